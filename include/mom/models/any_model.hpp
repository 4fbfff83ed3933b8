#pragma once
// A model instance behind a run-time interface, for code that should be compiled once per backend rather than
// once per architecture: the Trainer, the Checkpointer, evaluation loops, a command line that picks the
// architecture by name.
//
//   auto m = Model::make<cpu::Backend<float>>(seed);
//   mom::ErasedModel any(m);                      // an AnyModel<cpu::Backend<float>>& that forwards to m
//   train::Trainer<AnyModel<cpu::Backend<float>>> t(any, data, &val, cfg);   // the same steps, bit for bit
//
// What generic code needs to know of a model's type at run time (its tensors, size, shape and cost model) is
// its ModelCard: model_card<Model>() for a type, model_card(instance) for a ModelInstance or an AnyModel.
// TrainableModel is the contract the Trainer and the Checkpointer check; ModelInstance and AnyModel meet it.
//
// The interface costs one virtual call per member call (a handful per micro-batch); the model's forward and
// backward run exactly as on the instance itself (tests/train/test_trainer.cpp compares the two).
#include <concepts>
#include <span>
#include <string>

#include "mom/core/dims.hpp"
#include "mom/core/layout.hpp"
#include "mom/models/describe.hpp"
#include "mom/models/realised_flops.hpp"
#include "mom/models/runtime.hpp"

namespace mom {

// A model type's facts at run time: its dimensions, layout (Model::layout: every tensor's name, shape, offset),
// parameter count, describe<Model>() line, and its cost model's worst-case figures.
struct ModelCard {
  Dims dims;
  std::span<const ParamInfo> layout;
  index_t params = 0;
  std::string describe;
  // Model::training_flops(batch, seq), Model::training_flops_per_token(seq) (forward + backward, cost model)
  double (*training_flops)(index_t batch, index_t seq) = nullptr;
  double (*training_flops_per_token)(index_t seq) = nullptr;
  // Model::activation_bytes<float>(batch, seq): the workspace ModelInstance::reserve allocates, in fp32
  double (*activation_bytes)(index_t batch, index_t seq) = nullptr;
};

// The card of a model type (one per type, built on first use).
template <class Model>
const ModelCard& model_card() {
  static const ModelCard card{
      .dims = Model::dims,
      .layout = std::span<const ParamInfo>(Model::layout),
      .params = Model::params,
      .describe = describe<Model>(),
      .training_flops = [](index_t batch, index_t seq) { return double(Model::training_flops(batch, seq)); },
      .training_flops_per_token = [](index_t seq) { return double(Model::training_flops_per_token(seq)); },
      .activation_bytes = [](index_t batch, index_t seq) {
        return double(Model::template activation_bytes<float>(batch, seq));
      }};
  return card;
}
template <class Model, class Be>
const ModelCard& model_card(const ModelInstance<Model, Be>&) {
  return model_card<Model>();
}

// A ModelInstance<Model, Be> seen through the members that code generic over models calls. Abstract; an
// ErasedModel is one.
template <class Be>
class AnyModel {
 public:
  using backend_type = Be;
  using scalar = typename Be::scalar;
  using T = scalar;

  virtual ~AnyModel() = default;
  virtual const ModelCard& card() const = 0;
  virtual Be& backend() = 0;
  virtual std::span<T> params() = 0;
  virtual std::span<T> grads() = 0;
  std::span<const T> params() const { return const_cast<AnyModel*>(this)->params(); }
  std::span<const T> grads() const { return const_cast<AnyModel*>(this)->grads(); }
  virtual void reserve(index_t batch, index_t seq) = 0;
  virtual T forward(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch, index_t seq) = 0;
  virtual void forward_async(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch,
                             index_t seq) = 0;
  virtual T loss() const = 0;
  virtual std::span<const T> loss_data() const = 0;
  virtual T cross_entropy() const = 0;
  virtual MatrixView<const T> logits() const = 0;
  virtual void backward() = 0;
  virtual void zero_grad() = 0;
  virtual void update_buffers() = 0;
  virtual index_t batch() const = 0;
  virtual index_t seq() const = 0;
  // realised_training_flops(instance) of the last forward (models/realised_flops.hpp)
  virtual double realised_training_flops() = 0;
};

template <class Be>
const ModelCard& model_card(const AnyModel<Be>& m) {
  return m.card();
}
template <class Be>
double realised_training_flops(AnyModel<Be>& m) {
  return m.realised_training_flops();
}

// An AnyModel that forwards every member to a ModelInstance it refers to (which must outlive it).
template <class Instance>
class ErasedModel final : public AnyModel<typename Instance::backend_type> {
 public:
  using Be = typename Instance::backend_type;
  using T = typename Instance::scalar;
  explicit ErasedModel(Instance& m) : m_(m) {}

  const ModelCard& card() const override { return model_card<typename Instance::model_type>(); }
  Be& backend() override { return m_.backend(); }
  std::span<T> params() override { return m_.params(); }
  std::span<T> grads() override { return m_.grads(); }
  using AnyModel<Be>::params;
  using AnyModel<Be>::grads;
  void reserve(index_t batch, index_t seq) override { m_.reserve(batch, seq); }
  T forward(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch, index_t seq) override {
    return m_.forward(tokens, targets, batch, seq);
  }
  void forward_async(std::span<const token_t> tokens, std::span<const token_t> targets, index_t batch,
                     index_t seq) override {
    m_.forward_async(tokens, targets, batch, seq);
  }
  T loss() const override { return m_.loss(); }
  std::span<const T> loss_data() const override { return m_.loss_data(); }
  T cross_entropy() const override { return m_.cross_entropy(); }
  MatrixView<const T> logits() const override { return m_.logits(); }
  void backward() override { m_.backward(); }
  void zero_grad() override { m_.zero_grad(); }
  void update_buffers() override { m_.update_buffers(); }
  index_t batch() const override { return m_.batch(); }
  index_t seq() const override { return m_.seq(); }
  double realised_training_flops() override { return mom::realised_training_flops(m_); }

  Instance& instance() { return m_; }

 private:
  Instance& m_;
};
template <class Instance>
ErasedModel(Instance&) -> ErasedModel<Instance>;

// What the Trainer and the Checkpointer call on a model (train/trainer.hpp, train/checkpoint.hpp): a
// ModelInstance or an AnyModel.
template <class I>
concept TrainableModel = requires(I& m, const I& cm, std::span<const token_t> tok, index_t n) {
  typename I::backend_type;
  typename I::scalar;
  { model_card(cm) } -> std::same_as<const ModelCard&>;
  m.backend();
  { m.params() } -> std::same_as<std::span<typename I::scalar>>;
  { m.grads() } -> std::same_as<std::span<typename I::scalar>>;
  m.reserve(n, n);
  m.forward(tok, tok, n, n);
  m.forward_async(tok, tok, n, n);
  { cm.loss_data() } -> std::same_as<std::span<const typename I::scalar>>;
  cm.cross_entropy();
  m.backward();
  m.zero_grad();
  m.update_buffers();
  { realised_training_flops(m) } -> std::convertible_to<double>;
};

}  // namespace mom

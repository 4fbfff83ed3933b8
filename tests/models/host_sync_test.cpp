// A training step never reads the backend's memory from the host (issue 7: no host-device
// synchronisation inside a step): every model family runs forward_async, backward, the gradient norm
// and AdamW through a backend that counts the host reads (read, to_host), and the count stays 0
// until the step's one read-back. On a GPU each such read is a wait for the stream; the routed
// executors keep their group sizes in backend memory instead (core/groups.hpp). The CUDA suite checks
// the same on the device runtime (tests/cuda/cuda_models_test.cpp, under emulation).
#include <catch2/catch.hpp>

#include <cmath>

#include <mom/models/mom_models.hpp>
#include <mom/models/moe_models.hpp>
#include <mom/mom.hpp>

#include "models/random_tokens.hpp"

using namespace mom;

namespace {

template <class T>
struct HostReadCountingBackend : cpu::Backend<T> {
  using Base = cpu::Backend<T>;
  index_t host_reads = 0;
  template <class U>
  U read(const U* p) const {
    ++const_cast<HostReadCountingBackend*>(this)->host_reads;
    return Base::read(p);
  }
  template <class U>
  void to_host(std::span<U> host, std::span<const U> dev) const {
    ++const_cast<HostReadCountingBackend*>(this)->host_reads;
    Base::to_host(host, dev);
  }
};

constexpr Dims dims{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 64, .context = 32};

template <class Model>
void check_step_reads_nothing() {
  INFO(describe<Model>());
  using T = double;
  auto m = Model::template make<HostReadCountingBackend<T>>(5);
  test::randomise(m, 6, 0.3);
  const index_t batch = 2, seq = 16;
  m.reserve(batch, seq);
  const auto tokens = test::random_tokens(batch * seq, dims.vocab, 7);
  const auto targets = test::random_tokens(batch * seq, dims.vocab, 8);
  auto& be = m.backend();
  auto mom = be.template alloc<T>(Model::params), vel = be.template alloc<T>(Model::params), norm = be.template alloc<T>(1);
  for (int step = 1; step <= 2; ++step) {
    be.host_reads = 0;
    m.zero_grad();
    m.forward_async(tokens, targets, batch, seq);
    m.backward();
    be.grad_norm(std::span<const T>(m.grads()), norm.data());
    be.adamw_step(m.params(), std::span<const T>(m.grads()), mom.span(), vel.span(), cpu::AdamWConfig{.lr = 1e-3}, step,
                  norm.data(), T(1));
    CHECK(be.host_reads == 0);
    // The step's one read-back: the loss (cross-entropy + auxiliary losses), equal to forward's.
    const T loss = m.loss();
    CHECK(be.host_reads == 1);
    CHECK(std::isfinite(loss));
  }
  // forward() is forward_async + loss(): the same value.
  m.zero_grad();
  const T direct = m.forward(tokens, targets, batch, seq);
  m.forward_async(tokens, targets, batch, seq);
  CHECK(m.loss() == direct);
}

}  // namespace

TEST_CASE("a training step makes no host read: every routed family keeps its routing on the backend",
          "[models][sync]") {
  check_step_reads_nothing<LM<dims, Dense<2>>>();
  check_step_reads_nothing<LM<dims, Strategy_11411<MoM_P<>>>>();
  check_step_reads_nothing<LM<dims, Chunked<Layer, KaHbS<2, 3, 3, Router<GRU>, phi::MoMRoutedKV>>>>();
  check_step_reads_nothing<LM<dims, MoEStack<2, 3, 2>>>();
  check_step_reads_nothing<LM<dims, MoEShareStack<2, 3, 2>>>();
  check_step_reads_nothing<LM<dims, MoDEIntegrated<2, 3, 2>>>();
  check_step_reads_nothing<LM<dims, MoDEStaged<2, 3, 2>>>();
  check_step_reads_nothing<LM<dims, MoD<4>>>();
  check_step_reads_nothing<LM<dims, MoD<4, 1, 8, 2, CausalAux<>>>>();
  check_step_reads_nothing<LM<dims, MoD<4, 1, 8, 2, CausalPredictor<8>>>>();
  check_step_reads_nothing<LM<dims, LayerSkipping<3>>>();
  check_step_reads_nothing<LM<dims, LayerSkipping<3, RunTarget<1, 2, 1, 1>>>>();
  check_step_reads_nothing<LM<dims, EarlyExiting<3, RunTarget<1, 2, 1, 1>>>>();
  check_step_reads_nothing<LM<dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>>>();
}

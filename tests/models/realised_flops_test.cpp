// The FLOPs a training step runs, as the library reports them (models/realised_flops.hpp: what the Trainer logs
// and issue 32's equal-compute budgets count) against the testing kit's backend that tallies every product of
// the forward and the backward: equal, for every family, with routing that varies from token to token (O(1)
// router weights). The forward half is also checked family by family in the model tests; here the backward too.
#include <catch2/catch.hpp>

#include <random>

#include "cuda/small_models.hpp"  // small models of every family (shared with the CUDA suite)
#include "mom/models/realised_flops.hpp"
#include "mom/testing/counting_backend.hpp"
#include "mom/testing/random.hpp"

using namespace mom;
using namespace mom::test::small_models;

namespace {
// per_step_forward: FLOPs the forward runs once per step whatever its tokens, which a per-token cost model does
// not hold (ModuleFormer's ‖A'‖² regulariser of inserted modules, a 1×1 product per gate): checked to be the same
// at two shapes.
template <class Model>
void check_step_flops(const char* name, bool varied_routing = true, bool per_step_forward = false) {
  INFO(name);
  ModelInstance<Model, testing::CountingBackend<float>> m(5);
  if (varied_routing) {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (auto& p : m.params()) p = normal(rng);
  }
  index_t extra = -1;
  for (auto [batch, seq] : {std::pair<index_t, index_t>{2, 16}, {3, 7}}) {
    INFO("batch " << batch << " seq " << seq);
    m.reserve(batch, seq);
    const auto tokens = testing::random_tokens(batch * seq, Model::dims.vocab, 9);
    m.backend().flops = 0;
    m.forward(tokens, tokens, batch, seq);
    const index_t forward = m.backend().flops;
    if (per_step_forward) {
      CHECK(forward > realised_forward_flops(m));
      if (extra >= 0) CHECK(forward - realised_forward_flops(m) == extra);
      extra = forward - realised_forward_flops(m);
    } else {
      CHECK(forward == realised_forward_flops(m));
    }
    m.backward();
    CHECK(m.backend().flops - forward == realised_backward_flops(m));
    // The cost model's worst case bounds it (up to its per-token figure's rounding down where a capacity C/seq
    // does not divide evenly: 9 and 18 FLOPs of MoR's 25 million at seq 7).
    CHECK(realised_training_flops(m) <= double(Model::training_flops(batch, seq)) * (1 + 1e-6));
  }
}
}  // namespace

TEST_CASE("a step's realised forward and backward FLOPs are the products that ran, for every family", "[flops]") {
  check_step_flops<DenseSmall>("dense", false);
  check_step_flops<MoMP>("MoM_P");
  check_step_flops<MoMRoutedKV>("MoM, routed K/V");
  check_step_flops<MoESmall>("MoE");
  check_step_flops<MoEShareSmall>("MoE(share)");
  check_step_flops<MoDEIntSmall>("MoDE integrated");
  check_step_flops<DSSmall>("DeepSeekMoE");
  check_step_flops<ECSmall>("expert-choice MoE");
  check_step_flops<MoDSmall>("MoD");
  check_step_flops<MoDEStagedSmall>("MoDE staged");
  check_step_flops<SkipSmall>("layer-skip");
  check_step_flops<ExitSmall>("early exit");
  check_step_flops<MoRSmall>("MoR");
  check_step_flops<MoRTokenSmall>("MoR token choice");
  check_step_flops<MoRShareSmall>("MoR KV sharing");
  check_step_flops<MoRMiddleSmall>("MoR middle cycle");
  check_step_flops<ShareCycle>("sharing, cycle");
  check_step_flops<MoEUTSmall>("MoEUT");
  check_step_flops<MoEUTPreSmall>("MoEUT pre-LN AABB");
  check_step_flops<MFSmall>("ModuleFormer");
  check_step_flops<MFInsertedSmall>("ModuleFormer, inserted modules", true, true);
}

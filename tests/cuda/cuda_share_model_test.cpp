// Parameter sharing (routers/share.hpp) on both backends: a shared model is the dense executor over a
// step -> module map, so the same type, seed and batch give the same loss and gradients (a shared
// module's gradient summed over its uses) on cpu::Backend and cuda::Backend. Tolerances as in
// cuda_models_test.cpp: double 1e-9 (loss) / 1e-8 (gradients).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "mom/backend/cuda.hpp"
#include "mom/mom.hpp"
#include "ops/grad_check.hpp"

using namespace mom;

namespace {

template <class Model>
void compare_shared_model() {
  using T = double;
  const index_t batch = 2, seq = 24;
  auto on_cpu = Model::template make<cpu::Backend<T>>(7);
  auto on_gpu = Model::template make<cuda::Backend<T>>(7);
  on_cpu.reserve(batch, seq);
  on_gpu.reserve(batch, seq);
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<int> tok(0, int(Model::dims.vocab) - 1);
  std::vector<token_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  for (auto& t : tokens) t = tok(gen);
  for (auto& t : targets) t = tok(gen);
  const T lc = on_cpu.forward(tokens, targets, batch, seq);
  const T lg = on_gpu.forward(tokens, targets, batch, seq);
  INFO("loss cpu " << lc << " gpu " << lg);
  CHECK(std::abs(lc - lg) <= 1e-9 * std::abs(lc));
  on_cpu.backward();
  on_gpu.backward();
  std::vector<T> gc(on_cpu.grads().begin(), on_cpu.grads().end()), gg(gc.size());
  on_gpu.backend().to_host(std::span<T>(gg), std::span<const T>(on_gpu.grads()));
  const double err = test::rel_error(gg, gc);
  INFO("gradient relative error " << err);
  CHECK(err <= 1e-8);
}

constexpr Dims dims{.d_model = 32, .heads = 4, .d_ff = 64, .vocab = 50, .context = 32};

}  // namespace

TEST_CASE("parameter sharing: same loss and gradients as cpu (double; Cycle<2>, All, Map)", "[cuda][models][share]") {
  if (cuda::device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  compare_shared_model<LM<dims, Assembly<Router<Share<Cycle<2>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<5>>>>();
  compare_shared_model<LM<dims, Assembly<Router<Share<All>>, ModuleSet<MHA<1>, FFN<1>>, K<1>, H<3>>>>();
  compare_shared_model<
      LM<dims, Chunked<Layer, Assembly<Router<Share<Map<0, 1, 1, 0>>>, ModuleSet<MHA<2>, FFN<2>>, K<1>, H<4>>>>>();
}

// bench_gpu_grouped: TFLOP/s of the grouped GEMMs (the routed modules' products: grouped_linear_forward and the
// backward's dx and dW + db, kernels/gemm_tile_mma.cuh) beside the backend's dense products (cuBLASLt / cuBLAS) over
// the same rows, in TF32 and bf16 (issue 28: grouped GEMMs at cuBLAS-class speed).
//
//   bench_gpu_grouped [--rows N] [--reps R]
//
// Shapes: GPT-2 small's FFN (768 → 3072, 3072 → 768) and attention input (768 → 2304) over N rows (default 8192,
// 8 × 1024), as one dense product and as 1, 4 (equal) and 16 (ragged: sizes drawn between N / 32 and 3N / 32, the
// last group taking the rest) groups with a weight matrix each. A product's time is the mean over R launches after
// 3 untimed ones (the host waits once, after the last); FLOPs 2 · N · in · out a product. The dense backward is
// one call (dx, dW and db from one bf16 staging of dy under BF16), so its row stands beside the grouped dx + dW.
// A compact table (TFLOP/s only) comes last.
//
// Without a GPU it prints one line and exits 0 (built with the benchmarks, MOM_BUILD_BENCH; the test command does
// not build them).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <mom/backend/cuda.hpp>

using namespace mom;

namespace {

using B = cuda::Backend<float>;

template <class F>
double time_ms(const B& be, int reps, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  be.sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  be.sync();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// The compact table printed last: per precision and shape, TFLOP/s of the dense products and of the grouped ones
// at 1, 4 and 16 ragged groups (forward; backward dx + dW + db).
std::vector<std::string> summary;

void row(const char* precision, const char* product, index_t in, index_t out, const std::string& groups, double ms,
         double flops, double dense_ms) {
  std::printf("| %s | %s | %lld → %lld | %s | %.3f | %.1f | %s |\n", precision, product, static_cast<long long>(in),
              static_cast<long long>(out), groups.c_str(), ms, flops / ms * 1e-9,
              dense_ms > 0 ? (std::to_string(dense_ms / ms).substr(0, 4) + "×").c_str() : "–");
}

// Group offsets: 1 group, G equal, or G ragged (seeded).
std::vector<token_t> offsets(index_t rows, int groups, bool ragged) {
  std::vector<token_t> o{0};
  std::mt19937 rng(11);
  std::uniform_int_distribution<index_t> size(rows / 32, 3 * rows / 32);
  for (int g = 1; g < groups; ++g) o.push_back(token_t(ragged ? o.back() + size(rng) : rows * g / groups));
  o.push_back(token_t(rows));
  return o;
}

void shape(B& be, const char* pname, index_t rows, index_t in, index_t out, int reps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const auto random = [&](index_t n) {
    std::vector<float> h(static_cast<std::size_t>(n));
    for (auto& v : h) v = nd(rng);
    auto d = be.alloc(n);
    be.from_host(d.span(), std::span<const float>(h));
    return d;
  };
  constexpr int max_groups = 16;
  auto x = random(rows * in), dy = random(rows * out), w = random(max_groups * out * in), b = random(max_groups * out);
  auto y = be.alloc(rows * out), dx = be.alloc(rows * in), dw = be.alloc(max_groups * out * in),
       db = be.alloc(max_groups * out);
  const MatrixView<const float> xv{x.data(), rows, in, in}, dyv{dy.data(), rows, out, out};
  const MatrixView<float> yv{y.data(), rows, out, out}, dxv{dx.data(), rows, in, in};
  const double flops = 2.0 * double(rows) * double(in) * double(out);
  const MatrixView<const float> w1{w.data(), out, in, in};
  const double dense_fwd = time_ms(be, reps, [&] {
    be.linear_forward(yv, xv, w1, std::span<const float>(b.data(), std::size_t(out)));
  });
  const double dense_bwd = time_ms(be, reps, [&] {
    be.linear_backward(dxv, MatrixView<float>{dw.data(), out, in, in}, std::span<float>(db.data(), std::size_t(out)),
                       dyv, xv, w1);
  });
  char line[256];
  std::string fwd_rates, bwd_rates;
  row(pname, "forward, dense", in, out, "–", dense_fwd, flops, 0);
  row(pname, "backward dx + dW + db, dense", in, out, "–", dense_bwd, 2 * flops, 0);
  for (const auto& [groups, ragged] : {std::pair{1, false}, std::pair{4, false}, std::pair{max_groups, true}}) {
    const auto o = offsets(rows, groups, ragged);
    auto od = be.alloc<token_t>(index_t(o.size()));
    be.from_host(od.span(), std::span<const token_t>(o));
    const RowGroups g{od.data(), groups};
    const PerGroup<const float> wg(w.data(), groups, [&](int i) { return index_t(i) * out * in; });
    const PerGroup<const float> bg(b.data(), groups, [&](int i) { return index_t(i) * out; });
    const PerGroup<float> dwg(dw.data(), groups, [&](int i) { return index_t(i) * out * in; });
    const PerGroup<float> dbg(db.data(), groups, [&](int i) { return index_t(i) * out; });
    const std::string name = std::to_string(groups) + (ragged ? " ragged" : "");
    const double fwd = time_ms(be, reps, [&] { be.grouped_linear_forward(yv, xv, wg, bg, g); });
    const double bdx = time_ms(be, reps, [&] {
      be.grouped_linear_backward(dxv, PerGroup<float>{}, PerGroup<float>{}, dyv, xv, wg, g);
    });
    const double bdw = time_ms(be, reps, [&] {
      be.grouped_linear_backward(MatrixView<float>{}, dwg, dbg, dyv, xv, wg, g);
    });
    row(pname, "forward, grouped", in, out, name, fwd, flops, dense_fwd);
    row(pname, "backward dx, grouped", in, out, name, bdx, flops, 0);
    row(pname, "backward dW + db, grouped", in, out, name, bdw, flops, 0);
    row(pname, "backward dx + dW + db, grouped", in, out, name, bdx + bdw, 2 * flops, dense_bwd);
    std::snprintf(line, sizeof line, "%s%.0f", fwd_rates.empty() ? "" : " / ", flops / fwd * 1e-9);
    fwd_rates += line;
    std::snprintf(line, sizeof line, "%s%.0f", bwd_rates.empty() ? "" : " / ", 2 * flops / (bdx + bdw) * 1e-9);
    bwd_rates += line;
  }
  std::snprintf(line, sizeof line, "| %s | %lld → %lld | %.0f | %s | %.0f | %s |", pname, static_cast<long long>(in),
                static_cast<long long>(out), flops / dense_fwd * 1e-9, fwd_rates.c_str(), 2 * flops / dense_bwd * 1e-9,
                bwd_rates.c_str());
  summary.push_back(line);
}

}  // namespace

int main(int argc, char** argv) {
  index_t rows = 8192;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rows")) rows = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (cuda::device_count() == 0) {
    std::printf("bench_gpu_grouped: no CUDA device: nothing to measure\n");
    return 0;
  }
  if (rows < 64 || reps < 1) {
    std::fprintf(stderr, "bench_gpu_grouped: --rows must be at least 64 and --reps at least 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
  std::printf("bench_gpu_grouped on %s, %lld rows, mean of %d launches\n\n", prop.name, static_cast<long long>(rows),
              reps);
  std::printf("| precision | product | in → out | groups | ms | TFLOP/s | dense ms / this |\n|---|---|---|---|---:|---:|---:|\n");
  B be;
  for (const auto& [precision, pname] : {std::pair{cuda::Precision::BF16, "bf16"}, std::pair{cuda::Precision::TF32, "tf32"}}) {
    be.set_precision(precision);
    for (const auto& [in, out] : {std::pair<index_t, index_t>{768, 3072}, std::pair<index_t, index_t>{3072, 768},
                                  std::pair<index_t, index_t>{768, 2304}})
      shape(be, pname, rows, in, out, reps);
  }
  std::printf("\nSummary (TFLOP/s; grouped at 1 / 4 / 16 ragged groups):\n\n");
  std::printf("| precision | in → out | dense forward | grouped forward | dense backward | grouped backward |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const auto& l : summary) std::printf("%s\n", l.c_str());
  return 0;
}

// bench_ops: GFLOP/s of mom's CPU ops beside this machine's measured sgemm peak.
//
//   bench_ops              the full report (markdown tables, as pasted into bench/RESULTS.md)
//   bench_ops --peak-only  "PEAK <GFLOP/s> <OpenBLAS core>", then "LINEAR <i> <GFLOP/s>" for OpenBLAS
//                          on each linear shape (the full report runs this with the other kernels)
//
// The sgemm peak is OpenBLAS's sgemm on a large square product, measured twice: as the
// environment has it (OPENBLAS_CORETYPE as set, e.g. Haswell = AVX2 kernels) and with its
// AVX-512 kernels (this binary re-runs itself with OPENBLAS_CORETYPE=SkylakeX: OpenBLAS
// picks its kernels when the library loads, so it takes a second process). The larger of
// the two is "the machine's sgemm peak" the fractions are taken against.
//
// Linear forward+backward at n tokens, in → out features (one layer's three products):
//   forward  y[n×out]  = x[n×in]·w[out×in]ᵀ        (NT)
//   dX       dx[n×in] += dy[n×out]·w[out×in]       (NN)
//   dW       dw[out×in] += dy[n×out]ᵀ·x[n×in]      (TN)
// 6·n·in·out FLOPs, for three GEMMs: mom's native kernel (cpu::gemm), Eigen's own product
// (cpu::detail::gemm_eigen, what MOM_GEMM=EIGEN uses) and OpenBLAS sgemm (what
// MOM_GEMM=BLAS, Eigen with EIGEN_USE_BLAS, forwards these products to).
//
// Attention forward+backward (mom::cpu::attention_*) over batch·seq = 4096 tokens, d 768,
// 12 heads. FLOPs counted for the causal half only (the work that is needed):
// forward QKᵀ and PV = 2·S²·d per sequence, backward (dV, dP, dQ, dK) = 4·S²·d; the
// recomputation of QKᵀ in the backward is not counted.
//
// Times are the median of repeats after warm-up; threads = OpenMP's (OMP_NUM_THREADS).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <mom/backend/cpu/gemm.hpp>
#include <mom/backend/cpu/openmp_env.hpp>

#if __has_include(<mom/backend/cpu/attention.hpp>)
#include <mom/backend/cpu/attention.hpp>
#define MOM_BENCH_ATTENTION 1
#endif

#if defined(MOM_BENCH_OPENBLAS)
#include <cblas.h>
#endif

using namespace mom;
using cpu::Trans;

namespace {

// Median seconds of `reps` timed calls after `warmup` untimed ones; reps adapt so that a
// measurement takes about `budget` seconds (at least 5, at most 50).
double median_seconds(const std::function<void()>& f, double budget = 1.0, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  auto time_once = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> t{time_once()};
  const int reps = std::clamp(int(budget / std::max(t[0], 1e-6)), 5, 50);
  while (int(t.size()) < reps) t.push_back(time_once());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// OpenBLAS's worker threads spin for a while after each call and OpenMP's do too: let
// the other library's threads fall asleep before timing the next one.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

std::vector<float> random_floats(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// One GEMM implementation: C = alpha·op(A)·op(B) + beta·C on row-major views.
using Gemm = std::function<void(MatrixView<float>, MatrixView<const float>, Trans, MatrixView<const float>, Trans, float,
                                 float)>;

struct Impl {
  const char* name;
  Gemm gemm;
};

std::vector<Impl> implementations() {
  std::vector<Impl> impls;
  impls.push_back({"mom native (cpu::gemm)", [](auto C, auto A, Trans ta, auto B, Trans tb, float alpha, float beta) {
                     cpu::gemm<float>(C, A, ta, B, tb, alpha, beta);
                   }});
  impls.push_back({"Eigen 3.4 own GEMM", [](auto C, auto A, Trans ta, auto B, Trans tb, float alpha, float beta) {
                     cpu::detail::gemm_eigen<float>(C, A, ta, B, tb, alpha, beta);
                   }});
#if defined(MOM_BENCH_OPENBLAS)
  impls.push_back({"OpenBLAS sgemm (= MOM_GEMM=BLAS)", [](auto C, auto A, Trans ta, auto B, Trans tb, float alpha,
                                                          float beta) {
                     const index_t k = ta == Trans::N ? A.cols : A.rows;
                     cblas_sgemm(CblasRowMajor, ta == Trans::N ? CblasNoTrans : CblasTrans,
                                 tb == Trans::N ? CblasNoTrans : CblasTrans, int(C.rows), int(C.cols), int(k), alpha, A.data,
                                 int(A.ld), B.data, int(B.ld), beta, C.data, int(C.ld));
                   }});
#endif
  return impls;
}

// GFLOP/s of one square-ish product with a given implementation.
double gemm_gflops(const Gemm& g, index_t m, index_t n, index_t k, Trans ta, Trans tb) {
  auto a = random_floats(m * k, 1), b = random_floats(k * n, 2), c = random_floats(m * n, 3);
  MatrixView<const float> A(a.data(), ta == Trans::N ? m : k, ta == Trans::N ? k : m);
  MatrixView<const float> B(b.data(), tb == Trans::N ? k : n, tb == Trans::N ? n : k);
  MatrixView<float> C(c.data(), m, n);
  const double s = median_seconds([&] { g(C, A, ta, B, tb, 1.0f, 0.0f); });
  return 2.0 * double(m) * double(n) * double(k) / s * 1e-9;
}

struct LinearResult {
  double total_s, fwd_s, dx_s, dw_s;
};

// One linear layer's forward and backward (three GEMMs) with implementation g.
LinearResult bench_linear(const Gemm& g, index_t n, index_t in, index_t out) {
  auto x = random_floats(n * in, 4), w = random_floats(out * in, 5, 0.05f), dy = random_floats(n * out, 6);
  std::vector<float> y(n * out), dx(n * in, 0.0f), dw(out * in, 0.0f);
  MatrixView<const float> X(x.data(), n, in), W(w.data(), out, in), DY(dy.data(), n, out);
  auto fwd = [&] { g({y.data(), n, out}, X, Trans::N, W, Trans::T, 1.0f, 0.0f); };
  auto bwd_x = [&] { g({dx.data(), n, in}, DY, Trans::N, W, Trans::N, 1.0f, 1.0f); };
  auto bwd_w = [&] { g({dw.data(), out, in}, DY, Trans::T, X, Trans::N, 1.0f, 1.0f); };
  LinearResult r;
  r.total_s = median_seconds([&] {
    fwd();
    bwd_x();
    bwd_w();
  }, 1.5);
  r.fwd_s = median_seconds(fwd, 0.5);
  r.dx_s = median_seconds(bwd_x, 0.5);
  r.dw_s = median_seconds(bwd_w, 0.5);
  return r;
}


constexpr index_t kLinearShapes[][3] = {{4096, 256, 1024}, {4096, 768, 3072}};  // n, in, out

constexpr index_t kPeakSize = 3072;

#if defined(MOM_BENCH_OPENBLAS)
double openblas_peak() {
  return gemm_gflops(implementations().back().gemm, kPeakSize, kPeakSize, kPeakSize, Trans::N, Trans::N);
}

// Runs this binary again with OPENBLAS_CORETYPE=core and reads its peak line and its
// linear fwd+bwd lines (GFLOP/s per entry of kLinearShapes).
bool peak_in_child(const char* core, double& gflops, std::string& core_name, double* linear_gflops) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return false;
  const std::string cmd = std::string("OPENBLAS_CORETYPE=") + core + " '" + exe.string() + "' --peak-only";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return false;
  char line[256] = {};
  char name[64] = {};
  bool ok = false;
  while (std::fgets(line, sizeof line, pipe)) {
    if (std::sscanf(line, "PEAK %lf %63s", &gflops, name) == 2) ok = true;
    int i = 0;
    double g = 0;
    if (std::sscanf(line, "LINEAR %d %lf", &i, &g) == 2 && i >= 0 && i < 2) linear_gflops[i] = g;
  }
  pclose(pipe);
  core_name = name;
  return ok;
}
#endif

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  cpu::limit_openmp_spinning(argv);  // GOMP_SPINCOUNT=cpu::kOpenmpSpinCount unless the environment says otherwise
  const bool peak_only = argc > 1 && std::strcmp(argv[1], "--peak-only") == 0;
#if defined(MOM_BENCH_OPENBLAS)
  if (peak_only) {
    const double p = openblas_peak();
    std::printf("PEAK %.1f %s\n", p, openblas_get_corename());
    for (int i = 0; i < 2; ++i) {
      const auto [n, in, out] = kLinearShapes[i];
      settle();
      const LinearResult r = bench_linear(implementations().back().gemm, n, in, out);
      std::printf("LINEAR %d %.1f\n", i, 6.0 * double(n) * double(in) * double(out) / r.total_s * 1e-9);
    }
    return 0;
  }
#else
  if (peak_only) return 1;
#endif

  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("# bench_ops\n\n");
  std::printf("- CPU: %s, %u hardware threads; OpenMP threads: %d\n", cpu_model().c_str(),
              std::thread::hardware_concurrency(), omp_get_max_threads());
#if defined(MOM_HAVE_NATIVE_GEMM)
  namespace nat = cpu::detail::native;
  const bool wide = nat::isa() == nat::Isa::avx512;
  std::printf("- mom float GEMM: %s kernel (picked at run time), tile %lldx%lld, KC %lld, MC %lld, NC %lld\n",
              cpu::gemm_kernel(), (long long)(wide ? nat::avx512::MR : nat::avx2::MR),
              (long long)(wide ? nat::avx512::NR : nat::avx2::NR), (long long)(wide ? nat::avx512::KC : nat::avx2::KC),
              (long long)(wide ? nat::avx512::MC : nat::avx2::MC), (long long)(wide ? nat::avx512::NC : nat::avx2::NC));
#else
  std::printf("- mom float GEMM: Eigen (MOM_GEMM_EIGEN, or not x86)\n");
#endif
  std::printf("- OPENBLAS_CORETYPE in the environment: %s\n", env_core ? env_core : "(unset)");
  std::printf("- load average at start: %s\n\n", loadavg().c_str());

  // ---- (a) the machine's sgemm peak --------------------------------------------------
  double peak = 0;
  [[maybe_unused]] double peak_env = 0, peak_avx512 = 0;
  double linear_avx512[2] = {0, 0};  // OpenBLAS with its AVX-512 kernels, from the re-run
#if defined(MOM_BENCH_OPENBLAS)
  std::string core_env = openblas_get_corename(), core_512;
  peak_env = openblas_peak();
  settle();
  if (!peak_in_child("SkylakeX", peak_avx512, core_512, linear_avx512)) core_512 = "(re-run failed)";
  peak = std::max(peak_env, peak_avx512);
  std::printf("## sgemm peak (OpenBLAS 0.3 sgemm, %lld^3 NN)\n\n", (long long)kPeakSize);
  std::printf("| OpenBLAS kernels | GFLOP/s |\n|---|---:|\n");
  std::printf("| as the environment selects (core %s) | %.1f |\n", core_env.c_str(), peak_env);
  std::printf("| OPENBLAS_CORETYPE=SkylakeX (core %s, AVX-512) | %.1f |\n", core_512.c_str(), peak_avx512);
  std::printf("\nPeak used below: %.1f GFLOP/s (the larger).\n\n", peak);
  settle();
#endif
  auto frac = [&](double gflops) {
    char buf[32];
    if (peak > 0) std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * gflops / peak);
    else std::snprintf(buf, sizeof buf, "-");
    return std::string(buf);
  };

  const auto impls = implementations();

  // ---- single products ----------------------------------------------------------------
  struct Shape {
    index_t m, n, k;
    Trans ta, tb;
    const char* what;
  };
  const Shape shapes[] = {
      {kPeakSize, kPeakSize, kPeakSize, Trans::N, Trans::N, "square (peak shape)"},
      {512, 512, 512, Trans::N, Trans::N, "512^3"},
      {4096, 3072, 768, Trans::N, Trans::T, "linear fwd 4096x768->3072 (NT)"},
      {4096, 768, 3072, Trans::N, Trans::N, "linear dX (NN)"},
      {3072, 768, 4096, Trans::T, Trans::N, "linear dW (TN)"},
      // moeut8's routed shapes (d 256, 4096 tokens): few columns (A read in place), an expert's few hundred rows
      // (edge tiles), a 43-row weight gradient
      {4096, 43, 256, Trans::N, Trans::T, "sigma-MoE selection logits, 43 experts (NT)"},
      {4096, 16, 256, Trans::N, Trans::T, "SwitchHead selection logits, 16 columns (NT)"},
      {43, 256, 4096, Trans::T, Trans::N, "sigma-MoE selection dW (TN)"},
      {381, 128, 256, Trans::N, Trans::T, "one expert's W1, 381 rows (NT)"},
      {128, 256, 381, Trans::T, Trans::N, "one expert's dW1 (TN)"},
  };
  std::printf("## single GEMMs, GFLOP/s\n\n| product (m x n x k) |");
  for (const auto& im : impls) std::printf(" %s |", im.name);
  std::printf("\n|---|");
  for (std::size_t i = 0; i < impls.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (const auto& s : shapes) {
    std::printf("| %s: %lldx%lldx%lld |", s.what, (long long)s.m, (long long)s.n, (long long)s.k);
    for (const auto& im : impls) {
      std::printf(" %.1f |", gemm_gflops(im.gemm, s.m, s.n, s.k, s.ta, s.tb));
      std::fflush(stdout);
      settle();
    }
    std::printf("\n");
  }

  // ---- (b) linear forward + backward --------------------------------------------------
  std::printf("\n## linear forward+backward (fwd NT + dX NN + dW TN, 6*n*in*out FLOPs)\n\n");
  std::printf("| n x in x out | GEMM | fwd+bwd ms | GFLOP/s | of peak | fwd / dX / dW GFLOP/s |\n");
  std::printf("|---|---|---:|---:|---:|---|\n");
  for (int si = 0; si < 2; ++si) {
    const auto [n, in, out] = kLinearShapes[si];
    const double flops = 6.0 * double(n) * double(in) * double(out);
    for (const auto& im : impls) {
      const LinearResult r = bench_linear(im.gemm, n, in, out);
      const double g = flops / r.total_s * 1e-9, third = flops / 3.0 * 1e-9;
      std::printf("| %lldx%lldx%lld | %s | %.2f | %.1f | %s | %.0f / %.0f / %.0f |\n", (long long)n, (long long)in,
                  (long long)out, im.name, r.total_s * 1e3, g, frac(g).c_str(), third / r.fwd_s, third / r.dx_s,
                  third / r.dw_s);
      std::fflush(stdout);
      settle();
    }
    if (linear_avx512[si] > 0)
      std::printf("| %lldx%lldx%lld | OpenBLAS sgemm, OPENBLAS_CORETYPE=SkylakeX (re-run) | %.2f | %.1f | %s | |\n",
                  (long long)n, (long long)in, (long long)out, flops / linear_avx512[si] * 1e-6, linear_avx512[si],
                  frac(linear_avx512[si]).c_str());
  }

  // ---- (c) attention forward + backward -----------------------------------------------
#if defined(MOM_BENCH_ATTENTION)
  std::printf("\n## attention forward+backward (mom::cpu::attention_*, causal; d 768, 12 heads, batch*seq = 4096)\n\n");
  std::printf("FLOPs counted: causal half, forward 2*S^2*d per sequence, backward 4*S^2*d.\n\n");
  std::printf("| batch x seq | fwd ms | bwd ms | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd GFLOP/s | of peak |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (index_t seq : {index_t(256), index_t(1024)}) {
    const index_t d = 768, heads = 12, batch = 4096 / seq, rows = batch * seq;
    auto qkv = random_floats(rows * 3 * d, 7), dout = random_floats(rows * d, 8);
    std::vector<float> out(rows * d), lse(batch * heads * seq), dqkv(rows * 3 * d, 0.0f);
    MatrixView<const float> QKV(qkv.data(), rows, 3 * d), DOUT(dout.data(), rows, d), OUT(out.data(), rows, d);
    auto fwd = [&] {
      cpu::attention_forward<float>({out.data(), rows, d}, std::span<float>(lse), QKV, batch, seq, heads);
    };
    auto bwd = [&] {
      cpu::attention_backward<float>({dqkv.data(), rows, 3 * d}, DOUT, OUT, std::span<const float>(lse), QKV, batch,
                                     seq, heads);
    };
    const double tf = median_seconds(fwd);
    const double tb = median_seconds(bwd);
    const double ff = 2.0 * double(seq) * double(seq) * double(d) * double(batch);
    const double fb = 2.0 * ff;
    const double g = (ff + fb) / (tf + tb) * 1e-9;
    std::printf("| %lldx%lld | %.2f | %.2f | %.1f | %.1f | %.1f | %s |\n", (long long)batch, (long long)seq, tf * 1e3,
                tb * 1e3, ff / tf * 1e-9, fb / tb * 1e-9, g, frac(g).c_str());
    std::fflush(stdout);
  }
#else
  std::printf("\n(attention bench skipped: mom/backend/cpu/attention.hpp not found)\n");
#endif
  std::printf("\n- load average at end: %s\n", loadavg().c_str());
  return 0;
}

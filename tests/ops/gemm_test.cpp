// gemm: C = alpha·op(A)·op(B) + beta·C against a naive triple loop in double, for every
// transpose combination, odd sizes (edges of the 14×32 tile and of the KC / MC / NC
// cache blocks), leading dimensions wider than the rows, alpha/beta, float (the native
// kernel) and double (Eigen), the threaded and the serial entry; and the shape check.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <mom/backend/cpu/gemm.hpp>

using namespace mom;
using cpu::Trans;

namespace {

// A stored matrix with a leading dimension wider than its columns; the padding holds
// a sentinel that must survive every call untouched.
template <class T>
struct Stored {
  index_t rows, cols, ld;
  std::vector<T> data;
  Stored(index_t r, index_t c, index_t pad, std::mt19937& rng) : rows(r), cols(c), ld(c + pad), data(r * (c + pad)) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (index_t i = 0; i < r; ++i)
      for (index_t j = 0; j < ld; ++j) data[i * ld + j] = j < c ? T(u(rng)) : T(777);
  }
  MatrixView<T> view() { return {data.data(), rows, cols, ld}; }
  MatrixView<const T> cview() const { return {data.data(), rows, cols, ld}; }
  double at(index_t i, index_t j) const { return double(data[i * ld + j]); }
};

enum class Entry { Threaded, Serial };

// Runs one product and checks every element against the double-precision loop, with an
// error bound on the float accumulation: |err| ≤ (k + 2)·eps·(Σ|a·b|·|alpha| + |beta·c|).
template <class T>
void check_gemm(index_t m, index_t n, index_t k, Trans ta, Trans tb, T alpha, T beta, Entry entry = Entry::Threaded) {
  std::mt19937 rng(static_cast<unsigned>(m * 7919 + n * 131 + k * 17 + int(ta) * 3 + int(tb)));
  Stored<T> a(ta == Trans::N ? m : k, ta == Trans::N ? k : m, 3, rng);
  Stored<T> b(tb == Trans::N ? k : n, tb == Trans::N ? n : k, 5, rng);
  Stored<T> c(m, n, 2, rng);
  const Stored<T> c0 = c;
  if (entry == Entry::Threaded) cpu::gemm<T>(c.view(), a.cview(), ta, b.cview(), tb, alpha, beta);
  else cpu::gemm_serial<T>(c.view(), a.cview(), ta, b.cview(), tb, alpha, beta);

  const double eps = std::numeric_limits<T>::epsilon();
  index_t bad = 0;
  double worst = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (index_t p = 0; p < k; ++p) {
        const double x = ta == Trans::N ? a.at(i, p) : a.at(p, i);
        const double y = tb == Trans::N ? b.at(p, j) : b.at(j, p);
        sum += x * y;
        mag += std::abs(x * y);
      }
      const double ref = double(alpha) * sum + (beta == T(0) ? 0.0 : double(beta) * c0.at(i, j));
      const double tol = double(k + 2) * eps * (std::abs(double(alpha)) * mag + std::abs(double(beta) * c0.at(i, j))) + 1e-30;
      const double err = std::abs(c.at(i, j) - ref);
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) ++bad;  // also counts NaN
    }
  INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << int(ta) << " tb=" << int(tb) << " alpha=" << alpha
            << " beta=" << beta << " worst err/tol=" << worst);
  CHECK(bad == 0);
  // The padding past each row's last column is never written.
  index_t touched = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = n; j < c.ld; ++j) touched += c.data[i * c.ld + j] != T(777);
  CHECK(touched == 0);
}

const Trans kTrans[] = {Trans::N, Trans::T};

}  // namespace

TEST_CASE("gemm float: all transposes, odd sizes, padded ld, alpha/beta vs naive loop", "[ops][gemm]") {
  // Sizes straddle the 14×32 micro-tile, 16-wide vectors and the packing fast paths.
  const index_t ms[] = {1, 3, 14, 15, 33, 100};
  const index_t ns[] = {1, 17, 32, 33, 63, 100};
  const index_t ks[] = {1, 3, 16, 17, 64};
  for (Trans ta : kTrans)
    for (Trans tb : kTrans)
      for (index_t m : ms)
        for (index_t n : ns)
          for (index_t k : ks) check_gemm<float>(m, n, k, ta, tb, 1.0f, 0.0f);
  for (Trans ta : kTrans)
    for (Trans tb : kTrans) {
      check_gemm<float>(17, 33, 100, ta, tb, 0.5f, 1.0f);
      check_gemm<float>(100, 257, 33, ta, tb, -1.5f, 0.25f);
      check_gemm<float>(3, 1, 257, ta, tb, 2.0f, -1.0f);
    }
}

TEST_CASE("gemm float: products spanning several KC, MC and NC blocks, threaded", "[ops][gemm]") {
  // k > KC (768) exercises the beta-then-accumulate passes, m > MC (168) several A
  // blocks, and these are large enough to take the multi-threaded path.
  for (Trans ta : kTrans)
    for (Trans tb : kTrans) {
      check_gemm<float>(257, 300, 1100, ta, tb, 1.0f, 0.0f);
      check_gemm<float>(401, 96, 600, ta, tb, 0.75f, 1.0f);
    }
  // n > NC (1024): several column blocks of B.
  check_gemm<float>(5, 4100, 7, Trans::N, Trans::T, 1.0f, 0.5f);
  // Few rows, many columns: the threads split the B panels instead of the A blocks.
  check_gemm<float>(20, 2000, 300, Trans::N, Trans::N, 1.0f, 1.0f);
}

TEST_CASE("gemm float: every kernel this CPU has (runtime dispatch: avx512, avx2, eigen) is correct", "[ops][gemm]") {
  const std::string best = cpu::gemm_kernel();
  INFO("best kernel on this CPU: " << best);
  CHECK(best != std::string("eigen"));  // this project's machines have AVX2 at least
  int ran = 0;
  for (const char* kernel : {"avx512", "avx2", "eigen"}) {
    if (!cpu::set_gemm_kernel(kernel)) continue;  // not on this CPU
    REQUIRE(std::string(cpu::gemm_kernel()) == kernel);
    ++ran;
    for (Trans ta : kTrans)
      for (Trans tb : kTrans) {
        check_gemm<float>(15, 33, 17, ta, tb, 1.0f, 0.0f);
        check_gemm<float>(100, 257, 33, ta, tb, -1.5f, 0.25f);
        check_gemm<float>(257, 300, 1100, ta, tb, 1.0f, 0.0f, Entry::Serial);
      }
    check_gemm<float>(401, 96, 600, Trans::N, Trans::T, 0.75f, 1.0f);  // threaded, several blocks
  }
  CHECK(ran >= 2);  // the best kernel and Eigen at least
  CHECK_FALSE(cpu::set_gemm_kernel("sse9"));
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));  // back to the default for the other tests
}

TEST_CASE("gemm float: up to 8 rows against a row-major weight (the decoder's GEMV path), every kernel", "[ops][gemm]") {
  // op(A) rows contiguous, op(B) = Wᵀ with W's rows contiguous (linear_forward): no packing, each row of W
  // read once. Column counts off the 4-, 2- and 1-column groups, k off the 16- and 8-wide vectors, both
  // entries, the threaded split (m·n·k >= 32768), and 9 rows (the blocked path) beside them.
  const std::string best = cpu::gemm_kernel();
  for (const char* kernel : {"avx512", "avx2"}) {
    if (!cpu::set_gemm_kernel(kernel)) continue;
    for (index_t m = 1; m <= 9; ++m) {
      check_gemm<float>(m, 1001, 300, Trans::N, Trans::T, 1.0f, 0.0f);
      check_gemm<float>(m, 1001, 300, Trans::N, Trans::T, -1.0f, 0.25f, Entry::Serial);
      check_gemm<float>(m, 37, 17, Trans::N, Trans::T, 0.5f, 1.0f);
      check_gemm<float>(m, 3, 7, Trans::N, Trans::T, 1.0f, 0.0f);
    }
  }
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));
  // beta = 0 never reads C on this path either.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(2 * 30, 1.0f), w(50 * 30, 2.0f), y(2 * 50, nan);
  cpu::gemm<float>({y.data(), 2, 50}, {x.data(), 2, 30}, Trans::N, {w.data(), 50, 30}, Trans::T, 1.0f, 0.0f);
  for (float v : y) REQUIRE(v == 60.0f);
}

TEST_CASE("gemm float: a product's bits do not depend on its size (edge tiles, the few-column path), every kernel",
          "[ops][gemm]") {
  // Row i of C reads row i of op(A) only, column j column j of op(B) only, and each element is one k-ordered chain
  // of fused multiply-adds in the same k blocks: the corner [m × n] of a product on a large block of its operands
  // equals the large product's corner bit for bit, whichever path and tiles each took (the large one: full 14 × 32
  // tiles; the corner: an edge tile of its last rows, a last panel of ≤ 16 columns, or, at most 64 columns of a
  // row-stored op(A) or of op(A) = Aᵀ, A's values read in place instead of packed). Gathered rows of A (op(A)'s rows,
  // or with op(A) = Aᵀ its columns: a weight gradient dyᵀ·x of routed rows), scaled ones, k over several KC blocks,
  // alpha / beta, both entries.
  const std::string best = cpu::gemm_kernel();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  constexpr index_t M = 400, N = 100, K = 1100, table_rows = 450;
  std::vector<float> a(std::size_t(K * K)), b(std::size_t(K * N)), c0(std::size_t(M * N)), scale(M);
  for (auto* v : {&a, &b, &c0, &scale})
    for (float& x : *v) x = u(rng);
  std::vector<token_t> rows(M), krows(K);  // op(A)'s rows (ta = N), its columns (ta = T)
  for (auto& r : rows) r = token_t(rng() % table_rows);
  for (auto& r : krows) r = token_t(rng() % table_rows);
  std::vector<float> kscale(K);
  for (float& x : kscale) x = u(rng);
  int compared = 0;
  for (const char* kernel : {"avx512", "avx2"}) {
    if (!cpu::set_gemm_kernel(kernel)) continue;
    for (Trans ta : kTrans)
      for (Trans tb : kTrans)
        for (index_t k : {17, 256, 1100})
          for (int list = 0; list < 3; ++list) {  // A itself, a row list, a row list with scales
            // ta = T: A's rows are op(A)'s columns (a table of them with a list)
            const index_t a_rows_n = ta == Trans::N ? table_rows : list ? table_rows : k;
            const MatrixView<const float> A{a.data(), a_rows_n, ta == Trans::N ? k : M, K};
            const MatrixView<const float> B{b.data(), tb == Trans::N ? k : N, tb == Trans::N ? N : k,
                                            tb == Trans::N ? N : K};
            const auto a_rows = [&](index_t m) {
              if (!list) return std::span<const token_t>{};
              return ta == Trans::N ? std::span<const token_t>(rows).first(m) : std::span<const token_t>(krows).first(k);
            };
            const auto a_scale = [&](index_t m) {
              if (list != 2) return std::span<const float>{};
              return ta == Trans::N ? std::span<const float>(scale).first(m) : std::span<const float>(kscale).first(k);
            };
            const auto op_a = [&](index_t m) {  // op(A)'s first m rows (with a list: the table)
              return list || ta == Trans::T ? A : MatrixView<const float>{A.data, m, A.cols, A.ld};
            };
            const auto op_b = [&](index_t n) {  // op(B)'s first n columns
              return tb == Trans::N ? MatrixView<const float>{B.data, k, n, B.ld} : MatrixView<const float>{B.data, n, k, B.ld};
            };
            const auto run = [&](index_t m, index_t n, float alpha, float beta, bool serial) {
              std::vector<float> c(c0);
              const MatrixView<float> C{c.data(), m, n, N};
              MatrixView<const float> Am = op_a(m);
              if (ta == Trans::T) Am = {A.data, list ? table_rows : k, m, A.ld};
              if (serial) {
                REQUIRE(!list);  // gemm_serial has no row list
                cpu::gemm_serial<float>(C, Am, ta, op_b(n), tb, alpha, beta);
              } else {
                cpu::gemm_gathered<float>(C, Am, ta, a_rows(m), a_scale(m), op_b(n), tb, {}, alpha, beta);
              }
              return c;
            };
            for (float beta : {0.0f, 0.5f}) {
              const std::vector<float> whole = run(M, N, 1.5f, beta, false);
              for (index_t m : {9, 15, 43, 381})
                for (index_t n : {1, 16, 17, 43, 64, 65})
                  for (bool serial : {false, true}) {
                    if (serial && list) continue;
                    const std::vector<float> part = run(m, n, 1.5f, beta, serial);
                    index_t differ = 0;
                    for (index_t i = 0; i < m; ++i)
                      for (index_t j = 0; j < n; ++j) differ += std::memcmp(&part[i * N + j], &whole[i * N + j], 4) != 0;
                    INFO(kernel << " ta=" << int(ta) << " tb=" << int(tb) << " k=" << k << " list=" << list
                                << " beta=" << beta << " m=" << m << " n=" << n << " serial=" << serial);
                    CHECK(differ == 0);
                    ++compared;
                  }
            }
          }
  }
  REQUIRE(cpu::set_gemm_kernel(best.c_str()));
  CHECK(compared > 0);
}

TEST_CASE("gemm double (Eigen path): all transposes, odd sizes, alpha/beta", "[ops][gemm]") {
  for (Trans ta : kTrans)
    for (Trans tb : kTrans) {
      check_gemm<double>(1, 1, 1, ta, tb, 1.0, 0.0);
      check_gemm<double>(17, 33, 100, ta, tb, 0.5, 1.0);
      check_gemm<double>(100, 257, 3, ta, tb, -1.5, 0.25);
    }
}

TEST_CASE("gemm_serial: same results, and safe inside an OpenMP parallel region", "[ops][gemm]") {
  for (Trans ta : kTrans)
    for (Trans tb : kTrans) check_gemm<float>(200, 70, 530, ta, tb, 1.0f, 0.5f, Entry::Serial);

  // Each thread runs its own product with its own packing buffers at the same time;
  // the threaded entry called from inside a region must fall back to one thread.
  const index_t m = 45, n = 64, k = 90;
  constexpr int kProducts = 8;
  std::mt19937 rng(5);
  std::vector<Stored<float>> as, bs;
  for (int t = 0; t < kProducts; ++t) {
    as.emplace_back(m, k, 0, rng);
    bs.emplace_back(n, k, 0, rng);
  }
  std::vector<std::vector<float>> serial(kProducts, std::vector<float>(m * n)), threaded = serial, ref = serial;
  for (int t = 0; t < kProducts; ++t)
    cpu::gemm_serial<float>({ref[t].data(), m, n}, as[t].cview(), Trans::N, bs[t].cview(), Trans::T);
#pragma omp parallel for num_threads(2) schedule(static, 1)
  for (int t = 0; t < kProducts; ++t) {
    cpu::gemm_serial<float>({serial[t].data(), m, n}, as[t].cview(), Trans::N, bs[t].cview(), Trans::T);
    cpu::gemm<float>({threaded[t].data(), m, n}, as[t].cview(), Trans::N, bs[t].cview(), Trans::T);
  }
  for (int t = 0; t < kProducts; ++t) {
    CHECK(serial[t] == ref[t]);
    CHECK(threaded[t] == ref[t]);
  }
  // Spot-check ref itself against a loop.
  double s = 0;
  for (index_t p = 0; p < k; ++p) s += double(as[3].at(7, p)) * bs[3].at(11, p);
  CHECK(ref[3][7 * n + 11] == Approx(s).epsilon(1e-5));
}

TEST_CASE("gemm: beta = 0 never reads C, k = 0 only scales C", "[ops][gemm]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(40 * 30, 1.0f), b(30 * 50, 2.0f);
  std::vector<float> c(40 * 50, nan);
  cpu::gemm<float>({c.data(), 40, 50}, {a.data(), 40, 30}, Trans::N, {b.data(), 30, 50}, Trans::N, 1.0f, 0.0f);
  for (float x : c) REQUIRE(x == 60.0f);

  std::vector<float> c2(4 * 5, 3.0f);
  cpu::gemm<float>({c2.data(), 4, 5}, {a.data(), 4, 0}, Trans::N, {b.data(), 0, 5}, Trans::N, 1.0f, 0.5f);
  for (float x : c2) REQUIRE(x == 1.5f);
}

TEST_CASE("gemm: shape mismatch raises an error naming the op and the shapes", "[ops][gemm][errors]") {
  std::vector<float> a(3 * 4), b(5 * 6), c(3 * 6);
  try {
    cpu::gemm<float>({c.data(), 3, 6}, {a.data(), 3, 4}, Trans::N, {b.data(), 5, 6}, Trans::N);
    FAIL("no error for inner dimensions 4 vs 5");
  } catch (const mom::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("gemm") != std::string::npos);
    CHECK(msg.find("[3x4]") != std::string::npos);
    CHECK(msg.find("[5x6]") != std::string::npos);
  }
  // Wrong C shape for a transposed product: op(A) = [4x3], op(B) = [3x2], C must be [4x2].
  std::vector<float> c2(3 * 2);
  CHECK_THROWS_AS(cpu::gemm_serial<float>({c2.data(), 3, 2}, {a.data(), 3, 4}, Trans::T, {b.data(), 2, 3}, Trans::T),
                  mom::Error);
  std::vector<double> ad(3 * 4), cd(4 * 4);
  CHECK_THROWS_WITH(cpu::gemm<double>({cd.data(), 4, 4}, {ad.data(), 3, 4}, Trans::T, {ad.data(), 3, 4}, Trans::T),
                    Catch::Contains("gemm") && Catch::Contains("shapes do not agree"));
}

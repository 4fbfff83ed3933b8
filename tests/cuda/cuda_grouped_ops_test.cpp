// Cross-backend cases for the grouped ops of cuda::Backend (kernels/grouped_*.cuh): every op against
// cpu::Backend<T> (backend/cpu/grouped.hpp) on the same random inputs, over several row-group layouts:
// empty groups (first, middle, last), offsets[0] > 0, rows after offsets[count] (the SKIP range),
// one group, and sizes that are no tile multiples (d = 70, out = 130). Backward ops start from
// random gradients (accumulation is checked). Rows outside [offsets[0], offsets[count]) must come
// back bit-for-bit as they were (a sentinel for forward outputs), and their indices are set out of
// range so that reading them would raise a device error. Per-group tensors are laid out in reverse
// group order with gaps between them, so PerGroup::at is really used.
//
// Tolerances (max |gpu - cpu| / max |cpu|): double 1e-12, float 1e-5 (GEMMs with Precision::FP32).
// The float GEMMs' tensor-core paths (TF32, BF16) are compared with a double reference computed from
// operands rounded independently of the kernels: 1e-5, and at least 2e-5 (TF32) / 2e-4 (BF16) away
// from the unrounded product, so the rounding is really in use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

template <class T>
constexpr double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;


// Rows of a [rows × cols] device matrix outside [lo, hi) must be exactly as before the op.
template <class T>
void expect_untouched(const std::vector<T>& got, const std::vector<T>& initial, const std::string& what, index_t cols,
                      index_t lo, index_t hi) {
  const index_t rows = ssize(got) / cols;
  bool untouched = true;
  for (index_t r = 0; r < rows; ++r)
    if (r < lo || r >= hi)
      for (index_t c = 0; c < cols; ++c)
        untouched = untouched && got[std::size_t(r * cols + c)] == initial[std::size_t(r * cols + c)];
  INFO(what << ": rows outside [" << lo << ", " << hi << ") untouched");
  CHECK(untouched);
}
// Device copy within tol of the CPU copy (and, with cols, untouched outside rows [lo, hi)).
template <class T>
void expect_close(Arr<T>& a, const std::string& what, index_t cols = 0, index_t lo = 0, index_t hi = 0) {
  const auto got = a.fetch();
  const double err = test::rel_error(got, a.h);
  INFO(what << ": relative error " << err << " (tolerance " << tol<T> << ")");
  CHECK(err <= tol<T>);
  if (cols > 0) expect_untouched(got, a.initial, what, cols, lo, hi);
}

// A row-group layout over `rows` packed rows.
struct Layout {
  index_t rows;
  std::vector<token_t> offsets;
  int count() const { return int(offsets.size()) - 1; }
  index_t lo() const { return offsets.front(); }
  index_t hi() const { return offsets.back(); }
};
// max_row_groups groups over 200 of 230 rows: runs of empty groups between groups of 1 to 9 rows.
Layout many_groups() {
  Layout L{230, {}};
  test::Rng rng(70);
  token_t o = 20;
  for (int g = 0; g <= max_row_groups; ++g) {
    L.offsets.push_back(std::min<token_t>(o, 220));
    if (rng.integer(0, 3) == 0) o += token_t(rng.integer(1, 9));
  }
  L.offsets.back() = 220;
  return L;
}
std::vector<Layout> layouts() {
  return {
      {300, {5, 70, 70, 200, 260}},               // offsets[0] > 0, an empty group, a SKIP range
      {130, {0, 130}},                            // one group, every row
      {64, {0, 0, 64, 64}},                       // empty first and last groups
      {200, {3, 3, 40, 41, 41, 41, 130, 131, 190, 190}},  // nine groups, one-row groups
      {50, {10, 10, 10}},                         // no grouped rows at all
      many_groups(),                              // max_row_groups groups, most of them empty
  };
}

// Group g's tensor of `size` elements at (count - 1 - g)·(size + 7): reverse order, with gaps.
inline index_t pg_stride(index_t size) { return size + 7; }
template <class U>
PerGroup<U> per_group(U* base, int count, index_t size) {
  return PerGroup<U>(base, count, [&](int g) { return index_t(count - 1 - g) * pg_stride(size); });
}

// Row indices into a table of n rows for the grouped rows; -1 (out of range: a device error if read)
// for the others.
std::vector<token_t> grouped_indices(const Layout& L, index_t n, test::Rng& rng) {
  std::vector<token_t> v(static_cast<std::size_t>(L.rows), -1);
  for (index_t r = L.lo(); r < L.hi(); ++r) v[std::size_t(r)] = token_t(rng.integer(0, int(n) - 1));
  return v;
}

// Full fp32 grouped GEMMs for the duration of a case (float follows the backend's precision,
// TF32 by default; the tensor-core paths have their own case below).
template <class T>
struct Fp32Gemms {
  Fp32Gemms() { gpu<T>().set_precision(cuda::Precision::FP32); }
  ~Fp32Gemms() { gpu<T>().set_precision(cuda::Precision::TF32); }
};

template <class T>
struct Groups {
  Arr<T, token_t> offsets;
  int count;
  explicit Groups(const Layout& L) : offsets(L.offsets), count(L.count()) {}
  RowGroups h() { return {offsets.h.data(), count}; }
  RowGroups d() { return {offsets.d.data(), count}; }
};

}  // namespace

TEMPLATE_TEST_CASE("grouped linear forward/backward match cpu (empty groups, SKIP rows, ragged tiles)",
                   "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const Fp32Gemms<T> fp32;
  test::Rng rng(71);
  for (const auto& [in, out] : {std::pair<index_t, index_t>{70, 130}, {16, 64}, {3, 1}})
    for (const Layout& L : layouts())
      for (const bool bias : {true, false}) {
        INFO("in " << in << " out " << out << " rows " << L.rows << " groups " << L.count() << " bias " << bias);
        const int G = L.count();
        const index_t R = L.rows;
        Groups<T> g(L);
        auto x = rand_arr<T>(R * in, rng), y = const_arr<T>(R * out, T(-3.25));
        auto w = rand_arr<T>(G * pg_stride(out * in), rng), b = rand_arr<T>(G * pg_stride(out), rng);
        const auto wh = per_group<const T>(w.h.data(), G, out * in), wd = per_group<const T>(w.d.data(), G, out * in);
        const auto bh = bias ? per_group<const T>(b.h.data(), G, out) : PerGroup<const T>{};
        const auto bd = bias ? per_group<const T>(b.d.data(), G, out) : PerGroup<const T>{};
        host<T>().grouped_linear_forward(y.hm(R, out), x.hm(R, in), wh, bh, g.h());
        gpu<T>().grouped_linear_forward(y.dm(R, out), x.dm(R, in), wd, bd, g.d());
        expect_close(y, "y", out, L.lo(), L.hi());

        auto dy = rand_arr<T>(R * out, rng), dx = rand_arr<T>(R * in, rng);
        auto dw = rand_arr<T>(G * pg_stride(out * in), rng), db = rand_arr<T>(G * pg_stride(out), rng);
        host<T>().grouped_linear_backward(dx.hm(R, in), per_group(dw.h.data(), G, out * in),
                                          bias ? per_group(db.h.data(), G, out) : PerGroup<T>{}, dy.hm(R, out),
                                          x.hm(R, in), wh, g.h());
        gpu<T>().grouped_linear_backward(dx.dm(R, in), per_group(dw.d.data(), G, out * in),
                                         bias ? per_group(db.d.data(), G, out) : PerGroup<T>{}, dy.dm(R, out),
                                         x.dm(R, in), wd, g.d());
        expect_close(dx, "dx", in, L.lo(), L.hi());
        expect_close(dw, "dw");
        expect_close(db, "db");

        // Each gradient alone (the others empty): dx only, dW only, db only.
        auto dx2 = rand_arr<T>(R * in, rng), dw2 = rand_arr<T>(G * pg_stride(out * in), rng),
             db2 = rand_arr<T>(G * pg_stride(out), rng);
        host<T>().grouped_linear_backward(dx2.hm(R, in), {}, {}, dy.hm(R, out), x.hm(R, in), wh, g.h());
        gpu<T>().grouped_linear_backward(dx2.dm(R, in), {}, {}, dy.dm(R, out), x.dm(R, in), wd, g.d());
        host<T>().grouped_linear_backward({}, per_group(dw2.h.data(), G, out * in), {}, dy.hm(R, out), x.hm(R, in), wh,
                                          g.h());
        gpu<T>().grouped_linear_backward({}, per_group(dw2.d.data(), G, out * in), {}, dy.dm(R, out), x.dm(R, in), wd,
                                         g.d());
        host<T>().grouped_linear_backward({}, {}, per_group(db2.h.data(), G, out), dy.hm(R, out), x.hm(R, in), wh,
                                          g.h());
        gpu<T>().grouped_linear_backward({}, {}, per_group(db2.d.data(), G, out), dy.dm(R, out), x.dm(R, in), wd,
                                         g.d());
        expect_close(dx2, "dx alone", in, L.lo(), L.hi());
        expect_close(dw2, "dw alone");
        expect_close(db2, "db alone");

        // dx overwritten (Store::overwrite) on the groups' rows, the others untouched.
        auto dx3 = rand_arr<T>(R * in, rng);
        host<T>().grouped_linear_backward(dx3.hm(R, in), {}, {}, dy.hm(R, out), x.hm(R, in), wh, g.h(), Store::overwrite);
        gpu<T>().grouped_linear_backward(dx3.dm(R, in), {}, {}, dy.dm(R, out), x.dm(R, in), wd, g.d(), Store::overwrite);
        expect_close(dx3, "dx overwritten", in, L.lo(), L.hi());
      }
}

TEMPLATE_TEST_CASE("grouped linear over gathered rows matches cpu (SKIP rows never read)", "[cuda][grouped]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const Fp32Gemms<T> fp32;
  test::Rng rng(76);
  const index_t in = 70, out = 130, Tn = 41;
  for (const Layout& L : layouts()) {
    INFO("rows " << L.rows << " groups " << L.count());
    const int G = L.count();
    const index_t R = L.rows;
    Groups<T> g(L);
    auto idx = Arr<T, token_t>(grouped_indices(L, Tn, rng));  // -1 outside the groups: an error if read
    const std::span<const token_t> ih(idx.h), id(idx.d.span());
    auto table = rand_arr<T>(Tn * in, rng), y = const_arr<T>(R * out, T(-3.25));
    auto w = rand_arr<T>(G * pg_stride(out * in), rng), b = rand_arr<T>(G * pg_stride(out), rng);
    const auto wh = per_group<const T>(w.h.data(), G, out * in), wd = per_group<const T>(w.d.data(), G, out * in);
    host<T>().grouped_linear_forward(y.hm(R, out), table.hm(Tn, in), ih, wh, per_group<const T>(b.h.data(), G, out), g.h());
    gpu<T>().grouped_linear_forward(y.dm(R, out), table.dm(Tn, in), id, wd, per_group<const T>(b.d.data(), G, out), g.d());
    expect_close(y, "y gathered", out, L.lo(), L.hi());
    auto dy = rand_arr<T>(R * out, rng), dx = rand_arr<T>(R * in, rng);
    auto dw = rand_arr<T>(G * pg_stride(out * in), rng), db = rand_arr<T>(G * pg_stride(out), rng);
    for (const Store st : {Store::add, Store::overwrite}) {
      host<T>().grouped_linear_backward(dx.hm(R, in), per_group(dw.h.data(), G, out * in), per_group(db.h.data(), G, out),
                                        dy.hm(R, out), table.hm(Tn, in), ih, wh, g.h(), st);
      gpu<T>().grouped_linear_backward(dx.dm(R, in), per_group(dw.d.data(), G, out * in), per_group(db.d.data(), G, out),
                                       dy.dm(R, out), table.dm(Tn, in), id, wd, g.d(), st);
      expect_close(dx, st == Store::add ? "dx gathered" : "dx gathered, overwritten", in, L.lo(), L.hi());
      expect_close(dw, "dw gathered");
      expect_close(db, "db gathered");
    }
    gpu<T>().sync();  // no index error: the SKIP rows' -1 indices were never read
  }
}

TEMPLATE_TEST_CASE("grouped linear: large group with many k steps matches cpu", "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const Fp32Gemms<T> fp32;
  test::Rng rng(72);
  const Layout L{700, {1, 450, 451, 690}};  // a 449-row group: 8 row tiles, 29 k steps in dW
  const index_t in = 200, out = 67;
  const int G = L.count();
  const index_t R = L.rows;
  Groups<T> g(L);
  auto x = rand_arr<T>(R * in, rng), y = const_arr<T>(R * out, T(7));
  auto w = rand_arr<T>(G * pg_stride(out * in), rng), b = rand_arr<T>(G * pg_stride(out), rng);
  const auto wh = per_group<const T>(w.h.data(), G, out * in), wd = per_group<const T>(w.d.data(), G, out * in);
  host<T>().grouped_linear_forward(y.hm(R, out), x.hm(R, in), wh, per_group<const T>(b.h.data(), G, out), g.h());
  gpu<T>().grouped_linear_forward(y.dm(R, out), x.dm(R, in), wd, per_group<const T>(b.d.data(), G, out), g.d());
  expect_close(y, "y", out, L.lo(), L.hi());
  auto dy = rand_arr<T>(R * out, rng), dx = rand_arr<T>(R * in, rng);
  auto dw = rand_arr<T>(G * pg_stride(out * in), rng), db = rand_arr<T>(G * pg_stride(out), rng);
  host<T>().grouped_linear_backward(dx.hm(R, in), per_group(dw.h.data(), G, out * in), per_group(db.h.data(), G, out),
                                    dy.hm(R, out), x.hm(R, in), wh, g.h());
  gpu<T>().grouped_linear_backward(dx.dm(R, in), per_group(dw.d.data(), G, out * in), per_group(db.d.data(), G, out),
                                   dy.dm(R, out), x.dm(R, in), wd, g.d());
  expect_close(dx, "dx", in, L.lo(), L.hi());
  expect_close(dw, "dw");
  expect_close(db, "db");
}

namespace {
// TF32 (cvt.rna: 11 significant bits, ties away from zero) and bf16 (8 significant bits, ties to
// even) of x, computed with frexp independently of the kernels' bit manipulation.
double tf32_reference(float x) {
  int e = 0;
  const double f = std::frexp(double(x), &e);
  return std::ldexp(std::round(std::ldexp(f, 11)), e - 11);
}
double bf16_reference(float x) {
  int e = 0;
  const double f = std::frexp(double(x), &e);
  return std::ldexp(std::nearbyint(std::ldexp(f, 8)), e - 8);
}
double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b, double& scale) {
  double m = 0;
  scale = 1e-300;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return m;
}
}  // namespace

namespace {
// Elements of a and b that differ (a count: Catch would print the vectors).
std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), std::size_t(0), std::plus<>(),
                            [](float u, float v) { return std::size_t(u != v); });
}
// x [rows × cols] behind a random row permutation, for the ops that read x's rows through an index list:
// table[perm[r]] = x[r], so index r = perm[r] reads x's row r.
template <class T>
std::pair<std::vector<token_t>, std::vector<T>> shuffled_rows(const std::vector<T>& x, index_t cols, test::Rng& rng) {
  std::vector<token_t> perm(x.size() / std::size_t(cols));
  std::iota(perm.begin(), perm.end(), token_t(0));
  for (std::size_t r = perm.size(); r > 1; --r) std::swap(perm[r - 1], perm[std::size_t(rng.integer(0, int(r) - 1))]);
  std::vector<T> table(x.size());
  for (std::size_t r = 0; r < perm.size(); ++r)
    std::copy_n(x.begin() + std::ptrdiff_t(r) * cols, cols, table.begin() + std::ptrdiff_t(perm[r]) * cols);
  return {perm, table};
}
}  // namespace

// Both widths of each operand: 70 and 130 (rows not 16-byte aligned: element loads) and 68 and 132 (16-byte loads
// where the bf16 tile can, with a partial last k step and column tile). x is also read through an index list from a
// shuffled copy of it: the same values through the same products, so the same bits.
TEST_CASE("grouped linear on tensor cores (TF32, BF16): rounded operands, fp32 accumulation, exact bias gradient",
          "[cuda][grouped]") {
  MOM_REQUIRE_GPU();
  using T = float;
  auto& be = gpu<T>();
  test::Rng rng(76);
  for (const auto precision : {cuda::Precision::TF32, cuda::Precision::BF16})
    for (const auto [in, out] : {std::pair<index_t, index_t>{70, 130}, std::pair<index_t, index_t>{68, 132}})
    for (const Layout& L : {Layout{300, {5, 70, 70, 200, 260}}, Layout{130, {0, 130}}}) {
      const bool tf32 = precision == cuda::Precision::TF32;
      INFO((tf32 ? "TF32" : "BF16") << " in " << in << " out " << out << " rows " << L.rows << " groups " << L.count());
      const auto round = [&](float v) { return tf32 ? tf32_reference(v) : bf16_reference(v); };
      const double min_effect = tf32 ? 2e-5 : 2e-4;
      const int G = L.count();
      const index_t R = L.rows;
      Groups<T> g(L);
      auto x = rand_arr<T>(R * in, rng), y = const_arr<T>(R * out, T(-3.25));
      auto w = rand_arr<T>(G * pg_stride(out * in), rng), b = rand_arr<T>(G * pg_stride(out), rng);
      auto dy = rand_arr<T>(R * out, rng), dx = rand_arr<T>(R * in, rng);
      auto dw = rand_arr<T>(G * pg_stride(out * in), rng), db = rand_arr<T>(G * pg_stride(out), rng);
      const auto wh = per_group<const T>(w.h.data(), G, out * in), wd = per_group<const T>(w.d.data(), G, out * in);
      const auto at = [&](int gi, index_t size) { return std::size_t(index_t(G - 1 - gi) * pg_stride(size)); };
      // Double references from rounded operands, starting from the initial values.
      std::vector<double> yr(y.initial.begin(), y.initial.end()), dxr(dx.initial.begin(), dx.initial.end()),
          dwr(dw.initial.begin(), dw.initial.end());
      for (int gi = 0; gi < G; ++gi)
        for (index_t r = L.offsets[std::size_t(gi)]; r < L.offsets[std::size_t(gi) + 1]; ++r)
          for (index_t o = 0; o < out; ++o) {
            double s = b.h[at(gi, out) + std::size_t(o)];
            for (index_t k = 0; k < in; ++k) {
              const double wv = round(w.h[at(gi, out * in) + std::size_t(o * in + k)]);
              s += round(x.h[std::size_t(r * in + k)]) * wv;
              const double dyv = round(dy.h[std::size_t(r * out + o)]);
              dxr[std::size_t(r * in + k)] += dyv * wv;
              dwr[at(gi, out * in) + std::size_t(o * in + k)] += dyv * round(x.h[std::size_t(r * in + k)]);
            }
            yr[std::size_t(r * out + o)] = s;
          }
      const index_t grows = be.context().bf16_stage_grows;
      be.set_precision(precision);
      be.grouped_linear_forward(y.dm(R, out), x.dm(R, in), wd, per_group<const T>(b.d.data(), G, out), g.d());
      be.grouped_linear_backward(dx.dm(R, in), per_group(dw.d.data(), G, out * in), per_group(db.d.data(), G, out),
                                 dy.dm(R, out), x.dm(R, in), wd, g.d());
      be.set_precision(cuda::Precision::TF32);
      CHECK(be.context().bf16_stage_grows == grows);  // operands are converted in shared memory: no staging buffer
      host<T>().grouped_linear_forward(y.hm(R, out), x.hm(R, in), wh, per_group<const T>(b.h.data(), G, out), g.h());
      host<T>().grouped_linear_backward(dx.hm(R, in), per_group(dw.h.data(), G, out * in),
                                        per_group(db.h.data(), G, out), dy.hm(R, out), x.hm(R, in), wh, g.h());
      for (auto [arr, ref, name] :
           {std::tuple{&y, &yr, "y"}, std::tuple{&dx, &dxr, "dx"}, std::tuple{&dw, &dwr, "dw"}}) {
        const auto got = arr->fetch();
        double scale = 0;
        const double err = max_abs_diff(got, *ref, scale) / scale;
        const double effect = test::rel_error(got, arr->h);  // against the CPU's unrounded fp32 product
        INFO(name << ": error " << err << " against the rounded-operand reference, " << effect
                  << " against the unrounded product");
        CHECK(err <= 1e-5);
        CHECK(effect >= min_effect);
      }
      expect_close(db, "db (full precision)");
      expect_untouched(y.fetch(), y.initial, "y", out, L.lo(), L.hi());
      expect_untouched(dx.fetch(), dx.initial, "dx", in, L.lo(), L.hi());
      // x's rows through an index list: table[perm[r]] = x[r], index r = perm[r].
      const auto [perm, shuffled] = shuffled_rows(x.initial, in, rng);
      Arr<T> table(shuffled), y2(y.initial), dx2(dx.initial), dw2(dw.initial), db2(db.initial);
      auto idx = Arr<T, token_t>(perm);
      const std::span<const token_t> id(idx.d.span());
      be.set_precision(precision);
      be.grouped_linear_forward(y2.dm(R, out), table.dm(R, in), id, wd, per_group<const T>(b.d.data(), G, out), g.d());
      be.grouped_linear_backward(dx2.dm(R, in), per_group(dw2.d.data(), G, out * in), per_group(db2.d.data(), G, out),
                                 dy.dm(R, out), table.dm(R, in), id, wd, g.d());
      be.set_precision(cuda::Precision::TF32);
      for (auto [a, b2, name] : {std::tuple{&y, &y2, "y"}, std::tuple{&dx, &dx2, "dx"}, std::tuple{&dw, &dw2, "dw"},
                                 std::tuple{&db, &db2, "db"}}) {
        INFO(name << " through the index list");
        CHECK(differing(a->fetch(), b2->fetch()) == 0);
      }
    }
}

TEMPLATE_TEST_CASE("grouped layernorm forward/backward match cpu", "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(73);
  for (const index_t d : {index_t(8), index_t(70), index_t(300)})
    for (const Layout& L : layouts()) {
      INFO("d " << d << " rows " << L.rows << " groups " << L.count());
      const int G = L.count();
      const index_t R = L.rows;
      Groups<T> g(L);
      auto x = rand_arr<T>(R * d, rng, -2, 3), out = const_arr<T>(R * d, T(-3.25));
      auto mean = const_arr<T>(R, T(-3.25)), rstd = const_arr<T>(R, T(-3.25));
      auto ga = rand_arr<T>(G * pg_stride(d), rng), be = rand_arr<T>(G * pg_stride(d), rng);
      host<T>().grouped_layernorm_forward(out.hm(R, d), mean.hs(), rstd.hs(), x.hm(R, d),
                                          per_group<const T>(ga.h.data(), G, d), per_group<const T>(be.h.data(), G, d),
                                          g.h());
      gpu<T>().grouped_layernorm_forward(out.dm(R, d), mean.ds(), rstd.ds(), x.dm(R, d),
                                         per_group<const T>(ga.d.data(), G, d), per_group<const T>(be.d.data(), G, d),
                                         g.d());
      expect_close(out, "out", d, L.lo(), L.hi());
      expect_close(mean, "mean", 1, L.lo(), L.hi());
      expect_close(rstd, "rstd", 1, L.lo(), L.hi());
      // Backward from the CPU's statistics (the SKIP rows' sentinel included: they must not be read).
      auto m2 = Arr<T>(mean.h), r2 = Arr<T>(rstd.h);
      auto dout = rand_arr<T>(R * d, rng), dx = rand_arr<T>(R * d, rng);
      auto dg = rand_arr<T>(G * pg_stride(d), rng), db = rand_arr<T>(G * pg_stride(d), rng);
      host<T>().grouped_layernorm_backward(dx.hm(R, d), per_group(dg.h.data(), G, d), per_group(db.h.data(), G, d),
                                           dout.hm(R, d), x.hm(R, d), std::span<const T>(m2.hs()),
                                           std::span<const T>(r2.hs()), per_group<const T>(ga.h.data(), G, d), g.h());
      gpu<T>().grouped_layernorm_backward(dx.dm(R, d), per_group(dg.d.data(), G, d), per_group(db.d.data(), G, d),
                                          dout.dm(R, d), x.dm(R, d), std::span<const T>(m2.ds()),
                                          std::span<const T>(r2.ds()), per_group<const T>(ga.d.data(), G, d), g.d());
      expect_close(dx, "dx", d, L.lo(), L.hi());
      expect_close(dg, "dgamma");
      expect_close(db, "dbeta");
      // Parameter gradients alone, and dx alone.
      auto dx2 = rand_arr<T>(R * d, rng), dg2 = rand_arr<T>(G * pg_stride(d), rng);
      host<T>().grouped_layernorm_backward({}, per_group(dg2.h.data(), G, d), {}, dout.hm(R, d), x.hm(R, d),
                                           std::span<const T>(m2.hs()), std::span<const T>(r2.hs()),
                                           per_group<const T>(ga.h.data(), G, d), g.h());
      gpu<T>().grouped_layernorm_backward({}, per_group(dg2.d.data(), G, d), {}, dout.dm(R, d), x.dm(R, d),
                                          std::span<const T>(m2.ds()), std::span<const T>(r2.ds()),
                                          per_group<const T>(ga.d.data(), G, d), g.d());
      host<T>().grouped_layernorm_backward(dx2.hm(R, d), {}, {}, dout.hm(R, d), x.hm(R, d), std::span<const T>(m2.hs()),
                                           std::span<const T>(r2.hs()), per_group<const T>(ga.h.data(), G, d), g.h());
      gpu<T>().grouped_layernorm_backward(dx2.dm(R, d), {}, {}, dout.dm(R, d), x.dm(R, d), std::span<const T>(m2.ds()),
                                          std::span<const T>(r2.ds()), per_group<const T>(ga.d.data(), G, d), g.d());
      expect_close(dg2, "dgamma alone");
      expect_close(dx2, "dx alone", d, L.lo(), L.hi());
      // dx overwritten (Store::overwrite): its old values unread, the rows outside the groups untouched.
      auto dx3 = rand_arr<T>(R * d, rng);
      host<T>().grouped_layernorm_backward(dx3.hm(R, d), {}, {}, dout.hm(R, d), x.hm(R, d), std::span<const T>(m2.hs()),
                                           std::span<const T>(r2.hs()), per_group<const T>(ga.h.data(), G, d), g.h(),
                                           Store::overwrite);
      gpu<T>().grouped_layernorm_backward(dx3.dm(R, d), {}, {}, dout.dm(R, d), x.dm(R, d), std::span<const T>(m2.ds()),
                                          std::span<const T>(r2.ds()), per_group<const T>(ga.d.data(), G, d), g.d(),
                                          Store::overwrite);
      expect_close(dx3, "dx overwritten", d, L.lo(), L.hi());
      // x's rows through an index list (a routed FFN's LayerNorm reading its token rows in place): table[perm[r]] =
      // x[r], index r = perm[r]; the same results as above.
      const auto [perm, shuffled] = shuffled_rows(x.h, d, rng);
      Arr<T> table(shuffled), out4(const_arr<T>(R * d, T(-3.25)).h), mean4(const_arr<T>(R, T(-3.25)).h),
          rstd4(mean4.h), dx4(dx3.h), dg4(dg2.h), db4(db.h);
      auto idx = Arr<T, token_t>(perm);
      host<T>().grouped_layernorm_forward(out4.hm(R, d), mean4.hs(), rstd4.hs(), table.hm(R, d), perm,
                                          per_group<const T>(ga.h.data(), G, d), per_group<const T>(be.h.data(), G, d),
                                          g.h());
      gpu<T>().grouped_layernorm_forward(out4.dm(R, d), mean4.ds(), rstd4.ds(), table.dm(R, d), idx.d.span(),
                                         per_group<const T>(ga.d.data(), G, d), per_group<const T>(be.d.data(), G, d),
                                         g.d());
      expect_close(out4, "out, x through the index", d, L.lo(), L.hi());
      expect_close(mean4, "mean, x through the index", 1, L.lo(), L.hi());
      host<T>().grouped_layernorm_backward(dx4.hm(R, d), per_group(dg4.h.data(), G, d), per_group(db4.h.data(), G, d),
                                           dout.hm(R, d), table.hm(R, d), perm, std::span<const T>(m2.hs()),
                                           std::span<const T>(r2.hs()), per_group<const T>(ga.h.data(), G, d), g.h(),
                                           Store::overwrite);
      gpu<T>().grouped_layernorm_backward(dx4.dm(R, d), per_group(dg4.d.data(), G, d), per_group(db4.d.data(), G, d),
                                          dout.dm(R, d), table.dm(R, d), idx.d.span(), std::span<const T>(m2.ds()),
                                          std::span<const T>(r2.ds()), per_group<const T>(ga.d.data(), G, d), g.d(),
                                          Store::overwrite);
      expect_close(dx4, "dx, x through the index", d, L.lo(), L.hi());
      expect_close(dg4, "dgamma, x through the index");
      expect_close(db4, "dbeta, x through the index");
      if (d == 8 && L.hi() > L.lo()) {  // an index outside x: a device error at the next sync, its row skipped
        auto bad = perm;
        bad[std::size_t(L.lo())] = token_t(R + 5);
        auto bad_idx = Arr<T, token_t>(bad);
        const std::string what = "gather_rows: idx " + std::to_string(R + 5) + " at position " +
                                 std::to_string(L.lo()) + " is out of range [0, " + std::to_string(R) + ")";
        gpu<T>().grouped_layernorm_forward(out4.dm(R, d), mean4.ds(), rstd4.ds(), table.dm(R, d), bad_idx.d.span(),
                                           per_group<const T>(ga.d.data(), G, d),
                                           per_group<const T>(be.d.data(), G, d), g.d());
        test::require_device_error(gpu<T>(), what);
        gpu<T>().grouped_layernorm_backward(dx4.dm(R, d), per_group(dg4.d.data(), G, d), per_group(db4.d.data(), G, d),
                                            dout.dm(R, d), table.dm(R, d), bad_idx.d.span(), std::span<const T>(m2.ds()),
                                            std::span<const T>(r2.ds()), per_group<const T>(ga.d.data(), G, d), g.d());
        test::require_device_error(gpu<T>(), what);
      }
    }
}

TEMPLATE_TEST_CASE("grouped gelu, add, axpy, zero_rows, gather and scatter-add match cpu", "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(74);
  const index_t d = 70, Tn = 23;
  for (const Layout& L : layouts()) {
    INFO("rows " << L.rows << " groups " << L.count());
    const int G = L.count();
    const index_t R = L.rows;
    Groups<T> g(L);
    auto x = rand_arr<T>(R * d, rng, -3, 3), out = const_arr<T>(R * d, T(-3.25));
    host<T>().gelu_forward(out.hm(R, d), x.hm(R, d), g.h());
    gpu<T>().gelu_forward(out.dm(R, d), x.dm(R, d), g.d());
    expect_close(out, "gelu", d, L.lo(), L.hi());
    auto dout = rand_arr<T>(R * d, rng), dx = rand_arr<T>(R * d, rng);
    host<T>().gelu_backward(dx.hm(R, d), x.hm(R, d), dout.hm(R, d), g.h());
    gpu<T>().gelu_backward(dx.dm(R, d), x.dm(R, d), dout.dm(R, d), g.d());
    expect_close(dx, "gelu backward", d, L.lo(), L.hi());
    auto dx_over = rand_arr<T>(R * d, rng);  // Store::overwrite: the old values unread
    host<T>().gelu_backward(dx_over.hm(R, d), x.hm(R, d), dout.hm(R, d), g.h(), Store::overwrite);
    gpu<T>().gelu_backward(dx_over.dm(R, d), x.dm(R, d), dout.dm(R, d), g.d(), Store::overwrite);
    expect_close(dx_over, "gelu backward, overwritten", d, L.lo(), L.hi());
    auto sum = const_arr<T>(R * d, T(-3.25));  // add_forward, then axpy into the sum (aliasing y)
    host<T>().add_forward(sum.hm(R, d), x.hm(R, d), dout.hm(R, d), g.h());
    gpu<T>().add_forward(sum.dm(R, d), x.dm(R, d), dout.dm(R, d), g.d());
    expect_close(sum, "add_forward", d, L.lo(), L.hi());
    host<T>().axpy(sum.hm(R, d), T(-0.75), x.hm(R, d), g.h());
    gpu<T>().axpy(sum.dm(R, d), T(-0.75), x.dm(R, d), g.d());
    expect_close(sum, "axpy", d, L.lo(), L.hi());
    auto z = rand_arr<T>(R * d, rng);
    host<T>().zero_rows(z.hm(R, d), g.h());
    gpu<T>().zero_rows(z.dm(R, d), g.d());
    expect_close(z, "zero_rows", d, L.lo(), L.hi());

    // Shared table; indices of the SKIP rows are -1 (reading them would raise at the next sync).
    auto idx = Arr<T, token_t>(grouped_indices(L, Tn, rng));
    const std::span<const token_t> ih(idx.h), id(idx.d.span());
    auto table = rand_arr<T>(Tn * d, rng), packed = const_arr<T>(R * d, T(-3.25));
    host<T>().gather_rows(packed.hm(R, d), table.hm(Tn, d), ih, g.h());
    gpu<T>().gather_rows(packed.dm(R, d), table.dm(Tn, d), id, g.d());
    expect_close(packed, "gather_rows", d, L.lo(), L.hi());
    // Per-group tables [Tn × d] at in[g].
    auto tables = rand_arr<T>(G * pg_stride(Tn * d), rng), packed2 = const_arr<T>(R * d, T(-3.25));
    host<T>().gather_rows(packed2.hm(R, d), per_group<const T>(tables.h.data(), G, Tn * d), Tn, ih, g.h());
    gpu<T>().gather_rows(packed2.dm(R, d), per_group<const T>(tables.d.data(), G, Tn * d), Tn, id, g.d());
    expect_close(packed2, "gather_rows per group", d, L.lo(), L.hi());

    auto src = rand_arr<T>(R * d, rng), wts = rand_arr<T>(R, rng);
    for (const bool weighted : {true, false}) {
      INFO("weighted " << weighted);
      const std::span<const T> wh = weighted ? std::span<const T>(wts.hs()) : std::span<const T>();
      const std::span<const T> wd = weighted ? std::span<const T>(wts.ds()) : std::span<const T>();
      auto acc = rand_arr<T>(Tn * d, rng);
      host<T>().scatter_add_rows(acc.hm(Tn, d), src.hm(R, d), ih, wh, g.h());
      gpu<T>().scatter_add_rows(acc.dm(Tn, d), src.dm(R, d), id, wd, g.d());
      expect_close(acc, "scatter_add_rows");
      auto din = rand_arr<T>(R * d, rng), dwts = rand_arr<T>(R, rng);
      host<T>().scatter_add_rows_backward(din.hm(R, d), dwts.hs(), acc.hm(Tn, d), src.hm(R, d), ih, wh, g.h());
      gpu<T>().scatter_add_rows_backward(din.dm(R, d), dwts.ds(), acc.dm(Tn, d), src.dm(R, d), id, wd, g.d());
      expect_close(din, "scatter_add_rows_backward din", d, L.lo(), L.hi());
      expect_close(dwts, "scatter_add_rows_backward dweights", 1, L.lo(), L.hi());
      auto din2 = rand_arr<T>(R * d, rng);
      host<T>().scatter_add_rows_backward(din2.hm(R, d), {}, acc.hm(Tn, d), src.hm(R, d), ih, wh, g.h());
      gpu<T>().scatter_add_rows_backward(din2.dm(R, d), {}, acc.dm(Tn, d), src.dm(R, d), id, wd, g.d());
      expect_close(din2, "scatter_add_rows_backward din alone", d, L.lo(), L.hi());
      auto din3 = rand_arr<T>(R * d, rng), dwts3 = rand_arr<T>(R, rng);
      host<T>().scatter_add_rows_backward(din3.hm(R, d), dwts3.hs(), acc.hm(Tn, d), src.hm(R, d), ih, wh, g.h(),
                                          Store::overwrite);
      gpu<T>().scatter_add_rows_backward(din3.dm(R, d), dwts3.ds(), acc.dm(Tn, d), src.dm(R, d), id, wd, g.d(),
                                         Store::overwrite);
      expect_close(din3, "scatter_add_rows_backward din overwritten", d, L.lo(), L.hi());
      expect_close(dwts3, "scatter_add_rows_backward dweights overwritten", 1, L.lo(), L.hi());
    }
    auto accs = rand_arr<T>(G * pg_stride(Tn * d), rng);
    host<T>().scatter_add_rows(per_group(accs.h.data(), G, Tn * d), Tn, src.hm(R, d), ih, g.h());
    gpu<T>().scatter_add_rows(per_group(accs.d.data(), G, Tn * d), Tn, src.dm(R, d), id, g.d());
    expect_close(accs, "scatter_add_rows per group");
    gpu<T>().sync();  // no index error: the SKIP rows' -1 indices were never read
  }
}

TEST_CASE("grouped ops: host shape errors as the cpu's, bad offsets and indices reported at the next sync",
          "[cuda][grouped]") {
  MOM_REQUIRE_GPU();
  auto& be = gpu<double>();
  test::Rng rng(75);
  const index_t R = 100, in = 20, out = 30;
  auto x = rand_arr<double>(R * in, rng), y = rand_arr<double>(R * out, rng);
  auto w = rand_arr<double>(2 * out * in, rng);
  const auto at = [&](int g) { return index_t(g) * out * in; };
  std::vector<token_t> ok{0, 40, 100};
  auto offs = Arr<double, token_t>(ok);
  const RowGroups gh{offs.h.data(), 2}, gd{offs.d.data(), 2};
  const PerGroup<const double> wh(w.h.data(), 2, at), wd(w.d.data(), 2, at);
  auto expect_same_error = [](auto&& on_cpu, auto&& on_gpu) {
    std::string cpu_msg, gpu_msg;
    try { on_cpu(); } catch (const Error& e) { cpu_msg = e.what(); }
    try { on_gpu(); } catch (const Error& e) { gpu_msg = e.what(); }
    CHECK(!cpu_msg.empty());
    CHECK(gpu_msg == cpu_msg);
  };
  expect_same_error([&] { host<double>().grouped_linear_forward(y.hm(R - 1, out), x.hm(R, in), wh, {}, gh); },
                    [&] { be.grouped_linear_forward(y.dm(R - 1, out), x.dm(R, in), wd, {}, gd); });
  expect_same_error([&] { host<double>().grouped_linear_forward(y.hm(R, out), x.hm(R, in), {}, {}, gh); },
                    [&] { be.grouped_linear_forward(y.dm(R, out), x.dm(R, in), {}, {}, gd); });
  expect_same_error([&] { host<double>().gelu_forward(y.hm(R, out), x.hm(R, in), gh); },
                    [&] { be.gelu_forward(y.dm(R, out), x.dm(R, in), gd); });
  expect_same_error([&] { host<double>().zero_rows(y.hm(R, out), RowGroups{nullptr, 2}); },
                    [&] { be.zero_rows(y.dm(R, out), RowGroups{nullptr, 2}); });

  // Offsets the CPU rejects on the host: the device reports them at the next sync, naming the bad
  // entry, and the kernels stay inside the matrices (offsets clamped to [0, rows]).
  for (const auto& bad :
       {std::vector<token_t>{0, 60, 20}, std::vector<token_t>{0, 40, 150}, std::vector<token_t>{-5, 40, 100}}) {
    INFO("offsets " << bad[0] << " " << bad[1] << " " << bad[2]);
    auto b = Arr<double, token_t>(bad);
    const RowGroups bh{b.h.data(), 2}, bd{b.d.data(), 2};
    std::string cpu_msg;
    try {
      host<double>().grouped_linear_forward(y.hm(R, out), x.hm(R, in), wh, {}, bh);
    } catch (const Error& e) {
      cpu_msg = e.what();
    }
    CHECK_THAT(cpu_msg, Catch::Contains("group offsets must be non-decreasing"));
    const int bad_at = bad[2] == 20 ? 2 : bad[2] == 150 ? 2 : 0;
    const std::string entry = "offsets[" + std::to_string(bad_at) + "] = " + std::to_string(bad[std::size_t(bad_at)]);
    auto expect_reported = [&](auto&& op) {
      op();
      try {
        be.sync();
        FAIL("bad offsets were not reported");
      } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("group offsets must be non-decreasing in [0, 100]") &&
                                 Catch::Contains(entry));
      }
    };
    auto dx = rand_arr<double>(R * in, rng), dw = rand_arr<double>(2 * out * in, rng);
    expect_reported([&] { be.grouped_linear_forward(y.dm(R, out), x.dm(R, in), wd, {}, bd); });
    expect_reported([&] {
      be.grouped_linear_backward(dx.dm(R, in), PerGroup<double>(dw.d.data(), 2, at), {}, y.dm(R, out), x.dm(R, in), wd,
                                 bd);
    });
    expect_reported([&] { be.gelu_forward(dx.dm(R, in), x.dm(R, in), bd); });
    expect_reported([&] { be.zero_rows(dx.dm(R, in), bd); });
    // Ops that look up each row's group (binary search over the offsets) stay in range too.
    auto mean = rand_arr<double>(R, rng), rstd = rand_arr<double>(R, rng), ln = rand_arr<double>(2 * in, rng);
    const PerGroup<const double> gamma(ln.d.data(), 2, [&](int gi) { return index_t(gi) * in; });
    expect_reported(
        [&] { be.grouped_layernorm_forward(dx.dm(R, in), mean.ds(), rstd.ds(), x.dm(R, in), gamma, gamma, bd); });
    auto tables = rand_arr<double>(2 * 10 * in, rng);
    auto zeros = Arr<double, token_t>(std::vector<token_t>(std::size_t(R), 0));
    const auto tat = [&](int gi) { return index_t(gi) * 10 * in; };
    expect_reported([&] {
      be.gather_rows(dx.dm(R, in), PerGroup<const double>(tables.d.data(), 2, tat), 10,
                     std::span<const token_t>(zeros.d.span()), bd);
    });
    expect_reported([&] {
      be.scatter_add_rows(PerGroup<double>(tables.d.data(), 2, tat), 10, x.dm(R, in),
                          std::span<const token_t>(zeros.d.span()), bd);
    });
    be.sync();  // the error was consumed
  }

  // An index out of range inside the grouped rows is reported as for the plain ops.
  std::vector<token_t> ix(static_cast<std::size_t>(R), 0);
  ix[57] = 99;
  auto idx = Arr<double, token_t>(ix);
  auto table = rand_arr<double>(50 * out, rng);
  be.gather_rows(y.dm(R, out), table.dm(50, out), std::span<const token_t>(idx.d.span()), gd);
  try {
    be.sync();
    FAIL("grouped gather_rows with index 99 into 50 rows did not raise");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("gather_rows") && Catch::Contains("99") && Catch::Contains("position 57"));
  }
  be.sync();
}

// The weight gradients take the 128 × 128 tile only where it gives at least dw_wide_tile_blocks blocks, the 64 ×
// 64 one below: 30 groups of a 260 × 260 dW_g is 270 blocks of the wide tile in one launch; each group alone is 9
// (so the narrow tile, 25 blocks). Each dW element is the same k-ordered chain of products at either size: the
// same bits; db's partial sums split the rows differently between the tiles' threads: equal within rounding.
TEST_CASE("grouped weight gradients on tensor cores: the 128 x 128 and 64 x 64 tiles give the same dW bits",
          "[cuda][grouped]") {
  MOM_REQUIRE_GPU();
  using T = float;
  auto& be = gpu<T>();
  test::Rng rng(77);
  const index_t in = 260, out = 260;
  const int G = 30;
  Layout L{0, {3}};
  for (int gi = 0; gi < G; ++gi) L.offsets.push_back(L.offsets.back() + token_t(rng.integer(0, 40)));
  L.rows = L.offsets.back() + 5;
  STATIC_REQUIRE(cuda::dw_wide_tile_blocks <= 9 * 30);  // the one launch takes the wide tile
  STATIC_REQUIRE(cuda::dw_wide_tile_blocks > 9);        // a group alone the narrow one
  const index_t R = L.rows;
  auto x = rand_arr<T>(R * in, rng), dy = rand_arr<T>(R * out, rng), w = rand_arr<T>(G * pg_stride(out * in), rng);
  const auto wd = per_group<const T>(w.d.data(), G, out * in);
  Groups<T> g(L);
  for (const auto precision : {cuda::Precision::TF32, cuda::Precision::BF16}) {
    INFO((precision == cuda::Precision::TF32 ? "TF32" : "BF16"));
    auto dw_all = rand_arr<T>(G * pg_stride(out * in), rng), db_all = rand_arr<T>(G * pg_stride(out), rng);
    Arr<T> dw_one(dw_all.initial), db_one(db_all.initial);
    be.set_precision(precision);
    be.grouped_linear_backward(MatrixView<T>{}, per_group(dw_all.d.data(), G, out * in),
                               per_group(db_all.d.data(), G, out), dy.dm(R, out), x.dm(R, in), wd, g.d());
    for (int gi = 0; gi < G; ++gi) {  // each group's rows as matrices of their own (too few rows to split: dw_splits)
      const index_t lo = L.offsets[std::size_t(gi)], n = L.offsets[std::size_t(gi) + 1] - lo;
      Groups<T> one(Layout{n, {0, token_t(n)}});
      const index_t at_w = index_t(G - 1 - gi) * pg_stride(out * in), at_b = index_t(G - 1 - gi) * pg_stride(out);
      be.grouped_linear_backward(MatrixView<T>{}, per_group(dw_one.d.data() + at_w, 1, out * in),
                                 per_group(db_one.d.data() + at_b, 1, out), dy.dm(R, out).row_block(lo, n),
                                 x.dm(R, in).row_block(lo, n), per_group<const T>(w.d.data(), 1, out * in), one.d());
    }
    be.set_precision(cuda::Precision::TF32);
    const auto a = dw_all.fetch(), b = dw_one.fetch();
    const auto differ = differing(a, b), changed = differing(a, dw_all.initial);
    INFO("dW elements that differ between the tiles: " << differ << "; changed by the product: " << changed);
    CHECK(differ == 0);
    CHECK(changed > a.size() / 2);
    double scale = 0;
    const auto dba = db_all.fetch(), dbo = db_one.fetch();
    const double db_err = max_abs_diff(dba, std::vector<double>(dbo.begin(), dbo.end()), scale) / scale;
    INFO("db: relative difference " << db_err);
    CHECK(db_err <= 1e-6);
  }
}

// Few, small dW_g over many rows are split over their rows (kernels.hpp, dw_splits): 5 groups of a 130 × 40 dW_g (3
// narrow tiles each: 15 blocks) over 4120 grouped rows take 3 slices (at most one per 256 rows of an average group).
// Each slice's sums are the unsplit kernel's over that slice's rows alone (a view of them: under 512 rows, no split),
// so the split dW and db must be their initial values plus the slices' sums added in slice order: the same bits. The
// 20-row group has an empty third slice, the empty group none; x is also read through an index list. FP32 also
// against the CPU. Under the emulation, the split's launches (2) and the unsplit slices' (1) are counted.
TEST_CASE("grouped weight gradients split over their rows: the slices' sums added in order give the same bits",
          "[cuda][grouped]") {
  MOM_REQUIRE_GPU();
  using T = float;
  auto& be = gpu<T>();
  test::Rng rng(78);
  const index_t in = 40, out = 130, Tn = 300;
  const Layout L{4125, {3, 1403, 1423, 1423, 2823, 4123}};
  const int G = L.count(), S = 3;
  const index_t R = L.rows;
  const std::size_t ws = std::size_t(32) << 20, slice_bytes = std::size_t(G) * (out * in + out) * sizeof(T);
  REQUIRE(cuda::dw_splits(3 * G, R, G, out, in, sizeof(T), ws) == S);
  CHECK(cuda::dw_splits(cuda::dw_wide_tile_blocks, R, G, out, in, sizeof(T), ws) == 1);   // blocks enough
  CHECK(cuda::dw_splits(15, G * (2 * cuda::dw_split_min_rows - 1), G, out, in, sizeof(T), ws) == 1);  // rows too few
  CHECK(cuda::dw_splits(15, index_t(1) << 24, G, out, in, sizeof(T), ws) == 18);          // ceil(264 / 15)
  CHECK(cuda::dw_splits(15, index_t(1) << 24, G, out, in, sizeof(T), 5 * slice_bytes + 1) == 5);  // the workspace
  // Slice s of a group's rows [lo, hi) (grouped_linear.cuh, dw_slice): ceil(n / S) rows rounded up to 16.
  const auto slice = [&](index_t lo, index_t hi, int s) {
    const index_t chunk = ((hi - lo + S - 1) / S + 15) / 16 * 16, a = std::min(hi, lo + s * chunk);
    return std::pair{a, std::min(hi, a + chunk)};
  };
  Groups<T> g(L);
  auto x = rand_arr<T>(R * in, rng), dy = rand_arr<T>(R * out, rng), table = rand_arr<T>(Tn * in, rng);
  auto w = rand_arr<T>(G * pg_stride(out * in), rng);
  auto idx = Arr<T, token_t>(grouped_indices(L, Tn, rng));
  const auto wh = per_group<const T>(w.h.data(), G, out * in), wd = per_group<const T>(w.d.data(), G, out * in);
  const auto one_w = per_group<const T>(w.d.data(), 1, out * in);
  for (const bool gathered : {false, true})
    for (const auto precision : {cuda::Precision::FP32, cuda::Precision::TF32, cuda::Precision::BF16}) {
      INFO((gathered ? "x through indices, " : "x, ")
           << (precision == cuda::Precision::FP32 ? "FP32" : precision == cuda::Precision::TF32 ? "TF32" : "BF16"));
      be.set_precision(precision);
      // dy and x (or x's indices) of packed rows [a, b) as a matrix of their own with one group.
      const auto backward = [&](T* dw, T* db, index_t a, index_t b, RowGroups rg, PerGroup<const T> wg) {
        const auto dyv = dy.dm(R, out).row_block(a, b - a);
        const auto dwg = per_group(dw, rg.count, out * in), dbg = per_group(db, rg.count, out);
        if (gathered)
          be.grouped_linear_backward(MatrixView<T>{}, dwg, dbg, dyv, table.dm(Tn, in),
                                     std::span<const token_t>(idx.d.data() + a, std::size_t(b - a)), wg, rg);
        else
          be.grouped_linear_backward(MatrixView<T>{}, dwg, dbg, dyv, x.dm(R, in).row_block(a, b - a), wg, rg);
      };
      auto dw = rand_arr<T>(G * pg_stride(out * in), rng), db = rand_arr<T>(G * pg_stride(out), rng);
      // Under the emulation its cost is counted too: the split products and the reduction in slice order, two
      // launches (one unsplit), no memset, allocation or host wait (the partials live in the context's workspace).
      const bool counted = mom_emu_launches && mom_emu_host_waits && mom_emu_allocations;
      const auto before = counted ? test::EmuCounters::now() : test::EmuCounters{};
      backward(dw.d.data(), db.d.data(), 0, R, g.d(), wd);
      if (counted) {
        const auto c = test::EmuCounters::now() - before;
        CHECK(c.launches == 2);
        CHECK(c.memset_bytes == 0);
        CHECK(c.allocations == 0);
        CHECK(c.host_waits == 0);
      }
      std::vector<T> want_w = dw.initial, want_b = db.initial;
      for (int gi = 0; gi < G; ++gi) {
        const index_t lo = L.offsets[std::size_t(gi)], hi = L.offsets[std::size_t(gi) + 1];
        if (lo == hi) continue;
        std::vector<T> sum_w(std::size_t(out * in), T(0)), sum_b(std::size_t(out), T(0));
        for (int s = 0; s < S; ++s) {
          const auto [a, b] = slice(lo, hi, s);
          if (a == b) continue;
          Groups<T> one(Layout{b - a, {0, token_t(b - a)}});
          auto pw = const_arr<T>(out * in, T(0)), pb = const_arr<T>(out, T(0));
          const auto unsplit = counted ? test::EmuCounters::now() : test::EmuCounters{};
          backward(pw.d.data(), pb.d.data(), a, b, one.d(), one_w);
          if (counted) CHECK((test::EmuCounters::now() - unsplit).launches == 1);
          const auto fw = pw.fetch(), fb = pb.fetch();
          for (std::size_t e = 0; e < fw.size(); ++e) sum_w[e] += fw[e];
          for (std::size_t e = 0; e < fb.size(); ++e) sum_b[e] += fb[e];
        }
        const auto at_w = std::size_t((G - 1 - gi) * pg_stride(out * in)), at_b = std::size_t((G - 1 - gi) * pg_stride(out));
        for (std::size_t e = 0; e < sum_w.size(); ++e) want_w[at_w + e] += sum_w[e];
        for (std::size_t e = 0; e < sum_b.size(); ++e) want_b[at_b + e] += sum_b[e];
      }
      const auto got_w = dw.fetch(), got_b = db.fetch();
      const auto differ_w = differing(got_w, want_w), differ_b = differing(got_b, want_b);
      INFO("elements that differ from the slices' sums: dW " << differ_w << ", db " << differ_b << "; dW changed "
                                                             << differing(got_w, dw.initial));
      CHECK(differ_w == 0);
      CHECK(differ_b == 0);
      CHECK(differing(got_w, dw.initial) > got_w.size() / 2);
      if (precision == cuda::Precision::FP32) {
        if (gathered)
          host<T>().grouped_linear_backward(MatrixView<T>{}, per_group(dw.h.data(), G, out * in),
                                            per_group(db.h.data(), G, out), dy.hm(R, out), table.hm(Tn, in),
                                            std::span<const token_t>(idx.h), wh, g.h());
        else
          host<T>().grouped_linear_backward(MatrixView<T>{}, per_group(dw.h.data(), G, out * in),
                                            per_group(db.h.data(), G, out), dy.hm(R, out), x.hm(R, in), wh, g.h());
        expect_close(dw, "dW split, against the cpu");
        expect_close(db, "db split, against the cpu");
      }
    }
  be.set_precision(cuda::Precision::TF32);
}

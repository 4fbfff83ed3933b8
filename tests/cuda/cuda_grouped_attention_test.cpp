// Cross-backend cases for cuda::Backend's grouped attention (attention_grouped_forward / _backward,
// the packed attention per row group of core/groups.hpp): the device must match cpu::Backend (which
// runs the packed attention group by group, cpu/grouped.hpp) on the same random inputs, in both key
// modes, with empty groups, rows before offsets[0] and a SKIP range after offsets[count] that must
// stay untouched, and tiles that straddle groups and sequences. Gradients start from random values,
// so accumulation is checked. Without a CUDA device every case prints one skip line and passes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

// Precision::FP32 on the float backend for one case (the exact SIMT kernels), TF32 again after it.
template <class T>
struct Fp32Attention {
  Fp32Attention() { gpu<T>().set_precision(cuda::Precision::FP32); }
  ~Fp32Attention() { gpu<T>().set_precision(cuda::Precision::TF32); }
};

// max |got - want| / max |want| over the finite entries; -inf must sit at the same places in both.
template <class T>
double expect_close(Arr<T>& a, double tol, const std::string& what) {
  auto got = a.fetch();
  auto want = a.h;
  std::size_t inf_mismatch = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::isinf(got[i]) || std::isinf(want[i])) {
      inf_mismatch += got[i] != want[i];
      got[i] = want[i] = T(0);
    }
  const double err = test::rel_error(got, want);
  INFO(what << ": relative error " << err << " (tolerance " << tol << "), " << inf_mismatch << " -inf mismatches");
  CHECK(inf_mismatch == 0);
  CHECK(err <= tol);
  return err;
}
// Rows outside [offsets[0], offsets[count]) of a [rows × width] array must hold their initial values, bit for bit.
template <class T>
void expect_untouched(Arr<T>& a, index_t width, index_t first, index_t last, const std::string& what) {
  const auto got = a.fetch();
  std::size_t changed = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const index_t r = static_cast<index_t>(i) / width;
    if (r < first || r >= last) changed += got[i] != a.initial[i] || a.h[i] != a.initial[i];
  }
  INFO(what << ": " << changed << " entries outside the groups changed");
  CHECK(changed == 0);
}

enum class Keys { all_tokens, routed_same, routed_other };

// A routing round: `lead` rows before offsets[0], groups of the given sizes (each an ascending random
// subset of the tokens), `skip` rows after offsets[count]. Rows outside the groups get position -3:
// a kernel that read them would report a bad position. k_other: keys that differ from the queries,
// each one token after its query within the sequence (so each group's first query of a sequence
// sees no key: lse -inf, zero row).
struct Round {
  std::vector<token_t> offsets, q_tok, k_other;
  index_t rows = 0, first = 0, last = 0;
};
Round make_round(test::Rng& rng, const std::vector<index_t>& sizes, index_t lead, index_t skip, index_t tokens,
                 index_t seq) {
  Round r;
  const auto subset = [&](index_t n) {
    std::vector<token_t> all(static_cast<std::size_t>(tokens));
    std::iota(all.begin(), all.end(), token_t(0));
    for (index_t i = 0; i < n; ++i)  // partial Fisher-Yates
      std::swap(all[std::size_t(i)], all[std::size_t(rng.integer(int(i), int(tokens - 1)))]);
    all.resize(std::size_t(n));
    std::sort(all.begin(), all.end());
    return all;
  };
  r.q_tok.assign(std::size_t(lead), token_t(-3));
  r.k_other = r.q_tok;
  r.offsets.push_back(token_t(lead));
  for (const index_t n : sizes) {
    const auto q = subset(n);
    auto k = q;
    for (auto& t : k)
      if ((t + 1) % seq != 0) ++t;
    r.q_tok.insert(r.q_tok.end(), q.begin(), q.end());
    r.k_other.insert(r.k_other.end(), k.begin(), k.end());
    r.offsets.push_back(r.offsets.back() + token_t(n));
  }
  r.q_tok.resize(r.q_tok.size() + std::size_t(skip), token_t(-3));
  r.k_other.resize(r.q_tok.size(), token_t(-3));
  r.rows = ssize(std::span<token_t>(r.q_tok));
  r.first = lead;
  r.last = r.offsets.back();
  return r;
}

// Group g's key/value matrices in one buffer: without k_tok each group has its own [kv_rows × 2d]
// block (keys in columns [0, d), values in [d, 2d)); with k_tok every group's entry is the same
// [rows × 2d] matrix (the groups' rows are disjoint), as the routed executors lay them out.
template <class U>
PerGroup<U> group_table(U* base, int count, bool routed, index_t kv_rows, index_t d) {
  return PerGroup<U>(base, count, [&](int g) { return routed ? index_t(0) : index_t(g) * kv_rows * 2 * d; });
}

}  // namespace

// One random routing round through the device's grouped attention against cpu::Backend's: tol for out and lse,
// tol_grad for the gradients (relative to the largest entry). Returns the forward's and the gradients' relative
// errors (the tensor-core cases check that they are not fp32's).
struct GroupedErrors {
  double out = 0, grads = 0;
};
template <class T>
GroupedErrors grouped_round(test::Rng& rng, index_t hd, Keys keys, double tol, double tol_grad) {
  const index_t batch = 2, seq = 37, heads = 2, tokens = batch * seq;
  const std::vector<index_t> sizes = {23, 0, 41, 0, 0, 9, 30};  // tiles of 16, 32, 64 rows straddle groups
  const int count = static_cast<int>(sizes.size());
  GroupedErrors errs;
  const index_t d = heads * hd;
  const bool routed = keys != Keys::all_tokens;
  INFO("hd " << hd << " keys " << int(keys));
  const Round r = make_round(rng, sizes, 5, 11, tokens, seq);
  const index_t nq = r.rows, kv_rows = routed ? nq : tokens, kv_ld = 2 * d;
  const int n_kv = routed ? 1 : count;
  Arr<T, token_t> offsets(r.offsets), q_tok(r.q_tok);
  Arr<T, token_t> k_tok(routed ? (keys == Keys::routed_same ? r.q_tok : r.k_other) : std::vector<token_t>{});
  const std::span<const token_t> hkt = routed ? std::span<const token_t>(k_tok.hs()) : std::span<const token_t>();
  const std::span<const token_t> dkt = routed ? std::span<const token_t>(k_tok.ds()) : std::span<const token_t>();
  const RowGroups hg{offsets.h.data(), count}, dg{offsets.d.data(), count};
  // q and dq as column blocks of wider matrices (strided views); out, lse, dout, gradients random.
  auto q = rand_arr<T>(nq * 2 * d, rng, -1.5, 1.5), kv = rand_arr<T>(n_kv * kv_rows * 2 * d, rng, -1.5, 1.5);
  auto out = rand_arr<T>(nq * d, rng), lse = rand_arr<T>(nq * heads, rng), dout = rand_arr<T>(nq * d, rng);
  auto dq = rand_arr<T>(nq * 2 * d, rng), dkv = rand_arr<T>(n_kv * kv_rows * 2 * d, rng);
  const MatrixView<const T> hq{q.h.data(), nq, d, 2 * d}, gq{q.d.data(), nq, d, 2 * d};
  const auto hk = group_table<const T>(kv.h.data(), count, routed, kv_rows, d), hv = hk.plus(d);
  const auto gk = group_table<const T>(kv.d.data(), count, routed, kv_rows, d), gv = gk.plus(d);

  host<T>().attention_grouped_forward(MatrixView<T>{out.h.data(), nq, d}, lse.hs(), hq, hk, hv, kv_rows, kv_ld,
                                      q_tok.hs(), hkt, hg, seq, heads);
  gpu<T>().attention_grouped_forward(MatrixView<T>{out.d.data(), nq, d}, lse.ds(), gq, gk, gv, kv_rows, kv_ld,
                                     q_tok.ds(), dkt, dg, seq, heads);
  errs.out = expect_close(out, tol, "out");
  expect_close(lse, tol, "lse");
  expect_untouched(out, d, r.first, r.last, "out");
  expect_untouched(lse, heads, r.first, r.last, "lse");
  if (keys == Keys::routed_other) {  // the no-key case (lse -inf, zero row) is exercised
    const auto got = lse.fetch();
    CHECK(std::count_if(got.begin() + r.first * heads, got.begin() + r.last * heads,
                        [](T x) { return std::isinf(x); }) > 0);
  }

  const auto hdk = group_table<T>(dkv.h.data(), count, routed, kv_rows, d), hdv = hdk.plus(d);
  const auto gdk = group_table<T>(dkv.d.data(), count, routed, kv_rows, d), gdv = gdk.plus(d);
  host<T>().attention_grouped_backward(MatrixView<T>{dq.h.data(), nq, d, 2 * d}, hdk, hdv,
                                       MatrixView<const T>{dout.h.data(), nq, d},
                                       MatrixView<const T>{out.h.data(), nq, d}, std::span<const T>(lse.hs()), hq,
                                       hk, hv, kv_rows, kv_ld, q_tok.hs(), hkt, hg, seq, heads);
  gpu<T>().attention_grouped_backward(MatrixView<T>{dq.d.data(), nq, d, 2 * d}, gdk, gdv,
                                      MatrixView<const T>{dout.d.data(), nq, d},
                                      MatrixView<const T>{out.d.data(), nq, d}, std::span<const T>(lse.ds()), gq,
                                      gk, gv, kv_rows, kv_ld, q_tok.ds(), dkt, dg, seq, heads);
  errs.grads = expect_close(dq, tol_grad, "dq");
  errs.grads = std::max(errs.grads, expect_close(dkv, tol_grad, "dk and dv"));
  expect_untouched(dq, 2 * d, r.first, r.last, "dq");
  if (routed) expect_untouched(dkv, 2 * d, r.first, r.last, "dk and dv (routed rows)");
  return errs;
}

TEMPLATE_TEST_CASE("grouped attention forward and backward match cpu (empty groups, lead and SKIP rows untouched)",
                   "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(71);
  // Precision::FP32: the SIMT kernels, exact to fp32 (float at head dim 64 takes the tensor cores otherwise).
  const Fp32Attention<T> exact;
  for (const index_t hd : {index_t(16), index_t(64)})
    for (const Keys keys : {Keys::all_tokens, Keys::routed_same, Keys::routed_other}) {
      INFO("hd " << hd << " keys " << int(keys));
      grouped_round<T>(rng, hd, keys, tol_attention<T>, tol_attention<T> * 10);
    }
}

TEST_CASE("grouped attention on tensor cores (TF32, BF16) matches cpu within the operands' rounding",
          "[cuda][grouped][tc]") {
  MOM_REQUIRE_GPU();
  // kernels/attention_packed_tc.cuh over the same rounds (tiles straddling groups and sequences, empty groups,
  // routed keys, queries without keys, rows outside the groups). Its bit-for-bit agreement with the dense
  // tensor-core kernel is checked in cuda_tc_attention_test.cpp; here the ranges and masks of the packed layout
  // against the CPU: a missed or extra key moves its row by ~1/(its keys) of the output's scale, far above these
  // tolerances (measured in emulation: TF32 out <= 6.2e-4, gradients <= 3.4e-4; BF16 out <= 4.7e-3, gradients <= 2.9e-3).
  // The floor checks the rounded path ran (the SIMT kernels agree to ~1e-6).
  struct Case {
    cuda::Precision precision;
    double tol, tol_grad, floor;
    const char* name;
  };
  for (const Case k : {Case{cuda::Precision::TF32, 1.5e-3, 1.5e-3, 3e-5, "TF32"},
                       Case{cuda::Precision::BF16, 1.2e-2, 1e-2, 3e-4, "BF16"}}) {
    gpu<float>().set_precision(k.precision);
    test::Rng rng(72);
    for (const index_t hd : {index_t(64), index_t(128)})
      for (const Keys keys : {Keys::all_tokens, Keys::routed_same, Keys::routed_other}) {
        INFO(k.name << " hd " << hd << " keys " << int(keys));
        const GroupedErrors e = grouped_round<float>(rng, hd, keys, k.tol, k.tol_grad);
        if (std::getenv("MOM_TC_ATTENTION_REPORT"))
          WARN(k.name << " hd " << hd << " keys " << int(keys) << ": out " << e.out << " grads " << e.grads);
        CHECK(e.out >= k.floor);
        CHECK(e.grads >= k.floor);
      }
  }
  gpu<float>().set_precision(cuda::Precision::TF32);
}

TEST_CASE("grouped attention backward passes a finite-difference check in double on the GPU", "[cuda][grouped]") {
  MOM_REQUIRE_GPU();
  using T = double;
  auto& be = gpu<T>();
  test::Rng rng(72);
  const index_t batch = 2, seq = 5, heads = 2, hd = 4, d = heads * hd, tokens = batch * seq;
  const std::vector<index_t> sizes = {3, 0, 4};
  const int count = static_cast<int>(sizes.size());
  for (const bool routed : {false, true}) {
    INFO("routed " << routed);
    const Round r = make_round(rng, sizes, 1, 2, tokens, seq);
    const index_t nq = r.rows, kv_rows = routed ? nq : tokens, kv_ld = 2 * d, n_kv = routed ? 1 : count;
    auto offsets = be.alloc<token_t>(count + 1), q_tok = be.alloc<token_t>(nq);
    be.from_host(offsets.span(), std::span<const token_t>(r.offsets));
    be.from_host(q_tok.span(), std::span<const token_t>(r.q_tok));
    const std::span<const token_t> k_tok = routed ? std::span<const token_t>(q_tok.span()) : std::span<const token_t>();
    const RowGroups g{offsets.data(), count};
    std::vector<T> q = test::random_vec<T>(std::size_t(nq * d), rng);
    std::vector<T> kv = test::random_vec<T>(std::size_t(n_kv * kv_rows * 2 * d), rng);
    const std::vector<T> w = test::random_vec<T>(std::size_t(nq * d), rng);  // loss = Σ w ∘ out
    auto q_dev = be.alloc<T>(nq * d), kv_dev = be.alloc<T>(ssize(kv)), out = be.alloc<T>(nq * d);
    auto lse = be.alloc<T>(nq * heads), dout = be.alloc<T>(nq * d), dq = be.alloc<T>(nq * d);
    auto dkv = be.alloc<T>(ssize(kv));
    be.from_host(dout.span(), std::span<const T>(w));
    const auto k = group_table<const T>(kv_dev.data(), count, routed, kv_rows, d), v = k.plus(d);
    const MatrixView<const T> qv{q_dev.data(), nq, d};
    const auto forward = [&] {
      be.from_host(q_dev.span(), std::span<const T>(q));
      be.from_host(kv_dev.span(), std::span<const T>(kv));
      be.attention_grouped_forward(out.view(nq, d), lse.span(), qv, k, v, kv_rows, kv_ld, q_tok.span(), k_tok, g, seq,
                                   heads);
    };
    const auto loss = [&] {
      forward();
      std::vector<T> o(std::size_t(nq * d));
      be.to_host(std::span<T>(o), std::span<const T>(out.span()));
      double s = 0;
      for (std::size_t i = 0; i < o.size(); ++i) s += w[i] * o[i];
      return s;
    };
    forward();
    const auto dk = group_table<T>(dkv.data(), count, routed, kv_rows, d), dv = dk.plus(d);
    be.attention_grouped_backward(dq.view(nq, d), dk, dv, MatrixView<const T>(dout.view(nq, d)),
                                  MatrixView<const T>(out.view(nq, d)), std::span<const T>(lse.span()), qv, k, v,
                                  kv_rows, kv_ld, q_tok.span(), k_tok, g, seq, heads);
    std::vector<T> dq_host(q.size()), dkv_host(kv.size());
    be.to_host(std::span<T>(dq_host), std::span<const T>(dq.span()));
    be.to_host(std::span<T>(dkv_host), std::span<const T>(dkv.span()));
    const auto num_q = test::numeric_grad(q, loss), num_kv = test::numeric_grad(kv, loss);
    CHECK(test::rel_error(dq_host, num_q) < test::fd_tol);
    CHECK(test::rel_error(dkv_host, num_kv) < test::fd_tol);
    CHECK(*std::max_element(num_kv.begin(), num_kv.end()) > 1e-3);  // the keys do get a gradient
  }
}

TEMPLATE_TEST_CASE("grouped attention reports bad offsets and positions at the next sync, empty groups touch nothing",
                   "[cuda][grouped]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  auto& be = gpu<T>();
  const index_t nq = 6, d = 4, seq = 4, tokens = 8;
  auto q = be.template alloc<T>(nq * d), out = be.template alloc<T>(nq * d), lse = be.template alloc<T>(nq);
  auto kv = be.template alloc<T>(2 * tokens * 2 * d);
  auto offsets = be.template alloc<token_t>(3), q_tok = be.template alloc<token_t>(nq);
  const auto k = group_table<const T>(kv.data(), 2, false, tokens, d), v = k.plus(d);
  const auto run = [&](std::vector<token_t> off, std::vector<token_t> pos) {
    be.from_host(offsets.span(), std::span<const token_t>(off));
    be.from_host(q_tok.span(), std::span<const token_t>(pos));
    be.attention_grouped_forward(out.view(nq, d), lse.span(), MatrixView<const T>(q.view(nq, d)), k, v, tokens,
                                 2 * d, q_tok.span(), {}, RowGroups{offsets.data(), 2}, seq, 1);
  };
  run({0, 5, 3}, {0, 1, 2, 3, 4, 5});  // decreasing offsets
  CHECK_THROWS_WITH(be.sync(),
                    Catch::Contains("group offsets must be non-decreasing") && Catch::Contains("offsets[2] = 3"));
  run({1, 3, 7}, {0, 1, 2, 3, 4, 5});  // past the rows
  CHECK_THROWS_WITH(be.sync(), Catch::Contains("offsets[2] = 7"));
  run({1, 3, 6}, {-3, 2, 4, 5, 3, -3});  // group 1's positions descend (row 4 = its position 1)
  CHECK_THROWS_WITH(be.sync(), Catch::Contains("query positions must be ascending") && Catch::Contains("q_tok[1] = 3"));
  run({1, 3, 6}, {-3, 2, 4, 5, 6, 7});  // good: row 0 (position -3) is outside the groups, never read
  CHECK_NOTHROW(be.sync());
  // Only empty groups: nothing is read or written.
  const std::vector<T> sentinel(std::size_t(nq * d), T(7));
  be.from_host(out.span(), std::span<const T>(sentinel));
  run({3, 3, 3}, {-3, -3, -3, -3, -3, -3});
  std::vector<T> got(sentinel.size());
  be.to_host(std::span<T>(got), std::span<const T>(out.span()));
  CHECK(got == sentinel);
}

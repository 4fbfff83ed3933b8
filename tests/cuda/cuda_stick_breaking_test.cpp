// Stick-breaking attention (ModuleFormer, arXiv 2306.04640; cpu/stick_breaking.hpp, cuda/kernels/stick_breaking.cuh):
// cuda::Backend<T> against cpu::Backend<T> on the same random inputs. Forward; backward with the gradients
// accumulated onto random values (the kernel takes the prefix sums from D = dO·o, the CPU sums them
// directly: the same gradient by two routes); decode through a cache; grouped and shared key/value heads;
// the same shape errors; a decode row outside the cache reported at the next sync.
// Tolerances (max |gpu - cpu| / max |cpu|): double 1e-10, float 2e-5 (exp / log1p, reassociated sums).
// Without a CUDA device every case prints "no CUDA device: skipped" once and passes.
#include <catch2/catch.hpp>

#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {
template <class T>
constexpr double tol_sb = std::is_same_v<T, double> ? 1e-10 : 2e-5;

template <class T, class U>
void expect_close(Arr<T, U>& a, double tol, const std::string& what) {
  const auto got = a.fetch();
  const double err = test::rel_error(got, a.h);
  INFO(what << ": relative error " << err << " (tolerance " << tol << ")");
  CHECK(err <= tol);
}
}  // namespace

TEMPLATE_TEST_CASE("stick-breaking attention forward/backward match cpu (head dims 8 to 128, ragged tiles, large |z|)",
                   "[cuda][stick_breaking]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(250);
  struct Shape {
    index_t B, S, heads, d;
    double range;  // of q, k and v
  };
  // Head dims 8, 32, 64, 128 (padded to 32, 64, 128); sequences shorter than a tile, ragged, and longer
  // than a CPU descent chunk with |z| large enough that every row reaches the spent-stick cutoff.
  for (const Shape s : {Shape{2, 37, 2, 16, 1.5}, Shape{1, 70, 3, 96, 1.0}, Shape{2, 19, 1, 64, 2.0},
                        Shape{1, 45, 2, 256, 0.7}, Shape{1, 300, 1, 8, 6.0}, Shape{1, 1, 1, 32, 1.0}}) {
    INFO("B " << s.B << " S " << s.S << " heads " << s.heads << " d " << s.d);
    const index_t n = s.B * s.S, d = s.d;
    auto qkv = rand_arr<T>(n * 3 * d, rng, -s.range, s.range);
    auto out = rand_arr<T>(n * d, rng);
    host<T>().stick_breaking_forward(out.hm(n, d), qkv.hm(n, 3 * d), s.B, s.S, s.heads, s.heads);
    gpu<T>().stick_breaking_forward(out.dm(n, d), qkv.dm(n, 3 * d), s.B, s.S, s.heads, s.heads);
    expect_close(out, tol_sb<T>, "stick_breaking_forward out");

    auto dout = rand_arr<T>(n * d, rng), dqkv = rand_arr<T>(n * 3 * d, rng);
    host<T>().stick_breaking_backward(dqkv.hm(n, 3 * d), dout.hm(n, d), out.hm(n, d), qkv.hm(n, 3 * d), s.B, s.S,
                                      s.heads, s.heads);
    gpu<T>().stick_breaking_backward(dqkv.dm(n, 3 * d), dout.dm(n, d), out.dm(n, d), qkv.dm(n, 3 * d), s.B, s.S,
                                     s.heads, s.heads);
    expect_close(dqkv, tol_sb<T>, "stick_breaking_backward dqkv");
  }
}

TEMPLATE_TEST_CASE("stick-breaking attention with grouped and shared key/value heads matches cpu (forward, backward, "
                   "decode)", "[cuda][stick_breaking]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(253);
  for (const auto [B, S, heads, kv, hd] : {std::array<index_t, 5>{2, 37, 4, 1, 16}, std::array<index_t, 5>{1, 70, 4, 2, 40},
                                           std::array<index_t, 5>{2, 9, 2, 1, 128}}) {
    INFO("B " << B << " S " << S << " heads " << heads << " kv_heads " << kv << " hd " << hd);
    const index_t n = B * S, d = heads * hd, W = (heads + 2 * kv) * hd;
    auto qkv = rand_arr<T>(n * W, rng, -1.5, 1.5);
    auto out = rand_arr<T>(n * d, rng), dout = rand_arr<T>(n * d, rng), dqkv = rand_arr<T>(n * W, rng);
    host<T>().stick_breaking_forward(out.hm(n, d), qkv.hm(n, W), B, S, heads, kv);
    gpu<T>().stick_breaking_forward(out.dm(n, d), qkv.dm(n, W), B, S, heads, kv);
    expect_close(out, tol_sb<T>, "stick_breaking_forward out");
    host<T>().stick_breaking_backward(dqkv.hm(n, W), dout.hm(n, d), out.hm(n, d), qkv.hm(n, W), B, S, heads, kv);
    gpu<T>().stick_breaking_backward(dqkv.dm(n, W), dout.dm(n, d), out.dm(n, d), qkv.dm(n, W), B, S, heads, kv);
    expect_close(dqkv, tol_sb<T>, "stick_breaking_backward dqkv");
    // Decode: every row of sequence 0 against a cache of kv_heads·hd columns.
    const index_t max_len = S;
    auto kc = rand_arr<T>(max_len * kv * hd, rng, -1.5, 1.5), vc = rand_arr<T>(max_len * kv * hd, rng);
    std::vector<index_t> slot(std::size_t(S), 0), pos;
    for (index_t t = 0; t < S; ++t) pos.push_back(t);
    Arr<T, index_t> ds(slot), dp(pos);
    auto dec = rand_arr<T>(S * d, rng);
    host<T>().stick_breaking_decode(dec.hm(S, d), qkv.hm(S, W), kc.hm(max_len, kv * hd), vc.hm(max_len, kv * hd), ds.hs(),
                                    dp.hs(), max_len, heads, kv);
    gpu<T>().stick_breaking_decode(dec.dm(S, d), qkv.dm(S, W), kc.dm(max_len, kv * hd), vc.dm(max_len, kv * hd), ds.ds(),
                                   dp.ds(), max_len, heads, kv);
    expect_close(dec, tol_sb<T>, "stick_breaking_decode out");
  }
}

TEMPLATE_TEST_CASE("stick-breaking attention at seq 4096 matches cpu (sticks spent within a few keys, and never)",
                   "[cuda][stick_breaking]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(252);
  const index_t S = 4096, heads = 2, d = 8, hd = d / heads;
  // Head 0: q, k in [-12, 12], |z| ~ 50. Head 1: z ≈ k_0 in [-9, -3]: β tiny, 4096-term suffixes.
  std::vector<T> v(std::size_t(S * 3 * d));
  for (index_t r = 0; r < S; ++r) {
    T* row = v.data() + r * 3 * d;
    for (index_t c = 0; c < hd; ++c) {
      row[c] = T(rng.uniform(-12, 12));
      row[d + c] = T(rng.uniform(-12, 12));
      row[hd + c] = c == 0 ? T(2) : T(rng.uniform(-0.1, 0.1));
      row[d + hd + c] = c == 0 ? T(rng.uniform(-9, -3)) : T(rng.uniform(-0.1, 0.1));
    }
    for (index_t c = 0; c < d; ++c) row[2 * d + c] = T(rng.uniform(-1, 1));
  }
  Arr<T> qkv(std::move(v));
  auto out = rand_arr<T>(S * d, rng), dout = rand_arr<T>(S * d, rng), dqkv = rand_arr<T>(S * 3 * d, rng);
  host<T>().stick_breaking_forward(out.hm(S, d), qkv.hm(S, 3 * d), 1, S, heads, heads);
  gpu<T>().stick_breaking_forward(out.dm(S, d), qkv.dm(S, 3 * d), 1, S, heads, heads);
  expect_close(out, tol_sb<T>, "stick_breaking_forward out");
  host<T>().stick_breaking_backward(dqkv.hm(S, 3 * d), dout.hm(S, d), out.hm(S, d), qkv.hm(S, 3 * d), 1, S, heads, heads);
  gpu<T>().stick_breaking_backward(dqkv.dm(S, 3 * d), dout.dm(S, d), out.dm(S, d), qkv.dm(S, 3 * d), 1, S, heads, heads);
  expect_close(dqkv, tol_sb<T>, "stick_breaking_backward dqkv");
}

TEMPLATE_TEST_CASE("stick-breaking decode matches cpu (cache of several sequences, every position in one call)",
                   "[cuda][stick_breaking][decode]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(251);
  const index_t slots = 3, max_len = 24, S = 20, heads = 2, d = 40;  // head dim 20 (padded to 32)
  // Cache rows slot·max_len + t hold the key / value of token t of sequence slot (the tail is stale).
  auto kc = rand_arr<T>(slots * max_len * d, rng, -2, 2), vc = rand_arr<T>(slots * max_len * d, rng);
  auto qkv = rand_arr<T>(slots * S * 3 * d, rng, -2, 2);
  std::vector<index_t> slot, pos;
  for (index_t t = 0; t < S; ++t)
    for (index_t b = slots - 1; b >= 0; --b) {
      slot.push_back(b);
      pos.push_back(t);
    }
  const index_t rows = ssize(slot);
  Arr<T, index_t> ds(slot), dp(pos);
  auto out = rand_arr<T>(rows * d, rng);
  host<T>().stick_breaking_decode(out.hm(rows, d), qkv.hm(rows, 3 * d), kc.hm(slots * max_len, d),
                                  vc.hm(slots * max_len, d), ds.hs(), dp.hs(), max_len, heads, heads);
  gpu<T>().stick_breaking_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d),
                                 vc.dm(slots * max_len, d), ds.ds(), dp.ds(), max_len, heads, heads);
  expect_close(out, tol_sb<T>, "stick_breaking_decode out");

  // The shape errors are the CPU's; a position outside the cache is found on the device.
  auto expect_same_error = [](auto&& on_cpu, auto&& on_gpu) {
    std::string cpu_msg, gpu_msg;
    try { on_cpu(); } catch (const Error& e) { cpu_msg = e.what(); }
    try { on_gpu(); } catch (const Error& e) { gpu_msg = e.what(); }
    CHECK(!cpu_msg.empty());
    CHECK(gpu_msg == cpu_msg);
  };
  expect_same_error([&] { host<T>().stick_breaking_forward(out.hm(rows, d), qkv.hm(rows, 3 * d), 1, rows, 3, 3); },
                    [&] { gpu<T>().stick_breaking_forward(out.dm(rows, d), qkv.dm(rows, 3 * d), 1, rows, 3, 3); });
  expect_same_error(
      [&] {
        host<T>().stick_breaking_backward(qkv.hm(rows, 3 * d - 1), out.hm(rows, d), out.hm(rows, d), qkv.hm(rows, 3 * d),
                                          1, rows, heads, heads);
      },
      [&] {
        gpu<T>().stick_breaking_backward(qkv.dm(rows, 3 * d - 1), out.dm(rows, d), out.dm(rows, d), qkv.dm(rows, 3 * d),
                                         1, rows, heads, heads);
      });
  expect_same_error(
      [&] {
        host<T>().stick_breaking_decode(out.hm(rows, d), qkv.hm(rows, 3 * d), kc.hm(slots * max_len, d),
                                        vc.hm(slots * max_len, d), ds.hs().first(1), dp.hs(), max_len, heads, heads);
      },
      [&] {
        gpu<T>().stick_breaking_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d),
                                       vc.dm(slots * max_len, d), ds.ds().first(1), dp.ds(), max_len, heads, heads);
      });
  expect_same_error([&] { host<T>().stick_breaking_forward(out.hm(rows, d), qkv.hm(rows, 3 * d), 1, rows, 4, 3); },
                    [&] { gpu<T>().stick_breaking_forward(out.dm(rows, d), qkv.dm(rows, 3 * d), 1, rows, 4, 3); });
  expect_same_error(
      [&] {
        host<T>().stick_breaking_decode(out.hm(rows, d), qkv.hm(rows, 3 * d), kc.hm(slots * max_len, d),
                                        vc.hm(slots * max_len, d), ds.hs(), dp.hs(), max_len, heads, -1);
      },
      [&] {
        gpu<T>().stick_breaking_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d),
                                       vc.dm(slots * max_len, d), ds.ds(), dp.ds(), max_len, heads, -1);
      });
  Arr<T, index_t> far(std::vector<index_t>{0, max_len});
  gpu<T>().stick_breaking_decode(out.dm(2, d), qkv.dm(2, 3 * d), kc.dm(slots * max_len, d), vc.dm(slots * max_len, d),
                                 ds.ds().first(2), far.ds(), max_len, heads, heads);
  try {
    gpu<T>().sync();
    FAIL("stick_breaking_decode at position max_len did not raise");
  } catch (const Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("stick_breaking_decode: slot or position 24 at position 1 is out of range [0, 24)"));
  }
  gpu<T>().sync();  // the error was consumed
}

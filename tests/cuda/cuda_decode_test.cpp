// KV-cache decoding ops (cpu/decode.hpp, cuda/kernels/decode.cuh): cuda::Backend<T> against cpu::Backend<T> on
// the same inputs: kv_write into caches of several sequences (stale rows elsewhere untouched), then
// attention_decode of every position of every sequence in one call (head dims 16 to 128); the same shape
// errors; a slot or position outside the cache reported at the next sync.
// Tolerances (max |gpu - cpu| / max |cpu|): double 1e-12, float 2e-6.
// Without a CUDA device every case prints "no CUDA device: skipped" once and passes.
#include <catch2/catch.hpp>

#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

TEMPLATE_TEST_CASE("kv_write and attention_decode match cpu (several sequences, every position in one call)",
                   "[cuda][decode]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-6;
  test::Rng rng(261);
  for (const auto [heads, d] : {std::array<index_t, 2>{2, 32}, std::array<index_t, 2>{4, 256}, std::array<index_t, 2>{1, 128}}) {
    INFO("heads " << heads << " d " << d);
    const index_t slots = 3, max_len = 21, S = 19;
    // Sequence b's token t: its qkv row; written to the cache at (b, t), then every row attends at once.
    auto qkv = rand_arr<T>(slots * S * 3 * d, rng, -2, 2);
    auto kc = rand_arr<T>(slots * max_len * d, rng), vc = rand_arr<T>(slots * max_len * d, rng);  // stale rows stay
    std::vector<index_t> slot, pos;
    for (index_t b = 0; b < slots; ++b)
      for (index_t t = 0; t < S; ++t) {
        slot.push_back(b);
        pos.push_back(t);
      }
    const index_t rows = ssize(slot);
    Arr<T, index_t> ds(slot), dp(pos);
    host<T>().kv_write(kc.hm(slots * max_len, d), vc.hm(slots * max_len, d), qkv.hm(rows, 3 * d), ds.hs(), dp.hs(), max_len);
    gpu<T>().kv_write(kc.dm(slots * max_len, d), vc.dm(slots * max_len, d), qkv.dm(rows, 3 * d), ds.ds(), dp.ds(), max_len);
    CHECK(kc.fetch() == kc.h);
    CHECK(vc.fetch() == vc.h);
    auto out = rand_arr<T>(rows * d, rng);
    host<T>().attention_decode(out.hm(rows, d), qkv.hm(rows, 3 * d), kc.hm(slots * max_len, d), vc.hm(slots * max_len, d),
                               ds.hs(), dp.hs(), max_len, heads);
    gpu<T>().attention_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d), vc.dm(slots * max_len, d),
                              ds.ds(), dp.ds(), max_len, heads);
    CHECK(test::rel_error(out.fetch(), out.h) <= tol);
  }
}

TEMPLATE_TEST_CASE("kv_write and attention_decode: the CPU's shape errors, positions outside the cache found on the device",
                   "[cuda][decode]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(262);
  const index_t d = 16, max_len = 4, slots = 2, rows = 2;
  auto qkv = rand_arr<T>(rows * 3 * d, rng), kc = rand_arr<T>(slots * max_len * d, rng), vc = rand_arr<T>(slots * max_len * d, rng);
  auto out = rand_arr<T>(rows * d, rng);
  Arr<T, index_t> ds(std::vector<index_t>{0, 1}), dp(std::vector<index_t>{0, 1});
  auto same_error = [](auto&& on_cpu, auto&& on_gpu) {
    std::string cpu_msg, gpu_msg;
    try { on_cpu(); } catch (const Error& e) { cpu_msg = e.what(); }
    try { on_gpu(); } catch (const Error& e) { gpu_msg = e.what(); }
    CHECK(!cpu_msg.empty());
    CHECK(gpu_msg == cpu_msg);
  };
  same_error([&] { host<T>().kv_write(kc.hm(slots * max_len, d), vc.hm(slots * max_len, d), qkv.hm(rows, 3 * d - 1), ds.hs(), dp.hs(), max_len); },
             [&] { gpu<T>().kv_write(kc.dm(slots * max_len, d), vc.dm(slots * max_len, d), qkv.dm(rows, 3 * d - 1), ds.ds(), dp.ds(), max_len); });
  same_error([&] { host<T>().attention_decode(out.hm(rows, d), qkv.hm(rows, 3 * d), kc.hm(slots * max_len, d), vc.hm(slots * max_len, d), ds.hs(), dp.hs(), max_len, 3); },
             [&] { gpu<T>().attention_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d), vc.dm(slots * max_len, d), ds.ds(), dp.ds(), max_len, 3); });
  Arr<T, index_t> far(std::vector<index_t>{0, max_len});
  gpu<T>().kv_write(kc.dm(slots * max_len, d), vc.dm(slots * max_len, d), qkv.dm(rows, 3 * d), ds.ds(), far.ds(), max_len);
  require_device_error(gpu<T>(), "kv_write: slot or position 4 at position 1 is out of range [0, 4)");
  gpu<T>().attention_decode(out.dm(rows, d), qkv.dm(rows, 3 * d), kc.dm(slots * max_len, d), vc.dm(slots * max_len, d),
                            far.ds(), dp.ds(), max_len, 2);
  require_device_error(gpu<T>(), "attention_decode: slot or position 4 at position 1 is out of range [0, 2)");
}

TEMPLATE_TEST_CASE("embedding_forward at rows' own positions matches cpu and reports a position outside wpe",
                   "[cuda][decode]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(263);
  const index_t V = 11, C = 9, d = 24, rows = 7;
  auto wte = rand_arr<T>(V * d, rng), wpe = rand_arr<T>(C * d, rng), out = rand_arr<T>(rows * d, rng);
  Arr<T, token_t> tok(std::vector<token_t>{3, 0, 10, 3, 7, 1, 5});
  Arr<T, index_t> pos(std::vector<index_t>{8, 0, 4, 4, 2, 7, 1});
  host<T>().embedding_forward(out.hm(rows, d), tok.hs(), wte.hm(V, d), wpe.hm(C, d), pos.hs());
  gpu<T>().embedding_forward(out.dm(rows, d), tok.ds(), wte.dm(V, d), wpe.dm(C, d), pos.ds());
  CHECK(out.fetch() == out.h);
  host<T>().embedding_forward(out.hm(rows, d), tok.hs(), wte.hm(V, d), MatrixView<const T>{}, pos.hs());  // no wpe
  gpu<T>().embedding_forward(out.dm(rows, d), tok.ds(), wte.dm(V, d), MatrixView<const T>{}, pos.ds());
  CHECK(out.fetch() == out.h);
  Arr<T, index_t> far(std::vector<index_t>{0, 1, 2, 3, C, 5, 6});
  gpu<T>().embedding_forward(out.dm(rows, d), tok.ds(), wte.dm(V, d), wpe.dm(C, d), far.ds());
  require_device_error(gpu<T>(), "embedding_forward: position 9 at position 4 is out of range [0, 9)");
}

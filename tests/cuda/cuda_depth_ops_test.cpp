// Cross-backend cases for the depth-routing ops of cuda::Backend (kernels/depth.cuh), ported from the
// CPU ops of backend/cpu/depth.hpp (depth branch, commit dc98a76). Each case checks the device
// against a plain host reference written here (the definition of the op), and also against
// cpu::Backend<T> where that backend has the op (once the depth branch is merged).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {

template <class T>
cuda::Buffer<T> upload(const std::vector<T>& v) {
  auto b = gpu<T>().template alloc<T>(ssize(v));
  gpu<T>().from_host(b.span(), std::span<const T>(v));
  return b;
}
template <class T, class U>
cuda::Buffer<U> upload_as(const std::vector<U>& v) {
  auto b = gpu<T>().template alloc<U>(ssize(v));
  gpu<T>().from_host(b.span(), std::span<const U>(v));
  return b;
}
template <class T, class U>
std::vector<U> download(cuda::Buffer<U>& b) {
  std::vector<U> out(static_cast<std::size_t>(b.size()));
  gpu<T>().to_host(std::span<U>(out), std::span<const U>(b.span()));
  return out;
}

// Reference: per sequence, positions sorted by (score desc, position asc), the first C, ascending.
template <class T>
std::vector<token_t> topc_reference(const std::vector<T>& scores, index_t batch, index_t seq, index_t C) {
  std::vector<token_t> out;
  for (index_t b = 0; b < batch; ++b) {
    std::vector<token_t> order(static_cast<std::size_t>(seq));
    std::iota(order.begin(), order.end(), token_t(0));
    const T* s = scores.data() + b * seq;
    std::stable_sort(order.begin(), order.end(), [s](token_t a, token_t c) { return s[a] > s[c]; });
    std::sort(order.begin(), order.begin() + C);
    for (index_t j = 0; j < C; ++j) out.push_back(token_t(b * seq + order[std::size_t(j)]));
  }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("depth: select_topc_per_sequence matches the reference (ties, C = 0 .. seq, long sequences)",
                   "[cuda][depth]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(31);
  for (const index_t seq : {index_t(1), index_t(7), index_t(256), index_t(300)})
    for (const index_t batch : {index_t(1), index_t(3)})
      for (const index_t C : {index_t(0), index_t(1), seq / 8, seq / 2, seq}) {
        INFO("batch " << batch << " seq " << seq << " C " << C);
        std::vector<T> scores(static_cast<std::size_t>(batch * seq));
        // Few distinct values, so ties are common: they must go to the earlier position.
        for (auto& s : scores) s = T(rng.integer(-3, 3)) * T(0.5);
        const auto want = topc_reference(scores, batch, seq, C);
        auto d_scores = upload(scores);
        auto d_idx = upload_as<T, token_t>(std::vector<token_t>(std::size_t(batch * C), token_t(-7)));
        gpu<T>().select_topc_per_sequence(d_idx.span(), std::span<const T>(d_scores.span()), batch, seq);
        CHECK(download<T>(d_idx) == want);
        if constexpr (requires(cpu::Backend<T> be, std::span<token_t> i, std::span<const T> s) {
                        be.select_topc_per_sequence(i, s, index_t{1}, index_t{1});
                      }) {
          std::vector<token_t> cpu_idx(std::size_t(batch * C));
          cpu::Backend<T>{}.select_topc_per_sequence(std::span<token_t>(cpu_idx), std::span<const T>(scores), batch,
                                                     seq);
          CHECK(cpu_idx == want);
        }
      }
}

TEMPLATE_TEST_CASE("depth: skip_select (with and without early exit) and selection_mask match the reference",
                   "[cuda][depth]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(32);
  for (const index_t n : {index_t(1), index_t(255), index_t(256), index_t(700)})
    for (const bool early_exit : {false, true}) {
      INFO("n " << n << " early exit " << early_exit);
      const auto logits = test::random_vec<T>(std::size_t(n), rng);
      std::vector<token_t> alive(early_exit ? std::size_t(n) : 0);
      for (auto& a : alive) a = token_t(rng.integer(0, 3) != 0);
      std::vector<token_t> want_idx, want_alive = alive;
      for (index_t i = 0; i < n; ++i) {
        const bool run = logits[std::size_t(i)] > T(0) && (!early_exit || alive[std::size_t(i)] != 0);
        if (run) want_idx.push_back(token_t(i));
        if (early_exit) want_alive[std::size_t(i)] = run ? 1 : 0;
      }
      auto d_logits = upload(logits);
      auto d_idx = upload_as<T, token_t>(std::vector<token_t>(std::size_t(n), token_t(-7)));
      auto d_count = upload_as<T, token_t>(std::vector<token_t>{-1});
      auto d_alive = upload_as<T, token_t>(alive);
      gpu<T>().skip_select(d_idx.span(), d_count.span(), d_alive.span(), std::span<const T>(d_logits.span()));
      const token_t count = gpu<T>().read(d_count.data());
      REQUIRE(count == token_t(want_idx.size()));
      const auto idx = download<T>(d_idx);
      CHECK(std::vector<token_t>(idx.begin(), idx.begin() + count) == want_idx);
      CHECK(download<T>(d_alive) == want_alive);

      // The 0/1 mask of the selection.
      std::vector<T> want_mask(std::size_t(n), T(0));
      for (token_t i : want_idx) want_mask[std::size_t(i)] = T(1);
      auto d_mask = upload(test::random_vec<T>(std::size_t(n), rng));
      gpu<T>().selection_mask(d_mask.span(), std::span<const token_t>(d_idx.data(), std::size_t(count)));
      CHECK(download<T>(d_mask) == want_mask);
    }
  // A bad index is reported at the next sync.
  auto d_mask = upload(std::vector<T>(4, T(0)));
  auto d_bad = upload_as<T, token_t>(std::vector<token_t>{1, 4});
  gpu<T>().selection_mask(d_mask.span(), std::span<const token_t>(d_bad.span()));
  CHECK_THROWS_WITH(gpu<T>().sync(), Catch::Contains("selection_mask") && Catch::Contains("out of range [0, 4)"));
}

TEMPLATE_TEST_CASE("depth: sigmoid and BCE on logits, forward and backward, match the reference", "[cuda][depth]",
                   float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  test::Rng rng(33);
  const index_t n = 1000;
  auto x = test::random_vec<T>(std::size_t(n), rng, -30, 30);  // large |l|: the stable form matters
  x[0] = T(0);
  std::vector<T> targets(static_cast<std::size_t>(n));
  for (auto& t : targets) t = T(rng.integer(0, 1));
  const auto dout = test::random_vec<T>(std::size_t(n), rng), dx0 = test::random_vec<T>(std::size_t(n), rng);

  // Reference in double.
  const auto nn = static_cast<std::size_t>(n);
  std::vector<double> sig(nn), dx_want(nn), dl_want(nn);
  double loss = 0, correct = 0;
  const double scale = 0.37;
  for (std::size_t i = 0; i < std::size_t(n); ++i) {
    const double l = double(x[i]), t = double(targets[i]);
    sig[i] = 1 / (1 + std::exp(-l));
    dx_want[i] = double(dx0[i]) + double(dout[i]) * sig[i] * (1 - sig[i]);
    loss += std::max(l, 0.0) + std::log1p(std::exp(-std::abs(l))) - t * l;
    correct += (l > 0) == (t > 0.5) ? 1 : 0;
    dl_want[i] = double(dx0[i]) + scale * (sig[i] - t);
  }

  auto d_x = upload(x), d_t = upload(targets), d_dout = upload(dout);
  auto d_out = upload(std::vector<T>(std::size_t(n), T(0)));
  gpu<T>().sigmoid_forward(d_out.span(), std::span<const T>(d_x.span()));
  CHECK(test::rel_error(download<T>(d_out), sig) <= tol);
  auto d_dx = upload(dx0);
  gpu<T>().sigmoid_backward(d_dx.span(), std::span<const T>(d_out.span()), std::span<const T>(d_dout.span()));
  CHECK(test::rel_error(download<T>(d_dx), dx_want) <= tol);

  auto d_bce = upload(std::vector<T>{T(-1), T(-1)});
  gpu<T>().bce_logits_forward(d_bce.span(), std::span<const T>(d_x.span()), std::span<const T>(d_t.span()));
  const auto bce = download<T>(d_bce);
  CHECK(std::abs(double(bce[0]) - loss / double(n)) <= tol * (loss / double(n)));
  CHECK(bce[1] == T(correct));
  auto d_dl = upload(dx0);
  gpu<T>().bce_logits_backward(d_dl.span(), std::span<const T>(d_x.span()), std::span<const T>(d_t.span()), T(scale));
  CHECK(test::rel_error(download<T>(d_dl), dl_want) <= tol);

  // Same shape checks (and messages) as the CPU ops.
  CHECK_THROWS_WITH(gpu<T>().bce_logits_forward(std::span<T>(d_bce.data(), 1), std::span<const T>(d_x.span()),
                                                std::span<const T>(d_t.span())),
                    Catch::Contains("bce_logits_forward: out 1 (expected 2"));
  CHECK_THROWS_WITH(gpu<T>().sigmoid_forward(std::span<T>(d_out.data(), 3), std::span<const T>(d_x.span())),
                    Catch::Contains("sigmoid_forward: out has 3 elements"));
  CHECK_THROWS_WITH(gpu<T>().select_topc_per_sequence(std::span<token_t>(), std::span<const T>(d_x.span()), 3, 7),
                    Catch::Contains("select_topc_per_sequence: 1000 scores for batch 3 x seq 7"));
}

TEMPLATE_TEST_CASE("depth: depth_choice_rows and its backward (token-choice MoR) match the reference", "[cuda][depth]",
                   float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(35);
  const index_t n = 777, Nr = 4;
  std::vector<token_t> picks(static_cast<std::size_t>(n));
  for (auto& p : picks) p = token_t(rng.integer(0, Nr - 1));
  const auto w = test::random_vec<T>(std::size_t(n), rng, 0, 1), dcoef = test::random_vec<T>(std::size_t(n), rng);
  auto d_picks = upload_as<T>(picks);
  auto d_w = upload(w), d_dcoef = upload(dcoef);
  for (index_t r = 0; r < Nr; ++r) {
    std::vector<T> dec(static_cast<std::size_t>(n)), coef(static_cast<std::size_t>(n)), dw(w), d_want(w);
    cpu::depth_choice_rows<T>(dec, coef, picks, w, r);
    cpu::depth_choice_rows_backward<T>(d_want, dcoef, picks, r);
    auto d_dec = upload(std::vector<T>(std::size_t(n), T(0))), d_coef = upload(std::vector<T>(std::size_t(n), T(0)));
    auto d_dw = upload(dw);
    gpu<T>().depth_choice_rows(d_dec.span(), d_coef.span(), std::span<const token_t>(d_picks.span()),
                               std::span<const T>(d_w.span()), r);
    gpu<T>().depth_choice_rows_backward(d_dw.span(), std::span<const T>(d_dcoef.span()),
                                        std::span<const token_t>(d_picks.span()), r);
    CHECK(download<T, T>(d_dec) == dec);
    CHECK(download<T, T>(d_coef) == coef);
    CHECK(download<T, T>(d_dw) == d_want);
  }
}

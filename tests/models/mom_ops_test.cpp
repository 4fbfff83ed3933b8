// The routing ops of backend/cpu/routing.hpp: packed attention against the dense causal
// attention op and finite differences, router top-K/renormalisation backward against finite
// differences, the stable counting sort, the balance loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "mom/backend/cpu.hpp"

using namespace mom;

namespace {
std::vector<double> randn(std::size_t n, std::uint64_t seed, double sd = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

TEST_CASE("attention_packed over all tokens equals the dense causal attention op", "[mom][ops]") {
  const index_t batch = 2, seq = 7, heads = 2, d = 8, n = batch * seq;
  auto qkv = randn(std::size_t(n * 3 * d), 1);
  std::vector<double> ref(std::size_t(n * d)), lse_ref(std::size_t(batch * heads * seq));
  cpu::attention_forward<double>({ref.data(), n, d}, std::span(lse_ref), {qkv.data(), n, 3 * d}, batch, seq, heads);
  std::vector<token_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  const MatrixView<const double> m{qkv.data(), n, 3 * d};
  std::vector<double> out(std::size_t(n * d)), lse(std::size_t(n * heads));
  for (bool explicit_keys : {false, true}) {
    cpu::attention_packed_forward<double>({out.data(), n, d}, std::span(lse), m.col_block(0, d), m.col_block(d, d),
                                          m.col_block(2 * d, d), all,
                                          explicit_keys ? std::span<const token_t>(all) : std::span<const token_t>{},
                                          seq, heads);
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(ref[i]).margin(1e-13));
  }
}

TEST_CASE("attention_packed: a query subset sees only earlier keys of its own sequence, gradients", "[mom][ops]") {
  const index_t seq = 6, heads = 2, d = 4;
  const std::vector<token_t> q_tok{1, 2, 5, 6, 9, 11};   // two sequences of 6
  const std::vector<token_t> k_tok{0, 2, 4, 5, 7, 9, 10};
  const index_t nq = 6, nk = 7;
  auto q = randn(std::size_t(nq * d), 2), k = randn(std::size_t(nk * d), 3), v = randn(std::size_t(nk * d), 4);
  auto w = randn(std::size_t(nq * d), 5);  // loss = Σ w ∘ out
  auto run = [&](std::vector<double>& o, std::vector<double>& l) {
    cpu::attention_packed_forward<double>({o.data(), nq, d}, std::span(l), {q.data(), nq, d}, {k.data(), nk, d},
                                          {v.data(), nk, d}, q_tok, k_tok, seq, heads);
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += w[i] * o[i];
    return s;
  };
  std::vector<double> out(std::size_t(nq * d)), lse(std::size_t(nq * heads));
  run(out, lse);
  // Token 6 (sequence 1, position 0) has key 7? no: keys of sequence 1 at or before 6: none.
  CHECK(std::isinf(lse[3 * heads]));
  CHECK(out[3 * d] == 0.0);
  // Token 1 sees only key 0: its output is v row 0.
  for (index_t c = 0; c < d; ++c) CHECK(out[std::size_t(c)] == Approx(v[std::size_t(c)]).margin(1e-14));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_packed_backward<double>({dq.data(), nq, d}, {dk.data(), nk, d}, {dv.data(), nk, d}, {w.data(), nq, d},
                                         {out.data(), nq, d}, std::span<const double>(lse), {q.data(), nq, d},
                                         {k.data(), nk, d}, {v.data(), nk, d}, q_tok, k_tok, seq, heads);
  const double eps = 1e-6;
  for (auto [x, g] : {std::pair{&q, &dq}, {&k, &dk}, {&v, &dv}})
    for (std::size_t i = 0; i < x->size(); ++i) {
      std::vector<double> o(out.size()), l(lse.size());
      const double saved = (*x)[i];
      (*x)[i] = saved + eps;
      const double up = run(o, l);
      (*x)[i] = saved - eps;
      const double down = run(o, l);
      (*x)[i] = saved;
      REQUIRE((*g)[i] == Approx((up - down) / (2 * eps)).margin(1e-8));
    }
}

TEST_CASE("route_topk: temperature softmax, top-K, renormalised weights and their gradient", "[mom][ops]") {
  const index_t n = 5, E = 5, K = 2;
  auto logits = randn(std::size_t(n * E), 7);
  auto dw = randn(std::size_t(n * K), 8);
  const std::vector<double> col{0.3, -0.2, 0.1, 0.5, -0.4};  // a per-column probability gradient
  for (bool renorm : {true, false}) {
    auto run = [&](std::vector<double>& w, std::vector<token_t>& picks, std::vector<double>& p) {
      cpu::route_topk_forward<double>({w.data(), n, K}, {picks.data(), n, K}, {p.data(), n, E},
                                      {logits.data(), n, E}, 5.0, renorm);
      double s = 0;
      for (std::size_t i = 0; i < w.size(); ++i) s += dw[i] * w[i];
      for (index_t r = 0; r < n; ++r)
        for (index_t e = 0; e < E; ++e) s += col[std::size_t(e)] * p[std::size_t(r * E + e)];
      return s;
    };
    std::vector<double> w(std::size_t(n * K)), p(std::size_t(n * E));
    std::vector<token_t> picks(std::size_t(n * K));
    run(w, picks, p);
    for (index_t r = 0; r < n; ++r) {
      CHECK(p[std::size_t(r * E + picks[std::size_t(r * K)])] >= p[std::size_t(r * E + picks[std::size_t(r * K + 1)])]);
      if (renorm) CHECK(w[std::size_t(r * K)] + w[std::size_t(r * K + 1)] == Approx(1.0));
    }
    std::vector<double> dl(logits.size());
    cpu::route_topk_backward<double>({dl.data(), n, E}, {dw.data(), n, K}, {w.data(), n, K}, {p.data(), n, E},
                                     {picks.data(), n, K}, 5.0, renorm, col);
    const double eps = 1e-6;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      std::vector<double> w2(w.size()), p2(p.size());
      std::vector<token_t> k2(picks.size());
      const double saved = logits[i];
      logits[i] = saved + eps;
      const double up = run(w2, k2, p2);
      REQUIRE(k2 == picks);
      logits[i] = saved - eps;
      const double down = run(w2, k2, p2);
      REQUIRE(k2 == picks);
      logits[i] = saved;
      REQUIRE(dl[i] == Approx((up - down) / (2 * eps)).margin(1e-8));
    }
  }
}

TEST_CASE("group_by_choice is a stable counting sort, balance loss", "[mom][ops]") {
  const std::vector<token_t> picks{2, 0, 1, 2, 0, 3, 2, 1};  // 4 tokens, K = 2, E = 4
  std::vector<token_t> row_token(8), row_slot(8), offsets(5);
  cpu::group_by_choice(row_token, row_slot, offsets, MatrixView<const token_t>(picks.data(), 4, 2), 4);
  CHECK(offsets == std::vector<token_t>{0, 2, 4, 7, 8});
  CHECK(row_token == std::vector<token_t>{0, 2, 1, 3, 0, 1, 3, 2});  // ascending tokens inside each class
  CHECK(row_slot == std::vector<token_t>{1, 4, 2, 7, 0, 3, 6, 5});
  std::vector<double> probs{0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25, 0.4, 0.3, 0.2, 0.1, 0.0, 0.5, 0.5, 0.0};
  std::vector<double> loss(1), col(4);
  cpu::balance_loss_forward<double>(loss, col, {probs.data(), 4, 4}, offsets, 2, 0.01);
  // f = (2, 2, 3, 1) / 8, P = (0.1875, 0.3125, 0.3125, 0.1875)
  const double expect = 0.01 * 4 * (2 * 0.1875 + 2 * 0.3125 + 3 * 0.3125 + 1 * 0.1875) / 8;
  CHECK(loss[0] == Approx(expect));
  CHECK(col[2] == Approx(0.01 * 4 * (3.0 / 8) / 4));
}

TEST_CASE("attention_packed over several query blocks matches a naive reference, forward and backward", "[mom][ops]") {
  const index_t seq = 150, heads = 2, d = 8, hd = d / heads, batch = 2;
  std::mt19937_64 rng(9);
  std::vector<token_t> q_tok, k_tok;  // ~2/3 of the tokens query, ~1/2 give keys
  for (token_t t = 0; t < batch * seq; ++t) {
    if (rng() % 3 != 0) q_tok.push_back(t);
    if (rng() % 2 == 0) k_tok.push_back(t);
  }
  const index_t nq = ssize(std::span(q_tok)), nk = ssize(std::span(k_tok));
  auto q = randn(std::size_t(nq * d), 10), k = randn(std::size_t(nk * d), 11), v = randn(std::size_t(nk * d), 12);
  auto dout = randn(std::size_t(nq * d), 13);
  // Naive reference with its analytic gradient, one query at a time.
  std::vector<double> ref(q.size()), dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
  for (index_t i = 0; i < nq; ++i)
    for (index_t h = 0; h < heads; ++h) {
      std::vector<index_t> js;
      for (index_t j = 0; j < nk; ++j)
        if (k_tok[std::size_t(j)] / seq == q_tok[std::size_t(i)] / seq && k_tok[std::size_t(j)] <= q_tok[std::size_t(i)])
          js.push_back(j);
      if (js.empty()) continue;
      std::vector<double> p;
      double m = -1e300, sum = 0;
      for (index_t j : js) {
        double s = 0;
        for (index_t c = 0; c < hd; ++c) s += q[std::size_t(i * d + h * hd + c)] * k[std::size_t(j * d + h * hd + c)];
        p.push_back(s / std::sqrt(double(hd)));
        m = std::max(m, p.back());
      }
      for (auto& x : p) sum += (x = std::exp(x - m));
      for (auto& x : p) x /= sum;
      double D = 0;
      for (std::size_t a = 0; a < js.size(); ++a)
        for (index_t c = 0; c < hd; ++c) {
          ref[std::size_t(i * d + h * hd + c)] += p[a] * v[std::size_t(js[a] * d + h * hd + c)];
        }
      for (index_t c = 0; c < hd; ++c) D += dout[std::size_t(i * d + h * hd + c)] * ref[std::size_t(i * d + h * hd + c)];
      for (std::size_t a = 0; a < js.size(); ++a) {
        double dp = 0;
        for (index_t c = 0; c < hd; ++c) dp += dout[std::size_t(i * d + h * hd + c)] * v[std::size_t(js[a] * d + h * hd + c)];
        const double ds = p[a] * (dp - D) / std::sqrt(double(hd));
        for (index_t c = 0; c < hd; ++c) {
          dq_ref[std::size_t(i * d + h * hd + c)] += ds * k[std::size_t(js[a] * d + h * hd + c)];
          dk_ref[std::size_t(js[a] * d + h * hd + c)] += ds * q[std::size_t(i * d + h * hd + c)];
          dv_ref[std::size_t(js[a] * d + h * hd + c)] += p[a] * dout[std::size_t(i * d + h * hd + c)];
        }
      }
    }
  std::vector<double> out(q.size()), lse(std::size_t(nq * heads)), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_packed_forward<double>({out.data(), nq, d}, std::span(lse), {q.data(), nq, d}, {k.data(), nk, d},
                                        {v.data(), nk, d}, q_tok, k_tok, seq, heads);
  for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(ref[i]).margin(1e-12));
  cpu::attention_packed_backward<double>({dq.data(), nq, d}, {dk.data(), nk, d}, {dv.data(), nk, d},
                                         {dout.data(), nq, d}, {out.data(), nq, d}, std::span<const double>(lse),
                                         {q.data(), nq, d}, {k.data(), nk, d}, {v.data(), nk, d}, q_tok, k_tok, seq,
                                         heads);
  for (std::size_t i = 0; i < dq.size(); ++i) REQUIRE(dq[i] == Approx(dq_ref[i]).margin(1e-12));
  for (std::size_t i = 0; i < dk.size(); ++i) REQUIRE(dk[i] == Approx(dk_ref[i]).margin(1e-12));
  for (std::size_t i = 0; i < dv.size(); ++i) REQUIRE(dv[i] == Approx(dv_ref[i]).margin(1e-12));
}

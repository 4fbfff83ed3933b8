#pragma once
// A hand-computed pre-norm transformer in double, naive loops and no library op, for the reference
// tests of the routed depths (tests/models/depth_model_test.cpp: Mixture-of-Depths;
// tests/models/recursion_test.cpp: Mixture-of-Recursions): embedding, one block (layer `layer`'s
// h.<layer>.* tensors) over a list of rows causal among them only, and the LM head.
#include <cmath>
#include <string>
#include <vector>

#include "mom/mom.hpp"

namespace mom::test {

template <Dims D>
struct NaiveTransformer {
  using Row = std::vector<double>;
  template <class Model>
  static const double* at(const std::vector<double>& p, const std::string& name) {
    return p.data() + Model::find(name).offset;
  }
  static Row layernorm(const Row& x, const double* g, const double* b) {
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= double(x.size());
    for (double v : x) var += (v - mean) * (v - mean);
    var /= double(x.size());
    Row y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + 1e-5) * g[i] + b[i];
    return y;
  }
  static Row linear(const Row& x, const double* w, const double* b, std::size_t out) {
    Row y(out);
    for (std::size_t o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (std::size_t i = 0; i < x.size(); ++i) s += w[o * x.size() + i] * x[i];
      y[o] = s;
    }
    return y;
  }
  static double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

  // One transformer block (layer `layer`) over the rows xs, in their order, causal among them only.
  template <class Model>
  // With `keys` (and `qpos`, the rows' positions in it) the rows' queries attend to the keys and values of
  // those rows, positions 0 .. qpos[i] (Mixture-of-Recursions' KV sharing), instead of to each other.
  static std::vector<Row> block(const std::vector<double>& p, int layer, const std::vector<Row>& xs,
                                const std::vector<Row>* keys = nullptr, const std::vector<index_t>* qpos = nullptr) {
    const std::size_t n = xs.size(), d = D.d_model, H = D.heads, hd = d / H, f = D.ff();
    const std::string h = "h." + std::to_string(layer) + ".";
    std::vector<Row> qkv(n), out(n), kv;
    auto project = [&](const Row& x) {
      return linear(layernorm(x, at<Model>(p, h + "ln_1.w"), at<Model>(p, h + "ln_1.b")), at<Model>(p, h + "attn.w_qkv"),
                    at<Model>(p, h + "attn.b_qkv"), 3 * d);
    };
    for (std::size_t i = 0; i < n; ++i) qkv[i] = project(xs[i]);
    if (keys)
      for (const Row& k : *keys) kv.push_back(project(k));
    const std::vector<Row>& src = keys ? kv : qkv;
    for (std::size_t i = 0; i < n; ++i) {
      Row att(d, 0.0);
      const std::size_t last = keys ? std::size_t((*qpos)[i]) : i;
      for (std::size_t hh = 0; hh < H; ++hh) {
        std::vector<double> s(last + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= last; ++j) {
          double dot = 0;
          for (std::size_t c = 0; c < hd; ++c) dot += qkv[i][hh * hd + c] * src[j][d + hh * hd + c];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (std::size_t j = 0; j <= last; ++j)
          for (std::size_t c = 0; c < hd; ++c) att[hh * hd + c] += s[j] / sum * src[j][2 * d + hh * hd + c];
      }
      const Row a = linear(att, at<Model>(p, h + "attn.w_proj"), at<Model>(p, h + "attn.b_proj"), d);
      Row u(d);
      for (std::size_t c = 0; c < d; ++c) u[c] = xs[i][c] + a[c];
      Row hid = linear(layernorm(u, at<Model>(p, h + "ln_2.w"), at<Model>(p, h + "ln_2.b")), at<Model>(p, h + "mlp.w_fc"),
                       at<Model>(p, h + "mlp.b_fc"), f);
      for (auto& v : hid) v = gelu(v);
      const Row mo = linear(hid, at<Model>(p, h + "mlp.w_proj"), at<Model>(p, h + "mlp.b_proj"), d);
      out[i] = u;
      for (std::size_t c = 0; c < d; ++c) out[i][c] += mo[c];
    }
    return out;
  }


  // x_0 = wte[token] + wpe[position] for batch × seq tokens.
  template <class Model>
  static std::vector<Row> embed(const std::vector<double>& p, const std::vector<token_t>& tokens, index_t batch,
                                index_t seq) {
    const std::size_t d = D.d_model;
    const double* wte = at<Model>(p, "wte");
    const double* wpe = at<Model>(p, "wpe");
    std::vector<Row> x(std::size_t(batch * seq), Row(d));
    for (index_t t = 0; t < batch * seq; ++t)
      for (std::size_t c = 0; c < d; ++c) x[t][c] = wte[tokens[t] * d + c] + wpe[(t % seq) * d + c];
    return x;
  }
  // The logits of every row: ln_f then the tied head.
  template <class Model>
  static std::vector<double> head(const std::vector<double>& p, const std::vector<Row>& x) {
    const std::size_t d = D.d_model, V = D.vocab;
    const double* wte = at<Model>(p, "wte");
    std::vector<double> logits;
    for (const Row& xr : x) {
      const Row ln = layernorm(xr, at<Model>(p, "ln_f.w"), at<Model>(p, "ln_f.b"));
      for (std::size_t v = 0; v < V; ++v) {
        double s = 0;
        for (std::size_t c = 0; c < d; ++c) s += wte[v * d + c] * ln[c];
        logits.push_back(s);
      }
    }
    return logits;
  }
};

}  // namespace mom::test

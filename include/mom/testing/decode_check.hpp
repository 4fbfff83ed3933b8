#pragma once
// KV-cache decoding against the full forward (mom/testing.hpp): the exactness check of a model's decode path
// (infer::Decoder: prefill in passes, then one token per step for every unfinished sequence), for any family
// and for a user's attention that implements plan_decode / decode (docs/extending.md):
//
//   const auto r = mom::testing::decode_check<Model, double>();
//   CHECK(r.ok(1e-12));   // float: r.ok(1e-4); r.summary() says what failed
#include <algorithm>
#include <cmath>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mom/backend/cpu.hpp"
#include "mom/core/check.hpp"
#include "mom/infer/decoder.hpp"
#include "mom/testing/random.hpp"

namespace mom::testing {

// max |a - b| / max |b| over a row of logits.
template <class T>
double row_error(std::span<const T> a, const T* b, index_t n) {
  double diff = 0, scale = 0;
  for (index_t v = 0; v < n; ++v) {
    diff = std::max(diff, std::abs(double(a[std::size_t(v)]) - double(b[v])));
    scale = std::max(scale, std::abs(double(b[v])));
  }
  return diff / scale;
}

// Sequences of different lengths decoded together: each sequence's tokens and its prompt.
// lengths / prompt_len empty: the context, 9, 17 and 1 tokens with prompts of 5, 1, 17 and 1.
struct DecodeCase {
  std::vector<index_t> lengths, prompt_len;
  std::vector<std::vector<token_t>> seqs, prompts;
};
inline DecodeCase decode_case(index_t context, index_t vocab, std::vector<index_t> lengths = {},
                              std::vector<index_t> prompt_len = {}) {
  if (lengths.empty()) lengths = {context, 9, 17, 1}, prompt_len = {5, 1, 17, 1};
  MOM_CHECK(lengths.size() == prompt_len.size(), "decode_case: ", lengths.size(), " lengths but ", prompt_len.size(),
            " prompt lengths");
  DecodeCase c{lengths, prompt_len, {}, {}};
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    MOM_CHECK(prompt_len[b] >= 1 && prompt_len[b] <= lengths[b] && lengths[b] <= context, "decode_case: sequence ", b,
              " has length ", lengths[b], " and prompt ", prompt_len[b], " (1 <= prompt <= length <= context ", context,
              ")");
    c.seqs.push_back(random_tokens(lengths[b], vocab, 100 + b));
    c.prompts.emplace_back(c.seqs[b].begin(), c.seqs[b].begin() + prompt_len[b]);
  }
  return c;
}
// The next decode step: every unfinished sequence's slot and next token (false: all are done).
template <class Decoder>
bool next_step(const Decoder& dec, const DecodeCase& c, std::vector<index_t>& slots, std::vector<token_t>& toks) {
  slots.clear();
  toks.clear();
  for (std::size_t b = 0; b < c.lengths.size(); ++b)
    if (dec.length(index_t(b)) < c.lengths[b]) {
      slots.push_back(index_t(b));
      toks.push_back(c.seqs[b][std::size_t(dec.length(index_t(b)))]);
    }
  return !slots.empty();
}

// Sequences of different lengths (the last one fills the context) decoded together: prefill with
// prompts of different lengths, then one token per step for every unfinished sequence; each token's
// logits against a full forward over its sequence.
// lengths / prompt_len: each sequence's length and its prompt's (empty: the context, 9, 17 and 1 tokens
// with prompts of 5, 1, 17 and 1). seed: the parameters' randomisation (test::randomise, scale 0.2).
// prefill_rows: the Decoder's prefill pass size (0: its default, every prompt token of these cases in one pass; 3:
// passes that split a prompt).
// What decode_check found: the largest error of a decoded token's logits against the full forward's (max |a − b|
// / max |b| over the row), and whether the Decoder's bookkeeping held: each prompt's length after prefill, each
// sequence's final length, and step()'s logits equal to last_logits() for the same sequence.
struct DecodeReport {
  double max_error = 0;
  int rows = 0;                 // decoded rows compared (prefill's last rows and every step's)
  int length_mismatches = 0;    // Decoder::length() not what was fed
  int last_logits_mismatches = 0;
  bool finite = true;           // every compared logit was finite
  bool ok(double tolerance) const {
    return finite && rows > 0 && max_error <= tolerance && length_mismatches == 0 && last_logits_mismatches == 0;
  }
  std::string summary() const {
    std::ostringstream s;
    s << "decoded rows " << rows << ", max error " << max_error << ", length mismatches " << length_mismatches
      << ", step / last_logits mismatches " << last_logits_mismatches << (finite ? "" : ", non-finite logits");
    return s.str();
  }
};

// Sequences of different lengths (the first fills the context) decoded together: prefill with prompts of
// different lengths, then one token per step for every unfinished sequence; each token's logits against a full
// forward over its sequence.
// lengths / prompt_len: each sequence's length and its prompt's (empty: the context, 9, 17 and 1 tokens with
// prompts of 5, 1, 17 and 1; the model's context must then be at least 17). seed: the parameters'
// randomisation (randomise, scale 0.2). prefill_rows: the Decoder's prefill pass size (0: its default, every
// prompt token of these cases in one pass; 3: passes that split a prompt).
template <class Model, class T>
DecodeReport decode_check(std::vector<index_t> lengths = {}, std::vector<index_t> prompt_len = {}, unsigned seed = 11,
                          index_t prefill_rows = 0) {
  constexpr index_t C = Model::dims.context, V = Model::dims.vocab;
  const DecodeCase c = decode_case(C, V, std::move(lengths), std::move(prompt_len));
  const std::size_t S = c.lengths.size();
  auto model = Model::template make<cpu::Backend<T>>(7);
  randomise(model, seed, 0.2);
  // Reference: one full forward per sequence.
  std::vector<std::vector<T>> full(S);
  {
    auto ref = Model::template make<cpu::Backend<T>>(7);
    std::copy(model.params().begin(), model.params().end(), ref.params().begin());
    ref.reserve(1, C);
    for (std::size_t b = 0; b < S; ++b) {
      ref.forward(c.seqs[b], {}, 1, c.lengths[b]);
      const auto l = ref.logits();
      full[b].assign(l.data, l.data + c.lengths[b] * V);
    }
  }
  DecodeReport r;
  auto compare = [&](std::span<const T> row, const T* expected) {
    const double e = row_error(row, expected, V);
    r.finite = r.finite && std::isfinite(e);
    r.max_error = std::max(r.max_error, std::isfinite(e) ? e : r.max_error);
    ++r.rows;
  };
  infer::Decoder dec(model, index_t(S), C, prefill_rows);
  dec.prefill(std::span<const std::vector<token_t>>(c.prompts));
  for (std::size_t b = 0; b < S; ++b) {
    r.length_mismatches += dec.length(index_t(b)) != c.prompt_len[b];
    compare(dec.last_logits(index_t(b)), full[b].data() + (c.prompt_len[b] - 1) * V);
  }
  std::vector<index_t> slots;
  std::vector<token_t> toks;
  while (next_step(dec, c, slots, toks)) {
    const auto logits = dec.step(slots, toks);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto b = std::size_t(slots[i]), at = std::size_t(dec.length(slots[i]) - 1);
      compare(std::span<const T>(logits.row(index_t(i)), std::size_t(V)), full[b].data() + at * V);
      r.last_logits_mismatches +=
          !std::equal(logits.row(index_t(i)), logits.row(index_t(i)) + V, dec.last_logits(index_t(b)).begin());
    }
  }
  for (std::size_t b = 0; b < S; ++b) r.length_mismatches += dec.length(index_t(b)) != c.lengths[b];
  return r;
}

}  // namespace mom::testing

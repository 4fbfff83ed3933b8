#pragma once
// KV-cache decoding against the full forward, shared by the decode tests of every family
// (tests/models/decode_test.cpp, rope_model_test.cpp, switch_head_test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "mom/mom.hpp"
#include "models/random_tokens.hpp"

namespace mom::test {

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
  REQUIRE(lengths.size() == prompt_len.size());
  DecodeCase c{lengths, prompt_len, {}, {}};
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    c.seqs.push_back(test::random_tokens(lengths[b], vocab, 100 + b));
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
template <class Model, class T>
double decode_error(std::vector<index_t> lengths = {}, std::vector<index_t> prompt_len = {}, unsigned seed = 11,
                    index_t prefill_rows = 0) {
  constexpr index_t C = Model::dims.context, V = Model::dims.vocab;
  const DecodeCase c = decode_case(C, V, std::move(lengths), std::move(prompt_len));
  const std::size_t S = c.lengths.size();
  auto model = Model::template make<cpu::Backend<T>>(7);
  test::randomise(model, seed, 0.2);
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
  infer::Decoder dec(model, index_t(S), C, prefill_rows);
  dec.prefill(std::span<const std::vector<token_t>>(c.prompts));
  double worst = 0;
  for (std::size_t b = 0; b < S; ++b) {
    CHECK(dec.length(index_t(b)) == c.prompt_len[b]);
    worst = std::max(worst, row_error(dec.last_logits(index_t(b)), full[b].data() + (c.prompt_len[b] - 1) * V, V));
  }
  std::vector<index_t> slots;
  std::vector<token_t> toks;
  while (next_step(dec, c, slots, toks)) {
    const auto logits = dec.step(slots, toks);
    for (std::size_t r = 0; r < slots.size(); ++r) {
      const auto b = std::size_t(slots[r]), at = std::size_t(dec.length(slots[r]) - 1);
      worst = std::max(worst, row_error(std::span<const T>(logits.row(index_t(r)), std::size_t(V)),
                                        full[b].data() + at * V, V));
      CHECK(std::equal(logits.row(index_t(r)), logits.row(index_t(r)) + V, dec.last_logits(index_t(b)).begin()));
    }
  }
  for (std::size_t b = 0; b < S; ++b) CHECK(dec.length(index_t(b)) == c.lengths[b]);
  return worst;
}

}  // namespace mom::test

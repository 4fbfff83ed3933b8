#pragma once
// The decode tests' use of the kit's decode_check (mom/testing/decode_check.hpp): its bookkeeping as Catch2
// checks, the logits' error returned for each test's own tolerance.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "mom/testing/decode_check.hpp"
#include "models/random_tokens.hpp"

namespace mom::test {

using testing::decode_case;
using testing::DecodeCase;
using testing::next_step;
using testing::row_error;

template <class Model, class T>
double decode_error(std::vector<index_t> lengths = {}, std::vector<index_t> prompt_len = {}, unsigned seed = 11,
                    index_t prefill_rows = 0) {
  const testing::DecodeReport r =
      testing::decode_check<Model, T>(std::move(lengths), std::move(prompt_len), seed, prefill_rows);
  INFO(r.summary());
  CHECK(r.rows > 0);
  CHECK(r.finite);
  CHECK(r.length_mismatches == 0);
  CHECK(r.last_logits_mismatches == 0);
  return r.max_error;
}

}  // namespace mom::test

#pragma once
// Random token ids and parameters for the model tests: the kit's (mom/testing/random.hpp).
#include "mom/testing/random.hpp"

namespace mom::test {
using testing::random_tokens;
using testing::randomise;
}  // namespace mom::test

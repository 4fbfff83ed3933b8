#pragma once
// The FLOP-counting backend of the cost-model tests: the kit's (mom/testing/counting_backend.hpp).
#include "mom/testing/counting_backend.hpp"

namespace mom::test {
using testing::CountingBackend;
}  // namespace mom::test

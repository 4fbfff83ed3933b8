#pragma once
// mom::testing: the checks a user runs on a module, router or architecture of their own (docs/extending.md,
// step 4), from any test framework: each returns a report with ok() and summary(), nothing asserts.
//
//   gradient_check<Model>(seed)            whole-model central differences in double, routing held fixed
//                                          (testing/gradient_check.hpp; check_central_differences for your own
//                                          objective or routing reader)
//   module_gradient_check<M>(seed)         one module's parameters and input, with workspace / scratch guards
//                                          (testing/module_check.hpp)
//   CountingBackend<T>                     executed FLOPs, against the cost model (testing/counting_backend.hpp)
//   decode_check<Model, T>()               KV-cache decoding against the full forward (testing/decode_check.hpp)
//   random_tokens, randomise               inputs and O(1) parameters (testing/random.hpp)
//
// The library's own tests (tests/models/) use these; tests/extending shows them on user types.
#include "mom/testing/counting_backend.hpp"
#include "mom/testing/decode_check.hpp"
#include "mom/testing/gradient_check.hpp"
#include "mom/testing/module_check.hpp"
#include "mom/testing/random.hpp"

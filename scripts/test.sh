#!/usr/bin/env bash
# Configure, build and run the whole test suite (CTest), then the bounded sanitizer and fuzz passes:
# the ops and train tests under ASan+UBSan (scripts/sanitize.sh --quick, in build-asan/) and 10 s of
# libFuzzer per target over the committed corpus (scripts/fuzz.sh 10, in build-fuzz/); any failure or report
# fails the script. Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
# The benchmarks (bench/) are not part of the suite: `cmake --build build --target bench_train_step` etc.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOM_BUILD_TESTS=ON -DMOM_BUILD_BENCH=OFF
cmake --build "$build" -j "$jobs"
(cd "$build" && ctest --output-on-failure -j "$jobs")
bash scripts/sanitize.sh --quick
bash scripts/fuzz.sh 10

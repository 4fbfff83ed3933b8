#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++), in its own build folder.
#
#   bash scripts/sanitize.sh [--quick|--full] [build-dir]     (default: --full, build-asan)
#
#   --full    every CTest test (ops, models, train, examples, compile-fail, docs, package)
#   --quick   only the test_ops and test_train binaries (CTest names ops.* and train.*): what CI runs
#
# Build: Debug with -O1 -g1 (assertions on; -g1: line tables for the reports, less to compile than -g),
# -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined, MOM_BUILD_TESTS=ON,
# no benchmarks. A sanitizer report (ASan, UBSan, LeakSanitizer where it works here) ends its process with a
# failure, which fails its test; besides, every test's output (passing ones too) is kept in
# <build-dir>/sanitize-junit.xml and searched for reports, so one from a child process whose failure a test
# expects is not lost. Exit status: 1 if any test fails or any report appears, 0 otherwise.
# Environment: MOM_SANITIZE_JOBS (default: 2) build and ctest parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

mode=full
build=build-asan
for arg in "$@"; do
  case "$arg" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "sanitize: unknown option '$arg' (use --quick or --full)" >&2; exit 2 ;;
    *) build="$arg" ;;
  esac
done
jobs="${MOM_SANITIZE_JOBS:-2}"
cxx="${CXX:-g++}"
san_flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
start=$SECONDS

# LeakSanitizer needs to stop the world with ptrace; some containers forbid it. Probe once.
mkdir -p "$build"
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstdlib>\nint main() { void* p = std::malloc(7); p = nullptr; return p != nullptr; }\n' >"$probe_dir/p.cpp"
detect_leaks=0
if "$cxx" -fsanitize=address -g "$probe_dir/p.cpp" -o "$probe_dir/p" 2>/dev/null; then
  if ASAN_OPTIONS=detect_leaks=1 "$probe_dir/p" >"$probe_dir/out" 2>&1; then :; fi
  grep -q "detected memory leaks" "$probe_dir/out" && detect_leaks=1
fi
echo "sanitize: [1/3] configure $build ($mode; $cxx ${san_flags}; LeakSanitizer $([ $detect_leaks = 1 ] && echo on || echo 'off: it does not work here'))"

# -Wno-uninitialized: at -O1 with ASan, g++ 12 warns about its own AVX-512 intrinsic headers (`__m512 __Y = __Y;`)
# over a thousand times, as the main build's -Wno-maybe-uninitialized notes for -march=native.
examples=ON
targets=()
ctest_filter=()
if [ "$mode" = quick ]; then
  examples=OFF
  targets=(--target test_ops test_train)
  ctest_filter=(-R '^(ops|train)\.')
fi
# Ninja where it is installed (scripts/setup.sh installs it): it builds test_ops and test_train side by side,
# where make runs one target after the other. A folder keeps the generator it was first configured with.
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="$san_flags -Wno-uninitialized" -DCMAKE_EXE_LINKER_FLAGS="$san_flags" \
  -DMOM_BUILD_TESTS=ON -DMOM_BUILD_EXAMPLES="$examples" -DMOM_BUILD_BENCH=OFF -DMOM_CUDA=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "sanitize: configure failed" >&2; exit 1; }

echo "sanitize: [2/3] build ${targets[*]:-all} with -j$jobs"
t0=$SECONDS
cmake --build "$build" -j "$jobs" "${targets[@]}"
echo "sanitize: build took $((SECONDS - t0)) s"

junit="$repo/$build/sanitize-junit.xml"
echo "sanitize: [3/3] ctest ${ctest_filter[*]:-(all tests)} under ASan+UBSan (every test's output: $junit)"
# No detect_stack_use_after_return: GCC's fake stack frames do not keep the 64-byte alignment of the
# AVX-512 vector locals (backend/cpu/vecmath_isa.hpp), so an aligned store there faults.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=$detect_leaks:check_initialization_order=1:strict_init_order=1:strict_string_checks=1:print_stacktrace=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
# Keep passing tests' whole output in the JUnit file (CTest cuts it to 1 KB by default).
echo 'set(CTEST_CUSTOM_MAXIMUM_PASSED_TEST_OUTPUT_SIZE 10000000)' >"$build/CTestCustom.cmake"
t0=$SECONDS
status=0
rm -f "$junit"
(cd "$build" && ctest --output-on-failure -j "$jobs" --output-junit "$junit" "${ctest_filter[@]}") || status=$?
echo "sanitize: ctest took $((SECONDS - t0)) s"

pattern='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)'
if [ -f "$junit" ] && grep -Eq "$pattern" "$junit"; then
  grep -En "$pattern" "$junit" | head -n 20
  echo "sanitize: FAILED: sanitizer report(s) in the tests' output ($junit)" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "sanitize: FAILED: ctest exited $status" >&2
  exit 1
fi
echo "sanitize: OK ($mode): no sanitizer report, all tests passed ($((SECONDS - start)) s in all)"

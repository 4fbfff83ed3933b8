#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ (clang++-14, -fsanitize=fuzzer,address,undefined) and runs each
# target for a bounded time on its committed seed corpus.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET ...]      (default: 60 seconds; all targets)
#   bash scripts/fuzz.sh --make-corpus               (rewrite the seed files of tests/fuzz/corpus/)
#
# Targets: safetensors (safetensors::File), token_file (TokenFile), tokenizer (GPT-2 BPE + byte tokenizer).
# For each target: (1) every file of tests/fuzz/corpus/<target>/ is run once (the regression pass: a reproducer
# saved there fails it until its bug is fixed), (2) libFuzzer mutates for SECONDS from that corpus, with
# new inputs kept in build-fuzz/corpus/<target>/ (the committed corpus is only read). A crash, a sanitizer
# report, a broken property, a timeout (-timeout) or running out of memory (-rss_limit_mb) fails the script;
# the input is saved as build-fuzz/artifacts/<target>/crash-* (or timeout-*, oom-*, leak-*) and the log is
# build-fuzz/logs/<target>.log. Exit status: 0 when every target ran clean, 1 otherwise.
# Environment: MOM_FUZZ_BUILD (default build-fuzz), MOM_FUZZ_JOBS (build parallelism, default 2),
# CXX (default clang++-14), MOM_GPT2_DIR (GPT-2 vocabulary, else the one scripts/setup.sh installs).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${MOM_FUZZ_BUILD:-build-fuzz}"
jobs="${MOM_FUZZ_JOBS:-2}"
cxx="${CXX:-clang++-14}"
all_targets=(safetensors token_file tokenizer)

make_corpus=0
seconds=60
targets=()
for arg in "$@"; do
  case "$arg" in
    --make-corpus) make_corpus=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    [0-9]*) seconds="$arg" ;;
    safetensors|token_file|tokenizer) targets+=("$arg") ;;
    *) echo "fuzz: unknown argument '$arg' (SECONDS, --make-corpus, or a target: ${all_targets[*]})" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: $cxx not found: install clang-14 and libclang-rt-14-dev (scripts/setup.sh does)" >&2
  exit 1
fi

echo "fuzz: [1/2] build $build with $cxx -fsanitize=fuzzer,address,undefined"
mkdir -p "$build"
cmake -S tests/fuzz -B "$build" -DCMAKE_CXX_COMPILER="$cxx" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "fuzz: configure failed" >&2; exit 1; }
if [ "$make_corpus" = 1 ]; then
  cmake --build "$build" -j "$jobs" --target make_corpus
  "$build/make_corpus" tests/fuzz/corpus
  exit 0
fi
t0=$SECONDS
cmake --build "$build" -j "$jobs" --target "${targets[@]/#/fuzz_}"
echo "fuzz: build took $((SECONDS - t0)) s"

# LeakSanitizer where it works here (it needs ptrace; some containers forbid it): libFuzzer then reports leaks.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:print_stacktrace=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
mkdir -p "$build/logs"
failed=()
report='==[0-9]+==ERROR|runtime error:|property violated|^SUMMARY'  # the first lines of a finding
echo "fuzz: [2/2] ${targets[*]}: regression pass over tests/fuzz/corpus/<target>/, then ${seconds} s of fuzzing each"
for target in "${targets[@]}"; do
  bin="$build/fuzz_$target"
  seeds="tests/fuzz/corpus/$target"
  work="$build/corpus/$target"
  artifacts="$build/artifacts/$target/"
  log="$build/logs/$target.log"
  mkdir -p "$work" "$artifacts"
  dict=()
  [ -f "tests/fuzz/$target.dict" ] && dict=(-dict="tests/fuzz/$target.dict")
  common=(-rss_limit_mb=2048 -timeout=20 -artifact_prefix="$artifacts" "${dict[@]}")

  mapfile -t files < <(find "$seeds" -type f | sort)
  if ! "$bin" "${common[@]}" "${files[@]}" >"$log" 2>&1; then
    grep -E '^Running: ' "$log" | tail -n 1
    grep -E -A 12 "$report" "$log" | head -n 40
    echo "fuzz: $target: FAILED the regression pass over $seeds/ (${#files[@]} files; log $log)" >&2
    failed+=("$target")
    continue
  fi

  t0=$SECONDS
  status=0
  "$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 "$work" "$seeds" >>"$log" 2>&1 || status=$?
  took=$((SECONDS - t0))
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
  if [ "$status" -ne 0 ]; then
    grep -E -A 12 "$report" "$log" | head -n 40 || true
    grep -E 'Test unit written' "$log" || true
    echo "fuzz: $target: FAILED after ${took} s (exit $status; inputs in $artifacts, log $log)" >&2
    failed+=("$target")
  else
    echo "fuzz: $target: OK, ${#files[@]} seed files pass; ${took} s, ${execs:-?} executions (${rate:-?}/s); ${done_line#*DONE   }"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: OK: ${targets[*]}"

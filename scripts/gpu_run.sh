#!/usr/bin/env bash
# Everything issue 7 asks of a GPU session, in one call (the device tool's run, from the repository
# root, after scripts/gpu_prepare.sh here and with carry=[".gpu-deps"]):
#   1. configure and build test_cuda and bench_gpu_train_step for the GPU in the machine,
#   2. the cross-backend suite (every op and model against the CPU backend),
#   3. compute-sanitizer memcheck and racecheck over the op tests,
#   4. bench_gpu_train_step: GPT-2 small (seq 1024) TF32 / bf16 and MoM_P, tokens/s and MFU.
# Logs go to $OUT (or ./gpu-out); the summary is printed last.
source "$(dirname "$0")/gpu_common.sh"

arch="${MOM_CUDA_ARCH:-native}"
if ! cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DMOM_BUILD_EXAMPLES=OFF -DMOM_BUILD_BENCH=ON >"$out/configure.txt" 2>&1; then
  note "configure FAILED (configure.txt)"; tail -20 "$out/configure.txt"; exit 1
fi
start=$(date +%s)
if ! cmake --build build-gpu -j"$jobs" --target test_cuda bench_gpu_train_step >"$out/build.txt" 2>&1; then
  note "build FAILED (build.txt)"; grep -m 20 -E "error" "$out/build.txt"; exit 1
fi
note "build: $(( $(date +%s) - start )) s"

# 2. The suite: must not print the no-GPU skip line.
./build-gpu/tests/cuda/test_cuda --durations yes >"$out/test_cuda.txt" 2>&1
rc=$?
skipped=$(grep -c "no CUDA device: skipped" "$out/test_cuda.txt")
note "test_cuda: exit $rc, $(grep -E '^(All tests passed|test cases:)' "$out/test_cuda.txt" | tail -1), skipped $skipped"
grep -B3 -A12 "FAILED" "$out/test_cuda.txt" | head -80 >"$out/test_failures.txt"

# 3. Sanitizers over the op-level cases (models take long under memcheck).
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 9 ./build-gpu/tests/cuda/test_cuda "~[models]" \
      >"$out/sanitizer_$tool.txt" 2>&1
    note "compute-sanitizer $tool: exit $? ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$tool.txt"))"
  done
else
  note "compute-sanitizer: not found"
fi

# 4. The benchmark.
./build-gpu/bench/bench_gpu_train_step --batch 8 --seq 1024 >"$out/bench.txt" 2>&1
note "bench_gpu_train_step: exit $?"
cat "$out/bench.txt" >>"$summary"
echo "----"
cat "$summary"

#!/usr/bin/env bash
# The bundled loop on a GPU, in one device call of at most ~8 minutes (the device tool's run, from the repository
# root, after scripts/gpu_prepare.sh here and with carry=[".gpu-deps"]):
#   1. configure for the GPU in the machine and build test_cuda and mom-train (its CUDA code included),
#   2. test_cuda: the cross-backend suite, the Trainer on CUDA against the CPU among it (tests/cuda/),
#   3. mom-train on KJV (.gpu-deps/kjv.txt), dense8 and mom8-p, 300 steps of 16 x 128 bytes: on the GPU in tf32
#      and bf16, and on the CPU (fp32; in the background, beside the GPU runs), validation every 50 steps,
#   4. a table last: per run the validation curve, tokens/s and wall time, and each GPU run's largest validation
#      difference from the CPU run's curve.
# Logs go to $OUT (or ./gpu-out). Record the table in bench/RESULTS.md with the device's name.
source "$(dirname "$0")/gpu_common.sh"
started=$(date +%s)

# 1. Build.
if ! cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${MOM_CUDA_ARCH:-native}" \
      -DMOM_BUILD_TESTS=ON -DMOM_BUILD_EXAMPLES=ON -DMOM_BUILD_BENCH=OFF >"$out/configure.txt" 2>&1; then
  note "configure FAILED (configure.txt)"; tail -20 "$out/configure.txt"; exit 1
fi
t=$(date +%s)
if ! cmake --build build-gpu -j"$jobs" --target test_cuda mom-train >"$out/build.txt" 2>&1; then
  note "build FAILED (build.txt)"; grep -m 20 -E "error" "$out/build.txt"; exit 1
fi
note "build: $(( $(date +%s) - t )) s"

# 2. The cross-backend suite (must not print the no-GPU skip line).
t=$(date +%s)
timeout 240 ./build-gpu/tests/cuda/test_cuda >"$out/test_cuda.txt" 2>&1
rc=$?
note "test_cuda: exit $rc, $(grep -E '^(All tests passed|test cases:)' "$out/test_cuda.txt" | tail -1), skipped $(grep -c "no CUDA device: skipped" "$out/test_cuda.txt"), $(( $(date +%s) - t )) s"
grep -B3 -A12 "FAILED" "$out/test_cuda.txt" | head -80 >"$out/test_failures.txt"

# 3. Training on KJV: the CPU runs in the background, the GPU runs one after another.
kjv="$repo/.gpu-deps/kjv.txt"
[ -s "$kjv" ] || { note "no $kjv (run scripts/gpu_prepare.sh on the development machine)"; exit 1; }
bin=./build-gpu/examples/mom-train
common=(--data "$kjv" --steps 300 --batch 16 --seq 128 --eval-interval 50 --eval-batches 8 --checkpoint-interval 0
        --sample-tokens 0 --lr 2e-3 --warmup 50)
cpu_threads=$(( jobs > 4 ? jobs - 2 : jobs ))
for arch in dense8 mom8-p; do
  timeout 420 "$bin" "${common[@]}" --arch "$arch" --out "$out/runs/$arch-cpu" --threads "$cpu_threads" >"$out/$arch-cpu.txt" 2>&1 &
done
for arch in dense8 mom8-p; do
  for p in tf32 bf16; do
    timeout 200 "$bin" "${common[@]}" --arch "$arch" --out "$out/runs/$arch-cuda-$p" --device cuda --precision "$p" \
      --sample-tokens 100 >"$out/$arch-cuda-$p.txt" 2>&1
    note "mom-train --arch $arch --device cuda --precision $p: exit $?"
  done
done
wait
note "wall time so far: $(( $(date +%s) - started )) s"

# 4. The table.
python3 - "$out/runs" <<'PY' | tee -a "$summary"
import json, os, sys
root = sys.argv[1]
runs = {}
for name in sorted(os.listdir(root)):
    path = os.path.join(root, name, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    rows = [json.loads(l) for l in open(path)]
    val = {r["step"]: r["loss"] for r in rows if r.get("type") == "val"}
    train = [r for r in rows if r.get("type") == "train"]
    runs[name] = (val, train[-1]["tok_per_s"] if train else float("nan"), train[-1]["elapsed_s"] if train else float("nan"))
print("| run | validation loss at steps 50, 100, ..., 300 | tokens/s | s | max abs diff to the CPU curve |")
print("|---|---|---|---|---|")
for name, (val, tps, secs) in runs.items():
    arch = name.split("-cpu")[0].split("-cuda")[0]
    ref = runs.get(arch + "-cpu", ({}, 0, 0))[0]
    diff = max((abs(v - ref[s]) for s, v in val.items() if s in ref), default=float("nan"))
    curve = ", ".join(f"{val[s]:.3f}" for s in sorted(val))
    print(f"| {name} | {curve} | {tps:.0f} | {secs:.0f} | {diff:.3f} |")
PY

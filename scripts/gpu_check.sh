#!/usr/bin/env bash
# The bundled loop on a GPU, in one device call of at most ~8 minutes (the device tool's run, from the repository
# root, after scripts/gpu_prepare.sh here and with carry=[".gpu-deps"]):
#   1. configure for the GPU in the machine and build test_cuda and mom-train (its CUDA code included); or, with
#      MOM_GPU_BIN=<folder>, use the binaries built on the development machine (scripts/gpu_prepare.sh --build puts
#      test_cuda, mom-train, bench_gpu_train_step, bench_gpu_decode and bench_gpu_grouped in .gpu-deps/bin: no device
#      minutes on a build),
#   2. test_cuda: the cross-backend suite, the Trainer on CUDA against the CPU among it (tests/cuda/), then its
#      [attention] cases under compute-sanitizer's racecheck (at most 3 minutes; MOM_GPU_RACECHECK=0 leaves it out),
#   3. mom-train on KJV (.gpu-deps/kjv.txt), dense8 and mom8-p, 300 steps of 16 x 128 bytes: on the GPU in tf32
#      and bf16, validation every 50 steps, beside the CPU's curves of the same commands: MOM_GPU_CPU_RUNS=<folder>
#      (dense8-cpu/ and mom8-p-cpu/, each with its metrics.jsonl; default bench/gpu_cpu_curves, in the repository:
#      the validation rows and the last training row of runs made on the development machine in the thirtieth
#      session, about 5 and 15 minutes on 2 cores; make them again when scripts/fingerprint.sh changes dense8's or
#      mom8-p's line); MOM_GPU_CPU_RUNS= (empty) runs them on the GPU machine's CPU instead, in the background:
#        for a in dense8 mom8-p; do build/examples/mom-train --data .gpu-deps/kjv.txt --steps 300 --batch 16 --seq 128 \
#          --eval-interval 50 --eval-batches 8 --checkpoint-interval 0 --lr 2e-3 --warmup 50 --arch $a \
#          --out <folder>/$a-cpu --threads 2 --sample-tokens 0; done
#   4. with MOM_GPU_BENCH=1 (issue 28's numbers): bench_gpu_train_step (GPT-2 small and MoM_P at 8 x 1024, TF32 and
#      bf16; with MOM_GPU_BENCH_BEFORE=<binary>, that older build too, first, for a before / after in one call) and
#      bench/pytorch_gpu_train_step.py (PyTorch's GPT-2 small, bf16 autocast, eager and torch.compile) in the same
#      call, one after the other on an otherwise idle GPU, and an Nsight Compute summary of one dense bf16 step
#      (and of one MoM_P step with MOM_GPU_NCU_MOM=1);
#      bench_gpu_grouped (the grouped GEMMs' TFLOP/s beside cuBLAS on the same rows; MOM_GPU_GROUPED_BEFORE=<binary>
#      an older build of it first);
#      with MOM_GPU_FAMILIES=1, every family's step time over dense8's beside the cost model's FLOP ratio (or those
#      of MOM_GPU_FAMILY_ARCHS="dense8 ..."); with
#      MOM_GPU_PROFILE="arch ...", Nsight Compute's kernel times of two steps of each (scripts/ncu_summary.py);
#      bench_gpu_decode and bench/pytorch_decode.py at batch 1 (MOM_GPU_DECODE=0 leaves them out, MOM_GPU_PYTORCH=0
#      PyTorch's training step),
#   4c. with MOM_GPU_COMPARE=1 (issue 32's sweep at GPT-2-small scale): scripts/compare.py on the GPU over the
#      registry's GPT-2-small-sized entries (gpt2-small, gpt2-small-mom-p after gpt2-small, half the budget each
#      phase, and gpt2-small-moeut; MOM_GPU_COMPARE_ARCHS to change), 3 seeds, MOM_GPU_COMPARE_FLOPS training FLOPs
#      a run (default 1e15, about 150 dense steps; 8.6 of its 9 runs took 505 s beside 4d on one H200: alone it
#      fits a call, not with 4d; see docs/comparison.md), bf16, 8 x 1024
#      tokens of KJV in the GPT-2 vocabulary (.gpu-deps/gpt2, from scripts/gpu_prepare.sh); its table and
#      picture in $out/compare,
#   4d. with MOM_GPU_MOMP_RECIPE=1 (issue 32's MoM_P with a phase 2 of the MoM recipe's length in steps, which the
#      CPU cannot reach): compare.py on the GPU, dense8 against mom8-p after dense8 at the recipe's 2 : 1 phase
#      ratio, 61.44 M bytes of KJV each (30 k steps of 16 x 128: mom8-p's phase 2 is 10 k steps, the recipe's),
#      lr 1e-3 as the CPU's recipe-ratio runs, seeds MOM_GPU_MOMP_SEEDS (default 1: about 8-9 minutes a seed on an
#      idle H200, from the thirtieth session's partial run: a device call of its own, without 4c), fp32 as on the
#      CPU; table and picture in $out/compare-mom-recipe,
#   5. a table last (sections 3 and 5 are left out with MOM_GPU_KJV=0): per run the validation curve, tokens/s and wall time, and each GPU run's largest validation
#      difference from the CPU run's curve.
# Logs go to $OUT (or ./gpu-out). Record the table in bench/RESULTS.md with the device's name.
source "$(dirname "$0")/gpu_common.sh"
started=$(date +%s)

# 1. Build (or take the carried binaries).
if [ -n "${MOM_GPU_BIN:-}" ]; then
  bindir="$repo/$MOM_GPU_BIN"
  for b in test_cuda mom-train; do
    [ -x "$bindir/$b" ] || { note "no $bindir/$b (scripts/gpu_prepare.sh --build)"; exit 1; }
  done
  test_cuda="$bindir/test_cuda" bin="$bindir/mom-train" bench="$bindir/bench_gpu_train_step"
  note "binaries: $MOM_GPU_BIN (built on the development machine)"
else
test_cuda=./build-gpu/tests/cuda/test_cuda bin=./build-gpu/examples/mom-train bench=./build-gpu/bench/bench_gpu_train_step
if ! cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${MOM_CUDA_ARCH:-native}" \
      -DMOM_BUILD_TESTS=ON -DMOM_BUILD_EXAMPLES=ON -DMOM_BUILD_BENCH="$([ "${MOM_GPU_BENCH:-0}" = 1 ] && echo ON || echo OFF)" >"$out/configure.txt" 2>&1; then
  note "configure FAILED (configure.txt)"; tail -20 "$out/configure.txt"; exit 1
fi
t=$(date +%s)
if ! cmake --build build-gpu -j"$jobs" --target test_cuda mom-train \
      $([ "${MOM_GPU_BENCH:-0}" = 1 ] && echo bench_gpu_train_step bench_gpu_decode bench_gpu_grouped) >"$out/build.txt" 2>&1; then
  note "build FAILED (build.txt)"; grep -m 20 -E "error" "$out/build.txt"; exit 1
fi
note "build: $(( $(date +%s) - t )) s"
fi

# 2. The cross-backend suite (must not print the no-GPU skip line).
t=$(date +%s)
timeout 240 "$test_cuda" >"$out/test_cuda.txt" 2>&1
rc=$?
note "test_cuda: exit $rc, $(grep -E '^(All tests passed|test cases:)' "$out/test_cuda.txt" | tail -1), skipped $(grep -c "no CUDA device: skipped" "$out/test_cuda.txt"), $(( $(date +%s) - t )) s"
grep -B3 -A12 "FAILED" "$out/test_cuda.txt" | head -80 >"$out/test_failures.txt"
[ -s "$out/test_failures.txt" ] && { note "test_cuda failures (first 40 lines):"; head -40 "$out/test_failures.txt" | tee -a "$summary"; }
# 2b. The attention kernels' shared-memory hazards (the cp.async copies' waits and barriers, which the emulation cannot
#     check: they complete at once there) under compute-sanitizer's racecheck; MOM_GPU_RACECHECK=0 leaves it out.
if [ "${MOM_GPU_RACECHECK:-1}" = 1 ]; then
  if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    t=$(date +%s)
    san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
    timeout 180 "$san" --tool racecheck --error-exitcode 9 "$test_cuda" "[attention]" \
      >"$out/racecheck_attention.txt" 2>&1
    note "racecheck [attention]: exit $? ($(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck_attention.txt")), $(( $(date +%s) - t )) s"
  else
    note "racecheck: compute-sanitizer not found"
  fi
fi

# 3. Training on KJV: the CPU runs in the background, the GPU runs one after another.
kjv="$repo/.gpu-deps/kjv.txt"
[ -s "$kjv" ] || { note "no $kjv (run scripts/gpu_prepare.sh on the development machine)"; exit 1; }
if [ "${MOM_GPU_KJV:-1}" = 1 ]; then
common=(--data "$kjv" --steps 300 --batch 16 --seq 128 --eval-interval 50 --eval-batches 8 --checkpoint-interval 0
        --lr 2e-3 --warmup 50)
# Two CPU runs side by side, leaving 4 cores to the GPU runs' host thread (their launches are host-bound).
cpu_threads=$(( jobs > 8 ? (jobs - 4) / 2 : 1 ))
cpu_runs="${MOM_GPU_CPU_RUNS-bench/gpu_cpu_curves}"
for arch in dense8 mom8-p; do
  if [ -n "$cpu_runs" ]; then
    mkdir -p "$out/runs/$arch-cpu" && cp "$repo/$cpu_runs/$arch-cpu/metrics.jsonl" "$out/runs/$arch-cpu/" ||
      note "no $cpu_runs/$arch-cpu/metrics.jsonl"
    continue
  fi
  timeout 420 "$bin" "${common[@]}" --arch "$arch" --out "$out/runs/$arch-cpu" --threads "$cpu_threads" --sample-tokens 0 >"$out/$arch-cpu.txt" 2>&1 &
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
fi

# 4. Issue 28's step times, mom and PyTorch on the same GPU (nothing else running).
if [ "${MOM_GPU_BENCH:-0}" = 1 ]; then
  if [ -n "${MOM_GPU_BENCH_BEFORE:-}" ] && [ -x "$repo/$MOM_GPU_BENCH_BEFORE" ]; then
    timeout 240 "$repo/$MOM_GPU_BENCH_BEFORE" --batch 8 --seq 1024 --reps 10 >"$out/bench-before.txt" 2>&1
    note "bench_gpu_train_step (before: $MOM_GPU_BENCH_BEFORE): exit $?"; grep -E "^ |step /" "$out/bench-before.txt" | tee -a "$summary"
  fi
  if [ -x "$bench" ]; then
    timeout 240 "$bench" --batch 8 --seq 1024 --reps 10 >"$out/bench.txt" 2>&1
    note "bench_gpu_train_step: exit $?"; grep -E "^ |step /" "$out/bench.txt" | tee -a "$summary"
  fi
  # The grouped GEMMs beside cuBLAS on the same rows (with MOM_GPU_GROUPED_BEFORE=<binary>, an older build first).
  grouped="$(dirname "$bench")/bench_gpu_grouped"
  for g in ${MOM_GPU_GROUPED_BEFORE:+"$repo/$MOM_GPU_GROUPED_BEFORE"} "$grouped"; do
    [ -x "$g" ] || continue
    timeout 120 "$g" >"$out/grouped-$(basename "$(dirname "$g")").txt" 2>&1
    note "bench_gpu_grouped ($g): exit $?"; sed -n '/^Summary/,$p' "$out/grouped-$(basename "$(dirname "$g")").txt" | tee -a "$summary"
  done
  fpt=$(sed -n 's/.*params, \([0-9.]*\) MFLOP\/token.*/\1/p' "$out/bench.txt" 2>/dev/null | head -1)
  if [ "${MOM_GPU_PYTORCH:-1}" = 1 ]; then
    timeout 240 python3 bench/pytorch_gpu_train_step.py ${fpt:+--flops-per-token $(python3 -c "print(3e6*$fpt)")} \
      >"$out/pytorch.txt" 2>&1
    note "pytorch_gpu_train_step: exit $?"; grep -E "^  pytorch|Error|error" "$out/pytorch.txt" | tail -4 | tee -a "$summary"
  fi
  # Batch-1 decoding against one read of the weights (issue 28's decode target), and PyTorch's KV cache beside it.
  decode="$(dirname "$bench")/bench_gpu_decode"
  if [ -x "$decode" ] && [ "${MOM_GPU_DECODE:-1}" = 1 ]; then
    timeout 120 "$decode" --tokens 64 >"$out/decode.txt" 2>&1
    note "bench_gpu_decode: exit $?"; grep -E "bandwidth|GPT-2 small|op by op" "$out/decode.txt" | head -12 | tee -a "$summary"
    timeout 120 python3 bench/pytorch_decode.py --device cuda --tokens 64 >"$out/pytorch_decode.txt" 2>&1
    note "pytorch_decode: exit $?"; grep -E "gpt2-small|Error" "$out/pytorch_decode.txt" | head -6 | tee -a "$summary"
  fi
fi
if [ "${MOM_GPU_FAMILIES:-0}" = 1 ]; then
  # Every family's step on the GPU over dense8's (8 layers, d 256, bf16, 64 x 256 tokens), beside the cost model's
  # FLOP ratio: steps 20..60 of mom-train, no validation or checkpoint inside.
  "$bin" --help >"$out/archs.txt" 2>&1
  for arch in ${MOM_GPU_FAMILY_ARCHS:-dense8 mom8-p moe8 dsmoe8 ec8 mod8 moeut8 moduleformer8 mor8 share8-all}; do
    timeout 60 "$bin" --data "$kjv" --arch "$arch" --steps 60 --batch 64 --seq 256 --eval-interval 0 --eval-batches 1 \
      --checkpoint-interval 0 --sample-tokens 0 --device cuda --precision bf16 --out "$out/steps/$arch" \
      >"$out/steps-$arch.txt" 2>&1 || note "mom-train --arch $arch (step time): exit $?"
  done
  python3 - "$out/steps" "$out/archs.txt" <<'PY' | tee -a "$summary"
import json, os, re, sys
root, archs = sys.argv[1], open(sys.argv[2]).read()
flops = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\S+) .*\n.* ([0-9.]+) MFLOP/token forward at seq 256", archs, re.M)}
rate = {}
for name in os.listdir(root):
    rows = [json.loads(l) for l in open(os.path.join(root, name, "metrics.jsonl")) if '"train"' in l]
    a = next((r for r in rows if r["step"] == 20), None)
    if a and rows[-1]["step"] > 20:
        rate[name] = (rows[-1]["tokens"] - a["tokens"]) / (rows[-1]["elapsed_s"] - a["elapsed_s"])
print("| arch (bf16, 64 x 256) | tokens/s | step / dense8 step | cost-model FLOP ratio | step ratio / FLOP ratio |")
print("|---|---:|---:|---:|---:|")
d = rate.get("dense8")
for name in sorted(rate, key=lambda n: (n != "dense8", n)):
    if d and name in flops and "dense8" in flops:
        sr, fr = d / rate[name], flops[name] / flops["dense8"]
        print(f"| {name} | {rate[name]:.0f} | {sr:.2f} | {fr:.2f} | {sr / fr:.2f} |")
PY
fi
if [ "${MOM_GPU_BENCH:-0}" = 1 ]; then
  # Nsight Compute: every kernel's time in two steps of bench_gpu_train_step --only ONLY at 8 x 1024 (one warm-up,
  # one timed), the top 15 per step: ncu_step TIMEOUT_S ONLY NAME (files $out/NAME.csv, .err) "TITLE" "NOTE".
  ncu_step() {
    timeout "$1" ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
      "$bench" --batch 8 --seq 1024 --warmup 1 --reps 1 --only "$2" >"$out/$3.csv" 2>"$out/$3.err"
    note "$5: exit $?"
    python3 scripts/ncu_summary.py "$out/$3.csv" "$4" 2 | tee -a "$summary"
  }
  if command -v ncu >/dev/null && [ -x "$bench" ]; then
    ncu_step 120 dense-bf16 ncu "dense GPT-2 small bf16, 8 x 1024" "ncu"
    # With MOM_GPU_NCU_MOM=1, the same for MoM_P's step (the grouped attention and GEMMs: bench/RESULTS.md's
    # twenty-third-session predictions; about 100 s more).
    if [ "${MOM_GPU_NCU_MOM:-0}" = 1 ]; then
      ncu_step 180 mom-bf16 ncu-mom "MoM_P GPT-2 small bf16, 8 x 1024" "ncu MoM_P"
    fi
  fi
  note "wall time so far: $(( $(date +%s) - started )) s"
fi

# 4b. With MOM_GPU_PROFILE="arch ...": Nsight Compute's kernel times of two mom-train steps of each (bf16, 64 x 256).
for arch in ${MOM_GPU_PROFILE:-}; do
  timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$bin" --data "$kjv" --arch "$arch" --steps 2 --batch 64 --seq 256 --eval-interval 0 --eval-batches 1 \
    --checkpoint-interval 0 --sample-tokens 0 --device cuda --precision bf16 --out "$out/profile/$arch" \
    >"$out/ncu-$arch.csv" 2>"$out/ncu-$arch.err"
  note "ncu $arch: exit $?"
  python3 scripts/ncu_summary.py "$out/ncu-$arch.csv" "mom-train $arch bf16, 64 x 256" 2 10 | tee -a "$summary"
done

# 4c. With MOM_GPU_COMPARE=1: the GPT-2-small-sized families side by side at equal training FLOPs (compare.py).
if [ "${MOM_GPU_COMPARE:-0}" = 1 ]; then
  if [ -s "$repo/.gpu-deps/gpt2/encoder.json" ]; then
    t=$(date +%s)
    MOM_GPT2_DIR="$repo/.gpu-deps/gpt2" timeout "${MOM_GPU_COMPARE_TIMEOUT:-480}" python3 scripts/compare.py \
      --mom-train "$bin" --data "$kjv" --out "$out/compare" --device cuda --precision bf16 \
      --archs "${MOM_GPU_COMPARE_ARCHS:-gpt2-small,gpt2-small-mom-p@gpt2-small:0.5,gpt2-small-moeut}" \
      --flops "${MOM_GPU_COMPARE_FLOPS:-1e15}" --seeds 1,2,3 --batch 8 --seq 1024 --lr 6e-4 --warmup 20 --evals 4 \
      --eval-batches 4 --checkpoints 1 >"$out/compare.txt" 2>&1
    note "compare.py (GPT-2 small, bf16): exit $?, $(( $(date +%s) - t )) s"
    [ -s "$out/compare/results.md" ] && tee -a "$summary" <"$out/compare/results.md"
    tail -3 "$out/compare.txt" | tee -a "$summary"
  else
    note "MOM_GPU_COMPARE=1: no .gpu-deps/gpt2/encoder.json (scripts/gpu_prepare.sh after scripts/setup.sh)"
  fi
fi

# 4d. With MOM_GPU_MOMP_RECIPE=1: MoM_P after dense8 with the recipe's phase-2 length in steps (compare.py).
if [ "${MOM_GPU_MOMP_RECIPE:-0}" = 1 ]; then
  t=$(date +%s)
  timeout "${MOM_GPU_MOMP_TIMEOUT:-540}" python3 scripts/compare.py --mom-train "$bin" --data "$kjv" \
    --out "$out/compare-mom-recipe" --device cuda --precision fp32 --archs dense8,mom8-p@dense8:0.667 --tokens 6.144e7 \
    --seeds "${MOM_GPU_MOMP_SEEDS:-1}" --batch 16 --seq 128 --lr 1e-3 --evals 8 --eval-batches 8 --checkpoints 1 \
    >"$out/compare-mom-recipe.txt" 2>&1
  note "compare.py (MoM_P, recipe-length phase 2): exit $?, $(( $(date +%s) - t )) s"
  [ -s "$out/compare-mom-recipe/results.md" ] && tee -a "$summary" <"$out/compare-mom-recipe/results.md"
  tail -3 "$out/compare-mom-recipe.txt" | tee -a "$summary"
fi

# 5. The table.
[ "${MOM_GPU_KJV:-1}" = 1 ] && python3 - "$out/runs" <<'PY' | tee -a "$summary"
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

# The device tool brings back at most 8 files: everything else (logs, metrics, ncu CSVs; not the checkpoints) goes
# into one archive beside summary.txt.
if [ -n "${OUT:-}" ] && [ "$out" = "$OUT" ]; then
  cp "$summary" /tmp/gpu-summary.txt
  (cd "$out" && find . -type f ! -name summary.txt ! -name '*.safetensors' -size -8M -print0 |
     tar czf /tmp/gpu-logs.tgz --null -T -)
  rm -rf "${out:?}"/*
  mv /tmp/gpu-logs.tgz "$out/logs.tgz"
  mv /tmp/gpu-summary.txt "$out/summary.txt"
fi

#!/usr/bin/env bash
# mom-train --device cuda, run by mom-train-emu: mom-train's own objects linked with the CUDA backend's CPU
# emulation (kernels and runtime; tests/cuda/emu/), so that the GPU path of the command-line tools runs on a
# machine without a GPU (CTest examples.device_*). Usage:
#   test_device.sh <mom-train-emu> archs <i> <n>  the registered architectures i, i + n, i + 2n, ... of --help's list
#                                                 but the GPT-2-sized (gpt2-*: mode gpt2): one training step on the
#                                                 CPU and on emulated CUDA (fp32 matrix products), the same data: the
#                                                 step's loss and the validation loss after its update within 1e-5
#                                                 (relative; 3e-7 measured), then a 4-token sample through the
#                                                 device's Decoder (at the 8-layer sizes; small-bpe runs the GPT-2
#                                                 vocabulary at the small size)
#   test_device.sh <mom-train-emu> gpt2           the same for the GPT-2-sized architectures (gpt2-small and the
#                                                 8-layer families' code at its size, gpt2-medium, gpt2-large), one
#                                                 after another in one test: gpt2-large's run holds 13 GB, medium's
#                                                 6.5 GB; 12-87 s each, both runs (about 5 minutes in all)
#   test_device.sh <mom-train-emu> cli            checkpoints cross backends both ways (resume: the same validation
#                                                 loss and parameters as an uninterrupted run), mom-sample / eval /
#                                                 prune with --device cuda, bf16 and tf32 runs (bf16 with the GPT-2
#                                                 vocabulary too: the padded LM head)
set -u
BIN="$1"
MODE="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
T="$(mktemp -d)"
[ -n "${KEEP:-}" ] && echo "keeping $T" || trap 'rm -rf "$T"' EXIT
fail=0
export OMP_NUM_THREADS=2
PY=""
for p in python3 /usr/bin/python3; do "$p" -c 'import numpy' 2>/dev/null && { PY="$p"; break; }; done
[ -n "$PY" ] || { echo "SKIP: no python3 with numpy (Debian: python3-numpy; scripts/setup.sh)"; exit 77; }
run() {  # run <log> <command...>: a hang fails too
  local log="$1"; shift
  timeout 600 "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then echo "FAIL: $* (exit $rc):"; tail -20 "$log"; fail=1; return 1; fi
}
# close <run a> <run b> <tolerance>: the training losses of every step and the final validation loss agree.
close() {
  "$PY" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'EOF'
import json, sys
def read(path):
    rows = [json.loads(l) for l in open(path)]
    return [r["loss"] for r in rows if r.get("type") == "train"], [r["loss"] for r in rows if r.get("type") == "val"]
(ta, va), (tb, vb), tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
a, b = ta + va[-1:], tb + vb[-1:]
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"{'ok' if worst <= tol else 'FAIL'}: losses {a} vs {b}: largest relative difference {worst:.1e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
EOF
}

for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth. And the earth was without form $i."; done >"$T/text.txt"
few=(--batch 1 --seq 16 --warmup 1 --lr 1e-3 --eval-interval 0 --eval-batches 1)

case "$MODE" in
archs | gpt2)
  mapfile -t archs < <("$BIN" --help | sed -n 's/^  \([a-z0-9-]*\) (.*/\1/p')
  [ "${#archs[@]}" -gt 40 ] || { echo "FAIL: --help lists ${#archs[@]} architectures"; exit 1; }
  if [ "$MODE" = archs ]; then
    I="$3"
    N="$4"
  else
    I=0
    N=1
  fi
  run "$T/prep-byte.log" "$BIN" --data "$T/text.txt" --arch tiny --out "$T/prep-byte" "${few[@]}" --steps 1 --sample-tokens 0 || exit 1
  ran=0
  for ((k = I; k < ${#archs[@]}; k += N)); do
    a="${archs[$k]}"
    case "$a" in gpt2-*) [ "$MODE" = gpt2 ] || continue ;; *) [ "$MODE" = archs ] || continue ;; esac
    ran=$((ran + 1))
    data="$T/prep-byte/data"
    sample=4
    if "$BIN" --help | grep -A1 "^  $a (" | tail -1 | grep -q "vocab=50257"; then
      sample=0  # GPT-2-sized: the device's Decoder is sampled at the 8-layer sizes
      [ -d "$T/prep-bpe/data" ] || run "$T/prep-bpe.log" "$BIN" --data "$T/text.txt" --arch small-bpe --out "$T/prep-bpe" "${few[@]}" --steps 1 --sample-tokens 0 || exit 1
      data="$T/prep-bpe/data"
    fi
    start=$SECONDS
    # No checkpoints (metrics.jsonl is what is compared): the GPT-2-sized architectures would write up to 3 GB each.
    run "$T/$a-cpu.log" "$BIN" --data "$data" --arch "$a" --out "$T/$a-cpu" "${few[@]}" --steps 1 --sample-tokens 0 \
      --no-checkpoint || continue
    run "$T/$a-cuda.log" "$BIN" --data "$data" --arch "$a" --out "$T/$a-cuda" "${few[@]}" --steps 1 --device cuda --precision fp32 \
      --sample-tokens $sample --no-checkpoint || continue
    [ ! -e "$T/$a-cuda/latest" ] || { echo "FAIL: $a wrote a checkpoint with --no-checkpoint"; fail=1; }
    grep -q "^device: cuda:0 (CUDA emulated on the CPU" "$T/$a-cuda.log" || { echo "FAIL: $a did not run on cuda:"; head "$T/$a-cuda.log"; fail=1; }
    [ "$sample" = 0 ] || grep -q "^sample (temperature" "$T/$a-cuda.log" ||
      { echo "FAIL: $a sampled nothing on cuda"; tail -3 "$T/$a-cuda.log"; fail=1; }
    echo -n "$a ($((SECONDS - start)) s): "
    close "$T/$a-cuda" "$T/$a-cpu" 1e-5 || fail=1
    rm -rf "$T/$a-cpu" "$T/$a-cuda"
  done
  [ "$ran" -gt 0 ] || { echo "FAIL: no architecture ran"; fail=1; }
  ;;
cli)
  cpu=(--arch mom8-p --batch 2 --seq 16 --warmup 1 --lr 1e-3 --eval-interval 0 --eval-batches 2 --sample-tokens 0
       --steps 4 --checkpoint-interval 2)
  cuda=("${cpu[@]}" --device cuda --precision fp32)
  # Uninterrupted 4-step runs on each backend; each one's step-2 checkpoint (a run stopped there) is resumed on
  # the other backend to step 4.
  run "$T/full.log" "$BIN" --data "$T/text.txt" --out "$T/full" "${cpu[@]}" || exit 1
  data="$T/full/data"
  run "$T/full-cuda.log" "$BIN" --data "$T/text.txt" --out "$T/full-cuda" "${cuda[@]}" || exit 1
  for r in cpu-cuda:full cuda-cpu:full-cuda; do
    mkdir -p "$T/${r%%:*}"
    cp -r "$T/${r#*:}/step-000002" "$T/${r%%:*}/"
    echo step-000002 >"$T/${r%%:*}/latest"
  done
  run "$T/c2.log" "$BIN" --data "$T/text.txt" --out "$T/cpu-cuda" "${cuda[@]}" --resume
  grep -q 'resume: changed since the checkpoint: device "cpu" -> "cuda:0"' "$T/c2.log" ||
    { echo "FAIL: the resume on cuda did not report the change of device"; cat "$T/c2.log"; fail=1; }
  run "$T/g2.log" "$BIN" --data "$T/text.txt" --out "$T/cuda-cpu" "${cpu[@]}" --resume
  for r in cpu-cuda cuda-cpu; do
    echo -n "$r vs uninterrupted on the CPU: "
    "$PY" - "$T/$r/metrics.jsonl" "$T/full/metrics.jsonl" <<'EOF' || fail=1
import json, sys
val = lambda p: [json.loads(l)["loss"] for l in open(p) if json.loads(l).get("type") == "val"][-1]
a, b = val(sys.argv[1]), val(sys.argv[2])
ok = abs(a - b) <= 1e-4 * abs(b)
print(f"{'ok' if ok else 'FAIL'}: validation loss at step 4 {a} vs {b}")
sys.exit(0 if ok else 1)
EOF
    "$PY" "$HERE/compare_checkpoints.py" "$T/$r" "$T/full" --atol 1e-4 || fail=1
  done
  # mom-sample and eval read either backend's checkpoints on either device.
  for ck in cpu-cuda cuda-cpu; do
    for dev in cpu cuda; do
      run "$T/s-$ck-$dev.log" "$BIN" sample --checkpoint "$T/$ck" --prompt "In the" --tokens 12 --device "$dev" ||
        continue
      grep -q "^In the" "$T/s-$ck-$dev.log" || { echo "FAIL: sample $ck on $dev"; cat "$T/s-$ck-$dev.log"; fail=1; }
    done
  done
  echo "ok: mom-sample reads checkpoints of both backends on both devices"
  run "$T/e-cpu.log" "$BIN" eval --checkpoint "$T/cuda-cpu" --data "$data" --batch 2 --seq 16 --batches 2
  run "$T/e-cuda.log" "$BIN" eval --checkpoint "$T/cuda-cpu" --data "$data" --batch 2 --seq 16 --batches 2 --device cuda --precision fp32
  "$PY" - "$T/e-cpu.log" "$T/e-cuda.log" <<'EOF' || fail=1
import re, sys
a, b = (float(re.search(r"validation loss ([0-9.]+)", open(p).read()).group(1)) for p in sys.argv[1:])
ok = abs(a - b) <= 2e-4
print(f"{'ok' if ok else 'FAIL'}: mom-train eval on the CPU {a}, on cuda {b}")
sys.exit(0 if ok else 1)
EOF
  # Ctrl-C (SIGINT) during a run on the device: the step finishes, a checkpoint is written, exit 0; the run
  # then resumes on the CPU.
  "$BIN" --data "$T/text.txt" --out "$T/int" --arch tiny "${few[@]}" --sample-tokens 0 --steps 100000 --device cuda \
    >"$T/int.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q '"type":"train"' "$T/int/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  kill -INT "$pid"
  timeout 60 tail --pid="$pid" -f /dev/null
  wait "$pid"; rc=$?
  stopped=$(tr '\r' '\n' <"$T/int.log" | grep -ao "step [0-9]* | interrupted" | grep -o "[0-9]*")
  if [ "$rc" -ne 0 ] || [ -z "$stopped" ] || [ "$(cat "$T/int/latest" 2>/dev/null)" != "$(printf 'step-%06d' "$stopped")" ]; then
    echo "FAIL: SIGINT on cuda: exit $rc, stopped at '$stopped'"; tail -c 1000 "$T/int.log"; fail=1
  elif run "$T/int2.log" "$BIN" --data "$T/text.txt" --out "$T/int" --arch tiny "${few[@]}" --sample-tokens 0 \
         --steps $((stopped + 1)) --resume; then
    echo "ok: SIGINT on cuda saved step $stopped, resumed on the CPU to step $((stopped + 1))"
  fi
  # ModuleFormer's pruning on the device; bf16 and tf32 matrix products train close to fp32.
  mf=(--arch moduleformer8 --batch 1 --seq 16 --warmup 1 --lr 1e-3 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --steps 2)
  run "$T/mf.log" "$BIN" --data "$data" --out "$T/mf" "${mf[@]}" &&
    run "$T/prune.log" "$BIN" prune --checkpoint "$T/mf" --data "$data" --batch 1 --seq 16 --batches 2 --tau 0.5 \
      --out "$T/mf-p" --device cuda &&
    grep -Eq "^prune: parameters [0-9]+ of [0-9]+ kept" "$T/prune.log" && echo "ok: prune --device cuda" ||
    { echo "FAIL: prune on cuda"; cat "$T/prune.log"; fail=1; }
  for p in bf16 tf32; do
    run "$T/$p.log" "$BIN" --data "$data" --out "$T/$p" "${few[@]}" --steps 2 --sample-tokens 0 --arch tiny --device cuda --precision "$p" || continue
    grep -q "^device: cuda:0 .*, $p matrix products" "$T/$p.log" || { echo "FAIL: $p not reported"; head -8 "$T/$p.log"; fail=1; }
  done
  run "$T/fp32.log" "$BIN" --data "$data" --out "$T/fp32" "${few[@]}" --steps 2 --sample-tokens 0 --arch tiny
  echo -n "bf16 vs fp32 (CPU): "; close "$T/bf16" "$T/fp32" 2e-2 || fail=1
  echo -n "tf32 vs fp32 (CPU): "; close "$T/tf32" "$T/fp32" 1e-2 || fail=1
  # The GPT-2 vocabulary in bf16: the device lays the logits out 50304 wide and runs the LM head's forward and dx over
  # the padded width (ops.hpp, lm_head_forward); 3 steps within 1e-4 of the CPU's losses (2e-5 measured).
  bpe=(--arch small-bpe --batch 2 --seq 16 --warmup 1 --lr 1e-3 --eval-interval 0 --eval-batches 1 --sample-tokens 0)
  if run "$T/bpe-prep.log" "$BIN" --data "$T/text.txt" --out "$T/bpe-prep" "${bpe[@]}" --steps 1 &&
     run "$T/bpe-cpu.log" "$BIN" --data "$T/bpe-prep/data" --out "$T/bpe-cpu" "${bpe[@]}" --steps 3 &&
     run "$T/bpe-bf16.log" "$BIN" --data "$T/bpe-prep/data" --out "$T/bpe-bf16" "${bpe[@]}" --steps 3 --device cuda \
       --precision bf16; then
    echo -n "GPT-2 vocabulary, bf16 vs fp32 (CPU): "; close "$T/bpe-bf16" "$T/bpe-cpu" 1e-4 || fail=1
  fi
  ;;
*)
  echo "usage: $0 <mom-train-emu> archs <i> <n> | cli"; exit 2 ;;
esac
exit $fail

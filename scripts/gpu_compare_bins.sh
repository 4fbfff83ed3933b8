#!/usr/bin/env bash
# Two mom-train binaries side by side on the GPU (a device call, after scripts/gpu_prepare.sh --build here):
#   MOM_GPU_BIN_A=<folder> MOM_GPU_BIN_B=<folder> bash scripts/gpu_compare_bins.sh "dense8 mom8-p" "16x128 64x256"
# trains each architecture at each batch x seq (bf16, steps 20..60 timed: no validation, checkpoint or sample) with
# A, then B, then A and B again (pairs alternate, so a drift of the machine shows in both), and prints tokens/s of
# each run and B over A per pair. Written for the question whether the family units' -O1 (examples/CMakeLists.txt)
# slows the host side of a GPU step, where small steps are bound by kernel launches. (MOM_CMP_DEVICE=cpu,
# MOM_CMP_PRECISION=fp32 and MOM_CMP_STEPS=25 try the script without a GPU.)
source "$(dirname "$0")/gpu_common.sh"
kjv="$repo/.gpu-deps/kjv.txt"
runs=$(mktemp -d)  # the runs' folders stay on the machine: only summary.txt comes back
archs=${1:-dense8}
shapes=${2:-16x128}
rate() {  # tokens/s between steps 20 and the last of a run's metrics.jsonl
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
a = next(r for r in rows if r["step"] == 20)
print(f'{(rows[-1]["tokens"] - a["tokens"]) / (rows[-1]["elapsed_s"] - a["elapsed_s"]):.0f}')
PY
}
echo "| arch | batch x seq | pair | A tokens/s | B tokens/s | B / A |" | tee -a "$summary"
echo "|---|---|---:|---:|---:|---:|" | tee -a "$summary"
for arch in $archs; do
  for shape in $shapes; do
    b=${shape%x*} s=${shape#*x}
    for pair in 1 2; do
      declare -A tps=()
      for v in A B; do
        dir_var=MOM_GPU_BIN_$v
        run="$runs/$arch-$shape-$v-$pair"
        timeout 60 "$repo/${!dir_var}/mom-train" --data "$kjv" --arch "$arch" --steps "${MOM_CMP_STEPS:-60}" \
          --batch "$b" --seq "$s" --eval-interval 0 --eval-batches 1 --checkpoint-interval 0 --sample-tokens 0 \
          --device "${MOM_CMP_DEVICE:-cuda}" --precision "${MOM_CMP_PRECISION:-bf16}" --out "$run" >"$run.txt" 2>&1 || note "$v $arch $shape: exit $?"
        tps[$v]=$(rate "$run/metrics.jsonl" 2>/dev/null || echo nan)
      done
      ratio=$(python3 -c "print(f'{${tps[B]} / ${tps[A]}:.3f}')" 2>/dev/null || echo nan)
      echo "| $arch | $shape | $pair | ${tps[A]} | ${tps[B]} | $ratio |" | tee -a "$summary"
    done
  done
done

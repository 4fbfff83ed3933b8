#!/usr/bin/env bash
# ModuleFormer's continual-learning and pruning demo (issue 15; arXiv 2306.04640 §4.3, §5.3), as recorded in
# bench/RESULTS.md ("Issue 15"):
#   1. moduleformer8 (and dense8 beside it) trained on KJV at seq 128; KJV validation loss at 128 and 256
#      (stick-breaking attention has no position embedding: the length-extrapolation check)
#   2. a second text: the licence texts Debian ships in /usr/share/common-licenses (data/licenses.txt)
#   3. fine-tuning on it, in segments of --segment steps at a constant learning rate, the KJV validation loss
#      measured after each segment: (a) full fine-tuning of moduleformer8; module insertion (+2 heads, +4
#      experts per layer, old modules frozen) with (b) the partially trainable router (moduleformer8-insert-reg:
#      λ‖A'‖², the routers' A, B frozen too) and (c) the fully trainable router (moduleformer8-insert)
#   4. pruning of the KJV model at two thresholds: parameters kept vs KJV validation loss
# Writes runs/i15-*/ and runs/i15-demo.tsv (step, variant, KJV loss, licences loss); plot with
# scripts/plot_forgetting.py. Usage: scripts/moduleformer_demo.sh [build dir] (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/examples/mom-train
STEPS=${STEPS:-300} FT_STEPS=${FT_STEPS:-100} SEGMENT=${SEGMENT:-20}
common=(--batch 8 --seq 128 --eval-interval 50 --eval-batches 16 --sample-tokens 0)
eval=(--batch 8 --seq 128 --batches 16)

mkdir -p data runs
if [ ! -s data/licenses.txt ]; then  # every licence text once (symlinks resolved), in name order
  find -L /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat > data/licenses.txt
fi
echo "licences text: $(wc -c < data/licenses.txt) bytes"

for arch in moduleformer8 dense8; do
  [ -e runs/i15-$arch/latest ] || "$BIN" --data data/kjv.txt --arch $arch --steps "$STEPS" --out runs/i15-$arch \
    --lr 1e-3 --warmup 20 "${common[@]}" > runs/i15-$arch.log 2>&1
  echo "$arch on KJV: $(tail -n 2 runs/i15-$arch.log | head -n 1)"
done
for seq in 128 256; do
  echo "moduleformer8, KJV validation at seq $seq: $("$BIN" eval --checkpoint runs/i15-moduleformer8 --data runs/i15-moduleformer8/data --batch 4 --seq $seq --batches 16)"
done

old="wte,ln_f.*,h.*.ln_*,h.*.moa.w_kv,h.*.moa.w_q,h.*.moa.w_o,h.*.smoe.w1,h.*.smoe.w2"
kjv_loss() { "$BIN" eval --checkpoint "$1" --data runs/i15-moduleformer8/data "${eval[@]}" | awk '{print $3}'; }
lic_loss() { "$BIN" eval --checkpoint "$1" --data runs/i15-licenses-data "${eval[@]}" | awk '{print $3}'; }
# The licences' prepared split, shared by every fine-tuning run (and read by lic_loss).
if [ ! -e runs/i15-licenses-data/val.bin ]; then
  "$BIN" --data data/licenses.txt --arch moduleformer8 --steps 1 --out runs/i15-licenses-prep --batch 1 --seq 32 \
    --eval-interval 0 --sample-tokens 0 > /dev/null
  rm -rf runs/i15-licenses-data && cp -r runs/i15-licenses-prep/data runs/i15-licenses-data && rm -rf runs/i15-licenses-prep
fi
echo -e "step\tvariant\tkjv_val\tlicenses_val" > runs/i15-demo.tsv
base_kjv=$(kjv_loss runs/i15-moduleformer8) base_lic=$(lic_loss runs/i15-moduleformer8)
for v in full insert insert-reg; do echo -e "0\t$v\t$base_kjv\t$base_lic" >> runs/i15-demo.tsv; done
for v in full insert insert-reg; do
  case $v in
    full) args=(--arch moduleformer8) ;;
    insert) args=(--arch moduleformer8-insert --freeze "$old") ;;
    insert-reg) args=(--arch moduleformer8-insert-reg --freeze "$old,h.*.router.w_b,h.*.router.w_a") ;;
  esac
  out=runs/i15-ft-$v
  rm -rf "$out"
  for ((s = SEGMENT; s <= FT_STEPS; s += SEGMENT)); do
    if [ "$s" -eq "$SEGMENT" ]; then start=(--init-from runs/i15-moduleformer8); else start=(--resume); fi
    "$BIN" --data runs/i15-licenses-data "${args[@]}" --steps "$s" --out "$out" "${start[@]}" --lr 5e-4 --warmup 0 \
      --min-lr-ratio 1 --checkpoint-interval 0 "${common[@]}" >> "$out.log" 2>&1
    echo -e "$s\t$v\t$(kjv_loss "$out")\t$(lic_loss "$out")" | tee -a runs/i15-demo.tsv
  done
done

for tau in 0.1 0.3; do
  echo "prune tau $tau:"
  "$BIN" prune --checkpoint runs/i15-moduleformer8 --data runs/i15-moduleformer8/data "${eval[@]}" --tau "$tau" \
    --out runs/i15-pruned-$tau | sed 's/^/  /'
done

#!/usr/bin/env bash
# CLI behaviour of mom-train / mom-sample on bad input (run by CTest as examples.cli_bad_input):
# every case must exit non-zero with exactly one line on stderr naming the problem, and must leave an
# existing checkpoint byte-for-byte unchanged. Then a short real run, a resume and a sample.
set -u
BIN="$1"
SAMPLE="$(dirname "$BIN")/mom-sample"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail=0

# expect_error <regex> <args...>: non-zero exit, one stderr line matching regex.
expect_error() {
  local re="$1"; shift
  timeout 120 "$@" >"$T/out" 2>"$T/err"  # a hang (rc 124) fails the case too
  local rc=$?
  local lines
  lines=$(wc -l <"$T/err")
  if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -Eq -- "$re" "$T/err"; then
    echo "FAIL: $* -> rc=$rc, stderr ($lines lines):"; cat "$T/err"; fail=1
  else
    echo "ok: $(cat "$T/err")"
  fi
}

# A small text and a good checkpoint to protect.
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. $i"; done >"$T/text.txt"
common=(--arch tiny --steps 3 --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0)
if ! "$BIN" --data "$T/text.txt" --out "$T/run" "${common[@]}" >"$T/first.log" 2>&1; then
  echo "FAIL: first run"; cat "$T/first.log"; exit 1
fi
checksum() { find "$T/run" -type f \( -name '*.safetensors' -o -name latest -o -name '*.bin' \) | sort | xargs md5sum; }
before=$(checksum)

: >"$T/empty.txt"
head -c 5000 /dev/urandom >"$T/garbage.bin"
printf 'abc' >"$T/short.txt"
echo x >"$T/afile"

# A token file (docs/training.md format) of 4 u16 tokens, vocab 256, whose third id is 300.
{ printf 'MOMTOK\0\0\001\0\0\0\002\0\0\0\004\0\0\0\0\0\0\0\0\001\0\0\0\0\0\0byte'
  head -c 28 /dev/zero; printf 'A\0B\0\054\001C\0'; } >"$T/badid.bin"
expect_error "token 2 has id 300 >= vocab 256" "$BIN" --data "$T/badid.bin" --out "$T/o8" "${common[@]}"
expect_error "data file '.*missing.txt' does not exist" "$BIN" --data "$T/missing.txt" --out "$T/o1" "${common[@]}"
expect_error "data file '.*empty.txt' is empty" "$BIN" --data "$T/empty.txt" --out "$T/o2" "${common[@]}"
expect_error "is not UTF-8 text" "$BIN" --data "$T/garbage.bin" --out "$T/o3" "${common[@]}"
expect_error "is too short" "$BIN" --data "$T/short.txt" --out "$T/o4" "${common[@]}"
expect_error "unknown architecture 'nope' \(known: tiny" "$BIN" --data "$T/text.txt" --arch nope --out "$T/o5"
expect_error "--seq 4096 exceeds the context 128 of architecture 'tiny'" "$BIN" --data "$T/text.txt" --out "$T/o6" --arch tiny --seq 4096
expect_error "cannot create output directory" "$BIN" --data "$T/text.txt" --out "$T/afile/run" "${common[@]}"
expect_error "already holds a checkpoint: pass --resume" "$BIN" --data "$T/text.txt" --out "$T/run" "${common[@]}"
expect_error "--resume: no checkpoint in" "$BIN" --data "$T/text.txt" --out "$T/o7" --resume "${common[@]}"
expect_error "different architecture" "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch small --steps 6 --batch 2 --seq 32 --sample-tokens 0
expect_error "checkpoint '.*nowhere' does not exist" "$SAMPLE" --checkpoint "$T/nowhere"
# Options out of range: refused up front (before any data is prepared), one line each.
big=4611686018427387904  # 2^62: batch·seq and the step loops would overflow or never end
expect_error "weight_decay -100 must be a finite number >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --weight-decay -100
expect_error "weight_decay nan must be a finite number >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --weight-decay nan
expect_error "grad_clip nan must be a finite number >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --grad-clip nan
expect_error "grad_clip -1 must be a finite number >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --grad-clip -1
expect_error "min_lr_ratio nan must be in \[0, 1\]" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --min-lr-ratio nan
expect_error "min_lr_ratio -5 must be in \[0, 1\]" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --min-lr-ratio -5
expect_error "lr inf must be a finite number > 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --lr inf
expect_error "--threads -3 must be in \[0, [0-9]+\]" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --threads -3
expect_error "--threads 100000 must be in \[0, [0-9]+\]" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --threads 100000
# Empty and wrapped values, the same rules in every subcommand (check_values in examples/train.cpp).
expect_error "--grad-clip: an empty value \(give one\)" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --grad-clip ''
expect_error "--warmup: an empty value" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --warmup ''
expect_error "--tokenizer: an empty value" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --tokenizer ''
expect_error "--tokens: an empty value" "$SAMPLE" --checkpoint "$T/run" --tokens ''
expect_error "--batches: an empty value" "$BIN" eval --checkpoint "$T/run" --data "$T/text.txt" --batches ''
expect_error "'-1' is not a seed \(a whole number in \[0, 18446744073709551615\]\)" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --seed -1
expect_error "'18446744073709551616' is not a seed" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --seed 18446744073709551616
expect_error "'-1' is not a seed" "$SAMPLE" --checkpoint "$T/run" --seed -1
expect_error "lr 0.002 x weight_decay 4.6[0-9e+]* must be < 1" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --weight-decay 4611686018427387904
# --resume continues the run's own seed and prepared data: options that only shape a fresh run are refused.
expect_error "--resume continues the run's own seed .*: leave out --seed" "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch tiny --steps 6 --batch 2 --seq 32 --sample-tokens 0 --seed 5
expect_error "--resume continues the run's own prepared data: leave out --tokenizer and --val-fraction" "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch tiny --steps 6 --batch 2 --seq 32 --sample-tokens 0 --val-fraction 0.5
expect_error "--resume continues the run's own prepared data" "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch tiny --steps 6 --batch 2 --seq 32 --sample-tokens 0 --tokenizer gpt2
# eval and prune share training's ranges: batch x seq cannot overflow, at most 10^9 batches.
expect_error "batch $big must be in \[1, 1000000000\]" "$BIN" eval --checkpoint "$T/run" --data "$T/text.txt" --batch $big --seq 128
expect_error "eval_batches $big must be in \[1, 1000000000\]" "$BIN" eval --checkpoint "$T/run" --data "$T/text.txt" --batches $big
expect_error "batch 100000000 x seq 32 tokens per micro-batch exceed" "$BIN" prune --checkpoint "$T/run" --data "$T/text.txt" --batch 100000000 --seq 32
expect_error "checkpoint_interval -1 must be >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --checkpoint-interval -1
expect_error "eval_interval -1 must be >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --steps 3 --batch 2 --seq 32 --eval-batches 1 --sample-tokens 0 --eval-interval -1
expect_error "log_interval 0 must be > 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --log-interval 0
expect_error "batch $big must be in \[1, 1000000000\]" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --steps 3 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --batch $big
expect_error "batch 100000000 x seq 32 tokens per micro-batch exceed" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --steps 3 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --batch 100000000
expect_error "steps $big must be in \[1, 1000000000\]" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --steps $big
expect_error "accum $big must be in \[1, 1000000000\]" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --accum $big
expect_error "eval_batches $big must be in \[1, 1000000000\]" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --steps 3 --batch 2 --seq 32 --eval-interval 0 --sample-tokens 0 --eval-batches $big
expect_error "--temperature nan must be a finite number >= 0" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --temperature nan
expect_error "Could not convert: --steps = 1e30" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --batch 2 --seq 32 --steps 1e30
expect_error "The following argument was not expected: --bogus" "$BIN" --data "$T/text.txt" --out "$T/r1" "${common[@]}" --bogus
expect_error "--top-k -1 must be >= 0" "$SAMPLE" --checkpoint "$T/run" --top-k -1
expect_error "--tokens -1 must be in \[0, 100000000\]" "$SAMPLE" --checkpoint "$T/run" --tokens -1
expect_error "--top-p 0 must be in \(0, 1\]" "$SAMPLE" --checkpoint "$T/run" --top-p 0
# Hostile data: a FIFO (opening it would block forever), a token file whose count x width wraps 2^64, one
# naming a tokenizer this build does not know; a batch whose workspace exceeds the machine's memory.
mkfifo "$T/fifo"
expect_error "data file '.*fifo' is not a regular file \(a FIFO" "$BIN" --data "$T/fifo" --out "$T/r1" "${common[@]}"
{ printf 'MOMTOK\0\0\001\0\0\0\002\0\0\0\0\0\0\0\0\0\0\200\0\001\0\0\0\0\0\0byte'; head -c 28 /dev/zero; } >"$T/wrap.bin"
expect_error "token file '.*wrap.bin' is truncated: header says 9223372036854775808 tokens" "$BIN" --data "$T/wrap.bin" --out "$T/r1" "${common[@]}"
{ printf 'MOMTOK\0\0\001\0\0\0\002\0\0\0\100\0\0\0\0\0\0\0\0\001\0\0\0\0\0\0nope'; head -c 28 /dev/zero
  for i in $(seq 1 64); do printf 'A\0'; done; } >"$T/nope.bin"
expect_error "names the tokenizer 'nope' which this build does not know" "$BIN" --data "$T/nope.bin" --out "$T/r1" "${common[@]}"
expect_error "unknown tokenizer 'nope'" "$BIN" --data "$T/nope.bin" --out "$T/r1" --arch tiny --steps 3 --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 5
expect_error "--batch 10000000 x --seq 128 needs about .* GiB of activations" "$BIN" --data "$T/text.txt" --out "$T/r1" --arch tiny --steps 3 --seq 128 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --batch 10000000
# --resume with other data is refused before anything is tokenized (the run's prepared data stays).
cp "$T/text.txt" "$T/other.txt"; echo "and more" >>"$T/other.txt"
expect_error "--resume: --data '.*other.txt' is not the data this run trained on" "$BIN" --data "$T/other.txt" --out "$T/run" --resume --arch tiny --steps 6 --batch 2 --seq 32 --sample-tokens 0
# (.lock: the run folder's lock, train::DirLock, taken before the checks that need the folder)
if [ -e "$T/r1" ] && [ -n "$(ls -A "$T/r1" 2>/dev/null | grep -vx '.lock')" ]; then echo "FAIL: a refused run wrote into its --out"; ls -AR "$T/r1"; fail=1; fi
after=$(checksum)
if [ "$before" != "$after" ]; then echo "FAIL: the checkpoint changed"; fail=1; else echo "ok: checkpoint unchanged"; fi

# Resume continues to --steps with the run's prepared data (not tokenized again), listing what changed; a
# sample comes out of the checkpoint.
if "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch tiny --steps 5 --batch 2 --seq 32 --eval-interval 0 \
     --eval-batches 1 --sample-tokens 0 --lr 0.001 >"$T/resume.log" 2>&1 && grep -q "resumed from step 3" "$T/resume.log" &&
   grep -q "resume: changed since the checkpoint: lr 0.002 -> 0.001" "$T/resume.log" &&
   grep -q "resume: changed since the checkpoint: steps 3 -> 5" "$T/resume.log" &&
   grep -q "data: the run's prepared .*run/data (not tokenized again)" "$T/resume.log" &&
   grep -q "step-000005" "$T/run/latest"; then
  echo "ok: resume to step 5"
else
  echo "FAIL: resume"; cat "$T/resume.log"; fail=1
fi
if "$SAMPLE" --checkpoint "$T/run" --prompt "In the" --tokens 20 --temperature 0 >"$T/sample.log" 2>&1 &&
   grep -q "^In the" "$T/sample.log"; then
  echo "ok: sample: $(head -c 80 "$T/sample.log" | tr '\n' ' ')"
else
  echo "FAIL: sample"; cat "$T/sample.log"; fail=1
fi
# Divergence: a good run to step 4, then resumed with --lr 1e6 and no clipping. Each must stop non-zero with
# one line ("training diverged": a non-finite loss at a save's check forward, or 5 skipped steps in a row),
# and what `latest` names then (step 4 or a later state that was still finite) must sample.
"$BIN" --data "$T/text.txt" --out "$T/div" --arch tiny --steps 4 --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 \
  --sample-tokens 0 >"$T/div.log" 2>&1 || { echo "FAIL: the run before divergence"; cat "$T/div.log"; fail=1; }
div=(--data "$T/text.txt" --out "$T/div" --resume --arch tiny --steps 60 --batch 2 --seq 32 --eval-batches 1
     --sample-tokens 0 --lr 1e6 --warmup 0 --grad-clip 0 --weight-decay 0)
expect_error "training diverged" "$BIN" "${div[@]}" --checkpoint-interval 1 --eval-interval 0
expect_error "training diverged: 5 steps in a row \(to step [0-9]+\) had a non-finite loss or gradients" \
  "$BIN" "${div[@]}" --checkpoint-interval 0 --eval-interval 0
if timeout 60 "$SAMPLE" --checkpoint "$T/div" --prompt "In" --tokens 5 --temperature 0 >"$T/div-sample.log" 2>&1; then
  echo "ok: after divergence latest ($(cat "$T/div/latest")) is finite and samples"
else
  echo "FAIL: latest after divergence"; cat "$T/div/latest" "$T/div-sample.log"; fail=1
fi
# Past the context (tiny: 128 tokens) the KV-cache sampler restarts its window from the last 64 tokens.
if "$SAMPLE" --checkpoint "$T/run" --prompt "In the" --tokens 300 --temperature 0.8 --top-p 0.9 >"$T/long.log" 2>&1 &&
   [ "$(wc -c <"$T/long.log")" -ge 300 ]; then
  echo "ok: 300 tokens past the context of 128 (top-p 0.9)"
else
  echo "FAIL: long sample"; cat "$T/long.log"; fail=1
fi
# Two-phase training (paper §3.4): a few steps of dense8, then mom8-p warm-started from it; the routed run
# writes routing statistics at its validation. Refusals: a checkpoint that is not the dense twin, a dense arch.
p2=(--steps 2 --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0)
if "$BIN" --data "$T/text.txt" --arch dense8 --out "$T/p1" "${p2[@]}" >"$T/p1.log" 2>&1 &&
   "$BIN" --data "$T/p1/data" --arch mom8-p --out "$T/p2" --init-from "$T/p1" "${p2[@]}" >"$T/p2.log" 2>&1 &&
   grep -q "phase 2: warm-started from .*p1/step-000002/model.safetensors (dense8" "$T/p2.log" &&
   grep -q '"name": "part2.attn"' "$T/p2/routing.json" && [ -f "$T/p2/routing/step-000002.part2.ffn.csv" ] &&
   grep '"type":"routing"' "$T/p2/metrics.jsonl" | grep '"router":"part2.ffn"' | grep -q '"cv":'; then
  echo "ok: phase 1 (dense8) -> phase 2 (mom8-p --init-from), routing statistics written"
else
  echo "FAIL: phase 1 -> phase 2"; cat "$T/p1.log" "$T/p2.log"; fail=1
fi
# A depth-routed family (token-choice Mixture-of-Recursions) adds its usage record (per recursion the fraction of
# tokens run) to metrics.jsonl, and samples through the KV cache.
if "$BIN" --data "$T/p1/data" --arch mor8-token --out "$T/mor" "${p2[@]}" >"$T/mor.log" 2>&1 &&
   grep '"type":"depth"' "$T/mor/metrics.jsonl" | grep '"part1.h2"' | grep -q '"run_fraction":'; then
  echo "ok: mor8-token writes its per-recursion usage to metrics.jsonl"
else
  echo "FAIL: mor8-token usage record"; cat "$T/mor.log"; fail=1
fi
expect_error "--init-from: '.*' holds 'LM<d_model=128.*' but --arch mom8-p warm-starts from its dense twin dense8 .* or fine-tunes its own" \
  "$BIN" --data "$T/text.txt" --arch mom8-p --out "$T/o9" --init-from "$T/run" "${p2[@]}"
expect_error "--init-from: '.*' holds 'LM<.*': architecture 'tiny' starts only from its own checkpoints" \
  "$BIN" --data "$T/text.txt" --arch tiny --out "$T/o10" --init-from "$T/p1" "${p2[@]}"
expect_error "--init-from: '.*nowhere' does not exist" \
  "$BIN" --data "$T/text.txt" --arch mom8-p --out "$T/o11" --init-from "$T/nowhere" "${p2[@]}"
# Fine-tuning: --init-from a checkpoint of the same architecture; mom-train eval prints a checkpoint's loss.
if "$BIN" --data "$T/text.txt" --arch tiny --out "$T/ft" --init-from "$T/run" "${p2[@]}" >"$T/ft.log" 2>&1 &&
   grep -q "fine-tuning: parameters from .*run/step-000005/model.safetensors" "$T/ft.log" &&
   "$BIN" eval --checkpoint "$T/ft" --data "$T/text.txt" --batch 2 --seq 32 --batches 2 >"$T/eval.log" 2>&1 &&
   grep -Eq "^validation loss [0-9.]+ nats/token over 2 windows of 2 x 32 tokens" "$T/eval.log"; then
  echo "ok: fine-tuning from a checkpoint of the same architecture, mom-train eval"
else
  echo "FAIL: fine-tuning / eval"; cat "$T/ft.log" "$T/eval.log"; fail=1
fi
# ModuleFormer pruning (issue 15): usage over validation windows, the masked checkpoint written and evaluated.
if "$BIN" --data "$T/text.txt" --arch moduleformer8 --out "$T/mf" "${p2[@]}" >"$T/mf.log" 2>&1 &&
   "$BIN" prune --checkpoint "$T/mf" --data "$T/mf/data" --batch 2 --seq 32 --batches 2 --tau 0.5 --out "$T/mf-p" \
     >"$T/prune.log" 2>&1 &&
   grep -Eq "^prune: parameters [0-9]+ of [0-9]+ kept .*validation loss [0-9.]+ -> [0-9.]+" "$T/prune.log" &&
   "$BIN" eval --checkpoint "$T/mf-p" --data "$T/mf/data" --batch 2 --seq 32 --batches 2 >"$T/eval2.log" 2>&1; then
  echo "ok: moduleformer8 trains, prunes and the pruned checkpoint evaluates"
else
  echo "FAIL: moduleformer8 prune"; cat "$T/mf.log" "$T/prune.log" "$T/eval2.log"; fail=1
fi
expect_error "--into 'dense8': this architecture compacts into 'moduleformer8-c6-12'" \
  "$BIN" prune --checkpoint "$T/mf" --data "$T/mf/data" --batch 2 --seq 32 --into dense8
expect_error "architecture 'tiny' has no modules to prune" "$BIN" prune --checkpoint "$T/run" --data "$T/text.txt"
expect_error "--tau 2 must be in \[0, 1\]" "$BIN" prune --checkpoint "$T/run" --data "$T/text.txt" --tau 2
if "$BIN" --help | grep -q "gpt2-small-mom-p" && "$BIN" --help | grep -q "127,596,800 params"; then
  echo "ok: --help lists the MoM architectures"
else
  echo "FAIL: --help MoM architectures"; fail=1
fi
if "$BIN" --help | grep -q "gpt2-small" && "$BIN" --help | grep -q "124,439,808 params"; then
  echo "ok: --help lists the architectures"
else
  echo "FAIL: --help"; fail=1
fi
# Which architectures mom-sample decodes with the KV cache (causal routing) and which recompute the window.
help_line() { "$BIN" --help | grep -A1 "^  $1 (" | tail -1; }
if help_line mom8-p | grep -q "samples with the KV cache" && help_line mod8-causal | grep -q "samples with the KV cache" &&
   help_line exit8 | grep -q "samples with the KV cache" && help_line mod8 | grep -q "forward over the window per token" &&
   help_line mor8-token | grep -q "samples with the KV cache" && help_line mor8-paper | grep -q "samples with the KV cache" &&
   help_line mor8 | grep -q "forward over the window per token" &&
   help_line dsmoe8 | grep -q "samples with the KV cache" && help_line ec8 | grep -q "forward over the window per token"; then
  echo "ok: --help says how each architecture samples"
else
  echo "FAIL: --help sampling column: $(help_line mom8-p) / $(help_line mod8)"; fail=1
fi
# A checkpoint that is a FIFO is refused, not waited on (mom-sample, --init-from).
mkdir -p "$T/fck"; mkfifo "$T/fck/model.safetensors"
expect_error "fck/model.safetensors' is not a regular file" "$SAMPLE" --checkpoint "$T/fck"
expect_error "fck/model.safetensors' is not a regular file" "$BIN" eval --checkpoint "$T/fck" --data "$T/text.txt"
expect_error "(fck/model.safetensors' is not a regular file|no checkpoint in '.*fck/model.safetensors')" "$BIN" --data "$T/text.txt" --out "$T/o12" "${common[@]}" --init-from "$T/fck/model.safetensors"
# A header nested 200,000 deep (shape, then data_offsets) is refused in one line; the message never recurses.
for field in shape data_offsets; do
  mkdir -p "$T/deep-$field"
  python3 - "$T/deep-$field/model.safetensors" "$field" <<'PY'
import struct, sys
deep = "[" * 200000 + "]" * 200000
entry = {"shape": '"dtype":"F32","shape":%s,"data_offsets":[0,0]', "data_offsets": '"dtype":"F32","shape":[0],"data_offsets":%s'}
header = ('{"wte":{' + entry[sys.argv[2]] % deep + '}}').encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header)
PY
done
expect_error "entry 'wte' is malformed \(shape holds an array of 1, not an integer >= 0\)" "$SAMPLE" --checkpoint "$T/deep-shape"
expect_error "entry 'wte' is malformed \(data_offsets an array of 1 is not two integers >= 0\)" "$SAMPLE" --checkpoint "$T/deep-data_offsets"
# A failed write of metrics.jsonl (a full disk: /dev/full) ends the run with the cause.
mkdir -p "$T/mfull"; ln -s /dev/full "$T/mfull/metrics.jsonl"
expect_error "cannot write metrics file '.*mfull/metrics.jsonl': No space left on device" "$BIN" --data "$T/text.txt" --out "$T/mfull" "${common[@]}"
# Two writers on one --out: the second is refused in one line naming the first's pid; the first goes on.
"$BIN" --data "$T/text.txt" --out "$T/lock" --arch tiny --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0 \
  --steps 1000000 --checkpoint-interval 0 >"$T/lock.log" 2>&1 &
first=$!
for _ in $(seq 1 600); do grep -q '"type":"train"' "$T/lock/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
expect_error "output directory '.*lock' is in use by another mom-train process \(pid $first\)" \
  "$BIN" --data "$T/text.txt" --out "$T/lock" --arch tiny --batch 2 --seq 32 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --steps 5 --resume
expect_error "output directory '.*lock' is in use by another mom-train process \(pid $first\)" \
  "$BIN" --data "$T/text.txt" --out "$T/lock" "${common[@]}"
kill -INT "$first"; wait "$first"
if [ "$?" -eq 0 ] && [ -f "$T/lock/latest" ]; then echo "ok: the first writer went on and saved on Ctrl-C"; else echo "FAIL: the first writer"; tail -c 600 "$T/lock.log"; fail=1; fi
# --device / --precision (docs/cuda.md, "Train on a GPU"): bad values are refused up front; --device cuda where there
# is no GPU (or in a build without the CUDA backend) is one line and writes nothing. (The CUDA runs themselves are
# tested by examples/test_device.sh with the backend's CPU emulation.)
expect_error "--device 'gpu': expected cpu, cuda or cuda:N" "$BIN" --data "$T/text.txt" --out "$T/d1" "${common[@]}" --device gpu
expect_error "--device 'cuda:x': expected cpu, cuda or cuda:N" "$BIN" --data "$T/text.txt" --out "$T/d1" "${common[@]}" --device cuda:x
expect_error "--precision 'fp16': expected fp32, tf32 or bf16" "$BIN" --data "$T/text.txt" --out "$T/d1" "${common[@]}" --device cuda --precision fp16
expect_error "--precision bf16 needs --device cuda: the CPU backend computes in fp32" "$BIN" --data "$T/text.txt" --out "$T/d1" "${common[@]}" --precision bf16
expect_error "--device 'tpu': expected cpu, cuda or cuda:N" "$SAMPLE" --checkpoint "$T/run" --device tpu
expect_error "--precision tf32 needs --device cuda" "$BIN" eval --checkpoint "$T/run" --data "$T/text.txt" --precision tf32
if nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: --device cuda without a GPU (this machine has one)"
else
  no_gpu="--device cuda(:[0-9]+)?: (no CUDA device \(no GPU, or no NVIDIA driver, on this machine\); use --device cpu|this build of mom-train has no cuda backend)"
  expect_error "$no_gpu" "$BIN" --data "$T/text.txt" --out "$T/d2" "${common[@]}" --device cuda
  expect_error "$no_gpu" "$BIN" --data "$T/text.txt" --out "$T/d2" "${common[@]}" --device cuda:1 --precision bf16
  expect_error "$no_gpu" "$SAMPLE" --checkpoint "$T/run" --device cuda
  expect_error "$no_gpu" "$BIN" eval --checkpoint "$T/run" --data "$T/text.txt" --device cuda
  if [ -e "$T/d2" ]; then echo "FAIL: a run refused for its device wrote into its --out"; ls -R "$T/d2"; fail=1; fi
fi
exit $fail

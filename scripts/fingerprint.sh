#!/usr/bin/env bash
# The numerics of every byte-level architecture in one line each, to show that a refactor changed no bit
# (issue 29: "losses, gradients and decode stay bit-identical").
#
#   scripts/fingerprint.sh BUILD_DIR [OUT_FILE] [ARCH ...]
#
# Per architecture, mom-train runs 3 optimizer steps (batch 2 × 64 tokens, 2 threads, seed 1) on KJV, saves
# its checkpoint and samples 32 tokens through the KV-cache Decoder. The line holds SHA-256 prefixes of
#   model      the parameters after 3 AdamW steps (any change in a loss, gradient or routing decision shows)
#   optim      AdamW's moments (the gradients of all three steps)
#   sample     the sampled text (decoding: prefill and one token per step)
#   losses     the printed losses, gradient norms and validation loss
# Run it on the commit before and after a change and diff the two files. The GPT-2-vocabulary entries
# (small-bpe, gpt2-*) are left out: they need the BPE data and GPT-2-small-sized memory.
set -euo pipefail
build=${1:?usage: scripts/fingerprint.sh BUILD_DIR [OUT_FILE] [ARCH ...]}
out=${2:-/dev/stdout}
shift $(( $# >= 2 ? 2 : 1 ))
train="$build/examples/mom-train"
[[ -x "$train" ]] || { echo "fingerprint: no $train (build the mom-train target first)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
kjv="$root/data/kjv.txt"
[[ -f "$kjv" ]] || { echo "fingerprint: no $kjv (scripts/setup.sh downloads it)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if (( $# == 0 )); then
  mapfile -t archs < <("$train" --help 2>&1 | sed -n '/^Architectures/,$p' | grep -E '^  [a-z0-9]' | awk '{print $1}' |
                       grep -Ev '^(small-bpe|gpt2-)')
else
  archs=("$@")
fi
h() { sha256sum | cut -c1-16; }
# A safetensors file's tensor bytes (its JSON header holds a random checkpoint id and the run's paths).
tensors() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"; }
: > "$work/table"
for a in "${archs[@]}"; do
  run="$work/$a"
  data="$work/data"
  [[ -d "$data" ]] || data="$kjv"
  if ! "$train" -d "$data" -a "$a" -n 3 -b 2 --seq 64 --warmup 1 --eval-interval 0 --eval-batches 1 \
       --checkpoint-interval 0 --sample-tokens 32 --threads 2 --log-interval 1 --seed 1 -o "$run" > "$run.log" 2>&1; then
    echo "fingerprint: $a failed:" >&2; tail -3 "$run.log" >&2; exit 1
  fi
  [[ -d "$work/data" ]] || cp -r "$run/data" "$work/data"
  ck="$run/step-000003"
  printf '%-28s model %s  optim %s  sample %s  losses %s\n' "$a" \
    "$(tensors "$ck/model.safetensors" | h)" "$(tensors "$ck/optimizer.safetensors" | h)" \
    "$(sed -n '/^sample/,$p' "$run.log" | h)" \
    "$(grep -E '^step' "$run.log" | grep -Eo '(loss|grad|val loss) [0-9.]+' | h)" | tee -a "$work/table" >&2
  rm -rf "$run"
done
cp "$work/table" "$out"

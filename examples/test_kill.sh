#!/usr/bin/env bash
# mom-train killed with SIGKILL at random points (run by CTest as examples.cli_kill_resume): a tiny run that
# checkpoints every step is started (resumed once it has a checkpoint) and killed after a seeded random delay,
# over and over. After every kill:
#   - `latest` (once there is one) loads: mom-sample samples from it;
#   - at most three step folders exist (the newest, the one before, one being written), never step-N.K with K > 1;
#   - temporary files left by an earlier kill are gone once the next run has started (its `train:` line):
#     ensure_writable_dir removes those of dead processes.
# Finally a resume runs to completion: no temporary file and no incomplete step folder remains anywhere,
# exactly two step folders, and `latest` names the last step.
set -u
BIN="$1"
SAMPLE="$(dirname "$BIN")/mom-sample"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail=0
RANDOM=16  # seeded: the same delays every time (where a kill lands still depends on the machine's speed)

for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. $i"; done >"$T/text.txt"
run="$T/run"
args=(--data "$T/text.txt" --out "$run" --arch tiny --batch 2 --seq 32 --eval-interval 0 --eval-batches 1
      --sample-tokens 0 --checkpoint-interval 1)
temps() { find "$run" "$@" \( -name '.*.tmp.*' -o -name '.mom_write_test.*' \) 2>/dev/null | sort; }
step_folders() { find "$run" -mindepth 1 -maxdepth 1 -type d -name 'step-*' 2>/dev/null | sort; }

kills=15
killed_at=()
debris=0  # kills that left a temporary file or a half-written step folder behind
for k in $(seq 1 "$kills"); do
  before=$( { temps -maxdepth 1; temps -path "$run/data/*"; } )  # top level and data/: ensure_writable_dir's folders
  resume=()
  [ -f "$run/latest" ] && resume=(--resume)
  "$BIN" "${args[@]}" "${resume[@]}" --steps 100000 >"$T/run$k.log" 2>&1 &
  pid=$!
  delay=$(printf '0.%03d' $((100 + RANDOM % 900)))
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  latest=$(cat "$run/latest" 2>/dev/null)
  killed_at+=("${latest:-none}")
  half=$(for d in $(step_folders); do [ -f "$d/model.safetensors" ] || echo "$d"; done)
  [ -n "$(temps)$half" ] && debris=$((debris + 1))
  if [ -n "$latest" ]; then
    if ! "$SAMPLE" --checkpoint "$run" --tokens 4 --temperature 0 >"$T/sample.log" 2>&1; then
      echo "FAIL: kill $k (after ${delay}s): latest ($latest) does not load:"; cat "$T/sample.log"; fail=1
    fi
  fi
  n=$(step_folders | wc -l)
  if [ "$n" -gt 3 ] || step_folders | grep -Eq '\.([2-9]|[1-9][0-9]+)$'; then
    echo "FAIL: kill $k: step folders accumulate:"; step_folders; fail=1
  fi
  if grep -q "^train:" "$T/run$k.log" && [ -n "$before" ]; then
    for f in $before; do
      if [ -e "$f" ]; then echo "FAIL: kill $k: $f (left by an earlier kill) is still there"; fail=1; fi
    done
  fi
done
echo "killed at (latest then): ${killed_at[*]}; $debris of $kills kills left debris behind"

# Resume to completion: three more steps.
last=$(sed -E 's/^step-0*([0-9]+).*/\1/' "$run/latest" 2>/dev/null)
last=${last:-0}
target=$((last + 3))
resume=()
[ -f "$run/latest" ] && resume=(--resume)
if "$BIN" "${args[@]}" "${resume[@]}" --steps "$target" >"$T/final.log" 2>&1 &&
   grep -q "$(printf 'step-%06d' "$target")" "$run/latest"; then
  echo "ok: resumed from step $last to completion (step $target)"
else
  echo "FAIL: the final resume"; cat "$T/final.log"; fail=1
fi
left=$(temps)
if [ -n "$left" ]; then echo "FAIL: temporary files remain:"; echo "$left"; fail=1; else echo "ok: no temporary files"; fi
if [ "$(step_folders | wc -l)" -ne 2 ]; then echo "FAIL: expected 2 step folders:"; step_folders; fail=1; fi
for d in $(step_folders); do
  if [ ! -f "$d/model.safetensors" ] || [ ! -f "$d/optimizer.safetensors" ]; then
    echo "FAIL: incomplete step folder $d"; ls -la "$d"; fail=1
  fi
done
if "$SAMPLE" --checkpoint "$run" --tokens 4 --temperature 0 >"$T/sample.log" 2>&1; then
  echo "ok: the final checkpoint samples; step folders: $(step_folders | xargs -n1 basename | tr '\n' ' ')"
else
  echo "FAIL: sample from the final checkpoint"; cat "$T/sample.log"; fail=1
fi
exit $fail

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
  "$@" >"$T/out" 2>"$T/err"
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
checksum() { find "$T/run" -type f -name '*.safetensors' -o -name latest | sort | xargs md5sum; }
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
after=$(checksum)
if [ "$before" != "$after" ]; then echo "FAIL: the checkpoint changed"; fail=1; else echo "ok: checkpoint unchanged"; fi

# Resume continues to --steps; a sample comes out of the checkpoint.
if "$BIN" --data "$T/text.txt" --out "$T/run" --resume --arch tiny --steps 5 --batch 2 --seq 32 --eval-interval 0 \
     --eval-batches 1 --sample-tokens 0 >"$T/resume.log" 2>&1 && grep -q "resumed from step 3" "$T/resume.log" &&
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
if "$BIN" --help | grep -q "gpt2-small" && "$BIN" --help | grep -q "124,439,808 params"; then
  echo "ok: --help lists the architectures"
else
  echo "FAIL: --help"; fail=1
fi
exit $fail

#!/usr/bin/env bash
# scripts/compare.py end to end at a tiny budget (issue 32): three architectures (one dense, one routed, one
# two-phase MoM) × seeds at equal training FLOPs on a small corpus; the table and the SVG are written, every run
# trained until its FLOPs reached its budget (the pilot's measure sets its intervals); then the
# same sweep with one more seed keeps the finished runs (resumable) and trains only the new ones; a run stopped
# part-way continues from its checkpoint to the numbers of an uninterrupted one.
set -u
BIN="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form $i."; done >"$T/text.txt"
args=(--mom-train "$BIN" --data "$T/text.txt" --out "$T/sweep" --archs tiny,mod8,mom8-e@dense8:0.5 --flops 3e10
      --batch 2 --seq 16 --warmup 1 --evals 2 --pilot 2 --eval-batches 1 --checkpoints 1)
python3 "$HERE/../scripts/compare.py" "${args[@]}" --seeds 1 >"$T/first.log" 2>&1 || { echo "FAIL: first sweep"; cat "$T/first.log"; exit 1; }
python3 "$HERE/../scripts/compare.py" "${args[@]}" --seeds 1,2 >"$T/second.log" 2>&1 || { echo "FAIL: second sweep"; cat "$T/second.log"; exit 1; }
cat "$T/second.log"
fail=0
# The second sweep trained seed 2 only (4 runs: tiny, mod8, dense8 phase 1, mom8-e), none of seed 1.
n=$(grep -c "^  training" "$T/second.log")
[ "$n" = 4 ] || { echo "FAIL: the second sweep trained $n runs, not the 4 of seed 2"; fail=1; }
grep -q "training .* seed 1" "$T/second.log" && { echo "FAIL: seed 1 trained again"; fail=1; }
python3 - "$T/sweep" <<'PY' || fail=1
import json, os, sys
out = sys.argv[1]
plan = json.load(open(os.path.join(out, "plan.json")))["steps"]
budget = 3e10
bad = 0
for folder, spec, phases in (("tiny", "tiny", [("seed-{s}", 1.0)]), ("mod8", "mod8", [("seed-{s}", 1.0)]),
                             ("mom8-e_after_dense8_0.5", "mom8-e@dense8:0.5",
                              [("seed-{s}-phase1", 0.5), ("seed-{s}", 0.5)])):
    for s in (1, 2):
        for ph, share in phases:
            rows = [json.loads(l) for l in open(os.path.join(out, folder, ph.format(s=s), "metrics.jsonl"))]
            train = [r for r in rows if r["type"] == "train"]
            flops = sum(r["flops"] for r in train)
            assert any(r["type"] == "val" for r in rows), (folder, ph)
            # each phase trains until its FLOPs reach its share of the budget (mom-train --flops-budget): at least
            # the share, and less than the share plus its last step (MoM_E's steps vary with its Skip picks)
            want = share * budget
            ok = want <= flops < want + train[-1]["flops"]
            print(f"{'ok' if ok else 'FAIL'}: {spec} {ph.format(s=s)}: {flops:.4g} training FLOPs for {want:.4g}")
            bad += not ok
table = open(os.path.join(out, "results.md")).read()
for spec in ("| tiny |", "| mod8 |", "| mom8-e (after dense8, 0.5) |"):
    if spec not in table or "(n=2)" not in table.split(spec)[1].split("\n")[0]:
        print(f"FAIL: results.md has no row {spec} over 2 seeds"); bad += 1
# The "best val CE on the way" column: the mean over seeds of each run's lowest validation loss (of its last phase).
for folder, label in (("mod8", "| mod8 |"), ("mom8-e_after_dense8_0.5", "| mom8-e (after dense8, 0.5) |")):
    rows = {s: [json.loads(l) for l in open(os.path.join(out, folder, f"seed-{s}", "metrics.jsonl"))] for s in (1, 2)}
    lows = [min(r["loss"] for r in rows[s] if r["type"] == "val") for s in (1, 2)]
    row = [c.strip() for c in table.split(label)[1].split("\n")[0].split("|")]
    final, best = float(row[0].split()[0]), float(row[1].split()[0])
    ok = abs(best - sum(lows) / 2) < 6e-5 and best <= final
    print(f"{'ok' if ok else 'FAIL'}: {label} best {best} (runs' lowest {lows}), final {final}")
    bad += not ok
svg = open(os.path.join(out, "val_vs_flops.svg")).read()
if svg.count("<path") != 3:
    print(f"FAIL: val_vs_flops.svg draws {svg.count('<path')} curves, not 3"); bad += 1
sys.exit(1 if bad else 0)
PY
# A run stopped part-way continues from its checkpoint when the sweep runs again, to the same numbers as the
# uninterrupted run of the first sweep (the same plan: one pilot per architecture). The stop: a mom-train whose
# tiny runs end at step 2, leaving the last checkpoint as a killed run does (only the pilot's 2 steps get through
# whole); mod8, trained first, finishes, and the stopped sweep leaves a partial table of it.
cat >"$T/stops_early.sh" <<EOF
#!/usr/bin/env bash
stop=0; for x in "\$@"; do [ "\$x" = tiny ] && stop=1; done
a=(); while (( \$# )); do if [ "\$1" = --steps ] && [ \$stop = 1 ]; then a+=(--steps 2); shift 2; else a+=("\$1"); shift; fi; done
exec "$BIN" "\${a[@]}"
EOF
chmod +x "$T/stops_early.sh"
rargs=(--data "$T/text.txt" --out "$T/resumed" --archs mod8,tiny --flops 3e10 --batch 2 --seq 16 --warmup 1 --evals 2
       --pilot 2 --eval-batches 1 --checkpoints 1 --seeds 1)
if python3 "$HERE/../scripts/compare.py" --mom-train "$T/stops_early.sh" "${rargs[@]}" >"$T/stopped.log" 2>&1; then
  echo "FAIL: a run stopped at step 2 counted as finished"; cat "$T/stopped.log"; fail=1
fi
partial="$(cat "$T/resumed/results.md" 2>/dev/null)"
{ grep -q "^Partial: 1 of 2 runs finished" <<<"$partial" && grep -q "^| mod8 |" <<<"$partial" &&
  ! grep -q "^| tiny |" <<<"$partial"; } || { echo "FAIL: the stopped sweep's table of its finished run:"; echo "$partial"; fail=1; }
python3 "$HERE/../scripts/compare.py" --mom-train "$BIN" "${rargs[@]}" >"$T/resumed.log" 2>&1 ||
  { echo "FAIL: the sweep after the stop"; cat "$T/resumed.log"; fail=1; }
grep -q "^  resuming tiny seed 1" "$T/resumed.log" || { echo "FAIL: the stopped run was not resumed"; fail=1; }
{ ! grep -q "^Partial" "$T/resumed/results.md" && grep -q "^| tiny |" "$T/resumed/results.md"; } ||
  { echo "FAIL: the resumed sweep's table:"; cat "$T/resumed/results.md"; fail=1; }
python3 - "$T/sweep/tiny/seed-1/metrics.jsonl" "$T/resumed/tiny/seed-1/metrics.jsonl" <<'PY' || fail=1
import json, sys
def read(path):
    rows = [json.loads(l) for l in open(path)]
    train = {r["step"]: r["loss"] for r in rows if r["type"] == "train"}
    return train, [r["loss"] for r in rows if r["type"] == "val"][-1]
(whole, whole_val), (resumed, resumed_val) = read(sys.argv[1]), read(sys.argv[2])
ok = whole == resumed and whole_val == resumed_val
print(f"{'ok' if ok else 'FAIL'}: resumed run: {len(resumed)} steps, validation {resumed_val} "
      f"(uninterrupted: {len(whole)} steps, {whole_val})")
sys.exit(0 if ok else 1)
PY
# A bad architecture name is one line, not a traceback.
python3 "$HERE/../scripts/compare.py" --mom-train "$BIN" --data "$T/text.txt" --out "$T/bad" --archs mom8-e@dense8 --flops 1e9 >"$T/bad.log" 2>&1
[ $? = 1 ] && grep -q "^compare: 'mom8-e@dense8': a two-phase architecture is A@B:fraction" "$T/bad.log" ||
  { echo "FAIL: a malformed two-phase spec:"; cat "$T/bad.log"; fail=1; }
python3 "$HERE/../scripts/compare.py" --mom-train "$BIN" --data "$T/text.txt" --out "$T/bad" --archs moeut8/lr=-1 --flops 1e9 >"$T/bad.log" 2>&1
[ $? = 1 ] && grep -q "^compare: 'moeut8/lr=-1': a learning rate of its own is A/lr=X with X > 0" "$T/bad.log" ||
  { echo "FAIL: a bad learning-rate suffix:"; cat "$T/bad.log"; fail=1; }
[ "$fail" = 0 ] && echo "compare: ok"
exit "$fail"

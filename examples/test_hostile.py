#!/usr/bin/env python3
"""A seeded, bounded campaign of hostile inputs against mom-train and mom-sample (CTest examples.hostile_campaign).

Every case must end the way its category expects: refused (a non-zero exit, exactly one line on stderr naming the
cause, nothing written where nothing should be) or, for changes a reader may ignore, accepted with the same result
as the untouched input. Never a crash (a signal), a hang (past the case's time limit) or a silent acceptance (exit
0 where a refusal is due, or a different result). Categories:

  cli         every option of train / eval / prune / sample and mom-sample with values no option accepts
  data        token files with one header field changed (the 2^28 vocabulary among them), FIFOs, folders, binaries
  mutants     model.safetensors read by mom-sample, optimizer.safetensors by --resume: bytes changed, cut or added
  metadata    checkpoint metadata edited with the checksums recomputed (mom.tokenizer, mom.step, mom.data, ...)
  resume      --resume with options or files that would change the run: swapped splits, another seed or data
  divergence  a resume at --lr 1e6 stops with "training diverged" and `latest` still samples
  writers     a second writer on a run's --out is refused naming the first's pid

Usage: test_hostile.py <mom-train> [seed] [cli-cases]. The same seed draws the same cases. Prints one line per
failed case and a table of outcomes per category; exit status 1 on any failure.
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = os.path.abspath(sys.argv[1])
SAMPLE = os.path.join(os.path.dirname(BIN), "mom-sample")
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 20261127
CLI_CASES = int(sys.argv[3]) if len(sys.argv) > 3 else 160
rng = random.Random(SEED)
T = tempfile.mkdtemp(prefix="mom-hostile-")
env = dict(os.environ, OMP_NUM_THREADS="1")
tally = {}  # category -> {outcome: count}
failures = []


# ---- XXH64 and safetensors metadata edits (the checksums recomputed: include/mom/train/safetensors.hpp) ------
M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def xxh64(data):
    n, i = len(data), 0
    word = lambda at, k: int.from_bytes(data[at:at + k], "little")
    if n >= 32:
        v = [(P1 + P2) & M64, P2, 0, (-P1) & M64]
        while i + 32 <= n:
            v = [_round(v[k], word(i + 8 * k, 8)) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for lane in v:
            h = ((h ^ _round(0, lane)) * P1 + P4) & M64
    else:
        h = P5
    h = (h + n) & M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, word(i, 8)), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((word(i, 4) * P1) & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * P5) & M64), 11) * P1) & M64
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M64
    h = ((h ^ (h >> 29)) * P3) & M64
    return h ^ (h >> 32)


assert xxh64(b"") == 0xEF46DB3751D8E999 and xxh64(b"abc") == 0x44BC2CF5AD770999  # the reference's test values


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def resign(path, edit):
    """Rewrites a safetensors file after edit(metadata) changed its metadata, with a valid header checksum."""
    header, data = read_safetensors(path)
    meta = header["__metadata__"]
    edit(meta)
    meta.pop("mom.header_checksum", None)
    s = lambda x: "%d:%s" % (len(x.encode()), x)
    text = "mom.header.v1\n" + "".join("m %s %s\n" % (s(k), s(meta[k])) for k in sorted(meta, key=lambda k: k.encode()))
    for name in sorted((k for k in header if k != "__metadata__"), key=lambda k: k.encode()):
        t = header[name]
        text += "t %s %s [%s] %d,%d\n" % (s(name), t["dtype"], ",".join(map(str, t["shape"])), *t["data_offsets"])
    meta["mom.header_checksum"] = "xxh64:%016x" % xxh64(text.encode())
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    open(path, "wb").write(struct.pack("<Q", len(blob)) + blob + data)


# ---- running a case ---------------------------------------------------------------------------------------------
def run(args, timeout=60):
    try:
        p = subprocess.run(args, capture_output=True, timeout=timeout, env=env)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "hang", "", ""


def record(category, outcome, what="", detail=""):
    tally.setdefault(category, {}).setdefault(outcome, 0)
    tally[category][outcome] += 1
    if outcome not in ("refused", "accepted"):
        failures.append("%s: %s: %s %s" % (category, outcome, what, detail.strip()[-400:]))


def expect_refusal(category, args, names=(), out_dir=None, timeout=60):
    """Non-zero exit, one stderr line mentioning one of `names` (when given), nothing but .lock in out_dir."""
    rc, out, err = run(args, timeout)
    what = " ".join(a if a else "''" for a in args[1:])
    lines = err.strip("\n").split("\n") if err.strip() else []
    if rc == "hang":
        return record(category, "hang", what)
    if rc < 0 or rc >= 128:
        return record(category, "crash", what, "signal %d: %s" % (-rc if rc < 0 else rc - 128, err))
    if rc == 0:
        return record(category, "silent", what, out[-300:])
    if len(lines) != 1 or (names and not any(n in lines[0] for n in names)):
        return record(category, "unclear", what, err)
    if out_dir and os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {".lock"}:
        return record(category, "wrote", what, str(os.listdir(out_dir)))
    record(category, "refused")


# ---- a text, a good run, its sample -----------------------------------------------------------------------------
words = "the of and to in that is for it as was with be by on not he this are or his from at which but have".split()
with open(os.path.join(T, "text.txt"), "w") as f:
    for i in range(400):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize() + ".\n")
TEXT = os.path.join(T, "text.txt")
RUN = os.path.join(T, "run")
base = ["--arch", "tiny", "--batch", "2", "--seq", "32", "--eval-interval", "0", "--eval-batches", "1",
        "--sample-tokens", "0"]
rc, out, err = run([BIN, "--data", TEXT, "--out", RUN, "--steps", "3"] + base, 300)
if rc != 0:
    sys.exit("hostile campaign: the good run failed (%s): %s" % (rc, err))
sample_args = ["--prompt", "The", "--tokens", "12", "--temperature", "0"]
rc, GOOD_SAMPLE, err = run([SAMPLE, "--checkpoint", RUN] + sample_args)
if rc != 0:
    sys.exit("hostile campaign: sampling the good run failed: " + err)
STEP = os.path.join(RUN, open(os.path.join(RUN, "latest")).read().strip())
fifo = os.path.join(T, "fifo")
os.mkfifo(fifo)
junk = os.path.join(T, "junk.bin")
open(junk, "wb").write(bytes(rng.randrange(256) for _ in range(3000)))
fresh_id = [0]


def fresh_out():
    fresh_id[0] += 1
    return os.path.join(T, "out%d" % fresh_id[0])


# ---- cli: options with values none of them accepts --------------------------------------------------------------
numeric = {
    "train": ["--steps", "--batch", "--seq", "--accum", "--lr", "--min-lr-ratio", "--warmup", "--weight-decay",
              "--grad-clip", "--seed", "--eval-interval", "--eval-batches", "--checkpoint-interval", "--log-interval",
              "--threads", "--sample-tokens", "--temperature", "--val-fraction", "--collective-timeout"],
    "eval": ["--val-fraction", "--batch", "--seq", "--batches"],
    "prune": ["--val-fraction", "--batch", "--seq", "--batches", "--tau"],
    "sample": ["--tokens", "--temperature", "--top-k", "--top-p", "--seed"],
}
bad_numbers = ["", " ", "nan", "inf", "-inf", "-1", "abc", "1e400", "-9223372036854775809", "1.5.2", "7x"]
bad_strings = {
    "train": {"--data": ["", "/nonexistent/x.txt", fifo, T, junk], "--arch": ["", "nope"], "--tokenizer": ["", "nope"],
              "--device": ["", "gpu", "cuda:-1", "cuda:x", "cuda:99999999999"], "--precision": ["", "fp8"],
              "--out": ["", TEXT + "/sub"], "--init-from": ["", "/nonexistent", fifo, junk], "--freeze": ["nomatch*"]},
    "eval": {"--checkpoint": ["", "/nonexistent", fifo, junk, T], "--data": ["", "/nonexistent", fifo, junk],
             "--device": ["", "gpu"], "--precision": ["fp8"]},
    "prune": {"--checkpoint": ["", "/nonexistent", fifo], "--device": ["gpu"]},
    "sample": {"--checkpoint": ["", "/nonexistent", fifo, junk, T], "--prompt": [""], "--device": ["", "gpu"],
               "--precision": ["fp8"]},
}
commands = {
    "train": lambda out: [BIN, "--data", TEXT, "--out", out, "--steps", "2"] + base,
    "eval": lambda out: [BIN, "eval", "--checkpoint", RUN, "--data", TEXT, "--batch", "2", "--seq", "32",
                         "--batches", "1"],
    "prune": lambda out: [BIN, "prune", "--checkpoint", RUN, "--data", TEXT, "--batch", "2", "--seq", "32",
                          "--batches", "1", "--out", out],
    "sample": lambda out: ([SAMPLE] if rng.random() < 0.5 else [BIN, "sample"]) + ["--checkpoint", RUN, "--tokens", "4"],
}
cases = [(cmd, opt, v) for cmd, opts in numeric.items() for opt in opts for v in bad_numbers]
cases += [(cmd, opt, v) for cmd, opts in bad_strings.items() for opt, vs in opts.items() for v in vs]
for cmd, opt, value in sorted(rng.sample(cases, min(CLI_CASES, len(cases)))):
    out = fresh_out()
    args = commands[cmd](out)
    if opt in args:  # replace the template's value
        args[args.index(opt) + 1] = value
    else:
        args += [opt, value]
    # The cause named: the option (--name, or its TrainConfig spelling name_with_underscores) or, for a file that
    # is not what it should be, the file.
    names = [opt, opt[2:].replace("-", "_"), opt[2:]] + ([value] if value and "/" in value else [])
    expect_refusal("cli", args, names, out if cmd == "train" else None)

# ---- data: token files with one header field changed ------------------------------------------------------------
good_tok = open(os.path.join(RUN, "data", "train.bin"), "rb").read()
fields = [(0, 8, "magic"), (8, 4, "version"), (12, 4, "width"), (16, 8, "count"), (24, 8, "vocab"),
          (32, 16, "tokenizer"), (48, 16, "reserved")]
interesting = [0, 1, 2, 3, 255, 256, 257, 65535, 65536, 50257, 1 << 28, 1 << 31, (1 << 32) - 1, 1 << 63, (1 << 64) - 1]
for i in range(30):
    at, width, name = rng.choice(fields)
    b = bytearray(good_tok)
    if name in ("tokenizer", "magic"):
        word = rng.choice([b"gpt2", b"nope", b"BYTE", b"", b"\xff\xfe", b"MOMTOK\x00\x01"])
        b[at:at + width] = word.ljust(width, b"\0")[:width]
    elif name == "reserved":
        b[at + rng.randrange(width)] = rng.randrange(1, 256)
    else:
        v = rng.choice(interesting) & ((1 << (8 * width)) - 1)
        b[at:at + width] = v.to_bytes(width, "little")
    if rng.random() < 0.2:  # and cut short
        b = b[:rng.randrange(len(b))]
    if bytes(b) == good_tok:
        continue
    path = os.path.join(T, "tok%d.bin" % i)
    open(path, "wb").write(bytes(b))
    out = fresh_out()
    expect_refusal("data", [BIN, "--data", path, "--out", out, "--steps", "2"] + base,
                   ["token file", "data file", path, "not a mom token file"], out)
for path in (fifo, T, junk, "/dev/zero"):
    out = fresh_out()
    expect_refusal("data", [BIN, "--data", path, "--out", out, "--steps", "2"] + base, [path, "data file", "data folder"], out)

# ---- mutants: checkpoint bytes changed, cut or added --------------------------------------------------------------
def mutate(raw):
    kind = rng.choice(["flip", "flip", "flip", "cut", "append", "zero-length"])
    b = bytearray(raw)
    if kind == "flip":
        at = rng.randrange(len(b))
        b[at] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        b = b[:rng.randrange(len(b))]
    elif kind == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:
        b[:8] = rng.choice([0, 1, len(b), 1 << 62]).to_bytes(8, "little")
    return bytes(b), kind


def mutant_run(name, count, check):
    path = os.path.join(STEP, name)
    good = open(path, "rb").read()
    for _ in range(count):
        bad, kind = mutate(good)
        if bad == good:
            continue
        open(path, "wb").write(bad)
        check(kind)
        open(path, "wb").write(good)


def sample_mutant(kind):
    rc, out, err = run([SAMPLE, "--checkpoint", RUN] + sample_args)
    if rc == 0 and out == GOOD_SAMPLE:  # a change the reader may ignore (the header's JSON whitespace)
        return record("mutants", "accepted")
    if rc == 0:
        return record("mutants", "silent", "model.safetensors " + kind, out)
    expect_refusal("mutants", [SAMPLE, "--checkpoint", RUN] + sample_args, ["model.safetensors", "checkpoint"])


def resume_mutant(kind):
    copy = os.path.join(T, "resume-mutant")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(RUN, copy)
    expect_refusal("mutants", [BIN, "--data", TEXT, "--out", copy, "--resume", "--steps", "4"] + base,
                   ["optimizer.safetensors", "checkpoint"])


mutant_run("model.safetensors", 40, sample_mutant)
mutant_run("optimizer.safetensors", 12, resume_mutant)

# ---- metadata: edited, checksums recomputed ----------------------------------------------------------------------
def meta_case(file, edit, tool, names):
    copy = os.path.join(T, "meta-run")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(RUN, copy)
    step = os.path.join(copy, os.path.basename(STEP))
    resign(os.path.join(step, file), edit)
    if tool == "sample":
        args = [SAMPLE, "--checkpoint", copy] + sample_args
    else:
        args = [BIN, "--data", TEXT, "--out", copy, "--resume", "--steps", "4"] + base
    expect_refusal("metadata", args, names)


def swap_records(m):
    d = json.loads(m["mom.data"])
    d["train"], d["val"] = d["val"], d["train"]
    m["mom.data"] = json.dumps(d)


meta_case("model.safetensors", lambda m: m.update({"mom.tokenizer": "gpt2"}), "sample",
          ["mom.tokenizer is 'gpt2' but the data it trained on was tokenized by 'byte'"])
meta_case("model.safetensors", lambda m: (m.update({"mom.tokenizer": "gpt2"}), m.pop("mom.data")), "sample",
          ["has 50257 tokens, more than the model's vocabulary"])
meta_case("model.safetensors", lambda m: m.update({"mom.data": "[[["}), "sample", ["mom.data is malformed"])
meta_case("model.safetensors", lambda m: m.update({"mom.arch": "small"}), "sample", ["different architecture"])
meta_case("model.safetensors", lambda m: m.update({"mom.tokenizer": "gpt2"}), "resume", ["is not the file optimizer"])
meta_case("model.safetensors", lambda m: m.update({"mom.step": "99"}), "resume", ["at step 99"])
meta_case("model.safetensors", lambda m: m.update({"mom.checkpoint_id": "1"}), "resume", ["different saves"])
meta_case("model.safetensors", swap_records, "resume", ["is not the file optimizer"])
meta_case("optimizer.safetensors", lambda m: m.update({"mom.model_checksum": "xxh64:0000000000000000"}), "resume",
          ["is not the file optimizer"])
meta_case("optimizer.safetensors", lambda m: m.update({"mom.sampler_state": "1 2 3"}), "resume", ["mom.sampler_state"])
meta_case("optimizer.safetensors", lambda m: m.update({"mom.ranks": "2"}), "resume", ["ranks"])

# ---- resume: what would change the run ---------------------------------------------------------------------------
def resume_copy():
    copy = os.path.join(T, "resume-run")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(RUN, copy)
    return copy


resume = lambda copy: [BIN, "--data", TEXT, "--out", copy, "--resume", "--steps", "4"] + base
copy = resume_copy()
data = os.path.join(copy, "data")
os.rename(os.path.join(data, "train.bin"), os.path.join(data, "x"))
os.rename(os.path.join(data, "val.bin"), os.path.join(data, "train.bin"))
os.rename(os.path.join(data, "x"), os.path.join(data, "val.bin"))
expect_refusal("resume", resume(copy), ["training and validation files are swapped"])
copy = resume_copy()
os.remove(os.path.join(copy, "data", "val.bin"))
expect_refusal("resume", resume(copy), ["validated on a file of"])
copy = resume_copy()
tok = bytearray(open(os.path.join(copy, "data", "train.bin"), "rb").read())
tok[64:66] = (ord("Z")).to_bytes(2, "little") if tok[64:66] != b"Z\0" else b"Y\0"
open(os.path.join(copy, "data", "train.bin"), "wb").write(bytes(tok))
expect_refusal("resume", resume(copy), ["is not the file this run trained on"])
copy = resume_copy()
for extra, names in ((["--seed", "5"], ["--seed"]), (["--tokenizer", "gpt2"], ["--tokenizer"]),
                     (["--val-fraction", "0.5"], ["--val-fraction"]), (["--arch", "small"], ["different architecture"])):
    args = resume(copy)
    if extra[0] in args:
        args[args.index(extra[0]) + 1] = extra[1]
    else:
        args += extra
    expect_refusal("resume", args, names)
other = os.path.join(T, "other.txt")
shutil.copy(TEXT, other)
open(other, "a").write("And more.\n")
args = resume(copy)
args[args.index(TEXT)] = other
expect_refusal("resume", args, ["is not the data this run trained on"])
rc, out, err = run(resume(copy) + ["--lr", "0.001"], 300)  # a schedule change: accepted, and said
record("resume", "accepted" if rc == 0 and "lr 0.002 -> 0.001" in out else "unclear", "--resume --lr 0.001", out + err)

# ---- divergence -------------------------------------------------------------------------------------------------
copy = resume_copy()
div = [BIN, "--data", TEXT, "--out", copy, "--resume", "--steps", "60", "--lr", "1e6", "--warmup", "0",
       "--grad-clip", "0", "--weight-decay", "0", "--checkpoint-interval", "1"] + base
expect_refusal("divergence", div, ["training diverged"], None, 300)
rc, out, err = run([SAMPLE, "--checkpoint", copy] + sample_args)
record("divergence", "accepted" if rc == 0 else "unclear", "sampling latest after divergence", err)

# ---- writers ----------------------------------------------------------------------------------------------------
lock_run = os.path.join(T, "lock")
first = subprocess.Popen([BIN, "--data", TEXT, "--out", lock_run, "--steps", "1000000", "--checkpoint-interval", "0"]
                         + base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(os.path.join(lock_run, "metrics.jsonl"))
                                      and '"type":"train"' in open(os.path.join(lock_run, "metrics.jsonl")).read()):
    time.sleep(0.1)
expect_refusal("writers", [BIN, "--data", TEXT, "--out", lock_run, "--steps", "5"] + base, ["pid %d" % first.pid])
expect_refusal("writers", [BIN, "--data", TEXT, "--out", lock_run, "--steps", "5", "--resume"] + base,
               ["pid %d" % first.pid])
first.send_signal(signal.SIGINT)
record("writers", "accepted" if first.wait(60) == 0 and os.path.exists(os.path.join(lock_run, "latest")) else "unclear",
       "the first writer saving on Ctrl-C")

# ---- the table ----------------------------------------------------------------------------------------------------
shutil.rmtree(T, ignore_errors=True)
outcomes = ["refused", "accepted", "crash", "hang", "silent", "unclear", "wrote"]
print("hostile campaign, seed %d: %d cases" % (SEED, sum(sum(v.values()) for v in tally.values())))
print("%-11s" % "category" + "".join("%9s" % o for o in outcomes))
for category, counts in tally.items():
    print("%-11s" % category + "".join("%9d" % counts.get(o, 0) for o in outcomes))
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)

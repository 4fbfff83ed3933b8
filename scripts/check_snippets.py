#!/usr/bin/env python3
"""Checks that the code the docs quote is code that compiles: every fenced block right after a line
`<!-- snippet: PATH -->` must appear in PATH, line for line in one run (leading and trailing blanks of each line
ignored). PATH is a source file a test compiles (tests/extending/*.cpp, *.hpp), so a quoted snippet is compiled
by CI as long as this check passes. CTest runs it as `docs.snippets`.

  python3 scripts/check_snippets.py [FILE.md ...]     (default: README.md docs/*.md)

Prints FILE:LINE: reason for each snippet not found and exits 1 if there is any.
"""
import glob, os, re, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
files = sys.argv[1:] or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
bad = checked = 0
for doc in files:
    lines = open(doc, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"<!-- snippet: (\S+) -->\s*$", lines[i])
        if not m:
            i += 1
            continue
        where = f"{os.path.relpath(doc, root)}:{i + 1}"
        src = os.path.join(root, m.group(1))
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            print(f"{where}: a snippet marker must be followed by a fenced code block"); bad += 1; i += 1; continue
        j = i + 2
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        block = [l.strip() for l in lines[i + 2:j] if l.strip()]
        if not os.path.isfile(src):
            print(f"{where}: missing {m.group(1)}"); bad += 1
        else:
            code = [l.strip() for l in open(src, encoding="utf-8").read().split("\n") if l.strip()]
            n = len(block)
            if not any(code[k:k + n] == block for k in range(len(code) - n + 1)):
                print(f"{where}: this block is not in {m.group(1)} (the docs quote code a test compiles)"); bad += 1
        checked += 1
        i = j + 1
print(f"snippets: {checked} checked, {bad} not found")
sys.exit(1 if bad else 0)

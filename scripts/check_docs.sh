#!/usr/bin/env bash
# Checks that every repository path the docs name exists, so the docs stand alone.
#
#   bash scripts/check_docs.sh [FILE.md ...]     (default: README.md docs/*.md)
#
# Prints one line per missing path, `FILE:LINE: missing PATH`, and exits 1 if there is any
# (0 otherwise, 2 on a usage error). CTest runs it as `docs.paths`.
#
# What is checked (in prose, tables, inline code and fenced code blocks alike):
#   1. Markdown link and image targets `[text](target)`: always, except URLs (`scheme:...`),
#      in-page anchors (`#...`) and absolute paths; a `#fragment` is dropped first.
#   2. Path-like words, i.e. maximal runs of [A-Za-z0-9_.*/+-] with a `/`, whose first
#      component is one of:
#        - a top-level entry of the repository that git tracks (include, docs, scripts, bench,
#          tests, examples, cmake, ...; without git: the folders next to this script's parent),
#          e.g. `docs/ops.md`, `scripts/demo.sh`, `bench/RESULTS.md`, `tests/compile_fail/`;
#        - an entry of the doc's own folder (e.g. `img/routing_mom8p.svg` from docs/);
#        - `mom`, with a header extension (.hpp .h .cuh .cu): `mom/mom.hpp` is include/mom/mom.hpp;
#        - a layer of the library (core modules routers assembly models train backend), or cpu /
#          cuda, ending in `/` or in a file name with an extension: `models/lm.hpp` is
#          include/mom/models/lm.hpp, `cpu/depth.hpp` is include/mom/backend/cpu/depth.hpp.
#   3. Bare Markdown file names ending in `.md` (`special_cases.md`, `ops.md`).
# A path exists if it exists relative to the repository root or to the doc's own folder; a bare
# `.md` name may also name a file of docs/ (the README's tour lists them so).
#
# Rules that keep out false positives:
#   - Run-time and set-up outputs are never checked: a first component that git does not track
#     (build*/, runs/, data/, third_party/, ...) is not on the list above, so `runs/demo-1/`,
#     `build-demo/`, `data/kjv.txt` are ignored.
#   - URLs and absolute paths: a word starting with `/` (also the `//host/...` of `https://...`,
#     whose `:` ends the word before it) or a `~`, `$`, `}` just before it is not checked
#     (`/usr/include/eigen3`, `${PROJECT_SOURCE_DIR}/scripts/x.sh`, `-Iinclude`).
#   - Placeholders: a word that contains `...` / `…`, or is directly followed by `<` or `{`, or
#     directly preceded by `>` or `}`, is part of a pattern (`tests/compile_fail/<case>.cpp`,
#     `runs/demo-<date>/`, `tests/...`) and is not checked. (`<mom/mom.hpp>` is checked.)
#   - Globs: a word with `*` (`tests/compile_fail/*.cpp`) must match at least one path.
#   - A trailing `.` or `-` (end of a sentence) is not part of the path.
#   - Words without `/` are not checked, except bare `.md` names (rule 3): `kernels.cuh` alone
#     does not say where it lives.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  files=(README.md docs/*.md)
fi

if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  top="$(git -C "$root" ls-files | cut -d/ -f1 | sort -u | tr '\n' ' ')"
else
  top="include docs scripts bench tests examples cmake README.md CMakeLists.txt"
fi

command -v python3 >/dev/null || { echo "check_docs.sh: needs python3" >&2; exit 2; }

MOM_DOC_TOP="$top" python3 - "${files[@]}" <<'PY'
import glob, os, re, sys

top = set(os.environ["MOM_DOC_TOP"].split())
layers = {"core", "modules", "routers", "assembly", "models", "train", "backend"}
backends = {"cpu", "cuda"}
header_ext = (".hpp", ".h", ".cuh", ".cu")

word_re = re.compile(r"[A-Za-z0-9_.*/+-]+")
link_re = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
md_re = re.compile(r"(?<![A-Za-z0-9_./-])([A-Za-z0-9_-]+\.md)(?![A-Za-z0-9_/-])")


def exists(path, docdir):
    cands = [path] if docdir in ("", ".") else [path, os.path.join(docdir, path)]
    for c in cands:
        if "*" in c:
            if glob.glob(c):
                return True
        elif os.path.exists(c):
            return True
    return False


def has_ext(path):
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return path.endswith("/") or "." in last


def resolve(word, docdir, docdir_entries):
    """The path to look for, or None when the word is not a repository path."""
    if "/" not in word or word.startswith("/") or "..." in word:
        return None
    first = word.split("/", 1)[0]
    if first in top or first in docdir_entries:
        return word
    if first == "mom" and word.endswith(header_ext):
        return "include/" + word
    if first in layers and has_ext(word):
        return "include/mom/" + word
    if first in backends and has_ext(word):
        return "include/mom/backend/" + word
    return None


missing = 0
for doc in sys.argv[1:]:
    if not os.path.isfile(doc):
        print(f"check_docs.sh: no such file {doc}", file=sys.stderr)
        sys.exit(2)
    docdir = os.path.dirname(doc)
    docdir_entries = set(os.listdir(docdir)) if docdir not in ("", ".") else set()
    with open(doc, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for no, line in enumerate(lines, 1):
        found = []
        for m in link_re.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            found.append(target)
        for m in word_re.finditer(line):
            word, s, e = m.group(0), m.start(), m.end()
            before = line[s - 1] if s > 0 else ""
            after = line[e] if e < len(line) else ""
            if before in ("~", "$", "}", ">") or after in ("<", "{") or "\u2026" in line[e:e + 1]:
                continue
            word = word.rstrip(".-")
            path = resolve(word, docdir, docdir_entries)
            if path is not None:
                found.append(path)
        bare_md = {m.group(1) for m in md_re.finditer(line)}
        seen = set()
        for path in found + sorted(bare_md):
            if path in seen:
                continue
            seen.add(path)
            if not exists(path, docdir) and not (path in bare_md and exists(path, "docs")):
                print(f"{doc}:{no}: missing {path}")
                missing += 1
sys.exit(1 if missing else 0)
PY

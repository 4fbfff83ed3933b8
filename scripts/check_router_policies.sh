#!/usr/bin/env bash
# Checks that the one list of router policies, MOM_ROUTER_POLICY_NAMES (include/mom/routers/router.hpp), which
# the "unknown router policy" message prints (include/mom/assembly/assembly.hpp), cannot go stale:
#   - every router policy declared under include/mom (a `static constexpr bool is_router_policy = true;`
#     followed within a few lines by its `static constexpr std::string_view name = "...";`) is in the list,
#     as an entry equal to its name or its name with template arguments (`Share` is listed as `Share<P>`);
#   - every entry of the list is such a policy;
#   - the message prints the macro (no second, hand-written list).
# Prints each problem as FILE:LINE: reason and exits 1 if there is any. CTest runs it as lint.router_policies.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "check_router_policies.sh: needs python3" >&2; exit 2; }
python3 - <<'PY'
import pathlib, re, sys

root = pathlib.Path("include/mom")
list_file = root / "routers/router.hpp"
message_file = root / "assembly/assembly.hpp"
problems = []

# The list: the string literals of the #define and its continuation lines, concatenated.
text = list_file.read_text().split("\n")
start = next((i for i, l in enumerate(text) if l.startswith("#define MOM_ROUTER_POLICY_NAMES")), None)
if start is None:
    print(f"{list_file}: no #define MOM_ROUTER_POLICY_NAMES")
    sys.exit(1)
body, i = [], start
while True:
    body.append(text[i])
    if not text[i].rstrip().endswith("\\"):
        break
    i += 1
entries = [e.strip() for e in "".join(re.findall(r'"([^"]*)"', "\n".join(body))).split(",") if e.strip()]

# The policies: is_router_policy = true, then the name within the next few lines.
policies = []  # (name, file, line)
for f in sorted(root.rglob("*.hpp")):
    lines = f.read_text().split("\n")
    for n, l in enumerate(lines):
        if re.search(r"\bis_router_policy\s*=\s*true", l.split("//")[0]):  # code, not comments
            m = next((re.search(r'std::string_view\s+name\s*(?:=\s*|\{)"([^"]+)"', x) for x in lines[n:n + 6]
                      if re.search(r'std::string_view\s+name\s*(?:=\s*|\{)"', x)), None)
            if m is None:
                problems.append(f"{f}:{n + 1}: a router policy without a literal `name` in the next lines "
                                "(the check cannot tell which policy it is)")
            else:
                policies.append((m.group(1), f, n + 1))

def lists(entry, name):
    return entry == name or (entry.startswith(name + "<") and "<" not in name)

for name, f, n in policies:
    if not any(lists(e, name) for e in entries):
        problems.append(f"{f}:{n}: router policy {name} is missing from MOM_ROUTER_POLICY_NAMES ({list_file})")
for e in entries:
    if not any(lists(e, name) for name, _, _ in policies):
        problems.append(f"{list_file}:{start + 1}: MOM_ROUTER_POLICY_NAMES lists {e}, which no policy under "
                        f"{root} declares")
if not re.search(r'unknown router policy; known: "\s*MOM_ROUTER_POLICY_NAMES', message_file.read_text()):
    problems.append(f"{message_file}: the unknown-router-policy message does not print MOM_ROUTER_POLICY_NAMES")

for p in problems:
    print(p)
if problems:
    sys.exit(1)
print(f"router policies ok ({len(policies)} policies, all listed)")
PY

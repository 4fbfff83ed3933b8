#!/usr/bin/env bash
# Checks the layering of include/mom (docs/design.md): dependencies point down only,
#   core -> backend -> modules -> routers -> assembly -> models -> infer -> train -> testing
# (a header may include headers of its own layer and of the layers to its left; both "mom/..." and <mom/...>
# includes are read), and no header
# outside modules/ and models/ names a concrete module type (modules::Attention,
# modules::FeedForward): executors reach modules through the concepts of modules/module.hpp.
# Prints each violation as FILE:LINE: reason and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."
layers=(core backend modules routers assembly models infer train testing)
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
fail=0
while IFS= read -r f; do
  rel=${f#include/mom/}
  layer=${rel%%/*}
  [ "$layer" = "$rel" ] && continue  # include/mom/mom.hpp: the umbrella header includes everything
  r=$(rank "$layer")
  [ "$r" -lt 0 ] && continue
  while IFS=: read -r line inc; do
    dep=$(sed -E 's/.*["<]mom\/([a-z_]+)\/.*/\1/' <<<"$inc")
    d=$(rank "$dep")
    if [ "$d" -gt "$r" ]; then
      echo "$f:$line: $layer/ includes $dep/ (dependencies point down: ${layers[*]})"
      fail=1
    fi
  done < <(grep -n '#include ["<]mom/[a-z_]*/' "$f" | cut -d: -f1,2-)
done < <(find include/mom -name '*.hpp' -o -name '*.cuh' | sort)
while IFS= read -r hit; do
  echo "$hit: names a concrete module outside modules/ and models/ (use the module concepts)"
  fail=1
done < <(grep -rn 'modules::Attention\|modules::FeedForward' include/mom | grep -v '^include/mom/modules/\|^include/mom/models/')
[ "$fail" -eq 0 ] && echo "layering ok"
exit "$fail"

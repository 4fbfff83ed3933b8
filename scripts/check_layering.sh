#!/usr/bin/env bash
# Checks the layering of include/mom (docs/design.md): dependencies point down only,
#   core -> backend -> routing -> modules -> routers -> assembly -> models -> infer -> train -> testing
# (a header may include headers of its own layer and of the layers to its left; both "mom/..." and <mom/...>
# includes are read, in every .hpp, .cuh and .cu file under include/mom, train/ and the CUDA kernels included),
# and no header outside modules/ and models/ names a concrete module type (modules::Attention,
# modules::FeedForward): executors reach modules through the concepts of modules/module.hpp.
# infer/ sits below train/ because a training loop may sample through the Decoder (train/ includes no infer/
# header today; infer/ may never include train/). A folder of include/mom or an included mom/<folder>/ that is
# not in the list above is a violation too, so a new layer cannot escape the check: add it in its place.
# The umbrella headers at the top (mom/mom.hpp, mom/testing.hpp) are not checked: they include their layers.
# Prints each violation as FILE:LINE: reason and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."
layers=(core backend routing modules routers assembly models infer train testing)
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
fail=0
while IFS= read -r f; do
  rel=${f#include/mom/}
  layer=${rel%%/*}
  [ "$layer" = "$rel" ] && continue  # include/mom/mom.hpp: the umbrella header includes everything
  r=$(rank "$layer")
  if [ "$r" -lt 0 ]; then
    echo "$f:1: $layer/ is not a layer of the check (${layers[*]}): add it in its place"
    fail=1
    continue
  fi
  while IFS=: read -r line inc; do
    dep=$(sed -E 's/.*["<]mom\/([a-z_]+)\/.*/\1/' <<<"$inc")
    d=$(rank "$dep")
    if [ "$d" -lt 0 ]; then
      echo "$f:$line: includes mom/$dep/, which is not a layer of the check (${layers[*]})"
      fail=1
    elif [ "$d" -gt "$r" ]; then
      echo "$f:$line: $layer/ includes $dep/ (dependencies point down: ${layers[*]})"
      fail=1
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]mom/[a-z_]+/' "$f")
done < <(find include/mom \( -name '*.hpp' -o -name '*.cuh' -o -name '*.cu' \) | sort)
while IFS= read -r hit; do
  echo "$hit: names a concrete module outside modules/ and models/ (use the module concepts)"
  fail=1
done < <(grep -rn 'modules::Attention\|modules::FeedForward' include/mom | grep -v '^include/mom/modules/\|^include/mom/models/')
[ "$fail" -eq 0 ] && echo "layering ok"
exit "$fail"

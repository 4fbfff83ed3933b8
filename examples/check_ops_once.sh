#!/usr/bin/env bash
# mom-train compiles the CPU backend's ops on float once, in cpu_ops.cpp: the other units declare
# mom::cpu::Backend<float> extern (backend_cpu.hpp; mom/backend/cpu/backend_impl.hpp). An op defined inside the class
# again would be inline, and every family unit would compile it again (a fifth of the build's CPU time: 763 s against 604 s, bench/RESULTS.md). This
# fails when an object other than cpu_ops.cpp's defines an op (a Backend<float> member other than the memory helpers,
# or a mom::cpu function on float), and when cpu_ops.cpp's defines none (the pattern no longer sees them).
#   check_ops_once.sh <folder of mom_train_objects' object files>
set -euo pipefail
dir=${1:?usage: check_ops_once.sh <object folder>}
op='^[0-9a-f]+ [tTwW] (\S+ )?mom::cpu::(Backend<float>::)?[A-Za-z_:]*[A-Za-z_](<float>)?\('
memory='mom::cpu::Backend<float>::(copy|zero|fill|alloc|alloc_host|read|to_host|from_host)[<(]'
shopt -s nullglob
objects=("$dir"/*.o)
[ ${#objects[@]} -gt 0 ] || { echo "check_ops_once: no object files in $dir"; exit 1; }
found_once=0 bad=0
for o in "${objects[@]}"; do
  n=$(nm -C --defined-only "$o" | grep -E "$op" | grep -vcE "$memory" || true)
  case "$(basename "$o")" in
    cpu_ops.cpp.o) found_once=$n ;;
    *) if [ "$n" -gt 0 ]; then
         echo "check_ops_once: $(basename "$o") defines $n CPU op(s) on float, e.g.:"
         nm -C --defined-only "$o" | grep -E "$op" | grep -vE "$memory" | head -3 | cut -c 1-200
         bad=1
       fi ;;
  esac
done
[ "$found_once" -gt 0 ] || { echo "check_ops_once: cpu_ops.cpp.o defines no CPU op (is the pattern stale?)"; exit 1; }
[ $bad -eq 0 ] || exit 1
echo "check_ops_once: the CPU ops on float are defined in cpu_ops.cpp.o only ($found_once symbols), ${#objects[@]} objects"

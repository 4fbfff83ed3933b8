#!/usr/bin/env bash
# mom vs PyTorch on the same CPU, same model (dense 8 layers, d 256, seq 256, batch 16), same threads, in one run:
# the two benches alternate ROUNDS times so that machine load hits both alike; prints every measurement and the
# median tokens/s ratio. Needs bench_train_step (build with -DMOM_BUILD_BENCH=ON) and python3-torch.
#
#   bash bench/compare_pytorch.sh <build-dir> [threads=2] [rounds=3]
set -euo pipefail
build=${1:?usage: compare_pytorch.sh <build-dir> [threads] [rounds]}
threads=${2:-2}
rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "needs python3-torch (apt-get install python3-torch)"; exit 1; }
echo "environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, $threads threads, $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
mom=() torch=()
for r in $(seq "$rounds"); do
  t=$(OMP_NUM_THREADS=$threads "$build/bench/bench_train_step" --only dense --reps 5 | awk -F'|' '!found && /^\| dense/ {gsub(/ /,"",$5); print $5; found=1}')
  p=$(OMP_NUM_THREADS=$threads "$py" "$here/pytorch_train_step.py" --threads "$threads" --reps 5 | sed -n 's/.*), \([0-9]*\) tokens\/s/\1/p')
  echo "round $r: mom $t tokens/s, pytorch $p tokens/s"
  mom+=("$t") torch+=("$p")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m=$(median "${mom[@]}") p=$(median "${torch[@]}")
awk -v m="$m" -v p="$p" 'BEGIN {printf "median: mom %d tokens/s, pytorch %d tokens/s, ratio %.2fx\n", m, p, m / p}'

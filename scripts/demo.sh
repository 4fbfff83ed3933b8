#!/usr/bin/env bash
# The README's first command: set up (if needed), build, then train the default small model on the King James
# Bible for a few minutes, printing progress, the final validation loss (against the corpus' unigram entropy)
# and a sample of generated text.
#
#   scripts/demo.sh                      # default: 'tiny' byte-level model, MOM_DEMO_STEPS steps
#   MOM_DEMO_STEPS=2000 scripts/demo.sh  # longer
#   MOM_DEMO_ARCH=small scripts/demo.sh
#
# Output goes to runs/demo-<date>/ (checkpoints, metrics.jsonl, loss.svg); an existing run is never touched.
# Continue a run:  build-demo/examples/mom-train --data data/kjv.txt --out runs/demo-... --resume --steps 3000
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
steps="${MOM_DEMO_STEPS:-1200}"
arch="${MOM_DEMO_ARCH:-tiny}"
threads="${OMP_NUM_THREADS:-$(nproc 2>/dev/null || echo 2)}"

need_setup=0
for tool in cmake g++ bible python3; do command -v "$tool" >/dev/null 2>&1 || need_setup=1; done
for f in /usr/include/eigen3/Eigen/Core /usr/include/CLI/CLI.hpp /usr/include/nlohmann/json.hpp; do
  [ -e "$f" ] || need_setup=1
done
if [ "$need_setup" = 1 ]; then
  echo "== setting up (scripts/setup.sh)"
  bash scripts/setup.sh
fi

# The CUDA backend (mom-train --device cuda) only where there is a GPU to run it: it adds minutes to the build.
cuda=OFF
if nvidia-smi -L >/dev/null 2>&1 && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then cuda=ON; fi
echo "== building mom-train (build-demo/; CUDA backend $cuda)"
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DMOM_BUILD_TESTS=OFF -DMOM_BUILD_BENCH=OFF -DMOM_CUDA=$cuda >/dev/null
cmake --build build-demo -j "$(nproc 2>/dev/null || echo 2)" --target mom-train >/dev/null

mkdir -p data runs
if [ ! -s data/kjv.txt ]; then
  echo "== writing the King James Bible to data/kjv.txt (bible Gen1:1-Rev22:21)"
  bible Gen1:1-Rev22:21 >data/kjv.txt
fi

out="runs/demo-$(date +%Y%m%d-%H%M%S)"
echo "== training '$arch' for $steps steps on $threads threads -> $out"
OMP_NUM_THREADS="$threads" build-demo/examples/mom-train --data data/kjv.txt --arch "$arch" --steps "$steps" \
  --out "$out" --sample-tokens 300 --prompt "And God said" --temperature 0.8

python3 scripts/plot_runs.py "$out" -o "$out/loss.svg" --smooth 10 --title "mom-train $arch on KJV" >/dev/null &&
  echo "loss curves: $out/loss.svg (scripts/plot_runs.py)"
echo "sample again: build-demo/examples/mom-sample --checkpoint $out --prompt 'In the beginning' --tokens 300"
echo "== demo wall time $((SECONDS - start)) s"

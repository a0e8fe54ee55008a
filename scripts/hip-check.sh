#!/usr/bin/env bash
# The HIP build of attnd with CMake (-DATTND_GPU=hip, cmake/hip.cmake) and Debian's ROCm 5.2
# (hipcc and its clang 15): the portable GPU kernels, the daemon's GPU runtime, attnd and attnctl,
# and tests/hip/runtime_check.cc, for gfx90a by default. Debian's ROCm 5.2 does not know gfx950
# (the MI355X's arch): the same sources build for it with a ROCm >= 6.4 toolchain (the ROCm
# image). CUDA-only code sits behind `#if defined(ATTND_GPU_CUDA)` and compiles to nothing here.
# Not part of .ci/run (hipcc and its LLVM are a large install, the build a few more minutes);
# run it by hand:
#   scripts/hip-check.sh [--arch gfx90a] [--build-dir build-hip]
# Environment: ATTND_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=gfx90a
BUILD_DIR=build-hip
while (($#)); do
  case "$1" in
    --arch) ARCH="${2:?--arch needs a value}"; shift ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift ;;
    *) echo "hip-check: unknown argument '$1' (want --arch ARCH, --build-dir DIR)" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v hipcc >/dev/null && [ ! -x /opt/rocm/llvm/bin/clang++ ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends hipcc
fi
ATTND_SKIP_BUILD=1 scripts/setup.sh

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTND_GPU=hip \
  -DATTND_HIP_ARCH="$ARCH" -DATTND_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j "${ATTND_JOBS:-$(nproc)}" \
  --target attn_kernels attnd attnctl hip_runtime_check
echo "hip-check: attnd, attnctl, the kernels and the runtime check build for $ARCH" \
     "($(( $(date +%s) - start )) s, in $BUILD_DIR)"

#!/usr/bin/env bash
# The AMD compile gate: every kernel source under kernels/, the daemon (attnd) and attnctl built as
# HIP for gfx90a (MI200), gfx942 (MI300) and gfx950 (MI355X) in one CMake build
# (-DATTND_GPU=hip, cmake/hip.cmake) with the project's -Werror, by the pinned clang 22 toolchain
# that scripts/setup-hip-toolchain.sh installs (run here when needed; docs/HIP.md). Compile and
# link only: no AMD GPU runs here. Exits non-zero when anything fails to compile or a kernel .cu
# is left out of the build; prints its time.
#   scripts/hip-check.sh [--arch "gfx90a;gfx942;gfx950"] [--build-dir build-hip] [--no-tests]
# --no-tests leaves out tests/hip/runtime_check.cc (the one HIP test source; a few seconds).
# Environment: ATTND_JOBS (default nproc), ATTND_HIP_TOOLCHAIN (the toolchain prefix, default
# ~/.cache/attnd-hip/toolchain), ATTND_HIP_CACHE (its download cache).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH="gfx90a;gfx942;gfx950"
BUILD_DIR=build-hip
TARGETS=(attn_kernels attnd attnctl hip_runtime_check)
while (($#)); do
  case "$1" in
    --arch) ARCH="${2:?--arch needs a value}"; shift ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift ;;
    --no-tests) TARGETS=(attn_kernels attnd attnctl) ;;
    *)
      echo "hip-check: unknown argument '$1' (want --arch ARCHS, --build-dir DIR, --no-tests)" >&2
      exit 2
      ;;
  esac
  shift
done
start=$(date +%s)
JOBS="${ATTND_JOBS:-$(nproc)}"
# ccache's results then serve every clone of the repository (CI clones afresh).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

ATTND_SKIP_BUILD=1 scripts/setup.sh  # the Debian packages of the CPU build (gRPC, Abseil, ...)
TOOLCHAIN="$(scripts/setup-hip-toolchain.sh | tail -1)"
setup_s=$(($(date +%s) - start))

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DATTND_GPU=hip -DATTND_HIP_ARCH="$ARCH"
  -DATTND_HIP_TOOLCHAIN="$TOOLCHAIN" -DATTND_BUILD_BENCH=OFF)
mkdir -p "$BUILD_DIR"
if ! cmake -S . -B "$BUILD_DIR" -G Ninja "${cmake_args[@]}" >"$BUILD_DIR/hip-check-configure.log" 2>&1 ||
  ! grep -qxF "set(CMAKE_HIP_COMPILER \"$TOOLCHAIN/bin/clang++\")" \
    "$BUILD_DIR"/CMakeFiles/[0-9]*/CMakeHIPCompiler.cmake; then
  cat "$BUILD_DIR/hip-check-configure.log"
  echo "hip-check: FAILED: cmake did not configure $BUILD_DIR for $TOOLCHAIN/bin/clang++ (a" \
    "folder configured for another HIP compiler must be removed first)" >&2
  exit 1
fi
# Objects built by an earlier toolchain are rebuilt (CMake does not track the compiler's files).
# Only the build folder's object files go: the "clean" target would also delete the outputs that
# this build writes into the source tree (client/python/attnd_client/_gen/, the Python stubs
# every build folder shares), and the Python tests would then fail to import.
if ! cmp -s "$TOOLCHAIN/stamp" "$BUILD_DIR/hip-toolchain.stamp"; then
  find "$BUILD_DIR" -name '*.o' -type f -delete
  cp "$TOOLCHAIN/stamp" "$BUILD_DIR/hip-toolchain.stamp"
fi
if ! nice -n 10 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"; then
  echo "hip-check: FAILED: the HIP build ($ARCH) does not compile ($(($(date +%s) - start)) s)" >&2
  exit 1
fi

# Every kernel source must be part of the build (a .cu missing from its sources.cmake would
# otherwise never be compiled for AMD).
targets="$(ninja -C "$BUILD_DIR" -t targets all)"
missing=()
while IFS= read -r cu; do
  grep -qF "kernels/CMakeFiles/attn_kernels.dir/${cu#kernels/}.o: HIP_COMPILER" <<<"$targets" ||
    missing+=("$cu")
done < <(find kernels -name '*.cu' | sort)
if ((${#missing[@]})); then
  echo "hip-check: FAILED: not compiled as HIP (not in attn_kernels): ${missing[*]}" >&2
  exit 1
fi
echo "hip-check: ${TARGETS[*]} build for $ARCH ($(($(date +%s) - start)) s, of which" \
  "toolchain setup ${setup_s} s; in $BUILD_DIR)"

#!/usr/bin/env bash
# The whole test suite: set up (install + build), then every registered test via ctest; then,
# where the CUDA toolkit is installed, the CUDA build (-DATTND_GPU=cuda: kernels, GPU runtime,
# daemon, GPU tests and benchmarks) is compiled too, so that GPU code cannot rot where no GPU runs
# it (CI). Its binaries are not run here. Exits non-zero when any test fails or the CUDA build
# does not compile.
#   scripts/test.sh
#   ATTND_TEST_CUDA=0 scripts/test.sh     # skip the CUDA build
# Environment: ATTND_BUILD_DIR (default build), ATTND_CUDA_BUILD_DIR (default build-cuda, the
# folder scripts/device-bundle.sh bundles from), ATTND_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR="${ATTND_BUILD_DIR:-build}"
JOBS="${ATTND_JOBS:-$(nproc)}"
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900) || rc=1

if [ "${ATTND_TEST_CUDA:-1}" != 0 ]; then
  NVCC="$(command -v nvcc || true)"
  if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
  if [ -n "$NVCC" ]; then
    CUDA_DIR="${ATTND_CUDA_BUILD_DIR:-build-cuda}"
    echo "test: compiling the CUDA build in $CUDA_DIR with $NVCC (ATTND_TEST_CUDA=0 skips it)"
    start=$(date +%s)
    cuda_args=(-DCMAKE_BUILD_TYPE=Release -DATTND_GPU=cuda)
    # The compiler only for a new folder: naming another path for it resets a configured one.
    [ -f "$CUDA_DIR/CMakeCache.txt" ] || cuda_args+=(-DCMAKE_CUDA_COMPILER="$NVCC")
    if cmake -S . -B "$CUDA_DIR" -G Ninja "${cuda_args[@]}" &&
       cmake --build "$CUDA_DIR" -j "$JOBS"; then
      echo "test: the CUDA build compiles ($(( $(date +%s) - start )) s)"
    else
      echo "test: FAILED: the CUDA build does not compile"
      rc=1
    fi
  else
    echo "test: no nvcc here: the CUDA build was not compiled"
  fi
fi
exit "$rc"

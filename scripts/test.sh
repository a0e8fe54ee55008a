#!/usr/bin/env bash
# The whole test suite, in this order (each step timed; a failed step does not stop the others):
#   1. setup: install the Debian/PyPI packages and build ./build (scripts/setup.sh)
#   2. lint: the format and lint gate (scripts/lint.sh)
#   3. ctest: every registered test of the CPU build
#   4. thread-safety: clang -Wthread-safety over the host C++ (scripts/thread-safety.sh)
#   5. cuda: where the CUDA toolkit is installed, the CUDA build (-DATTND_GPU=cuda: kernels, GPU
#      runtime, daemon, GPU tests and benchmarks) is compiled so that GPU code cannot rot where no
#      GPU runs it (CI); its binaries are not run here. Fails where ptxas reports that it
#      serialised a kernel's wgmma instructions
#   6. hip: every kernel source, the daemon and attnctl compiled as HIP for gfx90a, gfx942 and
#      gfx950 (scripts/hip-check.sh; docs/HIP.md)
#   7. asan: the clang AddressSanitizer + UndefinedBehaviorSanitizer build (build-fuzz) of the
#      daemon, the server unit tests and the fuzz targets; the unit tests, the fuzz corpora and
#      the request-handling integration tests run against it (scripts/fuzz.sh; docs/FUZZING.md)
#   8. fuzz: each libFuzzer target for ATTND_FUZZ_SECONDS (default 30) from its corpus
# Exits non-zero when any step fails.
#   scripts/test.sh
#   ATTND_TEST_CUDA=0 ATTND_TEST_HIP=0 scripts/test.sh     # skip steps (LINT, TSA, CUDA, HIP,
#                                                          # ASAN, FUZZ)
# Environment: ATTND_BUILD_DIR (default build), ATTND_CUDA_BUILD_DIR (default build-cuda, the
# folder scripts/device-bundle.sh bundles from), ATTND_JOBS (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUILD_DIR="${ATTND_BUILD_DIR:-build}"
JOBS="${ATTND_JOBS:-$(nproc)}"
# ccache keys on paths below this folder relatively, so a fresh clone reuses earlier objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

SUMMARY=()
rc=0
# step NAME COMMAND...: runs COMMAND, records its result and time.
step() {
  local name=$1 start status
  shift
  echo "test: == $name =="
  start=$(date +%s)
  "$@"
  status=$?
  local took=$(($(date +%s) - start))
  if ((status == 0)); then
    SUMMARY+=("$name ok (${took} s)")
  else
    SUMMARY+=("$name FAILED rc $status (${took} s)")
    rc=1
  fi
  echo "test: $name finished with rc $status in ${took} s"
  return "$status"
}
# enabled VAR: whether the step switched by ATTND_TEST_<VAR> runs (default yes).
enabled() {
  local var="ATTND_TEST_$1"
  [ "${!var:-1}" != 0 ]
}

find_nvcc() {
  local nvcc
  nvcc="$(command -v nvcc || true)"
  if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  echo "$nvcc"
}

# shellcheck disable=SC2317  # invoked through step
cuda_build() {
  local nvcc=$1 dir="${ATTND_CUDA_BUILD_DIR:-build-cuda}"
  local args=(-DCMAKE_BUILD_TYPE=Release -DATTND_GPU=cuda)
  # The compiler only for a new folder: naming another path for it resets a configured one.
  [ -f "$dir/CMakeCache.txt" ] || args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  cmake -S . -B "$dir" -G Ninja "${args[@]}" || return
  local log="$dir/cuda-build-output.log"
  cmake --build "$dir" -j "$JOBS" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  ((status == 0)) || return "$status"
  # A wgmma kernel that ptxas serialises still builds and passes its tests, only several times
  # slower: fail on the message (docs/KERNELS.md "MLA prefill on Hopper"). Objects rebuilt in
  # this run (or replayed by ccache) print it; an up-to-date build prints nothing.
  if grep -n "wgmma.mma_async instructions are serialized" "$log"; then
    echo "test: ptxas serialised the wgmma instructions of a kernel above"
    return 1
  fi
}

if ! step setup scripts/setup.sh; then
  printf 'test: %s\n' "${SUMMARY[@]}"
  exit 1
fi
if enabled LINT; then step lint scripts/lint.sh; fi
step ctest bash -c "cd '$BUILD_DIR' && ctest --output-on-failure -j '$JOBS' --timeout 900"
if enabled TSA; then step thread-safety scripts/thread-safety.sh; fi
if enabled CUDA; then
  NVCC="$(find_nvcc)"
  if [ -n "$NVCC" ]; then
    step cuda cuda_build "$NVCC"
  else
    echo "test: no nvcc here: the CUDA build was not compiled"
  fi
fi
if enabled HIP; then step hip scripts/hip-check.sh; fi
if enabled ASAN; then step asan scripts/fuzz.sh asan; fi
if enabled FUZZ; then step fuzz scripts/fuzz.sh fuzz "${ATTND_FUZZ_SECONDS:-30}"; fi

echo "test: summary:"
printf 'test:   %s\n' "${SUMMARY[@]}"
exit "$rc"

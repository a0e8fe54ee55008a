#!/usr/bin/env bash
# Compiles attnd's portable GPU kernels and GPU runtime code with Debian's hipcc for gfx90a
# (Debian's ROCm 5.2 does not know gfx950, the MI355X's arch; the same sources build for it with
# a ROCm >= 6.3 toolchain). CUDA-only code sits behind `#if defined(ATTND_GPU_CUDA)` and compiles
# to nothing here. Not part of .ci/run (hipcc and its LLVM are a large install); run it by hand:
#   scripts/hip-check.sh [--arch gfx90a]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=gfx90a
[ "${1:-}" = "--arch" ] && ARCH="$2"

if ! command -v hipcc >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends hipcc
fi
ATTND_SKIP_BUILD=1 scripts/setup.sh

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# The kernels, the daemon's GPU runtime (server/engine/gpu, host code on the gpu:: wrappers) and
# the fused DSA layer's GPU composition.
mapfile -t SOURCES < <(ls kernels/*/gpu/*.cu server/engine/gpu/*.cc 2>/dev/null
                       echo kernels/dsa/gpu.cc; echo tests/hip/runtime_check.cc)
fail=0
for src in "${SOURCES[@]}"; do
  [ -f "$src" ] || continue
  obj="$OUT/$(echo "$src" | tr '/' '_').o"
  if hipcc -x hip --offload-arch="$ARCH" -std=c++17 -O2 -I. -DATTND_GPU_HIP -Wall -Werror \
       -Wno-unused-command-line-argument -c "$src" -o "$obj" 2> "$obj.log"; then
    echo "ok    $src"
  else
    echo "FAIL  $src"
    grep -v rocm_agent_enumerator "$obj.log" | head -30
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "hip-check: every portable source compiles for $ARCH"
exit $fail

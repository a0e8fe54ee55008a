#!/usr/bin/env bash
# A device bundle of attn_gpu_bench built at another revision, the base of the pending list's
# `abbench` lines (docs/BENCHMARKS.md "The pending list"): a temporary git worktree at REV, its
# own CUDA build folder (ccache makes a rebuild of unchanged sources cheap), and
# scripts/device-bundle.sh of that worktree, packed as OUT (default devtmp/base.tar.xz; carry it
# beside the main bundle and pass it as ATTND_PENDING_BASE).
#   scripts/device-base-bundle.sh REV [OUT]
# Environment: CUDACXX (default /usr/local/cuda/bin/nvcc), ATTND_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:?usage: scripts/device-base-bundle.sh REV [OUT]}"
OUT="${2:-devtmp/base.tar.xz}"
# shellcheck source=scripts/worktree-lib.sh
source scripts/worktree-lib.sh
temp_worktree "$REV" device-base-bundle  # WORK, TREE
(
  cd "$TREE"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTND_GPU=cuda \
    -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" > /dev/null
  cmake --build build-cuda --target attn_gpu_bench -j "${ATTND_JOBS:-$(nproc)}"
  ATTND_CUDA_BUILD_DIR=build-cuda ATTND_BUNDLE_SKIP_BUILD=1 ATTND_BUNDLE_ONLY=attn_gpu_bench \
    scripts/device-bundle.sh "$WORK/base"
)
mkdir -p "$(dirname "$OUT")"
tar cJf "$OUT" -C "$WORK" base
echo "device-base-bundle: $OUT (attn_gpu_bench at $(git rev-parse --short "$REV"))"

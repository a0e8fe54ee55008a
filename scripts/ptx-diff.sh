#!/usr/bin/env bash
# Proves a kernel refactor changed no code: compiles CUDA sources of the working tree and of a
# base revision (a temporary git worktree) to PTX for both targets the build embeds (sm_90a and
# compute_80, the flags of cmake/attnd.cmake without -lineinfo), compares the PTX with source
# line records and comments stripped, and where the PTX differs assembles both with ptxas and
# compares the cubins. Prints one line per source and target: "same" (PTX identical), "same
# code" (PTX differs, cubins byte-identical: e.g. instruction order that ptxas schedules away) or
# "DIFFERENT". Exits 1 when any source is DIFFERENT, 2 on usage or compile errors.
# docs/KERNELS.md "Moving kernel code".
#   scripts/ptx-diff.sh [--base REV] [FILE.cu ...]
# --base: the revision to compare with (default HEAD). Files: paths relative to the repository
# root (default: every tracked .cu under kernels/; a few minutes on two cores).
# Environment: ATTND_JOBS (parallel compiles, default nproc), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BASE=HEAD
FILES=()
while (($#)); do
  case "$1" in
    --base) BASE="${2:?--base needs a revision}"; shift ;;
    -*)
      echo "ptx-diff: unknown option '$1' (want --base REV, then .cu files)" >&2
      exit 2
      ;;
    *) FILES+=("$1") ;;
  esac
  shift
done
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC="$CUDA_HOME/bin/nvcc"
PTXAS="$CUDA_HOME/bin/ptxas"
if [ ! -x "$NVCC" ] || [ ! -x "$PTXAS" ]; then
  echo "ptx-diff: no nvcc/ptxas under $CUDA_HOME" >&2
  exit 2
fi
if ((${#FILES[@]} == 0)); then
  mapfile -t FILES < <(git ls-files 'kernels/*.cu')
fi
JOBS="${ATTND_JOBS:-$(nproc)}"
# shellcheck source=scripts/worktree-lib.sh
source "$(dirname "$0")/worktree-lib.sh"
temp_worktree "$BASE" ptx-diff  # WORK, TREE
BASE_TREE="$TREE"

# compile TREE FILE TARGET OUT: PTX of FILE in TREE for TARGET (sm_90a or compute_80).
# shellcheck disable=SC2317  # called through xargs
compile() {
  local tree=$1 file=$2 target=$3 out=$4 arch
  if [ "$target" = sm_90a ]; then arch=compute_90a; else arch=compute_80; fi
  "$NVCC" -DATTND_GPU_CUDA -I"$tree" -isystem="$CUDA_HOME/include" -O3 -DNDEBUG \
    --expt-relaxed-constexpr -std=c++17 -arch="$arch" -ptx -x cu "$tree/$file" -o "$out"
}
strip_ptx() { grep -v -E '^\s*(\.loc|\.file|//)' "$1" || true; }

export -f compile
export NVCC CUDA_HOME
fail=0
for target in sm_90a compute_80; do
  jobs_list=()
  for f in "${FILES[@]}"; do
    [ -f "$ROOT/$f" ] || { echo "ptx-diff: no file $f in the working tree" >&2; exit 2; }
    n=$(echo "$f" | tr '/' '_')
    jobs_list+=("$ROOT $f $target $WORK/$n.$target.new.ptx")
    if [ -f "$BASE_TREE/$f" ]; then
      jobs_list+=("$BASE_TREE $f $target $WORK/$n.$target.base.ptx")
    fi
  done
  # shellcheck disable=SC2016  # the arguments expand in the child shell
  printf '%s\n' "${jobs_list[@]}" |
    xargs -P "$JOBS" -L 1 bash -c 'compile "$0" "$1" "$2" "$3"' ||
    { echo "ptx-diff: a compile failed" >&2; exit 2; }
  for f in "${FILES[@]}"; do
    n=$(echo "$f" | tr '/' '_')
    new="$WORK/$n.$target.new.ptx" base="$WORK/$n.$target.base.ptx"
    if [ ! -f "$base" ]; then
      echo "$target  new        $f (not in $BASE)"
      continue
    fi
    if cmp -s <(strip_ptx "$base") <(strip_ptx "$new"); then
      echo "$target  same       $f"
      continue
    fi
    if [ "$target" = sm_90a ]; then sm=sm_90a; else sm=sm_80; fi
    "$PTXAS" -arch="$sm" -O3 "$base" -o "$base.cubin"
    "$PTXAS" -arch="$sm" -O3 "$new" -o "$new.cubin"
    if cmp -s "$base.cubin" "$new.cubin"; then
      echo "$target  same code  $f (PTX differs, cubins identical)"
    else
      echo "$target  DIFFERENT  $f"
      fail=1
    fi
  done
done
exit "$fail"

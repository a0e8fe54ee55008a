#!/usr/bin/env bash
# Static checks of the sm_90a SASS of built binaries (docs/KERNELS.md "Finding a hang" and
# "Sparse MLA in ping-pong"). For every kernel it reports a warpgroup MMA group (an HGMMA, or
# QGMMA for fp8 and IGMMA for int8, after the previous group's last, scoreboarded one) that
# ptxas issued with no WARPGROUP.ARRIVE before it. The one such group found so far (the ping-pong kernels of 2f7b7e0, a wgmma group
# without a wgmma.fence before it) was in the build whose first launch failed with an illegal
# instruction; the other sm_90a kernels have none.
#   scripts/sass-check.sh BINARY_OR_CUBIN...
# Exits 0 when every group has its ARRIVE, 1 when a group lacks one (listed per kernel), 2 on
# usage errors or when cuobjdump is missing. cuobjdump: $CUOBJDUMP, else on PATH, else
# $CUDA_HOME/bin (default /usr/local/cuda); the CUDA 13.0 toolkit installed here lacks it, the
# nvidia-cuda-cuobjdump wheel on PyPI has it (nvidia/cu13/bin/cuobjdump).
set -euo pipefail
if (($# == 0)); then
  echo "usage: scripts/sass-check.sh BINARY_OR_CUBIN..." >&2
  exit 2
fi
CUOBJDUMP="${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}"
if [ ! -x "$CUOBJDUMP" ]; then
  echo "sass-check: no cuobjdump (set CUOBJDUMP; see the header of this script)" >&2
  exit 2
fi
status=0
for bin in "$@"; do
  if [ ! -f "$bin" ]; then
    echo "sass-check: $bin: no such file" >&2
    exit 2
  fi
  report=$("$CUOBJDUMP" -sass "$bin" 2>/dev/null | awk '
    /Function : / { fn = $NF; after_group = 0; arrived = 0; next }
    /WARPGROUP\.ARRIVE/ { arrived = 1 }
    /[HQI]GMMA\./ {
      if (after_group && !arrived) { bad[fn]++; hgmma = $0; sub(/^[ \t]*/, "", hgmma); sub(/;.*/, ";", hgmma); first[fn] = hgmma }
      arrived = 0
      after_group = ($0 ~ /gsb0/)
      groups++
    }
    END {
      for (f in bad) printf "  %s: %d group(s) without WARPGROUP.ARRIVE, e.g. %s\n", f, bad[f], first[f]
      printf "#groups %d\n", groups
    }')
  groups=$(sed -n 's/^#groups //p' <<<"$report")
  missing=$(grep -v '^#groups' <<<"$report" || true)
  if [ -n "$missing" ]; then
    echo "$bin: warpgroup MMA groups without WARPGROUP.ARRIVE:"
    echo "$missing"
    status=1
  else
    echo "$bin: ok (${groups:-0} warpgroup MMA instructions, every group after an ARRIVE)"
  fi
done
exit "$status"

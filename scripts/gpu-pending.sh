#!/usr/bin/env bash
# Runs the pending device measurements of bench/gpu/pending.txt from a device bundle (made by
# scripts/device-bundle.sh, or its .tar.xz), in the list's order, within a time budget, so a
# device call can start on the backlog without any preparation (docs/BENCHMARKS.md "The pending
# list").
#   scripts/gpu-pending.sh BUNDLE_DIR_OR_TAR_XZ OUT_DIR [SECONDS] [LIST]
# SECONDS (default 540) is the budget for the whole run: a line starts only while at least its
# reserve (below) is left, and each runs under `timeout` with what is left, so what has been
# written under OUT_DIR survives a call's time limit. LIST defaults to bench/gpu/pending.txt.
# List lines (blank lines and `#` comments skipped):
#   test BINARY [GTEST_FILTER]   the bundle's test binary, log in OUT_DIR/tests/, one line in
#                                OUT_DIR/tests.txt (name, filter, rc, seconds, last summary)
#   bench FILTER                 attn_gpu_bench --replays=$ATTND_PENDING_REPLAYS (20)
#                                --filter=FILTER, results appended to OUT_DIR/bench.jsonl
#   ibench FILTER                the same with --interleave (the selected cases' warm replays
#                                in rounds: for A/Bs, docs/BENCHMARKS.md "Order in one process")
#   sanitize BINARY GTEST_FILTER compute-sanitizer memcheck of that binary and filter
#   ncu KERNEL_REGEX FILTER      ncu --set full --clock-control none of one launch (the fourth)
#                                of the kernels matching KERNEL_REGEX in attn_gpu_bench
#                                --replays=2 --filter=FILTER, text in OUT_DIR/ncu/
#   abbench FILTER               the same cases from a base bundle (ATTND_PENDING_BASE: a bundle
#                                dir or .tar.xz of another commit) and from this one, in
#                                alternating processes (base first in even rounds, this one in
#                                odd; ATTND_PENDING_AB_ROUNDS rounds, default 2), results in
#                                OUT_DIR/bench_base.jsonl and OUT_DIR/bench.jsonl; skipped
#                                without a base bundle
#   reserve SECONDS              lines after it start only while SECONDS are left (default 20)
# Skipped lines go to OUT_DIR/skipped.txt; OUT_DIR/clocks.csv samples the card's SM and memory
# clocks, power and temperature every 200 ms. Exits 0 unless the bundle cannot be used; test
# failures are in OUT_DIR/tests.txt.
set -uo pipefail
SRC="${1:?usage: gpu-pending.sh BUNDLE_DIR_OR_TAR_XZ OUT_DIR [SECONDS] [LIST]}"
OUT="${2:?usage: gpu-pending.sh BUNDLE_DIR_OR_TAR_XZ OUT_DIR [SECONDS] [LIST]}"
BUDGET="${3:-540}"
LIST="${4:-$(cd "$(dirname "$0")/.." && pwd)/bench/gpu/pending.txt}"
T0=$(date +%s)
mkdir -p "$OUT/tests" "$OUT/ncu"
if [[ "$SRC" == *.tar.xz ]]; then
  X="$(mktemp -d /tmp/attnd-pending.XXXXXX)"
  tar xJf "$SRC" -C "$X" || { echo "gpu-pending: cannot extract $SRC" >&2; exit 2; }
  SRC="$(find "$X" -mindepth 1 -maxdepth 1 -type d | head -1)"
fi
[[ -x "$SRC/bin/attn_gpu_bench" || -d "$SRC/bin" ]] || { echo "gpu-pending: $SRC has no bin/" >&2; exit 2; }
[[ -r "$LIST" ]] || { echo "gpu-pending: no list $LIST" >&2; exit 2; }
LIBS="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$SRC/lib${LIBS:+:$LIBS}"
COMMIT="$(cat "$SRC/COMMIT" 2>/dev/null || echo unknown)"
# The base bundle of abbench lines, if any.
BASE="${ATTND_PENDING_BASE:-}"
if [[ "$BASE" == *.tar.xz ]]; then
  XB="$(mktemp -d /tmp/attnd-pending-base.XXXXXX)"
  tar xJf "$BASE" -C "$XB" || { echo "gpu-pending: cannot extract $BASE" >&2; exit 2; }
  BASE="$(find "$XB" -mindepth 1 -maxdepth 1 -type d | head -1)"
fi
if [[ -n "$BASE" && ! -x "$BASE/bin/attn_gpu_bench" ]]; then
  echo "gpu-pending: base bundle $BASE has no bin/attn_gpu_bench" >&2
  exit 2
fi
BASE_COMMIT="$(cat "$BASE/COMMIT" 2>/dev/null || echo unknown)"
AB_ROUNDS="${ATTND_PENDING_AB_ROUNDS:-2}"
REPLAYS="${ATTND_PENDING_REPLAYS:-20}"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.max.mem --format=csv \
  > "$OUT/device.csv" 2>&1
echo "commit $COMMIT list $LIST budget ${BUDGET}s start $(date -u +%FT%TZ)${BASE:+ base $BASE_COMMIT}" \
  > "$OUT/pending.log"
# The card's clocks, power and temperature every 200 ms while the list runs, to set beside the
# lines' start times in pending.log (docs/BENCHMARKS.md "Order in one process": whether the
# first heavy case of a process runs at a higher clock was never logged).
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 200 > "$OUT/clocks.csv" 2>&1 &
SAMPLER=$!
trap 'kill "$SAMPLER" 2> /dev/null' EXIT
reserve=20
left() { echo $((BUDGET - ($(date +%s) - T0))); }
n=0
while IFS= read -r line || [[ -n "$line" ]]; do
  line="${line%%#*}"
  read -r kind a b <<< "$line"
  [[ -z "${kind:-}" ]] && continue
  n=$((n + 1))
  if [[ "$kind" == reserve ]]; then reserve="$a"; continue; fi
  l=$(left)
  if ((l < reserve)); then
    echo "$kind $a ${b:-} (${l}s left, reserve ${reserve}s)" >> "$OUT/skipped.txt"
    continue
  fi
  s=$(date +%s)
  case "$kind" in
    test)
      log="$OUT/tests/$(printf '%03d' "$n")-$a.log"
      timeout "$l" "$SRC/bin/$a" ${b:+"--gtest_filter=$b"} > "$log" 2>&1 < /dev/null
      rc=$?
      echo "$a ${b:-} rc=$rc $(($(date +%s) - s))s $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tr '\n' ' ')" \
        >> "$OUT/tests.txt"
      ;;
    bench | ibench)
      extra=()
      [[ "$kind" == ibench ]] && extra=(--interleave)
      timeout "$l" "$SRC/bin/attn_gpu_bench" --replays="$REPLAYS" --filter="$a" \
        --out="$OUT/bench.jsonl" --commit="$COMMIT" "${extra[@]}" \
        >> "$OUT/bench.log" 2>&1 < /dev/null
      rc=$?
      ;;
    abbench)
      if [[ -z "$BASE" ]]; then
        echo "$kind $a (no base bundle: ATTND_PENDING_BASE)" >> "$OUT/skipped.txt"
        continue
      fi
      rc=0
      for ((r = 0; r < AB_ROUNDS; r++)); do
        for side in $((r % 2)) $((1 - r % 2)); do  # 0: base, 1: this bundle
          l=$(left)
          ((l < reserve)) && break 2
          if ((side == 0)); then
            LD_LIBRARY_PATH="$BASE/lib${LIBS:+:$LIBS}" timeout "$l" "$BASE/bin/attn_gpu_bench" \
              --replays="$REPLAYS" --filter="$a" --out="$OUT/bench_base.jsonl" \
              --commit="$BASE_COMMIT" >> "$OUT/bench.log" 2>&1 < /dev/null || rc=$?
          else
            timeout "$l" "$SRC/bin/attn_gpu_bench" --replays="$REPLAYS" --filter="$a" \
              --out="$OUT/bench.jsonl" --commit="$COMMIT" >> "$OUT/bench.log" 2>&1 < /dev/null ||
              rc=$?
          fi
        done
      done
      ;;
    sanitize)
      log="$OUT/tests/$(printf '%03d' "$n")-memcheck-$a.log"
      timeout "$l" compute-sanitizer --tool memcheck --error-exitcode 3 "$SRC/bin/$a" \
        ${b:+"--gtest_filter=$b"} > "$log" 2>&1 < /dev/null
      rc=$?
      echo "memcheck $a ${b:-} rc=$rc $(($(date +%s) - s))s $(grep -E 'ERROR SUMMARY' "$log" | tail -1)" \
        >> "$OUT/tests.txt"
      ;;
    ncu)
      log="$OUT/ncu/$(printf '%03d' "$n")-$(tr -c 'A-Za-z0-9_.-' '_' <<< "${b:-all}").txt"
      timeout "$l" ncu --clock-control none --set full -k "regex:$a" --launch-skip 3 -c 1 \
        "$SRC/bin/attn_gpu_bench" --replays=2 --filter="$b" > "$log" 2>&1 < /dev/null
      rc=$?
      ;;
    *)
      echo "unknown line kind: $line" >> "$OUT/skipped.txt"
      continue
      ;;
  esac
  echo "$kind $a ${b:-} rc=$rc $(($(date +%s) - s))s from $(date -u -d "@$s" +%T)" >> "$OUT/pending.log"
done < "$LIST"
echo "end $(date -u +%FT%TZ) after $(($(date +%s) - T0))s" >> "$OUT/pending.log"

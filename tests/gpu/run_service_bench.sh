#!/usr/bin/env bash
# The GPU service-overhead benchmark (service_bench.py) from a device bundle: starts the bundled
# daemon (daemon.sh) with graphs on, runs the benchmark, restarts it with --graphs=false and runs
# it again. Results: OUT_DIR/service_gpu.jsonl (one JSON line per op and graph setting), logs
# beside it.
#   bundle/gpu-tests/run_service_bench.sh OUT_DIR          (or: bundle/run-gpu-suite.sh OUT_DIR service)
#   tests/gpu/run_service_bench.sh OUT_DIR --device=cpu    # dry run against a CPU daemon, here
# Environment: PYTHON (default python3), ATTND_POOL_BYTES (default 8GiB), ATTND_ARGS (extra daemon
# flags), ATTND_BIN (default the bundle's bin/attnd), ATTND_PYTHONPATH (default the bundle's
# python/), SERVICE_BENCH_ARGS (extra service_bench.py arguments, e.g. "--iters 50").
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run_service_bench.sh OUT_DIR [--device=cuda|cpu]}"
DEVICE=cuda
case "${2:-}" in
  "" | --device=cuda) ;;
  --device=cpu) DEVICE=cpu ;;
  *) echo "run_service_bench: unknown argument '$2'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
# shellcheck source-path=SCRIPTDIR source=daemon.sh
. "$HERE/daemon.sh"
trap 'attnd_stop; attnd_cleanup' EXIT
PYPATH="${ATTND_PYTHONPATH:-$ATTND_BUNDLE/python}"
COMMIT="$(cat "$ATTND_BUNDLE/COMMIT" 2>/dev/null || git -C "$HERE" rev-parse HEAD 2>/dev/null ||
          echo unknown)"

probe="import grpc, google.protobuf, numpy"
[ "$DEVICE" = cuda ] && probe="$probe, torch; assert torch.cuda.is_available()"
if ! "$PYTHON" -c "$probe" > "$OUT/service-python.txt" 2>&1; then
  echo "run_service_bench: $PYTHON cannot run the $DEVICE benchmark ($probe):" >&2
  cat "$OUT/service-python.txt" >&2
  exit 2
fi

# One daemon per graph setting (the CPU backend has no graphs: one run).
rc=0
settings=(on)
[ "$DEVICE" = cuda ] && settings=(on off)
for graphs in "${settings[@]}"; do
  flags=(--backend="$DEVICE")
  [ "$DEVICE" = cuda ] && flags+=(--pool-bytes="${ATTND_POOL_BYTES:-8GiB}" --graphs="$([ "$graphs" = on ] && echo true || echo false)")
  [ "$DEVICE" = cpu ] && flags+=(--cpu-threads=2)
  echo "== service benchmark, $DEVICE, graphs $graphs"
  # shellcheck disable=SC2086  # ATTND_ARGS is a list of flags
  attnd_start "$OUT/service-attnd-graphs-$graphs.log" "${flags[@]}" ${ATTND_ARGS:-} || { rc=1; continue; }
  # shellcheck disable=SC2086  # SERVICE_BENCH_ARGS is a list of arguments
  PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/service_bench.py" \
    --target "$ATTND_TARGET" --out "$OUT/service_gpu.jsonl" --device "$DEVICE" \
    --graphs "$graphs" --commit "$COMMIT" ${SERVICE_BENCH_ARGS:-} \
    2>&1 | tee "$OUT/service-graphs-$graphs.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  curl -s "$ATTND_METRICS_URL" > "$OUT/service-metrics-graphs-$graphs.txt" 2>/dev/null || true
  attnd_stop
done
echo "run_service_bench: exit $rc (results in $OUT/service_gpu.jsonl)"
exit "$rc"

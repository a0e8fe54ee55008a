#!/usr/bin/env bash
# Runs the Python/PyTorch frontend test (frontend_test.py) on a GPU host from a device bundle:
# starts the bundled daemon (bin/attnd, its libraries in lib/) with --backend=cuda on a private
# unix socket, runs the test with the bundle's Python client on PYTHONPATH (the host's python3
# with torch and grpcio), stops the daemon. Logs and the test's JSON figures go to OUT_DIR.
#   bundle/gpu-tests/run_frontend.sh OUT_DIR        (or: bundle/run-gpu-suite.sh OUT_DIR frontend)
# Environment: PYTHON (default python3), ATTND_POOL_BYTES (default 4GiB), ATTND_ARGS (extra
# daemon flags, e.g. --graphs=false).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BUNDLE="$(cd "$HERE/.." && pwd)"
OUT="${1:?usage: run_frontend.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
TMP="$(mktemp -d /tmp/attnd-frontend.XXXXXX)"
PID=""

stop_daemon() {
  [ -n "$PID" ] || return 0
  kill -TERM "$PID" 2>/dev/null
  for _ in $(seq 1 100); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  PID=""
}
trap 'stop_daemon; rm -rf "$TMP"' EXIT

if ! "$PYTHON" -c "import torch, grpc, google.protobuf, numpy; assert torch.cuda.is_available()" \
    > "$OUT/frontend-python.txt" 2>&1; then
  echo "run_frontend: $PYTHON lacks torch with CUDA, grpcio, protobuf or numpy:" >&2
  cat "$OUT/frontend-python.txt" >&2
  exit 2
fi

SOCK="$TMP/attnd.sock"
READY="$TMP/ready"
# shellcheck disable=SC2086  # ATTND_ARGS is a list of flags
LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BUNDLE/bin/attnd" \
  --backend=cuda --listen="unix:$SOCK" --metrics-listen=127.0.0.1:0 --ready-file="$READY" \
  --allow-client-shm --pool-bytes="${ATTND_POOL_BYTES:-4GiB}" --log-level=info \
  ${ATTND_ARGS:-} > "$OUT/frontend-attnd.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
  [ -s "$READY" ] && break
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "run_frontend: attnd exited at start:" >&2
    tail -20 "$OUT/frontend-attnd.log" >&2
    PID=""
    exit 1
  fi
  sleep 0.1
done
if [ ! -s "$READY" ]; then
  echo "run_frontend: attnd not ready after 60 s" >&2
  tail -20 "$OUT/frontend-attnd.log" >&2
  exit 1
fi
METRICS="$(awk '$1 == "metrics" { print $2 }' "$READY")"

GRAPHS=on
case " ${ATTND_ARGS:-} " in *" --graphs=false "*|*" --nographs "*) GRAPHS=off ;; esac
PYTHONPATH="$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/frontend_test.py" \
  --target "unix:$SOCK" --metrics "http://$METRICS/metrics" --json "$OUT/frontend.json" \
  --graphs "$GRAPHS" \
  2>&1 | tee "$OUT/frontend.log"
rc=${PIPESTATUS[0]}
curl -s "http://$METRICS/metrics" > "$OUT/frontend-metrics.txt" 2>/dev/null || true
stop_daemon
echo "run_frontend: exit $rc (logs in $OUT)"
exit "$rc"

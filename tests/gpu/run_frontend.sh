#!/usr/bin/env bash
# Runs the Python/PyTorch frontend test (frontend_test.py) on a GPU host from a device bundle:
# starts the bundled daemon (bin/attnd, its libraries in lib/) with --backend=cuda on a private
# unix socket (daemon.sh), runs the test with the bundle's Python client on PYTHONPATH (the
# host's python3 with torch and grpcio), stops the daemon. Logs and the test's JSON figures go to
# OUT_DIR.
#   bundle/gpu-tests/run_frontend.sh OUT_DIR        (or: bundle/run-gpu-suite.sh OUT_DIR frontend)
# Environment: PYTHON (default python3), ATTND_POOL_BYTES (default 4GiB), ATTND_ARGS (extra
# daemon flags, e.g. --graphs=false).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run_frontend.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
# shellcheck source-path=SCRIPTDIR source=daemon.sh
. "$HERE/daemon.sh"
trap 'attnd_stop; attnd_cleanup' EXIT

if ! "$PYTHON" -c "import torch, grpc, google.protobuf, numpy; assert torch.cuda.is_available()" \
    > "$OUT/frontend-python.txt" 2>&1; then
  echo "run_frontend: $PYTHON lacks torch with CUDA, grpcio, protobuf or numpy:" >&2
  cat "$OUT/frontend-python.txt" >&2
  exit 2
fi

# shellcheck disable=SC2086  # ATTND_ARGS is a list of flags
attnd_start "$OUT/frontend-attnd.log" --backend=cuda --pool-bytes="${ATTND_POOL_BYTES:-4GiB}" \
  ${ATTND_ARGS:-} || exit 1

GRAPHS=on
case " ${ATTND_ARGS:-} " in *" --graphs=false "*|*" --nographs "*) GRAPHS=off ;; esac
# The vLLM plugin's package too (its device-form case; it imports no vLLM).
PYTHONPATH="$ATTND_BUNDLE/python:$ATTND_BUNDLE/integration/client/python_vllm${PYTHONPATH:+:$PYTHONPATH}" \
  "$PYTHON" "$HERE/frontend_test.py" \
  --target "$ATTND_TARGET" --metrics "$ATTND_METRICS_URL" --json "$OUT/frontend.json" \
  --graphs "$GRAPHS" \
  2>&1 | tee "$OUT/frontend.log"
rc=${PIPESTATUS[0]}
curl -s "$ATTND_METRICS_URL" > "$OUT/frontend-metrics.txt" 2>/dev/null || true
attnd_stop
echo "run_frontend: exit $rc (logs in $OUT)"
exit "$rc"

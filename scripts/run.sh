#!/usr/bin/env bash
# The main job: set up (install + build), start the attnd daemon (GPU backend when a GPU is
# present, else the CPU backend) on a private unix socket, and drive a real DSA layer through it
# with the C++ client: DeepSeek-V3.2 shapes (indexer H 64 -> top-2048 -> sparse MLA H 128,
# d_qk 576), inline and zero-copy through a shared-memory region, each checked against the local
# CPU operators. Prints the results, the server's timings and the round trips, then drains the
# daemon with SIGTERM.
#   scripts/run.sh [--preset=deepseek|glm|decode|prefill|tiny] [more attnctl run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR="${ATTND_BUILD_DIR:-build}"
ATTND="$BUILD_DIR/server/attnd"
ATTNCTL="$BUILD_DIR/client/attnctl"
PRESET="--preset=deepseek"
for a in "$@"; do case "$a" in --preset=*) PRESET="$a" ;; esac; done

RUN_DIR="$(mktemp -d)"
SOCK="$RUN_DIR/attnd.sock"
cleanup() {
  if [ -n "${DAEMON_PID:-}" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT

echo "== starting attnd (backend auto: GPU if present, else CPU)"
"$ATTND" --listen="unix:$SOCK" --allow-client-shm --backend=auto \
  --ready-file="$RUN_DIR/ready" 2> "$RUN_DIR/attnd.log" &
DAEMON_PID=$!
for _ in $(seq 1 300); do
  [ -s "$RUN_DIR/ready" ] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$RUN_DIR/attnd.log"; exit 1; }
  sleep 0.1
done
[ -s "$RUN_DIR/ready" ] || { echo "attnd did not become ready"; cat "$RUN_DIR/attnd.log"; exit 1; }

"$ATTNCTL" --target="unix:$SOCK" info
echo
echo "== one DSA layer through DsaAttention, tensors inline"
"$ATTNCTL" --target="unix:$SOCK" run dsa_attention "$PRESET" "$@"
echo
echo "== the same layer, tensors in a shared-memory region (zero copy)"
"$ATTNCTL" --target="unix:$SOCK" run dsa_attention "$PRESET" --regions "$@"
echo
echo "== draining attnd (SIGTERM)"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" && echo "attnd exited cleanly"
DAEMON_PID=

# Sourced (not run) by the GPU-host scripts of a device bundle (run_frontend.sh,
# run_service_bench.sh): starts the bundled attnd on a private unix socket and stops it.
#   . "$HERE/daemon.sh"
#   trap 'attnd_stop; attnd_cleanup' EXIT
#   attnd_start "$OUT/attnd.log" --backend=cuda --pool-bytes=4GiB || exit 1
#   ... "$ATTND_TARGET" (unix:...) and "$ATTND_METRICS_URL" (http://127.0.0.1:PORT/metrics) ...
#   attnd_stop
# The daemon is $ATTND_BIN (default: the bundle's bin/attnd, its libraries in the bundle's lib/),
# with --metrics-listen=127.0.0.1:0, --allow-client-shm, --log-level=info and the flags given.
# shellcheck shell=bash disable=SC2034  # ATTND_* are read by the scripts that source this

ATTND_BUNDLE="${ATTND_BUNDLE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
ATTND_BIN="${ATTND_BIN:-$ATTND_BUNDLE/bin/attnd}"
ATTND_TMP=""
ATTND_PID=""
ATTND_TARGET=""
ATTND_METRICS_URL=""

# attnd_start LOG [FLAG...]: starts the daemon, logging to LOG, and waits up to 60 s for its
# ready file. Sets ATTND_PID, ATTND_TARGET and ATTND_METRICS_URL; 1 (with the log's tail on
# stderr) when it exits or is not ready in time.
attnd_start() {
  local log="$1" ready
  shift
  [ -n "$ATTND_TMP" ] || ATTND_TMP="$(mktemp -d /tmp/attnd-gpu.XXXXXX)"
  ready="$ATTND_TMP/ready"
  rm -f "$ready"
  ATTND_TARGET="unix:$ATTND_TMP/attnd.sock"
  LD_LIBRARY_PATH="$ATTND_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$ATTND_BIN" \
    --listen="$ATTND_TARGET" --metrics-listen=127.0.0.1:0 --ready-file="$ready" \
    --allow-client-shm --log-level=info "$@" > "$log" 2>&1 &
  ATTND_PID=$!
  local _
  for _ in $(seq 1 600); do
    [ -s "$ready" ] && break
    if ! kill -0 "$ATTND_PID" 2>/dev/null; then
      echo "attnd exited at start:" >&2
      tail -20 "$log" >&2
      ATTND_PID=""
      return 1
    fi
    sleep 0.1
  done
  if [ ! -s "$ready" ]; then
    echo "attnd not ready after 60 s:" >&2
    tail -20 "$log" >&2
    attnd_stop
    return 1
  fi
  ATTND_METRICS_URL="http://$(awk '$1 == "metrics" { print $2 }' "$ready")/metrics"
}

# attnd_stop: SIGTERM (attnd drains, then exits), SIGKILL after 10 s; a no-op when none runs.
attnd_stop() {
  [ -n "$ATTND_PID" ] || return 0
  kill -TERM "$ATTND_PID" 2>/dev/null
  local _
  for _ in $(seq 1 100); do
    kill -0 "$ATTND_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$ATTND_PID" 2>/dev/null
  wait "$ATTND_PID" 2>/dev/null
  ATTND_PID=""
}

# attnd_cleanup: removes the socket folder (after attnd_stop).
attnd_cleanup() {
  [ -n "$ATTND_TMP" ] && rm -rf "$ATTND_TMP"
  ATTND_TMP=""
}

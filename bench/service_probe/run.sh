#!/usr/bin/env bash
# Issue 15 overhead probes on the GPU host. From the repo root:
#   bash bench/service_probe/run.sh BUNDLE_DIR OUT_DIR          # GPU host, CUDA daemon from the bundle
#   bash bench/service_probe/run.sh . OUT_DIR --cpu             # local dry run against a CPU build
#     (--cpu: ATTND_BIN / ATTNCTL default to build/'s; small shapes; no kernel bench, no smi)
# 1. SparseMla 243-vs-104 µs: attn_gpu_bench (graph replays) of the kernel bench's decode B64
#    preset, then the service's shape through the daemon (device regions) with variants
#    (warm / idle gaps / S 2M pool / FAST-HIGH / exact read-back vs upper_bound / alternating
#    outputs / two callers), daemon graphs on and off; nvidia-smi clock queries before, during
#    (sampled, read-only) and after.
# 2. Blocking overhead of a tiny call (C++ attnctl unary + Session, Python), GetInfo round trip.
# 3. Caller CPU per stream-ordered prepared call: RunPrepared RPC vs submission ring (C++, Python).
# 4. The blocking forms again with the caller polling for its reply (attnctl --wait-spin) and with
#    a daemon whose workers poll their queue (--worker-spin=1ms): every thread wake-up of a small
#    call removed that a flag can remove (docs/LATENCY.md).
# Results: OUT/*.jsonl, OUT/summary.md (tables), logs. Budget: about 150 s; steps are time-boxed.
# PROBE_PARTS (default gap,small,cpu) picks the Python parts; without gap the graphs-off pass is
# skipped too.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUNDLE="$(cd "${1:?usage: gpu.sh BUNDLE_DIR OUT_DIR [--cpu]}" && pwd)"
OUT="${2:?usage: gpu.sh BUNDLE_DIR OUT_DIR [--cpu]}"
MODE="${3:-gpu}"
PARTS="${PROBE_PARTS:-gap,small,cpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
T0=$SECONDS
left() { echo $((170 - (SECONDS - T0))); }
log() { echo "[gpu.sh +$((SECONDS - T0))s] $*" | tee -a "$OUT/gpu.log"; }

if [ "$MODE" = --cpu ]; then
  DEVICE=cpu
  export ATTND_BIN="${ATTND_BIN:-$ROOT/build/server/attnd}"
  ATTNCTL="${ATTNCTL:-$ROOT/build/client/attnctl}"
  PYPATH="${ATTND_PYTHONPATH:-$ROOT/client/python}"
  SB_DIR="$ROOT/tests/gpu"
  COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  ITERS=40
  DFLAGS=(--backend=cpu --cpu-threads=2)
else
  DEVICE=cuda
  export ATTND_BIN="${ATTND_BIN:-$BUNDLE/bin/attnd}"
  ATTNCTL="${ATTNCTL:-$BUNDLE/bin/attnctl}"
  PYPATH="${ATTND_PYTHONPATH:-$BUNDLE/python}"
  SB_DIR="$BUNDLE/gpu-tests"
  COMMIT="$(cut -c1-12 "$BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
  ITERS=200
  DFLAGS=(--backend=cuda --pool-bytes=4GiB)
fi
# The bundle's libraries for its own binaries only (daemon.sh does the same for attnd): python and
# torch keep the host's (the bundle's libstdc++ or libcudart must not shadow theirs).
LIBS="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ATTND_BUNDLE="$BUNDLE"
# shellcheck source=/dev/null
. "$SB_DIR/daemon.sh"
SMI_PID=""
DEVICE_NAME="$DEVICE"
cleanup() {
  attnd_stop
  attnd_cleanup
  [ -n "$SMI_PID" ] && kill "$SMI_PID" 2> /dev/null
}
trap cleanup EXIT
log "mode $DEVICE, commit $COMMIT, bundle $BUNDLE, out $OUT"

SMI_FIELDS="timestamp,name,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active,compute_mode"
smi() {  # read-only queries
  [ "$DEVICE" = cuda ] || return 0
  {
    echo "== $1"
    nvidia-smi --query-gpu="$SMI_FIELDS" --format=csv 2>&1 ||
      nvidia-smi --query-gpu="${SMI_FIELDS/clocks_event_reasons/clocks_throttle_reasons}" --format=csv 2>&1
    nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | grep -v '^$' | head -60
  } >> "$OUT/smi.txt"
}
smi "before (idle)"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu \
    --format=csv,noheader -lms 250 > "$OUT/smi_samples.csv" 2>&1 &
  SMI_PID=$!
fi

# --- 1a. the kernel benchmark's figure (graph replays of 10 launches, warm and cold)
if [ "$DEVICE" = cuda ] && [[ "$PARTS" == *gap* ]]; then
  log "attn_gpu_bench sparse_mla decode B64 (S 2M) cuda_wgmma"
  LD_LIBRARY_PATH="$LIBS" timeout 40 "$BUNDLE/bin/attn_gpu_bench" \
    --filter=sparse_mla/deepseek_decode_b64_s2097152_h128_d576_k2048/cuda_wgmma \
    --replays=30 --out="$OUT/kernel_bench.jsonl" --commit="$COMMIT" > "$OUT/kernel_bench.log" 2>&1
  log "attn_gpu_bench rc $?"
  smi "after the kernel bench"
fi

probe() {  # probe GRAPHS PARTS TIMEOUT
  PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" SERVICE_BENCH_DIR="$SB_DIR" \
    timeout "$3" "$PYTHON" "$HERE/probe.py" --target "$ATTND_TARGET" --out "$OUT/probe.jsonl" \
    --device "$DEVICE" --graphs "$1" --parts "$2" --iters "$ITERS" --commit "$COMMIT" \
    >> "$OUT/probe-graphs-$1.log" 2>&1
  log "probe graphs $1 parts $2 rc $?"
}

ctl() {  # ctl TAG TIMEOUT ATTNCTL-ARGS... -> one wrapped JSON line in attnctl.jsonl
  local tag="$1" to="$2"
  shift 2
  [ "$(left)" -lt "$to" ] && to="$(left)"
  if [ "$to" -le 3 ]; then
    log "skipped (time): attnctl $*"
    return 0
  fi
  LD_LIBRARY_PATH="$LIBS" timeout "$to" "$ATTNCTL" --target="$ATTND_TARGET" --json --progress=false "$@" \
    2>> "$OUT/attnctl.err" |
    "$PYTHON" "$HERE/wrap.py" wrap "$OUT/attnctl.jsonl" h4_probe="$tag" client=cpp \
      commit="$COMMIT" device="$DEVICE_NAME" graphs="$GRAPHS" args="$*" >> "$OUT/attnctl.log"
}

# --- daemon, graphs on: every probe
GRAPHS=on
# Workers asleep between calls (--worker-spin=0: not the GPU default, auto = 1 ms), as in the
# earlier probes; the polling pass is below.
flags=("${DFLAGS[@]}" --worker-spin=0)
[ "$DEVICE" = cuda ] && flags+=(--graphs=true)
log "starting attnd (${flags[*]})"
if attnd_start "$OUT/attnd-graphs-on.log" "${flags[@]}"; then
  DEVICE_NAME="$(LD_LIBRARY_PATH="$LIBS" "$ATTNCTL" --target="$ATTND_TARGET" --json info 2> /dev/null |
    "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin)["devices"]; print(d[0]["name"] if d else "cpu")' 2> /dev/null)"
  log "device: $DEVICE_NAME"
  probe on "$PARTS" "$(($(left) > 75 ? 75 : $(left)))"
  smi "after the probes (graphs on)"
  N=1000
  [ "$DEVICE" = cpu ] && N=300
  log "attnctl ping / small blocking calls"
  ctl ping 20 ping --requests=$N --warmup=50
  # A tiny SparseMla: host region (attnctl allocates no device memory) and inline.
  ctl small 20 bench sparse_mla --preset=tiny --regions --requests=$N --warmup=50
  ctl small 20 bench sparse_mla --preset=tiny --regions --session --requests=$N --warmup=50
  ctl small 20 bench sparse_mla --preset=tiny --requests=$N --warmup=50
  ctl small 20 bench sparse_mla --preset=tiny --regions --prepared --requests=$N --warmup=50
  # Blocking through a submission ring: no RPC per call (docs/SERVICE.md).
  ctl small 20 bench sparse_mla --preset=tiny --regions --stream-ordered --prepared --ring \
    --ring-wait --requests=$N --warmup=50
  log "attnctl small blocking calls, the caller polling (--wait-spin=2ms)"
  ctl small_spin 20 ping --requests=$N --warmup=50 --wait-spin=2ms
  for api in "" --session --prepared; do
    # shellcheck disable=SC2086  # $api: one flag or none
    ctl small_spin 20 bench sparse_mla --preset=tiny --regions $api --requests=$N --warmup=50 \
      --wait-spin=2ms
  done
  ctl small_spin 20 bench sparse_mla --preset=tiny --regions --stream-ordered --prepared --ring \
    --ring-wait --requests=$N --warmup=50 --wait-spin=2ms
  log "attnctl caller CPU: RunPrepared RPC vs ring"
  for op in sparse_mla topk; do
    ctl caller_cpu 25 bench $op --preset=tiny --regions --stream-ordered --prepared \
      --requests=$((3 * N)) --warmup=50
    ctl caller_cpu 25 bench $op --preset=tiny --regions --stream-ordered --prepared --ring \
      --requests=$((3 * N)) --warmup=50
  done
  curl -s "$ATTND_METRICS_URL" > "$OUT/metrics-graphs-on.txt" 2> /dev/null || true
  attnd_stop
else
  log "attnd did not start (graphs on)"
fi

# --- daemon, graphs on, workers polling their queue for 1 ms: the small calls again
if [ "$(left)" -gt 25 ]; then
  GRAPHS=on
  flags=("${DFLAGS[@]}" --worker-spin=1ms)
  [ "$DEVICE" = cuda ] && flags+=(--graphs=true)
  log "starting attnd (${flags[*]})"
  if attnd_start "$OUT/attnd-worker-spin.log" "${flags[@]}"; then
    N=1000
    [ "$DEVICE" = cpu ] && N=300
    for spin in 0 2ms; do
      ctl worker_spin 20 ping --requests=$N --warmup=50 --wait-spin=$spin
      for api in "" --session --prepared; do
        # shellcheck disable=SC2086  # $api: one flag or none
        ctl worker_spin 20 bench sparse_mla --preset=tiny --regions $api --requests=$N \
          --warmup=50 --wait-spin=$spin
      done
      ctl worker_spin 20 bench sparse_mla --preset=tiny --regions --stream-ordered --prepared \
        --ring --ring-wait --requests=$N --warmup=50 --wait-spin=$spin
    done
    probe worker_spin small "$(($(left) > 40 ? 40 : $(left)))"
    attnd_stop
  fi
fi

# --- daemon, graphs off: the gap probe again
if [ "$DEVICE" = cuda ] && [[ "$PARTS" == *gap* ]] && [ "$(left)" -gt 25 ]; then
  GRAPHS=off
  log "starting attnd (graphs off)"
  if attnd_start "$OUT/attnd-graphs-off.log" "${DFLAGS[@]}" --worker-spin=0 --graphs=false; then
    probe off gap "$(($(left) > 60 ? 60 : $(left)))"
    attnd_stop
  fi
fi
smi "after (end)"
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2> /dev/null
SMI_PID=""
"$PYTHON" "$HERE/wrap.py" summary "$OUT" > "$OUT/summary.md" 2>> "$OUT/gpu.log"
cat "$OUT/summary.md"
log "done in $((SECONDS - T0)) s"

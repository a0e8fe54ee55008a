#!/usr/bin/env bash
# The forms of the daemon's device-ordered graph side by side on a GPU host, from a device bundle:
# how it skips a cancelled call's op (docs/SERVICE.md "Skipping a cancelled call's op") and where
# the conditional form's done store sits ("The done store inside the body"). Forms: cond (the
# default: the done store after the conditional), cond_body (ATTND_ORDERED_DONE=body), enable
# (ATTND_ORDERED_SKIP=enable), enable_spin (enable and ATTND_ORDERED_GATE=spin):
#   1. bin/handoff_probe --graph-cost 1: first its enable check (a cancelled launch runs none of
#      the body, the next runs all of it), then the graph forms' cost in process, the enable
#      forms (en_host, en_always, en_dev) beside the conditional ones (cond_host, cond_dev,
#      cond_in: the done store inside the body);
#   2. bin/gpu_runtime_test 'GpuOrderedTest.*' in each of the four forms (no MPS);
#   3. under one MPS server, handoff_probe's two-process hand-offs (with the kernel_gpu signal:
#      GPU-scope fences around the done store), then the decode step
#      (bench/decode_step/decode_step.py: B64 and B128, 61 layers, stream-ordered through a
#      submission ring, device signal words, the in-process chain as baseline) through a daemon
#      in each of DECODE_FORMS (default "cond cond_body enable"), alternating, ROUNDS times;
#      each daemon traces its calls (ATTND_ORDERED_TRACE), so the trace's "skip" and "done_at"
#      fields show the form every call ran in, and its log says when an op fell back.
# Results under OUT_DIR: graph_cost.jsonl and .txt, gpu_ordered_<form>.txt, handoff_mps.jsonl,
# decode_step_skip_<form>.jsonl (one file per form, a line per configuration and round),
# daemon-<form>-<round>.log and .trace.jsonl, skip_summary.txt.
#   bundle/gpu-tests/run_skip_form_ab.sh OUT_DIR
# Environment: PYTHON (default python3: needs torch with CUDA, grpcio, numpy), ROUNDS (default 2),
# STEPS (default 30), ATTND_POOL_BYTES (default 8GiB), DECODE_FORMS.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run_skip_form_ab.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
# shellcheck source-path=SCRIPTDIR source=daemon.sh
. "$HERE/daemon.sh"
BIN="$ATTND_BUNDLE/bin"
export LD_LIBRARY_PATH="$ATTND_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT="$(cat "$ATTND_BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
rc=0
# A form's daemon environment, as NAME=VALUE words.
form_env() {
  case "$1" in
    cond) echo "ATTND_ORDERED_DONE=after" ;;
    cond_body) echo "ATTND_ORDERED_DONE=body" ;;
    enable) echo "ATTND_ORDERED_SKIP=enable" ;;
    enable_spin) echo "ATTND_ORDERED_SKIP=enable ATTND_ORDERED_GATE=spin" ;;
    *) echo "run_skip_form_ab: unknown form $1" >&2; return 1 ;;
  esac
}

for form in ${DECODE_FORMS:-cond cond_body enable}; do
  form_env "$form" > /dev/null || exit 2
done

MPS_DIR=""
quit_mps() {
  [ -n "$MPS_DIR" ] || return 0
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  local _
  for _ in $(seq 100); do
    echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1 || break
    sleep 0.1
  done
  cp "$MPS_DIR"/log/*.log "$OUT/" 2> /dev/null || true
  rm -rf "$MPS_DIR"
  MPS_DIR=""
}
trap 'attnd_stop; attnd_cleanup; quit_mps' EXIT

echo "== 1. handoff_probe --graph-cost 1 (commit $COMMIT)"
"$BIN/handoff_probe" --graph-cost 1 --iters 200 --b-us 5 --label "$COMMIT" \
  --out "$OUT/graph_cost.jsonl" > "$OUT/graph_cost.txt" 2>&1 || rc=1
grep -E "enable check|^plain|^cluster|^memset|^distinct " "$OUT/graph_cost.txt"

echo "== 2. GpuOrderedTest in each form (no MPS)"
for form in cond cond_body enable enable_spin; do
  read -r -a env_args <<< "$(form_env "$form")"
  env "${env_args[@]}" timeout 300 "$BIN/gpu_runtime_test" --gtest_filter='GpuOrderedTest.*' \
    > "$OUT/gpu_ordered_$form.txt" 2>&1 || rc=1
  echo "$form: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_ordered_$form.txt" | tr '\n' ' ')"
done

echo "== 3. decode step under MPS, ${DECODE_FORMS:-cond cond_body enable} alternating"
if ! "$PYTHON" -c "import grpc, numpy, torch; assert torch.cuda.is_available()" \
  > "$OUT/python.txt" 2>&1; then
  echo "run_skip_form_ab: $PYTHON cannot run the decode step:" >&2
  cat "$OUT/python.txt" >&2
  exit 1
fi
MPS_DIR="$(mktemp -d /tmp/attnd-mps.XXXXXX)"
mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
nvidia-cuda-mps-control -d || { echo "MPS did not start" >&2; exit 1; }
# The two-process hand-offs under MPS, the GPU-scope done store (kernel_gpu) among them.
"$BIN/handoff_probe" --iters 300 --a-us 20 --b-us 100 --kernels 4 --label "$COMMIT" \
  --out "$OUT/handoff_mps.jsonl" > "$OUT/handoff_mps.txt" 2>&1 || rc=1
cat "$OUT/handoff_mps.txt"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for form in ${DECODE_FORMS:-cond cond_body enable}; do
    trace="$OUT/daemon-$form-$round.trace.jsonl"
    read -r -a env_args <<< "$(form_env "$form")"
    # attnd_start is a function (it sets ATTND_PID): the form's variables exported around it.
    for kv in "${env_args[@]}"; do export "${kv?}"; done
    ATTND_ORDERED_TRACE="$trace" attnd_start "$OUT/daemon-$form-$round.log" --backend=cuda \
      --pool-bytes="${ATTND_POOL_BYTES:-8GiB}"
    started=$?
    for kv in "${env_args[@]}"; do unset "${kv%%=*}"; done
    [ "$started" -eq 0 ] || { rc=1; continue; }
    PYTHONPATH="$ATTND_BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" \
      "$ATTND_BUNDLE/bench/decode_step/decode_step.py" --target "$ATTND_TARGET" \
      --metrics "$ATTND_METRICS_URL" --batch 64 128 --paths stream_ordered --signals device \
      --torch-stream new --steps "${STEPS:-30}" --inproc "$ATTND_BUNDLE/lib/libattnd_inproc.so" \
      --commit "$COMMIT" --out "$OUT/decode_step_skip_$form.jsonl" \
      > "$OUT/decode_step-$form-$round.txt" 2>&1 || rc=1
    attnd_stop
    {
      echo "$form round $round: calls by form: $(grep -o '"skip":"[a-z]*","done_at":"[a-z]*"' \
        "$trace" 2> /dev/null | sort | uniq -c | tr '\n' ' ')"
      grep -E "instead \(logged once\)" "$OUT/daemon-$form-$round.log" | head -3
      tail -2 "$OUT/decode_step-$form-$round.txt"
    } | tee -a "$OUT/skip_summary.txt"
  done
done
quit_mps
"$PYTHON" - "$OUT" << 'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for form in ("cond", "cond_body", "enable"):
    f = out / f"decode_step_skip_{form}.jsonl"
    if not f.exists():
        continue
    for line in f.read_text().splitlines():
        r = json.loads(line)
        print(form, r.get("preset"), "added_us_per_layer", r.get("added_us_per_layer"),
              "step_us", r.get("step_us"), "check", r.get("check"), r.get("error", ""))
EOF
echo "run_skip_form_ab: exit $rc (results in $OUT)"
exit "$rc"

#!/usr/bin/env bash
# Runs the GPU test suite and the GPU kernel benchmarks from a device bundle (made by
# scripts/device-bundle.sh) on a GPU host with only the driver installed. Logs and JSON go to
# OUT_DIR. Exits non-zero when any test binary fails.
#   bundle/run-gpu-suite.sh OUT_DIR [tests|bench|frontend|service|sanitize|integration|all] [filter]
# frontend: the Python/PyTorch frontend test against the bundled daemon (gpu-tests/
# run_frontend.sh; needs the host's python3 with torch and grpcio). `all` runs it too when that
# python3 can import torch.
# service: the service-overhead benchmark (gpu-tests/run_service_bench.sh: the same ops through
# the bundled daemon over device regions, graphs on then off; needs torch); results in
# OUT_DIR/service_gpu.jsonl. Not in `all`.
# integration: the integration test modules (tests/integration, pytest) and the vLLM plugin's
# fixtures against the bundled daemon (needs $PYTHON, default python3, with numpy, grpcio and
# pytest), with ATTND_EXPECT_BACKEND=cuda (tests of backend-dependent defaults read it);
# filter = the modules to run, space-separated (default: all but test_venv, which needs PyPI);
# without promtool its one test is deselected; a log per module and OUT_DIR/integration.txt,
# one summary line per module. Not in `all`.
# sanitize: compute-sanitizer memcheck over each op's test binary (the cases past 2^31 elements
# excluded: too slow under the tool), ATTND_SANITIZE_TIMEOUT seconds each (default 300); not in
# `all`.
# ATTND_SUITE_TESTS="dsa_test topk_test ...": tests and sanitize run only these binaries (a name
# not in the bundle fails the run), so a suite longer than one device call can be split over
# several; each binary's wall seconds go to OUT_DIR/tests-times.txt.
# ATTND_MPS=1: everything runs under one MPS server (docs/OPERATIONS.md "MPS"): a control daemon
# (nvidia-cuda-mps-control -d) with its pipe and log directories in a temporary folder, exported
# as CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY so attnd and the test clients reach it,
# quit when the script exits (its logs copied to OUT_DIR/mps-*.log); the tests then expect
# GetInfo's mps=true. ATTND_MPS=0: they expect mps=false. ATTND_EXPECT_MPS overrides either.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run-gpu-suite.sh OUT_DIR [tests|bench|frontend|service|sanitize|all] [filter]}"
WHAT="${2:-all}"
FILTER="${3:-}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT="$(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv > "$OUT/device.csv" 2>&1
rc=0

MPS_DIR=""
mps_running() { echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1; }
# Quits the control daemon this script started (it stops its server first) and keeps its logs.
# shellcheck disable=SC2317  # run by the EXIT trap
quit_mps() {
  [ -n "$MPS_DIR" ] || return 0
  {
    echo "# get_server_list"
    echo get_server_list | nvidia-cuda-mps-control 2>&1
    echo "# nvidia-smi"
    nvidia-smi 2>&1
  } > "$OUT/mps-state.txt"
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  for _ in $(seq 100); do mps_running || break; sleep 0.1; done
  mps_running && echo "MPS: the control daemon on $CUDA_MPS_PIPE_DIRECTORY did not quit"
  for f in "$CUDA_MPS_LOG_DIRECTORY"/*.log; do
    [ -e "$f" ] && cp "$f" "$OUT/mps-$(basename "$f")"
  done
  rm -rf "$MPS_DIR"
  MPS_DIR=""
}
case "${ATTND_MPS:-}" in
  1)
    if ! command -v nvidia-cuda-mps-control > /dev/null; then
      echo "ATTND_MPS=1: nvidia-cuda-mps-control is not on PATH (it comes with the driver)"
      exit 2
    fi
    MPS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/attnd-mps.XXXXXX")"
    export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    trap quit_mps EXIT
    trap 'exit 130' INT TERM
    if ! nvidia-cuda-mps-control -d; then
      echo "ATTND_MPS=1: nvidia-cuda-mps-control -d failed"
      exit 2
    fi
    for _ in $(seq 100); do mps_running && break; sleep 0.1; done
    if ! mps_running; then
      echo "ATTND_MPS=1: the MPS control daemon does not answer on $CUDA_MPS_PIPE_DIRECTORY"
      exit 2
    fi
    export ATTND_EXPECT_MPS="${ATTND_EXPECT_MPS:-1}"
    echo "MPS: control daemon on $CUDA_MPS_PIPE_DIRECTORY (logs in $CUDA_MPS_LOG_DIRECTORY)"
    ;;
  0 | "") [ "${ATTND_MPS:-}" = 0 ] && export ATTND_EXPECT_MPS="${ATTND_EXPECT_MPS:-0}" ;;
  *)
    echo "ATTND_MPS=${ATTND_MPS}: want 1 or 0"
    exit 2
    ;;
esac
# The test binaries to run: ATTND_SUITE_TESTS's names, else every bin/*_test.
test_binaries() {
  if [ -z "${ATTND_SUITE_TESTS:-}" ]; then
    for t in "$HERE"/bin/*_test; do [ -e "$t" ] && echo "$t"; done
    return 0
  fi
  local name
  for name in $ATTND_SUITE_TESTS; do echo "$HERE/bin/$name"; done
}
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  : > "$OUT/tests-times.txt"
  mapfile -t tests < <(test_binaries)
  for t in "${tests[@]}"; do
    name="$(basename "$t")"
    echo "== $name"
    if [ ! -x "$t" ]; then
      rc=1
      echo "FAILED: $name is not in the bundle's bin/"
      continue
    fi
    start=$SECONDS
    if ! "$t" ${FILTER:+--gtest_filter="$FILTER"} --gtest_brief=1 > "$OUT/$name.log" 2>&1; then
      rc=1
      echo "FAILED: $name (see $name.log)"
      grep -E "^\[  FAILED|Failure|error" "$OUT/$name.log" | head -20
    fi
    echo "$name $((SECONDS - start)) s" >> "$OUT/tests-times.txt"
    tail -3 "$OUT/$name.log"
  done
fi
if [ "$WHAT" = integration ]; then
  # The bundle's daemon is a CUDA build: the tests of backend-dependent defaults expect it.
  export ATTND_BIN="$HERE/bin/attnd" ATTNCTL_BIN="$HERE/bin/attnctl" ATTND_EXPECT_BACKEND=cuda
  export PYTHONPATH="$HERE/python:$HERE/integration/client/python_vllm${PYTHONPATH:+:$PYTHONPATH}"
  deselect=()
  if ! command -v promtool >/dev/null && [ -z "${PROMTOOL:-}" ]; then
    echo "note: no promtool on this host: test_metrics.py::test_promtool_accepts_exposition not run (set PROMTOOL)"
    deselect+=(--deselect test_metrics.py::test_promtool_accepts_exposition)
  fi
  modules="$FILTER"
  if [ -z "$modules" ]; then
    for f in "$HERE"/integration/tests/integration/test_*.py; do
      m="$(basename "$f" .py)"
      # test_venv installs the client from PyPI into a fresh venv: GPU hosts here are offline.
      if [ "$m" = test_venv ]; then
        echo "note: test_venv not run (it needs PyPI; name it to run it)"
        continue
      fi
      modules+="$m "
    done
    modules+="vllm"
  fi
  : > "$OUT/integration.txt"
  for m in $modules; do
    if [ "$m" = vllm ]; then
      dir="$HERE/integration/tests/client/python_vllm" target=.
    else
      dir="$HERE/integration/tests/integration" target="$m.py"
    fi
    (cd "$dir" && "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -rs ${deselect[@]+"${deselect[@]}"} "$target") > "$OUT/it-$m.log" 2>&1 ||
      rc=1
    echo "$m: $(tail -1 "$OUT/it-$m.log")" | tee -a "$OUT/integration.txt"
  done
fi
if [ "$WHAT" = sanitize ]; then
  SAN="$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")"
  mapfile -t tests < <(test_binaries)
  for t in "${tests[@]}"; do
    name="$(basename "$t")"
    case "$name" in common_test|server_test|gpu_runtime_test) continue ;; esac
    if [ ! -x "$t" ]; then
      rc=1
      echo "FAILED: $name is not in the bundle's bin/"
      continue
    fi
    echo "== memcheck $name"
    timeout "${ATTND_SANITIZE_TIMEOUT:-300}" "$SAN" --tool memcheck --error-exitcode 99 \
      "$t" --gtest_filter="${FILTER:-*}:-*2To31*" --gtest_brief=1 > "$OUT/memcheck-$name.log" 2>&1
    st=$?
    [ "$st" -eq 0 ] || rc=1
    echo "exit $st; $(grep -E "ERROR SUMMARY" "$OUT/memcheck-$name.log" | tail -1)"
    tail -2 "$OUT/memcheck-$name.log"
  done
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  if [ -x "$HERE/bin/attn_gpu_bench" ]; then
    "$HERE/bin/attn_gpu_bench" --commit="$COMMIT" --out="$OUT/gpu_bench.jsonl" \
      ${FILTER:+--filter="$FILTER"} 2> "$OUT/gpu_bench.err" || rc=1
    tail -5 "$OUT/gpu_bench.err"
  fi
fi
if [ "$WHAT" = frontend ] || { [ "$WHAT" = all ] && python3 -c "import torch" 2>/dev/null; }; then
  echo "== frontend (Python/PyTorch, device regions)"
  if [ -x "$HERE/gpu-tests/run_frontend.sh" ]; then
    "$HERE/gpu-tests/run_frontend.sh" "$OUT" > "$OUT/frontend-run.log" 2>&1 || {
      rc=1
      echo "FAILED: frontend (see frontend.log, frontend-attnd.log)"
    }
    tail -15 "$OUT/frontend-run.log"
  else
    rc=1
    echo "FAILED: frontend: gpu-tests/run_frontend.sh is not in the bundle"
  fi
fi
if [ "$WHAT" = service ]; then
  echo "== service overhead (device regions, graphs on and off)"
  if [ -x "$HERE/gpu-tests/run_service_bench.sh" ]; then
    "$HERE/gpu-tests/run_service_bench.sh" "$OUT" > "$OUT/service-run.log" 2>&1 || {
      rc=1
      echo "FAILED: service benchmark (see service-run.log, service-attnd-*.log)"
    }
    tail -12 "$OUT/service-run.log"
  else
    rc=1
    echo "FAILED: service: gpu-tests/run_service_bench.sh is not in the bundle"
  fi
fi
exit $rc

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
# pytest);
# filter = the modules to run, space-separated (default: all); a log per module and
# OUT_DIR/integration.txt, one summary line per module. Not in `all`.
# sanitize: compute-sanitizer memcheck over each op's test binary (the cases past 2^31 elements
# excluded: too slow under the tool), ATTND_SANITIZE_TIMEOUT seconds each (default 300); not in
# `all`.
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
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  for t in "$HERE"/bin/*_test; do
    name="$(basename "$t")"
    echo "== $name"
    if ! "$t" ${FILTER:+--gtest_filter="$FILTER"} --gtest_brief=1 > "$OUT/$name.log" 2>&1; then
      rc=1
      echo "FAILED: $name (see $name.log)"
      grep -E "^\[  FAILED|Failure|error" "$OUT/$name.log" | head -20
    fi
    tail -3 "$OUT/$name.log"
  done
fi
if [ "$WHAT" = integration ]; then
  export ATTND_BIN="$HERE/bin/attnd" ATTNCTL_BIN="$HERE/bin/attnctl"
  export PYTHONPATH="$HERE/python:$HERE/integration/client/python_vllm${PYTHONPATH:+:$PYTHONPATH}"
  command -v promtool >/dev/null || [ -n "${PROMTOOL:-}" ] ||
    echo "note: no promtool on this host (test_metrics needs it; set PROMTOOL)"
  modules="$FILTER"
  if [ -z "$modules" ]; then
    for f in "$HERE"/integration/tests/integration/test_*.py; do modules+="$(basename "$f" .py) "; done
    modules+="vllm"
  fi
  : > "$OUT/integration.txt"
  for m in $modules; do
    if [ "$m" = vllm ]; then
      dir="$HERE/integration/tests/client/python_vllm" target=.
    else
      dir="$HERE/integration/tests/integration" target="$m.py"
    fi
    (cd "$dir" && "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -rs "$target") > "$OUT/it-$m.log" 2>&1 ||
      rc=1
    echo "$m: $(tail -1 "$OUT/it-$m.log")" | tee -a "$OUT/integration.txt"
  done
fi
if [ "$WHAT" = sanitize ]; then
  SAN="$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")"
  for t in "$HERE"/bin/*_test; do
    name="$(basename "$t")"
    case "$name" in common_test|server_test|gpu_runtime_test) continue ;; esac
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

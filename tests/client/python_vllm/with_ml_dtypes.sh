#!/usr/bin/env bash
# The vLLM plugin's fixtures again, in a Python where ml_dtypes is installed: attnd_client then
# returns bf16 / fp8 as ml_dtypes arrays (as on hosts with JAX or ml_dtypes, e.g. the GPU host),
# and the plugin must treat them as bits all the same. A throw-away virtual environment on top of
# the system Python (pytest, numpy, grpcio from Debian) with ml_dtypes from PyPI.
#   tests/client/python_vllm/with_ml_dtypes.sh [pytest args]   # ATTND_BIN, PYTHONPATH as ctest
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${ATTND_VLLM_PYTHON3:-/usr/bin/python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
"$PYTHON" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "ml_dtypes>=0.2"
"$venv/bin/python" -c "import ml_dtypes; print('ml_dtypes', ml_dtypes.__version__)"
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$@" .

#!/usr/bin/env bash
# Service benchmark of attnd (round trip, service overhead, copied bytes; inline vs regions):
# starts a CPU daemon on a temporary unix socket and drives it with `attnctl bench`.
# Results: bench/results/service_<date>.jsonl and a Markdown table on stdout.
#   bench/service_bench.sh [--build build] [--rounds 4] [--nice -10] (--help: all options)
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/service_bench.py" "$@"

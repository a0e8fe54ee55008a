#!/usr/bin/env bash
# The whole test suite: set up (install + build), then every registered test via ctest.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR="${ATTND_BUILD_DIR:-build}"
cd "$BUILD_DIR"
ctest --output-on-failure -j "${ATTND_JOBS:-$(nproc)}" --timeout 900

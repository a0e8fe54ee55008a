#!/usr/bin/env bash
# Installs every Debian package attnd needs (idempotent: apt-get runs only when one is missing),
# then configures and builds into ./build (override with ATTND_BUILD_DIR).
#   scripts/setup.sh            # install + build everything
#   ATTND_SKIP_BUILD=1 scripts/setup.sh   # install only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libcivetweb-dev libssl-dev openssl
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-numpy python3-grpcio python3-protobuf python3-pytest
  prometheus
  yamllint shellcheck python3-yaml python3-kubernetes
  clang-format clang-tidy
  clang
  libclang-rt-14-dev llvm
)
# libclang-rt-14-dev: clang's libFuzzer and sanitizer runtimes (scripts/fuzz.sh), only recommended
# by clang; llvm: llvm-symbolizer, which names the source lines in sanitizer reports.
# tests/deploy also renders deploy/k8s with `kubectl kustomize` (kustomize v4+: kubectl >= 1.21).
# The machine image brings kubectl 1.32; Debian's kubernetes-client (1.20) is too old for it.

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ruff for scripts/lint.sh, from PyPI at the version ruff.toml is written for.
RUFF_VERSION=0.17.6
if [ "$(python3 -m ruff --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]; then
  echo "setup: installing ruff $RUFF_VERSION"
  python3 -m pip install --quiet "ruff==$RUFF_VERSION"
fi

[ "${ATTND_SKIP_BUILD:-0}" = "1" ] && exit 0

BUILD_DIR="${ATTND_BUILD_DIR:-build}"
JOBS="${ATTND_JOBS:-$(nproc)}"
read -ra cmake_extra <<<"${ATTND_CMAKE_ARGS:-}"  # several arguments, split at whitespace
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_extra[@]}"
echo "setup: building in $BUILD_DIR with $JOBS jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"

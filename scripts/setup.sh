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
  python3 python3-numpy python3-grpcio python3-protobuf python3-pytest
  prometheus
  yamllint shellcheck python3-yaml python3-kubernetes
)
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

[ "${ATTND_SKIP_BUILD:-0}" = "1" ] && exit 0

BUILD_DIR="${ATTND_BUILD_DIR:-build}"
JOBS="${ATTND_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ATTND_CMAKE_ARGS:-}
echo "setup: building in $BUILD_DIR with $JOBS jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"

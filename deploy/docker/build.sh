#!/usr/bin/env bash
# Builds attnd and attnctl for one image variant and stages them, with the shared libraries they
# need, into a relocatable prefix that an image's runtime stage copies whole. The Dockerfiles in
# this folder RUN it; CI runs the cpu variant for real (tests/deploy) so the steps cannot rot.
#   deploy/docker/build.sh cpu  --prefix /tmp/stage                 # deps, configure, build, stage, verify
#   deploy/docker/build.sh cuda --prefix /opt/attnd                 # in Dockerfile.cuda
#   deploy/docker/build.sh hip  --prefix /opt/attnd --hip-arch gfx950   # in Dockerfile.rocm
#   deploy/docker/build.sh cuda --dry-run                           # print the plan, probe the toolchain
# Options:
#   --prefix DIR      staging prefix: bin/{attnd,attnctl}, lib/<closure>, share/attnd/BUILD_INFO
#   --build-dir DIR   CMake build folder (default build-docker-VARIANT); an existing, configured
#                     folder is reused as it is (its ATTND_GPU must match the variant)
#   --steps LIST      comma-separated subset of deps,configure,build,stage,verify (default: all)
#   --hip-arch ARCH   offload arch of the hip variant (default gfx950, the MI355X; ROCm >= 6.4.
#                     Debian's ROCm 5.2 hipcc knows gfx90a and gfx940, not gfx942/gfx950)
#   --jobs N          parallel build jobs (default: nproc)
#   --dry-run         print every command instead of running it; probe the toolchain only
# Environment: ATTND_COMMIT names the commit in BUILD_INFO where the tree has no .git (images).
# Exit status: 0 on success, 1 when a step fails, 2 for bad usage.
set -euo pipefail

SRC="$(cd "$(dirname "$0")/../.." && pwd)"
VARIANT=""
PREFIX=""
BUILD_DIR=""
STEPS="deps,configure,build,stage,verify"
HIP_ARCH="gfx950"
JOBS="$(nproc)"
DRY_RUN=0

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "build.sh: $*" >&2; exit 1; }

while (($#)); do
  case "$1" in
    cpu|cuda|hip) VARIANT="$1" ;;
    --prefix) PREFIX="${2:?--prefix needs a value}"; shift ;;
    --prefix=*) PREFIX="${1#*=}" ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift ;;
    --build-dir=*) BUILD_DIR="${1#*=}" ;;
    --steps) STEPS="${2:?--steps needs a value}"; shift ;;
    --steps=*) STEPS="${1#*=}" ;;
    --hip-arch) HIP_ARCH="${2:?--hip-arch needs a value}"; shift ;;
    --hip-arch=*) HIP_ARCH="${1#*=}" ;;
    --jobs) JOBS="${2:?--jobs needs a value}"; shift ;;
    --jobs=*) JOBS="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage ;;
    *) echo "build.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
[ -n "$VARIANT" ] || { echo "build.sh: name a variant: cpu, cuda or hip" >&2; usage; }
PREFIX="$(realpath -m "${PREFIX:-/opt/attnd}")"
[ "$PREFIX" != / ] || { echo "build.sh: --prefix / would replace the system's bin and lib" >&2; exit 2; }
BUILD_DIR="${BUILD_DIR:-$SRC/build-docker-$VARIANT}"
for s in ${STEPS//,/ }; do
  case "$s" in deps|configure|build|stage|verify) ;; *) echo "build.sh: unknown step '$s'" >&2; usage ;; esac
done
want() { [[ ",$STEPS," == *",$1,"* ]]; }

# What each variant builds with. Package names are Debian's; the CUDA and ROCm base images are
# Ubuntu 24.04, which ships the same names and, for gRPC/Protobuf/Abseil, the same versions.
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config file binutils
  libabsl-dev libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libcivetweb-dev libssl-dev
)
case "$VARIANT" in
  cpu)  GPU=off ;;
  cuda) GPU=cuda ;;
  hip)  GPU=hip ;;
esac
CMAKE_ARGS=(-S "$SRC" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTND_GPU="$GPU"
            -DATTND_BUILD_TESTS=OFF -DATTND_BUILD_BENCH=OFF)
# The HIP build's offload arch (cmake/hip.cmake); CMake finds ROCm's clang under /opt/rocm, or
# the clang Debian's hipcc drives.
[ "$VARIANT" = hip ] && CMAKE_ARGS+=(-DATTND_HIP_ARCH="$HIP_ARCH")

# Libraries the runtime stage must not carry: the C runtime (the base image's) and the GPU
# driver's user-space part (the NVIDIA container runtime injects libcuda; ROCm's kernel driver
# is the host's amdgpu, its user-space libraries do travel).
SKIP_LIBS='^(linux-vdso\.so|ld-linux[^ ]*\.so|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libcuda\.so|libnvidia-[^ ]*\.so)'
# Libraries the HIP runtime dlopens (ldd does not see them): copied with their own closure.
HIP_DLOPENED=(libamd_comgr.so libhiprtc.so libhsa-amd-aqlprofile64.so)

run() {
  if ((DRY_RUN)); then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

probe_toolchain() {
  local v
  v="$(cmake --version 2>/dev/null | head -1 || true)"
  echo "toolchain: ${v:-cmake not found (the deps step installs it)}"
  case "$VARIANT" in
    cuda)
      local nvcc
      nvcc="$(command -v nvcc || true)"
      [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
      if [ -z "$nvcc" ]; then
        echo "toolchain: nvcc not found (the CUDA 13 devel base image provides it)"
        ((DRY_RUN)) || die "cuda variant needs nvcc"
        return
      fi
      v="$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p')"
      echo "toolchain: $nvcc, CUDA $v"
      [ "${v%%.*}" -ge 13 ] || die "cuda variant wants CUDA >= 13 (the H200 image's toolkit), found $v"
      ;;
    hip)
      local hipcc
      hipcc="$(command -v hipcc || true)"
      [ -z "$hipcc" ] && [ -x /opt/rocm/bin/hipcc ] && hipcc=/opt/rocm/bin/hipcc
      if [ -z "$hipcc" ]; then
        echo "toolchain: hipcc not found (the ROCm dev base image provides it)"
        ((DRY_RUN)) || die "hip variant needs hipcc"
        return
      fi
      v="$("$hipcc" --version 2>/dev/null | sed -n 's/^HIP version: \([0-9][0-9.]*\).*/\1/p' | head -1)"
      echo "toolchain: $hipcc, HIP ${v:-unknown}; --offload-arch=$HIP_ARCH"
      if [ "$HIP_ARCH" = gfx950 ]; then
        echo "toolchain: gfx950 (MI355X) needs ROCm >= 6.4; Debian's ROCm 5.2 hipcc cannot target it"
      fi
      ;;
    cpu) echo "toolchain: $(c++ --version | head -1)" ;;
  esac
}

step_deps() {
  echo "== deps: ${BUILD_PACKAGES[*]}"
  local -a sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  run "${sudo[@]}" apt-get update -qq
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${BUILD_PACKAGES[@]}"
}

step_configure() {
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
    local cached
    cached="$(sed -n 's/^ATTND_GPU:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")"
    [ "$cached" = "$GPU" ] || die "$BUILD_DIR is configured with ATTND_GPU=$cached, want $GPU"
    echo "== configure: reusing $BUILD_DIR (ATTND_GPU=$cached)"
    return
  fi
  echo "== configure: $BUILD_DIR"
  run cmake "${CMAKE_ARGS[@]}"
}

step_build() {
  echo "== build: attnd attnctl"
  run cmake --build "$BUILD_DIR" --target attnd attnctl -j "$JOBS"
}

# The resolved "name path" pairs of one ELF file's dependencies, less the skipped ones.
closure_of() {
  LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$1" |
    awk '/=> not found/ {print $1, "NOT_FOUND"; next} /=> \// {print $1, $3}' |
    while read -r name path; do
      [[ "$name" =~ $SKIP_LIBS ]] || echo "$name $path"
    done
}

copy_closure() {
  local name path
  while read -r name path; do
    [ "$path" = NOT_FOUND ] && die "$1 needs $name, which is not found"
    [ -e "$PREFIX/lib/$name" ] && continue
    cp -L "$path" "$PREFIX/lib/$name"
    chmod 0644 "$PREFIX/lib/$name"
    copy_closure "$PREFIX/lib/$name"
  done < <(closure_of "$1")
}

step_stage() {
  echo "== stage: $PREFIX"
  if ((DRY_RUN)); then
    run install -D -m 0755 "$BUILD_DIR/server/attnd" "$PREFIX/bin/attnd"
    run install -D -m 0755 "$BUILD_DIR/client/attnctl" "$PREFIX/bin/attnctl"
    [ "$VARIANT" = cuda ] && run install -D -m 0755 "$SRC/deploy/docker/attnd-mps.sh" "$PREFIX/bin/attnd-mps"
    echo "+ copy the ldd closure of bin/* into $PREFIX/lib (less: C runtime, GPU driver)"
    return
  fi
  rm -rf "${PREFIX:?}/bin" "${PREFIX:?}/lib" "${PREFIX:?}/share/attnd"
  mkdir -p "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/share/attnd"
  install -m 0755 "$BUILD_DIR/server/attnd" "$PREFIX/bin/attnd"
  install -m 0755 "$BUILD_DIR/client/attnctl" "$PREFIX/bin/attnctl"
  strip --strip-unneeded "$PREFIX/bin/attnd" "$PREFIX/bin/attnctl"
  # CUDA: the MPS entrypoint (docs/OPERATIONS.md "MPS"), a shell script.
  if [ "$VARIANT" = cuda ]; then
    install -m 0755 "$SRC/deploy/docker/attnd-mps.sh" "$PREFIX/bin/attnd-mps"
  fi
  copy_closure "$PREFIX/bin/attnd"
  copy_closure "$PREFIX/bin/attnctl"
  if [ "$VARIANT" = hip ]; then
    local lib found
    for lib in "${HIP_DLOPENED[@]}"; do
      for found in /opt/rocm/lib/"$lib".*; do
        [ -e "$found" ] || continue
        [ -e "$PREFIX/lib/${found##*/}" ] || cp -L "$found" "$PREFIX/lib/${found##*/}"
        copy_closure "$PREFIX/lib/${found##*/}"
      done
    done
  fi
  {
    echo "variant=$VARIANT"
    echo "gpu=$GPU"
    echo "version=$(LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/attnd" --version | awk '{print $2}')"
    echo "commit=${ATTND_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}"
    if [ "$VARIANT" = hip ]; then echo "hip_arch=$HIP_ARCH"; fi
  } > "$PREFIX/share/attnd/BUILD_INFO"
  echo "stage: $(find "$PREFIX/lib" -type f | wc -l) libraries, $(du -sh "$PREFIX" | cut -f1)"
}

# The runtime stage copies only $PREFIX: it must hold exactly the two programs, their
# libraries and BUILD_INFO (and, CUDA, the attnd-mps script), and every library either program
# loads must resolve inside it.
step_verify() {
  echo "== verify: $PREFIX"
  if ((DRY_RUN)); then
    echo "+ check the file list of $PREFIX and the ldd closure; start attnd, attnctl health, SIGTERM"
    return
  fi
  local f bad=0 rel name path
  while IFS= read -r f; do
    rel="${f#"$PREFIX"/}"
    case "$rel" in
      bin/attnd|bin/attnctl|share/attnd/BUILD_INFO) ;;
      bin/attnd-mps) [ "$VARIANT" = cuda ] || { echo "verify: unexpected file $rel"; bad=1; } ;;
      lib/*.so|lib/*.so.*) ;;
      *) echo "verify: unexpected file $rel"; bad=1 ;;
    esac
  done < <(find "$PREFIX" -type f -o -type l)
  for f in bin/attnd bin/attnctl; do
    [ -x "$PREFIX/$f" ] || { echo "verify: $f missing"; bad=1; }
  done
  for f in "$PREFIX"/bin/* "$PREFIX"/lib/*; do
    [ -e "$f" ] || continue
    [ "$f" = "$PREFIX/bin/attnd-mps" ] && continue  # a shell script: no libraries
    while read -r name path; do
      if [ "$path" = NOT_FOUND ]; then
        echo "verify: ${f#"$PREFIX"/} needs $name: not found"; bad=1
      elif [[ "$path" != "$PREFIX/lib/"* ]]; then
        echo "verify: ${f#"$PREFIX"/} loads $name from $path, outside the prefix"; bad=1
      fi
    done < <(closure_of "$f")
  done
  ((bad == 0)) || die "the staged prefix is not self-contained"
  LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/attnd" --version
  LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/attnctl" --version
  smoke_test
  echo "verify: ok"
}

# Starts the staged daemon (CPU backend) on a private socket, asks the staged attnctl for its
# gRPC health, then stops it with SIGTERM and expects exit status 0.
smoke_test() {
  local dir pid rc=0
  dir="$(mktemp -d)"
  LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/attnd" --listen="unix:$dir/attnd.sock" \
    --metrics-listen= --backend=cpu --cpu-threads=1 --ready-file="$dir/ready" \
    2> "$dir/attnd.log" &
  pid=$!
  for _ in $(seq 1 200); do
    [ -s "$dir/ready" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [ -s "$dir/ready" ]; then
    LD_LIBRARY_PATH="$PREFIX/lib" "$PREFIX/bin/attnctl" --target="unix:$dir/attnd.sock" \
      --connect-timeout=5s --timeout=5s health || rc=1
  else
    echo "verify: the staged attnd did not become ready"; rc=1
  fi
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || rc=1
  ((rc == 0)) || cat "$dir/attnd.log" >&2
  rm -rf "$dir"
  ((rc == 0)) || die "smoke test failed"
}

echo "build.sh: variant=$VARIANT gpu=$GPU prefix=$PREFIX build-dir=$BUILD_DIR steps=$STEPS$( ((DRY_RUN)) && echo ' (dry run)')"
probe_toolchain
if want deps; then step_deps; fi
if want configure; then step_configure; fi
if want build; then step_build; fi
if want stage; then step_stage; fi
if want verify; then step_verify; fi
echo "build.sh: done"

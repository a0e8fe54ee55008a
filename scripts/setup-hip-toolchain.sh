#!/usr/bin/env bash
# Installs the pinned HIP compile toolchain that scripts/hip-check.sh builds with (docs/HIP.md):
# clang 22 from PyPI's ziglang wheel, clang 22's resource headers from Debian 13's
# libclang-common-22-dev, Debian 12's ROCm 5.2 HIP headers, runtime and device libraries, and
# the wrappers and device-library overlay that join them. It compiles and links for gfx90a, gfx942
# and gfx950; it is not a deployment toolchain (the ROCm image builds the shipped binaries).
#   scripts/setup-hip-toolchain.sh [PREFIX]
# PREFIX: $ATTND_HIP_TOOLCHAIN, else ~/.cache/attnd-hip/toolchain. Downloads are cached in
# $ATTND_HIP_CACHE (default ~/.cache/attnd-hip/downloads). Idempotent: a prefix whose stamp names
# the same pins and the same version of this script is left as it is. Installs the ROCm 5.2
# packages with apt-get when they are missing. Prints the path of the prefix (stdout, last line)
# and its progress and time (stderr).
set -euo pipefail

# ---- Pins (docs/HIP.md says why each one) ----
ZIGLANG_VERSION=0.17.1
ZIGLANG_WHEEL=ziglang-0.17.1-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl
ZIGLANG_SHA256=ea6cc5d87b033cf0aedfbc8f9549a908cae6c50ac31f1698188fa48a74524b54
CLANG_VERSION=22.1.8  # zig clang's version: the resource headers must be the same release
CLANG_MAJOR=22
RESOURCE_DEB=libclang-common-22-dev
RESOURCE_SUITE=trixie  # Debian 13
ROCM_PACKAGES=(hipcc libamdhip64-dev rocm-device-libs)
ROCM_VERSION=5.2.3  # Debian 12's ROCm
# Code-object ISA versions that ROCm 5.2's device libraries lack, made from gfx940's.
NEW_ISA_VERSIONS=(941 942 950)

start=$(date +%s)
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/attnd-hip"
PREFIX="${1:-${ATTND_HIP_TOOLCHAIN:-$CACHE_ROOT/toolchain}}"
DOWNLOADS="${ATTND_HIP_CACHE:-$CACHE_ROOT/downloads}"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
say() { echo "setup-hip-toolchain: $*" >&2; }
die() {
  echo "setup-hip-toolchain: $*" >&2
  exit 1
}
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo)

mkdir -p "$(dirname "$PREFIX")" "$DOWNLOADS"
PREFIX="$(readlink -f "$PREFIX")"
# One setup at a time per prefix (two checks may start together).
exec 9>"$PREFIX.lock"
flock 9

# ---- Debian 12's ROCm 5.2: HIP headers, libamdhip64, CMake packages, device libraries ----
# hipcc itself only because Debian's hip-config.cmake refuses to load without /usr/bin/hipcc.
rocm_versions() {
  local p
  for p in "${ROCM_PACKAGES[@]}"; do
    printf '%s=%s ' "$p" "$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$p" 2>/dev/null |
      sed -n 's/^ii *//p')"
  done
}
if [[ "$(rocm_versions)" == *"= "* ]]; then
  say "installing ${ROCM_PACKAGES[*]} (Debian)"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
    "${ROCM_PACKAGES[@]}" >/dev/null
fi
ROCM_INSTALLED="$(rocm_versions)"
for p in "${ROCM_PACKAGES[@]}"; do
  [[ " $ROCM_INSTALLED" == *" $p=$ROCM_VERSION-"* ]] ||
    die "want $p $ROCM_VERSION-* (Debian 12), have: $ROCM_INSTALLED"
done
BITCODE="$(dirname "$(dpkg -L rocm-device-libs | grep -m1 '/amdgcn/bitcode/ocml\.bc$')")"
BUILTINS="$(compgen -G "/usr/lib/llvm-15/lib/clang/*/lib/linux/libclang_rt.builtins-x86_64.a" |
  head -1)" || die "no clang 15 builtins library (hipcc's clang-15 should have installed it)"

STAMP="ziglang=$ZIGLANG_VERSION/$ZIGLANG_SHA256 $RESOURCE_DEB=$CLANG_VERSION $ROCM_INSTALLED"
STAMP+="script=$(sha256sum "$SELF" | cut -c1-16)"
if [ -f "$PREFIX/stamp" ] && [ "$(cat "$PREFIX/stamp")" = "$STAMP" ]; then
  say "up to date ($(($(date +%s) - start)) s)"
  echo "$PREFIX"
  exit 0
fi

# ---- Downloads (cached) ----
wheel="$DOWNLOADS/$ZIGLANG_WHEEL"
if ! echo "$ZIGLANG_SHA256  $wheel" | sha256sum -c --status 2>/dev/null; then
  say "downloading ziglang==$ZIGLANG_VERSION (PyPI, ~100 MB)"
  rm -f "$wheel"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$DOWNLOADS" \
    "ziglang==$ZIGLANG_VERSION"
  echo "$ZIGLANG_SHA256  $wheel" | sha256sum -c --status ||
    die "$wheel: missing or not the pinned sha256 $ZIGLANG_SHA256"
fi

# The resource headers through a private apt configuration (its own sources list, lists and
# cache), so that the system's apt state never sees Debian 13.
deb="$(compgen -G "$DOWNLOADS/${RESOURCE_DEB}_*${CLANG_VERSION}-*_amd64.deb" | head -1)" || true
if [ -z "$deb" ]; then
  say "downloading $RESOURCE_DEB $CLANG_VERSION (Debian $RESOURCE_SUITE)"
  apt_dir="$DOWNLOADS/apt"
  mkdir -p "$apt_dir/sources.list.d" "$apt_dir/preferences.d" "$apt_dir/lists/partial" \
    "$apt_dir/cache/archives/partial"
  : >"$apt_dir/status"
  mirror="$(grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list \
    /etc/apt/sources.list.d/ 2>/dev/null | head -1 | tr -d ' ')" || true
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "${mirror:-http://deb.debian.org/debian} $RESOURCE_SUITE main" >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list"
    -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
    -o "Dir::Etc::preferencesparts=$apt_dir/preferences.d"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::status=$apt_dir/status"
    -o "Dir::Cache=$apt_dir/cache" -o Acquire::Languages=none -o APT::Architecture=amd64
    -o APT::Architectures::=amd64 -o APT::Sandbox::User=root -qq)
  apt-get "${apt_opts[@]}" update
  version="$(apt-cache "${apt_opts[@]}" madison "$RESOURCE_DEB" | awk -F'|' '{gsub(/ /, "", $2);
    print $2}' | grep -m1 -E "^1:${CLANG_VERSION//./\\.}-")" ||
    die "Debian $RESOURCE_SUITE has no $RESOURCE_DEB $CLANG_VERSION"
  (cd "$DOWNLOADS" && apt-get "${apt_opts[@]}" download "$RESOURCE_DEB=$version")
  rm -rf "$apt_dir"
  deb="$(compgen -G "$DOWNLOADS/${RESOURCE_DEB}_*${CLANG_VERSION}-*_amd64.deb" | head -1)"
fi

# ---- The prefix, staged beside its final place and moved there whole ----
stage="$PREFIX.new"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib/clang/$CLANG_MAJOR/lib/linux" "$stage/amdgcn/bitcode"
python3 - "$wheel" "$stage/bin/zig" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl, whl.open("ziglang/zig") as src:
    with open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
chmod 755 "$stage/bin/zig"
"$stage/bin/zig" clang --version | grep -q "clang version $CLANG_VERSION" ||
  die "ziglang $ZIGLANG_VERSION's zig clang is not clang $CLANG_VERSION"

unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
cp -a "$unpacked/usr/lib/llvm-$CLANG_MAJOR/lib/clang/$CLANG_MAJOR/include" \
  "$stage/lib/clang/$CLANG_MAJOR/include"
# hip-lang-config.cmake looks for the compiler-rt builtins beside the compiler.
ln -s "$BUILTINS" "$stage/lib/clang/$CLANG_MAJOR/lib/linux/"

# clang++: zig clang as a g++-mode driver for x86_64-linux-gnu with clang 22's resource headers.
# Debian's hip-lang CMake package adds `-isystem /usr/include` to CMake's first test compiles
# (before CMake knows it is an implicit directory), which breaks libstdc++'s
# `#include_next <math.h>` under clang 22: dropped.
cat >"$stage/bin/clang++" <<EOF
#!/usr/bin/env bash
# clang 22 (PyPI ziglang $ZIGLANG_VERSION) for HIP; made by scripts/setup-hip-toolchain.sh.
here="\$(dirname "\$(readlink -f "\${BASH_SOURCE[0]}")")"
args=()
while ((\$#)); do
  case "\$1" in
    -isystem) if [ "\${2-}" = /usr/include ]; then shift 2; continue; fi ;;
    -isystem/usr/include) shift; continue ;;
  esac
  args+=("\$1")
  shift
done
exec "\$here/zig" clang --driver-mode=g++ --target=x86_64-linux-gnu \\
  -resource-dir="\$here/../lib/clang/$CLANG_MAJOR" "\${args[@]}"
EOF
# lld: the HIP driver links device code with `lld -flavor gnu ...`; zig names it ld.lld.
cat >"$stage/bin/lld" <<'EOF'
#!/usr/bin/env bash
# lld 22 (zig ld.lld) for the HIP driver's device link; made by scripts/setup-hip-toolchain.sh.
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
if [ "${1-}" = -flavor ]; then
  [ "${2-}" = gnu ] || { echo "lld: only -flavor gnu is provided here" >&2; exit 2; }
  shift 2
fi
exec "$here/zig" ld.lld "$@"
EOF
ln -s lld "$stage/bin/ld.lld"
# clang-offload-bundler: bundling of object files, the one use the HIP driver makes of it when
# compiling (docs/HIP.md describes the format).
cat >"$stage/bin/clang-offload-bundler" <<'EOF'
#!/usr/bin/env python3
"""Bundles offload objects as clang's HIP driver asks (-type=o, inputs and targets in the same
order); made by scripts/setup-hip-toolchain.sh. Unbundling and listing are not provided."""

import struct
import sys

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def main(argv: list[str]) -> None:
    opts = {"-targets": [], "-input": [], "-output": [], "-bundle-align": ["1"], "-type": []}
    for arg in argv:
        name, _, value = arg.partition("=")
        key = {"-inputs": "-input", "-outputs": "-output"}.get(name, name)
        if key not in opts:
            sys.exit(f"clang-offload-bundler: {arg}: only bundling is provided here")
        opts[key] += value.split(",") if name in ("-targets", "-inputs", "-outputs") else [value]
    targets, inputs, outputs = opts["-targets"], opts["-input"], opts["-output"]
    if len(targets) != len(inputs) or len(outputs) != 1 or opts["-type"] not in ([], ["o"]):
        sys.exit("clang-offload-bundler: want -type=o, one -input per target and one -output")
    align = int(opts["-bundle-align"][-1])
    blobs = []
    for path in inputs:
        with open(path, "rb") as f:
            blobs.append(f.read())
    offset = len(MAGIC) + 8 + sum(24 + len(t.encode()) for t in targets)
    header = [MAGIC, struct.pack("<Q", len(targets))]
    layout = []
    for target, blob in zip(targets, blobs, strict=True):
        offset = -(-offset // align) * align
        header += [struct.pack("<QQQ", offset, len(blob), len(target.encode())), target.encode()]
        layout.append(offset)
        offset += len(blob)
    out = bytearray(b"".join(header))
    for start, blob in zip(layout, blobs, strict=True):
        out += bytes(start - len(out)) + blob
    with open(outputs[0], "wb") as f:
        f.write(out)


main(sys.argv[1:])
EOF
chmod 755 "$stage/bin/clang++" "$stage/bin/lld" "$stage/bin/clang-offload-bundler"

# ---- Device libraries: Debian's, plus what clang 22 needs for gfx941/942/950 and ABI v5 ----
overlay="$stage/amdgcn/bitcode"
for f in "$BITCODE"/*.bc; do ln -s "$f" "$overlay/"; done
ir=("$stage/bin/zig" clang -cc1 -triple amdgcn-amd-amdhsa -disable-llvm-passes -x ir)
"${ir[@]}" -emit-llvm "$BITCODE/oclc_isa_version_940.bc" -o "$unpacked/isa940.ll"
for v in "${NEW_ISA_VERSIONS[@]}"; do
  sed "s/constant i32 9400,/constant i32 ${v}0,/" "$unpacked/isa940.ll" >"$unpacked/isa$v.ll"
  grep -q "constant i32 ${v}0," "$unpacked/isa$v.ll" || die "oclc_isa_version_940.bc: unexpected"
  "${ir[@]}" -emit-llvm-bc "$unpacked/isa$v.ll" -o "$overlay/oclc_isa_version_$v.bc"
done
# ROCm 5.2's __threadfence() calls __atomic_work_item_fence, defined in hip.bc, which clang 22
# no longer links: its definition joins the ABI-version library that every v5 device link takes.
"${ir[@]}" -emit-llvm "$BITCODE/hip.bc" -o "$unpacked/hip.ll"
"${ir[@]}" -emit-llvm "$BITCODE/oclc_abi_version_500.bc" -o "$unpacked/abi500.ll"
grep '^@__oclc_ABI_version = ' "$unpacked/abi500.ll" >>"$unpacked/hip.ll" ||
  die "oclc_abi_version_500.bc: unexpected"
rm "$overlay/oclc_abi_version_500.bc"
"${ir[@]}" -emit-llvm-bc "$unpacked/hip.ll" -o "$overlay/oclc_abi_version_500.bc"

echo "$STAMP" >"$stage/stamp"
rm -rf "$PREFIX"
mv "$stage" "$PREFIX"
say "installed in $PREFIX ($(($(date +%s) - start)) s)"
echo "$PREFIX"

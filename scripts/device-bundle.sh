#!/usr/bin/env bash
# Builds attnd for the H200 (ATTND_GPU=cuda, sm_90a) on a machine without a GPU and gathers every
# executable (daemon, CLI, tests, benchmarks) with the shared libraries they need into one
# relocatable, git-ignored folder (default ./bundle) that runs on a GPU host which has the driver
# but none of the build dependencies:
#   scripts/device-bundle.sh [bundle-dir]
#   # on the GPU host, from the repo root:  bundle/run-gpu-suite.sh OUT_DIR
# Environment: ATTND_CUDA_BUILD_DIR (default build-cuda); ATTND_BUNDLE_SKIP_BUILD=1 bundles what
# that folder already holds; ATTND_BUNDLE_ONLY="sparse_mla_test attn_gpu_bench" bundles only
# those executables (a smaller, quicker transfer while iterating on one kernel); CUOBJDUMP names
# a cuobjdump for the SASS check (scripts/sass-check.sh, skipped without one). Every test
# binary links all kernels (~30 MB each stripped): the whole bundle's .tar.xz is ~65 MB, so a
# transport limited to 64 MiB takes a subset, e.g. ATTND_BUNDLE_ONLY="attnd attnctl
# attn_gpu_bench dsa_test libattnd_inproc.so" (~29 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${1:-bundle}"
BUILD_DIR="${ATTND_CUDA_BUILD_DIR:-build-cuda}"

if [ "${ATTND_BUNDLE_SKIP_BUILD:-0}" != 1 ]; then  # 1: bundle what $BUILD_DIR already holds
  ATTND_SKIP_BUILD=1 scripts/setup.sh
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTND_GPU=cuda
  cmake --build "$BUILD_DIR" -j "${ATTND_JOBS:-$(nproc)}"
fi

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
# The daemon, the CLI, the GPU benchmarks (decode_step_cpp and handoff_probe too) and every test binary, flattened into bin/, stripped
# (the device tool carries at most 64 MiB).
while IFS= read -r -d '' f; do
  case "$(basename "$f")" in
    attnd|attnctl|attn_gpu_bench|decode_step_cpp|handoff_probe|*_test) ;;
    *) continue ;;
  esac
  if [ -n "${ATTND_BUNDLE_ONLY:-}" ] && [[ " $ATTND_BUNDLE_ONLY " != *" $(basename "$f") "* ]]; then
    continue
  fi
  if head -c 4 "$f" | grep -q $'\x7fELF'; then
    cp "$f" "$BUNDLE/bin/"
    strip --strip-unneeded "$BUNDLE/bin/$(basename "$f")"
  fi
done < <(find "$BUILD_DIR" -type f -perm -u+x ! -name '*.so*' ! -path '*/CMakeFiles/*' -print0)

# The decode-step benchmark's in-process baseline (bench/decode_step/: a library for ctypes whose
# RUNPATH is lib/, where its own libraries go) and its script.
inproc="$BUILD_DIR/bench/libattnd_inproc.so"
if [ -f "$inproc" ] && { [ -z "${ATTND_BUNDLE_ONLY:-}" ] || [[ " $ATTND_BUNDLE_ONLY " == *" libattnd_inproc.so "* ]]; }; then
  cp "$inproc" "$BUNDLE/lib/"
fi
mkdir -p "$BUNDLE/bench"
cp -r bench/decode_step "$BUNDLE/bench/decode_step"

# Their shared libraries, except the C runtime and the driver (the host provides those).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so)'
for exe in "$BUNDLE"/bin/* "$BUNDLE"/lib/libattnd_inproc.so; do
  [ -e "$exe" ] || continue
  ldd "$exe" 2>/dev/null | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$BUNDLE/lib/$name" ] || cp -L "$path" "$BUNDLE/lib/$name"
  done
done

cp scripts/run-gpu-suite.sh "$BUNDLE/"
[ -d client/python ] && cp -r client/python "$BUNDLE/python"
[ -d tests/gpu ] && cp -r tests/gpu "$BUNDLE/gpu-tests"
# The integration tests and the vLLM plugin (package and fixtures), in the repository's layout
# (the tests find each other by relative paths), run against the bundled daemon by
# `run-gpu-suite.sh OUT integration`.
# test_decode_step runs bench/decode_step/decode_step.py with client/python on its path.
mkdir -p "$BUNDLE/integration/tests/client" "$BUNDLE/integration/client" \
  "$BUNDLE/integration/bench/decode_step"
cp -r tests/integration "$BUNDLE/integration/tests/integration"
cp -r tests/client/python_vllm "$BUNDLE/integration/tests/client/python_vllm"
cp -r client/python_vllm "$BUNDLE/integration/client/python_vllm"
cp -r client/python "$BUNDLE/integration/client/python"
cp bench/decode_step/decode_step.py "$BUNDLE/integration/bench/decode_step/"
find "$BUNDLE/integration" -name __pycache__ -prune -exec rm -rf {} +
# The commit the binaries were built from; "-dirty" when tracked files differ from it, so no
# result is credited to a commit that lacks the code that produced it.
if commit="$(git rev-parse HEAD 2>/dev/null)"; then
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit-dirty"
  echo "$commit" > "$BUNDLE/COMMIT"
else
  echo unknown > "$BUNDLE/COMMIT"
fi
# The SASS check (scripts/sass-check.sh) on one binary that links every kernel, where cuobjdump
# is found: a warpgroup MMA group issued without WARPGROUP.ARRIVE is reported before any launch.
for exe in "$BUNDLE"/bin/attn_gpu_bench "$BUNDLE"/bin/*_test; do
  [ -e "$exe" ] || continue
  sass_rc=0
  scripts/sass-check.sh "$exe" || sass_rc=$?
  [ "$sass_rc" = 1 ] && echo "WARNING: $exe has HGMMA groups without WARPGROUP.ARRIVE (above)" >&2
  [ "$sass_rc" = 2 ] && echo "note: SASS check skipped (no cuobjdump; scripts/sass-check.sh)" >&2
  break
done
for l in "$BUNDLE"/lib/*; do strip --strip-unneeded "$l" 2>/dev/null || true; done
# A compressed copy for transports with a size limit: tar xf bundle.tar.xz restores $BUNDLE/.
tar -cJf "$BUNDLE.tar.xz" "$BUNDLE"
du -sh "$BUNDLE" "$BUNDLE.tar.xz"
echo "bundle ready: $BUNDLE (run $BUNDLE/run-gpu-suite.sh OUT_DIR on the GPU host)"

#!/usr/bin/env bash
# The sanitizer build (clang, AddressSanitizer + UndefinedBehaviorSanitizer) and the libFuzzer
# targets (fuzz/, docs/FUZZING.md), in one build folder: every source is compiled with
# -fsanitize=address,undefined,fuzzer-no-link, the fuzz targets link libFuzzer, the tests do not.
#   scripts/fuzz.sh build               # configure and build the fuzz targets, tests and attnd
#   scripts/fuzz.sh asan                # build, then the sanitized tests: server unit tests,
#                                       # fuzz corpora, integration tests against that attnd
#   scripts/fuzz.sh fuzz [SECONDS]      # build, then each target for SECONDS (default 30)
#   scripts/fuzz.sh long [RUNS] [TARGET...]  # each target for RUNS executions (default 10^7),
#                                       # figures appended to $ATTND_FUZZ_DIR/long.txt
# Exits non-zero on a build failure, a failed test, or any fuzzer finding (the crashing input is
# left in $ATTND_FUZZ_DIR/findings/). Environment: ATTND_FUZZ_DIR (default build-fuzz),
# ATTND_JOBS (default nproc), ATTND_FUZZ_CLANG (default clang++), ATTND_FUZZ_TARGETS (default
# "ops regions session").
set -euo pipefail
cd "$(dirname "$0")/.."

DIR="${ATTND_FUZZ_DIR:-build-fuzz}"
JOBS="${ATTND_JOBS:-$(nproc)}"
CLANG="${ATTND_FUZZ_CLANG:-clang++}"
read -ra TARGETS <<<"${ATTND_FUZZ_TARGETS:-ops regions session}"
# The integration modules run against the sanitized daemon (the others exercise the clients, TLS
# and deployment rather than request handling). integration_hostile passes its memory checks
# there but its descriptor-exhaustion case waits on timings the slower daemon misses on a loaded
# machine: ATTND_FUZZ_INTEGRATION='integration_(ops|regions|leases|hostile)$' adds it by hand.
INTEGRATION="${ATTND_FUZZ_INTEGRATION:-integration_(ops|regions|leases)$}"
# Every report is fatal and names the source line; leaks are reported at exit. SIGBUS stays the
# program's own (server/regions/sigbus_guard.h chains to the default action, which its tests check).
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:handle_sigbus=0}"
# fuzz/ubsan.supp: what the checks cannot see through in the uninstrumented system libraries.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/fuzz/ubsan.supp}"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
FLAGS="-O1 -gline-tables-only -fno-omit-frame-pointer $SAN -fsanitize=fuzzer-no-link"

build() {
  command -v "$CLANG" >/dev/null || {
    echo "fuzz: $CLANG not found (Debian package clang; scripts/setup.sh)" >&2
    exit 2
  }
  mkdir -p "$DIR"
  # The build type names no flags of its own: CMAKE_CXX_FLAGS holds them all (asserts stay on).
  cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_COMPILER="$CLANG" \
    -DCMAKE_C_COMPILER="${CLANG%++}" -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" -DATTND_GPU=off \
    -DATTND_BUILD_BENCH=OFF -DATTND_WERROR=OFF -DATTND_FUZZ=ON >"$DIR/configure.log" 2>&1 || {
    cat "$DIR/configure.log" >&2
    exit 2
  }
  local targets=(server_test attnd attn_python_stubs)
  for t in "${TARGETS[@]}"; do targets+=("${t}_fuzz"); done
  cmake --build "$DIR" -j "$JOBS" --target "${targets[@]}"
}

asan() {
  local rc=0
  "$DIR/tests/server/server_test" --gtest_brief=1 || rc=1
  (cd "$DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900 -R "^fuzz_|$INTEGRATION") ||
    rc=1
  return "$rc"
}

# run_target NAME ARGS...: one fuzzer from its committed corpus (new inputs go to a scratch
# corpus in the build folder, so the committed one only grows by hand); a finding fails.
run_target() {
  local name=$1
  shift
  local work="$DIR/fuzz-corpus/$name"
  mkdir -p "$work" "$DIR/findings"
  "$DIR/fuzz/${name}_fuzz" "$@" -artifact_prefix="$DIR/findings/${name}-" -print_final_stats=1 \
    -max_len=65536 -timeout=30 -rss_limit_mb=4096 "$work" "fuzz/corpus/$name"
}

fuzz() {
  local seconds=${1:-30} rc=0
  for t in "${TARGETS[@]}"; do
    echo "fuzz: $t for $seconds s"
    run_target "$t" -max_total_time="$seconds" >"$DIR/fuzz-$t.log" 2>&1 || {
      rc=1
      tail -n 60 "$DIR/fuzz-$t.log" >&2
      echo "fuzz: $t FAILED (log $DIR/fuzz-$t.log, input in $DIR/findings/)" >&2
      continue
    }
    grep -E '^(stat::|#[0-9]+ +DONE)' "$DIR/fuzz-$t.log" | tr '\n' ' '
    echo
  done
  return "$rc"
}

long() {
  local runs=${1:-10000000} rc=0
  shift || true
  local names=("$@")
  ((${#names[@]})) || names=("${TARGETS[@]}")
  for t in "${names[@]}"; do
    local start end
    start=$(date +%s)
    echo "fuzz: $t for $runs runs from $(date -u +%FT%TZ)"
    run_target "$t" -runs="$runs" >"$DIR/long-$t.log" 2>&1 || rc=1
    end=$(date +%s)
    {
      echo "$t commit $(git rev-parse --short HEAD) $(date -u +%F) runs $runs wall $((end - start)) s rc $rc"
      grep -E '^#[0-9]+ +DONE|^stat::' "$DIR/long-$t.log"
      echo "corpus files: $(find "$DIR/fuzz-corpus/$t" "fuzz/corpus/$t" -type f | wc -l)"
    } | tee -a "$DIR/long.txt"
  done
  return "$rc"
}

case "${1:-}" in
  build) build ;;
  asan) build && asan ;;
  fuzz) build && fuzz "${2:-30}" ;;
  long)
    shift
    long "$@"
    ;;
  *)
    echo "usage: scripts/fuzz.sh build|asan|fuzz [SECONDS]|long [RUNS] [TARGET...]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Clang's thread-safety analysis over the host C++ that shares state between threads: every
# translation unit under server/, client/, kernels/common/ and tests/server/ is parsed (not built)
# by Debian's clang with the flags CMake gives it, plus -Wthread-safety -Werror=thread-safety, so
# the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED / ABSL_LOCKS_EXCLUDED annotations are
# checked. Exits non-zero on any thread-safety warning (or a file clang cannot parse).
#   scripts/thread-safety.sh                       # CPU configuration, plus the GPU runtime
#                                                  # (server/engine/gpu) when nvcc is installed
#   scripts/thread-safety.sh client/session.cc    # only these translation units
#   ATTND_TSA_DIR=/tmp/tsa ATTND_JOBS=4 scripts/thread-safety.sh
# Configures $ATTND_TSA_DIR/{cpu,cuda} (default build-tsa; a re-run reuses them) and generates the
# protobuf headers there; compiles nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG="${ATTND_TSA_CLANG:-clang++}"  # Debian's clang package (clang 14 on bookworm)
DIR="${ATTND_TSA_DIR:-build-tsa}"
JOBS="${ATTND_JOBS:-$(nproc)}"
FOLDERS="server/ client/ kernels/common/ tests/server/"
NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"  # for the GPU configuration
command -v "$CLANG" >/dev/null || {
  echo "thread-safety: $CLANG not found (Debian package clang; scripts/setup.sh)" >&2
  exit 2
}

now() { date +%s%N; }
# elapsed <start from now>: "12.3 s"
elapsed() {
  local ms=$((($(now) - $1) / 1000000))
  printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
}
start=$(now)

# configure <name> <cmake args...>: a clang configuration exporting compile_commands.json, with
# the generated protobuf/gRPC headers the sources include.
configure() {
  local name=$1
  shift
  local t
  t=$(now)
  cmake -S . -B "$DIR/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_CXX_COMPILER="$CLANG" \
    -DATTND_BUILD_BENCH=OFF "$@" >"$DIR/$name.configure.log" 2>&1 || {
    cat "$DIR/$name.configure.log" >&2
    exit 2
  }
  echo "thread-safety: configured $DIR/$name in $(elapsed "$t")"
  t=$(now)
  mapfile -t generated < <(ninja -C "$DIR/$name" -t targets all |
    sed -n 's/^\([^/].*\.pb\.h\): .*/\1/p')
  cmake --build "$DIR/$name" --target "${generated[@]}" >/dev/null
  echo "thread-safety: generated ${#generated[@]} protobuf/gRPC headers in $(elapsed "$t")"
}

mkdir -p "$DIR"
configure cpu -DATTND_GPU=off
databases=("$DIR/cpu/compile_commands.json")
if command -v "$NVCC" >/dev/null; then
  # The GPU build adds the GPU runtime's host C++ (server/engine/gpu/*.cc); nvcc is only needed
  # for CMake's CUDA checks, the .cu files are not analysed.
  configure cuda -DATTND_GPU=cuda -DCMAKE_CUDA_COMPILER="$NVCC"
  databases+=("$DIR/cuda/compile_commands.json")
else
  echo "thread-safety: $NVCC not found: the GPU runtime (server/engine/gpu) is not analysed"
fi

t=$(now)
status=0
python3 - "$CLANG" "$JOBS" "$PWD" "$FOLDERS" "$*" "${databases[@]}" <<'EOF' || status=$?
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

clang, jobs, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
folders, only = sys.argv[4].split(), set(sys.argv[5].split())
units = {}  # source path -> (directory, argv); the first configuration that compiles it wins
for database in sys.argv[6:]:
    for entry in json.load(open(database)):
        path = os.path.relpath(entry["file"], root)
        if not path.endswith(".cc") or not path.startswith(tuple(folders)) or path in units:
            continue
        if only and path not in only:
            continue
        argv = entry.get("arguments") or shlex.split(entry["command"])
        args, skip = [], False
        for a in argv[1:]:
            if skip:
                skip = False
            elif a == "-o":
                skip = True
            # The project's -Wall -Wextra -Werror are the GCC build's gate; only thread safety
            # is checked here.
            elif a != "-c" and not (a.startswith("-W") and not a.startswith(("-Wp,", "-Wa,"))):
                args.append(a)
        args += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
        units[path] = (entry["directory"], [clang] + args)


def check(path):
    directory, argv = units[path]
    p = subprocess.run(argv, cwd=directory, capture_output=True, text=True)
    return path, p.returncode, p.stderr


if only - set(units):
    sys.exit(f"thread-safety: not analysed here: {' '.join(sorted(only - set(units)))}")
failed = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for path, rc, err in pool.map(check, sorted(units)):
        if rc != 0:
            failed += 1
            sys.stderr.write(err)
            kind = "thread-safety errors" if "-Wthread-safety" in err else "clang cannot parse it"
            print(f"thread-safety: FAIL {path} ({kind})")
print(f"thread-safety: {len(units) - failed} of {len(units)} translation units clean")
sys.exit(1 if failed else 0)
EOF
echo "thread-safety: analysis took $(elapsed "$t"); total $(elapsed "$start")"
exit "$status"

#!/usr/bin/env bash
# The format and lint gate. Runs every check below on the tracked files, prints one summary line
# per tool with its time, and exits non-zero when any of them has a finding (or cannot run):
#   - clang-format: every C++/CUDA/proto file matches .clang-format (Debian's clang-format 14)
#   - ruff: `ruff check` and `ruff format --check` of every Python file (ruff.toml)
#   - shellcheck: every shell script (*.sh, *.bash and any file with a sh/bash shebang)
#   - clang-tidy: .clang-tidy's checks on the host C++ sources under TIDY_DIRS (below), from a
#     compile_commands.json that this script configures itself (see below)
#   - commits: every commit after COMMIT_BASE has a subject of at most 72 characters and, when
#     it has a body, a blank second line (merge commits are not checked)
#   - kernel-asm: no tracked CUDA/C++ source uses an inline-PTX form known to build into a
#     faulting instruction (today: cp.async with an L2::cache_hint operand, docs/KERNELS.md
#     "Sparse MLA in ping-pong")
# The tools come from scripts/setup.sh (ATTND_SKIP_BUILD=1 scripts/setup.sh installs only).
#   scripts/lint.sh                       # everything
#   scripts/lint.sh ruff shellcheck       # only these (any of the six names above)
# Environment: ATTND_LINT_BUILD_DIR (default build-lint): the CMake folder clang-tidy reads its
# compile commands from (configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON; only the generated
# headers are built there, nothing is compiled); ATTND_JOBS (default nproc): clang-tidy processes.
# Fixing findings: `clang-format -i FILE`, `ruff check --fix FILE` and `ruff format FILE`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# Commits after this one are checked (29253c2: the tree the code-health issue was filed at).
COMMIT_BASE=29253c20c97783b6edeb2020c048b799c180677d
CLANG_FORMAT_MAJOR=14
CLANG_TIDY_MAJOR=14
RUFF_VERSION=0.17.6
# clang-tidy's scope: the host sources of the library and service layers. Tests and benchmarks
# are left out to keep the gate fast on a 2-core machine (see .clang-tidy for the timings).
TIDY_DIRS="kernels server client common"
# Sources under TIDY_DIRS that clang-tidy leaves out (space-separated paths; none today: every
# source parses with clang).
TIDY_SKIP=""
LINT_BUILD_DIR="${ATTND_LINT_BUILD_DIR:-build-lint}"
JOBS="${ATTND_JOBS:-$(nproc)}"

ALL_TOOLS=(clang-format ruff shellcheck clang-tidy commits kernel-asm)
if (($#)); then TOOLS=("$@"); else TOOLS=("${ALL_TOOLS[@]}"); fi
for tool in "${TOOLS[@]}"; do
  case " ${ALL_TOOLS[*]} " in
    *" $tool "*) ;;
    *) echo "lint: unknown tool '$tool'; want some of: ${ALL_TOOLS[*]}" >&2; exit 2 ;;
  esac
done

SUMMARY=()
FAILED=()
LOG_DIR="$(mktemp -d)"
trap 'rm -rf "$LOG_DIR"' EXIT

# tracked PATHSPEC...: the tracked files matching the git pathspecs that exist in the work
# tree, NUL-separated.
tracked() {
  local f
  while IFS= read -r -d '' f; do
    if [ -f "$f" ]; then printf '%s\0' "$f"; fi
  done < <(git ls-files -z -- "$@")
}

# with_shebang REGEX: the tracked text files whose first line matches REGEX (a #! line).
with_shebang() {
  local f line
  while IFS= read -r -d '' f; do
    line=""
    [ -f "$f" ] || continue
    IFS= read -r line <"$f" || [ -n "$line" ] || continue
    if [[ "$line" =~ $1 ]]; then printf '%s\0' "$f"; fi
  done < <(git grep -lzI -e '^#!' -- . 2>/dev/null)
}

# ruff: the executable on PATH, else python3's module (where pip installed it).
if command -v ruff >/dev/null; then RUFF=(ruff); else RUFF=(python3 -m ruff); fi

# need VERSION COMMAND...: whether COMMAND runs and `COMMAND --version` names VERSION (a major
# version or a full one; empty: any).
need() {
  local want="$1" got
  shift
  if ! got="$("$@" --version 2>/dev/null)"; then
    echo "lint: $* is not installed (ATTND_SKIP_BUILD=1 scripts/setup.sh installs it)"
    return 1
  fi
  if [ -n "$want" ] && ! grep -qE "(version |ruff )$want([. ]|$)" <<<"$got"; then
    echo "lint: $* is not version $want: $(head -n 1 <<<"$got")"
    echo "      (scripts/setup.sh installs the pinned one)"
    return 1
  fi
}

# ---- clang-format ----
lint_clang_format() {
  need "$CLANG_FORMAT_MAJOR" clang-format || return 1
  local files=() bad=() f
  while IFS= read -r -d '' f; do files+=("$f"); done < <(
    tracked '*.cc' '*.h' '*.cu' '*.cuh' '*.cpp' '*.hpp' '*.c' '*.inc' '*.proto')
  # One process per 50 files, two at a time; every file is checked even when one fails.
  printf '%s\0' "${files[@]}" |
    xargs -0 -n 50 -P 2 clang-format --dry-run -Werror --ferror-limit=3 >"$LOG_DIR/cf" 2>&1
  mapfile -t bad < <(sed -nE 's/^([^ :]+):[0-9]+:[0-9]+: error: .*clang-format-violations.*/\1/p' \
    "$LOG_DIR/cf" | sort -u)
  if ((${#bad[@]})) || grep -q . "$LOG_DIR/cf"; then
    cat "$LOG_DIR/cf"
    echo "lint: clang-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format" \
      "(fix: clang-format -i FILE):"
    printf '  %s\n' "${bad[@]}"
    DETAIL="${#bad[@]} of ${#files[@]} files unformatted"
    return 1
  fi
  DETAIL="${#files[@]} files"
}

# ---- ruff ----
# Python files: *.py and *.pyi, and tracked files with a python shebang.
python_files() {
  { tracked '*.py' '*.pyi'; with_shebang '^#!.*python'; } | sort -zu
}

lint_ruff() {
  need "$RUFF_VERSION" "${RUFF[@]}" || return 1
  local files=() f rc=0
  while IFS= read -r -d '' f; do files+=("$f"); done < <(python_files)
  if ! "${RUFF[@]}" check --no-cache --quiet "${files[@]}"; then
    echo "lint: ruff check: findings above (ruff check --fix FILE fixes the [*] ones)"
    rc=1
  fi
  if ! "${RUFF[@]}" format --no-cache --check --quiet "${files[@]}"; then
    "${RUFF[@]}" format --no-cache --check "${files[@]}" 2>&1 | grep -v 'already formatted'
    echo "lint: ruff format: files above are not formatted (fix: ruff format FILE)"
    rc=1
  fi
  DETAIL="${#files[@]} files"
  return "$rc"
}

# ---- shellcheck ----
# Shell scripts: *.sh and *.bash, and tracked files with a sh/bash/dash/ksh shebang.
shell_files() {
  { tracked '*.sh' '*.bash'; with_shebang '^#!.*[/ ](ba|da|k)?sh([[:space:]]|$)'; } | sort -zu
}

lint_shellcheck() {
  need "" shellcheck || return 1
  local files=() f
  while IFS= read -r -d '' f; do files+=("$f"); done < <(shell_files)
  DETAIL="${#files[@]} files"
  # -x: follow the files scripts source (their `# shellcheck source=` directives).
  shellcheck -x "${files[@]}"
}

# ---- clang-tidy ----
# Configures LINT_BUILD_DIR (CPU build, compile_commands.json) and generates the headers the
# sources include from it (the protobuf/gRPC stubs); prints the sources in TIDY_DIRS.
tidy_sources() {
  if ! cmake -S . -B "$LINT_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTND_GPU=off \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$LOG_DIR/cmake" 2>&1; then
    cat "$LOG_DIR/cmake" >&2
    echo "lint: clang-tidy: cmake could not configure $LINT_BUILD_DIR" >&2
    return 1
  fi
  local generated=()
  mapfile -t generated < <(ninja -C "$LINT_BUILD_DIR" -t targets all |
    sed -nE 's/^([^/][^:]*\.(h|hpp|inc)): CUSTOM_COMMAND$/\1/p')
  if ((${#generated[@]})) && ! ninja -C "$LINT_BUILD_DIR" "${generated[@]}" >"$LOG_DIR/gen" 2>&1
  then
    cat "$LOG_DIR/gen" >&2
    echo "lint: clang-tidy: the generated headers failed to build" >&2
    return 1
  fi
  local root dirs
  root="$(pwd -P)"
  dirs="$(tr ' ' '|' <<<"$TIDY_DIRS")"
  python3 - "$LINT_BUILD_DIR/compile_commands.json" "$root" "$dirs" "$TIDY_SKIP" <<'EOF'
import json, os, re, sys
db, root, dirs, skip = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4].split())
want = re.compile(r"(%s)/.*\.(cc|cpp)$" % dirs)
seen = set()
for entry in json.load(open(db)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if want.fullmatch(rel) and rel not in seen | skip:
        seen.add(rel)
        print(rel)
EOF
}

lint_clang_tidy() {
  need "$CLANG_TIDY_MAJOR" clang-tidy || return 1
  local files=() tidy_rc=0 failed=()
  mapfile -t files < <(tidy_sources) || return 1
  if ((${#files[@]} == 0)); then
    echo "lint: clang-tidy: no sources found under $TIDY_DIRS"
    return 1
  fi
  # Each file's output in its own log (no interleaving); a file fails on any finding
  # (WarningsAsErrors in .clang-tidy) or when it does not parse.
  mkdir -p "$LOG_DIR/tidy"
  # shellcheck disable=SC2016  # expanded by the inner sh
  printf '%s\0' "${files[@]}" | xargs -0 -n 1 -P "$JOBS" sh -c \
    'clang-tidy --quiet -p "$1" "$3" >"$2/$(echo "$3" | tr / _).log" 2>&1 ||
       echo "$3" >>"$2/failed"' sh "$LINT_BUILD_DIR" "$LOG_DIR/tidy" || tidy_rc=1
  DETAIL="${#files[@]} files"
  if [ -s "$LOG_DIR/tidy/failed" ] || ((tidy_rc)); then
    mapfile -t failed < <(sort "$LOG_DIR/tidy/failed" 2>/dev/null)
    local f
    for f in "${failed[@]}"; do
      grep -vE '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings' \
        "$LOG_DIR/tidy/$(echo "$f" | tr / _).log"
    done
    echo "lint: clang-tidy: findings in ${#failed[@]} of ${#files[@]} files:"
    printf '  %s\n' "${failed[@]}"
    DETAIL="findings in ${#failed[@]} of ${#files[@]} files"
    return 1
  fi
}

# ---- commits ----
lint_commits() {
  if ! git cat-file -e "$COMMIT_BASE^{commit}" 2>/dev/null; then
    echo "lint: commits: the base $COMMIT_BASE is not in this clone (a shallow clone? fetch"
    echo "      the full history)"
    return 1
  fi
  if ! git merge-base --is-ancestor "$COMMIT_BASE" HEAD; then
    echo "lint: commits: HEAD does not descend from the base $COMMIT_BASE"
    return 1
  fi
  local commits=() c message subject second nbad=0
  mapfile -t commits < <(git rev-list --no-merges "$COMMIT_BASE..HEAD")
  for c in "${commits[@]}"; do
    message="$(git log -1 --format=%B "$c")"
    subject="$(sed -n 1p <<<"$message")"
    second="$(sed -n 2p <<<"$message")"
    if ((${#subject} > 72)) || [ -n "$second" ]; then
      ((${#subject} > 72)) &&
        echo "lint: commits: ${c:0:10}: subject of ${#subject} characters (at most 72): $subject"
      [ -n "$second" ] && echo "lint: commits: ${c:0:10}: the second line is not blank: $subject"
      nbad=$((nbad + 1))
    fi
  done
  DETAIL="${#commits[@]} commits after ${COMMIT_BASE:0:10}"
  if ((nbad)); then
    DETAIL="$nbad of $DETAIL"
    echo "lint: commits: reword them (a subject of <= 72 characters, a blank line, the body)"
    return 1
  fi
}

# ---- kernel-asm ----
# CUDA 13.0's ptxas turns `cp.async ... .L2::cache_hint ...` into an LDGSTS that faults with "an
# illegal instruction" on sm_90 (a stand-alone kernel reproduces it); the plain form is fine.
lint_kernel_asm() {
  local files=() f hits
  while IFS= read -r -d '' f; do files+=("$f"); done < <(tracked '*.cu' '*.cuh' '*.h' '*.cc')
  DETAIL="${#files[@]} files"
  hits="$(grep -nE 'cp\.async[^"]*L2::cache_hint' "${files[@]}" /dev/null)"
  if [ -n "$hits" ]; then
    echo "$hits"
    echo "lint: kernel-asm: cp.async with an L2::cache_hint operand faults at run time (use the"
    echo "  plain form; docs/KERNELS.md \"Sparse MLA in ping-pong\")"
    return 1
  fi
}

for tool in "${TOOLS[@]}"; do
  DETAIL=""
  start="$EPOCHREALTIME"
  echo "lint: running $tool"
  "lint_${tool//-/_}"
  rc=$?
  seconds="$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
  if ((rc)); then
    SUMMARY+=("$(printf '%-13s FAILED %6s s  %s' "$tool" "$seconds" "$DETAIL")")
    FAILED+=("$tool")
  else
    SUMMARY+=("$(printf '%-13s ok     %6s s  %s' "$tool" "$seconds" "$DETAIL")")
  fi
done

echo "lint: summary"
printf '  %s\n' "${SUMMARY[@]}"
if ((${#FAILED[@]})); then
  echo "lint: FAILED: ${FAILED[*]}"
  exit 1
fi
echo "lint: all passed"

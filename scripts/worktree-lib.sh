# shellcheck shell=bash
# Sourced by the scripts that build another revision beside the working tree (ptx-diff.sh,
# device-base-bundle.sh): a detached git worktree of REV in a fresh temporary folder, removed
# with the folder when the script exits.
#   source "$(dirname "$0")/worktree-lib.sh"
#   temp_worktree REV NAME   # sets WORK (the folder) and TREE (the worktree, $WORK/tree); NAME
#                            # prefixes the message when REV is not a revision (exit 2)
temp_worktree() {
  local rev=$1 name=$2
  git rev-parse --verify --quiet "$rev^{commit}" > /dev/null ||
    { echo "$name: '$rev' is not a revision" >&2; exit 2; }
  WORK=$(mktemp -d)
  TREE="$WORK/tree"
  # shellcheck disable=SC2064  # the paths are fixed now
  trap "git worktree remove --force '$TREE' > /dev/null 2>&1 || true; rm -rf '$WORK'" EXIT
  git worktree add --detach --quiet "$TREE" "$rev"
}

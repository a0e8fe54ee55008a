#!/bin/sh
# A CXX_LINKER_LAUNCHER that records a link instead of failing the build with it: runs the link
# command, writes its output and exit status to LOG and exits 0. When the link fails it leaves
# an empty file at the -o path, so that the build step counts as done until its inputs change.
#   capture_link.sh LOG <link command...>
set -u
log=$1
shift
out=
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out=$arg; fi
  prev=$arg
done
"$@" >"$log.tmp" 2>&1
status=$?
echo "link exit status: $status" >>"$log.tmp"
mv "$log.tmp" "$log"
if [ "$status" -ne 0 ] && [ -n "$out" ]; then : >"$out"; fi
exit 0

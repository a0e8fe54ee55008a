#!/bin/sh
# attnd as a client of one CUDA MPS server, the server its frontends use too (docs/OPERATIONS.md
# "MPS"). Staged as /opt/attnd/bin/attnd-mps in the CUDA image; every argument goes to attnd:
#   docker run ... -v /run/nvidia-mps:/run/nvidia-mps --entrypoint attnd-mps attnd:cuda --listen=...
# If no MPS control daemon answers on CUDA_MPS_PIPE_DIRECTORY, it starts one
# (nvidia-cuda-mps-control -d) and quits it when attnd exits; one that already runs (the host's,
# another container's) is joined and left running. attnd runs as a child: SIGTERM/SIGINT are
# passed on, attnd drains, and its exit status is this script's.
# Environment:
#   ATTND_MPS                 1 (default): as above; 0: exec attnd without touching MPS
#   CUDA_MPS_PIPE_DIRECTORY   default /run/nvidia-mps/pipe (frontends must set the same path)
#   CUDA_MPS_LOG_DIRECTORY    default /run/nvidia-mps/log
#   ATTND_MPS_WAIT            seconds to wait for a new control daemon to answer (default 10)
set -u

if [ "${ATTND_MPS:-1}" = 0 ]; then exec attnd "$@"; fi
if [ "${ATTND_MPS:-1}" != 1 ]; then
  echo "attnd-mps: ATTND_MPS=${ATTND_MPS}: want 1 or 0" >&2
  exit 2
fi

: "${CUDA_MPS_PIPE_DIRECTORY:=/run/nvidia-mps/pipe}"
: "${CUDA_MPS_LOG_DIRECTORY:=/run/nvidia-mps/log}"
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

say() { echo "attnd-mps: $*" >&2; }
mps_up() { echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1; }

if ! command -v nvidia-cuda-mps-control > /dev/null 2>&1; then
  say "nvidia-cuda-mps-control not found (the NVIDIA runtime mounts it with the compute capability)"
  exit 1
fi

started=0
if mps_up; then
  say "joining the MPS control daemon already on $CUDA_MPS_PIPE_DIRECTORY (left running on exit)"
else
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || exit 1
  if ! nvidia-cuda-mps-control -d; then
    say "nvidia-cuda-mps-control -d failed (logs: $CUDA_MPS_LOG_DIRECTORY)"
    exit 1
  fi
  tries=$((${ATTND_MPS_WAIT:-10} * 10))
  until mps_up; do
    tries=$((tries - 1))
    if [ "$tries" -le 0 ]; then
      say "the MPS control daemon does not answer on $CUDA_MPS_PIPE_DIRECTORY"
      exit 1
    fi
    sleep 0.1
  done
  started=1
  say "started an MPS control daemon on $CUDA_MPS_PIPE_DIRECTORY (logs: $CUDA_MPS_LOG_DIRECTORY)"
fi

attnd "$@" &
pid=$!
# shellcheck disable=SC2317  # run by the trap
forward() { kill -"$1" "$pid" 2> /dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
status=0
wait "$pid" || status=$?
# A trapped signal ends `wait` early: wait again until attnd itself has exited (its drain).
while kill -0 "$pid" 2> /dev/null; do
  status=0
  wait "$pid" || status=$?
done
if [ "$started" = 1 ]; then
  # Stops the server and the control daemon; clients still attached (frontends) lose them.
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1 || say "quitting the MPS control daemon failed"
  say "quit the MPS control daemon on $CUDA_MPS_PIPE_DIRECTORY"
fi
exit "$status"

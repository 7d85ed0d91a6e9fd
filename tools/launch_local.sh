#!/usr/bin/env bash
# Starts N processes of a data-parallel olmax program on this machine and waits for them:
#     bash tools/launch_local.sh N build/examples/train_lm [flags...]
# Each gets --world_size=N --rank=R and a fresh file rendezvous (a temporary folder), plus
# --threads=T with T = cores / N unless the flags set --threads. Rank 0's output is shown as is;
# the other ranks' lines are prefixed with "[rank R]". When a rank fails, the others are stopped
# (they would otherwise wait for it until --collective_timeout_s) and the launcher exits with the
# first failing rank's status. SIGINT (Ctrl-C) or SIGTERM to the launcher is passed on to the ranks
# as SIGTERM, which train_lm answers by finishing the current step and writing a checkpoint; the
# launcher waits for them and exits with their status (143). A second SIGINT or SIGTERM kills the
# ranks at once.
set -uo pipefail

if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash tools/launch_local.sh N PROGRAM [flags...]   (N >= 1 processes)" >&2
  exit 2
fi
ranks=$1
program=$2
shift 2
[ -x "$program" ] || { echo "launch_local: $program is not an executable (build it first)" >&2; exit 2; }

extra=()
threads_given=false
for arg in "$@"; do
  case $arg in --threads=*|--threads) threads_given=true ;; esac
done
if ! $threads_given; then
  cores=$(nproc)
  per_rank=$(( cores / ranks ))
  [ "$per_rank" -ge 1 ] || per_rank=1
  extra+=("--threads=$per_rank")
fi

store=$(mktemp -d "${TMPDIR:-/tmp}/olmax-rendezvous.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$store"
}
trap cleanup EXIT
stopping=false
on_signal() {
  if $stopping; then
    echo "launch_local: stopping the ranks at once" >&2
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    exit 130
  fi
  stopping=true
  echo "launch_local: asking the ranks to stop after their current step (again: at once)" >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
}
trap on_signal INT TERM

for (( rank = 0; rank < ranks; ++rank )); do
  flags=("$@" "${extra[@]}" "--world_size=$ranks" "--rank=$rank" "--rendezvous=file:$store")
  if [ "$rank" -eq 0 ]; then
    "$program" "${flags[@]}" &
  else
    "$program" "${flags[@]}" > >(sed -u "s/^/[rank $rank] /") 2> >(sed -u "s/^/[rank $rank] /" >&2) &
  fi
  pids+=($!)
done

# Each rank's status by `wait PID` (bash keeps it even when it reaped the process early), not by
# `wait -n -p`: a rank that has already ended by then can make that fail with "no such job".
status=0
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  wait -n "${running[@]}" 2>/dev/null || true  # until one ends (at once if one has)
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null && [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
      still+=("$pid")
      continue
    fi
    wait "$pid"
    code=$?
    if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
      status=$code
      $stopping && continue  # every rank is stopping anyway
      for (( rank = 0; rank < ranks; ++rank )); do
        [ "${pids[$rank]}" = "$pid" ] && echo "launch_local: rank $rank exited with status $code; stopping the others" >&2
      done
      for other in "${pids[@]}"; do kill "$other" 2>/dev/null; done
    fi
  done
  running=("${still[@]}")
  [ "${#running[@]}" -eq 0 ] || sleep 0.05
done
exit "$status"

#!/usr/bin/env bash
# Starts N processes of a data-parallel olmax program on this machine and waits for them:
#     bash tools/launch_local.sh N build/examples/train_lm [flags...]
# Each gets --world_size=N --rank=R and a fresh file rendezvous (a temporary folder), plus
# --threads=T with T = cores / N unless the flags set --threads. Rank 0's output is shown as is;
# the other ranks' lines are prefixed with "[rank R]". When a rank fails, the others are stopped
# (they would otherwise wait for it until --collective_timeout_s) and the launcher exits with the
# first failing rank's status.
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
trap 'exit 130' INT TERM

for (( rank = 0; rank < ranks; ++rank )); do
  flags=("$@" "${extra[@]}" "--world_size=$ranks" "--rank=$rank" "--rendezvous=file:$store")
  if [ "$rank" -eq 0 ]; then
    "$program" "${flags[@]}" &
  else
    "$program" "${flags[@]}" > >(sed -u "s/^/[rank $rank] /") 2> >(sed -u "s/^/[rank $rank] /" >&2) &
  fi
  pids+=($!)
done

status=0
remaining=$ranks
while [ "$remaining" -gt 0 ]; do
  wait -n -p finished "${pids[@]}"
  code=$?
  remaining=$(( remaining - 1 ))
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    for (( rank = 0; rank < ranks; ++rank )); do
      [ "${pids[$rank]}" = "$finished" ] && echo "launch_local: rank $rank exited with status $code; stopping the others" >&2
    done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  fi
done
exit "$status"

#!/usr/bin/env bash
# Starts the ranks of one tests/distributed case on this machine (TCP on 127.0.0.1, a Gloo file
# store in a fresh temporary folder) and passes when every rank exits 0.
#
#   run_ranks.sh PROGRAM CASE WORLD [STARTED [TIMEOUT_MS [RENDEZVOUS]]]
#
# STARTED (default WORLD) ranks are started, 0 .. STARTED-1: fewer than WORLD leaves the others
# missing (the rendezvous case). Each rank runs under `timeout` (TIMEOUT_MS + 60 s), so a rank that
# hangs despite the library's own timeouts fails the test instead of blocking it. Every rank's
# output is printed, prefixed with its rank. RENDEZVOUS "tcp" (default "file") passes every rank
# --rendezvous=tcp:127.0.0.1:PORT instead, a TCP store that rank 0 hosts on a port the OS reports
# free just before (PROGRAM --free_port), so that concurrent runs do not collide.
set -uo pipefail
program=$1 case_name=$2 world=$3 started=${4:-$3} timeout_ms=${5:-20000} rendezvous=${6:-file}
store=$(mktemp -d "${TMPDIR:-/tmp}/olmax-distributed-XXXXXX")
trap 'rm -rf "$store"' EXIT
limit=$(( timeout_ms / 1000 + 60 ))

extra=()
if [ "$rendezvous" = tcp ]; then
  port=$("$program" --free_port) || { echo "run_ranks: $program --free_port failed" >&2; exit 1; }
  extra=(--rendezvous="tcp:127.0.0.1:$port")
  echo "run_ranks: TCP store on 127.0.0.1:$port"
fi

pids=()
for (( rank = 0; rank < started; ++rank )); do
  timeout --kill-after=5 "$limit" "$program" --case="$case_name" --rank="$rank" --world="$world" \
    --store="$store/store" --timeout_ms="$timeout_ms" "${extra[@]}" >"$store/rank$rank.log" 2>&1 &
  pids+=($!)
done

status=0
for (( rank = 0; rank < started; ++rank )); do
  wait "${pids[$rank]}"
  code=$?
  sed "s/^/[rank $rank] /" "$store/rank$rank.log"
  if [ "$code" -ne 0 ]; then
    echo "run_ranks: rank $rank exited with status $code" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "run_ranks: $case_name passed on $started of $world ranks ($rendezvous rendezvous)"
exit "$status"

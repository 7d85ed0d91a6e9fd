#!/usr/bin/env bash
# Starts one tests/distributed case over MPI with mpirun on this machine and checks how the job ends.
#
#   run_mpi.sh MPIEXEC PROGRAM CASE RANKS TIMEOUT_MS EXPECTED
#
# EXPECTED:
#   pass     mpirun exits 0 and every rank printed "all checks passed".
#   aborted  (peer_hang) rank 0's collective timed out and its checks passed, then its broken
#            communicator called MPI_Abort: mpirun exits nonzero, and the hung rank 1 was ended by
#            it before waking up (it never reports).
#   killed   (peer_exit) rank 1 exited without MPI_Finalize: mpirun ends the job, nonzero, within
#            10 s although the collective timeout is longer (so the end came from mpirun, not from
#            rank 0's timeout), and no rank reports a failed check.
# The job runs under `timeout` (TIMEOUT_MS + 60 s): a hang fails the test instead of blocking it.
# As root, Open MPI's mpirun needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM); more ranks than cores need
# oversubscription (both set here; other MPIs ignore these variables).
set -uo pipefail
mpiexec=$1 program=$2 case_name=$3 ranks=$4 timeout_ms=$5 expected=$6
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# In the sanitizer build: Open MPI leaves allocations of its plugins (dlclose'd, so unattributable)
# at exit, which LeakSanitizer would report; leak checking of the same cases runs over Gloo.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
log=$(mktemp "${TMPDIR:-/tmp}/olmax-distributed-mpi-XXXXXX")
trap 'rm -f "$log"' EXIT
limit=$(( timeout_ms / 1000 + 60 ))

start=$(date +%s%N)
timeout --kill-after=5 "$limit" "$mpiexec" -n "$ranks" "$program" --case="$case_name" --timeout_ms="$timeout_ms" >"$log" 2>&1
code=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$log"
echo "run_mpi: $case_name on $ranks ranks: mpirun exited with status $code after $elapsed_ms ms"

fail() { echo "run_mpi: FAILED: $*" >&2; exit 1; }
[ "$code" -eq 124 ] || [ "$code" -eq 137 ] && fail "the job did not end within $limit s"
grep -q "FAILED" "$log" && fail "a rank reported a failed check"
case "$expected" in
  pass)
    [ "$code" -eq 0 ] || fail "mpirun exited with status $code"
    passed=$(grep -c "all checks passed" "$log")
    [ "$passed" -eq "$ranks" ] || fail "$passed of $ranks ranks reported all checks passed" ;;
  aborted)
    [ "$code" -ne 0 ] || fail "the job was not aborted"
    grep -q "rank 0: all checks passed" "$log" || fail "rank 0's checks did not pass"
    grep -q "ending the MPI job (MPI_Abort)" "$log" || fail "rank 0's communicator did not abort the job"
    grep -q "rank 1 (woke up)\|rank 1: all checks passed" "$log" && fail "rank 1 woke up: the abort did not end it" ;;
  killed)
    [ "$code" -ne 0 ] || fail "the job ended with status 0 although a rank died"
    [ "$elapsed_ms" -lt 10000 ] || fail "the job took $elapsed_ms ms to end after a rank died" ;;
  *) fail "unknown expectation '$expected'" ;;
esac
echo "run_mpi: $case_name passed ($expected)"

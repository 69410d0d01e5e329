#!/bin/sh
# run_fail.sh MPIEXEC NP WANT PROGRAM ARGS... - runs a failure test under mpirun with a
# hard time limit and passes only if at least WANT ranks printed "SURVIVOR-OK" and none
# printed "FAIL".  mpirun's own exit status is ignored: it reports the rank that died.
# orte_enable_recovery keeps the survivors alive after a peer's death (Open MPI would
# otherwise kill the whole job at once, before anyone could report); it is an Open MPI
# 4.x parameter, other MPIs ignore the variable.  RUN_FAIL_LIMIT (seconds, default 60)
# raises the hard limit for programs that start slowly (Python importing torch).
MPIEXEC=$1 NP=$2 WANT=$3
shift 3
OUT=$(mktemp)
export OMPI_MCA_orte_enable_recovery=1
timeout -k 5 "${RUN_FAIL_LIMIT:-60}" "$MPIEXEC" -np "$NP" "$@" >"$OUT" 2>&1
RC=$?
OK=$(grep -c '^SURVIVOR-OK' "$OUT")
BAD=$(grep -c '^FAIL' "$OUT")
grep -E '^(SURVIVOR-OK|FAIL)' "$OUT"
if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then
    echo "run_fail.sh: hard time limit hit (a rank hung)"
    cat "$OUT"
    rm -f "$OUT"
    exit 1
fi
rm -f "$OUT"
if [ "$OK" -ge "$WANT" ] && [ "$BAD" -eq 0 ]; then
    echo "run_fail.sh: $OK of $NP ranks reported as expected"
    exit 0
fi
echo "run_fail.sh: only $OK survivors reported (want $WANT), $BAD failures"
exit 1

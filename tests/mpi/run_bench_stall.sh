#!/bin/sh
# run_bench_stall.sh MPIEXEC GRADCOMP NP TIMEOUT - `gradcomp allreduce-bench --timeout
# TIMEOUT` under mpirun with NP ranks, the last rank stopped with SIGSTOP a few seconds in.
# Passes only when every other rank printed a timeout error ("rank R: ... timed out") and
# mpirun ended within TIMEOUT + 10 s of the SIGSTOP (the tool used to wait in blocking
# MPI_Barrier / MPI_Allreduce for ever).  Plain mpirun settings: the job ends when the
# first rank gives up (mpirun then kills the stopped one), which the tool allows for by
# telling the others first.
MPIEXEC=$1 GRADCOMP=$2 NP=$3 TIMEOUT=$4
victim=$((NP - 1))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Rank `victim` writes its pid; exec keeps it, so SIGSTOP reaches the rank itself.
# OMPI_COMM_WORLD_RANK is Open MPI's; PMI_RANK / PMIX_RANK cover other launchers.
timeout -k 5 $((TIMEOUT * 4 + 60)) "$MPIEXEC" -np "$NP" sh -c '
    r=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-0}}}
    [ "$r" = "$1" ] && echo $$ >"$2/victim.pid"
    shift 2
    exec "$@"' sh "$victim" "$dir" "$GRADCOMP" allreduce-bench -c topk:density=0.01 -n 4000000 \
    --runs 1000 --warmup 0 --timeout "$TIMEOUT" >"$dir/out" 2>&1 &
job=$!
# Let the ranks get into the timed loop (set-up takes a moment on a loaded machine); the
# 4M-element runs take far longer than those seconds, so the job is still running on a quiet one.
i=0
while [ ! -s "$dir/victim.pid" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
sleep 4
pid=$(cat "$dir/victim.pid" 2>/dev/null)
if [ -z "$pid" ] || ! kill -STOP "$pid" 2>/dev/null; then
    echo "run_bench_stall: could not stop rank $victim (pid '$pid'); output:"
    cat "$dir/out"
    kill "$job" 2>/dev/null
    exit 1
fi
t0=$(date +%s)
wait "$job"
rc=$?
t1=$(date +%s)
kill -KILL "$pid" 2>/dev/null # if mpirun left it behind
cat "$dir/out"
took=$((t1 - t0))
echo "run_bench_stall: mpirun exited with $rc, $took s after the SIGSTOP (--timeout $TIMEOUT)"
bad=0
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "run_bench_stall: FAIL: hard time limit hit (the job hung)"
    bad=1
fi
if [ "$took" -gt $((TIMEOUT + 10)) ]; then
    echo "run_bench_stall: FAIL: the job ended $took s after the stop (limit $((TIMEOUT + 10)))"
    bad=1
fi
r=0
while [ $r -lt "$victim" ]; do
    if ! grep -q "rank $r: .*timed out" "$dir/out"; then
        echo "run_bench_stall: FAIL: rank $r printed no timeout error"
        bad=1
    fi
    r=$((r + 1))
done
[ "$bad" -eq 0 ] && echo "run_bench_stall: every other rank reported the timeout"
exit $bad

#!/bin/sh
# test_cost_bytes.sh MPIEXEC GRADCOMP WORKDIR - the cost model's bytes per step against the
# MPI layer's own counters: for every strategy, a real 4-rank `gradcomp allreduce-bench`
# reports gcomp_mpi_stats bytes_sent per rank (max and min over ranks) and `gradcomp plan
# --json` predicts them for the same tensor.  Deterministic sizes must match exactly (the
# model gives the mean over ranks, so it must lie in [min, max], which is one number when
# every rank sends the same); top-k's index coding may pick a smaller coding than the
# estimate (within 3 % above), the sparse strategy's slices depend on where the selected
# elements fall (within 10 %).
set -u
MPIEXEC=$1
G=$2
W=$3
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fails=0
pass=0
check() { # check NAME SPEC STRATEGY N SHAPE(RxC or -) TOL [RANKS_PER_NODE]
  name=$1 spec=$2 strat=$3 n=$4 shape=$5 tol=$6 rpn=${7:-0}
  if [ "$shape" = - ]; then echo "t $n" > model.txt; shapearg=""
  else echo "t $(echo "$shape" | tr x ' ')" > model.txt; shapearg="--shape $shape"; fi
  nodes=4; [ "$rpn" -gt 0 ] && nodes=$((4 / rpn))
  # shellcheck disable=SC2086
  "$MPIEXEC" -np 4 "$G" allreduce-bench -c "$spec" -n "$n" $shapearg --strategy "$strat" \
      --ranks-per-node "$rpn" --runs 2 --warmup 1 --no-baseline --no-check --json > bench.json 2> bench.err
  rc=$?
  "$G" plan --model model.txt --compare "policy:spec=$spec;dense=$spec;min_elements=1;dense_1d=0@$strat" \
      --workers 4 --nodes $nodes --link 1gbit --compute-ms 0 --calibration none.txt --json > plan.json 2> plan.err
  rc2=$?
  if [ $rc -ne 0 ] || [ $rc2 -ne 0 ]; then
    echo "FAIL $name: bench rc=$rc plan rc=$rc2"; cat bench.err plan.err; fails=$((fails + 1)); return
  fi
  if python3 - "$name" "$tol" <<'PYEOF'
import json, sys
name, tol = sys.argv[1], float(sys.argv[2])
b = json.load(open("bench.json"))
p = json.load(open("plan.json"))
hi, lo = b["bytes_sent_per_rank"]["max"], b["bytes_sent_per_rank"]["min"]
model = p["results"][0]["bytes_per_step"]
if hi != lo and lo == 0:  # hierarchical: only node leaders send between nodes
    lo = hi
ok = (lo - 1 <= model <= hi + 1) if tol == 0 else (abs(model - hi) <= tol * hi)
print(f"{'ok  ' if ok else 'FAIL'} {name}: library sent {lo:.0f}..{hi:.0f} B/rank, model {model:.0f} B"
      f" ({b['strategy']})")
sys.exit(0 if ok else 1)
PYEOF
  then pass=$((pass + 1)); else fails=$((fails + 1)); fi
}
printf 'gradcomp-calibration 1\n' > none.txt
check "dense f32 ring"        none                   allreduce 1048576 -          0
check "dense f32 small"       none                   allreduce 1000    -          0
check "dense f16 ring"        none:values=f16        allreduce 1000003 -          0
check "randomk allreduce"     randomk:density=0.01   allreduce 1000000 -          0.01
check "powersgd rank 4"       powersgd:rank=4        allreduce 1000000 1000x1000  0
check "powersgd 2 iters"      powersgd:rank=2,iters=2 allreduce 300000 600x500    0
check "sign allgather"        sign:feedback=ef       allgather 1000000 -          0
check "twobit allgather"      twobit:threshold=0.5   allgather 1000000 -          0
check "topk allgather"        topk:density=0.01      allgather 1000000 -          0.03
check "dgc allgather"         dgc:density=0.001      allgather 1000000 -          0.03
check "int8 rsag"             int8                   rsag      1000003 -          0
check "sign rsag"             sign:feedback=ef       rsag      1000000 -          0
check "topk sparse"           topk:density=0.01      sparse    1000000 -          0.10
check "hierarchical allgather" sign:feedback=ef      hierarchical:allgather 1000000 - 0 2
echo "$pass passed, $fails failed"
[ $fails -eq 0 ]

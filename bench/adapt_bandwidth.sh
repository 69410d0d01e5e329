#!/bin/sh
# bench/adapt_bandwidth.sh [BUILD] RATE|change [SEED] - the bandwidth-aware adaptive method
# against fixed methods on 4 netsim hosts (root; docs/BENCHMARKS.md, "Bandwidth-aware on
# netsim").  One run per link rate: the same mlp-large training, every method given BUDGET
# seconds of training (default 60; --time-budget), the target the dense run's final
# accuracy.  Each method trains in its own `gradcomp train` job, dense first, the others
# with --target-acc set to dense's final accuracy: methods run one after another in one
# job step 7-14 % slower than the first (docs/BENCHMARKS.md, "Three seeds, medians"), and
# the method compared would always be the one run last.  ONE_JOB=1 runs them all in one
# `--compare` job instead, as the tables before 2026-11-27 22:45 UTC were made.  The table
# at the end reads each job's results.json (OUT/summary.tsv).
#   RATE     a tc rate (100mbit, 1gbit) or none (unshaped: the CPUs are the limit)
#   change   the adaptive method alone on links that start at FROM (default 1gbit) and are
#            reshaped to TO (default 100mbit) AFTER seconds (default 90) after the job
#            starts, from outside the job (scripts/netsim rate), with a
#            budget of 3 * AFTER: the decisions over time are in OUT/settings.csv and
#            OUT/adapt-*.png
# NP (hosts, one rank each; default 4) and EVALS (per epoch, default 24) may be set in the
# environment; TARGET=A skips the dense job and takes A as its final accuracy (where dense is
# deterministic: at 100mbit it stops by the budget at its first evaluation, so an earlier
# run of the same seed gives it).
set -eu
B=${1:-build}
what=${2:-1gbit}
seed=${3:-1}
G=$B/gradcomp
BASE="dgc:density=0.001,values=f16"
# The adaptive method as a user writes it: its default ladder dense / powersgd:rank=4 /
# top-k 0.001 / top-k 0.0001 (f16 values, error feedback; ADAPT overrides, e.g.
# "adapt:bandwidth;base=$BASE" for DGC's density ladder).
ADAPT=${ADAPT:-adapt:bandwidth}
NP=${NP:-4}
common="--np $NP --model mlp-large --seed $seed --epochs 2 --evals ${EVALS:-24}"
case "$what" in
change)
  FROM=${FROM:-1gbit} TO=${TO:-100mbit} AFTER=${AFTER:-90}
  (
    sleep "$AFTER"
    "$(dirname "$0")/../scripts/netsim" rate "$TO" && date -u +"adapt_bandwidth.sh: at %T" >&2
  ) &
  exec "$G" train $common --link "$FROM" --time-budget $((3 * AFTER)) \
    --out "out/adapt-bw-change-$NP-$FROM-$TO-$seed" --compare "$ADAPT"
  ;;
*)
  out="out/adapt-bw-$NP-$what-$seed"
  run="$G train $common --link $what --time-budget ${BUDGET:-60}"
  if [ "${ONE_JOB:-0}" = 1 ]; then
    exec $run --out "$out" --compare "dense,$BASE,powersgd:rank=4,$ADAPT"
  fi
  if [ -n "${TARGET:-}" ]; then
    target=$TARGET
  else
    $run --out "$out/dense" --compare dense
    target=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["methods"][0]["test_accuracy"])' \
      "$out/dense/results.json")
  fi
  for m in "$BASE" "powersgd:rank=4" "$ADAPT"; do
    $run --target-acc "$target" --out "$out/$(printf '%s' "$m" | tr -c 'A-Za-z0-9.=-' '_')" --compare "$m"
  done
  python3 - "$out" "$target" <<'EOF'
import glob, json, os, sys
out, target = sys.argv[1], float(sys.argv[2])
rows = []
for f in sorted(glob.glob(os.path.join(out, "*", "results.json")), key=os.path.getmtime):
    m = json.load(open(f))["methods"][0]
    t = m.get("time_to_target_s")
    rows.append((m["method"], m["test_accuracy"], m["step_ms"], t if t is not None and t >= 0 else None))
with open(os.path.join(out, "summary.tsv"), "w") as tsv:
    tsv.write("method\tfinal_accuracy\tstep_ms\ttime_to_target_s\n")
    print(f"target {100 * target:.2f} % (dense's final accuracy{', given' if os.environ.get('TARGET') else ''}); "
          "each method in its own job")
    for name, acc, ms, t in rows:
        tsv.write(f"{name}\t{acc}\t{ms}\t{'' if t is None else t}\n")
        print(f"  {name:<44} {100 * acc:6.2f} %  {ms:8.1f} ms/step  " + ("never" if t is None else f"{t:6.1f} s"))
EOF
  ;;
esac

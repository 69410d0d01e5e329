#!/bin/sh
# bench/adapt_bandwidth.sh [BUILD] RATE|change [SEED] - the bandwidth-aware adaptive method
# against fixed methods on 4 netsim hosts (root; docs/BENCHMARKS.md, "Bandwidth-aware on
# netsim").  One command per link rate: the same mlp-large training, every method given
# BUDGET seconds of training (default 60; --time-budget), the target the dense run's final
# accuracy in the same command.
#   RATE     a tc rate (100mbit, 1gbit) or none (unshaped: the CPUs are the limit)
#   change   the adaptive method alone on links that start at FROM (default 1gbit) and are
#            reshaped to TO (default 100mbit) AFTER seconds (default 90) after the job
#            starts, from outside the job (scripts/netsim rate), with a
#            budget of 3 * AFTER: the decisions over time are in OUT/settings.csv and
#            OUT/adapt-*.png
# NP (hosts, one rank each; default 4) and EVALS (per epoch, default 24) may be set in the
# environment.
set -eu
B=${1:-build}
what=${2:-1gbit}
seed=${3:-1}
G=$B/gradcomp
BASE="dgc:density=0.001,values=f16"
# The adaptive method as a user writes it: its default ladder dense / powersgd:rank=4 /
# dgc 0.001 / dgc 0.0001 (ADAPT overrides, e.g. "adapt:bandwidth;base=$BASE" for DGC's
# density ladder).
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
  exec "$G" train $common --link "$what" --time-budget "${BUDGET:-60}" \
    --out "out/adapt-bw-$NP-$what-$seed" \
    --compare "dense,$BASE,powersgd:rank=4,$ADAPT"
  ;;
esac

#!/bin/sh
# bench/train.sh [BUILD] [small|large] - the training comparisons of docs/BENCHMARKS.md.
#   small  4 ranks on this machine (loopback/shared memory), MLP 784-1024-1024-10,
#          3 epochs: accuracy and compression of each method against dense f32.
#   large  4 hosts on 1 Gbit/s links (scripts/netsim, root), MLP 784-4096-4096-10:
#          time to the dense run's final accuracy, dense f32 in the same run.
# Every figure comes with the dense baseline trained in the same invocation.
set -eu
B=${1:-build}
what=${2:-small}
G=$B/gradcomp
case "$what" in
small)
  exec "$G" train --np 4 --model mlp --epochs 3 --out out/bench-small \
    --compare "dense,dgc:density=0.001,values=f16,powersgd:rank=4,twobit:threshold=0.5,sign:feedback=ef@allgather,sign:feedback=ef"
  ;;
large)
  exec "$G" train --np 4 --link 1gbit --model mlp-large --epochs 1 --max-steps 150 --batch 32 \
    --evals 6 --out out/bench-large \
    --compare "dense,dgc:density=0.001,values=f16,powersgd:rank=4,sign:feedback=ef@allgather"
  ;;
*) echo "usage: bench/train.sh [BUILD] [small|large]" >&2; exit 2 ;;
esac

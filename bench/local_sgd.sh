#!/bin/sh
# bench/local_sgd.sh [BUILD] mlp|cnn|wan|cnn-wan|hetero [SEED] - local SGD / DiLoCo against
# data-parallel training on 4 netsim hosts at 100 Mbit/s (root; docs/BENCHMARKS.md, "Local
# SGD / DiLoCo: gradcomp train --local-steps (issue 18)").  One command per figure: every
# method shares the same machine state, and the dense data-parallel run sets the target (its
# final accuracy) in the same invocation.  Each method trains at most --time-budget seconds.
#   mlp     MLP 784-1024-1024-10 (1.86 M parameters)
#   cnn     the CNN (LeNet-5 geometry, 16-32-128: 0.12 M parameters)
#   wan     the MLP with DELAY_US one-way delay on every host (default 5000: 10 ms RTT)
#   cnn-wan the CNN with DELAY_US one-way delay on every host (default 25000: 50 ms RTT;
#           50000 is 100 ms, across an ocean), where its dense step waits on the round
#           trips
#   hetero  the CNN with host 3 on a 10 Mbit/s link (an edge device), the rest 100 Mbit/s
# BUDGET (seconds of training per method, default 150) and EVALS (per epoch, default 24)
# may be set in the environment.
# Methods: (a) dense data-parallel, (b) data-parallel with PowerSGD rank 4 (the best
# compressor of the 1 Gbit/s runs), (c) DiLoCo dense, H = 32, (d1) SparseLoCo-like: top-k
# 1 % with sign values and error feedback, outer SGD, (d2) INTELLECT-like: int8.  (d) use
# H = 8 (DH=N to change it): the first runs in docs/BENCHMARKS.md used DH=16, which needs
# twice the samples of data-parallel training early on; H = 8 keeps up (the probe there).
set -eu
B=${1:-build}
what=${2:-mlp}
seed=${3:-1}
G=$B/gradcomp
OUTER="outer=nesterov:lr=0.7,momentum=0.5"
DH=${DH:-8}
METHODS="dense,powersgd:rank=4,dense;local_steps=32;$OUTER,topk:density=0.01,values=sign,feedback=ef;local_steps=$DH;outer=sgd,int8;local_steps=$DH;$OUTER"
common="--np 4 --seed $seed --epochs 2 --evals ${EVALS:-24} --time-budget ${BUDGET:-150}"
case "$what" in
mlp) exec "$G" train $common --link 100mbit --model mlp --out out/local-sgd-mlp-$seed --compare "$METHODS" ;;
cnn) exec "$G" train $common --link 100mbit --model cnn --out out/local-sgd-cnn-$seed --compare "$METHODS" ;;
wan)
  D=${DELAY_US:-5000}
  exec "$G" train $common --link 100mbit --delay-us "$D" --model mlp \
    --out out/local-sgd-wan$D-$seed --compare "$METHODS"
  ;;
cnn-wan)
  D=${DELAY_US:-25000}
  exec "$G" train $common --link 100mbit --delay-us "$D" --model cnn \
    --out out/local-sgd-cnn-wan$D-$seed --compare "$METHODS"
  ;;
hetero)
  exec "$G" train $common --link 100mbit --host-rate 3:10mbit --model cnn \
    --out out/local-sgd-hetero-$seed --compare "dense,dense;local_steps=32;$OUTER,topk:density=0.01,values=sign,feedback=ef;local_steps=$DH;outer=sgd"
  ;;
*) echo "usage: bench/local_sgd.sh [BUILD] mlp|cnn|wan|cnn-wan|hetero [SEED]" >&2; exit 2 ;;
esac

#!/bin/sh
# example_parity.sh MPIEXEC PYTHON GRADCOMP WORKDIR - examples/torch_mpi_optimizer.py and
# `gradcomp train` run the same experiment (the example's docstring): on 2 ranks, 30 steps
# of Fashion-MNIST, dense and top-k must send the same bytes a step (within 1 %: the same
# layer policy, --min-k's floor included), end within 1 pp of each other, and give the
# difference to dense the same paired standard error (within 0.1 pp).  Exits 77 (skipped)
# without Debian's dataset-fashion-mnist.
set -u
MPIEXEC=$1 PY=$2 G=$3 W=$4
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/t10k-labels-idx1-ubyte.gz" ] || { echo "SKIP: no $DATA (dataset-fashion-mnist)"; exit 77; }
SRC=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
M="dense,topk:density=0.01,feedback=ef"
common="--epochs 1 --max-steps 30 --evals 2"
timeout 300 "$MPIEXEC" -np 2 "$PY" "$SRC/examples/torch_mpi_optimizer.py" $common --quiet \
    --compare "$M" --out py > py.log 2>&1
rc=$?
[ $rc -eq 0 ] || { cat py.log; echo "FAIL: the example exited $rc"; exit 1; }
timeout 300 "$G" train --np 2 $common --quiet --compare "$M" --out c > c.log 2>&1
rc=$?
[ $rc -eq 0 ] || { cat c.log; echo "FAIL: gradcomp train exited $rc"; exit 1; }
cat py.log c.log
"$PY" - <<'PYEOF'
import json, sys
c = {m["method"]: m for m in json.load(open("c/results.json"))["methods"]}
p = {m["method"]: m for m in json.load(open("py/results.json"))["results"]}
bad = 0
for name in ("dense", "topk:density=0.01,feedback=ef"):
    a, b = c[name], p[name]
    if abs(a["bytes_per_step"] - b["bytes_per_step"]) > 0.01 * a["bytes_per_step"]:
        print("FAIL: %s: %.0f bytes a step in C, %.0f in Python" % (name, a["bytes_per_step"], b["bytes_per_step"])); bad += 1
    if abs(a["test_accuracy"] - b["final_acc"]) > 0.01:
        print("FAIL: %s: %.4f in C, %.4f in Python" % (name, a["test_accuracy"], b["final_acc"])); bad += 1
    sa, sb = a["delta_vs_dense_se_pp"], b["delta_vs_dense_se_pp"]
    if name == "dense":
        if sa is not None or sb is not None:
            print("FAIL: dense has a standard error against itself: %r / %r" % (sa, sb)); bad += 1
    elif sa is None or sb is None or not sa > 0 or abs(sa - sb) > 0.1:
        print("FAIL: %s: standard error %r pp in C, %r in Python" % (name, sa, sb)); bad += 1
print("example_parity: %s" % ("FAILED" if bad else "passed"))
sys.exit(1 if bad else 0)
PYEOF

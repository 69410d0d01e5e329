#!/bin/sh
# test_train_outer.sh GRADCOMP WORKDIR - `gradcomp train` with local SGD (the outer step) on
# 2 MPI ranks, synthetic data:
#  - dense;local_steps=1;outer=sgd (lr 1, momentum 0) is data-parallel SGD up to float
#    rounding: every evaluation's test loss within 1e-4 (relative) of dense's, the same
#    accuracy, and bytes like dense's;
#  - DiLoCo (H=8, Nesterov at a small lr), SparseLoCo-like (top-k + sign + error feedback,
#    outer SGD), and streaming (3 fragments) learn, keep the ranks' global weights
#    identical, and send about H times fewer bytes than dense;
#  - results.json says H, the outer optimizer, the bytes per worker and the standard error
#    against dense (from the global weights' verdicts);
#  - bad outer-step arguments are refused with the reason.
set -u
G=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
timeout 600 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 256,128 --epochs 1 \
    --batch 32 --evals 4 --max-steps 120 --quiet --min-elements 1000 \
    --compare "dense,dense;local_steps=1;outer=sgd,dense;local_steps=8;outer=nesterov:lr=0.3,momentum=0.5,topk:density=0.05,values=sign,feedback=ef;local_steps=8;outer=sgd,dense;local_steps=8;outer=sgd;stream=3" \
    --out res > train.log 2>&1
rc=$?
cat train.log
[ $rc -eq 0 ] || { echo "FAIL: gradcomp train exited $rc"; exit 1; }
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF' || exit 1
import json, csv, sys
r = json.load(open("res/results.json"))
m = {x["method"]: x for x in r["methods"]}
bad = 0
def fail(msg):
    global bad
    print("FAIL:", msg); bad += 1
dense, replay = m["dense"], m["dense;local_steps=1;outer=sgd"]
# the final verdicts are the global weights' (those of the last point): every outer method
# has its standard error against dense, and the trainer found no verdict off its evaluation
for x in r["methods"][1:]:
    if x.get("delta_vs_dense_se_pp") is None:
        fail("%s has no standard error against dense" % x["method"])
if "no standard error" in open("train.log").read():
    fail("train.log: a final model's verdicts disagree with its last evaluation")
if dense["local_steps"] != 0 or dense["outer"] is not None:
    fail("dense says local_steps=%r outer=%r" % (dense["local_steps"], dense["outer"]))
if replay["local_steps"] != 1 or not replay["outer"].startswith("H=1 sgd lr=1 momentum=0"):
    fail("replay says local_steps=%r outer=%r" % (replay["local_steps"], replay["outer"]))
rows = list(csv.DictReader(open("res/metrics.csv")))
pd = [x for x in rows if x["method"] == "dense"]
pr = [x for x in rows if x["method"] == "dense;local_steps=1;outer=sgd"]
# the outer-step run has one more point: the evaluation after its final sync (a no-op at H=1)
if len(pr) != len(pd) + 1:
    fail("replay has %d points, dense %d" % (len(pr), len(pd)))
for a, b in zip(pd, pr):
    la, lb = float(a["test_loss"]), float(b["test_loss"])
    if abs(la - lb) > 1e-4 * abs(la):
        fail("epoch %s: test loss %.7f (dense) vs %.7f (outer step, H=1)" % (a["epoch"], la, lb))
if abs(dense["test_accuracy"] - replay["test_accuracy"]) > 1e-9:
    fail("accuracy %.4f vs %.4f" % (dense["test_accuracy"], replay["test_accuracy"]))
if abs(replay["bytes_per_worker"] / dense["bytes_per_worker"] - 1) > 0.01:
    fail("H=1 sent %.0f bytes, dense %.0f" % (replay["bytes_per_worker"], dense["bytes_per_worker"]))
for name, x in m.items():
    if not x["weights_identical"]:
        fail("%s: ranks diverged" % name)
    if "bytes_per_worker" not in x or x["bytes_per_worker"] <= 0:
        fail("%s: bytes_per_worker %r" % (name, x.get("bytes_per_worker")))
    if x["local_steps"] == 8:
        if not x["test_accuracy"] > 0.6:
            fail("%s: accuracy %.3f" % (name, x["test_accuracy"]))
        if not x["bytes_per_worker"] < dense["bytes_per_worker"] / 6:
            fail("%s: %.0f bytes against dense's %.0f (H=8)" % (name, x["bytes_per_worker"], dense["bytes_per_worker"]))
        if not x["outer"].startswith("H=8"):
            fail("%s: outer %r" % (name, x["outer"]))
if "stream=3" not in m["dense;local_steps=8;outer=sgd;stream=3"]["outer"]:
    fail("streaming run does not say stream=3")
print("train_outer: %d passed, %d failed" % (1 if not bad else 0, bad))
sys.exit(1 if bad else 0)
PYEOF

# Refusals, with the reason (exit status 2 for flags, 1 for a method's items).
check() { # WANT_RC NEEDLE ARGS...
    want=$1 needle=$2
    shift 2
    out=$(timeout 120 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 32 --epochs 1 \
        --max-steps 4 --quiet --out bad "$@" 2>&1)
    got=$?
    if [ $got -ne "$want" ] || ! printf '%s' "$out" | grep -q -- "$needle"; then
        echo "$out"
        echo "FAIL: $* gave $got, want $want and '$needle'"
        exit 1
    fi
}
check 2 "local-steps 0" --local-steps 0
check 2 "sgd or nesterov" --local-steps 4 --outer adam
check 2 "momentum must be in" --local-steps 4 --outer nesterov:momentum=1
check 2 "lr must be > 0" --local-steps 4 --outer sgd:lr=0
check 1 "fragments 5" --compare "dense;local_steps=8;stream=5"
check 1 "contraction" --compare "qsgd:levels=4,feedback=ef;local_steps=4;min_elements=100"
echo "train_outer refusals: passed"

#!/bin/sh
# test_train_mpi.sh GRADCOMP WORKDIR - `gradcomp train` end to end on 2 MPI ranks with the
# synthetic dataset: dense and compressed methods reduce the loss, the ranks' weights stay
# bit-identical (the trainer checks a hash at every evaluation and fails otherwise), and
# results.json has every field for every method, metrics.csv and both PNGs exist; then
# --time-budget, an accuracy course, the --sensitivity probe and the link panel of a
# bandwidth-aware method. Each method has the paired standard error of its difference to
# dense.
set -u
G=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
timeout 600 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 256,128 --epochs 1 \
    --batch 32 --evals 2 --max-steps 120 --quiet --min-elements 1000 --lr-schedule cosine \
    --compare "dense,topk:density=0.01,feedback=ef,dgc:density=0.01,powersgd:rank=2,sign:feedback=ef;min_elements=40000,twobit:threshold=0.05" \
    --out res > train.log 2>&1
rc=$?
cat train.log
[ $rc -eq 0 ] || { echo "FAIL: gradcomp train exited $rc"; exit 1; }
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF' || exit 1
import json, csv, os, sys
r = json.load(open("res/results.json"))
fields = ["method", "test_accuracy", "delta_vs_dense_pp", "bytes_per_step", "effective_ratio",
          "step_ms", "codec_ms", "comm_ms", "time_to_target_s", "weights_identical", "steps"]
bad = 0
methods = r["methods"]
if r.get("lr_schedule") != "cosine" or r.get("loss") != "mean":
    print("FAIL: results.json says lr_schedule=%r loss=%r" % (r.get("lr_schedule"), r.get("loss"))); bad += 1
if len(methods) != 6:
    print("FAIL: expected 6 methods, got", len(methods)); bad += 1
for m in methods:
    for f in fields:
        if f not in m:
            print("FAIL: %s lacks %s" % (m.get("method"), f)); bad += 1
    if not m["weights_identical"]:
        print("FAIL: %s: ranks diverged" % m["method"]); bad += 1
# The paired standard error of each method's difference to dense: none for dense itself;
# for the others above 0 where the accuracies differ and at most 100 / sqrt(n - 1) pp (every
# sample disagreeing; the synthetic test set has 2000).
for m in methods:
    se = m.get("delta_vs_dense_se_pp")
    if m["method"] == "dense":
        if se is not None:
            print("FAIL: dense has a standard error against itself: %r" % se); bad += 1
    elif se is None or not (0 <= se <= 100 / 1999 ** 0.5) or (m["delta_vs_dense_pp"] != 0) != (se > 0):
        print("FAIL: %s: delta %r pp, standard error %r pp" % (m["method"], m["delta_vs_dense_pp"], se)); bad += 1
if "±" not in open("train.log").read() or "no standard error" in open("train.log").read():
    print("FAIL: the table has no standard errors (train.log)"); bad += 1
# "SPEC;min_elements=N" is that method's own policy: fc2.weight (256x128 = 32768) goes dense there
# and only there (the run's --min-elements is 1000).
def groups(m):
    return dict(g.split(": ", 1) for g in m["specs"].split("; "))
for m in methods:
    dense_names = ",".join(v for k, v in groups(m).items() if k.startswith("none"))
    want = m["method"].startswith("sign") and m["method"] != "dense"
    if m["method"] != "dense" and ("fc2.weight" in dense_names) != want:
        print("FAIL: %s: specs %r" % (m["method"], m["specs"])); bad += 1
# --min-k's default floor of 512 values a step travels in the specs of the codecs that count
# from density= (topk, dgc), and only there.
for m in methods:
    if ("min_k=512" in m["specs"]) != m["method"].startswith(("topk", "dgc")):
        print("FAIL: %s: specs %r" % (m["method"], m["specs"])); bad += 1
rows = list(csv.DictReader(open("res/metrics.csv")))
for m in methods:
    pts = [x for x in rows if x["method"] == m["method"]]
    start, end = pts[0], pts[-1]
    # loss goes down: the last training loss below the initial test loss (ln 10 = 2.30)
    if not float(end["train_loss"]) < float(start["test_loss"]) * 0.8:
        print("FAIL: %s: loss %s -> %s did not go down" % (m["method"], start["test_loss"], end["train_loss"])); bad += 1
    if not m["test_accuracy"] > 0.5:
        print("FAIL: %s: accuracy %.3f" % (m["method"], m["test_accuracy"])); bad += 1
# The first step and the steady steps after it make up the mean step: first + steady x
# (steps - 1) = step_ms x steps, to the printed digits (6 significant).
for m in methods:
    f, st, n = m.get("first_step_ms"), m.get("steady_step_ms"), m["steps"]
    if not (f and st and f > 0 and st > 0 and
            abs(f + st * (n - 1) - m["step_ms"] * n) <= 1e-4 * m["step_ms"] * n):
        print("FAIL: %s: first_step_ms %r, steady_step_ms %r, step_ms %r over %d steps"
              % (m["method"], f, st, m["step_ms"], n)); bad += 1
dense = [m for m in methods if m["method"] == "dense"][0]
if abs(dense["effective_ratio"] - 1.0) > 0.2:
    print("FAIL: dense ratio %.2f" % dense["effective_ratio"]); bad += 1
for m in methods:
    if m["method"] != "dense" and not m["effective_ratio"] > 2:
        print("FAIL: %s ratio %.2f" % (m["method"], m["effective_ratio"])); bad += 1
for png in ("accuracy_vs_bytes.png", "accuracy_vs_time.png"):
    p = os.path.join("res", png)
    if not (os.path.exists(p) and os.path.getsize(p) > 1000 and open(p, "rb").read(4) == b"\x89PNG"):
        print("FAIL: %s missing or empty" % png); bad += 1
print("train_mpi: %d passed, %d failed" % (1 if not bad else 0, bad))
sys.exit(1 if bad else 0)
PYEOF

# --time-budget: a run of 100000 steps (>= 10 s even on a fast idle machine: ~0.1 ms a
# step) must stop at the first evaluation after 1 s of training, on both ranks at the
# same step, and say so.  --target-tolerance 2: the target is dense's final accuracy
# minus 2 pp, which dense reaches no later than its last evaluation.
timeout 300 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 64 --epochs 1000 \
    --batch 16 --evals 4 --max-steps 100 --quiet --time-budget 1 --target-tolerance 2 \
    --compare "dense,sign:feedback=ef" \
    --out budget > budget.log 2>&1
rc=$?
[ $rc -eq 0 ] || { cat budget.log; echo "FAIL: gradcomp train --time-budget exited $rc"; exit 1; }
"$PY" - <<'PYEOF' || exit 1
import json, sys
r = json.load(open("budget/results.json"))
bad = 0
if r.get("time_budget_s") != 1:
    print("FAIL: time_budget_s = %r" % r.get("time_budget_s")); bad += 1
for m in r["methods"]:
    if not (m["stopped_by_budget"] is True and 0 < m["steps"] < 1000 * 100 and m["weights_identical"]):
        print("FAIL: %s: stopped_by_budget=%r steps=%d" % (m["method"], m["stopped_by_budget"], m["steps"])); bad += 1
    # the budget is checked at evaluations (every 25 steps here): it may overshoot by at most one interval
    if not (0.9 <= m["train_seconds"] < 1.0 + 25 * m["step_ms"] / 1e3 * 1.5 + 0.5):
        print("FAIL: %s trained %.2f s on a 1 s budget" % (m["method"], m["train_seconds"])); bad += 1
dense = [m for m in r["methods"] if m["method"] == "dense"][0]
if abs(r["target_accuracy"] - (dense["test_accuracy"] - 0.02)) > 1e-4:
    print("FAIL: target %r, dense's final accuracy %r minus 2 pp" % (r["target_accuracy"], dense["test_accuracy"])); bad += 1
if not (dense["time_to_target_s"] is not None and dense["time_to_target_s"] <= dense["train_seconds"] + 1e-6):
    print("FAIL: dense reached its own target at %r s of %r" % (dense["time_to_target_s"], dense["train_seconds"])); bad += 1
print("train_mpi budget: %d passed, %d failed" % (1 if not bad else 0, bad))
sys.exit(1 if bad else 0)
PYEOF

# An accuracy-driven method steers by the curve of the dense run before it in --compare
# (target=ref-X: X points below that curve's end); without one, target=ref-X has nothing to
# steer by, and the run stops at its first decision saying so, on every rank, exit status 1.
course_run() { # OUT METHODS
    timeout 300 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 64 --epochs 1 \
        --batch 16 --evals 8 --max-steps 80 --quiet --min-elements 100 --compare "$2" \
        --out "$1" > "$1.log" 2>&1
}
A="adapt:accuracy;target=ref-0.3;base=topk:density=0.01,feedback=ef;interval=10"
course_run course "dense,$A"
rc=$?
[ $rc -eq 0 ] || { cat course.log; echo "FAIL: gradcomp train with an accuracy course exited $rc"; exit 1; }
grep -q "steered by dense's curve" course.log || { cat course.log; echo "FAIL: no course line"; exit 1; }
"$PY" - <<'PYEOF' || exit 1
import csv, json, sys
m = [m for m in json.load(open("course/results.json"))["methods"] if m["method"].startswith("adapt:")]
ok = len(m) == 1 and m[0].get("accuracy_course") == "dense" and m[0]["adaptive_decisions"] >= 7
# settings.csv names each setting's spec, a ladder entry of the method's base codec
rows = [r for r in csv.DictReader(open("course/settings.csv")) if r["method"].startswith("adapt:")]
ok = ok and len(rows) >= 2 and all(r["spec"].startswith("topk:density=") for r in rows)
# the split the loop steers by has its own difference to dense and standard error (1000
# samples: at most 100 / sqrt(999) pp)
se, dv = m[0].get("validation_delta_vs_dense_se_pp"), m[0].get("validation_delta_vs_dense_pp")
if se is None or dv is None or not (0 <= se <= 100 / 999 ** 0.5) or (dv != 0) != (se > 0):
    print("FAIL: course: validation delta %r pp, standard error %r pp" % (dv, se)); ok = False
print("train_mpi course: %d passed, %d failed" % (ok, not ok))
sys.exit(0 if ok else 1)
PYEOF
# The loop steers by a validation split held out of the training set (--val auto: a twelfth
# of the synthetic 12000), never by the test set: every decision's metric is the validation
# accuracy of the evaluation at its step, and with --val 0 it is the test accuracy.
check_metric() { # DIR SAMPLES COLUMN
    "$PY" - "$@" <<'PYEOF'
import csv, json, math, sys
d, n, col = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bad = 0
r = json.load(open(d + "/results.json"))
if r["validation_samples"] != n:
    print("FAIL: %s: validation_samples %r, expected %d" % (d, r["validation_samples"], n)); bad += 1
pts = {}
for row in csv.DictReader(open(d + "/metrics.csv")):
    has = row["val_accuracy"] != ""
    if has != (n > 0):
        print("FAIL: %s: val_accuracy %r with --val %d" % (d, row["val_accuracy"], n)); bad += 1
    if row["method"].startswith("adapt:"):
        pts[round(float(row["epoch"]), 4)] = row
dec = [x for x in csv.DictReader(open(d + "/decisions.csv")) if x["chosen"] == "1"]
differ = 0
for x in dec:
    p = pts.get(round(float(x["epoch"]), 4))
    if p is None or abs(float(x["metric"]) - float(p[col])) > 1e-6:
        print("FAIL: %s: decision at epoch %s saw %s, %s was %s" % (d, x["epoch"], x["metric"], col, p and p[col])); bad += 1
    elif abs(float(p["val_accuracy"] or "nan") - float(p["test_accuracy"])) > 1e-6:
        differ += 1
if len(dec) < 7 or (n and not differ):
    print("FAIL: %s: %d decisions, %d where validation and test differ" % (d, len(dec), differ)); bad += 1
print("train_mpi %s steers by %s: %d passed, %d failed" % (d, col, 0 if bad else 1, bad))
sys.exit(1 if bad else 0)
PYEOF
}
check_metric course 1000 val_accuracy || exit 1
timeout 300 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 64 --epochs 1 --batch 16 \
    --evals 8 --max-steps 80 --quiet --min-elements 100 --compare "dense,$A" --val 0 \
    --out course0 > course0.log 2>&1 || { cat course0.log; echo "FAIL: --val 0"; exit 1; }
check_metric course0 0 test_accuracy || exit 1
grep -q "steered by the test set" course0.log || { cat course0.log; echo "FAIL: --val 0 not said"; exit 1; }
timeout 60 mpirun -np 2 "$G" train --data synthetic --model mlp --epochs 1 --quiet \
    --compare dense --val 12000 --out val-all > val-all.log 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "val 12000: leaves no training samples" val-all.log; then
    cat val-all.log; echo "FAIL: --val as large as the training set: exit $rc"; exit 1
fi
echo "train_mpi --val too large: 1 passed, 0 failed"
course_run nocourse "$A"
rc=$?
if [ $rc -ne 1 ] || [ "$(grep -c 'needs a reference curve' nocourse.log)" -lt 1 ]; then
    cat nocourse.log; echo "FAIL: target=ref-0.3 without a dense run: exit $rc"; exit 1
fi
echo "train_mpi no course: 1 passed, 0 failed"

# The sensitivity probe: one short run per tensor the policy compresses, that tensor alone
# compressed with SPEC as a plain SPEC method gets it (--min-k's floor included), and the
# layer policy it suggests, written as a --compare method.
timeout 300 mpirun -np 2 "$G" train --sensitivity dgc:density=0.01 --threshold 0.5 \
    --data synthetic --model mlp --hidden 256,128 --epochs 1 --batch 32 --evals 1 \
    --max-steps 40 --quiet --min-elements 1000 --out sens > sens.log 2>&1
rc=$?
[ $rc -eq 0 ] || { cat sens.log; echo "FAIL: gradcomp train --sensitivity exited $rc"; exit 1; }
"$PY" - <<'PYEOF' || exit 1
import sys
bad = 0
lines = open("sens/sensitivity.txt").read().splitlines()
if "(validation accuracy)" not in lines[0]:  # --val auto: the probe decides on a held-out split
    print("FAIL: sensitivity.txt header %r" % lines[0]); bad += 1
rows = [l.split() for l in lines if not l.startswith(("#", "tensor "))]
if [r[0] for r in rows] != ["fc1.weight", "fc2.weight", "fc3.weight"] or any(len(r) != 6 for r in rows):
    print("FAIL: sensitivity.txt rows %r" % rows); bad += 1
for r in rows:
    # se: paired against dense on the 1000 validation samples (a twelfth of 12000)
    cost, acc, se = float(r[3]), float(r[2]), float(r[4])
    if not (0 < acc <= 1) or not r[5].startswith("dgc:density=0.") or "min_k=512" not in r[5]:
        print("FAIL: sensitivity row %r" % r); bad += 1
    if not (0 <= se <= 100 / 999 ** 0.5) or (cost != 0) != (se > 0):
        print("FAIL: sensitivity row %r: cost %g pp, standard error %g pp" % (r, cost, se)); bad += 1
    # lighter only above the threshold (0.5 pp) and clear of the noise (2 SE)
    if r[5].startswith("dgc:density=0.1,") != (cost > 0.5 and abs(cost) >= 2 * se):
        print("FAIL: sensitivity row %r: cost %g pp, standard error %g pp, suggested %s" % (r, cost, se, r[5])); bad += 1
if not any(r[5].startswith("dgc:density=0.1,") for r in rows):
    print("FAIL: no layer sensitive: the rule above is not exercised"); bad += 1
pol = open("sens/layer_policy.txt").read().strip()
if not pol.startswith("policy:spec=dgc:density=0.01,min_k=512,") or ";min_elements=1000;" not in pol:
    print("FAIL: layer_policy.txt %r" % pol); bad += 1
print("train_mpi sensitivity: %d passed, %d failed" % (0 if bad else 1, bad))
sys.exit(1 if bad else 0)
PYEOF
# A threshold every cost passes (-100 pp) after 3 steps, where the costs are small against
# their standard errors: only the layers clear of 2 SE go lighter, the others keep SPEC.
timeout 300 mpirun -np 2 "$G" train --sensitivity dgc:density=0.01 --threshold -100 \
    --data synthetic --model mlp --hidden 256,128 --epochs 1 --batch 32 --evals 1 \
    --max-steps 3 --quiet --min-elements 1000 --out sens3 > sens3.log 2>&1 ||
    { cat sens3.log; echo "FAIL: gradcomp train --sensitivity (3 steps) failed"; exit 1; }
"$PY" - <<'PYEOF' || { cat sens3.log; exit 1; }
import sys
rows = [l.split() for l in open("sens3/sensitivity.txt").read().splitlines() if not l.startswith(("#", "tensor "))]
bad = 0
for r in rows:
    cost, se = float(r[3]), float(r[4])
    if r[5].startswith("dgc:density=0.1,") != (abs(cost) >= 2 * se):
        print("FAIL: 3 steps: row %r: cost %g pp, standard error %g pp, suggested %s" % (r[0], cost, se, r[5])); bad += 1
kept = [r[0] for r in rows if abs(float(r[3])) < 2 * float(r[4])]
if not kept or len(kept) == len(rows):
    print("FAIL: 3 steps: rows within 2 SE %r of %d: the rule is not exercised both ways" % (kept, len(rows))); bad += 1
print("train_mpi sensitivity within the noise: %s" % ("FAILED" if bad else "passed"))
sys.exit(1 if bad else 0)
PYEOF

# The prediction beside the measured step takes the shaped link's delay (netsim's
# --delay-us, which `gradcomp train --link` hands its ranks as GCOMP_TRAIN_DELAY_US).  A
# dense step of 6 tensors on 2 ranks pays 2 latencies a tensor, and the trainer's buckets
# are in flight together (the model's `concurrent`): the first layer's chain, 40 ms more
# with 20 ms each way, overlaps the other tensors' bytes, so the exposed exchange grows by
# 10-40 ms.  One exchange at a time would add 240 ms: more than 120 fails.
for d in 0 20000; do
    timeout 300 mpirun -np 2 -x GCOMP_TRAIN_LINK=100mbit -x GCOMP_TRAIN_DELAY_US=$d "$G" train \
        --data synthetic --model mlp --hidden 256,128 --epochs 1 --batch 32 --evals 1 \
        --max-steps 10 --quiet --compare dense --out delay$d > delay$d.log 2>&1 ||
        { cat delay$d.log; echo "FAIL: gradcomp train with GCOMP_TRAIN_DELAY_US=$d"; exit 1; }
done
"$PY" - <<'PYEOF' || exit 1
import json, sys
p = [json.load(open("delay%d/results.json" % d))["methods"][0]["predicted_exposed_comm_ms"]
     for d in (0, 20000)]
ok = 10 <= p[1] - p[0] <= 120
print("train_mpi delay: predicted exposed exchange %.1f ms without, %.1f ms with 20 ms each way: %s"
      % (p[0], p[1], "passed" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PYEOF

# A bandwidth-aware method's plot has a third panel: the link it measured at each decision
# (link-N.dat, the chosen rows of decisions.csv that read one), so that a link reshaped
# mid-run shows beside the settings that followed it.
timeout 300 mpirun -np 2 "$G" train --data synthetic --model mlp --hidden 64 --epochs 1 \
    --batch 16 --evals 2 --max-steps 40 --quiet --min-elements 100 \
    --compare "adapt:bandwidth;interval=10" --out link > link.log 2>&1 ||
    { cat link.log; echo "FAIL: gradcomp train with adapt:bandwidth"; exit 1; }
"$PY" - <<'PYEOF' || { cat link.log; exit 1; }
import csv, os, shutil, struct, sys
want = [(float(r["epoch"]), float(r["link_MBps"])) for r in csv.DictReader(open("link/decisions.csv"))
        if r["chosen"] == "1" and float(r["link_MBps"]) > 0]
got = [tuple(map(float, l.split())) for l in open("link/link-0.dat")] if os.path.exists("link/link-0.dat") else []
ok = len(want) >= 3 and len(got) == len(want) and all(
    abs(a - c) < 1e-4 and abs(b - d) <= 1e-4 * b for (a, b), (c, d) in zip(want, got))
if not ok:
    print("FAIL: link-0.dat %r, decisions.csv's links %r" % (got, want))
if ok and shutil.which("gnuplot"):
    head = open("link/adapt-0.png", "rb").read(24)
    ok = head[1:4] == b"PNG" and struct.unpack(">II", head[16:24]) == (900, 800)
    if not ok:
        print("FAIL: link/adapt-0.png is not the three-panel plot: %r" % head)
print("train_mpi link panel: %s" % ("passed" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PYEOF

# Each host reads its own calibration file (GRADCOMP_CALIBRATION here, one a rank): the
# trainer broadcasts rank 0's, so every rank's bandwidth controller predicts from the same
# rates. Read by each rank, the ranks' controllers would see other configurations and stop
# at the first decision (or, before the calibration was in their fingerprint, decide apart).
for r in 0 1; do
    printf 'gradcomp-calibration 3\ncodec int8:feedback=ef encode_fixed_s=0 encode_per_elem=%s decode_fixed_s=0 decode_per_elem=%s\n' \
        "${r}e-6" "${r}e-6" > "cal$r.txt"
done
cal_run="$G train --data synthetic --model mlp --hidden 64 --epochs 1 --batch 16 --evals 2 \
    --max-steps 40 --quiet --min-elements 100 --dense-spec int8:feedback=ef \
    --compare adapt:bandwidth;interval=10 --out cal"
timeout 300 mpirun -np 1 -x GRADCOMP_CALIBRATION="$PWD/cal0.txt" $cal_run : \
    -np 1 -x GRADCOMP_CALIBRATION="$PWD/cal1.txt" $cal_run > cal.log 2>&1 ||
    { cat cal.log; echo "FAIL: ranks with calibrations of their own"; exit 1; }
"$PY" -c 'import json, sys; m = json.load(open("cal/results.json"))["methods"][0]; sys.exit(m["adaptive_decisions"] < 3)' ||
    { cat cal.log; echo "FAIL: ranks with calibrations of their own: under 3 decisions"; exit 1; }
echo "train_mpi per-rank calibration files: passed"

# One rank sends nothing: its plots are accuracy over time and the adaptive method's own,
# and the bytes plot, whose log axis would have no point (gnuplot then refused the whole
# script, and an earlier run's PNG stayed behind), is left out and said to be.
mkdir -p one && echo stale > one/accuracy_vs_bytes.png
timeout 300 mpirun -np 1 "$G" train --data synthetic --model mlp --hidden 64 --epochs 1 \
    --batch 16 --evals 2 --max-steps 40 --quiet --min-elements 100 \
    --compare "topk:density=0.01,adapt:norm;interval=10" --out one > one.log 2>&1 ||
    { cat one.log; echo "FAIL: gradcomp train on one rank"; exit 1; }
if command -v gnuplot >/dev/null 2>&1; then
    for png in accuracy_vs_time.png adapt-1.png; do
        head -c 4 "one/$png" 2>/dev/null | grep -q PNG ||
            { cat one.log; echo "FAIL: one rank: one/$png not drawn"; exit 1; }
    done
    [ ! -e one/link-1.dat ] || { echo "FAIL: one rank: adapt:norm has a link panel"; exit 1; }
    [ ! -e one/accuracy_vs_bytes.png ] && grep -q "no accuracy_vs_bytes.png: no method sent a byte (1 rank)" one.log ||
        { cat one.log; echo "FAIL: one rank: the bytes plot not left out, or not said so"; exit 1; }
    echo "train_mpi one rank: passed"
fi

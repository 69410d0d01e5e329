#!/bin/sh
# test_train_ps.sh GRADCOMP WORKDIR - `gradcomp train --ps` end to end: 2 workers and 1
# server on the synthetic dataset, each method through the collectives and through the
# parameter server in sync and async mode.  Checks what the table and results.json say about
# each run: the exchange, the per-worker bytes (per step and over the run, which must agree
# with the step count), the PS statistics (sync: no staleness, every worker the same step
# count; async: the servers' momentum), equal weights on every worker, a loss that falls,
# and each run's standard error against the collective dense run.
set -u
G=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
timeout 600 "$G" train --np 2 --ps 1:sync,async --data synthetic --model mlp --hidden 256,128 \
    --epochs 1 --batch 32 --evals 2 --max-steps 60 --quiet --min-elements 1000 --loss sum \
    --compare "dense,twobit:threshold=0.5" --out res > train.log 2>&1
rc=$?
cat train.log
[ $rc -eq 0 ] || { echo "FAIL: gradcomp train --ps exited $rc"; exit 1; }
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF' || exit 1
import json, math
r = json.load(open("res/results.json"))
bad = 0
if "no standard error" in open("train.log").read():
    print("FAIL: train.log: a final model's verdicts disagree with its last evaluation"); bad += 1
def fail(*a):
    global bad
    print("FAIL:", *a); bad += 1
if r.get("servers") != 1 or r.get("ranks") != 2:
    fail("results.json says servers=%r ranks=%r" % (r.get("servers"), r.get("ranks")))
runs = [(m["method"], m["exchange"]) for m in r["methods"]]
want = [(me, ex) for me in ("dense", "twobit:threshold=0.5")
        for ex in ("collective", "ps 1 sync", "ps 1 async")]
if runs != want:
    fail("runs", runs, "expected", want)
for m in r["methods"]:
    name = "%s [%s]" % (m["method"], m["exchange"])
    if not m["weights_identical"]:
        fail(name, "workers' weights differ")
    if not (m["bytes_per_step"] > 0 and m["bytes_per_worker"] > 0):
        fail(name, "bytes_per_step=%r bytes_per_worker=%r" % (m["bytes_per_step"], m["bytes_per_worker"]))
    # the workers' final verdicts give every run but the collective dense its standard error
    if (m["delta_vs_dense_se_pp"] is None) != (name == "dense [collective]"):
        fail(name, "standard error against dense", m["delta_vs_dense_se_pp"])
    if m["exchange"] == "collective":
        continue
    # per step times steps is the total, to the rounding of the JSON figures
    steps = 0.5 * (m["ps_worker_steps_min"] + m["ps_worker_steps_max"])
    if m["exchange"] == "ps 1 sync":
        if m["ps_worker_steps_min"] != m["ps_worker_steps_max"] or m["ps_worker_steps_min"] != m["steps"]:
            fail(name, "sync worker steps %r-%r, run steps %r" % (m["ps_worker_steps_min"], m["ps_worker_steps_max"], m["steps"]))
        if m["ps_staleness_max"] != 0:
            fail(name, "sync staleness", m["ps_staleness_max"])
        if not math.isclose(m["bytes_per_worker"], m["bytes_per_step"] * steps, rel_tol=1e-4):
            fail(name, "bytes_per_worker %r != bytes_per_step %r x %r steps" % (m["bytes_per_worker"], m["bytes_per_step"], steps))
    else:
        if not math.isclose(m["ps_momentum"], 1 - 2 * (1 - r["momentum"]), abs_tol=1e-6):
            fail(name, "async servers' momentum", m["ps_momentum"])
    # pushes are the sent bytes (async: plus worker 0's kv.init of the weights, averaged over
    # the workers' steps); pulls are dense f32 weights or sums, one per parameter
    extra = 0 if m["exchange"] == "ps 1 sync" else 4 * m["parameters"] / 2 / steps
    if not math.isclose(m["ps_pushed_bytes_per_step"], m["bytes_per_step"] + extra, rel_tol=0.01):
        fail(name, "pushed %r vs sent %r + init %r" % (m["ps_pushed_bytes_per_step"], m["bytes_per_step"], extra))
    if m["ps_pulled_bytes_per_step"] < 4 * m["parameters"]:
        fail(name, "pulled %r < 4 x %r parameters" % (m["ps_pulled_bytes_per_step"], m["parameters"]))
    if m["ps_workers_lost"] != 0:
        fail(name, "workers lost", m["ps_workers_lost"])
    if not m["test_accuracy"] > 0.5:
        fail(name, "test accuracy", m["test_accuracy"])
print("ok" if bad == 0 else "%d failures" % bad)
raise SystemExit(1 if bad else 0)
PYEOF

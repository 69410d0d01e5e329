#!/usr/bin/env python3
"""vs_pytorch_report.py - the table of bench/vs_pytorch.sh: medians over repetitions.

    vs_pytorch_report.py [--target A|dense-PP] [--dense M] DIR  DIR/runs/*.json -> DIR/summary.{md,json}
    vs_pytorch_report.py --import-gc RUNDIR METHOD OUT  a `gradcomp train` run -> one run JSON

Target: a fixed accuracy (--target 80 or 0.80), or dense-PP (default dense-0.5): the
median over repetitions of PyTorch DDP dense's final accuracy minus PP percentage points,
one number for every run.  Time to target: training seconds at the first evaluation at or
above it ("never" when a run did not get there).  Bytes: what each rank's network interface
sent per training step (tx_bytes), TCP/IP headers included.  Each cell is the median over the
repetitions, with [min-max]; "x sooner" compares medians with DDP dense's (with DDP + fp16's);
"> x sooner (never there)": the baseline did not reach the target in any repetition, so its
time to it is more than its median training time, and x is a lower bound.
--dense M: the runs of method M are DDP dense's for the target and the "vs DDP dense"
column (default ddp; e.g. ddp+keepmem to compare with DDP under the same malloc settings).
"""

import csv
import glob
import json
import os
import statistics
import sys

NAMES = {
    "ddp": "PyTorch DDP, gloo (dense fp32)",
    "ddp-fp16": "DDP + fp16_compress_hook",
    "ddp-powersgd": "DDP + powerSGD_hook (rank 4)",
    "ddp-gradcomp": "DDP + gradcomp hook",
}


def name_of(m, run_spec=None):
    if m.startswith("gc:"):
        return "gradcomp train " + m[3:]
    m, _, spec = m.partition(":")  # ddp-gradcomp[+...]:SPEC
    spec = spec or run_spec or ""  # the hook's spec when the method did not name it
    base, *mods = m.split("+")
    extra = {"keepmem": "glibc keeps freed memory", "view": "gradient_as_bucket_view"}
    return (NAMES.get(base, base) + (f" `{spec}`" if spec else "")
            + "".join(f", {extra.get(x, x)}" for x in mods))


def import_gc(rundir, method, out):
    r = json.load(open(os.path.join(rundir, "results.json")))
    m = r["methods"][0]
    curve = []
    with open(os.path.join(rundir, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            curve.append({"train_s": float(row["train_seconds"]), "epoch": float(row["epoch"]),
                          "acc": float(row["test_accuracy"])})
    tx = [int(open(p).read()) for p in glob.glob(os.path.join(rundir, "tx.*"))]
    res = {
        "method": method, "model": r["model"], "world": r["ranks"], "batch": r["batch_per_rank"],
        "spec": m["method"], "steps": m["steps"], "train_s": m["train_seconds"],
        "step_ms": m["step_ms"], "step_ms_median": None,
        "wire_bytes_per_step": statistics.mean(tx) / m["steps"] if tx else None,
        "algo_bytes_per_step": m["bytes_per_step"], "final_acc": m["test_accuracy"],
        "best_acc": m["best_accuracy"], "curve": curve, "budget_s": r["time_budget_s"],
        "comm_ms": m["comm_ms"], "codec_ms": m["codec_ms"], "compute_ms": m["compute_ms"],
    }
    json.dump(res, open(out, "w"), indent=1)


def time_to(run, target):
    for p in run["curve"]:
        if p["acc"] >= target - 1e-12:
            return p["train_s"]
    return None


def med(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


def fmt(t, unit="", scale=1.0, prec=1):
    m, lo, hi = t
    if m is None:
        return "never"
    s = f"{m * scale:.{prec}f}{unit}"
    if lo != hi:
        s += f" [{lo * scale:.{prec}f}–{hi * scale:.{prec}f}]"
    return s


def human(b):
    if b is None:
        return "–"
    for unit, div in (("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def report(d, target_arg, dense_m="ddp"):
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "runs", "*.json")))]
    if not runs:
        sys.exit(f"vs_pytorch_report: no runs in {d}/runs")
    by = {}
    order = ["ddp", "ddp-fp16", "ddp-powersgd", "ddp-gradcomp"]

    def rank(m):
        b = m.partition(":")[0].split("+")[0] if not m.startswith("gc:") else m
        return (order.index(b) if b in order else 9, m)
    for r in sorted(runs, key=lambda r: rank(r["method"])):
        by.setdefault(r["method"], []).append(r)
    if target_arg.startswith("dense-"):
        dense = by.get(dense_m)
        if not dense:
            sys.exit(f"vs_pytorch_report: --target dense-PP needs {dense_m} runs")
        tol = float(target_arg[len("dense-"):])
        target = statistics.median(r["final_acc"] for r in dense) - tol / 100
        why = f"{name_of(dense_m)}: median final accuracy minus {tol:g} pp"
    else:
        target = float(target_arg)
        target = target / 100 if target > 1 else target
        why = "fixed"
    rows = []
    for m, rs in by.items():
        tts = [time_to(r, target) for r in rs]
        rows.append({
            "method": m, "name": name_of(m, rs[0].get("spec")),
            "runs": len(rs), "step_ms": med([r["step_ms"] for r in rs]),
            "wire": med([r.get("wire_bytes_per_step") for r in rs]),
            "algo": med([r.get("algo_bytes_per_step") for r in rs]),
            "final": med([r["final_acc"] for r in rs]), "steps": med([r["steps"] for r in rs]),
            "tt": med(tts), "reached": sum(t is not None for t in tts),
            "train_s": med([r["train_s"] for r in rs]),
            "loads": [r.get("load_before", "?") + " / " + r.get("load_after", "?") for r in rs],
        })
    base = {r["method"]: r for r in rows}
    first = runs[0]
    head = (f"{first.get('world')} ranks on {first.get('where', '?')} ({first.get('link', '?')}), "
            f"{first.get('model')}, batch {first.get('batch')} per rank, "
            f"{first.get('budget_s'):g} s of training per run, {max(r['runs'] for r in rows)} repetitions")
    lines = [f"**{head}.** Target accuracy {100 * target:.2f} % ({why}).", "",
             "| method | runs | step ms | wire bytes/step/rank | steps | final acc | time to target | "
             f"vs DDP dense{'' if dense_m == 'ddp' else ' (' + dense_m + ')'} | vs DDP+fp16 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tt = r["tt"][0]
        def vs(m):
            b = base.get(m)
            if not tt or not b or m == r["method"]:
                return "–"
            if b["tt"][0]:
                return f"{b['tt'][0] / tt:.1f}× sooner"
            # the baseline never got there: its time to target is more than its whole run
            return f"> {b['train_s'][0] / tt:.1f}× sooner (never there)" if not b["reached"] else "–"
        lines.append(
            f"| {r['name']} | {r['runs']} | {fmt(r['step_ms'], prec=0)} | "
            f"{human(r['wire'][0])} | {fmt(r['steps'], prec=0)} | "
            f"{fmt(r['final'], ' %', 100, 2)} | {fmt(r['tt'], ' s')} ({r['reached']}/{r['runs']}) | "
            f"{vs(dense_m)} | {vs('ddp-fp16')} |")
    lines += ["", "Load average (1, 5, 15 min) before / after each run:", ""]
    for r in rows:
        lines.append(f"- {r['name']}: " + "; ".join(r["loads"]))
    text = "\n".join(lines) + "\n"
    open(os.path.join(d, "summary.md"), "w").write(text)
    json.dump({"target": target, "why": why, "rows": rows}, open(os.path.join(d, "summary.json"), "w"),
              indent=1)
    print(text)


def main():
    a = sys.argv[1:]
    if a and a[0] == "--import-gc":
        import_gc(*a[1:4])
        return
    opts = {"--target": "dense-0.5", "--dense": "ddp"}
    while len(a) >= 2 and a[0] in opts:
        opts[a[0]], a = a[1], a[2:]
    if len(a) != 1:
        sys.exit(__doc__)
    report(a[0], opts["--target"], opts["--dense"])


if __name__ == "__main__":
    main()

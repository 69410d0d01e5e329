#!/usr/bin/env python3
"""scaling_table.py GRADCOMP CALIBRATION - the cost model's scaling table of
docs/BENCHMARKS.md ("Extrapolated"): mlp-large, GPT-2 small and a 1.3B transformer at
10 and 100 Gbit/s on 2, 64 and 1,024 workers, compute 100 ms a step, overlap 1, dense
tensors fused into 25 MiB buckets as DDP fuses them; PowerSGD rank 4 and DGC 0.1 % against
dense f32 (and f16), their break-even link speeds, and PowerSGD with a message a tensor.

Every figure is `gradcomp plan --json` with the given calibration (codec rates of the
machine that measured it); run from the repository root.
"""
import json
import subprocess
import sys

G, CAL = sys.argv[1], sys.argv[2]
MODELS = ["mlp-large", "bench/models/gpt2-small.txt", "bench/models/transformer-1.3b.txt"]
PSGD, DGC = "powersgd:rank=4", "dgc:density=0.001,values=f16"


def plan(model, link, bucket_mb):
    out = subprocess.run(
        [G, "plan", "--model", model, "--compare", "dense,%s,%s" % (PSGD, DGC),
         "--workers", "2,64,1024", "--link", link, "--compute-ms", "100",
         "--bucket-mb", str(bucket_mb), "--calibration", CAL, "--json"],
        check=True, capture_output=True, text=True).stdout
    return {(r["method"], r["workers"]): r for r in json.loads(out)["results"]}


def gbit(r):
    b = r["break_even_link_bits_per_s"]
    if b is None or b == float("inf") or b > 1e15:
        return "pays at any speed"
    return "%.3g Gbit/s" % (b / 1e9) if b > 0 else "never pays"


print("| model | link | P | dense f32 step | PowerSGD r=4 vs f32 | vs f16 | break-even "
      "| DGC 0.1 % vs f32 | break-even | PowerSGD vs f32, a message a tensor |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in MODELS:
    name = model.rsplit("/", 1)[-1].removesuffix(".txt")
    for link in ["10gbit", "100gbit"]:
        fused, alone = plan(model, link, 25), plan(model, link, 0)
        for P in [2, 64, 1024]:
            d, p, g = fused[("dense", P)], fused[(PSGD, P)], fused[(DGC, P)]
            print("| %s | %s | %d | %.0f ms | %.2fx | %.2fx | %s | %.2fx | %s | %.2fx |" % (
                name, link, P, 1e3 * d["step_s"], p["speedup_vs_dense_f32"],
                p["speedup_vs_dense_f16"], gbit(p), g["speedup_vs_dense_f32"], gbit(g),
                alone[(PSGD, P)]["speedup_vs_dense_f32"]))

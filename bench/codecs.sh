#!/bin/sh
# bench/codecs.sh [BUILD] [N] [RUNS] - every codec family on one synthetic gradient of N
# float32 (default 25M), one core, each figure beside memcpy of the same buffer measured in
# the same run.  Prints a Markdown table (the one in docs/BENCHMARKS.md).
set -eu
B=${1:-build}
N=${2:-25000000}
R=${3:-5}
G=$B/gradcomp
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
specs="none none:values=f16 none:values=bf16
topk:density=0.001,values=f16 topk:density=0.001,values=int8 topk:density=0.01
topk:density=0.001,feedback=ef sampled:density=0.001 threshold:tau=3
randomk:density=0.001 bernoulli:density=0.001 importance:density=0.001
block:density=0.001,block=64 dgc:density=0.001
int8 int4 sign sign:feedback=ef twobit:threshold=0.5 ternary qsgd:levels=16"
out=$(mktemp)
for s in $specs; do
  if "$G" list-codecs | grep -q "^${s%%:*} (id"; then
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$G" bench -c "$s" -n "$N" --runs "$R" --json >> "$out" || true
  fi
done
if "$G" list-codecs | grep -q "^powersgd (id"; then
  side=$("$PY" -c "import math; print(int(math.isqrt($N)))")
  OPENBLAS_NUM_THREADS=1 "$G" bench -c powersgd:rank=4 -n $((side * side)) --shape "${side}x${side}" --runs "$R" --json >> "$out" || true
fi
"$PY" - "$out" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| spec | ratio | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print("| `%s` | %.1f× | %.2f | %.2f | %.2f | %.2f |" % (r["spec"], r["ratio"], r["encode_gbps"],
          r["decode_gbps"], r["memcpy_gbps"], r["encode_gbps"] / r["memcpy_gbps"]))
PYEOF
rm -f "$out"

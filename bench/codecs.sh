#!/bin/sh
# bench/codecs.sh [BUILD] [N] [RUNS] [BASELINE] - every codec family on one synthetic
# gradient of N float32 (default 25M), one core, each figure beside memcpy of the same
# buffer measured in the same run.  Prints a Markdown table (the one in
# docs/BENCHMARKS.md): the steady state (median of RUNS calls) and the first call on a
# fresh compressor beside a memcpy into fresh memory, with the process's AnonHugePages.
# With BASELINE (another build folder), each spec runs on the baseline and then on BUILD,
# back to back, and the table sets the two side by side: a before/after comparison taken
# in one sitting, so that the machine's load hits both alike.
set -eu
B=${1:-build}
N=${2:-25000000}
R=${3:-5}
BASE=${4:-}
G=$B/gradcomp
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
specs="none none:values=f16 none:values=bf16
topk:density=0.001,values=f16 topk:density=0.001,values=int8 topk:density=0.01
topk:density=0.001,feedback=ef sampled:density=0.001 threshold:tau=3
randomk:density=0.001 bernoulli:density=0.001 importance:density=0.001
block:density=0.001,block=64 dgc:density=0.001
int8 int4 sign sign:feedback=ef twobit:threshold=0.5 ternary qsgd:levels=16 natural"
out=$(mktemp)
one() { # GRADCOMP LABEL ROW SPEC [ARGS...]  (sh has no locals: o_* are its own)
  o_g=$1 o_label=$2 o_row=$3 o_spec=$4; shift 4
  if "$o_g" list-codecs | grep -q "^${o_spec%%:*} (id"; then
    o_line=$(OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 "$o_g" bench -c "$o_spec" "$@" --runs "$R" --json || true)
    [ -n "$o_line" ] && echo "$o_label|$o_row|$o_line" >> "$out"
  fi
  return 0
}
side=$("$PY" -c "import math; print(int(math.isqrt($N)))")
for s in $specs powersgd:rank=4; do
  case $s in powersgd*) size="-n $((side * side)) --shape ${side}x${side}" ;; *) size="-n $N" ;; esac
  # A baseline from before the key renames (docs/FORMAT.md, change log) spells it so.
  old=$(echo "$s" | sed 's/^threshold:tau=/threshold:threshold=/')
  # shellcheck disable=SC2086
  [ -n "$BASE" ] && one "$BASE/gradcomp" before "$s" "$old" $size
  # shellcheck disable=SC2086
  one "$G" after "$s" "$s" $size
done
"$PY" - "$out" "$BASE" <<'PYEOF'
import json, sys
rows = []
for l in open(sys.argv[1]):
    label, spec, js = l.split("|", 2)
    r = json.loads(js)
    r["spec"] = spec
    rows.append((label, r))
def first(r):
    return "%.2f | %.2f | %.0f" % (r.get("first_encode_gbps", 0), r.get("first_memcpy_gbps", 0),
                                   r.get("anon_huge_kb", -1) / 1024)
if not sys.argv[2]:
    print("| spec | ratio | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy "
          "| first encode GB/s | first memcpy GB/s | huge pages MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _, r in rows:
        print("| `%s` | %.1f× | %.2f | %.2f | %.2f | %.2f | %s |" % (r["spec"], r["ratio"],
              r["encode_gbps"], r["decode_gbps"], r["memcpy_gbps"],
              r["encode_gbps"] / r["memcpy_gbps"], first(r)))
else:
    before = {r["spec"]: r for label, r in rows if label == "before"}
    print("| spec | ratio | before: encode / memcpy | after: encode / memcpy "
          "| before: decode GB/s | after: decode GB/s | before: first encode GB/s "
          "| after: first encode GB/s | after: huge pages MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows:
        if label != "after":
            continue
        b = before.get(r["spec"])
        bm = "%.2f (%.2f / %.2f)" % (b["encode_gbps"] / b["memcpy_gbps"], b["encode_gbps"],
                                     b["memcpy_gbps"]) if b else "—"
        print("| `%s` | %.1f× | %s | %.2f (%.2f / %.2f) | %s | %.2f | %s | %.2f | %.0f |" % (
            r["spec"], r["ratio"], bm, r["encode_gbps"] / r["memcpy_gbps"], r["encode_gbps"],
            r["memcpy_gbps"], "%.2f" % b["decode_gbps"] if b else "—", r["decode_gbps"],
            "%.2f" % b["first_encode_gbps"] if b and "first_encode_gbps" in b else "—",
            r["first_encode_gbps"], r["anon_huge_kb"] / 1024))
PYEOF
rm -f "$out"

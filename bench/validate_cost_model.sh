#!/usr/bin/env bash
# validate_cost_model.sh - the cost model against measurement on netsim hosts: for each
# host count and link rate, calibrate the codecs and the network on those very hosts
# (gradcomp plan --calibrate under netsim: the same ranks, cores and links as the runs),
# then run allreduce-bench on mlp-large's biggest tensor and a short `gradcomp train
# --model mlp-large` for every method, and print predicted beside measured step time.
#
#   sudo bench/validate_cost_model.sh [OUTDIR]         the full grid (~5 min per case)
#   HOSTS="2" RATES="1gbit" METHODS="dense dgc:density=0.001" STEPS=5 sudo bench/...  a reduced one
#
# Needs root (scripts/netsim) and a Release build in build/.  Writes OUTDIR/validation.tsv
# (case, predicted ms, measured ms, ratio) and prints the share within 20 %.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
G=$ROOT/build/gradcomp
NETSIM=$ROOT/scripts/netsim
OUT=${1:-$ROOT/out/validate-cost}
HOSTS=${HOSTS:-"2 4"}
RATES=${RATES:-"100mbit 1gbit none"}
METHODS=${METHODS:-"dense dense-f16 dgc:density=0.001,values=f16 powersgd:rank=4 sign:feedback=ef twobit:threshold=0.5"}
STEPS=${STEPS:-20}       # training steps per method (after the first evaluation)
RUNS=${RUNS:-3}          # allreduce-bench timed runs
N=${N:-4096x4096}        # allreduce-bench tensor: mlp-large's fc2.weight
mkdir -p "$OUT"
printf 'kind\thosts\trate\tmethod\tpredicted_ms\tmeasured_ms\tratio\n' > "$OUT/validation.tsv"
[ -x "$G" ] || { echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2"; exit 2; }
echo "load before: $(uptime)"
comma_methods=$(echo "$METHODS" | tr ' ' ',')
bench_spec() { case $1 in dense) echo none ;; dense-f16) echo none:values=f16 ;; *) echo "$1" ;; esac; }
for H in $HOSTS; do
  for R in $RATES; do
    tag="h$H-$R"
    cal=$OUT/cal-$tag.txt
    rm -f "$cal"
    "$NETSIM" up "$H" "$R" >/dev/null
    trap '"$NETSIM" down >/dev/null 2>&1 || true' EXIT
    run() { "$NETSIM" run "$H" -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 -x GCOMP_TRAIN_LINK="$R" -- "$@"; }
    run "$G" plan --calibrate --calibration "$cal" --compare "$comma_methods" --size 4M 2> "$OUT/cal-$tag.log" ||
      { cat "$OUT/cal-$tag.log"; exit 1; }
    linkarg=(--link "$R"); [ "$R" = none ] && linkarg=()
    echo "t ${N/x/ }" > "$OUT/tensor.txt"
    for M in $METHODS; do
      spec=$(bench_spec "$M")
      run "$G" allreduce-bench -c "$spec" --shape "$N" --runs "$RUNS" --no-baseline --no-check --json \
        > "$OUT/bench-$tag-${M%%:*}.json"
      "$G" plan --model "$OUT/tensor.txt" --compare "policy:spec=$spec;dense=$spec;min_elements=1" \
        --workers "$H" "${linkarg[@]}" --latency 50 --compute-ms 0 --calibration "$cal" --json \
        > "$OUT/plan-$tag-${M%%:*}.json"
      python3 - "$OUT/bench-$tag-${M%%:*}.json" "$OUT/plan-$tag-${M%%:*}.json" "$H" "$R" "$M" \
        >> "$OUT/validation.tsv" <<'PY'
import json, sys
b, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
meas, pred = b["time_ms"]["median"], 1e3 * p["results"][0]["step_s"]
print(f"allreduce-bench\t{sys.argv[3]}\t{sys.argv[4]}\t{sys.argv[5]}\t{pred:.2f}\t{meas:.2f}\t{pred / meas:.3f}")
PY
    done
    run "$G" train --model mlp-large --compare "$comma_methods" --epochs 1 --max-steps "$STEPS" \
      --evals 1 --calibration "$cal" --quiet --out "$OUT/train-$tag" > "$OUT/train-$tag.log" 2>&1 ||
      { tail "$OUT/train-$tag.log"; exit 1; }
    python3 - "$OUT/train-$tag/results.json" "$H" "$R" >> "$OUT/validation.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m in d["methods"]:
    pred, meas = m.get("predicted_step_ms"), m["step_ms"]
    if pred is None: continue
    print(f"train mlp-large\t{sys.argv[2]}\t{sys.argv[3]}\t{m['method']}\t{pred:.2f}\t{meas:.2f}\t{pred / meas:.3f}")
PY
    "$NETSIM" down >/dev/null
    trap - EXIT
  done
done
echo "load after: $(uptime)"
column -t -s $'\t' "$OUT/validation.tsv"
python3 - "$OUT/validation.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
ok = [r for r in rows if abs(float(r[6]) - 1) <= 0.2]
print(f"{len(ok)} of {len(rows)} cases within 20 % ({100 * len(ok) / max(1, len(rows)):.0f} %)")
PY

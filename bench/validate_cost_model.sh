#!/usr/bin/env bash
# validate_cost_model.sh - the cost model against measurement on netsim hosts: for each
# host count and link rate, calibrate the codecs and the network on those very hosts
# (gradcomp plan --calibrate under netsim: the same ranks, cores and links as the runs),
# then run allreduce-bench on one of mlp-large's tensors and a short `gradcomp train --model
# mlp-large` for every method, and print predicted beside measured step time.
#
#   sudo bench/validate_cost_model.sh [OUTDIR]         the full grid (2x3 cases, ~2-3 min each)
#   CASES="h2-1gbit h4-100mbit" METHODS="dense dgc:density=0.001,values=f16" sudo bench/...
#
# netsim is shared (one job at a time, a lock): the script takes the lock for a turn, runs
# cases in it (each: up, calibrate, one short allreduce-bench per method, one short train
# comparing all methods, down; one to three minutes) and starts another case in the same
# turn only while the turn is younger than TURN_S seconds (default 120), then lets the
# other users' jobs run.  The calibration is per case on purpose: the codec rates are taken
# seconds before the runs they predict, under the same load.
#
# Why these sizes: allreduce-bench uses fc2.weight (4096x4096, 64 MiB) at 1 Gbit/s and
# unshaped, fc1.weight (4096x784) at 100 Mbit/s so that a dense run stays near a second.
# train runs STEPS steps (default 3) on the synthetic data set (the step time does not
# depend on the pixels; Fashion-MNIST's 10,000-image evaluation would cost more than the
# steps).  The measured step is the trainer's steady_step_ms, the mean of the steps after
# the first: the first touches every compressor's state and workspace for the first time
# (hundreds of MB for DGC's momentum on mlp-large), a one-time cost the model leaves out.
#
# Needs root (scripts/netsim) and a Release build in build/.  Writes OUTDIR/validation.tsv
# (kind, hosts, rate, method, predicted ms, measured ms, ratio, load) and prints the share
# of cases within 20 %.  An existing validation.tsv is appended to (CASES="h4-100mbit" adds
# or reruns one case); delete it for a fresh grid.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
G=$ROOT/build/gradcomp
NETSIM=${NETSIM:-$ROOT/scripts/netsim} # a stand-in with the same commands, for testing the script
OUT=${1:-$ROOT/out/validate-cost}
METHODS=${METHODS:-"dense dense-f16 dgc:density=0.001,values=f16 powersgd:rank=4 sign:feedback=ef twobit:threshold=0.5"}
STEPS=${STEPS:-4}             # training steps per method (the first is left out)
RUNS=${RUNS:-3}               # allreduce-bench timed runs (after one warm-up)
# Codec calibration at the sizes of mlp-large's tensors (fc2 4096x4096, fc1 4096x784, fc3
# 4096x10; the biases take the smallest): per-element cost changes as a tensor outgrows the
# caches, and the model interpolates between the sizes measured (one size at 16.8 M
# over-predicted fc1's 3.2 M by 1.2-2.8x).
CAL_SIZE=${CAL_SIZE:-16777216,3211264,40960}
# The cases, in the order they run (the most telling first: a short session may get only a
# few turns of the netsim lock): hH-RATE for H hosts at RATE.
CASES=${CASES-"h2-1gbit h4-100mbit h2-none h2-100mbit h4-1gbit h4-none"}
TURN_S=${TURN_S:-120}          # start no new case in a turn of the lock older than this
export NETSIM_TIMEOUT=${NETSIM_TIMEOUT:-240}
STATE=${NETSIM_STATE_DIR:-/run/gradcomp-netsim}
mkdir -p "$OUT"
TSV=$OUT/validation.tsv
[ -s "$TSV" ] || printf 'kind\thosts\trate\tmethod\tpredicted_ms\tmeasured_ms\tratio\tload1\n' >"$TSV"
[ -x "$G" ] || {
    echo "build first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2"
    exit 2
}
comma_methods=$(echo "$METHODS" | tr ' ' ',')
bench_spec() { case $1 in dense) echo none ;; dense-f16) echo none:values=f16 ;; *) echo "$1" ;; esac; }
load1() { cut -d' ' -f1 /proc/loadavg; }
log() { printf '%s %s (load %s)\n' "$(date -u +%H:%M:%S)" "$*" "$(load1)"; }

# One turn of netsim's lock: cases from $pending while the turn is young; each case brings
# its hosts up and down (also on failure).  The cases run are listed in $OUT/turn.
turn() {
    (
        mkdir -p "$STATE"
        exec 9>"$STATE/lock"
        flock -w "${NETSIM_LOCK_WAIT:-3600}" 9 || {
            echo "netsim lock busy" >&2
            exit 1
        }
        export NETSIM_LOCKED=1
        trap '"$NETSIM" down >/dev/null 2>&1 || true' EXIT
        local t0=$SECONDS
        for tag in $pending; do
            [ $((SECONDS - t0)) -lt "$TURN_S" ] || break
            set_case "$tag"
            echo "$tag" >>"$OUT/turn"
            "$NETSIM" up "$H" "$R" >/dev/null 2>&1 || { log "$tag: netsim up failed"; continue; }
            case_unit || log "$tag: failed"
            "$NETSIM" down >/dev/null 2>&1 || true
        done
    )
}
set_case() {
    tag=$1 H=${1%%-*} R=${1#*-}
    H=${H#h}
    cal=$OUT/cal-$tag.txt
    N=4096x4096
    [ "$R" != 100mbit ] || N=4096x784
}
nrun() { "$NETSIM" run "$H" -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 -x GCOMP_TRAIN_LINK="$R" -- "$@"; }

bench_unit() {
    nrun "$G" plan --calibrate --calibration "$cal" --compare "$comma_methods" --size "$CAL_SIZE" \
        2>"$OUT/cal-$tag.log" || {
        cat "$OUT/cal-$tag.log"
        return 1
    }
    for M in $METHODS; do
        local spec
        spec=$(bench_spec "$M")
        echo "$(load1)" >"$OUT/bench-$tag-${M%%:*}.load"
        nrun "$G" allreduce-bench -c "$spec" --shape "$N" --runs "$RUNS" --no-baseline --no-check \
            --json >"$OUT/bench-$tag-${M%%:*}.json" 2>"$OUT/bench-$tag-${M%%:*}.log" ||
            echo "allreduce-bench $M failed (rc $?): $(tail -1 "$OUT/bench-$tag-${M%%:*}.log")"
    done
}

train_unit() {
    echo "$(load1)" >"$OUT/train-$tag.load"
    nrun "$G" train --model mlp-large --data synthetic --compare "$comma_methods" --epochs 1 \
        --max-steps "$STEPS" --evals 1 --calibration "$cal" --quiet --out "$OUT/train-$tag" \
        >"$OUT/train-$tag.log" 2>&1 || {
        tail -3 "$OUT/train-$tag.log"
        return 1
    }
}

case_unit() {
    rm -f "$cal" "$OUT/train-$tag/results.json"
    log "$tag: calibrate + allreduce-bench"
    bench_unit || return 1
    log "$tag: train"
    train_unit
}

# Predicted beside measured for one case that ran (outside the lock: plan is arithmetic).
post() {
    set_case "$1"
    [ -s "$cal" ] || { log "$tag: no calibration, nothing to compare"; return 0; }
    # The prediction: the tensor alone, its spec for every tensor, the calibrated codec
    # rates, latency and burst, the link's nominal rate (the calibrated one when unshaped).
    local lat_us burst M spec b
    lat_us=$(awk '$1 == "net" && $2 == "inter" { for (i = 3; i <= NF; i++)
        if ($i ~ /^latency=/) { sub("latency=", "", $i); printf "%.3f", $i * 1e6 } }' "$cal")
    burst=$(awk '$1 == "net" && $2 == "inter" { for (i = 3; i <= NF; i++)
        if ($i ~ /^burst=/) { sub("burst=", "", $i); printf "%.0f", $i } }' "$cal")
    local linkarg=(--link "$R" --latency "${lat_us:-25}" --burst "${burst:-0}")
    [ "$R" != none ] || linkarg=()
    echo "t ${N/x/ }" >"$OUT/tensor-$tag.txt"
    for M in $METHODS; do
        spec=$(bench_spec "$M")
        b=$OUT/bench-$tag-${M%%:*}
        [ -s "$b.json" ] || continue
        "$G" plan --model "$OUT/tensor-$tag.txt" --compare "policy:spec=$spec;dense=$spec;min_elements=1" \
            --workers "$H" "${linkarg[@]}" --compute-ms 0 --calibration "$cal" --json \
            >"$OUT/plan-$tag-${M%%:*}.json"
        python3 - "$b.json" "$OUT/plan-$tag-${M%%:*}.json" "$H" "$R" "$M" "$(cat "$b.load")" \
            >>"$TSV" <<'PY'
import json, sys
b, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
meas, pred = b["time_ms"]["median"], 1e3 * p["results"][0]["step_s"]
h, r, m, load = sys.argv[3:7]
print(f"allreduce-bench\t{h}\t{r}\t{m}\t{pred:.2f}\t{meas:.2f}\t{pred / meas:.3f}\t{load}")
PY
    done
    [ -s "$OUT/train-$tag/results.json" ] || return 0
    python3 - "$OUT/train-$tag/results.json" "$H" "$R" "$(cat "$OUT/train-$tag.load")" >>"$TSV" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m in d["methods"]:
    # The model predicts a step in steady state: the first step, which also touches every
    # compressor's state for the first time, is left out (steady_step_ms; the trainer's
    # step_ms is the mean over all steps).
    pred, meas = m.get("predicted_step_ms"), m.get("steady_step_ms") or m["step_ms"]
    if pred is None: continue
    print(f"train mlp-large\t{sys.argv[2]}\t{sys.argv[3]}\t{m['method']}\t{pred:.2f}\t{meas:.2f}\t{pred / meas:.3f}\t{sys.argv[4]}")
PY
}

for tag in ${POST:-}; do post "$tag"; done # POST="h2-1gbit": compare a case run before
pending=$CASES
while [ -n "$pending" ]; do
    log "waiting for netsim (cases left: $pending)"
    : >"$OUT/turn"
    turn || log "turn failed"
    ran=$(cat "$OUT/turn")
    [ -n "$ran" ] || break
    for tag in $ran; do
        post "$tag"
        log "$tag: done"
    done
    left=""
    for tag in $pending; do
        case " $(echo $ran) " in *" $tag "*) ;; *) left="$left $tag" ;; esac
    done
    pending=${left# }
done
column -t -s $'\t' "$TSV"
python3 - "$TSV" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
ok = [r for r in rows if abs(float(r[6]) - 1) <= 0.2]
print(f"{len(ok)} of {len(rows)} cases within 20 % ({100 * len(ok) / max(1, len(rows)):.0f} %)")
PY

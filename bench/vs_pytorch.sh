#!/bin/sh
# bench/vs_pytorch.sh - gradcomp side by side with what users run today, on shaped links.
#
#   bench/vs_pytorch.sh [--build DIR] [--hosts N] [--link RATE] [--model M] [--budget S]
#                       [--reps R] [--eval-every S] [--target A|dense-PP] [--out DIR]
#                       [--methods "M1 M2 ..."] [--loopback]
#
# Methods (space-separated; each trains the same model from the same weights, in its own
# job, for the same --budget seconds of training):
#   ddp            PyTorch 1.13 DDP on gloo, dense fp32 (no hook)
#   ddp-fp16       DDP + fp16_compress_hook
#   ddp-powersgd   DDP + powerSGD_hook, rank 4 (one DDP bucket: see bench/vs_pytorch.py)
#   ddp-gradcomp   DDP + gradcomp's hook, --spec of bench/vs_pytorch.py (powersgd:rank=4);
#                  ddp-gradcomp:SPEC with SPEC (ddp-gradcomp:dgc:density=0.001,values=f16)
#   gc:SPEC        `gradcomp train` with SPEC (gc:powersgd:rank=4, gc:dense, ...)
#   a ddp method with +keepmem (glibc keeps freed memory: torch's per-step temporaries
#   stop faulting in fresh pages) and/or +view (gradient_as_bucket_view), e.g.
#   ddp-gradcomp+keepmem: what PyTorch itself costs beside the hook (docs/BENCHMARKS.md)
# Default: "ddp ddp-fp16 ddp-powersgd ddp-gradcomp gc:powersgd:rank=4", 4 hosts at
# 1gbit, mlp-large, 90 s, 3 repetitions: about 35 minutes.
#
# Each host is a network namespace with its own tbf-shaped full-duplex link
# (scripts/netsim: root); one rank per host, pinned one per core by netsim's rankfile.
# Without root (or with --loopback) it runs on loopback (mpirun -np N), which checks the
# scripts but measures no network.  Before and after every run the load average is recorded beside it.
#
# Output: DIR/runs/<rep>-<method>.json (one per run), DIR/summary.md and DIR/summary.json
# (bench/vs_pytorch_report.py: medians over repetitions with their ranges).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
FORCE_LO=0 BUILD=build HOSTS=4 LINK=1gbit MODEL=mlp-large BUDGET=90 REPS=3 EVERY=10 TARGET=dense-0.5
OUT=out/vs-pytorch
METHODS="ddp ddp-fp16 ddp-powersgd ddp-gradcomp gc:powersgd:rank=4"
while [ $# -gt 0 ]; do
  case $1 in
  --build) BUILD=$2 ;;
  --hosts) HOSTS=$2 ;;
  --link) LINK=$2 ;;
  --model) MODEL=$2 ;;
  --budget) BUDGET=$2 ;;
  --reps) REPS=$2 ;;
  --eval-every) EVERY=$2 ;;
  --target) TARGET=$2 ;;
  --out) OUT=$2 ;;
  --methods) METHODS=$2 ;;
  --loopback) FORCE_LO=1; shift; continue ;;
  -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
  *) echo "vs_pytorch.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift 2
done
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
case $OUT in /*) ;; *) OUT=$(pwd)/$OUT ;; esac
G=$BUILD/gradcomp
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
[ -x "$G" ] || { echo "vs_pytorch.sh: no $G (cmake --build $BUILD)" >&2; exit 1; }
mkdir -p "$OUT/runs"

if [ $FORCE_LO = 0 ] && [ "$(id -u)" -eq 0 ] && bash "$ROOT/scripts/netsim" check >/dev/null 2>&1; then
  WHERE=netsim
  echo "vs_pytorch: $HOSTS netsim hosts, each behind a $LINK full-duplex link; $MODEL; $BUDGET s of training per method; $REPS repetitions"
else
  WHERE=loopback
  LINK=loopback
  echo "vs_pytorch: NOT on shaped links (needs root and scripts/netsim): $HOSTS ranks on loopback; times here measure no network"
fi
# Training runs far past netsim's default 300 s job limit; evaluations and start-up too.
export NETSIM_TIMEOUT=$((BUDGET * 4 + 600))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# run_job ENV... -- PROGRAM ARGS...: one job of $HOSTS ranks, here or on the netsim hosts.
run_job() {
  xs=""
  while [ "$1" != -- ]; do xs="$xs -x $1"; shift; done
  shift
  if [ $WHERE = netsim ]; then
    # shellcheck disable=SC2086
    bash "$ROOT/scripts/netsim" job "$HOSTS" "$LINK" "$HOSTS" $xs \
      -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 -x GLOO_SOCKET_IFNAME=eth0 \
      -x MASTER_ADDR=10.77.0.1 -- "$@"
  else
    # shellcheck disable=SC2086
    mpirun -np "$HOSTS" --bind-to none $xs -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1 \
      -x GLOO_SOCKET_IFNAME=lo -x MASTER_ADDR=127.0.0.1 "$@"
  fi
}

load() { cut -d' ' -f1-3 /proc/loadavg; }

rep=1
while [ "$rep" -le "$REPS" ]; do
  for m in $METHODS; do
    tag=$(printf '%s' "$m" | tr -c 'A-Za-z0-9.=-' '_')
    res=$OUT/runs/$rep-$tag.json
    before=$(load)
    echo "== repetition $rep/$REPS: $m (load $before)"
    case $m in
    gc:*)
      spec=${m#gc:}
      [ "$spec" = dense ] && spec=dense
      d=$OUT/runs/$rep-$tag.d
      rm -rf "$d" && mkdir -p "$d"
      # Each rank notes what its interface sent, around the whole run (evaluations add a
      # few hundred bytes; there is no start-up broadcast: every rank builds the same
      # weights from the seed).
      IF=eth0
      [ $WHERE = netsim ] || IF=lo
      run_job GCOMP_TRAIN_LINK="$LINK" -- sh -c '
        f=/sys/class/net/$1/statistics/tx_bytes; a=$(cat $f); shift; d=$1; shift
        "$@"; rc=$?; b=$(cat $f); echo $((b - a)) > "$d/tx.$OMPI_COMM_WORLD_RANK"; exit $rc' \
        sh "$IF" "$d" "$G" train --model "$MODEL" --epochs 20 --time-budget "$BUDGET" \
        --evals 24 --quiet --compare "$spec" --out "$d" > "$d/train.log" 2>&1 ||
        { cat "$d/train.log"; echo "vs_pytorch: gradcomp train $spec failed" >&2; exit 1; }
      "$PY" "$HERE/vs_pytorch_report.py" --import-gc "$d" "$m" "$res"
      ;;
    ddp*)
      # ddp-gradcomp[+...]:SPEC gives the hook SPEC instead of vs_pytorch.py's default.
      set -- --method "${m%%:*}"
      case $m in *:*) set -- "$@" --spec "${m#*:}" ;; esac
      run_job MASTER_PORT=$((29500 + rep)) -- "$PY" "$HERE/vs_pytorch.py" "$@" \
        --model "$MODEL" --budget "$BUDGET" --eval-every "$EVERY" --out "$res" \
        > "$OUT/runs/$rep-$tag.log" 2>&1 ||
        { tail -20 "$OUT/runs/$rep-$tag.log"; echo "vs_pytorch: $m failed" >&2; exit 1; }
      ;;
    *) echo "vs_pytorch.sh: unknown method $m" >&2; exit 2 ;;
    esac
    "$PY" - "$res" "$before" "$(load)" "$WHERE" "$LINK" "$rep" "$m" <<'EOF'
import json, sys
p, before, after, where, link, rep, label = sys.argv[1:]
r = json.load(open(p))
# the method as the list named it (ddp-gradcomp:SPEC), so runs of one hook with two specs differ
r.update({"load_before": before, "load_after": after, "where": where, "link": link, "rep": int(rep),
          "method": label})
json.dump(r, open(p, "w"), indent=1)
print(f"   {r['steps']} steps, {r['step_ms']:.0f} ms/step, final accuracy {100 * r['final_acc']:.2f} %, load after {after}")
EOF
  done
  rep=$((rep + 1))
done
# DDP dense's runs for the target: plain, else the kept-memory ones
DENSE=ddp
case " $METHODS " in *" ddp "*) ;; *" ddp+keepmem "*) DENSE=ddp+keepmem ;; esac
"$PY" "$HERE/vs_pytorch_report.py" --target "$TARGET" --dense "$DENSE" "$OUT"

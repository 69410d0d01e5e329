#!/bin/sh
# test_cli_oom.sh GRADCOMP WORKDIR - the CLI out of memory: each command runs under a ladder
# of address-space limits (ulimit -v, 50 MB to 400 MB) on a 4M-element gradient, so the
# library's allocations (compressor state, workspaces, messages) fail at different points.
# At every limit a command must exit 0, or 1 with a message on stderr (never a signal, an
# abort or a usage error), and a failed `encode --state` must leave the state file as it
# was (it is replaced atomically only after success).  The ladder must see both outcomes
# for encode, so the failure path is really taken.  One OpenBLAS/OpenMP thread: their
# thread creation under a limit is theirs, not gradcomp's.  Skipped (77) under sanitizers,
# whose shadow memory needs terabytes of address space.
set -u
G=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ -n "${ASAN_OPTIONS:-}" ] || nm -D "$G" 2>/dev/null | grep -q __asan_init; then
    echo "test_cli_oom: sanitizer build; skipped"
    exit 77
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" -c "
import array, math
a = array.array('f', (math.sin(i * 0.37) * ((i % 97) + 0.5) for i in range(4 << 20)))
open('g.f32', 'wb').write(a.tobytes())
" || exit 1
"$G" encode -c topk:density=0.01,feedback=ef --state st.bin -i g.f32 -o m.gcm || exit 1
cp st.bin st.orig
fails=0
enc_ok=0
enc_fail=0
check() { # check LIMIT DESC CMD...
  lim=$1 desc=$2
  shift 2
  (ulimit -v "$lim" && exec "$@") >out.txt 2>err.txt
  rc=$?
  if [ $rc -eq 0 ]; then
    return 0
  elif [ $rc -eq 1 ] && [ -s err.txt ]; then
    return 1
  fi
  echo "FAIL: $desc under ulimit -v $lim: exit $rc"
  cat err.txt
  fails=$((fails + 1))
  return 2
}
for lim in 50000 60000 70000 80000 100000 120000 150000 200000 300000 400000; do
  cp st.orig st.bin
  check $lim "encode --state" "$G" encode -c topk:density=0.01,feedback=ef --state st.bin -i g.f32 -o m2.gcm
  case $? in
  0) enc_ok=$((enc_ok + 1)) ;;
  1) enc_fail=$((enc_fail + 1))
     cmp -s st.bin st.orig || { echo "FAIL: failed encode under $lim changed st.bin"; fails=$((fails + 1)); } ;;
  esac
  check $lim "encode powersgd" "$G" encode -c powersgd:rank=4 --shape 2048x2048 -i g.f32 -o p.gcm
  check $lim "decode" "$G" decode -i m.gcm -o d.f32
  check $lim "inspect" "$G" inspect m.gcm
  check $lim "state" "$G" state st.orig --residual r.f32
  check $lim "verify" "$G" verify m.gcm
done
echo "test_cli_oom: encode succeeded under $enc_ok limits and failed cleanly under $enc_fail"
[ $enc_ok -gt 0 ] || { echo "FAIL: encode never succeeded (raise the ladder)"; fails=$((fails + 1)); }
[ $enc_fail -gt 0 ] || { echo "FAIL: encode never ran out of memory (lower the ladder)"; fails=$((fails + 1)); }
[ $fails -eq 0 ] && echo "test_cli_oom: ok"
exit $((fails != 0))

#!/bin/sh
# test_cli.sh GRADCOMP WORKDIR - the CLI as a user drives it: round trips, a sequence of
# steps through --state, inspect/verify, and clear non-zero exits (never a signal) on
# corrupt, truncated and foreign input.
set -u
G=$1
W=$2
REGRESS=$(cd "$(dirname "$0")/../fuzz/regress" && pwd)
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fails=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_rc() { # expect_rc WANT DESC CMD...  (WANT: 0, or "err" for 1..127)
  want=$1; desc=$2; shift 2
  "$@" >out.txt 2>err.txt; rc=$?
  if [ "$want" = err ]; then
    if [ $rc -ge 1 ] && [ $rc -lt 128 ] && [ -s err.txt ]; then ok; else bad "$desc: rc=$rc (want a clean error)"; cat err.txt; fi
  elif [ $rc -eq "$want" ]; then ok; else bad "$desc: rc=$rc want $want"; cat err.txt; fi
}

# Two deterministic gradients of 10000 float32.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import struct, math
with open("g.f32", "wb") as f:
    f.write(struct.pack("<10000f", *[math.sin(i * 0.37) * ((i % 97) + 0.5) for i in range(10000)]))
with open("g2.f32", "wb") as f:
    f.write(struct.pack("<10000f", *[math.cos(i * 0.11) * (i % 13) for i in range(10000)]))
PYEOF
[ -s g.f32 ] || { echo "cannot create test data (python3 missing)"; exit 1; }

# dense f32 round trip is exact
expect_rc 0 "encode none" "$G" encode -c none -i g.f32 -o none.gcm
expect_rc 0 "decode none" "$G" decode -i none.gcm -o none.f32
cmp -s g.f32 none.f32 && ok || bad "none round trip differs"
# stdin/stdout
"$G" encode -c topk:density=0.01,values=f16 < g.f32 > topk.gcm && ok || bad "encode via pipes"
"$G" decode < topk.gcm > topk.f32 && [ "$(wc -c < topk.f32)" -eq 40000 ] && ok || bad "decode via pipes"
expect_rc 0 "inspect" "$G" inspect topk.gcm
grep -q "codec          topk" out.txt && grep -q "sent           100 values" out.txt && ok || { bad "inspect fields"; cat out.txt; }
expect_rc 0 "verify good" "$G" verify none.gcm topk.gcm

# --state: a sequence of steps with error feedback
rm -f st.bin
expect_rc 0 "step 1" "$G" encode -c topk:density=0.01,feedback=ef --state st.bin -i g.f32 -o s1.gcm
expect_rc 0 "step 2" "$G" encode -c topk:density=0.01,feedback=ef --state st.bin -i g2.f32 -o s2.gcm
expect_rc 0 "state" "$G" state st.bin --residual r.f32
grep -q "step           2" out.txt && ok || { bad "state step"; cat out.txt; }
[ "$(wc -c < r.f32)" -eq 40000 ] && ok || bad "residual dump size"
cmp -s s1.gcm s2.gcm && bad "steps identical" || ok
expect_rc err "state from another spec" "$G" encode -c topk:density=0.02,feedback=ef --state st.bin -i g.f32 -o x.gcm
grep -q "was saved by" err.txt && ok || bad "foreign state message"
# --state keeps the shape: a PowerSGD state for 100x100 is not one for 50x200 (same spec and
# size); it used to be used silently.
rm -f ps.bin
expect_rc 0 "powersgd step 1" "$G" encode -c powersgd:rank=2 --shape 100x100 --state ps.bin -i g.f32 -o p1.gcm
expect_rc err "state for another shape" "$G" encode -c powersgd:rank=2 --shape 50x200 --state ps.bin -i g2.f32 -o p2.gcm
grep -q "another matrix shape" err.txt && ok || { bad "other-shape message"; cat err.txt; }
expect_rc err "state for no shape" "$G" encode -c powersgd:rank=2 --state ps.bin -i g2.f32 -o p2.gcm
expect_rc 0 "powersgd step 2" "$G" encode -c powersgd:rank=2 --shape 100x100 --state ps.bin -i g2.f32 -o p2.gcm
expect_rc 0 "powersgd state" "$G" state ps.bin
grep -q "step           2" out.txt && ok || { bad "powersgd state step"; cat out.txt; }
# seeds: same seed -> same bytes; different -> different
"$G" encode -c randomk:density=0.01 --seed 5 -i g.f32 -o r5a.gcm && "$G" encode -c randomk:density=0.01 --seed 5 -i g.f32 -o r5b.gcm
cmp -s r5a.gcm r5b.gcm && ok || bad "same seed differs"
"$G" encode -c randomk:density=0.01 --seed 6 -i g.f32 -o r6.gcm
cmp -s r5a.gcm r6.gcm && bad "different seeds equal" || ok

# bad specs and usage
expect_rc 2 "unknown codec" "$G" encode -c tpok -i g.f32 -o x.gcm
grep -q "unknown codec 'tpok'; known:" err.txt && ok || bad "unknown codec message"
expect_rc 2 "bad key" "$G" encode -c topk:densty=0.1 -i g.f32 -o x.gcm
grep -q "allowed: density" err.txt && ok || bad "bad key message"
expect_rc 2 "no spec" "$G" encode -i g.f32
expect_rc 2 "unknown command" "$G" frobnicate
expect_rc err "missing input" "$G" encode -c none -i nonexistent.f32 -o x.gcm
printf 'abc' > odd.f32
expect_rc err "odd-sized input" "$G" encode -c none -i odd.f32 -o x.gcm

# corrupt and truncated messages: every truncation of a small message, and flipped bytes
len=$(wc -c < topk.gcm)
i=0
while [ $i -lt "$len" ]; do
  head -c $i topk.gcm > t.gcm
  "$G" decode -i t.gcm -o t.f32 2>err.txt; rc=$?
  if [ $rc -lt 1 ] || [ $rc -ge 128 ] || ! [ -s err.txt ]; then bad "truncated to $i: rc=$rc"; fi
  i=$((i + 7))
done
ok
for pos in 0 4 5 6 8 12 16 20 24 32 36 40 45 50 60 70 100; do
  [ $pos -lt "$len" ] || continue
  cp topk.gcm c.gcm
  printf '\377' | dd of=c.gcm bs=1 seek=$pos conv=notrunc 2>/dev/null
  cmp -s c.gcm topk.gcm && continue
  "$G" decode -i c.gcm -o c.f32 2>err.txt; rc=$?
  if [ $rc -lt 1 ] || [ $rc -ge 128 ] || ! [ -s err.txt ]; then bad "corrupt byte $pos: rc=$rc"; fi
  "$G" verify c.gcm >/dev/null 2>&1 && bad "verify accepted corrupt byte $pos"
done
ok
expect_rc err "verify mixed" "$G" verify topk.gcm c.gcm
grep -q "INVALID" out.txt && ok || bad "verify says INVALID"
expect_rc err "decode garbage" "$G" decode -i g.f32 -o x.f32
grep -q "bad magic" err.txt && ok || { bad "garbage message"; cat err.txt; }

# list-codecs and bench
expect_rc 0 "list-codecs" "$G" list-codecs
grep -q "^topk (id 2)" out.txt && grep -q "density" out.txt && ok || bad "list-codecs content"
expect_rc 0 "list-codecs --json" "$G" list-codecs --json
grep -q '"name":"topk"' out.txt && ok || bad "list-codecs json"
expect_rc 0 "bench json" "$G" bench -c topk:density=0.01 -n 100000 --runs 3 --json
for f in spec n bytes_in bytes_out ratio encode_gbps decode_gbps memcpy_gbps encode_mean_ms; do
  grep -q "\"$f\":" out.txt || bad "bench json lacks $f"
done
grep -q '"pairs":false' out.txt && ok || bad "bench json: pairs is not false by default"
expect_rc 0 "bench --pairs" "$G" bench -c powersgd:rank=4 --shape 64x32 --runs 3 --pairs --json
grep -q '"pairs":true' out.txt && grep -q '"memcpy_ms":[0-9]' out.txt && ok || bad "bench --pairs json"
expect_rc 2 "bench bad n" "$G" bench -c topk -n abc

# train's option errors come before any MPI or data work
if "$G" --help 2>/dev/null | grep -q "gradcomp train"; then
  expect_rc 2 "train bad --lr-schedule" "$G" train --lr-schedule linear
  grep -q "const, cosine or step" err.txt && ok || bad "train --lr-schedule message"
  expect_rc 2 "train bad --loss" "$G" train --loss total
  grep -q "mean or sum" err.txt && ok || bad "train --loss message"
  expect_rc 2 "train bad --epochs" "$G" train --epochs 0
  expect_rc 2 "train bad --min-k" "$G" train --min-k 4294967296
  grep -q "min-k 4294967296: 0..4294967295" err.txt && ok || bad "train --min-k message"
fi

# A 68-byte message whose header claims 3.4e9 elements and whose counts ask for 5.7 GB: the
# CLI validates it before allocating the output, so under a 1.5 GB address-space limit it is
# "corrupt", not "out of memory" (issue 16's repro; the library's side: tests/fuzz).
# ASan reserves terabytes of address space for itself: no ulimit -v under a sanitizer.
lim=1500000
if [ -n "${ASAN_OPTIONS:-}" ] || nm -D "$G" 2>/dev/null | grep -q __asan_init; then lim=unlimited; fi
(ulimit -v $lim && exec "$G" decode -i "$REGRESS/decode/sparse_bigalloc.gcm" -o big.f32) \
  >out.txt 2>err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "corrupt" err.txt; then ok; else bad "sparse_bigalloc: rc=$rc $(cat err.txt)"; fi

echo "cli: $pass passed, $fails failed"
[ $fails -eq 0 ]

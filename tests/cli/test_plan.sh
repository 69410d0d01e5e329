#!/bin/sh
# test_plan.sh GRADCOMP WORKDIR - `gradcomp plan`: a table and JSON for a model file, and a
# clear non-zero exit naming the wrong input for a bad model file (with its line), an
# unknown spec, P < 1, a link of 0 and a corrupt calibration.
set -u
G=$1
W=$2
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fails=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect_err DESC PATTERN CMD...: exit 1..127, stderr matches PATTERN (names the input)
expect_err() {
  desc=$1; pat=$2; shift 2
  "$@" >out.txt 2>err.txt; rc=$?
  if [ $rc -ge 1 ] && [ $rc -lt 128 ] && grep -q -- "$pat" err.txt; then ok
  else bad "$desc: rc=$rc, stderr:"; cat err.txt; fi
}
printf 'gradcomp-calibration 1\n' > empty.cal
printf '# a model\nfc1.weight 1024 784\nfc1.bias 1024\nfc2.weight 10 1024\n' > m.txt
C="--calibration empty.cal"
"$G" plan --model m.txt --compare dense,topk:density=0.01,powersgd:rank=4 --workers 2,8 \
    --link 1gbit --compute-ms 5 $C > out.txt 2> err.txt && ok || { bad "plan table"; cat err.txt; }
grep -q "P = 8 workers" out.txt && grep -q "topk:density=0.01" out.txt && ok || { bad "table"; cat out.txt; }
"$G" plan --model m.txt --compare topk:density=0.01 --workers 4 --link 10gbit --compute-ms 5 \
    $C --json > j.json 2> err.txt && ok || { bad "plan --json"; cat err.txt; }
python3 -c "
import json; d = json.load(open('j.json')); r = d['results'][0]
assert r['workers'] == 4 and len(r['tensors']) == 3 and r['bytes_per_step'] > 0, r
assert r['tensors'][1]['spec'].startswith('none'), r   # 1-D: dense by the policy
" && ok || bad "json content"


# macs=: the backward spread by work. A last layer of no work is final when backward starts;
# by elements, after half of it (1 ms of 2).
printf 'first 1000 1000 macs=1\nlast 1000 1000 macs=0\n' > w.txt
printf 'first 1000 1000\nlast 1000 1000\n' > w0.txt
for f in w w0; do
  "$G" plan --model $f.txt --compare dense --workers 2 --link 10gbit --compute-ms 3 $C --json \
      > $f.json 2> err.txt || { bad "plan $f.txt"; cat err.txt; }
done
python3 -c "
import json
w, w0 = (json.load(open(f))['results'][0] for f in ('w.json', 'w0.json'))
last, last0 = w['tensors'][1], w0['tensors'][1]
assert abs(last0['ready_s'] - last['ready_s'] - 1e-3) < 1e-12, (last, last0)  # half of backward
" && ok || { bad "macs= moves the ready time"; cat w.json; }
# --bucket-mb: both tensors in one message, sent when the first is final.
"$G" plan --model w0.txt --compare dense --workers 2 --link 10gbit --compute-ms 3 $C --json \
    --bucket-mb 64 > b.json 2> err.txt || { bad "plan --bucket-mb"; cat err.txt; }
python3 -c "
import json
r, r0 = (json.load(open(f))['results'][0] for f in ('b.json', 'w0.json'))
t = r['tensors']
assert t[1]['bytes_sent'] == 0 and t[0]['bytes_sent'] == r0['bytes_per_step'], (t, r0)
assert t[0]['bucket'] == t[1]['bucket'] == 1, t
assert r['bytes_per_step'] == r0['bytes_per_step'], (r, r0)
" && ok || { bad "--bucket-mb fuses"; cat b.json; }
printf 'a 10 10 macs=5\nb 5\n' > m5.txt
expect_err "macs= on some lines" "m5.txt:2.*every tensor or on none" "$G" plan --model m5.txt --link 1gbit $C
printf 'a 10 10 macs=-1\n' > m6.txt
expect_err "negative macs" "m6.txt:1.*macs=" "$G" plan --model m6.txt --link 1gbit $C
printf 'a 10 macs=2 10\n' > m7.txt
expect_err "dimension after macs" "m7.txt:1.*after macs=" "$G" plan --model m7.txt --link 1gbit $C
expect_err "bad --bucket-mb" "--bucket-mb" "$G" plan --model m.txt --bucket-mb -1 --link 1gbit $C
printf 'a 10 10\nb 5\nc 7 x\n' > m2.txt
expect_err "bad model line" "m2.txt:3.*positive integers" "$G" plan --model m2.txt --link 1gbit $C
printf 'a 10 10\nlonely\n' > m3.txt
expect_err "no dimensions" "m3.txt:2" "$G" plan --model m3.txt --link 1gbit $C
: > m4.txt
expect_err "empty model" "no tensors" "$G" plan --model m4.txt --link 1gbit $C
expect_err "missing model" "nosuchmodel" "$G" plan --model nosuchmodel --link 1gbit $C
expect_err "unknown spec" "unknown codec 'nosuch'" "$G" plan --model m.txt --compare nosuch --link 1gbit $C
expect_err "bad spec key" "densty" "$G" plan --model m.txt --compare topk:densty=0.1 --link 1gbit $C
expect_err "P = 0" "worker count 0" "$G" plan --model m.txt --workers 0 --link 1gbit $C
expect_err "P < 0" "--workers" "$G" plan --model m.txt --workers 4,-2 --link 1gbit $C
expect_err "link 0" "link speed must be a rate > 0" "$G" plan --model m.txt --link 0 $C
expect_err "link 0gbit" "link speed must be a rate > 0" "$G" plan --model m.txt --link 0gbit $C
expect_err "link 1.5" "with its unit" "$G" plan --model m.txt --link 1.5 $C
expect_err "link 1e300gbit" "from 1kbit to 1000tbit" "$G" plan --model m.txt --link 1e300gbit $C
expect_err "link junk" "--link fast" "$G" plan --model m.txt --link fast $C
expect_err "no link" "no link" "$G" plan --model m.txt $C
expect_err "bad --burst" "--burst -5" "$G" plan --model m.txt --link 1gbit --burst -5 $C
# A shaper's burst: from the calibration's net line without --link, or --burst; the step's
# compressed exchange fits in it, so the step is shorter than on a plain wire.
printf 'gradcomp-calibration 3\nnet inter ranks=2 latency=1e-5 bandwidth=1.25e7 burst=262144\n' \
    > burst.cal
for b in cal 0; do
  extra=""; [ $b = cal ] || extra="--burst $b"
  # shellcheck disable=SC2086
  "$G" plan --model m.txt --compare topk:density=0.01 --workers 2 --compute-ms 50 \
      --calibration burst.cal $extra --json > burst-$b.json 2> err.txt ||
      { bad "plan with burst $b"; cat err.txt; }
done
python3 -c "
import json
a, b = (json.load(open('burst-%s.json' % x)) for x in ('cal', '0'))
assert a['link_burst_bytes'] == 262144 and b['link_burst_bytes'] == 0, (a, b)
ra, rb = a['results'][0], b['results'][0]
assert ra['step_s'] < rb['step_s'] - 0.5 * rb['exposed_comm_s'], (ra, rb)
" && ok || { bad "the burst shortens the step"; cat burst-cal.json; }
printf 'gradcomp-calibration 1\ncodec none encode_fixed_s=oops\n' > bad.cal
expect_err "bad calibration" "bad.cal.*line 2" "$G" plan --model m.txt --link 1gbit --calibration bad.cal
expect_err "missing calibration" "nosuch.cal" "$G" plan --model m.txt --link 1gbit --calibration nosuch.cal
expect_err "adaptive method" "adapt:norm: an adaptive method decides at run time" "$G" plan --model m.txt --link 1gbit --compare adapt:norm $C
# Calibration at several sizes: one codec line per spec and size, the size recorded; a bad
# size list names itself.
"$G" plan --calibrate --compare topk:density=0.01 --size 8192,65536 --calibration two.cal \
    > out.txt 2> err.txt && ok || { bad "calibrate at two sizes"; cat err.txt; }
[ "$(grep -c '^codec topk:density=0.01,.* elements=8192 ' two.cal)" = 1 ] &&
    [ "$(grep -c '^codec topk:density=0.01,.* elements=65536 ' two.cal)" = 1 ] &&
    [ "$(grep -c '^codec none:values=f32,.* elements=' two.cal)" = 2 ] && ok ||
    { bad "two sizes in the calibration"; cat two.cal; }
expect_err "bad size list" "--size 1M,x" "$G" plan --calibrate --size 1M,x --calibration x.cal
expect_err "size too small" "4096..2^28" "$G" plan --calibrate --size 100 --calibration x.cal
# --plot: a PNG through gnuplot; when gnuplot cannot draw, what it says is not "install
# gnuplot" unless the shell could not find it (the one message there was, whatever the cause).
expect_err "no gnuplot" "gnuplot is not installed.*the data is in nogp.png.dat" \
    env PATH=/nonexistent "$G" plan --model m.txt --link 1gbit --compute-ms 5 $C --plot nogp.png
if command -v gnuplot >/dev/null 2>&1; then
  "$G" plan --model m.txt --link 1gbit --compute-ms 5 $C --plot p.png > out.txt 2> err.txt &&
      [ -s p.png ] && ok || { bad "plan --plot"; cat err.txt; }
  mkdir -p dir.png # the PNG's path is a directory: gnuplot runs and cannot write it
  expect_err "gnuplot cannot draw" "gnuplot could not draw dir.png.gp (its message is above)" \
      "$G" plan --model m.txt --link 1gbit --compute-ms 5 $C --plot dir.png
  grep -q "not installed" err.txt && bad "cannot draw blamed on gnuplot's absence"
fi
echo "$pass passed, $fails failed"
[ $fails -eq 0 ]

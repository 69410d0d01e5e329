#!/bin/sh
# test_runner.sh WORKDIR - proves that tests/fuzz/run_fuzzers.sh (what `make fuzz` runs)
# fails when there is something to find, so `make check` cannot pass over a crash:
#   1. a failing input of each kind (crash-, leak-, timeout-, oom-) planted in the work
#      directory makes it exit 1 before fuzzing anything;
#   2. a target built to crash on a magic input (fuzz_selftest.c, the input in
#      regress/selftest/) makes it exit 1 and leaves the crash-* file libFuzzer wrote.
# Exit 0 when both hold; 77 (skipped) without clang.
set -u
work=${1:?usage: test_runner.sh WORKDIR}
here=$(cd "$(dirname "$0")" && pwd)
runner="$here/run_fuzzers.sh"
mkdir -p "$work"
out="$work/runner.out"
bad=0
if ! command -v clang >/dev/null 2>&1 && ! command -v clang-14 >/dev/null 2>&1; then
    echo "test_runner: clang not found; skipped"
    exit 77
fi

rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
for kind in crash leak timeout oom; do
    echo planted >"$work/$kind-planted"
    if sh "$runner" 1 "$work" selftest >"$out" 2>&1; then
        echo "test_runner: FAIL: the runner passed with $kind-planted in $work"
        bad=1
    elif ! grep -q "$kind-planted" "$out"; then
        echo "test_runner: FAIL: the runner failed without naming $kind-planted:"
        cat "$out"
        bad=1
    else
        echo "test_runner: ok: $kind-planted makes the runner fail"
    fi
    rm -f "$work/$kind-planted"
done

if sh "$runner" 5 "$work" selftest >"$out" 2>&1; then
    echo "test_runner: FAIL: the runner passed although fuzz_selftest crashes on its seed:"
    cat "$out"
    bad=1
elif ! ls "$work"/crash-* >/dev/null 2>&1; then
    echo "test_runner: FAIL: the runner failed but left no crash-* file:"
    cat "$out"
    bad=1
else
    echo "test_runner: ok: a crashing target makes the runner fail ($(basename "$(ls "$work"/crash-* | head -n 1)"))"
fi
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
exit $bad

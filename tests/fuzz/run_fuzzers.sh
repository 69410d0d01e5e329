#!/bin/sh
# run_fuzzers.sh [SECONDS] [WORKDIR] [TARGET...] - builds the fuzz targets with clang's
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, and fuzzes each for SECONDS
# (default $FUZZ_SECONDS, else 30), one after the other, from the generated seed corpus, the
# saved regression inputs (tests/fuzz/regress/TARGET) and what earlier runs in WORKDIR
# found.  Targets: decode repair roundtrip state spec (default: all).
#
# Fails (exit 1) on any failing input of any kind -- crash-*, leak-*, timeout-*, oom-*,
# left in WORKDIR by this run or by an earlier one: a failing input stays a failure until
# someone moves it into tests/fuzz/regress/TARGET/ (where ctest replays it) and fixes the
# bug.  It also fails when a fuzzer exits non-zero without leaving a file.  Writes one
# line of figures per target to WORKDIR/summary.txt and prints it.
#
# FUZZ_RUNS=N runs each target for N executions instead (the long runs behind
# docs/TESTING.md: FUZZ_RUNS=10000000; SECONDS is then only an upper bound).
# FUZZ_NICE=N runs the fuzzers under `nice -n N`.  Each target is one libFuzzer process
# (no -jobs/-workers), and FUZZ_JOBS of them (default: the online CPUs) run at a time, each
# for its full SECONDS: on 2 cores the five targets take three rounds instead of five.
# FUZZ_JOBS=1 runs them one after the other (`make fuzz-long`, on a shared machine).  The
# library compiles FUZZ_JOBS files at a time.  Skips (exit 0, with a message) when clang is
# missing.
set -eu
secs=${1:-${FUZZ_SECONDS:-30}}
top=$(cd "$(dirname "$0")/../.." && pwd)
work=${2:-$top/build-fuzz}
[ $# -ge 2 ] && shift 2 || shift $#
targets=${*:-decode repair roundtrip state spec}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Failing inputs of earlier runs count: nothing may pass while one is lying there.
failing() {
    ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null || true
}
stale=$(failing)
if [ -n "$stale" ]; then
    echo "run_fuzzers: failing inputs from an earlier run in $work:"
    echo "$stale"
    echo "run_fuzzers: move each into tests/fuzz/regress/TARGET/ and fix the bug (ctest replays them)"
    exit 1
fi

cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
    echo "run_fuzzers: clang not found; skipping libFuzzer runs (apt-get install clang)"
    exit 0
fi

# The library as static archives with the targets' instrumentation: libgradcomp_fuzz.a with
# libFuzzer's comparison tracing, for the targets whose input the library parses (decode,
# repair, state, spec), and libgradcomp_fuzz_nocmp.a without it, for the round trip, whose
# spec comes from the registry and whose data are floats: there the tracing of every
# numeric loop's comparisons took 60% of the time (perf) and steers nothing.  The target's
# own file keeps full tracing.
flags="-O2 -g -std=c11 -D_GNU_SOURCE -DGCOMP_BUILDING=1 -I$top/include -I$top/src"
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
blasinc=/usr/include/x86_64-linux-gnu/openblas-pthread
libs="-lm -lpthread"
if [ -f "$blasinc/cblas.h" ]; then flags="$flags -DGCOMP_HAVE_BLAS=1 -I$blasinc"; libs="-lopenblas $libs"; fi
jobs=${FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)}
case $jobs in '' | *[!0-9]* | 0) echo "run_fuzzers: FUZZ_JOBS=$jobs is not a count of jobs"; exit 1 ;; esac
# Rebuilt when the source or any header is newer than its object (a test of this runner
# reuses its work directory).
newest=$(ls -t "$top"/include/*.h "$top"/src/*/*.h | head -n 1)
build_lib() { # build_lib NAME EXTRA_FLAGS
    mkdir -p "$work/obj-$1"
    # One "source object" pair per line for the files that need compiling, FUZZ_JOBS at a
    # time; xargs fails (123) when any of them does.  The sh that xargs starts expands $FUZZ_*.
    # shellcheck disable=SC2016
    for src in "$top"/src/common/*.c "$top"/src/core/*.c "$top"/src/select/*.c "$top"/src/values/*.c \
               "$top"/src/index/*.c "$top"/src/feedback/*.c "$top"/src/adapt/*.c "$top"/src/lowrank/*.c; do
        [ -f "$src" ] || continue
        obj="$work/obj-$1/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
        [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest" ] && continue
        printf '%s\n%s\n' "$src" "$obj"
    done | FUZZ_CC=$cc FUZZ_CFLAGS="$flags $san $2" xargs -r -d '\n' -n 2 -P "$jobs" \
        sh -c '$FUZZ_CC $FUZZ_CFLAGS -c "$0" -o "$1"'
    rm -f "$work/lib$1.a"
    ar rcs "$work/lib$1.a" "$work/obj-$1"/*.o
}
# fuzz_selftest (test_runner.sh's target that must crash) needs neither the library nor
# the seed corpus.
case " $targets " in
" selftest ") needlib=0 ;;
*) needlib=1 ;;
esac
if [ "$needlib" -eq 1 ]; then
    build_lib gradcomp_fuzz ""
    case " $targets " in
    *" roundtrip "*) build_lib gradcomp_fuzz_nocmp "-fno-sanitize-coverage=trace-cmp" ;;
    esac
    # shellcheck disable=SC2086
    $cc $flags -fsanitize=address,undefined -o "$work/make_corpus" "$top/tests/fuzz/make_corpus.c" \
        "$work/libgradcomp_fuzz.a" $libs
    "$work/make_corpus" "$work/seeds"
fi
wrap="-Wl,--wrap=aligned_alloc -Wl,--wrap=posix_memalign"

: >"$work/summary.txt"
# One thread each: OpenBLAS would otherwise start a thread per core for PowerSGD's products.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
nice_cmd=""
[ -n "${FUZZ_NICE:-}" ] && nice_cmd="nice -n $FUZZ_NICE"
if [ -n "${FUZZ_RUNS:-}" ]; then
    limit="-runs=$FUZZ_RUNS -max_total_time=$secs"
    what="$FUZZ_RUNS executions (at most ${secs}s)"
else
    limit="-max_total_time=$secs"
    what="${secs}s"
fi
# Build every target first, so that a compile error stops the run before any fuzzing.
for t in $targets; do
    src="$top/tests/fuzz/fuzz_$t.c"
    if [ ! -f "$src" ]; then
        echo "run_fuzzers: no target $t ($src)"
        exit 1
    fi
    if [ "$t" = selftest ]; then
        # shellcheck disable=SC2086
        $cc $flags -fsanitize=fuzzer,address,undefined -o "$work/fuzz_$t" "$src"
        continue
    fi
    lib="$work/libgradcomp_fuzz.a"
    [ "$t" = roundtrip ] && lib="$work/libgradcomp_fuzz_nocmp.a"
    # shellcheck disable=SC2086
    $cc $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $wrap \
        -o "$work/fuzz_$t" "$src" "$top/tests/fuzz/fuzz_alloc.c" "$lib" $libs
done

fuzz_one() { # fuzz_one TARGET: runs it to its limit, then writes "STATUS START END" to fuzz_TARGET.rc
    set +e # a background job: its fuzzer's status is written, not acted on here
    dirs="$work/corpus/$1"
    mkdir -p "$dirs"
    [ -d "$work/seeds/$1" ] && dirs="$dirs $work/seeds/$1"
    [ -d "$top/tests/fuzz/regress/$1" ] && dirs="$dirs $top/tests/fuzz/regress/$1"
    # Inputs long enough for every path of each target, short enough to keep it fast.
    case $1 in
    decode | repair) maxlen=16384 ;;
    *) maxlen=4096 ;;
    esac
    start=$(date +%s)
    # shellcheck disable=SC2086
    (cd "$work" && $nice_cmd ./fuzz_$1 $limit -max_len=$maxlen \
        -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 -artifact_prefix="$work/" \
        $dirs >"$work/fuzz_$1.log" 2>&1)
    echo "$? $start $(date +%s)" >"$work/fuzz_$1.rc"
}

report() { # report TARGET: its log's end and figures; returns its fuzzer's status
    read -r frc start end <"$work/fuzz_$1.rc"
    log="$work/fuzz_$1.log"
    tail -n 14 "$log"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | sed 's/cov: //')
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | sed 's/ft: //')
    corp=$(grep -o 'corp: [0-9]*' "$log" | tail -n 1 | sed 's/corp: //')
    echo "fuzz_$1 executions=${execs:-?} seconds=$((end - start)) edges=${cov:-?} features=${ft:-?} corpus=${corp:-?} exit=$frc" |
        tee -a "$work/summary.txt"
    return "$frc"
}

rc=0
# shellcheck disable=SC2086
set -- $targets
while [ $# -gt 0 ]; do
    round="" n=0
    while [ $# -gt 0 ] && [ "$n" -lt "$jobs" ]; do
        round="$round $1" n=$((n + 1))
        shift
    done
    echo "run_fuzzers:$(for t in $round; do printf ' fuzz_%s' "$t"; done) for $what"
    for t in $round; do
        rm -f "$work/fuzz_$t.rc"
        fuzz_one "$t" &
    done
    wait
    for t in $round; do
        if [ ! -f "$work/fuzz_$t.rc" ]; then
            echo "run_fuzzers: fuzz_$t left no status (log: $work/fuzz_$t.log)"
            rc=1
            continue
        fi
        set +e
        report "$t"
        frc=$?
        set -e
        if [ "$frc" -ne 0 ]; then
            # libFuzzer names the file it wrote: "Test unit written to PATH".
            grep -q 'Test unit written to' "$work/fuzz_$t.log" &&
                echo "run_fuzzers: fuzz_$t found a failing input:" &&
                sed -n 's/.*Test unit written to //p' "$work/fuzz_$t.log"
            echo "run_fuzzers: fuzz_$t exited with status $frc (log: $work/fuzz_$t.log)"
            rc=1
        fi
    done
    found=$(failing)
    if [ -n "$found" ]; then
        echo "run_fuzzers: failing inputs in $work:"
        echo "$found"
        exit 1
    fi
done
[ "$rc" -eq 0 ] && echo "run_fuzzers: no failing input ($what per target)"
exit "$rc"

#!/bin/sh
# run_fuzzers.sh SECONDS [WORKDIR] - builds the fuzz targets with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer and runs each for SECONDS, starting from
# the generated seed corpus.  Exits non-zero on the first crash (libFuzzer saves the
# input as crash-* in WORKDIR).  Skips (exit 0, with a message) when clang is missing.
set -eu
secs=${1:-30}
top=$(cd "$(dirname "$0")/../.." && pwd)
work=${2:-$top/build-fuzz}
cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
  echo "run_fuzzers: clang not found; skipping libFuzzer runs (apt-get install clang)"
  exit 0
fi
mkdir -p "$work"
srcs=$(ls "$top"/src/common/*.c "$top"/src/core/*.c "$top"/src/select/*.c "$top"/src/values/*.c "$top"/src/index/*.c \
          "$top"/src/feedback/*.c "$top"/src/adapt/*.c "$top"/src/lowrank/*.c 2>/dev/null || true)
flags="-O1 -g -std=c11 -D_GNU_SOURCE -DGCOMP_BUILDING=1 -march=native -I$top/include -I$top/src"
san="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
blasinc=/usr/include/x86_64-linux-gnu/openblas-pthread
blas=""
if [ -f "$blasinc/cblas.h" ]; then flags="$flags -DGCOMP_HAVE_BLAS=1 -I$blasinc"; blas="-lopenblas"; fi
# shellcheck disable=SC2086
$cc $flags -fsanitize=address,undefined -o "$work/make_corpus" "$top/tests/fuzz/make_corpus.c" $srcs $blas -lm -lpthread
"$work/make_corpus" "$work/corpus-decode" "$work/corpus-spec"
for t in decode spec; do
  # shellcheck disable=SC2086
  $cc $flags $san -o "$work/fuzz_$t" "$top/tests/fuzz/fuzz_$t.c" $srcs $blas -lm -lpthread
  echo "run_fuzzers: fuzz_$t for ${secs}s"
  (cd "$work" && ./fuzz_$t -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
      -print_final_stats=1 "corpus-$t" 2>&1 | tail -n 12)
  # libFuzzer exits non-zero on a crash; the pipeline above hides that, so check files.
  if ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then
    echo "run_fuzzers: fuzz_$t found a failing input:"; ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null
    exit 1
  fi
done
echo "run_fuzzers: no crash in ${secs}s per target"

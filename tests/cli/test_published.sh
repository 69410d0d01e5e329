#!/bin/sh
# test_published.sh GRADCOMP WORKDIR - the CNN tensor lists in bench/models are what
# bench/models/cnn_lists.py writes, and bench/published.sh (the cost model against
# Horovod's published scaling and the DGC paper's setting, docs/BENCHMARKS.md "Someone else's
# data") still prints the tables the docs quote: a change to the model that moves them must
# update the docs.
set -u
G=$1
W=$2
S=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$W" && mkdir -p "$W" || exit 1
fails=0
python3 "$S/bench/models/cnn_lists.py" "$W" > /dev/null || { echo "FAIL: cnn_lists.py"; exit 1; }
for f in "$W"/*.txt; do
  cmp -s "$f" "$S/bench/models/$(basename "$f")" ||
    { echo "FAIL: bench/models/$(basename "$f") is not what cnn_lists.py writes"; fails=1; }
done
sh "$S/bench/published.sh" "$G" > "$W/published.txt" 2> "$W/err.txt" ||
  { echo "FAIL: published.sh"; cat "$W/err.txt"; exit 1; }
diff "$S/tests/cli/published.expected" "$W/published.txt" ||
  { echo "FAIL: bench/published.sh changed its table (update docs/BENCHMARKS.md and published.expected)"; fails=1; }
[ $fails -eq 0 ] && echo "published: tensor lists and table as documented"
exit $fails

#!/bin/sh
# check.sh GRADCOMP WORKDIR - the golden messages still decode to the recorded values,
# encoding the recorded input with the recorded spec still gives the same bytes, and
# each bad message is refused with its specific error.
set -u
G=$1
W=$2
D=$(cd "$(dirname "$0")" && pwd)
rm -rf "$W" && mkdir -p "$W"
fails=0
pass=0
while IFS='|' read -r name spec seed; do
  case "$name" in ''|'#'*) continue ;; esac
  if "$G" decode -i "$D/$name.gcm" -o "$W/$name.f32" && cmp -s "$W/$name.f32" "$D/$name.expect.f32"; then
    pass=$((pass + 1))
  else
    echo "FAIL: $name no longer decodes to $name.expect.f32"; fails=$((fails + 1))
  fi
  if "$G" encode -c "$spec" --seed "$seed" -i "$D/input.f32" -o "$W/$name.gcm" && cmp -s "$W/$name.gcm" "$D/$name.gcm"; then
    pass=$((pass + 1))
  else
    echo "FAIL: encoding $name ($spec) no longer gives the golden bytes"; fails=$((fails + 1))
  fi
done < "$D/MANIFEST"
check_bad() { # FILE EXPECTED-TEXT
  "$G" decode -i "$D/$1" -o "$W/x.f32" 2> "$W/err.txt"; rc=$?
  if [ $rc -ge 1 ] && [ $rc -lt 128 ] && grep -q "$2" "$W/err.txt"; then pass=$((pass + 1)); else
    echo "FAIL: $1: rc=$rc, wanted '$2', got: $(cat "$W/err.txt")"; fails=$((fails + 1)); fi
}
check_bad bad-truncated.gcm "message truncated"
check_bad bad-crc.gcm "checksum mismatch"
check_bad bad-version.gcm "unsupported format version"
check_bad bad-codec.gcm "unknown codec id"
echo "golden: $pass passed, $fails failed"
[ $fails -eq 0 ]

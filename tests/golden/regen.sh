#!/bin/sh
# regen.sh GRADCOMP - rewrites the golden messages in this folder from input.f32 and
# MANIFEST, plus the corrupt/unsupported variants.  Run it only for a deliberate format
# change (and bump GCOMP_FORMAT_VERSION); check.sh compares against these files.
set -eu
G=$1
D=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" - "$D/input.f32" <<'PYEOF'
import struct, sys
vals = [0.5, -2.0, 0.25, 3.0, -0.125, 1.0, -1.75, 0.0, 2.5, -0.5, 1.5, -3.5, 0.75, -1.0, 0.0625, 2.0]
open(sys.argv[1], "wb").write(struct.pack("<16f", *vals))
PYEOF
grep -v '^#' "$D/MANIFEST" | while IFS='|' read -r name spec seed; do
  "$G" encode -c "$spec" --seed "$seed" -i "$D/input.f32" -o "$D/$name.gcm"
  "$G" decode -i "$D/$name.gcm" -o "$D/$name.expect.f32"
done
# Bad ones, derived from topk.gcm: truncated, payload CRC broken, version 2 (with a valid
# header CRC: "unsupported", not "corrupt"), unknown codec id (valid CRCs).
head -c 50 "$D/topk.gcm" > "$D/bad-truncated.gcm"
"$PY" - "$D" <<'PYEOF'
import sys, struct
D = sys.argv[1]
m = bytearray(open(D + "/topk.gcm", "rb").read())
def crc32c(b):
    crc = 0xffffffff
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff
c = bytearray(m); c[-1] ^= 0xff; open(D + "/bad-crc.gcm", "wb").write(c)
v = bytearray(m); v[4] = 2; v[36:40] = struct.pack("<I", crc32c(v[:36])); open(D + "/bad-version.gcm", "wb").write(v)
u = bytearray(m); u[6:8] = struct.pack("<H", 999); u[36:40] = struct.pack("<I", crc32c(u[:36])); open(D + "/bad-codec.gcm", "wb").write(u)
PYEOF
echo "regenerated golden messages in $D"

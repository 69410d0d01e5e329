/*
 * fuzz_repair.c - libFuzzer target: the decoders behind the checksums.
 *
 * Random bytes almost never pass two CRC-32Cs, so a plain decode target stops at the header
 * (fuzz_decode.c: ~315 edges after 66 M runs).  This one repairs what a checksum or a
 * length would reject and hands the payload to the codec's decoder, so every codec's
 * parser is explored (zstd's fuzzers fix their inputs the same way).
 *
 * Input: two parameter bytes, then a message of at least 40 bytes.
 *   byte 0   bits 0-3: scale (table below, all |scale| <= 1); bits 4-5: receiver
 *            (0, 1: an accumulator of the header's n; 2: validate only, acc = NULL;
 *            3: an accumulator of n + 1, which must never be accepted); bit 6: keep the
 *            header's flags (else 0); bit 7: keep the sparse section's index length
 *   byte 1   codec: < 0xf0 picks gcomp_codec_at(byte % count), else the message's own id
 * The repair: magic, version 1, header length 40, the codec id, payload length = what
 * follows, n folded into [1, 8192] with an accumulator ([1, 2^32 - 1] validating only),
 * the sparse section's index length folded into the payload, then both CRCs.
 *
 * Properties: no crash (ASan, UBSan); a refused message leaves the accumulator untouched,
 * an accepted one adds only finite values; validation and decoding agree; inspect accepts
 * what decode accepts; the library allocates at most 64 bytes per message byte plus 16 per
 * accumulator element (fuzz_alloc.c), whatever the header's counts say.
 */
#include "fuzz_alloc.h"
#include "fuzz_common.h"
#include "gradcomp.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const float scales[16] = {1.0f,    0.5f,   0.25f,       1.0f / 3, 1e-3f, 1e-20f,
                                 FLT_MIN, 1e-40f, 0.0f,        -0.0f,    -1.0f, -0.5f,
                                 -0.125f, 0.999f, 0.99999994f, -1e-3f};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc_selftest();
    if (size < 2 + 40 || size > 2 + ((size_t)1 << 20)) return 0;
    const unsigned p0 = data[0], p1 = data[1];
    const float scale = scales[p0 & 15];
    const unsigned receiver = (p0 >> 4) & 3;
    size_t len = size - 2;
    uint8_t *m = malloc(len);
    if (!m) return 0;
    memcpy(m, data + 2, len);

    memcpy(m, "GCmp", 4);
    m[4] = 1;
    m[5] = 40;
    if (p1 < 0xf0) {
        const gcomp_codec_info *ci = gcomp_codec_at(p1 % gcomp_codec_count());
        m[6] = (uint8_t)ci->id;
        m[7] = (uint8_t)(ci->id >> 8);
    }
    if (!(p0 & 0x40)) fz_put32(m + 8, 0);
    const uint32_t plen = (uint32_t)(len - 40);
    fz_put32(m + 12, plen);
    const uint64_t n_raw = fz_get64(m + 16);
    const uint64_t nmax = receiver == 2 ? 0xffffffffu : 8192;
    const uint64_t n = n_raw >= 1 && n_raw <= nmax ? n_raw : 1 + n_raw % nmax;
    fz_put64(m + 16, n);
    uint16_t id = (uint16_t)(m[6] | m[7] << 8);
    const gcomp_codec_info *ci = gcomp_codec_by_id(id);
    if (!(p0 & 0x80) && ci && !(ci->flags & GCOMP_CODEC_MULTIPHASE) && plen >= 24)
        fz_put32(m + 40 + 20, fz_get32(m + 40 + 20) % (plen - 24 + 1)); /* index bytes fit */
    fz_put32(m + 32, fz_crc32c(m + 40, plen));
    fz_put32(m + 36, fz_crc32c(m, 36));

    gcomp_message_info info;
    gcomp_status ist = gcomp_message_inspect(m, len, &info);
    fuzz_alloc_begin(64 * len + 4096);
    gcomp_status vst = gcomp_decode_add(m, len, NULL, 0, scale);
    fuzz_alloc_end();
    if (vst == GCOMP_OK && ist != GCOMP_OK) abort(); /* inspect refuses what decode accepts */

    if (receiver != 2) {
        size_t an = (size_t)n + (receiver == 3);
        float *acc = malloc(an * sizeof(float));
        if (acc) {
            for (size_t i = 0; i < an; i++) acc[i] = (float)(i % 7) * 0.125f;
            fuzz_alloc_begin(64 * len + 16 * an + 4096);
            gcomp_status st = gcomp_decode_add(m, len, acc, an, scale);
            fuzz_alloc_end();
            if (receiver == 3 && st == GCOMP_OK) abort(); /* accepted at the wrong size */
            if (receiver != 3 && (st == GCOMP_OK) != (vst == GCOMP_OK)) abort();
            for (size_t i = 0; i < an; i++) {
                if (st != GCOMP_OK && acc[i] != (float)(i % 7) * 0.125f) abort(); /* wrote */
                if (!isfinite(acc[i])) abort(); /* accepted a non-finite value */
            }
            free(acc);
        }
    }
    free(m);
    return 0;
}

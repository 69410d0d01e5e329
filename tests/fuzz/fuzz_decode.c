/*
 * fuzz_decode.c - libFuzzer target: any bytes, as they are, into the decoder.
 *
 * The input is the message itself (so a saved message, such as the files in regress/decode/, is a
 * regression input as it is).  Most random bytes stop at the magic or a CRC; this target
 * guards the header and the checksums, and fuzz_repair.c, which repairs both CRCs, reaches
 * the payloads.  Properties, checked at scales 0.5, -1 and 1e-3:
 *   - no crash, no out-of-bounds access (ASan), no undefined behaviour (UBSan);
 *   - a refused message leaves the accumulator untouched; an accepted one adds only
 *     finite values (|scale| <= 1: gcomp_decode_add's contract);
 *   - inspect accepts every message that decode accepts;
 *   - at a size the message does not claim: never GCOMP_OK;
 *   - the library allocates at most 64 bytes per message byte plus 16 per accumulator
 *     element (fuzz_alloc.c): a header cannot make the decoder reserve what its counts say.
 */
#include "fuzz_alloc.h"
#include "gradcomp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_N ((size_t)1 << 20)

static gcomp_status decode_limited(const uint8_t *m, size_t len, float *acc, size_t n,
                                   float scale) {
    fuzz_alloc_begin(64 * len + 16 * (acc ? n : 0) + 4096);
    gcomp_status st = gcomp_decode_add(m, len, acc, n, scale);
    fuzz_alloc_end();
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc_selftest();
    gcomp_message_info info;
    gcomp_status ist = gcomp_message_inspect(data, size, &info);
    gcomp_status vst = decode_limited(data, size, NULL, 0, 1.0f);
    if (vst == GCOMP_OK && ist != GCOMP_OK) abort(); /* inspect refuses what decode accepts */
    if (ist == GCOMP_OK && info.n <= MAX_N) {
        size_t n = (size_t)info.n;
        float *acc = malloc(n * sizeof(float));
        if (!acc) return 0;
        static const float scales[] = {0.5f, -1.0f, 1e-3f};
        for (size_t s = 0; s < 3; s++) {
            for (size_t i = 0; i < n; i++) acc[i] = (float)(i % 5) * 0.25f;
            gcomp_status st = decode_limited(data, size, acc, n, scales[s]);
            if ((st == GCOMP_OK) != (vst == GCOMP_OK)) abort(); /* validation disagrees */
            for (size_t i = 0; i < n; i++) {
                if (st != GCOMP_OK && acc[i] != (float)(i % 5) * 0.25f) abort(); /* wrote */
                if (!isfinite(acc[i])) abort(); /* accepted a non-finite value */
            }
        }
        free(acc);
    }
    /* At a size the message does not claim. */
    float small[8] = {0};
    if (ist == GCOMP_OK && info.n != 8 && decode_limited(data, size, small, 8, 1.0f) == GCOMP_OK)
        abort();
    return 0;
}

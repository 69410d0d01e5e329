/*
 * fuzz_spec.c - libFuzzer target: any text as a spec, and any (spec, size) into create.
 *
 * Input: one byte for the tensor size (n = 1 + 37 * byte), then the text.
 * Properties: no crash (ASan, UBSan); a spec that parses has a canonical form that parses
 * again to the same canonical form and fingerprint (the fingerprint is stable);
 * gcomp_spec_describe agrees with it (codec, fingerprint); for every key of the codec,
 * gcomp_spec_get answers and gcomp_spec_set of that key to the value it answered gives the
 * canonical form back; create either succeeds with that canonical spec or returns a status
 * with a message; every refusal says why.
 */
#include "gradcomp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* get -> set round trip of one key: setting a key to its own value changes nothing. */
static void check_key(const char *text, const char *canon, const char *key) {
    char val[256], again[1024];
    gcomp_error err;
    if (gcomp_spec_get(text, key, val, sizeof val, &err) != GCOMP_OK) abort();
    double num;
    if (gcomp_spec_get_number(text, key, &num, &err) != GCOMP_OK) abort();
    if (gcomp_spec_set(text, key, val, again, sizeof again, &err) != GCOMP_OK) abort();
    if (strcmp(again, canon) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 2000) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char canon[1024], again[1024];
    uint64_t f1, f2;
    gcomp_error err;
    size_t n = 1 + (size_t)data[0] * 37;
    if (gcomp_spec_canonical(text, canon, sizeof canon, &f1, &err) == GCOMP_OK) {
        if (gcomp_spec_canonical(canon, again, sizeof again, &f2, &err) != GCOMP_OK) abort();
        if (strcmp(canon, again) != 0 || f1 != f2) abort();
        gcomp_spec_info info;
        gcomp_status st = gcomp_spec_describe(text, n, &info, &err);
        if (st == GCOMP_OK) {
            if (info.fingerprint != f1 || !info.codec) abort();
            for (size_t i = 0; i < info.codec->nparams; i++)
                check_key(text, canon, info.codec->params[i].name);
            check_key(text, canon, "feedback");
            check_key(text, canon, "seed");
        } else if (st != GCOMP_E_NOMEM && err.message[0] == 0) {
            abort();
        }
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

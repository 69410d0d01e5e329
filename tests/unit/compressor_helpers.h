/*
 * compressor_helpers.h - create-or-report and encode-into-a-fresh-buffer, the two steps
 * most codec tests repeat.  A failure is a CHECK failure, never a crash.
 */
#ifndef GCOMP_TEST_COMPRESSOR_HELPERS_H
#define GCOMP_TEST_COMPRESSOR_HELPERS_H

#include "check.h"
#include "gradcomp.h"

#include <stdint.h>

typedef struct msg {
    uint8_t *p;
    size_t len;
} msg;

static inline gcomp_compressor *make(const char *spec, size_t n) {
    gcomp_compressor *c = NULL;
    gcomp_error err;
    gcomp_status st = gcomp_compressor_create(&c, spec, n, 0, 0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: %s", spec, err.message);
    return c;
}

static inline msg encode(gcomp_compressor *c, const float *g) {
    msg m;
    size_t cap = gcomp_encode_bound(c);
    m.p = malloc(cap);
    m.len = 0;
    CHECK_OK(gcomp_encode(c, g, m.p, cap, &m.len));
    CHECK(m.len <= cap);
    return m;
}

#endif

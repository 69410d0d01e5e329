/*
 * fuzz_common.h - what the fuzz targets share: reading parameters from the front of the
 * input (zstd's FUZZ_dataProducer idea: the first bytes choose, the rest is data), the
 * format's CRC-32C computed without the library, little-endian access, and test data with
 * the values that break numeric code (ties, zeros of both signs, denormals, huge values).
 */
#ifndef GCOMP_FUZZ_COMMON_H
#define GCOMP_FUZZ_COMMON_H

#include "gradcomp.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz_reader {
    const uint8_t *p;
    size_t n;
} fz_reader;

/* The next byte, or 0 once the input is used up (so every input is a valid one). */
static inline unsigned fz_u8(fz_reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static inline uint32_t fz_u32(fz_reader *r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(r) << (8 * i);
    return v;
}

/* CRC-32C (Castagnoli), byte table: the format's checksum (docs/FORMAT.md), independent of
 * the library's table and hardware paths so a target does not trust what it tests. */
static inline uint32_t fz_crc32c(const uint8_t *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t c = b;
            for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
            table[b] = c;
        }
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = (c >> 8) ^ table[(c ^ p[i]) & 0xff];
    return ~c;
}

static inline void fz_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t fz_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void fz_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t fz_get64(const uint8_t *p) {
    return (uint64_t)fz_get32(p) | (uint64_t)fz_get32(p + 4) << 32;
}

/* splitmix64: filler once the input's bytes run out. */
static inline uint64_t fz_mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n finite floats.  Each element's class comes from the input (then from a generator
 * seeded by it): zero, negative zero, a denormal, a huge value up to FLT_MAX, a tie (a few
 * repeated values), any finite bit pattern, a moderate Gaussian-like value, or the previous
 * element again.  `huge` (0..3) scales how often the huge class appears. */
static inline void fz_fill(fz_reader *r, float *x, size_t n, unsigned huge) {
    uint64_t s = fz_u32(r);
    static const float ties[4] = {1.0f, -1.0f, 0.5f, 3.0f};
    for (size_t i = 0; i < n; i++) {
        unsigned c = r->n ? fz_u8(r) : (unsigned)(fz_mix(&s) & 0xff);
        uint64_t z = fz_mix(&s);
        float v;
        switch (c & 7) {
        case 0:
            v = 0.0f;
            break;
        case 1:
            v = (c & 8) ? -0.0f : FLT_TRUE_MIN * (float)(1 + (z & 0xffff));
            break;
        case 2:
            v = (c >> 3) < 4 * huge ? ((z & 1) ? -1.0f : 1.0f) * FLT_MAX / (float)(1 + (z >> 60))
                                    : (float)(int)(z % 2001) * 1e-3f;
            break;
        case 3:
            v = ties[(c >> 3) & 3];
            break;
        case 4: {
            uint32_t b = (uint32_t)z;
            memcpy(&v, &b, 4);
            if (!isfinite(v)) v = 1.0f;
            break;
        }
        case 5:
            v = i ? x[i - 1] : 0.0f;
            break;
        default: {
            /* Irwin-Hall(4) - 2: roughly N(0, 1/3), with a heavy tail every 97th element */
            double u = 0;
            for (int k = 0; k < 4; k++) u += (double)((z >> (16 * k)) & 0xffff) / 65536.0;
            v = (float)(u - 2.0) * ((i % 97) ? 1.0f : 20.0f);
        }
        }
        x[i] = v;
    }
}

/* Largest |x|. */
static inline float fz_maxabs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* The adaptive controllers whose saved state fuzz_state loads (docs/FORMAT.md, "Adaptive
 * controllers' state"), and a run that fills it: the seed corpus (make_corpus.c) saves this
 * object, so blobs get past the configuration check to the fields. */
#define FZ_ADAPT_METHOD                                                                            \
    "adapt:bandwidth+accuracy+layers+norm;target=0.8;interval=2;measure=2;confirm=2;"              \
    "ladder=0.5/0.1/0.02;base=topk:density=0.1,feedback=ef;min_elements=16"
static inline gcomp_adapt *fz_adapt_make(void) {
    static const gcomp_tensor_desc t[] = {{"a", 64, 8, 8}, {"b", 32, 0, 0}, {"c", 4, 0, 0}};
    gcomp_adapt_options o = {0};
    o.total_steps = 40;
    o.workers = 2;
    gcomp_adapt *a = NULL;
    return gcomp_adapt_create(&a, FZ_ADAPT_METHOD, t, 3, &o, NULL) == GCOMP_OK ? a : NULL;
}
/* `steps` steps of made-up gradients, compute, link and metrics, deciding when due. */
static inline void fz_adapt_run(gcomp_adapt *a, int steps) {
    float g[64];
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < gcomp_adapt_count(a); i++) {
            for (int k = 0; k < 64; k++) g[k] = (float)((k * 7 + s * 3) % 11 - 5) / (1.0f + s);
            gcomp_adapt_observe(a, i, g, NULL);
        }
        gcomp_adapt_observe_compute(a, 1e-3, 2e-3, 1e-4);
        gcomp_adapt_observe_link(a, 1e8 / (1 + s % 3), 1e-5);
        if (s % 2) gcomp_adapt_observe_metric(a, 0.5 + 0.01 * s);
        int due;
        gcomp_adapt_end_step(a, &due);
        if (due) {
            double st[4096];
            size_t len;
            if (gcomp_adapt_stats(a, st, 4096, &len) == GCOMP_OK)
                gcomp_adapt_decide(a, st, len, 1, NULL, NULL);
        }
    }
}

#endif

/*
 * values_quant.h - what the quantizing value coders (int8/int4, sign, twobit, ternary,
 * qsgd) share: bucket sizes, the per-bucket random stream, reductions whose result does
 * not depend on the code path, and a little-endian LSB-first bit writer/reader.
 *
 * Every coder has a portable C kernel and, under __AVX512F__, a SIMD kernel.  The two
 * must produce the same bytes for the same input and seed (a message must not depend on
 * the build), so:
 *   - sums (scales, norms) are taken in 64 float lanes (lane l sums elements l, l+64, ...)
 *     and reduced in one fixed tree that both paths follow (values_quant.c);
 *   - per-element arithmetic is written as the same sequence of IEEE operations in both
 *     (no contraction: the build is ISO C, -ffp-contract=off; fused steps use fmaf()
 *     and _mm512_fmadd_ps explicitly);
 *   - random numbers are counter-based: element k of bucket b draws half of
 *     gcomp__rand64(gcomp__rand64(key, b), k / 2), so any group of elements computes its
 *     own draws.  One 64-bit draw serves two elements (its low 32 bits for even k, its
 *     high 32 bits for odd k), which halves the 64-bit multiplies; the coders use the
 *     top 24 of those bits (int8, ternary: compared with a probability in float) or top
 *     S <= 24 (qsgd: added to a fixed-point level).
 * tests/unit/test_values_quant.c runs both paths (gcomp__test_quant_portable) and
 * compares the messages byte for byte.
 */
#ifndef GCOMP_VALUES_QUANT_H
#define GCOMP_VALUES_QUANT_H

#include "core/internal.h"

#include <float.h>
#include <math.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <immintrin.h>
#define GCOMP__Q_AVX512 1
#else
#define GCOMP__Q_AVX512 0
#endif

/* Test hook: true makes every quantizer use its portable kernels (the reference the SIMD
 * kernels are checked against).  Not thread-safe; tests only. */
void gcomp__test_quant_portable(bool on);
/* Whether SIMD kernels run now (compiled in and not disabled by the hook). */
bool gcomp__quant_simd(void);

/* Bucket length for nv values from the spec's `bucket=` (0: one bucket of all values).
 * Never 0, so ceil(nv / B) is always defined. */
static inline size_t gcomp__q_bucket(const gcomp__vparams *p, size_t nv) {
    double b = gcomp__spec_num(p->spec, "bucket", 512);
    size_t B = (size_t)b;
    if (B == 0) B = nv ? nv : 1;
    return B;
}
static inline size_t gcomp__q_nbuckets(size_t nv, size_t B) {
    return nv ? (nv - 1) / B + 1 : 0;
}

/* Stream key of bucket b. */
static inline uint64_t gcomp__q_bkey(uint64_t key, size_t b) {
    return gcomp__rand64(key, b);
}
/* The 32 random bits of element k of a bucket stream: half of draw k / 2. */
static inline uint32_t gcomp__q_r32(uint64_t bkey, size_t k) {
    return (uint32_t)(gcomp__rand64(bkey, k >> 1) >> ((k & 1) * 32));
}
/* 24-bit uniform integer (as a float, exact) of element k of a bucket stream. */
static inline float gcomp__q_u24(uint64_t bkey, size_t k) {
    return (float)(gcomp__q_r32(bkey, k) >> 8);
}

#if GCOMP__Q_AVX512
#define GCOMP__Q_GOLDEN 0x9e3779b97f4a7c15ull
/* Counters of the eight draws that serve elements k0 .. k0+15 of a bucket (k0 even); add
 * gcomp__q_ctr_step() to move on by 16 elements. */
static inline __m512i gcomp__q_ctr(uint64_t bkey, size_t k0) {
    const uint64_t G = GCOMP__Q_GOLDEN;
    const __m512i lanes = _mm512_setr_epi64(0, (long long)G, (long long)(2 * G), (long long)(3 * G),
                                            (long long)(4 * G), (long long)(5 * G),
                                            (long long)(6 * G), (long long)(7 * G));
    return _mm512_add_epi64(_mm512_set1_epi64((long long)(bkey + (k0 / 2 + 1) * G)), lanes);
}
static inline __m512i gcomp__q_ctr_step(void) {
    return _mm512_set1_epi64((long long)(8 * GCOMP__Q_GOLDEN));
}
/* gcomp__q_r32 of the 16 elements whose draws are counted by `z`, in lane order: draw j's
 * low half is element k0 + 2j, its high half element k0 + 2j + 1 (splitmix64's finaliser,
 * as gcomp__mix64). */
static inline __m512i gcomp__q_r32x16(__m512i z) {
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 30));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull));
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 27));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)0x94d049bb133111ebull));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}
/* gcomp__q_u24 of elements k0 .. k0+15 (k0 even). */
static inline __m512 gcomp__q_u24x16(uint64_t bkey, size_t k0) {
    return _mm512_cvtepi32_ps(_mm512_srli_epi32(gcomp__q_r32x16(gcomp__q_ctr(bkey, k0)), 8));
}
#endif

/* A bucket's second pass computes from L1 while nothing asks memory for the next values,
 * so the stream would stall between buckets.  The SIMD loops prefetch one line per 16
 * values, `ahead` values on: two buckets ahead for buckets up to 4096 values (larger ones
 * stream through the hardware prefetcher in their first pass). */
static inline size_t gcomp__q_ahead(size_t B) {
    return B <= 4096 ? 2 * B : 0;
}
static inline void gcomp__q_prefetch(const float *v, size_t i, size_t ahead, size_t nv) {
#if GCOMP__Q_AVX512
    if (ahead && i + ahead < nv) _mm_prefetch((const char *)(v + i + ahead), _MM_HINT_T0);
#else
    (void)v, (void)i, (void)ahead, (void)nv;
#endif
}

/* A prescale for p = |x| / den computed as (|x| * f) * (1 / (den * f)): for den below
 * 2^-32, 1/den could overflow or lose the subnormal's precision; 2^64 brings it back.
 * Both factors are powers of two, so the scaling itself is exact. */
static inline float gcomp__q_prescale(float den) {
    return den < 0x1p-32f ? 0x1p64f : 1.0f;
}

/* Sums over v[0..n) in 64 float lanes with a fixed reduction (in double, sequentially, when
 * float would overflow or lose squares to underflow): the same bits on every path.
 * Non-finite input makes the result non-finite. */
double gcomp__q_sum_abs(const float *v, size_t n);
double gcomp__q_sum_sq(const float *v, size_t n);
/* Largest |v[i]| as a bit pattern (>= 0x7f800000: some value is Inf or NaN). */
uint32_t gcomp__q_max_abs_bits(const float *v, size_t n);

static inline unsigned gcomp__q_bitlen(uint32_t x) {
    return x ? 32u - (unsigned)__builtin_clz(x) : 0;
}
static inline bool gcomp__q_finite_bits(uint32_t u) {
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* ---- bit streams: bit i is bit i % 8 of byte i / 8 (docs/FORMAT.md, conventions) ---- */

typedef struct gcomp__bitw {
    uint8_t *p, *end;
    uint64_t acc;
    unsigned n; /* bits pending in acc, < 8 between calls */
    bool full;  /* ran out of room: the encode fails with GCOMP_E_DST_SIZE */
} gcomp__bitw;

static inline void gcomp__bitw_init(gcomp__bitw *w, uint8_t *p, size_t cap) {
    w->p = p;
    w->end = p + cap;
    w->acc = 0;
    w->n = 0;
    w->full = false;
}
/* Appends the low `nbits` (<= 56) bits of v (v has no bits above them).  While there is
 * room for 8 bytes, every call stores the whole accumulator and advances by its complete
 * bytes: no data-dependent branch (whether a byte completed is a coin flip that a branch
 * predictor loses), and the bytes past the complete ones are rewritten by the next store,
 * so it may touch up to 8 bytes past the stream but never past `end`. */
static inline void gcomp__bitw_put(gcomp__bitw *w, uint64_t v, unsigned nbits) {
    w->acc |= v << w->n;
    w->n += nbits;
    unsigned bytes = w->n >> 3; /* <= 7 */
    size_t room = (size_t)(w->end - w->p);
    if (room >= 8) {
        gcomp__put64(w->p, w->acc);
    } else if (room >= bytes) {
        for (unsigned i = 0; i < bytes; i++) w->p[i] = (uint8_t)(w->acc >> (8 * i));
    } else {
        w->full = true;
        bytes = (unsigned)room;
    }
    w->p += bytes;
    w->acc >>= 8 * (w->n >> 3);
    w->n &= 7;
}
/* Pads with zero bits to a byte; returns the end of the stream. */
static inline uint8_t *gcomp__bitw_flush(gcomp__bitw *w) {
    if (w->n > 0) {
        if (w->p == w->end)
            w->full = true;
        else
            *w->p++ = (uint8_t)w->acc;
        w->acc = 0;
        w->n = 0;
    }
    return w->p;
}

typedef struct gcomp__bitr {
    const uint8_t *p;
    size_t nbits, pos; /* stream length and read position, in bits */
} gcomp__bitr;

/* Up to 57 bits at the read position without consuming them (zeros past the end). */
static inline uint64_t gcomp__bitr_peek(const gcomp__bitr *r) {
    size_t byte = r->pos >> 3, bytes = (r->nbits + 7) >> 3;
    uint64_t v = 0;
    if (byte + 8 <= bytes) {
        v = gcomp__get64(r->p + byte);
    } else {
        for (size_t i = 0; byte + i < bytes; i++) v |= (uint64_t)r->p[byte + i] << (8 * i);
    }
    return v >> (r->pos & 7);
}
/* Reads nbits (<= 32); false when the stream ends first. */
static inline bool gcomp__bitr_get(gcomp__bitr *r, unsigned nbits, uint32_t *out) {
    if (nbits > r->nbits - r->pos) return false;
    uint64_t v = gcomp__bitr_peek(r);
    *out = (uint32_t)(v & ((1ull << nbits) - 1));
    r->pos += nbits;
    return true;
}

#endif /* GCOMP_VALUES_QUANT_H */

/*
 * collect.h - the candidate compaction step shared by the selection pass (select_common.c)
 * and the feedback passes that select while they build the working vector
 * (feedback_dgc.c, feedback_ef.c): every |x_i| >= t is appended to (idx, val) in index
 * order, up to `cap` (the count keeps going past it, so the caller can tell that the
 * threshold took too many), and the largest |x| bit pattern seen is tracked, so NaN/Inf
 * (bits >= 0x7f800000) are found in the same pass.
 *
 * Hits are rare (about 1.3 k of n), so the AVX-512 step costs one compare and one
 * never-taken branch per 16 elements; the portable step branches per element, which is as
 * cheap for the same reason.  Both produce the same output: they are checked against
 * each other by every test that runs a fused pass next to the two-pass path.
 *
 * Large passes write their outputs with non-temporal stores (gcomp__store16): a working
 * vector of 100 MB does not fit any cache, and an ordinary store first reads each line it
 * writes (read for ownership), so two written streams would cost four.  Small vectors keep
 * ordinary stores, so that the next step finds them in cache.
 */
#ifndef GCOMP_SELECT_COLLECT_H
#define GCOMP_SELECT_COLLECT_H

#include "core/internal.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Vectors of at least this many elements are written with non-temporal stores: 4 MiB
 * each, so a pass over 3-5 of them overflows the 1 MiB L2 and most of any L3 share. */
#define GCOMP__STREAM_MIN ((size_t)1 << 20)

static inline uint32_t gcomp__absbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}

/* Portable step: element i with value x. */
static inline size_t gcomp__collect1(float x, size_t i, float t, uint32_t *idx, float *val,
                                     size_t m, size_t cap, uint32_t *mx) {
    uint32_t a = gcomp__absbits(x);
    *mx = a > *mx ? a : *mx;
    float ax;
    memcpy(&ax, &a, 4);
    if (ax >= t) {
        if (m < cap) {
            idx[m] = (uint32_t)i;
            val[m] = x;
        }
        m++;
    }
    return m;
}

#if defined(__AVX512F__)
/* AVX-512 step, first half: the lanes of x (elements i..i+15) with |x| >= t; tracks the
 * largest |x| bits in *vmx. */
static inline __mmask16 gcomp__hits16(__m512 x, __m512 t, __m512i *vmx) {
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    __m512i b = _mm512_and_si512(_mm512_castps_si512(x), absmask);
    *vmx = _mm512_max_epu32(*vmx, b);
    return _mm512_cmp_ps_mask(_mm512_castsi512_ps(b), t, _CMP_GE_OQ);
}

/* Second half, for a nonzero hit mask k (rare): appends those lanes. */
static inline size_t gcomp__append16(__mmask16 k, __m512 x, size_t i, uint32_t *idx, float *val,
                                     size_t m, size_t cap) {
    if (m + 16 <= cap) {
        const __m512i iota =
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i iv = _mm512_add_epi32(iota, _mm512_set1_epi32((int)i));
        _mm512_mask_compressstoreu_epi32(idx + m, k, iv);
        _mm512_mask_compressstoreu_ps(val + m, k, x);
        return m + (size_t)__builtin_popcount(k);
    }
    float lane[16];
    _mm512_storeu_ps(lane, x);
    for (unsigned j = 0; j < 16; j++)
        if (k >> j & 1) {
            if (m < cap) {
                idx[m] = (uint32_t)(i + j);
                val[m] = lane[j];
            }
            m++;
        }
    return m;
}

static inline size_t gcomp__collect16(__m512 x, size_t i, __m512 t, uint32_t *idx, float *val,
                                      size_t m, size_t cap, __m512i *vmx) {
    __mmask16 k = gcomp__hits16(x, t, vmx);
    return __builtin_expect(k != 0, 0) ? gcomp__append16(k, x, i, idx, val, m, cap) : m;
}

/* Stores 16 floats at p (64-byte aligned when nt), bypassing the caches when nt. */
static inline void gcomp__store16(float *p, __m512 v, bool nt) {
    if (nt)
        _mm512_stream_ps(p, v);
    else
        _mm512_storeu_ps(p, v);
}
#endif

#endif /* GCOMP_SELECT_COLLECT_H */

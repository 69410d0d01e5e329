/*
 * select_common.c - the selection kernels every sparsifier stands on.
 *
 * Exact top-k in O(n) with one read of the gradient in the common case:
 *   1. Estimate a threshold t from a stratified sample of 8-element runs (4096 strata;
 *      one cache line each, so the sample costs ~4096 misses, not 32768), choosing the
 *      sample rank with a 6-sigma margin so that |{i : |x_i| >= t}| >= k almost surely.
 *   2. One pass compacts every |x_i| >= t (AVX-512 compress-store; the portable loop
 *      branches, which is cheap because hits are rare) and tracks the largest exponent
 *      seen, so NaN/Inf are caught in the same pass.
 *   3. Among the m ~ 1.3k candidates, quickselect on the key (|x| bits << 32 | ~index)
 *      finds the k-th largest key; the candidates at or above it, already in index order,
 *      are the answer.  The key breaks ties by the lower index, so the result is exactly
 *      what a stable sort by decreasing |x| would give.
 * If the sample misled us (fewer than k candidates, or too many to hold), an exact
 * radix select takes over: a 65536-bin histogram of the top 16 bits of |x|, then the
 * same key quickselect inside the boundary bin.  A full sort is never used.
 *
 * Rejected: torch-style topk (heap or sort of (value, index) pairs; 0.07-2 GB/s here,
 * shared/TORCH.md); a 2048-bin radix as the main path (two full passes, ~4 GB/s).
 */
#include "core/internal.h"

#include <math.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static inline uint32_t absbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}

bool gcomp__all_finite(const float *x, size_t n) {
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = absbits(x[i]);
        mx = a > mx ? a : mx;
    }
    return mx < 0x7f800000u;
}

/* Collects |x[i]| >= t; *maxbits receives the largest |x| bit pattern seen. */
static size_t collect(const float *x, size_t n, float t, uint32_t *idx, float *val, size_t cap,
                      uint32_t *maxbits) {
    size_t m = 0, i = 0;
    uint32_t mx = 0;
#if defined(__AVX512F__)
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 tv = _mm512_set1_ps(t);
    __m512i vmx = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), absmask);
        vmx = _mm512_max_epu32(vmx, b);
        __mmask16 k = _mm512_cmp_ps_mask(_mm512_castsi512_ps(b), tv, _CMP_GE_OQ);
        if (k) {
            if (m + 16 <= cap) {
                __m512i iv = _mm512_add_epi32(iota, _mm512_set1_epi32((int)i));
                _mm512_mask_compressstoreu_epi32(idx + m, k, iv);
                _mm512_mask_compressstoreu_ps(val + m, k, _mm512_loadu_ps(x + i));
                m += (size_t)__builtin_popcount(k);
            } else {
                for (unsigned j = 0; j < 16; j++)
                    if (k >> j & 1) {
                        if (m < cap) {
                            idx[m] = (uint32_t)(i + j);
                            val[m] = x[i + j];
                        }
                        m++;
                    }
            }
        }
    }
    mx = (uint32_t)_mm512_reduce_max_epu32(vmx);
#endif
    for (; i < n; i++) {
        uint32_t a = absbits(x[i]);
        mx = a > mx ? a : mx;
        float ax;
        memcpy(&ax, &a, 4);
        if (ax >= t) {
            if (m < cap) {
                idx[m] = (uint32_t)i;
                val[m] = x[i];
            }
            m++;
        }
    }
    *maxbits = mx;
    return m;
}

size_t gcomp__collect_ge(const float *x, size_t n, float t, uint32_t *idx, float *val, size_t cap) {
    uint32_t mx;
    return collect(x, n, t, idx, val, cap, &mx);
}

/* ---- quickselect on 64-bit keys --------------------------------------------------------- */

static inline void swap64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Returns the r-th largest (r >= 1) of distinct keys a[0..m); reorders a. Pivots come from
 * a fixed hash of the range, so the result and the work are deterministic. */
static uint64_t select_kth_largest(uint64_t *a, size_t m, size_t r) {
    size_t lo = 0, hi = m; /* answer index (descending order) is r-1 within [lo, hi) */
    size_t want = r - 1;
    uint64_t salt = 0x853c49e6748fea9bull;
    while (hi - lo > 1) {
        size_t span = hi - lo;
        /* median of three hashed positions */
        salt = gcomp__mix64(salt + span);
        uint64_t p0 = a[lo + (salt % span)], p1 = a[lo + ((salt >> 21) % span)],
                 p2 = a[lo + ((salt >> 42) % span)];
        uint64_t piv =
            p0 > p1 ? (p1 > p2 ? p1 : (p0 > p2 ? p2 : p0)) : (p0 > p2 ? p0 : (p1 > p2 ? p2 : p1));
        /* partition: keys > piv first, then == piv (one, keys are distinct), then < piv */
        size_t i = lo, j = hi;
        size_t gt = lo;
        for (i = lo; i < j;) {
            if (a[i] > piv)
                swap64(&a[i++], &a[gt++]);
            else if (a[i] < piv)
                swap64(&a[i], &a[--j]);
            else
                i++;
        }
        /* [lo, gt) > piv, [gt, j) == piv, [j, hi) < piv */
        if (want < gt)
            hi = gt;
        else if (want < j)
            return piv;
        else
            lo = j;
    }
    return a[lo];
}

static inline uint64_t key_of(float v, uint32_t i) {
    return (uint64_t)absbits(v) << 32 | (uint32_t)~i;
}

/* Keeps exactly k of the m candidates (ascending idx), those with the largest keys. */
static gcomp_status keep_top(gcomp_compressor *c, uint32_t *idx, float *val, size_t m, size_t k) {
    if (m == k) return GCOMP_OK;
    if (gcomp__buf_reserve(&c->sel_tmp, m * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint64_t *keys = c->sel_tmp.p;
    for (size_t j = 0; j < m; j++) keys[j] = key_of(val[j], idx[j]);
    uint64_t kth = select_kth_largest(keys, m, k);
    size_t w = 0;
    for (size_t j = 0; j < m; j++)
        if (key_of(val[j], idx[j]) >= kth) {
            idx[w] = idx[j];
            val[w] = val[j];
            w++;
        }
    return w == k ? GCOMP_OK : GCOMP_E_CORRUPT; /* cannot happen: keys are distinct */
}

/* Exact fallback: 65536-bin histogram of the top 16 bits of |x|. */
static gcomp_status radix_topk(gcomp_compressor *c, const float *x, size_t n, size_t k,
                               gcomp__selection *sel) {
    if (gcomp__buf_reserve(&c->scratch, 65536 * sizeof(uint32_t)) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint32_t *hist = c->scratch.p;
    memset(hist, 0, 65536 * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) hist[absbits(x[i]) >> 15]++;
    size_t above = 0;
    long b = 65535;
    for (; b >= 0; b--) {
        if (above + hist[b] >= k) break;
        above += hist[b];
    }
    size_t m = above + hist[b];
    gcomp_status st = gcomp__sel_reserve(c, m, m, sel);
    if (st != GCOMP_OK) return st;
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if ((absbits(x[i]) >> 15) >= (uint32_t)b) {
            sel->idx[w] = (uint32_t)i;
            sel->val[w] = x[i];
            w++;
        }
    st = keep_top(c, sel->idx, sel->val, w, k);
    sel->k = sel->nvals = k;
    return st;
}

gcomp_status gcomp__topk(gcomp_compressor *c, const float *x, size_t n, size_t k,
                         gcomp__selection *sel, bool *nonfinite) {
    *nonfinite = false;
    sel->expand = GCOMP__EXPAND_ELEM;
    sel->unit = 1;
    sel->stride = 0;
    sel->index_kind = 0;
    if (k > n) k = n;
    if (k == 0 || k == n || n <= 8192) {
        if (!gcomp__all_finite(x, n)) {
            *nonfinite = true;
            return GCOMP_OK;
        }
        gcomp_status st = gcomp__sel_reserve(c, n, n, sel);
        if (st != GCOMP_OK) return st;
        for (size_t i = 0; i < n; i++) {
            sel->idx[i] = (uint32_t)i;
            sel->val[i] = x[i];
        }
        sel->k = sel->nvals = k;
        return k == n ? GCOMP_OK : keep_top(c, sel->idx, sel->val, n, k);
    }

    /* 1. Stratified sample of 8-element runs. */
    const size_t run = 8, strata = 4096;
    size_t stride = n / strata; /* >= 2 since n > 8192 */
    size_t s = 0;
    if (gcomp__buf_reserve(&c->sel_tmp, strata * run * sizeof(float)) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    float *sample = c->sel_tmp.p;
    uint64_t key = gcomp__mix64(n * 0x9e3779b97f4a7c15ull + 17);
    for (size_t j = 0; j < strata; j++) {
        size_t span = stride > run ? stride - run + 1 : 1;
        size_t off = j * stride + (size_t)(gcomp__rand64(key, j) % span);
        for (size_t r = 0; r < run && off + r < n; r++) sample[s++] = fabsf(x[off + r]);
    }
    double f = (double)s / (double)n;
    double expect = (double)k * f;
    size_t rank = (size_t)ceil(expect + 6.0 * sqrt(expect * run) + 8.0);

    for (int attempt = 0; attempt < 2 && rank <= s; attempt++) {
        /* r-th largest |x| of the sample, by the same key select. */
        if (gcomp__buf_reserve(&c->scratch, s * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
        uint64_t *sk = c->scratch.p;
        for (size_t j = 0; j < s; j++) sk[j] = (uint64_t)absbits(sample[j]) << 32 | (uint32_t)j;
        uint64_t kth = select_kth_largest(sk, s, rank);
        uint32_t tb = (uint32_t)(kth >> 32);
        float t;
        memcpy(&t, &tb, 4);
        if (!(t > 0.0f)) break; /* threshold 0 would take everything: use the radix path */

        size_t cap = (size_t)((double)rank / f * 1.5) + 1024;
        if (cap > n) cap = n;
        gcomp_status st = gcomp__sel_reserve(c, cap, cap, sel);
        if (st != GCOMP_OK) return st;
        uint32_t mx;
        size_t m = collect(x, n, t, sel->idx, sel->val, cap, &mx);
        if (mx >= 0x7f800000u) {
            *nonfinite = true;
            return GCOMP_OK;
        }
        if (m >= k && m <= cap) {
            sel->k = sel->nvals = k;
            return keep_top(c, sel->idx, sel->val, m, k);
        }
        if (m > cap) break; /* too many ties or a lopsided sample: exact path */
        rank *= 4;          /* too few: lower the threshold once */
    }
    if (!gcomp__all_finite(x, n)) {
        *nonfinite = true;
        return GCOMP_OK;
    }
    return radix_topk(c, x, n, k, sel);
}

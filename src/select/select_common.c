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
 * Steps 1 and 2 can also run inside the pass of a feedback that builds x (gcomp__topk_plan_make,
 * internal.h): the feedback computes x at the sampled positions only, takes the threshold
 * before its pass and compacts the candidates during it, so that x is written once and
 * never read again by the selection.  Step 3 and every fallback are shared, so the result
 * is the same either way.
 *
 * Rejected: torch-style topk (heap or sort of (value, index) pairs; 0.07-2 GB/s here,
 * shared/TORCH.md); a 2048-bin radix as the main path (two full passes, ~4 GB/s).
 */
#include "core/internal.h"
#include "select/collect.h"

#include <math.h>

#define absbits gcomp__absbits

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
    const __m512 tv = _mm512_set1_ps(t);
    __m512i vmx = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16)
        m = gcomp__collect16(_mm512_loadu_ps(x + i), i, tv, idx, val, m, cap, &vmx);
    mx = (uint32_t)_mm512_reduce_max_epu32(vmx);
#endif
    for (; i < n; i++) m = gcomp__collect1(x[i], i, t, idx, val, m, cap, &mx);
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

/* ---- the sampled threshold ------------------------------------------------------------------ */

enum { RUN = 8, STRATA = 4096 };

static void read_x(const void *ctx, const uint32_t *pos, size_t count, float *out) {
    const float *x = ctx;
    for (size_t j = 0; j < count; j++) out[j] = x[pos[j]];
}

/* Draws the stratified sample of |x| (n > 8192) into c->sel_tmp; returns its size.  The
 * positions are listed first (in c->scratch), so that `fill` can fetch ahead: the sample
 * is ~4096 cache misses per input vector, which in order would cost more than the math. */
static gcomp_status take_sample(gcomp_compressor *c, size_t n, gcomp__sample_fn fill,
                                const void *ctx, size_t *count) {
    size_t stride = n / STRATA; /* >= 2 since n > 8192 */
    size_t s = 0;
    if (gcomp__buf_reserve(&c->sel_tmp, STRATA * RUN * sizeof(float)) != GCOMP_OK ||
        gcomp__buf_reserve(&c->scratch, STRATA * RUN * sizeof(uint32_t)) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    float *sample = c->sel_tmp.p;
    uint32_t *pos = c->scratch.p;
    uint64_t key = gcomp__mix64(n * 0x9e3779b97f4a7c15ull + 17);
    for (size_t j = 0; j < STRATA; j++) {
        size_t span = stride > RUN ? stride - RUN + 1 : 1;
        size_t off = j * stride + (size_t)(gcomp__rand64(key, j) % span);
        for (size_t r = 0; r < RUN && off + r < n; r++) pos[s++] = (uint32_t)(off + r);
    }
    fill(ctx, pos, s, sample);
    for (size_t j = 0; j < s; j++) sample[j] = fabsf(sample[j]);
    *count = s;
    return GCOMP_OK;
}

/* The first sample rank to try: k's share of the sample plus a 6-sigma margin (runs of 8
 * counted as if fully correlated), so that |{|x| >= t}| >= k almost surely. */
static size_t first_rank(size_t n, size_t k, size_t s) {
    double expect = (double)k * ((double)s / (double)n);
    return (size_t)ceil(expect + 6.0 * sqrt(expect * RUN) + 8.0);
}

/* Threshold at sample rank `rank` (the sample is in c->sel_tmp) and the room that its
 * candidates need; *t = 0 when the sample cannot separate (then only radix helps). */
static gcomp_status threshold_at(gcomp_compressor *c, size_t n, size_t s, size_t rank, float *t,
                                 size_t *cap) {
    const float *sample = c->sel_tmp.p;
    if (gcomp__buf_reserve(&c->scratch, s * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint64_t *sk = c->scratch.p;
    for (size_t j = 0; j < s; j++) sk[j] = (uint64_t)absbits(sample[j]) << 32 | (uint32_t)j;
    uint64_t kth = select_kth_largest(sk, s, rank);
    uint32_t tb = (uint32_t)(kth >> 32);
    memcpy(t, &tb, 4);
    double f = (double)s / (double)n;
    *cap = (size_t)((double)rank / f * 1.5) + 1024;
    if (*cap > n) *cap = n;
    return GCOMP_OK;
}

static gcomp_status topk_small(gcomp_compressor *c, const float *x, size_t n, size_t k,
                               gcomp__selection *sel, bool *nonfinite) {
    c->topk_path = GCOMP__TOPK_SMALL;
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

/* Steps 1-3 from sample rank `rank` on, `attempt` (0 or 1) of two, then radix. */
static gcomp_status topk_sampled(gcomp_compressor *c, const float *x, size_t n, size_t k, size_t s,
                                 size_t rank, int attempt, gcomp__selection *sel, bool *nonfinite,
                                 bool finite) {
    for (; attempt < 2 && rank <= s; attempt++) {
        float t;
        size_t cap;
        gcomp_status st = threshold_at(c, n, s, rank, &t, &cap);
        if (st != GCOMP_OK) return st;
        if (!(t > 0.0f)) break; /* threshold 0 would take everything: use the radix path */
        st = gcomp__sel_reserve(c, cap, cap, sel);
        if (st != GCOMP_OK) return st;
        uint32_t mx;
        size_t m = collect(x, n, t, sel->idx, sel->val, cap, &mx);
        if (mx >= 0x7f800000u) {
            *nonfinite = true;
            return GCOMP_OK;
        }
        finite = true;
        if (m >= k && m <= cap) {
            c->topk_path = attempt ? GCOMP__TOPK_RETRY : GCOMP__TOPK_SAMPLED;
            sel->k = sel->nvals = k;
            return keep_top(c, sel->idx, sel->val, m, k);
        }
        if (m > cap) break; /* too many ties or a lopsided sample: exact path */
        rank *= 4;          /* too few: lower the threshold once */
    }
    if (!finite && !gcomp__all_finite(x, n)) {
        *nonfinite = true;
        return GCOMP_OK;
    }
    c->topk_path = GCOMP__TOPK_RADIX;
    return radix_topk(c, x, n, k, sel);
}

gcomp_status gcomp__topk_plan_make(gcomp_compressor *c, size_t k, gcomp__sample_fn fill,
                                   const void *ctx, gcomp__topk_plan *p) {
    size_t n = c->n;
    c->topk_pre.x = NULL;
    memset(p, 0, sizeof *p);
    if (k > n) k = n;
    if (c->fuse_off || k == 0 || k == n || n <= 8192) return GCOMP_OK;
    size_t s, cap = 0;
    gcomp_status st = take_sample(c, n, fill, ctx, &s);
    if (st != GCOMP_OK) return st;
    size_t rank = first_rank(n, k, s);
    float t = 0.0f;
    if (rank <= s && (st = threshold_at(c, n, s, rank, &t, &cap)) != GCOMP_OK) return st;
    p->active = true;
    p->k = k;
    c->topk_pre.rank = rank;
    c->topk_pre.s = s;
    if (!(t > 0.0f)) { /* the sample cannot separate: the selection goes to radix */
        p->t = INFINITY;
        c->topk_pre.radix = true;
        return GCOMP_OK;
    }
    gcomp__selection sel;
    if ((st = gcomp__sel_reserve(c, cap, cap, &sel)) != GCOMP_OK) return st;
    c->topk_pre.radix = false;
    p->t = t;
    p->cap = cap;
    p->idx = sel.idx;
    p->val = sel.val;
    return GCOMP_OK;
}

void gcomp__topk_plan_done(gcomp_compressor *c, const gcomp__topk_plan *p, const float *x,
                           size_t m) {
    c->topk_pre.x = x;
    c->topk_pre.k = p->k;
    c->topk_pre.m = m;
    c->topk_pre.cap = p->cap;
}

gcomp_status gcomp__topk(gcomp_compressor *c, const float *x, size_t n, size_t k,
                         gcomp__selection *sel, bool *nonfinite) {
    *nonfinite = false;
    sel->expand = GCOMP__EXPAND_ELEM;
    sel->unit = 1;
    sel->stride = 0;
    sel->index_kind = 0;
    if (k > n) k = n;
    if (k == 0 || k == n || n <= 8192) return topk_small(c, x, n, k, sel, nonfinite);

    /* Candidates from the feedback's pass over this very x (which found it finite). */
    if (c->topk_pre.x == x && n == c->n && c->topk_pre.k == k) {
        c->topk_pre.x = NULL;
        size_t m = c->topk_pre.m, cap = c->topk_pre.cap;
        gcomp_status st = gcomp__sel_reserve(c, cap, cap, sel); /* the buffers they are in */
        if (st != GCOMP_OK) return st;
        if (!c->topk_pre.radix && m >= k && m <= cap) {
            c->topk_path = GCOMP__TOPK_PREPASS;
            sel->k = sel->nvals = k;
            return keep_top(c, sel->idx, sel->val, m, k);
        }
        if (!c->topk_pre.radix && m < k) /* too few: the second attempt, as below */
            return topk_sampled(c, x, n, k, c->topk_pre.s, c->topk_pre.rank * 4, 1, sel, nonfinite,
                                true);
        c->topk_path = GCOMP__TOPK_RADIX;
        return radix_topk(c, x, n, k, sel);
    }
    c->topk_pre.x = NULL;

    /* 1. Stratified sample of 8-element runs; 2. one compaction pass; 3. key select. */
    size_t s;
    gcomp_status st = take_sample(c, n, read_x, x, &s);
    if (st != GCOMP_OK) return st;
    return topk_sampled(c, x, n, k, s, first_rank(n, k, s), 0, sel, nonfinite, false);
}

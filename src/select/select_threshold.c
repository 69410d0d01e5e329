/*
 * select_threshold.c - `threshold` (|g| >= t) and DGC's `sampled` threshold.
 *
 * threshold: a fixed t (tau=).  How many elements pass depends on the gradient, so the
 *   workspace grows to the largest count seen (one rescan when it grows).
 * sampled: Lin et al. 2018 (DGC), section 3: estimate the top-k threshold from a random
 *   sample (sample= fraction of n), take |g| >= t in one pass, and refine only when the
 *   count misses k by more than 10%: too many -> keep the exact top k of the candidates
 *   (cheap, they are few); too few -> lower t by re-reading the sample at a larger rank
 *   (at most 3 times, then exact top-k).  exact=1 always trims to exactly k.
 */
#include "core/internal.h"

#include <math.h>

size_t gcomp__density_k(const gcomp_compressor *c);

/* Collects |x| >= t, growing the workspace as needed; nonfinite input is reported. */
static gcomp_status collect_all(gcomp_compressor *c, const float *x, float t, gcomp__selection *sel,
                                size_t *count) {
    size_t cap = c->sel_idx.cap / 4;
    if (cap < 4096) cap = 4096 < c->n ? 4096 : c->n;
    for (;;) {
        gcomp_status st = gcomp__sel_reserve(c, cap, cap, sel);
        if (st != GCOMP_OK) return st;
        size_t m = gcomp__collect_ge(x, c->n, t, sel->idx, sel->val, cap);
        if (m <= cap) {
            *count = m;
            return GCOMP_OK;
        }
        cap = m;
    }
}

static void elem_selection(gcomp__selection *sel, size_t k) {
    sel->k = sel->nvals = k;
    sel->expand = GCOMP__EXPAND_ELEM;
    sel->unit = 1;
    sel->stride = 0;
    sel->index_kind = 0;
}

static gcomp_status threshold_select(gcomp_compressor *c, const float *x, gcomp__selection *sel) {
    if (!gcomp__all_finite(x, c->n)) return GCOMP_E_NONFINITE;
    float t = (float)gcomp__spec_num(&c->spec, "tau", 0.0);
    size_t m;
    gcomp_status st = collect_all(c, x, t, sel, &m);
    if (st == GCOMP_OK) elem_selection(sel, m);
    return st;
}

/* Keeps the k largest of m candidates (exact, ties by index) via the top-k kernel. */
static gcomp_status trim(gcomp_compressor *c, gcomp__selection *sel, size_t m, size_t k) {
    /* The candidates are a small dense vector: run exact top-k on it and map back. */
    if (gcomp__buf_reserve(&c->sel_res, m * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint32_t *oidx = c->sel_res.p;
    float *oval = (float *)(void *)(oidx + m);
    memcpy(oidx, sel->idx, m * 4);
    memcpy(oval, sel->val, m * 4);
    bool bad;
    gcomp__selection inner = {0};
    gcomp_status st = gcomp__topk(c, oval, m, k, &inner, &bad);
    if (st != GCOMP_OK) return st;
    /* inner.idx are positions within the candidate list, ascending. */
    for (size_t j = 0; j < k; j++) {
        uint32_t p = inner.idx[j];
        inner.idx[j] = oidx[p];
        inner.val[j] = oval[p];
    }
    *sel = inner;
    elem_selection(sel, k);
    return GCOMP_OK;
}

static gcomp_status sampled_init(gcomp_compressor *c, gcomp_error *err) {
    (void)err;
    c->max_entries = c->max_values = c->n; /* approximate count: bounded by n */
    return GCOMP_OK;
}

static gcomp_status sampled_select(gcomp_compressor *c, const float *x, gcomp__selection *sel) {
    if (!gcomp__all_finite(x, c->n)) return GCOMP_E_NONFINITE;
    size_t n = c->n, k = gcomp__density_k(c);
    bool exact = gcomp__spec_num(&c->spec, "exact", 0) != 0;
    double frac = gcomp__spec_num(&c->spec, "sample", 0.01);
    size_t s = (size_t)ceil(frac * (double)n);
    if (s < 256) s = n < 256 ? n : 256;
    if (s > n) s = n;
    /* Sample positions from the step's stream, so every call looks at fresh elements.
     * The sample lives in sel_res: the top-k kernel below uses the other buffers. */
    if (gcomp__buf_reserve(&c->sel_res, s * 4) != GCOMP_OK) return GCOMP_E_NOMEM;
    float *sample = c->sel_res.p;
    uint64_t key = gcomp__stream(c->seed, c->step, 3);
    for (size_t j = 0; j < s; j++)
        sample[j] = fabsf(x[(size_t)(((unsigned __int128)gcomp__rand64(key, j) * n) >> 64)]);
    double want = (double)k * (double)s / (double)n;
    for (int attempt = 0; attempt < 4 && k > 0; attempt++) {
        size_t r = (size_t)ceil(want * (attempt == 0 ? 1.0 : pow(1.5, attempt)));
        if (r < 1) r = 1;
        if (r > s) r = s;
        /* r-th largest of the sample: a partial selection by the top-k kernel. */
        gcomp__selection ss = {0};
        bool bad;
        gcomp_status st = gcomp__topk(c, sample, s, r, &ss, &bad);
        if (st != GCOMP_OK) return st;
        float t = INFINITY;
        for (size_t j = 0; j < r; j++) t = ss.val[j] < t ? ss.val[j] : t;
        if (!(t > 0.0f)) break;
        size_t m;
        st = collect_all(c, x, t, sel, &m);
        if (st != GCOMP_OK) return st;
        if (m >= k && (exact || (double)m > 1.1 * (double)k)) return trim(c, sel, m, k);
        if ((double)m >= 0.9 * (double)k) {
            elem_selection(sel, m);
            return GCOMP_OK;
        }
    }
    /* The sample kept missing (or the gradient is mostly zeros): exact top-k. */
    bool bad;
    gcomp_status st = gcomp__topk(c, x, n, k, sel, &bad);
    return st == GCOMP_OK && bad ? GCOMP_E_NONFINITE : st;
}

static const gcomp_param_info threshold_params[] = {
    /* tau (Strom 2015's name for it), not `threshold`: twobit, a value coder this
     * selector may carry, has its own `threshold` (MXNet's name). */
    {"tau", GCOMP_PARAM_FLOAT, 0, 3.0e38, 0, "0.001", NULL, "send every element with |g| >= tau"},
    GCOMP__PARAM_VALUES,
};
static const gcomp_param_info sampled_params[] = {
    GCOMP__PARAM_DENSITY("0.001"),
    GCOMP__PARAM_MIN_K,
    {"sample", GCOMP_PARAM_FLOAT, 0, 1, 1, "0.01", NULL,
     "fraction of the elements sampled to estimate the threshold (DGC uses 0.1%-1%)"},
    {"exact", GCOMP_PARAM_BOOL, 0, 1, 0, "0", NULL,
     "1: trim to exactly k; 0: accept any count within +-10% of k"},
    GCOMP__PARAM_VALUES,
};

const gcomp__codec gcomp__codec_threshold = {
    .info = {GCOMP__CODEC_NAME_ID(threshold), GCOMP_CODEC_SPARSE, "every element with |g| >= tau",
             threshold_params, GCOMP__COUNTOF(threshold_params)},
    .select = threshold_select,
    .count = GCOMP__COUNT_DATA,
};

const gcomp__codec gcomp__codec_sampled = {
    .info = {GCOMP__CODEC_NAME_ID(sampled), GCOMP_CODEC_SPARSE,
             "DGC's sampled top-k threshold with a bounded refinement (count within 10% of k)",
             sampled_params, GCOMP__COUNTOF(sampled_params)},
    .select = sampled_select,
    .init = sampled_init,
    /* The threshold is estimated from a sample drawn from the seed; the positions travel. */
    .traits = GCOMP_SPEC_PRIVATE_DRAWS,
    .count = GCOMP__COUNT_EXPECTED,
};

/*
 * select_topk.c - the dense baseline `none` and exact `topk`.
 *
 * none:  every element, cast by the value coder (f32, f16, bf16, ...).
 * topk:  the k = ceil(density * n) largest |g|, ties broken by the lower index, in O(n)
 *        (select_common.c: sampled threshold + compaction + key quickselect, exact radix
 *        select as the fallback).  Strom 2015, Aji & Heafield 2017.
 */
#include "core/internal.h"

#include <math.h>

/* The density this step uses: the spec's, unless a schedule (DGC's warm-up) overrides it
 * for this step through c->density_override. */
double gcomp__density(const gcomp_compressor *c) {
    return c->density_override > 0.0 ? c->density_override
                                     : gcomp__spec_num(&c->spec, "density", 1.0);
}

/* min_k= (0 where the codec has no such key) floors k: at density 0.001 a 10 x 1024
 * classifier would send 11 values a step, each of its weights about once a thousand steps,
 * and that layer is the one whose error shows in the accuracy (docs/BENCHMARKS.md, "Good
 * defaults").  A floor in the spec, not a density picked per tensor by the caller, so that
 * it holds through a retune of density= and under DGC's warm-up, and every rank's spec
 * fingerprint says the same. */
size_t gcomp__density_k(const gcomp_compressor *c) {
    double d = gcomp__density(c);
    double k = ceil(d * (double)c->n), floor_k = gcomp__spec_num(&c->spec, "min_k", 0);
    if (k < floor_k) k = floor_k;
    return k > (double)c->n ? c->n : (size_t)k;
}

static gcomp_status topk_init(gcomp_compressor *c, gcomp_error *err) {
    (void)err;
    c->max_entries = c->max_values = gcomp__density_k(c);
    return GCOMP_OK;
}

static gcomp_status topk_select(gcomp_compressor *c, const float *x, gcomp__selection *sel) {
    bool bad;
    gcomp_status st = gcomp__topk(c, x, c->n, gcomp__density_k(c), sel, &bad);
    return st == GCOMP_OK && bad ? GCOMP_E_NONFINITE : st;
}

static const gcomp_param_info none_params[] = {GCOMP__PARAM_VALUES};
static const gcomp_param_info topk_params[] = {GCOMP__PARAM_DENSITY("0.01"), GCOMP__PARAM_MIN_K,
                                               GCOMP__PARAM_VALUES};

const gcomp__codec gcomp__codec_none = {
    .info = {GCOMP__CODEC_NAME_ID(none), GCOMP_CODEC_LINEAR,
             "dense baseline: every element, as f32 or cast (f16, bf16) by values=", none_params,
             GCOMP__COUNTOF(none_params)},
    .traits = GCOMP_SPEC_UNBIASED, /* every element: exact with f32 */
};

const gcomp__codec gcomp__codec_topk = {
    .info = {GCOMP__CODEC_NAME_ID(topk), GCOMP_CODEC_SPARSE,
             "exact top-k by magnitude (ties: lower index), O(n) selection, never a full sort",
             topk_params, GCOMP__COUNTOF(topk_params)},
    .select = topk_select,
    .topk_k = gcomp__density_k,
    .init = topk_init,
    .count = GCOMP__COUNT_FIXED,
};

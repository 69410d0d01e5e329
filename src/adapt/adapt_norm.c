/*
 * adapt_norm.c - Accordion (Agarwal, Wang, Lee, Venkataraman, Papailiopoulos, "Accordion:
 * Adaptive Gradient Communication via Critical Learning Regime Identification", MLSys
 * 2021): small gradient errors in a critical learning regime (early training, right after
 * the learning rate changes) cost accuracy that later training does not win back, so a
 * tensor is sent at a low compression there and at a high one elsewhere.  A regime is
 * critical when the norm of the gradient accumulated over an interval moves fast:
 *
 *     critical_k  =  | ||G_k|| - ||G_k-1|| |  /  ||G_k-1||  >=  eta      (eta = 0.5)
 *
 * per tensor, with G_k the sum of its gradients over interval k (the paper's per-layer
 * rule, at its interval boundaries).  Training starts critical (there is no G_-1), as in
 * the paper.  Here ||G_k||^2 is summed over ranks (each rank's own accumulated gradient):
 * the ratio of two such sums is what the rule reads, and every rank has the same sums.
 *
 * Accordion's second rule: where the learning rate decays, the interval after it is
 * critical whatever the norms say (the paper's code switches every layer to the low
 * setting at each decay point).  Here a decay is a fall of the rate by at least lr_drop
 * (default 0.8) between two decisions, from the rates the training loop gives
 * (gcomp_adapt_observe_lr; the least over ranks): a step schedule's /10 or /5 is one; a
 * cosine schedule's fall, which near its end halves the rate from one decision to the next
 * (a rule at 0.5 held the last ~8 % of a run critical for 16 % more bytes and no accuracy,
 * docs/BENCHMARKS.md), reaches 0.8 at most at the run's last decision.  lr_drop=1 turns the
 * rule off.
 *
 * The interval scales with the run (interval=auto: steps / 40), so a two-epoch run gets
 * the same number of chances to leave the critical regime as a long one: the "warm-up
 * that scales with the run's length" a fixed number of warm-up epochs is not.
 *
 * In a combination this controller comes last: it only ever lightens a tensor's
 * compression (to at most `low`), whatever the others chose.  Rejected: switching on the
 * per-step gradient norm (noisy at batch 32: single steps cross eta all the time) and on
 * the norm of the decoded, averaged gradient (its norm depends on the compression chosen,
 * which would feed the decision back into its own input).
 */
#include "adapt_internal.h"

typedef struct norm_state {
    double eta, lr_drop;
    int low;
    double *prev;        /* ||G_k-1|| per managed tensor, NaN before the first interval */
    unsigned char *crit; /* the current verdict */
} norm_state;

static const char *const norm_keys[] = {"eta", "low", "lr_drop", NULL};

static void norm_free(void *p) {
    norm_state *s = p;
    if (!s) return;
    gcomp__free(s->prev);
    gcomp__free(s->crit);
    gcomp__free(s);
}

static gcomp_status norm_create(gcomp_adapt *a, void **out, gcomp_error *err) {
    norm_state *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    *out = s;
    gcomp_status st = gcomp__adapt_num(a, "norm", "eta", 0.5, 1e-6, 1e6, &s->eta, err);
    if (st != GCOMP_OK) return st;
    st = gcomp__adapt_num(a, "norm", "lr_drop", 0.8, 0, 1, &s->lr_drop, err);
    if (st != GCOMP_OK) return st;
    const char *low = gcomp__adapt_opt(a, "low");
    if (low) {
        s->low = gcomp__adapt_find_level(a, low, err);
        if (s->low < 0) return GCOMP_E_SPEC;
        if (s->low >= a->base)
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: norm: low=%s must send more than base (%s)", low,
                               a->ladder[a->base]);
    } else {
        s->low = a->base >= 2 ? a->base - 2 : 0;
    }
    s->prev = gcomp__alloc((a->nm + 1) * sizeof(double));
    s->crit = gcomp__calloc(a->nm + 1);
    if (!s->prev || !s->crit) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    for (size_t m = 0; m < a->nm; m++) {
        s->prev[m] = NAN;
        s->crit[m] = 1;
    }
    return GCOMP_OK;
}

static void norm_save(const gcomp_adapt *a, const void *p, gcomp__adapt_cursor *c) {
    const norm_state *s = p;
    for (size_t m = 0; m < a->nm; m++) {
        gcomp__adapt_wf(c, s->prev[m]);
        gcomp__adapt_w64(c, s->crit[m]);
    }
}

static gcomp_status norm_load(const gcomp_adapt *a, void *p, gcomp__adapt_cursor *c, bool apply,
                              gcomp_error *err) {
    norm_state *s = p;
    for (size_t m = 0; m < a->nm; m++) {
        double prev = gcomp__adapt_rf(c);
        uint64_t crit = gcomp__adapt_r64(c);
        if (crit > 1 || !(isnan(prev) || (isfinite(prev) && prev >= 0)))
            return gcomp__adapt_bad_state(err, "norm");
        if (apply) {
            s->prev[m] = prev;
            s->crit[m] = (unsigned char)crit;
        }
    }
    return GCOMP_OK;
}

static gcomp_status norm_decide(gcomp_adapt *a, void *p, const gcomp__adapt_in *in,
                                gcomp__adapt_plan *plan) {
    norm_state *s = p;
    /* The rate fell by lr_drop or more since the last decision: the next interval is
     * critical for every tensor (Accordion's rule at a decay).  The tolerance keeps an exact
     * /5 a fall of 0.8 (1 - 0.8 is 0.19999999999999996). */
    bool decay = !in->initial && s->lr_drop < 1 && in->lr < in->lr_prev &&
                 in->lr <= (1 - s->lr_drop) * in->lr_prev * (1 + 1e-9);
    for (size_t m = 0; m < a->nm; m++) {
        if (!in->initial && in->norm2 && isfinite(in->norm2[m])) {
            double g = sqrt(in->norm2[m]), prev = s->prev[m];
            if (isnan(prev))
                s->crit[m] = 1; /* interval 0: nothing to compare with, still critical */
            else
                s->crit[m] = prev > 0 ? fabs(g - prev) / prev >= s->eta : g > 0; /* Accordion */
            s->prev[m] = g;
        }
        if (decay) s->crit[m] = 1;
        if (s->crit[m]) {
            if (plan->level[m] > s->low) plan->level[m] = s->low;
            plan->critical++;
        }
    }
    return GCOMP_OK;
}

const gcomp__adapt_ctl gcomp__adapt_norm = {
    .name = "norm",
    .order = 3,
    .keys = norm_keys,
    .needs_norm = true,
    .create = norm_create,
    .free = norm_free,
    .save = norm_save,
    .load = norm_load,
    .decide = norm_decide,
};

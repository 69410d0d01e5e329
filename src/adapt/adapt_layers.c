/*
 * adapt_layers.c - L-GreCo (Markov, Ramezani-Kebrya, Alistarh et al., "L-GreCo: Layerwise-
 * Adaptive Gradient Compression for Efficient and Accurate Deep Learning", MLSys 2024):
 * layers differ in how much a given compression hurts them, so give each layer its own
 * setting such that the total compression error is smallest for the bytes spent:
 *
 *     minimise   sum_i  e_i(c_i)      subject to   sum_i  b_i(c_i)  <=  B
 *
 * over one candidate c_i per managed tensor from the ladder, where e_i(c) = |C_c(x_i) -
 * x_i|^2 is measured on the real gradient plus residual (summed over ranks) every
 * `measure` steps, b_i(c) is the candidate's message size, and B is the budget: by default
 * the bytes of the uniform setting the controllers before this one chose (base, or
 * bandwidth's level), so the same traffic is spent where it buys the most error.
 *
 * The knapsack is solved exactly on a discretised budget, as L-GreCo does: with U units of
 * B/U bytes, each candidate costs ceil(b/unit) units and
 *
 *     D[i+1][u] = min_c  D[i][u - cost_i(c)] + e_i(c)
 *
 * in O(tensors x candidates x U).  The capacity is U plus one unit per tensor, so the
 * uniform setting (which fits exactly) stays feasible despite the rounding up; the
 * choice can exceed B by at most that slack, tensors x B / U (U >= 64 x tensors: 1.6 %).
 * Ties go to the candidate sending fewer bytes.  Before the first measurement the plan
 * stays uniform.
 *
 * Hysteresis: the plan in force is kept unless the DP's plan has at least `margin`
 * (default 5 %) less error on the same measurement, or the plan in force no longer fits
 * the budget.  Without it the plan alternated at every measurement between a non-uniform
 * plan and the uniform one, whose errors were within 0.1-2 % of each other: error feedback
 * feeds the choice back into the next measurement (a starved tensor's residual grows, so
 * the next DP feeds it again), and a small measured gain is not worth the switch.
 *
 * What the errors are of (`error_on`): by default the vector the codec will compress, the
 * gradient plus the residual.  With error feedback that input carries the plan in force:
 * a tensor the plan starves piles up residual, measures a large error at the next
 * measurement and wins its bytes back, and the plan can swing between two plans at every
 * measurement that only the margin holds still (the CNN of docs/BENCHMARKS.md at
 * margin=0).  error_on=gradient measures the gradient alone: the errors then depend on
 * the gradients and not on the plans chosen before, the decision has no loop through
 * its own past, and the total it reports is the error of compressing the gradients.
 *
 * Rejected: greedy by error per byte (not optimal for a ladder of discrete settings, and
 * the DP is cheap at a decision every few hundred steps).
 */
#include "adapt_internal.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>

typedef struct layers_state {
    double fixed_budget; /* > 0: budget=BYTES */
    double margin;       /* a new plan's least error reduction, relative */
    double *err;         /* nm * K, the last measurement */
    int *cur;            /* nm: the plan in force (-1 before the first DP: uniform) */
    bool has_err;
} layers_state;

static const char *const layers_keys[] = {"budget", "margin", "error_on", NULL};

static void layers_free(void *p) {
    layers_state *s = p;
    if (!s) return;
    gcomp__free(s->err);
    gcomp__free(s->cur);
    gcomp__free(s);
}

static gcomp_status layers_create(gcomp_adapt *a, void **out, gcomp_error *err) {
    layers_state *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    *out = s;
    const char *b = gcomp__adapt_opt(a, "budget");
    if (b && strcmp(b, "uniform")) {
        char *end;
        errno = 0;
        double v = strtod(b, &end);
        if (end == b || *end || errno || !(v >= 1) || !isfinite(v))
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: layers: budget=%s: uniform, or bytes per step >= 1", b);
        if (a->nm && v < a->total[a->K - 1])
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: layers: budget=%s is below the lightest ladder entry's "
                               "%.0f bytes per step",
                               b, a->total[a->K - 1]);
        s->fixed_budget = v;
    }
    gcomp_status st = gcomp__adapt_num(a, "layers", "margin", 0.05, 0, 0.9, &s->margin, err);
    if (st != GCOMP_OK) return st;
    static const char *const on[] = {"input", "gradient", NULL};
    int w;
    if ((st = gcomp__adapt_word(a, "layers", "error_on", on,
                                "input (the gradient plus the residual) or gradient", &w, err)))
        return st;
    a->error_on_grad = w == 1;
    s->err = gcomp__alloc((a->nm * a->K + 1) * sizeof(double));
    s->cur = gcomp__alloc((a->nm + 1) * sizeof(int));
    if (!s->err || !s->cur) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    for (size_t m = 0; m < a->nm; m++) s->cur[m] = -1;
    return GCOMP_OK;
}

static void layers_save(const gcomp_adapt *a, const void *p, gcomp__adapt_cursor *c) {
    const layers_state *s = p;
    gcomp__adapt_w64(c, s->has_err);
    for (size_t m = 0; m < a->nm; m++) gcomp__adapt_w64(c, (uint64_t)(int64_t)s->cur[m]);
    for (size_t q = 0; q < a->nm * a->K; q++) gcomp__adapt_wf(c, s->has_err ? s->err[q] : 0);
}

static gcomp_status layers_load(const gcomp_adapt *a, void *p, gcomp__adapt_cursor *c, bool apply,
                                gcomp_error *err) {
    layers_state *s = p;
    size_t at = c->at;
    uint64_t has = gcomp__adapt_r64(c);
    bool ok = has <= 1, none = false;
    for (size_t m = 0; m < a->nm; m++) { /* a plan: every level, or none (all -1) */
        int64_t v = (int64_t)gcomp__adapt_r64(c);
        ok &= v >= -1 && v < (int64_t)a->K && (m == 0 || (v < 0) == none);
        none = v < 0;
    }
    for (size_t q = 0; q < a->nm * a->K; q++) { /* squared errors */
        double x = gcomp__adapt_rf(c);
        ok &= isfinite(x) && x >= 0;
    }
    if (!ok) return gcomp__adapt_bad_state(err, "layers");
    if (!apply) return GCOMP_OK;
    c->at = at;
    s->has_err = gcomp__adapt_r64(c) != 0;
    for (size_t m = 0; m < a->nm; m++) s->cur[m] = (int)(int64_t)gcomp__adapt_r64(c);
    for (size_t q = 0; q < a->nm * a->K; q++) s->err[q] = gcomp__adapt_rf(c);
    return GCOMP_OK;
}

static gcomp_status layers_decide(gcomp_adapt *a, void *p, const gcomp__adapt_in *in,
                                  gcomp__adapt_plan *plan) {
    layers_state *s = p;
    const size_t nm = a->nm, K = a->K;
    if (in->measured && in->err2) {
        bool ok = true;
        for (size_t q = 0; q < nm * K; q++) ok &= isfinite(in->err2[q]);
        if (ok) {
            memcpy(s->err, in->err2, nm * K * sizeof(double));
            s->has_err = true;
        }
    }
    double B = s->fixed_budget > 0 ? s->fixed_budget : plan->budget;
    if (!s->has_err || nm == 0 || !(B > 0)) return GCOMP_OK;
    plan->error_uniform = 0;
    for (size_t m = 0; m < nm; m++) plan->error_uniform += s->err[m * K + (size_t)plan->uniform];
    size_t U = 4096 > 64 * nm ? 4096 : 64 * nm, cap = U + nm;
    double unit = B / (double)U;
    double *D = gcomp__alloc(2 * (cap + 1) * sizeof(double));
    unsigned char *choice = gcomp__alloc(nm * (cap + 1));
    size_t *cost = gcomp__alloc(nm * K * sizeof(size_t));
    if (!D || !choice || !cost) {
        gcomp__free(D);
        gcomp__free(choice);
        gcomp__free(cost);
        return GCOMP_E_NOMEM;
    }
    for (size_t q = 0; q < nm * K; q++) {
        double c = ceil(a->bytes[q] / unit - 1e-9);
        cost[q] = c > (double)cap ? cap + 1 : (size_t)c;
    }
    double *cur = D, *nxt = D + cap + 1;
    for (size_t u = 0; u <= cap; u++) cur[u] = 0.0;
    for (size_t m = 0; m < nm; m++) {
        for (size_t u = 0; u <= cap; u++) {
            double best = INFINITY;
            unsigned char bj = (unsigned char)(K - 1);
            for (size_t j = K; j-- > 0;) { /* fewer bytes first: ties keep them */
                size_t c = cost[m * K + j];
                if (c > u || !isfinite(cur[u - c])) continue;
                double v = cur[u - c] + s->err[m * K + j];
                if (v < best) {
                    best = v;
                    bj = (unsigned char)j;
                }
            }
            nxt[u] = best;
            choice[m * (cap + 1) + u] = bj;
        }
        double *t = cur;
        cur = nxt;
        nxt = t;
    }
    if (isfinite(cur[cap])) {
        size_t u = cap;
        for (size_t m = nm; m-- > 0;) {
            unsigned char j = choice[m * (cap + 1) + u];
            plan->level[m] = j;
            u -= cost[m * K + j];
        }
        plan->error = cur[cap];
    } else { /* not even the lightest entries fit: send them */
        for (size_t m = 0; m < nm; m++) plan->level[m] = (int)K - 1;
    }
    /* Hysteresis: the plan in force (uniform before any) stays unless the new one wins by
     * the margin on this measurement, or it no longer fits the budget (with the DP's
     * rounding slack). */
    if (s->cur[0] < 0)
        for (size_t m = 0; m < nm; m++) s->cur[m] = plan->uniform;
    double cur_err = 0, cur_bytes = 0;
    bool same = true;
    for (size_t m = 0; m < nm; m++) {
        size_t q = m * K + (size_t)s->cur[m];
        cur_err += s->err[q];
        cur_bytes += a->bytes[q];
        same &= s->cur[m] == plan->level[m];
    }
    if (!same && cur_bytes <= (double)cap * unit && !(plan->error < (1 - s->margin) * cur_err)) {
        memcpy(plan->level, s->cur, nm * sizeof(int));
        plan->error = cur_err;
    }
    for (size_t m = 0; m < nm; m++) s->cur[m] = plan->level[m];
    gcomp__free(D);
    gcomp__free(choice);
    gcomp__free(cost);
    return GCOMP_OK;
}

const gcomp__adapt_ctl gcomp__adapt_layers = {
    .name = "layers",
    .order = 2,
    .keys = layers_keys,
    .needs_measure = true,
    .create = layers_create,
    .free = layers_free,
    .save = layers_save,
    .load = layers_load,
    .decide = layers_decide,
};

/*
 * adapt_accuracy.c - accuracy-driven compression: a closed loop on a validation metric
 * (accuracy, as a fraction) that compresses harder while the run is on course for its
 * target and lighter when it falls behind.
 *
 * Course: the metric rises during training, so comparing it with the final target would
 * call every run "behind" until its end.  The loop follows a glide path instead,
 *
 *     required(p) = target - margin * (1 - p)          p = progress in [0, 1]
 *
 * a straight line that reaches the target at the end of the run (margin 2 pp at the
 * start by default).  A straight line is the wrong shape under a decaying learning rate:
 * under a cosine rate the accuracy stays well below it until the rate is small, and a
 * loop on that course reads "behind" all run (docs/BENCHMARKS.md measured it stepping
 * lighter five times to end below its target).  So when the caller has a reference curve
 * (gcomp_adapt_set_course: in the trainer, the dense run of the same command) the course
 * is that curve shifted to end at the target,
 *
 *     required(p) = ref(p) - (ref(last) - target)
 *
 * which has the schedule's shape by construction: "0.3 pp below dense" at every
 * evaluation.  Each metric from p >= start on (p: the progress when it was observed) is
 * compared with the course at its own progress, and the loop judges the mean d of the
 * latest `window` (4) of these deviations since its last move:
 *     d < -band   ->  one ladder step lighter (more bytes)
 *     d > +band   ->  one ladder step heavier (never from p >= hold on)
 * with at least `dwell` metric decisions between two moves.  The dead band, the dwell and
 * the mean are the hysteresis: at a constant learning rate one evaluation swings by about
 * 1 pp from the next, and a loop that answered single evaluations moved with that noise
 * (docs/BENCHMARKS.md, accuracy-driven).  The window keeps the mean recent: a mean over
 * everything since the last move let a long stretch on course mask a drift below it at
 * the end of a cosine run.  Late in the run a step to heavier compression
 * has no time left to be corrected if it costs accuracy, and the final accuracy is what
 * the target is about, so from `hold` on the loop only lightens.  One step per move and
 * the ladder's ends are the bounds.  The offset it keeps is relative
 * to the uniform level the controllers before it chose (bandwidth's, or base), and is
 * clamped to the ladder, so it never winds up beyond what it can apply.
 *
 * Rejected: extrapolating the learning curve to predict the final accuracy (Domhan et al.
 * 2015; fragile on a few noisy points and blind to a learning-rate schedule); steering by
 * the training loss (the target users state is an accuracy); a course from the integral
 * of the learning rate (it knows the schedule but not how accuracy answers it, which the
 * reference curve measures).
 */
#include "adapt_internal.h"

#include <errno.h>
#include <stdlib.h>

#define ACC_WINDOW 64 /* the largest window= */

typedef struct acc_state {
    double target, band, margin, start, dwell, hold;
    double below;  /* target=ref-X: the target is X (a fraction) below the curve's end; else NaN */
    bool glide;    /* course=glide: ignore a reference curve */
    double window; /* deviations the mean is taken over, at most */
    double dev[ACC_WINDOW]; /* the latest deviations from the course since the last move */
    int ndev, offset, since;
} acc_state;

static const char *const acc_keys[] = {"target", "band",   "margin", "start", "dwell",
                                       "hold",   "course", "window", NULL};

static void acc_free(void *p) {
    gcomp__free(p);
}

static gcomp_status acc_create(gcomp_adapt *a, void **out, gcomp_error *err) {
    acc_state *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    *out = s;
    if (!gcomp__adapt_opt(a, "target"))
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: accuracy: target=T is required (the accuracy to end at: "
                           "0 < T < 1, a percentage such as 88.4, or ref-X: X points below "
                           "a reference curve's end)");
    const char *tv = gcomp__adapt_opt(a, "target");
    s->below = NAN;
    gcomp_status st;
    if (!strncmp(tv, "ref-", 4)) { /* percentage points below the reference's end */
        char *end;
        errno = 0;
        double x = strtod(tv + 4, &end);
        if (end == tv + 4 || *end || errno || !(x >= 0 && x < 100))
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: accuracy: target=%s: expected ref-X, X the percentage "
                               "points below the reference curve's end (0 <= X < 100)",
                               tv);
        s->below = x / 100;
    } else {
        char *end;
        errno = 0;
        double x = strtod(tv, &end);
        const bool number = end != tv && !*end && !errno && isfinite(x);
        if (number && x > 1 && x < 100) x /= 100;
        if (!number || !(x > 0 && x < 1))
            return gcomp__fail(
                err, GCOMP_E_SPEC,
                "adapt: accuracy: target=%s is out of range or no number: 0 < T < 1 (or a "
                "percentage below 100; or ref-X, X points below a reference "
                "curve's end)",
                tv);
        s->target = x;
    }
    if ((st = gcomp__adapt_num(a, "accuracy", "band", 0.002, 0, 1, &s->band, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "margin", 0.02, 0, 1, &s->margin, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "start", 0.1, 0, 1, &s->start, err)) ||
        (st = gcomp__adapt_whole(a, "accuracy", "dwell", 2, 1, 1000, &s->dwell, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "hold", 0.8, 0, 1, &s->hold, err)) ||
        (st = gcomp__adapt_whole(a, "accuracy", "window", 4, 1, ACC_WINDOW, &s->window, err)))
        return st;
    static const char *const course[] = {"auto", "glide", NULL};
    int w;
    if ((st = gcomp__adapt_word(a, "accuracy", "course", course,
                                "auto (a reference curve when one is given, else the glide "
                                "path) or glide",
                                &w, err)))
        return st;
    s->glide = w == 1;
    if (isfinite(s->below) && s->glide)
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: accuracy: target=%s needs the reference curve, which "
                           "course=glide ignores",
                           tv);
    /* Without the run's length every evaluation would read as the run's end: the loop
     * would hold from the start and compare each metric with the final target, which
     * calls every run behind (above). */
    if (!a->total_steps)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "adapt: accuracy needs the run's length (gcomp_adapt_options."
                           "total_steps; total_steps= in Python): it compares each metric with "
                           "the course at the run's progress");
    s->since = (int)s->dwell; /* the first metric may move at once */
    return GCOMP_OK;
}

/* The reference curve at progress p: linear between its points, flat beyond them. */
static double ref_at(const gcomp_adapt *a, double p) {
    const double *c = a->course;
    size_t n = a->ncourse;
    if (p <= c[0]) return c[1];
    for (size_t k = 1; k < n; k++)
        if (p <= c[2 * k]) {
            double w = (p - c[2 * k - 2]) / (c[2 * k] - c[2 * k - 2]);
            return c[2 * k - 1] + w * (c[2 * k + 1] - c[2 * k - 1]);
        }
    return c[2 * n - 1];
}

static double required(const gcomp_adapt *a, const acc_state *s, double p) {
    if (a->ncourse && !s->glide) /* ref(p) - (ref(last) - target) */
        return ref_at(a, p) -
               (isfinite(s->below) ? s->below : a->course[2 * a->ncourse - 1] - s->target);
    return s->target - s->margin * (1 - p);
}

/* The counters stay bounded over any run: `since` counts only up to dwell (it is only
 * compared with it), and `ndev` indexes a ring of ACC_WINDOW (>= window) deviations, so a
 * multiple of the ring taken off changes neither the slot it points at nor the window. */
static void saturate(acc_state *s) {
    if (s->since > (int)s->dwell) s->since = (int)s->dwell;
    if (s->ndev >= 2 * ACC_WINDOW) s->ndev = ACC_WINDOW + s->ndev % ACC_WINDOW;
}

static gcomp_status acc_check(const gcomp_adapt *a, const void *p, gcomp_error *err) {
    const acc_state *s = p;
    if (isfinite(s->below) && !a->ncourse)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "adapt: accuracy: target=ref-%g needs a reference curve "
                           "(gcomp_adapt_set_course; in gradcomp train, a dense run before "
                           "it in --compare)",
                           100 * s->below);
    return GCOMP_OK;
}

static void acc_save(const gcomp_adapt *a, const void *p, gcomp__adapt_cursor *c) {
    const acc_state *s = p;
    (void)a;
    gcomp__adapt_w64(c, (uint64_t)s->ndev);
    gcomp__adapt_w64(c, (uint64_t)(int64_t)s->offset);
    gcomp__adapt_w64(c, (uint64_t)s->since);
    for (int k = 0; k < ACC_WINDOW; k++) gcomp__adapt_wf(c, s->dev[k]);
}

static gcomp_status acc_load(const gcomp_adapt *a, void *p, gcomp__adapt_cursor *c, bool apply,
                             gcomp_error *err) {
    acc_state *s = p;
    uint64_t ndev = gcomp__adapt_r64(c);
    int64_t offset = (int64_t)gcomp__adapt_r64(c);
    uint64_t since = gcomp__adapt_r64(c);
    if (ndev > INT32_MAX || since > INT32_MAX || offset <= -(int64_t)a->K ||
        offset >= (int64_t)a->K)
        return gcomp__adapt_bad_state(err, "accuracy");
    size_t at = c->at;
    for (int k = 0; k < ACC_WINDOW; k++)
        if (!isfinite(gcomp__adapt_rf(c))) return gcomp__adapt_bad_state(err, "accuracy");
    c->at = at;
    if (!apply) return GCOMP_OK;
    s->ndev = (int)ndev;
    s->offset = (int)offset;
    s->since = (int)since;
    for (int k = 0; k < ACC_WINDOW; k++) s->dev[k] = gcomp__adapt_rf(c);
    saturate(s); /* states saved before the counters saturated */
    return GCOMP_OK;
}

static gcomp_status acc_decide(gcomp_adapt *a, void *p, const gcomp__adapt_in *in,
                               gcomp__adapt_plan *plan) {
    acc_state *s = p;
    if (!in->initial && in->has_metric) {
        double prog = isfinite(in->progress) ? fmin(fmax(in->progress, 0), 1) : 1;
        double mp = isfinite(in->metric_progress) ? fmin(fmax(in->metric_progress, 0), 1) : prog;
        s->since++;
        if (mp >= s->start) {
            s->dev[s->ndev % ACC_WINDOW] = in->metric - required(a, s, mp);
            s->ndev++;
        }
        if (s->ndev > 0 && s->since >= (int)s->dwell) {
            int w = s->ndev < (int)s->window ? s->ndev : (int)s->window;
            double d = 0;
            for (int k = 1; k <= w; k++) d += s->dev[(s->ndev - k) % ACC_WINDOW];
            d /= w;
            int move = d < -s->band ? -1 : d > s->band && prog < s->hold ? 1 : 0;
            if (move) {
                s->offset += move;
                s->since = 0;
                s->ndev = 0;
            }
        }
        saturate(s);
    }
    int lvl = plan->uniform + s->offset;
    if (lvl < 0) lvl = 0;
    if (lvl > (int)a->K - 1) lvl = (int)a->K - 1;
    s->offset = lvl - plan->uniform; /* anti-windup */
    gcomp__adapt_plan_uniform(a, plan, lvl);
    return GCOMP_OK;
}

const gcomp__adapt_ctl gcomp__adapt_accuracy = {
    .name = "accuracy",
    .order = 1,
    .keys = acc_keys,
    .create = acc_create,
    .free = acc_free,
    .check = acc_check,
    .save = acc_save,
    .load = acc_load,
    .decide = acc_decide,
};

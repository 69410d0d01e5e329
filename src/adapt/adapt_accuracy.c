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
 * start by default).  Each metric from p >= start on is compared with the course at its
 * own progress, and the loop judges the mean d of these deviations since its last move:
 *     d < -band   ->  one ladder step lighter (more bytes)
 *     d > +band   ->  one ladder step heavier (never from p >= hold on)
 * with at least `dwell` metric decisions between two moves.  The dead band, the dwell and
 * the mean are the hysteresis: at a constant learning rate one evaluation swings by about
 * 1 pp from the next, and a loop that answered single evaluations moved with that noise
 * (docs/BENCHMARKS.md, accuracy-driven).  Late in the run a step to heavier compression
 * has no time left to be corrected if it costs accuracy, and the final accuracy is what
 * the target is about, so from `hold` on the loop only lightens.  One step per move and
 * the ladder's ends are the bounds.  The offset it keeps is relative
 * to the uniform level the controllers before it chose (bandwidth's, or base), and is
 * clamped to the ladder, so it never winds up beyond what it can apply.
 *
 * Rejected: extrapolating the learning curve to predict the final accuracy (Domhan et al.
 * 2015; fragile on a few noisy points and blind to a learning-rate schedule); steering by
 * the training loss (the target users state is an accuracy).
 */
#include "adapt_internal.h"

typedef struct acc_state {
    double target, band, margin, start, dwell, hold;
    double dev; /* deviations from the course summed since the last move */
    int ndev, offset, since;
} acc_state;

static const char *const acc_keys[] = {"target", "band", "margin", "start", "dwell", "hold", NULL};

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
                           "0 < T < 1, or a percentage such as 88.4)");
    gcomp_status st = gcomp__adapt_num(a, "accuracy", "target", 0, -1e300, 1e300, &s->target, err);
    if (st != GCOMP_OK) return st;
    if (s->target > 1 && s->target < 100) s->target /= 100;
    if (!(s->target > 0 && s->target < 1))
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: accuracy: target=%s is out of range: 0 < T < 1 (or a "
                           "percentage below 100)",
                           gcomp__adapt_opt(a, "target"));
    if ((st = gcomp__adapt_num(a, "accuracy", "band", 0.002, 0, 1, &s->band, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "margin", 0.02, 0, 1, &s->margin, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "start", 0.1, 0, 1, &s->start, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "dwell", 2, 1, 1000, &s->dwell, err)) ||
        (st = gcomp__adapt_num(a, "accuracy", "hold", 0.8, 0, 1, &s->hold, err)))
        return st;
    s->since = (int)s->dwell; /* the first metric may move at once */
    return GCOMP_OK;
}

static void acc_decide(gcomp_adapt *a, void *p, const gcomp__adapt_in *in,
                       gcomp__adapt_plan *plan) {
    acc_state *s = p;
    if (!in->initial && in->has_metric) {
        double prog = isfinite(in->progress) ? fmin(fmax(in->progress, 0), 1) : 1;
        s->since++;
        if (prog >= s->start) {
            s->dev += in->metric - (s->target - s->margin * (1 - prog));
            s->ndev++;
        }
        if (s->ndev > 0 && s->since >= (int)s->dwell) {
            double d = s->dev / s->ndev;
            int move = d < -s->band ? -1 : d > s->band && prog < s->hold ? 1 : 0;
            if (move) {
                s->offset += move;
                s->since = 0;
                s->dev = 0;
                s->ndev = 0;
            }
        }
    }
    int lvl = plan->uniform + s->offset;
    if (lvl < 0) lvl = 0;
    if (lvl > (int)a->K - 1) lvl = (int)a->K - 1;
    s->offset = lvl - plan->uniform; /* anti-windup */
    gcomp__adapt_plan_uniform(a, plan, lvl);
}

const gcomp__adapt_ctl gcomp__adapt_accuracy = {
    .name = "accuracy",
    .order = 1,
    .keys = acc_keys,
    .create = acc_create,
    .free = acc_free,
    .decide = acc_decide,
};

/*
 * retune.c - changing a live compressor's spec between steps without losing what it holds
 * back (gcomp_compressor_retune, include/gradcomp.h).
 *
 * What carries over is decided by what the two specs are (gcomp_spec_describe), through
 * the stages' own hooks, never by codec names:
 *
 *   held back (GCOMP_SPEC_FEEDBACK on the old spec: ef's residual, dgc's accumulated
 *   velocity v, PowerSGD's residual, or an earlier retune's carry) - one vector h of n
 *   floats, the gradient not yet sent - goes to
 *     the new spec's feedback (ef: e += h; dgc: v += h), else
 *     its codec's own residual (PowerSGD: E = h), else, for a spec that keeps nothing
 *     (feedback=none, e.g. dense `none`, or PowerSGD where every step of the tensor is
 *     dense), into the next message: the next encode, or PowerSGD's next dense step,
 *     sends g + h ("switching to dense flushes the residual").
 *   momentum (GCOMP_SPEC_MOMENTUM on both: dgc -> dgc) is kept under the same m; under
 *   another m the tail u still owes, m u / (1 - m) of update, joins h and u starts from 0
 *   (kept as it was, 0.9 -> 0.5 would have owed u instead of 9 u).  Across the boundary the
 *   held-back vector changes units.  DGC's v is update (it is applied once, by plain
 *   SGD, when sent); another spec's residual is gradient, which the caller's momentum
 *   optimizer (momentum m, the same as DGC's) amplifies by 1/(1 - m) once sent.  So
 *     dgc -> other:  h = (1 - m) v + m u: the update owed, v, plus the tail u would still
 *                    have added (m u + m^2 u + ... = m u / (1 - m)), in gradient units;
 *                    the optimizer takes momentum back from 0 (or from what is left of
 *                    its own buffer's tail, below);
 *     other -> dgc:  v += h / (1 - m), and u starts at 0; the caller's optimizer stops
 *                    adding to its own momentum buffer for the tensor but goes on
 *                    applying the tail it still owes as it decays (the trainer's
 *                    gtrain_sgd_release_tensor): that is in the optimizer's units and
 *                    on every rank alike, where u is per rank and per exchange.
 *   Moved unconverted, v came back amplified by 1/(1 - m) (10x at m = 0.9): a switch
 *   from DGC to PowerSGD after 115 steps at density 0.0001 blew the loss up on netsim.
 *   warm start (the same multi-phase codec and shape: PowerSGD's Q) keeps the first
 *   min(r, r') columns; new columns are drawn from the shared seed as at a start.
 *   step counter, epoch and statistics continue.
 * So with error feedback sum(sent) + held back = sum(gradients) holds across any number
 * of retunes (tests/unit/test_retune.c), the property that makes adaptive compression
 * safe to switch.
 *
 * The new compressor is built completely (every allocation) before the old one is
 * touched, then the two objects swap contents, so the caller's pointer stays valid and a
 * failed retune (bad spec, no memory, a PowerSGD step in flight) changes nothing.
 * Rejected: retuning stage by stage in place (every codec would need a resize path, and a
 * failure half-way would leave a compressor that is neither spec).
 * gcomp_compressor_retune_from does the same into a compressor the caller already has (the
 * MPI layer's switch, which must keep the old one for a roll-back): the conversion only
 * reads the source.
 */
#include "core/internal.h"

#include <math.h>

/* Fills nc (just built, of c's size) with what c holds back, converted into nc's spec;
 * c is only read.  On failure nc is to be freed; *err names the reason. */
static gcomp_status carry_over(gcomp_compressor *nc, const gcomp_compressor *c, gcomp_error *err) {
    const size_t n = c->n;
    const gcomp__feedback *of = c->spec.feedback, *nf = nc->spec.feedback;
    const bool om = (of->traits & GCOMP_SPEC_MOMENTUM) && of->momentum,
               nm = (nf->traits & GCOMP_SPEC_MOMENTUM) && nf->momentum;
    const float *r = of->residual ? of->residual(c) : NULL;
    /* A residual that goes over as it is (no carry to add, no change of units) is read in
     * place: a copy of it would be one more tensor-sized buffer on fresh pages. */
    float *held = NULL;
    const float *h = r;
    if (!r || c->carry || om || nm) {
        if (!(held = gcomp__calloc(n * sizeof(float))))
            return gcomp__fail(err, GCOMP_E_NOMEM, "retune: out of memory");
        if (r)
            memcpy(held, r, n * sizeof(float));
        else if (c->codec->held)
            c->codec->held(c, held);
        if (c->carry)
            for (size_t i = 0; i < n; i++) held[i] += c->carry[i];
        h = held;
    }
    if (om && !nm) { /* velocity and momentum tail -> gradient */
        const float *u;
        const float m = of->momentum(c, &u);
        if (m < 1) /* m = 1 has no gradient equivalent: kept as it is */
            for (size_t i = 0; i < n; i++) held[i] = (1 - m) * held[i] + m * u[i];
    } else if (!om && nm) { /* gradient -> velocity */
        const float m = nf->momentum(nc, NULL);
        if (m < 1)
            for (size_t i = 0; i < n; i++) held[i] /= 1 - m;
    } else if (om && nm) { /* momentum -> another momentum: the old tail joins the velocity */
        const float *u;
        const float m = of->momentum(c, &u);
        if (m < 1 && m != nf->momentum(nc, NULL))
            for (size_t i = 0; i < n; i++) held[i] += m / (1 - m) * u[i];
    }
    bool any = false, finite = true;
    for (size_t i = 0; i < n; i++) {
        any |= h[i] != 0.0f;
        finite &= isfinite(h[i]) != 0;
    }
    if (!finite) { /* in the new units it overflows float: kept, it would be Inf for good */
        gcomp__free(held);
        return gcomp__fail(err, GCOMP_E_NONFINITE,
                           "retune: what '%s' holds back overflows float as '%s' holds it",
                           c->spec.canonical, nc->spec.canonical);
    }
    nc->step = c->step; /* before absorb: PowerSGD draws new warm-start columns from it */
    nc->epoch = c->epoch;
    nc->stats = c->stats;

    if (nf->absorb) {
        nf->absorb(nc, h, c);
    } else if (gcomp__keeps_held(nc)) {
        gcomp_status st = nc->codec->absorb(nc, h, c);
        if (st != GCOMP_OK) {
            gcomp__free(held);
            return gcomp__fail(err, st,
                               "retune: cannot keep the %zu elements '%s' held back in '%s'", n,
                               c->spec.canonical, nc->spec.canonical);
        }
    } else if (any) { /* nothing to keep it in (no residual, or every step dense): it rides
                       * in the next message */
        if (!held && (held = gcomp__alloc(n * sizeof(float))) != NULL)
            memcpy(held, h, n * sizeof(float));
        nc->carry = held;
        nc->carry_ws = gcomp__alloc(n * sizeof(float));
        held = NULL;
        if (!nc->carry || !nc->carry_ws)
            return gcomp__fail(err, GCOMP_E_NOMEM, "retune: out of memory");
    }
    gcomp__free(held);
    return GCOMP_OK;
}

/* Builds the compressor `spec` makes for src's size and carries src's state into it. */
static gcomp_status retuned(gcomp_compressor **out, const gcomp_compressor *src, const char *spec,
                            gcomp_error *err) {
    *out = NULL;
    if (src->codec->busy && src->codec->busy(src))
        return gcomp__fail(err, GCOMP_E_PROTOCOL,
                           "retune: a %s step is in flight; finish or abort it first",
                           src->codec->info.name);
    gcomp__spec parsed;
    gcomp_status st = gcomp__spec_parse(spec, &parsed, err);
    if (st != GCOMP_OK) return st;
    gcomp_compressor *nc;
    if ((st = gcomp__compressor_build(&nc, &parsed, src->n, src->rows, src->cols, err)) != GCOMP_OK)
        return st;
    if ((st = carry_over(nc, src, err)) != GCOMP_OK) {
        gcomp_compressor_free(nc); /* after the message, which names nc's spec */
        return st;
    }
    *out = nc;
    return GCOMP_OK;
}

/* c takes nc's contents and nc is freed with c's old ones: the caller's pointer stays valid. */
static void swap_and_free(gcomp_compressor *c, gcomp_compressor *nc) {
    gcomp_compressor tmp = *c;
    *c = *nc;
    *nc = tmp;
    c->vp.spec = &c->spec; /* the only pointer a compressor holds into itself */
    nc->vp.spec = &nc->spec;
    gcomp_compressor_free(nc);
}

gcomp_status gcomp_compressor_retune(gcomp_compressor *c, const char *spec, gcomp_error *err) {
    if (!c || !spec) return gcomp__fail(err, GCOMP_E_ARG, "retune: compressor and spec needed");
    gcomp_compressor *nc;
    gcomp_status st = retuned(&nc, c, spec, err);
    if (st != GCOMP_OK) return st;
    swap_and_free(c, nc);
    return GCOMP_OK;
}

gcomp_status gcomp_compressor_retune_from(gcomp_compressor *dst, const gcomp_compressor *src,
                                          gcomp_error *err) {
    if (!dst || !src || dst == src)
        return gcomp__fail(err, GCOMP_E_ARG, "retune_from: two distinct compressors needed");
    if (dst->n != src->n || dst->rows != src->rows || dst->cols != src->cols)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "retune_from: sizes differ (%zu = %zu x %zu against %zu = %zu x %zu)",
                           dst->n, dst->rows, dst->cols, src->n, src->rows, src->cols);
    if (dst->codec->busy && dst->codec->busy(dst))
        return gcomp__fail(err, GCOMP_E_PROTOCOL,
                           "retune_from: the destination's %s step is in flight",
                           dst->codec->info.name);
    gcomp_compressor *nc;
    gcomp_status st = retuned(&nc, src, dst->spec.canonical, err);
    if (st != GCOMP_OK) return st;
    swap_and_free(dst, nc);
    return GCOMP_OK;
}

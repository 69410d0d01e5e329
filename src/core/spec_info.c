/*
 * spec_info.c - what a spec is, told by its stages: gcomp_spec_describe, and the rule
 * that decides whether error feedback may wrap a codec.
 *
 * A transport (the MPI layer, the PyTorch hook) has to decide how messages meet --
 * allreduce of values, allgather, re-compression on an owner -- and whether ranks share a
 * seed.  It used to read codec names and spec strings for that.  Instead each stage states
 * what it is next to its code: the codec (its info.flags, `traits`, `count` and an
 * optional `describe` for parameter-dependent facts: randomk's unbiased=, powersgd's
 * iters=), the value coder (`type`, `bits`, `traits`, optional `describe`: int8's
 * rounding=, qsgd's levels=, ternary's clip=) and the feedback (`traits`).  This file only
 * combines them; no codec name appears here.
 *
 * The combination rules:
 *   UNBIASED       the selection's and the value coding's (both must be);
 *   PRIVATE_DRAWS  the selection's or the value coding's;
 *   LINEAR         positions alike on every rank (codec flag GCOMP_CODEC_LINEAR) and
 *                  values that travel as plain floats, and not multi-phase;
 *   QUANTIZER      dense, single-phase, values not plain floats;
 *   CONTRACTION    gcomp__ef_refusal accepts feedback at the size the codec hands its
 *                  value coder -- the very function gcomp_compressor_create calls, so the
 *                  flag and the refusal cannot disagree.
 * Sizing: the count of values a codec hands its value coder (max_values) is set by the
 * codec's init from n; to know it without duplicating every codec's rule, describe builds
 * the compressor as gcomp_spec_bytes_estimate does (feedback none: no n-sized state) and
 * reads it.  Rejected: a second per-codec "max values" function (the same rule written
 * twice, and they would drift); building with the spec's own feedback (two n-float buffers
 * per call for ef).
 */
#include "core/internal.h"

#include <stdint.h>
#include <stdio.h>

static gcomp__desc codec_desc(const gcomp__spec *s) {
    gcomp__desc d = {s->codec->traits, 0, 0};
    if (s->codec->describe) s->codec->describe(s, &d);
    return d;
}

static gcomp__desc values_desc(const gcomp__spec *s, const gcomp__vparams *vp) {
    gcomp__desc d = {0, 0, 0};
    if (!s->vcoder) return d;
    d.traits = s->vcoder->traits;
    d.bits = s->vcoder->bits;
    if (s->vcoder->describe) s->vcoder->describe(vp, &d);
    return d;
}

/*
 * Error feedback (e += g; c = C(e); e -= decode(c)) converges only when the codec is a
 * contraction, E|C(x) - x|^2 < |x|^2 (Stich et al. 2018, Karimireddy et al. 2019): the
 * residual then keeps less than it was given.  A random quantizer whose error can exceed
 * its input (QSGD at few levels for its bucket, ternary) lets the residual grow instead:
 * by hand on Gaussian gradients of 4096 values, |e|^2 reached 1.3e6 |g|^2 after 30 steps
 * with qsgd:levels=4 and 1.9e18 after 700 with levels=8 (the MPI layer's 4-rank MLP with
 * levels=4: NaN at step 18); ternary levels off near 70 |g|^2, eight gradients' worth of
 * stale update, with no guarantee.  The value coder states a bound over every input
 * (ef_ratio); a bound of 1 or more refuses the spec at create, deterministically, as do
 * the 1/p-scaled selectors (GCOMP__T_NOT_CONTRACTION, select_random.c).  The bound is the
 * worst case, not an average on some probe: the decision must not depend on the data, and
 * so the same spec is accepted or refused everywhere.  It is taken at the largest number
 * of values the codec can hand the coder (max_values, set by the codec's init).
 */
gcomp_status gcomp__ef_refusal(const gcomp__spec *s, const gcomp__vparams *vp, size_t max_values,
                               const char *feedback, char *msg, size_t cap) {
    const char *name = s->codec->info.name;
    if (codec_desc(s).traits & GCOMP__T_NOT_CONTRACTION) {
        snprintf(msg, cap,
                 "%s: feedback=%s would diverge with an unbiased (1/p-scaled) estimate; use "
                 "feedback=none, or a biased selector (topk, randomk without unbiased=1) with "
                 "feedback",
                 name, feedback);
        return GCOMP_E_SPEC;
    }
    const gcomp__vcoder *vc = s->vcoder;
    if (!vc || !vc->ef_ratio) return GCOMP_OK;
    char fix[160];
    fix[0] = 0;
    double r = vc->ef_ratio(vp, max_values, fix, sizeof fix);
    if (r < 1.0) return GCOMP_OK;
    snprintf(msg, cap,
             "%s: feedback=%s needs a contraction, error below |x|^2, or the residual can grow "
             "without bound; values=%s errs by up to %.3g|x|^2: use feedback=none (%s is "
             "unbiased)%s%s",
             name, feedback, vc->name, r, vc->name, fix[0] ? ", or " : "", fix);
    return GCOMP_E_SPEC;
}

gcomp_status gcomp_spec_describe(const char *spec, size_t n, gcomp_spec_info *out,
                                 gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "spec_describe: out must not be NULL");
    memset(out, 0, sizeof *out);
    if (!spec) return gcomp__fail(err, GCOMP_E_ARG, "spec_describe: spec must not be NULL");
    gcomp__spec s;
    gcomp_status st = gcomp__spec_parse(spec, &s, err);
    if (st != GCOMP_OK) return st;
    const gcomp__codec *codec = s.codec;
    const unsigned cflags = codec->info.flags;
    gcomp__vparams vp = {&s, (uint64_t)gcomp__spec_num(&s, "seed", 0)};

    /* The values the codec hands its coder at most, and how many elements it sends. */
    size_t max_values = SIZE_MAX;
    double density = gcomp__spec_num(&s, "density", 1.0);
    if (n > UINT32_MAX)
        return gcomp__fail(err, GCOMP_E_LIMIT, "tensor of %zu elements: at most 2^32-1", n);
    if (n > 0 && (cflags & GCOMP_CODEC_NEEDS_SHAPE)) {
        max_values = n; /* the worst case over the shapes of n elements */
    } else if (n > 0) {
        gcomp__spec bare = s;
        bare.feedback = &gcomp__feedback_none;
        gcomp_compressor *c;
        if ((st = gcomp__compressor_build(&c, &bare, n, 0, 0, err)) != GCOMP_OK) {
            memset(out, 0, sizeof *out);
            return st;
        }
        max_values = c->max_values;
        if (codec->count == GCOMP__COUNT_FIXED) density = (double)max_values / (double)n;
        gcomp_compressor_free(c);
    }
    if (codec->count == GCOMP__COUNT_ALL || codec->count == GCOMP__COUNT_DATA) density = 1.0;

    gcomp__desc cd = codec_desc(&s), vd = values_desc(&s, &vp);
    unsigned f = 0;
    f |= (cflags & GCOMP_CODEC_SPARSE) ? GCOMP_SPEC_SPARSE : 0;
    f |= (cflags & GCOMP_CODEC_MULTIPHASE) ? GCOMP_SPEC_MULTIPHASE : 0;
    f |= (cflags & GCOMP_CODEC_NEEDS_SHAPE) ? GCOMP_SPEC_NEEDS_SHAPE : 0;
    f |= cd.traits & (GCOMP_SPEC_SEEDED_POSITIONS | GCOMP_SPEC_SHARED_DRAWS |
                      GCOMP_SPEC_PRIVATE_DRAWS | GCOMP_SPEC_FEEDBACK);
    f |= vd.traits & (GCOMP_SPEC_PRIVATE_DRAWS | GCOMP_SPEC_SATURATING);
    f |= cd.traits & vd.traits & GCOMP_SPEC_UNBIASED;
    f |= s.feedback->traits & (GCOMP_SPEC_FEEDBACK | GCOMP_SPEC_MOMENTUM);
    f |= codec->fixed_feedback ? GCOMP_SPEC_FIXED_FEEDBACK : 0;
    gcomp_value_type vt = s.vcoder ? s.vcoder->type : GCOMP_VALUES_OTHER;
    bool multiphase = (cflags & GCOMP_CODEC_MULTIPHASE) != 0;
    if ((cflags & GCOMP_CODEC_LINEAR) && vt != GCOMP_VALUES_OTHER && !multiphase)
        f |= GCOMP_SPEC_LINEAR;
    if (!(cflags & GCOMP_CODEC_SPARSE) && !multiphase && vt == GCOMP_VALUES_OTHER)
        f |= GCOMP_SPEC_QUANTIZER;
    char why[256];
    if (gcomp__ef_refusal(&s, &vp, max_values, "ef", why, sizeof why) == GCOMP_OK)
        f |= GCOMP_SPEC_CONTRACTION;

    out->codec = &codec->info;
    out->values = s.vcoder ? s.vcoder->name : "";
    out->feedback = s.feedback->info.name;
    out->flags = f;
    out->value_type = vt;
    out->value_bits = vd.bits;
    out->density = density;
    out->phases = multiphase ? cd.phases : 0;
    out->seed = vp.seed;
    out->fingerprint = s.fingerprint;
    return GCOMP_OK;
}

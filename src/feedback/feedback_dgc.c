/*
 * feedback_dgc.c - Deep Gradient Compression's feedback (Lin, Han, Mao, Wang, Dally,
 * "Deep Gradient Compression", ICLR 2018, Algorithm 1 and section 3), usable with any
 * selector (`topk:...,feedback=dgc`, `block:...,feedback=dgc`), and the `dgc` codec: the
 * paper's method as one spec (`dgc:density=0.001,momentum=0.9,warmup=4`).
 *
 * Per step, with g this step's gradient (docs/DGC.md has the full story):
 *   clipping    g <- g * min(1, clip / ||g||_2)          (clip=, 0: off; section 3.2)
 *   momentum    u <- m*u + g;        v <- v + u          (momentum correction, 3.1)
 *   Nesterov    u <- m*(u + g);      v <- v + u + g      (nesterov=1; as the authors' code)
 *   select      from v (any selector); the codec writes v - decoded into v, so v keeps
 *               exactly what was not sent (0 at sent positions with f32 values; the
 *               rounding error with f16/bf16, like error feedback)
 *   masking     u[sent] <- 0                              (masking=1; section 3.2)
 *   warm-up     density of epoch e < W: s * (density/s)^(e/W), s = warmup_start, or when
 *               that is 0, s = density^(1/(W+1)), the authors' code; with density 0.001 and
 *               W = 4 this is the paper's 25% -> 6.25% -> 1.56% -> 0.4% -> 0.1%.  The
 *               caller advances the epoch with gcomp_compressor_set_epoch; the epoch's
 *               integer part picks the step of the schedule.  warmup_start=1 makes epoch 0
 *               dense.
 * The caller's optimizer must not apply its own momentum to this tensor: u is the momentum.
 *
 * A step in which every element was sent (a dense codec, or density 1 during a dense
 * warm-up) is not masked: there is no delayed coordinate whose momentum could be stale,
 * and masking everything would silently turn momentum SGD into plain SGD.  Codecs that
 * replace the whole pipeline (low rank) send an approximation of every element and are
 * treated the same way.
 *
 * Like error feedback, the new u and v are built in workspaces and swapped in by commit,
 * so a failed encode (NaN gradient, small buffer) leaves the state exactly as it was; the
 * one pass that builds them also finds NaN/Inf.  Without clipping the gradient is read
 * once here; with clipping twice (its norm first).
 *
 * Rejected: updating u and v in place and undoing on failure (m*u + g cannot be inverted
 * exactly in floats); zeroing v at the sent positions as the reference code does (with a
 * lossy value coder that throws the rounding error away; with f32 it is the same thing);
 * masking on dense steps (see above).
 */
#include "core/internal.h"
#include "select/collect.h"

#include <float.h>
#include <math.h>

typedef struct dgc_state {
    float *u, *v;   /* momentum and accumulated velocity: the state */
    float *uw, *vw; /* this step's, swapped in on commit */
    float m;
    bool nesterov, masking, scheduled;
    double clip;
    double target, start; /* density= and the warm-up's first density */
    double warmup;        /* epochs (may be fractional) */
    unsigned stages;      /* steps of the schedule */
} dgc_state;

static bool spec_has(const gcomp__spec *s, const char *name) {
    for (size_t i = 0; i < s->count; i++)
        if (!strcmp(s->items[i].p->name, name)) return true;
    return false;
}

/* The warm-up schedule: density of the step at `epoch`.  The warm-up of W epochs is cut
 * into K equal stages (K = warmup_stages, or one per epoch: ceil(W)); stage j has density
 * s * (density/s)^(j/K).  With W = K = 4 that is the paper's per-epoch schedule; a short
 * run can keep the paper's proportions (4 of ~100 epochs) with e.g. warmup=0.125. */
static double schedule(const dgc_state *s, double epoch) {
    if (!s->scheduled || epoch >= s->warmup) return s->target;
    double j = floor(epoch / s->warmup * (double)s->stages);
    double d = s->start * pow(s->target / s->start, j / (double)s->stages);
    return d < s->target ? s->target : d > 1.0 ? 1.0 : d;
}

static void dgc_fini(gcomp_compressor *c) {
    dgc_state *s = c->fb_state;
    if (!s) return;
    gcomp__free(s->u);
    gcomp__free(s->v);
    gcomp__free(s->uw);
    gcomp__free(s->vw);
    gcomp__free(s);
    c->fb_state = NULL;
}

static gcomp_status dgc_init(gcomp_compressor *c) {
    dgc_state *s = gcomp__calloc(sizeof *s);
    if (!s) return GCOMP_E_NOMEM;
    c->fb_state = s;
    size_t bytes = c->n * sizeof(float);
    s->u = gcomp__calloc(bytes);
    s->v = gcomp__calloc(bytes);
    s->uw = gcomp__alloc(bytes);
    s->vw = gcomp__alloc(bytes);
    if (!s->u || !s->v || !s->uw || !s->vw) {
        dgc_fini(c);
        return GCOMP_E_NOMEM;
    }
    const gcomp__spec *sp = &c->spec;
    s->m = (float)gcomp__spec_num(sp, "momentum", 0.9);
    s->nesterov = gcomp__spec_num(sp, "nesterov", 0) != 0;
    s->masking = gcomp__spec_num(sp, "masking", 1) != 0;
    s->clip = gcomp__spec_num(sp, "clip", 0);
    s->warmup = gcomp__spec_num(sp, "warmup", 0);
    s->stages = (unsigned)gcomp__spec_num(sp, "warmup_stages", 0);
    if (s->stages == 0) s->stages = s->warmup > 1 ? (unsigned)ceil(s->warmup) : 1;
    /* The schedule acts on selectors whose count comes from density=; others (threshold,
     * dense) have nothing to ramp. */
    if (s->warmup > 0 && spec_has(sp, "density")) {
        s->target = gcomp__spec_num(sp, "density", 1.0);
        double st = gcomp__spec_num(sp, "warmup_start", 0);
        s->start = st > 0 ? st : pow(s->target, 1.0 / (double)(s->stages + 1));
        s->scheduled = s->start > s->target;
    }
    /* The codec's init runs next and sizes its bound from the largest density used. */
    c->density_override = s->scheduled ? schedule(s, 0.0) : 0.0;
    return GCOMP_OK;
}

/* The pass's inputs: this step's gradient, scaled by sc (clipping), and the state. */
typedef struct dgc_pass {
    const float *g, *u, *v;
    float *uw, *vw;
    float sc, m;
    bool nesterov;
} dgc_pass;

/* DGC's momentum correction (Lin et al. 2018, section 3.1, equation 5 and Algorithm 1):
 *     u <- m*u + g          v <- v + u
 * or, with Nesterov momentum (the authors' code):
 *     u <- m*(u + g)        v <- v + u + g
 * One element; every other form of this arithmetic below does the same operations in
 * the same order, so the sample, the SIMD pass and the tail agree to the bit. */
static inline float dgc_step(const dgc_pass *p, size_t i, float *uo) {
    float gi = p->g[i] * p->sc;
    if (p->nesterov) {
        float ui = p->m * (p->u[i] + gi);
        *uo = ui;
        return p->v[i] + ui + gi;
    }
    float ui = p->m * p->u[i] + gi;
    *uo = ui;
    return p->v[i] + ui;
}

/* The sample gcomp__topk_plan_make asks for: v at a few positions, nothing written.  The
 * positions are far apart (three cache misses each), so fetch a few dozen ahead. */
static void dgc_sample(const void *ctx, const uint32_t *pos, size_t count, float *out) {
    const dgc_pass *p = ctx;
    const size_t ahead = 64;
    float u;
    for (size_t j = 0; j < count; j++) {
        if (j + ahead < count) {
            size_t q = pos[j + ahead];
            __builtin_prefetch(p->g + q);
            __builtin_prefetch(p->u + q);
            __builtin_prefetch(p->v + q);
        }
        out[j] = dgc_step(p, pos[j], &u);
    }
}

#if defined(__AVX512F__)
/* Sixteen elements of dgc_step, written to uw and vw, candidates appended.  A vector with
 * candidates is stored through the cache: the selection will write the residual and the
 * mask into some of those lines moments later. */
static inline __attribute__((always_inline)) size_t
dgc_step16(const dgc_pass *p, size_t i, __m512 sc, __m512 mm, __m512 t, bool nesterov, bool nt,
           const gcomp__topk_plan *pl, size_t m, __m512i *vmx) {
    __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(p->g + i), sc), ui, vi;
    if (nesterov) {
        ui = _mm512_mul_ps(mm, _mm512_add_ps(_mm512_loadu_ps(p->u + i), gi));
        vi = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(p->v + i), ui), gi);
    } else {
        ui = _mm512_add_ps(_mm512_mul_ps(mm, _mm512_loadu_ps(p->u + i)), gi);
        vi = _mm512_add_ps(_mm512_loadu_ps(p->v + i), ui);
    }
    __mmask16 k = gcomp__hits16(vi, t, vmx);
    if (__builtin_expect(k != 0, 0)) {
        _mm512_storeu_ps(p->uw + i, ui);
        _mm512_storeu_ps(p->vw + i, vi);
        return gcomp__append16(k, vi, i, pl->idx, pl->val, m, pl->cap);
    }
    gcomp__store16(p->uw + i, ui, nt);
    gcomp__store16(p->vw + i, vi, nt);
    return m;
}

static size_t dgc_pass16(const dgc_pass *p, size_t n, const gcomp__topk_plan *pl, float t,
                         bool nesterov, bool nt, size_t *done, uint32_t *maxbits) {
    const __m512 tv = _mm512_set1_ps(t), sc = _mm512_set1_ps(p->sc), mm = _mm512_set1_ps(p->m);
    __m512i vmx = _mm512_setzero_si512();
    size_t m = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        m = dgc_step16(p, i, sc, mm, tv, nesterov, nt, pl, m, &vmx);
        m = dgc_step16(p, i + 16, sc, mm, tv, nesterov, nt, pl, m, &vmx);
    }
    for (; i + 16 <= n; i += 16) m = dgc_step16(p, i, sc, mm, tv, nesterov, nt, pl, m, &vmx);
    if (nt) _mm_sfence();
    *done = i;
    *maxbits = (uint32_t)_mm512_reduce_max_epu32(vmx);
    return m;
}
#endif

/* The pass: uw, vw from g, u, v (5 streams), the candidates of the plan (select/collect.h),
 * and the largest |v| bits (NaN/Inf in g, or an overflow of u or v, show in v). */
static size_t dgc_pass_run(const dgc_pass *p, size_t n, const gcomp__topk_plan *pl,
                           uint32_t *maxbits) {
    float t = pl->active ? pl->t : INFINITY;
    size_t m = 0, i = 0;
    uint32_t mx = 0;
#if defined(__AVX512F__)
    /* Four instances, so that each loop has its branches folded away. */
    bool nt = n >= GCOMP__STREAM_MIN;
    if (p->nesterov)
        m = nt ? dgc_pass16(p, n, pl, t, true, true, &i, &mx)
               : dgc_pass16(p, n, pl, t, true, false, &i, &mx);
    else
        m = nt ? dgc_pass16(p, n, pl, t, false, true, &i, &mx)
               : dgc_pass16(p, n, pl, t, false, false, &i, &mx);
#endif
    for (; i < n; i++) {
        float vi = dgc_step(p, i, &p->uw[i]);
        p->vw[i] = vi;
        m = gcomp__collect1(vi, i, t, pl->idx, pl->val, m, pl->cap, &mx);
    }
    *maxbits = mx;
    return m;
}

static gcomp_status dgc_prepare(gcomp_compressor *c, const float *g, const float **x, float **res) {
    dgc_state *s = c->fb_state;
    size_t n = c->n;
    float sc = 1.0f;
    if (s->clip > 0) {
        /* Local gradient clipping (DGC 3.2): by the L2 norm, before accumulation. */
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) a[l] += (double)g[i + (size_t)l] * g[i + (size_t)l];
        for (; i < n; i++) a[0] += (double)g[i] * g[i];
        double ss = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        if (!(ss <= DBL_MAX)) return GCOMP_E_NONFINITE;
        double norm = sqrt(ss);
        if (norm > s->clip) sc = (float)(s->clip / norm);
    }
    dgc_pass p = {g, s->u, s->v, s->uw, s->vw, sc, s->m, s->nesterov};
    /* The warm-up's density for this step, kept only if the step succeeds. */
    double was = c->density_override;
    if (s->scheduled) c->density_override = schedule(s, c->epoch);
    /* A top-k codec selects in this same pass (internal.h, gcomp__topk_plan_make). */
    gcomp__topk_plan plan = {0};
    gcomp_status st = GCOMP_OK;
    if (c->codec->topk_k) st = gcomp__topk_plan_make(c, c->codec->topk_k(c), dgc_sample, &p, &plan);
    uint32_t mx = 0;
    size_t m = st == GCOMP_OK ? dgc_pass_run(&p, n, &plan, &mx) : 0;
    if (st == GCOMP_OK && mx >= 0x7f800000u) st = GCOMP_E_NONFINITE;
    if (st != GCOMP_OK) {
        c->density_override = was;
        return st;
    }
    if (plan.active) gcomp__topk_plan_done(c, &plan, s->vw, m);
    *x = s->vw;
    *res = s->vw;
    return GCOMP_OK;
}

/* Momentum factor masking: u <- 0 at every position of the last selection. */
static void mask_sent(gcomp_compressor *c, float *u) {
    const gcomp__selection *sel = &c->last;
    size_t n = c->n;
    for (size_t e = 0; e < sel->k; e++) {
        size_t b = sel->idx[e];
        if (sel->expand == GCOMP__EXPAND_ELEM) {
            u[b] = 0.0f;
        } else if (sel->expand == GCOMP__EXPAND_RUN) {
            size_t start = b * sel->unit, end = start + sel->unit < n ? start + sel->unit : n;
            memset(u + start, 0, (end - start) * sizeof(float));
        } else {
            for (size_t r = 0; r < sel->unit; r++) u[b + r * (size_t)sel->stride] = 0.0f;
        }
    }
}

static void dgc_commit(gcomp_compressor *c) {
    dgc_state *s = c->fb_state;
    float *t = s->u;
    s->u = s->uw;
    s->uw = t;
    t = s->v;
    s->v = s->vw;
    s->vw = t;
    /* c->last is the generic pipeline's record of what was sent; a whole-pipeline codec
     * does not write it, and a dense step is not masked (see the top comment). */
    if (s->masking && !c->codec->encode && !c->last_dense && c->last.idx) mask_sent(c, s->u);
}

static size_t dgc_state_size(const gcomp_compressor *c) {
    return 2 * c->n * sizeof(float);
}

static void dgc_state_save(const gcomp_compressor *c, uint8_t *dst) {
    const dgc_state *s = c->fb_state;
    memcpy(dst, s->u, c->n * sizeof(float));
    memcpy(dst + c->n * sizeof(float), s->v, c->n * sizeof(float));
}

static gcomp_status dgc_state_load(gcomp_compressor *c, const uint8_t *src, size_t len) {
    dgc_state *s = c->fb_state;
    if (len != 2 * c->n * sizeof(float)) return GCOMP_E_STATE;
    for (size_t i = 0; i < 2 * c->n; i++)
        if ((gcomp__get32(src + 4 * i) & 0x7f800000u) == 0x7f800000u) return GCOMP_E_STATE;
    memcpy(s->u, src, c->n * sizeof(float));
    memcpy(s->v, src + c->n * sizeof(float), c->n * sizeof(float));
    return GCOMP_OK;
}

static void dgc_state_reset(gcomp_compressor *c) {
    dgc_state *s = c->fb_state;
    memset(s->u, 0, c->n * sizeof(float));
    memset(s->v, 0, c->n * sizeof(float));
}

static const float *dgc_residual(const gcomp_compressor *c) {
    const dgc_state *s = c->fb_state;
    return s->v;
}

/* Retune (retune.c): what the replaced compressor held back joins v, the velocity not yet
 * sent; its momentum u is kept only when it was DGC's too (otherwise the optimizer's own
 * momentum held that role, and u starts at 0). */
static void dgc_absorb(gcomp_compressor *c, const float *held, const gcomp_compressor *from) {
    dgc_state *s = c->fb_state;
    for (size_t i = 0; i < c->n; i++) s->v[i] += held[i];
    /* The momentum u goes on under the same m.  Under another m its tail, m u / (1 - m) of
     * update still owed, is already in `held` (retune.c), and u starts from 0. */
    if (from->spec.feedback == &gcomp__feedback_dgc) {
        const dgc_state *f = from->fb_state;
        if (f->m == s->m || f->m >= 1) memcpy(s->u, f->u, c->n * sizeof(float));
    }
}

static float dgc_momentum(const gcomp_compressor *c, const float **u) {
    const dgc_state *s = c->fb_state;
    if (u) *u = s->u;
    return s->m;
}

static const gcomp_param_info dgc_params[] = {
    {"momentum", GCOMP_PARAM_FLOAT, 0, 1, 0, "0.9", NULL,
     "momentum m of the correction u = m*u + g (the optimizer must then use none)"},
    {"nesterov", GCOMP_PARAM_BOOL, 0, 1, 0, "0", NULL,
     "1: Nesterov form u = m*(u + g), v = v + u + g"},
    {"clip", GCOMP_PARAM_FLOAT, 0, 3.0e38, 0, "0", NULL,
     "local gradient clipping: scale g to L2 norm <= clip before accumulating (0: off; DGC "
     "uses the global threshold times N^-1/2 for N ranks)"},
    {"masking", GCOMP_PARAM_BOOL, 0, 1, 0, "1", NULL,
     "momentum factor masking: zero the momentum of the coordinates just sent"},
    {"warmup", GCOMP_PARAM_FLOAT, 0, 1000, 0, "0", NULL,
     "warm-up epochs (fractional allowed): density ramps down exponentially to density= "
     "(gcomp_compressor_set_epoch)"},
    {"warmup_stages", GCOMP_PARAM_INT, 0, 1000, 0, "0", NULL,
     "steps of the warm-up schedule; 0: one per warm-up epoch (at least 1)"},
    {"warmup_start", GCOMP_PARAM_FLOAT, 0, 1, 0, "0", NULL,
     "density of the first warm-up stage (1: dense); 0: density^(1/(stages+1)), DGC's schedule"},
};

const gcomp__feedback gcomp__feedback_dgc = {
    .info = {"dgc",
             "Deep Gradient Compression's feedback (docs/DGC.md): momentum correction, local "
             "gradient clipping, momentum factor masking, warm-up of the density",
             dgc_params, GCOMP__COUNTOF(dgc_params)},
    .init = dgc_init,
    .fini = dgc_fini,
    .prepare = dgc_prepare,
    .commit = dgc_commit,
    .state_size = dgc_state_size,
    .state_save = dgc_state_save,
    .state_load = dgc_state_load,
    .state_reset = dgc_state_reset,
    .residual = dgc_residual,
    .traits = GCOMP_SPEC_FEEDBACK | GCOMP_SPEC_MOMENTUM,
    .absorb = dgc_absorb,
    .momentum = dgc_momentum,
};

/* ---- the `dgc` codec: exact top-k with the dgc feedback built in ---------------------- */
/*
 * Selection is gcomp__topk: it already estimates the threshold from a sample, as DGC
 * does, and then trims to exactly k, so messages have a fixed size.  The paper's
 * approximate count (within 10% of k) is `sampled:...,feedback=dgc`.
 */

static gcomp_status dgc_codec_init(gcomp_compressor *c, gcomp_error *err) {
    (void)err;
    c->max_entries = c->max_values = gcomp__density_k(c); /* warm-up start, if any */
    return GCOMP_OK;
}

static gcomp_status dgc_select(gcomp_compressor *c, const float *x, gcomp__selection *sel) {
    bool bad;
    gcomp_status st = gcomp__topk(c, x, c->n, gcomp__density_k(c), sel, &bad);
    return st == GCOMP_OK && bad ? GCOMP_E_NONFINITE : st;
}

static const gcomp_param_info dgc_codec_params[] = {
    GCOMP__PARAM_DENSITY("0.001"),
    GCOMP__PARAM_MIN_K,
    GCOMP__PARAM_VALUES,
};

const gcomp__codec gcomp__codec_dgc = {
    .info = {GCOMP__CODEC_NAME_ID(dgc), GCOMP_CODEC_SPARSE,
             "Deep Gradient Compression: top-k of the momentum-corrected accumulation, with "
             "clipping, momentum masking and warm-up (feedback dgc built in)",
             dgc_codec_params, GCOMP__COUNTOF(dgc_codec_params)},
    .select = dgc_select,
    .topk_k = gcomp__density_k,
    .init = dgc_codec_init,
    .fixed_feedback = "dgc",
    .count = GCOMP__COUNT_FIXED,
};

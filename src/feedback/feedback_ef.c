/*
 * feedback_ef.c - no feedback, and error feedback (Seide et al. 2014; Karimireddy et al.
 * 2019 "Error feedback fixes SignSGD"):
 *
 *     x = e + g;   m = C(x);   e = x - decode(m)
 *
 * Nothing a compressor holds back is lost: over any number of steps,
 * sum(decoded messages) + e = sum(gradients) up to float rounding.
 *
 * The new residual is built in a second buffer and swapped in only when the encode
 * succeeded (commit), so a failed call leaves the state exactly as it was.  The sum pass
 * also checks the result is finite, which catches NaN/Inf gradients before anything is
 * sent.
 *
 * prepare has two ways to hand over x = e + g:
 *   formed  one pass here writes x into the workspace w (checking it is finite); the
 *           codec reads x and writes the residual x - decoded back into w.
 *   fused   when the codec sends every element and its value coder can form the sum in
 *           its own pass (vcoder.encode_fused: twobit, MXNet's one-pass kernel), prepare
 *           does no work: x is g, the pending addend c->x_add is e, and the coder writes
 *           the residual into w.  Three streams of n floats instead of five.
 * Either way commit swaps w in.  A stage that wants its sum fused elsewhere (a selector
 * reading e + g as it selects) takes the same road: set c->x_add and let the consumer that
 * knows how add it.
 *
 * When the codec selects by exact top-k (codec->topk_k: topk), the formed pass also
 * selects (gcomp__topk_plan_make, internal.h): a threshold from e + g at a sample of
 * positions before the pass, the candidates above it collected during it, so the selector
 * never reads w again: e and g read, w written, three streams of n floats instead of four
 * (plus a read-for-ownership of w, avoided with non-temporal stores on large vectors).
 * Rejected: letting the selector form e + g through c->x_add, the road above; it would
 * still have to write all of w, the residual of every element not sent, so it saves
 * nothing over selecting here and spreads the residual's bookkeeping over two stages.
 */
#include "core/internal.h"
#include "select/collect.h"

#include <math.h>

typedef struct ef_state {
    float *e;   /* residual: the state */
    float *w;   /* this step's working vector, becomes e on commit */
    bool fused; /* the value coder forms e + g itself (gcomp__fuses_residual) */
} ef_state;

static gcomp_status none_prepare(gcomp_compressor *c, const float *g, const float **x,
                                 float **res) {
    (void)c;
    *x = g;
    *res = NULL;
    return GCOMP_OK;
}

const gcomp__feedback gcomp__feedback_none = {
    .info = {"none", "nothing is remembered: each step sends only its own gradient", NULL, 0},
    .prepare = none_prepare,
};

static gcomp_status ef_init(gcomp_compressor *c) {
    ef_state *s = gcomp__calloc(sizeof *s);
    if (!s) return GCOMP_E_NOMEM;
    s->e = gcomp__calloc(c->n * sizeof(float));
    s->w = gcomp__alloc(c->n * sizeof(float));
    if (!s->e || !s->w) {
        gcomp__free(s->e);
        gcomp__free(s->w);
        gcomp__free(s);
        return GCOMP_E_NOMEM;
    }
    s->fused = gcomp__fuses_residual(&c->spec);
    c->fb_state = s;
    return GCOMP_OK;
}

static void ef_fini(gcomp_compressor *c) {
    ef_state *s = c->fb_state;
    if (!s) return;
    gcomp__free(s->e);
    gcomp__free(s->w);
    gcomp__free(s);
    c->fb_state = NULL;
}

typedef struct ef_pass {
    const float *e, *g;
    float *w;
} ef_pass;

/* The sample gcomp__topk_plan_make asks for: e + g at a few far-apart positions, fetched
 * a few dozen ahead (two cache misses each). */
static void ef_sample(const void *ctx, const uint32_t *pos, size_t count, float *out) {
    const ef_pass *p = ctx;
    const size_t ahead = 64;
    for (size_t j = 0; j < count; j++) {
        if (j + ahead < count) {
            __builtin_prefetch(p->e + pos[j + ahead]);
            __builtin_prefetch(p->g + pos[j + ahead]);
        }
        out[j] = p->e[pos[j]] + p->g[pos[j]];
    }
}

#if defined(__AVX512F__)
/* x = e + g for 16 elements, written to w, candidates appended; a vector with candidates
 * goes through the cache, since the codec writes their residuals moments later. */
static inline __attribute__((always_inline)) size_t ef_step16(const ef_pass *p, size_t i, __m512 t,
                                                              bool nt, const gcomp__topk_plan *pl,
                                                              size_t m, __m512i *vmx) {
    __m512 x = _mm512_add_ps(_mm512_loadu_ps(p->e + i), _mm512_loadu_ps(p->g + i));
    __mmask16 k = gcomp__hits16(x, t, vmx);
    if (__builtin_expect(k != 0, 0)) {
        _mm512_storeu_ps(p->w + i, x);
        return gcomp__append16(k, x, i, pl->idx, pl->val, m, pl->cap);
    }
    gcomp__store16(p->w + i, x, nt);
    return m;
}

static size_t ef_pass16(const ef_pass *p, size_t n, const gcomp__topk_plan *pl, float t, bool nt,
                        size_t *done, uint32_t *maxbits) {
    const __m512 tv = _mm512_set1_ps(t);
    __m512i vmx = _mm512_setzero_si512();
    size_t m = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        m = ef_step16(p, i, tv, nt, pl, m, &vmx);
        m = ef_step16(p, i + 16, tv, nt, pl, m, &vmx);
    }
    for (; i + 16 <= n; i += 16) m = ef_step16(p, i, tv, nt, pl, m, &vmx);
    if (nt) _mm_sfence();
    *done = i;
    *maxbits = (uint32_t)_mm512_reduce_max_epu32(vmx);
    return m;
}
#endif

/* The formed pass: w = e + g (Seide et al. 2014), the plan's candidates, the largest |w|
 * bits (NaN/Inf in g or an overflowing sum show there). */
static size_t ef_pass_run(const ef_pass *p, size_t n, const gcomp__topk_plan *pl,
                          uint32_t *maxbits) {
    float t = pl->active ? pl->t : INFINITY;
    size_t m = 0, i = 0;
    uint32_t mx = 0;
#if defined(__AVX512F__)
    m = n >= GCOMP__STREAM_MIN ? ef_pass16(p, n, pl, t, true, &i, &mx)
                               : ef_pass16(p, n, pl, t, false, &i, &mx);
#endif
    for (; i < n; i++) {
        float x = p->e[i] + p->g[i];
        p->w[i] = x;
        m = gcomp__collect1(x, i, t, pl->idx, pl->val, m, pl->cap, &mx);
    }
    *maxbits = mx;
    return m;
}

static gcomp_status ef_prepare(gcomp_compressor *c, const float *g, const float **x, float **res) {
    ef_state *s = c->fb_state;
    if (s->fused) { /* the coder adds e, and checks that the sum is finite */
        *x = g;
        *res = s->w;
        c->x_add = s->e;
        return GCOMP_OK;
    }
    ef_pass p = {s->e, g, s->w};
    gcomp__topk_plan plan = {0};
    gcomp_status st = GCOMP_OK;
    if (c->codec->topk_k) st = gcomp__topk_plan_make(c, c->codec->topk_k(c), ef_sample, &p, &plan);
    if (st != GCOMP_OK) return st;
    uint32_t mx = 0;
    size_t m = ef_pass_run(&p, c->n, &plan, &mx);
    if (mx >= 0x7f800000u) return GCOMP_E_NONFINITE;
    if (plan.active) gcomp__topk_plan_done(c, &plan, s->w, m);
    *x = s->w;
    *res = s->w;
    return GCOMP_OK;
}

static void ef_commit(gcomp_compressor *c) {
    ef_state *s = c->fb_state;
    float *t = s->e;
    s->e = s->w;
    s->w = t;
}

static size_t ef_state_size(const gcomp_compressor *c) {
    return c->n * sizeof(float);
}

static void ef_state_save(const gcomp_compressor *c, uint8_t *dst) {
    const ef_state *s = c->fb_state;
    memcpy(dst, s->e, c->n * sizeof(float));
}

static gcomp_status ef_state_load(gcomp_compressor *c, const uint8_t *src, size_t len) {
    ef_state *s = c->fb_state;
    if (len != c->n * sizeof(float)) return GCOMP_E_STATE;
    for (size_t i = 0; i < c->n; i++)
        if ((gcomp__get32(src + 4 * i) & 0x7f800000u) == 0x7f800000u) return GCOMP_E_STATE;
    memcpy(s->e, src, len);
    return GCOMP_OK;
}

static void ef_state_reset(gcomp_compressor *c) {
    ef_state *s = c->fb_state;
    memset(s->e, 0, c->n * sizeof(float));
}

static const float *ef_residual(const gcomp_compressor *c) {
    const ef_state *s = c->fb_state;
    return s->e;
}

/* Retune: the replaced compressor's held-back vector becomes this residual (retune.c). */
static void ef_absorb(gcomp_compressor *c, const float *held, const gcomp_compressor *from) {
    ef_state *s = c->fb_state;
    (void)from;
    for (size_t i = 0; i < c->n; i++) s->e[i] += held[i];
}

const gcomp__feedback gcomp__feedback_ef = {
    .info = {"ef",
             "error feedback: the residual of what was not sent is added to the next step's "
             "gradient (e += g; send C(e); e -= decoded)",
             NULL, 0},
    .init = ef_init,
    .fini = ef_fini,
    .prepare = ef_prepare,
    .commit = ef_commit,
    .state_size = ef_state_size,
    .state_save = ef_state_save,
    .state_load = ef_state_load,
    .state_reset = ef_state_reset,
    .residual = ef_residual,
    .traits = GCOMP_SPEC_FEEDBACK,
    .absorb = ef_absorb,
};

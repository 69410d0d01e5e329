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
 */
#include "core/internal.h"

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

static gcomp_status ef_prepare(gcomp_compressor *c, const float *g, const float **x, float **res) {
    ef_state *s = c->fb_state;
    if (s->fused) { /* the coder adds e, and checks that the sum is finite */
        *x = g;
        *res = s->w;
        c->x_add = s->e;
        return GCOMP_OK;
    }
    const float *e = s->e;
    float *w = s->w;
    size_t n = c->n;
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float v = e[i] + g[i];
        uint32_t u;
        w[i] = v;
        memcpy(&u, &v, 4);
        u &= 0x7fffffffu;
        mx = u > mx ? u : mx;
    }
    if (mx >= 0x7f800000u) return GCOMP_E_NONFINITE;
    *x = w;
    *res = w;
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

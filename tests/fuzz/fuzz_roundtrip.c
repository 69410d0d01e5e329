/*
 * fuzz_roundtrip.c - libFuzzer target: a random spec from the registry, random gradients,
 * encode -> decode, checked against what each codec documents.
 *
 * The spec is built through the public registry only: gcomp_codec_at picks the codec, its
 * parameter table (gcomp_codec_info.params) each key's value within the table's range or
 * choices; a `values=` coder that is itself a quantizer codec adds that codec's keys, and
 * gcomp_common_params adds feedback= and its keys.  So a codec or key added to the
 * registry is fuzzed without touching this file.  The data (fuzz_common.h) mixes zeros of
 * both signs, denormals, ties, huge values up to FLT_MAX and arbitrary finite bit patterns.
 *
 * Each step (1 or 2, with set_epoch for DGC's warm-up), the properties:
 *   - encode is GCOMP_OK, or GCOMP_E_NONFINITE only where a sum or a 1/p scaling can leave
 *     float (values or state above 1e6, or an extreme parameter) -- then the state blob is
 *     byte-identical to before the call;
 *   - the message fits gcomp_encode_bound, inspect agrees, the stateless and the
 *     compressor's decode give the same finite tensor d;
 *   - error feedback (feedback=ef, the twobit codec, PowerSGD's own) conserves the gradient:
 *     d + e_after = e_before + g, to float rounding;
 *   - without feedback, the codec's documented bound (x = g):
 *       f32 values        topk: exactly the k largest |x| (ties by index), threshold: every
 *                         |x| >= t, sampled/block/rows/cols: whole units, every one sent at
 *                         least as large as every one held back; random-k: at most k
 *                         values, each x (or x * n/k unbiased); bernoulli/importance: each x
 *                         scaled up by 1/p
 *       dense coders      f16: |d - x| <= 2^-11 |x| (saturating at 65504), bf16: 2^-8 |x|,
 *                         int8/int4: scale/2 (nearest) or scale (stochastic) per bucket
 *                         (+ qmax * 2^-150 where the scale is a subnormal float),
 *                         sign: +-s_b with x's sign (s_b mean |x| or L2/sqrt(n)),
 *                         ternary: 0 or +-max|x| of the bucket, qsgd: one level, |x|_2 / s
 *                         (+ s * 2^-150 where that level is a subnormal float);
 *   - PowerSGD: |d|_F <= |x|_F (P^ P^T x is a projection; with values=f16, plus the
 *     rounding of Q's entries below f16's normal range), dense steps carry g exactly;
 *   - the state survives save -> from_state -> save byte for byte, and the restored
 *     compressor's next message is byte-identical to the original's.
 */
#include "fuzz_alloc.h"
#include "fuzz_common.h"
#include "gradcomp.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_N 512 /* and 1 in 64 inputs up to 24576 */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "fuzz_roundtrip: %s: ", g_spec);                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)

static char g_spec[1024]; /* the canonical spec of the run, for messages */

/* ---- spec generation ----------------------------------------------------------------- */

typedef struct specbuf {
    char s[1024];
    size_t len;
    char sep;
    int risky; /* a parameter value that can take sums out of float (1/p, thresholds) */
} specbuf;

static void add(specbuf *b, const char *key, const char *val) {
    int w = snprintf(b->s + b->len, sizeof b->s - b->len, "%c%s=%s", b->sep, key, val);
    if (w > 0 && (size_t)w < sizeof b->s - b->len) b->len += (size_t)w;
    b->sep = ',';
}

/* A value for parameter p from its table: mostly small and typical, sometimes the ends. */
static void pick(fz_reader *r, const gcomp_param_info *p, char *out, size_t cap, int *risky) {
    unsigned c = fz_u8(r);
    switch (p->type) {
    case GCOMP_PARAM_BOOL:
        snprintf(out, cap, "%u", c & 1);
        return;
    case GCOMP_PARAM_ENUM: {
        const char *ch = p->choices ? p->choices : "";
        size_t nch = 1;
        for (const char *q = ch; *q; q++) nch += *q == '|';
        size_t k = c % nch;
        const char *s = ch;
        while (k--) s = strchr(s, '|') + 1;
        size_t l = strcspn(s, "|");
        snprintf(out, cap, "%.*s", (int)l, s);
        return;
    }
    case GCOMP_PARAM_INT: {
        double lo = p->min + (p->min_exclusive ? 1 : 0), hi = p->max, v;
        switch (c & 3) {
        case 0:
        case 1:
            v = lo + (double)((c >> 2) % 9); /* small: the values that matter most */
            break;
        case 2:
            v = lo + (double)(fz_u8(r) | fz_u8(r) << 8);
            break;
        default:
            v = (c >> 2) & 1 ? hi : lo + floor((hi - lo) * (double)fz_u32(r) / 4294967295.0);
        }
        if (v > hi) v = hi;
        /* Time: each power iteration is two passes over the matrix per step. */
        if (!strcmp(p->name, "iters") && v > 4) v = 4;
        if (!strcmp(p->name, "rank") && v > 16) v = 16;
        snprintf(out, cap, "%.0f", v);
        return;
    }
    case GCOMP_PARAM_FLOAT: {
        static const double typical[] = {1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0};
        double lo = p->min, hi = p->max, v;
        switch (c & 3) {
        case 0:
        case 1:
            v = typical[(c >> 2) & 7];
            break;
        case 2:
            v = lo + (hi - lo) * (double)fz_u8(r) / 255.0;
            break;
        default:
            v = (c >> 2) & 1 ? hi : lo + (hi - lo) * ldexp(1.0, -(int)(fz_u8(r) % 100));
        }
        if (v < lo || (p->min_exclusive && v <= lo)) v = hi;
        if (v > hi) v = hi;
        if (v < 1e-3 || v > 1e3) *risky = 1;
        snprintf(out, cap, "%.9g", v);
        return;
    }
    }
}

/* Adds a random subset of a parameter table; returns the chosen `values=`, if any. */
static void add_table(fz_reader *r, specbuf *b, const gcomp_param_info *t, size_t n, char *values,
                      char *feedback) {
    for (size_t i = 0; i < n; i++) {
        unsigned use = fz_u8(r);
        if (!(use & 1)) continue; /* default */
        char v[64];
        pick(r, &t[i], v, sizeof v, &b->risky);
        add(b, t[i].name, v);
        if (values && !strcmp(t[i].name, "values")) snprintf(values, 64, "%s", v);
        if (feedback && !strcmp(t[i].name, "feedback")) snprintf(feedback, 64, "%s", v);
    }
}

/* Value of `key` in a canonical spec ("name:k=v,k=v,..."); dflt when absent.  The last
 * occurrence wins (the canonical form lists each key once). */
static double canon_num(const char *canon, const char *key, double dflt) {
    size_t kl = strlen(key);
    const char *p = strchr(canon, ':');
    double v = dflt;
    while (p && *p) {
        p++;
        if (!strncmp(p, key, kl) && p[kl] == '=') v = atof(p + kl + 1);
        p = strchr(p, ',');
    }
    return v;
}
static int canon_is(const char *canon, const char *key, const char *val) {
    size_t kl = strlen(key), vl = strlen(val);
    const char *p = strchr(canon, ':');
    int hit = 0;
    while (p && *p) {
        p++;
        if (!strncmp(p, key, kl) && p[kl] == '=')
            hit = !strncmp(p + kl + 1, val, vl) && (p[kl + 1 + vl] == ',' || !p[kl + 1 + vl]);
        p = strchr(p, ',');
    }
    return hit;
}

/* ---- the documented bounds ------------------------------------------------------------- */

static size_t bucket_of(const char *canon, size_t nv) {
    double b = canon_num(canon, "bucket", 512);
    return b <= 0 || b >= (double)nv ? (nv ? nv : 1) : (size_t)b;
}

/* A dense value coder's bound on every element (x = g, no feedback). */
static void check_values(const char *vc, const char *canon, const float *x, const float *d,
                         size_t n) {
    if (!strcmp(vc, "f32")) {
        for (size_t i = 0; i < n; i++)
            if (d[i] != x[i])
                FAIL("f32 changed x[%zu] = %g into %g", i, (double)x[i], (double)d[i]);
        return;
    }
    if (!strcmp(vc, "f16") || !strcmp(vc, "bf16")) {
        int half = !strcmp(vc, "f16");
        for (size_t i = 0; i < n; i++) {
            double xc = x[i];
            if (half) xc = xc > 65504 ? 65504 : xc < -65504 ? -65504 : xc;
            double tol = half ? fabs(xc) * 0x1p-11 + 0x1p-25 : fabs(xc) * 0x1p-8 + 0x1p-134;
            if (fabs(d[i] - xc) > tol)
                FAIL("%s: x[%zu] = %g decoded as %g", vc, i, (double)x[i], (double)d[i]);
        }
        return;
    }
    if (!strcmp(vc, "twobit")) return; /* fixed error feedback: conservation covers it */
    size_t B = bucket_of(canon, n);
    for (size_t s = 0; s < n; s += B) {
        size_t e = s + B < n ? s + B : n;
        double mn = INFINITY, mx = -INFINITY, sa = 0, s2 = 0, ma = 0;
        for (size_t i = s; i < e; i++) {
            mn = fmin(mn, x[i]);
            mx = fmax(mx, x[i]);
            sa += fabs((double)x[i]);
            s2 += (double)x[i] * x[i];
            ma = fmax(ma, fabs((double)x[i]));
        }
        const double m = (double)(e - s);
        if (!strcmp(vc, "int8") || !strcmp(vc, "int4")) {
            double qmax = !strcmp(vc, "int8") ? 255.0 : 15.0, sc = (mx - mn) / qmax;
            double lim = (canon_is(canon, "rounding", "stochastic") ? 1.0 : 0.5) * sc;
            /* + the scale's own rounding to float, times the code: qmax * 2^-150 absolute
             * where the scale is subnormal (found by this target) */
            for (size_t i = s; i < e; i++) {
                double err = fabs((double)x[i] - d[i]);
                if (err > lim * (1 + 1e-5) + 1e-6 * (fabs(x[i]) + fabs(mn)) + (qmax + 1) * 0x1p-149)
                    FAIL("%s: x[%zu] = %g decoded as %g, bucket scale %g", vc, i, (double)x[i],
                         (double)d[i], sc);
            }
        } else if (!strcmp(vc, "sign")) {
            double want = canon_is(canon, "scale", "l2") ? sqrt(s2 / m) : sa / m;
            for (size_t i = s; i < e; i++) {
                int neg = x[i] < 0; /* zero travels as +s (values_sign.c) */
                double dv = d[i];
                if ((dv < 0) != neg || fabs(fabs(dv) - want) > 1e-5 * want + 1e-44)
                    FAIL("sign: x[%zu] = %g decoded as %g, scale %g", i, (double)x[i], dv, want);
            }
        } else if (!strcmp(vc, "ternary")) {
            /* clip_sigma= since keys got one meaning each; clip= before */
            double clip = canon_num(canon, "clip_sigma", canon_num(canon, "clip", 0)), s0 = -1;
            for (size_t i = s; i < e; i++) {
                double dv = d[i];
                if (dv == 0) continue;
                if ((dv < 0) != (x[i] < 0) || x[i] == 0)
                    FAIL("ternary: x[%zu] = %g decoded as %g", i, (double)x[i], dv);
                if (s0 < 0) s0 = fabs(dv);
                if (fabs(dv) != s0 || (clip == 0 && fabs(fabs(dv) - ma) > 1e-6 * ma) ||
                    fabs(dv) > ma * (1 + 1e-6))
                    FAIL("ternary: x[%zu] = %g decoded as %g, max %g", i, (double)x[i], dv, ma);
            }
        } else if (!strcmp(vc, "qsgd")) {
            double lv = canon_num(canon, "levels", 16), unit = sqrt(s2) / lv;
            for (size_t i = s; i < e; i++) {
                double dv = d[i];
                /* + the rounding of unit = norm / s itself, times the level: s * 2^-150
                 * absolute where the unit is subnormal (found by this target) */
                if (fabs(dv - x[i]) > unit * (1 + 1e-5) + 1e-6 * fabs(x[i]) + lv * 0x1p-149 ||
                    (dv != 0 && (dv < 0) != (x[i] < 0)))
                    FAIL("qsgd: x[%zu] = %g decoded as %g, level %g", i, (double)x[i], dv, unit);
            }
        }
    }
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Whole units (runs of `unit`, or columns of a rows x cols matrix) sent or held back, and
 * every sent unit's norm at least every held-back one's. */
static void check_units(const char *canon, const float *x, const float *d, size_t n, size_t unit,
                        size_t stride) {
    size_t units = stride ? stride : (n + unit - 1) / unit, len = stride ? n / stride : unit;
    int l1 = canon_is(canon, "norm", "l1");
    double min_sent = INFINITY, max_held = 0;
    for (size_t u = 0; u < units; u++) {
        int any = 0, all = 1;
        double norm = 0;
        for (size_t t = 0; t < len; t++) {
            size_t i = stride ? u + t * stride : u * unit + t;
            if (i >= n) break;
            if (d[i] != 0) any = 1;
            if (d[i] != x[i]) all = 0;
            norm += l1 ? fabs((double)x[i]) : (double)x[i] * x[i];
        }
        if (any && !all) FAIL("unit %zu sent in part", u);
        if (!l1) norm = sqrt(norm);
        if (any)
            min_sent = fmin(min_sent, norm);
        else
            max_held = fmax(max_held, norm);
    }
    if (min_sent < INFINITY && max_held > min_sent * (1 + 1e-5) + 1e-30)
        FAIL("a unit of norm %g held back while one of %g was sent", max_held, min_sent);
}

/* The selector's rule with f32 values and no feedback (x = g). */
static void check_selection(const char *codec, const char *canon, const float *x, const float *d,
                            size_t n, size_t rows, size_t cols) {
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) sent += d[i] != 0;
    double density = canon_num(canon, "density", 1), min_k = canon_num(canon, "min_k", 0);
    size_t k = (size_t)fmax(ceil(density * (double)n), min_k); /* min_k: a floor on k */
    if (k > n) k = n;
    if (!strcmp(codec, "topk")) {
        float *a = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) a[i] = fabsf(x[i]);
        qsort(a, n, sizeof(float), cmp_desc);
        float t = k ? a[k - 1] : INFINITY;
        free(a);
        size_t above = 0;
        for (size_t i = 0; i < n; i++) {
            if (d[i] != 0 && d[i] != x[i])
                FAIL("topk: x[%zu] = %g sent as %g", i, (double)x[i], (double)d[i]);
            if (fabsf(x[i]) > t) {
                above++;
                if (d[i] != x[i])
                    FAIL("topk: x[%zu] = %g above the k-th %g not sent", i, (double)x[i],
                         (double)t);
            }
            if (d[i] != 0 && fabsf(x[i]) < t)
                FAIL("topk: x[%zu] = %g below the k-th %g sent", i, (double)x[i], (double)t);
        }
        if (sent > k) FAIL("topk: %zu sent, k = %zu", sent, k);
    } else if (!strcmp(codec, "threshold")) {
        double t = canon_num(canon, "tau", canon_num(canon, "threshold", 0)); /* tau= now */
        for (size_t i = 0; i < n; i++) {
            float want = fabsf(x[i]) >= (float)t ? x[i] : 0.0f;
            if (d[i] != want && !(d[i] == 0 && want == 0))
                FAIL("threshold %g: x[%zu] = %g decoded as %g", t, i, (double)x[i], (double)d[i]);
        }
    } else if (!strcmp(codec, "sampled")) {
        check_units(canon, x, d, n, 1, 0);
    } else if (!strcmp(codec, "block")) {
        check_units(canon, x, d, n, (size_t)canon_num(canon, "block", 64), 0);
    } else if (!strcmp(codec, "rows") && rows) {
        check_units(canon, x, d, n, cols, 0);
    } else if (!strcmp(codec, "cols") && rows) {
        check_units(canon, x, d, n, rows, cols);
    } else if (!strcmp(codec, "randomk")) {
        int unb = canon_num(canon, "unbiased", 0) != 0;
        if (sent > k) FAIL("randomk: %zu sent, k = %zu", sent, k);
        for (size_t i = 0; i < n; i++)
            if (d[i] != 0 &&
                (unb ? (d[i] < 0) != (x[i] < 0) || fabsf(d[i]) < fabsf(x[i]) : d[i] != x[i]))
                FAIL("randomk: x[%zu] = %g decoded as %g", i, (double)x[i], (double)d[i]);
    } else if (!strcmp(codec, "bernoulli") || !strcmp(codec, "importance")) {
        for (size_t i = 0; i < n; i++)
            if (d[i] != 0 && ((d[i] < 0) != (x[i] < 0) || fabsf(d[i]) < fabsf(x[i])))
                FAIL("%s: x[%zu] = %g decoded as %g", codec, i, (double)x[i], (double)d[i]);
    }
}

/* ---- the run ------------------------------------------------------------------------------ */

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static blob save(const gcomp_compressor *c) {
    blob b;
    size_t cap = gcomp_state_bound(c);
    b.p = malloc(cap ? cap : 1);
    if (!b.p || gcomp_state_save(c, b.p, cap, &b.len) != GCOMP_OK) FAIL("state_save failed");
    return b;
}

/* This step's residual (zeros when the spec keeps none). */
static void residual(const gcomp_compressor *c, int lowrank, float *e, size_t n) {
    const float *r = gcomp_compressor_residual(c);
    if (r)
        memcpy(e, r, n * sizeof(float));
    else if (!lowrank || gcomp_lowrank_residual(c, e) != GCOMP_OK)
        memset(e, 0, n * sizeof(float));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc_selftest();
    fz_reader r = {data, size};
    const gcomp_codec_info *ci = gcomp_codec_at(fz_u8(&r) % gcomp_codec_count());
    specbuf b = {{0}, 0, ':', 0};
    b.len = (size_t)snprintf(b.s, sizeof b.s, "%s", ci->name);
    char values[64] = "", feedback[64] = "";
    add_table(&r, &b, ci->params, ci->nparams, values, NULL);
    const gcomp_codec_info *vq = values[0] ? gcomp_codec_find(values) : NULL;
    if (vq && (vq->flags & GCOMP_CODEC_QUANTIZER) && vq != ci)
        add_table(&r, &b, vq->params, vq->nparams, NULL, NULL);
    size_t ncommon = 0;
    const gcomp_param_info *common = gcomp_common_params(&ncommon);
    add_table(&r, &b, common, ncommon, NULL, feedback);

    size_t n = 1 + (fz_u8(&r) | fz_u8(&r) << 8) % MAX_N, rows = 0, cols = 0;
    unsigned shape = fz_u8(&r);
    if ((ci->flags & GCOMP_CODEC_NEEDS_SHAPE) || (shape & 3) == 0) {
        for (rows = 1 + (shape >> 2) % (n < 64 ? n : 64); n % rows; rows--) {
        }
        cols = n / rows;
    }
    unsigned nsteps = 1 + fz_u8(&r) % 2, hb = fz_u8(&r), huge = hb & 3;
    /* One input in 64 takes a tensor above 8192 elements, where top-k leaves its exact
     * small-n path for the sampled threshold and the radix select (select_common.c). */
    if ((hb >> 2) == 63 && !rows) n = 8193 + (size_t)(fz_u8(&r) | fz_u8(&r) << 8) % 16384;

    gcomp_compressor *c = NULL;
    if (gcomp_spec_canonical(b.s, g_spec, sizeof g_spec, NULL, NULL) != GCOMP_OK ||
        gcomp_compressor_create(&c, b.s, n, rows, cols, NULL) != GCOMP_OK)
        return 0; /* a combination the registry refuses (fuzz_spec.c checks refusals) */
    const char *canon = gcomp_compressor_spec(c);
    snprintf(g_spec, sizeof g_spec, "%s (n=%zu %zux%zu)", canon, n, rows, cols);
    const char *vc = values[0] ? values : (ci->flags & GCOMP_CODEC_QUANTIZER) ? ci->name : "f32";
    const int lowrank = (ci->flags & GCOMP_CODEC_MULTIPHASE) != 0;
    const int ef =
        canon_is(canon, "feedback", "ef") || gcomp_compressor_residual(c) != NULL || lowrank;
    const int dgc = canon_is(canon, "feedback", "dgc") || !strcmp(ci->name, "dgc");

    float *g = malloc(n * 4), *d = malloc(n * 4), *d2 = malloc(n * 4), *e0 = malloc(n * 4),
          *e1 = malloc(n * 4);
    size_t cap = gcomp_encode_bound(c), len = 0;
    uint8_t *m = malloc(cap), *m2 = malloc(cap);
    for (unsigned step = 0; step < nsteps; step++) {
        fz_fill(&r, g, n, huge);
        gcomp_compressor_set_epoch(c, (double)(fz_u8(&r) % 8) * 0.5);
        residual(c, lowrank, e0, n);
        blob before = save(c);
        gcomp_status st = gcomp_encode(c, g, m, cap, &len);
        if (st == GCOMP_E_NONFINITE) {
            int allowed = fz_maxabs(g, n) > 1e6f || fz_maxabs(e0, n) > 1e6f || b.risky || dgc;
            if (!allowed) FAIL("step %u: NONFINITE for moderate finite input", step);
            blob after = save(c);
            if (after.len != before.len || memcmp(after.p, before.p, before.len))
                FAIL("step %u: refused encode changed the state", step);
            free(after.p);
            free(before.p);
            break;
        }
        free(before.p);
        if (st != GCOMP_OK) FAIL("step %u: encode: %s", step, gcomp_status_str(st));
        if (len > cap) FAIL("message of %zu bytes above the bound %zu", len, cap);
        gcomp_message_info info;
        if (gcomp_message_inspect(m, len, &info) != GCOMP_OK || info.n != n ||
            info.codec_id != ci->id)
            FAIL("inspect disagrees");
        memset(d, 0, n * 4);
        memset(d2, 0, n * 4);
        if ((st = gcomp_decode_add(m, len, d, n, 1.0f)) != GCOMP_OK)
            FAIL("step %u: decode of our own message: %s", step, gcomp_status_str(st));
        if (gcomp_compressor_decode_add(c, m, len, d2, 1.0f) != GCOMP_OK || memcmp(d, d2, n * 4))
            FAIL("compressor decode differs from stateless decode");
        for (size_t i = 0; i < n; i++)
            if (!isfinite(d[i])) FAIL("step %u: decoded d[%zu] = %g", step, i, (double)d[i]);
        residual(c, lowrank, e1, n);

        if (ef && !dgc) {
            /* d + e_after = x = e_before + g (feedback_ef.c, values_twobit.c, powersgd.c) */
            double xm = 0, dm = 0;
            for (size_t i = 0; i < n; i++) {
                xm = fmax(xm, fabs((double)(e0[i] + g[i])));
                dm = fmax(dm, fabs((double)d[i]));
            }
            for (size_t i = 0; i < n; i++) {
                float x = e0[i] + g[i];
                double tol = lowrank ? 1e-4 * (xm + dm) + 1e-30
                                     : 0x1p-22 * (fabs((double)x) + fabs((double)d[i])) + 1e-44;
                if (fabs((double)d[i] + (double)e1[i] - (double)x) > tol)
                    FAIL("step %u: d + e_after != e_before + g at %zu: %g + %g vs %g", step, i,
                         (double)d[i], (double)e1[i], (double)x);
            }
        } else if (!dgc && !lowrank) {
            if (!(ci->flags & GCOMP_CODEC_SPARSE))
                check_values(vc, canon, g, d, n);
            else if (!strcmp(vc, "f32"))
                check_selection(ci->name, canon, g, d, n, rows, cols);
        }
        if (lowrank) {
            double nd = 0, nx = 0;
            for (size_t i = 0; i < n; i++) {
                double x = (double)e0[i] + g[i];
                nd += (double)d[i] * d[i];
                nx += x * x;
            }
            /* values=f16 rounds the factors: Q's entries (|x|-sized) below f16's normal
             * range keep an absolute error of 2^-25 each, so d = P Q^T is off by up to
             * |E|_F <= sqrt(cols r) 2^-25 (P's columns are orthonormal). */
            double rank = 0, slack = 1e-30;
            if (canon_is(canon, "values", "f16") &&
                gcomp_spec_get_number(canon, "rank", &rank, NULL) == GCOMP_OK)
                slack += sqrt((double)(rows + cols) * rank) * 0x1p-25;
            if (sqrt(nd) > sqrt(nx) * (1 + 1e-2) + slack)
                FAIL("powersgd: |d| = %g above |x| = %g", sqrt(nd), sqrt(nx));
        }
    }

    /* Restart from a checkpoint: the same bytes, then the same next message. */
    blob s1 = save(c);
    gcomp_compressor *c2 = NULL;
    gcomp_status st = gcomp_compressor_from_state(&c2, s1.p, s1.len, NULL);
    if (st != GCOMP_OK) FAIL("from_state of our own state: %s", gcomp_status_str(st));
    blob s2 = save(c2);
    if (s1.len != s2.len || memcmp(s1.p, s2.p, s1.len)) FAIL("state changed through from_state");
    fz_fill(&r, g, n, 0);
    size_t l1 = 0, l2 = 0;
    gcomp_status a = gcomp_encode(c, g, m, cap, &l1), z = gcomp_encode(c2, g, m2, cap, &l2);
    if (a != z || (a == GCOMP_OK && (l1 != l2 || memcmp(m, m2, l1))))
        FAIL("restored compressor's message differs (%s / %s)", gcomp_status_str(a),
             gcomp_status_str(z));
    free(s1.p);
    free(s2.p);
    gcomp_compressor_free(c2);
    gcomp_compressor_free(c);
    free(g);
    free(d);
    free(d2);
    free(e0);
    free(e1);
    free(m);
    free(m2);
    return 0;
}

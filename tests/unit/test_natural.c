/*
 * test_natural.c - natural compression (src/values/values_natural.c), against its
 * definition (Horvath et al. 2019): with a = 2^floor(log2|x|), C(x) is sign(x) a or
 * sign(x) 2a with the probabilities that make E[C(x)] = x.
 *   - every decoded value is one of the two powers of two around x, with x's sign (0 or
 *     2^-126 for a subnormal), so |C(x) - x| <= |x|; 2^127 and up are sent as 2^127;
 *   - unbiased: the mean over T seeds converges to x at the rate of each value's exact
 *     variance a^2 p (1 - p) / T;
 *   - the error bound E|C(x) - x|^2 <= |x|^2 / 8, reached at p = 1/3;
 *   - the SIMD and the portable kernels give the same bytes and residuals, and the
 *     residual is x - decoded exactly, at sizes around the 16-value step;
 *   - exact length, the wire's invalid patterns refused with an untouched accumulator;
 *   - usable alone and as `values=` of every selector, with feedback.
 */
#include "check.h"
#include "gradcomp.h"
#include "core/internal.h"
#include "values/values_quant.h"

#include <float.h>
#include <stdint.h>

static gcomp__spec spec;
static gcomp__vparams vp;
static const gcomp__vcoder *vc;

static size_t enc(const float *x, size_t n, float *res, uint64_t key, uint8_t *m, size_t cap,
                  gcomp_status *st) {
    size_t len = 0;
    *st = vc->encode(&vp, x, n, res, key, m, cap, &len);
    return len;
}

/* The powers of two around |x|: lo <= |x| < hi (lo = 0, hi = 2^-126 for a subnormal). */
static void around(float x, double *lo, double *hi) {
    double ax = fabs((double)x);
    if (ax < 0x1p-126) {
        *lo = 0;
        *hi = 0x1p-126;
        return;
    }
    int e;
    frexp(ax, &e); /* ax = f 2^e, f in [0.5, 1) */
    *lo = ldexp(1.0, e - 1);
    *hi = 2 * *lo;
}

/* Values of every kind: Gaussian over many scales, zeros, -0, subnormals, powers of two. */
static void fill(float *x, size_t n, unsigned long long seed) {
    test_fill(x, n, seed);
    for (size_t i = 0; i < n; i++) {
        x[i] *= ldexpf(1.0f, (int)(i % 61) - 30);
        if (i % 23 == 5) x[i] = 0.0f;
        if (i % 29 == 7) x[i] = -0.0f;
        if (i % 31 == 3) x[i] = ldexpf(1.0f, (int)(i % 40) - 20); /* exact power */
        if (i % 37 == 11) x[i] = (i & 1 ? -1.0f : 1.0f) * 1e-40f; /* subnormal */
    }
}

static void test_values_and_kernels(void) {
    static const size_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 100, 1000, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k], cap = vc->bound(&vp, n);
        CHECK(cap == n + (n + 7) / 8); /* 9 bits per value */
        float *x = malloc((n + 1) * 4), *r1 = malloc((n + 1) * 4), *r2 = malloc((n + 1) * 4),
              *d = calloc(n + 1, 4);
        uint8_t *m1 = malloc(cap + 1), *m2 = malloc(cap + 1);
        fill(x, n, 40 + n);
        gcomp_status s1, s2;
        gcomp__test_quant_portable(false);
        size_t l1 = enc(x, n, r1, 0x77 + n, m1, cap, &s1);
        gcomp__test_quant_portable(true);
        size_t l2 = enc(x, n, r2, 0x77 + n, m2, cap, &s2);
        gcomp__test_quant_portable(false);
        CHECK(s1 == GCOMP_OK && s2 == GCOMP_OK && l1 == cap && l2 == cap);
        CHECK_MSG(!memcmp(m1, m2, l1), "n=%zu: SIMD and portable bytes differ", n);
        CHECK_MSG(!memcmp(r1, r2, n * 4), "n=%zu: residuals differ", n);
        CHECK_OK(vc->decode(m1, l1, n, d, 1.0f));
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            double lo, hi, ad = fabs((double)d[i]);
            around(x[i], &lo, &hi);
            bad += !(ad == lo || ad == hi);                  /* a neighbouring power */
            bad += d[i] != 0.0f && (d[i] < 0) != (x[i] < 0); /* x's sign */
            bad += fabs((double)x[i] - d[i]) > fabs((double)x[i]) + 0x1p-126; /* |C(x)-x| <= |x| */
            bad += r1[i] != x[i] - d[i]; /* the residual, exactly */
            if (bad && bad < 4) fprintf(stderr, "i=%zu x=%a d=%a\n", i, x[i], d[i]);
        }
        CHECK_MSG(bad == 0, "n=%zu: %d bad values", n, bad);
        /* Decoding with both kernels and a scale gives the same sums. */
        float *a1 = malloc((n + 1) * 4), *a2 = malloc((n + 1) * 4);
        for (size_t i = 0; i < n; i++) a1[i] = a2[i] = (float)i * 0.5f;
        CHECK_OK(vc->decode(m1, l1, n, a1, -0.25f));
        gcomp__test_quant_portable(true);
        CHECK_OK(vc->decode(m1, l1, n, a2, -0.25f));
        gcomp__test_quant_portable(false);
        CHECK(!memcmp(a1, a2, n * 4));
        free(x), free(r1), free(r2), free(d), free(m1), free(m2), free(a1), free(a2);
    }
}

static void test_edges(void) {
    float x[6] = {FLT_MAX, -0x1p127f, 0x1.8p127f, -0.0f, 0x1p-149f, 1.0f};
    uint8_t m[16];
    float r[6], d[6] = {0};
    gcomp_status st;
    size_t len = enc(x, 6, r, 1, m, sizeof m, &st);
    CHECK_OK(st);
    CHECK_OK(vc->decode(m, len, 6, d, 1.0f));
    CHECK(d[0] == 0x1p127f && d[1] == -0x1p127f && d[2] == 0x1p127f); /* no infinity */
    CHECK(d[3] == 0.0f && m[3] == 0 && !(m[6] & (1u << 3)));          /* -0 is +0 */
    CHECK(d[4] == 0.0f || d[4] == 0x1p-126f);
    CHECK(d[5] == 1.0f && r[5] == 0.0f); /* a power of two travels exactly */
    x[2] = NAN;
    CHECK(enc(x, 6, NULL, 1, m, sizeof m, &st) == 0 && st == GCOMP_E_NONFINITE);
    x[2] = -INFINITY;
    enc(x, 6, NULL, 1, m, sizeof m, &st);
    CHECK(st == GCOMP_E_NONFINITE);
    CHECK(enc(x, 6, NULL, 1, m, 6, &st) == 0 && st == GCOMP_E_DST_SIZE);
}

static void test_corrupt(void) {
    size_t n = 37;
    float x[37], acc[37], keep[37];
    fill(x, n, 9);
    x[3] = 0.0f;
    uint8_t m[64];
    gcomp_status st;
    size_t len = enc(x, n, NULL, 5, m, sizeof m, &st);
    CHECK_OK(st);
    for (size_t i = 0; i < n; i++) acc[i] = keep[i] = (float)i;
    uint8_t b[64];
    memcpy(b, m, len);
    b[10] = 255; /* no power of two */
    CHECK(vc->decode(b, len, n, acc, 1.0f) == GCOMP_E_CORRUPT);
    memcpy(b, m, len);
    b[n + 0] |= 1u << 3; /* a negative zero */
    CHECK(vc->decode(b, len, n, acc, 1.0f) == GCOMP_E_CORRUPT);
    memcpy(b, m, len);
    b[len - 1] |= 0x80; /* padding past value 36 */
    CHECK(vc->decode(b, len, n, acc, 1.0f) == GCOMP_E_CORRUPT);
    CHECK(vc->decode(m, len - 1, n, acc, 1.0f) == GCOMP_E_CORRUPT);
    CHECK(vc->decode(m, len + 1, n, acc, 1.0f) == GCOMP_E_CORRUPT);
    CHECK(!memcmp(acc, keep, sizeof acc));
    CHECK_OK(vc->decode(m, len, n, NULL, 0.0f));
    /* The same checks with a 255 and a negative zero where the SIMD validation runs. */
    float big[200];
    fill(big, 200, 3);
    big[150] = 0.0f;
    uint8_t mb[256];
    len = enc(big, 200, NULL, 5, mb, sizeof mb, &st);
    mb[130] = 255;
    CHECK(vc->decode(mb, len, 200, NULL, 0.0f) == GCOMP_E_CORRUPT);
    mb[130] = 100;
    mb[200 + 150 / 8] |= 1u << (150 % 8);
    CHECK(vc->decode(mb, len, 200, NULL, 0.0f) == GCOMP_E_CORRUPT);
}

/* E[C(x)] = x: the mean of T draws is within 5 standard deviations of x, value by value,
 * each deviation from the value's exact variance a^2 p (1 - p) (p = |x|/a - 1). */
static void test_unbiased(void) {
    enum { N = 256, T = 4000 };
    float x[N], d[N];
    double sum[N] = {0}, sq = 0, xx = 0;
    fill(x, N, 77);
    uint8_t m[N + N / 8];
    gcomp_status st;
    for (int t = 0; t < T; t++) {
        memset(d, 0, sizeof d);
        size_t len = enc(x, N, NULL, gcomp__stream(11, (uint64_t)t, 1), m, sizeof m, &st);
        CHECK_OK(vc->decode(m, len, N, d, 1.0f));
        for (size_t i = 0; i < N; i++) {
            sum[i] += d[i];
            if (fabs((double)x[i]) >= 0x1p-126) {
                sq += ((double)d[i] - x[i]) * ((double)d[i] - x[i]);
                xx += (double)x[i] * x[i];
            }
        }
    }
    int bad = 0;
    for (size_t i = 0; i < N; i++) {
        double lo, hi;
        around(x[i], &lo, &hi);
        double ax = fabs((double)x[i]), p = lo > 0 ? ax / lo - 1 : ax / hi;
        double sd = (lo > 0 ? lo : hi) * sqrt(p * (1 - p) / T);
        double err = fabs(sum[i] / T - x[i]);
        if (err > 5 * sd + 1e-300) {
            bad++;
            fprintf(stderr, "i=%zu x=%g mean=%g sd=%g\n", i, x[i], sum[i] / T, sd);
        }
    }
    CHECK_MSG(bad == 0, "%d of %d values biased", bad, N);
    /* The mean squared error, relative: at most 1/8 (the values here are spread out, so
     * well under it). */
    CHECK_MSG(sq / xx <= 0.125, "E|C(x)-x|^2 / |x|^2 = %g", sq / xx);
}

/* The bound is reached where p = 1/3: x = (4/3) a gives E|C(x)-x|^2 = x^2 / 8. */
static void test_error_bound(void) {
    enum { N = 1024, T = 400 };
    float x[N], d[N];
    for (size_t i = 0; i < N; i++)
        x[i] = (i & 1 ? -1.0f : 1.0f) * ldexpf(4.0f / 3.0f, (int)(i % 50) - 25);
    uint8_t m[N + N / 8];
    double sq = 0, xx = 0;
    gcomp_status st;
    for (int t = 0; t < T; t++) {
        memset(d, 0, sizeof d);
        size_t len = enc(x, N, NULL, gcomp__stream(3, (uint64_t)t, 1), m, sizeof m, &st);
        CHECK_OK(vc->decode(m, len, N, d, 1.0f));
        for (size_t i = 0; i < N; i++) {
            sq += ((double)d[i] - x[i]) * ((double)d[i] - x[i]);
            xx += (double)x[i] * x[i];
        }
    }
    double ratio = sq / xx;
    printf("natural at p = 1/3: E|C(x)-x|^2 / |x|^2 = %.4f (bound 0.125)\n", ratio);
    CHECK_MSG(fabs(ratio - 0.125) < 0.005, "ratio %g", ratio);
    /* ef_ratio states the same bound, so feedback=ef is accepted. */
    CHECK(vc->ef_ratio && vc->ef_ratio(&vp, 1000, NULL, 0) == 0.125);
}

/* Alone and as values= of every selector, with feedback where it can be set: encode,
 * decode, and every decoded value a power of two or zero. */
static void test_every_selector(void) {
    size_t n = 4096;
    float *g = malloc(n * 4), *acc = malloc(n * 4);
    fill(g, n, 5);
    int tried = 0;
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        char s[128];
        int takes_values = 0;
        for (size_t j = 0; j < ci->nparams; j++)
            takes_values |= !strcmp(ci->params[j].name, "values") &&
                            strstr(ci->params[j].choices, "natural") != NULL;
        if (!strcmp(ci->name, "natural"))
            snprintf(s, sizeof s, "natural:feedback=ef");
        else if (takes_values)
            snprintf(s, sizeof s, "%s:values=natural", ci->name);
        else
            continue;
        gcomp_compressor *c = NULL;
        gcomp_error err;
        size_t rows = ci->flags & GCOMP_CODEC_NEEDS_SHAPE ? 64 : 0, cols = rows ? n / 64 : 0;
        gcomp_status st = gcomp_compressor_create(&c, s, n, rows, cols, &err);
        CHECK_MSG(st == GCOMP_OK, "%s: %s", s, err.message);
        if (st != GCOMP_OK) continue;
        size_t cap = gcomp_encode_bound(c), len;
        uint8_t *m = malloc(cap);
        CHECK_OK(gcomp_encode(c, g, m, cap, &len));
        memset(acc, 0, n * 4);
        CHECK_OK(gcomp_decode_add(m, len, acc, n, 1.0f));
        gcomp_message_info info;
        CHECK_OK(gcomp_message_inspect(m, len, &info));
        CHECK_MSG(!strcmp(info.value_coding, "natural"), "%s: %s", s, info.value_coding);
        int bad = 0;
        for (size_t k = 0; k < n; k++) {
            int e;
            double f = frexp(fabs((double)acc[k]), &e);
            bad += acc[k] != 0.0f && f != 0.5;
        }
        CHECK_MSG(bad == 0, "%s: %d values are no power of two", s, bad);
        free(m);
        gcomp_compressor_free(c);
        tried++;
    }
    CHECK(tried >= 12);
    free(g);
    free(acc);
}

int main(void) {
    gcomp_error err;
    CHECK_OK(gcomp__spec_parse("natural", &spec, &err));
    vp.spec = &spec;
    vc = spec.vcoder;
    CHECK(vc && !strcmp(vc->name, "natural"));
    if (!vc) return CHECK_DONE();
    test_values_and_kernels();
    test_edges();
    test_corrupt();
    test_unbiased();
    test_error_bound();
    test_every_selector();
    return CHECK_DONE();
}

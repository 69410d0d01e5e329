/*
 * test_twobit.c - `twobit` against an independent, straightforward implementation of
 * MXNet's 2-bit rule (kvstore gradient compression, type '2bit'):
 *
 *     r += g;  q = +t if r >= t, -t if r <= -t, else 0;  r -= q;
 *     value i -> byte 4*(i/16) + (i%16)/4 of the payload, bits 7-2(i%4) .. 6-2(i%4),
 *     11 = +t, 10 = -t, 00 = 0
 *
 * A fixed sequence of gradients is replayed and every message byte, every decoded value
 * and every residual value is compared exactly, for sizes around the 16-value word, on
 * the SIMD and the portable kernel, through `twobit` and `none:values=twobit,feedback=ef`
 * (both dense: the ef feedback leaves e + g to the coder's fused pass).  The fused pass is
 * then held to the unfused one: at the coder (encode_fused(e, g) against encode(e + g),
 * byte for byte, residual for residual) and through the pipeline (against
 * `topk:density=1,values=twobit`, where the ef stage forms the sum itself).  Also: exact
 * payload size (threshold + ceil(n/16) words), a NaN step that changes nothing, state
 * save/load continuing the same sequence, and a residual large enough for the
 * non-temporal store path.
 */
#include "check.h"
#include "gradcomp.h"
#include "core/internal.h"
#include "values/values_quant.h"

#include <stdint.h>

#define HDR 40
#define SECTION 24

/* The reference: one step on r (updated in place), the expected value bytes and q. */
static void ref_step(float t, float *r, const float *g, size_t n, uint8_t *bytes, float *q) {
    memset(bytes, 0, 4 * ((n + 15) / 16));
    for (size_t i = 0; i < n; i++) {
        r[i] += g[i];
        unsigned code = 0;
        q[i] = 0.0f;
        if (r[i] >= t) {
            code = 3;
            q[i] = t;
        } else if (r[i] <= -t) {
            code = 2;
            q[i] = -t;
        }
        r[i] -= q[i];
        bytes[4 * (i / 16) + (i % 16) / 4] |= (uint8_t)(code << (6 - 2 * (i % 4)));
    }
}

/* Gradients of a replay: small enough that many values wait several steps in r. */
static void grad(float *g, size_t n, int step, float scale) {
    test_fill(g, n, 7000 + (unsigned)step);
    for (size_t i = 0; i < n; i++) g[i] *= scale;
}

static int replay(const char *spec, float t, size_t n, int steps, float scale) {
    gcomp_compressor *c = NULL;
    if (gcomp_compressor_create(&c, spec, n, 0, 0, NULL) != GCOMP_OK) return 1;
    size_t cap = gcomp_encode_bound(c), len, words = (n + 15) / 16;
    uint8_t *m = malloc(cap), *want = malloc(4 * words);
    float *g = malloc(n * 4), *r = calloc(n, 4), *q = malloc(n * 4), *acc = malloc(n * 4);
    int bad = 0;
    for (int s = 0; s < steps && !bad; s++) {
        grad(g, n, s, scale);
        ref_step(t, r, g, n, want, q);
        bad += gcomp_encode(c, g, m, cap, &len) != GCOMP_OK;
        bad += len != HDR + SECTION + 4 + 4 * words;
        bad += gcomp__getf(m + HDR + SECTION) != t;
        bad += memcmp(m + HDR + SECTION + 4, want, 4 * words) != 0;
        const float *e = gcomp_compressor_residual(c);
        bad += e == NULL || memcmp(e, r, n * 4) != 0;
        memset(acc, 0, n * 4);
        bad += gcomp_decode_add(m, len, acc, n, 1.0f) != GCOMP_OK;
        for (size_t i = 0; i < n; i++) bad += acc[i] != q[i];
        if (bad) fprintf(stderr, "%s n=%zu: step %d differs\n", spec, n, s);
    }
    free(m);
    free(want);
    free(g);
    free(r);
    free(q);
    free(acc);
    gcomp_compressor_free(c);
    return bad;
}

static void test_replay(void) {
    static const size_t sizes[] = {1, 2, 15, 16, 17, 31, 32, 33, 100, 257, 1000, 4099};
    for (int simd = 0; simd < 2; simd++) {
        gcomp__test_quant_portable(simd == 0);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            CHECK_MSG(replay("twobit", 0.5f, n, 25, 0.3f) == 0, "twobit n=%zu simd=%d", n, simd);
            CHECK_MSG(replay("twobit:threshold=0.25", 0.25f, n, 25, 0.1f) == 0, "t=0.25 n=%zu", n);
            CHECK_MSG(replay("none:values=twobit,feedback=ef", 0.5f, n, 25, 0.3f) == 0,
                      "generic pipeline n=%zu simd=%d", n, simd);
        }
    }
    gcomp__test_quant_portable(false);
    /* Past 2^21 values the residual is written with non-temporal stores. */
    CHECK(replay("twobit", 0.5f, ((size_t)1 << 21) + 5, 3, 0.3f) == 0);
}

/* Thresholds that are not representable exactly, and gradients landing exactly on t. */
static void test_edges(void) {
    size_t n = 64;
    float g[64];
    for (size_t i = 0; i < n; i++) g[i] = (float)((int)i - 32) * 0.03125f; /* multiples of 1/32 */
    gcomp_compressor *c;
    CHECK_OK(gcomp_compressor_create(&c, "twobit:threshold=0.25", n, 0, 0, NULL));
    uint8_t m[512];
    size_t len;
    CHECK_OK(gcomp_encode(c, g, m, sizeof m, &len));
    float acc[64] = {0};
    CHECK_OK(gcomp_decode_add(m, len, acc, n, 1.0f));
    for (size_t i = 0; i < n; i++) {
        float want = g[i] >= 0.25f ? 0.25f : g[i] <= -0.25f ? -0.25f : 0.0f;
        CHECK(acc[i] == want); /* r == t exactly sends t (>=), as MXNet does */
    }
    gcomp_compressor_free(c);
}

/* The fused residual is the unfused pass, bit for bit: at the coder, on both kernels. */
static void test_fused_coder(void) {
    static const size_t sizes[] = {1, 15, 16, 17, 100, 1000, 4099, ((size_t)1 << 21) + 3};
    const gcomp__vcoder *vc = gcomp__vcoder_find("twobit");
    CHECK(vc && vc->encode_fused);
    if (!vc || !vc->encode_fused) return;
    gcomp__spec spec;
    CHECK_OK(gcomp__spec_parse("none:values=twobit,threshold=0.3", &spec, NULL));
    gcomp__vparams vp = {&spec, 0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k], cap = vc->bound(&vp, n);
        float *e = malloc(n * 4), *g = malloc(n * 4), *x = malloc(n * 4), *r1 = malloc(n * 4),
              *r2 = malloc(n * 4);
        uint8_t *m1 = malloc(cap), *m2 = malloc(cap);
        grad(e, n, 1, 0.2f);
        grad(g, n, 2, 0.2f);
        for (size_t i = 0; i < n; i++) x[i] = e[i] + g[i]; /* as feedback_ef.c forms it */
        for (int simd = 0; simd < 2; simd++) {
            gcomp__test_quant_portable(simd == 0);
            size_t l1 = 0, l2 = 0;
            CHECK_OK(vc->encode(&vp, x, n, r1, 0, m1, cap, &l1));
            CHECK_OK(vc->encode_fused(&vp, e, g, n, r2, 0, m2, cap, &l2));
            CHECK_MSG(l1 == l2 && !memcmp(m1, m2, l1), "n=%zu simd=%d: bytes differ", n, simd);
            CHECK_MSG(!memcmp(r1, r2, n * 4), "n=%zu simd=%d: residuals differ", n, simd);
            /* The residual may be written over e itself. */
            float *ee = malloc(n * 4);
            memcpy(ee, e, n * 4);
            CHECK_OK(vc->encode_fused(&vp, ee, g, n, ee, 0, m2, cap, &l2));
            CHECK(!memcmp(ee, r1, n * 4) && !memcmp(m1, m2, l1));
            free(ee);
            /* A non-finite sum is refused, as the unfused ef stage refuses it. */
            float keep_g = g[n / 2], keep_e = e[n / 2];
            g[n / 2] = NAN;
            CHECK(vc->encode_fused(&vp, e, g, n, r2, 0, m2, cap, &l2) == GCOMP_E_NONFINITE);
            g[n / 2] = 3e38f; /* finite, but e + g overflows */
            e[n / 2] = 3e38f;
            CHECK(vc->encode_fused(&vp, e, g, n, r2, 0, m2, cap, &l2) == GCOMP_E_NONFINITE);
            g[n / 2] = keep_g;
            e[n / 2] = keep_e;
        }
        gcomp__test_quant_portable(false);
        free(e), free(g), free(x), free(r1), free(r2), free(m1), free(m2);
    }
}

/* The fused dense codec against a pipeline whose ef stage forms e + g in a pass of its
 * own (topk keeping every element): the same residual and the same decoded sum every step,
 * and the same value section as the generic dense pipeline. */
static void test_fused_matches_unfused(void) {
    size_t n = 777;
    float g[777], da[777], db[777];
    gcomp_compressor *a, *b, *c;
    CHECK_OK(gcomp_compressor_create(&a, "twobit:threshold=0.4", n, 0, 0, NULL));
    CHECK_OK(gcomp_compressor_create(&b, "topk:density=1,values=twobit,threshold=0.4,feedback=ef",
                                     n, 0, 0, NULL));
    CHECK_OK(
        gcomp_compressor_create(&c, "none:values=twobit,threshold=0.4,feedback=ef", n, 0, 0, NULL));
    uint8_t ma[4096], mb[8192], mc[4096];
    size_t la, lb, lc;
    for (int s = 0; s < 10; s++) {
        grad(g, n, s, 0.2f);
        CHECK_OK(gcomp_encode(a, g, ma, sizeof ma, &la));
        CHECK_OK(gcomp_encode(b, g, mb, sizeof mb, &lb));
        CHECK_OK(gcomp_encode(c, g, mc, sizeof mc, &lc));
        CHECK(!memcmp(gcomp_compressor_residual(a), gcomp_compressor_residual(b), n * 4));
        memset(da, 0, sizeof da);
        memset(db, 0, sizeof db);
        CHECK_OK(gcomp_decode_add(ma, la, da, n, 1.0f));
        CHECK_OK(gcomp_decode_add(mb, lb, db, n, 1.0f));
        CHECK(!memcmp(da, db, sizeof da));
        /* The codec id, fingerprint and CRCs differ; the sections must not. */
        CHECK(la == lc && !memcmp(ma + HDR, mc + HDR, la - HDR));
    }
    gcomp_message_info info;
    CHECK_OK(gcomp_message_inspect(ma, la, &info));
    CHECK(info.codec_id == 19 && !strcmp(info.value_coding, "twobit") && info.elements_sent == n);
    gcomp_stats st;
    gcomp_compressor_stats(a, &st);
    CHECK(st.messages == 10 && st.elements_sent == 10 * n);
    gcomp_compressor_free(a);
    gcomp_compressor_free(b);
    gcomp_compressor_free(c);
}

/* A NaN step fails and changes nothing; a saved state resumes the same sequence. */
static void test_state(void) {
    size_t n = 300;
    float g[300], r[300] = {0}, q[300];
    uint8_t want[80], m[2048];
    size_t len;
    gcomp_compressor *c;
    CHECK_OK(gcomp_compressor_create(&c, "twobit", n, 0, 0, NULL));
    for (int s = 0; s < 5; s++) {
        grad(g, n, s, 0.3f);
        ref_step(0.5f, r, g, n, want, q);
        CHECK_OK(gcomp_encode(c, g, m, sizeof m, &len));
    }
    grad(g, n, 99, 0.3f);
    g[123] = NAN;
    CHECK(gcomp_encode(c, g, m, sizeof m, &len) == GCOMP_E_NONFINITE);
    g[123] = INFINITY;
    CHECK(gcomp_encode(c, g, m, sizeof m, &len) == GCOMP_E_NONFINITE);
    CHECK(!memcmp(gcomp_compressor_residual(c), r, sizeof r));
    CHECK(gcomp_compressor_step(c) == 5);

    size_t sb = gcomp_state_bound(c), sl;
    uint8_t *blob = malloc(sb);
    CHECK_OK(gcomp_state_save(c, blob, sb, &sl));
    gcomp_compressor *d = NULL;
    CHECK_OK(gcomp_compressor_from_state(&d, blob, sl, NULL));
    CHECK(d && !memcmp(gcomp_compressor_residual(d), r, sizeof r));
    for (int s = 5; s < 10 && d; s++) {
        grad(g, n, s, 0.3f);
        ref_step(0.5f, r, g, n, want, q);
        size_t l2;
        uint8_t m2[2048];
        CHECK_OK(gcomp_encode(c, g, m, sizeof m, &len));
        CHECK_OK(gcomp_encode(d, g, m2, sizeof m2, &l2));
        CHECK(len == l2 && !memcmp(m, m2, len));
        CHECK(!memcmp(m + HDR + SECTION + 4, want, 4 * ((n + 15) / 16)));
        CHECK(!memcmp(gcomp_compressor_residual(d), r, sizeof r));
    }
    /* Reset zeroes the residual. */
    gcomp_state_reset(c);
    const float *e = gcomp_compressor_residual(c);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= e[i] == 0.0f;
    CHECK(zero);
    free(blob);
    gcomp_compressor_free(c);
    gcomp_compressor_free(d);
}

/* The spec's feedback is part of the method. */
static void test_spec(void) {
    gcomp_compressor *c = NULL;
    gcomp_error err;
    CHECK(gcomp_compressor_create(&c, "twobit:feedback=none", 10, 0, 0, &err) == GCOMP_E_SPEC);
    CHECK(c == NULL);
    CHECK_OK(gcomp_compressor_create(&c, "twobit:feedback=ef", 10, 0, 0, &err));
    CHECK(!strcmp(gcomp_compressor_spec(c), "twobit:threshold=0.5,feedback=ef,seed=0"));
    gcomp_compressor_free(c);
    size_t bytes;
    CHECK_OK(gcomp_spec_bytes_estimate("twobit", 1000, 0, 0, &bytes, NULL));
    CHECK_EQ_INT(bytes, HDR + SECTION + 4 + 4 * 63);
}

int main(void) {
    test_replay();
    test_edges();
    test_fused_coder();
    test_fused_matches_unfused();
    test_state();
    test_spec();
    return CHECK_DONE();
}

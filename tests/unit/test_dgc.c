/*
 * test_dgc.c - Deep Gradient Compression (feedback=dgc and the dgc codec) against a
 * straightforward reference written from the paper (Lin et al., ICLR 2018, Algorithm 1):
 *   - momentum correction, Nesterov, local clipping, momentum masking: message and state
 *     (u and v, read back through gcomp_state_save) step by step on small vectors;
 *   - the warm-up schedule: the count sent at every epoch, the dense first epoch with
 *     warmup_start=1, and that encode_bound covers the largest density;
 *   - conservation with masking and clipping off (invariant stated below);
 *   - dgc with other selectors (block, sampled, threshold) and with a lossy value coder;
 *   - NaN refused with the state untouched; save/load/from_state; bad specs; failing
 *     allocations.
 */
#include "check.h"
#include "compressor_helpers.h"
#include "gradcomp.h"
#include "core/internal.h"

#include <stdint.h>

/* The decoded message as a dense vector (what was sent). */
static void decoded(const msg *m, float *out, size_t n) {
    memset(out, 0, n * sizeof(float));
    CHECK_OK(gcomp_decode_add(m->p, m->len, out, n, 1.0f));
}

/* u and v from a saved state: 56 fixed bytes, the canonical spec, u32 length, u, v. */
static void read_uv(const gcomp_compressor *c, float *u, float *v) {
    size_t n = gcomp_compressor_size(c), cap = gcomp_state_bound(c), len;
    uint8_t *blob = malloc(cap);
    CHECK_OK(gcomp_state_save(c, blob, cap, &len));
    size_t off = 56 + strlen(gcomp_compressor_spec(c));
    uint32_t fl;
    memcpy(&fl, blob + off, 4);
    CHECK_EQ_INT(fl, 8 * n);
    memcpy(u, blob + off + 4, n * 4);
    memcpy(v, blob + off + 4 + n * 4, n * 4);
    free(blob);
}

/* ---- the reference --------------------------------------------------------------------- */

typedef struct ref {
    size_t n;
    float m, clip;
    int nesterov, masking;
    float *u, *v;
} ref;

static const float *sort_v;
static int by_mag(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = fabsf(sort_v[i]), y = fabsf(sort_v[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* One DGC step with exact top-k of k elements; `sent` receives the sent vector. */
static void ref_step(ref *r, const float *g0, size_t k, float *sent) {
    size_t n = r->n;
    float sc = 1.0f;
    if (r->clip > 0) {
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)g0[i] * g0[i];
        double norm = sqrt(ss);
        if (norm > r->clip) sc = (float)(r->clip / norm);
    }
    for (size_t i = 0; i < n; i++) {
        float g = g0[i] * sc;
        if (r->nesterov) { /* u = m (u + g); v = v + u + g */
            r->u[i] = r->m * (r->u[i] + g);
            r->v[i] = r->v[i] + r->u[i] + g;
        } else { /* u = m u + g; v = v + u */
            r->u[i] = r->m * r->u[i] + g;
            r->v[i] = r->v[i] + r->u[i];
        }
    }
    uint32_t *ord = malloc(n * 4);
    for (size_t i = 0; i < n; i++) ord[i] = (uint32_t)i;
    sort_v = r->v;
    qsort(ord, n, 4, by_mag);
    memset(sent, 0, n * 4);
    for (size_t j = 0; j < k; j++) {
        uint32_t i = ord[j];
        sent[i] = r->v[i];
        r->v[i] = 0.0f;                          /* what was sent leaves v */
        if (r->masking && k < n) r->u[i] = 0.0f; /* momentum factor masking (not on a dense step) */
    }
    free(ord);
}

static int close_enough(float a, float b) {
    return fabsf(a - b) <= 1e-5f * (1.0f + fabsf(a) + fabsf(b));
}

/* Runs `steps` steps of `spec` against the reference and compares message, u and v. */
static void check_against_ref(const char *spec, float m, int nesterov, int masking, float clip,
                              double density, float gscale) {
    const size_t n = 64, steps = 8;
    size_t k = (size_t)ceil(density * (double)n);
    gcomp_compressor *c = make(spec, n);
    if (!c) return;
    ref r = {n, m, clip, nesterov, masking, calloc(n, 4), calloc(n, 4)};
    float *g = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4), *u = malloc(n * 4),
          *v = malloc(n * 4);
    int bad = 0;
    for (size_t t = 0; t < steps; t++) {
        test_fill(g, n, 1000 + t);
        for (size_t i = 0; i < n; i++) g[i] *= gscale;
        ref_step(&r, g, k, want);
        msg mm = encode(c, g);
        decoded(&mm, got, n);
        read_uv(c, u, v);
        for (size_t i = 0; i < n; i++) {
            bad += !close_enough(got[i], want[i]);
            bad += !close_enough(u[i], r.u[i]);
            bad += !close_enough(v[i], r.v[i]);
        }
        const float *res = gcomp_compressor_residual(c);
        CHECK(res && !memcmp(res, v, n * 4)); /* residual() is v */
        free(mm.p);
    }
    CHECK_MSG(bad == 0, "%s: %d mismatches against the reference", spec, bad);
    CHECK_EQ_INT(gcomp_compressor_step(c), steps);
    free(r.u);
    free(r.v);
    free(g);
    free(want);
    free(got);
    free(u);
    free(v);
    gcomp_compressor_free(c);
}

static void test_update_equations(void) {
    /* density 0.1 of 64: k = 7 per step. */
    check_against_ref("dgc:density=0.1", 0.9f, 0, 1, 0, 0.1, 1.0f);
    check_against_ref("topk:density=0.1,feedback=dgc", 0.9f, 0, 1, 0, 0.1, 1.0f);
    check_against_ref("dgc:density=0.1,momentum=0.5,nesterov=1", 0.5f, 1, 1, 0, 0.1, 1.0f);
    check_against_ref("dgc:density=0.1,masking=0", 0.9f, 0, 0, 0, 0.1, 1.0f);
    check_against_ref("dgc:density=0.1,nesterov=1,masking=0", 0.9f, 1, 0, 0, 0.1, 1.0f);
    /* ||g|| of 64 heavy-tailed normals is ~20: clip=3 always clips, clip=1e4 never. */
    check_against_ref("dgc:density=0.1,clip=3", 0.9f, 0, 1, 3.0f, 0.1, 1.0f);
    check_against_ref("dgc:density=0.1,clip=1e4", 0.9f, 0, 1, 1e4f, 0.1, 1.0f);
    check_against_ref("dgc:density=0.1,clip=3,nesterov=1,momentum=0.99", 0.99f, 1, 1, 3.0f, 0.1,
                      0.2f);
    check_against_ref("dgc:density=0.1,momentum=0", 0.0f, 0, 1, 0, 0.1, 1.0f);
    /* Every element each step: momentum SGD exactly, and masking must not zero u. */
    check_against_ref("dgc:density=1", 0.9f, 0, 1, 0, 1.0, 1.0f);
    check_against_ref("none:feedback=dgc", 0.9f, 0, 1, 0, 1.0, 1.0f);
}

/* Spelled-out first steps on a 4-vector, so the equations are visible in the test. */
static void test_by_hand(void) {
    gcomp_compressor *c = make("dgc:density=0.25,momentum=0.5", 4); /* k = 1 */
    if (!c) return;
    float g1[4] = {1, -2, 0.5f, 0}, g2[4] = {1, 1, 1, 1}, out[4], u[4], v[4];
    msg a = encode(c, g1);
    /* u = g1, v = g1; sends v[1] = -2; v[1] = 0, u[1] = 0 (masking). */
    decoded(&a, out, 4);
    CHECK(out[0] == 0 && out[1] == -2 && out[2] == 0 && out[3] == 0);
    read_uv(c, u, v);
    CHECK(u[0] == 1 && u[1] == 0 && u[2] == 0.5f && u[3] == 0);
    CHECK(v[0] == 1 && v[1] == 0 && v[2] == 0.5f && v[3] == 0);
    msg b = encode(c, g2);
    /* u = 0.5 u + g2 = {1.5, 1, 1.25, 1}; v += u = {2.5, 1, 1.75, 1}; sends v[0]. */
    decoded(&b, out, 4);
    CHECK(out[0] == 2.5f && out[1] == 0 && out[2] == 0 && out[3] == 0);
    read_uv(c, u, v);
    CHECK(u[0] == 0 && u[1] == 1 && u[2] == 1.25f && u[3] == 1);
    CHECK(v[0] == 0 && v[1] == 1 && v[2] == 1.75f && v[3] == 1);
    free(a.p);
    free(b.p);
    gcomp_compressor_free(c);

    /* Nesterov: u = m (u + g); v = v + u + g. */
    c = make("dgc:density=0.25,momentum=0.5,nesterov=1", 4);
    if (!c) return;
    a = encode(c, g1);
    /* u = 0.5 g1 = {0.5, -1, 0.25, 0}; v = u + g1 = {1.5, -3, 0.75, 0}; sends v[1]. */
    decoded(&a, out, 4);
    CHECK(out[1] == -3 && out[0] == 0);
    read_uv(c, u, v);
    CHECK(u[0] == 0.5f && u[1] == 0 && u[2] == 0.25f && u[3] == 0);
    CHECK(v[0] == 1.5f && v[1] == 0 && v[2] == 0.75f && v[3] == 0);
    free(a.p);
    gcomp_compressor_free(c);

    /* Clipping: ||(3, 4, 0, 0)|| = 5 > clip 1: g becomes (0.6, 0.8, 0, 0). */
    c = make("dgc:density=0.5,momentum=0.9,clip=1", 4);
    if (!c) return;
    float g3[4] = {3, 4, 0, 0};
    a = encode(c, g3);
    decoded(&a, out, 4);
    CHECK(close_enough(out[0], 0.6f) && close_enough(out[1], 0.8f) && out[2] == 0 && out[3] == 0);
    free(a.p);
    gcomp_compressor_free(c);
}

/* ---- warm-up ------------------------------------------------------------------------------ */

static size_t sent_count(const msg *m) {
    gcomp_message_info info;
    CHECK_OK(gcomp_message_inspect(m->p, m->len, &info));
    return (size_t)info.elements_sent;
}

static void test_warmup(void) {
    const size_t n = 100000;
    float *g = malloc(n * 4);
    test_fill(g, n, 5);

    /* DGC's schedule: density^( (e+1) / (W+1) ) for e < W, then density.  With 0.001 and
     * W = 4: 25.1%, 6.3%, 1.58%, 0.40%, 0.1%. */
    gcomp_compressor *c = make("dgc:density=0.001,warmup=4", n);
    if (!c) return;
    size_t cap0 = gcomp_encode_bound(c);
    printf("warm-up dgc:density=0.001,warmup=4 on n=%zu\n  epoch  density    sent\n", n);
    for (int e = 0; e <= 6; e++) {
        CHECK_OK(gcomp_compressor_set_epoch(c, e + 0.5)); /* the integer part counts */
        double d = e < 4 ? pow(0.001, (e + 1) / 5.0) : 0.001;
        size_t want = (size_t)ceil(d * (double)n);
        msg m = encode(c, g);
        CHECK(m.len <= cap0);
        size_t got = sent_count(&m);
        CHECK_MSG(got == want, "epoch %d: sent %zu, want %zu", e, got, want);
        printf("  %5d  %7.4f%%  %6zu\n", e, 100.0 * (double)got / (double)n, got);
        free(m.p);
    }
    CHECK(gcomp_encode_bound(c) == cap0);
    gcomp_compressor_free(c);

    /* The bound covers the warm-up start; without warm-up it is the target's. */
    gcomp_compressor *plain = make("dgc:density=0.001", n);
    if (plain) CHECK(gcomp_encode_bound(plain) < cap0);
    gcomp_compressor_free(plain);

    /* Explicit start: 25% -> (0.25 * (0.004)^(e/4)) -> 0.1%. */
    c = make("topk:density=0.001,feedback=dgc,warmup=4,warmup_start=0.25", n);
    if (!c) return;
    for (int e = 0; e <= 4; e++) {
        CHECK_OK(gcomp_compressor_set_epoch(c, e));
        double d = e < 4 ? 0.25 * pow(0.001 / 0.25, e / 4.0) : 0.001;
        msg m = encode(c, g);
        CHECK_EQ_INT(sent_count(&m), (size_t)ceil(d * (double)n));
        free(m.p);
    }
    gcomp_compressor_free(c);

    /* warmup_start=1: epoch 0 is dense, and the dense step keeps the momentum (u = g after
     * one step, not 0), so the dense phase is plain momentum SGD. */
    c = make("dgc:density=0.01,warmup=2,warmup_start=1", 1000);
    if (!c) return;
    float *u = malloc(1000 * 4), *v = malloc(1000 * 4);
    msg m = encode(c, g);
    CHECK_EQ_INT(sent_count(&m), 1000);
    read_uv(c, u, v);
    CHECK(!memcmp(u, g, 1000 * 4));
    for (size_t i = 0; i < 1000; i++) CHECK(v[i] == 0.0f);
    free(m.p);
    CHECK_OK(gcomp_compressor_set_epoch(c, 1)); /* sqrt(1 * 0.01) = 10% */
    m = encode(c, g);
    CHECK_EQ_INT(sent_count(&m), 100);
    free(m.p);
    CHECK_OK(gcomp_compressor_set_epoch(c, 2));
    m = encode(c, g);
    CHECK_EQ_INT(sent_count(&m), 10);
    free(m.p);
    free(u);
    free(v);
    gcomp_compressor_free(c);

    /* The schedule drives other selectors that count by density (block: K blocks). */
    c = make("block:density=0.01,block=10,feedback=dgc,warmup=1,warmup_start=0.5", 10000);
    if (!c) return;
    m = encode(c, g);
    CHECK_EQ_INT(sent_count(&m), 5000); /* 500 of 1000 blocks */
    free(m.p);
    CHECK_OK(gcomp_compressor_set_epoch(c, 1));
    m = encode(c, g);
    CHECK_EQ_INT(sent_count(&m), 100);
    free(m.p);
    gcomp_compressor_free(c);
    free(g);
}

/* ---- conservation --------------------------------------------------------------------------- */
/*
 * With masking=0 and clip=0 nothing is ever dropped from u or v, so over T steps
 *     sum_t decoded_t + v_T = sum_t u_t                  (u_t = m u_{t-1} + g_t, u_0 = 0)
 *     sum_t decoded_t + v_T = sum_t (u_t + g_t)          (Nesterov: u_t = m (u_{t-1} + g_t))
 * exactly in real arithmetic: v gains u_t (or u_t + g_t) every step and loses only what
 * the message carried (with f16 values the rounding error stays in v).  The test tracks
 * the right-hand side in double and allows float rounding.
 */
static void conservation(const char *spec, int nesterov, float m) {
    const size_t n = 20000, steps = 30;
    gcomp_compressor *c = make(spec, n);
    if (!c) return;
    double *rhs = calloc(n, sizeof(double)), *lhs = calloc(n, sizeof(double));
    double *uref = calloc(n, sizeof(double));
    float *g = malloc(n * 4), *out = malloc(n * 4);
    for (size_t t = 0; t < steps; t++) {
        CHECK_OK(gcomp_compressor_set_epoch(c, (double)t / 10)); /* crosses warm-up if any */
        test_fill(g, n, 77 + t);
        for (size_t i = 0; i < n; i++) {
            if (nesterov) {
                uref[i] = m * (uref[i] + g[i]);
                rhs[i] += uref[i] + g[i];
            } else {
                uref[i] = m * uref[i] + g[i];
                rhs[i] += uref[i];
            }
        }
        msg mm = encode(c, g);
        decoded(&mm, out, n);
        for (size_t i = 0; i < n; i++) lhs[i] += out[i];
        free(mm.p);
    }
    const float *v = gcomp_compressor_residual(c);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(lhs[i] + v[i] - rhs[i]);
        worst = e > worst ? e : worst;
        scale = fabs(rhs[i]) > scale ? fabs(rhs[i]) : scale;
    }
    CHECK_MSG(worst <= 1e-4 * scale, "%s: sum sent + v differs from sum u by %g (scale %g)", spec,
              worst, scale);
    free(rhs);
    free(lhs);
    free(uref);
    free(g);
    free(out);
    gcomp_compressor_free(c);
}

static void test_conservation(void) {
    conservation("dgc:density=0.01,masking=0", 0, 0.9f);
    conservation("dgc:density=0.01,masking=0,nesterov=1", 1, 0.9f);
    conservation("dgc:density=0.001,masking=0,warmup=2", 0, 0.9f);
    conservation("dgc:density=0.01,masking=0,values=f16", 0, 0.9f);
    conservation("dgc:density=0.01,masking=0,values=bf16,momentum=0.5", 0, 0.5f);
    conservation("block:density=0.01,block=16,feedback=dgc,masking=0", 0, 0.9f);
    conservation("sampled:density=0.01,feedback=dgc,masking=0", 0, 0.9f);
    conservation("threshold:tau=30,feedback=dgc,masking=0", 0, 0.9f);
    conservation("none:feedback=dgc", 0, 0.9f);
}

/* Masking with structured selections: u is zero on every sent block / column. */
static void test_masking_structured(void) {
    const size_t rows = 30, cols = 40, n = rows * cols;
    const char *specs[] = {"block:density=0.1,block=7,feedback=dgc",
                           "rows:density=0.1,feedback=dgc", "cols:density=0.1,feedback=dgc",
                           "sampled:density=0.05,feedback=dgc"};
    float *g = malloc(n * 4), *out = malloc(n * 4), *u = malloc(n * 4), *v = malloc(n * 4);
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        gcomp_compressor *c = NULL;
        gcomp_error err;
        CHECK_OK(gcomp_compressor_create(&c, specs[s], n, rows, cols, &err));
        if (!c) continue;
        int bad = 0;
        size_t sent = 0;
        for (int t = 0; t < 4; t++) {
            test_fill(g, n, 300 + (unsigned)t);
            msg m = encode(c, g);
            decoded(&m, out, n);
            read_uv(c, u, v);
            for (size_t i = 0; i < n; i++)
                if (out[i] != 0.0f) {
                    sent++;
                    bad += u[i] != 0.0f || v[i] != 0.0f;
                }
            free(m.p);
        }
        CHECK_MSG(bad == 0 && sent > 0, "%s: %d sent positions keep momentum", specs[s], bad);
        gcomp_compressor_free(c);
    }
    free(g);
    free(out);
    free(u);
    free(v);
}

/* ---- failures, state, specs -------------------------------------------------------------------
 */

static void test_nan_and_state(void) {
    const size_t n = 3000;
    float *g = malloc(n * 4);
    const char *specs[] = {"dgc:density=0.01", "dgc:density=0.01,clip=5",
                           "dgc:density=0.01,nesterov=1", "block:density=0.1,feedback=dgc"};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        gcomp_compressor *c = make(specs[s], n);
        if (!c) continue;
        for (int t = 0; t < 3; t++) {
            test_fill(g, n, 40 + (unsigned)t);
            msg m = encode(c, g);
            free(m.p);
        }
        size_t cap = gcomp_state_bound(c), l1, l2;
        uint8_t *before = malloc(cap), *after = malloc(cap), *buf = malloc(gcomp_encode_bound(c));
        CHECK_OK(gcomp_state_save(c, before, cap, &l1));
        for (int kind = 0; kind < 3; kind++) {
            test_fill(g, n, 50);
            g[n / 2] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
            size_t len = 1;
            CHECK_EQ_INT(gcomp_encode(c, g, buf, gcomp_encode_bound(c), &len), GCOMP_E_NONFINITE);
            CHECK_EQ_INT(len, 0);
        }
        /* A finite gradient that overflows v (Nesterov: v ~ 1.9 g) is refused too. */
        size_t len;
        if (strstr(specs[s], "nesterov")) {
            for (size_t i = 0; i < n; i++) g[i] = 3e38f;
            CHECK_EQ_INT(gcomp_encode(c, g, buf, gcomp_encode_bound(c), &len), GCOMP_E_NONFINITE);
        }
        /* Too small a buffer: refused, state kept. */
        test_fill(g, n, 51);
        CHECK_EQ_INT(gcomp_encode(c, g, buf, GCOMP_HEADER_SIZE + 10, &len), GCOMP_E_DST_SIZE);
        CHECK_OK(gcomp_state_save(c, after, cap, &l2));
        CHECK(l1 == l2 && !memcmp(before, after, l1));
        CHECK_EQ_INT(gcomp_compressor_step(c), 3);

        /* from_state gives a twin: same messages from here on. */
        gcomp_compressor *twin = NULL;
        gcomp_error err;
        CHECK_MSG(gcomp_compressor_from_state(&twin, before, l1, &err) == GCOMP_OK, "%s: %s",
                  specs[s], err.message);
        if (twin) {
            for (int t = 0; t < 3; t++) {
                test_fill(g, n, 60 + (unsigned)t);
                msg a = encode(c, g), b = encode(twin, g);
                CHECK(a.len == b.len && !memcmp(a.p, b.p, a.len));
                free(a.p);
                free(b.p);
            }
            /* A corrupt u (NaN inside the blob, CRC fixed up) is refused; nothing changes. */
            size_t off = 56 + strlen(gcomp_compressor_spec(c)) + 4;
            uint32_t nanbits = 0x7fc00000u;
            memcpy(before + off + 8, &nanbits, 4);
            uint32_t crc = gcomp__crc32c(0, before, l1 - 4);
            memcpy(before + l1 - 4, &crc, 4);
            CHECK_OK(gcomp_state_save(twin, after, cap, &l2));
            CHECK_EQ_INT(gcomp_state_load(twin, before, l1), GCOMP_E_STATE);
            uint8_t *again = malloc(cap);
            CHECK_OK(gcomp_state_save(twin, again, cap, &l2));
            CHECK(!memcmp(after, again, l2));
            free(again);
            gcomp_state_reset(twin);
            float *u = malloc(n * 4), *v = malloc(n * 4);
            read_uv(twin, u, v);
            int nz = 0;
            for (size_t i = 0; i < n; i++) nz += u[i] != 0 || v[i] != 0;
            CHECK_EQ_INT(nz, 0);
            free(u);
            free(v);
        }
        gcomp_compressor_free(twin);
        free(before);
        free(after);
        free(buf);
        gcomp_compressor_free(c);
    }
    free(g);
}

static void test_specs(void) {
    char canon[GCOMP__SPEC_MAX];
    CHECK_OK(gcomp_spec_canonical("dgc:density=0.001,momentum=0.9,warmup=4", canon, sizeof canon,
                                  NULL, NULL));
    CHECK(!strcmp(canon, "dgc:density=0.001,values=f32,feedback=dgc,seed=0,momentum=0.9,"
                         "nesterov=0,clip=0,masking=1,warmup=4,warmup_stages=0,warmup_start=0"));
    CHECK_OK(gcomp_spec_canonical("dgc:feedback=dgc", canon, sizeof canon, NULL, NULL));
    CHECK(gcomp_codec_find("dgc") && gcomp_codec_find("dgc")->id == 11);
    const char *bad[] = {"dgc:feedback=ef", "dgc:momentum=1.5",           "dgc:warmup=-1",
                         "dgc:clip=-1",     "dgc:warmup_start=2",         "topk:momentum=0.9",
                         "dgc:nesterov=2",  "topk:feedback=dgc,masking=x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gcomp_error err;
        gcomp_status st = gcomp_spec_canonical(bad[i], canon, sizeof canon, NULL, &err);
        CHECK_MSG(st == GCOMP_E_SPEC, "%s gave %s", bad[i], gcomp_status_str(st));
    }
    gcomp_compressor *c = NULL;
    CHECK_EQ_INT(gcomp_compressor_set_epoch(c, 1), GCOMP_E_ARG);
    c = make("dgc", 10);
    if (c) {
        CHECK_EQ_INT(gcomp_compressor_set_epoch(c, -1), GCOMP_E_ARG);
        CHECK_EQ_INT(gcomp_compressor_set_epoch(c, NAN), GCOMP_E_ARG);
    }
    gcomp_compressor_free(c);
}

static void test_alloc_failures(void) {
    float g[500];
    test_fill(g, 500, 9);
    for (size_t k = 0; k < 12; k++) {
        gcomp_compressor *c = NULL;
        gcomp__test_fail_alloc_after(k);
        gcomp_status st = gcomp_compressor_create(&c, "dgc:density=0.01,warmup=2", 500, 0, 0, NULL);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK(st == GCOMP_OK || (st == GCOMP_E_NOMEM && c == NULL));
        if (!c) continue;
        uint8_t buf[8192];
        size_t len;
        gcomp__test_fail_alloc_after(0);
        st = gcomp_encode(c, g, buf, sizeof buf, &len);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK(st == GCOMP_OK || st == GCOMP_E_NOMEM);
        if (st == GCOMP_E_NOMEM) CHECK_EQ_INT(gcomp_compressor_step(c), 0);
        gcomp_compressor_free(c);
    }
}

int main(void) {
    test_by_hand();
    test_update_equations();
    test_warmup();
    test_conservation();
    test_masking_structured();
    test_nan_and_state();
    test_specs();
    test_alloc_failures();
    return CHECK_DONE();
}

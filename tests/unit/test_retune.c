/*
 * test_retune.c - gcomp_compressor_retune: nothing held back is lost across any sequence of
 * spec changes (sum of gradients = sum of decoded messages + what is held back), switching
 * to dense flushes the residual into the next message, retuning to the same spec changes
 * nothing (momentum and warm starts carry over), a pending carry survives a checkpoint,
 * and every failure - bad spec, a step in flight, out of memory - leaves the compressor as
 * it was.
 */
#include "check.h"
#include "core/internal.h"

#include <stdint.h>

#define ROWS 48
#define COLS 40
#define N (ROWS * COLS)

static void gradient(float *g, unsigned long long *seed, double scale) {
    for (size_t i = 0; i < N; i++) g[i] = (float)(scale * test_gauss(seed));
}

/* What c holds back, as doubles: the residual, a carry, or PowerSGD's residual. */
static void held(const gcomp_compressor *c, double *out) {
    const float *r = gcomp_compressor_residual(c);
    static float tmp[N];
    if (!r && gcomp_lowrank_residual(c, tmp) == GCOMP_OK) r = tmp;
    for (size_t i = 0; i < N; i++) out[i] = r ? r[i] : 0.0;
}

/* Encodes `steps` gradients, adding them to *sum_g and the decoded messages to *sum_d. */
static void run(gcomp_compressor *c, int steps, unsigned long long *seed, double *sum_g,
                double *sum_d) {
    float g[N], d[N];
    size_t cap = gcomp_encode_bound(c), len;
    uint8_t *msg = malloc(cap);
    for (int s = 0; s < steps; s++) {
        gradient(g, seed, 1.0);
        CHECK_OK(gcomp_encode(c, g, msg, cap, &len));
        memset(d, 0, sizeof d);
        CHECK_OK(gcomp_decode_add(msg, len, d, N, 1.0f));
        for (size_t i = 0; i < N; i++) {
            sum_g[i] += g[i];
            sum_d[i] += d[i];
        }
    }
    free(msg);
}

static double conservation_gap(const gcomp_compressor *c, const double *sum_g,
                               const double *sum_d) {
    static double h[N];
    held(c, h);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < N; i++) {
        worst = fmax(worst, fabs(sum_g[i] - sum_d[i] - h[i]));
        scale = fmax(scale, fabs(sum_g[i]));
    }
    return worst / (scale > 0 ? scale : 1);
}

/* A path through every kind of switch, each spec retuned from the one before. */
static const char *const path[] = {
    "topk:density=0.01,feedback=ef",
    "topk:density=0.001,feedback=ef", /* a lower density */
    "none",                           /* dense: flushes the residual */
    "topk:density=0.05,values=f16,feedback=ef",
    "dgc:density=0.02,momentum=0",  /* ef -> dgc: e becomes v */
    "dgc:density=0.005,momentum=0", /* dgc -> dgc */
    "int8:feedback=ef",             /* dgc -> ef, dense quantizer */
    "powersgd:rank=4",              /* ef -> PowerSGD's own residual */
    "powersgd:rank=2",              /* rank change, warm start kept in part */
    "powersgd:rank=12",             /* low rank does not pay at 48 x 40: dense, flushes E */
    "powersgd:rank=3",              /* and back */
    "sign:feedback=ef",             /* PowerSGD -> ef */
    "randomk:density=0.02,feedback=ef,seed=3",
    "none:values=f16,feedback=ef",
    "none",
    "none", /* a retune with nothing held back */
    "topk:density=0.01,feedback=ef",
};

static void test_conservation(void) {
    unsigned long long seed = 1;
    gcomp_compressor *c;
    gcomp_error e = {0};
    CHECK_OK(gcomp_compressor_create(&c, path[0], N, ROWS, COLS, &e));
    double *sum_g = calloc(N, sizeof(double)), *sum_d = calloc(N, sizeof(double));
    uint64_t steps = 0;
    for (size_t k = 0; k < sizeof path / sizeof path[0]; k++) {
        if (k > 0) {
            double before = conservation_gap(c, sum_g, sum_d);
            CHECK_OK(gcomp_compressor_retune(c, path[k], &e));
            CHECK_MSG(gcomp_compressor_step(c) == steps, "%s: step %llu", path[k],
                      (unsigned long long)gcomp_compressor_step(c));
            double after = conservation_gap(c, sum_g, sum_d);
            CHECK_MSG(after <= before + 1e-6, "retune to %s lost %g of the held-back sum", path[k],
                      after - before);
        }
        run(c, 7, &seed, sum_g, sum_d);
        steps += 7;
        double gap = conservation_gap(c, sum_g, sum_d);
        CHECK_MSG(gap < 1e-4, "after %s: sum g - sum decoded - held = %g (relative)", path[k], gap);
    }
    gcomp_stats st;
    gcomp_compressor_stats(c, &st);
    CHECK_EQ_INT(st.messages, steps); /* statistics continue */
    gcomp_compressor_free(c);
    free(sum_g);
    free(sum_d);
}

/* c (top-k with error feedback, after a step) retuned to `spec`, which keeps no residual
 * for it: the carry is what c held back, the next message is exactly g + it, and then
 * nothing is pending. */
static void check_flush(gcomp_compressor *c, const char *spec, unsigned long long *seed) {
    float g[N], d[N], kept[N];
    size_t len;
    uint8_t *msg = malloc(4 * N + 256);
    memcpy(kept, gcomp_compressor_residual(c), sizeof kept);
    CHECK_OK(gcomp_compressor_retune(c, spec, NULL));
    const float *carry = gcomp_compressor_residual(c);
    CHECK_MSG(carry != NULL && !memcmp(carry, kept, sizeof kept), "%s: the carry", spec);
    gradient(g, seed, 1.0);
    CHECK_OK(gcomp_encode(c, g, msg, gcomp_encode_bound(c), &len));
    memset(d, 0, sizeof d);
    CHECK_OK(gcomp_decode_add(msg, len, d, N, 1.0f));
    int exact = 1;
    for (size_t i = 0; i < N; i++) exact &= d[i] == g[i] + kept[i];
    CHECK_MSG(exact, "%s: the next message must carry g + the old residual", spec);
    CHECK(gcomp_compressor_residual(c) == NULL); /* flushed */
    free(msg);
}

static void test_dense_flush(void) {
    unsigned long long seed = 5;
    float g[N], d[N];
    gcomp_compressor *c;
    CHECK_OK(gcomp_compressor_create(&c, "topk:density=0.01,feedback=ef", N, 0, 0, NULL));
    size_t len;
    uint8_t *msg = malloc(4 * N + 256);
    gradient(g, &seed, 1.0);
    CHECK_OK(gcomp_encode(c, g, msg, gcomp_encode_bound(c), &len));
    check_flush(c, "none", &seed);
    /* the next step is plain dense */
    gradient(g, &seed, 1.0);
    CHECK_OK(gcomp_encode(c, g, msg, gcomp_encode_bound(c), &len));
    memset(d, 0, sizeof d);
    CHECK_OK(gcomp_decode_add(msg, len, d, N, 1.0f));
    CHECK(!memcmp(d, g, sizeof d));
    free(msg);
    gcomp_compressor_free(c);
}

/* PowerSGD where every step is dense (a vector, or a rank at which low rank does not pay)
 * has no residual to keep what a retune hands it: it goes out with the next dense step,
 * through the protocol (*p = g + held) as through gcomp_encode, and survives an abandoned
 * step and a checkpoint until then.  Before, such a retune failed (GCOMP_E_UNSUPPORTED):
 * the accuracy loop stopped on the way from rank 2 back to rank 8 for a 10-column layer. */
static void test_dense_only_powersgd(void) {
    unsigned long long seed = 9;
    float g[N], kept[N], out[N];
    float *p;
    size_t np;
    unsigned rounds;
    gcomp_error e = {0};
    gcomp_compressor *c;
    CHECK_OK(gcomp_compressor_create(&c, "powersgd:rank=2", N, ROWS, COLS, NULL));
    for (int s = 0; s < 3; s++) { /* one rank: the sums are the buffers themselves */
        gradient(g, &seed, 1.0);
        CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
        CHECK_EQ_INT(rounds, 1);
        float *q;
        size_t nq;
        CHECK_OK(gcomp_lowrank_after_p(c, &q, &nq));
        CHECK_OK(gcomp_lowrank_finish(c, out, 1.0f));
    }
    CHECK_OK(gcomp_lowrank_residual(c, kept));
    CHECK_OK(gcomp_compressor_retune(c, "powersgd:rank=12", &e));
    const float *carry = gcomp_compressor_residual(c);
    CHECK_MSG(carry && !memcmp(carry, kept, sizeof kept), "the carry must be E as it was");

    gradient(g, &seed, 1.0);
    for (int pass = 0; pass < 2; pass++) { /* an abandoned step keeps the carry */
        CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
        CHECK_EQ_INT(rounds, 0);
        CHECK(p != NULL && np == N);
        int exact = 1;
        for (size_t i = 0; p && i < N; i++) exact &= p[i] == g[i] + kept[i];
        CHECK_MSG(exact, "the dense step must send g + what rank 2 held back");
        if (pass == 0) gcomp_lowrank_abort(c);
    }
    /* a checkpoint with the carry pending loads into the same spec, not into one that keeps
     * a residual of its own */
    gcomp_lowrank_abort(c);
    size_t cap = gcomp_state_bound(c), len;
    uint8_t *blob = malloc(cap);
    CHECK_OK(gcomp_state_save(c, blob, cap, &len));
    gcomp_compressor *twin, *other;
    CHECK_OK(gcomp_compressor_create(&twin, "powersgd:rank=12", N, ROWS, COLS, NULL));
    CHECK_OK(gcomp_state_load(twin, blob, len));
    CHECK(gcomp_compressor_residual(twin) &&
          !memcmp(gcomp_compressor_residual(twin), kept, sizeof kept));
    CHECK_OK(gcomp_compressor_create(&other, "powersgd:rank=3", N, ROWS, COLS, NULL));
    CHECK_EQ_INT(gcomp_state_load(other, blob, len), GCOMP_E_MISMATCH); /* another spec */
    gcomp_compressor_free(other);
    gcomp_compressor_free(twin);
    free(blob);

    CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
    CHECK_OK(gcomp_lowrank_finish(c, NULL, 0.0f));
    CHECK(gcomp_compressor_residual(c) == NULL); /* sent */
    CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
    CHECK(rounds == 0 && p == NULL); /* a plain dense step */
    CHECK_OK(gcomp_lowrank_finish(c, NULL, 0.0f));
    gcomp_compressor_free(c);

    /* a vector (no shape): every step dense, the same way, through gcomp_encode */
    gcomp_compressor *v;
    CHECK_OK(gcomp_compressor_create(&v, "topk:density=0.1,feedback=ef", N, 0, 0, NULL));
    uint8_t *msg = malloc(4 * N + 256);
    CHECK_OK(gcomp_encode(v, g, msg, gcomp_encode_bound(v), &len));
    free(msg);
    check_flush(v, "powersgd:rank=2", &seed);
    gcomp_compressor_free(v);
}

/* Retuning to the spec it already has changes nothing: the next messages are the bytes a
 * twin that never retuned makes (residual, DGC momentum, PowerSGD warm start all kept). */
static void test_same_spec_is_noop(void) {
    static const char *const specs[] = {"topk:density=0.01,feedback=ef",
                                        "dgc:density=0.01,momentum=0.9", "powersgd:rank=3"};
    for (size_t k = 0; k < 3; k++) {
        gcomp_compressor *a, *b;
        CHECK_OK(gcomp_compressor_create(&a, specs[k], N, ROWS, COLS, NULL));
        CHECK_OK(gcomp_compressor_create(&b, specs[k], N, ROWS, COLS, NULL));
        unsigned long long sa = 9, sb = 9;
        float g[N];
        size_t cap = gcomp_encode_bound(a), la, lb;
        uint8_t *ma = malloc(cap), *mb = malloc(cap);
        int same = 1;
        for (int s = 0; s < 8; s++) {
            if (s == 4) CHECK_OK(gcomp_compressor_retune(a, specs[k], NULL));
            gradient(g, &sa, 1.0);
            CHECK_OK(gcomp_encode(a, g, ma, cap, &la));
            gradient(g, &sb, 1.0);
            CHECK_OK(gcomp_encode(b, g, mb, cap, &lb));
            same &= la == lb && !memcmp(ma, mb, la);
        }
        CHECK_MSG(same, "%s: retune to itself changed the messages", specs[k]);
        free(ma);
        free(mb);
        gcomp_compressor_free(a);
        gcomp_compressor_free(b);
    }
}

static int same_state(gcomp_compressor *c, const char *spec, const float *res) {
    const float *r = gcomp_compressor_residual(c);
    return !strcmp(gcomp_compressor_spec(c), spec) && r && !memcmp(r, res, N * sizeof(float));
}

static void test_failures(void) {
    unsigned long long seed = 3;
    float g[N], res[N];
    char spec[GCOMP__SPEC_MAX];
    gcomp_compressor *c;
    gcomp_error e = {0};
    CHECK_OK(gcomp_compressor_create(&c, "topk:density=0.02,feedback=ef", N, ROWS, COLS, NULL));
    size_t cap = 4 * N + 256, len; /* holds any message of this tensor */
    uint8_t *msg = malloc(cap);
    gradient(g, &seed, 1.0);
    CHECK_OK(gcomp_encode(c, g, msg, cap, &len));
    snprintf(spec, sizeof spec, "%s", gcomp_compressor_spec(c));
    memcpy(res, gcomp_compressor_residual(c), sizeof res);

    CHECK_EQ_INT(gcomp_compressor_retune(c, "topk:densty=0.1", &e), GCOMP_E_SPEC);
    CHECK(strstr(e.message, "densty") != NULL);
    CHECK_EQ_INT(gcomp_compressor_retune(c, "nosuch", &e), GCOMP_E_UNKNOWN_CODEC);
    CHECK_EQ_INT(gcomp_compressor_retune(c, NULL, &e), GCOMP_E_ARG);
    CHECK(same_state(c, spec, res));

    /* out of memory at every allocation a retune makes: unchanged, then it succeeds */
    int ok = 0;
    for (size_t k = 0; k < 64 && !ok; k++) {
        gcomp__test_fail_alloc_after(k);
        gcomp_status st = gcomp_compressor_retune(c, "none", &e);
        gcomp__test_fail_alloc_after((size_t)-1);
        if (st == GCOMP_OK) {
            ok = 1;
            CHECK(gcomp_compressor_residual(c) &&
                  !memcmp(gcomp_compressor_residual(c), res, sizeof res)); /* now the carry */
        } else {
            CHECK_EQ_INT(st, GCOMP_E_NOMEM);
            CHECK_MSG(same_state(c, spec, res), "allocation %zu: state changed", k);
        }
    }
    CHECK(ok);

    /* a pending carry survives a checkpoint (state blob version 2) */
    size_t blen;
    uint8_t *blob = malloc(gcomp_state_bound(c));
    CHECK_OK(gcomp_state_save(c, blob, gcomp_state_bound(c), &blen));
    CHECK_EQ_INT(blob[4], 2);
    gcomp_compressor *twin;
    CHECK_OK(gcomp_compressor_from_state(&twin, blob, blen, &e));
    size_t l1, l2;
    uint8_t *m1 = malloc(4 * N + 256), *m2 = malloc(4 * N + 256);
    gradient(g, &seed, 1.0);
    CHECK_OK(gcomp_encode(c, g, m1, 4 * N + 256, &l1));
    CHECK_OK(gcomp_encode(twin, g, m2, 4 * N + 256, &l2));
    CHECK(l1 == l2 && !memcmp(m1, m2, l1));
    blob[blen / 2] ^= 1;
    gcomp_compressor *bad = NULL;
    CHECK_EQ_INT(gcomp_compressor_from_state(&bad, blob, blen, &e), GCOMP_E_CHECKSUM);
    /* without a carry the blob is version 1, as before retunes existed */
    CHECK_OK(gcomp_state_save(c, blob, gcomp_state_bound(c), &blen));
    CHECK_EQ_INT(blob[4], 1);
    /* a carry where the spec keeps what it holds back (here: error feedback) cannot come
     * from a retune: a version-2 blob of it is refused, CRC or not */
    {
        gcomp_compressor *ef;
        CHECK_OK(
            gcomp_compressor_create(&ef, "topk:density=0.02,feedback=ef", N, ROWS, COLS, NULL));
        size_t l = gcomp_state_bound(ef), lv = l + 4 + 4 * N;
        uint8_t *v2 = calloc(1, lv);
        CHECK_OK(gcomp_state_save(ef, v2, l, &l));
        lv = l + 4 + 4 * N;
        gcomp__put32(v2 + 4, 2);
        gcomp__put32(v2 + 8, (uint32_t)lv);
        gcomp__put32(v2 + l - 4, 4 * N); /* the carry's length where the CRC was, zeros */
        memset(v2 + l, 0, 4 * N);
        gcomp__put32(v2 + lv - 4, gcomp__crc32c(0, v2, lv - 4));
        CHECK_EQ_INT(gcomp_state_load(ef, v2, lv), GCOMP_E_STATE);
        free(v2);
        gcomp_compressor_free(ef);
    }
    /* what is held back, in the new spec's units, must be a float: a residual near FLT_MAX
     * becomes 10x that as DGC's velocity at m = 0.9; refused, nothing changes */
    {
        gcomp_compressor *ef;
        CHECK_OK(
            gcomp_compressor_create(&ef, "topk:density=0.02,feedback=ef", N, ROWS, COLS, NULL));
        static float big[N];
        for (size_t i = 0; i < N; i++) big[i] = (i % 2 ? 1 : -1) * 1e38f;
        CHECK_OK(gcomp_encode(ef, big, msg, cap, &len));
        char before[GCOMP__SPEC_MAX];
        snprintf(before, sizeof before, "%s", gcomp_compressor_spec(ef));
        memcpy(res, gcomp_compressor_residual(ef), sizeof res);
        CHECK_EQ_INT(gcomp_compressor_retune(ef, "dgc:density=0.02,momentum=0.9", &e),
                     GCOMP_E_NONFINITE);
        CHECK_MSG(strstr(e.message, "overflows"), "%s", e.message);
        CHECK(same_state(ef, before, res));
        gcomp_compressor_free(ef);
    }
    gcomp_compressor_free(twin);
    free(blob);
    free(m1);
    free(m2);

    /* PowerSGD: a step in flight refuses a retune */
    gcomp_compressor *p;
    CHECK_OK(gcomp_compressor_create(&p, "powersgd:rank=2", N, ROWS, COLS, NULL));
    float *pp;
    size_t np;
    unsigned rounds;
    CHECK_OK(gcomp_lowrank_begin(p, g, &pp, &np, &rounds));
    CHECK_EQ_INT(gcomp_compressor_retune(p, "powersgd:rank=1", &e), GCOMP_E_PROTOCOL);
    gcomp_lowrank_abort(p);
    CHECK_OK(gcomp_compressor_retune(p, "powersgd:rank=1", &e));
    gcomp_compressor_free(p);
    free(msg);
    gcomp_compressor_free(c);
}

/* Across the momentum boundary the held-back vector changes units (retune.c): DGC's
 * velocity v plus its momentum tail become gradient for a momentum optimizer,
 * h = (1 - m) v + m u; gradient held back becomes velocity, v = h / (1 - m).  So what the
 * optimizer finally applies is what DGC owed, not 1/(1 - m) times it. */
static void test_momentum_boundary(void) {
    const float m = 0.9f;
    unsigned long long seed = 21;
    double sg[N], sd[N];
    gcomp_compressor *c;
    CHECK_OK(gcomp_compressor_create(&c, "dgc:density=0.01,momentum=0.9", N, ROWS, COLS, NULL));
    run(c, 5, &seed, sg, sd);
    static float v[N], u[N];
    memcpy(v, gcomp_compressor_residual(c), sizeof v);
    const float *up;
    CHECK(c->spec.feedback->momentum && c->spec.feedback->momentum(c, &up) == m);
    memcpy(u, up, sizeof u);
    double un = 0;
    for (size_t i = 0; i < N; i++) un += fabs(u[i]);
    CHECK(un > 0); /* a tail to carry */
    CHECK_OK(gcomp_compressor_retune(c, "topk:density=0.01,feedback=ef", NULL));
    const float *e = gcomp_compressor_residual(c);
    double worst = 0;
    for (size_t i = 0; i < N; i++) worst = fmax(worst, fabs(e[i] - ((1 - m) * v[i] + m * u[i])));
    CHECK_MSG(worst < 1e-5, "dgc -> ef: residual off (1-m) v + m u by %g", worst);
    /* and back: v = e / (1 - m), u from 0 */
    static float e2[N];
    run(c, 3, &seed, sg, sd);
    memcpy(e2, gcomp_compressor_residual(c), sizeof e2);
    CHECK_OK(gcomp_compressor_retune(c, "dgc:density=0.01,momentum=0.9", NULL));
    const float *v2 = gcomp_compressor_residual(c);
    worst = 0;
    for (size_t i = 0; i < N; i++) worst = fmax(worst, fabs(v2[i] - e2[i] / (1 - m)));
    c->spec.feedback->momentum(c, &up);
    for (size_t i = 0; i < N; i++) worst = fmax(worst, fabs(up[i]));
    CHECK_MSG(worst < 1e-4, "ef -> dgc: v off e / (1 - m), or u not 0, by %g", worst);
    /* DGC under another momentum: u's tail, m u / (1 - m) still owed, joins v and u starts
     * from 0 (u kept as it was, 0.9 -> 0.5 would owe 1 u instead of 9 u; 0.9 -> 0 none) */
    run(c, 3, &seed, sg, sd);
    memcpy(v, gcomp_compressor_residual(c), sizeof v);
    c->spec.feedback->momentum(c, &up);
    memcpy(u, up, sizeof u);
    CHECK_OK(gcomp_compressor_retune(c, "dgc:density=0.01,momentum=0.5", NULL));
    v2 = gcomp_compressor_residual(c);
    CHECK(c->spec.feedback->momentum(c, &up) == 0.5f);
    worst = 0;
    for (size_t i = 0; i < N; i++)
        worst = fmax(worst, fabs(v2[i] - (v[i] + m / (1 - m) * u[i])) + fabs(up[i]));
    CHECK_MSG(worst < 1e-3, "dgc 0.9 -> dgc 0.5: v off v + 9 u, or u not 0, by %g", worst);
    gcomp_compressor_free(c);
}

static void save(const gcomp_compressor *c, uint8_t **blob, size_t *len) {
    size_t cap = gcomp_state_bound(c);
    *blob = malloc(cap);
    CHECK_OK(gcomp_state_save(c, *blob, cap, len));
}

/* gcomp_compressor_retune_from: a fresh compressor of each next spec takes what the one
 * before holds back, byte for byte as a retune of a copy of it would (their saved states
 * are equal), and the source's own state does not change; then its refusals. */
static void test_retune_from(void) {
    unsigned long long seed = 5;
    gcomp_error e = {0};
    double *sum_g = calloc(N, sizeof(double)), *sum_d = calloc(N, sizeof(double));
    gcomp_compressor *src = NULL;
    CHECK_OK(gcomp_compressor_create(&src, path[0], N, ROWS, COLS, &e));
    for (size_t k = 1; k < sizeof path / sizeof path[0]; k++) {
        run(src, 7, &seed, sum_g, sum_d);
        uint8_t *before, *want, *got, *after;
        size_t lb, lw, lg, la;
        save(src, &before, &lb);
        gcomp_compressor *copy = NULL, *dst = NULL;
        CHECK_OK(gcomp_compressor_from_state(&copy, before, lb, &e));
        CHECK_OK(gcomp_compressor_retune(copy, path[k], &e));
        save(copy, &want, &lw);
        CHECK_OK(gcomp_compressor_create(&dst, path[k], N, ROWS, COLS, &e));
        CHECK_OK(gcomp_compressor_retune_from(dst, src, &e));
        save(dst, &got, &lg);
        save(src, &after, &la);
        CHECK_MSG(lg == lw && !memcmp(got, want, lw), "%s -> %s: not the retune's state",
                  path[k - 1], path[k]);
        CHECK_MSG(la == lb && !memcmp(after, before, lb), "%s -> %s: the source changed",
                  path[k - 1], path[k]);
        free(before);
        free(want);
        free(got);
        free(after);
        gcomp_compressor_free(copy);
        gcomp_compressor_free(src);
        src = dst;
    }
    /* Refusals leave both as they were, out of memory at any allocation included. */
    gcomp_compressor *other = NULL, *wide = NULL;
    CHECK_OK(gcomp_compressor_create(&other, "topk:density=0.1,feedback=ef", N, ROWS, COLS, &e));
    CHECK_OK(gcomp_compressor_create(&wide, "topk:density=0.1,feedback=ef", N, N, 1, &e));
    uint8_t *b0, *b1, *o0, *o1;
    size_t l0, l1, m0, m1;
    save(src, &b0, &l0);
    save(other, &o0, &m0);
    int ok = 0;
    for (size_t k = 0; k < 64 && !ok; k++) {
        gcomp__test_fail_alloc_after(k);
        gcomp_status st = gcomp_compressor_retune_from(other, src, &e);
        gcomp__test_fail_alloc_after((size_t)-1);
        if (st == GCOMP_OK) {
            ok = 1;
        } else {
            CHECK_EQ_INT(st, GCOMP_E_NOMEM);
            save(other, &o1, &m1);
            CHECK_MSG(m1 == m0 && !memcmp(o1, o0, m0), "allocation %zu: dst changed", k);
            free(o1);
        }
        save(src, &b1, &l1);
        CHECK_MSG(l0 == l1 && !memcmp(b0, b1, l0), "allocation %zu: src changed", k);
        free(b1);
    }
    CHECK(ok);
    free(o0);
    CHECK_EQ_INT(gcomp_compressor_retune_from(wide, src, &e), GCOMP_E_ARG); /* other shape */
    CHECK(strstr(e.message, "sizes differ") != NULL);
    CHECK_EQ_INT(gcomp_compressor_retune_from(src, src, &e), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_compressor_retune_from(NULL, src, &e), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_compressor_retune_from(other, NULL, &e), GCOMP_E_ARG);
    save(src, &b1, &l1);
    CHECK(l0 == l1 && !memcmp(b0, b1, l0));
    free(b0);
    free(b1);
    gcomp_compressor_free(wide);
    gcomp_compressor_free(other);
    gcomp_compressor_free(src);
    free(sum_g);
    free(sum_d);
}

int main(void) {
    test_conservation();
    test_retune_from();
    test_momentum_boundary();
    test_dense_flush();
    test_dense_only_powersgd();
    test_same_spec_is_noop();
    test_failures();
    return CHECK_DONE();
}

/*
 * test_sparse.c - properties of the sparsifiers and of error feedback, through the public
 * API only (plus the allocation hook):
 *   - topk equals a sort-based reference on random data with ties, at every size class;
 *   - error feedback conserves the sum: sum(decoded) + residual = sum(gradients);
 *   - bernoulli and importance are unbiased; randomk agrees across ranks with one seed;
 *   - same spec + seed -> byte-identical messages;
 *   - every truncation and many single-byte corruptions are refused, never a crash;
 *   - NaN gradients are refused and leave the state untouched;
 *   - state save/load resumes exactly; a failing allocation at any point is clean.
 */
#include "check.h"
#include "compressor_helpers.h"
#include "gradcomp.h"
#include "core/internal.h"

/* Reference top-k: sort indices by (|x| desc, index asc). */
static const float *ref_x;
static int ref_cmp(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = fabsf(ref_x[i]), y = fabsf(ref_x[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}
static int u32_cmp(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return (i > j) - (i < j);
}

static void test_topk_reference(void) {
    size_t ns[] = {1, 5, 100, 8192, 8193, 50000, 300000};
    double dens[] = {0.001, 0.01, 0.3, 1.0};
    unsigned long long s = 11;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t d = 0; d < sizeof dens / sizeof *dens; d++)
            for (int ties = 0; ties < 3; ties++) {
                size_t n = ns[a];
                float *x = malloc(n * 4), *acc = calloc(n, 4);
                test_fill(x, n, s++);
                if (ties == 1) /* heavy ties: few distinct magnitudes, random signs */
                    for (size_t i = 0; i < n; i++)
                        x[i] = (float)((int)(fabsf(x[i]) * 2)) * (x[i] < 0 ? -1 : 1);
                if (ties == 2) /* all equal */
                    for (size_t i = 0; i < n; i++) x[i] = (i & 1) ? 1.0f : -1.0f;
                char spec[64];
                snprintf(spec, sizeof spec, "topk:density=%g", dens[d]);
                gcomp_compressor *c = make(spec, n);
                msg m = encode(c, x);
                CHECK_OK(gcomp_decode_add(m.p, m.len, acc, n, 1.0f));
                size_t k = (size_t)ceil(dens[d] * (double)n);
                if (k > n) k = n;
                uint32_t *order = malloc(n * 4);
                for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
                ref_x = x;
                qsort(order, n, 4, ref_cmp);
                qsort(order, k, 4, u32_cmp);
                /* decoded must be exactly x on the reference set and 0 elsewhere */
                size_t bad = 0, j = 0;
                for (size_t i = 0; i < n; i++) {
                    bool in = j < k && order[j] == i;
                    if (in) j++;
                    float want = in ? x[i] : 0.0f;
                    if (acc[i] != want && !(want == 0.0f && acc[i] == 0.0f)) bad++;
                }
                CHECK_MSG(bad == 0, "n=%zu density=%g ties=%d: %zu positions differ", n, dens[d],
                          ties, bad);
                gcomp_message_info info;
                CHECK_OK(gcomp_message_inspect(m.p, m.len, &info));
                CHECK(info.elements_sent == k);
                free(order);
                free(m.p);
                free(x);
                free(acc);
                gcomp_compressor_free(c);
            }
}

/* sum over steps of decoded + final residual == sum of gradients. */
static void check_conservation(const char *spec, size_t n, int steps, double tol) {
    gcomp_compressor *c = make(spec, n);
    if (!c) return;
    double *sum_g = calloc(n, sizeof(double)), *sum_d = calloc(n, sizeof(double));
    float *g = malloc(n * 4), *acc = malloc(n * 4);
    for (int t = 0; t < steps; t++) {
        test_fill(g, n, 1000 + (unsigned long long)t);
        for (size_t i = 0; i < n; i++) sum_g[i] += g[i];
        msg m = encode(c, g);
        memset(acc, 0, n * 4);
        CHECK_OK(gcomp_compressor_decode_add(c, m.p, m.len, acc, 1.0f));
        for (size_t i = 0; i < n; i++) sum_d[i] += acc[i];
        free(m.p);
    }
    const float *r = gcomp_compressor_residual(c);
    CHECK(r != NULL);
    double worst = 0, scale = 0;
    for (size_t i = 0; r && i < n; i++) {
        double e = fabs(sum_d[i] + r[i] - sum_g[i]);
        worst = e > worst ? e : worst;
        scale = fabs(sum_g[i]) > scale ? fabs(sum_g[i]) : scale;
    }
    CHECK_MSG(worst <= tol * (scale + 1.0), "%s: conservation error %g (scale %g)", spec, worst,
              scale);
    CHECK(gcomp_compressor_step(c) == (uint64_t)steps);
    free(sum_g);
    free(sum_d);
    free(g);
    free(acc);
    gcomp_compressor_free(c);
}

static void test_error_feedback(void) {
    const char *specs[] = {
        "topk:density=0.01,feedback=ef",    "topk:density=0.05,values=f16,feedback=ef",
        "threshold:tau=2,feedback=ef",      "sampled:density=0.01,feedback=ef",
        "randomk:density=0.02,feedback=ef", "none:values=bf16,feedback=ef",
        "none:values=f16,feedback=ef"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        check_conservation(specs[i], 20011, 40, 1e-4);
}

/* E[decoded] = g for unbiased codecs: the mean over S seeds converges like sigma/sqrt(S). */
static void check_unbiased(const char *base, size_t n, int seeds) {
    float *g = malloc(n * 4), *acc = calloc(n, 4);
    test_fill(g, n, 5);
    double *mean = calloc(n, sizeof(double)), *sq = calloc(n, sizeof(double));
    for (int s = 0; s < seeds; s++) {
        char spec[128];
        snprintf(spec, sizeof spec, "%s,seed=%d", base, s + 1);
        gcomp_compressor *c = make(spec, n);
        msg m = encode(c, g);
        memset(acc, 0, n * 4);
        CHECK_OK(gcomp_decode_add(m.p, m.len, acc, n, 1.0f));
        for (size_t i = 0; i < n; i++) {
            mean[i] += acc[i];
            sq[i] += (double)acc[i] * acc[i];
        }
        free(m.p);
        gcomp_compressor_free(c);
    }
    /* z-score of the mean of each element, then the z-scores' RMS must be ~1 (no bias):
     * a bias b adds (b*sqrt(S)/sigma)^2. */
    double z2 = 0;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        double m = mean[i] / seeds, var = sq[i] / seeds - m * m;
        if (var <= 1e-12) { /* always kept (p_i = 1) or never drawn in S seeds */
            if (m == 0.0) continue;
            CHECK_MSG(fabs(m - g[i]) <= 1e-5 * (fabs(g[i]) + 1),
                      "%s: deterministic element %zu biased", base, i);
            continue;
        }
        double z = (m - g[i]) / sqrt(var / (seeds - 1));
        z2 += z * z;
        used++;
    }
    double rms = used ? sqrt(z2 / (double)used) : 0;
    CHECK_MSG(rms < 1.3, "%s: RMS z-score of the mean %.3f (unbiased gives ~1)", base, rms);
    free(g);
    free(acc);
    free(mean);
    free(sq);
}

static void test_scaled_refuse_feedback(void) {
    /* 1/p-scaled estimators are not contractive: with a residual they diverge (the
     * residual is multiplied by 1 - 1/p whenever an element is kept), so the combination
     * is refused with an explanation instead of silently blowing up. */
    const char *bad[] = {"bernoulli:density=0.05,feedback=ef",
                         "importance:density=0.05,feedback=ef",
                         "randomk:density=0.05,unbiased=1,feedback=ef"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gcomp_compressor *c = NULL;
        gcomp_error err;
        CHECK(gcomp_compressor_create(&c, bad[i], 1000, 0, 0, &err) == GCOMP_E_SPEC);
        CHECK_MSG(strstr(err.message, "diverge") != NULL, "%s", err.message);
    }
}

static void test_unbiased(void) {
    check_unbiased("bernoulli:density=0.2", 2000, 400);
    check_unbiased("importance:density=0.2", 2000, 400);
    check_unbiased("randomk:density=0.2,unbiased=1", 2000, 400);
}

static void test_sampled_count(void) {
    size_t n = 1000000;
    float *g = malloc(n * 4);
    test_fill(g, n, 77);
    for (int exact = 0; exact < 2; exact++) {
        gcomp_compressor *c =
            make(exact ? "sampled:density=0.001,exact=1" : "sampled:density=0.001", n);
        for (int t = 0; t < 5; t++) {
            msg m = encode(c, g);
            gcomp_message_info info;
            CHECK_OK(gcomp_message_inspect(m.p, m.len, &info));
            if (exact)
                CHECK(info.elements_sent == 1000);
            else
                CHECK_MSG(info.elements_sent >= 900 && info.elements_sent <= 1100, "got %llu",
                          (unsigned long long)info.elements_sent);
            free(m.p);
        }
        gcomp_compressor_free(c);
    }
    free(g);
}

static void test_determinism_and_randomk(void) {
    size_t n = 100003;
    float *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    test_fill(g1, n, 1);
    test_fill(g2, n, 2);
    const char *specs[] = {"topk:density=0.01", "bernoulli:density=0.01,seed=9",
                           "importance:density=0.01,seed=9", "randomk:density=0.01,seed=9",
                           "sampled:density=0.01,seed=9"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        gcomp_compressor *a = make(specs[i], n), *b = make(specs[i], n);
        for (int t = 0; t < 3; t++) {
            msg ma = encode(a, g1), mb = encode(b, g1);
            CHECK_MSG(ma.len == mb.len && memcmp(ma.p, mb.p, ma.len) == 0, "%s step %d", specs[i],
                      t);
            free(ma.p);
            free(mb.p);
        }
        gcomp_compressor_free(a);
        gcomp_compressor_free(b);
    }
    /* Two ranks, different gradients, same seed: the same random-k positions. */
    gcomp_compressor *r0 = make("randomk:density=0.01,seed=3", n),
                     *r1 = make("randomk:density=0.01,seed=3", n);
    msg m0 = encode(r0, g1), m1 = encode(r1, g2);
    float *a0 = calloc(n, 4), *a1 = calloc(n, 4);
    gcomp_decode_add(m0.p, m0.len, a0, n, 1.0f);
    gcomp_decode_add(m1.p, m1.len, a1, n, 1.0f);
    size_t same = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        k += a0[i] != 0;
        same += (a0[i] != 0) == (a1[i] != 0);
    }
    CHECK(k == 1001);
    CHECK(same == n);
    CHECK(m0.len == 40 + 24 + 8 + 4 * 1001); /* indices do not travel */
    free(m0.p);
    free(m1.p);
    free(a0);
    free(a1);
    gcomp_compressor_free(r0);
    gcomp_compressor_free(r1);
    free(g1);
    free(g2);
}

static void test_corruption(void) {
    size_t n = 5000;
    float *g = malloc(n * 4), *acc = malloc(n * 4);
    test_fill(g, n, 3);
    const char *specs[] = {"none",
                           "none:values=f16",
                           "none:values=bf16",
                           "topk:density=0.01",
                           "topk:density=0.3,values=f16",
                           "randomk:density=0.05",
                           "bernoulli:density=0.6",
                           "threshold:tau=1.5"};
    unsigned long long s = 99;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        gcomp_compressor *c = make(specs[i], n);
        msg m = encode(c, g);
        for (size_t len = 0; len < m.len; len++) /* every truncation */
            CHECK_MSG(gcomp_decode_add(m.p, len, acc, n, 1.0f) != GCOMP_OK, "%s truncated to %zu",
                      specs[i], len);
        uint8_t *copy = malloc(m.len + 1);
        for (int trial = 0; trial < 3000; trial++) { /* single-byte corruptions */
            memcpy(copy, m.p, m.len);
            size_t pos = (size_t)(test_rng_next_(&s) % m.len);
            copy[pos] ^= (uint8_t)(1 + test_rng_next_(&s) % 255);
            gcomp_status st = gcomp_decode_add(copy, m.len, acc, n, 1.0f);
            CHECK_MSG(st == GCOMP_E_CHECKSUM || st == GCOMP_E_BAD_MAGIC || st == GCOMP_E_VERSION ||
                          st == GCOMP_E_CORRUPT || st == GCOMP_E_TRUNCATED,
                      "%s: byte %zu corrupted gave %d", specs[i], pos, st);
        }
        memcpy(copy, m.p, m.len);
        copy[m.len] = 0;
        CHECK(gcomp_decode_add(copy, m.len + 1, acc, n, 1.0f) ==
              GCOMP_E_CORRUPT); /* trailing byte */
        CHECK(gcomp_decode_add(m.p, m.len, acc, n + 1, 1.0f) == GCOMP_E_MISMATCH);
        gcomp_compressor *other = make("topk:density=0.02", n);
        CHECK(gcomp_compressor_decode_add(other, m.p, m.len, acc, 1.0f) == GCOMP_E_MISMATCH);
        gcomp_compressor_free(other);
        /* A newer version with a valid header CRC reads as unsupported, not corrupt. */
        memcpy(copy, m.p, m.len);
        copy[4] = 2;
        gcomp__put32(copy + 36, gcomp__crc32c(0, copy, 36));
        CHECK(gcomp_decode_add(copy, m.len, acc, n, 1.0f) == GCOMP_E_VERSION);
        /* An unknown codec id with valid checksums. */
        memcpy(copy, m.p, m.len);
        gcomp__put16(copy + 6, 999);
        gcomp__put32(copy + 36, gcomp__crc32c(0, copy, 36));
        CHECK(gcomp_decode_add(copy, m.len, acc, n, 1.0f) == GCOMP_E_CODEC_ID);
        /* Reserved flag bits. */
        memcpy(copy, m.p, m.len);
        copy[8] = 1;
        gcomp__put32(copy + 36, gcomp__crc32c(0, copy, 36));
        CHECK(gcomp_decode_add(copy, m.len, acc, n, 1.0f) == GCOMP_E_CORRUPT);
        free(copy);
        free(m.p);
        gcomp_compressor_free(c);
    }
    CHECK(gcomp_decode_add("GCm", 3, acc, n, 1.0f) == GCOMP_E_TRUNCATED);
    CHECK(gcomp_decode_add("XXXXXXXX", 8, acc, n, 1.0f) == GCOMP_E_BAD_MAGIC);
    CHECK(gcomp_decode_add(NULL, 8, acc, n, 1.0f) == GCOMP_E_ARG);
    free(g);
    free(acc);
}

/* Content corruption behind valid checksums: the payload validator must catch it. */
static void test_hostile_payload(void) {
    size_t n = 4000;
    float *g = malloc(n * 4), *acc = calloc(n, 4);
    test_fill(g, n, 4);
    gcomp_compressor *c = make("topk:density=0.05", n);
    msg m = encode(c, g);
    unsigned long long s = 5;
    uint8_t *copy = malloc(m.len);
    int refused = 0;
    for (int trial = 0; trial < 5000; trial++) {
        memcpy(copy, m.p, m.len);
        size_t pos = 40 + (size_t)(test_rng_next_(&s) % (m.len - 40));
        copy[pos] ^= (uint8_t)(1 + test_rng_next_(&s) % 255);
        gcomp__put32(copy + 32, gcomp__crc32c(0, copy + 40, m.len - 40));
        gcomp__put32(copy + 36, gcomp__crc32c(0, copy, 36));
        for (size_t i = 0; i < n; i++) acc[i] = 0;
        gcomp_status st = gcomp_decode_add(copy, m.len, acc, n, 1.0f);
        if (st != GCOMP_OK) {
            refused++;
            /* nothing may have been written */
            size_t nz = 0;
            for (size_t i = 0; i < n; i++) nz += acc[i] != 0;
            CHECK_MSG(nz == 0, "refused message wrote %zu elements", nz);
        } else {
            for (size_t i = 0; i < n; i++) CHECK(isfinite(acc[i]));
        }
    }
    CHECK(refused > 500); /* changes to counts and indices are mostly invalid; values mostly not */
    free(copy);
    free(m.p);
    free(g);
    free(acc);
    gcomp_compressor_free(c);
}

static void test_nonfinite(void) {
    size_t n = 20000;
    float *g = malloc(n * 4);
    const char *specs[] = {"topk:density=0.01,feedback=ef",
                           "topk:density=0.01",
                           "none",
                           "none:values=f16",
                           "threshold:tau=1",
                           "sampled:density=0.01,feedback=ef",
                           "bernoulli:density=0.1",
                           "importance:density=0.1",
                           "randomk:density=0.1"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        gcomp_compressor *c = make(specs[i], n);
        test_fill(g, n, 8);
        msg m = encode(c, g);
        free(m.p);
        size_t sl = gcomp_state_bound(c), len1, len2;
        uint8_t *s1 = malloc(sl), *s2 = malloc(sl);
        CHECK_OK(gcomp_state_save(c, s1, sl, &len1));
        for (int bad = 0; bad < 2; bad++) {
            test_fill(g, n, 9);
            g[n / 2 + 7] = bad ? INFINITY : NAN;
            size_t cap = gcomp_encode_bound(c), len;
            uint8_t *out = malloc(cap);
            CHECK_MSG(gcomp_encode(c, g, out, cap, &len) == GCOMP_E_NONFINITE, "%s", specs[i]);
            free(out);
        }
        CHECK_OK(gcomp_state_save(c, s2, sl, &len2));
        CHECK_MSG(len1 == len2 && memcmp(s1, s2, len1) == 0,
                  "%s: state changed by a refused encode", specs[i]);
        free(s1);
        free(s2);
        gcomp_compressor_free(c);
    }
    free(g);
}

static void test_state(void) {
    size_t n = 30000;
    float *g = malloc(n * 4);
    const char *spec = "topk:density=0.01,values=f16,feedback=ef";
    gcomp_compressor *a = make(spec, n), *b = make(spec, n);
    for (int t = 0; t < 5; t++) {
        test_fill(g, n, 50 + (unsigned long long)t);
        msg m = encode(a, g);
        free(m.p);
    }
    size_t sl = gcomp_state_bound(a), len;
    uint8_t *blob = malloc(sl);
    CHECK_OK(gcomp_state_save(a, blob, sl, &len));
    CHECK(gcomp_state_save(a, blob, sl - 1, &len) == GCOMP_E_DST_SIZE);
    CHECK_OK(gcomp_state_save(a, blob, sl, &len));
    CHECK_OK(gcomp_state_load(b, blob, len));
    CHECK(gcomp_compressor_step(b) == 5);
    gcomp_compressor *c2 = NULL;
    CHECK_OK(gcomp_compressor_from_state(&c2, blob, len, NULL));
    for (int t = 5; t < 8; t++) { /* resumed compressors continue identically */
        test_fill(g, n, 50 + (unsigned long long)t);
        msg ma = encode(a, g), mb = encode(b, g), mc = encode(c2, g);
        CHECK(ma.len == mb.len && !memcmp(ma.p, mb.p, ma.len));
        CHECK(ma.len == mc.len && !memcmp(ma.p, mc.p, ma.len));
        free(ma.p);
        free(mb.p);
        free(mc.p);
    }
    /* foreign, corrupt, truncated, newer blobs */
    gcomp_compressor *other = make("topk:density=0.02,values=f16,feedback=ef", n);
    CHECK(gcomp_state_load(other, blob, len) == GCOMP_E_MISMATCH);
    gcomp_compressor *small = make(spec, n - 1);
    CHECK(gcomp_state_load(small, blob, len) == GCOMP_E_MISMATCH);
    blob[100] ^= 1;
    CHECK(gcomp_state_load(b, blob, len) == GCOMP_E_CHECKSUM);
    blob[100] ^= 1;
    CHECK(gcomp_state_load(b, blob, len - 1) != GCOMP_OK);
    CHECK(gcomp_state_load(b, "nope", 4) == GCOMP_E_BAD_MAGIC);
    CHECK(gcomp_state_load(b, "GCst", 4) == GCOMP_E_STATE);
    blob[0] = 'X';
    CHECK(gcomp_state_load(b, blob, len) == GCOMP_E_BAD_MAGIC);
    gcomp_state_reset(a);
    CHECK(gcomp_compressor_step(a) == 0);
    const float *r = gcomp_compressor_residual(a);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += r[i] != 0;
    CHECK(nz == 0);
    gcomp_stats st;
    gcomp_compressor_stats(a, &st);
    CHECK(st.messages == 8 && st.bytes_in == 8ull * 4 * n && st.elements_sent == 8ull * 300);
    free(blob);
    free(g);
    gcomp_compressor_free(a);
    gcomp_compressor_free(b);
    gcomp_compressor_free(c2);
    gcomp_compressor_free(other);
    gcomp_compressor_free(small);
}

/* SQLite-style anomaly test: fail the N-th allocation for N = 0, 1, ... through
 * create + encode + decode; every failure must be a clean status. */
static void test_alloc_failures(void) {
    size_t n = 50000;
    float *g = malloc(n * 4), *acc = calloc(n, 4);
    test_fill(g, n, 12);
    const char *specs[] = {"topk:density=0.01,feedback=ef", "sampled:density=0.01",
                           "randomk:density=0.01", "bernoulli:density=0.01",
                           "threshold:tau=2,feedback=ef"};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        int completed = 0;
        for (size_t fail = 0; fail < 40 && !completed; fail++) {
            gcomp__test_fail_alloc_after(fail);
            gcomp_compressor *c = NULL;
            gcomp_status st = gcomp_compressor_create(&c, specs[s], n, 0, 0, NULL);
            if (st != GCOMP_OK) {
                CHECK(st == GCOMP_E_NOMEM && c == NULL);
                continue;
            }
            size_t cap = gcomp_encode_bound(c), len;
            uint8_t *m = malloc(cap);
            st = gcomp_encode(c, g, m, cap, &len);
            if (st == GCOMP_OK) {
                st = gcomp_compressor_decode_add(c, m, len, acc, 1.0f);
                if (st == GCOMP_OK) completed = 1;
            }
            CHECK_MSG(st == GCOMP_OK || st == GCOMP_E_NOMEM, "%s fail@%zu: %d", specs[s], fail, st);
            if (st == GCOMP_E_NOMEM) CHECK(gcomp_compressor_step(c) <= 1);
            free(m);
            gcomp_compressor_free(c);
        }
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK_MSG(completed, "%s never completed", specs[s]);
    }
    free(g);
    free(acc);
}

/* min_k= floors the count of every codec that takes it from density=, through a retune
 * and under DGC's warm-up, never above n, never below ceil(density * n). */
static size_t sent(const char *spec, size_t n, const float *g) {
    gcomp_compressor *c = make(spec, n);
    if (!c) return 0;
    msg m = encode(c, g);
    gcomp_message_info info = {0};
    CHECK_OK(gcomp_message_inspect(m.p, m.len, &info));
    free(m.p);
    gcomp_compressor_free(c);
    return (size_t)info.elements_sent;
}

static void test_min_k(void) {
    size_t n = 10240;
    float *g = malloc(n * 4);
    test_fill(g, n, 5);
    const char *floored[] = {"topk:density=0.001,min_k=512", "dgc:density=0.001,min_k=512",
                             "randomk:density=0.001,min_k=512",
                             "sampled:density=0.001,min_k=512,exact=1",
                             "topk:density=0.001,min_k=512,values=f16,feedback=ef"};
    for (size_t i = 0; i < sizeof floored / sizeof *floored; i++)
        CHECK_MSG(sent(floored[i], n, g) == 512, "%s", floored[i]);
    CHECK_EQ_INT(sent("topk:density=0.001", n, g), 11); /* ceil(10.24): no floor by default */
    CHECK_EQ_INT(sent("topk:density=0.1,min_k=512", n, g), 1024);    /* a floor, not a cap */
    CHECK_EQ_INT(sent("topk:density=0.001,min_k=512", 100, g), 100); /* at most n */

    /* The default writes nothing: specs and fingerprints from before min_k stay as they were. */
    char canon[256], v[32];
    uint64_t fp0 = 0, fp1 = 1;
    CHECK_OK(gcomp_spec_canonical("topk:density=0.001,min_k=0", canon, sizeof canon, &fp0, NULL));
    CHECK_MSG(!strcmp(canon, "topk:density=0.001,values=f32,feedback=none,seed=0"), "%s", canon);
    CHECK_OK(gcomp_spec_canonical("topk:density=0.001", canon, sizeof canon, &fp1, NULL));
    CHECK(fp0 == fp1);
    CHECK_OK(gcomp_spec_get("dgc", "min_k", v, sizeof v, NULL));
    CHECK(!strcmp(v, "0"));
    gcomp_spec_info info;
    CHECK_OK(gcomp_spec_describe("dgc:density=0.001,min_k=512", n, &info, NULL));
    CHECK_MSG(info.density == 512.0 / (double)n, "density %g", info.density);

    /* A retune of density= keeps the floor; DGC's warm-up starts above it and ends on it. */
    gcomp_compressor *c = make("topk:density=0.01,min_k=512,feedback=ef", n);
    char lower[256];
    CHECK_OK(gcomp_spec_set("topk:density=0.01,min_k=512,feedback=ef", "density", "0.0001", lower,
                            sizeof lower, NULL));
    CHECK_OK(gcomp_compressor_retune(c, lower, NULL));
    msg m = encode(c, g);
    gcomp_message_info mi;
    CHECK_OK(gcomp_message_inspect(m.p, m.len, &mi));
    CHECK_EQ_INT(mi.elements_sent, 512);
    free(m.p);
    gcomp_compressor_free(c);
    c = make("dgc:density=0.001,min_k=512,warmup=1,warmup_stages=2,warmup_start=0.25", n);
    m = encode(c, g);
    CHECK_OK(gcomp_message_inspect(m.p, m.len, &mi));
    CHECK_EQ_INT(mi.elements_sent, 2560);
    free(m.p);
    CHECK_OK(gcomp_compressor_set_epoch(c, 1.0));
    m = encode(c, g);
    CHECK_OK(gcomp_message_inspect(m.p, m.len, &mi));
    CHECK_EQ_INT(mi.elements_sent, 512);
    free(m.p);
    gcomp_compressor_free(c);

    const char *bad[] = {"topk:min_k=-1",    "topk:min_k=1.5",    "topk:min_k=4294967296",
                         "powersgd:min_k=4", "bernoulli:min_k=4", "int8:min_k=4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gcomp_error err;
        CHECK_MSG(gcomp_spec_canonical(bad[i], canon, sizeof canon, NULL, &err) == GCOMP_E_SPEC &&
                      strstr(err.message, "min_k"),
                  "%s: %s", bad[i], err.message);
    }
    free(g);
}

int main(void) {
    test_topk_reference();
    test_error_feedback();
    test_unbiased();
    test_scaled_refuse_feedback();
    test_sampled_count();
    test_min_k();
    test_determinism_and_randomk();
    test_corruption();
    test_hostile_payload();
    test_nonfinite();
    test_state();
    test_alloc_failures();
    return CHECK_DONE();
}

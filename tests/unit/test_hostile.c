/*
 * test_hostile.c - inputs a hostile or careless caller hands the core, each one a bug that
 * was found (issue "Reliability") and must stay fixed:
 *   - a non-finite decode scale is GCOMP_E_ARG for every codec, before the message is read
 *     (sparse codecs used to return OK with +-Inf in the accumulator);
 *   - a valid random-k message relabelled to n = 2^32 - 1 validates (acc = NULL) without
 *     allocating the n-bit scratch of its positions (it grew the process by 512 MB);
 *   - PowerSGD's finish refuses a product that overflows float before it is scaled
 *     (scale < 1 used to let +-Inf through), with the state as before begin;
 *   - state blobs with a valid CRC but an impossible tensor (rows * cols != n, n = 0, a NUL
 *     in the spec, an infinite epoch) are GCOMP_E_STATE, not create's GCOMP_E_ARG, and a
 *     blob too short for the n it claims is refused before anything of n's size is
 *     allocated;
 *   - a shape whose rows * cols wraps around to n in size_t (2 x (2^63 + 5) for n = 10) is
 *     GCOMP_E_ARG at create, in the policy and in the cost model: it was accepted, and the
 *     cols codec and PowerSGD then sized their buffers by the wrapped side and wrote past
 *     them at the first encode.
 * The repro messages of the decode fuzzers are checked by tests/fuzz/repro_check.c.
 */
#include "check.h"
#include "compressor_helpers.h"
#include "core/internal.h"

#include <float.h>

static void fix_header_crc(uint8_t *m) {
    gcomp__put32(m + 36, gcomp__crc32c(0, m, 36));
}

static void fix_blob_crc(uint8_t *b, size_t len) {
    gcomp__put32(b + len - 4, gcomp__crc32c(0, b, len - 4));
}

static void test_scale(void) {
    const size_t n = 4000;
    float *g = malloc(n * 4), *acc = calloc(n, 4);
    test_fill(g, n, 3);
    const char *specs[] = {
        "topk:density=0.05", "randomk:density=0.1", "none", "threshold:tau=1,values=f16", "qsgd",
        "block:block=16"};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        gcomp_compressor *c = make(specs[s], n);
        msg m = encode(c, g);
        for (size_t b = 0; b < 3; b++) {
            CHECK_MSG(gcomp_decode_add(m.p, m.len, acc, n, bad[b]) == GCOMP_E_ARG, "%s scale %g",
                      specs[s], (double)bad[b]);
            CHECK(gcomp_compressor_decode_add(c, m.p, m.len, acc, bad[b]) == GCOMP_E_ARG);
        }
        for (size_t i = 0; i < n; i++)
            if (acc[i] != 0.0f) {
                CHECK_MSG(0, "%s: accumulator written at %zu", specs[s], i);
                break;
            }
        /* The largest finite scale is allowed. */
        CHECK_OK(gcomp_decode_add(m.p, m.len, NULL, 0, FLT_MAX));
        free(m.p);
        gcomp_compressor_free(c);
    }
    free(g);
    free(acc);
}

static void test_seeded_validate(void) {
    const size_t n = 1000;
    float *g = malloc(n * 4);
    test_fill(g, n, 5);
    gcomp_compressor *c = make("randomk:density=0.05,seed=3", n);
    msg m = encode(c, g);
    gcomp__put64(m.p + 16, UINT32_MAX);
    fix_header_crc(m.p);
    /* Valid (k <= n): a receiver of 2^32 - 1 floats could add it.  Validation alone must
     * not allocate anything of n's size; with every allocation failing it still succeeds. */
    gcomp__test_fail_alloc_after(0);
    CHECK_OK(gcomp_decode_add(m.p, m.len, NULL, 0, 1.0f));
    gcomp__test_fail_alloc_after((size_t)-1);
    free(m.p);
    gcomp_compressor_free(c);
    free(g);
}

static void test_powersgd_overflow(void) {
    const size_t rows = 8, cols = 8, n = rows * cols;
    gcomp_compressor *c = NULL;
    CHECK_OK(
        gcomp_compressor_create(&c, "powersgd:rank=4,min_compression_rate=0", n, rows, cols, NULL));
    float g[64], out[64];
    test_fill(g, n, 9);
    size_t cap = gcomp_state_bound(c), l0, l1;
    uint8_t *s0 = malloc(cap), *s1 = malloc(cap);
    CHECK_OK(gcomp_state_save(c, s0, cap, &l0));
    float *p, *q;
    size_t np, nq;
    unsigned rounds;
    CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
    CHECK(rounds == 1);
    CHECK_OK(gcomp_lowrank_after_p(c, &q, &nq));
    /* The "summed" Q of a transport: each entry finite, but P^ Q^T passes FLT_MAX before
     * the 1/4 scale brings it back: sum_k max|P_k| * 3e38 > FLT_MAX for orthonormal P^. */
    for (size_t i = 0; i < nq; i++) q[i] = (i & 1) ? 3e38f : -3e38f;
    for (size_t i = 0; i < n; i++) out[i] = 7.0f;
    gcomp_status st = gcomp_lowrank_finish(c, out, 0.25f);
    CHECK_MSG(st == GCOMP_E_NONFINITE, "finish: %s", gcomp_status_str(st));
    for (size_t i = 0; i < n; i++) CHECK(isfinite(out[i]));
    CHECK_OK(gcomp_state_save(c, s1, cap, &l1));
    CHECK(l0 == l1 && memcmp(s0, s1, l0) == 0);
    CHECK(gcomp_compressor_step(c) == 0);
    /* And the next step starts cleanly. */
    CHECK_OK(gcomp_lowrank_begin(c, g, &p, &np, &rounds));
    gcomp_lowrank_abort(c);
    free(s0);
    free(s1);
    gcomp_compressor_free(c);
}

/* A blob of `spec` for a rows x cols tensor, with field `off` (u64) set to v and the CRC
 * repaired; from_state must answer `want`. */
static void blob_case(const char *spec, size_t rows, size_t cols, size_t off, uint64_t v,
                      gcomp_status want, const char *what) {
    size_t n = rows * cols;
    gcomp_compressor *c = NULL, *d = NULL;
    CHECK_OK(gcomp_compressor_create(&c, spec, n, rows, cols, NULL));
    size_t cap = gcomp_state_bound(c), len;
    uint8_t *b = malloc(cap);
    CHECK_OK(gcomp_state_save(c, b, cap, &len));
    gcomp__put64(b + off, v);
    fix_blob_crc(b, len);
    gcomp_error err = {0};
    gcomp_status st = gcomp_compressor_from_state(&d, b, len, &err);
    CHECK_MSG(st == want, "%s: from_state %s (%s), want %s", what, gcomp_status_str(st),
              err.message, gcomp_status_str(want));
    CHECK(d == NULL || st == GCOMP_OK);
    gcomp_compressor_free(d);
    st = gcomp_state_load(c, b, len);
    CHECK_MSG(st == want || (want == GCOMP_E_STATE && st == GCOMP_E_MISMATCH) ||
                  (want == GCOMP_OK && st == GCOMP_E_MISMATCH),
              "%s: state_load %s", what, gcomp_status_str(st));
    free(b);
    gcomp_compressor_free(c);
}

static void test_state_blobs(void) {
    /* Offsets in the blob (docs/FORMAT.md, "state"): 16 n, 24 rows, 32 cols, 48 epoch. */
    blob_case("powersgd:rank=2", 10, 20, 24, 7, GCOMP_E_STATE, "rows*cols != n");
    blob_case("powersgd:rank=2", 10, 20, 32, 0, GCOMP_E_STATE, "cols 0");
    blob_case("topk:feedback=ef", 10, 20, 24, 200, GCOMP_E_STATE, "200x20 for 200");
    blob_case("topk:feedback=ef", 10, 20, 16, 0, GCOMP_E_STATE, "n = 0");
    blob_case("topk", 1, 100, 16, (uint64_t)1 << 33, GCOMP_E_STATE, "n = 2^33");
    double inf = INFINITY;
    uint64_t bits;
    memcpy(&bits, &inf, 8);
    blob_case("topk:feedback=ef", 10, 20, 48, bits, GCOMP_E_STATE, "epoch inf");
    blob_case("topk:feedback=ef", 10, 20, 24, 10, GCOMP_OK, "unchanged rows");

    /* A NUL inside the spec text: it would parse as its prefix. */
    gcomp_compressor *c = make("topk:feedback=ef", 100), *d = NULL;
    size_t cap = gcomp_state_bound(c), len;
    uint8_t *b = malloc(cap);
    CHECK_OK(gcomp_state_save(c, b, cap, &len));
    b[56 + 4] = 0; /* "topk\0..." */
    fix_blob_crc(b, len);
    CHECK(gcomp_compressor_from_state(&d, b, len, NULL) == GCOMP_E_STATE);
    CHECK(d == NULL);

    /* A short blob claiming n = 2^32 - 1 with error feedback: the feedback section must hold
     * 4n bytes, so it is refused before create allocates 8n.  One allocation (the sizing
     * shell) is all it may take. */
    CHECK_OK(gcomp_state_save(c, b, cap, &len));
    gcomp__put64(b + 16, UINT32_MAX);
    fix_blob_crc(b, len);
    gcomp__test_fail_alloc_after(1);
    gcomp_status st = gcomp_compressor_from_state(&d, b, len, NULL);
    gcomp__test_fail_alloc_after((size_t)-1);
    CHECK_MSG(st == GCOMP_E_STATE, "short blob for 2^32-1: %s", gcomp_status_str(st));
    CHECK(d == NULL);
    free(b);
    gcomp_compressor_free(c);
}

static void test_wrapped_shape(void) {
    const size_t n = 10, rows = 2, cols = ((size_t)1 << 63) + 5; /* rows * cols wraps to 10 */
    const size_t n2 = 12, rows2 = 4, cols2 = ((size_t)1 << 62) + 3;
    CHECK(rows * cols == n && rows2 * cols2 == n2); /* the wrap itself */
    gcomp_compressor *c = (gcomp_compressor *)1;
    gcomp_error e = {0};
    CHECK_EQ_INT(gcomp_compressor_create(&c, "cols:density=0.5", n, rows, cols, &e), GCOMP_E_ARG);
    CHECK(c == NULL);
    CHECK_EQ_INT(gcomp_compressor_create(&c, "powersgd:rank=1", n2, rows2, cols2, &e), GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "does not hold"), "%s", e.message);
    CHECK(c == NULL);
    /* the real shapes of those sizes still go */
    CHECK_OK(gcomp_compressor_create(&c, "cols:density=0.5", n, 2, 5, &e));
    gcomp_compressor_free(c);
    gcomp_tensor_desc t = {"w", n2, rows2, cols2};
    gcomp_policy *p = NULL;
    CHECK_OK(gcomp_policy_create(&p, "spec=powersgd:rank=1;min_elements=1", &e));
    if (p) {
        gcomp_layer_plan ch;
        CHECK_EQ_INT(gcomp_policy_choose(p, &t, &ch, &e), GCOMP_E_ARG);
        gcomp_policy_free(p);
    }
    gcomp_cost_tensor ct = {
        .name = "w", .spec = "powersgd:rank=1", .n = n2, .rows = rows2, .cols = cols2};
    gcomp_cost_model *m = NULL;
    CHECK_EQ_INT(gcomp_cost_model_create(&m, &ct, 1, 2, 1, NULL, &e), GCOMP_E_ARG);
    CHECK(m == NULL);
}

int main(void) {
    test_scale();
    test_seeded_validate();
    test_powersgd_overflow();
    test_state_blobs();
    test_wrapped_shape();
    return CHECK_DONE();
}

/*
 * test_mpi_slice.c - the MPI layer's own formats and arithmetic, without mpirun (the
 * test compiles src/mpi/mpi_util.c in, since the library hides these symbols):
 *   - sparse-allreduce slices round-trip (f32, f16, bf16, dense fallback, empty), and a
 *     hostile slice (truncated, extended, bad kind, reserved bits, bad counts, indices past
 *     the region, oversized varints, NaN, random byte flips) is rejected before anything
 *     is added;
 *   - the half casts and the f16/bf16 sum op agree bit for bit with the core's value
 *     coders;
 *   - random-k positions re-derived from the key equal what the core decoder writes.
 */
#include "check.h"
#include "mpi_internal.h"

#include <stdbool.h>

static unsigned long long rng = 12345;

static void sparse_vec(float *x, size_t n, double density, int kind) {
    for (size_t i = 0; i < n; i++) {
        x[i] = 0.0f;
        if (test_uniform(&rng) < density) {
            float g = test_gauss(&rng);
            if (kind == 1) g = gm_f16_to_f32(gm_f32_to_f16(g));
            if (kind == 2) g = gm_bf16_to_f32(gm_f32_to_bf16(g * 1e6f)); /* not f16-exact */
            x[i] = g == 0.0f ? 1.0f : g;
        }
    }
}

static void roundtrip(size_t n, double density, int kind, int want_kind) {
    float *x = malloc(n * 4), *orig = malloc(n * 4), *acc = calloc(n, 4);
    uint8_t *buf = malloc(gm_slice_bound(n) + 1);
    sparse_vec(x, n, density, kind);
    memcpy(orig, x, n * 4);
    size_t len = gm_slice_encode(x, n, buf);
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        CHECK(x[i] == 0.0f); /* the encoder leaves the region zero */
        any = any || orig[i] != 0.0f;
    }
    CHECK(len <= gm_slice_bound(n));
    if (!any)
        CHECK(len == 0);
    else
        CHECK_MSG(buf[0] == want_kind, "kind %d, wanted %d", buf[0], want_kind);
    CHECK_OK(gm_slice_decode_add(buf, len, n, acc));
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(acc[i] == orig[i], "i=%zu %g vs %g", i, acc[i], orig[i]);
    free(x);
    free(orig);
    free(acc);
    free(buf);
}

/* A corrupt slice must be refused and leave acc untouched. */
static void expect_bad(const uint8_t *s, size_t len, size_t n, const char *what) {
    float *acc = malloc(n * 4), *copy = malloc(n * 4);
    for (size_t i = 0; i < n; i++) acc[i] = copy[i] = (float)i;
    gcomp_status st = gm_slice_decode_add(s, len, n, acc);
    CHECK_MSG(st == GCOMP_E_CORRUPT, "%s: %s", what, gcomp_status_str(st));
    CHECK_MSG(!memcmp(acc, copy, n * 4), "%s: accumulator written", what);
    free(acc);
    free(copy);
}

static void hostile(void) {
    size_t n = 300;
    float x[300] = {0};
    x[3] = 1.5f;
    x[100] = -2.25f;
    x[299] = 7.0f;
    x[150] = 0.1f; /* not f16-exact: f32 slice */
    uint8_t buf[2000], bad[2000];
    size_t len = gm_slice_encode(x, n, buf);
    CHECK(buf[0] == GM_SLICE_SPARSE_F32);
    for (size_t l = 1; l < len; l++) expect_bad(buf, l, n, "truncated");
    memcpy(bad, buf, len);
    bad[len] = 0;
    expect_bad(bad, len + 1, n, "trailing byte");
    memcpy(bad, buf, len);
    bad[0] = 9;
    expect_bad(bad, len, n, "bad kind");
    memcpy(bad, buf, len);
    bad[2] = 1;
    expect_bad(bad, len, n, "reserved");
    memcpy(bad, buf, len);
    memset(bad + 4, 0, 4);
    expect_bad(bad, len, n, "m = 0");
    memcpy(bad, buf, len);
    bad[4] = 0xff;
    bad[5] = 0xff;
    expect_bad(bad, len, n, "m > region");
    expect_bad(buf, len, 299, "index past the region"); /* x[299] in a region of 299 */
    /* an index gap of 5 continuation bytes (> 2^32) */
    uint8_t v[] = {0, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0x80, 0x3f};
    expect_bad(v, sizeof v, n, "oversized varint");
    uint8_t nanv[] = {0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0xc0, 0x7f};
    expect_bad(nanv, sizeof nanv, n, "NaN value");
    uint8_t infh[] = {GM_SLICE_SPARSE_F16, 0, 0, 0, 1, 0, 0, 0, 5, 0x00, 0x7c};
    expect_bad(infh, sizeof infh, n, "Inf half");
    /* dense with the wrong count */
    float y[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t dense[64];
    size_t dl = gm_slice_encode(y, 8, dense);
    CHECK(dense[0] == GM_SLICE_DENSE_F32 && dl == gm_slice_bound(8));
    expect_bad(dense, dl, 9, "dense, wrong region");
    expect_bad(dense, dl - 1, 8, "dense, truncated");
    /* random single-byte flips: never a crash; either refused cleanly or a valid slice */
    for (int t = 0; t < 3000; t++) {
        memcpy(bad, buf, len);
        size_t at = (size_t)(test_uniform(&rng) * (double)len);
        bad[at] ^= (uint8_t)(1u << (t % 8));
        float acc[300] = {0};
        gcomp_status st = gm_slice_decode_add(bad, len, n, acc);
        CHECK(st == GCOMP_OK || st == GCOMP_E_CORRUPT);
    }
}

static void halves(void) {
    /* Values of every kind: ties, subnormals, saturation. */
    size_t n = 4096;
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        double u = test_uniform(&rng);
        x[i] = i % 5 == 0   ? (float)(u * 1e-6)
               : i % 5 == 1 ? (float)((u - 0.5) * 2e5)
               : i % 5 == 2 ? ldexpf(1.0f + (float)(i % 2048) / 2048.0f, -14 - (int)(i % 12))
                            : test_gauss(&rng);
    }
    const char *specs[] = {"none:values=f16", "none:values=bf16"};
    for (int bf = 0; bf < 2; bf++) {
        gcomp_compressor *c;
        CHECK_OK(gcomp_compressor_create(&c, specs[bf], n, 0, 0, NULL));
        size_t cap = gcomp_encode_bound(c), len, nv;
        uint8_t *m = malloc(cap);
        CHECK_OK(gcomp_encode(c, x, m, cap, &len));
        const uint8_t *vals;
        uint64_t key;
        CHECK_OK(gm_linear_values(m, len, n, bf ? 2 : 1, &vals, &nv, &key));
        CHECK(nv == n && key == 0);
        uint16_t *mine = malloc(n * 2);
        gm_f32_to_halves(x, n, bf, mine);
        CHECK_MSG(!memcmp(mine, vals, n * 2), "%s: casts differ from the value coder", specs[bf]);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = bf ? gm_f32_to_bf16(x[i]) : gm_f32_to_f16(x[i]);
            CHECK(h == mine[i]);
        }
        /* the sum op: vector path and scalar tail against the scalar formula */
        uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
        memcpy(a, mine, n * 2);
        for (size_t i = 0; i < n; i++) b[i] = mine[(i * 7 + 3) % n];
        uint16_t *want = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            float s = bf ? gm_bf16_to_f32(a[i]) + gm_bf16_to_f32(b[i])
                         : gm_f16_to_f32(a[i]) + gm_f16_to_f32(b[i]);
            want[i] = bf ? gm_f32_to_bf16(s) : gm_f32_to_f16(s);
        }
        int len_i = (int)n - 3;
        MPI_Datatype dt = MPI_DATATYPE_NULL;
        if (bf)
            gm_op_bf16_sum(a, b, &len_i, &dt);
        else
            gm_op_f16_sum(a, b, &len_i, &dt);
        CHECK(!memcmp(b, want, (n - 3) * 2));
        float *back = malloc(n * 4);
        gm_halves_to_f32(mine, n, bf, 2.0f, back);
        for (size_t i = 0; i < n; i++)
            CHECK(back[i] == 2.0f * (bf ? gm_bf16_to_f32(mine[i]) : gm_f16_to_f32(mine[i])));
        free(a);
        free(b);
        free(want);
        free(back);
        free(mine);
        free(m);
        gcomp_compressor_free(c);
    }
    free(x);
}

static void seeded(void) {
    size_t sizes[] = {1, 7, 1000, 65537};
    for (size_t s = 0; s < 4; s++) {
        size_t n = sizes[s];
        gcomp_compressor *c;
        CHECK_OK(gcomp_compressor_create(&c, "randomk:density=0.05,seed=42", n, 0, 0, NULL));
        float *x = malloc(n * 4), *acc = calloc(n, 4);
        for (size_t i = 0; i < n; i++) x[i] = (float)(i + 1);
        size_t cap = gcomp_encode_bound(c), len, nv;
        uint8_t *m = malloc(cap);
        for (int step = 0; step < 3; step++) {
            CHECK_OK(gcomp_encode(c, x, m, cap, &len));
            const uint8_t *vals;
            uint64_t key;
            CHECK_OK(gm_linear_values(m, len, n, 0, &vals, &nv, &key));
            uint32_t *pos = malloc((nv + 1) * 4);
            gm_buf bits = {0};
            CHECK_OK(gm_seeded_positions(key, n, nv, pos, &bits));
            memset(acc, 0, n * 4);
            CHECK_OK(gcomp_decode_add(m, len, acc, n, 1.0f));
            size_t j = 0;
            for (size_t i = 0; i < n; i++)
                if (acc[i] != 0.0f) {
                    CHECK_MSG(j < nv && pos[j] == i, "n=%zu: position %zu", n, i);
                    j++;
                }
            CHECK(j == nv);
            gm_buf_free(&bits);
            free(pos);
        }
        free(m);
        free(x);
        free(acc);
        gcomp_compressor_free(c);
    }
}

int main(void) {
    roundtrip(1, 1.0, 0, GM_SLICE_DENSE_F32);
    roundtrip(1000, 0.03, 0, GM_SLICE_SPARSE_F32);
    roundtrip(1000, 0.03, 1, GM_SLICE_SPARSE_F16);
    roundtrip(1000, 0.03, 2, GM_SLICE_SPARSE_BF16);
    roundtrip(1000, 0.9, 0, GM_SLICE_DENSE_F32);
    roundtrip(1000, 0.0, 0, 0);
    roundtrip(100003, 0.001, 0, GM_SLICE_SPARSE_F32);
    roundtrip(17, 0.5, 1, GM_SLICE_SPARSE_F16);
    hostile();
    halves();
    seeded();
    return CHECK_DONE();
}

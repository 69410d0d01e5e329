/*
 * test_block.c - the structured selectors `block`, `rows` and `cols`:
 *   - the selected set equals a reference that computes every unit's norm in double and
 *     sorts (norm descending, index ascending), for l2 and l1, partial last blocks, block
 *     sizes from 1 to larger than n, and data with tied and all-zero units;
 *   - the message size is exact: header + sparse section + the smallest index coding of
 *     the chosen units (docs/FORMAT.md) + 4 bytes per value;
 *   - the decoded tensor is x on the chosen units and 0 elsewhere (run / stride
 *     expansion), and inspect reports the value count;
 *   - rows/cols without a shape, NaN/Inf, huge finite values, error feedback's
 *     conservation, truncated messages and failing allocations.
 */
#include "check.h"
#include "gradcomp.h"
#include "core/internal.h"

#include <stdint.h>

enum { BLOCK, ROWS, COLS };

/* ---- reference ---------------------------------------------------------------------------- */

static const double *ref_norm;
static int by_norm(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (ref_norm[i] != ref_norm[j]) return ref_norm[i] > ref_norm[j] ? -1 : 1;
    return i < j ? -1 : 1;
}
static int by_index(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    return (i > j) - (i < j);
}

/* Unit u's elements: positions pos(u, 0..len). */
static size_t unit_pos(int kind, size_t u, size_t r, size_t B, size_t cols) {
    if (kind == COLS) return u + r * cols;
    return u * B + r;
}

/* Chosen units (ascending) for kind over x; *k receives K.  The norm is the plain one:
 * the library's scaling by 1/len (same for every unit) must not change the order. */
static uint32_t *ref_select(int kind, const float *x, size_t n, size_t B, size_t rows, size_t cols,
                            double density, int l1, size_t *k, size_t *units_out) {
    size_t units = kind == BLOCK ? (n + B - 1) / B : kind == ROWS ? rows : cols;
    size_t len = kind == BLOCK ? B : kind == ROWS ? cols : rows;
    double *norm = malloc(units * sizeof(double));
    for (size_t u = 0; u < units; u++) {
        double s = 0;
        for (size_t r = 0; r < len; r++) {
            size_t p = unit_pos(kind, u, r, kind == ROWS ? cols : B, cols);
            if (kind != COLS && p >= n) break;
            s += l1 ? fabs((double)x[p]) : (double)x[p] * x[p];
        }
        /* Rounded as the library stores it (a float), so equal floats tie the same way. */
        norm[u] = (double)(float)(l1 ? s / (double)len : sqrt(s / (double)len));
    }
    uint32_t *ord = malloc(units * 4);
    for (size_t u = 0; u < units; u++) ord[u] = (uint32_t)u;
    ref_norm = norm;
    qsort(ord, units, 4, by_norm);
    size_t K = (size_t)ceil(density * (double)units);
    if (K > units) K = units;
    qsort(ord, K, 4, by_index);
    free(norm);
    *k = K;
    *units_out = units;
    return ord;
}

/* Bytes of the smallest index coding of k ascending entries below U (docs/FORMAT.md). */
static size_t index_bytes(const uint32_t *e, size_t k, size_t U) {
    size_t bitmap = (U + 7) / 8, varint = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t g = i ? e[i] - e[i - 1] - 1 : e[0];
        varint += 1 + (g >= 1u << 7) + (g >= 1u << 14) + (g >= 1u << 21) + (g >= 1u << 28);
    }
    unsigned l = 0;
    for (size_t q = U / k; q > 1; q >>= 1) l++;
    size_t ef = (k * l + 7) / 8 + (k + (U >> l) + 1 + 7) / 8;
    size_t best = bitmap < varint ? bitmap : varint;
    return ef < best ? ef : best;
}

/* ---- one case ------------------------------------------------------------------------------- */

static int run_case(int kind, const float *x, size_t n, size_t B, size_t rows, size_t cols,
                    double density, int l1) {
    char spec[160];
    const char *norm = l1 ? "l1" : "l2";
    if (kind == BLOCK)
        snprintf(spec, sizeof spec, "block:density=%.9g,block=%zu,norm=%s", density, B, norm);
    else
        snprintf(spec, sizeof spec, "%s:density=%.9g,norm=%s", kind == ROWS ? "rows" : "cols",
                 density, norm);
    gcomp_compressor *c = NULL;
    gcomp_error err;
    gcomp_status st = gcomp_compressor_create(&c, spec, n, kind == BLOCK ? 0 : rows,
                                              kind == BLOCK ? 0 : cols, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: %s", spec, err.message);
    if (!c) return 1;
    size_t cap = gcomp_encode_bound(c), len = 0;
    uint8_t *m = malloc(cap);
    CHECK_OK(gcomp_encode(c, x, m, cap, &len));

    size_t K, units;
    uint32_t *sel = ref_select(kind, x, n, B > n ? n : B, rows, cols, density, l1, &K, &units);
    size_t Beff = B > n ? n : B;
    float *want = calloc(n, 4), *got = calloc(n, 4);
    size_t nv = 0;
    for (size_t e = 0; e < K; e++) {
        size_t ulen = kind == BLOCK ? Beff : kind == ROWS ? cols : rows;
        for (size_t r = 0; r < ulen; r++) {
            size_t p = kind == BLOCK  ? sel[e] * Beff + r
                       : kind == ROWS ? sel[e] * cols + r
                                      : sel[e] + r * cols;
            if (p >= n) break;
            want[p] = x[p];
            nv++;
        }
    }
    CHECK_OK(gcomp_decode_add(m, len, got, n, 1.0f));
    int bad = memcmp(want, got, n * 4) != 0;
    CHECK_MSG(!bad, "%s n=%zu: selected set differs from the sorted-norm reference", spec, n);
    size_t exact = GCOMP_HEADER_SIZE + 24 + index_bytes(sel, K, units) + 4 * nv;
    CHECK_MSG(len == exact, "%s n=%zu: %zu bytes, want %zu", spec, n, len, exact);
    gcomp_message_info info;
    CHECK_OK(gcomp_message_inspect(m, len, &info));
    CHECK_EQ_INT(info.elements_sent, nv);
    CHECK_EQ_INT(info.codec_id, kind == BLOCK ? 8 : kind == ROWS ? 9 : 10);
    /* Every truncation is refused without touching the accumulator. */
    for (size_t cut = 0; cut < len; cut += 1 + len / 50) {
        memset(got, 0, n * 4);
        CHECK(gcomp_decode_add(m, cut, got, n, 1.0f) != GCOMP_OK);
        int touched = 0;
        for (size_t i = 0; i < n; i++) touched |= got[i] != 0.0f;
        CHECK(!touched);
    }
    free(sel);
    free(want);
    free(got);
    free(m);
    gcomp_compressor_free(c);
    return bad;
}

static void test_block_reference(void) {
    size_t ns[] = {1, 7, 64, 1000, 4099, 100000, 1234567};
    size_t Bs[] = {1, 3, 64, 1000, 5000000};
    double dens[] = {0.001, 0.01, 0.3, 1.0};
    unsigned long long seed = 1;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        size_t n = ns[a];
        float *x = malloc(n * 4);
        for (int data = 0; data < 3; data++) {
            test_fill(x, n, seed++);
            if (data == 1) /* ties: every block of 8 a copy of the first few, some all zero */
                for (size_t i = 0; i < n; i++) x[i] = (i / 8) % 5 == 4 ? 0.0f : x[i % 24];
            if (data == 2) /* a few huge values and tiny ones */
                for (size_t i = 0; i < n; i += 997) x[i] = (i / 997) % 2 ? 1e30f : 1e-30f;
            for (size_t b = 0; b < sizeof Bs / sizeof *Bs; b++)
                for (size_t d = 0; d < sizeof dens / sizeof *dens; d++)
                    for (int l1 = 0; l1 < 2; l1++) {
                        if (n > 100000 && (Bs[b] == 1 || d == 3)) continue; /* reference is slow */
                        run_case(BLOCK, x, n, Bs[b], 0, 0, dens[d], l1);
                    }
        }
        free(x);
    }
}

static void test_rows_cols_reference(void) {
    size_t shapes[][2] = {{1, 1},   {1, 50},   {50, 1},   {7, 13},
                          {64, 64}, {300, 17}, {17, 300}, {1000, 1000}};
    double dens[] = {0.001, 0.05, 0.5, 1.0};
    unsigned long long seed = 99;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *x = malloc(n * 4);
        for (int data = 0; data < 2; data++) {
            test_fill(x, n, seed++);
            if (data == 1) /* tied rows and columns: a periodic matrix */
                for (size_t i = 0; i < n; i++)
                    x[i] = (float)((i / cols) % 3) + (float)((i % cols) % 4);
            for (size_t d = 0; d < sizeof dens / sizeof *dens; d++)
                for (int l1 = 0; l1 < 2; l1++) {
                    run_case(ROWS, x, n, 0, rows, cols, dens[d], l1);
                    run_case(COLS, x, n, 0, rows, cols, dens[d], l1);
                }
        }
        free(x);
    }
}

/* ---- errors and properties ---------------------------------------------------------------------
 */

static void test_errors(void) {
    gcomp_compressor *c = NULL;
    gcomp_error err;
    CHECK_EQ_INT(gcomp_compressor_create(&c, "rows:density=0.1", 100, 0, 0, &err), GCOMP_E_ARG);
    CHECK(c == NULL && strstr(err.message, "shape"));
    CHECK_EQ_INT(gcomp_compressor_create(&c, "cols", 100, 0, 0, &err), GCOMP_E_ARG);
    CHECK(strstr(err.message, "cols") && strstr(err.message, "shape"));
    const char *bad[] = {"block:block=0", "block:norm=l3", "block:density=0", "rows:block=4",
                         "cols:density=2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_EQ_INT(gcomp_compressor_create(&c, bad[i], 100, 10, 10, &err), GCOMP_E_SPEC);
    CHECK(gcomp_codec_find("rows")->flags & GCOMP_CODEC_NEEDS_SHAPE);
    CHECK(!(gcomp_codec_find("block")->flags & GCOMP_CODEC_NEEDS_SHAPE));

    /* NaN / Inf anywhere: refused; huge finite values are fine (the norm is a double). */
    const char *specs[] = {"block:density=0.01,block=64", "block:density=0.01,norm=l1",
                           "rows:density=0.1", "cols:density=0.1,norm=l1"};
    const size_t rows = 100, cols = 100, n = rows * cols;
    float *x = malloc(n * 4), *acc = calloc(n, 4);
    uint8_t *m = malloc(1 << 20);
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        CHECK_OK(gcomp_compressor_create(&c, specs[s], n, rows, cols, &err));
        if (!c) continue;
        size_t len;
        for (int k = 0; k < 3; k++) {
            test_fill(x, n, 5);
            x[(size_t)k * 3001 + 17] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
            CHECK_EQ_INT(gcomp_encode(c, x, m, gcomp_encode_bound(c), &len), GCOMP_E_NONFINITE);
        }
        test_fill(x, n, 6);
        for (size_t i = 0; i < n; i++) x[i] *= 1e-3f;
        x[4321] = 3.4e38f;
        x[4322] = -3.4e38f;
        CHECK_OK(gcomp_encode(c, x, m, gcomp_encode_bound(c), &len));
        memset(acc, 0, n * 4);
        CHECK_OK(gcomp_decode_add(m, len, acc, n, 1.0f));
        CHECK(acc[4321] == 3.4e38f && acc[4322] == -3.4e38f);
        CHECK_EQ_INT(gcomp_compressor_step(c), 1);
        gcomp_compressor_free(c);
    }
    free(x);
    free(acc);
    free(m);
}

/* Error feedback around a structured selector: sum(decoded) + e = sum(g). */
static void test_feedback(void) {
    const char *specs[] = {"block:density=0.02,block=32,feedback=ef",
                           "rows:density=0.05,feedback=ef,values=f16",
                           "cols:density=0.05,feedback=ef,values=bf16"};
    const size_t rows = 60, cols = 70, n = rows * cols, steps = 20;
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        gcomp_compressor *c = NULL;
        CHECK_OK(gcomp_compressor_create(&c, specs[s], n, rows, cols, NULL));
        if (!c) continue;
        double *sum_g = calloc(n, 8), *sum_d = calloc(n, 8);
        float *x = malloc(n * 4), *out = malloc(n * 4);
        uint8_t *m = malloc(gcomp_encode_bound(c));
        for (size_t t = 0; t < steps; t++) {
            test_fill(x, n, 500 + t);
            size_t len;
            CHECK_OK(gcomp_encode(c, x, m, gcomp_encode_bound(c), &len));
            memset(out, 0, n * 4);
            CHECK_OK(gcomp_decode_add(m, len, out, n, 1.0f));
            for (size_t i = 0; i < n; i++) {
                sum_g[i] += x[i];
                sum_d[i] += out[i];
            }
        }
        const float *e = gcomp_compressor_residual(c);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs(sum_d[i] + e[i] - sum_g[i]);
            worst = d > worst ? d : worst;
        }
        CHECK_MSG(worst < 1e-3, "%s: conservation off by %g", specs[s], worst);
        free(sum_g);
        free(sum_d);
        free(x);
        free(out);
        free(m);
        gcomp_compressor_free(c);
    }
}

/* A stride message must have unit * stride = n; a run message nvals = the runs' total. */
static void test_hostile(void) {
    const size_t rows = 20, cols = 30, n = rows * cols;
    float *x = malloc(n * 4), *acc = calloc(n, 4);
    test_fill(x, n, 8);
    gcomp_compressor *c = NULL;
    CHECK_OK(gcomp_compressor_create(&c, "cols:density=0.1", n, rows, cols, NULL));
    if (!c) return;
    size_t cap = gcomp_encode_bound(c), len;
    uint8_t *m = malloc(cap);
    CHECK_OK(gcomp_encode(c, x, m, cap, &len));
    /* Decoding with a different n (the receiver's) is a mismatch, not a wrong write. */
    float *small = calloc(n - 1, 4);
    CHECK_EQ_INT(gcomp_decode_add(m, len, small, n - 1, 1.0f), GCOMP_E_MISMATCH);
    /* Flip each byte of the payload: refused (checksum) or, if accepted, never crashes. */
    for (size_t i = GCOMP_HEADER_SIZE; i < len; i++) {
        m[i] ^= 0x5a;
        CHECK(gcomp_decode_add(m, len, acc, n, 1.0f) != GCOMP_OK);
        m[i] ^= 0x5a;
    }
    CHECK_OK(gcomp_decode_add(m, len, NULL, n, 1.0f));
    free(small);
    free(m);
    free(x);
    free(acc);
    gcomp_compressor_free(c);
}

static void test_alloc_failures(void) {
    const size_t rows = 40, cols = 50, n = rows * cols;
    float *x = malloc(n * 4);
    test_fill(x, n, 3);
    const char *specs[] = {"block:density=0.1,block=16", "rows:density=0.1", "cols:density=0.1"};
    for (size_t s = 0; s < 3; s++)
        for (size_t k = 0; k < 10; k++) {
            gcomp_compressor *c = NULL;
            gcomp__test_fail_alloc_after(k);
            gcomp_status st = gcomp_compressor_create(&c, specs[s], n, rows, cols, NULL);
            gcomp__test_fail_alloc_after((size_t)-1);
            CHECK(st == GCOMP_OK || (st == GCOMP_E_NOMEM && !c));
            if (!c) continue;
            uint8_t buf[16384];
            size_t len;
            gcomp__test_fail_alloc_after(k % 3);
            st = gcomp_encode(c, x, buf, sizeof buf, &len);
            gcomp__test_fail_alloc_after((size_t)-1);
            CHECK(st == GCOMP_OK || st == GCOMP_E_NOMEM);
            gcomp_compressor_free(c);
        }
    free(x);
}

int main(void) {
    test_block_reference();
    test_rows_cols_reference();
    test_errors();
    test_feedback();
    test_hostile();
    test_alloc_failures();
    return CHECK_DONE();
}

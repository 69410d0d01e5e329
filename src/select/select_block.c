/*
 * select_block.c - structured sparsity: `block`, `rows` and `cols`.
 *
 * block  the tensor as a flat vector cut into blocks of `block=` elements (the last one
 *        may be partial); the K = ceil(density * nblocks) blocks of largest norm travel,
 *        one index per block (run expansion, unit = block).
 * rows   the K = ceil(density * rows) rows of a row-major rows x cols matrix with the
 *        largest norm (run expansion, unit = cols).
 * cols   the K = ceil(density * cols) columns with the largest norm (stride expansion,
 *        unit = rows, stride = cols).
 * Structured selection trades some of top-k's precision for an index per block instead
 * of per element, and for contiguous runs that a GPU or a BLAS kernel can use as is
 * (block-sparse gradients: Narang et al. 2017 "Block-sparse recurrent neural networks";
 * row/column sparsification of weight gradients: Wangni et al. 2018 discuss structured
 * variants; DGC's per-layer view).  The wire layout is the sparse section of
 * docs/FORMAT.md with expansion `run` or `stride`, so the generic decoder reads it.
 *
 * Algorithm (O(n), the gradient is read once to rank and once more only at the K chosen
 * units): one pass computes every unit's norm, then the exact top-K of that short norm
 * vector comes from gcomp__topk (O(nblocks), ties by the lower index), then the chosen
 * units are copied out.  The norm is accumulated in double, so no finite float input can
 * overflow or underflow it, and is stored as a float divided by the nominal unit length
 * (sqrt(sum x^2 / B) for l2, sum |x| / B for l1): that keeps it <= max |x| (finite in a
 * float) while ranking exactly as the plain norm, the partial last block included.  A
 * NaN or Inf anywhere makes its unit's sum non-finite, which is caught in the same pass.
 *
 * Rejected: sorting the blocks (O(nb log nb) and no better answer); float accumulation
 * (a block of 1e20s overflows to Inf and would read as a NaN gradient; tiny gradients
 * underflow to 0 and would rank as ties); ranking by the block's max |x| (one outlier
 * would drag a whole block along; the norm is what the papers use).
 */
#include "core/internal.h"

#include <float.h>
#include <math.h>

enum { UNIT_BLOCK, UNIT_ROW, UNIT_COL };

typedef struct block_state {
    int kind;
    bool l1;
    size_t units; /* nblocks, rows or cols */
    size_t len;   /* nominal elements per unit: block, cols or rows */
    float *norm;  /* one per unit, reused every step */
    double *acc;  /* cols: running per-column sums */
} block_state;

/* Sum of x^2 (or |x|) over x[0..m), in double, eight independent lanes so the compiler
 * vectorises it without reassociating a single running sum. */
static double unit_sum(const float *x, size_t m, bool l1) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    if (l1) {
        for (; j + 8 <= m; j += 8)
            for (int l = 0; l < 8; l++) a[l] += fabs((double)x[j + (size_t)l]);
        for (; j < m; j++) a[0] += fabs((double)x[j]);
    } else {
        for (; j + 8 <= m; j += 8)
            for (int l = 0; l < 8; l++) {
                double v = (double)x[j + (size_t)l];
                a[l] += v * v;
            }
        for (; j < m; j++) a[0] += (double)x[j] * (double)x[j];
    }
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* The ranking key of a unit from its sum; < 0 when the sum is not finite (NaN/Inf input). */
static float unit_key(double sum, size_t len, bool l1) {
    if (!(sum <= DBL_MAX)) return -1.0f;
    return (float)(l1 ? sum / (double)len : sqrt(sum / (double)len));
}

/* Norms of every unit into s->norm.  Returns GCOMP_E_NONFINITE for NaN/Inf input. */
static gcomp_status unit_norms(gcomp_compressor *c, block_state *s, const float *x) {
    size_t n = c->n;
    bool bad = false;
    if (s->kind == UNIT_COL) {
        size_t rows = c->rows, cols = c->cols;
        double *acc = s->acc;
        memset(acc, 0, cols * sizeof(double));
        for (size_t r = 0; r < rows; r++) {
            const float *row = x + r * cols;
            if (s->l1)
                for (size_t j = 0; j < cols; j++) acc[j] += fabs((double)row[j]);
            else
                for (size_t j = 0; j < cols; j++) acc[j] += (double)row[j] * (double)row[j];
        }
        for (size_t j = 0; j < cols; j++) {
            float k = unit_key(acc[j], rows, s->l1);
            bad |= k < 0.0f;
            s->norm[j] = k;
        }
    } else {
        size_t len = s->len;
        for (size_t u = 0; u < s->units; u++) {
            size_t start = u * len, m = n - start < len ? n - start : len;
            float k = unit_key(unit_sum(x + start, m, s->l1), len, s->l1);
            bad |= k < 0.0f;
            s->norm[u] = k;
        }
    }
    return bad ? GCOMP_E_NONFINITE : GCOMP_OK;
}

static size_t units_k(const gcomp_compressor *c, const block_state *s) {
    double k = ceil(gcomp__density(c) * (double)s->units);
    if (k < 1.0) k = 1.0;
    return k > (double)s->units ? s->units : (size_t)k;
}

/* Values carried by K units: full units, except that a partial last block is shorter. */
static size_t values_for(const gcomp_compressor *c, const block_state *s, size_t k) {
    size_t v = k * s->len;
    return v > c->n ? c->n : v;
}

static gcomp_status block_select(gcomp_compressor *c, const float *x, gcomp__selection *sel) {
    block_state *s = c->codec_state;
    gcomp_status st = unit_norms(c, s, x);
    if (st != GCOMP_OK) return st;
    size_t k = units_k(c, s);
    bool bad;
    st = gcomp__topk(c, s->norm, s->units, k, sel, &bad);
    if (st != GCOMP_OK) return st;
    if (bad) return GCOMP_E_NONFINITE; /* cannot happen: every key was checked */

    /* sel->idx holds the k chosen units, ascending; the index buffer already has room for
     * k entries, so reserving it again keeps them.  The values replace the norms. */
    size_t n = c->n, len = s->len, nv = 0;
    if (s->kind == UNIT_COL) {
        nv = k * c->rows;
    } else {
        for (size_t e = 0; e < k; e++) {
            size_t start = (size_t)sel->idx[e] * len;
            nv += n - start < len ? n - start : len;
        }
    }
    st = gcomp__sel_reserve(c, k, nv, sel);
    if (st != GCOMP_OK) return st;
    float *val = sel->val;
    const uint32_t *idx = sel->idx;
    if (s->kind == UNIT_COL) {
        /* Row by row, so x is read in address order; value j of column e is row j. */
        size_t rows = c->rows, cols = c->cols;
        for (size_t r = 0; r < rows; r++) {
            const float *row = x + r * cols;
            for (size_t e = 0; e < k; e++) val[e * rows + r] = row[idx[e]];
        }
        sel->expand = GCOMP__EXPAND_STRIDE;
        sel->unit = (uint32_t)rows;
        sel->stride = (uint32_t)cols;
    } else {
        size_t j = 0;
        for (size_t e = 0; e < k; e++) {
            size_t start = (size_t)idx[e] * len, m = n - start < len ? n - start : len;
            memcpy(val + j, x + start, m * sizeof(float));
            j += m;
        }
        sel->expand = GCOMP__EXPAND_RUN;
        sel->unit = (uint32_t)len;
        sel->stride = 0;
    }
    sel->k = k;
    sel->nvals = nv;
    sel->index_kind = 0;
    return GCOMP_OK;
}

static void block_fini(gcomp_compressor *c) {
    block_state *s = c->codec_state;
    if (!s) return;
    gcomp__free(s->norm);
    gcomp__free(s->acc);
    gcomp__free(s);
    c->codec_state = NULL;
}

static gcomp_status unit_init(gcomp_compressor *c, gcomp_error *err, int kind) {
    const char *name = c->spec.codec->info.name;
    size_t units, len;
    if (kind == UNIT_BLOCK) {
        double b = gcomp__spec_num(&c->spec, "block", 64);
        len = b > (double)c->n ? c->n : (size_t)b; /* one block when block >= n */
        units = (c->n + len - 1) / len;
    } else {
        if (c->rows == 0 || c->cols == 0)
            return gcomp__fail(err, GCOMP_E_ARG,
                               "%s: needs the tensor's matrix shape (rows x cols); got a vector "
                               "of %zu elements (pass rows and cols to create, --shape RxC in "
                               "the CLI, or use block:block=B)",
                               name, c->n);
        units = kind == UNIT_ROW ? c->rows : c->cols;
        len = kind == UNIT_ROW ? c->cols : c->rows;
    }
    block_state *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "%s: out of memory", name);
    s->kind = kind;
    s->l1 = gcomp__spec_num(&c->spec, "norm", 0) == 1;
    s->units = units;
    s->len = len;
    s->norm = gcomp__alloc(units * sizeof(float));
    if (kind == UNIT_COL) s->acc = gcomp__alloc(units * sizeof(double));
    c->codec_state = s;
    if (!s->norm || (kind == UNIT_COL && !s->acc)) {
        block_fini(c);
        return gcomp__fail(err, GCOMP_E_NOMEM, "%s: out of memory for %zu norms", name, units);
    }
    /* At create the density is the largest the compressor will use (a warm-up start). */
    size_t k = units_k(c, s);
    c->max_entries = k;
    c->max_values = values_for(c, s, k);
    return GCOMP_OK;
}

static gcomp_status block_init(gcomp_compressor *c, gcomp_error *err) {
    return unit_init(c, err, UNIT_BLOCK);
}
static gcomp_status rows_init(gcomp_compressor *c, gcomp_error *err) {
    return unit_init(c, err, UNIT_ROW);
}
static gcomp_status cols_init(gcomp_compressor *c, gcomp_error *err) {
    return unit_init(c, err, UNIT_COL);
}

#define PARAM_NORM                                                                                 \
    {                                                                                              \
        "norm", GCOMP_PARAM_ENUM, 0, 0, 0, "l2", "l2|l1",                                          \
            "how a block/row/column is ranked: l2 (Euclidean) or l1 norm"                          \
    }

static const gcomp_param_info block_params[] = {
    {"density", GCOMP_PARAM_FLOAT, 0, 1, 1, "0.01", NULL,
     "fraction of the blocks sent: K = ceil(density * ceil(n / block))"},
    {"block", GCOMP_PARAM_INT, 1, 4294967295.0, 0, "64", NULL,
     "elements per block (the last block may be shorter); one index travels per block"},
    PARAM_NORM,
    GCOMP__PARAM_VALUES,
};
static const gcomp_param_info rows_params[] = {
    {"density", GCOMP_PARAM_FLOAT, 0, 1, 1, "0.01", NULL,
     "fraction of the rows sent: K = ceil(density * rows)"},
    PARAM_NORM,
    GCOMP__PARAM_VALUES,
};
static const gcomp_param_info cols_params[] = {
    {"density", GCOMP_PARAM_FLOAT, 0, 1, 1, "0.01", NULL,
     "fraction of the columns sent: K = ceil(density * cols)"},
    PARAM_NORM,
    GCOMP__PARAM_VALUES,
};

const gcomp__codec gcomp__codec_block = {
    .info = {GCOMP__CODEC_NAME_ID(block), GCOMP_CODEC_SPARSE,
             "top-K blocks of block= elements by l2/l1 norm; one index per block", block_params,
             GCOMP__COUNTOF(block_params)},
    .select = block_select,
    .init = block_init,
    .fini = block_fini,
    .count = GCOMP__COUNT_FIXED,
};

const gcomp__codec gcomp__codec_rows = {
    .info = {GCOMP__CODEC_NAME_ID(rows), GCOMP_CODEC_SPARSE | GCOMP_CODEC_NEEDS_SHAPE,
             "top-K rows of a rows x cols gradient by l2/l1 norm (needs the shape)", rows_params,
             GCOMP__COUNTOF(rows_params)},
    .select = block_select,
    .init = rows_init,
    .fini = block_fini,
    .count = GCOMP__COUNT_FIXED,
};

const gcomp__codec gcomp__codec_cols = {
    .info = {GCOMP__CODEC_NAME_ID(cols), GCOMP_CODEC_SPARSE | GCOMP_CODEC_NEEDS_SHAPE,
             "top-K columns of a rows x cols gradient by l2/l1 norm (needs the shape)", cols_params,
             GCOMP__COUNTOF(cols_params)},
    .select = block_select,
    .init = cols_init,
    .fini = block_fini,
    .count = GCOMP__COUNT_FIXED,
};

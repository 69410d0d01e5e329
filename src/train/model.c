/*
 * model.c — MLP and LeNet-like CNN with a hand-written backward pass over OpenBLAS sgemm.
 *
 * A model is a short list of layers, each DENSE (sgemm + bias [+ ReLU]) or CONV (im2col + sgemm,
 * then 2×2 max-pool, bias and ReLU fused into one pass), ending in softmax cross-entropy. Every
 * buffer is allocated at create for max_batch samples: flat weights / gradients / momentum (one
 * block each, tensors back to back), each layer's output activations, two ping-pong buffers for
 * activation gradients, and one sample's im2col matrix and conv output as scratch.
 *
 * Forward:  dense  Z = A·Wᵀ (sgemm) then one pass Z = relu(Z + b);
 *           conv   per sample: col = im2col(x), Z = W·col (sgemm), then one pass over Z:
 *                  out = relu(max(2×2 window of Z) + b), remembering which cell won. Bias and
 *                  ReLU commute with max, so they are applied to the pooled values (4× fewer).
 * Loss:     mean over the batch of logsumexp(z) − z_y, accumulated in double; dZ = (softmax −
 *           onehot) / batch, so every gradient is that of the MEAN loss.
 * Backward: from the last layer to the first; a layer's bias gradient, then its weight gradient,
 *           are finished and reported through the callback before the layer computes the
 *           gradient of its input, so the caller's communication of layer l overlaps the compute
 *           of layers l−1 … 1 (the order PyTorch DDP's buckets see).
 *           dense  dZ = dA ⊙ [A > 0] fused with db = Σ_rows dZ; dW = dZᵀ·A_in; dA_in = dZ·W.
 *           conv   per sample: scatter the pooled gradient to the winning cells (dZ, with the
 *                  ReLU mask and db in the same pass), recompute col = im2col(x), dW += dZ·colᵀ,
 *                  dcol = Wᵀ·dZ into the same col buffer, col2im into dA_in.
 *
 * Rejected:
 * - im2col of the whole batch in one matrix for one big sgemm: for conv2 at batch 64 that is a
 *   10 MB matrix streamed through DRAM three times; one sample's col (≤ 160 KB for the default
 *   CNN) stays in L2 and the per-sample sgemm shapes (32 × 100 × 400) still run near peak.
 * - keeping every sample's col from forward for backward: recomputing it is one cached copy,
 *   storing it is the same 10 MB of DRAM traffic.
 * - direct convolution loops, Winograd, FFT: slower or much more code for 5×5 kernels this small.
 * - OpenMP in the elementwise passes: in data-parallel runs each rank owns one core, and those
 *   passes are a few percent of a step; OpenBLAS threads (if the caller allows them) cover the
 *   sgemms in single-process runs.
 * - PyTorch's default init (U(±1/sqrt(fan_in)), random biases): He-uniform keeps the ReLU
 *   activations' scale through depth; the output layer gets gain 1 so initial logits stay O(1).
 */
#define _DEFAULT_SOURCE /* posix_memalign and madvise under -std=c11 */

#include "model.h"
#include "train_alloc.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_HIDDEN 8
#define MAX_LAYERS (MAX_HIDDEN + 1)
#define MAX_TENSORS (2 * MAX_LAYERS)
#define TAIL_START UINT_MAX
#define MAX_WIDTH 65536
#define MAX_BATCH 65536
#define CONV_K 5

enum layer_kind { LAYER_DENSE, LAYER_CONV };

typedef struct layer {
    enum layer_kind kind;
    int relu;       /* dense: ReLU on the output (all but the last layer); conv: always */
    size_t in, out; /* per-sample lengths of the input and output activations */
    /* conv only: square input of side `side` with cin channels, k×k kernel, zero padding pad,
     * conv output side cs (even), pooled output side cs/2 with cout channels */
    size_t cin, side, cout, k, pad, cs;
    size_t wt, bt;    /* indices of the weight and bias tensors */
    float *act;       /* max_batch × out: output activations, after ReLU */
    uint16_t *argmax; /* conv: max_batch × out: offset in its cs×cs plane of each window's max
                       * (cs ≤ 28, so 16 bits hold it: 4× less than the winners' full indices) */
} layer;

struct gtrain_model {
    size_t max_batch, nlayers, ntensors, nparams;
    layer layers[MAX_LAYERS];
    gtrain_tensor tensors[MAX_TENSORS];
    char names[MAX_TENSORS][24];
    float *w, *g, *v; /* flat weights, gradients, momentum, nparams each */
    /* per tensor: steps left of a released momentum buffer's tail (gtrain_sgd_release_tensor);
     * TAIL_START until the first step, which knows the momentum */
    unsigned tail[MAX_TENSORS];
    float *dact[2]; /* ping-pong activation gradients, max_batch × widest activation */
    float *col, *z; /* conv scratch: one sample's im2col matrix and conv output */
    int summed;     /* g is the gradient of the summed loss (gtrain_model_set_summed_loss) */
    size_t last_batch;
    gtrain_grad_ready_fn on_ready;
    void *ctx;
};

const char *gtrain_strerror(int status) {
    switch (status) {
    case GTRAIN_OK:
        return "ok";
    case GTRAIN_ERR_ARG:
        return "invalid argument";
    case GTRAIN_ERR_NOMEM:
        return "out of memory";
    case GTRAIN_ERR_NOFILE:
        return "data file not found";
    case GTRAIN_ERR_FORMAT:
        return "data file corrupt or truncated";
    case GTRAIN_ERR_IO:
        return "data file unreadable";
    default:
        return "unknown status";
    }
}

/* ---- memory -------------------------------------------------------------------------------- */

/* Big buffers get 2 MiB alignment and MADV_HUGEPAGE: on these VMs a fresh 4 KiB page costs
 * ~10 µs to touch (TORCH.md §2), so mlp-large's 240 MB of weights, gradients and momentum would
 * otherwise cost seconds of page faults. Everything is touched here, at create, never in a step. */
static void *big_alloc(size_t bytes) {
    void *p = gtrain_huge_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* ---- deterministic init -------------------------------------------------------------------- */

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, passes BigCrush; plenty for weights. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Each tensor has its own stream keyed by (seed, index), so changing one layer's width leaves
 * the other layers' draws alone. The arithmetic is exact integer → double plus one correctly
 * rounded multiply and one conversion: bit-identical on any IEEE machine. */
static void init_tensor(gtrain_tensor *t, size_t index, uint64_t seed, double bound) {
    uint64_t s = seed ^ (0xD1B54A32D192ED03u * (uint64_t)(index + 1));
    if (t->is_bias) {
        memset(t->w, 0, t->n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < t->n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * 0x1p-53; /* [0, 1) */
        t->w[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

/* ---- construction -------------------------------------------------------------------------- */

/* Parses "a,b,c" into at most maxn positive integers ≤ MAX_WIDTH; "" gives zero of them. */
static int parse_list(const char *s, size_t *vals, size_t maxn, size_t *n) {
    *n = 0;
    if (*s == '\0') return GTRAIN_OK;
    for (;;) {
        size_t v = 0;
        if (*n == maxn || *s < '0' || *s > '9') return GTRAIN_ERR_ARG;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (size_t)(*s - '0');
            if (v > MAX_WIDTH) return GTRAIN_ERR_ARG;
            s++;
        }
        if (v == 0) return GTRAIN_ERR_ARG;
        vals[(*n)++] = v;
        if (*s == '\0') return GTRAIN_OK;
        if (*s != ',') return GTRAIN_ERR_ARG;
        s++;
    }
}

static void add_tensor(gtrain_model *m, const char *layer_name, int is_bias, size_t rows,
                       size_t cols) {
    size_t t = m->ntensors++;
    snprintf(m->names[t], sizeof m->names[t], "%s.%s", layer_name, is_bias ? "bias" : "weight");
    m->tensors[t] = (gtrain_tensor){
        .name = m->names[t], .n = rows * cols, .rows = rows, .cols = cols, .is_bias = is_bias};
    m->nparams += rows * cols;
}

static void add_dense(gtrain_model *m, const char *name, size_t in, size_t out, int relu) {
    layer *L = &m->layers[m->nlayers++];
    *L = (layer){.kind = LAYER_DENSE, .relu = relu, .in = in, .out = out};
    L->wt = m->ntensors;
    add_tensor(m, name, 0, out, in);
    L->bt = m->ntensors;
    add_tensor(m, name, 1, out, 1);
}

static void add_conv(gtrain_model *m, const char *name, size_t cin, size_t side, size_t cout,
                     size_t pad) {
    layer *L = &m->layers[m->nlayers++];
    size_t cs = side + 2 * pad - CONV_K + 1;
    *L = (layer){.kind = LAYER_CONV,
                 .relu = 1,
                 .cin = cin,
                 .side = side,
                 .cout = cout,
                 .k = CONV_K,
                 .pad = pad,
                 .cs = cs,
                 .in = cin * side * side,
                 .out = cout * (cs / 2) * (cs / 2)};
    L->wt = m->ntensors;
    add_tensor(m, name, 0, cout, cin * CONV_K * CONV_K);
    L->bt = m->ntensors;
    add_tensor(m, name, 1, cout, 1);
}

/* Lays out the layers of `kind`; no allocation yet. */
static int build_layers(gtrain_model *m, const char *kind, const char *hidden) {
    size_t h[MAX_HIDDEN], nh = 0;
    char name[16];
    if (strcmp(kind, "mlp") == 0 || strcmp(kind, "mlp-large") == 0) {
        int large = kind[3] == '-';
        if (large && hidden) return GTRAIN_ERR_ARG;
        if (large) {
            h[0] = h[1] = 4096;
            nh = 2;
        } else if (!hidden) {
            h[0] = h[1] = 1024;
            nh = 2;
        } else if (parse_list(hidden, h, MAX_HIDDEN, &nh) != GTRAIN_OK) {
            return GTRAIN_ERR_ARG;
        }
        size_t in = GTRAIN_INPUT_DIM;
        for (size_t i = 0; i <= nh; i++) {
            size_t out = i < nh ? h[i] : GTRAIN_CLASSES;
            snprintf(name, sizeof name, "fc%zu", i + 1);
            add_dense(m, name, in, out, i < nh);
            in = out;
        }
        return GTRAIN_OK;
    }
    if (strcmp(kind, "cnn") == 0) {
        if (!hidden) {
            h[0] = 16, h[1] = 32, h[2] = 128;
        } else if (parse_list(hidden, h, 3, &nh) != GTRAIN_OK || nh != 3) {
            return GTRAIN_ERR_ARG;
        }
        /* LeNet-5 geometry: 28 →(5×5, pad 2) 28 →pool 14 →(5×5) 10 →pool 5. Both conv outputs
         * have even sides, which the pooling code relies on. */
        add_conv(m, "conv1", 1, GTRAIN_IMAGE_SIDE, h[0], 2);
        add_conv(m, "conv2", h[0], m->layers[0].cs / 2, h[1], 0);
        add_dense(m, "fc1", m->layers[1].out, h[2], 1);
        add_dense(m, "fc2", h[2], GTRAIN_CLASSES, 0);
        return GTRAIN_OK;
    }
    return GTRAIN_ERR_ARG;
}

int gtrain_model_create(const char *kind, const char *hidden, uint64_t seed, size_t max_batch,
                        gtrain_model **out) {
    if (!out) return GTRAIN_ERR_ARG;
    *out = NULL;
    if (!kind || max_batch == 0 || max_batch > MAX_BATCH) return GTRAIN_ERR_ARG;
    gtrain_model *m = calloc(1, sizeof *m);
    if (!m) return GTRAIN_ERR_NOMEM;
    int st = build_layers(m, kind, hidden);
    if (st != GTRAIN_OK) {
        free(m);
        return st;
    }
    m->max_batch = max_batch;

    size_t widest = 0, col = 0, z = 0;
    for (size_t i = 0; i < m->nlayers; i++) {
        layer *L = &m->layers[i];
        if (L->out > widest) widest = L->out;
        if (i > 0 && L->in > widest) widest = L->in;
        if (L->kind == LAYER_CONV) {
            size_t c = L->cin * L->k * L->k * L->cs * L->cs, zz = L->cout * L->cs * L->cs;
            if (c > col) col = c;
            if (zz > z) z = zz;
        }
    }
    int ok = (m->w = big_alloc(m->nparams * sizeof(float))) != NULL &&
             (m->g = big_alloc(m->nparams * sizeof(float))) != NULL &&
             (m->v = big_alloc(m->nparams * sizeof(float))) != NULL &&
             (m->dact[0] = big_alloc(max_batch * widest * sizeof(float))) != NULL &&
             (m->dact[1] = big_alloc(max_batch * widest * sizeof(float))) != NULL;
    if (ok && col)
        ok = (m->col = big_alloc(col * sizeof(float))) && (m->z = big_alloc(z * sizeof(float)));
    for (size_t i = 0; ok && i < m->nlayers; i++) {
        layer *L = &m->layers[i];
        ok = (L->act = big_alloc(max_batch * L->out * sizeof(float))) != NULL;
        if (ok && L->kind == LAYER_CONV)
            ok = (L->argmax = big_alloc(max_batch * L->out * sizeof(uint16_t))) != NULL;
    }
    if (!ok) {
        gtrain_model_free(m);
        return GTRAIN_ERR_NOMEM;
    }

    size_t off = 0;
    for (size_t t = 0; t < m->ntensors; t++) {
        m->tensors[t].w = m->w + off;
        m->tensors[t].g = m->g + off;
        off += m->tensors[t].n;
    }
    for (size_t i = 0; i < m->nlayers; i++) {
        layer *L = &m->layers[i];
        gtrain_tensor *W = &m->tensors[L->wt];
        double gain2 = L->relu ? 6.0 : 3.0; /* He for ReLU layers, gain 1 for the logits */
        double bound = sqrt(gain2 / (double)W->cols);
        init_tensor(W, L->wt, seed, bound);
        init_tensor(&m->tensors[L->bt], L->bt, seed, bound);
    }
    *out = m;
    return GTRAIN_OK;
}

void gtrain_model_free(gtrain_model *m) {
    if (!m) return;
    free(m->w);
    free(m->g);
    free(m->v);
    free(m->dact[0]);
    free(m->dact[1]);
    free(m->col);
    free(m->z);
    for (size_t i = 0; i < m->nlayers; i++) {
        free(m->layers[i].act);
        free(m->layers[i].argmax);
    }
    free(m);
}

gtrain_tensor *gtrain_model_tensors(gtrain_model *m, size_t *count) {
    if (count) *count = m ? m->ntensors : 0;
    return m ? m->tensors : NULL;
}

double gtrain_model_tensor_macs(const gtrain_model *m, size_t i) {
    for (size_t l = 0; m && l < m->nlayers; l++) {
        const layer *L = &m->layers[l];
        double plane = L->kind == LAYER_CONV ? (double)(L->cs * L->cs) : 1;
        double outputs = L->kind == LAYER_CONV ? (double)L->cout * plane : (double)L->out;
        if (i == L->wt) return (double)m->tensors[i].n * plane; /* out x in (x k² x cs²) */
        if (i == L->bt) return outputs;
    }
    return 0;
}

size_t gtrain_model_num_params(const gtrain_model *m) {
    return m ? m->nparams : 0;
}

size_t gtrain_model_max_batch(const gtrain_model *m) {
    return m ? m->max_batch : 0;
}

void gtrain_model_set_grad_ready(gtrain_model *m, gtrain_grad_ready_fn fn, void *ctx) {
    if (!m) return;
    m->on_ready = fn;
    m->ctx = ctx;
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* cblas takes int dimensions; create bounds every dimension far below INT_MAX. */
#define BI(x) ((blasint)(x))

/* Unrolls one sample's k×k patches of x (cin × side × side) into col (cin·k·k × cs·cs), the
 * zero padding written as zeros, each output row as at most three contiguous runs. */
static void im2col(const layer *L, const float *restrict x, float *restrict col) {
    const size_t k = L->k, pad = L->pad, side = L->side, cs = L->cs;
    for (size_t c = 0; c < L->cin; c++)
        for (size_t ky = 0; ky < k; ky++)
            for (size_t kx = 0; kx < k; kx++) {
                float *row = col + ((c * k + ky) * k + kx) * cs * cs;
                /* output columns ox whose input column ox + kx − pad lies inside [0, side) */
                size_t lo = pad > kx ? pad - kx : 0;
                size_t hi = side + pad - kx < cs ? side + pad - kx : cs;
                if (hi < lo) hi = lo;
                /* Plain loops, not memcpy/memset: the runs are 10–28 floats, where a libc call
                 * costs more than the copy (CMakeLists.txt stops GCC turning them back). */
                for (size_t oy = 0; oy < cs; oy++) {
                    float *restrict dst = row + oy * cs;
                    if (oy + ky < pad || oy + ky - pad >= side) {
                        for (size_t ox = 0; ox < cs; ox++) dst[ox] = 0.0f;
                        continue;
                    }
                    const float *restrict src =
                        x + (c * side + oy + ky - pad) * side + (lo + kx - pad);
                    for (size_t ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
                    for (size_t j = 0; j < hi - lo; j++) dst[lo + j] = src[j];
                    for (size_t ox = hi; ox < cs; ox++) dst[ox] = 0.0f;
                }
            }
}

/* The adjoint of im2col: adds each entry of dcol back to the input cell it was copied from. */
static void col2im(const layer *L, const float *restrict dcol, float *restrict dx) {
    const size_t k = L->k, pad = L->pad, side = L->side, cs = L->cs;
    memset(dx, 0, L->in * sizeof(float));
    for (size_t c = 0; c < L->cin; c++)
        for (size_t ky = 0; ky < k; ky++)
            for (size_t kx = 0; kx < k; kx++) {
                const float *row = dcol + ((c * k + ky) * k + kx) * cs * cs;
                size_t lo = pad > kx ? pad - kx : 0;
                size_t hi = side + pad - kx < cs ? side + pad - kx : cs;
                if (hi < lo) hi = lo;
                for (size_t oy = 0; oy < cs; oy++) {
                    if (oy + ky < pad || oy + ky - pad >= side) continue;
                    float *restrict dst = dx + (c * side + oy + ky - pad) * side + (lo + kx - pad);
                    const float *restrict src = row + oy * cs + lo;
                    for (size_t j = 0; j < hi - lo; j++) dst[j] += src[j];
                }
            }
}

static void dense_forward(gtrain_model *m, layer *L, const float *in, size_t B) {
    const float *W = m->tensors[L->wt].w, *b = m->tensors[L->bt].w;
    const size_t n = L->out;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BI(B), BI(n), BI(L->in), 1.0f, in,
                BI(L->in), W, BI(L->in), 0.0f, L->act, BI(n));
    for (size_t i = 0; i < B; i++) {
        float *restrict z = L->act + i * n;
        if (L->relu) {
            for (size_t j = 0; j < n; j++) {
                float t = z[j] + b[j];
                z[j] = t > 0.0f ? t : 0.0f;
            }
        } else {
            for (size_t j = 0; j < n; j++) z[j] += b[j];
        }
    }
}

static void conv_forward(gtrain_model *m, layer *L, const float *in, size_t B) {
    const float *W = m->tensors[L->wt].w, *b = m->tensors[L->bt].w;
    const size_t K = L->cin * L->k * L->k, cs = L->cs, P = cs * cs, ps = cs / 2;
    for (size_t s = 0; s < B; s++) {
        float *restrict act = L->act + s * L->out;
        uint16_t *restrict am = L->argmax + s * L->out;
        im2col(L, in + s * L->in, m->col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BI(L->cout), BI(P), BI(K), 1.0f, W,
                    BI(K), m->col, BI(P), 0.0f, m->z, BI(P));
        /* Max as a tournament of selects, not a chain of ifs: the winner is data-dependent, and
         * mispredicted branches cost more than the whole pass. Ties go to the first cell in
         * row-major order, like a sequential scan. */
        for (size_t c = 0; c < L->cout; c++)
            for (size_t py = 0; py < ps; py++) {
                const float *r0 = m->z + (c * cs + 2 * py) * cs, *r1 = r0 + cs;
                const size_t o0 = 2 * py * cs;
                for (size_t px = 0; px < ps; px++) {
                    size_t o = (c * ps + py) * ps + px;
                    float a = r0[2 * px], bb = r0[2 * px + 1], cc = r1[2 * px], d = r1[2 * px + 1];
                    float top = bb > a ? bb : a, bot = d > cc ? d : cc;
                    float best = (bot > top ? bot : top) + b[c];
                    /* the winner's offset as arithmetic on the comparisons, which GCC keeps
                     * branch-free (a select here it turns back into a jump) */
                    int rt = bb > a, rb = d > cc, low = bot > top;
                    act[o] = best > 0.0f ? best : 0.0f;
                    am[o] = (uint16_t)(o0 + 2 * px + (size_t)rt +
                                       (size_t)low * (cs + (size_t)rb - (size_t)rt));
                }
            }
    }
}

static void report(gtrain_model *m, size_t t) {
    if (m->on_ready) m->on_ready(m->ctx, t);
}

/* dA: batch × out, the gradient of the loss w.r.t. this layer's output; overwritten with dZ.
 * dprev: batch × in, receives the gradient w.r.t. this layer's input, or NULL for layer 0. */
static void dense_backward(gtrain_model *m, layer *L, const float *in, float *dA, float *dprev,
                           size_t B) {
    gtrain_tensor *W = &m->tensors[L->wt], *bias = &m->tensors[L->bt];
    const size_t n = L->out;
    float *restrict db = bias->g;
    memset(db, 0, n * sizeof(float));
    for (size_t i = 0; i < B; i++) {
        float *restrict d = dA + i * n;
        const float *restrict a = L->act + i * n;
        if (L->relu)
            for (size_t j = 0; j < n; j++) d[j] = a[j] > 0.0f ? d[j] : 0.0f;
        for (size_t j = 0; j < n; j++) db[j] += d[j];
    }
    report(m, L->bt);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, BI(n), BI(L->in), BI(B), 1.0f, dA, BI(n),
                in, BI(L->in), 0.0f, W->g, BI(L->in));
    report(m, L->wt);
    if (dprev)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BI(B), BI(L->in), BI(n), 1.0f, dA,
                    BI(n), W->w, BI(L->in), 0.0f, dprev, BI(L->in));
}

static void conv_backward(gtrain_model *m, layer *L, const float *in, const float *dA, float *dprev,
                          size_t B) {
    gtrain_tensor *W = &m->tensors[L->wt], *bias = &m->tensors[L->bt];
    const size_t K = L->cin * L->k * L->k, cs = L->cs, P = cs * cs, ps = cs / 2;
    float *restrict db = bias->g;
    memset(db, 0, L->cout * sizeof(float));
    for (size_t s = 0; s < B; s++) {
        const float *act = L->act + s * L->out, *d = dA + s * L->out;
        const uint16_t *am = L->argmax + s * L->out;
        /* Un-pool: clear dZ, then each window's winner gets the gradient if the ReLU passed it.
         * A branch-free scatter through the stored offsets; testing which of the four cells won
         * was a mispredicted branch per cell and the largest cost of a CNN step. */
        memset(m->z, 0, L->cout * P * sizeof(float));
        for (size_t c = 0; c < L->cout; c++) {
            float *restrict plane = m->z + c * P, sum = 0.0f;
            for (size_t o = c * ps * ps; o < (c + 1) * ps * ps; o++) {
                float gv = act[o] > 0.0f ? d[o] : 0.0f;
                plane[am[o]] = gv;
                sum += gv;
            }
            db[c] += sum;
        }
        im2col(L, in + s * L->in, m->col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BI(L->cout), BI(K), BI(P), 1.0f, m->z,
                    BI(P), m->col, BI(P), s ? 1.0f : 0.0f, W->g, BI(K));
        if (dprev) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, BI(K), BI(P), BI(L->cout), 1.0f,
                        W->w, BI(K), m->z, BI(P), 0.0f, m->col, BI(P));
            col2im(L, m->col, dprev + s * L->in);
        }
    }
    report(m, L->bt);
    report(m, L->wt);
}

static const float *forward(gtrain_model *m, const float *x, size_t B) {
    const float *in = x;
    for (size_t i = 0; i < m->nlayers; i++) {
        layer *L = &m->layers[i];
        if (L->kind == LAYER_DENSE)
            dense_forward(m, L, in, B);
        else
            conv_forward(m, L, in, B);
        in = L->act;
    }
    return in;
}

/* Sum over the batch of the cross-entropy (in double); if dz, writes (softmax − onehot)·scale;
 * if correct, adds the number of rows whose first maximal logit is the label. */
static double xent(const float *logits, const uint8_t *y, size_t B, float *dz, float scale,
                   size_t *correct) {
    enum { C = GTRAIN_CLASSES };
    double total = 0.0;
    for (size_t i = 0; i < B; i++) {
        const float *z = logits + i * C;
        float mx = z[0], e[C];
        size_t arg = 0;
        double sum = 0.0;
        for (size_t j = 1; j < C; j++)
            if (z[j] > mx) mx = z[j], arg = j;
        for (size_t j = 0; j < C; j++) {
            e[j] = expf(z[j] - mx);
            sum += e[j];
        }
        total += log(sum) + (double)mx - (double)z[y[i]];
        if (correct && arg == y[i]) (*correct)++;
        if (dz) {
            float inv = (float)(1.0 / sum);
            for (size_t j = 0; j < C; j++)
                dz[i * C + j] = (e[j] * inv - (j == y[i] ? 1.0f : 0.0f)) * scale;
        }
    }
    return total;
}

static int labels_ok(const uint8_t *y, size_t n) {
    uint8_t bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (uint8_t)(y[i] >= GTRAIN_CLASSES);
    return !bad;
}

void gtrain_model_set_summed_loss(gtrain_model *m, int on) {
    if (m) m->summed = on != 0;
}

int gtrain_model_forward_backward(gtrain_model *m, const float *x, const uint8_t *y, size_t batch,
                                  float *loss) {
    if (!m || !x || !y || batch == 0 || batch > m->max_batch || !labels_ok(y, batch))
        return GTRAIN_ERR_ARG;
    const float *logits = forward(m, x, batch);
    int cur = 0;
    double total =
        xent(logits, y, batch, m->dact[cur], m->summed ? 1.0f : 1.0f / (float)batch, NULL);
    m->last_batch = batch;
    for (size_t i = m->nlayers; i-- > 0;) {
        layer *L = &m->layers[i];
        const float *in = i ? m->layers[i - 1].act : x;
        float *dprev = i ? m->dact[cur ^ 1] : NULL;
        if (L->kind == LAYER_DENSE)
            dense_backward(m, L, in, m->dact[cur], dprev, batch);
        else
            conv_backward(m, L, in, m->dact[cur], dprev, batch);
        cur ^= 1;
    }
    if (loss) *loss = (float)(total / (double)batch);
    return GTRAIN_OK;
}

int gtrain_model_predict(gtrain_model *m, const float *x, size_t count, uint8_t *pred) {
    if (!m || !x || !pred) return GTRAIN_ERR_ARG;
    for (size_t off = 0; off < count; off += m->max_batch) {
        size_t B = count - off < m->max_batch ? count - off : m->max_batch;
        const float *logits = forward(m, x + off * GTRAIN_INPUT_DIM, B);
        for (size_t i = 0; i < B; i++) {
            const float *z = logits + i * GTRAIN_CLASSES;
            uint8_t arg = 0;
            for (uint8_t j = 1; j < GTRAIN_CLASSES; j++)
                if (z[j] > z[arg]) arg = j;
            pred[off + i] = arg;
        }
    }
    return GTRAIN_OK;
}

int gtrain_model_evaluate(gtrain_model *m, const float *x, const uint8_t *y, size_t count,
                          double *loss, double *accuracy) {
    if (!m || !x || !y || count == 0 || !labels_ok(y, count)) return GTRAIN_ERR_ARG;
    double total = 0.0;
    size_t correct = 0;
    for (size_t off = 0; off < count; off += m->max_batch) {
        size_t B = count - off < m->max_batch ? count - off : m->max_batch;
        const float *logits = forward(m, x + off * GTRAIN_INPUT_DIM, B);
        total += xent(logits, y + off, B, NULL, 0.0f, &correct);
    }
    if (loss) *loss = total / (double)count;
    if (accuracy) *accuracy = (double)correct / (double)count;
    return GTRAIN_OK;
}

/* ---- optimizer ----------------------------------------------------------------------------- */

/* torch.optim.SGD (dampening 0) in one pass per tensor; the branches are hoisted out of the
 * loops so each loop is a straight vectorisable FMA chain. */
void gtrain_sgd_step(gtrain_model *m, float lr, float momentum, float weight_decay, int nesterov,
                     const unsigned char *skip_momentum) {
    if (!m) return;
    const float gs = m->summed && m->last_batch ? 1.0f / (float)m->last_batch : 1.0f;
    for (size_t t = 0; t < m->ntensors; t++) {
        gtrain_tensor *T = &m->tensors[t];
        float *restrict w = T->w;
        const float *restrict g = T->g;
        float *restrict v = m->v + (T->w - m->w);
        const float wd = T->is_bias ? 0.0f : weight_decay, mu = momentum;
        const size_t n = T->n;
        const bool skip = skip_momentum && skip_momentum[t];
        if (skip && m->tail[t] && momentum > 0.0f && momentum < 1.0f) {
            if (m->tail[t] == TAIL_START) /* the steps until mu^k < 2^-24 */
                m->tail[t] = (unsigned)ceil(-24.0 * log(2.0) / log((double)mu));
            const float a = nesterov ? mu : 1.0f; /* the update's share of v, as above */
            for (size_t i = 0; i < n; i++) {
                float vi = mu * v[i];
                v[i] = vi;
                w[i] -= lr * (gs * g[i] + wd * w[i] + a * vi);
            }
            if (--m->tail[t] == 0) memset(v, 0, n * sizeof(float));
            continue;
        }
        if (!skip) m->tail[t] = 0; /* the momentum is the optimizer's again: v goes on */
        if (momentum == 0.0f || skip) {
            for (size_t i = 0; i < n; i++) w[i] -= lr * (gs * g[i] + wd * w[i]);
        } else if (nesterov) {
            for (size_t i = 0; i < n; i++) {
                float d = gs * g[i] + wd * w[i];
                float vi = mu * v[i] + d;
                v[i] = vi;
                w[i] -= lr * (d + mu * vi);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                float vi = mu * v[i] + gs * g[i] + wd * w[i];
                v[i] = vi;
                w[i] -= lr * vi;
            }
        }
    }
}

void gtrain_sgd_reset(gtrain_model *m) {
    if (!m) return;
    memset(m->v, 0, m->nparams * sizeof(float));
    memset(m->tail, 0, sizeof m->tail);
}

void gtrain_sgd_release_tensor(gtrain_model *m, size_t i) {
    if (m && i < m->ntensors) m->tail[i] = TAIL_START;
}

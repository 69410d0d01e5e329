/*
 * powersgd.c - PowerSGD low-rank compression (Vogels, Karimireddy, Jaggi, "PowerSGD:
 * Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019,
 * Algorithm 1 with the error feedback of its Algorithm 2).
 *
 * A tensor of n = rows*cols floats is the row-major matrix G (rows x cols).  One step:
 *
 *     M  = G + E                   E: this rank's residual (error feedback)
 *     P  = M * Q~                  Q~: warm-started Q, columns scaled to unit norm
 *     P  = sum over ranks of P     (reduction 1, by the transport)
 *     P^ = orthonormalise(P)       modified Gram-Schmidt, in double
 *     Ql = M^T * P^                this rank's Q
 *     Q  = sum over ranks of Ql    (reduction 2, by the transport)
 *     G^ = scale * P^ * Q^T        the step's update (scale = 1/world averages)
 *     E  = M - P^ * Ql^T           kept for the next step; Q is the next warm start
 *
 * `iters=` > 1 repeats "P = M * normalise(Q); reduce; orthonormalise; Q = M^T P^; reduce"
 * (subspace iteration) before G^ is formed.
 *
 * Residual: E = M - P^ Ql^T uses this rank's own Ql, not the summed Q (the PyTorch hook and
 * the authors' code use M - P^ (Q/world)^T).  Both give the same sum of residuals over
 * ranks, sum(M) - P^ Q^T, and P and Q are linear in sum(M), so training follows the same
 * trajectory; ours is a projection residual (never larger than M), does not depend on the
 * caller's scale or world size, and a single rank holding the summed gradient has exactly
 * the summed residual.  Because E is defined by the P/Q protocol it is codec state, and the
 * generic feedback= key is fixed to "none" for this codec.
 *
 * Memory traffic is what a 25M-element step costs, so E is kept lazily: the state is W and
 * the last factors, with E = W - P^ Ql^T.  The first pass reads W and G once, writes the new
 * W = (W - P^ Ql^T) + G, checks it is finite and accumulates P = W Q~ from the same cache
 * lines; the second pass reads W once more for Q = W^T P^.  That is two reads of the
 * gradient-sized state per step, against four for the textbook order (M = E + G; P = M Q;
 * Q = M^T P; E = M - P Q^T).  The new W goes to a second buffer that is swapped in only when
 * the step commits, so a failed step (NaN gradient, a transport error, abort) leaves the state
 * exactly as it was.  Rejected: updating W in place (a NaN in row 4000 would be found after
 * rows 0..3999 were overwritten, and (E + G) - G is not E in floats).
 *
 * Kernels: for ranks up to 8 the first pass is one loop per row with everything in
 * registers (the rank is a compile-time constant, 16 lanes, fixed summation order, no FP
 * contraction under -std=c11), and the Q pass updates Q^T from four rows of W per load of
 * it.  They beat cblas_sgemm here because sgemm cannot fuse the residual update and packs
 * the big operand: one core, 5000x5000 at rank 4, the whole local step (both passes,
 * orthogonalisation, message) takes ~22 ms against ~25-28 ms for the two sgemm products
 * alone (memcpy of the same 100 MB: ~6 ms).  From rank GCOMP__PSGD_BLAS_RANK on, M*Q~ and
 * W^T*P^ go to cblas_sgemm (compute starts to matter: it was on par at 16, faster at 32-64).
 * P^*Q^T: finish writes it over the output, a memory-bound pass with r products an element,
 * which the loops stream once; OpenBLAS's sgemm with beta = 0 first zeroes C in a pass of
 * its own.  One core, rank 4, the MPI strategy's whole call on one rank: 4096x4096 33-34 ms
 * with the loops against 40-43 with sgemm, 5000x5000 49-50 against 57-59.  A message's
 * decode adds into the output (beta = 1), and up to rank PSGD_DECODE_LOOP_RANK (8) the
 * loops do that too, so that PowerSGD at those ranks runs on one thread pool, OpenMP's.
 * With sgemm decoding, OpenBLAS's pool woke at every decode and OpenMP's at every encode,
 * and on 2 cores each spun against the other (`gradcomp bench --pairs`, rank 4, 3 runs of
 * 200 pairs): at 1024x1024 an encode and its decode took 3.0-4.6 ms a pair on average with
 * both pools at their defaults and 1.4-2.2 ms with OpenBLAS's at one thread; with the
 * loops, 1.9 ms at the defaults.  At 4096x4096 the decode took 10.9-14.0 ms, with the loops
 * 6.8-6.9.  On one thread the loops keep pace: 4096x4096 12.4-12.8 ms against 11.4-12.4
 * (two runs of 30), 5000x5000 19-20 against 22-23; rank 8 at 4096x4096 15 against 13-14.
 * From rank 9 decode goes to sgemm: at 12 its kernels were 1.5x faster on one thread
 * (18 ms against 12), and there both pools run, as in encode from rank 16.
 * Without BLAS at build time
 * (or with -DGCOMP_POWERSGD_NO_BLAS) the portable loops do everything.  Row passes are split
 * over OpenMP threads by rows and the Q pass by column stripes, so every number is summed in
 * the same order whatever the thread count: below rank 16 messages, and up to rank 8 decoded
 * sums, are byte-identical for any OMP_NUM_THREADS (test_powersgd checks it on 1 and 3
 * threads); sgemm's results differ with its thread count and CPU.
 *
 * Orthogonalisation: modified Gram-Schmidt run twice ("twice is enough", Giraud et al. 2005)
 * in double.  A column whose norm falls below 1e-6 of what it had before projection is
 * numerically dependent (a zero gradient, rank(M) < r, a zero warm-start column); it is
 * replaced by a deterministic pseudo-random vector (seed, step, column), orthogonalised
 * the same way, so P^ always has r orthonormal finite columns and every rank picks the same
 * one.  Rejected: PyTorch's "divide by norm + eps" (finite, but leaves a zero column that
 * then stays zero for ever under warm start: Q = M^T 0 = 0, and the next P column is 0
 * again); Householder QR (no better conditioned for r <= 32 columns after the second pass,
 * and its sign conventions make the replacement of dependent columns awkward).
 *
 * Dense steps: before start_iter, when (rows + cols) * r * min_compression_rate >=
 * rows * cols, or for a tensor without a shape (1-D: biases, norms) the gradient G is sent
 * as is (f32), like the PyTorch hook's uncompressed path; E is left untouched (it is zero
 * unless a compressed step came before) and joins the next compressed step.
 */
#include "core/internal.h"

#include <float.h>
#include <math.h>

#if defined(GCOMP_HAVE_BLAS) && !defined(GCOMP_POWERSGD_NO_BLAS)
#include <cblas.h>
#include <limits.h>
#define PSGD_BLAS 1
#else
#define PSGD_BLAS 0
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define CODEC_ID GCOMP__C_powersgd
#define SECTION 16    /* low-rank section header, docs/FORMAT.md */
#define MAX_RANK 1024 /* spec and wire limit on r */
#define LANES 16      /* accumulators per dot product (one AVX-512 register) */
#define BLOCK 512     /* columns per block of the row passes (2 KiB, stays in L1) */
#define STATE_FIXED 8 /* codec state: u32 r, u32 flags */
#define F16_MAX 65504.0f
/* Rank from which the two big products go to cblas_sgemm when it is there. */
#define GCOMP__PSGD_BLAS_RANK 16
/* Rank above which a message's decode goes to cblas_sgemm (the loops below). */
#define PSGD_DECODE_LOOP_RANK 8
/* Stream purposes for the shared random numbers. */
#define PURPOSE_INIT 0x50534744494e4954ull /* initial Q */
#define PURPOSE_ORTH 0x505347444f525448ull /* replacement of dependent P columns (+ col) */
/* Work below this many elements runs on one thread (forking costs more than it saves). */
#define PAR_MIN ((size_t)1 << 18)

enum { PH_IDLE = 0, PH_P, PH_Q, PH_DENSE };
enum { VAL_F32 = 0, VAL_F16 = 1 };

typedef struct psgd {
    size_t rows, cols, r; /* r: effective rank; 0 when this tensor is always dense */
    bool compressible;    /* shape and rank make the low-rank message pay */
    int values;           /* VAL_F32 / VAL_F16 */
    unsigned iters;
    bool warm;
    uint64_t start_iter;
    double rate;

    /* Committed state: E = w - pp * qp^T when has_pending, else E = w; E = 0 when w_zero
     * (then w is not even touched: creating a compressor, as the layer planner does for
     * every tensor, and reset cost no pass over n floats).  qw: warm start. */
    float *w, *pp, *qp, *qw;
    float *zero_row; /* cols zeros: the row of w while w_zero */
    bool has_pending, has_warm, w_zero;
    /* In-flight step: new W, P (rows x r, handed out), Q^T (r x cols, handed out), this
     * rank's Q^T, the normalised warm start, and scratch. */
    float *wn, *p, *q, *ql, *qn;
    double *orth; /* rows x r, column-major */
    float *acc;   /* nthreads x GROUP x r x LANES dot-product accumulators */
    int nthreads;

    int phase;
    unsigned round; /* power iterations done in this step */
    bool local;     /* one-rank encode: no reductions, P^ travels instead of P */
    uint64_t ns;    /* time spent in this step's protocol calls */
} psgd;

static const gcomp_param_info psgd_params[] = {
    {"rank", GCOMP_PARAM_INT, 1, MAX_RANK, 0, "4", NULL,
     "r: rank of the approximation P*Q^T (at most min(rows, cols) is used)"},
    {"iters", GCOMP_PARAM_INT, 1, 64, 0, "1", NULL,
     "power iterations per step (each one is one P and one Q reduction)"},
    {"warm_start", GCOMP_PARAM_BOOL, 0, 1, 0, "1", NULL,
     "start each step from the previous step's Q (0: a fresh shared random Q every step)"},
    {"start_iter", GCOMP_PARAM_INT, 0, 1e12, 0, "0", NULL,
     "steps sent dense before compression starts (PyTorch's start_powerSGD_iter)"},
    {"min_compression_rate", GCOMP_PARAM_FLOAT, 0, 1e6, 0, "2", NULL,
     "send dense when (rows+cols)*r*rate >= rows*cols (0: always compress a matrix)"},
    {"values", GCOMP_PARAM_ENUM, 0, 0, 0, "f32", "f32|f16",
     "precision of P and Q on the wire (f16: each rank's share is rounded, saturating at "
     "+-65504, and the rounding of Q stays in the residual)"},
};

static inline size_t min_sz(size_t a, size_t b) {
    return a < b ? a : b;
}

static bool is_psgd(const gcomp_compressor *c);

/* ---- kernels ------------------------------------------------------------------------------ */

/* t[l] = sum_k pr[k] * q[k*ld + l], l < nb, k ascending: the one place the rank-r product of
 * a row block is formed, so the lazy residual in the first pass, state_save and the
 * portable decode agree to the bit. */
static void outer_block(float *restrict t, const float *restrict pr, const float *restrict q,
                        size_t ld, size_t r, size_t nb) {
    for (size_t l = 0; l < nb; l++) t[l] = 0.0f;
    for (size_t k = 0; k < r; k++) {
        const float a = pr[k];
        const float *restrict qk = q + k * ld;
        for (size_t l = 0; l < nb; l++) t[l] += a * qk[l];
    }
}

/* acc[k][l % LANES] += x[l] * q[k*ld + l]: the dot products of a row block with r vectors,
 * element j always in lane j % LANES (blocks start at multiples of LANES). */
static void dot_block(float *restrict acc, const float *restrict x, const float *restrict q,
                      size_t ld, size_t r, size_t nb) {
    for (size_t k = 0; k < r; k++) {
        float a[LANES];
        float *restrict ak = acc + k * LANES;
        const float *restrict qk = q + k * ld;
        for (size_t t = 0; t < LANES; t++) a[t] = ak[t];
        size_t l = 0;
        for (; l + LANES <= nb; l += LANES)
            for (size_t t = 0; t < LANES; t++) a[t] += x[l + t] * qk[l + t];
        for (size_t t = 0; l < nb; l++, t++) a[t] += x[l] * qk[l];
        for (size_t t = 0; t < LANES; t++) ak[t] = a[t];
    }
}

static void dot_finish(const float *acc, size_t r, float *out) {
    for (size_t k = 0; k < r; k++) {
        float s = 0.0f;
        for (size_t t = 0; t < LANES; t++) s += acc[k * LANES + t];
        out[k] = s;
    }
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Columns per block of the row passes for rank r.  When the r rows of both Q^T arrays fit
 * in half of L2 (cols <= 16384 at r = 4) a block is the whole row; otherwise the slices a
 * block touches (2 * r * block floats) stay within 16 KiB of L1 while a group of rows reuses
 * them.  A multiple of LANES (or the row), so lane j % LANES never depends on it. */
static size_t block_cols(size_t r, size_t cols) {
    if (2 * r * cols * sizeof(float) <= ((size_t)512 << 10)) return cols;
    size_t b = (2048 / r) & ~(size_t)(LANES - 1);
    return b < LANES ? LANES : b > BLOCK ? BLOCK : b;
}

/* Rows handled together, so a Q^T block is read from L2 once per group instead of once per
 * row when rows are long. */
#define GROUP 4

/* One row block of the first pass, everything in registers, for a rank R known at compile
 * time (the switch below instantiates 1..8).  Per element, in this order:
 *     s = 0 + a_0 qp_0j + ... + a_{R-1} qp_{R-1,j}     (outer_block's order: E = W - P^ Ql^T)
 *     x = (w_j - s) + g_j;  wn_j = x;  c_k[j % LANES] += x qn_kj   (dot_block's lanes)
 * `pr` NULL: no pending factors (a = 0 gives s = +0 and x = w + g exactly).  Returns the
 * largest |x| as bits. */
static inline __attribute__((always_inline)) uint32_t
fused_small(const size_t R, const float *restrict wi, const float *restrict gi, float *restrict xi,
            const float *restrict pr, const float *restrict qp, const float *restrict qn, size_t ld,
            size_t nb, float *restrict acc) {
    float a[8] = {0}, c[8][LANES];
    uint32_t mx[LANES] = {0};
    for (size_t k = 0; k < R; k++) {
        a[k] = pr ? pr[k] : 0.0f;
        for (size_t t = 0; t < LANES; t++) c[k][t] = acc[k * LANES + t];
    }
#define FUSED_ELEMENT(J, T)                                                                        \
    do {                                                                                           \
        float s_ = 0.0f;                                                                           \
        for (size_t k = 0; k < R; k++) s_ += a[k] * qp[k * ld + (J)];                              \
        float e_ = wi[J] - s_;                                                                     \
        float x_ = e_ + gi[J];                                                                     \
        uint32_t u_;                                                                               \
        xi[J] = x_;                                                                                \
        memcpy(&u_, &x_, 4);                                                                       \
        u_ &= 0x7fffffffu;                                                                         \
        mx[T] = u_ > mx[T] ? u_ : mx[T];                                                           \
        for (size_t k = 0; k < R; k++) c[k][T] += x_ * qn[k * ld + (J)];                           \
    } while (0)
    size_t l = 0;
    for (; l + LANES <= nb; l += LANES)
        for (size_t t = 0; t < LANES; t++) FUSED_ELEMENT(l + t, t);
    for (size_t t = 0; l < nb; l++, t++) FUSED_ELEMENT(l, t);
#undef FUSED_ELEMENT
    for (size_t k = 0; k < R; k++)
        for (size_t t = 0; t < LANES; t++) acc[k * LANES + t] = c[k][t];
    uint32_t m = 0;
    for (size_t t = 0; t < LANES; t++) m = mx[t] > m ? mx[t] : m;
    return m;
}

/* The same for any r, through a block buffer (ranks above 8; `dots` false for sgemm). */
static uint32_t fused_any(size_t r, const float *wi, const float *gi, float *xi, const float *pr,
                          const float *qp, const float *qn, size_t ld, size_t nb, float *acc,
                          bool dots) {
    float t[BLOCK];
    uint32_t mx = 0;
    for (size_t j0 = 0; j0 < nb; j0 += BLOCK) {
        const size_t m = min_sz(BLOCK, nb - j0);
        if (pr) outer_block(t, pr, qp + j0, ld, r, m);
        for (size_t l = 0; l < m; l++) {
            float x;
            if (pr) {
                float e = wi[j0 + l] - t[l];
                x = e + gi[j0 + l];
            } else {
                x = wi[j0 + l] + gi[j0 + l];
            }
            uint32_t u;
            xi[j0 + l] = x;
            memcpy(&u, &x, 4);
            u &= 0x7fffffffu;
            mx = u > mx ? u : mx;
        }
        if (dots) dot_block(acc, xi + j0, qn + j0, ld, r, m);
    }
    return mx;
}

/* First pass (Alg. 1 "P <- M Q" with E applied lazily).  For each row i:
 *     x_j = (w_j - sum_k pp_ik qp_kj) + g_j;  wn_j = x_j;  p_ik = sum_j x_j qn_kj
 * `dots` false: P is left to sgemm.  Returns true when some |x_j| is above FLT_MAX/4 or
 * not finite. */
static bool pass_first(psgd *s, const float *g, bool dots) {
    const size_t rows = s->rows, cols = s->cols, r = s->r, bc = block_cols(r, cols);
    const float *w = s->w, *qp = s->qp, *qn = s->qn;
    const float *pp = s->has_pending ? s->pp : NULL;
    const bool w_zero = s->w_zero;
    float *wn = s->wn, *p = s->p;
    unsigned bad = 0;
    long long ngroups = (long long)((rows + GROUP - 1) / GROUP);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(s->nthreads)                                 \
    reduction(|                                                                                    \
              : bad) if (rows * cols >= PAR_MIN && s->nthreads > 1)
#endif
    for (long long gi = 0; gi < ngroups; gi++) {
        const size_t i0 = (size_t)gi * GROUP, nr = min_sz(GROUP, rows - i0);
        float *acc = s->acc + (size_t)thread_id() * GROUP * r * LANES;
        uint32_t mx = 0;
        if (dots) memset(acc, 0, nr * r * LANES * sizeof(float));
        for (size_t j0 = 0; j0 < cols; j0 += bc) {
            const size_t nb = min_sz(bc, cols - j0);
            for (size_t a = 0; a < nr; a++) {
                const size_t i = i0 + a;
                const float *wi = (w_zero ? s->zero_row : w + i * cols) + j0;
                const float *g_i = g + i * cols + j0;
                const float *pr = pp ? pp + i * r : NULL;
                float *xi = wn + i * cols + j0, *ac = acc + a * r * LANES;
                uint32_t m;
                switch (dots ? r : 0) {
                case 1:
                    m = fused_small(1, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 2:
                    m = fused_small(2, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 3:
                    m = fused_small(3, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 4:
                    m = fused_small(4, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 5:
                    m = fused_small(5, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 6:
                    m = fused_small(6, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 7:
                    m = fused_small(7, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                case 8:
                    m = fused_small(8, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac);
                    break;
                default:
                    m = fused_any(r, wi, g_i, xi, pr, qp + j0, qn + j0, cols, nb, ac, dots);
                    break;
                }
                mx = m > mx ? m : mx;
            }
        }
        /* Above FLT_MAX/4 (or not finite) is refused, not only Inf/NaN: the residual
         * E = W' - P^ Ql^T must stay finite too, and with |W'| <= FLT_MAX/4 and the
         * product bounded by FLT_MAX/2 (step_after_p) it does (fuzz_roundtrip: a W' of
         * -FLT_MAX minus a product of 3e34 left E = -Inf after an OK encode). */
        bad |= mx > 0x7e7fffffu;
        if (dots)
            for (size_t a = 0; a < nr; a++) dot_finish(acc + a * r * LANES, r, p + (i0 + a) * r);
    }
    return bad != 0;
}

/* P = W * Q~ for a later power iteration (same lanes and order as pass_first's dots). */
static void pass_dots(psgd *s) {
    const size_t rows = s->rows, cols = s->cols, r = s->r, bc = block_cols(r, cols);
#if PSGD_BLAS
    if (r >= GCOMP__PSGD_BLAS_RANK && rows <= INT_MAX && cols <= INT_MAX) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)r, (int)cols, 1.0f,
                    s->wn, (int)cols, s->qn, (int)cols, 0.0f, s->p, (int)r);
        return;
    }
#endif
    long long ngroups = (long long)((rows + GROUP - 1) / GROUP);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)                                                          \
    num_threads(s->nthreads) if (rows * cols >= PAR_MIN && s->nthreads > 1)
#endif
    for (long long gi = 0; gi < ngroups; gi++) {
        const size_t i0 = (size_t)gi * GROUP, nr = min_sz(GROUP, rows - i0);
        float *acc = s->acc + (size_t)thread_id() * GROUP * r * LANES;
        memset(acc, 0, nr * r * LANES * sizeof(float));
        for (size_t j0 = 0; j0 < cols; j0 += bc)
            for (size_t a = 0; a < nr; a++)
                dot_block(acc + a * r * LANES, s->wn + (i0 + a) * cols + j0, s->qn + j0, cols, r,
                          min_sz(bc, cols - j0));
        for (size_t a = 0; a < nr; a++) dot_finish(acc + a * r * LANES, r, s->p + (i0 + a) * r);
    }
}

/* Q^T = P^T * W (Alg. 1 "Q <- M^T P^"), by column stripes: each Q element sums the rows in
 * ascending order whoever computes it (so the thread count never changes a bit), a stripe
 * of r rows of Q^T stays in L2, and four rows of W update it per load of it. */
static void pass_qt(const float *restrict W, size_t rows, size_t cols, size_t r,
                    const float *restrict P, float *restrict qt, int nthreads) {
#if PSGD_BLAS
    if (r >= GCOMP__PSGD_BLAS_RANK && rows <= INT_MAX && cols <= INT_MAX) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r, (int)cols, (int)rows, 1.0f, P,
                    (int)r, W, (int)cols, 0.0f, qt, (int)cols);
        return;
    }
#endif
    size_t cap = (65536 / r) & ~(size_t)(LANES - 1); /* Q^T stripe <= 256 KiB (L2) */
    if (cap < LANES) cap = LANES;
    size_t width = (cols + (size_t)nthreads - 1) / (size_t)nthreads;
    width = (width + LANES - 1) & ~(size_t)(LANES - 1);
    if (width > cap) width = cap;
    if (width == 0) width = LANES;
    long long nstripes = (long long)((cols + width - 1) / width);
    (void)nthreads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)                                                          \
    num_threads(nthreads) if (rows * cols >= PAR_MIN && nthreads > 1)
#endif
    for (long long st = 0; st < nstripes; st++) {
        const size_t j0 = (size_t)st * width, len = min_sz(width, cols - j0);
        for (size_t k = 0; k < r; k++) memset(qt + k * cols + j0, 0, len * sizeof(float));
        size_t i = 0;
        for (; i + GROUP <= rows; i += GROUP) {
            const float *restrict x0 = W + i * cols + j0, *restrict x1 = x0 + cols,
                                  *restrict x2 = x1 + cols, *restrict x3 = x2 + cols;
            const float *p0 = P + i * r, *p1 = p0 + r, *p2 = p1 + r, *p3 = p2 + r;
            size_t k = 0;
            for (; k + 2 <= r; k += 2) {
                const float a0 = p0[k], a1 = p1[k], a2 = p2[k], a3 = p3[k];
                const float b0 = p0[k + 1], b1 = p1[k + 1], b2 = p2[k + 1], b3 = p3[k + 1];
                float *restrict qa = qt + k * cols + j0, *restrict qb = qa + cols;
                for (size_t j = 0; j < len; j++) {
                    float u = qa[j], v = qb[j];
                    u += a0 * x0[j];
                    v += b0 * x0[j];
                    u += a1 * x1[j];
                    v += b1 * x1[j];
                    u += a2 * x2[j];
                    v += b2 * x2[j];
                    u += a3 * x3[j];
                    v += b3 * x3[j];
                    qa[j] = u;
                    qb[j] = v;
                }
            }
            for (; k < r; k++) {
                const float a0 = p0[k], a1 = p1[k], a2 = p2[k], a3 = p3[k];
                float *restrict qa = qt + k * cols + j0;
                for (size_t j = 0; j < len; j++) {
                    float u = qa[j];
                    u += a0 * x0[j];
                    u += a1 * x1[j];
                    u += a2 * x2[j];
                    u += a3 * x3[j];
                    qa[j] = u;
                }
            }
        }
        for (; i < rows; i++) {
            const float *restrict x = W + i * cols + j0;
            for (size_t k = 0; k < r; k++) {
                const float a = P[i * r + k];
                float *restrict qa = qt + k * cols + j0;
                for (size_t j = 0; j < len; j++) qa[j] += a * x[j];
            }
        }
    }
}

/* out = scale * P * Q^T (add: out += ...): the step's G^ (finish) or a message (decode). */
static void product_out(float *out, const float *P, const float *qt, size_t rows, size_t cols,
                        size_t r, float scale, bool add, int nthreads) {
#if PSGD_BLAS
    if (add && r > PSGD_DECODE_LOOP_RANK && rows <= INT_MAX && cols <= INT_MAX) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)cols, (int)r, scale,
                    P, (int)r, qt, (int)cols, 1.0f, out, (int)cols);
        return;
    }
#endif
    long long nrows = (long long)rows;
    (void)nthreads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)                                                          \
    num_threads(nthreads) if (rows * cols >= PAR_MIN && nthreads > 1)
#endif
    for (long long ii = 0; ii < nrows; ii++) {
        const size_t i = (size_t)ii;
        float t[BLOCK];
        float *o = out + i * cols;
        for (size_t j0 = 0; j0 < cols; j0 += BLOCK) {
            const size_t nb = min_sz(BLOCK, cols - j0);
            outer_block(t, P + i * r, qt + j0, cols, r, nb);
            if (add)
                for (size_t l = 0; l < nb; l++) o[j0 + l] += scale * t[l];
            else
                for (size_t l = 0; l < nb; l++) o[j0 + l] = scale * t[l];
        }
    }
}

static bool finite_all(const float *v, size_t n) {
    return gcomp__all_finite(v, n);
}

/* Rounds to the nearest f16 value in place, saturating at +-65504 (values= f16). */
static void round_f16(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = v[i];
        x = x > F16_MAX ? F16_MAX : (x < -F16_MAX ? -F16_MAX : x);
        v[i] = gcomp__f16_to_f32(gcomp__f32_to_f16(x));
    }
}

/* qn[k] = qt[k] / |qt[k]| (0 for a zero column): the warm start with unit columns.  Column
 * scaling does not change what Gram-Schmidt makes of P = M Q, but it keeps P at the scale
 * of M instead of M*M^T*..., so f16 and large gradients do not overflow. */
static void normalise_rows(const float *qt, float *qn, size_t r, size_t cols) {
    for (size_t k = 0; k < r; k++) {
        const float *a = qt + k * cols;
        double ss = 0.0;
        for (size_t j = 0; j < cols; j++) ss += (double)a[j] * (double)a[j];
        double inv = ss > 0.0 && isfinite(ss) ? 1.0 / sqrt(ss) : 0.0;
        for (size_t j = 0; j < cols; j++) qn[k * cols + j] = (float)((double)a[j] * inv);
    }
}

/* Uniform in [-1, 1): shared random numbers (same on every rank and platform). */
static inline double rand_pm1(uint64_t key, uint64_t i) {
    return 2.0 * (double)gcomp__rand01(key, i) - 1.0;
}

/* v -= sum_j <u_j, v> u_j over the first k columns of U (column-major, ld rows), twice. */
static void project_out(const double *U, size_t rows, size_t k, double *v) {
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < k; j++) {
            const double *u = U + j * rows;
            double d = 0.0;
            for (size_t i = 0; i < rows; i++) d += u[i] * v[i];
            for (size_t i = 0; i < rows; i++) v[i] -= d * u[i];
        }
}

static double norm2(const double *v, size_t n) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += v[i] * v[i];
    return sqrt(ss);
}

/* P (rows x r, row-major) <- orthonormal columns spanning it, by modified Gram-Schmidt in
 * double with re-orthogonalisation; numerically dependent columns are replaced (top comment).
 * Needs rows >= r (r <= min(rows, cols) by construction). */
static void orthonormalise(float *P, size_t rows, size_t r, double *U, uint64_t seed,
                           uint64_t step) {
    for (size_t i = 0; i < rows; i++)
        for (size_t k = 0; k < r; k++) U[k * rows + i] = (double)P[i * r + k];
    for (size_t k = 0; k < r; k++) {
        double *v = U + k * rows;
        double before = norm2(v, rows);
        project_out(U, rows, k, v);
        double after = norm2(v, rows);
        if (!(before > 0.0) || !(after > 1e-6 * before)) {
            /* Dependent: a shared pseudo-random direction, then unit vectors as a last
             * resort (k < rows, so some e_i keeps a non-zero part). */
            uint64_t key = gcomp__stream(seed, step, PURPOSE_ORTH + k);
            after = 0.0;
            for (uint64_t attempt = 0; attempt < 4 && !(after > 1e-3); attempt++) {
                for (size_t i = 0; i < rows; i++) v[i] = rand_pm1(key, attempt * rows + i);
                before = norm2(v, rows);
                project_out(U, rows, k, v);
                after = norm2(v, rows) / before;
            }
            for (size_t e = 0; e < rows && !(after > 1e-3); e++) {
                for (size_t i = 0; i < rows; i++) v[i] = i == e ? 1.0 : 0.0;
                project_out(U, rows, k, v);
                after = norm2(v, rows);
            }
            after = norm2(v, rows);
        }
        const double inv = 1.0 / after;
        for (size_t i = 0; i < rows; i++) v[i] *= inv;
    }
    for (size_t i = 0; i < rows; i++)
        for (size_t k = 0; k < r; k++) P[i * r + k] = (float)U[k * rows + i];
}

/* ---- creation --------------------------------------------------------------------------- */

static void psgd_fini(gcomp_compressor *c) {
    psgd *s = c->codec_state;
    if (!s) return;
    float *bufs[] = {s->w, s->wn, s->pp, s->qp,  s->qw,      s->p,
                     s->q, s->ql, s->qn, s->acc, s->zero_row};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gcomp__free(bufs[i]);
    gcomp__free(s->orth);
    gcomp__free(s);
    c->codec_state = NULL;
}

/* The effective rank r, or 0 when every step is dense (a vector, or a shape where the
 * factors would not be smaller by min_compression_rate).  Reads only the spec and the shape,
 * so the state size is known before init allocates (gcomp_compressor_from_state checks a
 * blob's sections against it first). */
static size_t psgd_rank(const gcomp_compressor *c) {
    if (!c->rows || !c->cols) return 0;
    const size_t rank = (size_t)gcomp__spec_num(&c->spec, "rank", 4);
    const size_t r = min_sz(rank, min_sz(c->rows, c->cols));
    const double lowrank = (double)(c->rows + c->cols) * (double)r;
    const double rate = gcomp__spec_num(&c->spec, "min_compression_rate", 2);
    return lowrank * rate < (double)c->rows * (double)c->cols ? r : 0;
}

static gcomp_status psgd_init(gcomp_compressor *c, gcomp_error *err) {
    psgd *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "powersgd: out of memory");
    c->codec_state = s;
    const gcomp__spec *sp = &c->spec;
    s->rows = c->rows;
    s->cols = c->cols;
    s->iters = (unsigned)gcomp__spec_num(sp, "iters", 1);
    s->warm = gcomp__spec_num(sp, "warm_start", 1) != 0;
    s->start_iter = (uint64_t)gcomp__spec_num(sp, "start_iter", 0);
    s->rate = gcomp__spec_num(sp, "min_compression_rate", 2);
    s->values = sp->vcoder && sp->vcoder->id == GCOMP__V_f16 ? VAL_F16 : VAL_F32;
    s->r = psgd_rank(c);
    s->compressible = s->r > 0;
    if (!s->compressible) {
        s->r = 0; /* a vector, or compression does not pay: every step is dense */
        return GCOMP_OK;
    }
    s->nthreads = 1;
#ifdef _OPENMP
    s->nthreads = omp_get_max_threads();
    if (s->nthreads < 1) s->nthreads = 1;
    if (s->nthreads > 256) s->nthreads = 256;
#endif
    const size_t n = c->n, rows = s->rows, cols = s->cols, r = s->r;
    s->w = gcomp__alloc(n * sizeof(float));
    s->w_zero = true;
    s->zero_row = gcomp__calloc(cols * sizeof(float));
    s->wn = gcomp__alloc(n * sizeof(float));
    s->pp = gcomp__calloc(rows * r * sizeof(float));
    s->p = gcomp__calloc(rows * r * sizeof(float));
    s->qp = gcomp__calloc(r * cols * sizeof(float));
    s->qw = gcomp__calloc(r * cols * sizeof(float));
    s->q = gcomp__calloc(r * cols * sizeof(float));
    s->ql = gcomp__calloc(r * cols * sizeof(float));
    s->qn = gcomp__calloc(r * cols * sizeof(float));
    s->orth = gcomp__alloc(rows * r * sizeof(double));
    s->acc = gcomp__alloc((size_t)s->nthreads * GROUP * r * LANES * sizeof(float));
    if (!s->w || !s->wn || !s->pp || !s->p || !s->qp || !s->qw || !s->q || !s->ql || !s->qn ||
        !s->orth || !s->acc || !s->zero_row)
        return gcomp__fail(err, GCOMP_E_NOMEM,
                           "powersgd: out of memory for a %zux%zu tensor at rank %zu", rows, cols,
                           r);
    return GCOMP_OK;
}

static bool product_bounded(const float *P, const float *qt, size_t rows, size_t cols, size_t r,
                            float scale);

/* ---- the step, shared by the protocol and the one-rank encode ---------------------------- */

static bool step_is_dense(const gcomp_compressor *c, const psgd *s) {
    return !s->compressible || c->step < s->start_iter;
}

/* Phase 1: W' = E + G, P = W' Q~.  On error nothing changed. */
static gcomp_status step_begin(gcomp_compressor *c, const float *g) {
    psgd *s = c->codec_state;
    const size_t cols = s->cols, r = s->r;
    if (!s->warm || !s->has_warm) {
        uint64_t key = gcomp__stream(c->seed, c->step, PURPOSE_INIT);
        for (size_t i = 0; i < r * cols; i++) s->q[i] = (float)rand_pm1(key, i);
        normalise_rows(s->q, s->qn, r, cols);
    } else {
        normalise_rows(s->qw, s->qn, r, cols);
    }
    const bool dots =
        !(PSGD_BLAS && r >= GCOMP__PSGD_BLAS_RANK && s->rows <= INT32_MAX && cols <= INT32_MAX);
    if (pass_first(s, g, dots)) return GCOMP_E_NONFINITE;
    if (!dots) pass_dots(s);
    if (!finite_all(s->p, s->rows * r)) return GCOMP_E_NONFINITE;
    if (s->values == VAL_F16 && !s->local) round_f16(s->p, s->rows * r);
    s->round = 0;
    return GCOMP_OK;
}

/* Phase 2: P (summed) -> P^, Ql = W'^T P^ (kept for E), Q buffer = Ql to be summed. */
static gcomp_status step_after_p(gcomp_compressor *c) {
    psgd *s = c->codec_state;
    const size_t rows = s->rows, cols = s->cols, r = s->r;
    if (!finite_all(s->p, rows * r)) return GCOMP_E_NONFINITE;
    orthonormalise(s->p, rows, r, s->orth, c->seed, c->step);
    /* One rank: P^ itself travels, so E must be formed with the P^ the receiver sees. */
    if (s->values == VAL_F16 && s->local && s->round + 1 == s->iters) round_f16(s->p, rows * r);
    pass_qt(s->wn, rows, cols, r, s->p, s->ql, s->nthreads);
    if (!finite_all(s->ql, r * cols) || !product_bounded(s->p, s->ql, rows, cols, r, 1.0f))
        return GCOMP_E_NONFINITE;
    if (s->values == VAL_F16) round_f16(s->ql, r * cols);
    memcpy(s->q, s->ql, r * cols * sizeof(float));
    s->round++;
    return GCOMP_OK;
}

/* Phase 2b (iters > 1): Q (summed) -> P = W' normalise(Q) for the next power iteration. */
static gcomp_status step_after_q(gcomp_compressor *c) {
    psgd *s = c->codec_state;
    if (!finite_all(s->q, s->r * s->cols)) return GCOMP_E_NONFINITE;
    normalise_rows(s->q, s->qn, s->r, s->cols);
    pass_dots(s);
    if (!finite_all(s->p, s->rows * s->r)) return GCOMP_E_NONFINITE;
    if (s->values == VAL_F16 && !s->local) round_f16(s->p, s->rows * s->r);
    return GCOMP_OK;
}

/* True when scale * P Q^T is finite however it is formed.  With bound = sum_k max|P_k| max|Q_k|,
 * every element of P Q^T, every partial sum of its r terms and every term a_k q_kj is at most
 * `bound` in magnitude, and scaling multiplies that by |scale|.  The product is formed
 * unscaled and then scaled (outer_block, and sgemm's alpha applied to the sum) or with the
 * scale inside the terms, so both bound and bound * |scale| must stay finite: checking only
 * the scaled one let a message whose product overflows float pass at scale 0.5 and write
 * +-Inf (found by the CRC-repairing decode fuzzer, tests/fuzz/regress/decode/psgd_overflow.gcm).
 * Float rounding of r <= MAX_RANK terms can exceed the exact bound by (r + 1) * 2^-24
 * relative, so the limit keeps a factor 2 in hand. */
static bool product_bounded(const float *P, const float *qt, size_t rows, size_t cols, size_t r,
                            float scale) {
    double bound = 0.0;
    for (size_t k = 0; k < r; k++) {
        double mp = 0.0, mq = 0.0;
        for (size_t i = 0; i < rows; i++) mp = fmax(mp, fabs((double)P[i * r + k]));
        for (size_t j = 0; j < cols; j++) mq = fmax(mq, fabs((double)qt[k * cols + j]));
        bound += mp * mq;
    }
    return bound * fmax(1.0, fabs((double)scale)) < 0.5 * (double)FLT_MAX;
}

/* Makes the step's results the state: W', P^, Ql, and the summed Q as the next warm start. */
static void step_commit(psgd *s) {
    float *t;
    t = s->w, s->w = s->wn, s->wn = t;
    t = s->pp, s->pp = s->p, s->p = t;
    t = s->qp, s->qp = s->ql, s->ql = t;
    t = s->qw, s->qw = s->q, s->q = t;
    s->has_pending = true;
    s->has_warm = true;
    s->w_zero = false;
    s->phase = PH_IDLE;
}

/* ---- the multi-phase protocol (public) ---------------------------------------------------- */

static bool is_psgd(const gcomp_compressor *c) {
    return c && c->codec->info.id == CODEC_ID;
}

gcomp_status gcomp_lowrank_begin(gcomp_compressor *c, const float *grad, float **p, size_t *p_len,
                                 unsigned *rounds) {
    if (!c || !grad || !p || !p_len || !rounds) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    psgd *s = c->codec_state;
    if (s->phase != PH_IDLE) return GCOMP_E_PROTOCOL;
    *p = NULL;
    *p_len = 0;
    *rounds = 0;
    uint64_t t0 = gcomp__now_ns();
    if (step_is_dense(c, s)) {
        if (c->carry) { /* a retune's held-back vector rides in this dense step (retune.c) */
            for (size_t i = 0; i < c->n; i++) c->carry_ws[i] = grad[i] + c->carry[i];
            *p = c->carry_ws;
            *p_len = c->n;
        }
        s->phase = PH_DENSE;
        s->ns = gcomp__now_ns() - t0;
        return GCOMP_OK;
    }
    s->local = false;
    gcomp_status st = step_begin(c, grad);
    if (st != GCOMP_OK) return st;
    s->phase = PH_P;
    *p = s->p;
    *p_len = s->rows * s->r;
    *rounds = s->iters;
    s->ns = gcomp__now_ns() - t0;
    return GCOMP_OK;
}

gcomp_status gcomp_lowrank_shape(const gcomp_compressor *c, unsigned *rounds, size_t *p_len,
                                 size_t *q_len) {
    if (!c || !rounds || !p_len || !q_len) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    const psgd *s = c->codec_state;
    const bool dense = step_is_dense(c, s);
    *rounds = dense ? 0 : s->iters;
    *p_len = dense ? 0 : s->rows * s->r;
    *q_len = dense ? 0 : s->r * s->cols;
    return GCOMP_OK;
}

gcomp_status gcomp_lowrank_after_p(gcomp_compressor *c, float **q, size_t *q_len) {
    if (!c || !q || !q_len) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    psgd *s = c->codec_state;
    if (s->phase != PH_P) return GCOMP_E_PROTOCOL;
    uint64_t t0 = gcomp__now_ns();
    gcomp_status st = step_after_p(c);
    if (st != GCOMP_OK) {
        s->phase = PH_IDLE; /* the step is abandoned; the state is as before begin */
        return st;
    }
    s->phase = PH_Q;
    *q = s->q;
    *q_len = s->r * s->cols;
    s->ns += gcomp__now_ns() - t0;
    return GCOMP_OK;
}

gcomp_status gcomp_lowrank_after_q(gcomp_compressor *c, float **p, size_t *p_len) {
    if (!c || !p || !p_len) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    psgd *s = c->codec_state;
    if (s->phase != PH_Q || s->round >= s->iters) return GCOMP_E_PROTOCOL;
    uint64_t t0 = gcomp__now_ns();
    gcomp_status st = step_after_q(c);
    if (st != GCOMP_OK) {
        s->phase = PH_IDLE;
        return st;
    }
    s->phase = PH_P;
    *p = s->p;
    *p_len = s->rows * s->r;
    s->ns += gcomp__now_ns() - t0;
    return GCOMP_OK;
}

static void count_step(gcomp_compressor *c, uint64_t sent, uint64_t bytes, uint64_t ns) {
    c->step++;
    c->stats.messages++;
    c->stats.bytes_in += 4 * (uint64_t)c->n;
    c->stats.bytes_out += bytes;
    c->stats.elements_sent += sent;
    c->stats.encode_ns += ns;
}

gcomp_status gcomp_lowrank_finish(gcomp_compressor *c, float *out, float scale) {
    if (!c) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    psgd *s = c->codec_state;
    if (s->phase == PH_DENSE) {
        s->phase = PH_IDLE;
        if (c->carry) { /* sent with this step */
            gcomp__free(c->carry);
            gcomp__free(c->carry_ws);
            c->carry = c->carry_ws = NULL;
        }
        count_step(c, c->n, 4 * (uint64_t)c->n, s->ns);
        return GCOMP_OK;
    }
    if (s->phase != PH_Q || s->round != s->iters) return GCOMP_E_PROTOCOL;
    if (!out || !isfinite(scale)) return GCOMP_E_ARG;
    uint64_t t0 = gcomp__now_ns();
    const size_t rows = s->rows, cols = s->cols, r = s->r;
    if (!finite_all(s->q, r * cols) || !product_bounded(s->p, s->q, rows, cols, r, scale)) {
        s->phase = PH_IDLE;
        return GCOMP_E_NONFINITE;
    }
    product_out(out, s->p, s->q, rows, cols, r, scale, false, s->nthreads);
    step_commit(s);
    uint64_t sent = (uint64_t)s->iters * (rows + cols) * r;
    count_step(c, sent, sent * (s->values == VAL_F16 ? 2u : 4u), s->ns + gcomp__now_ns() - t0);
    return GCOMP_OK;
}

void gcomp_lowrank_abort(gcomp_compressor *c) {
    if (is_psgd(c)) ((psgd *)c->codec_state)->phase = PH_IDLE;
}

/* E = W - P^ Ql^T, the same arithmetic as pass_first, element by element. */
static void residual_to(const psgd *s, uint8_t *dst) {
    float t[BLOCK];
    for (size_t i = 0; i < s->rows; i++)
        for (size_t j0 = 0; j0 < s->cols; j0 += BLOCK) {
            const size_t nb = min_sz(BLOCK, s->cols - j0);
            const float *wi = (s->w_zero ? s->zero_row : s->w + i * s->cols) + j0;
            uint8_t *d = dst + 4 * (i * s->cols + j0);
            if (!s->has_pending) {
                memcpy(d, wi, nb * sizeof(float));
                continue;
            }
            outer_block(t, s->pp + i * s->r, s->qp + j0, s->cols, s->r, nb);
            for (size_t l = 0; l < nb; l++) {
                float e = wi[l] - t[l];
                memcpy(d + 4 * l, &e, 4);
            }
        }
}

gcomp_status gcomp_lowrank_residual(const gcomp_compressor *c, float *out) {
    if (!c || !out) return GCOMP_E_ARG;
    if (!is_psgd(c)) return GCOMP_E_UNSUPPORTED;
    const psgd *s = c->codec_state;
    if (!s->compressible)
        memset(out, 0, c->n * sizeof(float));
    else
        residual_to(s, (uint8_t *)out);
    return GCOMP_OK;
}

/* ---- retune (src/core/retune.c) ---------------------------------------------------------- */

static void psgd_held(const gcomp_compressor *c, float *out) {
    gcomp_lowrank_residual(c, out);
}

static bool psgd_busy(const gcomp_compressor *c) {
    const psgd *s = c->codec_state;
    return s->phase != PH_IDLE;
}

/* Every step dense (a vector, or low rank does not pay): a retune leaves a carry instead. */
static bool psgd_dense_only(const gcomp_compressor *c) {
    return !((const psgd *)c->codec_state)->compressible;
}

/* The replaced compressor's held-back vector becomes E (W, with no pending factors); a
 * PowerSGD predecessor of the same width hands over its warm start, its first min(r, r')
 * columns of Q, the others drawn from the shared seed as a first step draws them, so every
 * rank that retunes at the same step gets the same Q. */
static gcomp_status psgd_absorb(gcomp_compressor *c, const float *held,
                                const gcomp_compressor *from) {
    psgd *s = c->codec_state;
    bool any = false;
    for (size_t i = 0; i < c->n && !any; i++) any = held[i] != 0.0f;
    if (!s->compressible) return any ? GCOMP_E_UNSUPPORTED : GCOMP_OK;
    if (any) {
        memcpy(s->w, held, c->n * sizeof(float));
        s->w_zero = false;
        s->has_pending = false;
    }
    if (!is_psgd(from) || !s->warm) return GCOMP_OK;
    const psgd *f = from->codec_state;
    if (!f->compressible || !f->has_warm || !f->warm || f->cols != s->cols) return GCOMP_OK;
    const size_t keep = min_sz(s->r, f->r), cols = s->cols;
    memcpy(s->qw, f->qw, keep * cols * sizeof(float)); /* Q^T: one row per column of Q */
    uint64_t key = gcomp__stream(c->seed, c->step, PURPOSE_INIT);
    for (size_t i = keep * cols; i < s->r * cols; i++) s->qw[i] = (float)rand_pm1(key, i);
    s->has_warm = true;
    return GCOMP_OK;
}

/* ---- one-rank message (gcomp_encode) ----------------------------------------------------- */

static size_t lowrank_payload(const psgd *s) {
    return SECTION + (s->rows + s->cols) * s->r * (s->values == VAL_F16 ? 2u : 4u);
}

static size_t psgd_payload_bound(const gcomp_compressor *c) {
    const psgd *s = c->codec_state;
    size_t dense = SECTION + 4 * c->n;
    if (!s->compressible) return dense;
    size_t low = lowrank_payload(s);
    return s->start_iter > 0 && low < dense ? dense : low;
}

static void put_section(uint8_t *p, uint8_t kind, uint8_t vid, uint32_t r,
                        const gcomp_compressor *c) {
    p[0] = kind;
    p[1] = vid;
    gcomp__put16(p + 2, 0);
    gcomp__put32(p + 4, r);
    gcomp__put32(p + 8, (uint32_t)c->rows);
    gcomp__put32(p + 12, (uint32_t)c->cols);
}

static gcomp_status psgd_encode(gcomp_compressor *c, const float *x, float *res, uint8_t *payload,
                                size_t cap, size_t *len) {
    (void)res; /* feedback is fixed to none: the residual is this codec's own state */
    psgd *s = c->codec_state;
    if (s->phase != PH_IDLE) return GCOMP_E_PROTOCOL;
    if (step_is_dense(c, s)) {
        if (cap < SECTION + 4 * c->n) return GCOMP_E_DST_SIZE;
        if (!gcomp__all_finite(x, c->n)) return GCOMP_E_NONFINITE;
        put_section(payload, 0, GCOMP__V_f32, 0, c);
        memcpy(payload + SECTION, x, 4 * c->n);
        *len = SECTION + 4 * c->n;
        c->last.nvals = c->n;
        c->last_dense = true;
        return GCOMP_OK;
    }
    const size_t rows = s->rows, cols = s->cols, r = s->r;
    if (cap < lowrank_payload(s)) return GCOMP_E_DST_SIZE;
    s->local = true;
    gcomp_status st = step_begin(c, x);
    for (unsigned it = 0; st == GCOMP_OK && it < s->iters; it++) {
        if (it) st = step_after_q(c);
        if (st == GCOMP_OK) st = step_after_p(c);
    }
    if (st == GCOMP_OK && !product_bounded(s->p, s->q, rows, cols, r, 1.0f)) st = GCOMP_E_NONFINITE;
    if (st != GCOMP_OK) {
        s->local = false;
        return st;
    }
    const gcomp__vcoder *vc = c->spec.vcoder;
    size_t lp = 0, lq = 0, room = cap - SECTION;
    put_section(payload, 1, vc->id, (uint32_t)r, c);
    st = vc->encode(&c->vp, s->p, rows * r, NULL, 0, payload + SECTION, room, &lp);
    if (st == GCOMP_OK)
        st = vc->encode(&c->vp, s->q, r * cols, NULL, 0, payload + SECTION + lp, room - lp, &lq);
    s->local = false;
    if (st != GCOMP_OK) return st;
    step_commit(s); /* gcomp_encode cannot fail after this; it counts the step */
    *len = SECTION + lp + lq;
    c->last.nvals = (rows + cols) * r;
    c->last_dense = false;
    return GCOMP_OK;
}

/* ---- decode: untrusted bytes -------------------------------------------------------------- */

/* What `gradcomp inspect` shows: values carried (the factors, or every element). */
static gcomp_status psgd_info(const uint8_t *pl, size_t len, gcomp_message_info *info) {
    if (len < 16) return GCOMP_E_CORRUPT;
    uint64_t r = gcomp__get32(pl + 4), rows = gcomp__get32(pl + 8), cols = gcomp__get32(pl + 12);
    bool lowrank = pl[0] == 1;
    info->elements_sent = lowrank ? r * (rows + cols) : info->n;
    info->index_coding = lowrank ? "low-rank (P, Q)" : "none";
    info->value_coding = pl[1] == GCOMP__V_f16 ? "f16" : "f32";
    return GCOMP_OK;
}

static gcomp_status psgd_decode(const uint8_t *pl, size_t len, size_t n, float *acc, float scale,
                                gcomp__buf *ws) {
    if (len < SECTION) return GCOMP_E_CORRUPT;
    const uint8_t kind = pl[0], vid = pl[1];
    const uint64_t r = gcomp__get32(pl + 4), rows = gcomp__get32(pl + 8),
                   cols = gcomp__get32(pl + 12);
    if (gcomp__get16(pl + 2) != 0) return GCOMP_E_CORRUPT;
    const uint8_t *v = pl + SECTION;
    const size_t vlen = len - SECTION;
    if (kind == 0) { /* dense: G itself, f32 */
        if (vid != GCOMP__V_f32 || r != 0) return GCOMP_E_CORRUPT;
        if ((rows || cols) && rows * cols != n) return GCOMP_E_CORRUPT;
        return gcomp__vcoder_by_id(GCOMP__V_f32)->decode(v, vlen, n, acc, scale);
    }
    if (kind != 1 || (vid != GCOMP__V_f32 && vid != GCOMP__V_f16)) return GCOMP_E_CORRUPT;
    if (rows == 0 || cols == 0 || rows * cols != n || r == 0 || r > MAX_RANK || r > rows ||
        r > cols)
        return GCOMP_E_CORRUPT;
    const size_t width = vid == GCOMP__V_f16 ? 2 : 4;
    const size_t np = (size_t)(rows * r), nq = (size_t)(r * cols);
    if (vlen != (np + nq) * width) return GCOMP_E_CORRUPT;
    const gcomp__vcoder *vc = gcomp__vcoder_by_id(vid);
    gcomp_status st = vc->decode(v, np * width, np, NULL, 0.0f);
    if (st == GCOMP_OK) st = vc->decode(v + np * width, nq * width, nq, NULL, 0.0f);
    if (st != GCOMP_OK) return st;
    if (gcomp__buf_reserve(ws, (np + nq) * sizeof(float)) != GCOMP_OK) return GCOMP_E_NOMEM;
    float *P = ws->p, *qt = P + np;
    memset(P, 0, (np + nq) * sizeof(float));
    vc->decode(v, np * width, np, P, 1.0f);
    vc->decode(v + np * width, nq * width, nq, qt, 1.0f);
    /* A product that would overflow float is not something an encoder writes. */
    if (!product_bounded(P, qt, (size_t)rows, (size_t)cols, (size_t)r, scale))
        return GCOMP_E_CORRUPT;
    if (!acc) return GCOMP_OK;
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    product_out(acc, P, qt, (size_t)rows, (size_t)cols, (size_t)r, scale, true, nthreads);
    return GCOMP_OK;
}

/* ---- state ------------------------------------------------------------------------------- */
/* u32 r (0: always dense, nothing follows) | u32 flags (bit 0: Q holds a warm start) |
 * n x f32 E | r*cols x f32 warm-start Q^T.  docs/FORMAT.md, "PowerSGD state". */

static size_t psgd_state_size(const gcomp_compressor *c) {
    const size_t r = psgd_rank(c);
    return r ? STATE_FIXED + 4 * (c->n + r * c->cols) : STATE_FIXED;
}

static void psgd_state_save(const gcomp_compressor *c, uint8_t *dst) {
    const psgd *s = c->codec_state;
    gcomp__put32(dst, (uint32_t)s->r);
    const bool warm = s->compressible && s->warm && s->has_warm;
    gcomp__put32(dst + 4, warm ? 1u : 0u);
    if (!s->compressible) return;
    residual_to(s, dst + STATE_FIXED);
    uint8_t *q = dst + STATE_FIXED + 4 * c->n;
    if (warm)
        memcpy(q, s->qw, 4 * s->r * s->cols);
    else
        memset(q, 0, 4 * s->r * s->cols);
}

static gcomp_status psgd_state_load(gcomp_compressor *c, const uint8_t *src, size_t len) {
    psgd *s = c->codec_state;
    if (len != psgd_state_size(c) || gcomp__get32(src) != s->r) return GCOMP_E_STATE;
    const uint32_t flags = gcomp__get32(src + 4);
    if (flags & ~1u || (flags && !s->compressible)) return GCOMP_E_STATE;
    if (!s->compressible) {
        s->phase = PH_IDLE;
        return GCOMP_OK;
    }
    const size_t total = c->n + s->r * s->cols;
    for (size_t i = 0; i < total; i++)
        if ((gcomp__get32(src + STATE_FIXED + 4 * i) & 0x7f800000u) == 0x7f800000u)
            return GCOMP_E_STATE;
    memcpy(s->w, src + STATE_FIXED, 4 * c->n);
    memcpy(s->qw, src + STATE_FIXED + 4 * c->n, 4 * s->r * s->cols);
    s->has_pending = false;
    s->w_zero = false;
    s->has_warm = (flags & 1u) != 0;
    s->phase = PH_IDLE; /* a step in flight is abandoned */
    return GCOMP_OK;
}

static void psgd_state_reset(gcomp_compressor *c) {
    psgd *s = c->codec_state;
    s->phase = PH_IDLE;
    s->has_pending = s->has_warm = false;
    s->w_zero = true;
}

/* Each power iteration is two reductions (P, then Q). */
static void psgd_describe(const gcomp__spec *s, gcomp__desc *d) {
    d->phases = 2u * (unsigned)gcomp__spec_num(s, "iters", 1);
}

const gcomp__codec gcomp__codec_powersgd = {
    .info = {"powersgd", CODEC_ID,
             GCOMP_CODEC_MULTIPHASE | GCOMP_CODEC_NEEDS_SHAPE | GCOMP_CODEC_STOCHASTIC,
             "PowerSGD (Vogels et al. 2019): rank-r P*Q^T with warm start and its own error "
             "feedback; P and Q sum by allreduce (gcomp_lowrank_*); 1-D tensors go dense",
             psgd_params, GCOMP__COUNTOF(psgd_params)},
    .init = psgd_init,
    .fini = psgd_fini,
    .payload_bound = psgd_payload_bound,
    .encode = psgd_encode,
    .decode = psgd_decode,
    .inspect = psgd_info,
    .state_size = psgd_state_size,
    .state_save = psgd_state_save,
    .state_load = psgd_state_load,
    .state_reset = psgd_state_reset,
    .held = psgd_held,
    .absorb = psgd_absorb,
    .dense_only = psgd_dense_only,
    .busy = psgd_busy,
    .fixed_feedback = "none",
    /* Its starting and replacement Q columns come from the shared seed; it keeps its own
     * residual; the remainder of a projection is at most |x|^2, not less for every x. */
    .traits = GCOMP_SPEC_SHARED_DRAWS | GCOMP_SPEC_FEEDBACK | GCOMP__T_NOT_CONTRACTION,
    .describe = psgd_describe,
};

/*
 * test_gradcheck.c — gtrain_model_forward_backward's gradients against central finite
 * differences, for MLPs and CNNs.
 *
 * The oracle is an independent double-precision forward pass written here with naive loops
 * (direct convolution, bias → ReLU → pool in the textbook order, no im2col, no BLAS) that reads
 * the model's weights. Two checks use it:
 *   1. the model's float loss equals the reference loss (relative 1e-5): the forward is right;
 *   2. on a random subset of coordinates of EVERY tensor (plus each tensor's largest-gradient
 *      coordinate), the model's analytic gradient equals the reference's central difference
 *      (L(w+h) − L(w−h)) / 2h with h = 1e-6 in double. The criterion is
 *          |analytic − numeric| ≤ 1e-3 · max(|numeric|, 1e-2 · rms(gradient of that tensor))
 *      i.e. 0.1 % relative, with a floor for coordinates far smaller than the tensor's typical
 *      gradient (where float32 cancellation dominates). Doing the differences in double with a
 *      tiny h means a ReLU or max-pool kink is essentially never crossed, so there is no
 *      "allow a few failures" slack: any broken backward (mask, transpose, 1/batch, pool routing,
 *      col2im) fails it.
 * A third check differentiates the model's OWN forward (through gtrain_model_evaluate, which sums
 * the loss in double) with h = 1e-3 and compares per tensor ‖analytic − numeric‖ / ‖numeric‖ over
 * the sampled coordinates against 5e-2: loose (the default CNN reaches 1e-2 from max-pool
 * kinks; a broken backward gives errors of order 1), but it needs
 * no knowledge of the architecture.
 * Rejected: float-only finite differences as the sole check (at h small enough to miss kinks the
 * float round-off is as large as the gradients being checked).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "model.h"

#define SAMPLED 16

typedef struct ref {
    int cnn;
    size_t nt;
    const gtrain_tensor *t;
    double *w[32]; /* double copies of every tensor, perturbed by the finite differences */
} ref;

static double relu(double v) {
    return v > 0.0 ? v : 0.0;
}

/* out[o] = W[o,:]·in + b[o] */
static void ref_dense(const ref *r, size_t ti, const double *in, double *out) {
    const gtrain_tensor *T = &r->t[ti];
    for (size_t o = 0; o < T->rows; o++) {
        double s = r->w[ti + 1][o];
        for (size_t i = 0; i < T->cols; i++) s += r->w[ti][o * T->cols + i] * in[i];
        out[o] = s;
    }
}

/* conv 5×5 with zero padding, + bias, ReLU, 2×2 max-pool, the textbook way round. */
static size_t ref_conv(const ref *r, size_t ti, const double *in, size_t cin, size_t side,
                       size_t pad, double *out) {
    const gtrain_tensor *T = &r->t[ti];
    const size_t k = 5, cout = T->rows, cs = side + 2 * pad - k + 1, ps = cs / 2;
    double *z = malloc(cout * cs * cs * sizeof(double));
    for (size_t o = 0; o < cout; o++)
        for (size_t y = 0; y < cs; y++)
            for (size_t x = 0; x < cs; x++) {
                double s = r->w[ti + 1][o];
                for (size_t c = 0; c < cin; c++)
                    for (size_t ky = 0; ky < k; ky++)
                        for (size_t kx = 0; kx < k; kx++) {
                            long iy = (long)(y + ky) - (long)pad, ix = (long)(x + kx) - (long)pad;
                            if (iy < 0 || ix < 0 || iy >= (long)side || ix >= (long)side) continue;
                            s += r->w[ti][((o * cin + c) * k + ky) * k + kx] *
                                 in[(c * side + (size_t)iy) * side + (size_t)ix];
                        }
                z[(o * cs + y) * cs + x] = relu(s);
            }
    for (size_t o = 0; o < cout; o++)
        for (size_t y = 0; y < ps; y++)
            for (size_t x = 0; x < ps; x++) {
                const double *p = z + (o * cs + 2 * y) * cs + 2 * x;
                out[(o * ps + y) * ps + x] = fmax(fmax(p[0], p[1]), fmax(p[cs], p[cs + 1]));
            }
    free(z);
    return ps;
}

/* Mean cross-entropy over the batch, all in double. */
static double ref_loss(const ref *r, const float *x, const uint8_t *y, size_t batch) {
    double total = 0.0, a[8192], b[8192];
    for (size_t s = 0; s < batch; s++) {
        for (size_t i = 0; i < GTRAIN_INPUT_DIM; i++) a[i] = x[s * GTRAIN_INPUT_DIM + i];
        size_t t = 0, n = GTRAIN_INPUT_DIM;
        if (r->cnn) {
            size_t c1 = r->t[0].rows, c2 = r->t[2].rows;
            size_t p1 = ref_conv(r, 0, a, 1, GTRAIN_IMAGE_SIDE, 2, b);
            size_t p2 = ref_conv(r, 2, b, c1, p1, 0, a);
            n = c2 * p2 * p2;
            t = 4;
        }
        for (; t < r->nt; t += 2) {
            ref_dense(r, t, a, b);
            n = r->t[t].rows;
            for (size_t i = 0; i < n; i++) a[i] = t + 2 < r->nt ? relu(b[i]) : b[i];
        }
        double mx = a[0], sum = 0.0;
        for (size_t i = 1; i < n; i++) mx = fmax(mx, a[i]);
        for (size_t i = 0; i < n; i++) sum += exp(a[i] - mx);
        total += log(sum) + mx - a[y[s]];
    }
    return total / (double)batch;
}

static uint64_t rng_state = 12345;
static size_t rnd(size_t n) {
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (size_t)((rng_state >> 33) % n);
}

static void gradcheck(const char *kind, const char *hidden, size_t batch, uint64_t seed) {
    gtrain_model *m = NULL;
    gtrain_data d;
    int st = gtrain_model_create(kind, hidden, seed, batch, &m);
    CHECK(st == GTRAIN_OK, "create %s %s: %s", kind, hidden, gtrain_strerror(st));
    if (st != GTRAIN_OK) return;
    CHECK(gtrain_data_synthetic(batch, seed + 100, &d) == GTRAIN_OK, "synthetic");
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    ref r = {.cnn = strcmp(kind, "cnn") == 0, .nt = nt, .t = t};
    for (size_t i = 0; i < nt; i++) {
        r.w[i] = malloc(t[i].n * sizeof(double));
        for (size_t j = 0; j < t[i].n; j++) r.w[i][j] = t[i].w[j];
    }
    /* Non-zero biases, so a backward that ignores them or mixes them up is visible. */
    for (size_t i = 1; i < nt; i += 2)
        for (size_t j = 0; j < t[i].n; j++) {
            t[i].w[j] = 0.05f * (float)((int)rnd(21) - 10) / 10.0f;
            r.w[i][j] = t[i].w[j];
        }

    float loss;
    CHECK(gtrain_model_forward_backward(m, d.x, d.y, batch, &loss) == GTRAIN_OK, "fb");
    double rl = ref_loss(&r, d.x, d.y, batch);
    CHECK(fabs(loss - rl) <= 1e-5 * rl, "%s %s: loss %.9g but reference %.9g", kind, hidden,
          (double)loss, rl);

    double worst = 0.0, worst_self = 0.0;
    for (size_t ti = 0; ti < nt; ti++) {
        const gtrain_tensor *T = &t[ti];
        float *g = malloc(T->n * sizeof(float));
        memcpy(g, T->g,
               T->n * sizeof(float)); /* evaluate() below must not change it, but be safe */
        double rms = 0.0;
        size_t big = 0;
        for (size_t j = 0; j < T->n; j++) {
            rms += (double)g[j] * g[j];
            if (fabsf(g[j]) > fabsf(g[big])) big = j;
        }
        rms = sqrt(rms / (double)T->n);
        CHECK(rms > 0.0, "%s: gradient of %s is all zero", kind, T->name);
        size_t count = T->n <= SAMPLED ? T->n : SAMPLED + 1;
        double num2 = 0.0, diff2 = 0.0;
        for (size_t c = 0; c < count; c++) {
            size_t j = T->n <= SAMPLED ? c : c == SAMPLED ? big : rnd(T->n);
            /* reference, double, h = 1e-6 */
            double keep = r.w[ti][j], h = 1e-6;
            r.w[ti][j] = keep + h;
            double lp = ref_loss(&r, d.x, d.y, batch);
            r.w[ti][j] = keep - h;
            double lm = ref_loss(&r, d.x, d.y, batch);
            r.w[ti][j] = keep;
            double num = (lp - lm) / (2 * h), a = g[j];
            double err = fabs(a - num) / fmax(fabs(num), 1e-2 * rms);
            if (err > worst) worst = err;
            CHECK(err <= 1e-3, "%s %s: %s[%zu] analytic %.9g, numeric %.9g (rel err %.2g)", kind,
                  hidden ? hidden : "default", T->name, j, a, num, err);
            /* the model's own forward, float, h = 1e-3 */
            float wk = T->w[j];
            double fp, fm;
            T->w[j] = wk + 1e-3f;
            gtrain_model_evaluate(m, d.x, d.y, batch, &fp, NULL);
            T->w[j] = wk - 1e-3f;
            gtrain_model_evaluate(m, d.x, d.y, batch, &fm, NULL);
            T->w[j] = wk;
            double self = (fp - fm) / (double)((wk + 1e-3f) - (wk - 1e-3f));
            num2 += self * self;
            diff2 += (a - self) * (a - self);
        }
        double self_err = sqrt(diff2 / fmax(num2, 1e-30));
        if (self_err > worst_self) worst_self = self_err;
        CHECK(self_err <= 5e-2, "%s %s: %s: self finite-difference rel err %.3g", kind,
              hidden ? hidden : "default", T->name, self_err);
        free(g);
    }
    printf("%-4s %-10s batch %zu: loss %.6f (ref %.6f), worst rel err %.2e (ref FD), %.2e (self "
           "FD)\n",
           kind, hidden ? hidden : "default", batch, (double)loss, rl, worst, worst_self);
    for (size_t i = 0; i < nt; i++) free(r.w[i]);
    gtrain_data_free(&d);
    gtrain_model_free(m);
}

int main(void) {
    gradcheck("mlp", "24,16", 5, 1);
    gradcheck("mlp", "12,10,8", 3, 2);
    gradcheck("mlp", "", 4, 3); /* softmax regression: no hidden layer, no dA of the input */
    gradcheck("cnn", "3,4,10", 3, 4);
    gradcheck("cnn", NULL, 2, 5); /* the default 16,32,128 geometry */
    return check_failures ? 1 : 0;
}

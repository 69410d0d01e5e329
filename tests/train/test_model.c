/*
 * test_model.c — properties of gtrain_model beyond its gradients (those are test_gradcheck.c):
 * argument errors, the tensor list and flat layout, the init distribution, bit-for-bit
 * determinism (same seed → same weights and same losses after SGD steps; different seed →
 * different), the gradient-ready callback (order, once each, g final when it fires), SGD against
 * a scalar transcription of torch.optim.SGD, and predict / evaluate against forward_backward.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "model.h"

static void test_create_errors(void) {
    static const struct {
        const char *kind, *hidden;
        size_t max_batch;
    } bad[] = {
        {"resnet", NULL, 8},       {"mlp", "0", 8},
        {"mlp", "1,,2", 8},        {"mlp", "a", 8},
        {"mlp", "1024,", 8},       {"mlp", ",4", 8},
        {"mlp", "65537", 8},       {"mlp", "1,2,3,4,5,6,7,8,9", 8},
        {"mlp-large", "8", 8},     {"cnn", "16,32", 8},
        {"cnn", "16,32,128,4", 8}, {"mlp", NULL, 0},
        {"mlp", NULL, 65537},      {NULL, NULL, 8},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gtrain_model *m = (gtrain_model *)&bad; /* must be reset to NULL */
        int st = gtrain_model_create(bad[i].kind, bad[i].hidden, 1, bad[i].max_batch, &m);
        CHECK(st == GTRAIN_ERR_ARG && m == NULL, "create(%s, %s, %zu) gave %d", bad[i].kind,
              bad[i].hidden, bad[i].max_batch, st);
    }
    CHECK(gtrain_model_create("mlp", NULL, 1, 8, NULL) == GTRAIN_ERR_ARG, "NULL out");
    gtrain_model_free(NULL);
    for (int s = 0; s <= 6; s++) CHECK(gtrain_strerror(s) != NULL, "strerror(%d)", s);
}

static void expect_tensors(const char *kind, const char *hidden, size_t n, const char *const *names,
                           const size_t (*shape)[2]) {
    gtrain_model *m;
    CHECK(gtrain_model_create(kind, hidden, 7, 4, &m) == GTRAIN_OK, "create %s", kind);
    size_t nt, total = 0;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    CHECK(nt == n, "%s: %zu tensors, expected %zu", kind, nt, n);
    for (size_t i = 0; i < nt && i < n; i++) {
        CHECK(strcmp(t[i].name, names[i]) == 0, "%s tensor %zu is %s, expected %s", kind, i,
              t[i].name, names[i]);
        CHECK(t[i].rows == shape[i][0] && t[i].cols == shape[i][1] &&
                  t[i].n == shape[i][0] * shape[i][1],
              "%s: %s is %zu×%zu (n %zu)", kind, t[i].name, t[i].rows, t[i].cols, t[i].n);
        CHECK(t[i].is_bias == (shape[i][1] == 1), "%s: %s is_bias %d", kind, t[i].name,
              t[i].is_bias);
        /* flat layout: the tensors lie back to back, weights and gradients alike */
        CHECK(t[i].w == t[0].w + total && t[i].g == t[0].g + total, "%s: %s not contiguous", kind,
              t[i].name);
        total += t[i].n;
    }
    CHECK(gtrain_model_num_params(m) == total, "%s: num_params %zu, sum %zu", kind,
          gtrain_model_num_params(m), total);
    CHECK(gtrain_model_max_batch(m) == 4, "max_batch");
    gtrain_model_free(m);
}

static void test_tensors(void) {
    static const char *const mlp[] = {"fc1.weight", "fc1.bias",   "fc2.weight",
                                      "fc2.bias",   "fc3.weight", "fc3.bias"};
    static const size_t mlp_s[][2] = {{1024, 784}, {1024, 1},  {1024, 1024},
                                      {1024, 1},   {10, 1024}, {10, 1}};
    static const size_t big_s[][2] = {{4096, 784}, {4096, 1},  {4096, 4096},
                                      {4096, 1},   {10, 4096}, {10, 1}};
    static const size_t h3_s[][2] = {{300, 784}, {300, 1},  {100, 300},
                                     {100, 1},   {10, 100}, {10, 1}};
    static const char *const cnn[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
    static const size_t cnn_s[][2] = {{16, 25},   {16, 1},  {32, 400}, {32, 1},
                                      {128, 800}, {128, 1}, {10, 128}, {10, 1}};
    static const char *const lin[] = {"fc1.weight", "fc1.bias"};
    static const size_t lin_s[][2] = {{10, 784}, {10, 1}};
    expect_tensors("mlp", NULL, 6, mlp, mlp_s);
    expect_tensors("mlp", "300,100", 6, mlp, h3_s);
    expect_tensors("mlp-large", NULL, 6, mlp, big_s);
    expect_tensors("cnn", NULL, 8, cnn, cnn_s);
    expect_tensors("mlp", "", 2, lin, lin_s);
}

/* The backward work the cost model spreads the backward pass by: multiply-adds a sample. */
static void test_macs(void) {
    gtrain_model *m;
    CHECK(gtrain_model_create("cnn", NULL, 1, 1, &m) == GTRAIN_OK, "create cnn");
    /* conv1 1->16 5x5 on 28x28 (pad 2), conv2 16->32 5x5 on 10x10, fc1 800->128, fc2 128->10 */
    const double want[8] = {16.0 * 25 * 28 * 28,
                            16.0 * 28 * 28,
                            32.0 * 16 * 25 * 10 * 10,
                            32.0 * 10 * 10,
                            800.0 * 128,
                            128,
                            128.0 * 10,
                            10};
    for (size_t i = 0; i < 8; i++)
        CHECK(gtrain_model_tensor_macs(m, i) == want[i], "cnn tensor %zu: %g, expected %g", i,
              gtrain_model_tensor_macs(m, i), want[i]);
    CHECK(gtrain_model_tensor_macs(m, 8) == 0 && gtrain_model_tensor_macs(NULL, 0) == 0, "range");
    gtrain_model_free(m);
    CHECK(gtrain_model_create("mlp", NULL, 1, 1, &m) == GTRAIN_OK, "create mlp");
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    for (size_t i = 0; i < nt; i++) /* fully connected: the elements */
        CHECK(gtrain_model_tensor_macs(m, i) == (double)t[i].n, "mlp tensor %zu", i);
    gtrain_model_free(m);
}

/* He-uniform: |w| ≤ sqrt(6/fan_in) (sqrt(3/fan_in) for the output layer), variance bound²/3,
 * mean 0; biases 0. */
static void test_init(void) {
    gtrain_model *m;
    CHECK(gtrain_model_create("mlp", NULL, 42, 1, &m) == GTRAIN_OK, "create");
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    for (size_t i = 0; i < nt; i++) {
        if (t[i].is_bias) {
            int zero = 1;
            for (size_t j = 0; j < t[i].n; j++) zero &= t[i].w[j] == 0.0f;
            CHECK(zero, "%s not zero", t[i].name);
            continue;
        }
        double bound = sqrt((i + 2 < nt ? 6.0 : 3.0) / (double)t[i].cols), s = 0, s2 = 0, mx = 0;
        for (size_t j = 0; j < t[i].n; j++) {
            s += t[i].w[j];
            s2 += (double)t[i].w[j] * t[i].w[j];
            mx = fmax(mx, fabs(t[i].w[j]));
        }
        double mean = s / (double)t[i].n, var = s2 / (double)t[i].n - mean * mean;
        double want = bound * bound / 3.0, tol = 5.0 * want * sqrt(0.8 / (double)t[i].n);
        CHECK(mx <= bound * (1 + 1e-6) && mx > 0.99 * bound, "%s: max |w| %g, bound %g", t[i].name,
              mx, bound);
        CHECK(fabs(var - want) <= tol, "%s: variance %g, expected %g ± %g", t[i].name, var, want,
              tol);
        CHECK(fabs(mean) <= 5.0 * sqrt(want / (double)t[i].n), "%s: mean %g", t[i].name, mean);
    }
    gtrain_model_free(m);
}

/* Runs `steps` SGD steps and returns the losses' bits in *losses. */
static gtrain_model *train(const char *kind, uint64_t seed, const gtrain_data *d, size_t steps,
                           float *losses) {
    gtrain_model *m;
    const size_t B = 16;
    if (gtrain_model_create(kind, kind[0] == 'c' ? "6,8,16" : "64,32", seed, B, &m) != GTRAIN_OK)
        return NULL;
    for (size_t s = 0; s < steps; s++) {
        gtrain_model_forward_backward(m, d->x + (s * B % d->n) * d->dim, d->y + s * B % d->n, B,
                                      &losses[s]);
        gtrain_sgd_step(m, 0.05f, 0.9f, 5e-4f, (int)(s & 1), NULL);
    }
    return m;
}

static int same_weights(gtrain_model *a, gtrain_model *b) {
    size_t n = gtrain_model_num_params(a);
    return n == gtrain_model_num_params(b) &&
           memcmp(gtrain_model_tensors(a, NULL)[0].w, gtrain_model_tensors(b, NULL)[0].w,
                  n * sizeof(float)) == 0;
}

static void test_determinism(void) {
    gtrain_data d;
    CHECK(gtrain_data_synthetic(256, 9, &d) == GTRAIN_OK, "synthetic");
    for (int k = 0; k < 3; k++) {
        const char *kind = k == 0 ? "mlp" : k == 1 ? "cnn" : "mlp-large";
        /* weights straight after create */
        gtrain_model *a, *b, *c;
        CHECK(gtrain_model_create(kind, NULL, 1234, 1, &a) == GTRAIN_OK, "create");
        CHECK(gtrain_model_create(kind, NULL, 1234, 3, &b) == GTRAIN_OK, "create");
        CHECK(gtrain_model_create(kind, NULL, 1235, 1, &c) == GTRAIN_OK, "create");
        CHECK(same_weights(a, b), "%s: same seed, different weights", kind);
        size_t n = gtrain_model_num_params(a), equal = 0;
        const float *wa = gtrain_model_tensors(a, NULL)[0].w,
                    *wc = gtrain_model_tensors(c, NULL)[0].w;
        for (size_t i = 0; i < n; i++) equal += wa[i] == wc[i];
        /* only the zero biases may coincide */
        CHECK(equal < n / 100, "%s: seeds 1234 and 1235 share %zu of %zu weights", kind, equal, n);
        gtrain_model_free(a);
        gtrain_model_free(b);
        gtrain_model_free(c);
        if (k == 2) break; /* mlp-large: init only, its training is the benchmark's business */
        /* and after SGD steps with momentum, Nesterov and weight decay */
        float la[6], lb[6], lc[6];
        a = train(kind, 77, &d, 6, la);
        b = train(kind, 77, &d, 6, lb);
        c = train(kind, 78, &d, 6, lc);
        CHECK(a && b && c, "train create");
        if (!a || !b || !c) continue;
        CHECK(memcmp(la, lb, sizeof la) == 0, "%s: same seed, losses differ (%.9g vs %.9g)", kind,
              (double)la[5], (double)lb[5]);
        CHECK(same_weights(a, b), "%s: same seed, weights differ after 6 steps", kind);
        CHECK(la[0] != lc[0] && la[5] != lc[5], "%s: different seed, same losses", kind);
        CHECK(isfinite(la[5]) && la[5] != la[0], "%s: losses %g → %g", kind, (double)la[0],
              (double)la[5]);
        gtrain_model_free(a);
        gtrain_model_free(b);
        gtrain_model_free(c);
    }
    gtrain_data_free(&d);
}

typedef struct cb_log {
    gtrain_model *m;
    size_t calls, order[32];
    float *snap; /* g of every tensor as it was when its callback fired */
} cb_log;

static void on_ready(void *ctx, size_t t) {
    cb_log *log = ctx;
    gtrain_tensor *T = gtrain_model_tensors(log->m, NULL);
    if (log->calls < 32) log->order[log->calls] = t;
    log->calls++;
    memcpy(log->snap + (T[t].g - T[0].g), T[t].g, T[t].n * sizeof(float));
}

static void test_callback(const char *kind) {
    gtrain_model *m;
    gtrain_data d;
    const size_t B = 8;
    CHECK(gtrain_model_create(kind, NULL, 3, B, &m) == GTRAIN_OK, "create");
    CHECK(gtrain_data_synthetic(B, 4, &d) == GTRAIN_OK, "synthetic");
    size_t nt, n = gtrain_model_num_params(m);
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    cb_log log = {.m = m, .snap = malloc(n * sizeof(float))};
    gtrain_model_set_grad_ready(m, on_ready, &log);
    for (int round = 0; round < 2; round++) {
        /* poison g: a callback that fires before its gradient is written snapshots NaNs */
        for (size_t i = 0; i < n; i++) t[0].g[i] = NAN;
        log.calls = 0;
        CHECK(gtrain_model_forward_backward(m, d.x, d.y, B, NULL) == GTRAIN_OK, "fb");
        CHECK(log.calls == nt, "%s: %zu callbacks for %zu tensors", kind, log.calls, nt);
        for (size_t i = 0; i < nt && i < log.calls; i++)
            CHECK(log.order[i] == nt - 1 - i, "%s: callback %zu was tensor %zu, expected %zu", kind,
                  i, log.order[i], nt - 1 - i);
        CHECK(memcmp(log.snap, t[0].g, n * sizeof(float)) == 0,
              "%s: a gradient changed after its callback fired", kind);
        gtrain_sgd_step(m, 0.01f, 0.9f, 0.0f, 0, NULL);
    }
    /* rejected calls make no callback and compute nothing */
    uint8_t bad[8];
    memcpy(bad, d.y, sizeof bad);
    bad[5] = 10;
    log.calls = 0;
    CHECK(gtrain_model_forward_backward(m, d.x, bad, B, NULL) == GTRAIN_ERR_ARG, "label 10");
    CHECK(gtrain_model_forward_backward(m, d.x, d.y, 0, NULL) == GTRAIN_ERR_ARG, "batch 0");
    CHECK(gtrain_model_forward_backward(m, d.x, d.y, B + 1, NULL) == GTRAIN_ERR_ARG, "batch > max");
    CHECK(gtrain_model_forward_backward(m, NULL, d.y, B, NULL) == GTRAIN_ERR_ARG, "x NULL");
    CHECK(log.calls == 0, "%s: rejected calls made %zu callbacks", kind, log.calls);
    gtrain_model_set_grad_ready(m, NULL, NULL);
    CHECK(gtrain_model_forward_backward(m, d.x, d.y, B, NULL) == GTRAIN_OK && log.calls == 0,
          "cleared callback still called");
    free(log.snap);
    gtrain_data_free(&d);
    gtrain_model_free(m);
}

/* torch.optim.SGD.step, transcribed element by element in double. */
static void ref_sgd(double *w, double *v, const float *g, size_t n, double lr, double mu, double wd,
                    int nesterov, int skip) {
    for (size_t i = 0; i < n; i++) {
        double d = g[i] + wd * w[i];
        if (mu != 0.0 && !skip) {
            v[i] = mu * v[i] + d;
            d = nesterov ? d + mu * v[i] : v[i];
        }
        w[i] -= lr * d;
    }
}

static void test_sgd(void) {
    static const struct {
        float lr, mu, wd;
        int nesterov, skip;
    } cfg[] = {{0.1f, 0.0f, 0.0f, 0, 0},
               {0.05f, 0.9f, 1e-2f, 0, 0},
               {0.05f, 0.9f, 1e-2f, 1, 0},
               {0.05f, 0.9f, 1e-2f, 0, 1},
               {0.2f, 0.5f, 0.0f, 1, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        gtrain_model *m;
        CHECK(gtrain_model_create("mlp", "16,8", 5, 1, &m) == GTRAIN_OK, "create");
        size_t nt, n = gtrain_model_num_params(m);
        gtrain_tensor *t = gtrain_model_tensors(m, &nt);
        unsigned char skip[8] = {0};
        if (cfg[c].skip) skip[0] = skip[1] = skip[4] = 1; /* fc1.weight, fc1.bias, fc3.weight */
        double *w = malloc(n * sizeof(double)), *v = calloc(n, sizeof(double));
        for (size_t i = 0; i < n; i++) w[i] = t[0].w[i];
        for (size_t i = 0; i < nt; i++) /* biases start non-zero so a bias decay would show */
            if (t[i].is_bias)
                for (size_t j = 0; j < t[i].n; j++)
                    w[(size_t)(t[i].w - t[0].w) + j] = t[i].w[j] = 0.5f;
        uint64_t r = 99;
        for (int step = 0; step < 4; step++) {
            for (size_t i = 0; i < n; i++) {
                r = r * 6364136223846793005u + 1442695040888963407u;
                t[0].g[i] = (float)((double)(r >> 40) / 16777216.0 - 0.5);
            }
            gtrain_sgd_step(m, cfg[c].lr, cfg[c].mu, cfg[c].wd, cfg[c].nesterov,
                            cfg[c].skip ? skip : NULL);
            for (size_t i = 0; i < nt; i++) {
                size_t off = (size_t)(t[i].w - t[0].w);
                ref_sgd(w + off, v + off, t[i].g, t[i].n, cfg[c].lr, cfg[c].mu,
                        t[i].is_bias ? 0.0 : cfg[c].wd, cfg[c].nesterov, skip[i]);
            }
        }
        double worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(t[0].w[i] - w[i]));
        CHECK(worst < 1e-5, "sgd config %zu: max |w − reference| = %g", c, worst);
        free(w);
        free(v);
        gtrain_model_free(m);
    }
}

/* The summed-loss unit: g is batch × the mean-loss gradient, and SGD divides it back, so
 * both units follow the same path (to float rounding) over several steps of every kind. */
static void test_summed_loss(void) {
    enum { B = 12 };
    gtrain_data d;
    gtrain_model *mean, *sum;
    CHECK(gtrain_data_synthetic(4 * B, 3, &d) == GTRAIN_OK, "synthetic");
    CHECK(gtrain_model_create("mlp", "24,16", 9, B, &mean) == GTRAIN_OK, "create");
    CHECK(gtrain_model_create("mlp", "24,16", 9, B, &sum) == GTRAIN_OK, "create");
    gtrain_model_set_summed_loss(sum, 1);
    size_t nt, n = gtrain_model_num_params(mean);
    gtrain_tensor *tm = gtrain_model_tensors(mean, &nt), *ts = gtrain_model_tensors(sum, NULL);
    unsigned char skip[6] = {1, 0, 0, 0, 0, 0};
    for (int s = 0; s < 4; s++) {
        float lm, ls;
        const float *x = d.x + (size_t)s * B * d.dim;
        const uint8_t *y = d.y + (size_t)s * B;
        CHECK(gtrain_model_forward_backward(mean, x, y, B, &lm) == GTRAIN_OK, "fb");
        CHECK(gtrain_model_forward_backward(sum, x, y, B, &ls) == GTRAIN_OK, "fb");
        /* Equal weights at step 0 give the same loss to the bit; after an SGD step the two
         * models' weights differ by float rounding (g / B against mean g), and so may the
         * losses, in their last bits: a summed loss would be B = 12 times larger. */
        CHECK(s == 0 ? lm == ls : fabs((double)lm - ls) <= 1e-5 * fabs((double)lm),
              "step %d: the reported loss is the mean in both units (%.9g, %.9g)", s, (double)lm,
              (double)ls);
        if (s == 0) {
            double worst = 0, big = 0; /* float sums cancel: compare against the largest */
            for (size_t i = 0; i < n; i++) {
                worst = fmax(worst, fabs(ts[0].g[i] - (double)B * tm[0].g[i]));
                big = fmax(big, fabs((double)B * tm[0].g[i]));
            }
            CHECK(big > 0 && worst < 1e-5 * big, "summed g is not batch × mean g: %g of %g", worst,
                  big);
        }
        gtrain_sgd_step(mean, 0.1f, 0.9f, 1e-3f, s & 1, skip);
        gtrain_sgd_step(sum, 0.1f, 0.9f, 1e-3f, s & 1, skip);
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(ts[0].w[i] - tm[0].w[i]));
    CHECK(worst < 1e-5, "summed and mean units drifted apart: max |Δw| %g", worst);
    gtrain_model_free(mean);
    gtrain_model_free(sum);
    gtrain_data_free(&d);
}

/* predict and evaluate against forward_backward, and chunking across max_batch. */
static void test_eval(void) {
    gtrain_data d;
    gtrain_model *small, *big;
    CHECK(gtrain_data_synthetic(50, 21, &d) == GTRAIN_OK, "synthetic");
    CHECK(gtrain_model_create("cnn", "4,6,12", 8, 7, &small) == GTRAIN_OK, "create");
    CHECK(gtrain_model_create("cnn", "4,6,12", 8, 50, &big) == GTRAIN_OK, "create");
    double l1, a1, l2, a2;
    uint8_t pred[50];
    float fl;
    CHECK(gtrain_model_evaluate(small, d.x, d.y, 50, &l1, &a1) == GTRAIN_OK, "evaluate");
    CHECK(gtrain_model_evaluate(big, d.x, d.y, 50, &l2, &a2) == GTRAIN_OK, "evaluate");
    CHECK(gtrain_model_predict(small, d.x, 50, pred) == GTRAIN_OK, "predict");
    CHECK(gtrain_model_forward_backward(big, d.x, d.y, 50, &fl) == GTRAIN_OK, "fb");
    size_t hits = 0;
    for (size_t i = 0; i < 50; i++) hits += pred[i] == d.y[i];
    CHECK(fabs(l1 - l2) < 1e-6 * l2 && a1 == a2, "chunked evaluate %g/%g vs %g/%g", l1, a1, l2, a2);
    CHECK(a1 == (double)hits / 50.0, "accuracy %g but predict hits %zu/50", a1, hits);
    CHECK(fabs(fl - l2) < 1e-6 * l2, "fb loss %g, evaluate %g", (double)fl, l2);
    CHECK(gtrain_model_evaluate(small, d.x, d.y, 0, &l1, &a1) == GTRAIN_ERR_ARG, "count 0");
    gtrain_model_free(small);
    gtrain_model_free(big);
    gtrain_data_free(&d);
}

static unsigned long long lcg(unsigned long long *s) {
    return *s = *s * 6364136223846793005ull + 1442695040888963407ull;
}

/* A tensor whose momentum moves to its compressor (an adaptive switch to DGC) keeps what its
 * buffer still owes: over any number of later steps, all the gradients applied while the
 * optimizer kept the momentum count 1/(1 - m) times (momentum SGD's total, Nesterov's too),
 * the flagged steps' once (DGC's update is complete), whether the tensor stays flagged or
 * its momentum comes back to the optimizer before the tail has run out. */
static void test_momentum_release(void) {
    const float lr = 0.1f, mu = 0.9f;
    for (int c = 0; c < 4; c++) {
        const int nesterov = c & 1, back = c >> 1;
        gtrain_model *m;
        CHECK(gtrain_model_create("mlp", "24,16", 9, 4, &m) == GTRAIN_OK, "create");
        gtrain_tensor *t = gtrain_model_tensors(m, NULL);
        const size_t n = t[0].n;
        double *w0 = malloc(n * sizeof *w0), *owed = calloc(n, sizeof *owed);
        unsigned long long seed = 77 + (unsigned)c;
        for (size_t i = 0; i < n; i++) w0[i] = t[0].w[i];
        unsigned char skip[6] = {0};
        for (int s = 0; s < 308; s++) {
            const int phase = s < 5 ? 0 : s < 8 ? 1 : 2; /* optimizer, flagged, no gradient */
            if (s == 5) {
                gtrain_sgd_release_tensor(m, 0);
                skip[0] = 1;
            }
            if (s == 8 && back) skip[0] = 0; /* the momentum comes back mid-tail */
            for (size_t i = 0; i < n; i++) {
                float g = phase == 2 ? 0.0f : (float)((double)(lcg(&seed) >> 40) / (1 << 24) - 0.5);
                t[0].g[i] = g;
                owed[i] += phase == 0 ? g / (1.0 - mu) : g;
            }
            gtrain_sgd_step(m, lr, mu, 0.0f, nesterov, skip);
        }
        double worst = 0, big = 0;
        for (size_t i = 0; i < n; i++) {
            worst = fmax(worst, fabs((w0[i] - t[0].w[i]) - lr * owed[i]));
            big = fmax(big, fabs(lr * owed[i]));
        }
        CHECK(big > 0 && worst < 1e-5 * big + 1e-6,
              "%s%s: the weights moved %g off the gradients they were owed (of %g)",
              nesterov ? "nesterov" : "momentum", back ? ", momentum back mid-tail" : "", worst,
              big);
        free(w0);
        free(owed);
        gtrain_model_free(m);
    }
}

int main(void) {
    test_create_errors();
    test_tensors();
    test_macs();
    test_init();
    test_determinism();
    test_callback("mlp");
    test_callback("cnn");
    test_sgd();
    test_summed_loss();
    test_momentum_release();
    test_eval();
    if (!check_failures) printf("train_model: all checks passed\n");
    return check_failures ? 1 : 0;
}

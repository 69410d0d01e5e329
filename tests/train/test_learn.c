/*
 * test_learn.c — end-to-end: does the trainer core actually learn?
 *   test_train_learn synthetic   default MLP, 300 steps of batch 64 on the synthetic problem:
 *                                the mean loss of the last 50 steps must be below a quarter of
 *                                the initial loss, and held-out accuracy (another seed) ≥ 90 %.
 *   test_train_learn fmnist      default MLP (784-1024-1024-10), 1 epoch of Fashion-MNIST with
 *                                batch 64, lr 0.05, momentum 0.9, the documented shuffle/shard
 *                                loop with one rank: test accuracy ≥ 80 %. Exits 77 (ctest:
 * skipped) when the dataset is not installed. Both print ms per step, for information only: timing
 * is bench/'s job, not a pass criterion. Rejected: asserting exact loss values (would pin the test
 * to one OpenBLAS kernel's summation order; determinism has its own test).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "data.h"
#include "model.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One epoch (at most max_steps steps) of rank 0 of 1, exactly as data.h describes the loop.
 * Returns the mean training loss of the last `tail` steps; *steps and *ms receive the number of
 * steps taken and the mean time of forward_backward + sgd_step. */
static double epoch(gtrain_model *m, const gtrain_data *d, uint64_t seed, uint64_t e, size_t B,
                    size_t max_steps, float lr, size_t tail, size_t *steps, double *ms) {
    uint32_t *perm = malloc(d->n * sizeof(uint32_t)), *mine = malloc(d->n * sizeof(uint32_t));
    float *x = malloc(B * d->dim * sizeof(float)), *losses = malloc(d->n / B * sizeof(float));
    uint8_t *y = malloc(B);
    gtrain_shuffle(perm, d->n, seed, e);
    size_t count = gtrain_shard(perm, d->n, 0, 1, mine), s = 0;
    double busy = 0, sum = 0;
    for (; (s + 1) * B <= count && s < max_steps; s++) {
        gtrain_data_gather(d, mine + s * B, B, x, y);
        double t = now();
        gtrain_model_forward_backward(m, x, y, B, &losses[s]);
        gtrain_sgd_step(m, lr, 0.9f, 0.0f, 0, NULL);
        busy += now() - t;
    }
    for (size_t i = s > tail ? s - tail : 0; i < s; i++) sum += losses[i];
    *steps = s;
    *ms = 1e3 * busy / (double)(s ? s : 1);
    free(perm);
    free(mine);
    free(x);
    free(losses);
    free(y);
    return sum / (double)(s < tail ? (s ? s : 1) : tail);
}

static int synthetic(void) {
    gtrain_data tr, te;
    gtrain_model *m;
    CHECK(gtrain_data_synthetic(19200, 1, &tr) == GTRAIN_OK, "synthetic");
    CHECK(gtrain_data_synthetic(2000, 2, &te) == GTRAIN_OK, "synthetic");
    CHECK(gtrain_model_create("mlp", NULL, 1, 64, &m) == GTRAIN_OK, "create");
    if (check_failures) return 1;
    double l0, a0, l1, a1, ms;
    size_t steps;
    gtrain_model_evaluate(m, te.x, te.y, te.n, &l0, &a0);
    double tail = epoch(m, &tr, 7, 0, 64, 300, 0.05f, 50, &steps, &ms);
    gtrain_model_evaluate(m, te.x, te.y, te.n, &l1, &a1);
    printf("synthetic: %zu steps, %.2f ms/step; held-out loss %.4f -> %.4f, accuracy %.1f%% -> "
           "%.1f%%; mean loss of the last 50 steps %.4f\n",
           steps, ms, l0, l1, 100 * a0, 100 * a1, tail);
    CHECK(steps == 300, "took %zu steps", steps);
    CHECK(tail < 0.25 * l0, "training loss %g is not below a quarter of the initial %g", tail, l0);
    CHECK(a1 >= 0.90, "held-out accuracy %.3f < 0.90", a1);
    gtrain_model_free(m);
    gtrain_data_free(&tr);
    gtrain_data_free(&te);
    return check_failures ? 1 : 0;
}

static int fmnist(void) {
    gtrain_data tr, te;
    char err[512];
    double t0 = now();
    int st = gtrain_data_load(NULL, "train", &tr, err, sizeof err);
    if (st == GTRAIN_ERR_NOFILE) {
        printf("skipped: %s\n", err);
        return SKIP_CODE;
    }
    CHECK(st == GTRAIN_OK, "train split: %s", err);
    CHECK(gtrain_data_load(NULL, "t10k", &te, err, sizeof err) == GTRAIN_OK, "t10k: %s", err);
    if (check_failures) return 1;
    double t_load = now() - t0;
    gtrain_model *m;
    CHECK(gtrain_model_create("mlp", NULL, 1, 64, &m) == GTRAIN_OK, "create");
    double loss, acc, ms;
    size_t steps;
    double tail = epoch(m, &tr, 1, 0, 64, SIZE_MAX, 0.05f, 1, &steps, &ms);
    gtrain_model_evaluate(m, te.x, te.y, te.n, &loss, &acc);
    printf("fashion-mnist: load %.2f s; 1 epoch of mlp 784-1024-1024-10 (%zu steps of 64, lr "
           "0.05, momentum 0.9): %.2f ms/step, last train loss %.4f; t10k loss %.4f, accuracy "
           "%.2f%%\n",
           t_load, steps, ms, tail, loss, 100 * acc);
    CHECK(steps == 60000 / 64, "took %zu steps", steps);
    CHECK(acc >= 0.80, "test accuracy %.4f < 0.80 after one epoch", acc);
    gtrain_model_free(m);
    gtrain_data_free(&tr);
    gtrain_data_free(&te);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "fmnist") == 0) return fmnist();
    if (argc > 1 && strcmp(argv[1], "synthetic") == 0) return synthetic();
    fprintf(stderr, "usage: %s synthetic|fmnist\n", argv[0]);
    return 2;
}

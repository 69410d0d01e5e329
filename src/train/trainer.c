/*
 * trainer.c - the data-parallel training loop behind `gradcomp train`.
 *
 * One step on every rank:
 *   forward, then backward from the last layer to the first; as each tensor's gradient
 *   becomes final the model calls back and the exchange of that tensor starts at once
 *   (exchange.c), so the wire time of the late layers hides behind the backward pass of
 *   the early ones (the overlap of PyTorch DDP's buckets, at layer granularity);
 *   wait for every exchange: each g now holds the average over ranks of what the
 *   compressors sent;
 *   SGD with momentum and weight decay (skipping momentum where DGC owns it).
 * Evaluation runs a few times per epoch on a shard of the test set per rank; its time is
 * excluded from the training clock, so "time to accuracy" is training time.
 *
 * The weights must stay bit-identical on every rank: every rank applies the same averaged
 * update.  Each evaluation compares a hash of the weights across ranks.
 */
#define _POSIX_C_SOURCE 200809L
#include "trainer.h"

#include "exchange.h"
#include "model.h"
#include "outer.h"
#include "train_adapt.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

static uint64_t hash_weights(gtrain_model *m) {
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < nt; i++) {
        for (size_t j = 0; j < t[i].n; j++) {
            uint32_t u;
            memcpy(&u, &t[i].w[j], 4);
            h = (h ^ u) * 0x100000001b3ull;
        }
    }
    return h;
}

int gtrain_same_weights(gtrain_model *m, MPI_Comm comm) {
    uint64_t h[2] = {hash_weights(m), 0};
    h[1] = ~h[0];
    MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MAX, comm);
    return h[0] == ~h[1];
}

/* This rank's share [lo, hi) of n samples evaluated across comm. */
static void shard(size_t n, MPI_Comm comm, size_t *lo, size_t *hi) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    size_t per = (n + (size_t)P - 1) / (size_t)P;
    *lo = (size_t)rank * per < n ? (size_t)rank * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

int gtrain_evaluate(gtrain_model *m, const gtrain_data *test, MPI_Comm comm, double *acc,
                    double *loss) {
    size_t lo, hi;
    shard(test->n, comm, &lo, &hi);
    double sums[3] = {0, 0, 0};
    if (hi > lo) {
        double l, a;
        if (gtrain_model_evaluate(m, test->x + lo * test->dim, test->y + lo, hi - lo, &l, &a))
            return 1;
        sums[0] = a * (double)(hi - lo);
        sums[1] = l * (double)(hi - lo);
        sums[2] = (double)(hi - lo);
    }
    MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, comm);
    *acc = sums[0] / sums[2];
    *loss = sums[1] / sums[2];
    return 0;
}

int gtrain_evaluate_point(gtrain_model *m, const gtrain_config *cfg, const gtrain_data *test,
                          MPI_Comm comm, gtrain_point *p) {
    p->val_acc = p->val_loss = NAN;
    return gtrain_evaluate(m, test, comm, &p->test_acc, &p->test_loss) ||
           (cfg->val && gtrain_evaluate(m, cfg->val, comm, &p->val_acc, &p->val_loss));
}

gtrain_verdicts gtrain_final_verdicts(gtrain_model *m, const gtrain_data *set, double acc,
                                      MPI_Comm comm, const char *method, const char *what) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    size_t lo, hi;
    shard(set->n, comm, &lo, &hi);
    gtrain_verdicts v = {set->n <= INT_MAX ? calloc(set->n ? set->n : 1, 1) : NULL, set->n};
    uint8_t *pred = malloc(hi > lo ? hi - lo : 1);
    int bad = !v.right || !pred ||
              (hi > lo && gtrain_model_predict(m, set->x + lo * set->dim, hi - lo, pred));
    for (size_t i = lo; !bad && i < hi; i++) v.right[i] = pred[i - lo] == set->y[i];
    free(pred);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
    if (!bad) {
        MPI_Allreduce(MPI_IN_PLACE, v.right, (int)v.n, MPI_UNSIGNED_CHAR, MPI_SUM, comm);
        size_t right = 0;
        for (size_t i = 0; i < v.n; i++) right += v.right[i];
        if (fabs((double)right - acc * (double)v.n) > 0.5) {
            if (rank == 0)
                fprintf(stderr,
                        "train: %s: the final model is right on %zu of %zu %s samples, its "
                        "last evaluation said %.4f; no standard error for it\n",
                        method, right, v.n, what, acc);
            bad = 1;
        }
    }
    if (bad) {
        free(v.right);
        v = (gtrain_verdicts){NULL, 0};
    }
    return v;
}

double gtrain_paired_se(const gtrain_verdicts *a, const gtrain_verdicts *b) {
    if (!a->right || !b->right || a->n != b->n || a->n < 2) return NAN;
    size_t n = a->n, only_a = 0, only_b = 0;
    for (size_t i = 0; i < n; i++) {
        only_a += a->right[i] && !b->right[i];
        only_b += b->right[i] && !a->right[i];
    }
    /* d_i = right_a - right_b in {-1, 0, 1}: the standard error of its mean */
    double N = (double)n, mean = ((double)only_a - (double)only_b) / N;
    double var = ((double)(only_a + only_b) / N - mean * mean) * N / (N - 1);
    return sqrt(var > 0 ? var / N : 0);
}

/* Median of 3 forward+backward passes (after one warm-up), the slowest rank's. */
static double measure_compute(gtrain_model *m, const gtrain_data *train, size_t batch,
                              MPI_Comm comm) {
    float *xb = malloc(batch * train->dim * sizeof(float));
    uint8_t *yb = malloc(batch);
    double ts[3] = {0, 0, 0};
    if (xb && yb) {
        for (size_t i = 0; i < batch; i++) {
            size_t j = i % train->n;
            memcpy(xb + i * train->dim, train->x + j * train->dim, train->dim * sizeof(float));
            yb[i] = train->y[j];
        }
        gtrain_model_forward_backward(m, xb, yb, batch, NULL);
        for (int r = 0; r < 3; r++) {
            double t0 = now_s();
            gtrain_model_forward_backward(m, xb, yb, batch, NULL);
            ts[r] = now_s() - t0;
        }
    }
    free(xb);
    free(yb);
    double a = ts[0], b = ts[1], c = ts[2];
    double med = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
    MPI_Allreduce(MPI_IN_PLACE, &med, 1, MPI_DOUBLE, MPI_MAX, comm);
    return med;
}

/* The cost model's prediction for this run (gradcomp.h, "Cost model"). */
static void predict(const gtrain_config *cfg, const gtrain_exchange *ex, size_t nt, int P,
                    double fb_s, double sgd_s, gtrain_result *out) {
    const gcomp_cost_net_rate *inter = gcomp_cost_calibration_net(cfg->calibration, "inter"),
                              *intra = gcomp_cost_calibration_net(cfg->calibration, "intra");
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = P;
    net.nodes = gtrain_exchange_nodes(ex);
    if (net.nodes < 1 || net.nodes > P) return;
    if (cfg->link_bps > 0) { /* a shaped link: TCP payload of Ethernet frames */
        net.inter.bandwidth = cfg->link_bps / 8 * (1448.0 / 1514.0);
        if (inter) { /* measured on this link: its latency, and the shaper's burst */
            net.inter.latency = inter->latency;
            net.inter.burst = inter->burst;
        }
        net.inter.latency += cfg->link_delay_s; /* every hop crosses one delayed link */
    } else if (inter || (intra && net.nodes == 1)) {
        gcomp_cost_link_measured(inter ? inter : intra, &net.inter);
    } else {
        return; /* nothing says how fast the network is */
    }
    if (intra) gcomp_cost_link_measured(intra, &net.intra);
    if (net.nodes == 1) net.intra = net.inter; /* one node: the measured link is the node's */
    gcomp_cost_tensor *ct = malloc(nt * sizeof *ct);
    gcomp_cost_model *cm = NULL;
    gcomp_cost_result r;
    gcomp_cost_compute c = {fb_s / 3, fb_s - fb_s / 3, sgd_s, 0, 1}; /* gtrain_exchange_finish */
    if (ct) {
        gtrain_exchange_cost_tensors(ex, ct);
        if (gcomp_cost_model_create(&cm, ct, nt, P, net.nodes, cfg->calibration, NULL) ==
                GCOMP_OK &&
            gcomp_cost_eval(cm, &net, &c, &r, NULL) == GCOMP_OK) {
            out->predicted = 1;
            out->pred_step_ms = 1e3 * r.step_s;
            out->pred_codec_ms = 1e3 * r.codec_s;
            out->pred_exposed_ms = 1e3 * r.exposed_s;
            out->pred_bytes_per_step = r.bytes_sent;
            out->pure_compute_ms = 1e3 * fb_s;
        }
    }
    gcomp_cost_model_free(cm);
    free(ct);
}

typedef struct ready_ctx {
    gtrain_exchange *ex;
    gtrain_outer *ox;    /* local SGD: no exchange per step, but the syncs in flight move on */
    gtrain_adapt *adapt; /* an adaptive method's controllers, or NULL */
    int failed;
} ready_ctx;

static void on_ready(void *ctx, size_t i) {
    ready_ctx *r = ctx;
    if (r->ox)
        gtrain_outer_progress(r->ox);
    else if (!r->failed && r->adapt && gtrain_adapt_observe(r->adapt, r->ex, i) != 0)
        r->failed = 1;
    else if (!r->failed && gtrain_exchange_start(r->ex, i) != 0)
        r->failed = 1;
}

/* Evaluates the model the ranks share and checks that they do share it: the weights, or
 * with an outer step its global weights (the last syncs'; the live ones differ between
 * syncs by design).  Collective. */
static int eval_shared(gtrain_model *m, gtrain_outer *ox, const gtrain_config *cfg,
                       const gtrain_data *test, MPI_Comm comm, gtrain_point *p, int *same) {
    if (ox) gtrain_outer_eval_begin(ox);
    int rc = gtrain_evaluate_point(m, cfg, test, comm, p);
    *same = gtrain_same_weights(m, comm);
    if (ox) gtrain_outer_eval_end(ox);
    return rc;
}

/* The codec time the buckets measured so far (the compression started from backward). */
static double codec_so_far(const gtrain_exchange *ex) {
    gtrain_exchange_stats xs;
    gtrain_exchange_get_stats(ex, &xs);
    return xs.codec_s;
}

/* An adaptive run's history for the result (the model's names are copied: they live with
 * the model). */
static int keep_history(const gtrain_adapt *ad, const gtrain_tensor *t, size_t nt,
                        gtrain_result *out) {
    size_t n;
    const gtrain_setting *h = gtrain_adapt_history(ad, &n);
    out->settings = malloc((n + 1) * sizeof *out->settings);
    out->tensor_names = calloc(nt, sizeof *out->tensor_names);
    if (!out->settings || !out->tensor_names) return 1;
    memcpy(out->settings, h, n * sizeof *h);
    out->nsettings = n;
    out->ntensors = nt;
    for (size_t i = 0; i < nt; i++)
        if (!(out->tensor_names[i] = strdup(t[i].name))) return 1;
    out->decisions = gtrain_adapt_decisions(ad);
    size_t nl, K = gtrain_adapt_ladder_size(ad);
    const gtrain_decision *l = gtrain_adapt_log(ad, &nl);
    out->dlog = malloc((nl + 1) * sizeof *out->dlog);
    out->ladder = calloc(K + 1, sizeof *out->ladder);
    if (!out->dlog || !out->ladder) return 1;
    memcpy(out->dlog, l, nl * sizeof *l);
    out->ndlog = nl;
    out->nladder = K;
    for (size_t j = 0; j < K; j++)
        if (!(out->ladder[j] = strdup(gtrain_adapt_candidate(ad, j)))) return 1;
    gtrain_adapt_errors(ad, &out->error, &out->error_uniform);
    return 0;
}

static void progress_line(const gtrain_config *cfg, const char *method, const gtrain_point *p,
                          double bytes_per_step, double step_ms, int final) {
    if (cfg->progress == 2) {
        int width = 24, done = (int)(p->epoch / cfg->epochs * width + 0.5);
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = 0;
        fprintf(
            stderr,
            "\r  %-28.28s [%s] epoch %5.2f  loss %.4f  acc %6.2f%%  %9.0f B/step  %6.2f ms/step%s",
            method, bar, p->epoch, p->train_loss, 100 * p->test_acc, bytes_per_step, step_ms,
            final ? "\n" : "");
    } else if (cfg->progress == 1) {
        fprintf(stderr,
                "  %-28.28s epoch %5.2f  loss %.4f  acc %6.2f%%  %9.0f B/step  %6.2f ms/step\n",
                method, p->epoch, p->train_loss, 100 * p->test_acc, bytes_per_step, step_ms);
    }
    fflush(stderr);
}

int gtrain_run(const gtrain_config *cfg, const char *method, const gtrain_data *train,
               const gtrain_data *test, MPI_Comm comm, gtrain_result *out, char *err,
               size_t errlen) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    memset(out, 0, sizeof *out);
    snprintf(out->method, sizeof out->method, "%s", method);

    gtrain_model *m = NULL;
    int st = gtrain_model_create(cfg->model, cfg->hidden, cfg->seed, cfg->batch, &m);
    if (st) return fail(err, errlen, "model %s: %s", cfg->model, gtrain_strerror(st));
    gtrain_model_set_summed_loss(m, cfg->summed_loss);
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    out->params = gtrain_model_num_params(m);
    out->dense_bytes_per_step = 4.0 * (double)out->params;

    size_t steps_per_epoch = (train->n / (size_t)P) / cfg->batch;
    if (cfg->max_steps_per_epoch > 0 && steps_per_epoch > (size_t)cfg->max_steps_per_epoch)
        steps_per_epoch = (size_t)cfg->max_steps_per_epoch;
    /* The method's outer-step items (local SGD) come off before the layer policy sees it;
     * an adaptive method's controllers give every tensor its first spec. */
    gtrain_outer_cfg oc = cfg->outer;
    char core[1024];
    gtrain_exchange *ex = NULL;
    gtrain_outer *ox = NULL;
    gtrain_adapt *adapt = NULL;
    int bad = gtrain_outer_method(method, &oc, core, sizeof core, err, errlen);
    if (!bad && oc.local_steps > 0 && gtrain_adapt_is_method(core))
        bad = fail(err, errlen,
                   "adaptive methods retune the per-step exchange; local SGD has none (drop "
                   "--local-steps or local_steps=)");
    if (!bad && gtrain_adapt_is_method(core))
        bad = gtrain_adapt_create(&adapt, core, t, nt,
                                  (uint64_t)steps_per_epoch * (uint64_t)cfg->epochs, &cfg->policy,
                                  cfg->calibration, comm, err, errlen);
    if (!bad && adapt && cfg->nreference)
        bad = gtrain_adapt_set_reference(adapt, cfg->reference, cfg->nreference, cfg->epochs,
                                         cfg->val != NULL, &out->steered_by_reference, err, errlen);
    if (bad || (oc.local_steps > 0
                    ? gtrain_outer_create(&ox, &oc, core, t, nt, &cfg->policy, cfg->strategy,
                                          cfg->timeout_s, comm, err, errlen)
                    : gtrain_exchange_create(&ex, core, t, nt,
                                             adapt ? gtrain_adapt_specs(adapt) : NULL, &cfg->policy,
                                             cfg->strategy, cfg->timeout_s, comm, err, errlen))) {
        gtrain_adapt_free(adapt);
        gtrain_model_free(m);
        return 1;
    }
    out->local_steps = oc.local_steps;
    gtrain_outer_cfg_describe(&oc, out->outer, sizeof out->outer);
    if (ex)
        gtrain_exchange_describe(ex, out->detail, sizeof out->detail);
    else
        gtrain_outer_describe(ox, out->detail, sizeof out->detail);
    /* DGC's compressor keeps the momentum of a gradient it sends each step; a local-SGD
     * inner step keeps its own (a DGC spec there compresses pseudo-gradients). */
    unsigned char *skip = calloc(nt, 1);
    for (size_t i = 0; ex && skip && i < nt; i++)
        skip[i] = (unsigned char)gtrain_exchange_owns_momentum(ex, i);

    size_t shard_cap = train->n / (size_t)P + 1;
    uint32_t *perm = malloc(train->n * sizeof(uint32_t)),
             *mine = malloc(shard_cap * sizeof(uint32_t));
    float *xb = malloc(cfg->batch * train->dim * sizeof(float));
    uint8_t *yb = malloc(cfg->batch);
    size_t eval_every =
        steps_per_epoch / (size_t)(cfg->evals_per_epoch > 0 ? cfg->evals_per_epoch : 1);
    if (eval_every == 0) eval_every = 1;
    size_t cap_points = (size_t)cfg->epochs * (steps_per_epoch / eval_every + 2) + 2;
    out->points = calloc(cap_points, sizeof(gtrain_point));
    int rc = 0;
    if (!skip || !perm || !mine || !xb || !yb || !out->points || steps_per_epoch == 0) {
        rc = fail(err, errlen,
                  steps_per_epoch ? "out of memory"
                                  : "batch %zu too large for %zu samples on %d ranks",
                  cfg->batch, train->n, P);
        goto done;
    }
    /* The compute the cost model is given: forward+backward without any exchange, on the
     * first batch (gradients are overwritten by the first real step; weights untouched). */
    double fb_s = measure_compute(m, train, cfg->batch, comm);
    ready_ctx rctx = {ex, ox, adapt, 0};
    gtrain_model_set_grad_ready(m, on_ready, &rctx);

    /* Starting point. */
    gtrain_point p0 = {0};
    if (gtrain_evaluate_point(m, cfg, test, comm, &p0)) {
        rc = fail(err, errlen, "evaluation failed");
        goto done;
    }
    p0.train_loss = NAN;
    out->points[out->npoints++] = p0;

    double wall = 0, loss_sum = 0, compute_s = 0, wait_s = 0, sgd_s = 0, adapt_s = 0, first_s = 0;
    size_t loss_n = 0, step = 0;
    for (int epoch = 0; epoch < cfg->epochs && !rc; epoch++) {
        gtrain_shuffle(perm, train->n, cfg->seed, (uint64_t)epoch);
        size_t got = gtrain_shard(perm, train->n, (unsigned)rank, (unsigned)P, mine);
        (void)got;
        for (size_t s = 0; s < steps_per_epoch; s++, step++) {
            double t0 = now_s(), codec0 = adapt ? codec_so_far(ex) : 0;
            if (ex) gtrain_exchange_set_epoch(ex, epoch + (double)s / (double)steps_per_epoch);
            gtrain_data_gather(train, mine + s * cfg->batch, cfg->batch, xb, yb);
            float loss;
            if (ex && gtrain_exchange_begin_step(ex) != 0) {
                rc = fail(err, errlen, "%s", gtrain_exchange_error(ex));
                break;
            }
            st = gtrain_model_forward_backward(m, xb, yb, cfg->batch, &loss);
            if (rank == cfg->slow_rank && cfg->slow_factor > 1)
                gtrain_slow_down(now_s() - t0, cfg->slow_factor);
            double t1 = now_s();
            if (st || rctx.failed) {
                rc = fail(err, errlen, "step %zu: %s", step,
                          st ? gtrain_strerror(st) : gtrain_exchange_error(ex));
                break;
            }
            if (ex && gtrain_exchange_finish(ex) != 0) {
                rc = fail(err, errlen, "step %zu: %s", step, gtrain_exchange_error(ex));
                break;
            }
            double t2 = now_s();
            const double run_steps = (double)(steps_per_epoch * cfg->epochs);
            float lr = gtrain_lr_at(cfg, (double)step / run_steps);
            gtrain_sgd_step(m, lr, cfg->momentum, cfg->weight_decay, cfg->nesterov, skip);
            /* the rate of the coming steps: a decision at a decay point sees the decay */
            if (adapt) gtrain_adapt_lr(adapt, gtrain_lr_at(cfg, (double)(step + 1) / run_steps));
            if (ox && gtrain_outer_step(ox) != 0) {
                rc = fail(err, errlen, "step %zu: %s", step, gtrain_outer_error(ox));
                break;
            }
            double t3 = now_s();
            compute_s += t1 - t0;
            wait_s += t2 - t1;
            sgd_s += t3 - t2;
            wall += t3 - t0;
            if (step == 0) first_s = t3 - t0;
            loss_sum += loss;
            loss_n++;
            if (!isfinite(loss)) {
                rc = fail(err, errlen, "step %zu: loss is %f: training diverged", step, loss);
                break;
            }
            bool last = s + 1 == steps_per_epoch;
            if ((s + 1) % eval_every == 0 || last) {
                gtrain_point p = {0};
                p.epoch = epoch + (double)(s + 1) / (double)steps_per_epoch;
                p.bytes = ex ? gtrain_exchange_bytes_sent(ex) : gtrain_outer_bytes_sent(ox);
                /* The ranks' mean clock, as the run's train_seconds: a point is never later
                 * than the run that contains it. */
                double ls[3] = {loss_sum, (double)loss_n, wall};
                MPI_Allreduce(MPI_IN_PLACE, ls, 3, MPI_DOUBLE, MPI_SUM, comm);
                p.train_loss = ls[0] / ls[1];
                p.wall_s = ls[2] / P;
                loss_sum = 0;
                loss_n = 0;
                int same;
                if (eval_shared(m, ox, cfg, test, comm, &p, &same)) {
                    rc = fail(err, errlen, "evaluation failed");
                    break;
                }
                if (adapt) gtrain_adapt_metric(adapt, gtrain_decision_acc(&p, cfg->val != NULL));
                if (!same) {
                    rc = fail(err, errlen, "the ranks' weights differ after step %zu", step);
                    break;
                }
                /* The budget is judged on the slowest rank's clock, so all stop together. */
                double slowest = wall;
                if (cfg->time_budget_s > 0)
                    MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
                bool over = cfg->time_budget_s > 0 && slowest >= cfg->time_budget_s;
                if (out->npoints < cap_points) out->points[out->npoints++] = p;
                if (rank == 0)
                    progress_line(cfg, method, &p, p.bytes / (double)(step + 1),
                                  1e3 * wall / (double)(step + 1),
                                  over || (last && epoch + 1 == cfg->epochs));
                if (over && !(last && epoch + 1 == cfg->epochs)) {
                    out->stopped_by_budget = 1;
                    step++;
                    break;
                }
            }
            if (adapt) { /* the decision's time counts as training time */
                double spent, pure = (t1 - t0) - (codec_so_far(ex) - codec0);
                if (gtrain_adapt_end_step(adapt, ex, m, skip, step + 1,
                                          epoch + (double)(s + 1) / (double)steps_per_epoch,
                                          pure > 0.5 * fb_s ? pure : 0.5 * fb_s, t3 - t2, &spent,
                                          err, errlen)) {
                    rc = 1;
                    break;
                }
                wall += spent;
                adapt_s += spent;
            }
        }
        if (out->stopped_by_budget) break;
    }
    /* Local SGD: the steps since each fragment's last sync are synced too, and the model
     * that results is the run's last point. */
    if (!rc && ox) {
        double t0 = now_s();
        if (gtrain_outer_flush(ox) != 0) {
            rc = fail(err, errlen, "%s", gtrain_outer_error(ox));
        } else {
            wall += now_s() - t0;
            gtrain_point p = out->points[out->npoints - 1];
            double w = wall;
            MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_SUM, comm);
            p.wall_s = w / P;
            p.bytes = gtrain_outer_bytes_sent(ox);
            int same;
            if (eval_shared(m, ox, cfg, test, comm, &p, &same))
                rc = fail(err, errlen, "evaluation failed");
            else if (!same)
                rc = fail(err, errlen, "the ranks' weights differ after the last sync");
            else if (out->npoints < cap_points)
                out->points[out->npoints++] = p;
        }
    }
    if (rc) goto done;

    if (ox) gtrain_outer_eval_begin(ox); /* the model of the last point, as eval_shared */
    {
        const gtrain_point *last = &out->points[out->npoints - 1];
        out->test_verdicts = gtrain_final_verdicts(m, test, last->test_acc, comm, method, "test");
        if (cfg->val)
            out->val_verdicts =
                gtrain_final_verdicts(m, cfg->val, last->val_acc, comm, method, "validation");
    }
    if (ox) gtrain_outer_eval_end(ox);
    out->weights_identical = gtrain_same_weights(m, comm);
    {
        double sgd = sgd_s / (double)step;
        MPI_Allreduce(MPI_IN_PLACE, &sgd, 1, MPI_DOUBLE, MPI_MAX, comm);
        if (ex) predict(cfg, ex, nt, P, fb_s, sgd, out); /* the model knows no outer step */
    }

    gtrain_exchange_stats xs;
    if (ex)
        gtrain_exchange_get_stats(ex, &xs);
    else
        gtrain_outer_get_stats(ox, &xs);
    double v[9] = {1e3 * wall / (double)step,
                   1e3 * xs.codec_s / (double)step,
                   1e3 * xs.comm_s / (double)step,
                   1e3 * compute_s / (double)step,
                   xs.bytes_sent / (double)step,
                   wall,
                   xs.msg_bytes / (double)step,
                   1e3 * first_s,
                   step > 1 ? 1e3 * (wall - first_s) / (double)(step - 1) : 0};
    MPI_Allreduce(MPI_IN_PLACE, v, 9, MPI_DOUBLE, MPI_SUM, comm);
    out->first_step_ms = v[7] / P;
    out->steady_step_ms = v[8] / P;
    out->step_ms = v[0] / P;
    out->codec_ms = v[1] / P;
    out->comm_ms = v[2] / P;
    out->compute_ms = v[3] / P;
    out->bytes_per_step = v[4] / P;
    out->wall_s = v[5] / P;
    out->steps = step;
    out->bytes_total = out->bytes_per_step * (double)step;
    out->ratio = out->dense_bytes_per_step / (v[6] / P);
    out->traffic_ratio =
        P > 1 ? 2.0 * (P - 1) / P * out->dense_bytes_per_step / out->bytes_per_step : 1.0;
    const gtrain_point *last = &out->points[out->npoints - 1];
    out->final_acc = last->test_acc;
    out->final_loss = last->test_loss;
    out->final_val_acc = last->val_acc;
    for (size_t i = 0; i < out->npoints; i++)
        out->best_acc =
            out->points[i].test_acc > out->best_acc ? out->points[i].test_acc : out->best_acc;
    (void)wait_s;
    if (adapt) {
        double a = adapt_s;
        MPI_Allreduce(MPI_IN_PLACE, &a, 1, MPI_DOUBLE, MPI_MAX, comm);
        out->adapt_s = a;
        gtrain_exchange_describe(ex, out->detail, sizeof out->detail);
        if (keep_history(adapt, t, nt, out)) rc = fail(err, errlen, "out of memory");
    }
done:
    gtrain_model_set_grad_ready(m, NULL, NULL);
    gtrain_adapt_free(adapt);
    gtrain_exchange_free(ex);
    gtrain_outer_free(ox);
    gtrain_model_free(m);
    free(skip);
    free(perm);
    free(mine);
    free(xb);
    free(yb);
    return rc;
}

void gtrain_slow_down(double compute_s, double factor) {
    double d = compute_s * (factor - 1);
    if (!(d > 0)) return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

void gtrain_result_free(gtrain_result *r) {
    free(r->points);
    r->points = NULL;
    r->npoints = 0;
    free(r->settings);
    r->settings = NULL;
    r->nsettings = 0;
    for (size_t i = 0; r->tensor_names && i < r->ntensors; i++) free(r->tensor_names[i]);
    free(r->tensor_names);
    r->tensor_names = NULL;
    r->ntensors = 0;
    free(r->dlog);
    r->dlog = NULL;
    r->ndlog = 0;
    for (size_t j = 0; r->ladder && j < r->nladder; j++) free(r->ladder[j]);
    free(r->ladder);
    r->ladder = NULL;
    r->nladder = 0;
    free(r->test_verdicts.right);
    free(r->val_verdicts.right);
    r->test_verdicts = r->val_verdicts = (gtrain_verdicts){NULL, 0};
}

float gtrain_lr_at(const gtrain_config *cfg, double progress) {
    double p = progress < 0 ? 0 : progress > 1 ? 1 : progress, lr = cfg->lr;
    switch (cfg->lr_schedule) {
    case GTRAIN_LR_COSINE:
        return (float)(lr * 0.5 * (1.0 + cos(3.14159265358979323846 * p)));
    case GTRAIN_LR_STEP:
        return (float)(p < 0.5 ? lr : p < 0.75 ? lr * 0.1 : lr * 0.01);
    default:
        return (float)lr;
    }
}

double gtrain_time_to(const gtrain_result *r, double target) {
    for (size_t i = 0; i < r->npoints; i++)
        if (r->points[i].test_acc >= target - 1e-12) return r->points[i].wall_s;
    return -1;
}

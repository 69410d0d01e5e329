/*
 * ps_train.c - the reference trainer over the parameter server (ps_train.h).
 *
 * The worker's step is the collective trainer's (trainer.c): forward, then backward with
 * each tensor's exchange started as soon as its gradient is final - here its push - and
 * the pulls waited for at the end.  What the pulls hold decides the rest: the average
 * gradient (sync aggregate: the trainer's own SGD follows, as with allreduce), or the
 * weights (the servers' SGD: copied into the model).  Async mode ends on the servers'
 * update count instead of a step count, so that a fast worker is free to make more steps
 * than a slow one (what async is for) while the run still sees as many samples as sync.
 *
 * Evaluations pause training on every worker: in async mode each worker finishes the push
 * in flight, then all pull the same weights (nobody is pushing) and share the test set as
 * in sync.  The wait for the slowest worker's step counts as training time; the
 * evaluation does not.  Rejected: evaluating on one worker while the others go on (the
 * time they train during it would not be counted, flattering async), and a fixed number of
 * steps per worker in async (every evaluation would wait for the slow worker's steps).
 */
#define _POSIX_C_SOURCE 200809L
#include "ps_train.h"
#include "outer.h"
#include "train_adapt.h"

#include "exchange.h"
#include "model.h"

#include "gradcomp_mpi.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

const char *gtrain_ps_mode_name(int mode) {
    return mode == GTRAIN_PS_ASYNC ? "async" : mode == GTRAIN_PS_DEVICE ? "device" : "sync";
}

int gtrain_ps_parse(const char *s, int *servers, int *modes, int *nmodes, char *err,
                    size_t errlen) {
    char *end;
    long S = strtol(s, &end, 10);
    if (end == s || S < 1 || S > 64 || (*end && *end != ':'))
        return fail(err, errlen, "--ps %s: S[:sync|async|device[,...]] with 1 <= S <= 64", s);
    *servers = (int)S;
    *nmodes = 0;
    if (!*end) {
        modes[(*nmodes)++] = GTRAIN_PS_SYNC;
        return 0;
    }
    for (const char *p = end + 1; *p;) {
        size_t l = strcspn(p, ",+");
        int m = -1;
        for (int k = 0; k < 3; k++)
            if (strlen(gtrain_ps_mode_name(k)) == l && !strncmp(p, gtrain_ps_mode_name(k), l))
                m = k;
        if (m < 0 || *nmodes == 3)
            return fail(err, errlen, "--ps %s: modes are sync, async and device", s);
        modes[(*nmodes)++] = m;
        p += l;
        if (*p) p++;
    }
    if (*nmodes == 0) modes[(*nmodes)++] = GTRAIN_PS_SYNC;
    return 0;
}

float gtrain_ps_momentum(const gtrain_config *cfg, const gtrain_ps_config *pc, int workers) {
    if (pc->mode != GTRAIN_PS_ASYNC) return cfg->momentum;
    if (pc->async_momentum >= 0) return pc->async_momentum;
    float m = 1.0f - (float)workers * (1.0f - cfg->momentum);
    return m > 0 ? m : 0;
}

typedef struct ready_ctx {
    gtrain_exchange *ex;
    int failed;
} ready_ctx;

static void on_ready(void *ctx, size_t i) {
    ready_ctx *r = ctx;
    if (!r->failed && gtrain_exchange_start(r->ex, i) != 0) r->failed = 1;
}

/* Every bucket's kv.init (worker 0's weights) or kv.pull, into the model's weights. */
static int weights_call(gtrain_exchange *ex, gtrain_tensor *t, size_t nt, bool init,
                        double timeout_s, char *err, size_t errlen) {
    for (size_t i = 0; i < nt; i++) {
        gcomp_error e = {0};
        float *w[1] = {t[i].w};
        gcomp_mpi_bucket *b = gtrain_exchange_bucket(ex, i);
        gcomp_status st =
            init ? gcomp_mpi_ps_init(b, w, timeout_s, &e) : gcomp_mpi_ps_pull(b, w, timeout_s, &e);
        if (st != GCOMP_OK)
            return fail(err, errlen, "%s %s: %s", init ? "init" : "pull", t[i].name, e.message);
    }
    return 0;
}

/* What a worker's run adds up to (summed or maxed over the workers at the end). */
typedef struct wsum {
    double wall, compute, codec, comm, sent, msg, steps, updates, pushed, pulled;
} wsum;

static void progress(const gtrain_config *cfg, const char *label, const gtrain_point *p,
                     double bytes_per_step, double step_ms) {
    if (!cfg->progress) return;
    fprintf(stderr, "  %-40.40s epoch %5.2f  loss %.4f  acc %6.2f%%  %9.0f B/step  %6.2f ms/step\n",
            label, p->epoch, p->train_loss, 100 * p->test_acc, bytes_per_step, step_ms);
    fflush(stderr);
}

/* The worker's side of the run, on wcomm (the workers). */
static int worker_run(const gtrain_config *cfg, const gtrain_ps_config *pc, const char *label,
                      gtrain_model *m, gtrain_exchange *ex, gcomp_mpi_ps *ps,
                      const unsigned char *skip, const gtrain_data *train, const gtrain_data *test,
                      MPI_Comm wcomm, gtrain_result *out, wsum *ws, char *err, size_t errlen) {
    int rank, W;
    MPI_Comm_rank(wcomm, &rank);
    MPI_Comm_size(wcomm, &W);
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    bool async = pc->mode == GTRAIN_PS_ASYNC, update = async || pc->update;
    size_t spe = (train->n / (size_t)W) / cfg->batch; /* steps per epoch, sync */
    if (cfg->max_steps_per_epoch > 0 && spe > (size_t)cfg->max_steps_per_epoch)
        spe = (size_t)cfg->max_steps_per_epoch;
    size_t eval_every = spe / (size_t)(cfg->evals_per_epoch > 0 ? cfg->evals_per_epoch : 1);
    if (eval_every == 0) eval_every = 1;
    /* Everything is counted in sync-equivalent steps (W batches); async counts updates. */
    double total = (double)spe * cfg->epochs, per = async ? (double)W : 1.0;
    size_t cap_points = (size_t)cfg->epochs * (spe / eval_every + 2) + 2;
    size_t shard_cap = train->n / (size_t)W + 1;
    uint32_t *perm = malloc(train->n * sizeof(uint32_t)),
             *mine = malloc(shard_cap * sizeof(uint32_t));
    float *xb = malloc(cfg->batch * train->dim * sizeof(float));
    uint8_t *yb = malloc(cfg->batch);
    out->points = calloc(cap_points, sizeof(gtrain_point));
    int rc = 0;
    if (!perm || !mine || !xb || !yb || !out->points || spe == 0) {
        rc = fail(err, errlen,
                  spe ? "out of memory" : "batch %zu too large for %zu samples on %d workers",
                  cfg->batch, train->n, W);
        goto done;
    }
    ready_ctx rctx = {ex, 0};
    gtrain_model_set_grad_ready(m, on_ready, &rctx);
    /* kv.init: worker 0's weights are everyone's (all started from the same seed anyway). */
    if (update && weights_call(ex, t, nt, true, cfg->timeout_s, err, errlen)) {
        rc = 1;
        goto done;
    }
    gtrain_point p0 = {0};
    if (gtrain_evaluate_point(m, cfg, test, wcomm, &p0)) {
        rc = fail(err, errlen, "evaluation failed");
        goto done;
    }
    p0.train_loss = NAN;
    out->points[out->npoints++] = p0;

    double t_start = now_s(), eval_s = 0, loss_sum = 0, compute_s = 0;
    size_t loss_n = 0, my_steps = 0, pos = spe, next_eval = eval_every;
    uint64_t local_epoch = 0;
    double progress_steps = 0; /* sync-equivalent steps done */
    for (bool done = false; !done && !rc;) {
        if (pos == spe) { /* a new pass over this worker's shard */
            gtrain_shuffle(perm, train->n, cfg->seed, local_epoch++);
            gtrain_shard(perm, train->n, (unsigned)rank, (unsigned)W, mine);
            pos = 0;
        }
        double t0 = now_s();
        float lr = gtrain_lr_at(cfg, progress_steps / total);
        gcomp_mpi_ps_set_lr(ps, lr);
        gtrain_exchange_set_epoch(ex, progress_steps / (double)spe);
        gtrain_data_gather(train, mine + pos * cfg->batch, cfg->batch, xb, yb);
        pos++;
        float loss;
        gtrain_exchange_begin_step(ex);
        int st = gtrain_model_forward_backward(m, xb, yb, cfg->batch, &loss);
        if (rank == cfg->slow_rank && cfg->slow_factor > 1)
            gtrain_slow_down(now_s() - t0, cfg->slow_factor);
        double t1 = now_s();
        if (st || rctx.failed) {
            rc = fail(err, errlen, "step %zu: %s", my_steps,
                      st ? gtrain_strerror(st) : gtrain_exchange_error(ex));
            break;
        }
        if (gtrain_exchange_finish(ex) != 0) {
            rc = fail(err, errlen, "step %zu: %s", my_steps, gtrain_exchange_error(ex));
            break;
        }
        if (update) /* the pulls hold the servers' new weights */
            for (size_t i = 0; i < nt; i++) memcpy(t[i].w, t[i].g, t[i].n * sizeof(float));
        else
            gtrain_sgd_step(m, lr, cfg->momentum, cfg->weight_decay, cfg->nesterov, skip);
        compute_s += t1 - t0;
        my_steps++;
        loss_sum += loss;
        loss_n++;
        if (!isfinite(loss)) {
            rc = fail(err, errlen, "step %zu: loss is %f: training diverged", my_steps, loss);
            break;
        }
        /* Progress: sync steps; async updates (the servers' count, as this worker's reply
         * reported it) over W. */
        progress_steps = async
                             ? (double)gcomp_mpi_ps_version(gtrain_exchange_bucket(ex, 0), 0) / per
                             : (double)my_steps;
        size_t done_steps = (size_t)progress_steps;
        if (done_steps < next_eval && progress_steps < total) continue;

        /* An evaluation point: every worker gets here after its current step. */
        double te = now_s();
        MPI_Barrier(wcomm);
        double tb = now_s();
        if (async) { /* nobody pushes now: all pull the same weights and update count */
            if (weights_call(ex, t, nt, false, cfg->timeout_s, err, errlen)) {
                rc = 1;
                break;
            }
            progress_steps = (double)gcomp_mpi_ps_version(gtrain_exchange_bucket(ex, 0), 0) / per;
        }
        (void)te;
        gtrain_point p = {0};
        p.epoch = progress_steps / (double)spe;
        p.wall_s = tb - t_start - eval_s;
        p.bytes = gtrain_exchange_bytes_sent(ex);
        double ls[2] = {loss_sum, (double)loss_n};
        MPI_Allreduce(MPI_IN_PLACE, ls, 2, MPI_DOUBLE, MPI_SUM, wcomm);
        p.train_loss = ls[1] > 0 ? ls[0] / ls[1] : NAN;
        loss_sum = 0;
        loss_n = 0;
        if (gtrain_evaluate_point(m, cfg, test, wcomm, &p)) {
            rc = fail(err, errlen, "evaluation failed");
            break;
        }
        if (!gtrain_same_weights(m, wcomm)) {
            rc = fail(err, errlen, "the workers' weights differ after %.0f steps", progress_steps);
            break;
        }
        double slowest = p.wall_s;
        MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, wcomm);
        p.wall_s = slowest;
        bool last = progress_steps >= total;
        bool over = cfg->time_budget_s > 0 && slowest >= cfg->time_budget_s && !last;
        if (out->npoints < cap_points) out->points[out->npoints++] = p;
        if (rank == 0)
            progress(cfg, label, &p, p.bytes / (double)my_steps, 1e3 * p.wall_s / progress_steps);
        while (next_eval <= (size_t)progress_steps) next_eval += eval_every;
        if (over) out->stopped_by_budget = 1;
        done = last || over;
        eval_s += now_s() - tb;
    }
    gtrain_model_set_grad_ready(m, NULL, NULL);
    if (!rc) {
        double wall = 0;
        if (out->npoints) wall = out->points[out->npoints - 1].wall_s;
        gtrain_exchange_stats xs;
        gtrain_exchange_get_stats(ex, &xs);
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        ws->wall = wall;
        ws->compute = compute_s;
        ws->codec = xs.codec_s;
        ws->comm = xs.comm_s;
        ws->sent = xs.bytes_sent;
        ws->msg = xs.msg_bytes;
        ws->steps = (double)my_steps;
        ws->updates = progress_steps;
        ws->pushed = (double)s.bytes_pushed;
        ws->pulled = (double)s.bytes_pulled;
        out->weights_identical = gtrain_same_weights(m, wcomm);
        out->ps_workers_lost = (int)s.workers_lost;
    }
done:
    free(perm);
    free(mine);
    free(xb);
    free(yb);
    return rc;
}

int gtrain_run_ps(const gtrain_config *cfg, const gtrain_ps_config *pc, const char *method,
                  const gtrain_data *train, const gtrain_data *test, MPI_Comm comm,
                  gtrain_result *out, char *err, size_t errlen) {
    int rank, P;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    memset(out, 0, sizeof *out);
    snprintf(out->method, sizeof out->method, "%s", method);
    snprintf(out->exchange, sizeof out->exchange, "ps %d %s%s", pc->servers,
             gtrain_ps_mode_name(pc->mode),
             pc->mode != GTRAIN_PS_ASYNC && pc->update ? "+update" : "");
    out->ps_momentum = gtrain_ps_momentum(cfg, pc, P - pc->servers);
    int S = pc->servers, W = P - S;
    if (W < 1) return fail(err, errlen, "--ps %d on %d ranks leaves no worker", S, P);
    { /* local SGD syncs weights, not gradients: its outer step runs on the collectives */
        gtrain_outer_cfg oc = cfg->outer;
        char core[1024];
        if (gtrain_outer_method(method, &oc, core, sizeof core, err, errlen)) return 1;
        if (oc.local_steps > 0)
            return fail(err, errlen,
                        "local SGD (--local-steps, local_steps=) syncs weights over the "
                        "collectives; the parameter server does not run it");
        if (gtrain_adapt_is_method(core))
            return fail(err, errlen,
                        "adaptive methods retune the collectives' buckets; the parameter "
                        "server runs fixed specs");
    }
    bool server = rank >= W, async = pc->mode == GTRAIN_PS_ASYNC;
    MPI_Comm wcomm;
    MPI_Comm_split(comm, server ? 1 : 0, rank, &wcomm);

    gtrain_model *m = NULL;
    gcomp_mpi_comm *gc = NULL;
    gcomp_mpi_ps *ps = NULL;
    gtrain_exchange *ex = NULL;
    unsigned char *skip = NULL;
    gcomp_error e = {0};
    wsum ws = {0};
    double serve_s = 0;
    gcomp_mpi_ps_stats ss = {0};
    int rc = 0, st = gtrain_model_create(cfg->model, cfg->hidden, cfg->seed, cfg->batch, &m);
    if (st) {
        rc = fail(err, errlen, "model %s: %s", cfg->model, gtrain_strerror(st));
        goto agree;
    }
    gtrain_model_set_summed_loss(m, cfg->summed_loss);
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    out->params = gtrain_model_num_params(m);
    out->dense_bytes_per_step = 4.0 * (double)out->params;
    gcomp_mpi_options mo;
    gcomp_mpi_options_default(&mo);
    mo.timeout_s = cfg->timeout_s;
    if (pc->mode == GTRAIN_PS_DEVICE)
        mo.ranks_per_node = pc->ranks_per_node > 0 ? pc->ranks_per_node : 2;
    if (gcomp_mpi_comm_create(&gc, comm, &mo, cfg->timeout_s, &e) != GCOMP_OK) {
        rc = fail(err, errlen, "MPI: %s", e.message);
        goto agree;
    }
    gcomp_mpi_ps_options po;
    gcomp_mpi_ps_options_default(&po);
    po.servers = S;
    po.mode = async ? GCOMP_MPI_PS_ASYNC : GCOMP_MPI_PS_SYNC;
    po.update = async || pc->update;
    po.pull = pc->pull;
    /* The trainer's optimizer (gtrain_sgd_step), on the servers: the batch's summed loss
     * (MXNet's unit) is rescaled by 1/batch as MXNet's rescale_grad does. */
    po.optimizer =
        (gcomp_mpi_ps_optimizer){cfg->lr, gtrain_ps_momentum(cfg, pc, W), cfg->weight_decay,
                                 cfg->summed_loss ? 1.0f / (float)cfg->batch : 1.0f, cfg->nesterov};
    if (gcomp_mpi_ps_create(&ps, gc, &po, cfg->timeout_s, &e) != GCOMP_OK) {
        rc = fail(err, errlen, "parameter server: %s", e.message);
        goto agree;
    }
    if (gtrain_exchange_create_on(&ex, method, t, nt, NULL, &cfg->policy, 0, cfg->timeout_s, gc, ps,
                                  pc->mode == GTRAIN_PS_DEVICE, err, errlen)) {
        rc = 1;
        goto agree;
    }
    gtrain_exchange_describe(ex, out->detail, sizeof out->detail);
    skip = calloc(nt, 1);
    for (size_t i = 0; skip && i < nt; i++)
        skip[i] = (unsigned char)gtrain_exchange_owns_momentum(ex, i);

    if (server) {
        for (size_t i = 0; i < nt; i++) { /* the trainer's per-tensor rules, server side */
            gcomp_mpi_ps_optimizer o = po.optimizer;
            if (t[i].is_bias) o.weight_decay = 0;
            if (skip && skip[i]) o.momentum = 0; /* DGC keeps the momentum on the worker */
            gcomp_mpi_ps_set_optimizer(gtrain_exchange_bucket(ex, i), 0, &o);
        }
        double t0 = now_s();
        if (gcomp_mpi_ps_serve(ps, cfg->timeout_s, &e) != GCOMP_OK)
            rc = fail(err, errlen, "server: %s", e.message);
        serve_s = now_s() - t0;
        gcomp_mpi_ps_stats_get(ps, -1, &ss);
    } else {
        char label[300];
        snprintf(label, sizeof label, "%s [%s]", method, out->exchange);
        rc = worker_run(cfg, pc, label, m, ex, ps, skip, train, test, wcomm, out, &ws, err, errlen);
        gcomp_error e2 = {0};
        if (gcomp_mpi_ps_shutdown(ps, cfg->timeout_s, &e2) != GCOMP_OK && !rc)
            rc = fail(err, errlen, "shutdown: %s", e2.message);
    }

agree:
    /* What every rank saw, on rank 0 (a worker).  Sums over workers, maxima over ranks; every
     * rank gets here, also after a failure, so the collectives below always pair up. */
    double sum[10] = {server ? 0 : ws.wall,   server ? 0 : ws.compute,
                      server ? 0 : ws.codec,  server ? 0 : ws.comm,
                      server ? 0 : ws.sent,   server ? 0 : ws.msg,
                      server ? 0 : ws.steps,  server ? 0 : ws.pushed,
                      server ? 0 : ws.pulled, server ? (double)ss.stale_sum : 0};
    double mx[7] = {server && serve_s > 0 ? 1e-9 * (double)ss.busy_ns / serve_s : 0,
                    server ? (double)ss.stale_max : 0,
                    server ? (double)ss.queue_max : 0,
                    server ? (double)ss.workers_lost : (double)out->ps_workers_lost,
                    server ? 0 : ws.steps,
                    server ? -1e300 : -ws.steps,
                    server ? (double)ss.applied : 0};
    MPI_Allreduce(MPI_IN_PLACE, sum, 10, MPI_DOUBLE, MPI_SUM, comm);
    MPI_Allreduce(MPI_IN_PLACE, mx, 7, MPI_DOUBLE, MPI_MAX, comm);
    if (!rc && rank == 0) {
        double steps = ws.updates; /* sync-equivalent steps, the same on every worker */
        out->steps = (size_t)steps;
        out->step_ms = 1e3 * (sum[0] / W) / steps;
        out->compute_ms = 1e3 * (sum[1] / W) / (sum[6] / W);
        out->codec_ms = 1e3 * (sum[2] / W) / (sum[6] / W);
        out->comm_ms = 1e3 * (sum[3] / W) / (sum[6] / W);
        out->bytes_per_step = sum[4] / sum[6]; /* per worker step */
        out->bytes_total = sum[4] / W;         /* per worker, over the run */
        out->wall_s = sum[0] / W;
        out->ratio = out->dense_bytes_per_step / (sum[5] / sum[6]);
        out->traffic_ratio = 2.0 * (W - 1) / W * out->dense_bytes_per_step / out->bytes_per_step;
        out->ps_pushed_per_step = sum[7] / sum[6];
        out->ps_pulled_per_step = sum[8] / sum[6];
        out->ps_server_busy = mx[0];
        out->ps_stale_max = mx[1];
        out->ps_stale_mean = mx[6] > 0 ? sum[9] / mx[6] : 0;
        out->ps_queue_max = mx[2];
        out->ps_workers_lost = (int)mx[3];
        out->ps_worker_steps_max = mx[4];
        out->ps_worker_steps_min = -mx[5];
        const gtrain_point *last = &out->points[out->npoints - 1];
        out->final_acc = last->test_acc;
        out->final_loss = last->test_loss;
        out->final_val_acc = last->val_acc;
        for (size_t i = 0; i < out->npoints; i++)
            if (out->points[i].test_acc > out->best_acc) out->best_acc = out->points[i].test_acc;
    }
    /* Every rank returns the same verdict (rank 0's message where it has one). */
    {
        int bad = rc != 0, any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
        if (any && !rc) rc = fail(err, errlen, "failed on another rank");
    }
    if (!rc && !server && out->npoints) { /* the workers' final model, as gtrain_run keeps it */
        const gtrain_point *last = &out->points[out->npoints - 1];
        char label[300];
        snprintf(label, sizeof label, "%s [%s]", method, out->exchange);
        out->test_verdicts = gtrain_final_verdicts(m, test, last->test_acc, wcomm, label, "test");
        if (cfg->val)
            out->val_verdicts =
                gtrain_final_verdicts(m, cfg->val, last->val_acc, wcomm, label, "validation");
    }
    gtrain_exchange_free(ex);
    gcomp_mpi_ps_free(ps);
    gcomp_mpi_comm_free(gc);
    gtrain_model_free(m);
    free(skip);
    MPI_Comm_free(&wcomm);
    return rc;
}

/*
 * train_adapt.c - adaptive methods in the reference trainer (train_adapt.h).
 *
 * Each step, on every rank: the gradient of each tensor is observed as backward makes it
 * final, before its exchange starts (the controllers see what the compressor will see:
 * gradient plus held-back residual); after the optimizer step the step's compute time is
 * observed.  At the controllers' interval every rank, at the same step: probes the link when
 * the bandwidth controller asks for it (gcomp_adapt_link_due: every decision on a fast link,
 * spaced by the probe's cost on a slow one; gcomp_mpi_link_probe: timed ring steps of
 * PROBE_BYTES and its half, larger where the link has latency), decides (gcomp_mpi_adapt_decide:
 * one allgather of the statistics, so every rank takes the same decision) and retunes the tensors
 * that change, in tensor order, so structural switches run their checks in the same order
 * everywhere.  The decision's time is part of the training time the trainer reports: adaptivity is
 * not free, and a comparison of times must include it.
 *
 * Compute time: the trainer's forward + backward includes the compression started from the
 * backward pass, which the cost model counts apart; the codec time the buckets measured
 * over the step is taken out, and the rest split a third forward, two thirds backward (the
 * split gradcomp plan uses).
 */
#define _POSIX_C_SOURCE 200809L
#include "train_adapt.h"

#include "trainer.h"

#include "gradcomp_mpi.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_BYTES ((size_t)512 << 10)

struct gtrain_adapt {
    gcomp_adapt *ad;
    size_t nt;
    const gtrain_tensor *t;
    const char **specs;
    double timeout_s;
    gtrain_setting *hist;
    size_t nhist, caphist;
    gtrain_decision *log;
    size_t nlog, caplog;
    double err_sum, err_uniform_sum; /* layers: over the decisions that measured */
    size_t err_n;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int afail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

int gtrain_adapt_is_method(const char *method) {
    return method && !strncmp(method, "adapt:", 6);
}

int gtrain_adapt_method_uses(const char *method, const char *controller) {
    /* A trainer method may end in @STRATEGY, which the library does not take. */
    char *m = gtrain_adapt_is_method(method) ? strdup(method) : NULL;
    if (!m) return 0;
    m[strcspn(m, "@")] = 0;
    int uses = gcomp_adapt_method_uses(m, controller);
    free(m);
    return uses;
}

static int strategy_cb(void *ctx, const char *spec) {
    int s = 0;
    (void)ctx;
    return gcomp_mpi_strategy_auto(spec, 0, &s) == GCOMP_OK ? s : 0;
}

static int record(gtrain_adapt *a, size_t step, double epoch, size_t i) {
    if (a->nhist == a->caphist) {
        size_t cap = a->caphist ? 2 * a->caphist : 64;
        gtrain_setting *h = realloc(a->hist, cap * sizeof *h);
        if (!h) return 1;
        a->hist = h;
        a->caphist = cap;
    }
    const char *spec = gcomp_adapt_spec(a->ad, i);
    const gtrain_tensor *t = &a->t[i];
    size_t rows = t->is_bias || t->cols == 1 ? 0 : t->rows, bytes = 0;
    gcomp_spec_info info;
    memset(&info, 0, sizeof info);
    gcomp_spec_describe(spec, t->n, &info, NULL);
    gcomp_spec_bytes_estimate(spec, t->n, rows, rows ? t->cols : 0, &bytes, NULL);
    a->hist[a->nhist++] = (gtrain_setting){
        step, epoch, i, info.density, info.value_bits, (double)bytes, gcomp_adapt_level(a->ad, i)};
    return 0;
}

/* The decision just taken, a row per candidate; probe_s: its link probe (0: none). */
static int log_decision(gtrain_adapt *a, size_t step, double epoch, double probe_s) {
    size_t K = gcomp_adapt_ladder_size(a->ad);
    if (a->nlog + K > a->caplog) {
        size_t cap = a->caplog ? 2 * a->caplog : 64;
        while (cap < a->nlog + K) cap *= 2;
        gtrain_decision *l = realloc(a->log, cap * sizeof *l);
        if (!l) return 1;
        a->log = l;
        a->caplog = cap;
    }
    gcomp_adapt_report r;
    gcomp_adapt_get_report(a->ad, &r);
    for (size_t j = 0; j < K; j++)
        a->log[a->nlog++] = (gtrain_decision){(size_t)r.decisions,
                                              step,
                                              epoch,
                                              r.bandwidth,
                                              r.latency,
                                              r.compute_s,
                                              r.measure_s,
                                              probe_s,
                                              (size_t)r.next_measure_step,
                                              j,
                                              gcomp_adapt_predicted(a->ad, j),
                                              (int)j == r.uniform_level,
                                              r.metric};
    return 0;
}

int gtrain_adapt_create(gtrain_adapt **out, const char *method, const gtrain_tensor *t, size_t nt,
                        uint64_t total_steps, const gtrain_policy_defaults *pd,
                        const gcomp_cost_calibration *cal, MPI_Comm comm, char *err,
                        size_t errlen) {
    *out = NULL;
    int P, node_rank, nodes;
    MPI_Comm_size(comm, &P);
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_free(&node);
    int leader = node_rank == 0;
    MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, comm);

    gtrain_adapt *a = calloc(1, sizeof *a);
    gcomp_tensor_desc *d = calloc(nt, sizeof *d);
    if (a) a->specs = calloc(nt, sizeof *a->specs);
    if (!a || !d || !a->specs) {
        free(d);
        gtrain_adapt_free(a);
        return afail(err, errlen, "out of memory");
    }
    a->nt = nt;
    a->t = t;
    for (size_t i = 0; i < nt; i++) {
        size_t rows = t[i].is_bias || t[i].cols == 1 ? 0 : t[i].rows;
        d[i] = (gcomp_tensor_desc){t[i].name, t[i].n, rows, rows ? t[i].cols : 0};
    }
    gcomp_adapt_options o = {0};
    o.total_steps = total_steps;
    o.workers = P;
    o.nodes = nodes;
    o.strategy = strategy_cb;
    o.calibration = cal;
    o.min_elements = pd->min_elements;
    o.dense_spec = pd->dense_spec;
    gcomp_error e = {0};
    gcomp_status st = gcomp_adapt_create(&a->ad, method, d, nt, &o, &e);
    free(d);
    if (st != GCOMP_OK) {
        gtrain_adapt_free(a);
        return afail(err, errlen, "%s", e.message);
    }
    for (size_t i = 0; i < nt; i++) {
        a->specs[i] = gcomp_adapt_spec(a->ad, i);
        if (gcomp_adapt_managed(a->ad, i) && record(a, 0, 0.0, i)) {
            gtrain_adapt_free(a);
            return afail(err, errlen, "out of memory");
        }
    }
    *out = a;
    return 0;
}

void gtrain_adapt_free(gtrain_adapt *a) {
    if (!a) return;
    gcomp_adapt_free(a->ad);
    free(a->specs);
    free(a->hist);
    free(a->log);
    free(a);
}

const char *const *gtrain_adapt_specs(const gtrain_adapt *a) {
    return a->specs;
}

int gtrain_adapt_observe(gtrain_adapt *a, const gtrain_exchange *ex, size_t i) {
    /* A NaN/Inf gradient is left out of the controllers; its exchange still starts, and
     * fails on every rank with GCOMP_E_NONFINITE. */
    gcomp_status st = gcomp_adapt_observe(a->ad, i, a->t[i].g, gtrain_exchange_residual(ex, i));
    return st != GCOMP_OK && st != GCOMP_E_NONFINITE;
}

int gtrain_adapt_set_reference(gtrain_adapt *a, const gtrain_point *pts, size_t n, int epochs,
                               int use_val, int *used, char *err, size_t errlen) {
    *used = 0;
    if (!gcomp_adapt_uses(a->ad, "accuracy") || !n || epochs < 1) return 0;
    double *prog = malloc(2 * n * sizeof(double)), *acc = prog + n;
    if (!prog) return afail(err, errlen, "out of memory");
    size_t k = 0;
    for (size_t j = 0; j < n; j++) { /* the evaluation before training is not on the course */
        double p = pts[j].epoch / epochs;
        if (p > 0 && p <= 1 && (!k || p > prog[k - 1])) {
            prog[k] = p;
            acc[k++] = gtrain_decision_acc(&pts[j], use_val);
        }
    }
    for (size_t j = 0; j < k; j++)
        if (!isfinite(acc[j])) {
            free(prog);
            return afail(err, errlen,
                         "reference curve: the reference run has no validation "
                         "accuracy to steer by");
        }
    gcomp_error e = {0};
    int rc = 0;
    if (k && gcomp_adapt_set_course(a->ad, prog, acc, k, &e) != GCOMP_OK)
        rc = afail(err, errlen, "reference curve: %s", e.message);
    *used = k && !rc;
    free(prog);
    return rc;
}

void gtrain_adapt_metric(gtrain_adapt *a, double accuracy) {
    gcomp_adapt_observe_metric(a->ad, accuracy);
}

void gtrain_adapt_lr(gtrain_adapt *a, double lr) {
    gcomp_adapt_observe_lr(a->ad, lr);
}

int gtrain_adapt_end_step(gtrain_adapt *a, gtrain_exchange *ex, gtrain_model *m,
                          unsigned char *skip, size_t step, double epoch, double compute_s,
                          double optimizer_s, double *spent_s, char *err, size_t errlen) {
    *spent_s = 0;
    double fb = compute_s > 0 ? compute_s : 0;
    gcomp_adapt_observe_compute(a->ad, fb / 3, fb - fb / 3, optimizer_s);
    int due;
    gcomp_adapt_end_step(a->ad, &due);
    if (!due) return 0;
    double t0 = now_s();
    gcomp_mpi_comm *c = gtrain_exchange_comm(ex);
    gcomp_error e = {0};
    double probe_s = 0;
    if (gcomp_adapt_link_due(a->ad)) {
        double bw, lat, p0 = now_s();
        if (gcomp_mpi_link_probe(c, PROBE_BYTES, 0, &bw, &lat, &e) != GCOMP_OK)
            return afail(err, errlen, "link probe: %s", e.message);
        gcomp_adapt_observe_link(a->ad, bw, lat);
        probe_s = now_s() - p0;
        gcomp_adapt_observe_link_time(a->ad, probe_s);
    }
    size_t changed;
    if (gcomp_mpi_adapt_decide(c, a->ad, 0, &changed, &e) != GCOMP_OK)
        return afail(err, errlen, "adaptive decision at step %zu: %s", step, e.message);
    for (size_t i = 0; i < a->nt; i++) {
        if (!gcomp_adapt_changed(a->ad, i)) continue;
        int before = gtrain_exchange_owns_momentum(ex, i);
        if (gtrain_exchange_retune(ex, i, gcomp_adapt_spec(a->ad, i)))
            return afail(err, errlen, "step %zu: %s", step, gtrain_exchange_error(ex));
        int after = gtrain_exchange_owns_momentum(ex, i);
        if (before != after) { /* the momentum moves between optimizer and compressor */
            /* Into DGC: what the optimizer's buffer still owes is applied as it decays.  Out
             * of it: the buffer is zero, or such a tail, which the momentum goes on from. */
            if (after) gtrain_sgd_release_tensor(m, i);
            skip[i] = (unsigned char)after;
        }
        if (record(a, step, epoch, i)) return afail(err, errlen, "out of memory");
    }
    for (size_t i = 0; i < a->nt; i++) a->specs[i] = gcomp_adapt_spec(a->ad, i);
    if (log_decision(a, step, epoch, probe_s)) return afail(err, errlen, "out of memory");
    gcomp_adapt_report rep;
    gcomp_adapt_get_report(a->ad, &rep);
    if (rep.error > 0 && rep.error_uniform > 0) {
        a->err_sum += rep.error;
        a->err_uniform_sum += rep.error_uniform;
        a->err_n++;
    }
    *spent_s = now_s() - t0;
    return 0;
}

const gtrain_decision *gtrain_adapt_log(const gtrain_adapt *a, size_t *count) {
    *count = a ? a->nlog : 0;
    return a ? a->log : NULL;
}

size_t gtrain_adapt_ladder_size(const gtrain_adapt *a) {
    return a ? gcomp_adapt_ladder_size(a->ad) : 0;
}

const char *gtrain_adapt_candidate(const gtrain_adapt *a, size_t j) {
    return a ? gcomp_adapt_candidate(a->ad, j) : NULL;
}

const gtrain_setting *gtrain_adapt_history(const gtrain_adapt *a, size_t *count) {
    *count = a ? a->nhist : 0;
    return a ? a->hist : NULL;
}

void gtrain_adapt_errors(const gtrain_adapt *a, double *chosen, double *uniform) {
    *chosen = a && a->err_n ? a->err_sum / (double)a->err_n : 0;
    *uniform = a && a->err_n ? a->err_uniform_sum / (double)a->err_n : 0;
}

size_t gtrain_adapt_decisions(const gtrain_adapt *a) {
    gcomp_adapt_report r;
    gcomp_adapt_get_report(a ? a->ad : NULL, &r);
    return (size_t)r.decisions;
}

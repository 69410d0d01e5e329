/*
 * exchange.c - the trainer's gradient exchange over libgradcomp_mpi.
 *
 * One bucket per tensor, so each layer's exchange starts the moment backward has made
 * its gradient final, while the earlier layers are still being computed; the model's
 * callbacks also poke the buckets already in flight (gcomp_mpi_test), since MPI moves
 * data only inside MPI calls.  The layer policy picks each tensor's spec: small and 1-D
 * tensors dense, the rest the method's spec.  Rejected: one bucket for the whole model
 * (no overlap at all) and hand-made fusion of small tensors (the biases of these models
 * are a few KiB; a dense allreduce of each costs microseconds).
 */
#define _POSIX_C_SOURCE 200809L
#include "exchange.h"

#include "gradcomp_mpi.h"
#include "plan.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gtrain_exchange {
    gcomp_mpi_comm *comm;
    int owns_comm;
    gtrain_tensor *t;
    size_t nt;
    gcomp_mpi_bucket **b;
    gcomp_mpi_bucket **wait; /* the started buckets in start order, for the wait */
    size_t *wait_t;          /* their tensors */
    gcomp_error *each;       /* the wait's outcome per bucket */
    gtrain_plan plan;
    unsigned char *started;
    double timeout_s, wait_s, msg_bytes;
    double *sent_before; /* per tensor, bytes_sent at the end of the previous step */
    int nranks;
    char err[320];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int xfail(gtrain_exchange *ex, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ex->err, sizeof ex->err, fmt, ap);
    va_end(ap);
    return 1;
}

void gtrain_exchange_free(gtrain_exchange *ex) {
    if (!ex) return;
    for (size_t i = 0; ex->b && i < ex->nt; i++) gcomp_mpi_bucket_free(ex->b[i]);
    if (ex->owns_comm) gcomp_mpi_comm_free(ex->comm);
    gtrain_plan_free(&ex->plan);
    free(ex->b);
    free(ex->wait);
    free(ex->wait_t);
    free(ex->each);
    free(ex->started);
    free(ex->sent_before);
    free(ex);
}

static int efail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

int gtrain_exchange_create(gtrain_exchange **out, const char *method, gtrain_tensor *t, size_t nt,
                           const char *const *specs, const gtrain_policy_defaults *pd, int strategy,
                           double timeout_s, MPI_Comm comm, char *err, size_t errlen) {
    gcomp_mpi_comm *c = NULL;
    gcomp_error e = {0};
    *out = NULL;
    if (gcomp_mpi_comm_create(&c, comm, NULL, timeout_s, &e) != GCOMP_OK)
        return efail(err, errlen, "MPI: %s", e.message);
    int rc = gtrain_exchange_create_on(out, method, t, nt, specs, pd, strategy, timeout_s, c, NULL,
                                       0, err, errlen);
    if (rc)
        gcomp_mpi_comm_free(c);
    else
        (*out)->owns_comm = 1;
    return rc;
}

gcomp_mpi_bucket *gtrain_exchange_bucket(const gtrain_exchange *ex, size_t i) {
    return i < ex->nt ? ex->b[i] : NULL;
}

int gtrain_exchange_create_on(gtrain_exchange **out, const char *method, gtrain_tensor *t,
                              size_t nt, const char *const *specs, const gtrain_policy_defaults *pd,
                              int strategy, double timeout_s, gcomp_mpi_comm *comm,
                              gcomp_mpi_ps *ps, int hierarchical, char *err, size_t errlen) {
    *out = NULL;
    gtrain_exchange *ex = calloc(1, sizeof *ex);
    if (!ex) return efail(err, errlen, "out of memory");
    ex->t = t;
    ex->nt = nt;
    ex->timeout_s = timeout_s;
    ex->b = calloc(nt, sizeof *ex->b);
    ex->wait = calloc(nt, sizeof *ex->wait);
    ex->wait_t = calloc(nt, sizeof *ex->wait_t);
    ex->each = calloc(nt, sizeof *ex->each);
    ex->started = calloc(nt, 1);
    ex->sent_before = calloc(nt, sizeof(double));
    ex->comm = comm;
    ex->nranks = gcomp_mpi_comm_size(comm);
    gcomp_error e = {0};
    int rc = 0;
    if (!ex->b || !ex->wait || !ex->wait_t || !ex->each || !ex->started || !ex->sent_before) {
        rc = efail(err, errlen, "out of memory");
        goto out;
    }
    if (gtrain_plan_create(&ex->plan, method, t, nt, specs, pd, strategy, err, errlen)) {
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        gcomp_mpi_tensor mt = ex->plan.mt[i];
        gcomp_mpi_bucket_options bo;
        gcomp_mpi_bucket_options_default(&bo);
        if (ps) { /* the servers hold every key, dense ones too */
            mt.strategy = GCOMP_MPI_PS | (hierarchical ? GCOMP_MPI_HIERARCHICAL : 0);
            bo.ps = ps;
        }
        if (gcomp_mpi_bucket_create(&ex->b[i], ex->comm, &mt, 1, &bo, timeout_s, &e) != GCOMP_OK) {
            rc = efail(err, errlen, "%s: %s", t[i].name, e.message);
            goto out;
        }
    }
out:
    if (rc)
        gtrain_exchange_free(ex);
    else
        *out = ex;
    return rc;
}

void gtrain_exchange_describe(const gtrain_exchange *ex, char *out, size_t cap) {
    gtrain_plan_describe(&ex->plan, out, cap);
}

int gtrain_exchange_retune(gtrain_exchange *ex, size_t i, const char *spec) {
    gcomp_error e = {0};
    gcomp_spec_info info;
    if (gcomp_spec_describe(spec, ex->t[i].n, &info, &e) != GCOMP_OK ||
        gcomp_mpi_bucket_retune(ex->b[i], 0, spec, ex->timeout_s, &e) != GCOMP_OK)
        return xfail(ex, "%s: retune to %s: %s", ex->t[i].name, spec, e.message);
    if (gtrain_plan_set_spec(&ex->plan, i, spec, ex->err, sizeof ex->err)) return 1;
    return 0;
}

const char *gtrain_exchange_spec(const gtrain_exchange *ex, size_t i) {
    return i < ex->nt ? ex->plan.spec[i] : NULL;
}

const float *gtrain_exchange_residual(const gtrain_exchange *ex, size_t i) {
    gcomp_compressor *c = i < ex->nt ? gcomp_mpi_compressor(ex->b[i], 0) : NULL;
    return c ? gcomp_compressor_residual(c) : NULL;
}

gcomp_mpi_comm *gtrain_exchange_comm(const gtrain_exchange *ex) {
    return ex->comm;
}

int gtrain_exchange_owns_momentum(const gtrain_exchange *ex, size_t i) {
    return i < ex->nt && ex->plan.dgc[i];
}

void gtrain_exchange_set_epoch(gtrain_exchange *ex, double epoch) {
    for (size_t i = 0; i < ex->nt; i++) {
        gcomp_compressor *c = gcomp_mpi_compressor(ex->b[i], 0);
        if (c) {
            gcomp_compressor_set_epoch(c, epoch);
            continue;
        }
        /* a parameter-server key cut into parts: each part's compressor */
        for (size_t j = 0; (c = gcomp_mpi_ps_compressor(ex->b[i], 0, j)) != NULL; j++)
            gcomp_compressor_set_epoch(c, epoch);
    }
}

int gtrain_exchange_begin_step(gtrain_exchange *ex) {
    memset(ex->started, 0, ex->nt);
    return 0;
}

int gtrain_exchange_start(gtrain_exchange *ex, size_t i) {
    gcomp_error e = {0};
    float *data[1] = {ex->t[i].g};
    if (gcomp_mpi_start(ex->b[i], data, GCOMP_MPI_AVERAGE, &e) != GCOMP_OK)
        return xfail(ex, "%s: %s", ex->t[i].name, e.message);
    ex->started[i] = 1;
    /* Keep the transfers already in flight moving while backward continues. */
    for (size_t j = i + 1; j < ex->nt; j++) {
        int done;
        if (ex->started[j] && gcomp_mpi_test(ex->b[j], &done, &e) != GCOMP_OK)
            return xfail(ex, "%s: %s", ex->t[j].name, e.message);
    }
    return 0;
}

/* Adds this step's compressed size: the messages this rank made, or, for tensors that
 * travel by allreduce (dense, PowerSGD's factors), the buffer it reduced, recovered from
 * the ring volume 2(P-1)/P the MPI layer counts. */
static void count_messages(gtrain_exchange *ex) {
    for (size_t i = 0; i < ex->nt; i++) {
        gcomp_mpi_stats s;
        if (gcomp_mpi_stats_get(ex->b[i], (size_t)-1, &s) != GCOMP_OK) continue;
        double sent = (double)s.bytes_sent, step = sent - ex->sent_before[i];
        ex->sent_before[i] = sent;
        if ((gcomp_mpi_bucket_strategy(ex->b[i], 0) & 0xff) == GCOMP_MPI_ALLREDUCE) {
            ex->msg_bytes += ex->nranks > 1 ? step * ex->nranks / (2.0 * (ex->nranks - 1))
                                            : 4.0 * (double)ex->t[i].n;
            continue;
        }
        for (size_t j = 0; j < gcomp_mpi_message_count(ex->b[i], 0); j++) {
            const void *m;
            size_t len, off, cnt;
            if (gcomp_mpi_message(ex->b[i], 0, j, &m, &len, &off, &cnt) == GCOMP_OK)
                ex->msg_bytes += (double)len;
        }
    }
}

int gtrain_exchange_finish(gtrain_exchange *ex) {
    double t0 = now_s();
    int rc = 0;
    size_t n = 0;
    for (size_t k = ex->nt; k-- > 0;) { /* in start order: last layer first */
        if (!ex->started[k]) {
            if (!rc) rc = xfail(ex, "%s: its gradient was never reported ready", ex->t[k].name);
            continue;
        }
        ex->wait[n] = ex->b[k];
        ex->wait_t[n++] = k;
    }
    /* All at once, so that each bucket's next round trip (PowerSGD's second factor) goes
     * out as soon as its first is in; every bucket is finished, also after an error. */
    gcomp_error e = {0};
    size_t f = n;
    if (gcomp_mpi_wait_each(ex->wait, n, ex->timeout_s, ex->each, &f, &e) != GCOMP_OK && !rc)
        rc = f < n ? xfail(ex, "%s: %s", ex->t[ex->wait_t[f]].name, e.message)
                   : xfail(ex, "wait: %s", e.message);
    ex->wait_s += now_s() - t0;
    if (!rc) count_messages(ex);
    return rc;
}

const char *gtrain_exchange_error(const gtrain_exchange *ex) {
    return ex->err;
}

double gtrain_exchange_bytes_sent(const gtrain_exchange *ex) {
    double total = 0;
    for (size_t i = 0; i < ex->nt; i++) {
        gcomp_mpi_stats s;
        if (gcomp_mpi_stats_get(ex->b[i], (size_t)-1, &s) == GCOMP_OK)
            total += (double)s.bytes_sent;
    }
    return total;
}

void gtrain_exchange_get_stats(const gtrain_exchange *ex, gtrain_exchange_stats *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < ex->nt; i++) {
        gcomp_mpi_stats s;
        if (gcomp_mpi_stats_get(ex->b[i], (size_t)-1, &s) != GCOMP_OK) continue;
        out->bytes_sent += (double)s.bytes_sent;
        out->codec_s += 1e-9 * (double)s.codec_ns;
    }
    out->comm_s = ex->wait_s;
    out->msg_bytes = ex->msg_bytes;
}

void gtrain_exchange_cost_tensors(const gtrain_exchange *ex, gcomp_cost_tensor *out) {
    for (size_t i = 0; i < ex->nt; i++) {
        const gtrain_tensor *t = &ex->t[i];
        size_t rows = t->is_bias || t->cols == 1 ? 0 : t->rows;
        out[i] = (gcomp_cost_tensor){.name = t->name,
                                     .spec = ex->plan.spec[i],
                                     .n = t->n,
                                     .rows = rows,
                                     .cols = rows ? t->cols : 0,
                                     .strategy = gcomp_mpi_bucket_strategy(ex->b[i], 0)};
    }
}

int gtrain_exchange_nodes(const gtrain_exchange *ex) {
    return gcomp_mpi_comm_nodes(ex->comm);
}

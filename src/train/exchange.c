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

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gtrain_exchange {
    gcomp_mpi_comm *comm;
    gtrain_tensor *t;
    size_t nt;
    gcomp_mpi_bucket **b;
    char **spec;
    unsigned char *owns_momentum, *started;
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
    for (size_t i = 0; ex->spec && i < ex->nt; i++) free(ex->spec[i]);
    gcomp_mpi_comm_free(ex->comm);
    free(ex->b);
    free(ex->spec);
    free(ex->owns_momentum);
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

/* Whether the ';'-separated items of `items` set policy key `key`. */
static bool sets_key(const char *items, const char *key) {
    size_t kl = strlen(key);
    for (const char *p = items; p; p = strchr(p, ';')) {
        if (*p == ';') p++;
        while (*p == ' ') p++;
        if (!strncmp(p, key, kl) && p[kl] == '=') return true;
    }
    return false;
}

/* The policy string a method stands for: "dense", "dense-f16", "policy:<policy>", or
 * "SPEC[;KEY=VALUE...]", a spec for the compressed tensors plus policy items of this method
 * only (e.g. twobit:threshold=0.5;min_elements=16384), the trainer's --min-elements and
 * --dense-spec filling in what the method leaves out. */
static void method_policy(const char *method, size_t min_elements, const char *dense_spec,
                          char *out, size_t cap) {
    const char *semi = strchr(method, ';');
    if (!strcmp(method, "dense"))
        snprintf(out, cap, "spec=none;dense=none");
    else if (!strcmp(method, "dense-f16")) {
        /* The dense codec with f16 values (a bad spec makes the policy refuse "spec="). */
        char f16[128] = "";
        gcomp_spec_set("none", "values", "f16", f16, sizeof f16, NULL);
        snprintf(out, cap, "spec=%s;dense=%s", f16, f16);
    } else if (!strncmp(method, "policy:", 7))
        snprintf(out, cap, "%s", method + 7);
    else {
        int n = snprintf(out, cap, "spec=%s", method);
        if (n < 0 || (size_t)n >= cap) return;
        if (!semi || !sets_key(semi, "min_elements"))
            n += snprintf(out + n, cap - (size_t)n, ";min_elements=%zu", min_elements);
        if ((size_t)n < cap && (!semi || !sets_key(semi, "dense")))
            snprintf(out + n, cap - (size_t)n, ";dense=%s", dense_spec);
    }
}

int gtrain_exchange_create(gtrain_exchange **out, const char *method, gtrain_tensor *t, size_t nt,
                           const char *const *specs, size_t min_elements, const char *dense_spec,
                           int strategy, double timeout_s, MPI_Comm comm, char *err,
                           size_t errlen) {
    *out = NULL;
    gtrain_exchange *ex = calloc(1, sizeof *ex);
    if (!ex) return efail(err, errlen, "out of memory");
    ex->t = t;
    ex->nt = nt;
    ex->timeout_s = timeout_s;
    ex->b = calloc(nt, sizeof *ex->b);
    ex->spec = calloc(nt, sizeof *ex->spec);
    ex->owns_momentum = calloc(nt, 1);
    ex->started = calloc(nt, 1);
    ex->sent_before = calloc(nt, sizeof(double));
    MPI_Comm_size(comm, &ex->nranks);
    gcomp_error e = {0};
    gcomp_policy *policy = NULL;
    int rc = 0;
    char pol[1200], mbuf[1024];
    if (!ex->b || !ex->spec || !ex->owns_momentum || !ex->started || !ex->sent_before) {
        rc = efail(err, errlen, "out of memory");
        goto out;
    }
    /* "SPEC@STRATEGY" picks the strategy of this method's compressed tensors. */
    snprintf(mbuf, sizeof mbuf, "%s", method);
    char *at = strrchr(mbuf, '@');
    if (at) {
        *at = 0;
        if (gcomp_mpi_strategy_parse(at + 1, &strategy) != GCOMP_OK) {
            rc = efail(err, errlen, "method '%s': unknown strategy '%s'", method, at + 1);
            goto out;
        }
    }
    method_policy(mbuf, min_elements, dense_spec ? dense_spec : "none", pol, sizeof pol);
    if (!specs && gcomp_policy_create(&policy, pol, &e) != GCOMP_OK) {
        rc = efail(err, errlen, "method '%s': %s", method, e.message);
        goto out;
    }
    if (gcomp_mpi_comm_create(&ex->comm, comm, NULL, timeout_s, &e) != GCOMP_OK) {
        rc = efail(err, errlen, "MPI: %s", e.message);
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        size_t rows = t[i].is_bias || t[i].cols == 1 ? 0 : t[i].rows;
        size_t cols = rows ? t[i].cols : 0;
        gcomp_tensor_desc d = {t[i].name, t[i].n, rows, cols};
        gcomp_layer_plan plan = {0};
        plan.spec = specs ? specs[i] : NULL;
        plan.rule = GCOMP_RULE_DEFAULT;
        if (!specs && gcomp_policy_choose(policy, &d, &plan, &e) != GCOMP_OK) {
            rc = efail(err, errlen, "%s: %s", t[i].name, e.message);
            goto out;
        }
        ex->spec[i] = strdup(plan.spec);
        gcomp_spec_info info;
        if (!ex->spec[i] || gcomp_spec_describe(plan.spec, t[i].n, &info, &e) != GCOMP_OK) {
            rc = efail(err, errlen, "%s: %s", t[i].name, ex->spec[i] ? e.message : "out of memory");
            goto out;
        }
        /* DGC's momentum correction keeps the momentum: the optimizer must not add its own. */
        ex->owns_momentum[i] = (info.flags & GCOMP_SPEC_MOMENTUM) != 0;
        /* A codec that neither selects, quantizes nor factorises sends the tensor as it is:
         * the method's strategy is for the compressed tensors, these go by auto. */
        bool uncompressed = !(info.flags & (GCOMP_SPEC_SPARSE | GCOMP_SPEC_MULTIPHASE)) &&
                            !(info.codec->flags & GCOMP_CODEC_QUANTIZER);
        bool dense = plan.rule == GCOMP_RULE_1D || plan.rule == GCOMP_RULE_SMALL || uncompressed;
        gcomp_mpi_tensor mt = {t[i].name, plan.spec, t[i].n,
                               rows,      cols,      dense ? GCOMP_MPI_AUTO : strategy};
        if (gcomp_mpi_bucket_create(&ex->b[i], ex->comm, &mt, 1, NULL, timeout_s, &e) != GCOMP_OK) {
            rc = efail(err, errlen, "%s: %s", t[i].name, e.message);
            goto out;
        }
    }
out:
    gcomp_policy_free(policy);
    if (rc)
        gtrain_exchange_free(ex);
    else
        *out = ex;
    return rc;
}

void gtrain_exchange_describe(const gtrain_exchange *ex, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < ex->nt; i++) {
        bool seen = false;
        for (size_t j = 0; j < i; j++) seen |= !strcmp(ex->spec[j], ex->spec[i]);
        if (seen) continue;
        int w = snprintf(out + used, cap - used, "%s%s: ", used ? "; " : "", ex->spec[i]);
        if (w < 0 || (size_t)w >= cap - used) return;
        used += (size_t)w;
        bool first = true;
        for (size_t j = i; j < ex->nt; j++) {
            if (strcmp(ex->spec[j], ex->spec[i])) continue;
            w = snprintf(out + used, cap - used, "%s%s", first ? "" : ",", ex->t[j].name);
            if (w < 0 || (size_t)w >= cap - used) return;
            used += (size_t)w;
            first = false;
        }
    }
}

int gtrain_exchange_retune(gtrain_exchange *ex, size_t i, const char *spec) {
    gcomp_error e = {0};
    gcomp_spec_info info;
    if (gcomp_spec_describe(spec, ex->t[i].n, &info, &e) != GCOMP_OK ||
        gcomp_mpi_bucket_retune(ex->b[i], 0, spec, ex->timeout_s, &e) != GCOMP_OK)
        return xfail(ex, "%s: retune to %s: %s", ex->t[i].name, spec, e.message);
    char *copy = strdup(spec);
    if (!copy) return xfail(ex, "out of memory");
    free(ex->spec[i]);
    ex->spec[i] = copy;
    ex->owns_momentum[i] = (info.flags & GCOMP_SPEC_MOMENTUM) != 0;
    return 0;
}

const char *gtrain_exchange_spec(const gtrain_exchange *ex, size_t i) {
    return i < ex->nt ? ex->spec[i] : NULL;
}

const float *gtrain_exchange_residual(const gtrain_exchange *ex, size_t i) {
    gcomp_compressor *c = i < ex->nt ? gcomp_mpi_compressor(ex->b[i], 0) : NULL;
    return c ? gcomp_compressor_residual(c) : NULL;
}

gcomp_mpi_comm *gtrain_exchange_comm(const gtrain_exchange *ex) {
    return ex->comm;
}

int gtrain_exchange_owns_momentum(const gtrain_exchange *ex, size_t i) {
    return i < ex->nt && ex->owns_momentum[i];
}

void gtrain_exchange_set_epoch(gtrain_exchange *ex, double epoch) {
    for (size_t i = 0; i < ex->nt; i++) {
        gcomp_compressor *c = gcomp_mpi_compressor(ex->b[i], 0);
        if (c) gcomp_compressor_set_epoch(c, epoch);
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
    for (size_t k = ex->nt; k-- > 0;) { /* in start order: last layer first */
        gcomp_error e = {0};
        if (!ex->started[k]) {
            if (!rc) rc = xfail(ex, "%s: its gradient was never reported ready", ex->t[k].name);
            continue;
        }
        if (gcomp_mpi_wait(ex->b[k], ex->timeout_s, &e) != GCOMP_OK && !rc)
            rc = xfail(ex, "%s: %s", ex->t[k].name, e.message);
    }
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
        out[i] = (gcomp_cost_tensor){
            t->name, ex->spec[i],        t->n,
            rows,    rows ? t->cols : 0, gcomp_mpi_bucket_strategy(ex->b[i], 0)};
    }
}

int gtrain_exchange_nodes(const gtrain_exchange *ex) {
    return gcomp_mpi_comm_nodes(ex->comm);
}

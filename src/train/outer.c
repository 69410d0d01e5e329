/*
 * outer.c - local SGD / DiLoCo in the reference trainer (outer.h), over
 * libgradcomp_mpi's outer step (gcomp_mpi_outer_*).
 *
 * The trainer's inner step is unchanged (its own SGD with momentum, the momentum kept on
 * each rank as DiLoCo keeps AdamW's state local); only the exchange differs: none per
 * step, and after each inner step gcomp_mpi_outer_step, which syncs the fragments that are
 * due.  Evaluations use the global weights (the last syncs', the same on every rank), the
 * model DiLoCo reports, so the trainer's check that every rank holds the same weights
 * still applies; the live weights go back afterwards.
 *
 * Method items (after the spec, ';'-separated, as for the layer policy): local_steps=H,
 * outer=sgd|nesterov[:lr=,momentum=], stream=F, stream_delay=D, mix=A, ef_decay=B; they
 * are taken out before the rest goes to the layer policy (plan.c), which would read any
 * other key as a tensor-name glob.
 */
#define _POSIX_C_SOURCE 200809L
#include "outer.h"

#include "gradcomp_mpi.h"
#include "plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gtrain_outer {
    gcomp_mpi_comm *comm;
    gcomp_mpi_outer *o;
    gtrain_plan plan;
    gtrain_tensor *t;
    size_t nt;
    float **w;    /* the model's weights, as the outer step takes them */
    float **live; /* the live weights while an evaluation sees the global ones */
    double timeout_s, sync_s, msg_bytes;
    uint64_t *syncs;     /* per fragment, syncs counted into msg_bytes */
    double *sent_before; /* per tensor, its bytes_sent when last counted */
    int nranks;
    char err[320];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ofail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

void gtrain_outer_cfg_default(gtrain_outer_cfg *c) {
    memset(c, 0, sizeof *c);
    c->local_steps = 0;
    c->optimizer = GCOMP_MPI_OUTER_NESTEROV;
    c->lr = 0.7;
    c->momentum = 0.9;
    c->stream = 1;
    c->delay = -1;
    c->mix = 0;
    c->ef_decay = 1;
}

/* A number with nothing after it. */
static int number(const char *s, double *out) {
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == 0 && isfinite(*out) ? 0 : 1;
}

int gtrain_outer_parse(const char *s, gtrain_outer_cfg *c, char *err, size_t errlen) {
    size_t nl = strcspn(s, ":");
    if (nl == 3 && !strncmp(s, "sgd", 3)) {
        c->optimizer = GCOMP_MPI_OUTER_SGD;
        c->lr = 1.0;
        c->momentum = 0.0;
    } else if (nl == 8 && !strncmp(s, "nesterov", 8)) {
        c->optimizer = GCOMP_MPI_OUTER_NESTEROV;
        c->lr = 0.7;
        c->momentum = 0.9;
    } else {
        return ofail(err, errlen, "outer optimizer '%.*s': sgd or nesterov", (int)nl, s);
    }
    if (!s[nl]) return 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s + nl + 1);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        double v;
        if (!eq || number(eq + 1, &v))
            return ofail(err, errlen, "outer '%s': '%s' is not KEY=NUMBER", s, kv);
        *eq = 0;
        if (!strcmp(kv, "lr"))
            c->lr = v;
        else if (!strcmp(kv, "momentum"))
            c->momentum = v;
        else
            return ofail(err, errlen, "outer '%s': unknown key '%s' (lr, momentum)", s, kv);
    }
    if (!(c->lr > 0)) return ofail(err, errlen, "outer '%s': lr must be > 0 and finite", s);
    if (!(c->momentum >= 0 && c->momentum < 1))
        return ofail(err, errlen, "outer '%s': momentum must be in [0, 1)", s);
    return 0;
}

int gtrain_outer_method(const char *method, gtrain_outer_cfg *c, char *core, size_t cap, char *err,
                        size_t errlen) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", method);
    /* A trailing "@STRATEGY" belongs to the whole method: keep it at the end of core. */
    char *at = strrchr(buf, '@'), strat[64] = "";
    if (at && !strchr(at, ';')) {
        snprintf(strat, sizeof strat, "%s", at);
        *at = 0;
    }
    size_t used = 0;
    core[0] = 0;
    char *save = NULL;
    bool first = true;
    for (char *item = strtok_r(buf, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        while (*item == ' ') item++;
        char *eq = strchr(item, '=');
        size_t kl = eq ? (size_t)(eq - item) : 0;
        const char *v = eq ? eq + 1 : "";
        double x;
        bool taken = true;
        if (first) {
            taken = false; /* the spec itself */
        } else if (kl == 11 && !strncmp(item, "local_steps", kl)) {
            if (number(v, &x) || x < 1 || x > 1e6 || x != floor(x))
                return ofail(err, errlen, "method '%s': local_steps=%s: 1..1000000", method, v);
            c->local_steps = (unsigned)x;
        } else if (kl == 5 && !strncmp(item, "outer", kl)) {
            if (gtrain_outer_parse(v, c, err, errlen)) return 1;
        } else if (kl == 6 && !strncmp(item, "stream", kl)) {
            if (number(v, &x) || x < 1 || x > 1024 || x != floor(x))
                return ofail(err, errlen, "method '%s': stream=%s: 1..1024 fragments", method, v);
            c->stream = (unsigned)x;
        } else if (kl == 12 && !strncmp(item, "stream_delay", kl)) {
            if (number(v, &x) || x < -1 || x > 1e6 || x != floor(x))
                return ofail(err, errlen, "method '%s': stream_delay=%s: -1 (auto) or steps",
                             method, v);
            c->delay = (int)x;
        } else if (kl == 3 && !strncmp(item, "mix", kl)) {
            if (number(v, &x) || !(x >= 0 && x < 1))
                return ofail(err, errlen, "method '%s': mix=%s: in [0, 1)", method, v);
            c->mix = x;
        } else if (kl == 8 && !strncmp(item, "ef_decay", kl)) {
            if (number(v, &x) || !(x >= 0 && x <= 1))
                return ofail(err, errlen, "method '%s': ef_decay=%s: in [0, 1]", method, v);
            c->ef_decay = x;
        } else {
            taken = false;
        }
        if (!taken) {
            int w = snprintf(core + used, cap - used, "%s%s", first ? "" : ";", item);
            if (w < 0 || (size_t)w >= cap - used)
                return ofail(err, errlen, "method '%s' is too long", method);
            used += (size_t)w;
        }
        first = false;
    }
    if (snprintf(core + used, cap - used, "%s", strat) >= (int)(cap - used))
        return ofail(err, errlen, "method '%s' is too long", method);
    return 0;
}

void gtrain_outer_cfg_describe(const gtrain_outer_cfg *c, char *out, size_t cap) {
    out[0] = 0;
    if (!c->local_steps) return;
    int n =
        snprintf(out, cap, "H=%u %s lr=%g momentum=%g", c->local_steps,
                 c->optimizer == GCOMP_MPI_OUTER_NESTEROV ? "nesterov" : "sgd", c->lr, c->momentum);
    if (n > 0 && (size_t)n < cap && c->stream > 1)
        n += snprintf(out + n, cap - (size_t)n, " stream=%u", c->stream);
    if (n > 0 && (size_t)n < cap && c->delay >= 0)
        n += snprintf(out + n, cap - (size_t)n, " delay=%d", c->delay);
    if (n > 0 && (size_t)n < cap && c->mix > 0)
        n += snprintf(out + n, cap - (size_t)n, " mix=%g", c->mix);
    if (n > 0 && (size_t)n < cap && c->ef_decay < 1)
        snprintf(out + n, cap - (size_t)n, " ef_decay=%g", c->ef_decay);
}

void gtrain_outer_free(gtrain_outer *o) {
    if (!o) return;
    gcomp_mpi_outer_free(o->o);
    gcomp_mpi_comm_free(o->comm);
    gtrain_plan_free(&o->plan);
    for (size_t i = 0; o->live && i < o->nt; i++) free(o->live[i]);
    free(o->live);
    free(o->w);
    free(o->syncs);
    free(o->sent_before);
    free(o);
}

int gtrain_outer_create(gtrain_outer **out, const gtrain_outer_cfg *c, const char *method,
                        gtrain_tensor *t, size_t nt, const gtrain_policy_defaults *pd, int strategy,
                        double timeout_s, MPI_Comm comm, char *err, size_t errlen) {
    *out = NULL;
    gtrain_outer *o = calloc(1, sizeof *o);
    if (!o) return ofail(err, errlen, "out of memory");
    o->t = t;
    o->nt = nt;
    o->timeout_s = timeout_s;
    MPI_Comm_size(comm, &o->nranks);
    o->w = calloc(nt, sizeof *o->w);
    o->live = calloc(nt, sizeof *o->live);
    o->sent_before = calloc(nt, sizeof *o->sent_before);
    int rc = 0;
    gcomp_error e = {0};
    for (size_t i = 0; o->w && o->live && i < nt; i++) {
        o->w[i] = t[i].w;
        if (!(o->live[i] = malloc(t[i].n * sizeof(float)))) break;
    }
    if (!o->w || !o->live || !o->sent_before || (nt && !o->live[nt - 1])) {
        rc = ofail(err, errlen, "out of memory");
        goto done;
    }
    if (gtrain_plan_create(&o->plan, method, t, nt, NULL, pd, strategy, err, errlen)) {
        rc = 1;
        goto done;
    }
    if (gcomp_mpi_comm_create(&o->comm, comm, NULL, timeout_s, &e) != GCOMP_OK) {
        rc = ofail(err, errlen, "MPI: %s", e.message);
        goto done;
    }
    gcomp_mpi_outer_options opt;
    gcomp_mpi_outer_options_default(&opt);
    opt.local_steps = c->local_steps;
    opt.optimizer = c->optimizer;
    opt.lr = c->lr;
    opt.momentum = c->momentum;
    opt.fragments = c->stream ? c->stream : 1;
    opt.delay = c->delay;
    opt.mix = c->mix;
    opt.ef_decay = c->ef_decay;
    if (gcomp_mpi_outer_create(&o->o, o->comm, o->plan.mt, nt, o->w, &opt, timeout_s, &e) !=
        GCOMP_OK) {
        rc = ofail(err, errlen, "outer step: %s", e.message);
        goto done;
    }
    o->syncs = calloc(gcomp_mpi_outer_fragments(o->o), sizeof *o->syncs);
    if (!o->syncs) rc = ofail(err, errlen, "out of memory");
done:
    if (rc)
        gtrain_outer_free(o);
    else
        *out = o;
    return rc;
}

void gtrain_outer_describe(const gtrain_outer *o, char *out, size_t cap) {
    gtrain_plan_describe(&o->plan, out, cap);
}

void gtrain_outer_progress(gtrain_outer *o) {
    gcomp_mpi_outer_progress(o->o, NULL);
}

/* Adds the compressed bytes of the syncs completed since the last call: each tensor's
 * messages, or for tensors that travel by allreduce (dense, PowerSGD's factors) the buffer
 * it reduced, recovered from the ring volume 2(P-1)/P the MPI layer counts (as the
 * per-step exchange counts them). */
static void count_messages(gtrain_outer *o) {
    for (size_t i = 0; i < o->nt; i++) {
        size_t f, slot;
        gcomp_mpi_outer_locate(o->o, i, &f, &slot);
        uint64_t s = gcomp_mpi_outer_syncs(o->o, f);
        if (s == o->syncs[f]) continue;
        gcomp_mpi_bucket *b = gcomp_mpi_outer_bucket(o->o, f);
        gcomp_mpi_stats st;
        if (gcomp_mpi_stats_get(b, slot, &st) != GCOMP_OK) continue;
        double sent = (double)st.bytes_sent, step = sent - o->sent_before[i];
        o->sent_before[i] = sent;
        if ((gcomp_mpi_bucket_strategy(b, slot) & 0xff) == GCOMP_MPI_ALLREDUCE) {
            o->msg_bytes += o->nranks > 1 ? step * o->nranks / (2.0 * (o->nranks - 1))
                                          : 4.0 * (double)o->t[i].n;
            continue;
        }
        /* Only the last sync's messages are still there: syncs are counted one by one. */
        for (size_t j = 0; j < gcomp_mpi_message_count(b, slot); j++) {
            const void *m;
            size_t len, off, cnt;
            if (gcomp_mpi_message(b, slot, j, &m, &len, &off, &cnt) == GCOMP_OK)
                o->msg_bytes += (double)len * (double)(s - o->syncs[f]);
        }
    }
    for (size_t f = 0; f < gcomp_mpi_outer_fragments(o->o); f++)
        o->syncs[f] = gcomp_mpi_outer_syncs(o->o, f);
}

int gtrain_outer_step(gtrain_outer *o) {
    double t0 = now_s();
    gcomp_error e = {0};
    gcomp_status st = gcomp_mpi_outer_step(o->o, o->w, o->timeout_s, &e);
    o->sync_s += now_s() - t0;
    if (st != GCOMP_OK) return ofail(o->err, sizeof o->err, "outer step: %s", e.message);
    count_messages(o);
    return 0;
}

int gtrain_outer_flush(gtrain_outer *o) {
    double t0 = now_s();
    gcomp_error e = {0};
    gcomp_status st = gcomp_mpi_outer_flush(o->o, o->w, o->timeout_s, &e);
    o->sync_s += now_s() - t0;
    if (st != GCOMP_OK) return ofail(o->err, sizeof o->err, "outer flush: %s", e.message);
    count_messages(o);
    return 0;
}

void gtrain_outer_eval_begin(gtrain_outer *o) {
    for (size_t i = 0; i < o->nt; i++) {
        memcpy(o->live[i], o->t[i].w, o->t[i].n * sizeof(float));
        memcpy(o->t[i].w, gcomp_mpi_outer_global(o->o, i), o->t[i].n * sizeof(float));
    }
}

void gtrain_outer_eval_end(gtrain_outer *o) {
    for (size_t i = 0; i < o->nt; i++) memcpy(o->t[i].w, o->live[i], o->t[i].n * sizeof(float));
}

double gtrain_outer_bytes_sent(const gtrain_outer *o) {
    gcomp_mpi_stats s;
    return gcomp_mpi_outer_stats(o->o, &s) == GCOMP_OK ? (double)s.bytes_sent : 0;
}

void gtrain_outer_get_stats(const gtrain_outer *o, gtrain_exchange_stats *out) {
    memset(out, 0, sizeof *out);
    gcomp_mpi_stats s;
    if (gcomp_mpi_outer_stats(o->o, &s) == GCOMP_OK) {
        out->bytes_sent = (double)s.bytes_sent;
        out->codec_s = 1e-9 * (double)s.codec_ns;
    }
    /* Time blocked in the outer step, less the codec work it did there. */
    out->comm_s = o->sync_s > out->codec_s ? o->sync_s - out->codec_s : 0;
    out->msg_bytes = o->msg_bytes;
}

const char *gtrain_outer_error(const gtrain_outer *o) {
    return o->err;
}

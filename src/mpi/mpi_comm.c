/*
 * mpi_comm.c - the communicator object, bounded waits, failure state.
 *
 * Every wait in the library is gm_wait_all: MPI_Testall in a loop with a deadline and a
 * short back-off, never MPI_Wait, so a dead or stalled peer turns into GCOMP_E_TIMEOUT
 * instead of a hang (MPI itself has no timeouts; with shared memory a dead peer produces
 * no error at all, it just never arrives).  The duplicates carry MPI_ERRORS_RETURN, so
 * an MPI failure comes back as a code and becomes GCOMP_E_MPI.  Either fails the
 * communicator: MPI matches collectives by order, and after one was abandoned half-way
 * the ranks' sequences no longer line up, so nothing further on it can be trusted.
 *
 * Node split: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (or rank / ranks_per_node for
 * tests), then the node leaders (node rank 0) in their own communicator.  There is no
 * non-blocking split in MPI-3, so these two calls are the only unbounded ones.
 */
#include "mpi_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- failure state --------------------------------------------------------------------- */

gcomp_status gm_comm_fail(gcomp_mpi_comm *c, gcomp_error *err, gcomp_status st, const char *fmt,
                          ...) {
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (c && c->failed == GCOMP_OK) {
        c->failed = st;
        c->failure.status = st;
        snprintf(c->failure.message, sizeof c->failure.message, "%s", text);
    }
    return gm_fail(err, st, "%s", text);
}

gcomp_status gm_comm_mpi_fail(gcomp_mpi_comm *c, gcomp_error *err, int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    return gm_comm_fail(c, err, GCOMP_E_MPI, "%s: %s", what, text);
}

gcomp_status gm_comm_check(const gcomp_mpi_comm *c, gcomp_error *err) {
    if (!c) return gm_fail(err, GCOMP_E_ARG, "communicator is NULL");
    if (c->failed != GCOMP_OK)
        return gm_fail(err, GCOMP_E_FAILED, "communicator failed earlier (%s): %s",
                       gcomp_status_str(c->failed), c->failure.message);
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_comm_status(const gcomp_mpi_comm *c, gcomp_error *err) {
    return gm_comm_check(c, err);
}

uint64_t gm_deadline(const gcomp_mpi_comm *c, double timeout_s) {
    double t = timeout_s > 0 && isfinite(timeout_s) ? timeout_s : c->opt.timeout_s;
    if (t > 1e7) t = 1e7;
    return gm_now_ns() + (uint64_t)(t * 1e9);
}

gcomp_status gm_comm_agree(gcomp_mpi_comm *c, const uint64_t *in, int n, uint64_t *out,
                           uint64_t deadline, const char *what, gcomp_error *err) {
    return gm_comm_agree_on(c, c->comm, in, n, out, deadline, what, err);
}

gcomp_status gm_comm_agree_on(gcomp_mpi_comm *c, MPI_Comm on, const uint64_t *in, int n,
                              uint64_t *out, uint64_t deadline, const char *what,
                              gcomp_error *err) {
    gm_setup_cells *cc = c->cells;
    if (cc->pending) /* an earlier round timed out: this communicator has failed anyway */
        return gm_fail(err, GCOMP_E_FAILED, "%s: the communicator has failed", what);
    memset(cc->in, 0, sizeof cc->in);
    memcpy(cc->in, in, (size_t)n * sizeof *in);
    MPI_Request req;
    int rc = MPI_Iallreduce(cc->in, cc->out, n, MPI_UINT64_T, MPI_MAX, on, &req);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(c, err, rc, what);
    cc->pending = true;
    gcomp_status st = gm_wait_all(c, &req, 1, deadline, what, err);
    if (st != GCOMP_OK) return st; /* the cells stay pending */
    cc->pending = false;
    memcpy(out, cc->out, (size_t)n * sizeof *out);
    return GCOMP_OK;
}

gcomp_status gm_wait_all(gcomp_mpi_comm *c, MPI_Request *req, int n, uint64_t deadline,
                         const char *what, gcomp_error *err) {
    unsigned spins = 0;
    uint64_t t0 = gm_now_ns();
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(c, err, rc, what);
        if (flag) return GCOMP_OK;
        uint64_t now = gm_now_ns();
        if (now > deadline)
            return gm_comm_fail(c, err, GCOMP_E_TIMEOUT,
                                "%s: not complete after %.1f s (a peer is dead, stalled or has not "
                                "made the same call)",
                                what, (double)(now - t0) * 1e-9);
        gm_backoff(&spins, now - t0);
    }
}

void gm_comm_bury(gcomp_mpi_comm *c, MPI_Request *req, int nreq, void **bufs, size_t nbufs,
                  const MPI_Comm *comms, int ncomms) {
    gm_grave *g = gm_calloc(1, sizeof *g);
    if (!g) return; /* leak everything: never free what MPI may still use */
    g->req = req;
    g->nreq = nreq;
    g->bufs = bufs;
    g->nbufs = nbufs;
    for (int i = 0; i < 3; i++) g->comms[i] = i < ncomms ? comms[i] : MPI_COMM_NULL;
    g->next = c->graves;
    c->graves = g;
}

/* ---- create / free / reset --------------------------------------------------------------- */

void gcomp_mpi_options_default(gcomp_mpi_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->timeout_s = 300.0;
    o->ranks_per_node = 0;
}

static void free_comms(gcomp_mpi_comm *c) {
    if (c->leaders != MPI_COMM_NULL) MPI_Comm_free(&c->leaders);
    if (c->node != MPI_COMM_NULL) MPI_Comm_free(&c->node);
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    c->leaders = c->node = c->comm = MPI_COMM_NULL;
}

/* Small results that a pending request may still write after a timeout: on the heap,
 * and leaked when that happens. */
typedef struct build_cells {
    MPI_Comm dup;
    int info[2]; /* leader rank = node index, number of nodes */
} build_cells;

static gcomp_status build(gcomp_mpi_comm *c, double timeout_s, gcomp_error *err) {
    uint64_t deadline = gm_deadline(c, timeout_s);
    build_cells *cell = gm_calloc(1, sizeof *cell);
    if (!cell) return gm_fail(err, GCOMP_E_NOMEM, "out of memory creating a communicator");
    MPI_Request req;
    int rc = MPI_Comm_idup(c->user, &cell->dup, &req);
    if (rc != MPI_SUCCESS) {
        gm_free(cell);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Comm_idup");
    }
    gcomp_status st = gm_wait_all(c, &req, 1, deadline, "duplicating the communicator", err);
    if (st != GCOMP_OK) return st; /* cell leaked on purpose: MPI may still write it */
    c->comm = cell->dup;
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    if (c->opt.ranks_per_node > 0)
        rc = MPI_Comm_split(c->comm, c->rank / c->opt.ranks_per_node, c->rank, &c->node);
    else
        rc = MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->node);
    if (rc != MPI_SUCCESS) {
        gm_free(cell);
        return gm_comm_mpi_fail(c, err, rc, "splitting the communicator into nodes");
    }
    MPI_Comm_set_errhandler(c->node, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->node, &c->node_rank);
    MPI_Comm_size(c->node, &c->node_size);
    rc = MPI_Comm_split(c->comm, c->node_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &c->leaders);
    if (rc != MPI_SUCCESS) {
        gm_free(cell);
        return gm_comm_mpi_fail(c, err, rc, "making the node leaders' communicator");
    }
    if (c->leaders != MPI_COMM_NULL) {
        MPI_Comm_set_errhandler(c->leaders, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c->leaders, &cell->info[0]);
        MPI_Comm_size(c->leaders, &cell->info[1]);
    }
    rc = MPI_Ibcast(cell->info, 2, MPI_INT, 0, c->node, &req);
    if (rc != MPI_SUCCESS) {
        gm_free(cell);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Ibcast (node layout)");
    }
    st = gm_wait_all(c, &req, 1, deadline, "sharing the node layout", err);
    if (st != GCOMP_OK) return st;
    c->node_index = cell->info[0];
    c->nnodes = cell->info[1];
    gm_free(cell);
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_comm_create(gcomp_mpi_comm **out, MPI_Comm comm,
                                   const gcomp_mpi_options *opt, double timeout_s,
                                   gcomp_error *err) {
    if (!out) return gm_fail(err, GCOMP_E_ARG, "out must not be NULL");
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return gm_fail(err, GCOMP_E_ARG, "MPI is not initialised (or already finalised)");
    if (comm == MPI_COMM_NULL) return gm_fail(err, GCOMP_E_ARG, "comm is MPI_COMM_NULL");
    gcomp_mpi_options o;
    if (opt)
        o = *opt;
    else
        gcomp_mpi_options_default(&o);
    if (!(o.timeout_s > 0) || !isfinite(o.timeout_s) || o.ranks_per_node < 0)
        return gm_fail(err, GCOMP_E_ARG,
                       "options: timeout_s must be > 0 and finite, ranks_per_node >= 0");
    gcomp_mpi_comm *c = gm_calloc(1, sizeof *c);
    gm_setup_cells *cells = gm_calloc(1, sizeof *cells);
    if (!c || !cells) {
        gm_free(c);
        gm_free(cells);
        return gm_fail(err, GCOMP_E_NOMEM, "out of memory creating a communicator");
    }
    c->cells = cells;
    c->user = comm;
    c->comm = c->node = c->leaders = MPI_COMM_NULL;
    c->op_f16 = c->op_bf16 = MPI_OP_NULL;
    c->opt = o;
    if (MPI_Op_create(gm_op_f16_sum, 1, &c->op_f16) != MPI_SUCCESS ||
        MPI_Op_create(gm_op_bf16_sum, 1, &c->op_bf16) != MPI_SUCCESS) {
        if (c->op_f16 != MPI_OP_NULL) MPI_Op_free(&c->op_f16);
        gm_free(c->cells);
        gm_free(c);
        return gm_fail(err, GCOMP_E_MPI, "MPI_Op_create failed");
    }
    gcomp_status st = build(c, timeout_s, err);
    if (st != GCOMP_OK) {
        if (st == GCOMP_E_TIMEOUT) return st; /* c leaked on purpose: a request may still write */
        free_comms(c);
        MPI_Op_free(&c->op_f16);
        MPI_Op_free(&c->op_bf16);
        gm_free(c->cells);
        gm_free(c);
        return st;
    }
    *out = c;
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_comm_free(gcomp_mpi_comm *c) {
    if (!c) return GCOMP_OK;
    if (c->nbuckets) return GCOMP_E_ARG;
    int fin = 0;
    MPI_Finalized(&fin);
    while (c->graves) {
        gm_grave *g = c->graves;
        c->graves = g->next;
        int flag = 0;
        if (!fin && g->nreq) MPI_Testall(g->nreq, g->req, &flag, MPI_STATUSES_IGNORE);
        if (flag || !g->nreq) {
            for (size_t i = 0; i < g->nbufs; i++) gm_free(g->bufs[i]);
            gm_free(g->bufs);
            gm_free(g->req);
            for (int i = 0; i < 3 && !fin; i++)
                if (g->comms[i] != MPI_COMM_NULL) MPI_Comm_free(&g->comms[i]);
        } /* else: leaked on purpose, MPI may still use them */
        gm_free(g);
    }
    if (!fin) {
        free_comms(c);
        MPI_Op_free(&c->op_f16);
        MPI_Op_free(&c->op_bf16);
    }
    if (c->cells && !c->cells->pending) gm_free(c->cells); /* else leaked on purpose */
    gm_free(c);
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_comm_reset(gcomp_mpi_comm *c, double timeout_s, gcomp_error *err) {
    if (!c) return gm_fail(err, GCOMP_E_ARG, "communicator is NULL");
    if (c->cells->pending) {
        /* A bucket set-up timed out: its requests may still write the old cells. */
        gm_setup_cells *cells = gm_calloc(1, sizeof *cells);
        if (!cells) return gm_fail(err, GCOMP_E_NOMEM, "out of memory resetting a communicator");
        c->cells = cells; /* the old ones are leaked on purpose */
    }
    /* The old communicators may carry abandoned operations: keep them (see gm_grave)
     * until the communicator is freed, and start over from the caller's. */
    MPI_Comm old[3] = {c->comm, c->node, c->leaders};
    gm_comm_bury(c, NULL, 0, NULL, 0, old, 3);
    c->comm = c->node = c->leaders = MPI_COMM_NULL;
    c->epoch++;
    c->failed = GCOMP_OK;
    memset(&c->failure, 0, sizeof c->failure);
    gcomp_status st = build(c, timeout_s, err);
    if (st != GCOMP_OK && c->failed == GCOMP_OK)
        gm_comm_fail(c, NULL, st, "reset: %s", err ? err->message : gcomp_status_str(st));
    return st;
}

int gcomp_mpi_comm_rank(const gcomp_mpi_comm *c) {
    return c ? c->rank : -1;
}
int gcomp_mpi_comm_size(const gcomp_mpi_comm *c) {
    return c ? c->size : 0;
}
int gcomp_mpi_comm_nodes(const gcomp_mpi_comm *c) {
    return c ? c->nnodes : 0;
}
int gcomp_mpi_comm_node(const gcomp_mpi_comm *c) {
    return c ? c->node_index : -1;
}

MPI_Op gcomp_mpi_half_sum_op(const gcomp_mpi_comm *c, int bf16) {
    if (!c) return MPI_OP_NULL;
    return bf16 ? c->op_bf16 : c->op_f16;
}

/*
 * test_mpi_ps_common.h - what the parameter-server tests share: the roles (the last S ranks
 * serve), a communicator of the workers alone (for the collective strategies the PS is
 * compared with), and a session helper.  Public headers only.
 */
#ifndef GCOMP_TEST_MPI_PS_COMMON_H
#define GCOMP_TEST_MPI_PS_COMMON_H

#include "mpi_check.h"

#include <stdbool.h>

typedef struct ps_env {
    int S, W, widx; /* servers, workers, this worker's index (-1 on servers) */
    bool server;
    MPI_Comm wcomm; /* the workers, in rank order; MPI_COMM_NULL on servers */
    gcomp_mpi_comm *world;
    gcomp_mpi_comm *wc; /* over wcomm; NULL on servers */
} ps_env;

/* Roles with the last S ranks serving; communicators with ranks_per_node rpn (0: real
 * nodes) and timeout_s. */
static inline void ps_env_init(ps_env *e, int S, int rpn, double timeout_s) {
    memset(e, 0, sizeof *e);
    e->S = S;
    e->W = mc_size - S;
    e->server = mc_rank >= e->W;
    e->widx = e->server ? -1 : mc_rank;
    MPI_Comm_split(MPI_COMM_WORLD, e->server ? MPI_UNDEFINED : 0, mc_rank, &e->wcomm);
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.timeout_s = timeout_s;
    o.ranks_per_node = rpn;
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_comm_create(&e->world, MPI_COMM_WORLD, &o, 30.0, &err) == GCOMP_OK, "%s",
              err.message);
    if (!e->server)
        CHECK_MSG(gcomp_mpi_comm_create(&e->wc, e->wcomm, &o, 30.0, &err) == GCOMP_OK, "%s",
                  err.message);
}

static inline void ps_env_free(ps_env *e) {
    gcomp_mpi_comm_free(e->wc);
    gcomp_mpi_comm_free(e->world);
    if (e->wcomm != MPI_COMM_NULL) MPI_Comm_free(&e->wcomm);
}

/* Serves one session on a server rank; CHECKs that it ended well. */
static inline void ps_serve_ok(gcomp_mpi_ps *ps, double timeout_s, const char *what) {
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_ps_serve(ps, timeout_s, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: serve: %s", what, err.message);
}

static inline void ps_shutdown_ok(gcomp_mpi_ps *ps, const char *what) {
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_ps_shutdown(ps, 30.0, &err) == GCOMP_OK, "%s: shutdown: %s", what,
              err.message);
}

#endif

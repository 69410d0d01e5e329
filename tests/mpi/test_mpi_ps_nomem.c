/*
 * test_mpi_ps_nomem.c - a parameter server whose serve loop cannot allocate its tables
 * returns GCOMP_E_NOMEM and stays usable; it used to clean up requests it had never set and
 * crash (SIGSEGV).  The workers, whose pushes nobody answers, get GCOMP_E_TIMEOUT within
 * their timeout.  Then the job builds a fresh server on a fresh communicator and a round
 * goes through; and a server set-up short of memory on one rank fails on every rank.
 * np 2: rank 0 works, rank 1 serves.
 */
#include "test_mpi_ps_common.h"

size_t gcomp__mpi_test_fail_alloc_after(size_t n); /* the MPI layer's test hook */

#define TIMEOUT 1.0
#define N 3001

static void one_round(double timeout, int fail_serve, gcomp_status want_worker,
                      gcomp_status want_server) {
    ps_env env;
    ps_env_init(&env, 1, 0, timeout);
    gcomp_mpi_ps_options po;
    gcomp_mpi_ps_options_default(&po);
    gcomp_mpi_ps *ps = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_ps_create(&ps, env.world, &po, 30.0, &err));
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_tensor t = {"w", "topk:density=0.1", N, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket *b = NULL;
    if (ps) CHECK_OK(gcomp_mpi_bucket_create(&b, env.world, &t, 1, &bo, 30.0, &err));
    if (b) {
        gcomp_status st;
        gcomp_error e = {0};
        if (env.server) {
            if (fail_serve) gcomp__mpi_test_fail_alloc_after(0);
            st = gcomp_mpi_ps_serve(ps, timeout, &e);
            gcomp__mpi_test_fail_alloc_after((size_t)-1);
            CHECK_MSG(st == want_server, "serve: %s (%s)", gcomp_status_str(st), e.message);
        } else {
            static float x[N];
            float *d = x;
            test_fill(x, N, 3);
            st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_AVERAGE, timeout, &e);
            CHECK_MSG(st == want_worker, "push/pull: %s (%s)", gcomp_status_str(st), e.message);
            if (st == GCOMP_OK) CHECK_OK(gcomp_mpi_ps_shutdown(ps, 30.0, &e));
        }
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
    ps_env_free(&env);
}

/* gcomp_mpi_ps_create with the last rank out of memory from its k-th allocation on, for
 * every k until the create needs fewer: every rank fails alike and keeps a usable
 * communicator.  The layout's tables used to be allocated after the check: the failing
 * rank had no server object while the others had a working one.  The first two (the object
 * and its check cells) came before any collective, and the others timed out. */
static void create_sweep(void) {
    ps_env env;
    ps_env_init(&env, 1, 0, 5.0);
    for (size_t k = 0; k < 64; k++) {
        gcomp_mpi_ps_options po;
        gcomp_mpi_ps_options_default(&po);
        gcomp_mpi_ps *ps = NULL;
        gcomp_error err = {0};
        if (mc_rank == mc_size - 1) gcomp__mpi_test_fail_alloc_after(k);
        gcomp_status st = gcomp_mpi_ps_create(&ps, env.world, &po, 5.0, &err);
        size_t left = gcomp__mpi_test_fail_alloc_after((size_t)-1);
        CHECK_MSG(mc_same_everywhere(st != GCOMP_OK),
                  "k=%zu: ps_create failed on some ranks only (%s)", k, err.message);
        CHECK_MSG(gcomp_mpi_comm_status(env.world, NULL) == GCOMP_OK, "k=%zu: %s", k, err.message);
        CHECK((st == GCOMP_OK) == (ps != NULL));
        gcomp_mpi_ps_free(ps);
        if (mc_sweep_done(left)) break;
    }
    ps_env_free(&env);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    if (mc_size != 2) {
        if (mc_rank == 0) printf("test_mpi_ps_nomem: run with np 2\n");
        return mc_done("test_mpi_ps_nomem");
    }
    one_round(TIMEOUT, 1, GCOMP_E_TIMEOUT, GCOMP_E_NOMEM);
    MPI_Barrier(MPI_COMM_WORLD);
    one_round(30.0, 0, GCOMP_OK, GCOMP_OK);
    create_sweep();
    return mc_done("test_mpi_ps_nomem");
}

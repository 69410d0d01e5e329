/*
 * test_mpi_fail.c - a dead or stalled peer gives an error within the timeout, never a
 * hang; afterwards the communicator says it failed; reset works once every peer is back.
 *
 *   exit    rank 1 calls _exit(0) just before the second allreduce.  The others must get
 *           GCOMP_E_TIMEOUT (or GCOMP_E_MPI) within the timeout, then GCOMP_E_FAILED.
 *   stall   rank 1 sleeps through the second allreduce (then exits).  Same expectation.
 *   each    as stall, with two buckets waited for by gcomp_mpi_wait_each: both report a
 *           timeout, each naming its own tensor, within one timeout (one deadline for all).
 *   reset   rank 1 is late for the second allreduce; everyone times out (rank 1 too: the
 *           others gave up), all call gcomp_mpi_comm_reset, create the bucket again, load
 *           the state saved from the failed one, and the third allreduce is exact.
 * In every mode each survivor saves its failed bucket's state (allowed after a failure).
 * Survivors print "SURVIVOR-OK rank R: ..." and leave with _exit(0): after a peer died,
 * MPI_Finalize may itself wait for it.  run_fail.sh runs this under mpirun with a hard time
 * limit and counts those lines, so the test fails if a survivor hangs or gets no error.
 */
#include "mpi_check.h"

#include <stdbool.h>
#include <unistd.h>

#define TIMEOUT 2.0
#define N 100000

static int fail(const char *what) {
    printf("FAIL rank %d: %s\n", mc_rank, what);
    fflush(stdout);
    _exit(1);
}

static gcomp_status step(gcomp_mpi_bucket *b, float *x, unsigned seed, double *took,
                         gcomp_error *err) {
    test_fill(x, N, seed * 31u + (unsigned)mc_rank);
    double t0 = MPI_Wtime();
    float *d = x;
    gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, TIMEOUT, err);
    *took = MPI_Wtime() - t0;
    return st;
}

/* Mode "each": a second bucket beside `b`, rank 1 stalls, the others start both and wait
 * for them together. */
static int wait_each(gcomp_mpi_comm *comm, const char *spec, int strategy, gcomp_mpi_bucket *b,
                     float *x) {
    gcomp_mpi_tensor t = {"v", spec, N, 0, 0, strategy};
    gcomp_mpi_bucket *b2;
    gcomp_error err = {0}, each[2];
    if (gcomp_mpi_bucket_create(&b2, comm, &t, 1, NULL, 10.0, &err) != GCOMP_OK)
        return fail(err.message);
    float *y = malloc(N * sizeof(float)), *dx = x, *dy = y;
    test_fill(y, N, 7u + (unsigned)mc_rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mc_rank == 1) {
        sleep(3 * (unsigned)TIMEOUT + 2);
        _exit(0);
    }
    if (gcomp_mpi_start(b, &dx, GCOMP_MPI_SUM, &err) != GCOMP_OK ||
        gcomp_mpi_start(b2, &dy, GCOMP_MPI_SUM, &err) != GCOMP_OK)
        return fail(err.message);
    gcomp_mpi_bucket *both[2] = {b, b2};
    size_t failed = 99;
    double t0 = MPI_Wtime();
    gcomp_status st = gcomp_mpi_wait_each(both, 2, TIMEOUT, each, &failed, &err);
    double took = MPI_Wtime() - t0;
    for (int i = 0; i < 2; i++)
        if (each[i].status != GCOMP_E_TIMEOUT && each[i].status != GCOMP_E_MPI)
            return fail(gcomp_status_str(each[i].status));
    if (st != each[0].status || failed != 0 || strcmp(err.message, each[0].message) != 0)
        return fail("the call's status is not the first bucket's");
    if (each[0].status == GCOMP_E_TIMEOUT &&
        (!strstr(each[0].message, "'w'") || !strstr(each[1].message, "'v'")))
        return fail("a timeout does not name its own bucket's tensor");
    if (took > TIMEOUT + 1.5) return fail("more than one timeout for two buckets");
    if (gcomp_mpi_comm_status(comm, NULL) != GCOMP_E_FAILED) return fail("communicator not failed");
    printf("SURVIVOR-OK rank %d: %s / %s after %.2f s (%s | %s)\n", mc_rank,
           gcomp_status_str(each[0].status), gcomp_status_str(each[1].status), took,
           each[0].message, each[1].message);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "exit";
    const char *spec = argc > 2 ? argv[2] : "topk:density=0.01,feedback=ef";
    int strategy = GCOMP_MPI_AUTO;
    if (argc > 3 && gcomp_mpi_strategy_parse(argv[3], &strategy) != GCOMP_OK)
        return fail("strategy");
    if (mc_size < 2) return fail("needs 2 ranks or more");
    gcomp_mpi_comm *comm;
    gcomp_error err = {0};
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.timeout_s = TIMEOUT;
    if (gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, &o, 10.0, &err) != GCOMP_OK)
        return fail(err.message);
    gcomp_mpi_tensor t = {"w", spec, N, 0, 0, strategy};
    gcomp_mpi_bucket *b;
    if (gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 10.0, &err) != GCOMP_OK)
        return fail(err.message);
    float *x = malloc(N * sizeof(float));
    double took;
    if (step(b, x, 1, &took, &err) != GCOMP_OK) return fail(err.message);
    MPI_Barrier(MPI_COMM_WORLD); /* everyone has finished the first step */

    if (!strcmp(mode, "each")) return wait_each(comm, spec, strategy, b, x);

    bool victim = mc_rank == 1;
    if (victim && !strcmp(mode, "exit")) _exit(0);
    if (victim && !strcmp(mode, "stall")) {
        sleep(3 * (unsigned)TIMEOUT + 2);
        _exit(0);
    }
    if (victim && !strcmp(mode, "reset")) sleep(2 * (unsigned)TIMEOUT);

    gcomp_status st = step(b, x, 2, &took, &err);
    if (st == GCOMP_OK) return fail("the allreduce succeeded without a peer");
    if (st != GCOMP_E_TIMEOUT && st != GCOMP_E_MPI) return fail(gcomp_status_str(st));
    if (took > TIMEOUT + 5.0) return fail("the error came too late");
    if (gcomp_mpi_comm_status(comm, NULL) != GCOMP_E_FAILED) return fail("communicator not failed");
    /* What the residuals hold can still be saved, to restart from. */
    size_t cap = gcomp_mpi_bucket_state_size(b), slen = 0;
    uint8_t *saved = malloc(cap);
    if (gcomp_mpi_bucket_save_state(b, saved, cap, &slen, &err) != GCOMP_OK || slen != cap)
        return fail("saving the state of a failed bucket");
    if (gcomp_mpi_bucket_load_state(b, saved, slen, NULL) != GCOMP_E_FAILED)
        return fail("a failed bucket accepted a state");
    float *d = x;
    double t0 = MPI_Wtime();
    if (gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, TIMEOUT, NULL) != GCOMP_E_FAILED ||
        MPI_Wtime() - t0 > 0.5)
        return fail("a failed communicator did not refuse at once");
    if (strcmp(mode, "reset") != 0) {
        printf("SURVIVOR-OK rank %d: %s after %.2f s (%s)\n", mc_rank, gcomp_status_str(st), took,
               err.message);
        fflush(stdout);
        _exit(0);
    }

    /* reset: everyone is alive; start over on fresh communicators. */
    gcomp_mpi_bucket_free(b);
    if (gcomp_mpi_comm_reset(comm, 20.0, &err) != GCOMP_OK) return fail(err.message);
    if (gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 20.0, &err) != GCOMP_OK)
        return fail(err.message);
    if (gcomp_mpi_bucket_load_state(b, saved, slen, &err) != GCOMP_OK) return fail(err.message);
    /* Owner strategies: what the owners keep back this step is their residual's change. */
    double *delta = calloc(N, sizeof(double)), *dsum = calloc(N, sizeof(double));
    const float *res = NULL;
    size_t off = 0, cnt = 0;
    gcomp_mpi_owner_residual(b, 0, &res, &off, &cnt);
    for (size_t j = 0; res && j < cnt; j++) delta[off + j] = -(double)res[j];
    st = step(b, x, 3, &took, &err);
    if (st != GCOMP_OK) return fail(err.message);
    gcomp_mpi_owner_residual(b, 0, &res, &off, &cnt);
    for (size_t j = 0; res && j < cnt; j++) delta[off + j] += (double)res[j];
    MPI_Allreduce(delta, dsum, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double *ref = calloc(N, sizeof(double)), *abs_sum = calloc(N, sizeof(double)), worst = 0;
    if (mc_reference(MPI_COMM_WORLD, b, 0, N, ref, abs_sum) <= 0) return fail("reference");
    for (size_t i = 0; i < N; i++) {
        double e = fabs(x[i] - (ref[i] - dsum[i])) - 1e-5 * (abs_sum[i] + fabs(dsum[i])) - 1e-6;
        if (e > worst) worst = e;
    }
    free(delta);
    free(dsum);
    if (worst > 0) return fail("wrong sum after reset");
    printf("SURVIVOR-OK rank %d: reset and recovered (first error: timeout)\n", mc_rank);
    fflush(stdout);
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_comm_free(comm);
    free(saved);
    free(x);
    free(ref);
    free(abs_sum);
    MPI_Finalize();
    return 0;
}

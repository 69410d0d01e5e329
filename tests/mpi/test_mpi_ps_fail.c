/*
 * test_mpi_ps_fail.c - a dead or stalled worker under the parameter server (issue 13).
 * The last rank serves; worker 1 is the victim after VICTIM_STEPS pushes.
 *
 *   sync-exit   the victim calls _exit(0): every surviving worker's next push gets
 *               GCOMP_E_TIMEOUT (or GCOMP_E_MPI) within the timeout, never a hang, and the
 *               server's serve returns GCOMP_E_TIMEOUT (or _MPI) as well.
 *   sync-stall  the victim sleeps through the timeout (then exits): the same.
 *   async-exit  the victim calls _exit(0): the others keep pushing and every push succeeds;
 *               once the server has declared the victim lost (TIMEOUT of silence) their
 *               replies say so (gcomp_mpi_ps_stats.workers_lost == 1); they finish their
 *               steps and shut down, and serve returns GCOMP_OK with one worker lost.
 *   async-stall the victim sleeps past the timeout instead: the same for the others.
 *   async-nonleader  5 ranks in nodes of 2 ({0,1} {2,3} {4}: the server), the key
 *               hierarchical, so ranks 1 and 3 never push: after the last step rank 1 exits
 *               without shutting down while its leader shuts down cleanly.  serve must
 *               return GCOMP_OK with one worker lost within a few timeouts (it waited for
 *               ever before 2026-12-01: the hard time limit of run_fail.sh).
 * Survivors print "SURVIVOR-OK" and leave with _exit(0) (MPI_Finalize may wait for the
 * dead); run_fail.sh counts them under a hard time limit.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_mpi_ps_common.h"

#include <time.h>
#include <unistd.h>

#define TIMEOUT 2.0
#define N 5000
#define VICTIM_STEPS 3

static int fail(const char *what) {
    printf("FAIL rank %d: %s\n", mc_rank, what);
    fflush(stdout);
    _exit(1);
}

static void ok(const char *what) {
    printf("SURVIVOR-OK rank %d: %s\n", mc_rank, what);
    fflush(stdout);
    _exit(0);
}

/* The server object and a one-tensor bucket of strategy `strategy`, on every rank. */
static gcomp_mpi_bucket *setup(ps_env *E, const gcomp_mpi_ps_options *o, int strategy,
                               gcomp_mpi_ps **ps) {
    gcomp_error err = {0};
    *ps = NULL;
    if (gcomp_mpi_ps_create(ps, E->world, o, 10.0, &err) != GCOMP_OK) fail(err.message);
    gcomp_mpi_tensor t = {"w", "topk:density=0.05,feedback=ef", N, 0, 0, strategy};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = *ps;
    gcomp_mpi_bucket *b = NULL;
    if (gcomp_mpi_bucket_create(&b, E->world, &t, 1, &bo, 10.0, &err) != GCOMP_OK)
        fail(err.message);
    MPI_Barrier(MPI_COMM_WORLD);
    return b;
}

/* Serves on a server rank; its outcome and statistics in msg. */
static gcomp_status serve(gcomp_mpi_ps *ps, char *msg, size_t cap, uint32_t *lost) {
    gcomp_error err = {0};
    double t0 = MPI_Wtime();
    gcomp_status st = gcomp_mpi_ps_serve(ps, TIMEOUT, &err);
    gcomp_mpi_ps_stats s;
    gcomp_mpi_ps_stats_get(ps, -1, &s);
    snprintf(msg, cap, "serve: %s after %.1f s (%s); %u lost, %llu applied", gcomp_status_str(st),
             MPI_Wtime() - t0, err.message, s.workers_lost, (unsigned long long)s.applied);
    *lost = s.workers_lost;
    return st;
}

static int nonleader_case(void) {
    if (mc_size != 5) return fail("async-nonleader needs 5 ranks");
    ps_env E;
    ps_env_init(&E, 1, 2, TIMEOUT);
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.mode = GCOMP_MPI_PS_ASYNC;
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = setup(&E, &o, GCOMP_MPI_PS | GCOMP_MPI_HIERARCHICAL, &ps);
    gcomp_error err = {0};
    if (E.server) {
        char msg[400];
        uint32_t lost = 0;
        gcomp_status st = serve(ps, msg, sizeof msg, &lost);
        if (st != GCOMP_OK || lost != 1) return fail(msg);
        ok(msg);
    }
    float *x = malloc(N * sizeof(float)), *d[1] = {x};
    test_fill(x, N, 3);
    if (gcomp_mpi_ps_init(b, d, 10.0, &err) != GCOMP_OK) return fail(err.message);
    for (int step = 0; step < VICTIM_STEPS; step++) {
        test_fill(x, N, 100ull * (unsigned)step + (unsigned)E.widx);
        if (gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err) != GCOMP_OK)
            return fail(err.message);
    }
    if (E.widx == 1) _exit(0); /* a non-leader, gone before its shutdown */
    if (gcomp_mpi_ps_shutdown(ps, TIMEOUT, &err) != GCOMP_OK) return fail(err.message);
    ok("async-nonleader: shut down");
    return 0;
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "sync-exit";
    if (!strcmp(mode, "async-nonleader")) return nonleader_case();
    bool async = !strncmp(mode, "async", 5), stall = strstr(mode, "stall") != NULL;
    if (mc_size < 3) return fail("needs 3 ranks or more");
    ps_env E;
    ps_env_init(&E, 1, 0, TIMEOUT);
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.mode = async ? GCOMP_MPI_PS_ASYNC : GCOMP_MPI_PS_SYNC;
    o.part_bytes = 8192; /* several parts, so the server has several receives per worker */
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = setup(&E, &o, GCOMP_MPI_PS, &ps);
    gcomp_error err = {0};

    if (E.server) {
        char msg[400];
        uint32_t lost = 0;
        gcomp_status st = serve(ps, msg, sizeof msg, &lost);
        if (async) {
            if (st != GCOMP_OK || lost != 1) return fail(msg);
        } else if (st != GCOMP_E_TIMEOUT && st != GCOMP_E_MPI) {
            return fail(msg);
        }
        ok(msg);
    }

    float *x = malloc(N * sizeof(float)), *d[1] = {x};
    test_fill(x, N, 3);
    if (async && gcomp_mpi_ps_init(b, d, 10.0, &err) != GCOMP_OK) return fail(err.message);
    bool victim = E.widx == 1;
    double killed_at = 0;
    for (int step = 0;; step++) {
        if (victim && step == VICTIM_STEPS) {
            if (!stall) _exit(0);
            struct timespec ts = {(time_t)(3 * TIMEOUT) + 2, 0};
            nanosleep(&ts, NULL);
            _exit(0);
        }
        if (step == VICTIM_STEPS) killed_at = MPI_Wtime();
        test_fill(x, N, 100ull * (unsigned)step + (unsigned)E.widx);
        double t0 = MPI_Wtime();
        gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err);
        double took = MPI_Wtime() - t0;
        char msg[400];
        snprintf(msg, sizeof msg, "step %d: %s after %.2f s (%s)", step, gcomp_status_str(st), took,
                 err.message);
        if (!async) {
            if (step < VICTIM_STEPS) {
                if (st != GCOMP_OK) return fail(msg);
                continue;
            }
            if (st == GCOMP_OK) return fail("a sync round completed without a worker");
            if (st != GCOMP_E_TIMEOUT && st != GCOMP_E_MPI) return fail(msg);
            if (took > TIMEOUT + 5.0) return fail("the error came too late");
            if (gcomp_mpi_comm_status(E.world, NULL) != GCOMP_E_FAILED)
                return fail("communicator not failed");
            ok(msg);
        }
        if (st != GCOMP_OK) return fail(msg); /* async: the others are never held up */
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        if (s.workers_lost == 1 && step > VICTIM_STEPS) {
            snprintf(msg, sizeof msg, "async: %d steps, the loss reported %.1f s after it",
                     step + 1, MPI_Wtime() - killed_at);
            if (gcomp_mpi_ps_shutdown(ps, TIMEOUT, &err) != GCOMP_OK) return fail(err.message);
            ok(msg);
        }
        if (step > VICTIM_STEPS && MPI_Wtime() - killed_at > 6 * TIMEOUT)
            return fail("the lost worker was never reported");
        struct timespec ts = {0, 20000000L}; /* 20 ms a step: the loss takes TIMEOUT to see */
        nanosleep(&ts, NULL);
    }
}

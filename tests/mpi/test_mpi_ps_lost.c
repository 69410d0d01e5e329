/*
 * test_mpi_ps_lost.c - async parameter server: a push from a worker already declared lost
 * is refused, GCOMP_E_FAILED on that worker, and nothing of it is applied (the "Parameter
 * server" section of gradcomp_mpi.h, Faults).
 *
 * The last rank serves (timeout TIMEOUT); worker 1 is the victim.  It pushes VICTIM_STEPS
 * times, then goes silent (blocked in a plain MPI_Recv) while worker 0 keeps pushing until
 * its replies report the loss (workers_lost == 1); worker 0 then wakes the victim, which
 * pushes twice more with a long timeout: each push must come back GCOMP_E_FAILED, soon
 * (a server that no longer receives from it leaves it waiting for PUSH_TIMEOUT, then
 * GCOMP_E_TIMEOUT).  Worker 0 keeps pushing until the victim is done, then shuts down;
 * serve must return GCOMP_OK with one worker lost, the refused pushes counted and every
 * other push applied.  The victim shuts down too, after the session ended: that word is
 * not for the next session.  In a second session worker 0 pushes and shuts down first,
 * then the victim pushes: each push must be answered (a server that took the victim's old
 * word as its shutdown in the new session has stopped serving: the push times out).  Any
 * failure aborts the job, so a hang ends in seconds.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_mpi_ps_common.h"

#include <time.h>

#define TIMEOUT 1.0
#define PUSH_TIMEOUT 6.0
#define N 5000
#define VICTIM_STEPS 3
#define LATE_PUSHES 2
#define TAG_WAKE 71
#define TAG_DONE 72
#define TAG_GO 73
#define NEXT_PUSHES 3
#define NEXT_TIMEOUT 10.0

static void must(bool ok, const char *what, const gcomp_error *err) {
    CHECK_MSG(ok, "%s: %s", what, err ? err->message : "");
    if (ok) return;
    printf("FAIL rank %d: %s: %s\n", mc_rank, what, err ? err->message : "");
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* NEXT_PUSHES pushes of the next session, each answered and applied. */
static void push_next(gcomp_mpi_bucket *b, float *x, uint64_t seed, const char *what,
                      long *applied) {
    float *d[1] = {x};
    gcomp_error err = {0};
    for (int s = 0; s < NEXT_PUSHES; s++) {
        test_fill(x, N, seed + (unsigned)s);
        must(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, PUSH_TIMEOUT, &err) == GCOMP_OK, what,
             &err);
        (*applied)++;
    }
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    if (mc_size != 3) {
        if (mc_rank == 0) printf("test_mpi_ps_lost: needs 3 ranks\n");
        MPI_Finalize();
        return 1;
    }
    ps_env E;
    ps_env_init(&E, 1, 0, 30.0);
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.mode = GCOMP_MPI_PS_ASYNC;
    o.part_bytes = 8192; /* several parts */
    gcomp_mpi_ps *ps = NULL;
    gcomp_error err = {0};
    must(gcomp_mpi_ps_create(&ps, E.world, &o, 30.0, &err) == GCOMP_OK, "create", &err);
    gcomp_mpi_tensor t = {"w", "topk:density=0.05,feedback=ef", N, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL;
    must(gcomp_mpi_bucket_create(&b, E.world, &t, 1, &bo, 30.0, &err) == GCOMP_OK, "bucket", &err);

    long counts[2] = {0, 0}; /* pushes applied, pushes refused (as the workers saw them) */
    if (E.server) {
        gcomp_status st = gcomp_mpi_ps_serve(ps, TIMEOUT, &err);
        must(st == GCOMP_OK, "serve", &err);
        st = gcomp_mpi_ps_serve(ps, NEXT_TIMEOUT, &err);
        must(st == GCOMP_OK, "serve (the next session)", &err);
    } else {
        float *x = malloc(N * sizeof(float)), *d[1] = {x};
        test_fill(x, N, 3);
        must(gcomp_mpi_ps_init(b, d, 30.0, &err) == GCOMP_OK, "init", &err);
        if (E.widx == 1) {
            for (int s = 0; s < VICTIM_STEPS; s++) {
                test_fill(x, N, 100ull * (unsigned)s + 1);
                must(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, PUSH_TIMEOUT, &err) == GCOMP_OK,
                     "victim push", &err);
                counts[0]++;
            }
            int word = 0;
            MPI_Recv(&word, 1, MPI_INT, 0, TAG_WAKE, E.wcomm, MPI_STATUS_IGNORE);
            for (int s = 0; s < LATE_PUSHES; s++) {
                test_fill(x, N, 7777ull + (unsigned)s);
                double t0 = MPI_Wtime();
                gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, PUSH_TIMEOUT, &err);
                double took = MPI_Wtime() - t0;
                char msg[400];
                snprintf(msg, sizeof msg, "late push %d of the lost worker: %s after %.2f s", s,
                         gcomp_status_str(st), took);
                must(st == GCOMP_E_FAILED, msg, &err);
                must(took < PUSH_TIMEOUT / 2, msg, &err);
                counts[1]++;
            }
            MPI_Send(&word, 1, MPI_INT, 0, TAG_DONE, E.wcomm);
            must(gcomp_mpi_ps_shutdown(ps, 30.0, &err) == GCOMP_OK, "victim shutdown", &err);
            /* the next session: after worker 0 has shut down */
            MPI_Recv(&word, 1, MPI_INT, 0, TAG_GO, E.wcomm, MPI_STATUS_IGNORE);
            push_next(b, x, 9000, "victim push in the next session", &counts[0]);
            must(gcomp_mpi_ps_shutdown(ps, 30.0, &err) == GCOMP_OK, "victim shutdown (next)", &err);
        } else {
            bool woke = false;
            double t0 = MPI_Wtime();
            for (int s = 0;; s++) {
                test_fill(x, N, 100ull * (unsigned)s);
                must(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, PUSH_TIMEOUT, &err) == GCOMP_OK,
                     "push", &err);
                counts[0]++;
                gcomp_mpi_ps_stats s1;
                gcomp_mpi_ps_stats_get(ps, -1, &s1);
                if (!woke && s1.workers_lost == 1) {
                    int word = 1;
                    MPI_Send(&word, 1, MPI_INT, 1, TAG_WAKE, E.wcomm);
                    woke = true;
                }
                if (woke) {
                    int flag = 0;
                    MPI_Iprobe(1, TAG_DONE, E.wcomm, &flag, MPI_STATUS_IGNORE);
                    if (flag) {
                        int word;
                        MPI_Recv(&word, 1, MPI_INT, 1, TAG_DONE, E.wcomm, MPI_STATUS_IGNORE);
                        break;
                    }
                }
                must(MPI_Wtime() - t0 < 10 * TIMEOUT + 2 * PUSH_TIMEOUT, "the test took too long",
                     NULL);
                nap_ms(20);
            }
            must(gcomp_mpi_ps_shutdown(ps, 30.0, &err) == GCOMP_OK, "shutdown", &err);
            push_next(b, x, 8000, "push in the next session", &counts[0]);
            must(gcomp_mpi_ps_shutdown(ps, 30.0, &err) == GCOMP_OK, "shutdown (next)", &err);
            int go = 1;
            MPI_Send(&go, 1, MPI_INT, 1, TAG_GO, E.wcomm);
        }
        free(x);
    }
    long all[2];
    MPI_Allreduce(counts, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (E.server) {
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        char msg[300];
        snprintf(msg, sizeof msg,
                 "server: %llu applied (workers saw %ld), %llu refused (want %ld), %u lost",
                 (unsigned long long)s.applied, all[0], (unsigned long long)s.refused, all[1],
                 s.workers_lost);
        printf("%s\n", msg);
        must(s.applied == (uint64_t)all[0] && s.refused == (uint64_t)all[1] &&
                 s.workers_lost == 1 && all[1] == LATE_PUSHES,
             msg, NULL);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
    ps_env_free(&E);
    return mc_done("test_mpi_ps_lost");
}

/*
 * test_mpi_ps_race.c - sessions back to back: a push for the next session sent right after
 * the sender's shutdown is never lost (the "Parameter server" section of gradcomp_mpi.h:
 * such a push is kept and taken when serve is called again).
 *
 * W = 2 workers, S servers (the last S ranks; 1 at -np 3, 2 at -np 4), one key cut into
 * parts on every server.  SESSIONS sessions of one round each; in session s worker
 * s % W is made the last to shut down (it sleeps LAST_MS first) and then pushes the next
 * session's round at once, while the servers are still ending session s: its push can
 * arrive after the shutdown word that ends the session, when the server is cancelling its
 * posted receives.  A push whose receive completed instead of being cancelled must be kept
 * for the next session, not dropped (dropped, the round never completes: every rank times
 * out).  Each round's result must be the exact sum (sync) and every push must be applied
 * (both modes).  The timeouts are short and the first failure aborts the job, so a lost
 * push ends the test in a few seconds.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_mpi_ps_common.h"

#include <time.h>

#define TIMEOUT 3.0
#define SESSIONS 100
#define LAST_MS 10
#define N 1000

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Ends the whole job at the first failure: a lost push leaves every other rank waiting. */
static void must(bool ok, const char *name, int s, const char *what, const gcomp_error *err) {
    CHECK_MSG(ok, "%s: session %d: %s: %s", name, s, what, err ? err->message : "");
    if (ok) return;
    printf("FAIL rank %d: %s: session %d: %s: %s\n", mc_rank, name, s, what,
           err ? err->message : "");
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* An integer-valued gradient: the sum over workers is exact in float32. */
static float grad(int s, int w, size_t i) {
    return (float)((int)(i % 13) - 6 + 20 * w + 100 * s);
}

static void run(ps_env *E, int mode, const char *name) {
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = E->S;
    o.mode = mode;
    o.update = mode == GCOMP_MPI_PS_ASYNC;
    o.optimizer.lr = 0.01f;
    o.part_bytes = 1024; /* 256 floats a part: parts on every server */
    gcomp_mpi_ps *ps = NULL;
    gcomp_error err = {0};
    must(gcomp_mpi_ps_create(&ps, E->world, &o, 30.0, &err) == GCOMP_OK, name, -1, "create", &err);
    gcomp_mpi_tensor t = {"w", "none", N, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL;
    must(gcomp_mpi_bucket_create(&b, E->world, &t, 1, &bo, 30.0, &err) == GCOMP_OK, name, -1,
         "bucket", &err);
    int owned = 0;
    for (size_t j = 0; j < gcomp_mpi_ps_part_count(b, 0); j++) {
        int srv = -1;
        gcomp_mpi_ps_part(b, 0, j, NULL, NULL, &srv);
        owned |= E->server && srv == gcomp_mpi_ps_index(ps);
    }
    if (E->server) {
        CHECK_MSG(owned, "%s: server %d owns no part", name, gcomp_mpi_ps_index(ps));
        for (int s = 0; s < SESSIONS; s++) {
            gcomp_status st = gcomp_mpi_ps_serve(ps, TIMEOUT, &err);
            must(st == GCOMP_OK, name, s, "serve", &err);
        }
        gcomp_mpi_ps_stats st;
        gcomp_mpi_ps_stats_get(ps, -1, &st);
        CHECK_MSG(st.applied == (uint64_t)(SESSIONS * E->W) && st.refused == 0 &&
                      st.workers_lost == 0,
                  "%s: server %d: %llu pushes applied (want %d), %llu refused, %u workers lost",
                  name, gcomp_mpi_ps_index(ps), (unsigned long long)st.applied, SESSIONS * E->W,
                  (unsigned long long)st.refused, st.workers_lost);
    } else {
        float *x = malloc(N * sizeof(float)), *d[1] = {x};
        if (mode == GCOMP_MPI_PS_ASYNC) {
            for (size_t i = 0; i < N; i++) x[i] = 1.0f;
            must(gcomp_mpi_ps_init(b, d, TIMEOUT, &err) == GCOMP_OK, name, 0, "init", &err);
        }
        for (int s = 0; s < SESSIONS; s++) {
            for (size_t i = 0; i < N; i++) x[i] = grad(s, E->widx, i);
            must(gcomp_mpi_allreduce(b, d, GCOMP_MPI_SUM, TIMEOUT, &err) == GCOMP_OK, name, s,
                 "allreduce", &err);
            if (mode == GCOMP_MPI_PS_SYNC) {
                size_t bad = 0;
                for (size_t i = 0; i < N; i++) {
                    float want = 0;
                    for (int w = 0; w < E->W; w++) want += grad(s, w, i);
                    bad += x[i] != want;
                }
                CHECK_MSG(bad == 0, "%s: session %d: %zu values differ from the sum", name, s, bad);
            }
            /* The last one shuts down and goes on at once to the next session's push. */
            if (E->widx == s % E->W) nap_ms(LAST_MS);
            must(gcomp_mpi_ps_shutdown(ps, TIMEOUT, &err) == GCOMP_OK, name, s, "shutdown", &err);
        }
        free(x);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    if (mc_size < 3) {
        if (mc_rank == 0) printf("test_mpi_ps_race: needs 3 ranks or more\n");
        MPI_Finalize();
        return 1;
    }
    ps_env E;
    ps_env_init(&E, mc_size - 2, 0, TIMEOUT);
    run(&E, GCOMP_MPI_PS_SYNC, "sync");
    run(&E, GCOMP_MPI_PS_ASYNC, "async");
    ps_env_free(&E);
    return mc_done("test_mpi_ps_race");
}

/*
 * test_mpi_ps_bad.c - pushes a server must refuse, and refuses without touching its state
 * (issue 13).  Worker 0 spoils its next push through the library's test hook
 * (gcomp__mpi_ps_test_tamper, after the message was encoded and the frame sealed, so the
 * bytes on the wire are what a corrupting network or a foreign job would send):
 *   1 a payload byte of the gcomp message       GCOMP_E_CHECKSUM
 *   2 a part id that is not a key of the server GCOMP_E_MISMATCH (unknown key)
 *   3 a message of another spec (dense, valid)  GCOMP_E_MISMATCH (wrong fingerprint)
 *   4 a frame header byte                       GCOMP_E_CHECKSUM
 *   5 the round                                 GCOMP_E_MISMATCH
 *   6 a failure marker of status 0 (no failure) GCOMP_E_CORRUPT (it was taken as a push
 *     that carries nothing: the pusher left out of the sum, the round applied)
 * sync (server-side SGD): every worker gets that status for the round; the weights and
 * the update count on the server are those of before (kv.pull), and the next clean round
 * works and gives the weights a replay expects.  async: only worker 0 gets it; the others'
 * pushes are applied; the update count grows by exactly the clean pushes.  Also an init
 * with a NaN value: refused everywhere, nothing stored (a pull then says GCOMP_E_PROTOCOL);
 * then a pull made while the reply to the next init is already on its way to that worker.
 * And a server that owns no part (two servers, one part): its serve refuses at once with
 * GCOMP_E_ARG, naming the cause, where it used to wait for pushes that never come and
 * report a dead job (sync: GCOMP_E_TIMEOUT) after healthy training, and again at a second
 * call; the other server and the workers go on.
 */
#include "test_mpi_ps_common.h"

#define N 3000
#define TIMEOUT 30.0

GCOMP_API gcomp_status gcomp__mpi_ps_test_tamper(gcomp_mpi_bucket *b, int what,
                                                 const char *foreign);

#define TAMPERS 6
static const gcomp_status want[TAMPERS + 1] = {GCOMP_OK,         GCOMP_E_CHECKSUM, GCOMP_E_MISMATCH,
                                               GCOMP_E_MISMATCH, GCOMP_E_CHECKSUM, GCOMP_E_MISMATCH,
                                               GCOMP_E_CORRUPT};

static gcomp_mpi_bucket *make(ps_env *E, gcomp_mpi_ps **ps, int mode) {
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.mode = mode;
    o.update = 1;
    o.optimizer = (gcomp_mpi_ps_optimizer){0.1f, 0.5f, 0.0f, 1.0f, 0};
    o.part_bytes = 4096;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_ps_create(ps, E->world, &o, 30.0, &err));
    gcomp_mpi_tensor t = {"w", "topk:density=0.1,feedback=ef", N, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = *ps;
    gcomp_mpi_bucket *b = NULL;
    CHECK_MSG(gcomp_mpi_bucket_create(&b, E->world, &t, 1, &bo, TIMEOUT, &err) == GCOMP_OK, "%s",
              err.message);
    return b;
}

static void sync_case(ps_env *E) {
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = make(E, &ps, GCOMP_MPI_PS_SYNC);
    if (E->server) {
        ps_serve_ok(ps, TIMEOUT, "sync");
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        /* TAMPERS void rounds of W pushes, the NaN init, W pulls before any init */
        CHECK_MSG(s.refused == (TAMPERS + 1u) * (unsigned)E->W + 1u, "sync: %llu pushes refused",
                  (unsigned long long)s.refused);
    } else {
        gcomp_error err = {0};
        float *x = malloc(N * sizeof(float)), *before = malloc(N * sizeof(float)),
              *after = malloc(N * sizeof(float)), *d[1] = {x}, *pb[1] = {before}, *pa[1] = {after};
        /* an init with a NaN: refused everywhere, nothing stored */
        test_fill(x, N, 1);
        if (E->widx == 0) x[17] = NAN;
        CHECK(gcomp_mpi_ps_init(b, d, TIMEOUT, &err) == GCOMP_E_NONFINITE);
        CHECK(gcomp_mpi_ps_pull(b, pb, TIMEOUT, &err) == GCOMP_E_PROTOCOL);
        CHECK_MSG(strstr(err.message, "pull before any init"), "%s", err.message);
        MPI_Barrier(E->wcomm); /* every pull above answered before the init below */
        /* Only worker 0 sends the init; the server's reply to the others can reach them
         * while they are still in a pull: they pull once the init was served, and the pull
         * gets the stored values, the init its own reply. */
        test_fill(x, N, 1);
        if (E->widx == 0) CHECK_OK(gcomp_mpi_ps_init(b, d, TIMEOUT, &err));
        MPI_Barrier(E->wcomm);
        if (E->widx != 0) {
            CHECK_MSG(gcomp_mpi_ps_pull(b, pb, TIMEOUT, &err) == GCOMP_OK,
                      "a pull with an init reply on its way: %s", err.message);
            CHECK(!memcmp(pb[0], x, N * sizeof(float)));
            CHECK_OK(gcomp_mpi_ps_init(b, d, TIMEOUT, &err));
        }
        for (int what = 1; what <= TAMPERS; what++) {
            CHECK_OK(gcomp_mpi_ps_pull(b, pb, TIMEOUT, &err));
            uint64_t v0 = gcomp_mpi_ps_version(b, 0);
            if (E->widx == 0) CHECK_OK(gcomp__mpi_ps_test_tamper(b, what, "topk:density=0.001"));
            test_fill(x, N, 10ull + (unsigned)what);
            gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err);
            CHECK_MSG(st == want[what], "tamper %d: %s (%s), want %s", what, gcomp_status_str(st),
                      err.message, gcomp_status_str(want[what]));
            CHECK_MSG(gcomp_mpi_comm_status(E->world, NULL) == GCOMP_OK, "tamper %d: comm failed",
                      what);
            /* nothing applied */
            CHECK_OK(gcomp_mpi_ps_pull(b, pa, TIMEOUT, &err));
            CHECK_MSG(!memcmp(before, after, N * sizeof(float)), "tamper %d: weights changed",
                      what);
            CHECK(gcomp_mpi_ps_version(b, 0) == v0);
            /* and the next clean round works */
            test_fill(x, N, 20ull + (unsigned)what);
            CHECK_MSG(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK,
                      "after tamper %d: %s", what, err.message);
            CHECK(gcomp_mpi_ps_version(b, 0) == v0 + 1);
        }
        ps_shutdown_ok(ps, "sync");
        free(x);
        free(before);
        free(after);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

static void async_case(ps_env *E) {
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = make(E, &ps, GCOMP_MPI_PS_ASYNC);
    if (E->server) {
        ps_serve_ok(ps, TIMEOUT, "async");
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        CHECK_MSG(s.refused == TAMPERS &&
                      s.applied == TAMPERS * (unsigned)(E->W - 1) + 2u * (unsigned)E->W,
                  "async: %llu refused, %llu applied", (unsigned long long)s.refused,
                  (unsigned long long)s.applied);
    } else {
        gcomp_error err = {0};
        float *x = malloc(N * sizeof(float)), *d[1] = {x};
        test_fill(x, N, 1);
        CHECK_OK(gcomp_mpi_ps_init(b, d, TIMEOUT, &err));
        for (int what = 1; what <= TAMPERS; what++) {
            if (E->widx == 0) CHECK_OK(gcomp__mpi_ps_test_tamper(b, what, "topk:density=0.001"));
            test_fill(x, N, 30ull + (unsigned)what);
            gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err);
            gcomp_status expect = E->widx == 0 ? want[what] : GCOMP_OK;
            CHECK_MSG(st == expect, "async tamper %d: %s (%s), want %s", what, gcomp_status_str(st),
                      err.message, gcomp_status_str(expect));
        }
        MPI_Barrier(E->wcomm); /* every push of the loop applied or refused */
        for (int k = 0; k < 2; k++) {
            test_fill(x, N, 50ull + (unsigned)k);
            CHECK_OK(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err));
        }
        ps_shutdown_ok(ps, "async");
        free(x);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

/* A parameter-server bucket is not retuned: every rank, servers included, is refused at
 * once with GCOMP_E_UNSUPPORTED (no collective, so nothing waits); the same spec is a no-op,
 * and the bucket works on. */
static void retune_case(ps_env *E) {
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = make(E, &ps, GCOMP_MPI_PS_SYNC);
    gcomp_error err = {0};
    CHECK(gcomp_mpi_bucket_retune(b, 0, "topk:density=0.1,feedback=ef", TIMEOUT, &err) == GCOMP_OK);
    CHECK_MSG(gcomp_mpi_bucket_retune(b, 0, "topk:density=0.2,feedback=ef", TIMEOUT, &err) ==
                      GCOMP_E_UNSUPPORTED &&
                  strstr(err.message, "parameter-server"),
              "retune of a ps bucket: %s", err.message);
    if (E->server) {
        ps_serve_ok(ps, TIMEOUT, "retune");
    } else {
        float *x = calloc(N, sizeof(float)), *d[1] = {x};
        CHECK_MSG(gcomp_mpi_ps_init(b, d, TIMEOUT, &err) == GCOMP_OK, "init: %s", err.message);
        for (int i = 0; i < N; i++) x[i] = 1.0f;
        CHECK_MSG(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK,
                  "after the refused retune: %s", err.message);
        ps_shutdown_ok(ps, "retune");
        free(x);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

static void empty_server_case(ps_env *E) {
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = 2; /* the last two ranks */
    gcomp_error err = {0};
    gcomp_mpi_ps *ps = NULL;
    CHECK_MSG(gcomp_mpi_ps_create(&ps, E->world, &o, 30.0, &err) == GCOMP_OK, "%s", err.message);
    gcomp_mpi_tensor t = {"w", "topk:density=0.1,feedback=ef", 100, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL;
    CHECK_MSG(gcomp_mpi_bucket_create(&b, E->world, &t, 1, &bo, TIMEOUT, &err) == GCOMP_OK, "%s",
              err.message);
    size_t off = 0, n = 0;
    int srv = -1;
    CHECK(gcomp_mpi_ps_part_count(b, 0) == 1 &&
          gcomp_mpi_ps_part(b, 0, 0, &off, &n, &srv) == GCOMP_OK);
    int owner = gcomp_mpi_ps_server_rank(ps, srv), me = gcomp_mpi_ps_is_server(ps);
    if (me && mc_rank != owner) {
        double t0 = MPI_Wtime();
        CHECK_MSG(gcomp_mpi_ps_serve(ps, 2.0, &err) == GCOMP_E_ARG &&
                      strstr(err.message, "owns no part"),
                  "empty server: %s", err.message);
        CHECK(MPI_Wtime() - t0 < 1.0); /* at once, not after the timeout */
        CHECK_MSG(gcomp_mpi_ps_serve(ps, 2.0, &err) == GCOMP_E_ARG &&
                      strstr(err.message, "refused to serve before"),
                  "empty server, again: %s", err.message);
    } else if (me) {
        ps_serve_ok(ps, 2.0, "empty server: the owner");
    } else {
        float x[100], *d[1] = {x};
        for (int i = 0; i < 100; i++) x[i] = (float)i;
        for (int step = 0; step < 5; step++) {
            if (step > 0) { /* 2.4 s of training, no gap near the 2 s timeout */
                double t0 = MPI_Wtime();
                while (MPI_Wtime() - t0 < 0.6) continue;
            }
            CHECK_MSG(gcomp_mpi_allreduce(b, d, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK,
                      "empty server: step %d: %s", step, err.message);
        }
        ps_shutdown_ok(ps, "empty server");
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    ps_env E;
    ps_env_init(&E, 1, 0, TIMEOUT);
    sync_case(&E);
    async_case(&E);
    retune_case(&E);
    empty_server_case(&E);
    ps_env_free(&E);
    return mc_done("test_mpi_ps_bad");
}

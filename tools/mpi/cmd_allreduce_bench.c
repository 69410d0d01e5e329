/*
 * cmd_allreduce_bench.c - `gradcomp allreduce-bench`, run under mpirun: the compressed
 * allreduce of one tensor next to the honest baselines measured in the same job.
 *
 *   compressed   gcomp_mpi_allreduce (SUM) of a seeded synthetic gradient (each rank its
 *                own), compression and decompression included
 *   dense f32    MPI_Allreduce(MPI_FLOAT, MPI_SUM) of the same tensor
 *   dense f16    the tensor cast to f16, MPI_Allreduce with the library's half-sum
 *                MPI_Op, cast back: casts included (what an f16 allreduce costs a trainer)
 * Each time is the maximum over ranks of one call (a collective is as slow as its
 * slowest rank), after a barrier; the median over --runs after --warmup calls.  Bytes are
 * what each rank handed to MPI for its peers (gcomp_mpi_stats), per call.
 *
 * Correctness: after the last run every rank gathers every rank's messages
 * (gcomp_mpi_message), decodes them in rank order in float64, and the maximum
 * |result - that exact sum| over all elements and ranks is reported.  For the owner
 * strategies (sparse, rsag) the owners re-compress and keep the rest in their residuals,
 * so the error is reported twice: as is (what re-compression changed this step) and after
 * adding the owners' residual change (which must be ~0: nothing is lost).  Uses the public
 * headers only, like every CLI command.
 *
 * Every wait is bounded by --timeout.  The library's collectives time out on their own;
 * the tool's bookkeeping around them (the barrier before each timed call, the maximum
 * over ranks, the vote on failures, the gathers of the check) used blocking MPI on
 * MPI_COMM_WORLD, so a dead or stopped peer hung every other rank whatever --timeout said.
 * Each of those is the non-blocking collective and a deadline (wait_bounded, polled like
 * the library's gm_wait_all).  A rank that gives up prints why and sends every other rank a
 * one-int message (TAG_GIVE_UP), so ranks waiting on something else stop at once instead
 * of at their own deadline, waits a moment for the others to say the same, and leaves with
 * _exit: MPI_Finalize would wait for the peer that stalled.  The two dense baselines stay
 * the blocking MPI_Allreduce users compare against (Open MPI runs MPI_Iallreduce through
 * other algorithms, whose times would not be that baseline's): a bounded barrier before
 * each and a watchdog timer (SIGALRM, async-signal-safe write + _exit) around the call
 * bound them instead.  tests/mpi/run_bench_stall.sh stops a rank with SIGSTOP and checks
 * that every other rank reports the timeout and the job ends soon after --timeout.
 *
 * --retune SPEC2 times the live switch (gcomp_mpi_bucket_retune) to SPEC2 and back, each
 * after a call that leaves the compressors something held back: --runs of each, the
 * maximum over ranks, after the measurements above.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep, sigaction, setitimer */
#endif
#include "../cli.h"
#include "gradcomp_mpi.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_args {
    const char *spec, *retune;
    size_t n, rows, cols, runs, warmup, bucket_bytes;
    int strategy, ranks_per_node, json, baseline, check;
    double timeout;
} bench_args;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- bounded waits (top comment) ------------------------------------------------------- */

#define TAG_GIVE_UP 0x6743 /* a peer gave up; the payload is its rank */

static struct {
    double timeout;
    int rank, size;
    MPI_Request peer_req; /* posted receive of TAG_GIVE_UP from any rank */
    int peer;
    char alarm_msg[256];
    size_t alarm_len;
} guard = {300.0, 0, 1, MPI_REQUEST_NULL, -1, "", 0};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void guard_init(double timeout) {
    guard.timeout = timeout;
    MPI_Comm_rank(MPI_COMM_WORLD, &guard.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &guard.size);
    /* An MPI error (a peer's death seen by the transport) is a status to report here, not
     * the default abort of the whole job before anyone could say why. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Irecv(&guard.peer, 1, MPI_INT, MPI_ANY_SOURCE, TAG_GIVE_UP, MPI_COMM_WORLD,
              &guard.peer_req);
}

/* Prints why this rank stops, tells the others, gives them a moment to report their own
 * timeouts (so mpirun, which ends the job at the first exit, does not cut them off), and
 * leaves without MPI_Finalize. */
static void give_up(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void give_up(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gradcomp allreduce-bench: rank %d: ", guard.rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stdout);
    fflush(stderr);
    MPI_Request *req = calloc((size_t)guard.size, sizeof *req);
    int me = guard.rank;
    for (int r = 0; req && r < guard.size; r++) {
        req[r] = MPI_REQUEST_NULL;
        if (r != me) MPI_Isend(&me, 1, MPI_INT, r, TAG_GIVE_UP, MPI_COMM_WORLD, &req[r]);
    }
    double until = now_s() + (guard.timeout < 1.0 ? guard.timeout : 1.0);
    while (req && now_s() < until) {
        int done = 0;
        if (MPI_Testall(guard.size, req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    _exit(1);
}

/* Waits for `req` until --timeout has passed; gives up on a timeout, an MPI error or a
 * peer that gave up.  `what` names the wait in the message. */
static void wait_bounded(MPI_Request *req, const char *what) {
    double t0 = now_s();
    unsigned spins = 0;
    for (;;) {
        int done = 0, peer = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            give_up("%s: an MPI call failed (a peer died?)", what);
        if (done) return;
        if (guard.peer_req != MPI_REQUEST_NULL &&
            MPI_Test(&guard.peer_req, &peer, MPI_STATUS_IGNORE) == MPI_SUCCESS && peer)
            give_up("%s: rank %d timed out or failed and gave up; stopping too", what, guard.peer);
        double waited = now_s() - t0;
        if (waited > guard.timeout)
            give_up("timed out after %.1f s (--timeout %g) in %s: a peer is dead or stalled",
                    waited, guard.timeout, what);
        /* As gm_wait_all: yield first (MPI progresses only inside calls), then short sleeps. */
        if (++spins < 1000 && waited < 0.02) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000L};
            nanosleep(&ts, NULL);
        }
    }
}

static void barrier(const char *what) {
    MPI_Request req;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) give_up("%s: MPI_Ibarrier failed", what);
    wait_bounded(&req, what);
}

/* MPI_Allreduce on MPI_COMM_WORLD, bounded. */
static void allreduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op,
                      const char *what) {
    MPI_Request req;
    if (MPI_Iallreduce(in, out, count, type, op, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        give_up("%s: MPI_Iallreduce failed", what);
    wait_bounded(&req, what);
}

/* The watchdog around a blocking baseline call: after --timeout, print and leave from the
 * signal handler (only async-signal-safe calls there). */
static void on_alarm(int sig) {
    (void)sig;
    ssize_t w = write(2, guard.alarm_msg, guard.alarm_len);
    (void)w;
    _exit(1);
}

static void watchdog_arm(const char *what) {
    int len = snprintf(guard.alarm_msg, sizeof guard.alarm_msg,
                       "gradcomp allreduce-bench: rank %d: timed out after %g s (--timeout) in %s: "
                       "a peer is dead or stalled\n",
                       guard.rank, guard.timeout, what);
    guard.alarm_len = len > 0 && (size_t)len < sizeof guard.alarm_msg ? (size_t)len : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it;
    memset(&it, 0, sizeof it);
    it.it_value.tv_sec = (time_t)guard.timeout;
    it.it_value.tv_usec = (suseconds_t)((guard.timeout - floor(guard.timeout)) * 1e6);
    if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0) it.it_value.tv_usec = 1;
    setitimer(ITIMER_REAL, &it, NULL);
}

static void watchdog_disarm(void) {
    struct itimerval it;
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, NULL);
}

/* Max over ranks of a local time. */
static double max_time(double t) {
    double m;
    allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, "the maximum time over ranks");
    return m;
}

/* 1 when any rank passes 1. */
static int any_rank(int flag, const char *what) {
    int any = 0;
    allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, what);
    return any;
}

/* A library status that means the peers are gone: stop now, the others are told. */
static void give_up_if_peers_gone(gcomp_status st, const gcomp_error *err) {
    const char *msg = err->message[0] ? err->message : gcomp_status_str(st);
    if (st == GCOMP_E_TIMEOUT) give_up("timed out (--timeout %g): %s", guard.timeout, msg);
    if (st == GCOMP_E_MPI || st == GCOMP_E_FAILED) give_up("%s", msg);
}

/* f32 <-> f16 (round to nearest even, saturating), portable; the compiler vectorises it. */
static uint16_t to_f16(float f) {
    if (f > 65504.0f)
        f = 65504.0f;
    else if (f < -65504.0f)
        f = -65504.0f;
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;
    if (ax >= 0x38800000u) {
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u) return sign;
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, sh = 126u - e;
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
}

static float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * (1.0f / 16777216.0f);
        return (h & 0x8000u) ? -f : f;
    }
    x = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &x, 4);
    return f;
}

static int parse(int argc, char **argv, bench_args *a) {
    const char *cmd = "allreduce-bench";
    memset(a, 0, sizeof *a);
    a->runs = 5;
    a->warmup = 1;
    a->baseline = 1;
    a->check = 1;
    a->timeout = 300;
    a->bucket_bytes = (size_t)4 << 20;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool has = i + 1 < argc;
        if ((!strcmp(s, "-c") || !strcmp(s, "--codec")) && has)
            a->spec = argv[++i];
        else if (!strcmp(s, "-n") && has) {
            if (cli_parse_count(argv[++i], &a->n) || !a->n)
                return cli_fail(cmd, 2, "-n %s: expected a positive count (25000000, 25M)",
                                argv[i]);
        } else if (!strcmp(s, "--shape") && has) {
            if (cli_parse_shape(argv[++i], &a->rows, &a->cols))
                return cli_fail(cmd, 2, "--shape %s: expected ROWSxCOLS", argv[i]);
        } else if (!strcmp(s, "--strategy") && has) {
            if (gcomp_mpi_strategy_parse(argv[++i], &a->strategy) != GCOMP_OK)
                return cli_fail(cmd, 2,
                                "--strategy %s: one of auto, allgather, sparse, allreduce, rsag, "
                                "hierarchical[:NAME]",
                                argv[i]);
        } else if (!strcmp(s, "--runs") && has) {
            if (cli_parse_count(argv[++i], &a->runs) || !a->runs || a->runs > 1000)
                return cli_fail(cmd, 2, "--runs %s: expected 1..1000", argv[i]);
        } else if (!strcmp(s, "--warmup") && has) {
            if (cli_parse_count(argv[++i], &a->warmup) || a->warmup > 100)
                return cli_fail(cmd, 2, "--warmup %s: expected 0..100", argv[i]);
        } else if (!strcmp(s, "--bucket-bytes") && has) {
            if (cli_parse_count(argv[++i], &a->bucket_bytes))
                return cli_fail(cmd, 2, "--bucket-bytes %s: expected a count", argv[i]);
        } else if (!strcmp(s, "--ranks-per-node") && has) {
            size_t k;
            if (cli_parse_count(argv[++i], &k) || k > 1u << 20)
                return cli_fail(cmd, 2, "--ranks-per-node %s: expected a count", argv[i]);
            a->ranks_per_node = (int)k;
        } else if (!strcmp(s, "--timeout") && has) {
            char *end;
            a->timeout = strtod(argv[++i], &end);
            if (*end || !(a->timeout > 0))
                return cli_fail(cmd, 2, "--timeout %s: seconds > 0", argv[i]);
        } else if (!strcmp(s, "--retune") && has) {
            a->retune = argv[++i];
        } else if (!strcmp(s, "--json"))
            a->json = 1;
        else if (!strcmp(s, "--no-baseline"))
            a->baseline = 0;
        else if (!strcmp(s, "--no-check"))
            a->check = 0;
        else
            return cli_fail(cmd, 2, "unknown or incomplete option '%s'", s);
    }
    if (!a->spec) return cli_fail(cmd, 2, "-c SPEC is required");
    if (!a->n && a->rows) a->n = a->rows * a->cols;
    if (!a->n) return cli_fail(cmd, 2, "-n N is required");
    if (a->rows && a->rows * a->cols != a->n)
        return cli_fail(cmd, 2, "--shape %zux%zu does not hold -n %zu", a->rows, a->cols, a->n);
    if (a->n > 0x7fffffff) return cli_fail(cmd, 2, "-n %zu: at most 2^31-1 (MPI counts)", a->n);
    return 0;
}

/* Exact reference: every rank's messages, decoded in rank order, summed in float64. */
static int reference(const gcomp_mpi_bucket *b, size_t n, double *ref) {
    int P;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    size_t nm = gcomp_mpi_message_count(b, 0), bytes = 0;
    for (size_t j = 0; j < nm; j++) {
        const void *m;
        size_t len;
        gcomp_mpi_message(b, 0, j, &m, &len, NULL, NULL);
        bytes += 24 + len;
    }
    int bad = bytes > 0x7fffffff;
    uint8_t *mine = malloc(bytes + 1), *p = mine;
    int *counts = malloc(sizeof(int) * (size_t)P), *displs = malloc(sizeof(int) * (size_t)P);
    bad |= !mine || !counts || !displs;
    int anybad = any_rank(bad, "the check's allocation vote");
    if (anybad) {
        free(mine);
        free(counts);
        free(displs);
        return -1;
    }
    for (size_t j = 0; j < nm; j++) {
        const void *m;
        size_t len, off, cnt;
        gcomp_mpi_message(b, 0, j, &m, &len, &off, &cnt);
        uint64_t h[3] = {off, cnt, len};
        memcpy(p, h, 24);
        memcpy(p + 24, m, len);
        p += 24 + len;
    }
    int my = (int)bytes;
    MPI_Request req;
    if (MPI_Iallgather(&my, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        give_up("gathering message sizes: MPI_Iallgather failed");
    wait_bounded(&req, "gathering the message sizes for the check");
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        displs[r] = (int)total;
        total += (size_t)counts[r];
    }
    uint8_t *all = total < 0x7fffffff ? malloc(total + 1) : NULL;
    float *tmp = malloc(n * sizeof(float));
    bad = !all || !tmp;
    anybad = any_rank(bad, "the check's allocation vote");
    int rc = 0;
    if (!anybad) {
        if (MPI_Iallgatherv(mine, my, MPI_BYTE, all, counts, displs, MPI_BYTE, MPI_COMM_WORLD,
                            &req) != MPI_SUCCESS)
            give_up("gathering messages: MPI_Iallgatherv failed");
        wait_bounded(&req, "gathering every rank's messages for the check");
        for (size_t i = 0; i < n; i++) ref[i] = 0;
        for (size_t q = 0; q < total;) {
            uint64_t h[3];
            memcpy(h, all + q, 24);
            memset(tmp, 0, h[1] * sizeof(float));
            if (h[0] + h[1] > n ||
                gcomp_decode_add(all + q + 24, h[2], tmp, h[1], 1.0f) != GCOMP_OK)
                rc = -1;
            for (size_t i = 0; i < h[1] && !rc; i++) ref[h[0] + i] += tmp[i];
            q += 24 + h[2];
        }
    } else {
        rc = -1;
    }
    free(all);
    free(tmp);
    free(mine);
    free(counts);
    free(displs);
    return rc;
}

/* A copy of this rank's owner residual of tensor 0 (NULL, 0 when it keeps none). */
static float *owner_residual(const gcomp_mpi_bucket *b, size_t *off, size_t *cnt) {
    const float *res;
    gcomp_mpi_owner_residual(b, 0, &res, off, cnt);
    if (!res || !*cnt) return NULL;
    float *copy = malloc(*cnt * sizeof(float));
    if (copy) memcpy(copy, res, *cnt * sizeof(float));
    return copy;
}

/* PowerSGD's residual E on this rank (zeros where this rank holds no compressor). */
static float *lowrank_residual(const gcomp_mpi_bucket *b, size_t n) {
    float *e = calloc(n, sizeof(float));
    gcomp_compressor *c = gcomp_mpi_compressor(b, 0);
    if (e && c && gcomp_lowrank_residual(c, e) != GCOMP_OK) memset(e, 0, n * sizeof(float));
    return e;
}

typedef struct bench_out {
    double t_med, t_min, t_max, f32_med, f16_med, sent_max, sent_min, recv_max;
    double codec_ms, wire_ms, overlap_ms, err, err_conserved, max_sum;
    long messages;
    int checked, conserved;
    double sw[2][3]; /* the switch to --retune and back: median, min, max */
} bench_out;

static int run(const bench_args *a, int rank, int size) {
    const char *cmd = "allreduce-bench";
    gcomp_error err = {0};
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.timeout_s = a->timeout;
    o.ranks_per_node = a->ranks_per_node;
    gcomp_mpi_comm *comm = NULL;
    gcomp_mpi_bucket *b = NULL;
    gcomp_status cst = gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, &o, a->timeout, &err);
    if (cst != GCOMP_OK) {
        give_up_if_peers_gone(cst, &err);
        return cli_fail(cmd, 1, "rank %d: %s", rank, err.message);
    }
    gcomp_mpi_tensor t = {"tensor", a->spec, a->n, a->rows, a->cols, a->strategy};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.bucket_bytes = a->bucket_bytes;
    if ((cst = gcomp_mpi_bucket_create(&b, comm, &t, 1, &bo, a->timeout, &err)) != GCOMP_OK) {
        give_up_if_peers_gone(cst, &err);
        if (rank == 0) cli_fail(cmd, 2, "%s", err.message);
        gcomp_mpi_comm_free(comm);
        return 2;
    }
    size_t n = a->n, R = a->runs, W = a->warmup;
    float *g = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
    double *times = malloc(R * sizeof(double)), *tf = malloc(R * sizeof(double)),
           *th = malloc(R * sizeof(double));
    int bad = !g || !x || !times || !tf || !th;
    int anybad = any_rank(bad, "the allocation vote");
    int rc = 0;
    bench_out r = {0};
    double *ref = NULL;
    float *res0 = NULL, *e0 = NULL;
    char cname[64];
    snprintf(cname, sizeof cname, "%.*s", (int)strcspn(a->spec, ":"), a->spec);
    const gcomp_codec_info *ci = gcomp_codec_find(cname);
    int lowrank = ci && (ci->flags & GCOMP_CODEC_MULTIPHASE);
    size_t roff = 0, rcnt = 0;
    uint16_t *h = NULL;
    if (anybad) {
        rc = cli_fail(cmd, 1, "out of memory for n = %zu", n);
        goto out;
    }
    cli_synthetic_gradient(g, n, 1000003u + (unsigned)rank, 0);
    memcpy(x, g, n * sizeof(float)); /* touch every page before timing */

    /* the compressed allreduce */
    if (a->check) ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < W + R; i++) {
        if (i == W) gcomp_mpi_stats_reset(b);
        if (i + 1 == W + R && ref) res0 = owner_residual(b, &roff, &rcnt);
        if (i + 1 == W + R && ref && lowrank) e0 = lowrank_residual(b, n);
        memcpy(x, g, n * sizeof(float));
        float *d = x;
        barrier("the barrier before a timed call");
        double t0 = MPI_Wtime();
        gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, a->timeout, &err);
        double t1 = MPI_Wtime();
        give_up_if_peers_gone(st, &err);
        double dt = max_time(t1 - t0);
        int fail = st != GCOMP_OK;
        int anyfail = any_rank(fail, "the vote on the call's status");
        if (anyfail) {
            if (fail) cli_fail(cmd, 1, "rank %d: %s", rank, err.message);
            rc = 1;
            goto out;
        }
        if (i >= W) times[i - W] = dt;
    }
    gcomp_mpi_stats s;
    gcomp_mpi_stats_get(b, (size_t)-1, &s);
    double sent = (double)s.bytes_sent / (double)R, recv = (double)s.bytes_received / (double)R;
    allreduce(&sent, &r.sent_max, 1, MPI_DOUBLE, MPI_MAX, "the traffic figures");
    allreduce(&sent, &r.sent_min, 1, MPI_DOUBLE, MPI_MIN, "the traffic figures");
    allreduce(&recv, &r.recv_max, 1, MPI_DOUBLE, MPI_MAX, "the traffic figures");
    double loc[3] = {1e-6 * (double)s.codec_ns / (double)R, 1e-6 * (double)s.wire_ns / (double)R,
                     1e-6 * (double)s.overlap_ns / (double)R},
           mx[3];
    allreduce(loc, mx, 3, MPI_DOUBLE, MPI_MAX, "the time figures");
    r.codec_ms = mx[0];
    r.wire_ms = mx[1];
    r.overlap_ms = mx[2];
    r.t_min = times[0];
    r.t_max = times[0];
    for (size_t i = 0; i < R; i++) {
        if (times[i] < r.t_min) r.t_min = times[i];
        if (times[i] > r.t_max) r.t_max = times[i];
    }
    r.t_med = median(times, R);

    /* correctness of the last run */
    if (a->check && ref) {
        long nm = (long)gcomp_mpi_message_count(b, 0), all_nm;
        allreduce(&nm, &all_nm, 1, MPI_LONG, MPI_SUM, "counting the messages");
        r.messages = all_nm;
        int ok = 0;
        if (lowrank) {
            /* PowerSGD sends no messages; what it keeps is its residual E, so
             * sum(grad) + sum(E before) - sum(E after) is what the result must be. */
            float *e1 = lowrank_residual(b, n);
            for (size_t i = 0; i < n; i++)
                ref[i] = (double)g[i] + (e0 ? e0[i] : 0.0) - (e1 ? e1[i] : 0.0);
            allreduce(MPI_IN_PLACE, ref, (int)n, MPI_DOUBLE, MPI_SUM, "the exact reference sum");
            free(e1);
            ok = 1;
        } else if (all_nm > 0) {
            ok = reference(b, n, ref) == 0;
        } else if (gcomp_mpi_bucket_strategy(b, 0) & GCOMP_MPI_HIERARCHICAL) {
            /* one node: the exact dense sum of the inputs is the reference */
            for (size_t i = 0; i < n; i++) ref[i] = g[i];
            allreduce(MPI_IN_PLACE, ref, (int)n, MPI_DOUBLE, MPI_SUM, "the exact reference sum");
            ok = 1;
        }
        if (ok) {
            int strat = gcomp_mpi_bucket_strategy(b, 0) & 0xff;
            r.conserved = strat == GCOMP_MPI_SPARSE || strat == GCOMP_MPI_RSAG;
            double e = 0, ec = 0, ms = 0;
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)x[i] - ref[i]);
                if (d > e) e = d;
                if (fabs(ref[i]) > ms) ms = fabs(ref[i]);
            }
            /* Each owner checks its own region: result + residual change = exact sum. */
            const float *res1;
            size_t off1, cnt1;
            gcomp_mpi_owner_residual(b, 0, &res1, &off1, &cnt1);
            for (size_t i = 0; res1 && i < cnt1; i++) {
                double before = res0 && off1 == roff && cnt1 == rcnt ? res0[i] : 0.0;
                double d = fabs((double)x[off1 + i] + ((double)res1[i] - before) - ref[off1 + i]);
                if (d > ec) ec = d;
            }
            allreduce(&e, &r.err, 1, MPI_DOUBLE, MPI_MAX, "the error figures");
            allreduce(&ec, &r.err_conserved, 1, MPI_DOUBLE, MPI_MAX, "the error figures");
            allreduce(&ms, &r.max_sum, 1, MPI_DOUBLE, MPI_MAX, "the error figures");
            r.checked = 1;
        }
    }

    /* the baselines, same tensor, same job */
    if (a->baseline) {
        h = malloc(n * sizeof(uint16_t));
        if (any_rank(!h, "the allocation vote")) {
            rc = cli_fail(cmd, 1, "out of memory for the baselines");
            goto out;
        }
        MPI_Op half = gcomp_mpi_half_sum_op(comm, 0);
        for (size_t i = 0; i < W + R; i++) {
            memcpy(x, g, n * sizeof(float));
            barrier("the barrier before a dense f32 call");
            watchdog_arm("the dense f32 MPI_Allreduce");
            double t0 = MPI_Wtime();
            int mrc = MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t1 = MPI_Wtime();
            watchdog_disarm();
            if (mrc != MPI_SUCCESS) give_up("the dense f32 MPI_Allreduce failed (a peer died?)");
            double dt = max_time(t1 - t0);
            if (i >= W) tf[i - W] = dt;
        }
        for (size_t i = 0; i < W + R; i++) {
            barrier("the barrier before a dense f16 call");
            watchdog_arm("the dense f16 MPI_Allreduce");
            double t0 = MPI_Wtime();
            for (size_t k = 0; k < n; k++) h[k] = to_f16(g[k]);
            int mrc = MPI_Allreduce(MPI_IN_PLACE, h, (int)n, MPI_UINT16_T, half, MPI_COMM_WORLD);
            for (size_t k = 0; k < n; k++) x[k] = from_f16(h[k]);
            double t1 = MPI_Wtime();
            watchdog_disarm();
            if (mrc != MPI_SUCCESS) give_up("the dense f16 MPI_Allreduce failed (a peer died?)");
            double dt = max_time(t1 - t0);
            if (i >= W) th[i - W] = dt;
        }
        r.f32_med = median(tf, R);
        r.f16_med = median(th, R);
    }

    /* the switch to --retune and back, each after a call */
    if (a->retune) {
        double *ts[2] = {tf, th};
        for (size_t i = 0; i < 2 * R; i++) {
            memcpy(x, g, n * sizeof(float));
            float *d = x;
            gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, a->timeout, &err);
            give_up_if_peers_gone(st, &err);
            if (st == GCOMP_OK) {
                barrier("the barrier before a timed retune");
                double t0 = MPI_Wtime();
                st = gcomp_mpi_bucket_retune(b, 0, i % 2 ? a->spec : a->retune, a->timeout, &err);
                ts[i % 2][i / 2] = max_time(MPI_Wtime() - t0);
                give_up_if_peers_gone(st, &err);
            }
            int fail = st != GCOMP_OK;
            if (any_rank(fail, "the vote on the retune's status")) {
                if (fail)
                    cli_fail(cmd, 1, "rank %d: --retune %s: %s", rank, a->retune, err.message);
                rc = 1;
                goto out;
            }
        }
        for (int k = 0; k < 2; k++) {
            r.sw[k][0] = median(ts[k], R);
            r.sw[k][1] = r.sw[k][2] = ts[k][0];
            for (size_t i = 0; i < R; i++) {
                if (ts[k][i] < r.sw[k][1]) r.sw[k][1] = ts[k][i];
                if (ts[k][i] > r.sw[k][2]) r.sw[k][2] = ts[k][i];
            }
        }
    }

    if (rank == 0) {
        int strat = gcomp_mpi_bucket_strategy(b, 0);
        char canon[512] = "";
        gcomp_spec_canonical(a->spec, canon, sizeof canon, NULL, NULL);
        if (a->json) {
            printf("{\"spec\": \"%s\", \"canonical\": \"%s\", \"strategy\": \"%s\", \"n\": %zu, "
                   "\"rows\": %zu, \"cols\": %zu, \"ranks\": %d, \"nodes\": %d, \"runs\": %zu, "
                   "\"time_ms\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}, "
                   "\"bytes_sent_per_rank\": {\"max\": %.0f, \"min\": %.0f}, "
                   "\"bytes_received_per_rank_max\": %.0f, "
                   "\"codec_ms\": %.3f, \"wire_ms\": %.3f, \"overlap_ms\": %.3f",
                   a->spec, canon, gcomp_mpi_strategy_name(strat), n, a->rows, a->cols, size,
                   gcomp_mpi_comm_nodes(comm), R, 1e3 * r.t_med, 1e3 * r.t_min, 1e3 * r.t_max,
                   r.sent_max, r.sent_min, r.recv_max, r.codec_ms, r.wire_ms, r.overlap_ms);
            if (a->baseline)
                printf(
                    ", \"dense_f32_ms\": %.3f, \"dense_f16_ms\": %.3f, \"dense_f32_bytes\": %.0f, "
                    "\"speedup_vs_f32\": %.2f, \"speedup_vs_f16\": %.2f",
                    1e3 * r.f32_med, 1e3 * r.f16_med, 4.0 * (double)n, r.f32_med / r.t_med,
                    r.f16_med / r.t_med);
            if (r.checked)
                printf(", \"max_abs_err\": %.6g, \"max_abs_err_with_owner_residual\": %.6g, "
                       "\"max_abs_sum\": %.6g, \"messages\": %ld",
                       r.err, r.conserved ? r.err_conserved : r.err, r.max_sum, r.messages);
            if (a->retune)
                printf(", \"retune\": \"%s\", \"retune_ms\": {\"median\": %.3f, \"min\": %.3f, "
                       "\"max\": %.3f}, \"retune_back_ms\": {\"median\": %.3f, \"min\": %.3f, "
                       "\"max\": %.3f}",
                       a->retune, 1e3 * r.sw[0][0], 1e3 * r.sw[0][1], 1e3 * r.sw[0][2],
                       1e3 * r.sw[1][0], 1e3 * r.sw[1][1], 1e3 * r.sw[1][2]);
            printf("}\n");
        } else {
            printf("allreduce-bench: %s, strategy %s, n = %zu", canon,
                   gcomp_mpi_strategy_name(strat), n);
            if (a->rows) printf(" (%zux%zu)", a->rows, a->cols);
            printf(", %d ranks on %d node(s), median of %zu runs (max over ranks)\n", size,
                   gcomp_mpi_comm_nodes(comm), R);
            printf("  compressed  %10.2f ms  (min %.2f, max %.2f)  sent/rank %.0f B (min %.0f)\n",
                   1e3 * r.t_med, 1e3 * r.t_min, 1e3 * r.t_max, r.sent_max, r.sent_min);
            printf("              codec %.2f ms, wire %.2f ms, overlap %.2f ms per call (max over "
                   "ranks)\n",
                   r.codec_ms, r.wire_ms, r.overlap_ms);
            if (a->baseline) {
                printf("  dense f32   %10.2f ms  MPI_Allreduce (MPI_FLOAT)             x%.1f\n",
                       1e3 * r.f32_med, r.f32_med / r.t_med);
                printf("  dense f16   %10.2f ms  MPI_Allreduce (half-sum op, casts in) x%.1f\n",
                       1e3 * r.f16_med, r.f16_med / r.t_med);
            }
            if (r.checked) {
                printf("  correctness max |result - exact sum of %s| = %.3g (max |sum| %.3g)\n",
                       lowrank ? "gradients + residual change (PowerSGD)" : "decoded messages",
                       r.err, r.max_sum);
                if (r.conserved)
                    printf("              with the owners' residual change added: %.3g\n",
                           r.err_conserved);
            } else if (a->check) {
                printf("  correctness not checked (no messages to gather for this codec)\n");
            }
            if (a->retune)
                printf(
                    "  retune      %10.2f ms  (min %.2f, max %.2f) to %s; back %.2f ms (min %.2f, "
                    "max %.2f)\n",
                    1e3 * r.sw[0][0], 1e3 * r.sw[0][1], 1e3 * r.sw[0][2], a->retune,
                    1e3 * r.sw[1][0], 1e3 * r.sw[1][1], 1e3 * r.sw[1][2]);
        }
        fflush(stdout);
    }
out:
    free(g);
    free(x);
    free(h);
    free(times);
    free(tf);
    free(th);
    free(ref);
    free(res0);
    free(e0);
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_comm_free(comm);
    return rc;
}

int cmd_allreduce_bench(int argc, char **argv) {
    int inited = 0, provided, rank = 0, size = 1;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    bench_args a;
    int rc = parse(argc, argv, &a);
    guard_init(rc == 0 ? a.timeout : 300.0);
    if (rc == 0) rc = run(&a, rank, size);
    int worst = rc;
    allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, "the final status vote");
    if (guard.peer_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&guard.peer_req);
        MPI_Wait(&guard.peer_req, MPI_STATUS_IGNORE);
    }
    if (!inited) MPI_Finalize();
    return worst;
}

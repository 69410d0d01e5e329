/*
 * mpi_adapt.c - what adaptive compression needs from MPI (gradcomp_mpi.h): the allgather
 * of every rank's statistics at a decision point, and a measurement of the link.
 *
 * Decide: the controllers (src/adapt) must see every rank's statistics and combine them in
 * rank order (see adapt.c for why a floating-point allreduce would not do), so each rank's
 * block is allgathered - first the block lengths, so ranks running other configurations
 * fail together instead of passing MPI mismatched counts, then the blocks.  Both
 * collectives run on the communicator's own duplicate, never on a bucket's data
 * communicator, non-blocking with the usual deadline.
 *
 * Probe: steps of a ring, timed: each rank sends a message to rank + 1 and receives one
 * from rank - 1 at once, after a barrier: chains of 8-byte steps back to back (the latency
 * a ring step pays), then steps of bytes/2 and `bytes`: bandwidth = (bytes - bytes/2) /
 * (t_big - t_half), the payload rate of this rank's link in each direction, which is what
 * the cost model's alpha-beta laws take.  Three rounds of each.  Rejected: timing an
 * MPI_Allreduce (its algorithm, and so its traffic law, is Open MPI's choice: 1.5-1.9x off
 * the ring on the netsim links, docs/NETSIM.md) and reading the buckets' wire time alone
 * (it includes waiting for late peers and, for compressed exchanges, messages too small to
 * show the bandwidth at all - a link that got faster would never be noticed).
 */
#include "mpi_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define PROBE_TAG 0x6770 /* "gp" */

/* Waits for n heap requests; their buffers are freed, or kept by the communicator when the
 * wait failed (MPI may still write them). */
static gcomp_status settle(gcomp_mpi_comm *c, MPI_Request *req, int n, void **bufs, size_t nb,
                           uint64_t deadline, const char *what, gcomp_error *err) {
    gcomp_status st = gm_wait_all(c, req, n, deadline, what, err);
    if (st != GCOMP_OK) {
        void **keep = gm_calloc(nb + 1, sizeof *keep);
        if (keep) {
            memcpy(keep, bufs, nb * sizeof *keep);
            gm_comm_bury(c, req, n, keep, nb, NULL, 0);
        } /* else leaked on purpose */
        return st;
    }
    for (size_t k = 0; k < nb; k++) gm_free(bufs[k]);
    gm_free(req);
    return GCOMP_OK;
}

/* Waits for one collective writing into b0 and b1 (b1 may be NULL) and frees req.  On
 * failure MPI may still write them: the communicator keeps them with the request. */
static gcomp_status wait_one(gcomp_mpi_comm *c, MPI_Request *req, void *b0, void *b1,
                             uint64_t deadline, const char *what, gcomp_error *err) {
    gcomp_status st = gm_wait_all(c, req, 1, deadline, what, err);
    if (st == GCOMP_OK) {
        gm_free(req);
        return GCOMP_OK;
    }
    void **bufs = gm_calloc(2, sizeof *bufs);
    if (bufs) { /* else leaked on purpose */
        bufs[0] = b0;
        bufs[1] = b1;
        gm_comm_bury(c, req, 1, bufs, b1 ? 2 : 1, NULL, 0);
    }
    return st;
}

gcomp_status gcomp_mpi_adapt_decide(gcomp_mpi_comm *c, gcomp_adapt *a, double timeout_s,
                                    size_t *changed, gcomp_error *err) {
    if (changed) *changed = 0;
    gcomp_status st = gm_comm_check(c, err);
    if (st != GCOMP_OK) return st;
    if (!a) return gm_fail(err, GCOMP_E_ARG, "adapt: NULL controller");
    uint64_t deadline = gm_deadline(c, timeout_s);
    size_t len = gcomp_adapt_stats_size(a), P = (size_t)c->size;
    if (len > (size_t)INT32_MAX / (P ? P : 1))
        return gm_fail(err, GCOMP_E_LIMIT, "adapt: statistics too large for MPI counts");
    uint64_t *lens = gm_calloc(P + 1, sizeof *lens);
    MPI_Request *req = gm_calloc(1, sizeof *req);
    if (!lens || !req) {
        gm_free(lens);
        gm_free(req);
        return gm_fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    }
    lens[P] = len;
    int rc = MPI_Iallgather(lens + P, 1, MPI_UINT64_T, lens, 1, MPI_UINT64_T, c->comm, req);
    if (rc != MPI_SUCCESS) {
        gm_free(lens);
        gm_free(req);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Iallgather (adaptive statistics sizes)");
    }
    st = wait_one(c, req, lens, NULL, deadline, "adaptive decision (sizes)", err);
    if (st != GCOMP_OK) return st;
    size_t bad = P;
    for (size_t r = 0; r < P; r++)
        if (lens[r] != len) bad = r;
    gm_free(lens);
    if (bad < P)
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "adapt: rank %zu sends statistics of another size: the ranks run different "
                       "adaptive methods or models",
                       bad);
    double *mine = gm_alloc((len + 1) * sizeof(double)),
           *all = gm_alloc((P * len + 1) * sizeof(double));
    req = gm_calloc(1, sizeof *req);
    if (!mine || !all || !req) {
        gm_free(mine);
        gm_free(all);
        gm_free(req);
        return gm_fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    }
    size_t got;
    gcomp_adapt_stats(a, mine, len, &got);
    rc = MPI_Iallgather(mine, (int)len, MPI_DOUBLE, all, (int)len, MPI_DOUBLE, c->comm, req);
    if (rc != MPI_SUCCESS) {
        gm_free(mine);
        gm_free(all);
        gm_free(req);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Iallgather (adaptive statistics)");
    }
    st = wait_one(c, req, mine, all, deadline, "adaptive decision (statistics)", err);
    if (st != GCOMP_OK) return st;
    gm_free(mine);
    st = gcomp_adapt_decide(a, all, len, c->size, changed, err);
    gm_free(all);
    return st;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* v[0..n) <- its maximum over the ranks (collective, within the deadline). */
static gcomp_status probe_max(gcomp_mpi_comm *c, double *v, int n, uint64_t deadline,
                              gcomp_error *err) {
    double *buf = gm_alloc((size_t)n * sizeof *buf);
    MPI_Request *req = gm_calloc(1, sizeof *req);
    if (!buf || !req) {
        gm_free(buf);
        gm_free(req);
        return gm_fail(err, GCOMP_E_NOMEM, "probe: out of memory");
    }
    memcpy(buf, v, (size_t)n * sizeof *buf);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_MAX, c->comm, req);
    if (rc != MPI_SUCCESS) {
        gm_free(buf);
        gm_free(req);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Iallreduce (link probe)");
    }
    gcomp_status st = wait_one(c, req, buf, NULL, deadline, "link probe (times)", err);
    if (st != GCOMP_OK) return st;
    memcpy(v, buf, (size_t)n * sizeof *buf);
    gm_free(buf);
    return GCOMP_OK;
}

/* Waits for every rank to arrive (the barrier that starts a timed step). */
static gcomp_status probe_barrier(gcomp_mpi_comm *c, uint64_t deadline, gcomp_error *err) {
    MPI_Request *req = gm_calloc(1, sizeof *req);
    if (!req) return gm_fail(err, GCOMP_E_NOMEM, "probe: out of memory");
    int rc = MPI_Ibarrier(c->comm, req);
    if (rc != MPI_SUCCESS) {
        gm_free(req);
        return gm_comm_mpi_fail(c, err, rc, "MPI_Ibarrier (link probe)");
    }
    gcomp_status st = gm_wait_all(c, req, 1, deadline, "link probe (barrier)", err);
    if (st != GCOMP_OK) {
        void **none = gm_calloc(1, sizeof *none);
        if (none) gm_comm_bury(c, req, 1, none, 0, NULL, 0);
        return st;
    }
    gm_free(req);
    return GCOMP_OK;
}

/* One ring step: nb bytes to `next` while nb come from `prev`. */
static gcomp_status ring_step(gcomp_mpi_comm *c, size_t nb, int next, int prev, uint64_t deadline,
                              gcomp_error *err) {
    uint8_t *sb = gm_calloc(nb, 1), *rb = gm_alloc(nb);
    MPI_Request *req = gm_calloc(2, sizeof *req);
    if (!sb || !rb || !req) {
        gm_free(sb);
        gm_free(rb);
        gm_free(req);
        return gm_fail(err, GCOMP_E_NOMEM, "probe: out of memory");
    }
    void *bufs[2] = {sb, rb};
    req[0] = req[1] = MPI_REQUEST_NULL; /* zeroed memory is no request handle */
    int rc = MPI_Irecv(rb, (int)nb, MPI_BYTE, prev, PROBE_TAG, c->comm, &req[0]);
    if (rc != MPI_SUCCESS) { /* nothing in flight */
        gm_free(sb);
        gm_free(rb);
        gm_free(req);
        return gm_comm_mpi_fail(c, err, rc, "link probe");
    }
    rc = MPI_Isend(sb, (int)nb, MPI_BYTE, next, PROBE_TAG, c->comm, &req[1]);
    if (rc != MPI_SUCCESS) { /* the receive is posted: the communicator keeps it */
        gm_comm_mpi_fail(c, err, rc, "link probe");
        void **keep = gm_calloc(2, sizeof *keep);
        if (keep) {
            keep[0] = sb;
            keep[1] = rb;
            gm_comm_bury(c, req, 1, keep, 2, NULL, 0);
        }
        return GCOMP_E_MPI;
    }
    return settle(c, req, 2, bufs, 2, deadline, "link probe", err);
}

#define PROBE_CHAIN 5 /* 8-byte ring steps back to back: the latency's chain */
#define PROBE_GROW 4  /* a probe too short against the latency grows by this, twice at most */

/* One pass: an untimed step of `bytes`, then (with `lat`) three 8-byte steps and three
 * chains, then three pairs of bytes/2 and bytes, each after a barrier; t[size][rep] the
 * slowest rank's seconds, sorted within each size (0: 8 bytes, 1: half, 2: bytes, 3:
 * chain). */
static gcomp_status probe_pass(gcomp_mpi_comm *c, size_t bytes, bool lat, uint64_t deadline,
                               double t[4][3], gcomp_error *err) {
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    const size_t sizes[4] = {8, bytes / 2, bytes, 8};
    static const signed char order[][2] = {{-1, 0}, {0, 0}, {0, 1}, {0, 2}, {3, 0}, {3, 1}, {3, 2},
                                           {1, 0},  {2, 0}, {1, 1}, {2, 1}, {1, 2}, {2, 2}};
    memset(t, 0, 12 * sizeof(double));
    gcomp_status st;
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
        int size = order[o][0], rep = order[o][1];
        if (!lat && (size == 0 || size == 3)) continue;
        size_t nb = size < 0 ? bytes : sizes[size];
        if ((st = probe_barrier(c, deadline, err)) != GCOMP_OK) return st;
        uint64_t t0 = gm_now_ns();
        for (int k = 0; k < (size == 3 ? PROBE_CHAIN : 1); k++)
            if ((st = ring_step(c, nb, next, prev, deadline, err)) != GCOMP_OK) return st;
        if (size < 0) continue;
        t[size][rep] = 1e-9 * (double)(gm_now_ns() - t0);
    }
    if ((st = probe_max(c, &t[0][0], 12, deadline, err)) != GCOMP_OK) return st;
    for (int size = 0; size < 4; size++) qsort(t[size], 3, sizeof(double), cmp_double);
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_link_probe(gcomp_mpi_comm *c, size_t bytes, double timeout_s,
                                  double *bandwidth, double *latency, gcomp_error *err) {
    if (bandwidth) *bandwidth = 0;
    if (latency) *latency = 0;
    gcomp_status st = gm_comm_check(c, err);
    if (st != GCOMP_OK) return st;
    if (!bandwidth || !latency || bytes < 1024 || bytes > ((size_t)1 << 30))
        return gm_fail(err, GCOMP_E_ARG, "probe: bytes 1 KiB..1 GiB, outputs not NULL");
    if (c->size < 2) return GCOMP_OK; /* no link to measure */
    uint64_t deadline = gm_deadline(c, timeout_s);
    /* The untimed step empties a shaper's burst (it lets a burst pass at the wire's speed -
     * tbf's bucket, 256 KiB in scripts/netsim): timed against 8 bytes from an idle link,
     * one 512 KiB step read up to 1.8x the shaped rate; the difference of two large sizes
     * cancels what every step costs to start.
     * A step lasts until its slowest rank is done.  One rank's own clock is not enough: a
     * rank that leaves the barrier after its neighbour finds part of its message already
     * there and reads the link as faster than it is, by however late it was (on netsim,
     * a 10 Mbit/s link up to 4x).  The slowest rank's time gains from a late rank, queueing
     * or a retransmission, and loses only where the link sat idle before the step (a rank
     * late to send) and the bucket refilled: the pairs' first steps spend that, so of the
     * bytes/2 steps the median counts, of the `bytes` steps, which follow them, the
     * fastest.  (The fastest of either alone read a 10 Mbit/s link 32-38 % fast in
     * training: 0.49 s, then 0.39 s, for a 0.44 s step; the median of both, a 100 Mbit/s
     * link half as fast: two of three 44 ms steps took 63-67 ms.)
     * For the same reason one 8-byte step reads about two latencies, the barrier's skew
     * and the step: on netsim with 5 ms one way, 10.2 ms on 2 ranks and 12.6 ms on 4.  In a
     * chain every step waits for the one before it on the previous rank, so the skew is
     * paid once: the latency is the chain's time less one step's, per step after the
     * first, of the fastest of each (a stall only adds: over gloo one chain in three read
     * 2-4 ms on an unshaped 100 Mbit/s link whose steps take 0.05 ms).
     * A `bytes` step shorter than twenty latencies measures TCP's window and the shaper's
     * refilled burst more than the link: with 5 ms one way a 512 KiB probe read 100 Mbit/s
     * from -43 % to +21 % and 1 Gbit/s from -54 % to +36 %, where 1 and 2 MiB read them
     * within 2 % (at ten latencies, 100 Mbit/s's 49 ms step sat on the line and one probe
     * in two grew).  Such a probe grows fourfold and measures the pairs again, twice at
     * most. */
    double t[4][3];
    if ((st = probe_pass(c, bytes, true, deadline, t, err)) != GCOMP_OK) return st;
    double small = t[0][1], per = (t[3][0] - t[0][0]) / (PROBE_CHAIN - 1);
    *latency = per > 0 ? per : small;
    for (int grow = 0;
         grow < 2 && t[2][0] < 20 * *latency && bytes <= ((size_t)1 << 30) / PROBE_GROW; grow++) {
        bytes *= PROBE_GROW;
        if ((st = probe_pass(c, bytes, false, deadline, t, err)) != GCOMP_OK) return st;
    }
    double half = t[1][1], big = t[2][0];
    *bandwidth = big > half    ? (double)(bytes - bytes / 2) / (big - half)
                 : big > small ? (double)(bytes - 8) / (big - small)
                               : (double)bytes / big;
    return GCOMP_OK;
}

/*
 * mpi_adapt.c - what adaptive compression needs from MPI (gradcomp_mpi.h): the allgather
 * of every rank's statistics at a decision point, and a measurement of the link.
 *
 * Decide: the controllers (src/adapt) must see every rank's statistics and combine them in
 * rank order (see adapt.c for why a floating-point allreduce would not do), so each rank's
 * block is allgathered - after an agreement on the block length and every rank's
 * readiness, so ranks running other configurations, or short of memory, fail together
 * instead of passing MPI mismatched counts; then an agreement on the outcome.  All run on
 * the communicator's own duplicate, never on a bucket's data communicator, non-blocking
 * with the usual deadline.
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

/* One round of agreement on two words (gm_comm_agree). */
static gcomp_status agree(gcomp_mpi_comm *c, uint64_t w0, uint64_t w1, uint64_t out[2],
                          uint64_t deadline, const char *what, gcomp_error *err) {
    const uint64_t in[2] = {w0, w1};
    return gm_comm_agree(c, in, 2, out, deadline, what, err);
}

/* Every failure is every rank's.  Three collectives: an agreement on the statistics' size
 * and on each rank's readiness (everything is allocated before it, so a rank short of
 * memory says so there instead of leaving the others waiting), the allgather of the
 * statistics, and an agreement on the decision's outcome: the controllers allocate as they
 * decide, and a rank whose decision failed while the others' stood would go on with other
 * specs, so then every rank whose decision stood puts back the state it had before it
 * (saved just before), and all return the failure. */
gcomp_status gcomp_mpi_adapt_decide(gcomp_mpi_comm *c, gcomp_adapt *a, double timeout_s,
                                    size_t *changed, gcomp_error *err) {
    if (changed) *changed = 0;
    gcomp_status st = gm_comm_check(c, err);
    if (st != GCOMP_OK) return st;
    if (!a) return gm_fail(err, GCOMP_E_ARG, "adapt: NULL controller");
    uint64_t deadline = gm_deadline(c, timeout_s);
    size_t len = gcomp_adapt_stats_size(a), P = (size_t)c->size, bcap = gcomp_adapt_state_bound(a);
    gcomp_status local = GCOMP_OK;
    double *mine = NULL, *all = NULL;
    uint8_t *backup = NULL;
    MPI_Request *req = NULL;
    if (len > (size_t)INT32_MAX / (P ? P : 1)) {
        local = GCOMP_E_LIMIT;
    } else {
        mine = gm_alloc((len + 1) * sizeof(double));
        all = gm_alloc((P * len + 1) * sizeof(double));
        backup = gm_alloc(bcap + 1);
        req = gm_calloc(1, sizeof *req);
        if (!mine || !all || !backup || !req) local = GCOMP_E_NOMEM;
    }
#define FREE_ALL() (gm_free(mine), gm_free(all), gm_free(backup), gm_free(req))
    uint64_t out[2] = {0, 0};
    st = agree(c, local != GCOMP_OK ? gm_marker(local, c->rank) : len,
               local != GCOMP_OK ? 0 : ~(uint64_t)len, out, deadline, "adaptive decision (sizes)",
               err);
    if (st != GCOMP_OK) {
        FREE_ALL();
        return st;
    }
    if (out[0] & GM_MARK) {
        FREE_ALL();
        if (local == GCOMP_E_LIMIT)
            return gm_fail(err, local, "adapt: statistics too large for MPI counts");
        if (local != GCOMP_OK) return gm_fail(err, local, "adapt: out of memory");
        return gm_fail(err, gm_marker_status(out[0]),
                       "adapt: rank %d could not take part in the decision (%s); no rank took it",
                       gm_marker_rank(out[0]), gcomp_status_str(gm_marker_status(out[0])));
    }
    if (out[0] != ~out[1]) {
        FREE_ALL();
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "adapt: the ranks send statistics of different sizes: they run different "
                       "adaptive methods or models");
    }
    size_t got;
    gcomp_adapt_stats(a, mine, len, &got);
    int rc = MPI_Iallgather(mine, (int)len, MPI_DOUBLE, all, (int)len, MPI_DOUBLE, c->comm, req);
    if (rc != MPI_SUCCESS) {
        FREE_ALL();
        return gm_comm_mpi_fail(c, err, rc, "MPI_Iallgather (adaptive statistics)");
    }
    st = wait_one(c, req, mine, all, deadline, "adaptive decision (statistics)", err);
    req = NULL; /* freed, or kept with the buffers */
    if (st != GCOMP_OK) {
        gm_free(backup);
        return st;
    }
    gm_free(mine);
    mine = NULL;
    size_t blen = 0;
    gcomp_error mine_err = {0};
    gcomp_status dec = gcomp_adapt_save_state(a, backup, bcap, &blen);
    if (dec == GCOMP_OK) dec = gcomp_adapt_decide(a, all, len, c->size, changed, &mine_err);
    st = agree(c, dec != GCOMP_OK ? gm_marker(dec, c->rank) : 0, 0, out, deadline,
               "adaptive decision (outcome)", err);
    if (st == GCOMP_OK && out[0]) {
        if (dec != GCOMP_OK) {
            st = gm_fail(err, dec, "%s", mine_err.message);
        } else { /* ours stood, another rank's did not: back to before it, as they are */
            if (changed) *changed = 0;
            gcomp_status back = gcomp_adapt_load_state(a, backup, blen, NULL);
            if (back != GCOMP_OK)
                st = gm_comm_fail(c, err, GCOMP_E_FAILED,
                                  "adapt: rank %d's decision failed and this rank could not put "
                                  "its own back (%s)",
                                  gm_marker_rank(out[0]), gcomp_status_str(back));
            else
                st = gm_fail(err, gm_marker_status(out[0]),
                             "adapt: rank %d's decision failed (%s); no rank applied it",
                             gm_marker_rank(out[0]), gcomp_status_str(gm_marker_status(out[0])));
        }
    }
    FREE_ALL();
#undef FREE_ALL
    return st;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* A ring step's message travels as messages of at most PROBE_CHUNK bytes, below the
 * transports' eager limits (Open MPI's TCP BTL: 64 KiB with its header).  One message
 * above the limit goes by rendezvous: the receiver's acknowledgement must come back before
 * the bulk is sent, and with two ranks that acknowledgement shares the socket with the
 * receiver's own bulk in the other direction.  When a rank left the barrier more than a
 * latency after its neighbour, the neighbour was already streaming, its acknowledgement
 * queued behind its 2 MiB, and the two directions took turns: on netsim with 5 ms each way,
 * 7 probes in 20 ran every step of a pass at half the rate (-50 %), or switched half-way
 * through a pass (+320 %: the bytes/2 steps slow, the `bytes` ones not).  It takes the
 * receive posted before the send: the late rank then acknowledges as it posts, ahead of
 * its own request, and the early rank, acknowledged first, starts its bulk before it
 * reads that request.  Sends posted first (as the ring allreduce does) avoided it too, 16
 * of 16, but that rests on when Open MPI acknowledges.  Eager messages need no
 * acknowledgement: 20 of 20 read the rate within 0.3 %.  Unshaped (loopback
 * speeds) the chunks read the veth 1.3-1.8x higher than one message; there is no rate to
 * read there, the probe's reading is the exchange's CPU limit. */
#define PROBE_CHUNK ((size_t)32 << 10)

/* The buffers and requests of a pass, allocated and touched before any step is timed
 * (faulting fresh pages in would be counted as time on the link).  The barriers and the
 * times' maximum use them too: once the ranks agree that every rank has them, a pass
 * allocates nothing, so a rank short of memory cannot leave the others waiting. */
typedef struct probe_bufs {
    uint8_t *sb, *rb;
    MPI_Request *req; /* 2 per chunk of the largest step */
} probe_bufs;

static void probe_bufs_free(probe_bufs *b) {
    gm_free(b->sb);
    gm_free(b->rb);
    gm_free(b->req);
    b->sb = b->rb = NULL;
    b->req = NULL;
}

/* After a failure with n requests posted: MPI may still use the buffers, so the
 * communicator keeps them with the requests (or they leak, never freed under MPI). */
static void probe_bufs_bury(gcomp_mpi_comm *c, probe_bufs *b, int n) {
    void **keep = gm_calloc(2, sizeof *keep);
    if (keep) {
        keep[0] = b->sb;
        keep[1] = b->rb;
        gm_comm_bury(c, b->req, n, keep, 2, NULL, 0);
    }
    b->sb = b->rb = NULL;
    b->req = NULL;
}

/* Waits for every rank to arrive (the barrier that starts a timed step), in b's first
 * request. */
static gcomp_status probe_barrier(gcomp_mpi_comm *c, probe_bufs *b, uint64_t deadline,
                                  gcomp_error *err) {
    int rc = MPI_Ibarrier(c->comm, &b->req[0]);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(c, err, rc, "MPI_Ibarrier (link probe)");
    gcomp_status st = gm_wait_all(c, b->req, 1, deadline, "link probe (barrier)", err);
    if (st != GCOMP_OK) probe_bufs_bury(c, b, 1);
    return st;
}

/* v[0..n) <- its maximum over the ranks, through b's send buffer (at least 1 KiB, from
 * the allocator: room and alignment for n <= 128 doubles) and first request. */
static gcomp_status probe_max(gcomp_mpi_comm *c, probe_bufs *b, double *v, int n, uint64_t deadline,
                              gcomp_error *err) {
    double *buf = (double *)(void *)b->sb;
    memcpy(buf, v, (size_t)n * sizeof *buf);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_MAX, c->comm, &b->req[0]);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(c, err, rc, "MPI_Iallreduce (link probe)");
    gcomp_status st = gm_wait_all(c, b->req, 1, deadline, "link probe (times)", err);
    if (st != GCOMP_OK) {
        probe_bufs_bury(c, b, 1);
        return st;
    }
    memcpy(v, buf, (size_t)n * sizeof *buf);
    return GCOMP_OK;
}

/* One ring step: nb bytes to `next` while nb come from `prev`, in chunks. */
static gcomp_status ring_step(gcomp_mpi_comm *c, probe_bufs *b, size_t nb, int next, int prev,
                              uint64_t deadline, gcomp_error *err) {
    int k = (int)((nb + PROBE_CHUNK - 1) / PROBE_CHUNK);
    for (int i = 0; i < 2 * k; i++) { /* every receive first, then the sends */
        size_t off = (size_t)(i % k) * PROBE_CHUNK, len = nb - off;
        if (len > PROBE_CHUNK) len = PROBE_CHUNK;
        int rc =
            i < k
                ? MPI_Irecv(b->rb + off, (int)len, MPI_BYTE, prev, PROBE_TAG, c->comm, &b->req[i])
                : MPI_Isend(b->sb + off, (int)len, MPI_BYTE, next, PROBE_TAG, c->comm, &b->req[i]);
        if (rc != MPI_SUCCESS) {
            gm_comm_mpi_fail(c, err, rc, "link probe");
            if (i) probe_bufs_bury(c, b, i); /* else nothing in flight: the pass frees them */
            return GCOMP_E_MPI;
        }
    }
    gcomp_status st = gm_wait_all(c, b->req, 2 * k, deadline, "link probe", err);
    if (st != GCOMP_OK) probe_bufs_bury(c, b, 2 * k);
    return st;
}

#define PROBE_CHAIN 5 /* 8-byte ring steps back to back: the latency's chain */
#define PROBE_GROW 4  /* a probe too short against the latency grows by this, twice at most */
#define PROBE_CAP 1.5 /* the difference's reading, at most this times one step's over 8 bytes */

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
    size_t chunks = (bytes + PROBE_CHUNK - 1) / PROBE_CHUNK;
    probe_bufs b = {gm_alloc(bytes), gm_alloc(bytes), gm_alloc(2 * chunks * sizeof *b.req)};
    /* Every rank learns whether every rank has its buffers (the large ones: megabytes
     * once grown), so that one short of memory does not leave the others in a barrier. */
    bool ready = b.sb && b.rb && b.req;
    uint64_t out[2] = {0, 0};
    gcomp_status st = agree(c, ready ? 0 : gm_marker(GCOMP_E_NOMEM, c->rank), 0, out, deadline,
                            "link probe (buffers)", err);
    if (st != GCOMP_OK || out[0]) {
        probe_bufs_free(&b);
        if (st != GCOMP_OK) return st;
        if (!ready) return gm_fail(err, GCOMP_E_NOMEM, "probe: out of memory (%zu bytes)", bytes);
        return gm_fail(err, GCOMP_E_NOMEM, "probe: rank %d is out of memory for its %zu bytes",
                       gm_marker_rank(out[0]), bytes);
    }
    memset(b.sb, 0, bytes);
    memset(b.rb, 0, bytes);
    memset(t, 0, 12 * sizeof(double));
    for (size_t o = 0; o < sizeof order / sizeof order[0] && st == GCOMP_OK; o++) {
        int size = order[o][0], rep = order[o][1];
        if (!lat && (size == 0 || size == 3)) continue;
        size_t nb = size < 0 ? bytes : sizes[size];
        if ((st = probe_barrier(c, &b, deadline, err)) != GCOMP_OK) break;
        uint64_t t0 = gm_now_ns();
        for (int k = 0; k < (size == 3 ? PROBE_CHAIN : 1) && st == GCOMP_OK; k++)
            st = ring_step(c, &b, nb, next, prev, deadline, err);
        if (st == GCOMP_OK && size >= 0) t[size][rep] = 1e-9 * (double)(gm_now_ns() - t0);
    }
    if (st == GCOMP_OK) st = probe_max(c, &b, &t[0][0], 12, deadline, err);
    probe_bufs_free(&b); /* NULL where a failed step gave them to the communicator */
    if (st != GCOMP_OK) return st;
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
     * or a retransmission, and loses where the link sat idle before the step and the
     * bucket refilled: the step after a stall runs partly at the wire's speed.  Either is
     * one step in three at most, so the median of each size counts.  (The fastest
     * `bytes` step, taken before, read +27 % and +69 % on an idle 10 Mbit/s link in 2
     * probes of 6, each after one step had stalled 50-80 ms; and with 4 ranks on 2 busy
     * cores at 1 Gbit/s, +15..+46 % in 5 of 6, where the medians read -14..+23 %.)  Where
     * two of three stall, the medians' difference can be far too small (over gloo on busy
     * cores one probe read 33x the link): a `bytes` step cannot be faster than `bytes` at
     * the link's rate after the fastest 8-byte step's start, so the reading is capped at
     * PROBE_CAP times that.
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
    double t8 = t[0][0]; /* a grown pass times no 8-byte steps: the first pass's fastest */
    *latency = per > 0 ? per : small;
    for (int grow = 0;
         grow < 2 && t[2][0] < 20 * *latency && bytes <= ((size_t)1 << 30) / PROBE_GROW; grow++) {
        bytes *= PROBE_GROW;
        if ((st = probe_pass(c, bytes, false, deadline, t, err)) != GCOMP_OK) return st;
    }
    double half = t[1][1], big = t[2][1];
    double one = big > t8 ? (double)(bytes - 8) / (big - t8) : (double)bytes / big;
    *bandwidth = big > half ? (double)(bytes - bytes / 2) / (big - half) : one;
    if (*bandwidth > PROBE_CAP * one) *bandwidth = PROBE_CAP * one;
    return GCOMP_OK;
}

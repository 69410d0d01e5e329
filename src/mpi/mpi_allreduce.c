/*
 * mpi_allreduce.c - the allreduce strategy, for codecs whose messages sum linearly.
 *
 * `none` in f32, f16 or bf16 and `randomk` (every rank with the same seed and step picks
 * the same positions: Stich et al. 2018) produce messages whose value arrays can be
 * summed element by element, so the sum of the decoded messages is the decode of the
 * summed values.  Each tensor is encoded by its compressor (so error feedback, the f16
 * saturation and the seeded positions are the codec's own), its values are copied into
 * one packed array per sub-bucket, and one MPI_Iallreduce sums them:
 *   f32       MPI_FLOAT / MPI_SUM;
 *   f16/bf16  MPI_UINT16_T with the communicator's half-sum MPI_Op (mpi_util.c): half the
 *             bytes of f32 on the wire; each partial sum is rounded to the half format,
 *             so the result is within P-1 half roundings of the exact sum of the decoded
 *             messages (documented bound, checked by the tests).
 * Beside it, a 3-word MPI_Iallreduce(MPI_MAX) carries a failure marker and a hash of the
 * random-k keys (and its complement): a rank whose encode failed, or whose positions
 * differ (seed or step out of step), makes every rank fail instead of summing values
 * that belong to different positions.  Random-k positions are re-derived from the key
 * (FORMAT.md "Seeded entries"), never sent.
 * Rejected: decoding in an MPI_Op (an op cannot report corrupt input and sees arbitrary
 * pieces), and reducing in f32 for f16 codecs (doubles the traffic).
 */
#include "mpi_internal.h"

#include <limits.h>
#include <stdio.h>

static gcomp_status ar_encode(gcomp_mpi_bucket *b, gm_group *g) {
    uint64_t marker = 0, kh = 0x243f6a8885a308d3ull;
    uint8_t *pack = g->pack.p, *send = g->send.p;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t width = t->vtype == 0 ? 4 : 2, len = 0, nv = 0;
        uint8_t *slot = send + t->send_off;
        const uint8_t *vals = NULL;
        uint64_t key = 0, t0 = gm_now_ns();
        gcomp_status st = gcomp_encode(t->c, t->io, slot, gcomp_encode_bound(t->c), &len);
        if (st == GCOMP_OK) st = gm_linear_values(slot, len, t->n, t->vtype, &vals, &nv, &key);
        if (st == GCOMP_OK && nv != t->nvals) st = GCOMP_E_MISMATCH;
        if (st != GCOMP_OK) {
            uint64_t m = gm_marker(st, g->xrank);
            if (m > marker) marker = m;
            gm_group_local_fail(b, g, st, g->t0 + k, "encode");
        } else {
            memcpy(pack + t->pack_off * width, vals, nv * width);
            t->key = key;
            t->msgs[0] = (gm_msgref){slot, len, 0, t->n};
            t->nmsg = 1;
        }
        kh = gm_mix(kh ^ key) + k;
        t->call.codec_ns += gm_now_ns() - t0;
    }
    g->keyhash = kh;
    g->ring_s = 0;
    g->chk[0] = marker;
    g->chk[1] = kh;
    g->chk[2] = ~kh;
    return GCOMP_OK;
}

gcomp_status gm_start_pack_reduce(gcomp_mpi_bucket *b, gm_group *g, int vtype, int nchk,
                                  const char *what) {
    char msg[96];
    int rc = MPI_Iallreduce(g->chk, g->chk_out, nchk, MPI_UINT64_T, MPI_MAX, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI_Iallreduce (check words of the %s)", what);
        return gm_issue_fail(b, rc, msg);
    }
    MPI_Datatype dt = vtype == 0 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = vtype == 0 ? MPI_SUM : vtype == 1 ? b->comm->op_f16 : b->comm->op_bf16;
    rc = MPI_Iallreduce(MPI_IN_PLACE, g->pack.p, (int)g->pack_count, dt, op, g->xc, &g->req[1]);
    if (rc != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI_Iallreduce (%s)", what);
        return gm_issue_fail(b, rc, msg);
    }
    g->nreq = 2;
    return GCOMP_OK;
}

static gcomp_status ar_reduce(gcomp_mpi_bucket *b, gm_group *g) {
    gm_tensor *t0 = &b->t[g->t0];
    gcomp_status st = gm_start_pack_reduce(b, g, t0->vtype, 3, "values");
    if (st != GCOMP_OK) return st;
    size_t width = t0->vtype == 0 ? 4 : 2;
    uint64_t v = gm_ring_bytes(g->pack_count * width + 24, g->xsize);
    g->bytes_sent += v;
    g->bytes_recv += v;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t tv = gm_ring_bytes(t->nvals * width, g->xsize);
        t->call.bytes_sent += tv;
        t->call.bytes_received += tv;
    }
    return GCOMP_OK;
}

static gcomp_status ar_decode(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->chk_out[0] & GM_MARK) {
        gm_group_shared_fail(b, g, gm_marker_status(g->chk_out[0]), gm_marker_rank(g->chk_out[0]),
                             g->t0);
        return GCOMP_OK;
    }
    if (g->chk_out[1] != ~g->chk_out[2]) {
        g->st = GCOMP_E_MISMATCH;
        snprintf(g->msg, sizeof g->msg,
                 "sub-bucket at tensor '%s': random-k positions differ across ranks (seed or "
                 "step out of step); nothing was summed",
                 b->t[g->t0].name);
        return GCOMP_OK;
    }
    const uint8_t *pack = g->pack.p;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        size_t width = t->vtype == 0 ? 4 : 2;
        const uint8_t *v = pack + t->pack_off * width;
        uint32_t mx = 0; /* largest |bits| of the sum: Inf/NaN iff >= GM_INF_BITS */
        if (!t->seeded) {
            if (t->vtype == 0) {
                mx = gm_scale_max(t->io, (const float *)(const void *)v, t->n, b->scale);
            } else {
                gm_halves_to_f32((const uint16_t *)(const void *)v, t->n, t->vtype == 2, b->scale,
                                 t->io);
                if (t->vtype == 2 && !gm_finite(t->io, t->n)) mx = GM_INF_BITS; /* f16 saturates */
            }
        } else {
            uint32_t *pos = t->pos.p;
            gcomp_status st = gm_seeded_positions(t->key, t->n, t->nvals, pos, &t->bits);
            if (st != GCOMP_OK) {
                gm_group_shared_fail(b, g, st, -1, g->t0 + k); /* same key everywhere */
                continue;
            }
            memset(t->io, 0, t->n * sizeof(float));
            for (size_t j = 0; j < t->nvals; j++) {
                float x;
                if (t->vtype == 0)
                    memcpy(&x, v + 4 * j, 4);
                else {
                    uint16_t h;
                    memcpy(&h, v + 2 * j, 2);
                    x = t->vtype == 1 ? gm_f16_to_f32(h) : gm_bf16_to_f32(h);
                }
                float y = b->scale * x;
                uint32_t u = gm_abs_bits(y);
                t->io[pos[j]] = y;
                mx = u > mx ? u : mx;
            }
        }
        /* Every rank holds the same summed values (the ring copies one sum around), so
         * every rank reaches the same verdict from its own output. */
        if (mx >= GM_INF_BITS) gm_group_overflow(b, g, g->t0 + k, "sum of the values");
        t->call.codec_ns += gm_now_ns() - t0;
    }
    return GCOMP_OK;
}

/* ---- the ring, for big packs ------------------------------------------------------------
 * Reduce-scatter then allgather around the ranks (Patarasuk & Yuan 2009), with
 * MPI_Isend/Irecv of one chunk per round: 2(P-1)/P of the pack each way, the bandwidth
 * optimum.  Open MPI's non-blocking MPI_Iallreduce (libnbc) took 2.2 s for 25M f16 values
 * over 4 netsim hosts at 1 Gbit where the blocking MPI_Allreduce took 1.1 s; the ring is
 * what /work/shared/NETSIM.md measured at 95% of the link.  Each chunk is summed once,
 * in ring order, then copied around: every rank ends with the same bits.  f16/bf16
 * chunks are added with the same cast-add-round as the MPI_Op. */

#define RING_MIN_BYTES ((size_t)256 << 10)
#define RING_TAG 7002

static size_t width_of(const gcomp_mpi_bucket *b, const gm_group *g) {
    return b->t[g->t0].vtype == 0 ? 4 : 2;
}
static size_t chunk_lo(const gm_group *g, int j) {
    return (size_t)(((unsigned __int128)g->pack_count * (unsigned)j) / (unsigned)g->xsize);
}
static int mod(int a, int p) {
    return ((a % p) + p) % p;
}

static gcomp_status ring_round(gcomp_mpi_bucket *b, gm_group *g) {
    int P = g->xsize, me = g->xrank, s = g->ring_s, nreq = 0, rc;
    int right = (me + 1) % P, left = (me + P - 1) % P;
    size_t w = width_of(b, g);
    uint8_t *pack = g->pack.p;
    if (s == 0) {
        rc = MPI_Iallreduce(g->chk, g->chk_out, 3, MPI_UINT64_T, MPI_MAX, g->xc, &g->req[nreq++]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallreduce (check words)");
        for (size_t k = 0; k < g->nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            uint64_t tv = gm_ring_bytes(t->nvals * w, g->xsize);
            t->call.bytes_sent += tv;
            t->call.bytes_received += tv;
        }
    }
    bool rs = s < P - 1; /* reduce-scatter; then allgather */
    int sj = rs ? mod(me - s, P) : mod(me + 1 - (s - (P - 1)), P);
    int rj = rs ? mod(me - s - 1, P) : mod(me - (s - (P - 1)), P);
    size_t slen = (chunk_lo(g, sj + 1) - chunk_lo(g, sj)) * w;
    size_t rlen = (chunk_lo(g, rj + 1) - chunk_lo(g, rj)) * w;
    rc = MPI_Isend(pack + chunk_lo(g, sj) * w, (int)slen, MPI_BYTE, right, RING_TAG, g->xc,
                   &g->req[nreq++]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(rs ? g->recv.p : pack + chunk_lo(g, rj) * w, (int)rlen, MPI_BYTE, left,
                       RING_TAG, g->xc, &g->req[nreq++]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Isend/Irecv (ring)");
    g->nreq = nreq;
    g->bytes_sent += slen;
    g->bytes_recv += rlen;
    if (!rs) g->ring_s++;
    return GCOMP_OK;
}

static gcomp_status ring_add(gcomp_mpi_bucket *b, gm_group *g) {
    int P = g->xsize, me = g->xrank, rj = mod(me - g->ring_s - 1, P);
    int vtype = b->t[g->t0].vtype;
    size_t lo = chunk_lo(g, rj), n = chunk_lo(g, rj + 1) - lo;
    if (vtype == 0) {
        float *dst = (float *)g->pack.p + lo;
        const float *src = g->recv.p;
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    } else {
        int len = (int)n;
        if (vtype == 1)
            gm_op_f16_sum(g->recv.p, (uint16_t *)g->pack.p + lo, &len, NULL);
        else
            gm_op_bf16_sum(g->recv.p, (uint16_t *)g->pack.p + lo, &len, NULL);
    }
    g->ring_s++;
    return GCOMP_OK;
}

void gm_steps_allreduce(gcomp_mpi_bucket *b, gm_group *g) {
    gm_add_step(g, false, ar_encode, "compressing (allreduce)");
    size_t count = 0;
    for (size_t i = g->t0; i < g->t1; i++) count += b->t[i].nvals;
    g->ring = g->xsize > 1 && count * (b->t[g->t0].vtype == 0 ? 4 : 2) >= RING_MIN_BYTES;
    if (!g->ring) {
        gm_add_step(g, true, ar_reduce, "summing values (MPI_Iallreduce)");
    } else {
        for (int s = 0; s < g->xsize - 1; s++) {
            gm_add_step(g, true, ring_round, "summing values (ring, reduce-scatter)");
            gm_add_step(g, false, ring_add, "adding a ring chunk");
        }
        for (int s = 0; s < g->xsize - 1; s++)
            gm_add_step(g, true, ring_round, "gathering values (ring, allgather)");
    }
    gm_add_step(g, false, ar_decode, "unpacking (allreduce)");
}

gcomp_status gm_reserve_allreduce(gcomp_mpi_bucket *b, gm_group *g) {
    size_t send = 0, count = 0, width = b->t[g->t0].vtype == 0 ? 4 : 2;
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        t->send_off = send;
        send += (gcomp_encode_bound(t->c) + 63) & ~(size_t)63;
        t->pack_off = count;
        count += t->nvals;
    }
    if (count > INT_MAX || count * width > INT_MAX) return GCOMP_E_LIMIT;
    g->pack_count = count;
    if (gm_reserve(&g->send, send) != GCOMP_OK ||
        gm_reserve(&g->pack, count * width + 8) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    /* the ring's receive chunk */
    if (g->ring && gm_reserve(&g->recv, (count / (size_t)g->xsize + 1) * width + 8) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

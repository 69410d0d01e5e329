/*
 * mpi_allreduce.c - the allreduce strategy, for codecs whose messages sum linearly.
 *
 * A spec that is GCOMP_SPEC_LINEAR with plain-float values (`none` in f32, f16 or bf16;
 * random-k, whose ranks with the same seed and step pick the same positions: Stich et al.
 * 2018) produces messages whose value arrays can be summed element by element, so the sum
 * of the decoded messages is the decode of the summed values.  Each tensor is encoded by its
 * compressor (so error feedback, the f16 saturation and the seeded positions are the codec's own),
 * its values are copied into one packed array per sub-bucket, and one MPI_Iallreduce sums them: f32
 * MPI_FLOAT / MPI_SUM; f16/bf16  MPI_UINT16_T with the communicator's half-sum MPI_Op (mpi_util.c):
 * half the bytes of f32 on the wire; each partial sum is rounded to the half format, so the result
 * is within P-1 half roundings of the exact sum of the decoded messages (documented bound, checked
 * by the tests). Beside it, a 3-word MPI_Iallreduce(MPI_MAX) carries a failure marker and a hash of
 * the random-k keys and the specs' fingerprints (and its complement): a rank whose encode failed,
 * or whose positions or spec differ (seed or step out of step, a retune not made everywhere),
 * makes every rank fail instead of summing values that belong to different positions.  Random-k
 * positions are re-derived from the key (FORMAT.md "Seeded entries"), never sent. Rejected:
 * decoding in an MPI_Op (an op cannot report corrupt input and sees arbitrary pieces), and reducing
 * in f32 for f16 codecs (doubles the traffic).
 */
#include "mpi_strategy.h"

#include <limits.h>
#include <stdio.h>

/* Per tensor. */
typedef struct ar_tensor {
    int vid;          /* wire type of the values (GM_VID_*) */
    bool seeded;      /* positions from the key: values only travel */
    size_t nvals;     /* values per message: fixed by the spec and n */
    size_t send_off;  /* message slot in the group's send buffer */
    size_t pack_off;  /* first value in the pack buffer */
    uint64_t key;     /* this call's random-k key */
    gm_buf bits, pos; /* random-k: scratch, positions */
} ar_tensor;

/* Per group (all its tensors have one vid: ar_groups_with). */
typedef struct ar_group {
    int vid;
    size_t count; /* values in the pack */
    bool ring;    /* the library's own ring over point-to-point (big packs) */
    int ring_s;   /* its next round */
} ar_group;

static ar_tensor *art(const gm_tensor *t) {
    return t->priv;
}

static gcomp_status ar_encode(gcomp_mpi_bucket *b, gm_group *g) {
    ar_group *ag = g->priv;
    uint64_t marker = 0, kh = 0x243f6a8885a308d3ull;
    uint8_t *pack = g->pack.p, *send = g->send.p;
    size_t width = gm_vid_width(ag->vid);
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        ar_tensor *a = art(t);
        size_t len = 0, nv = 0;
        uint8_t *slot = send + a->send_off;
        const uint8_t *vals = NULL;
        uint64_t key = 0, t0 = gm_now_ns();
        gcomp_status st = gcomp_encode(t->c, t->io, slot, gcomp_encode_bound(t->c), &len);
        /* A refused encode leaves this rank's step behind the others', whose encodes
         * stand: random-k would draw other positions from here on (every later call a
         * mismatch).  The step is counted without its message. */
        if (st != GCOMP_OK) gcomp_compressor_skip_step(t->c);
        if (st == GCOMP_OK) st = gm_linear_values(slot, len, t->n, a->vid, &vals, &nv, &key);
        if (st == GCOMP_OK && nv != a->nvals) st = GCOMP_E_MISMATCH;
        if (st != GCOMP_OK) {
            uint64_t m = gm_marker(st, g->xrank);
            if (m > marker) marker = m;
            gm_group_local_fail(b, g, st, g->t0 + k, "encode");
        } else {
            memcpy(pack + a->pack_off * width, vals, nv * width);
            a->key = key;
            t->msgs[0] = (gm_msgref){slot, len, 0, t->n};
            t->nmsg = 1;
        }
        kh = gm_mix(kh ^ key ^ t->fp) + k; /* positions and, after a retune, the spec */
        t->call.codec_ns += gm_now_ns() - t0;
    }
    ag->ring_s = 0;
    g->chk[0] = marker;
    g->chk[1] = kh;
    g->chk[2] = ~kh;
    return GCOMP_OK;
}

static gcomp_status ar_reduce(gcomp_mpi_bucket *b, gm_group *g) {
    ar_group *ag = g->priv;
    gcomp_status st = gm_start_pack_reduce(b, g, ag->vid, ag->count, 3, "values");
    if (st != GCOMP_OK) return st;
    size_t width = gm_vid_width(ag->vid);
    uint64_t v = gm_ring_bytes(ag->count * width + 24, g->xsize);
    g->bytes_sent += v;
    g->bytes_recv += v;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t tv = gm_ring_bytes(art(t)->nvals * width, g->xsize);
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
                 "sub-bucket at tensor '%s': specs or random-k positions differ across ranks "
                 "(a retune not made on every rank, or seed or step out of step); nothing was "
                 "summed",
                 b->t[g->t0].name);
        return GCOMP_OK;
    }
    const uint8_t *pack = g->pack.p;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        ar_tensor *a = art(t);
        uint64_t t0 = gm_now_ns();
        const uint8_t *v = pack + a->pack_off * gm_vid_width(a->vid);
        uint32_t mx = 0; /* largest |bits| of the sum: Inf/NaN iff >= GM_INF_BITS */
        if (!a->seeded) {
            if (a->vid == GM_VID_F32) {
                mx = gm_scale_max(t->io, (const float *)(const void *)v, t->n, b->scale);
            } else {
                gm_halves_to_f32((const uint16_t *)(const void *)v, t->n, a->vid == GM_VID_BF16,
                                 b->scale, t->io);
                if (a->vid == GM_VID_BF16 && !gm_finite(t->io, t->n))
                    mx = GM_INF_BITS; /* f16 saturates */
            }
        } else {
            uint32_t *pos = a->pos.p;
            gcomp_status st = gm_seeded_positions(a->key, t->n, a->nvals, pos, &a->bits);
            if (st != GCOMP_OK) {
                gm_group_shared_fail(b, g, st, -1, g->t0 + k); /* same key everywhere */
                continue;
            }
            memset(t->io, 0, t->n * sizeof(float));
            for (size_t j = 0; j < a->nvals; j++) {
                float x;
                if (a->vid == GM_VID_F32)
                    memcpy(&x, v + 4 * j, 4);
                else {
                    uint16_t h;
                    memcpy(&h, v + 2 * j, 2);
                    x = a->vid == GM_VID_F16 ? gm_f16_to_f32(h) : gm_bf16_to_f32(h);
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
 * over 4 netsim hosts at 1 Gbit where the blocking MPI_Allreduce took 1.1 s; the ring moved
 * them at 95% of the link.  Each chunk is summed once, in ring order,
 * then copied around: every rank ends with the same bits.  f16/bf16 chunks are added with
 * the same cast-add-round as the MPI_Op. */

#define RING_TAG 7002

static size_t chunk_lo(const gm_group *g, int j) {
    return gm_region_lo(((const ar_group *)g->priv)->count, g->xsize, j);
}
static int mod(int a, int p) {
    return ((a % p) + p) % p;
}

static gcomp_status ring_round(gcomp_mpi_bucket *b, gm_group *g) {
    ar_group *ag = g->priv;
    int P = g->xsize, me = g->xrank, s = ag->ring_s, nreq = 0, rc;
    int right = (me + 1) % P, left = (me + P - 1) % P;
    size_t w = gm_vid_width(ag->vid);
    uint8_t *pack = g->pack.p;
    if (s == 0) {
        rc = MPI_Iallreduce(g->chk, g->chk_out, 3, MPI_UINT64_T, MPI_MAX, g->xc, &g->req[nreq++]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallreduce (check words)");
        for (size_t k = 0; k < g->nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            uint64_t tv = gm_ring_bytes(art(t)->nvals * w, g->xsize);
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
    if (!rs) ag->ring_s++;
    return GCOMP_OK;
}

static gcomp_status ring_add(gcomp_mpi_bucket *b, gm_group *g) {
    (void)b;
    ar_group *ag = g->priv;
    int P = g->xsize, me = g->xrank, rj = mod(me - ag->ring_s - 1, P);
    size_t lo = chunk_lo(g, rj), n = chunk_lo(g, rj + 1) - lo;
    if (ag->vid == GM_VID_F32) {
        float *dst = (float *)g->pack.p + lo;
        const float *src = g->recv.p;
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    } else {
        int len = (int)n;
        if (ag->vid == GM_VID_F16)
            gm_op_f16_sum(g->recv.p, (uint16_t *)g->pack.p + lo, &len, NULL);
        else
            gm_op_bf16_sum(g->recv.p, (uint16_t *)g->pack.p + lo, &len, NULL);
    }
    ag->ring_s++;
    return GCOMP_OK;
}

/* ---- the component -------------------------------------------------------------------------- */

static void ar_steps(gcomp_mpi_bucket *b, gm_group *g) {
    (void)b;
    const ar_group *ag = g->priv;
    gm_add_step(g, false, ar_encode, "compressing (allreduce)");
    if (!ag->ring) {
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

static gcomp_status ar_reserve(gcomp_mpi_bucket *b, gm_group *g) {
    ar_group *ag = g->priv; /* again after a retune's planning: the tensors' offsets anew */
    if (!ag && !(ag = gm_calloc(1, sizeof *ag))) return GCOMP_E_NOMEM;
    g->priv = ag;
    ag->vid = art(&b->t[g->t0])->vid;
    size_t send = 0, count = 0, width = gm_vid_width(ag->vid);
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        ar_tensor *a = art(t);
        a->send_off = send;
        send += (gcomp_encode_bound(t->c) + 63) & ~(size_t)63;
        a->pack_off = count;
        count += a->nvals;
    }
    if (count > INT_MAX || count * width > INT_MAX) return GCOMP_E_LIMIT;
    ag->count = count;
    ag->ring = g->xsize > 1 && count * width >= GM_RING_MIN_BYTES;
    if (gm_reserve(&g->send, send) != GCOMP_OK ||
        gm_reserve(&g->pack, count * width + 8) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    /* the ring's receive chunk */
    if (ag->ring && gm_reserve(&g->recv, (count / (size_t)g->xsize + 1) * width + 8) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

static int vid_of(gcomp_value_type v) {
    return v == GCOMP_VALUES_F16 ? GM_VID_F16 : v == GCOMP_VALUES_BF16 ? GM_VID_BF16 : GM_VID_F32;
}

static bool float_values(const gcomp_spec_info *d) {
    return d->value_type == GCOMP_VALUES_F32 || d->value_type == GCOMP_VALUES_F16 ||
           d->value_type == GCOMP_VALUES_BF16;
}

static gcomp_status ar_setup(gcomp_mpi_bucket *b, gm_tensor *t, gcomp_error *err) {
    (void)b;
    ar_tensor *a = gm_calloc(1, sizeof *a);
    if (!a) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    t->priv = a;
    a->vid = vid_of(t->info.value_type);
    a->seeded = (t->info.flags & GCOMP_SPEC_SPARSE) != 0;
    /* The ranks sum by position: every rank keeps the spec's own seed (t->wspec). */
    gcomp_error e2;
    gcomp_status st = gcomp_compressor_create(&t->c, t->wspec, t->n, t->rows, t->cols, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    a->nvals = t->n;
    if (!a->seeded) return GCOMP_OK;
    /* How many values travel is fixed by the spec and n; learn it from one encode of
     * zeros so the packed layout is identical on every rank before any call. */
    gcomp_compressor *tmp;
    size_t len = 0;
    st = gcomp_compressor_create(&tmp, t->spec, t->n, t->rows, t->cols, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    size_t cap = gcomp_encode_bound(tmp);
    float *z = gm_calloc(t->n, sizeof *z);
    uint8_t *m = gm_alloc(cap);
    const uint8_t *vals;
    uint64_t key;
    st = !z || !m ? GCOMP_E_NOMEM : gcomp_encode(tmp, z, m, cap, &len);
    if (st == GCOMP_OK) st = gm_linear_values(m, len, t->n, a->vid, &vals, &a->nvals, &key);
    gm_free(z);
    gm_free(m);
    gcomp_compressor_free(tmp);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': cannot sum '%s' messages linearly: %s", t->name,
                       t->spec, gcomp_status_str(st));
    /* Reserved now: positions and their scratch are regenerated every call. */
    if (gm_reserve(&a->pos, a->nvals * 4 + 4) != GCOMP_OK ||
        gm_reserve(&a->bits, gm_seeded_scratch(t->n)) != GCOMP_OK)
        return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    return GCOMP_OK;
}

static void ar_free(gm_tensor *t) {
    ar_tensor *a = t->priv;
    if (!a) return;
    gm_buf_free(&a->bits);
    gm_buf_free(&a->pos);
    gm_free(a);
}

/* Tensors whose values travel as one type share a pack. */
static bool ar_groups_with(const gm_tensor *first, const gm_tensor *t) {
    return first->info.value_type == t->info.value_type;
}

/* Linear with plain-float values: the cheapest exchange there is (3). */
static int ar_query(const gm_query *q, const char **why) {
    if (q->info->flags & GCOMP_SPEC_MULTIPHASE) {
        *why = "multi-phase codecs are the multi-phase allreduce's (mpi_lowrank.c)";
        return -2;
    }
    if (!(q->info->flags & GCOMP_SPEC_LINEAR) || !float_values(q->info)) {
        *why = "the allreduce strategy needs a codec whose messages sum linearly "
               "(GCOMP_SPEC_LINEAR) with f32/f16/bf16 values";
        return -1;
    }
    return 3;
}

const gm_strategy gm_strategy_allreduce = {
    .version = GM_STRATEGY_VERSION,
    GM_NAMES("allreduce"),
    .id = GCOMP_MPI_ALLREDUCE,
    .query = ar_query,
    .tensor_setup = ar_setup,
    .tensor_free = ar_free,
    .groups_with = ar_groups_with,
    .reserve = ar_reserve,
    .steps = ar_steps,
};

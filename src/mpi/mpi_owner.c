/*
 * mpi_owner.c - the two owner strategies: each rank owns one region of every tensor
 * (region j = elements [j*n/P, (j+1)*n/P)), reduces the contributions to it, re-compresses
 * the sum (with error feedback when that is stable), and the owners' messages are
 * allgathered.  Two components in one file, since they share every step but the first.
 *
 * rsag   reduce-scatter + allgather with re-compression at the owner: DeepSpeed's 1-bit
 *        compressed allreduce (Tang et al. 2021, "1-bit Adam"), for quantizers.  Every
 *        rank compresses region j of its gradient with its own chunk compressor (the
 *        worker side: the tensor's spec, with its feedback - use feedback=ef for 1-bit
 *        SGD) and sends it to rank j; rank j decodes the P chunks, sums them, compresses
 *        the sum with its owner compressor (same codec, its own seed, and error feedback
 *        when the codec contracts: the server side of the error feedback; see
 *        owner_spec below), and every rank decodes every owner's message.
 *        Bytes per rank: 2(P-1)/P of one compressed tensor, like a ring allreduce.
 *        What reaches the ranks is quantised twice; tests/mpi/test_mpi_rsag.c replays the
 *        algorithm step by step.  For 1-bit sign on gradients the second quantisation
 *        doubles what the residuals hold back and training can diverge, so `auto` sends
 *        sign by allgather (gcomp_mpi_strategy_auto).
 * sparse sparse allreduce (Renggli et al. 2019 "SparCML" split allgather; Li & Hoefler
 *        2022 "Ok-Topk"): every rank compresses the whole tensor with its compressor
 *        (global top-k with its own error feedback), decodes its own message, and sends
 *        each region's non-zeros to the region's owner as a slice (mpi_util.c: compact
 *        (gap, f32 value) pairs, or dense when that is smaller - the region "fills up").
 *        The owner adds the slices to its own part, re-selects with the tensor's codec
 *        over the region (top-k at the same density: k/P per region) keeping what it
 *        drops in its owner residual (the same feedback rule as rsag), and the owners'
 *        messages are allgathered.  Bytes
 *        per rank: at most 2(P-1)/P x k entries, bounded by 2k whatever P, where allgather
 *        sends (P-1) x k.  Regions are equal in size (Ok-Topk balances them by the
 *        observed distribution; equal regions keep every rank's buffers fixed).
 *
 *   encode    rsag: P chunk messages; sparse: the message, decoded locally, sliced
 *   sizes     MPI_Ialltoall of a size word per tensor and destination (or a marker)
 *   data      MPI_Ialltoallv of the chunk messages / slices
 *   owner     decode-add the P contributions to my region, re-compress (error feedback)
 *   gsizes    MPI_Iallgather of the owners' message sizes
 *   gdata     MPI_Iallgatherv of the owners' messages
 *   decode    every owner's message into its region
 *
 * A rank that fails to encode puts a marker in all its size words for that tensor, so
 * every rank skips the rest of the group together; an owner that finds a bad message
 * puts a marker in its owner size word, which every rank sees in gsizes.
 */
#include "mpi_strategy.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

/* Per tensor, on a rank of the exchange. */
typedef struct ow_tensor {
    int nreg;                /* xsize */
    size_t *reg;             /* xsize + 1 region boundaries */
    gcomp_compressor *owner; /* this rank's region (NULL when empty) */
    gcomp_compressor *other; /* a decoder for the other region length (NULL: none), so that
                              * decoding those owners' messages allocates nothing a call */
    char ospec[512];         /* the owner's canonical spec (owner_spec) */
    uint64_t owner_fp;
    gcomp_compressor **chunk;      /* rsag: one per region (NULL when empty) */
    gm_peers peers;                /* rsag: decoders of the other ranks' chunks of my region */
    gm_buf own;                    /* sparse: this rank's whole message */
    size_t gsend_off;              /* this call's owner message in g->gsend */
    size_t bound_len[2], bound[2]; /* owner message bounds for the two region lengths */
} ow_tensor;

extern const gm_strategy gm_strategy_rsag;
static size_t owner_bound(const ow_tensor *o, size_t len);

/* Per group. */
typedef struct ow_group {
    bool rsag;        /* rsag (chunk messages), else sparse (slices) */
    size_t *dest_off; /* xsize + 1 send areas, one per destination */
} ow_group;

static ow_tensor *owt(const gm_tensor *t) {
    return t->priv;
}

/* ---- what an owner re-compresses with ----------------------------------------------------- */

/*
 * The owner-side spec (rsag, sparse): the tensor's spec with
 *  - feedback=ef when the spec is a contraction (GCOMP_SPEC_CONTRACTION at GM_PROBE_N
 *    elements): what the owner drops stays in its residual and nothing is lost, the server
 *    side of 1-bit Adam's error feedback; whatever the tensor's own feedback is
 *    (deterministic codecs would otherwise lose their rounding bias every step).  Error
 *    feedback converges for a contraction, E|C(x) - x|^2 <= (1 - d)|x|^2 with d > 0 (Stich
 *    et al. 2018, Karimireddy et al. 2019): the residual then carries less than it was
 *    given.  A codec that draws random numbers may not be one: its error is zero-mean but
 *    can exceed the signal, and a residual fed back into it grows by that factor every step
 *    (QSGD levels=4 in buckets of 512: 3.5, and the 4-rank MLP's owner residual reached NaN
 *    at step 18; levels=8: 1.27, NaN at step 115; levels=16: 0.33, trains; ternary 1.6;
 *    bernoulli at density p: 1/p - 1).  The core's worst-case bound per codec grows with
 *    d = min(bucket, n), so a spec that is a contraction at GM_PROBE_N elements is one for
 *    any smaller region, and every rank takes the same decision;
 *  - feedback=none otherwise: the re-compression of an unbiased codec stays unbiased on its
 *    own, where a residual would diverge.  Rejected: feedback always (that divergence), and
 *    the tensor's own feedback (feedback=none on sign or twobit loses what the second
 *    quantisation drops; feedback=ef on QSGD levels=4 diverges on the workers already), and
 *    measuring the ratio on a probe (it accepted specs the core then refused at create:
 *    QSGD at 10-11 levels, ternary in buckets of 9-30);
 *  - its own feedback when the method fixes it (GCOMP_SPEC_FIXED_FEEDBACK: dgc's momentum
 *    correction, twobit's residual);
 *  - a seed of its own: with the workers' seed the owner draws the random numbers the
 *    workers drew for the same chunk, and its rounding is then not independent of (not
 *    unbiased for) an input that those numbers made.
 */
static gcomp_status owner_spec(const gm_tensor *t, char *out, size_t cap, uint64_t *fp) {
    const gcomp_spec_info *d = &t->info;
    char spec[512], num[24];
    gcomp_status st = GCOMP_OK;
    snprintf(spec, sizeof spec, "%s", t->spec);
    if (!(d->flags & GCOMP_SPEC_FIXED_FEEDBACK))
        st = gcomp_spec_set(spec, "feedback", d->flags & GCOMP_SPEC_CONTRACTION ? "ef" : "none",
                            spec, sizeof spec, NULL);
    uint64_t oseed = gm_mix(d->seed ^ 0x6f776e6572ull /* "owner" */) &
                     ((1ull << 53) - 1); /* the spec's seed range */
    snprintf(num, sizeof num, "%llu", (unsigned long long)oseed);
    if (st == GCOMP_OK) st = gcomp_spec_set(spec, "seed", num, spec, sizeof spec, NULL);
    if (st == GCOMP_OK) st = gcomp_spec_canonical(spec, out, cap, fp, NULL);
    return st;
}

static size_t reg_len(const gm_tensor *t, int j) {
    return owt(t)->reg[j + 1] - owt(t)->reg[j];
}

static void mark_tensor(gm_group *g, size_t k, uint64_t m) {
    for (int j = 0; j < g->xsize; j++) g->sz_send[(size_t)j * g->nt + k] = m;
}

static gcomp_status rsag_encode(gcomp_mpi_bucket *b, gm_group *g) {
    const ow_group *og = g->priv;
    uint8_t *send = g->send.p;
    size_t nt = g->nt;
    gcomp_status *bad = (gcomp_status *)(void *)g->gsz_send; /* scratch until the owner step */
    for (size_t k = 0; k < nt; k++) {
        bad[k] = GCOMP_OK;
        b->t[g->t0 + k].nmsg = 0;
    }
    for (int j = 0; j < g->xsize; j++) {
        size_t off = og->dest_off[j];
        for (size_t k = 0; k < nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            size_t len = 0, lj = reg_len(t, j);
            g->sz_send[(size_t)j * nt + k] = gm_size_word(t->fp, 0);
            if (!lj || bad[k] != GCOMP_OK) continue;
            uint64_t t0 = gm_now_ns();
            gcomp_status st = gcomp_encode(owt(t)->chunk[j], t->io + owt(t)->reg[j], send + off,
                                           og->dest_off[j + 1] - off, &len);
            t->call.codec_ns += gm_now_ns() - t0;
            if (st != GCOMP_OK) {
                bad[k] = st;
                continue;
            }
            g->sz_send[(size_t)j * nt + k] = gm_size_word(t->fp, len);
            t->msgs[t->nmsg++] = (gm_msgref){send + off, len, owt(t)->reg[j], lj};
            off += len;
        }
    }
    for (size_t k = 0; k < nt; k++)
        if (bad[k] != GCOMP_OK) {
            mark_tensor(g, k, gm_marker(bad[k], g->xrank));
            gm_group_local_fail(b, g, bad[k], g->t0 + k, "encode");
            b->t[g->t0 + k].nmsg = 0;
        }
    return GCOMP_OK;
}

static gcomp_status sparse_encode(gcomp_mpi_bucket *b, gm_group *g) {
    const ow_group *og = g->priv;
    uint8_t *send = g->send.p;
    size_t nt = g->nt;
    gcomp_status *bad = (gcomp_status *)(void *)g->gsz_send;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t len = 0;
        uint64_t t0 = gm_now_ns();
        t->nmsg = 0;
        gcomp_status st = gcomp_encode(t->c, t->io, owt(t)->own.p, owt(t)->own.cap, &len);
        if (st == GCOMP_OK) {
            /* This rank's contribution, as every decoder will see it. */
            memset(t->io, 0, t->n * sizeof(float));
            st = gm_decode_checked(t->c, owt(t)->own.p, len, gcomp_compressor_fingerprint(t->c),
                                   t->n, t->io, 1.0f);
        }
        t->call.codec_ns += gm_now_ns() - t0;
        bad[k] = st;
        if (st == GCOMP_OK) {
            t->msgs[0] = (gm_msgref){owt(t)->own.p, len, 0, t->n};
            t->nmsg = 1;
        }
    }
    for (int j = 0; j < g->xsize; j++) {
        size_t off = og->dest_off[j];
        for (size_t k = 0; k < nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            size_t len = 0;
            if (j != g->xrank && bad[k] == GCOMP_OK) {
                uint64_t t0 = gm_now_ns();
                len = gm_slice_encode(t->io + owt(t)->reg[j], reg_len(t, j), send + off);
                t->call.codec_ns += gm_now_ns() - t0;
            }
            g->sz_send[(size_t)j * nt + k] = gm_size_word(t->fp, len);
            off += len;
        }
    }
    for (size_t k = 0; k < nt; k++)
        if (bad[k] != GCOMP_OK) {
            mark_tensor(g, k, gm_marker(bad[k], g->xrank));
            gm_group_local_fail(b, g, bad[k], g->t0 + k, "encode");
        }
    return GCOMP_OK;
}

static gcomp_status ow_sizes(gcomp_mpi_bucket *b, gm_group *g) {
    int nt = (int)g->nt;
    int rc = MPI_Ialltoall(g->sz_send, nt, MPI_UINT64_T, g->sz_recv, nt, MPI_UINT64_T, g->xc,
                           &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ialltoall (slice sizes)");
    g->nreq = 1;
    gm_count_size_words(b, g);
    return GCOMP_OK;
}

static gcomp_status ow_data(gcomp_mpi_bucket *b, gm_group *g) {
    const ow_group *og = g->priv;
    size_t P = (size_t)g->xsize, nt = g->nt;
    /* A rank that failed marked every destination, so all ranks see it here. */
    if (gm_scan_markers(b, g, g->sz_recv, P * nt, nt)) return GCOMP_OK;
    if (gm_scan_specs(b, g, g->sz_recv, P * nt, nt)) return GCOMP_OK;
    uint64_t total = 0;
    for (size_t j = 0; j < P; j++) {
        uint64_t s = 0, r = 0;
        for (size_t k = 0; k < nt; k++) {
            s += gm_size_len(g->sz_send[j * nt + k]);
            r += gm_size_len(g->sz_recv[j * nt + k]);
            gm_tensor *t = &b->t[g->t0 + k];
            if ((int)j != g->xrank) {
                t->call.bytes_sent += gm_size_len(g->sz_send[j * nt + k]);
                t->call.bytes_received += gm_size_len(g->sz_recv[j * nt + k]);
            }
        }
        g->cnt_s[j] = (int)s; /* bounded by the send areas, checked at set-up */
        g->dsp_s[j] = (int)og->dest_off[j];
        g->cnt_r[j] = (int)r;
        g->dsp_r[j] = (int)total;
        total += r;
        if ((int)j != g->xrank) {
            g->bytes_sent += s;
            g->bytes_recv += r;
        }
    }
    /* Reserved at set-up for P contributions at their bound: more is no message of this
     * spec, which a peer of the same library cannot send. */
    if (total > g->recv.cap) return GCOMP_E_CORRUPT;
    int rc = MPI_Ialltoallv(g->send.p, g->cnt_s, g->dsp_s, MPI_BYTE, g->recv.p, g->cnt_r, g->dsp_r,
                            MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ialltoallv (slices)");
    g->nreq = 1;
    return GCOMP_OK;
}

static gcomp_status ow_owner(gcomp_mpi_bucket *b, gm_group *g) {
    const ow_group *og = g->priv;
    size_t P = (size_t)g->xsize, nt = g->nt, off = 0;
    int me = g->xrank;
    for (size_t k = 0; k < nt; k++) g->gsz_send[k] = gm_size_word(b->t[g->t0 + k].fp, 0);
    g->gsend_len = 0;
    if (g->st != GCOMP_OK) return GCOMP_OK; /* every rank knows: the rest is skipped */
    const uint8_t *recv = g->recv.p;
    for (size_t r = 0; r < P; r++) g->pos[r] = (size_t)g->dsp_r[r];
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t mine = reg_len(t, me);
        gcomp_status st = GCOMP_OK;
        int from = me;
        uint64_t t0 = gm_now_ns();
        float *acc = t->io + owt(t)->reg[me];
        if (mine && og->rsag) memset(acc, 0, mine * sizeof(float));
        for (size_t r = 0; r < P; r++) {
            size_t len = gm_size_len(g->sz_recv[r * nt + k]);
            const uint8_t *m = recv + g->pos[r];
            g->pos[r] += len;
            if (st != GCOMP_OK || !mine) continue;
            if (og->rsag) /* a chunk message from every rank */
                st = len ? gm_decode_checked(
                               gm_peer_decoder(&owt(t)->peers, (int)r, owt(t)->chunk[me]), m, len,
                               gm_peer_fp(&owt(t)->peers, (int)r, t->fp), mine, acc, 1.0f)
                         : GCOMP_E_CORRUPT;
            else if ((int)r != me) /* my own part is already in acc */
                st = gm_slice_decode_add(m, len, mine, acc);
            if (st != GCOMP_OK) from = (int)r;
        }
        size_t len = 0;
        bool reencode = st == GCOMP_OK;
        if (st == GCOMP_OK && mine)
            st = gcomp_encode(owt(t)->owner, acc, (uint8_t *)g->gsend.p + off, g->gsend.cap - off,
                              &len);
        t->call.codec_ns += gm_now_ns() - t0;
        if (st != GCOMP_OK) {
            g->gsz_send[k] = gm_marker(st, me) | (reencode ? GM_MARK_OWNER : 0);
            if (g->local_st == GCOMP_OK) {
                g->local_st = st;
                if (reencode) /* finite inputs: the sum, or sum + residual, overflowed */
                    snprintf(g->local_msg, sizeof g->local_msg,
                             "tensor '%s' (#%zu): owner re-compression: %s (the sum of the "
                             "contributions%s overflows: diverging?)",
                             t->name, g->t0 + k, gcomp_status_str(st),
                             gcomp_compressor_residual(owt(t)->owner) ? " plus the owner residual"
                                                                      : "");
                else
                    snprintf(g->local_msg, sizeof g->local_msg,
                             "tensor '%s' (#%zu): owner: %s in the contribution of %s %d", t->name,
                             g->t0 + k, gcomp_status_str(st), g->hier ? "node" : "rank", from);
            }
            continue;
        }
        g->gsz_send[k] = gm_size_word(t->fp, len);
        owt(t)->gsend_off = off;
        off += len;
    }
    g->gsend_len = off;
    return GCOMP_OK;
}

static gcomp_status ow_gsizes(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->st != GCOMP_OK) return GCOMP_OK;
    int nt = (int)g->nt;
    int rc = MPI_Iallgather(g->gsz_send, nt, MPI_UINT64_T, g->gsz_recv, nt, MPI_UINT64_T, g->xc,
                            &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgather (owner sizes)");
    g->nreq = 1;
    uint64_t w = 8 * g->nt * (uint64_t)(g->xsize - 1);
    g->bytes_sent += w;
    g->bytes_recv += w;
    return GCOMP_OK;
}

static gcomp_status ow_gdata(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->st != GCOMP_OK) return GCOMP_OK;
    size_t P = (size_t)g->xsize, nt = g->nt;
    if (gm_scan_markers(b, g, g->gsz_recv, P * nt, nt)) {
        /* Say what an owner elsewhere found wrong with its own sum. */
        for (size_t i = 0; i < P * nt; i++) {
            uint64_t m = g->gsz_recv[i];
            if (!(m & GM_MARK)) continue;
            int r = gm_marker_rank(m);
            if ((m & GM_MARK_OWNER) && r != g->xrank)
                snprintf(g->msg, sizeof g->msg,
                         "tensor '%s' (#%zu): owner re-compression on %s %d: %s (the sum of the "
                         "contributions, or sum plus owner residual, overflows: diverging?)",
                         b->t[g->t0 + i % nt].name, g->t0 + i % nt, g->hier ? "node" : "rank", r,
                         gcomp_status_str(gm_marker_status(m)));
            break;
        }
        return GCOMP_OK;
    }
    if (gm_scan_specs(b, g, g->gsz_recv, P * nt, nt)) return GCOMP_OK;
    size_t total = 0;
    if (gm_gather_counts(g, g->gsz_recv, nt, &total) != GCOMP_OK) {
        gm_group_shared_fail(b, g, GCOMP_E_LIMIT, -1, g->t0);
        return GCOMP_OK; /* every rank computed the same sums: all skip */
    }
    /* Reserved at set-up for every owner's message at its bound (the same words on every
     * rank: all skip together). */
    if (total > g->grecv.cap) {
        gm_group_shared_fail(b, g, GCOMP_E_CORRUPT, -1, g->t0);
        return GCOMP_OK;
    }
    int rc = MPI_Iallgatherv(g->gsend.p, (int)g->gsend_len, MPI_BYTE, g->grecv.p, g->cnt_r,
                             g->dsp_r, MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgatherv (owner messages)");
    g->nreq = 1;
    g->bytes_sent += g->gsend_len * (P - 1);
    g->bytes_recv += total - g->gsend_len;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        t->call.bytes_sent += gm_size_len(g->gsz_send[k]) * (P - 1) + 8 * (P - 1);
        t->call.bytes_received += 8 * (P - 1);
        for (size_t r = 0; r < P; r++)
            if ((int)r != g->xrank) t->call.bytes_received += gm_size_len(g->gsz_recv[r * nt + k]);
    }
    return GCOMP_OK;
}

static gcomp_status ow_decode(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->st != GCOMP_OK) return GCOMP_OK;
    size_t P = (size_t)g->xsize, nt = g->nt;
    int me = g->xrank;
    const uint8_t *grecv = g->grecv.p;
    for (size_t r = 0; r < P; r++) g->pos[r] = (size_t)g->dsp_r[r];
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t mine = reg_len(t, me);
        uint64_t t0 = gm_now_ns();
        for (size_t j = 0; j < P; j++) {
            size_t len = gm_size_len(g->gsz_recv[j * nt + k]), lj = reg_len(t, (int)j);
            const uint8_t *m = grecv + g->pos[j];
            g->pos[j] += len;
            if (!lj || g->st != GCOMP_OK) continue;
            gcomp_status st =
                gm_decode_checked(lj == mine ? owt(t)->owner : owt(t)->other, m, len,
                                  owt(t)->owner_fp, lj, t->io + owt(t)->reg[j], b->scale);
            if (st != GCOMP_OK) gm_group_shared_fail(b, g, st, (int)j, g->t0 + k);
        }
        /* An owner's sum that overflowed already failed its re-compression; this catches a
         * decoder that overflows on finite values (same messages everywhere: same verdict). */
        if (g->st == GCOMP_OK && !gm_finite(t->io, t->n))
            gm_group_overflow(b, g, g->t0 + k, "decoded owner messages");
        t->call.codec_ns += gm_now_ns() - t0;
    }
    return GCOMP_OK;
}

/* While the owners' messages travel: zero what the decoders add into (rsag: all of it;
 * sparse: only this rank's region, the rest was zeroed while slicing). */
static gcomp_status ow_zero(gcomp_mpi_bucket *b, gm_group *g) {
    const ow_group *og = g->priv;
    int me = g->xrank;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        int rc = og->rsag ? gm_zero_progress(g, t->io, t->n)
                          : gm_zero_progress(g, t->io + owt(t)->reg[me], reg_len(t, me));
        t->call.codec_ns += gm_now_ns() - t0;
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Testall (owner messages)");
    }
    return GCOMP_OK;
}

/* ---- the components ------------------------------------------------------------------------ */

static void ow_steps(gcomp_mpi_bucket *b, gm_group *g) {
    (void)b;
    if (((const ow_group *)g->priv)->rsag)
        gm_add_step(g, false, rsag_encode, "compressing chunks (rsag)");
    else
        gm_add_step(g, false, sparse_encode, "compressing and slicing (sparse)");
    gm_add_step(g, true, ow_sizes, "exchanging slice sizes (MPI_Ialltoall)");
    gm_add_step(g, true, ow_data, "sending regions to their owners (MPI_Ialltoallv)");
    gm_add_step(g, false, ow_owner, "reducing and re-compressing at the owner");
    gm_add_step(g, true, ow_gsizes, "exchanging owner message sizes (MPI_Iallgather)");
    gm_add_step(g, true, ow_gdata, "exchanging owner messages (MPI_Iallgatherv)");
    gm_add_overlap(g, ow_zero);
    gm_add_step(g, false, ow_decode, "decoding owner messages");
}

/* Send areas per destination, and every receive buffer at its bound: the contributions to
 * my regions (P of them per tensor) and every owner's message (reserved in virtual memory;
 * pages are touched only as far as messages reach), so that a call never allocates. */
static gcomp_status ow_reserve(gcomp_mpi_bucket *b, gm_group *g) {
    ow_group *og = g->priv; /* again after a retune's planning (mpi_strategy.h) */
    if (!og && !(og = gm_calloc(1, sizeof *og))) return GCOMP_E_NOMEM;
    g->priv = og;
    og->rsag = b->t[g->t0].S == &gm_strategy_rsag;
    size_t P = (size_t)g->xsize, off = 0, recv_max = 0, gcap = 0, all = 0;
    if (!og->dest_off && !(og->dest_off = gm_calloc(P + 1, sizeof *og->dest_off)))
        return GCOMP_E_NOMEM;
    int me = g->xrank;
    for (size_t j = 0; j < P; j++) {
        og->dest_off[j] = off;
        for (size_t i = g->t0; i < g->t1; i++) {
            gm_tensor *t = &b->t[i];
            size_t lj = reg_len(t, (int)j);
            if (!lj) continue;
            if (og->rsag)
                off += gcomp_encode_bound(owt(t)->chunk[j]);
            else if ((int)j != me)
                off += gm_slice_bound(lj);
        }
    }
    og->dest_off[P] = off;
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        const ow_tensor *o = owt(t);
        size_t mine = reg_len(t, me);
        for (size_t j = 0; j < P; j++) all += owner_bound(o, reg_len(t, (int)j));
        if (!mine) continue;
        recv_max += P * (og->rsag ? gcomp_encode_bound(o->chunk[me]) : gm_slice_bound(mine));
        gcap += gcomp_encode_bound(o->owner);
    }
    if (off > INT_MAX || recv_max > INT_MAX || gcap > INT_MAX) return GCOMP_E_LIMIT;
    if (all > INT_MAX) all = INT_MAX; /* more fails as GCOMP_E_LIMIT at run time anyway */
    if (gm_reserve(&g->send, off ? off : 1) != GCOMP_OK ||
        gm_reserve(&g->recv, recv_max ? recv_max : 1) != GCOMP_OK ||
        gm_reserve(&g->gsend, gcap ? gcap : 1) != GCOMP_OK ||
        gm_reserve(&g->grecv, all ? all : 1) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

static void ow_group_free(gm_group *g) {
    ow_group *og = g->priv;
    if (og) gm_free(og->dest_off);
    gm_free(og);
}

/* The bound of an owner message for a region of `len` elements: regions are n/P rounded
 * down or up, and this rank's owner compressor knows one of the two lengths. */
static size_t owner_bound(const ow_tensor *o, size_t len) {
    return len == 0 ? 0 : len == o->bound_len[0] ? o->bound[0] : o->bound[1];
}

static gcomp_status ow_setup(gcomp_mpi_bucket *b, gm_tensor *t, gcomp_error *err) {
    (void)b;
    ow_tensor *o = gm_calloc(1, sizeof *o);
    if (!o) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    t->priv = o;
    bool rsag = t->S == &gm_strategy_rsag;
    int P = t->xsize, me = t->xrank;
    gcomp_error e2;
    gcomp_status st;
    o->nreg = P;
    o->reg = gm_calloc((size_t)P + 1, sizeof *o->reg);
    if (!o->reg) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    for (int j = 0; j <= P; j++) o->reg[j] = gm_region_lo(t->n, P, j);
    size_t mine = o->reg[me + 1] - o->reg[me];
    /* rsag: the owner of a region decodes every rank's chunk of it (with per-rank seeds, a
     * decoder per rank); sparse: every rank decodes only owners' messages. */
    if (rsag) {
        st = gm_peers_setup(&o->peers, t, mine, 0, 0, err);
        if (st != GCOMP_OK) return st;
    } else {
        bool own;
        st = gm_rank_spec(t, me, t->wspec, sizeof t->wspec, NULL, &own);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "tensor '%s': no per-rank spec for '%s'", t->name, t->spec);
    }
    st = owner_spec(t, o->ospec, sizeof o->ospec, &o->owner_fp);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': no owner-side spec for '%s'", t->name, t->spec);
    if (mine) {
        st = gcomp_compressor_create(&o->owner, o->ospec, mine, 0, 0, &e2);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "tensor '%s': owner compressor: %s", t->name, e2.message);
    }
    /* The bounds of both region lengths, for receiving every owner's message. */
    size_t lo = t->n / (size_t)P;
    o->bound_len[0] = lo;
    o->bound_len[1] = lo + 1;
    for (int k = 0; k < 2; k++) {
        size_t len = o->bound_len[k];
        if (!len) continue;
        if (len == mine) {
            o->bound[k] = gcomp_encode_bound(o->owner);
            continue;
        }
        gcomp_compressor *tmp = NULL;
        st = gcomp_compressor_create(&tmp, o->ospec, len, 0, 0, &e2);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "tensor '%s': owner compressor: %s", t->name, e2.message);
        o->bound[k] = gcomp_encode_bound(tmp);
        gcomp_compressor_free(o->other);
        o->other = tmp;
    }
    if (rsag) {
        o->chunk = gm_calloc((size_t)P, sizeof *o->chunk);
        if (!o->chunk) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
        for (int j = 0; j < P; j++) {
            size_t len = o->reg[j + 1] - o->reg[j];
            if (!len) continue;
            st = gcomp_compressor_create(&o->chunk[j], t->wspec, len, 0, 0, &e2);
            if (st != GCOMP_OK)
                return gm_fail(err, st, "tensor '%s': chunk compressor: %s", t->name, e2.message);
        }
        return GCOMP_OK;
    }
    st = gcomp_compressor_create(&t->c, t->wspec, t->n, t->rows, t->cols, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    if (gm_reserve(&o->own, gcomp_encode_bound(t->c)) != GCOMP_OK)
        return gm_fail(err, GCOMP_E_NOMEM, "tensor '%s': out of memory", t->name);
    return GCOMP_OK;
}

static void ow_free(gm_tensor *t) {
    ow_tensor *o = t->priv;
    if (!o) return;
    if (o->chunk)
        for (int j = 0; j < o->nreg; j++) gcomp_compressor_free(o->chunk[j]);
    gm_free(o->chunk);
    gcomp_compressor_free(o->owner);
    gcomp_compressor_free(o->other);
    gm_free(o->reg);
    gm_peers_free(&o->peers);
    gm_buf_free(&o->own);
    gm_free(o);
}

/* Checkpoint slots (docs/FORMAT.md): 0 the worker compressor (sparse), 1 the owner's,
 * 2.. rsag's chunk compressors, one per region. */
static int rsag_slots(const gm_tensor *t) {
    return 2 + t->xsize;
}

static gcomp_compressor *ow_slot(const gm_tensor *t, int k) {
    const ow_tensor *o = t->priv;
    if (k == 0) return t->c;
    if (!o) return NULL;
    if (k == 1) return o->owner;
    return o->chunk && k - 2 < o->nreg ? o->chunk[k - 2] : NULL;
}

static void ow_owner_view(const gm_tensor *t, gm_owner_view *v) {
    const ow_tensor *o = t->priv;
    if (!o) return;
    v->spec = o->ospec;
    v->c = o->owner;
    v->offset = o->reg[t->xrank];
    v->count = o->reg[t->xrank + 1] - o->reg[t->xrank];
}

/* Both cut the tensor into regions, so neither can carry a codec that needs the whole
 * matrix, nor a multi-phase one. */
static int ow_carries(const gm_query *q, const char **why) {
    if (q->info->flags & GCOMP_SPEC_MULTIPHASE) {
        *why = "a multi-phase codec runs only with the allreduce strategy (its factors sum "
               "linearly; it exchanges no messages)";
        return -2;
    }
    if (q->info->flags & GCOMP_SPEC_NEEDS_SHAPE) {
        *why = "it cuts the tensor into regions, and the codec needs the matrix shape";
        return -1;
    }
    return 0;
}

/*
 * rsag is auto's choice (2, above allgather) for a codec that is itself a quantizer (its
 * gcomp_codec_info says GCOMP_CODEC_QUANTIZER: int8, int4, qsgd; not a quantizer as the
 * values= of a selector, `none:values=int8` included) whose owners keep error feedback
 * (GCOMP_SPEC_CONTRACTION), that is not saturating and keeps at least 4 bits per value.
 * Excluded, each measured on the 4-rank MLP (gradcomp_mpi.h, gcomp_mpi_strategy_auto):
 * saturating twobit (a fixed +-t cannot carry the sum of P ranks' +-t: the owner falls ever
 * further behind), 1-bit sign (the owner's second quantisation doubles what the residuals
 * hold back: 38 % after one epoch against 84 % by allgather), and quantizers that are no
 * contraction (qsgd at few levels, ternary: an owner without feedback adds the codec's
 * variance a second time).
 */
static int rsag_query(const gm_query *q, const char **why) {
    int can = ow_carries(q, why);
    if (can < 0) return can;
    const gcomp_spec_info *d = q->info;
    bool quantizer =
        (d->flags & GCOMP_SPEC_QUANTIZER) && d->codec && (d->codec->flags & GCOMP_CODEC_QUANTIZER);
    if (quantizer && (d->flags & GCOMP_SPEC_CONTRACTION) && !(d->flags & GCOMP_SPEC_SATURATING) &&
        d->value_bits >= 4)
        return 2;
    return 0;
}

/* Asked for by name only: its traffic is bounded whatever P, but it re-selects at the
 * owners, so auto keeps the exact allgather for sparse codecs. */
static int sparse_query(const gm_query *q, const char **why) {
    return ow_carries(q, why);
}

const gm_strategy gm_strategy_rsag = {
    .version = GM_STRATEGY_VERSION,
    .negotiated = true,
    GM_NAMES("rsag"),
    .id = GCOMP_MPI_RSAG,
    .query = rsag_query,
    .tensor_setup = ow_setup,
    .tensor_free = ow_free,
    .reserve = ow_reserve,
    .steps = ow_steps,
    .group_free = ow_group_free,
    .state_slots = rsag_slots,
    .state_slot = ow_slot,
    .owner = ow_owner_view,
};

const gm_strategy gm_strategy_sparse = {
    .version = GM_STRATEGY_VERSION,
    .negotiated = true,
    GM_NAMES("sparse"),
    .id = GCOMP_MPI_SPARSE,
    .query = sparse_query,
    .tensor_setup = ow_setup,
    .tensor_free = ow_free,
    .reserve = ow_reserve,
    .steps = ow_steps,
    .group_free = ow_group_free,
    .state_slot = ow_slot,
    .owner = ow_owner_view,
};

/*
 * mpi_allgather.c - the allgather strategy: every rank gets every rank's message and
 * decodes them all (the exchange of GRACE's sparse communicators and of DGC).
 *
 *   encode     each tensor's message, back to back in the send buffer
 *   sizes      MPI_Iallgather of one size word per tensor (or a failure marker)
 *   data       MPI_Iallgatherv of the messages, exactly their sizes (no padding to the
 *              largest: with top-k the sizes differ by rank, and a bitmap-coded message
 *              can be 10x an Elias-Fano one)
 *   decode     for each tensor: zero, then decode-add every rank's message in rank order
 *              (the same order on every rank, so all ranks get the same floats)
 *
 * Works for any codec, since only the decoder interprets a message.  An empty selection
 * is a valid (small) message; a rank with nothing at all still sends its size words.
 * Per-rank traffic is (P-1) x its message: fine for small P or very sparse messages; the
 * sparse strategy (mpi_owner.c) bounds it instead.
 */
#include "mpi_strategy.h"

#include <limits.h>

/* Per tensor: with per-rank seeds, a decoder for each other rank's messages. */
typedef struct ag_tensor {
    gm_peers peers;
} ag_tensor;

static gcomp_status ag_encode(gcomp_mpi_bucket *b, gm_group *g) {
    uint8_t *send = g->send.p;
    size_t off = 0;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t len = 0;
        uint64_t t0 = gm_now_ns();
        gcomp_status st = gcomp_encode(t->c, t->io, send + off, g->send.cap - off, &len);
        t->call.codec_ns += gm_now_ns() - t0;
        if (st != GCOMP_OK) {
            g->sz_send[k] = gm_marker(st, g->xrank);
            gm_group_local_fail(b, g, st, g->t0 + k, "encode");
            continue;
        }
        g->sz_send[k] = gm_size_word(t->fp, len);
        t->msgs[0] = (gm_msgref){send + off, len, 0, t->n};
        t->nmsg = 1;
        off += len;
    }
    g->send_len = off;
    return GCOMP_OK;
}

static gcomp_status ag_sizes(gcomp_mpi_bucket *b, gm_group *g) {
    int nt = (int)g->nt;
    int rc = MPI_Iallgather(g->sz_send, nt, MPI_UINT64_T, g->sz_recv, nt, MPI_UINT64_T, g->xc,
                            &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgather (message sizes)");
    g->nreq = 1;
    gm_count_size_words(b, g);
    return GCOMP_OK;
}

static gcomp_status ag_data(gcomp_mpi_bucket *b, gm_group *g) {
    size_t P = (size_t)g->xsize, nt = g->nt;
    if (gm_scan_markers(b, g, g->sz_recv, P * nt, nt)) return GCOMP_OK; /* all ranks skip */
    if (gm_scan_specs(b, g, g->sz_recv, P * nt, nt)) return GCOMP_OK;
    size_t total = 0;
    if (gm_gather_counts(g, g->sz_recv, nt, &total) != GCOMP_OK) {
        gm_group_shared_fail(b, g, GCOMP_E_LIMIT, -1, g->t0);
        return GCOMP_OK; /* every rank computed the same sums: all skip */
    }
    /* Reserved at set-up for P messages at their bound: a larger size is no message of
     * this spec (the same words on every rank: all skip together). */
    if (total > g->recv.cap) {
        gm_group_shared_fail(b, g, GCOMP_E_CORRUPT, -1, g->t0);
        return GCOMP_OK;
    }
    int rc = MPI_Iallgatherv(g->send.p, (int)g->send_len, MPI_BYTE, g->recv.p, g->cnt_r, g->dsp_r,
                             MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgatherv (messages)");
    g->nreq = 1;
    g->bytes_sent += g->send_len * (P - 1);
    g->bytes_recv += total - g->send_len;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        t->call.bytes_sent += gm_size_len(g->sz_send[k]) * (P - 1);
        for (size_t r = 0; r < P; r++)
            if ((int)r != g->xrank) t->call.bytes_received += gm_size_len(g->sz_recv[r * nt + k]);
    }
    return GCOMP_OK;
}

static gcomp_status ag_decode(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->st != GCOMP_OK) return GCOMP_OK;
    size_t P = (size_t)g->xsize, nt = g->nt;
    const uint8_t *recv = g->recv.p;
    for (size_t r = 0; r < P; r++) g->pos[r] = (size_t)g->dsp_r[r];
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        for (size_t r = 0; r < P; r++) {
            size_t len = gm_size_len(g->sz_recv[r * nt + k]);
            const ag_tensor *at = t->priv;
            gcomp_compressor *dc = gm_peer_decoder(&at->peers, (int)r, t->c);
            uint64_t fp = gm_peer_fp(&at->peers, (int)r, t->fp);
            gcomp_status st = g->st != GCOMP_OK ? GCOMP_OK
                                                : gm_decode_checked(dc, recv + g->pos[r], len, fp,
                                                                    t->n, t->io, b->scale);
            g->pos[r] += len;
            if (st != GCOMP_OK) gm_group_shared_fail(b, g, st, (int)r, g->t0 + k);
        }
        /* Every rank decoded the same messages in the same order: the same bits, so the
         * same verdict everywhere. */
        if (g->st == GCOMP_OK && !gm_finite(t->io, t->n))
            gm_group_overflow(b, g, g->t0 + k, "sum of the decoded messages");
        t->call.codec_ns += gm_now_ns() - t0;
    }
    return GCOMP_OK;
}

/* While the messages travel: the outputs are zeroed for decode-add (a full write of
 * every tensor, as long as the encode itself on big tensors: better hidden). */
static gcomp_status ag_zero(gcomp_mpi_bucket *b, gm_group *g) {
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        int rc = gm_zero_progress(g, t->io, t->n);
        t->call.codec_ns += gm_now_ns() - t0;
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Testall (messages)");
    }
    return GCOMP_OK;
}

static void ag_steps(gcomp_mpi_bucket *b, gm_group *g) {
    (void)b;
    gm_add_step(g, false, ag_encode, "compressing (allgather)");
    gm_add_step(g, true, ag_sizes, "exchanging message sizes (MPI_Iallgather)");
    gm_add_step(g, true, ag_data, "exchanging messages (MPI_Iallgatherv)");
    gm_add_overlap(g, ag_zero);
    gm_add_step(g, false, ag_decode, "decoding (allgather)");
}

/* The send buffer holds this rank's messages at their bound; the receive buffer every
 * rank's (all ranks have the same bound: the same codec and n, seeds aside).  Reserved
 * now, in virtual memory only until messages reach that far, so that a call never
 * allocates. */
static gcomp_status ag_reserve(gcomp_mpi_bucket *b, gm_group *g) {
    size_t cap = 0;
    for (size_t i = g->t0; i < g->t1; i++) cap += gcomp_encode_bound(b->t[i].c);
    if (cap > INT_MAX) return GCOMP_E_LIMIT;
    /* An exchange above MPI's int counts fails as GCOMP_E_LIMIT at run time anyway. */
    size_t all = cap > INT_MAX / (size_t)g->xsize ? (size_t)INT_MAX : cap * (size_t)g->xsize;
    if (gm_reserve(&g->send, cap) != GCOMP_OK || gm_reserve(&g->recv, all) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

static gcomp_status ag_setup(gcomp_mpi_bucket *b, gm_tensor *t, gcomp_error *err) {
    (void)b;
    ag_tensor *at = gm_calloc(1, sizeof *at);
    if (!at) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    t->priv = at;
    gcomp_status st = gm_peers_setup(&at->peers, t, t->n, t->rows, t->cols, err);
    if (st != GCOMP_OK) return st;
    gcomp_error e2;
    st = gcomp_compressor_create(&t->c, t->wspec, t->n, t->rows, t->cols, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    return GCOMP_OK;
}

static void ag_free(gm_tensor *t) {
    ag_tensor *at = t->priv;
    if (!at) return;
    gm_peers_free(&at->peers);
    gm_free(at);
}

/* Any codec that sends messages; the default for what sums neither linearly nor through an
 * owner (1).  Multi-phase codecs exchange no messages. */
static int ag_query(const gm_query *q, const char **why) {
    if (q->info->flags & GCOMP_SPEC_MULTIPHASE) {
        *why = "a multi-phase codec runs only with the allreduce strategy (its factors sum "
               "linearly; it exchanges no messages)";
        return -2;
    }
    return 1;
}

const gm_strategy gm_strategy_allgather = {
    .version = GM_STRATEGY_VERSION,
    .negotiated = true,
    GM_NAMES("allgather"),
    .id = GCOMP_MPI_ALLGATHER,
    .query = ag_query,
    .tensor_setup = ag_setup,
    .tensor_free = ag_free,
    .reserve = ag_reserve,
    .steps = ag_steps,
};

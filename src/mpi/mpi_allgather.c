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
#include "mpi_internal.h"

#include <limits.h>

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
        g->sz_send[k] = len;
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
    uint64_t total = 0;
    for (size_t r = 0; r < P; r++) {
        uint64_t c = 0;
        for (size_t k = 0; k < nt; k++) c += g->sz_recv[r * nt + k];
        if (c > INT_MAX || total + c > INT_MAX) {
            gm_group_shared_fail(b, g, GCOMP_E_LIMIT, -1, g->t0);
            return GCOMP_OK; /* every rank computed the same sums: all skip */
        }
        g->cnt_r[r] = (int)c;
        g->dsp_r[r] = (int)total;
        total += c;
    }
    if (gm_reserve(&g->recv, total ? total : 1) != GCOMP_OK) return GCOMP_E_NOMEM;
    int rc = MPI_Iallgatherv(g->send.p, (int)g->send_len, MPI_BYTE, g->recv.p, g->cnt_r, g->dsp_r,
                             MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgatherv (messages)");
    g->nreq = 1;
    g->bytes_sent += g->send_len * (P - 1);
    g->bytes_recv += total - g->send_len;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        t->call.bytes_sent += g->sz_send[k] * (P - 1);
        for (size_t r = 0; r < P; r++)
            if ((int)r != g->xrank) t->call.bytes_received += g->sz_recv[r * nt + k];
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
            size_t len = (size_t)g->sz_recv[r * nt + k];
            gcomp_compressor *dc = t->dec && t->dec[r] ? t->dec[r] : t->c;
            uint64_t fp = t->rfp ? t->rfp[r] : t->fp;
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

void gm_steps_allgather(gm_group *g) {
    gm_add_step(g, false, ag_encode, "compressing (allgather)");
    gm_add_step(g, true, ag_sizes, "exchanging message sizes (MPI_Iallgather)");
    gm_add_step(g, true, ag_data, "exchanging messages (MPI_Iallgatherv)");
    gm_add_overlap(g, ag_zero);
    gm_add_step(g, false, ag_decode, "decoding (allgather)");
}

gcomp_status gm_reserve_allgather(gcomp_mpi_bucket *b, gm_group *g) {
    size_t cap = 0;
    for (size_t i = g->t0; i < g->t1; i++) cap += gcomp_encode_bound(b->t[i].c);
    if (cap > INT_MAX) return GCOMP_E_LIMIT;
    return gm_reserve(&g->send, cap);
}

/*
 * mpi_ps_serve.c - the servers' loop (gcomp_mpi_ps_serve) and their optimizer.
 *
 * One table of requests, tested with MPI_Testsome: for every registered sub-bucket and
 * every pusher a pre-posted receive of its push frame (at the frame's bound, so the
 * payload lands in place) and a slot for the reply sent to it; for every worker a receive
 * of its shutdown word.  Init and pull requests are rare and of any size: the loop probes
 * each bucket's communicator for them (MPI_Improbe / MPI_Mrecv).
 *
 * sync   A push is only marked on arrival; the pushes are then checked and decoded in
 *        pusher order as soon as a prefix of them is there (pusher 0 zeroes the sum), so
 *        a round's sum is the same floats whatever the arrival order: the allgather
 *        strategy's decode-add, in the same order, with the same scale.  When the last one
 *        is in, the round is applied (the sum stored, or the optimizer's step) and one
 *        reply goes to every pusher; only then are their receives posted again (a pusher
 *        cannot push again before its reply).  A refused push voids the round for all.
 * async  Each push is checked, decoded and applied on arrival, and answered alone with the
 *        current weights.  Staleness = updates applied since the weights it was computed
 *        on (the version it carries).
 *
 * State changes only after a push has been checked whole: decoding goes into a scratch
 * sum (`acc`), the optimizer first checks that its result is finite for every part
 * (gm_ps_sgd_check) and only then writes (gm_ps_sgd_apply), so a refused push or an
 * overflowing step leaves weights, momentum and residuals as they were.
 *
 * Failure.  Every wait is bounded by serve's timeout.  sync: a round that started and did
 * not complete in time, or a job that went silent, is GCOMP_E_TIMEOUT (the communicator
 * fails: the workers' waits fail too).  async: a pusher silent that long is declared lost;
 * its pushes from then on (even one already received) are refused with GCOMP_E_FAILED,
 * replies to it are abandoned (their buffers go to the communicator's graveyard at the
 * end, never freed under MPI), and the others go on.
 */
#include "mpi_ps.h"

#include <math.h>
#include <stdio.h>

/* ---- the optimizer ----------------------------------------------------------------------- */

/*
 * SGD with momentum and weight decay, the reference trainer's formulas (gtrain_sgd_step)
 * written the same way, so that a server-side step gives the same floats as the worker's:
 *   v = m v + r g + wd w;  w -= lr v            (momentum; Sutskever et al. 2013 form)
 *   d = r g + wd w;  v = m v + d;  w -= lr (d + m v)   (Nesterov)
 *   w -= lr (r g + wd w)                         (no momentum)
 * with r = rescale (MXNet's rescale_grad).  Check first, write after: nothing changes
 * unless every result is finite.
 */
static gcomp_status sgd_check(const ps_part *p, float lr) {
    const float *g = p->acc.p, *w = p->store.p, *v = p->mom.p;
    const float r = p->opt.rescale, wd = p->opt.weight_decay, mu = p->opt.momentum;
    uint32_t mx = 0;
    if (mu == 0.0f || !v) {
        for (size_t i = 0; i < p->n; i++) {
            uint32_t u = gm_abs_bits(w[i] - lr * (r * g[i] + wd * w[i]));
            mx = u > mx ? u : mx;
        }
    } else if (p->opt.nesterov) {
        for (size_t i = 0; i < p->n; i++) {
            float d = r * g[i] + wd * w[i];
            float vi = mu * v[i] + d;
            uint32_t u = gm_abs_bits(w[i] - lr * (d + mu * vi)), a = gm_abs_bits(vi);
            mx = u > mx ? u : mx;
            mx = a > mx ? a : mx;
        }
    } else {
        for (size_t i = 0; i < p->n; i++) {
            float vi = mu * v[i] + r * g[i] + wd * w[i];
            uint32_t u = gm_abs_bits(w[i] - lr * vi), a = gm_abs_bits(vi);
            mx = u > mx ? u : mx;
            mx = a > mx ? a : mx;
        }
    }
    return mx < GM_INF_BITS ? GCOMP_OK : GCOMP_E_NONFINITE;
}

static void sgd_apply(ps_part *p, float lr) {
    const float *restrict g = p->acc.p;
    float *restrict w = p->store.p, *restrict v = p->mom.p;
    const float r = p->opt.rescale, wd = p->opt.weight_decay, mu = p->opt.momentum;
    if (mu == 0.0f || !v) {
        for (size_t i = 0; i < p->n; i++) w[i] -= lr * (r * g[i] + wd * w[i]);
    } else if (p->opt.nesterov) {
        for (size_t i = 0; i < p->n; i++) {
            float d = r * g[i] + wd * w[i];
            float vi = mu * v[i] + d;
            v[i] = vi;
            w[i] -= lr * (d + mu * vi);
        }
    } else {
        for (size_t i = 0; i < p->n; i++) {
            float vi = mu * v[i] + r * g[i] + wd * w[i];
            v[i] = vi;
            w[i] -= lr * vi;
        }
    }
}

/* ---- the loop's state ----------------------------------------------------------------------- */

enum { RQ_PUSH = 1, RQ_SEND = 2, RQ_STOP = 3 };

typedef struct srv_rq {
    uint8_t kind;
    int q;        /* pusher (PUSH, SEND) or worker (STOP) */
    ps_group *pg; /* PUSH, SEND */
    void *buf;    /* SEND: what it reads (for the graveyard) */
} srv_rq;

typedef struct srv {
    gcomp_mpi_ps *ps;
    uint64_t timeout_ns, t_last;
    MPI_Request *req;
    srv_rq *rq;
    int *idx;
    MPI_Status *sta;
    int n, stop0;
    uint64_t *stopbuf;
    uint64_t *heard; /* per worker: last message */
    bool *stopped, *lost;
    bool *judged;     /* per worker: it pushes (its silence means it is gone) */
    uint64_t rest_t0; /* async: when every worker that pushes had settled (0: not yet) */
    bool has_hier, async;
    int waiting; /* pushes received and not yet applied */
    uint32_t nlost;
    gcomp_error *err;
} srv;

/* A group's requests in the server's table: pusher q's push receive at rreq0 + q, its
 * replies (pushes, pulls) at send_slot, its init replies at send_slot(..., true). */
enum { PS_REQ_PER_PUSHER = 3 };

static int send_slot(const ps_group *pg, int q, bool init) {
    return pg->rreq0 + (init ? 2 : 1) * pg->npush + q;
}

static bool worker_lost(const srv *v, int rank) {
    int w = v->ps->role[rank];
    return w >= 0 && v->lost[w];
}

/* Waits (bounded) until a reply slot of pusher q of pg (its init slot when `init`) is
 * free: its last reply there has left.  A lost pusher's slot is abandoned instead (the
 * request stays in the table, buried at the end). */
static gcomp_status free_slot(srv *v, ps_group *pg, int q, bool init) {
    int k = send_slot(pg, q, init);
    if (v->req[k] == MPI_REQUEST_NULL) return GCOMP_OK;
    if (worker_lost(v, ps_pusher_rank(v->ps, pg->mode, q))) return GCOMP_OK;
    uint64_t t0 = gm_now_ns();
    unsigned spins = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(&v->req[k], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(v->ps->comm, v->err, rc, "MPI_Test (reply)");
        if (flag) return GCOMP_OK;
        uint64_t now = gm_now_ns();
        if (now - t0 > v->timeout_ns)
            return gm_comm_fail(v->ps->comm, v->err, GCOMP_E_TIMEOUT,
                                "parameter server: a reply to rank %d did not leave in %.1f s",
                                ps_pusher_rank(v->ps, pg->mode, q), (double)(now - t0) * 1e-9);
        gm_backoff(&spins, now - t0);
    }
}

static gcomp_status send_reply(srv *v, ps_group *pg, int q, bool init, void *buf, size_t len,
                               int tag) {
    int k = send_slot(pg, q, init), r = ps_pusher_rank(v->ps, pg->mode, q);
    if (v->req[k] != MPI_REQUEST_NULL) { /* a lost pusher's abandoned send: keep it apart */
        gcomp_mpi_comm *c = v->ps->comm;
        MPI_Request *keep = gm_alloc(sizeof *keep);
        if (keep) {
            *keep = v->req[k];
            gm_comm_bury(c, keep, 1, NULL, 0, NULL, 0);
        }
        v->req[k] = MPI_REQUEST_NULL;
    }
    int rc = MPI_Isend(buf, (int)len, MPI_BYTE, r, tag, pg->b->bc, &v->req[k]);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(v->ps->comm, v->err, rc, "MPI_Isend (reply)");
    v->rq[k].buf = buf;
    gm_ps_count(v->ps, r, false, len);
    return GCOMP_OK;
}

static gcomp_status post_push(srv *v, ps_group *pg, int q) {
    int k = pg->rreq0 + q, r = ps_pusher_rank(v->ps, pg->mode, q);
    int rc =
        MPI_Irecv(pg->slot[q].in.p, (int)pg->push_cap, MPI_BYTE, r, pg->tag, pg->b->bc, &v->req[k]);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(v->ps->comm, v->err, rc, "MPI_Irecv (push)");
    return GCOMP_OK;
}

/* ---- pushes ----------------------------------------------------------------------------- */

/* Checks pusher q's frame and decodes its entries into the parts' scratch sums (zeroed
 * first when `zero`).  Returns the verdict; *marker receives the failure's marker (the
 * frame's own when the worker reported one). */
static gcomp_status take_push(srv *v, ps_group *pg, int q, bool zero, ps_hdr *h, uint64_t *marker) {
    gcomp_mpi_ps *ps = v->ps;
    const uint8_t *f = pg->slot[q].in.p;
    size_t len = pg->slot[q].in_len;
    int culprit = ps_pusher_rank(ps, pg->mode, q);
    gcomp_status st = gm_ps_open(f, len, false, pg->m, h);
    uint64_t round = v->async ? pg->slot[q].round : pg->round;
    if (st == GCOMP_OK && (h->kind != PS_PUSH || h->who != (uint32_t)q || h->group != pg->gi ||
                           h->round != round || h->session != ps->session))
        st = GCOMP_E_MISMATCH;
    if (st == GCOMP_OK && (h->marker & GM_MARK)) {
        *marker = h->marker; /* the worker's own failure, passed on */
        return gm_marker_status(h->marker);
    }
    if (st == GCOMP_OK && h->m != pg->m) st = GCOMP_E_MISMATCH;
    size_t total = 0;
    for (size_t e = 0; st == GCOMP_OK && e < pg->m; e++) {
        uint32_t ti, pj;
        uint64_t l;
        ps_get_entry(f, e, &ti, &pj, &l);
        if (ti != pg->et[e] || pj != pg->ep[e])
            st = GCOMP_E_MISMATCH; /* not a key of ours */
        else if (l > len)
            st = GCOMP_E_CORRUPT;
        else
            total += (size_t)l;
    }
    if (st == GCOMP_OK && total > len - ps_frame_fixed(pg->m)) st = GCOMP_E_TRUNCATED;
    float scale = (h->flags & PS_F_AVERAGE) ? 1.0f / (float)ps->W : 1.0f;
    const uint8_t *msg = f + ps_frame_fixed(pg->m);
    for (size_t e = 0; st == GCOMP_OK && e < pg->m; e++) {
        gm_tensor *t = &pg->b->t[pg->et[e]];
        ps_tensor *pt = t->priv;
        ps_part *p = &pt->part[pg->ep[e]];
        uint64_t l = gcomp__get64(f + PS_HDR + PS_ENTRY * e + 8);
        if (zero) memset(p->acc.p, 0, p->n * sizeof(float));
        gcomp_compressor *dec = p->wdec ? p->wdec[q] : p->dec;
        st = gm_decode_checked(dec, msg, (size_t)l, pt->wfp[q], p->n, p->acc.p, scale);
        msg += l;
        pt->stats.pushes++;
        pt->stats.bytes_pushed += l;
    }
    if (st != GCOMP_OK) *marker = gm_marker(st, culprit);
    return st;
}

/* Counts a refused push. */
static void refused(srv *v, int rank) {
    v->ps->stats.refused++;
    v->ps->peer[rank].refused++;
}

/* The reply frame for pg in buf: the parts' stored values (dense) or, for a sync round with
 * compressed pulls, their messages (`msgs`, already encoded into the frame by the caller).
 * A failed verdict sends the marker and no payload. */
static size_t build_reply(srv *v, ps_group *pg, uint8_t *buf, int kind, uint64_t marker,
                          uint32_t stale, bool compressed) {
    size_t m = marker ? 0 : pg->m, off = ps_frame_fixed(m), dense = 0;
    uint64_t version = UINT64_MAX;
    for (size_t e = 0; e < m; e++) {
        ps_tensor *pt = pg->b->t[pg->et[e]].priv;
        ps_part *p = &pt->part[pg->ep[e]];
        size_t len;
        if (compressed) {
            len = (size_t)gcomp__get64(buf + PS_HDR + PS_ENTRY * e + 8); /* written by encode */
        } else {
            len = p->n * sizeof(float);
            memcpy(buf + off, p->store.p, len);
            dense += len;
        }
        ps_put_entry(buf, e, pg->et[e], pg->ep[e], len);
        pt->stats.bytes_pulled += len;
        off += len;
        if (p->sversion < version) version = p->sversion;
    }
    ps_hdr h = {kind,
                compressed ? PS_F_COMPRESSED : 0u,
                (uint32_t)pg->me,
                0,
                v->nlost,
                stale,
                (uint32_t)m,
                pg->round,
                version == UINT64_MAX ? 0 : version,
                marker,
                0,
                0};
    gm_ps_put_hdr(buf, true, &h);
    gm_ps_seal(buf, m);
    if (compressed) return off;
    gm_ps_seal_dense(buf, m, dense);
    return off + 4;
}

/* sync: the round is complete (every push decoded, or the round void): apply it, answer
 * every pusher, post their receives again. */
static gcomp_status finish_round(srv *v, ps_group *pg) {
    gcomp_mpi_ps *ps = v->ps;
    uint64_t marker = pg->rst != GCOMP_OK ? pg->rmark : 0;
    bool update = ps->opt.update != 0, compressed = false;
    int me = ps->rank;
    /* The sum of finite gradients can still overflow: never pass Inf on. */
    for (size_t e = 0; !marker && e < pg->m; e++) {
        ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
        if (!gm_finite(p->acc.p, p->n))
            marker = gm_marker(GCOMP_E_NONFINITE, me);
        else if (update && !p->inited)
            marker = gm_marker(GCOMP_E_PROTOCOL, me);
    }
    float lr = pg->rlr;
    for (size_t e = 0; update && !marker && e < pg->m; e++) {
        ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
        if (sgd_check(p, isnan(lr) ? p->opt.lr : lr) != GCOMP_OK)
            marker = gm_marker(GCOMP_E_NONFINITE, me);
    }
    /* Every sent reply must have left before the shared buffer is written again. */
    for (int q = 0; q < pg->npush; q++) {
        gcomp_status st = free_slot(v, pg, q, false);
        if (st != GCOMP_OK) return st;
    }
    uint8_t *buf = pg->reply.p;
    if (!marker && ps->pull) {
        /* BytePS: one compressed message per part, the server's residual kept. */
        size_t off = ps_frame_fixed(pg->m);
        for (size_t e = 0; e < pg->m && !marker; e++) {
            ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
            size_t len = 0;
            gcomp_status st = gcomp_encode(p->pull, p->acc.p, buf + off, pg->reply_cap - off, &len);
            if (st != GCOMP_OK) marker = gm_marker(st, me);
            gcomp__put64(buf + PS_HDR + PS_ENTRY * e + 8, len);
            off += len;
        }
        compressed = !marker;
    }
    if (!marker)
        for (size_t e = 0; e < pg->m; e++) {
            ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
            if (update) {
                sgd_apply(p, isnan(lr) ? p->opt.lr : lr);
            } else { /* the sum becomes what kv.pull returns */
                gm_buf tmp = p->store;
                p->store = p->acc;
                p->acc = tmp;
            }
            p->sversion++;
        }
    if (marker) {
        for (int q = 0; q < pg->npush; q++) refused(v, ps_pusher_rank(ps, pg->mode, q));
    } else {
        ps->stats.applied += (uint64_t)pg->npush;
    }
    size_t len = build_reply(v, pg, buf, PS_PUSH, marker, 0, compressed);
    for (int q = 0; q < pg->npush; q++) {
        gcomp_status st = send_reply(v, pg, q, false, buf, len, pg->tag + 1);
        if (st != GCOMP_OK) return st;
    }
    pg->round++;
    pg->next = pg->arrived = 0;
    pg->rst = GCOMP_OK;
    pg->rmark = 0;
    for (int q = 0; q < pg->npush; q++) {
        pg->slot[q].arrived = false;
        gcomp_status st = post_push(v, pg, q);
        if (st != GCOMP_OK) return st;
    }
    return GCOMP_OK;
}

/* sync: pusher q's frame is in.  Decode every push now possible in pusher order. */
static gcomp_status sync_push(srv *v, ps_group *pg, int q) {
    if (pg->arrived++ == 0) pg->round_t0 = gm_now_ns();
    pg->slot[q].arrived = true;
    while (pg->next < pg->npush && pg->slot[pg->next].arrived) {
        int p = pg->next++;
        ps_hdr h;
        uint64_t marker = 0;
        if (pg->rst == GCOMP_OK) {
            pg->rst = take_push(v, pg, p, p == 0, &h, &marker);
            /* Every pusher of a round must ask for the same thing. */
            if (pg->rst == GCOMP_OK && p == 0) {
                pg->rflags = h.flags;
                pg->rlr = h.lr;
            } else if (pg->rst == GCOMP_OK &&
                       (h.flags != pg->rflags || memcmp(&h.lr, &pg->rlr, sizeof h.lr))) {
                pg->rst = GCOMP_E_MISMATCH;
                marker = gm_marker(GCOMP_E_MISMATCH, ps_pusher_rank(v->ps, pg->mode, p));
            }
            if (pg->rst != GCOMP_OK) pg->rmark = marker;
        }
        v->waiting--;
    }
    return pg->next == pg->npush ? finish_round(v, pg) : GCOMP_OK;
}

/* async: check, decode and apply pusher q's frame at once; answer it alone (a lost
 * pusher's is refused). */
static gcomp_status async_push(srv *v, ps_group *pg, int q) {
    gcomp_mpi_ps *ps = v->ps;
    int r = ps_pusher_rank(ps, pg->mode, q), me = ps->rank;
    ps_hdr h;
    uint64_t marker = 0;
    uint32_t stale = 0;
    bool drop = false;
    v->waiting--;
    /* A lost worker's push is refused unread (GCOMP_E_FAILED there): nothing of it applies. */
    gcomp_status st = GCOMP_E_FAILED;
    if (worker_lost(v, r))
        marker = gm_marker(st, me);
    else
        st = take_push(v, pg, q, true, &h, &marker);
    uint64_t version = UINT64_MAX;
    for (size_t e = 0; e < pg->m; e++) {
        ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
        if (p->sversion < version) version = p->sversion;
    }
    if (st == GCOMP_OK) {
        uint64_t s = version > h.version ? version - h.version : 0;
        stale = s > UINT32_MAX ? UINT32_MAX : (uint32_t)s;
        drop = ps->opt.max_staleness && s > ps->opt.max_staleness;
    }
    for (size_t e = 0; st == GCOMP_OK && e < pg->m; e++) {
        ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
        if (!p->inited)
            st = GCOMP_E_PROTOCOL;
        else if (!drop)
            st = sgd_check(p, isnan(h.lr) ? p->opt.lr : h.lr);
        if (st != GCOMP_OK) marker = gm_marker(st, me);
    }
    if (st == GCOMP_OK && !drop)
        for (size_t e = 0; e < pg->m; e++) {
            ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
            sgd_apply(p, isnan(h.lr) ? p->opt.lr : h.lr);
            p->sversion++;
        }
    gcomp_mpi_ps_stats *ss[2] = {&ps->stats, &ps->peer[r]};
    for (int k = 0; k < 2; k++) {
        if (st != GCOMP_OK) {
            ss[k]->refused++;
            continue;
        }
        if (drop) {
            ss[k]->dropped++;
        } else {
            ss[k]->applied++;
            ss[k]->stale_sum += stale;
            if (stale > ss[k]->stale_max) ss[k]->stale_max = stale;
        }
    }
    for (size_t e = 0; st == GCOMP_OK && e < pg->m; e++) {
        ps_tensor *pt = pg->b->t[pg->et[e]].priv;
        if (e > 0 && pg->et[e] == pg->et[e - 1]) continue;
        pt->stats.applied += !drop;
        pt->stats.dropped += drop;
        pt->stats.stale_sum += stale;
        if (stale > pt->stats.stale_max) pt->stats.stale_max = stale;
    }
    pg->slot[q].round++;
    st = free_slot(v, pg, q, false);
    if (st != GCOMP_OK) return st;
    uint8_t *buf = pg->slot[q].out.p;
    size_t len = build_reply(v, pg, buf, PS_PUSH, marker, stale, false);
    gcomp__put64(buf + 16, pg->slot[q].round - 1); /* async rounds: each pusher's own count */
    gm_ps_seal(buf, marker ? 0 : pg->m);
    st = send_reply(v, pg, q, false, buf, len, pg->tag + 1);
    if (st == GCOMP_OK) st = post_push(v, pg, q);
    return st;
}

/* ---- init and pull requests ---------------------------------------------------------------- */

/* Whether a request comes from a worker already past `session` (the server's current
 * one: it shut down and went on before this server saw its shutdown word, which travels
 * on another communicator, so MPI does not order the two). */
static bool ahead(uint16_t session, const uint8_t *f, size_t len, size_t max_m) {
    ps_hdr h;
    if (gm_ps_open(f, len, false, max_m, &h) != GCOMP_OK) return false;
    uint16_t d = (uint16_t)(h.session - session);
    return d != 0 && d < 0x8000;
}

/* Pusher q's push is here (now, or parked from the last session): take it. */
static gcomp_status arrive(srv *v, ps_group *pg, int q) {
    gcomp_mpi_ps *ps = v->ps;
    uint64_t now = gm_now_ns();
    /* Queue depth: pushes here and not yet applied, this one included. */
    uint64_t depth = (uint64_t)++v->waiting;
    if (depth > ps->stats.queue_max) ps->stats.queue_max = depth;
    ps->stats.queue_sum += depth;
    gcomp_status st = v->async ? async_push(v, pg, q) : sync_push(v, pg, q);
    ps->stats.busy_ns += gm_now_ns() - now;
    return st;
}

/* A refusal for a request that names no sub-bucket of ours: marker only, no entries. */
static gcomp_status refuse_ctrl(srv *v, gcomp_mpi_bucket *b, int src, int kind, gcomp_status st) {
    (void)b;
    uint8_t *f = v->ps->ctrl.p;                 /* the request is no longer needed */
    kind = kind == PS_INIT ? PS_INIT : PS_PULL; /* what the sender waits for */
    ps_hdr h = {.kind = kind,
                .who = (uint32_t)v->ps->me_srv,
                .lost = v->nlost,
                .marker = gm_marker(st, v->ps->rank)};
    gm_ps_put_hdr(f, true, &h);
    gm_ps_seal(f, 0);
    refused(v, src);
    /* Tiny and sent once: a blocking send would be unbounded, so wait with the deadline. */
    MPI_Request req;
    int rc = MPI_Isend(f, (int)ps_frame_fixed(0), MPI_BYTE, src, ps_reply_tag(kind), b->bc, &req);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(v->ps->comm, v->err, rc, "MPI_Isend (refusal)");
    return gm_wait_all(v->ps->comm, &req, 1, gm_now_ns() + v->timeout_ns, "sending a refusal",
                       v->err);
}

/* kv.init from pusher 0 (stores the values, answers every pusher) or kv.pull (answers the
 * one that asked), for sub-bucket pg.  The frame is in ps->ctrl. */
static gcomp_status ctrl_request(srv *v, ps_group *pg, int src, size_t len) {
    gcomp_mpi_ps *ps = v->ps;
    const uint8_t *f = ps->ctrl.p;
    int q = ps->push_of[pg->mode][src], me = ps->rank;
    ps_hdr h;
    gcomp_status st = gm_ps_open(f, len, false, pg->m, &h);
    if (st == GCOMP_OK && (h.who != (uint32_t)q || h.m != pg->m || h.kind == PS_PUSH ||
                           (h.kind == PS_INIT && q != 0) || h.session != ps->session))
        st = GCOMP_E_MISMATCH;
    uint64_t marker = st != GCOMP_OK ? gm_marker(st, src) : 0;
    if (!marker && (h.marker & GM_MARK)) marker = h.marker;
    size_t dense = 0;
    for (size_t e = 0; !marker && e < pg->m; e++) {
        uint32_t ti, pj;
        uint64_t l;
        ps_get_entry(f, e, &ti, &pj, &l);
        const ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
        if (ti != pg->et[e] || pj != pg->ep[e])
            marker = gm_marker(GCOMP_E_MISMATCH, src);
        else if (l != (h.kind == PS_INIT ? 4 * (uint64_t)p->n : 0))
            marker = gm_marker(GCOMP_E_CORRUPT, src);
        dense += (size_t)l;
    }
    if (!marker && h.kind == PS_INIT) {
        st = gm_ps_check_dense(f, len, pg->m, dense);
        if (st == GCOMP_OK &&
            !gm_finite((const float *)(const void *)(f + ps_frame_fixed(pg->m)), dense / 4))
            st = GCOMP_E_NONFINITE;
        if (st != GCOMP_OK) marker = gm_marker(st, src);
    }
    if (!marker && h.kind == PS_PULL && (ps->opt.update || ps->opt.mode == GCOMP_MPI_PS_ASYNC))
        for (size_t e = 0; e < pg->m && !marker; e++)
            if (!((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]].inited)
                marker = gm_marker(GCOMP_E_PROTOCOL, me);
    int kind = h.kind == PS_INIT ? PS_INIT : PS_PULL;
    if (marker) refused(v, src);
    if (!marker && kind == PS_INIT) {
        const uint8_t *x = f + ps_frame_fixed(pg->m);
        for (size_t e = 0; e < pg->m; e++) {
            ps_part *p = &((ps_tensor *)pg->b->t[pg->et[e]].priv)->part[pg->ep[e]];
            memcpy(p->store.p, x, p->n * sizeof(float));
            x += p->n * sizeof(float);
            if (p->mom.p) memset(p->mom.p, 0, p->n * sizeof(float));
            p->sversion = 0;
            p->inited = true;
        }
    }
    if (kind == PS_PULL && !marker) ps->stats.pulls++;
    /* Inits are answered from a buffer and slots of their own: a worker takes an init's
     * reply only in its own init call, which may come after pulls and pushes of its own
     * that must not wait for it.  Every send from the buffer must have left first.  An
     * async pull is answered from the puller's own reply buffer, so it waits for nobody
     * else's reply to leave: one worker slow to take its reply slows only itself. */
    bool init = kind == PS_INIT, own = v->async && !init;
    for (int k = 0; k < pg->npush; k++) {
        if (own && k != q) continue;
        st = free_slot(v, pg, k, init);
        if (st != GCOMP_OK) return st;
    }
    uint8_t *buf = init ? pg->init_reply.p : own ? pg->slot[q].out.p : pg->reply.p;
    size_t n = build_reply(v, pg, buf, kind, marker, 0, false);
    /* An init answers every pusher (each waits in gcomp_mpi_ps_init); a refused init only
     * the one that sent it when it is not pusher 0. */
    for (int k = 0; k < pg->npush; k++) {
        if (k != q && (!init || (marker && q != 0))) continue;
        st = send_reply(v, pg, k, init, buf, n, ps_reply_tag(kind));
        if (st != GCOMP_OK) return st;
    }
    return GCOMP_OK;
}

/* The request in ps->ctrl (len bytes from rank src on b's communicator; st: what its
 * reception already found wrong). */
static gcomp_status take_ctrl(srv *v, gcomp_mpi_bucket *b, int src, size_t len, gcomp_status st) {
    gcomp_mpi_ps *ps = v->ps;
    ps_hdr h = {0};
    if (st == GCOMP_OK) st = gm_ps_open(ps->ctrl.p, len, false, (size_t)UINT32_MAX, &h);
    ps_group *pg = NULL;
    for (size_t j = 0; st == GCOMP_OK && j < ps->ngroups && !pg; j++)
        if (ps->groups[j]->b == b && ps->groups[j]->gi == h.group) pg = ps->groups[j];
    if (st == GCOMP_OK && (!pg || ps->push_of[pg->mode][src] < 0)) st = GCOMP_E_MISMATCH;
    return st == GCOMP_OK ? ctrl_request(v, pg, src, len)
                          : refuse_ctrl(v, b, src, len >= PS_HDR ? h.kind : PS_PULL, st);
}

/* Probes every bucket's communicator once for a request. */
static gcomp_status probe_ctrl(srv *v, bool *got) {
    gcomp_mpi_ps *ps = v->ps;
    for (size_t k = 0; k < ps->ngroups; k++) {
        gcomp_mpi_bucket *b = ps->groups[k]->b;
        bool seen = false; /* one probe per bucket */
        for (size_t j = 0; j < k && !seen; j++) seen = ps->groups[j]->b == b;
        if (seen) continue;
        int flag = 0;
        MPI_Message msg;
        MPI_Status sta;
        int rc = MPI_Improbe(MPI_ANY_SOURCE, PS_TAG_CTRL, b->bc, &flag, &msg, &sta);
        if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(ps->comm, v->err, rc, "MPI_Improbe");
        if (!flag) continue;
        *got = true;
        int cnt = 0, src = sta.MPI_SOURCE;
        MPI_Get_count(&sta, MPI_BYTE, &cnt);
        uint64_t t0 = gm_now_ns();
        v->t_last = t0;
        if (ps->role[src] >= 0) v->heard[ps->role[src]] = t0;
        bool fits = cnt >= 0 && (size_t)cnt <= ps->ctrl.cap;
        /* Too big for any request of ours: received in pieces of nothing, then refused. */
        rc = fits ? MPI_Mrecv(ps->ctrl.p, cnt, MPI_BYTE, &msg, &sta)
                  : MPI_Mrecv(NULL, 0, MPI_BYTE, &msg, &sta);
        if (rc != MPI_SUCCESS && fits) return gm_comm_mpi_fail(ps->comm, v->err, rc, "MPI_Mrecv");
        gm_ps_count(ps, src, true, (uint64_t)cnt);
        ps_hdr h;
        gcomp_status st = fits ? gm_ps_open(ps->ctrl.p, (size_t)cnt, false, (size_t)UINT32_MAX, &h)
                               : GCOMP_E_LIMIT;
        if (st == GCOMP_OK && ahead(ps->session, ps->ctrl.p, (size_t)cnt, (size_t)UINT32_MAX)) {
            ps_parked *x = gm_alloc(sizeof *x + (size_t)cnt), **tail = &ps->parked;
            if (x) {
                x->next = NULL;
                x->b = b;
                x->src = src;
                x->len = (size_t)cnt;
                memcpy(x->frame, ps->ctrl.p, (size_t)cnt);
                while (*tail) tail = &(*tail)->next;
                *tail = x;
                continue;
            }
            st = GCOMP_E_NOMEM;
        }
        st = take_ctrl(v, b, src, fits ? (size_t)cnt : 0, st);
        ps->stats.busy_ns += gm_now_ns() - t0;
        if (st != GCOMP_OK) return st;
    }
    return GCOMP_OK;
}

/* ---- the loop ------------------------------------------------------------------------------- */

/* Declares worker w lost (async): its shutdown receive is cancelled, replies to it
 * abandoned.  Its push receives stay posted: a push from it, one already received when it
 * was declared lost or one it sends later, is refused with GCOMP_E_FAILED (async_push). */
static void lose(srv *v, int w) {
    gcomp_mpi_ps *ps = v->ps;
    if (v->lost[w] || v->stopped[w]) return;
    v->lost[w] = true;
    v->nlost++;
    ps->stats.workers_lost = v->nlost;
    int r = ps->wrk_rank[w];
    ps->peer[r].workers_lost = 1;
    if (v->req[v->stop0 + w] != MPI_REQUEST_NULL) MPI_Cancel(&v->req[v->stop0 + w]);
}

/* Whether worker w needs nothing more: it shut down, or it (or, for hierarchical keys, the
 * node leader that pushes for it) was lost. */
static bool settled(const srv *v, int w) {
    const gcomp_mpi_ps *ps = v->ps;
    if (v->stopped[w] || v->lost[w]) return true;
    if (!v->has_hier) return false;
    int r = ps->wrk_rank[w];
    for (int q = 0; q < ps->npush[1]; q++) {
        int lr = ps->push_rank[1][q];
        if (ps->node[lr] == ps->node[r]) return v->lost[ps->role[lr]];
    }
    return false;
}

/* Posts the receive of worker w's shutdown word. */
static gcomp_status post_stop(srv *v, int w) {
    gcomp_mpi_ps *ps = v->ps;
    int rc = MPI_Irecv(&v->stopbuf[w], 1, MPI_UINT64_T, ps->wrk_rank[w], PS_TAG_STOP, ps->pc,
                       &v->req[v->stop0 + w]);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(ps->comm, v->err, rc, "MPI_Irecv (shutdown)");
    return GCOMP_OK;
}

static gcomp_status handle(srv *v, int k, const MPI_Status *sta) {
    gcomp_mpi_ps *ps = v->ps;
    srv_rq *rq = &v->rq[k];
    int cancelled = 0;
    MPI_Test_cancelled(sta, &cancelled);
    if (cancelled) return GCOMP_OK;
    uint64_t now = gm_now_ns();
    if (sta->MPI_ERROR != MPI_SUCCESS && sta->MPI_ERROR != MPI_ERR_PENDING) {
        int peer =
            rq->kind == RQ_STOP ? ps->wrk_rank[rq->q] : ps_pusher_rank(ps, rq->pg->mode, rq->q);
        if (v->async && ps->role[peer] >= 0) { /* that worker is gone; the others are not */
            lose(v, ps->role[peer]);
            return GCOMP_OK;
        }
        return gm_comm_mpi_fail(ps->comm, v->err, sta->MPI_ERROR,
                                "parameter server: a transfer with a worker");
    }
    if (rq->kind == RQ_SEND) return GCOMP_OK;
    if (rq->kind == RQ_STOP) {
        /* A word of a session this server has ended: sent by a worker that was declared
         * lost then (its receive was cancelled), so it does not end this one. */
        uint16_t d = (uint16_t)(ps->session - (uint16_t)v->stopbuf[rq->q]);
        if (d != 0 && d < 0x8000) return post_stop(v, rq->q);
        v->stopped[rq->q] = true;
        v->heard[rq->q] = v->t_last = now;
        return GCOMP_OK;
    }
    ps_group *pg = rq->pg;
    int q = rq->q, r = ps_pusher_rank(ps, pg->mode, q), cnt = 0;
    MPI_Get_count(sta, MPI_BYTE, &cnt);
    pg->slot[q].in_len = cnt > 0 ? (size_t)cnt : 0;
    pg->slot[q].t_arrived = now;
    v->heard[ps->role[r]] = v->t_last = now;
    gm_ps_count(ps, r, true, (uint64_t)pg->slot[q].in_len);
    if (ahead(ps->session, pg->slot[q].in.p, pg->slot[q].in_len, pg->m)) {
        pg->slot[q].parked = true; /* its receive is posted again when it is taken */
        return GCOMP_OK;
    }
    return arrive(v, pg, q);
}

/* A push receive that completed at the session's end (cleanup) instead of being cancelled:
 * a frame of the next session - the last worker to shut down pushes again at once, and
 * that push can arrive after its shutdown word ended the loop - is parked, as handle()
 * parks one that arrives a moment earlier, and taken at the next serve; a frame of this
 * session or an older one (a lost worker's late push) or one that does not open is
 * dropped.  ps->session already counts the session that ended. */
static void park_late(srv *v, int k, const MPI_Status *sta) {
    gcomp_mpi_ps *ps = v->ps;
    int cancelled = 0, cnt = 0;
    MPI_Test_cancelled(sta, &cancelled);
    if (cancelled) return;
    ps_group *pg = v->rq[k].pg;
    int q = v->rq[k].q;
    MPI_Get_count(sta, MPI_BYTE, &cnt);
    size_t len = cnt > 0 ? (size_t)cnt : 0;
    gm_ps_count(ps, ps_pusher_rank(ps, pg->mode, q), true, (uint64_t)len);
    if (!ahead((uint16_t)(ps->session - 1), pg->slot[q].in.p, len, pg->m)) return;
    pg->slot[q].in_len = len;
    pg->slot[q].t_arrived = gm_now_ns();
    pg->slot[q].parked = true; /* its receive is posted again when it is taken */
}

/* The buffer request rq of group pg reads or writes. */
static gm_buf *reply_buf(ps_group *pg, const srv_rq *rq) {
    if (rq->kind == RQ_PUSH) return &pg->slot[rq->q].in;
    if (rq->buf == pg->reply.p) return &pg->reply;
    if (rq->buf == pg->init_reply.p) return &pg->init_reply;
    return &pg->slot[rq->q].out;
}

/* Cancels what is still posted, waits a moment for it, and keeps whatever MPI still holds
 * (requests and the buffers they use) in the communicator's graveyard.  A push that
 * completes instead of being cancelled is kept when it belongs to the next session
 * (park_late). */
static void cleanup(srv *v, bool failed) {
    gcomp_mpi_ps *ps = v->ps;
    for (int k = 0; k < v->n; k++)
        if (v->req[k] != MPI_REQUEST_NULL && v->rq[k].kind != RQ_SEND) MPI_Cancel(&v->req[k]);
    /* Sends to live workers leave quickly (they shut down after their last reply). */
    uint64_t t0 = gm_now_ns(), limit = failed ? 200000000ull : v->timeout_ns;
    unsigned spins = 0;
    for (;;) {
        bool pending = false;
        for (int k = 0; k < v->n; k++) {
            if (v->req[k] == MPI_REQUEST_NULL) continue;
            if (v->rq[k].kind == RQ_SEND && v->rq[k].pg &&
                worker_lost(v, ps_pusher_rank(ps, v->rq[k].pg->mode, v->rq[k].q)))
                continue; /* never leaves */
            int flag = 0;
            MPI_Status sta;
            int rc = MPI_Test(&v->req[k], &flag, &sta);
            pending |= !flag;
            if (flag && rc == MPI_SUCCESS && v->rq[k].kind == RQ_PUSH) park_late(v, k, &sta);
        }
        uint64_t now = gm_now_ns();
        if (!pending || now - t0 > limit) break;
        gm_backoff(&spins, now - t0);
    }
    int left = 0;
    for (int k = 0; k < v->n; k++) left += v->req[k] != MPI_REQUEST_NULL;
    if (!left) return;
    /* Bury the requests with every buffer they may touch; the sub-buckets get new ones. */
    MPI_Request *keep = gm_calloc((size_t)left, sizeof *keep);
    void **bufs = gm_calloc((size_t)left + 1, sizeof *bufs);
    if (!keep || !bufs) { /* leak them all: never free what MPI may use */
        gm_free(keep);
        gm_free(bufs);
        for (int k = 0; k < v->n; k++)
            if (v->req[k] != MPI_REQUEST_NULL && v->rq[k].pg) {
                ps_group *pg = v->rq[k].pg;
                gm_buf *b = reply_buf(pg, &v->rq[k]);
                b->p = NULL;
                b->cap = 0;
            }
        return;
    }
    int nk = 0;
    size_t nb = 0;
    bool stop_left = false;
    for (int k = 0; k < v->n; k++) {
        if (v->req[k] == MPI_REQUEST_NULL) continue;
        keep[nk++] = v->req[k];
        ps_group *pg = v->rq[k].pg;
        stop_left |= !pg;
        if (!pg) continue; /* a shutdown word: in v->stopbuf, leaked below */
        gm_buf *b = reply_buf(pg, &v->rq[k]);
        if (b->p) {
            bufs[nb++] = b->p;
            size_t cap = b->cap;
            b->p = NULL;
            b->cap = 0;
            gm_reserve(b, cap); /* a failure shows as a buffer too small at the next serve */
        }
    }
    gm_comm_bury(ps->comm, keep, nk, bufs, nb, NULL, 0);
    if (stop_left) v->stopbuf = NULL; /* MPI may still write a shutdown word: leaked */
}

gcomp_status gm_ps_serve(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err) {
    gcomp_mpi_comm *c = ps->comm;
    srv v = {0};
    v.ps = ps;
    v.err = err;
    v.async = ps->opt.mode == GCOMP_MPI_PS_ASYNC;
    uint64_t t0 = gm_now_ns();
    v.timeout_ns = gm_deadline(c, timeout_s) - t0;
    v.t_last = t0;
    int n = 0;
    for (size_t k = 0; k < ps->ngroups; k++) {
        ps_group *pg = ps->groups[k];
        pg->rreq0 = n;
        n += PS_REQ_PER_PUSHER * pg->npush;
        v.has_hier |= pg->mode == 1;
        for (int q = 0; q < pg->npush; q++)
            if (!pg->slot[q].in.p || pg->slot[q].in.cap < pg->push_cap ||
                (v.async && pg->slot[q].out.cap < pg->reply_cap))
                return gm_fail(err, GCOMP_E_NOMEM, "parameter server: a buffer is missing");
    }
    v.stop0 = n;
    v.n = n + ps->W;
    v.req = gm_calloc((size_t)v.n, sizeof *v.req);
    v.rq = gm_calloc((size_t)v.n, sizeof *v.rq);
    v.idx = gm_calloc((size_t)v.n, sizeof *v.idx);
    v.sta = gm_calloc((size_t)v.n, sizeof *v.sta);
    v.stopbuf = gm_calloc((size_t)ps->W, sizeof *v.stopbuf);
    v.heard = gm_calloc((size_t)ps->W, sizeof *v.heard);
    v.stopped = gm_calloc((size_t)ps->W, sizeof *v.stopped);
    v.lost = gm_calloc((size_t)ps->W, sizeof *v.lost);
    v.judged = gm_calloc((size_t)ps->W, sizeof *v.judged);
    gcomp_status st = GCOMP_OK;
    if (!v.req || !v.rq || !v.idx || !v.sta || !v.stopbuf || !v.heard || !v.stopped || !v.lost ||
        !v.judged) {
        /* Nothing is posted yet: no cleanup (it would read requests never set). */
        gm_free(v.req);
        gm_free(v.rq);
        gm_free(v.idx);
        gm_free(v.sta);
        gm_free(v.stopbuf);
        gm_free(v.heard);
        gm_free(v.stopped);
        gm_free(v.lost);
        gm_free(v.judged);
        return gm_fail(err, GCOMP_E_NOMEM, "parameter server: out of memory serving");
    }
    for (int k = 0; k < v.n; k++) v.req[k] = MPI_REQUEST_NULL;
    for (int w = 0; st == GCOMP_OK && w < ps->W; w++) {
        v.heard[w] = t0;
        v.rq[v.stop0 + w] = (srv_rq){RQ_STOP, w, NULL, NULL};
        st = post_stop(&v, w);
    }
    /* A round begun in the last session goes on (its pushes stay); pushes and requests
     * parked as the next session's are taken now. */
    for (size_t k = 0; st == GCOMP_OK && k < ps->ngroups; k++) {
        ps_group *pg = ps->groups[k];
        pg->round_t0 = t0;
        for (int q = 0; q < pg->npush && st == GCOMP_OK; q++) {
            v.judged[ps->role[ps_pusher_rank(ps, pg->mode, q)]] = true;
            v.rq[pg->rreq0 + q] = (srv_rq){RQ_PUSH, q, pg, NULL};
            v.rq[send_slot(pg, q, false)] = (srv_rq){RQ_SEND, q, pg, NULL};
            v.rq[send_slot(pg, q, true)] = (srv_rq){RQ_SEND, q, pg, NULL};
            if (!pg->slot[q].arrived && !pg->slot[q].parked) st = post_push(&v, pg, q);
        }
    }
    for (size_t k = 0; st == GCOMP_OK && k < ps->ngroups; k++) {
        ps_group *pg = ps->groups[k];
        for (int q = 0; q < pg->npush && st == GCOMP_OK; q++)
            if (pg->slot[q].parked) {
                pg->slot[q].parked = false;
                st = arrive(&v, pg, q);
            }
    }
    while (st == GCOMP_OK && ps->parked) {
        ps_parked *x = ps->parked;
        ps->parked = x->next;
        if (x->len <= ps->ctrl.cap) memcpy(ps->ctrl.p, x->frame, x->len);
        st = take_ctrl(&v, x->b, x->src, x->len <= ps->ctrl.cap ? x->len : 0,
                       x->len <= ps->ctrl.cap ? GCOMP_OK : GCOMP_E_LIMIT);
        gm_free(x);
    }
    unsigned spins = 0;
    uint64_t idle0 = t0;
    while (st == GCOMP_OK) {
        int outcount = 0;
        int rc = MPI_Testsome(v.n, v.req, &outcount, v.idx, v.sta);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            st = gm_comm_mpi_fail(c, err, rc, "MPI_Testsome (parameter server)");
            break;
        }
        if (outcount == MPI_UNDEFINED) outcount = 0;
        if (rc == MPI_SUCCESS)
            for (int k = 0; k < outcount; k++) v.sta[k].MPI_ERROR = MPI_SUCCESS;
        /* Pushes first counted as waiting, then taken in order (queue depth). */
        for (int k = 0; k < outcount && st == GCOMP_OK; k++) st = handle(&v, v.idx[k], &v.sta[k]);
        bool got = false;
        if (st == GCOMP_OK) st = probe_ctrl(&v, &got);
        if (st != GCOMP_OK) break;
        uint64_t now = gm_now_ns();
        if (outcount > 0 || got) {
            spins = 0;
            idle0 = now;
        }
        bool done = true, alive = false;
        for (int w = 0; w < ps->W; w++) {
            done &= settled(&v, w);
            alive |= v.stopped[w];
        }
        if (done) {
            if (!alive && v.nlost)
                st = gm_comm_fail(c, err, GCOMP_E_TIMEOUT,
                                  "parameter server: every worker was lost (silent for %.1f s)",
                                  (double)v.timeout_ns * 1e-9);
            break;
        }
        if (v.async) {
            /* A worker that never pushes here (a hierarchical non-leader) cannot be judged by
             * its silence.  Once every worker that pushes has settled, each of the others
             * has one more timeout to shut down: a dead one cannot hold serve for ever. */
            if (!v.rest_t0) {
                bool any = false, all = true;
                for (int w = 0; w < ps->W; w++)
                    if (v.judged[w]) {
                        any = true;
                        all &= settled(&v, w);
                    }
                if (any && all) v.rest_t0 = now;
            }
            for (int w = 0; w < ps->W; w++)
                if (v.judged[w] ? !v.stopped[w] && !v.lost[w] && now - v.heard[w] > v.timeout_ns
                                : v.rest_t0 && !settled(&v, w) && now - v.rest_t0 > v.timeout_ns)
                    lose(&v, w);
        } else {
            for (size_t k = 0; k < ps->ngroups && st == GCOMP_OK; k++) {
                ps_group *pg = ps->groups[k];
                if (pg->arrived && now - pg->round_t0 > v.timeout_ns) {
                    int miss = -1;
                    for (int q = 0; q < pg->npush && miss < 0; q++)
                        if (!pg->slot[q].arrived) miss = ps_pusher_rank(ps, pg->mode, q);
                    st = gm_comm_fail(c, err, GCOMP_E_TIMEOUT,
                                      "parameter server: round %llu of the sub-bucket at tensor "
                                      "'%s' incomplete after %.1f s (no push from rank %d: dead "
                                      "or stalled)",
                                      (unsigned long long)pg->round, pg->b->t[pg->g->t0].name,
                                      (double)(now - pg->round_t0) * 1e-9, miss);
                }
            }
            if (st == GCOMP_OK && now - v.t_last > v.timeout_ns)
                st = gm_comm_fail(c, err, GCOMP_E_TIMEOUT,
                                  "parameter server: no message from any worker for %.1f s",
                                  (double)(now - v.t_last) * 1e-9);
        }
        if (st == GCOMP_OK && outcount == 0 && !got) gm_backoff(&spins, now - idle0);
    }
    if (st != GCOMP_OK)
        for (size_t k = 0; k < ps->ngroups; k++) ps->groups[k]->b->dead = c->failed != GCOMP_OK;
    ps->session++;
    cleanup(&v, st != GCOMP_OK);
    gm_free(v.req);
    gm_free(v.rq);
    gm_free(v.idx);
    gm_free(v.sta);
    gm_free(v.stopbuf); /* NULL when it went to the graveyard's care (leaked) */
    gm_free(v.heard);
    gm_free(v.stopped);
    gm_free(v.lost);
    gm_free(v.judged);
    return st;
}

gcomp_status gcomp_mpi_ps_serve(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err) {
    if (!ps) return gm_fail(err, GCOMP_E_ARG, "parameter server is NULL");
    if (ps->me_srv < 0)
        return gm_fail(err, GCOMP_E_ARG, "rank %d is a worker; it pushes, it does not serve",
                       ps->rank);
    gcomp_status st = gm_comm_check(ps->comm, err);
    if (st != GCOMP_OK) return st;
    if (ps->epoch != ps->comm->epoch)
        return gm_fail(err, GCOMP_E_FAILED, "the communicator was reset: create the server again");
    if (ps->serving) return gm_fail(err, GCOMP_E_PROTOCOL, "already serving");
    /* With no part here no push or request would come, only the shutdown words: a sync
     * server would take healthy training for a silent job and time out, an async one could
     * not tell a dead worker from a busy one.  A set-up error, said at once.  It sticks:
     * this session's shutdown words are never taken, so a later serve (after a bucket gave
     * this server a part) would run a session behind the workers. */
    if (ps->refused_serve)
        return gm_fail(err, GCOMP_E_ARG,
                       "parameter server: this server refused to serve before (it owned no "
                       "part): free it and create the server objects again");
    if (ps->ngroups == 0) {
        ps->refused_serve = true;
        return gm_fail(err, GCOMP_E_ARG,
                       "parameter server: server %d of %d (rank %d) owns no part of any bucket, "
                       "so nothing but the workers' shutdown would reach it: use at most as "
                       "many servers as the buckets have parts (fewer servers, or a smaller "
                       "part_bytes; gcomp_mpi_ps_part reports the placement)",
                       ps->me_srv, ps->S, ps->rank);
    }
    ps->serving = true;
    st = gm_ps_serve(ps, timeout_s, err);
    ps->serving = false;
    return st;
}

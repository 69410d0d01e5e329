/*
 * mpi_owner.c - the two owner strategies: each rank owns one region of every tensor
 * (region j = elements [j*n/P, (j+1)*n/P)), reduces the contributions to it, re-compresses
 * the sum (with error feedback when that is stable), and the owners' messages are
 * allgathered.
 *
 * rsag   reduce-scatter + allgather with re-compression at the owner: DeepSpeed's 1-bit
 *        compressed allreduce (Tang et al. 2021, "1-bit Adam"), for quantizers.  Every
 *        rank compresses region j of its gradient with its own chunk compressor (the
 *        worker side: the tensor's spec, with its feedback - use feedback=ef for 1-bit
 *        SGD) and sends it to rank j; rank j decodes the P chunks, sums them, compresses
 *        the sum with its owner compressor (same codec, its own seed, and error feedback
 *        when the codec contracts: the server side of the error feedback; see
 *        gm_owner_spec below), and every rank decodes every owner's message.
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
#include "mpi_internal.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- what an owner re-compresses with ----------------------------------------------------- */

/* The value of `key` in a canonical spec ("name:k=v,k=v,..."), or "" when absent. */
static void spec_get(const char *canon, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    out[0] = 0;
    for (const char *p = strchr(canon, ':'); p && *p; p = strchr(p, ',')) {
        p++;
        if (!strncmp(p, key, kl) && p[kl] == '=') {
            snprintf(out, cap, "%.*s", (int)strcspn(p + kl + 1, ","), p + kl + 1);
            return;
        }
    }
}

/* The canonical spec with feedback=`fb` (dropping what only dgc reads: the keys after
 * seed=) and seed=`seed`.  A codec that brings its own feedback (dgc) keeps it. */
static gcomp_status spec_with(const char *canon, const char *fb, uint64_t seed, char *out,
                              size_t cap, uint64_t *fp) {
    char spec[600];
    const char *at = strstr(canon, ",feedback="), *sp = strstr(canon, ",seed=");
    if (!at || !sp) return GCOMP_E_SPEC; /* every canonical spec has both */
    int w = snprintf(spec, sizeof spec, "%.*s,feedback=%s,seed=%llu", (int)(at - canon), canon, fb,
                     (unsigned long long)seed);
    if (w <= 0 || (size_t)w >= sizeof spec) return GCOMP_E_LIMIT;
    if (gcomp_spec_canonical(spec, out, cap, fp, NULL) == GCOMP_OK) return GCOMP_OK;
    const char *rest = sp + 6 + strcspn(sp + 6, ",");
    w = snprintf(spec, sizeof spec, "%.*s,seed=%llu%s", (int)(sp - canon), canon,
                 (unsigned long long)seed, rest);
    if (w <= 0 || (size_t)w >= sizeof spec) return GCOMP_E_LIMIT;
    return gcomp_spec_canonical(spec, out, cap, fp, NULL);
}

/* Does the codec draw random numbers (its own flag, or its value coder's: topk with
 * values=qsgd)? */
static bool spec_random(const char *canon) {
    char name[32], values[32];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(canon, ":"), canon);
    spec_get(canon, "values", values, sizeof values);
    const gcomp_codec_info *ci = gcomp_codec_find(name);
    const gcomp_codec_info *vi = values[0] ? gcomp_codec_find(values) : NULL;
    return (ci && (ci->flags & GCOMP_CODEC_STOCHASTIC)) ||
           (vi && (vi->flags & GCOMP_CODEC_STOCHASTIC));
}

/*
 * Error feedback converges for a contraction, E|C(x) - x|^2 <= (1 - d)|x|^2 with d > 0
 * (Stich et al. 2018, Karimireddy et al. 2019): the residual then carries less than it
 * was given.  Deterministic codecs are contractions by construction (top-k, threshold,
 * sign, twobit, nearest int8/int4).  A codec that draws random numbers may not be: its
 * error is zero-mean but can exceed the signal, and a residual fed back into it grows
 * by that factor every step (QSGD levels=4 in buckets of 512: 3.5, and the 4-rank MLP's
 * owner residual reached NaN at step 18; levels=8: 1.27, NaN at step 115; levels=16:
 * 0.33, trains; ternary 1.6; bernoulli at density p: 1/p - 1).  The core refuses
 * feedback=ef around such a codec at create, from a worst-case bound per codec (QSGD's
 * min(d/4s^2, sqrt(d)/s) for buckets of d values, ternary's (sqrt(d) - 1)/2, 1/p
 * scaling): so the owner asks the core, for a chunk of GM_PROBE_N elements, whether it
 * would take feedback=ef.  The bound only grows with the bucket's d = min(bucket, n), so a
 * codec accepted at that size is accepted for any smaller chunk; one refused there runs
 * without feedback on every owner (unbiased), and every rank takes the same decision.
 * Rejected: measuring the ratio on a probe (it accepted specs the core then refused at
 * create: QSGD at 10-11 levels, ternary in buckets of 9-30).
 */
#define GM_PROBE_N 65536
gcomp_status gm_owner_feedback(const char *canon, bool *ef) {
    *ef = true;
    if (!spec_random(canon)) return GCOMP_OK;
    char spec[512];
    gcomp_status st = spec_with(canon, "ef", 0, spec, sizeof spec, NULL);
    if (st != GCOMP_OK) return st;
    gcomp_compressor *c = NULL;
    st = gcomp_compressor_create(&c, spec, GM_PROBE_N, 0, 0, NULL);
    gcomp_compressor_free(c);
    if (st == GCOMP_E_SPEC) {
        *ef = false;
        return GCOMP_OK;
    }
    return st;
}

/* Whether codec or value coder `name` draws random numbers (int8/int4 only when they
 * round stochastically). */
static bool draws(const char *name, const char *rounding) {
    const gcomp_codec_info *ci = gcomp_codec_find(name);
    if (!ci || !(ci->flags & GCOMP_CODEC_STOCHASTIC)) return false;
    if (!strcmp(name, "int8") || !strcmp(name, "int4")) return strcmp(rounding, "nearest") != 0;
    return true;
}

/*
 * The worker-side spec of rank `rank` (allgather, sparse, rsag): the tensor's canonical
 * spec with a seed of that rank's own when the codec's random draws only round or sample
 * values whose positions travel (qsgd, ternary, stochastic int8/int4, bernoulli,
 * importance, dgc's sampling): with one seed on every rank, the ranks' rounding errors
 * on similar gradients are the same draws and do not average out over the P ranks;
 * with independent draws the variance of the mean shrinks by P.  Kept shared: random-k
 * (the positions are drawn from the seed on every rank: allreduce sums values by
 * position) and multi-phase codecs (PowerSGD's starting Q must agree).  Decoders never
 * need the seed (a random-k message carries its key), so only the fingerprint each
 * rank's messages carry changes; *own says whether it does.
 */
gcomp_status gm_rank_spec(const char *canon, int rank, char *out, size_t cap, uint64_t *fp,
                          bool *own) {
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(canon, ":"), canon);
    const gcomp_codec_info *ci = gcomp_codec_find(name);
    char rounding[16], values[32];
    spec_get(canon, "rounding", rounding, sizeof rounding);
    spec_get(canon, "values", values, sizeof values);
    *own = (draws(name, rounding) || (values[0] && draws(values, rounding))) &&
           strcmp(name, "randomk") != 0 && !(ci && (ci->flags & GCOMP_CODEC_MULTIPHASE));
    if (!*own) return gcomp_spec_canonical(canon, out, cap, fp, NULL);
    const char *sp = strstr(canon, ",seed=");
    if (!sp) return GCOMP_E_SPEC; /* every canonical spec has one */
    char seed[32], spec[600];
    spec_get(canon, "seed", seed, sizeof seed);
    uint64_t rseed =
        gm_mix(gm_mix(strtoull(seed, NULL, 10) ^ 0x72616e6bull /* "rank" */) + (uint64_t)rank) &
        ((1ull << 53) - 1); /* the spec's seed range */
    const char *rest = sp + 6 + strcspn(sp + 6, ",");
    int w = snprintf(spec, sizeof spec, "%.*s,seed=%llu%s", (int)(sp - canon), canon,
                     (unsigned long long)rseed, rest);
    if (w <= 0 || (size_t)w >= sizeof spec) return GCOMP_E_LIMIT;
    return gcomp_spec_canonical(spec, out, cap, fp, NULL);
}

/*
 * The owner-side spec (rsag, sparse): the tensor's codec and parameters with
 *  - feedback=ef when the codec is a contraction (gm_owner_feedback): what the owner drops
 *    stays in its residual and nothing is lost, the server side of 1-bit Adam's error
 *    feedback; whatever the tensor's own feedback is (deterministic codecs would otherwise
 *    lose their rounding bias every step);
 *  - feedback=none otherwise: the re-compression of an unbiased codec stays unbiased on
 *    its own, where a residual would diverge.  Rejected: feedback always (that divergence),
 *    and the tensor's own feedback (feedback=none on sign or twobit loses what the second
 *    quantisation drops; feedback=ef on QSGD levels=4 diverges on the workers already);
 *  - a seed of its own: with the workers' seed the owner draws the random numbers the
 *    workers drew for the same chunk, and its rounding is then not independent of (not
 *    unbiased for) an input that those numbers made.
 */
gcomp_status gm_owner_spec(const char *canon, char *out, size_t cap, uint64_t *fp) {
    char seed[32];
    bool ef = true;
    spec_get(canon, "seed", seed, sizeof seed);
    gcomp_status st = gm_owner_feedback(canon, &ef);
    if (st != GCOMP_OK) return st;
    uint64_t oseed = gm_mix(strtoull(seed, NULL, 10) ^ 0x6f776e6572ull /* "owner" */) &
                     ((1ull << 53) - 1); /* the spec's seed range */
    return spec_with(canon, ef ? "ef" : "none", oseed, out, cap, fp);
}

static size_t reg_len(const gm_tensor *t, int j) {
    return t->reg[j + 1] - t->reg[j];
}

static void mark_tensor(gm_group *g, size_t k, uint64_t m) {
    for (int j = 0; j < g->xsize; j++) g->sz_send[(size_t)j * g->nt + k] = m;
}

static gcomp_status rsag_encode(gcomp_mpi_bucket *b, gm_group *g) {
    uint8_t *send = g->send.p;
    size_t nt = g->nt;
    gcomp_status *bad = (gcomp_status *)(void *)g->gsz_send; /* scratch until the owner step */
    for (size_t k = 0; k < nt; k++) {
        bad[k] = GCOMP_OK;
        b->t[g->t0 + k].nmsg = 0;
    }
    for (int j = 0; j < g->xsize; j++) {
        size_t off = g->dest_off[j];
        for (size_t k = 0; k < nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            size_t len = 0, lj = reg_len(t, j);
            g->sz_send[(size_t)j * nt + k] = 0;
            if (!lj || bad[k] != GCOMP_OK) continue;
            uint64_t t0 = gm_now_ns();
            gcomp_status st = gcomp_encode(t->chunk[j], t->io + t->reg[j], send + off,
                                           g->dest_off[j + 1] - off, &len);
            t->call.codec_ns += gm_now_ns() - t0;
            if (st != GCOMP_OK) {
                bad[k] = st;
                continue;
            }
            g->sz_send[(size_t)j * nt + k] = len;
            t->msgs[t->nmsg++] = (gm_msgref){send + off, len, t->reg[j], lj};
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
    uint8_t *send = g->send.p;
    size_t nt = g->nt;
    gcomp_status *bad = (gcomp_status *)(void *)g->gsz_send;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        size_t len = 0;
        uint64_t t0 = gm_now_ns();
        t->nmsg = 0;
        gcomp_status st = gcomp_encode(t->c, t->io, t->own.p, t->own.cap, &len);
        if (st == GCOMP_OK) {
            /* This rank's contribution, as every decoder will see it. */
            memset(t->io, 0, t->n * sizeof(float));
            st = gm_decode_checked(t->c, t->own.p, len, gcomp_compressor_fingerprint(t->c), t->n,
                                   t->io, 1.0f);
        }
        t->call.codec_ns += gm_now_ns() - t0;
        bad[k] = st;
        if (st == GCOMP_OK) {
            t->msgs[0] = (gm_msgref){t->own.p, len, 0, t->n};
            t->nmsg = 1;
        }
    }
    for (int j = 0; j < g->xsize; j++) {
        size_t off = g->dest_off[j];
        for (size_t k = 0; k < nt; k++) {
            gm_tensor *t = &b->t[g->t0 + k];
            size_t len = 0;
            if (j != g->xrank && bad[k] == GCOMP_OK) {
                uint64_t t0 = gm_now_ns();
                len = gm_slice_encode(t->io + t->reg[j], reg_len(t, j), send + off);
                t->call.codec_ns += gm_now_ns() - t0;
            }
            g->sz_send[(size_t)j * nt + k] = len;
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
    size_t P = (size_t)g->xsize, nt = g->nt;
    /* A rank that failed marked every destination, so all ranks see it here. */
    if (gm_scan_markers(b, g, g->sz_recv, P * nt, nt)) return GCOMP_OK;
    uint64_t total = 0;
    for (size_t j = 0; j < P; j++) {
        uint64_t s = 0, r = 0;
        for (size_t k = 0; k < nt; k++) {
            s += g->sz_send[j * nt + k];
            r += g->sz_recv[j * nt + k];
            gm_tensor *t = &b->t[g->t0 + k];
            if ((int)j != g->xrank) {
                t->call.bytes_sent += g->sz_send[j * nt + k];
                t->call.bytes_received += g->sz_recv[j * nt + k];
            }
        }
        g->cnt_s[j] = (int)s; /* bounded by the send areas, checked at set-up */
        g->dsp_s[j] = (int)g->dest_off[j];
        g->cnt_r[j] = (int)r;
        g->dsp_r[j] = (int)total;
        total += r;
        if ((int)j != g->xrank) {
            g->bytes_sent += s;
            g->bytes_recv += r;
        }
    }
    if (total > INT_MAX) return GCOMP_E_LIMIT; /* bounded at set-up; cannot happen */
    if (gm_reserve(&g->recv, total ? total : 1) != GCOMP_OK) return GCOMP_E_NOMEM;
    int rc = MPI_Ialltoallv(g->send.p, g->cnt_s, g->dsp_s, MPI_BYTE, g->recv.p, g->cnt_r, g->dsp_r,
                            MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Ialltoallv (slices)");
    g->nreq = 1;
    return GCOMP_OK;
}

static gcomp_status ow_owner(gcomp_mpi_bucket *b, gm_group *g) {
    size_t P = (size_t)g->xsize, nt = g->nt, off = 0;
    int me = g->xrank;
    for (size_t k = 0; k < nt; k++) g->gsz_send[k] = 0;
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
        float *acc = t->io + t->reg[me];
        if (mine && g->strategy == GCOMP_MPI_RSAG) memset(acc, 0, mine * sizeof(float));
        for (size_t r = 0; r < P; r++) {
            size_t len = (size_t)g->sz_recv[r * nt + k];
            const uint8_t *m = recv + g->pos[r];
            g->pos[r] += len;
            if (st != GCOMP_OK || !mine) continue;
            if (g->strategy == GCOMP_MPI_RSAG) /* a chunk message from every rank */
                st = len ? gm_decode_checked(t->dec && t->dec[r] ? t->dec[r] : t->chunk[me], m, len,
                                             t->rfp ? t->rfp[r] : t->fp, mine, acc, 1.0f)
                         : GCOMP_E_CORRUPT;
            else if ((int)r != me) /* my own part is already in acc */
                st = gm_slice_decode_add(m, len, mine, acc);
            if (st != GCOMP_OK) from = (int)r;
        }
        size_t len = 0;
        bool reencode = st == GCOMP_OK;
        if (st == GCOMP_OK && mine)
            st = gcomp_encode(t->owner, acc, (uint8_t *)g->gsend.p + off, g->gsend.cap - off, &len);
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
                             gcomp_compressor_residual(t->owner) ? " plus the owner residual" : "");
                else
                    snprintf(g->local_msg, sizeof g->local_msg,
                             "tensor '%s' (#%zu): owner: %s in the contribution of %s %d", t->name,
                             g->t0 + k, gcomp_status_str(st), g->hier ? "node" : "rank", from);
            }
            continue;
        }
        g->gsz_send[k] = len;
        t->gsend_off = off;
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
    uint64_t total = 0;
    for (size_t r = 0; r < P; r++) {
        uint64_t c = 0;
        for (size_t k = 0; k < nt; k++) c += g->gsz_recv[r * nt + k];
        if (c > INT_MAX || total + c > INT_MAX) {
            gm_group_shared_fail(b, g, GCOMP_E_LIMIT, -1, g->t0);
            return GCOMP_OK;
        }
        g->cnt_r[r] = (int)c;
        g->dsp_r[r] = (int)total;
        total += c;
    }
    if (gm_reserve(&g->grecv, total ? total : 1) != GCOMP_OK) return GCOMP_E_NOMEM;
    int rc = MPI_Iallgatherv(g->gsend.p, (int)g->gsend_len, MPI_BYTE, g->grecv.p, g->cnt_r,
                             g->dsp_r, MPI_BYTE, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Iallgatherv (owner messages)");
    g->nreq = 1;
    g->bytes_sent += g->gsend_len * (P - 1);
    g->bytes_recv += total - g->gsend_len;
    for (size_t k = 0; k < nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        t->call.bytes_sent += g->gsz_send[k] * (P - 1) + 8 * (P - 1);
        t->call.bytes_received += 8 * (P - 1);
        for (size_t r = 0; r < P; r++)
            if ((int)r != g->xrank) t->call.bytes_received += g->gsz_recv[r * nt + k];
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
            size_t len = (size_t)g->gsz_recv[j * nt + k], lj = reg_len(t, (int)j);
            const uint8_t *m = grecv + g->pos[j];
            g->pos[j] += len;
            if (!lj || g->st != GCOMP_OK) continue;
            gcomp_status st = gm_decode_checked(lj == mine ? t->owner : NULL, m, len, t->owner_fp,
                                                lj, t->io + t->reg[j], b->scale);
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
    int me = g->xrank;
    for (size_t k = 0; k < g->nt; k++) {
        gm_tensor *t = &b->t[g->t0 + k];
        uint64_t t0 = gm_now_ns();
        int rc = g->strategy == GCOMP_MPI_RSAG
                     ? gm_zero_progress(g, t->io, t->n)
                     : gm_zero_progress(g, t->io + t->reg[me], reg_len(t, me));
        t->call.codec_ns += gm_now_ns() - t0;
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Testall (owner messages)");
    }
    return GCOMP_OK;
}

void gm_steps_owner(gm_group *g) {
    if (g->strategy == GCOMP_MPI_RSAG)
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

gcomp_status gm_reserve_owner(gcomp_mpi_bucket *b, gm_group *g) {
    size_t P = (size_t)g->xsize, off = 0, recv_max = 0, gcap = 0;
    int me = g->xrank;
    for (size_t j = 0; j < P; j++) {
        g->dest_off[j] = off;
        for (size_t i = g->t0; i < g->t1; i++) {
            gm_tensor *t = &b->t[i];
            size_t lj = reg_len(t, (int)j);
            if (!lj) continue;
            if (g->strategy == GCOMP_MPI_RSAG)
                off += gcomp_encode_bound(t->chunk[j]);
            else if ((int)j != me)
                off += gm_slice_bound(lj);
        }
    }
    g->dest_off[P] = off;
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        size_t mine = reg_len(t, me);
        if (!mine) continue;
        recv_max += P * (g->strategy == GCOMP_MPI_RSAG ? gcomp_encode_bound(t->chunk[me])
                                                       : gm_slice_bound(mine));
        gcap += gcomp_encode_bound(t->owner);
    }
    if (off > INT_MAX || recv_max > INT_MAX || gcap > INT_MAX) return GCOMP_E_LIMIT;
    if (gm_reserve(&g->send, off ? off : 1) != GCOMP_OK ||
        gm_reserve(&g->gsend, gcap ? gcap : 1) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

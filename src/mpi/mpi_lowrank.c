/*
 * mpi_lowrank.c - PowerSGD (Vogels et al. 2019) through the multi-phase protocol of
 * gradcomp.h (gcomp_lowrank_*): the component that provides the allreduce strategy for a
 * codec whose state machine needs reductions in the middle of compressing
 * (GCOMP_SPEC_MULTIPHASE).  The linear pack (mpi_allreduce.c) provides it for the rest.
 *
 *   begin     gcomp_lowrank_begin: P = (grad + E) * Q_warm, or a dense step (rounds 0)
 *   reduce 1  MPI_Iallreduce of P (or of the whole gradient on a dense step)
 *   mid       after_p: orthogonalise the summed P, Q_local = M^T P^
 *   reduce 2  MPI_Iallreduce of Q
 *   ...       (iters > 1: after_q gives the next P, and two more reductions)
 *   finish    out = scale * P^ Q^T, E = M - P^ Q_local^T
 *
 * Each reduction goes with a one-word MPI_MAX (a failure marker, and on the first one a
 * hash of the round count and buffer sizes), so a rank whose step failed, or whose
 * protocol differs, makes every rank abandon the step (gcomp_lowrank_abort: the state
 * stays as before begin) and skip the remaining reductions together.  The reduction that
 * carries the marker keeps the size the other ranks give it: a rank whose begin refused
 * its gradient, or whose Q overflowed, sends zeros of the step's shape
 * (gcomp_lowrank_shape) there.  The buffers are
 * copied into the group's pack buffer for the reduction rather than reduced in place in
 * the compressor: after a timeout MPI may still write into a reduction's buffer, and the
 * pack buffer is one the library keeps alive for that (gm_grave); P and Q are small.
 * Values travel as f32, or as f16/bf16 summed by the half op when the spec's value type
 * says so.  One tensor per sub-bucket: its round count is its own.
 */
#include "mpi_strategy.h"

#include <limits.h>
#include <stdio.h>

/* The group's state (one tensor per group). */
typedef struct lr_group {
    int vid;                       /* wire type of the factors (GM_VID_*) */
    size_t count;                  /* values in the pack */
    int phase, phases, max_phases; /* reductions done, needed this step, at most */
    bool started;                  /* gcomp_lowrank_begin succeeded: abort on failure */
    float *cur;                    /* the compressor's buffer being summed */
    size_t cur_len;
    size_t p_len, q_len; /* each round's P and Q (gcomp_lowrank_shape) */
} lr_group;

static void pack_values(gm_group *g, const float *src, size_t count) {
    lr_group *l = g->priv;
    if (l->vid == GM_VID_F32)
        memcpy(g->pack.p, src, count * 4);
    else
        gm_f32_to_halves(src, count, l->vid == GM_VID_BF16, g->pack.p);
    l->count = count;
}

/* What a rank whose step failed sends in place of a factor: every reduction keeps the size
 * the other ranks give it (a smaller one is MPI_ERR_TRUNCATE, or a hang), and the failure
 * marker beside it makes all of them abandon the step at the next lr_mid. */
static void pack_zeros(gm_group *g, size_t count) {
    lr_group *l = g->priv;
    memset(g->pack.p, 0, count * gm_vid_width(l->vid));
    l->count = count;
}

static void unpack_values(const gm_group *g, float *dst, size_t count, float scale) {
    const lr_group *l = g->priv;
    if (l->vid == GM_VID_F32) {
        const float *v = g->pack.p;
        if (scale == 1.0f)
            memcpy(dst, v, count * 4);
        else
            for (size_t i = 0; i < count; i++) dst[i] = scale * v[i];
    } else {
        gm_halves_to_f32(g->pack.p, count, l->vid == GM_VID_BF16, scale, dst);
    }
}

static void local_fail(gcomp_mpi_bucket *b, gm_group *g, gcomp_status st, const char *what) {
    gm_group_local_fail(b, g, st, g->t0, what);
    uint64_t m = gm_marker(st, g->xrank);
    if (m > g->chk[0]) g->chk[0] = m;
}

static gcomp_status lr_begin(gcomp_mpi_bucket *b, gm_group *g) {
    lr_group *l = g->priv;
    gm_tensor *t = &b->t[g->t0];
    float *p = NULL;
    size_t np = 0;
    unsigned rounds = 0;
    uint64_t t0 = gm_now_ns();
    g->chk[0] = 0;
    l->phase = 0;
    unsigned shape_rounds = 0;
    gcomp_status st = gcomp_lowrank_shape(t->c, &shape_rounds, &l->p_len, &l->q_len);
    if (st == GCOMP_OK) st = gcomp_lowrank_begin(t->c, t->io, &p, &np, &rounds);
    if (st != GCOMP_OK) {
        /* The step's shape still, so that the first reduction matches the other ranks'. */
        local_fail(b, g, st, "PowerSGD begin");
        rounds = shape_rounds;
        np = l->p_len;
    }
    l->phases = rounds ? 2 * (int)rounds : 1;
    if (l->phases > l->max_phases) { /* cannot be: iters bounds it; fail safely */
        local_fail(b, g, GCOMP_E_PROTOCOL, "PowerSGD rounds");
        l->phases = 1;
    }
    if (rounds) {
        l->cur = p;
        l->cur_len = np;
        if (np > t->n) { /* cannot be for rank <= min(rows, cols); fail safely */
            local_fail(b, g, GCOMP_E_LIMIT, "PowerSGD factor size");
            np = 0;
        }
        if (st == GCOMP_OK)
            pack_values(g, p, np);
        else
            pack_zeros(g, np);
    } else {
        /* Dense step: the gradient, or after a retune the gradient plus what the old spec
         * held back (p).  The compressor does not check the gradient then, so it is here. */
        const float *x = p ? p : t->io;
        float z = 0.0f;
        for (size_t i = 0; i < t->n; i++) z += x[i] * 0.0f; /* NaN/Inf make z NaN */
        if (z != z) local_fail(b, g, GCOMP_E_NONFINITE, "dense step");
        pack_values(g, x, t->n);
    }
    l->started = st == GCOMP_OK;
    /* Ranks must agree on the protocol: rounds and the size of the first buffer. */
    uint64_t h = gm_mix(((uint64_t)rounds << 40) ^ l->count);
    g->chk[1] = h;
    g->chk[2] = ~h;
    t->call.codec_ns += gm_now_ns() - t0;
    return GCOMP_OK;
}

static gcomp_status lr_reduce(gcomp_mpi_bucket *b, gm_group *g) {
    lr_group *l = g->priv;
    if (g->st != GCOMP_OK || l->phase >= l->phases) return GCOMP_OK; /* all ranks skip */
    gm_tensor *t = &b->t[g->t0];
    int nchk = l->phase == 0 ? 3 : 1;
    gcomp_status st = gm_start_pack_reduce(b, g, l->vid, l->count, nchk, "PowerSGD factors");
    if (st != GCOMP_OK) return st;
    uint64_t v = gm_ring_bytes(l->count * gm_vid_width(l->vid) + 8 * (size_t)nchk, g->xsize);
    g->bytes_sent += v;
    g->bytes_recv += v;
    t->call.bytes_sent += v;
    t->call.bytes_received += v;
    return GCOMP_OK;
}

static gcomp_status lr_mid(gcomp_mpi_bucket *b, gm_group *g) {
    lr_group *l = g->priv;
    gm_tensor *t = &b->t[g->t0];
    if (g->st != GCOMP_OK || l->phase >= l->phases) return GCOMP_OK;
    uint64_t t0 = gm_now_ns();
    if (g->chk_out[0] & GM_MARK) {
        gm_group_shared_fail(b, g, gm_marker_status(g->chk_out[0]), gm_marker_rank(g->chk_out[0]),
                             g->t0);
    } else if (l->phase == 0 && g->chk_out[1] != ~g->chk_out[2]) {
        g->st = GCOMP_E_MISMATCH;
        snprintf(g->msg, sizeof g->msg,
                 "tensor '%s': PowerSGD rounds or factor sizes differ across ranks (step counts "
                 "out of step?)",
                 t->name);
    }
    if (g->st != GCOMP_OK) { /* every rank saw it: all abandon the step here */
        if (l->started) gcomp_lowrank_abort(t->c);
        l->started = false;
        t->call.codec_ns += gm_now_ns() - t0;
        return GCOMP_OK;
    }
    int k = l->phase++;
    gcomp_status st = GCOMP_OK;
    float *next = NULL;
    size_t len = 0;
    g->chk[0] = 0;
    float *dst = l->phases == 1 ? t->io : l->cur;
    size_t count = l->phases == 1 ? t->n : l->cur_len;
    /* The protocol sums in place: the summed values go back into the compressor's buffer
     * of this phase (or, on a dense step, the output) before the next call reads them. */
    unpack_values(g, dst, count, l->phases == 1 ? b->scale : 1.0f);
    if (!gm_finite(dst, count)) {
        /* Finite factors whose sum overflowed: every rank holds the same sum, so all
         * abandon the step here, before anything is committed. */
        gm_group_overflow(b, g, g->t0, l->phases == 1 ? "dense sum" : "summed PowerSGD factor");
        if (l->started) gcomp_lowrank_abort(t->c);
        l->started = false;
        t->call.codec_ns += gm_now_ns() - t0;
        return GCOMP_OK;
    }
    if (l->phases == 1) { /* dense step: the sum is the answer */
        st = gcomp_lowrank_finish(t->c, NULL, 0.0f);
    } else {
        if (k % 2 == 0)
            st = gcomp_lowrank_after_p(t->c, &next, &len);
        else if (k + 1 < l->phases)
            st = gcomp_lowrank_after_q(t->c, &next, &len);
        else
            st = gcomp_lowrank_finish(t->c, t->io, b->scale);
        if (st == GCOMP_OK && next) {
            l->cur = next;
            l->cur_len = len;
            pack_values(g, next, len);
        }
    }
    if (st != GCOMP_OK) {
        if (l->phase < l->phases) {
            local_fail(b, g, st, k % 2 == 0 ? "PowerSGD, Q = M^T P^" : "PowerSGD, next P");
            pack_zeros(g, k % 2 == 0 ? l->q_len : l->p_len);
        } else {
            l->started = false; /* the last phase: nothing left to share it with */
            gm_group_local_fail(b, g, st, g->t0, "PowerSGD finish");
            g->st = st;
            snprintf(g->msg, sizeof g->msg, "%.250s", g->local_msg);
        }
    }
    t->call.codec_ns += gm_now_ns() - t0;
    return GCOMP_OK;
}

/* ---- the component -------------------------------------------------------------------------- */

static void lr_steps(gcomp_mpi_bucket *b, gm_group *g) {
    lr_group *l = g->priv;
    l->max_phases = (int)b->t[g->t0].info.phases; /* <= 16: lr_query */
    gm_add_step(g, false, lr_begin, "PowerSGD begin");
    for (int k = 0; k < l->max_phases; k++) {
        gm_add_step(g, true, lr_reduce,
                    k % 2 ? "summing Q (MPI_Iallreduce)" : "summing P (MPI_Iallreduce)");
        gm_add_step(g, false, lr_mid, "PowerSGD step");
    }
}

static gcomp_status lr_reserve(gcomp_mpi_bucket *b, gm_group *g) {
    const gm_tensor *t = &b->t[g->t0];
    lr_group *l = g->priv; /* again after a retune's planning (mpi_strategy.h) */
    if (!l && !(l = gm_calloc(1, sizeof *l))) return GCOMP_E_NOMEM;
    g->priv = l;
    l->vid = t->info.value_type == GCOMP_VALUES_F16    ? GM_VID_F16
             : t->info.value_type == GCOMP_VALUES_BF16 ? GM_VID_BF16
                                                       : GM_VID_F32;
    /* P (rows x r) and Q (r x cols) are at most n values each for any useful rank; the
     * dense step sends n. */
    return gm_reserve(&g->pack, t->n * 4 + 64);
}

/* One PowerSGD tensor per sub-bucket: each has its own round count. */
static bool lr_groups_with(const gm_tensor *first, const gm_tensor *t) {
    (void)first;
    (void)t;
    return false;
}

/* A failed call may have left a step half done: abandon it (the state goes back to
 * before the call), as the failure meant anyway. */
static void lr_abandon(gm_tensor *t) {
    if (t->c) gcomp_lowrank_abort(t->c);
}

/* Multi-phase codecs only, and those only here (3).  The schedule has a fixed number of
 * steps, so the rounds per step are bounded (at most 8 power iterations); the limit is
 * checked for a tensor, not for the spec alone (auto without a tensor). */
static int lr_query(const gm_query *q, const char **why) {
    if (!(q->info->flags & GCOMP_SPEC_MULTIPHASE)) {
        *why = "the multi-phase allreduce carries multi-phase codecs only";
        return -2;
    }
    if (q->n && (q->info->phases < 1 || q->info->phases > 16)) {
        *why = "the MPI layer runs 1 to 8 power iterations (iters=) per step";
        return -1;
    }
    return 3;
}

const gm_strategy gm_strategy_lowrank = {
    .version = GM_STRATEGY_VERSION,
    GM_NAMES("allreduce"),
    .id = GCOMP_MPI_ALLREDUCE,
    .query = lr_query,
    .groups_with = lr_groups_with,
    .reserve = lr_reserve,
    .steps = lr_steps,
    .abandon = lr_abandon,
};

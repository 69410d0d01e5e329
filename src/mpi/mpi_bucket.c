/*
 * mpi_bucket.c - the bucket engine: set-up (tensors, sub-buckets, the cross-rank check),
 * the pipelined engine behind start/test/wait, statistics and introspection.
 *
 * Components.  The engine knows no strategy: each tensor's strategy is a component of the
 * table in mpi_strategy.c (mpi_strategy.h has the contract), chosen by its query from the
 * spec's description, and the engine calls its members - set-up of the tensor on the
 * ranks of the exchange, the grouping rule, the reservation and the steps of each
 * sub-bucket, checkpoint slots, the owner view.  What several strategies need (size words
 * and markers, the pack reductions, decoders per rank, derived specs, the buffers handed
 * to MPI, statistics) is here or in mpi_spec.c / mpi_util.c, and components call it, never
 * each other.  The hierarchical flag is a wrapper of the engine's (mpi_hier.c), which puts
 * the node-internal sum before a component's steps and the broadcast after them.
 *
 * Engine.  A bucket is cut into groups (sub-buckets, see gradcomp_mpi.h).  Each group
 * runs a fixed list of steps: LOCAL steps do codec work, COLL steps issue non-blocking
 * collectives.  MPI matches collectives on a communicator by the order they are issued,
 * so COLL steps are issued in one global order on every rank - lexicographic in (group,
 * step) - whatever the timing; a later group's LOCAL steps (its compression) run while an
 * earlier group's collectives are in flight, and an earlier group is decoded while a
 * later one is on the wire.  This is PyTorch DDP's / Horovod's bucketing with the
 * compression folded into the pipeline.  Rejected: a progress thread (needs
 * MPI_THREAD_MULTIPLE, which many MPI builds do not give, and doubles the CPU use on
 * machines as small as these); one communicator for all buckets (buckets started in
 * different orders by a trainer would then mismatch: each bucket has its own duplicate).
 *
 * Memory.  Every allocation goes through libgradcomp's allocator (gm_alloc), and all of
 * them happen at creation: a call allocates nothing in this layer, because a rank that ran
 * out of memory in the middle of an exchange could not tell the others (tests/mpi/
 * test_mpi_nomem.c sweeps every allocation).  Creation itself issues the same collectives
 * on every rank whatever its memory (their results live in the communicator's cells), so
 * a local failure travels in the check below.
 *
 * Set-up check.  Bucket creation compares, across ranks, a hash of everything that must
 * agree (tensor count, each tensor's canonical spec fingerprint, n, shape, strategy,
 * name, the format version, the MPI wire revision and the bucket options) with one
 * MPI_Allreduce(MPI_MAX) of (h, ~h): every rank gets max(h) and ~min(h), so all agree
 * whether and where they differ.  Only when the bucket hash differs does a second
 * allreduce name the tensor.  A rank that failed locally (bad spec, out of memory) puts a
 * marker in the first allreduce, so the others fail too instead of waiting for it.
 */
#include "mpi_strategy.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- small helpers shared with the strategy files ---------------------------------------- */

uint64_t gm_ring_bytes(size_t bytes, int p) {
    return p > 1 ? (uint64_t)((2.0 * (double)(p - 1) / (double)p) * (double)bytes) : 0;
}

gcomp_status gm_issue_fail(gcomp_mpi_bucket *b, int rc, const char *what) {
    return gm_comm_mpi_fail(b->comm, NULL, rc, what);
}

/* Makes room for k requests in g->req. */
static gcomp_status gm_req_room(gm_group *g, int k) {
    if (g->req_cap >= k) return GCOMP_OK;
    gcomp_status st =
        gm_grow((void **)&g->req, (size_t)g->req_cap * sizeof *g->req, (size_t)k * sizeof *g->req);
    if (st == GCOMP_OK) g->req_cap = k;
    return st;
}

void gm_group_local_fail(gcomp_mpi_bucket *b, gm_group *g, gcomp_status st, size_t tensor,
                         const char *what) {
    if (g->local_st != GCOMP_OK) return;
    g->local_st = st;
    snprintf(g->local_msg, sizeof g->local_msg, "tensor '%s' (#%zu): %s: %s", b->t[tensor].name,
             tensor, what, gcomp_status_str(st));
}

void gm_group_shared_fail(gcomp_mpi_bucket *b, gm_group *g, gcomp_status st, int rank,
                          size_t tensor) {
    if (g->st != GCOMP_OK) return;
    g->st = st;
    const char *who = g->hier ? "node" : "rank";
    int me = g->hier ? b->comm->node_index : b->comm->rank;
    if (rank == me && g->local_st != GCOMP_OK)
        snprintf(g->msg, sizeof g->msg, "%.224s (on this %s)", g->local_msg, who);
    else if (rank >= 0)
        snprintf(g->msg, sizeof g->msg, "tensor '%s' (#%zu): %s (found by %s %d)",
                 b->t[tensor].name, tensor, gcomp_status_str(st), who, rank);
    else
        snprintf(g->msg, sizeof g->msg, "tensor '%s' (#%zu): %s", b->t[tensor].name, tensor,
                 gcomp_status_str(st));
}

void gm_group_overflow(gcomp_mpi_bucket *b, gm_group *g, size_t tensor, const char *where) {
    if (g->st != GCOMP_OK) return;
    g->st = GCOMP_E_NONFINITE;
    snprintf(g->msg, sizeof g->msg,
             "tensor '%s' (#%zu): %s: %s (every contribution was finite; their sum overflows "
             "float: diverging, or a loss scale too high?)",
             b->t[tensor].name, tensor, where, gcomp_status_str(GCOMP_E_NONFINITE));
}

bool gm_scan_markers(gcomp_mpi_bucket *b, gm_group *g, const uint64_t *w, size_t count,
                     size_t per_rank) {
    for (size_t i = 0; i < count; i++)
        if (w[i] & GM_MARK) {
            gm_group_shared_fail(b, g, gm_marker_status(w[i]), gm_marker_rank(w[i]),
                                 g->t0 + i % per_rank);
            return true;
        }
    return false;
}

bool gm_scan_specs(gcomp_mpi_bucket *b, gm_group *g, const uint64_t *w, size_t count,
                   size_t per_rank) {
    for (size_t i = 0; i < count; i++) {
        const gm_tensor *t = &b->t[g->t0 + i % per_rank];
        if ((uint32_t)(w[i] >> 32) == gm_spec_tag(t->fp)) continue;
        int r = (int)(i / per_rank);
        gm_group_shared_fail(b, g, GCOMP_E_MISMATCH, r, g->t0 + i % per_rank);
        snprintf(g->msg, sizeof g->msg,
                 "tensor '%.40s': %s %d sends another spec than '%.80s' (a retune not made "
                 "everywhere?)",
                 t->name, g->hier ? "node" : "rank", r, t->spec);
        return true;
    }
    return false;
}

gcomp_status gm_gather_counts(gm_group *g, const uint64_t *w, size_t per_rank, size_t *total) {
    uint64_t sum = 0;
    for (size_t r = 0; r < (size_t)g->xsize; r++) {
        uint64_t c = 0;
        for (size_t k = 0; k < per_rank; k++) c += gm_size_len(w[r * per_rank + k]);
        if (c > INT_MAX || sum + c > INT_MAX) return GCOMP_E_LIMIT;
        g->cnt_r[r] = (int)c;
        g->dsp_r[r] = (int)sum;
        sum += c;
    }
    *total = (size_t)sum;
    return GCOMP_OK;
}

gcomp_status gm_start_pack_reduce(gcomp_mpi_bucket *b, gm_group *g, int vid, size_t count, int nchk,
                                  const char *what) {
    char msg[96];
    int rc = MPI_Iallreduce(g->chk, g->chk_out, nchk, MPI_UINT64_T, MPI_MAX, g->xc, &g->req[0]);
    if (rc != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI_Iallreduce (check words of the %s)", what);
        return gm_issue_fail(b, rc, msg);
    }
    g->nreq = 1;
    MPI_Datatype dt = vid == GM_VID_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = vid == GM_VID_F32   ? MPI_SUM
                : vid == GM_VID_F16 ? b->comm->op_f16
                                    : b->comm->op_bf16;
    /* The reduction sends the whole pack at each hop (two ranks each other; more, libnbc's
     * binomial tree, which it takes for every in-place call).  Above the eager limit each
     * is a rendezvous, one more round trip before the bulk, and two ranks' directions can
     * take turns on their one socket (mpi_adapt.c, the link probe).  Slices below the
     * limit go at once.  The binomial tree sums every element in the same order whatever
     * the count, so the bits are the unsliced reduction's. */
    size_t w = gm_vid_width(vid), per = count;
    if (g->xsize > 1 && count * w > GM_SLICE_BYTES) {
        size_t n = (count * w + GM_SLICE_BYTES - 1) / GM_SLICE_BYTES;
        if (n > GM_SLICES_MAX) n = GM_SLICES_MAX;
        per = (count + n - 1) / n; /* n slices of `per` cover the pack */
    }
    for (size_t lo = 0; lo < count; lo += per) {
        size_t len = count - lo < per ? count - lo : per;
        rc = MPI_Iallreduce(MPI_IN_PLACE, (uint8_t *)g->pack.p + lo * w, (int)len, dt, op, g->xc,
                            &g->req[g->nreq]);
        if (rc != MPI_SUCCESS) {
            snprintf(msg, sizeof msg, "MPI_Iallreduce (%s)", what);
            return gm_issue_fail(b, rc, msg);
        }
        g->nreq++;
    }
    return GCOMP_OK;
}

/* ---- tensors ------------------------------------------------------------------------------ */

void gm_tensor_free(gm_tensor *t) {
    if (t->S && t->S->tensor_free) t->S->tensor_free(t);
    t->priv = NULL;
    gm_free(t->name);
    gcomp_compressor_free(t->c);
    gm_free(t->msgs);
    /* t->work and t->tmp are freed (or buried) by the bucket */
}

gcomp_status gm_tensor_setup(gcomp_mpi_bucket *b, gm_tensor *t, size_t i, const gcomp_mpi_tensor *d,
                             gcomp_error *err) {
    gcomp_mpi_comm *c = b->comm;
    char nm[32];
    if (!d->name) snprintf(nm, sizeof nm, "#%zu", i);
    t->name = gm_strdup(d->name ? d->name : nm);
    if (!t->name) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    t->n = d->n;
    t->rows = d->rows;
    t->cols = d->cols;
    if (!d->spec) return gm_fail(err, GCOMP_E_ARG, "tensor '%s': spec is NULL", t->name);
    if (d->n == 0) return gm_fail(err, GCOMP_E_ARG, "tensor '%s': n is 0", t->name);
    if (d->n > (size_t)INT_MAX)
        return gm_fail(err, GCOMP_E_ARG, "tensor '%s': %zu elements; MPI counts allow %d", t->name,
                       d->n, INT_MAX);
    gcomp_error e2;
    gcomp_status st = gm_spec_describe(d->spec, t->spec, sizeof t->spec, &t->fp, &t->info, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    int s = d->strategy, base = s & 0xff;
    t->req_strategy = s;
    const gm_strategy *S = base == GCOMP_MPI_AUTO ? NULL : gm_strategy_by_id(base);
    if ((s & ~(0xff | GCOMP_MPI_HIERARCHICAL)) || (base != GCOMP_MPI_AUTO && !S))
        return gm_fail(err, GCOMP_E_ARG,
                       "tensor '%s': strategy %d is not one of gcomp_mpi_strategy", t->name, s);
    t->hier = (s & GCOMP_MPI_HIERARCHICAL) != 0;
    t->xsize = t->hier ? c->nnodes : c->size;
    t->xrank = t->hier ? c->node_index : c->rank;
    t->exchange = (!t->hier || c->node_rank == 0) && !(t->hier && c->nnodes == 1);
    gm_query q = {t->spec, &t->info, t->n, t->rows, t->cols, t->xsize};
    const char *why = NULL;
    S = gm_strategy_choose(&q, base, &why);
    if (!S && base == GCOMP_MPI_AUTO)
        return gm_fail(err, GCOMP_E_UNSUPPORTED, "tensor '%s': no strategy carries '%s': %s",
                       t->name, t->spec, why);
    if (!S)
        return gm_fail(err, GCOMP_E_UNSUPPORTED, "tensor '%s': strategy %s cannot carry '%s': %s",
                       t->name, gcomp_mpi_strategy_name(base), t->spec, why);
    t->S = S;
    t->strategy = S->id;

    t->msgs = gm_calloc((size_t)(t->xsize > 0 ? t->xsize : 1), sizeof *t->msgs);
    if (!t->msgs) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    if (t->hier && (gm_reserve(&t->work, t->n * sizeof(float)) != GCOMP_OK ||
                    (c->node_size > 1 && gm_reserve(&t->tmp, t->n * sizeof(float)) != GCOMP_OK)))
        return gm_fail(err, GCOMP_E_NOMEM, "tensor '%s': out of memory", t->name);
    if (!t->exchange) return GCOMP_OK; /* no compressor here */

    snprintf(t->wspec, sizeof t->wspec, "%s", t->spec);
    if (S->tensor_setup) return S->tensor_setup(b, t, err);
    st = gcomp_compressor_create(&t->c, t->wspec, t->n, t->rows, t->cols, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", t->name, e2.message);
    return GCOMP_OK;
}

/* ---- groups ------------------------------------------------------------------------------- */

gcomp_status gm_group_setup(gcomp_mpi_bucket *b, gm_group *g) {
    gcomp_mpi_comm *c = b->comm;
    gm_tensor *t0 = &b->t[g->t0];
    g->nt = g->t1 - g->t0;
    g->S = t0->S;
    g->hier = t0->hier;
    g->single_node = g->hier && c->nnodes == 1;
    g->xc = g->hier ? b->bleaders : b->bc;
    g->xsize = t0->xsize;
    g->xrank = t0->xrank;
    g->member = !g->hier || c->node_rank == 0;
    if (gm_req_room(g, (int)g->nt + 4 + GM_SLICES_MAX) != GCOMP_OK) return GCOMP_E_NOMEM;
    size_t P = (size_t)g->xsize, nt = g->nt;
    size_t words = 8 * (3 * P * nt + nt + 2 * GM_CHK + 1) + sizeof(size_t) * (P + 1) +
                   sizeof(int) * 4 * P + 64;
    if (gm_reserve(&g->words, words) != GCOMP_OK) return GCOMP_E_NOMEM;
    memset(g->words.p, 0, words);
    uint64_t *w = g->words.p;
    g->sz_send = w;
    g->sz_recv = w + P * nt;
    g->gsz_recv = w + 2 * P * nt;
    g->gsz_send = w + 3 * P * nt;
    g->chk = g->gsz_send + nt;
    g->chk_out = g->chk + GM_CHK;
    g->hstat = g->chk_out + GM_CHK;
    g->pos = (size_t *)(g->hstat + 1);
    int *ip = (int *)(g->pos + P + 1);
    g->cnt_s = ip;
    g->dsp_s = ip + P;
    g->cnt_r = ip + 2 * P;
    g->dsp_r = ip + 3 * P;

    /* The schedule: [hierarchical prefix] [the component's steps] [hierarchical suffix].
     * Ranks outside the exchange (node members under the wrapper) run only the wrapper's. */
    bool inner = g->member && !g->single_node;
    if (inner && g->S->reserve) {
        gcomp_status st = g->S->reserve(b, g);
        if (st != GCOMP_OK) return st;
    }
    g->nsteps = 0;
    if (g->hier) gm_steps_hier_prefix(g, c->node_size);
    int first_inner = g->nsteps;
    if (inner) g->S->steps(b, g);
    if (g->hier) {
        for (int i = first_inner; i < g->nsteps; i++) g->steps[i].member_only = true;
        gm_steps_hier_suffix(g, c->node_size);
    }
    if (g->steps_nomem) return GCOMP_E_NOMEM;
    g->last_coll = -1;
    for (int i = 0; i < g->nsteps; i++)
        if (g->steps[i].coll) g->last_coll = i;
    return GCOMP_OK;
}

void gm_add_step(gm_group *g, bool coll, gm_step_fn fn, const char *what) {
    if (g->nsteps == g->steps_cap) {
        int cap = g->steps_cap ? 2 * g->steps_cap : 16;
        if (gm_grow((void **)&g->steps, (size_t)g->steps_cap * sizeof *g->steps,
                    (size_t)cap * sizeof *g->steps) != GCOMP_OK) {
            g->steps_nomem = true;
            return;
        }
        g->steps_cap = cap;
    }
    g->steps[g->nsteps++] = (gm_step){coll, false, fn, what, NULL};
}

static bool same_group(const gm_tensor *a, const gm_tensor *t) {
    if (a->S != t->S || a->hier != t->hier) return false;
    return !a->S->groups_with || a->S->groups_with(a, t);
}

/* ---- the set-up check ------------------------------------------------------------------------ */

enum { CHK_T = 0, CHK_H = 2, CHK_FAIL = 4, CHK_N = 5 };
enum { PT_FP = 0, PT_SIZE = 2, PT_STRAT = 4, PT_NAME = 6, PT_N = 8 };
_Static_assert(CHK_N <= GM_SETUP_WORDS, "the check words go through gm_setup_cells");

static void put_pair(uint64_t *a, uint64_t v) {
    a[0] = v;
    a[1] = ~v;
}
static bool pair_differs(const uint64_t *a) {
    return a[0] != ~a[1];
}

/* The check over `bc` (the bucket's duplicate).  `b` is NULL, and `tin` / `tout` (count *
 * PT_N words each, for the second round) may be NULL, only on a rank whose set-up failed
 * (local != GCOMP_OK): its marker makes every rank fail in the first round.  On a timeout
 * the cells stay pending and tout is leaked: MPI may still write them. */
static gcomp_status setup_check(gcomp_mpi_comm *c, MPI_Comm bc, const gcomp_mpi_bucket *b,
                                const gcomp_mpi_tensor *d, size_t count, gcomp_status local,
                                uint64_t *tin, uint64_t *tout, uint64_t deadline,
                                gcomp_error *err) {
    uint64_t in[CHK_N], out[CHK_N];
    uint64_t h =
        gm_mix(GCOMP_FORMAT_VERSION) ^ gm_mix(0x5eed0000ull + (b ? b->opt.bucket_bytes : 0));
    h = gm_mix(h ^ (uint64_t)c->opt.ranks_per_node);
    h = gm_mix(h ^ (0x3173000000ull + GM_WIRE_REVISION));
    for (size_t i = 0; b && tin && i < count; i++) {
        const gm_tensor *t = &b->t[i];
        /* A rank whose canonicalisation failed hashes the raw spec: it fails anyway. */
        uint64_t fp =
            t->fp ? t->fp
                  : gm_fnv1a(d[i].spec ? d[i].spec : "", d[i].spec ? strlen(d[i].spec) : 0, 0);
        fp = gm_mix(fp ^ ((uint64_t)GCOMP_FORMAT_VERSION << 56));
        uint64_t sz =
            gm_mix(gm_mix(d[i].n) ^ gm_mix(d[i].rows * 0x9e3779b97f4a7c15ull) ^ (d[i].cols << 1));
        uint64_t strat = (uint64_t)((unsigned)d[i].strategy) << 8 | (uint64_t)(t->strategy & 0xff);
        uint64_t nm = d[i].name ? gm_fnv1a(d[i].name, strlen(d[i].name), 0) : gm_mix(i + 1);
        uint64_t *p = tin + i * PT_N;
        put_pair(p + PT_FP, fp);
        put_pair(p + PT_SIZE, sz);
        put_pair(p + PT_STRAT, strat);
        put_pair(p + PT_NAME, nm);
        h = gm_mix(h ^ fp) + gm_mix(sz ^ (strat << 1)) + nm;
    }
    put_pair(in + CHK_T, count);
    put_pair(in + CHK_H, h);
    in[CHK_FAIL] = local != GCOMP_OK ? gm_marker(local, c->rank) : 0;
    gcomp_status st = gm_comm_agree_on(c, bc, in, CHK_N, out, deadline, "bucket set-up check", err);
    if (st != GCOMP_OK) return st;
    if (out[CHK_FAIL]) {
        uint64_t m = out[CHK_FAIL];
        if (local != GCOMP_OK) return local;
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "rank %d could not set up the bucket (%s); no rank uses it",
                       gm_marker_rank(m), gcomp_status_str(gm_marker_status(m)));
    }
    if (pair_differs(out + CHK_T))
        return gm_fail(err, GCOMP_E_MISMATCH, "ranks have different tensor counts (%llu to %llu)",
                       (unsigned long long)~out[CHK_T + 1], (unsigned long long)out[CHK_T]);
    if (!pair_differs(out + CHK_H)) return GCOMP_OK;
    /* No rank failed locally, so every rank has b, tin and tout. */
    MPI_Request req;
    int rc = MPI_Iallreduce(tin, tout, (int)(count * PT_N), MPI_UINT64_T, MPI_MAX, bc, &req);
    if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(c, err, rc, "MPI_Iallreduce (set-up check)");
    st = gm_wait_all(c, &req, 1, deadline, "bucket set-up check (per tensor)", err);
    if (st != GCOMP_OK) return st;
    st = gm_fail(err, GCOMP_E_MISMATCH,
                 "bucket settings differ across ranks "
                 "(bucket_bytes, ranks_per_node or format version)");
    for (size_t i = 0; i < count; i++) {
        const uint64_t *p = tout + i * PT_N;
        const char *what = pair_differs(p + PT_FP)      ? "codec spec (fingerprint)"
                           : pair_differs(p + PT_SIZE)  ? "size or shape"
                           : pair_differs(p + PT_STRAT) ? "strategy"
                           : pair_differs(p + PT_NAME)  ? "name (tensor order?)"
                                                        : NULL;
        if (what)
            return gm_fail(err, GCOMP_E_MISMATCH,
                           "tensor '%s' (#%zu): %s differs across ranks (this rank: %s, n=%zu)",
                           b->t[i].name ? b->t[i].name : "?", i, what,
                           b->t[i].spec[0] ? b->t[i].spec : d[i].spec, d[i].n);
    }
    return st;
}

/* ---- create / free ------------------------------------------------------------------------- */

void gcomp_mpi_bucket_options_default(gcomp_mpi_bucket_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->bucket_bytes = (size_t)4 << 20;
}

static size_t group_bufs(gm_group *g, void **out) {
    size_t k = 0;
    void *list[] = {g->send.p, g->recv.p, g->gsend.p, g->grecv.p, g->pack.p, g->words.p};
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
        if (list[i]) out[k++] = list[i];
    return k;
}

void gm_group_release(gm_group *g) {
    gm_buf_free(&g->send);
    gm_buf_free(&g->recv);
    gm_buf_free(&g->gsend);
    gm_buf_free(&g->grecv);
    gm_buf_free(&g->pack);
    gm_buf_free(&g->words);
    gm_free(g->req);
    gm_free(g->steps);
    if (g->S && g->S->group_free)
        g->S->group_free(g);
    else
        gm_free(g->priv);
    memset(g, 0, sizeof *g);
}

static void bucket_destroy(gcomp_mpi_bucket *b) {
    gcomp_mpi_comm *c = b->comm;
    int fin = 0;
    MPI_Finalized(&fin);
    /* Requests still in flight (after a failure): their buffers and the bucket's
     * communicators go to the graveyard, one grave for the whole bucket. */
    int nreq = 0;
    for (size_t gi = 0; gi < b->ng; gi++)
        if (b->g[gi].inflight) nreq += b->g[gi].nreq;
    if (nreq > 0 && !fin) {
        MPI_Request *req = gm_calloc((size_t)nreq, sizeof *req);
        void **bufs = gm_calloc(6 * b->ng + 2 * b->nt + 1, sizeof *bufs);
        size_t nb = 0;
        int k = 0;
        bool keep = req && bufs; /* else every such buffer is leaked, never freed */
        for (size_t gi = 0; gi < b->ng; gi++) {
            gm_group *g = &b->g[gi];
            if (!g->inflight) continue;
            for (int i = 0; keep && i < g->nreq; i++) req[k++] = g->req[i];
            if (keep) nb += group_bufs(g, bufs + nb);
            g->send.p = g->recv.p = g->gsend.p = g->grecv.p = g->pack.p = g->words.p = NULL;
            if (g->hier)
                for (size_t i = g->t0; i < g->t1; i++) {
                    if (keep) {
                        bufs[nb++] = b->t[i].work.p;
                        bufs[nb++] = b->t[i].tmp.p;
                    }
                    b->t[i].work.p = b->t[i].tmp.p = NULL;
                }
        }
        MPI_Comm comms[3] = {b->bc, b->bnode, b->bleaders};
        if (keep) {
            gm_comm_bury(c, req, k, bufs, nb, comms, 3);
        } else {
            gm_free(req);
            gm_free(bufs);
        }
        b->bc = b->bnode = b->bleaders = MPI_COMM_NULL;
    }
    for (size_t gi = 0; gi < b->ng; gi++) gm_group_release(&b->g[gi]);
    if (b->t)
        for (size_t i = 0; i < b->nt; i++) {
            gm_tensor_free(&b->t[i]);
            gm_buf_free(&b->t[i].work);
            gm_buf_free(&b->t[i].tmp);
        }
    gm_free(b->t);
    gm_free(b->g);
    if (!fin) {
        if (b->bc != MPI_COMM_NULL) MPI_Comm_free(&b->bc);
        if (b->bnode != MPI_COMM_NULL) MPI_Comm_free(&b->bnode);
        if (b->bleaders != MPI_COMM_NULL) MPI_Comm_free(&b->bleaders);
    }
    gm_free(b);
}

void gcomp_mpi_bucket_free(gcomp_mpi_bucket *b) {
    if (!b) return;
    b->comm->nbuckets--;
    bucket_destroy(b);
}

size_t gm_groups_plan(const gcomp_mpi_bucket *b, gm_group *g) {
    size_t start = 0, bytes = 0, ng = 0, count = b->nt;
    for (size_t i = 0; i <= count; i++) {
        bool cut =
            i == count ||
            (i > start && (!same_group(&b->t[start], &b->t[i]) ||
                           (b->opt.bucket_bytes && bytes + 4 * b->t[i].n > b->opt.bucket_bytes)));
        if (i > start && cut) {
            g[ng].t0 = start;
            g[ng].t1 = i;
            ng++;
            start = i;
            bytes = 0;
        }
        if (i < count) bytes += 4 * b->t[i].n;
    }
    return ng;
}

/* Local set-up of a bucket whose communicators exist: tensors, sub-buckets, buffers. */
static gcomp_status bucket_setup(gcomp_mpi_bucket *b, const gcomp_mpi_tensor *tensors, size_t count,
                                 gcomp_error *err) {
    b->nt = count;
    b->t = gm_calloc(count, sizeof *b->t);
    b->g = gm_calloc(count, sizeof *b->g);
    if (!b->t || !b->g) return gm_fail(err, GCOMP_E_NOMEM, "out of memory creating a bucket");
    for (size_t i = 0; i < count; i++) {
        gcomp_status st = gm_tensor_setup(b, &b->t[i], i, &tensors[i], err);
        if (st != GCOMP_OK) return st;
    }
    b->ng = gm_groups_plan(b, b->g);
    for (size_t gi = 0; gi < b->ng; gi++) {
        gcomp_status st = gm_group_setup(b, &b->g[gi]);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "sub-bucket at tensor '%s': %s", b->t[b->g[gi].t0].name,
                           st == GCOMP_E_LIMIT ? "an exchange would exceed MPI's 2 GiB counts"
                                               : gcomp_status_str(st));
    }
    return GCOMP_OK;
}

/*
 * Creation is collective, so every rank issues the same collectives whatever happens to it
 * locally: the communicator duplicates and the check are issued even by a rank that could
 * not allocate its bucket (their results live in the communicator's cells), and a local
 * failure travels in the check, so that every rank returns an error together instead of
 * the others waiting out their timeout.
 */
gcomp_status gcomp_mpi_bucket_create(gcomp_mpi_bucket **out, gcomp_mpi_comm *comm,
                                     const gcomp_mpi_tensor *tensors, size_t count,
                                     const gcomp_mpi_bucket_options *opt, double timeout_s,
                                     gcomp_error *err) {
    if (!out) return gm_fail(err, GCOMP_E_ARG, "out must not be NULL");
    *out = NULL;
    gcomp_status st = gm_comm_check(comm, err);
    if (st != GCOMP_OK) return st;
    if (!tensors || count == 0 || count > (size_t)INT_MAX / 16)
        return gm_fail(err, GCOMP_E_ARG, "tensors must hold 1 or more descriptions");
    uint64_t deadline = gm_deadline(comm, timeout_s);
    gm_setup_cells *cc = comm->cells;
    gcomp_error local_err = {0};
    gcomp_status local = GCOMP_OK;
    gcomp_mpi_bucket *b = gm_calloc(1, sizeof *b);
    if (!b) {
        local = gm_fail(&local_err, GCOMP_E_NOMEM, "out of memory creating a bucket");
    } else {
        b->comm = comm;
        b->epoch = comm->epoch;
        b->bc = b->bnode = b->bleaders = MPI_COMM_NULL;
        if (opt)
            b->opt = *opt;
        else
            gcomp_mpi_bucket_options_default(&b->opt);
    }

    /* 1. Our own communicators (collective on every rank whatever the tensors are). */
    MPI_Request req[3];
    cc->bc = cc->bnode = cc->bleaders = MPI_COMM_NULL;
    int nreq = 0, rc = MPI_Comm_idup(comm->comm, &cc->bc, &req[nreq++]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_idup(comm->node, &cc->bnode, &req[nreq++]);
    if (rc == MPI_SUCCESS && comm->leaders != MPI_COMM_NULL)
        rc = MPI_Comm_idup(comm->leaders, &cc->bleaders, &req[nreq++]);
    if (rc != MPI_SUCCESS) {
        gm_free(b);
        return gm_comm_mpi_fail(comm, err, rc, "MPI_Comm_idup (bucket)");
    }
    cc->pending = true;
    st = gm_wait_all(comm, req, nreq, deadline, "duplicating the communicator for a bucket", err);
    if (st != GCOMP_OK) {
        gm_free(b); /* the cells stay pending: MPI may still write them */
        return st;
    }
    cc->pending = false;
    MPI_Comm dups[3] = {cc->bc, cc->bnode, cc->bleaders};
    if (b) {
        b->bc = dups[0];
        b->bnode = dups[1];
        b->bleaders = dups[2];
        comm->nbuckets++;
    }

    /* 2. Local set-up.  A failure here is still shared through the check below. */
    uint64_t *tin = NULL, *tout = NULL;
    if (local == GCOMP_OK) local = bucket_setup(b, tensors, count, &local_err);
    if (local == GCOMP_OK) {
        tin = gm_calloc(count * PT_N, 8);
        tout = gm_calloc(count * PT_N, 8);
        if (!tin || !tout) local = gm_fail(&local_err, GCOMP_E_NOMEM, "out of memory");
    }

    /* 3. Every rank must agree. */
    st = setup_check(comm, dups[0], b, tensors, count, local, tin, tout, deadline, err);
    gm_free(tin);
    if (st != GCOMP_OK && comm->failed != GCOMP_OK) {
        /* The check timed out: b and tout are leaked, MPI may still write them. */
        if (b) comm->nbuckets--;
        return st;
    }
    gm_free(tout);
    if (st != GCOMP_OK) {
        if (local != GCOMP_OK && err) *err = local_err;
        if (b) {
            gcomp_mpi_bucket_free(b);
        } else {
            for (int i = 0; i < 3; i++)
                if (dups[i] != MPI_COMM_NULL) MPI_Comm_free(&dups[i]);
        }
        return st;
    }
    *out = b;
    return GCOMP_OK;
}

/* ---- the engine ---------------------------------------------------------------------------- */

static void coll_started(gcomp_mpi_bucket *b, gm_group *g) {
    uint64_t now = gm_now_ns();
    g->inflight = true;
    if (b->inflight++ == 0) b->wire_t0 = now;
    if (!g->wire_first) g->wire_first = now;
}

static void coll_done(gcomp_mpi_bucket *b, gm_group *g) {
    uint64_t now = gm_now_ns();
    g->inflight = false;
    g->nreq = 0;
    if (--b->inflight == 0) b->call.wire_ns += now - b->wire_t0;
    g->wire_last = now;
}

static gcomp_status fatal(gcomp_mpi_bucket *b, gcomp_error *err, gcomp_status st,
                          const char *what) {
    b->dead = true;
    if (b->comm->failed == GCOMP_OK)
        gm_comm_fail(b->comm, NULL, st, "%s: %s", what, gcomp_status_str(st));
    return gm_fail(err, st, "%s", b->comm->failure.message);
}

static gcomp_status progress(gcomp_mpi_bucket *b, gcomp_error *err) {
restart:
    for (size_t gi = 0; gi < b->ng; gi++) {
        gm_group *g = &b->g[gi];
        while (g->stage < g->nsteps) {
            const gm_step *s = &g->steps[g->stage];
            if (s->member_only && !g->member) {
                g->stage++;
                continue;
            }
            if (s->coll) {
                if (g->inflight) {
                    int flag = 0;
                    int rc = MPI_Testall(g->nreq, g->req, &flag, MPI_STATUSES_IGNORE);
                    if (rc != MPI_SUCCESS) {
                        gm_comm_mpi_fail(b->comm, NULL, rc, s->what);
                        return fatal(b, err, GCOMP_E_MPI, s->what);
                    }
                    if (!flag) break;
                    coll_done(b, g);
                    g->stage++;
                    continue;
                }
                /* Groups issue their collectives in order, the same on every rank; one
                 * with none left to issue (none at all: a hierarchical group of a 1-rank
                 * job; or its last one skipped, member_only) hands the turn on. */
                while (b->issue_group < b->ng &&
                       b->g[b->issue_group].stage > b->g[b->issue_group].last_coll)
                    b->issue_group++;
                if (gi != b->issue_group) break;
                g->nreq = 0;
                gcomp_status st = s->fn(b, g);
                if (st != GCOMP_OK) return fatal(b, err, st, s->what);
                if (g->stage == g->last_coll) b->issue_group++;
                if (g->nreq > 0)
                    coll_started(b, g);
                else
                    g->stage++;
                if (g->nreq > 0 && s->overlap) {
                    uint64_t t0 = gm_now_ns();
                    st = s->overlap(b, g);
                    uint64_t dt = gm_now_ns() - t0;
                    b->call.codec_ns += dt;
                    b->call.overlap_ns += dt;
                    g->codec_ns += dt;
                    if (st != GCOMP_OK) return fatal(b, err, st, s->what);
                }
                continue;
            }
            bool overlapped = b->inflight > 0;
            uint64_t t0 = gm_now_ns();
            gcomp_status st = s->fn(b, g);
            uint64_t dt = gm_now_ns() - t0;
            b->call.codec_ns += dt;
            g->codec_ns += dt;
            if (overlapped) b->call.overlap_ns += dt;
            if (st != GCOMP_OK) return fatal(b, err, st, s->what);
            g->stage++;
            goto restart; /* test what is in flight before more codec work */
        }
    }
    return GCOMP_OK;
}

int gm_zero_progress(gm_group *g, float *x, size_t n) {
    const size_t piece = (size_t)1 << 20; /* 4 MB */
    for (size_t i = 0; i < n; i += piece) {
        memset(x + i, 0, (n - i < piece ? n - i : piece) * sizeof(float));
        int flag = 0;
        if (g->nreq > 0) {
            int rc = MPI_Testall(g->nreq, g->req, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) return rc;
        }
    }
    return MPI_SUCCESS;
}

static bool all_done(const gcomp_mpi_bucket *b) {
    for (size_t gi = 0; gi < b->ng; gi++)
        if (b->g[gi].stage < b->g[gi].nsteps) return false;
    return true;
}

static void add_stats(gcomp_mpi_stats *to, const gcomp_mpi_stats *s) {
    to->calls += s->calls;
    to->bytes_sent += s->bytes_sent;
    to->bytes_received += s->bytes_received;
    to->node_bytes += s->node_bytes;
    to->codec_ns += s->codec_ns;
    to->wire_ns += s->wire_ns;
    to->elapsed_ns += s->elapsed_ns;
    to->overlap_ns += s->overlap_ns;
}

static gcomp_status finish(gcomp_mpi_bucket *b, gcomp_error *err) {
    b->busy = false;
    b->call.calls = 1;
    b->call.elapsed_ns = gm_now_ns() - b->t_start;
    gcomp_status st = GCOMP_OK;
    for (size_t gi = 0; gi < b->ng; gi++) {
        gm_group *g = &b->g[gi];
        b->call.bytes_sent += g->bytes_sent;
        b->call.bytes_received += g->bytes_recv;
        b->call.node_bytes += g->node_bytes;
        for (size_t i = g->t0; i < g->t1; i++) {
            gm_tensor *t = &b->t[i];
            t->call.calls = 1;
            t->call.wire_ns = g->wire_first ? g->wire_last - g->wire_first : 0;
            add_stats(&t->stats, &t->call);
        }
        if (st == GCOMP_OK && g->st != GCOMP_OK) {
            st = g->st;
            gm_fail(err, st, "%s", g->msg);
        }
    }
    add_stats(&b->stats, &b->call);
    return st;
}

gcomp_status gm_bucket_usable(gcomp_mpi_bucket *b, gcomp_error *err) {
    if (!b) return gm_fail(err, GCOMP_E_ARG, "bucket is NULL");
    gcomp_status st = gm_comm_check(b->comm, err);
    if (st != GCOMP_OK) return st;
    if (b->dead || b->epoch != b->comm->epoch)
        return gm_fail(err, GCOMP_E_FAILED,
                       "bucket belongs to a communicator that failed or was "
                       "reset; free it and create it again");
    return GCOMP_OK;
}

/* After a load_state was tried on this bucket: every rank's compressors at the same step,
 * checked in one reduction before any collective whose size follows the step (PowerSGD
 * sends n values a dense step before start_iter=, rows x r after it: ranks out of step, one
 * of whose loads failed, would post reductions of different sizes, which Open MPI aborts
 * the job for).  Blocking, once after a load; every rank that tried the load takes part.
 * Per tensor the largest step and the complement of the smallest, over the ranks that
 * encode it (a hierarchical tensor's node leaders): equal when they agree.  Out of step:
 * GCOMP_E_MISMATCH on every rank, and the next start checks again. */
static gcomp_status check_steps(gcomp_mpi_bucket *b, gcomp_error *err) {
    const size_t nt = b->nt;
    uint64_t *w = gm_calloc(4 * nt, sizeof *w); /* in, out: MPI may write them after a timeout */
    MPI_Request *req = gm_calloc(1, sizeof *req);
    if (!w || !req || nt > INT_MAX / 2) {
        gm_free(w);
        gm_free(req);
        return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    }
    const bool leader = b->bleaders != MPI_COMM_NULL;
    for (size_t i = 0; i < nt; i++)
        if (b->t[i].c && (!b->t[i].hier || leader)) {
            uint64_t step = gcomp_compressor_step(b->t[i].c);
            w[2 * i] = step;
            w[2 * i + 1] = ~step;
        }
    int rc = MPI_Iallreduce(w, w + 2 * nt, (int)(2 * nt), MPI_UINT64_T, MPI_MAX, b->bc, req);
    if (rc != MPI_SUCCESS) {
        gm_free(w);
        gm_free(req);
        return gm_comm_mpi_fail(b->comm, err, rc, "MPI_Iallreduce (steps after a state load)");
    }
    gcomp_status st = gm_wait_all(b->comm, req, 1, gm_deadline(b->comm, 0),
                                  "checking the ranks' steps after a state load", err);
    if (st != GCOMP_OK) {
        void **bufs = gm_calloc(1, sizeof *bufs);
        if (bufs) { /* else leaked on purpose */
            bufs[0] = w;
            gm_comm_bury(b->comm, req, 1, bufs, 1, NULL, 0);
        }
        return st;
    }
    size_t bad = nt;
    const uint64_t *out = w + 2 * nt;
    for (size_t i = 0; i < nt && bad == nt; i++)
        if (out[2 * i + 1] != 0 && out[2 * i] != ~out[2 * i + 1]) bad = i;
    gm_free(req);
    if (bad < nt) {
        st = gm_fail(err, GCOMP_E_MISMATCH,
                     "tensor '%s': the ranks' states stand at steps %llu to %llu (a load_state "
                     "that failed on some rank, or blobs of different steps): load the same "
                     "checkpoint on every rank",
                     b->t[bad].name, (unsigned long long)~out[2 * bad + 1],
                     (unsigned long long)out[2 * bad]);
        gm_free(w);
        return st;
    }
    gm_free(w);
    b->resync = false;
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_start(gcomp_mpi_bucket *b, float *const *data, gcomp_mpi_op op,
                             gcomp_error *err) {
    gcomp_status st = gm_bucket_usable(b, err);
    if (st != GCOMP_OK) return st;
    if (b->busy)
        return gm_fail(err, GCOMP_E_PROTOCOL, "this bucket's allreduce is already in flight");
    if (!data || (op != GCOMP_MPI_SUM && op != GCOMP_MPI_AVERAGE))
        return gm_fail(err, GCOMP_E_ARG, "data must not be NULL; op SUM or AVERAGE");
    for (size_t i = 0; i < b->nt; i++)
        if (!data[i]) return gm_fail(err, GCOMP_E_ARG, "data[%zu] is NULL", i);
    if (b->resync && (st = check_steps(b, err)) != GCOMP_OK) return st;
    b->scale = op == GCOMP_MPI_AVERAGE ? 1.0f / (float)b->comm->size : 1.0f;
    for (size_t i = 0; i < b->nt; i++) {
        gm_tensor *t = &b->t[i];
        t->data = data[i];
        t->io = t->hier ? (float *)t->work.p : data[i];
        t->nmsg = 0;
        memset(&t->call, 0, sizeof t->call);
    }
    for (size_t gi = 0; gi < b->ng; gi++) {
        gm_group *g = &b->g[gi];
        g->stage = 0;
        g->inflight = false;
        g->nreq = 0;
        g->st = g->local_st = GCOMP_OK;
        g->msg[0] = g->local_msg[0] = 0;
        g->wire_first = g->wire_last = g->codec_ns = 0;
        g->bytes_sent = g->bytes_recv = g->node_bytes = 0;
    }
    memset(&b->call, 0, sizeof b->call);
    b->issue_group = 0;
    b->inflight = 0;
    b->t_start = gm_now_ns();
    b->busy = true;
    return progress(b, err);
}

gcomp_status gcomp_mpi_test(gcomp_mpi_bucket *b, int *done, gcomp_error *err) {
    if (done) *done = 0;
    gcomp_status st = gm_bucket_usable(b, err);
    if (st != GCOMP_OK) return st;
    if (!done) return gm_fail(err, GCOMP_E_ARG, "done must not be NULL");
    if (!b->busy) {
        *done = 1;
        return GCOMP_OK;
    }
    st = progress(b, err);
    if (st != GCOMP_OK) return st;
    if (!all_done(b)) return GCOMP_OK;
    *done = 1;
    return finish(b, err);
}

/* The wait's deadline passed with `b` unfinished: fails the communicator, naming the step
 * and tensor still in flight. */
static gcomp_status wait_timeout(gcomp_mpi_bucket *b, uint64_t waited_ns, gcomp_error *err) {
    const char *what = "?", *tn = "?";
    for (size_t gi = 0; gi < b->ng; gi++)
        if (b->g[gi].stage < b->g[gi].nsteps) {
            what = b->g[gi].steps[b->g[gi].stage].what;
            tn = b->t[b->g[gi].t0].name;
            break;
        }
    b->dead = true;
    return gm_comm_fail(b->comm, err, GCOMP_E_TIMEOUT,
                        "allreduce: %s for the sub-bucket at tensor '%s' not complete after "
                        "%.1f s (a peer is dead, stalled, or did not start this bucket)",
                        what, tn, (double)waited_ns * 1e-9);
}

gcomp_status gcomp_mpi_wait(gcomp_mpi_bucket *b, double timeout_s, gcomp_error *err) {
    return gcomp_mpi_wait_all(&b, 1, timeout_s, NULL, err);
}

/* The wait of gcomp_mpi_wait_all (each == NULL: the first error ends it, *failed names its
 * bucket) and of gcomp_mpi_wait_each (each[i] takes bucket i's outcome, a failed bucket is
 * left out of the rest of the wait, and one deadline covers them all). */
static gcomp_status wait_buckets(gcomp_mpi_bucket *const *b, size_t n, double timeout_s,
                                 gcomp_error *each, size_t *failed, gcomp_error *err) {
    if (failed) *failed = n;
    if (n && !b) return gm_fail(err, GCOMP_E_ARG, "buckets must not be NULL");
    gcomp_status st = GCOMP_OK;
    size_t i, busy = 0;
    uint64_t t0 = gm_now_ns(), deadline = UINT64_MAX;
#define OUT(i) (each ? &each[i] : err)
#define LIVE(i) (!each || each[i].status == GCOMP_OK)
    for (i = 0; i < n; i++) {
        if (each) each[i] = (gcomp_error){GCOMP_OK, ""};
        if ((st = gm_bucket_usable(b[i], OUT(i))) != GCOMP_OK) {
            if (!each) goto fail;
            continue;
        }
        if (b[i]->busy && !busy++) deadline = gm_deadline(b[i]->comm, timeout_s);
    }
    for (unsigned spins = 0; busy;) {
        /* Every bucket's next exchange goes out as soon as its last one is in, rather than
         * when the wait reaches it: their round trips overlap. */
        busy = 0;
        for (i = 0; i < n; i++) {
            if (!LIVE(i) || !b[i]->busy) continue;
            if ((st = progress(b[i], OUT(i))) == GCOMP_OK) {
                if (!all_done(b[i])) {
                    busy++;
                    continue;
                }
                st = finish(b[i], OUT(i));
            }
            if (st == GCOMP_OK) continue;
            if (!each) goto fail;
            if (each[i].status == GCOMP_OK) /* keeps the bucket out of the rest of the wait */
                gm_fail(&each[i], st, "%s", gcomp_status_str(st));
        }
        if (!busy) break;
        uint64_t now = gm_now_ns();
        if (now > deadline) {
            for (i = 0; i < n; i++) {
                if (!LIVE(i) || !b[i]->busy) continue;
                st = wait_timeout(b[i], now - t0, OUT(i));
                if (!each) goto fail;
            }
            break;
        }
        gm_backoff(&spins, now - t0);
    }
    if (!each) return GCOMP_OK;
    for (i = 0; i < n && each[i].status == GCOMP_OK; i++) continue;
    if (i == n) return GCOMP_OK;
    st = each[i].status;
    gm_fail(err, st, "%s", each[i].message);
fail:
    if (failed) *failed = i;
    return st;
}
#undef OUT
#undef LIVE

gcomp_status gcomp_mpi_wait_all(gcomp_mpi_bucket *const *b, size_t n, double timeout_s,
                                size_t *failed, gcomp_error *err) {
    return wait_buckets(b, n, timeout_s, NULL, failed, err);
}

gcomp_status gcomp_mpi_wait_each(gcomp_mpi_bucket *const *b, size_t n, double timeout_s,
                                 gcomp_error *each, size_t *failed, gcomp_error *err) {
    if (n && !each) {
        if (failed) *failed = n;
        return gm_fail(err, GCOMP_E_ARG, "each must not be NULL: one gcomp_error per bucket");
    }
    return wait_buckets(b, n, timeout_s, each, failed, err);
}

gcomp_status gcomp_mpi_allreduce(gcomp_mpi_bucket *b, float *const *data, gcomp_mpi_op op,
                                 double timeout_s, gcomp_error *err) {
    gcomp_status st = gcomp_mpi_start(b, data, op, err);
    if (st != GCOMP_OK) return st;
    return gcomp_mpi_wait(b, timeout_s, err);
}

/* ---- introspection and statistics ------------------------------------------------------------ */

size_t gcomp_mpi_bucket_count(const gcomp_mpi_bucket *b) {
    return b ? b->nt : 0;
}

int gcomp_mpi_bucket_strategy(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt) return -1;
    return b->t[i].strategy | (b->t[i].hier ? GCOMP_MPI_HIERARCHICAL : 0);
}

size_t gcomp_mpi_message_count(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt || b->busy) return 0;
    return b->t[i].nmsg;
}

gcomp_status gcomp_mpi_message(const gcomp_mpi_bucket *b, size_t i, size_t j, const void **msg,
                               size_t *len, size_t *offset, size_t *count) {
    if (!b || i >= b->nt || b->busy || j >= b->t[i].nmsg || !msg || !len) return GCOMP_E_ARG;
    const gm_msgref *m = &b->t[i].msgs[j];
    *msg = m->p;
    *len = m->len;
    if (offset) *offset = m->offset;
    if (count) *count = m->count;
    return GCOMP_OK;
}

static void owner_view(const gm_tensor *t, gm_owner_view *v) {
    memset(v, 0, sizeof *v);
    if (t->S && t->S->owner) t->S->owner(t, v);
}

gcomp_status gcomp_mpi_owner_residual(const gcomp_mpi_bucket *b, size_t i, const float **res,
                                      size_t *offset, size_t *count) {
    if (!b || i >= b->nt || !res) return GCOMP_E_ARG;
    gm_owner_view v;
    owner_view(&b->t[i], &v);
    *res = v.c ? gcomp_compressor_residual(v.c) : NULL;
    if (offset) *offset = *res ? v.offset : 0;
    if (count) *count = *res ? v.count : 0;
    return GCOMP_OK;
}

const char *gcomp_mpi_worker_spec(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt || !b->t[i].wspec[0]) return NULL;
    return b->t[i].wspec;
}

const char *gcomp_mpi_owner_spec(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt) return NULL;
    gm_owner_view v;
    owner_view(&b->t[i], &v);
    return v.spec;
}

gcomp_compressor *gcomp_mpi_compressor(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt) return NULL;
    return b->t[i].c;
}

gcomp_status gcomp_mpi_stats_get(const gcomp_mpi_bucket *b, size_t i, gcomp_mpi_stats *out) {
    if (!b || !out) return GCOMP_E_ARG;
    if (i == (size_t)-1) {
        *out = b->stats;
        return GCOMP_OK;
    }
    if (i >= b->nt) return GCOMP_E_ARG;
    *out = b->t[i].stats;
    return GCOMP_OK;
}

void gcomp_mpi_stats_reset(gcomp_mpi_bucket *b) {
    if (!b) return;
    memset(&b->stats, 0, sizeof b->stats);
    for (size_t i = 0; i < b->nt; i++) memset(&b->t[i].stats, 0, sizeof b->t[i].stats);
}

/*
 * mpi_ps.c - the parameter server as a strategy component (`ps`): the server object
 * (roles, partitioning, options), the per-tensor and per-sub-bucket set-up of both roles,
 * the workers' push / pull steps, kv.init / kv.pull / shutdown, and introspection.  The
 * servers' loop is mpi_ps_serve.c, checkpoints mpi_ps_state.c.
 *
 * MXNet's kvstore (Li et al. 2014, "Scaling distributed machine learning with the
 * parameter server"; Chen et al. 2015, MXNet) and BytePS (Jiang et al. 2020, OSDI) on one
 * MPI job.  What we take from them:
 *   - roles: S ranks serve, W push and pull; a server keeps per key the sum of a round
 *     (dist_sync), or the weights and the optimizer state (kv.set_optimizer, dist_async);
 *   - BytePS's partitioning: a tensor is cut into parts of at most 4 MB, each placed on the
 *     server with the fewest bytes so far, so servers carry equal loads whatever the
 *     model's tensor sizes (MXNet's default is one server per key, or a big key cut
 *     evenly over all servers: a model of one big and many small tensors loads one server);
 *   - MXNet's compression contract: worker-to-server traffic compressed with the residual
 *     on the worker, server-to-worker dense; BytePS's compressed pulls with the server's
 *     own error feedback (its "server-side compression").
 * What is ours: every message is gradcomp's self-describing, checksummed one, so a server
 * checks each push (fingerprint, size, CRCs, part ids, round) before anything touches its
 * state; every wait is bounded; sync rounds decode in worker order, so a PS run is
 * reproducible bit for bit and equals the allgather strategy's decode.
 *
 * Worker steps (per sub-bucket): encode every part into one push frame per server (LOCAL);
 * post the reply receives and send the frames (COLL: point-to-point, no collective, so the
 * servers need not take part in the bucket's schedule); check and unpack the replies
 * (LOCAL).  A server's sub-buckets have one step that refuses gcomp_mpi_start.
 *
 * Rejected: servers in the bucket's schedule (gcomp_mpi_start on servers with scratch
 * buffers, a COLL step per round): it gives sync mode in lockstep but no async mode, where
 * a server must answer pushes of different steps in any order; MPI one-sided windows
 * (MPI_Accumulate into the server's memory): no decoding at the target, and a dead worker
 * in a passive-target epoch can block the window; a thread per server connection
 * (MPI_THREAD_MULTIPLE, which this library does not require).
 */
#include "mpi_ps.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>

/* ---- frames ------------------------------------------------------------------------------ */

void gm_ps_put_hdr(uint8_t *f, bool reply, const ps_hdr *h) {
    memcpy(f, reply ? PS_REPLY_MAGIC : PS_PUSH_MAGIC, 4);
    f[4] = (uint8_t)h->kind;
    f[5] = (uint8_t)h->flags;
    gcomp__put16(f + 6, reply ? 0 : (uint16_t)h->session);
    gcomp__put32(f + 8, h->who);
    gcomp__put32(f + 12, reply ? h->lost : h->group);
    gcomp__put64(f + 16, h->round);
    gcomp__put64(f + 24, h->version);
    gcomp__put64(f + 32, h->marker);
    if (reply)
        gcomp__put32(f + 40, h->stale);
    else
        gcomp__putf(f + 40, h->lr);
    gcomp__put32(f + 44, h->m);
}

void gm_ps_seal(uint8_t *f, size_t m) {
    size_t t = PS_HDR + PS_ENTRY * m;
    gcomp__put32(f + t, gcomp__crc32c(0, f, t));
}

void gm_ps_seal_dense(uint8_t *f, size_t m, size_t dense) {
    uint8_t *p = f + ps_frame_fixed(m);
    gcomp__put32(p + dense, gcomp__crc32c(0, p, dense));
}

gcomp_status gm_ps_open(const uint8_t *f, size_t cap, bool reply, size_t max_m, ps_hdr *h) {
    if (cap < PS_HDR + 4) return GCOMP_E_TRUNCATED;
    if (memcmp(f, reply ? PS_REPLY_MAGIC : PS_PUSH_MAGIC, 4)) return GCOMP_E_BAD_MAGIC;
    memset(h, 0, sizeof *h);
    h->kind = f[4];
    h->flags = f[5];
    h->session = reply ? 0 : gcomp__get16(f + 6);
    h->who = gcomp__get32(f + 8);
    if (reply)
        h->lost = gcomp__get32(f + 12);
    else
        h->group = gcomp__get32(f + 12);
    h->round = gcomp__get64(f + 16);
    h->version = gcomp__get64(f + 24);
    h->marker = gcomp__get64(f + 32);
    if (reply)
        h->stale = gcomp__get32(f + 40);
    else
        h->lr = gcomp__getf(f + 40);
    h->m = gcomp__get32(f + 44);
    /* The CRC before any field is trusted: a flipped bit in the header or the table is
     * corruption, not a misleading mismatch. */
    if (h->m > max_m || ps_frame_fixed(h->m) > cap) return GCOMP_E_CHECKSUM;
    size_t t = PS_HDR + PS_ENTRY * (size_t)h->m;
    if (gcomp__crc32c(0, f, t) != gcomp__get32(f + t)) return GCOMP_E_CHECKSUM;
    if ((reply && (f[6] || f[7])) || h->kind < PS_PUSH || h->kind > PS_PULL || (h->flags & ~1u))
        return GCOMP_E_CORRUPT;
    /* A failure marker names a failure: one of status 0 would pass as a frame that carries
     * nothing and fails nothing (a pusher left out of a sum, a reply with no values). */
    if ((h->marker & GM_MARK) && gm_marker_status(h->marker) == GCOMP_OK) return GCOMP_E_CORRUPT;
    return GCOMP_OK;
}

gcomp_status gm_ps_check_dense(const uint8_t *f, size_t cap, size_t m, size_t dense) {
    size_t fixed = ps_frame_fixed(m);
    if (cap < fixed || dense > cap - fixed || cap - fixed - dense < 4) return GCOMP_E_TRUNCATED;
    const uint8_t *p = f + fixed;
    return gcomp__crc32c(0, p, dense) == gcomp__get32(p + dense) ? GCOMP_OK : GCOMP_E_CHECKSUM;
}

/* ---- the server object -------------------------------------------------------------------- */

void gcomp_mpi_ps_options_default(gcomp_mpi_ps_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->servers = 1;
    o->mode = GCOMP_MPI_PS_SYNC;
    o->optimizer.lr = 0.01f;
    o->optimizer.rescale = 1.0f;
    o->part_bytes = (size_t)4 << 20;
}

bool gm_ps_opt_ok(const gcomp_mpi_ps_optimizer *o) {
    return isfinite(o->lr) && o->lr >= 0 && o->momentum >= 0 && o->momentum < 1 &&
           isfinite(o->weight_decay) && o->weight_decay >= 0 && isfinite(o->rescale) &&
           (o->nesterov == 0 || o->nesterov == 1);
}

/* Local checks of the options on a communicator of P ranks. */
static gcomp_status check_options(const gcomp_mpi_ps_options *o, int P, uint64_t *pull_fp,
                                  gcomp_error *err) {
    *pull_fp = 0;
    if (o->servers < 1 || o->servers >= P)
        return gm_fail(err, GCOMP_E_ARG, "ps: %d servers on %d ranks (1 to %d)", o->servers, P,
                       P - 1);
    if (o->server_ranks)
        for (int i = 0; i < o->servers; i++) {
            if (o->server_ranks[i] < 0 || o->server_ranks[i] >= P)
                return gm_fail(err, GCOMP_E_ARG, "ps: server rank %d is not a rank of %d",
                               o->server_ranks[i], P);
            for (int j = 0; j < i; j++)
                if (o->server_ranks[j] == o->server_ranks[i])
                    return gm_fail(err, GCOMP_E_ARG, "ps: server rank %d given twice",
                                   o->server_ranks[i]);
        }
    if (o->mode != GCOMP_MPI_PS_SYNC && o->mode != GCOMP_MPI_PS_ASYNC)
        return gm_fail(err, GCOMP_E_ARG, "ps: mode %d (GCOMP_MPI_PS_SYNC or _ASYNC)", o->mode);
    if (o->update != 0 && o->update != 1)
        return gm_fail(err, GCOMP_E_ARG, "ps: update must be 0 or 1");
    if (!gm_ps_opt_ok(&o->optimizer))
        return gm_fail(err, GCOMP_E_ARG,
                       "ps: optimizer: lr >= 0, momentum in [0, 1), weight_decay >= 0, rescale "
                       "finite, nesterov 0 or 1");
    if (o->part_bytes < 1024)
        return gm_fail(err, GCOMP_E_ARG, "ps: part_bytes %zu (at least 1024)", o->part_bytes);
    if (o->pull && o->pull[0]) {
        if (o->update || o->mode == GCOMP_MPI_PS_ASYNC)
            return gm_fail(err, GCOMP_E_ARG,
                           "ps: compressed pulls (pull=%s) need sync mode without server "
                           "update: pulled weights would lose what the compression drops",
                           o->pull);
        if (strcmp(o->pull, "same")) {
            char canon[512];
            gcomp_error e2;
            gcomp_status st = gcomp_spec_canonical(o->pull, canon, sizeof canon, pull_fp, &e2);
            if (st != GCOMP_OK) return gm_fail(err, st, "ps: pull spec: %s", e2.message);
        } else {
            *pull_fp = 1;
        }
    }
    return GCOMP_OK;
}

static void ps_destroy(gcomp_mpi_ps *ps) {
    if (!ps) return;
    gm_free(ps->pull);
    gm_free(ps->srv_rank);
    gm_free(ps->wrk_rank);
    gm_free(ps->role);
    gm_free(ps->node);
    for (int k = 0; k < 2; k++) {
        gm_free(ps->push_rank[k]);
        gm_free(ps->push_of[k]);
        gm_free(ps->load[k]);
    }
    while (ps->parked) {
        ps_parked *x = ps->parked;
        ps->parked = x->next;
        gm_free(x);
    }
    gm_free(ps->groups);
    gm_free(ps->peer);
    gm_buf_free(&ps->ctrl);
    gm_free(ps);
}

/* Roles, pushers and the node check, from the options and every rank's node. */
/* The layout's tables, from P and S alone: allocated before the set-up's collectives, so
 * that a rank short of memory says so in the check instead of failing alone after it
 * (the others would have gone on with a server object it has not). */
static gcomp_status ps_layout_alloc(gcomp_mpi_ps *ps) {
    int P = ps->P, S = ps->S;
    ps->srv_rank = gm_calloc((size_t)S, sizeof(int));
    ps->wrk_rank = gm_calloc((size_t)(P - S), sizeof(int));
    ps->role = gm_calloc((size_t)P, sizeof(int));
    ps->node = gm_calloc((size_t)P, sizeof(int));
    ps->peer = gm_calloc((size_t)P, sizeof *ps->peer);
    for (int k = 0; k < 2; k++) {
        ps->push_rank[k] = gm_calloc((size_t)P, sizeof(int));
        ps->push_of[k] = gm_calloc((size_t)P, sizeof(int));
        ps->load[k] = gm_calloc((size_t)S, sizeof(uint64_t));
        if (!ps->push_rank[k] || !ps->push_of[k] || !ps->load[k]) return GCOMP_E_NOMEM;
    }
    if (!ps->srv_rank || !ps->wrk_rank || !ps->role || !ps->node || !ps->peer) return GCOMP_E_NOMEM;
    return GCOMP_OK;
}

/* Fills the tables ps_layout_alloc made, from every rank's node. */
static void ps_layout(gcomp_mpi_ps *ps, const uint64_t *nodes) {
    int P = ps->P, S = ps->S;
    for (int r = 0; r < P; r++) {
        ps->role[r] = 0;
        ps->node[r] = (int)nodes[r];
    }
    for (int s = 0; s < S; s++) {
        int r = ps->opt.server_ranks ? ps->opt.server_ranks[s] : P - S + s;
        ps->srv_rank[s] = r;
        ps->role[r] = -1 - s;
    }
    ps->opt.server_ranks = NULL; /* borrowed: its values are in srv_rank now */
    int w = 0;
    for (int r = 0; r < P; r++)
        if (ps->role[r] >= 0) {
            ps->role[r] = w;
            ps->wrk_rank[w++] = r;
        }
    ps->W = w;
    ps->me_srv = ps->role[ps->rank] < 0 ? -1 - ps->role[ps->rank] : -1;
    ps->me_wrk = ps->role[ps->rank] >= 0 ? ps->role[ps->rank] : -1;
    /* Pushers: every worker (flat keys); the lowest worker rank of each node, its leader
     * when no node mixes roles (hierarchical keys). */
    for (int r = 0; r < P; r++) ps->push_of[0][r] = ps->push_of[1][r] = -1;
    int np = 0;
    for (int k = 0; k < w; k++) {
        int r = ps->wrk_rank[k];
        ps->push_rank[0][k] = r;
        ps->push_of[0][r] = k;
        bool seen = false;
        for (int q = 0; q < k && !seen; q++) seen = ps->node[ps->wrk_rank[q]] == ps->node[r];
        if (!seen) {
            ps->push_rank[1][np] = r;
            ps->push_of[1][r] = np++;
        }
    }
    ps->npush[0] = w;
    ps->npush[1] = np;
    ps->me_push[0] = ps->push_of[0][ps->rank];
    ps->me_push[1] = ps->push_of[1][ps->rank];
    ps->device_ok = true;
    for (int r = 0; r < P && ps->device_ok; r++) {
        if (ps->role[r] >= 0) continue;
        for (int q = 0; q < P; q++)
            if (q != r && ps->node[q] == ps->node[r]) {
                ps->device_ok = false;
                snprintf(ps->device_why, sizeof ps->device_why,
                         "hierarchical:ps needs every server alone in its node, and rank %d "
                         "(a server) shares node %d with rank %d (%s); see "
                         "gcomp_mpi_options.ranks_per_node",
                         r, ps->node[r], q, ps->role[q] >= 0 ? "a worker" : "a server");
                break;
            }
    }
}

static uint64_t options_hash(const gcomp_mpi_ps *ps, uint64_t pull_fp) {
    const gcomp_mpi_ps_options *o = &ps->opt;
    uint64_t h = gm_mix(0x7073ull ^ (uint64_t)o->servers);
    for (int s = 0; s < o->servers; s++)
        h = gm_mix(h ^ (uint64_t)(o->server_ranks ? o->server_ranks[s] : ps->P - o->servers + s));
    float f[4] = {o->optimizer.lr, o->optimizer.momentum, o->optimizer.weight_decay,
                  o->optimizer.rescale};
    h = gm_mix(h ^ gm_fnv1a(f, sizeof f, 0));
    h = gm_mix(
        h ^ ((uint64_t)o->mode << 8 | (uint64_t)o->update << 4 | (uint64_t)o->optimizer.nesterov));
    h = gm_mix(h ^ pull_fp) + gm_mix(o->part_bytes) + gm_mix(o->max_staleness ^ 0x5a);
    return h;
}

gcomp_status gcomp_mpi_ps_create(gcomp_mpi_ps **out, gcomp_mpi_comm *comm,
                                 const gcomp_mpi_ps_options *o, double timeout_s,
                                 gcomp_error *err) {
    if (!out) return gm_fail(err, GCOMP_E_ARG, "out must not be NULL");
    *out = NULL;
    gcomp_status st = gm_comm_check(comm, err);
    if (st != GCOMP_OK) return st;
    uint64_t deadline = gm_deadline(comm, timeout_s);
    gcomp_mpi_ps *ps = gm_calloc(1, sizeof *ps);
    /* Cells MPI writes into: on the heap, leaked if a wait times out. */
    uint64_t *cells = gm_calloc(4 + 4 * (size_t)comm->size, sizeof(uint64_t));
    /* Every rank learns whether every rank has these two, in the communicator's own cells:
     * without them a rank can take no part in the set-up below. */
    uint64_t short_of = ps && cells ? 0 : gm_marker(GCOMP_E_NOMEM, comm->rank), any = 0;
    st = gm_comm_agree(comm, &short_of, 1, &any, deadline, "parameter-server set-up", err);
    if (st != GCOMP_OK || any) {
        gm_free(ps);
        gm_free(cells);
        if (st != GCOMP_OK) return st;
        if (short_of)
            return gm_fail(err, GCOMP_E_NOMEM, "out of memory creating a parameter server");
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "ps: rank %d could not set up the parameter server (%s); no rank uses it",
                       gm_marker_rank(any), gcomp_status_str(gm_marker_status(any)));
    }
    ps->comm = comm;
    ps->epoch = comm->epoch;
    ps->pc = MPI_COMM_NULL;
    ps->P = comm->size;
    ps->rank = comm->rank;
    ps->lr = NAN;
    if (o)
        ps->opt = *o;
    else
        gcomp_mpi_ps_options_default(&ps->opt);
    ps->S = ps->opt.servers;
    gcomp_error local_err = {0};
    uint64_t pull_fp = 0;
    gcomp_status local = check_options(&ps->opt, ps->P, &pull_fp, &local_err);
    if (local == GCOMP_OK && ps->opt.pull && ps->opt.pull[0]) {
        ps->pull = gm_strdup(ps->opt.pull);
        if (!ps->pull) local = gm_fail(&local_err, GCOMP_E_NOMEM, "out of memory");
    }
    ps->opt.pull = ps->pull;
    if (local == GCOMP_OK && ps_layout_alloc(ps) != GCOMP_OK)
        local = gm_fail(&local_err, GCOMP_E_NOMEM, "out of memory creating a parameter server");

    /* Collective from here on, whatever the local verdict. */
    MPI_Request req;
    int rc = MPI_Comm_idup(comm->comm, &ps->pc, &req);
    if (rc != MPI_SUCCESS) {
        ps_destroy(ps);
        gm_free(cells);
        return gm_comm_mpi_fail(comm, err, rc, "MPI_Comm_idup (parameter server)");
    }
    st = gm_wait_all(comm, &req, 1, deadline, "duplicating the communicator for a parameter server",
                     err);
    if (st != GCOMP_OK) return st; /* ps and cells leaked on purpose */
    MPI_Comm_set_errhandler(ps->pc, MPI_ERRORS_RETURN);
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(comm->comm, MPI_TAG_UB, &ub, &flag);
    ps->tag_ub = flag && ub ? *ub : 32767;
    cells[0] = local == GCOMP_OK ? options_hash(ps, pull_fp) : 0;
    cells[1] = (uint64_t)comm->node_index;
    cells[2] = local == GCOMP_OK ? 0 : gm_marker(local, comm->rank);
    cells[3] = 0;
    uint64_t *all = cells + 4;
    rc = MPI_Iallgather(cells, 4, MPI_UINT64_T, all, 4, MPI_UINT64_T, ps->pc, &req);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&ps->pc);
        ps_destroy(ps);
        gm_free(cells);
        return gm_comm_mpi_fail(comm, err, rc, "MPI_Iallgather (parameter-server set-up)");
    }
    st = gm_wait_all(comm, &req, 1, deadline, "parameter-server set-up check", err);
    if (st != GCOMP_OK) return st;
    st = local;
    if (st != GCOMP_OK && err) *err = local_err;
    for (int r = 0; r < ps->P && st == GCOMP_OK; r++) {
        uint64_t m = all[4 * r + 2];
        if (m)
            st = gm_fail(err, GCOMP_E_MISMATCH,
                         "ps: rank %d could not set up the parameter server (%s); no rank uses it",
                         gm_marker_rank(m), gcomp_status_str(gm_marker_status(m)));
        else if (all[4 * r] != all[0])
            st = gm_fail(err, GCOMP_E_MISMATCH,
                         "ps: parameter-server options differ between rank 0 and rank %d", r);
    }
    uint64_t *nodes = cells; /* reuse: the node of every rank */
    if (st == GCOMP_OK)
        for (int r = 0; r < ps->P; r++) nodes[r] = all[4 * r + 1];
    if (st == GCOMP_OK) ps_layout(ps, nodes);
    gm_free(cells);
    if (st != GCOMP_OK) {
        MPI_Comm_free(&ps->pc);
        ps_destroy(ps);
        return st;
    }
    *out = ps;
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_ps_free(gcomp_mpi_ps *ps) {
    if (!ps) return GCOMP_OK;
    if (ps->nkeys || ps->ngroups) return GCOMP_E_ARG;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && ps->pc != MPI_COMM_NULL) {
        if (ps->comm->failed == GCOMP_OK)
            MPI_Comm_free(&ps->pc);
        else /* a shutdown message may still be in flight on it */
            gm_comm_bury(ps->comm, NULL, 0, NULL, 0, &ps->pc, 1);
    }
    ps_destroy(ps);
    return GCOMP_OK;
}

int gcomp_mpi_ps_is_server(const gcomp_mpi_ps *ps) {
    return ps ? ps->me_srv >= 0 : -1;
}
int gcomp_mpi_ps_index(const gcomp_mpi_ps *ps) {
    return !ps ? -1 : ps->me_srv >= 0 ? ps->me_srv : ps->me_wrk;
}
int gcomp_mpi_ps_workers(const gcomp_mpi_ps *ps) {
    return ps ? ps->W : 0;
}
int gcomp_mpi_ps_servers(const gcomp_mpi_ps *ps) {
    return ps ? ps->S : 0;
}
int gcomp_mpi_ps_server_rank(const gcomp_mpi_ps *ps, int s) {
    return ps && s >= 0 && s < ps->S ? ps->srv_rank[s] : -1;
}
int gcomp_mpi_ps_worker_rank(const gcomp_mpi_ps *ps, int w) {
    return ps && w >= 0 && w < ps->W ? ps->wrk_rank[w] : -1;
}

gcomp_status gcomp_mpi_ps_set_lr(gcomp_mpi_ps *ps, float lr) {
    if (!ps || !(isnan(lr) || (isfinite(lr) && lr >= 0))) return GCOMP_E_ARG;
    ps->lr = lr;
    return GCOMP_OK;
}

/* ---- keys: partitioning and per-part state ----------------------------------------------- */

const ps_tensor *gm_ps_tensor(const gm_tensor *t) {
    return t->priv;
}

/*
 * Parts of at most part_bytes (BytePS's partition size): nearly equal pieces (a 9 MB tensor
 * becomes three 3 MB parts, not 4 + 4 + 1), cut at row boundaries when the codec needs the
 * matrix shape (each part is then a matrix of whole rows).  Each part goes to the server
 * with the fewest bytes so far; ties to the lowest index.  Rejected: hashing the key to a
 * server (MXNet's and ps-lite's default) - with the few big tensors of a model the loads
 * differ by the size of the largest part; round-robin over parts - the same when sizes
 * differ.
 */
static gcomp_status partition(gcomp_mpi_ps *ps, gm_tensor *t, ps_tensor *pt) {
    size_t pe = ps->opt.part_bytes / sizeof(float);
    bool by_rows = (t->info.flags & GCOMP_SPEC_NEEDS_SHAPE) && t->rows > 0 && t->cols > 0;
    size_t units = by_rows ? t->rows : t->n, unit = by_rows ? t->cols : 1;
    size_t per = by_rows ? (pe / t->cols > 0 ? pe / t->cols : 1) : pe;
    size_t np = (units + per - 1) / per;
    if (np == 0) np = 1;
    if (np > UINT32_MAX) return GCOMP_E_LIMIT;
    pt->part = gm_calloc(np, sizeof *pt->part);
    if (!pt->part) return GCOMP_E_NOMEM;
    pt->nparts = np;
    uint64_t *load = ps->load[pt->mode];
    for (size_t j = 0; j < np; j++) {
        ps_part *p = &pt->part[j];
        size_t lo = gm_region_lo(units, (int)np, (int)j),
               hi = gm_region_lo(units, (int)np, (int)j + 1);
        p->off = lo * unit;
        p->n = (hi - lo) * unit;
        if (by_rows) {
            p->rows = hi - lo;
            p->cols = t->cols;
        } else if (np == 1) {
            p->rows = t->rows;
            p->cols = t->cols;
        }
        int best = 0;
        for (int s = 1; s < ps->S; s++)
            if (load[s] < load[best]) best = s;
        p->server = best;
        load[best] += 4 * (uint64_t)p->n;
    }
    return GCOMP_OK;
}

/* The server's pull spec for a key: the owner-side rule of rsag (mpi_owner.c), so that
 * compressed pulls keep what they drop in the server's residual when that is stable:
 * feedback=ef for a contraction, the method's own feedback where it fixes one (twobit,
 * dgc), none otherwise (an unbiased codec stays unbiased); and a seed of its own. */
static gcomp_status pull_spec(const gcomp_mpi_ps *ps, const gm_tensor *t, char *out, size_t cap,
                              uint64_t *fp, gcomp_error *err) {
    const char *base = strcmp(ps->pull, "same") ? ps->pull : t->spec;
    gcomp_spec_info d;
    char spec[512], num[24];
    gcomp_status st = gcomp_spec_describe(base, GM_PROBE_N, &d, err);
    if (st == GCOMP_OK) st = gcomp_spec_canonical(base, spec, sizeof spec, NULL, err);
    if (st != GCOMP_OK) return st;
    if (d.flags & GCOMP_SPEC_MULTIPHASE)
        return gm_fail(err, GCOMP_E_UNSUPPORTED,
                       "pull spec '%s': a multi-phase codec exchanges no messages", base);
    if (!(d.flags & GCOMP_SPEC_FIXED_FEEDBACK))
        st = gcomp_spec_set(spec, "feedback", d.flags & GCOMP_SPEC_CONTRACTION ? "ef" : "none",
                            spec, sizeof spec, err);
    uint64_t seed = gm_mix(d.seed ^ 0x70756c6cull /* "pull" */) & ((1ull << 53) - 1);
    snprintf(num, sizeof num, "%llu", (unsigned long long)seed);
    if (st == GCOMP_OK) st = gcomp_spec_set(spec, "seed", num, spec, sizeof spec, err);
    if (st == GCOMP_OK) st = gcomp_spec_canonical(spec, out, cap, fp, err);
    return st;
}

static gcomp_status create_c(gcomp_compressor **c, const char *spec, const ps_part *p,
                             const gm_tensor *t, const char *what, gcomp_error *err) {
    gcomp_error e2;
    gcomp_status st = gcomp_compressor_create(c, spec, p->n, p->rows, p->cols, &e2);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': %s for part at %zu: %s", t->name, what, p->off,
                       e2.message);
    return GCOMP_OK;
}

static void ps_tensor_free(gm_tensor *t) {
    ps_tensor *pt = t->priv;
    if (!pt) return;
    gcomp_mpi_ps *ps = pt->ps;
    int npush = ps->npush[pt->mode];
    for (size_t j = 0; j < pt->nparts; j++) {
        ps_part *p = &pt->part[j];
        if (p->c != t->c) gcomp_compressor_free(p->c); /* t->c is the engine's to free */
        gcomp_compressor_free(p->pdec);
        gcomp_compressor_free(p->dec);
        if (p->wdec)
            for (int q = 0; q < npush; q++) gcomp_compressor_free(p->wdec[q]);
        gm_free(p->wdec);
        gcomp_compressor_free(p->pull);
        gm_buf_free(&p->store);
        gm_buf_free(&p->mom);
        gm_buf_free(&p->acc);
        ps->load[pt->mode][p->server] -= 4 * (uint64_t)p->n;
    }
    gm_free(pt->part);
    gm_free(pt->wfp);
    ps->nkeys--;
    gm_free(pt);
    t->priv = NULL;
}

static gcomp_status ps_tensor_setup(gcomp_mpi_bucket *b, gm_tensor *t, gcomp_error *err) {
    gcomp_mpi_ps *ps = b->opt.ps;
    if (!ps)
        return gm_fail(err, GCOMP_E_ARG,
                       "tensor '%s': strategy ps needs a parameter server "
                       "(gcomp_mpi_bucket_options.ps)",
                       t->name);
    if (ps->comm != b->comm)
        return gm_fail(err, GCOMP_E_ARG,
                       "tensor '%s': the parameter server belongs to another communicator",
                       t->name);
    int mode = t->hier ? 1 : 0;
    if (mode && !ps->device_ok)
        return gm_fail(err, GCOMP_E_UNSUPPORTED, "tensor '%s': %s", t->name, ps->device_why);
    bool server = ps->me_srv >= 0;
    if (!server && ps->me_push[mode] < 0)
        return gm_fail(err, GCOMP_E_ARG, "tensor '%s': this rank neither serves nor pushes",
                       t->name);
    ps_tensor *pt = gm_calloc(1, sizeof *pt);
    if (!pt) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    pt->ps = ps;
    pt->mode = mode;
    pt->server = server;
    ps->nkeys++;
    t->priv = pt;
    gcomp_status st = partition(ps, t, pt);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': cannot cut it into parts (%s)", t->name,
                       gcomp_status_str(st));
    /* One message per part (gcomp_mpi_message); the engine sized msgs for xsize. */
    gm_free(t->msgs);
    t->msgs = gm_calloc(pt->nparts, sizeof *t->msgs);
    if (!t->msgs) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    if (ps->pull) {
        st = pull_spec(ps, t, pt->pspec, sizeof pt->pspec, &pt->pfp, err);
        if (st != GCOMP_OK) return st;
    }
    /* Pushers draw with seeds of their own when the codec's draws are private (as for
     * allgather: their errors are then independent); the server knows every pusher's
     * fingerprint and keeps a decoder per pusher for them. */
    int npush = ps->npush[mode];
    bool own = false;
    uint64_t fp;
    st = gm_rank_spec(t, server ? 0 : ps->me_push[mode], t->wspec, sizeof t->wspec, &fp, &own);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': no per-worker spec for '%s'", t->name, t->spec);
    if (server) t->wspec[0] = 0; /* a server compresses no gradient */
    pt->wfp = gm_calloc((size_t)npush, sizeof *pt->wfp);
    if (!pt->wfp) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    char rs[512];
    for (int q = 0; q < npush; q++) {
        bool o;
        st = gm_rank_spec(t, q, rs, sizeof rs, &pt->wfp[q], &o);
        if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': worker spec", t->name);
    }
    for (size_t j = 0; j < pt->nparts; j++) {
        ps_part *p = &pt->part[j];
        if (!server) {
            st = create_c(&p->c, t->wspec, p, t, "compressor", err);
            if (st == GCOMP_OK && ps->pull)
                st = create_c(&p->pdec, pt->pspec, p, t, "pull decoder", err);
            if (st != GCOMP_OK) return st;
            continue;
        }
        if (p->server != ps->me_srv) continue;
        p->opt = ps->opt.optimizer;
        st = create_c(&p->dec, t->spec, p, t, "decoder", err);
        if (st == GCOMP_OK && ps->pull)
            st = create_c(&p->pull, pt->pspec, p, t, "pull compressor", err);
        if (st != GCOMP_OK) return st;
        if (own) {
            p->wdec = gm_calloc((size_t)npush, sizeof *p->wdec);
            if (!p->wdec) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
            for (int q = 0; q < npush && st == GCOMP_OK; q++) {
                bool o;
                st = gm_rank_spec(t, q, rs, sizeof rs, NULL, &o);
                if (st == GCOMP_OK) st = create_c(&p->wdec[q], rs, p, t, "decoder", err);
            }
            if (st != GCOMP_OK) return st;
        }
        size_t bytes = p->n * sizeof(float);
        if (gm_reserve(&p->store, bytes) != GCOMP_OK || gm_reserve(&p->acc, bytes) != GCOMP_OK ||
            (ps->opt.update || ps->opt.mode == GCOMP_MPI_PS_ASYNC
                 ? gm_reserve(&p->mom, bytes) != GCOMP_OK
                 : false))
            return gm_fail(err, GCOMP_E_NOMEM, "tensor '%s': out of memory", t->name);
        memset(p->store.p, 0, bytes);
        if (p->mom.p) memset(p->mom.p, 0, bytes);
    }
    if (!server && pt->nparts == 1) t->c = pt->part[0].c; /* gcomp_mpi_compressor */
    return GCOMP_OK;
}

/* Asked for by name only (a bucket needs its server object).  Multi-phase codecs reduce
 * factors in rounds that every rank takes part in; a server has nothing to sum them with. */
static int ps_query(const gm_query *q, const char **why) {
    if (q->info->flags & GCOMP_SPEC_MULTIPHASE) {
        *why = "a multi-phase codec (PowerSGD) needs two allreduces per step; a parameter "
               "server carries messages only";
        return -2;
    }
    return 0;
}

/* Checkpoint slots: part p's worker compressor in 2p, its server's pull compressor in
 * 2p + 1 (docs/FORMAT.md), so a one-part key keeps the format's slot 0 = worker, 1 =
 * owner.  Ranks outside the exchange (hierarchical non-leaders) set up no parts and have
 * two empty slots. */
static int ps_slots(const gm_tensor *t) {
    const ps_tensor *pt = t->priv;
    return pt ? 2 * (int)pt->nparts : 2;
}

static gcomp_compressor *ps_state_slot(const gm_tensor *t, int k) {
    const ps_tensor *pt = t->priv;
    if (!pt || k < 0 || (size_t)k / 2 >= pt->nparts) return NULL;
    const ps_part *p = &pt->part[k / 2];
    return k % 2 ? p->pull : p->c;
}

/* The owner side (gcomp_mpi_owner_spec / _residual): the pull spec, and the server's pull
 * compressor when it keeps exactly one part of the key (one range per view). */
static void ps_owner(const gm_tensor *t, gm_owner_view *v) {
    const ps_tensor *pt = t->priv;
    if (!pt || !pt->pspec[0]) return;
    v->spec = pt->pspec;
    const ps_part *one = NULL;
    for (size_t j = 0; j < pt->nparts; j++)
        if (pt->part[j].pull) {
            if (one) return;
            one = &pt->part[j];
        }
    if (one) {
        v->c = one->pull;
        v->offset = one->off;
        v->count = one->n;
    }
}

/* ---- sub-buckets -------------------------------------------------------------------------- */

static ps_tensor *pst(const gcomp_mpi_bucket *b, size_t i) {
    return b->t[i].priv;
}

static void ps_group_free(gm_group *g) {
    ps_group *pg = g->priv;
    if (!pg) return;
    gcomp_mpi_ps *ps = pg->ps;
    for (ps_parked **x = &ps->parked; *x;) { /* requests for a bucket that is going away */
        if ((*x)->b == pg->b) {
            ps_parked *dead = *x;
            *x = dead->next;
            gm_free(dead);
        } else {
            x = &(*x)->next;
        }
    }
    for (size_t i = 0; i < ps->ngroups; i++)
        if (ps->groups[i] == pg) {
            memmove(ps->groups + i, ps->groups + i + 1, (ps->ngroups - i - 1) * sizeof *ps->groups);
            ps->ngroups--;
            break;
        }
    if (pg->slot)
        for (int q = 0; q < pg->npush; q++) {
            gm_buf_free(&pg->slot[q].in);
            gm_buf_free(&pg->slot[q].out);
        }
    gm_free(pg->slot);
    gm_buf_free(&pg->reply);
    gm_buf_free(&pg->init_reply);
    gm_free(pg->srv);
    gm_free(pg->cnt);
    gm_free(pg->soff);
    gm_free(pg->et);
    gm_free(pg->ep);
    gm_free(pg);
    g->priv = NULL;
}

/* The involved servers' index in pg->srv (servers are few: a scan). */
static int srv_slot(const ps_group *pg, int server) {
    for (int j = 0; j < pg->nsrv; j++)
        if (pg->srv[j] == server) return j;
    return -1;
}

static gcomp_status reserve_server(gcomp_mpi_ps *ps, gcomp_mpi_bucket *b, gm_group *g,
                                   ps_group *pg) {
    size_t m = 0, push = 0, reply = 0, dense = 0;
    for (size_t i = g->t0; i < g->t1; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts; j++) {
            const ps_part *p = &pt->part[j];
            if (p->server != ps->me_srv) continue;
            m++;
            push += gcomp_encode_bound(p->dec);
            size_t d = 4 * p->n, c = p->pull ? gcomp_encode_bound(p->pull) : 0;
            reply += d > c ? d : c;
            dense += d;
        }
    }
    pg->m = m;
    if (m == 0) return GCOMP_OK; /* nothing of this sub-bucket lives here */
    pg->et = gm_calloc(m, sizeof *pg->et);
    pg->ep = gm_calloc(m, sizeof *pg->ep);
    pg->npush = ps->npush[pg->mode];
    pg->slot = gm_calloc((size_t)pg->npush, sizeof *pg->slot);
    if (!pg->et || !pg->ep || !pg->slot) return GCOMP_E_NOMEM;
    m = 0;
    for (size_t i = g->t0; i < g->t1; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts; j++)
            if (pt->part[j].server == ps->me_srv) {
                pg->et[m] = (uint32_t)i;
                pg->ep[m++] = (uint32_t)j;
            }
    }
    pg->push_cap = ps_frame_bound(m, push);
    pg->reply_cap = ps_frame_bound(m, reply);
    pg->ctrl_cap = ps_frame_bound(m, dense);
    if (pg->push_cap > INT_MAX || pg->reply_cap > INT_MAX || pg->ctrl_cap > INT_MAX)
        return GCOMP_E_LIMIT;
    bool async = ps->opt.mode == GCOMP_MPI_PS_ASYNC;
    for (int q = 0; q < pg->npush; q++)
        if (gm_reserve(&pg->slot[q].in, pg->push_cap) != GCOMP_OK ||
            (async && gm_reserve(&pg->slot[q].out, pg->reply_cap) != GCOMP_OK))
            return GCOMP_E_NOMEM;
    /* The shared reply (sync rounds and pulls); async replies leave from slot[q].out. */
    if ((!async && gm_reserve(&pg->reply, pg->reply_cap) != GCOMP_OK) ||
        gm_reserve(&pg->init_reply, pg->ctrl_cap) != GCOMP_OK ||
        gm_reserve(&ps->ctrl, pg->ctrl_cap) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    if (ps->ngroups == ps->gcap) {
        size_t cap = ps->gcap ? 2 * ps->gcap : 8;
        if (gm_grow((void **)&ps->groups, ps->gcap * sizeof *ps->groups,
                    cap * sizeof *ps->groups) != GCOMP_OK)
            return GCOMP_E_NOMEM;
        ps->gcap = cap;
    }
    ps->groups[ps->ngroups++] = pg;
    pg->server = true;
    return GCOMP_OK;
}

static gcomp_status reserve_worker(gcomp_mpi_ps *ps, gcomp_mpi_bucket *b, gm_group *g,
                                   ps_group *pg) {
    size_t S = (size_t)pg->nsrv;
    size_t *send = gm_calloc(S, sizeof *send), *recv = gm_calloc(S, sizeof *recv),
           *init = gm_calloc(S, sizeof *init);
    gcomp_status st = send && recv && init ? GCOMP_OK : GCOMP_E_NOMEM;
    for (size_t i = g->t0; i < g->t1 && st == GCOMP_OK; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts; j++) {
            const ps_part *p = &pt->part[j];
            int s = srv_slot(pg, p->server);
            send[s] += gcomp_encode_bound(p->c);
            size_t d = 4 * p->n, c = p->pdec ? gcomp_encode_bound(p->pdec) : 0;
            recv[s] += d > c ? d : c;
            init[s] += d;
        }
    }
    size_t so = 0, ro = 0;
    for (size_t s = 0; s < S && st == GCOMP_OK; s++) {
        size_t sc = ps_frame_bound(pg->cnt[s], send[s]), ic = ps_frame_bound(pg->cnt[s], init[s]);
        if (ps->me_push[pg->mode] == 0 && ic > sc) sc = ic; /* kv.init's values travel from here */
        pg->soff[s] = so;
        pg->scap[s] = sc;
        pg->roff[s] = ro;
        pg->rcap[s] = ps_frame_bound(pg->cnt[s], recv[s]);
        if (sc > INT_MAX || pg->rcap[s] > INT_MAX) st = GCOMP_E_LIMIT;
        so += sc;
        ro += pg->rcap[s];
    }
    gm_free(send);
    gm_free(recv);
    gm_free(init);
    if (st != GCOMP_OK) return st;
    if (gm_reserve(&g->send, so) != GCOMP_OK || gm_reserve(&g->recv, ro) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    int want = 2 * pg->nsrv + 1;
    if (g->req_cap < want) {
        if (gm_grow((void **)&g->req, (size_t)g->req_cap * sizeof *g->req,
                    (size_t)want * sizeof *g->req) != GCOMP_OK)
            return GCOMP_E_NOMEM;
        g->req_cap = want;
    }
    return GCOMP_OK;
}

/* Every tensor of a ps bucket is a ps tensor: a collective strategy in the same bucket
 * would wait for the servers, which never start a bucket. */
static gcomp_status ps_reserve(gcomp_mpi_bucket *b, gm_group *g) {
    gcomp_mpi_ps *ps = b->opt.ps;
    for (size_t i = 0; i < b->nt; i++)
        if (b->t[i].S != b->t[g->t0].S) return GCOMP_E_UNSUPPORTED;
    ps_group *pg = gm_calloc(1, sizeof *pg);
    if (!pg) return GCOMP_E_NOMEM;
    g->priv = pg;
    pg->ps = ps;
    pg->b = b;
    pg->g = g;
    pg->gi = (size_t)(g - b->g);
    pg->mode = g->hier ? 1 : 0;
    pg->me = ps->me_srv;
    if ((uint64_t)PS_TAG_PUSH + 2 * (uint64_t)pg->gi + 1 > (uint64_t)ps->tag_ub)
        return GCOMP_E_LIMIT;
    pg->tag = PS_TAG_PUSH + 2 * (int)pg->gi;
    /* The servers this sub-bucket's parts go to, ascending, and their entry counts. */
    bool *used = gm_calloc((size_t)ps->S, sizeof *used);
    size_t *cnt = gm_calloc((size_t)ps->S, sizeof *cnt);
    if (!used || !cnt) {
        gm_free(used);
        gm_free(cnt);
        return GCOMP_E_NOMEM;
    }
    for (size_t i = g->t0; i < g->t1; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts; j++) {
            used[pt->part[j].server] = true;
            cnt[pt->part[j].server]++;
        }
    }
    for (int s = 0; s < ps->S; s++) pg->nsrv += used[s];
    pg->srv = gm_calloc((size_t)pg->nsrv, sizeof *pg->srv);
    pg->cnt = gm_calloc((size_t)pg->nsrv, sizeof *pg->cnt);
    pg->soff = gm_calloc(6 * (size_t)pg->nsrv, sizeof *pg->soff);
    gcomp_status st = pg->srv && pg->cnt && pg->soff ? GCOMP_OK : GCOMP_E_NOMEM;
    if (st == GCOMP_OK) {
        pg->scap = pg->soff + pg->nsrv;
        pg->roff = pg->scap + pg->nsrv;
        pg->rcap = pg->roff + pg->nsrv;
        pg->slen = pg->rcap + pg->nsrv;
        pg->ecnt = pg->slen + pg->nsrv;
        int k = 0;
        for (int s = 0; s < ps->S; s++)
            if (used[s]) {
                pg->srv[k] = s;
                pg->cnt[k++] = cnt[s];
            }
    }
    gm_free(used);
    gm_free(cnt);
    if (st != GCOMP_OK) return st;
    return ps->me_srv >= 0 ? reserve_server(ps, b, g, pg) : reserve_worker(ps, b, g, pg);
}

/* ---- the workers' steps -------------------------------------------------------------------- */

/* Test hook (tests/mpi/test_mpi_ps_bad.c): what this worker's next push of the bucket's
 * first sub-bucket spoils: 1 a payload byte (CHECKSUM), 2 a part id (an unknown key,
 * MISMATCH), 3 the fingerprint (a push made with `foreign`, another spec, MISMATCH), 4 a
 * header byte after sealing (CHECKSUM), 5 the round (MISMATCH).  `foreign` is borrowed until
 * that push.  Exported for the tests only. */
GCOMP_API gcomp_status gcomp__mpi_ps_test_tamper(gcomp_mpi_bucket *b, int what,
                                                 const char *foreign);
gcomp_status gcomp__mpi_ps_test_tamper(gcomp_mpi_bucket *b, int what, const char *foreign) {
    if (!b || b->ng == 0 || !b->g[0].priv || (what == 3 && !foreign)) return GCOMP_E_ARG;
    ((ps_group *)b->g[0].priv)->tamper = what;
    ((ps_group *)b->g[0].priv)->tamper_spec = foreign;
    return GCOMP_OK;
}

void gm_ps_group_fail(gcomp_mpi_bucket *b, gm_group *g, uint64_t marker, int server,
                      const char *what) {
    if (g->st != GCOMP_OK) return;
    g->st = gm_marker_status(marker);
    const ps_group *pg = g->priv;
    int r = gm_marker_rank(marker), srank = pg->ps->srv_rank[server];
    int w = pg->ps->role[r < pg->ps->P && r >= 0 ? r : 0];
    if (r == srank)
        snprintf(g->msg, sizeof g->msg, "sub-bucket at tensor '%s': %s: %s (on server %d, rank %d)",
                 b->t[g->t0].name, what, gcomp_status_str(g->st), server, srank);
    else if (r == b->comm->rank && g->local_st != GCOMP_OK)
        snprintf(g->msg, sizeof g->msg, "%.200s (refused by server %d)", g->local_msg, server);
    else
        snprintf(g->msg, sizeof g->msg,
                 "sub-bucket at tensor '%s': %s: %s in the push of worker %d (rank %d), "
                 "refused by server %d (rank %d)",
                 b->t[g->t0].name, what, gcomp_status_str(g->st), w, r, server, srank);
}

/* Encodes every part into its server's frame. */
static gcomp_status ps_encode(gcomp_mpi_bucket *b, gm_group *g) {
    ps_group *pg = g->priv;
    gcomp_mpi_ps *ps = pg->ps;
    uint8_t *send = g->send.p;
    uint64_t marker = 0;
    size_t *e = pg->ecnt;
    for (int s = 0; s < pg->nsrv; s++) {
        pg->slen[s] = ps_frame_fixed(pg->cnt[s]);
        e[s] = 0;
    }
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        ps_tensor *pt = t->priv;
        t->nmsg = 0;
        for (size_t j = 0; j < pt->nparts; j++) {
            ps_part *p = &pt->part[j];
            int s = srv_slot(pg, p->server);
            uint8_t *f = send + pg->soff[s], *dst = f + pg->slen[s];
            size_t len = 0, room = pg->scap[s] - pg->slen[s];
            uint64_t t0 = gm_now_ns();
            gcomp_status st = gcomp_encode(p->c, t->io + p->off, dst, room, &len);
            t->call.codec_ns += gm_now_ns() - t0;
            if (st != GCOMP_OK) {
                if (!marker) marker = gm_marker(st, b->comm->rank);
                gm_group_local_fail(b, g, st, i, "encode");
                len = 0;
            } else if (pg->tamper && i == g->t0 && j == 0) {
                if (pg->tamper == 1 && len > GM_HDR) dst[len - 1] ^= 0x40;
                if (pg->tamper == 3) {
                    /* a message of another spec: the right size, valid CRCs */
                    gcomp_compressor *x = NULL;
                    if (gcomp_compressor_create(&x, pg->tamper_spec, p->n, 0, 0, NULL) ==
                            GCOMP_OK &&
                        gcomp_encode_bound(x) <= room)
                        gcomp_encode(x, t->io + p->off, dst, room, &len);
                    gcomp_compressor_free(x);
                }
            }
            uint32_t part = (uint32_t)j;
            if (pg->tamper == 2 && i == g->t0 && j == 0) part = 0x7fff;
            ps_put_entry(f, e[s]++, (uint32_t)i, part, len);
            t->msgs[t->nmsg++] = (gm_msgref){dst, len, p->off, p->n};
            t->call.bytes_sent += len;
            pg->slen[s] += len;
        }
    }
    for (int s = 0; s < pg->nsrv; s++) {
        uint8_t *f = send + pg->soff[s];
        uint64_t version = UINT64_MAX;
        for (size_t i = g->t0; i < g->t1; i++) {
            const ps_tensor *pt = pst(b, i);
            for (size_t j = 0; j < pt->nparts; j++)
                if (pt->part[j].server == pg->srv[s] && pt->part[j].version < version)
                    version = pt->part[j].version;
        }
        ps_hdr h = {PS_PUSH,
                    b->scale != 1.0f ? PS_F_AVERAGE : 0u,
                    (uint32_t)ps->me_push[pg->mode],
                    (uint32_t)pg->gi,
                    0,
                    0,
                    (uint32_t)pg->cnt[s],
                    pg->round,
                    version,
                    marker,
                    ps->lr,
                    ps->session};
        if (pg->tamper == 5 && s == 0) h.round += 7;
        if (pg->tamper == 6 && s == 0) h.marker = GM_MARK; /* a marker of no failure */
        gm_ps_put_hdr(f, false, &h);
        gm_ps_seal(f, pg->cnt[s]);
        if (pg->tamper == 4 && s == 0) f[20] ^= 1;
    }
    pg->tamper = 0;
    return GCOMP_OK;
}

/* Posts the replies' receives, then sends the frames. */
static gcomp_status ps_exchange(gcomp_mpi_bucket *b, gm_group *g) {
    ps_group *pg = g->priv;
    gcomp_mpi_ps *ps = pg->ps;
    uint8_t *send = g->send.p, *recv = g->recv.p;
    for (int s = 0; s < pg->nsrv; s++) {
        int r = ps->srv_rank[pg->srv[s]];
        int rc = MPI_Irecv(recv + pg->roff[s], (int)pg->rcap[s], MPI_BYTE, r, pg->tag + 1, b->bc,
                           &g->req[g->nreq]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Irecv (parameter-server reply)");
        g->nreq++;
        rc = MPI_Isend(send + pg->soff[s], (int)pg->slen[s], MPI_BYTE, r, pg->tag, b->bc,
                       &g->req[g->nreq]);
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Isend (parameter-server push)");
        g->nreq++;
        g->bytes_sent += pg->slen[s];
        gm_ps_count(ps, r, true, pg->slen[s]);
    }
    return GCOMP_OK;
}

/* While the frames travel: zero what compressed pulls are decoded into. */
static gcomp_status ps_zero(gcomp_mpi_bucket *b, gm_group *g) {
    ps_group *pg = g->priv;
    if (!pg->ps->pull) return GCOMP_OK;
    for (size_t i = g->t0; i < g->t1; i++) {
        gm_tensor *t = &b->t[i];
        uint64_t t0 = gm_now_ns();
        int rc = gm_zero_progress(g, t->io, t->n);
        t->call.codec_ns += gm_now_ns() - t0;
        if (rc != MPI_SUCCESS) return gm_issue_fail(b, rc, "MPI_Testall (parameter-server reply)");
    }
    return GCOMP_OK;
}

/* Checks reply frame s (its kind, round, server, entries) and puts its parts where they
 * go.  Returns a status for the group; a marker the server sent is the group's outcome. */
static gcomp_status unpack_reply(gcomp_mpi_bucket *b, gm_group *g, int s, int kind,
                                 float *const *data) {
    ps_group *pg = g->priv;
    gcomp_mpi_ps *ps = pg->ps;
    const uint8_t *f = (const uint8_t *)g->recv.p + pg->roff[s];
    size_t cap = pg->rcap[s], m = pg->cnt[s];
    ps_hdr h;
    gcomp_status st = gm_ps_open(f, cap, true, m, &h);
    if (st == GCOMP_OK && (h.kind != kind || h.who != (uint32_t)pg->srv[s])) st = GCOMP_E_MISMATCH;
    /* A void round or a refused request comes back with its marker and no entries. */
    if (st == GCOMP_OK && !(h.marker & GM_MARK) &&
        (h.m != m || (kind == PS_PUSH && h.round != pg->round)))
        st = GCOMP_E_MISMATCH;
    if (st != GCOMP_OK) {
        gm_ps_group_fail(b, g, gm_marker(st, b->comm->rank), pg->srv[s], "reply");
        return st;
    }
    if (h.lost > ps->lost_seen) ps->lost_seen = h.lost;
    if (kind == PS_PUSH) {
        gcomp_mpi_ps_stats *ws[2] = {&ps->stats, &ps->peer[ps->srv_rank[pg->srv[s]]]};
        for (int k = 0; k < 2; k++) {
            ws[k]->applied++;
            ws[k]->stale_sum += h.stale;
            if (h.stale > ws[k]->stale_max) ws[k]->stale_max = h.stale;
            if (h.lost > ws[k]->workers_lost) ws[k]->workers_lost = h.lost;
        }
    }
    if (h.marker & GM_MARK) {
        /* A server refuses with GCOMP_E_PROTOCOL only what comes before any init. */
        bool early = gm_marker_status(h.marker) == GCOMP_E_PROTOCOL;
        const char *what = kind == PS_PUSH ? (early ? "push before any init or state load" : "push")
                           : kind == PS_INIT ? "init"
                           : early           ? "pull before any init or state load"
                                             : "pull";
        gm_ps_group_fail(b, g, h.marker, pg->srv[s], what);
        return gm_marker_status(h.marker);
    }
    bool compressed = h.flags & PS_F_COMPRESSED;
    size_t total = 0, e = 0;
    /* The table must be exactly this server's parts, in order, with lengths that fit. */
    for (size_t i = g->t0; i < g->t1 && st == GCOMP_OK; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts && st == GCOMP_OK; j++) {
            if (pt->part[j].server != pg->srv[s]) continue;
            uint32_t ti, pj;
            uint64_t len;
            ps_get_entry(f, e++, &ti, &pj, &len);
            if (ti != i || pj != j || (!compressed && len != 4 * (uint64_t)pt->part[j].n) ||
                len > cap)
                st = GCOMP_E_CORRUPT;
            total += (size_t)len;
        }
    }
    if (st == GCOMP_OK && total > cap - ps_frame_fixed(m)) st = GCOMP_E_CORRUPT;
    if (st == GCOMP_OK && !compressed) st = gm_ps_check_dense(f, cap, m, total);
    if (st == GCOMP_OK && compressed && (kind != PS_PUSH || !ps->pull)) st = GCOMP_E_CORRUPT;
    if (st != GCOMP_OK) {
        gm_ps_group_fail(b, g, gm_marker(st, b->comm->rank), pg->srv[s], "reply");
        return st;
    }
    const uint8_t *q = f + ps_frame_fixed(m);
    /* Second pass, now that the whole frame checked out: entries in table order. */
    e = 0;
    for (size_t i = g->t0; i < g->t1 && st == GCOMP_OK; i++) {
        gm_tensor *t = &b->t[i];
        ps_tensor *pt = t->priv;
        float *out = data ? data[i - g->t0] : t->io;
        uint64_t t0 = gm_now_ns();
        for (size_t j = 0; j < pt->nparts && st == GCOMP_OK; j++) {
            ps_part *p = &pt->part[j];
            if (p->server != pg->srv[s]) continue;
            uint32_t ti, pj;
            uint64_t len;
            ps_get_entry(f, e++, &ti, &pj, &len);
            p->version = h.version;
            if (compressed)
                st = gm_decode_checked(p->pdec, q, (size_t)len, pt->pfp, p->n, out + p->off, 1.0f);
            else
                memcpy(out + p->off, q, (size_t)len);
            q += len;
            t->call.bytes_received += len;
            pt->stats.bytes_pulled += len;
            if (st != GCOMP_OK)
                gm_ps_group_fail(b, g, gm_marker(st, b->comm->rank), pg->srv[s], "pulled message");
        }
        t->call.codec_ns += gm_now_ns() - t0;
    }
    return st;
}

static gcomp_status ps_unpack(gcomp_mpi_bucket *b, gm_group *g) {
    ps_group *pg = g->priv;
    for (int s = 0; s < pg->nsrv; s++) {
        const uint8_t *f = (const uint8_t *)g->recv.p + pg->roff[s];
        uint64_t len = ps_frame_fixed(pg->cnt[s]);
        /* Bytes received, as the reply's table says (bounded by the receive area). */
        if (gm_ps_open(f, pg->rcap[s], true, pg->cnt[s], &(ps_hdr){0}) == GCOMP_OK)
            for (size_t e = 0; e < pg->cnt[s]; e++)
                len += gcomp__get64(f + PS_HDR + PS_ENTRY * e + 8);
        if (len > pg->rcap[s]) len = pg->rcap[s];
        g->bytes_recv += len;
        gm_ps_count(pg->ps, pg->ps->srv_rank[pg->srv[s]], false, len);
        if (g->st == GCOMP_OK) unpack_reply(b, g, s, PS_PUSH, NULL);
    }
    pg->round++;
    return GCOMP_OK;
}

/* A server's sub-bucket: gcomp_mpi_start is not for it. */
static gcomp_status ps_refuse(gcomp_mpi_bucket *b, gm_group *g) {
    if (g->st == GCOMP_OK) {
        g->st = GCOMP_E_PROTOCOL;
        snprintf(g->msg, sizeof g->msg,
                 "sub-bucket at tensor '%s': rank %d is a parameter server: it serves with "
                 "gcomp_mpi_ps_serve and pushes nothing",
                 b->t[g->t0].name, b->comm->rank);
    }
    return GCOMP_OK;
}

static void ps_steps(gcomp_mpi_bucket *b, gm_group *g) {
    if (b->opt.ps && b->opt.ps->me_srv >= 0) {
        gm_add_step(g, false, ps_refuse, "a parameter server cannot push");
        return;
    }
    gm_add_step(g, false, ps_encode, "compressing (parameter-server push)");
    gm_add_step(g, true, ps_exchange, "pushing to the servers and pulling (MPI_Isend/Irecv)");
    gm_add_overlap(g, ps_zero);
    gm_add_step(g, false, ps_unpack, "unpacking the servers' replies");
}

static bool ps_groups_with(const gm_tensor *first, const gm_tensor *t) {
    (void)first;
    (void)t;
    return true;
}

const gm_strategy gm_strategy_ps = {
    .version = GM_STRATEGY_VERSION,
    GM_NAMES("ps"),
    .id = GCOMP_MPI_PS,
    .query = ps_query,
    .tensor_setup = ps_tensor_setup,
    .tensor_free = ps_tensor_free,
    .groups_with = ps_groups_with,
    .reserve = ps_reserve,
    .steps = ps_steps,
    .group_free = ps_group_free,
    .state_slots = ps_slots,
    .state_slot = ps_state_slot,
    .owner = ps_owner,
};

/* ---- kv.init, kv.pull, shutdown ----------------------------------------------------------- */

static gcomp_status ps_usable(gcomp_mpi_bucket *b, bool worker, gcomp_error *err) {
    if (!b) return gm_fail(err, GCOMP_E_ARG, "bucket is NULL");
    gcomp_status st = gm_comm_check(b->comm, err);
    if (st != GCOMP_OK) return st;
    if (b->dead || b->epoch != b->comm->epoch)
        return gm_fail(err, GCOMP_E_FAILED,
                       "bucket belongs to a communicator that failed or was reset");
    if (!b->opt.ps || b->t[0].strategy != GCOMP_MPI_PS)
        return gm_fail(err, GCOMP_E_ARG, "not a parameter-server bucket");
    if (worker && b->opt.ps->me_srv >= 0)
        return gm_fail(err, GCOMP_E_ARG, "rank %d is a server; only workers push and pull",
                       b->comm->rank);
    if (b->busy) return gm_fail(err, GCOMP_E_PROTOCOL, "this bucket's exchange is in flight");
    return GCOMP_OK;
}

/* Writes sub-bucket g's request frame for involved server s; returns its length. */
static size_t ctrl_frame(gcomp_mpi_bucket *b, gm_group *g, int s, int kind, float *const *data) {
    ps_group *pg = g->priv;
    gcomp_mpi_ps *ps = pg->ps;
    uint8_t *f = (uint8_t *)g->send.p + pg->soff[s], *q = f + ps_frame_fixed(pg->cnt[s]);
    uint64_t marker = 0;
    size_t e = 0, dense = 0;
    for (size_t i = g->t0; i < g->t1; i++) {
        const ps_tensor *pt = pst(b, i);
        for (size_t j = 0; j < pt->nparts; j++) {
            const ps_part *p = &pt->part[j];
            if (p->server != pg->srv[s]) continue;
            size_t len = 0;
            if (kind == PS_INIT) {
                const float *x = data[i] + p->off;
                if (!gm_finite(x, p->n) && !marker) {
                    marker = gm_marker(GCOMP_E_NONFINITE, b->comm->rank);
                    gm_group_local_fail(b, g, GCOMP_E_NONFINITE, i, "init values");
                }
                len = 4 * p->n;
                memcpy(q, x, len);
                q += len;
                dense += len;
            }
            ps_put_entry(f, e++, (uint32_t)i, (uint32_t)j, len);
        }
    }
    ps_hdr h = {kind,
                0,
                (uint32_t)ps->me_push[pg->mode],
                (uint32_t)pg->gi,
                0,
                0,
                (uint32_t)pg->cnt[s],
                pg->round,
                0,
                marker,
                NAN,
                ps->session};
    gm_ps_put_hdr(f, false, &h);
    gm_ps_seal(f, pg->cnt[s]);
    if (kind == PS_INIT) {
        gm_ps_seal_dense(f, pg->cnt[s], dense);
        return ps_frame_bound(pg->cnt[s], dense);
    }
    return ps_frame_fixed(pg->cnt[s]);
}

/* kv.init / kv.pull on one bucket: every sub-bucket's request to its servers, the replies
 * into data[], and for a hierarchical bucket the node's leader passes them on. */
static gcomp_status ps_ctrl(gcomp_mpi_bucket *b, float *const *data, int kind, double timeout_s,
                            gcomp_error *err) {
    gcomp_status st = ps_usable(b, true, err);
    if (st != GCOMP_OK) return st;
    if (!data) return gm_fail(err, GCOMP_E_ARG, "data must not be NULL");
    for (size_t i = 0; i < b->nt; i++)
        if (!data[i]) return gm_fail(err, GCOMP_E_ARG, "data[%zu] is NULL", i);
    gcomp_mpi_ps *ps = b->opt.ps;
    uint64_t deadline = gm_deadline(b->comm, timeout_s);
    const char *what = kind == PS_INIT ? "parameter-server init" : "parameter-server pull";
    gcomp_status out = GCOMP_OK;
    char msg[256] = "";
    bool hier = false;
    for (size_t gi = 0; gi < b->ng; gi++) {
        gm_group *g = &b->g[gi];
        hier |= g->hier;
        if (!g->member) continue;
        ps_group *pg = g->priv;
        bool sender = kind == PS_PULL || ps->me_push[pg->mode] == 0;
        g->st = g->local_st = GCOMP_OK;
        g->msg[0] = g->local_msg[0] = 0;
        g->nreq = 0;
        for (int s = 0; s < pg->nsrv; s++) {
            int r = ps->srv_rank[pg->srv[s]];
            int rc = MPI_Irecv((uint8_t *)g->recv.p + pg->roff[s], (int)pg->rcap[s], MPI_BYTE, r,
                               ps_reply_tag(kind), b->bc, &g->req[g->nreq]);
            if (rc == MPI_SUCCESS) g->nreq++;
            if (rc == MPI_SUCCESS && sender) {
                size_t len = ctrl_frame(b, g, s, kind, data);
                rc = MPI_Isend((uint8_t *)g->send.p + pg->soff[s], (int)len, MPI_BYTE, r,
                               PS_TAG_CTRL, b->bc, &g->req[g->nreq]);
                if (rc == MPI_SUCCESS) g->nreq++;
                g->bytes_sent += len;
                gm_ps_count(ps, r, true, len);
            }
            if (rc != MPI_SUCCESS) {
                b->dead = true;
                return gm_comm_mpi_fail(b->comm, err, rc, what);
            }
        }
        if (kind == PS_PULL) {
            ps->stats.pulls++;
        }
        st = gm_wait_all(b->comm, g->req, g->nreq, deadline, what, err);
        g->nreq = 0;
        if (st != GCOMP_OK) {
            b->dead = true;
            return st;
        }
        for (int s = 0; s < pg->nsrv && g->st == GCOMP_OK; s++)
            unpack_reply(b, g, s, kind, data + g->t0);
        if (g->st != GCOMP_OK && out == GCOMP_OK) {
            out = g->st;
            snprintf(msg, sizeof msg, "%s", g->msg);
        }
    }
    if (hier) { /* leaders pass the verdict, then the values, to their node */
        uint64_t *w = b->g[0].words.p;
        w[0] = out == GCOMP_OK ? 0 : gm_marker(out, b->comm->rank);
        MPI_Request req;
        int rc = MPI_Ibcast(w, 1, MPI_UINT64_T, 0, b->bnode, &req);
        if (rc != MPI_SUCCESS) {
            b->dead = true;
            return gm_comm_mpi_fail(b->comm, err, rc, what);
        }
        st = gm_wait_all(b->comm, &req, 1, deadline, what, err);
        if (st != GCOMP_OK) {
            b->dead = true;
            return st;
        }
        if ((w[0] & GM_MARK) && out == GCOMP_OK) {
            out = gm_marker_status(w[0]);
            snprintf(msg, sizeof msg, "%s: %s (reported by the node's leader)", what,
                     gcomp_status_str(out));
        }
        for (size_t i = 0; i < b->nt && out == GCOMP_OK; i++) {
            rc = MPI_Ibcast(data[i], (int)b->t[i].n, MPI_FLOAT, 0, b->bnode, &req);
            if (rc != MPI_SUCCESS) {
                b->dead = true;
                return gm_comm_mpi_fail(b->comm, err, rc, what);
            }
            st = gm_wait_all(b->comm, &req, 1, deadline, what, err);
            if (st != GCOMP_OK) {
                b->dead = true;
                return st;
            }
        }
    }
    if (out != GCOMP_OK) return gm_fail(err, out, "%s", msg);
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_ps_init(gcomp_mpi_bucket *b, float *const *data, double timeout_s,
                               gcomp_error *err) {
    return ps_ctrl(b, data, PS_INIT, timeout_s, err);
}

gcomp_status gcomp_mpi_ps_pull(gcomp_mpi_bucket *b, float *const *data, double timeout_s,
                               gcomp_error *err) {
    return ps_ctrl(b, data, PS_PULL, timeout_s, err);
}

gcomp_status gcomp_mpi_ps_shutdown(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err) {
    if (!ps) return gm_fail(err, GCOMP_E_ARG, "parameter server is NULL");
    if (ps->me_srv >= 0) return gm_fail(err, GCOMP_E_ARG, "a server does not shut down the job");
    gcomp_status st = gm_comm_check(ps->comm, err);
    if (st != GCOMP_OK) return st;
    uint64_t deadline = gm_deadline(ps->comm, timeout_s);
    MPI_Request *req = gm_calloc((size_t)ps->S, sizeof *req);
    if (!req) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    ps->stop_word = ps->session; /* a server ignores a word of a session it has ended */
    for (int s = 0; s < ps->S; s++) {
        int rc = MPI_Isend(&ps->stop_word, 1, MPI_UINT64_T, ps->srv_rank[s], PS_TAG_STOP, ps->pc,
                           &req[s]);
        if (rc != MPI_SUCCESS) return gm_comm_mpi_fail(ps->comm, err, rc, "MPI_Isend (shutdown)");
    }
    st = gm_wait_all(ps->comm, req, ps->S, deadline, "telling the servers to shut down", err);
    if (st == GCOMP_OK) gm_free(req); /* else leaked: MPI may still use it */
    ps->session++;                    /* what it sends from now on belongs to the next session */
    return st;
}

/* ---- introspection and statistics ---------------------------------------------------------- */

static const ps_tensor *key(const gcomp_mpi_bucket *b, size_t i) {
    if (!b || i >= b->nt || b->t[i].strategy != GCOMP_MPI_PS) return NULL;
    return b->t[i].priv;
}

size_t gcomp_mpi_ps_part_count(const gcomp_mpi_bucket *b, size_t i) {
    const ps_tensor *pt = key(b, i);
    return pt ? pt->nparts : 0;
}

gcomp_status gcomp_mpi_ps_part(const gcomp_mpi_bucket *b, size_t i, size_t j, size_t *offset,
                               size_t *n, int *server) {
    const ps_tensor *pt = key(b, i);
    if (!pt || j >= pt->nparts) return GCOMP_E_ARG;
    if (offset) *offset = pt->part[j].off;
    if (n) *n = pt->part[j].n;
    if (server) *server = pt->part[j].server;
    return GCOMP_OK;
}

gcomp_compressor *gcomp_mpi_ps_compressor(const gcomp_mpi_bucket *b, size_t i, size_t j) {
    const ps_tensor *pt = key(b, i);
    return pt && !pt->server && j < pt->nparts ? pt->part[j].c : NULL;
}

gcomp_status gcomp_mpi_ps_residual(const gcomp_mpi_bucket *b, size_t i, float *out) {
    const ps_tensor *pt = key(b, i);
    if (!pt || pt->server || !out) return GCOMP_E_ARG;
    for (size_t j = 0; j < pt->nparts; j++) {
        const ps_part *p = &pt->part[j];
        const float *r = gcomp_compressor_residual(p->c);
        if (r)
            memcpy(out + p->off, r, p->n * sizeof(float));
        else
            memset(out + p->off, 0, p->n * sizeof(float));
    }
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_ps_stored(const gcomp_mpi_bucket *b, size_t i, float *out, size_t *parts) {
    const ps_tensor *pt = key(b, i);
    if (!pt || !pt->server || !out) return GCOMP_E_ARG;
    size_t k = 0;
    for (size_t j = 0; j < pt->nparts; j++) {
        const ps_part *p = &pt->part[j];
        if (p->server != pt->ps->me_srv) continue;
        memcpy(out + p->off, p->store.p, p->n * sizeof(float));
        k++;
    }
    if (parts) *parts = k;
    return GCOMP_OK;
}

uint64_t gcomp_mpi_ps_version(const gcomp_mpi_bucket *b, size_t i) {
    const ps_tensor *pt = key(b, i);
    if (!pt || pt->server || pt->nparts == 0) return 0;
    uint64_t v = UINT64_MAX;
    for (size_t j = 0; j < pt->nparts; j++)
        if (pt->part[j].version < v) v = pt->part[j].version;
    return v;
}

gcomp_status gcomp_mpi_ps_set_optimizer(gcomp_mpi_bucket *b, size_t i,
                                        const gcomp_mpi_ps_optimizer *o) {
    if (!b || !o || !gm_ps_opt_ok(o) || !b->opt.ps || b->opt.ps->me_srv < 0) return GCOMP_E_ARG;
    if (i != (size_t)-1 && i >= b->nt) return GCOMP_E_ARG;
    for (size_t k = 0; k < b->nt; k++) {
        if (i != (size_t)-1 && k != i) continue;
        ps_tensor *pt = b->t[k].priv;
        if (!pt) continue;
        for (size_t j = 0; j < pt->nparts; j++) pt->part[j].opt = *o;
    }
    return GCOMP_OK;
}

static void stats_add(gcomp_mpi_ps_stats *s, bool push, uint64_t bytes) {
    if (push) {
        s->pushes++;
        s->bytes_pushed += bytes;
    } else {
        s->bytes_pulled += bytes;
    }
}

void gm_ps_count(gcomp_mpi_ps *ps, int peer, bool push, uint64_t bytes) {
    stats_add(&ps->stats, push, bytes);
    if (peer >= 0 && peer < ps->P) stats_add(&ps->peer[peer], push, bytes);
}

gcomp_status gcomp_mpi_ps_stats_get(const gcomp_mpi_ps *ps, int peer, gcomp_mpi_ps_stats *out) {
    if (!ps || !out || peer < -1 || peer >= ps->P) return GCOMP_E_ARG;
    *out = peer < 0 ? ps->stats : ps->peer[peer];
    if (peer < 0 && ps->me_srv < 0 && ps->lost_seen > out->workers_lost)
        out->workers_lost = ps->lost_seen;
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_ps_key_stats(const gcomp_mpi_bucket *b, size_t i, gcomp_mpi_ps_stats *out) {
    const ps_tensor *pt = key(b, i);
    if (!out || !b || i >= b->nt || b->t[i].strategy != GCOMP_MPI_PS) return GCOMP_E_ARG;
    if (!pt) {
        memset(out, 0, sizeof *out);
        return GCOMP_OK;
    }
    *out = pt->stats;
    return GCOMP_OK;
}

void gcomp_mpi_ps_stats_reset(gcomp_mpi_ps *ps) {
    if (!ps) return;
    memset(&ps->stats, 0, sizeof ps->stats);
    memset(ps->peer, 0, (size_t)ps->P * sizeof *ps->peer);
}

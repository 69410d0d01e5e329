/*
 * mpi_outer.c - the outer step of local SGD: DiLoCo, Streaming DiLoCo, SparseLoCo
 * (include/gradcomp_mpi.h, "The outer step", has the formulas and the contract).
 *
 * Built on the public bucket API only (create, start, test, wait, message, compressor,
 * stats, state save/load): each fragment is one bucket of its tensors, and the object
 * keeps per tensor three arrays the bucket does not: w_sync (the weights of the last
 * sync, identical on every rank), the outer momentum b, and the pseudo-gradient buffer
 * pg.  pg is what the bucket borrows while a sync is in flight (the live weights keep
 * moving under the inner optimizer meanwhile), and holds the ranks' average d once the
 * exchange has completed.  A fragment is IDLE, FLIGHT (started, the bucket busy) or DONE
 * (averaged, not applied yet: an exchange a checkpoint completed early, or one that
 * gcomp_mpi_outer_progress saw finish).  The residuals of error feedback are the bucket
 * compressors' own: the object never duplicates them.
 *
 * One call per inner step t (gcomp_mpi_outer_step):
 *   1. complete the fragments started at t - delay or earlier: wait, apply the outer
 *      optimizer to w_sync, merge into the live weights (mixing factor alpha);
 *   2. test the other exchanges in flight, so MPI moves them;
 *   3. start the fragments whose offset t hits: pg = w_sync - w (minus (1 - beta) e for
 *      SparseLoCo's decayed residual), gcomp_mpi_start; with delay 0 complete at once.
 * Completing before starting hands the link from one fragment to the next at the same
 * call.  Every rank runs the same schedule from the same step count, so the fragments'
 * collectives meet; the options are compared across ranks at create.
 *
 * Set-up check without an MPI communicator: the public API gives no access to the
 * gcomp_mpi_comm's MPI_Comm (and this file must not reach into src/mpi's internals), so
 * the check runs through a small bucket of its own with spec `none` and the SUM op.  A
 * 64-bit value v travels as its 16 nibbles c and their squares; sums of such integers
 * are exact in float below 2^24 (P < 74565 ranks), and all ranks hold the same v iff
 * P sum(c^2) = (sum c)^2 for every nibble (Cauchy-Schwarz holds with equality only for
 * equal terms).  One more float counts the ranks that failed locally, so a rank with bad
 * arguments still takes part and the others learn of it instead of timing out.
 *
 * State blob (little-endian, version 1; docs/FORMAT.md, "MPI outer-step state"):
 *   0   4 bytes  magic "GCmo"
 *   4   u32      version, 1
 *   8   u64      total length of the blob
 *   16  u32      communicator size;  20 u32 this rank
 *   24  u32      T tensors;          28 u32 F fragments
 *   32  u64      fingerprint of the options and the fragment assignment
 *   40  u64      inner steps counted
 *   48  F records of 40 bytes: u64 syncs completed, u64 start step of the held sync,
 *       u64 step of the last apply (0: none yet), u32 held (0: none, 1: its average
 *       follows its tensors' w_sync), u32 reserved 0, u64 L, the length of the fragment
 *       bucket's state blob
 *   ..  T records: u64 n, u64 FNV-1a 64 of the name, u32 fragment, u32 flags (bit 0:
 *       momentum follows), then n f32 w_sync, [n f32 momentum], [n f32 average if the
 *       fragment holds a sync]
 *   ..  F bucket state blobs ("GCmb", L bytes each, each with its own CRC-32C at its end)
 *   end u32      CRC-32C of every byte above except the bucket blobs' contents, but with
 *                each blob's last 4 bytes (its own CRC), so every byte is covered once.
 *
 * Rejected: an object per tensor (the schedule and the checkpoint are per model); a
 * blocking collective of its own for the set-up check (no MPI_Comm is reachable through
 * the public API); saving a sync in flight by keeping the pre-start residuals and
 * re-sending it after a load (a copy of every residual at every start, against one wait
 * at checkpoint time); hashing the weights across ranks at every sync inside the library
 * (a collective round trip per sync over exactly the slow links this is for: the tests
 * and the trainer check it instead).
 */
#include "gradcomp_mpi.h"

#include "../common/common.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The spec a rank out of memory gives a bucket it cannot fill: no codec has it, so the
 * bucket's own set-up check fails every rank's create and tells the others. */
#define NO_CODEC "out-of-memory"

/* Every allocation through the library's allocator (common.h), as the anomaly tests need. */
static void *ocalloc(size_t n, size_t size) {
    if (size && n > (size_t)-1 / size) return NULL;
    size_t bytes = n * size;
    return gcomp__calloc(bytes ? bytes : 1);
}

static char *ostrdup(const char *s) {
    size_t l = strlen(s) + 1;
    char *p = gcomp__alloc(l);
    if (p) memcpy(p, s, l);
    return p;
}

#define OT_MAGIC "GCmo"
#define OT_VERSION 1u
#define OT_HDR 48
#define OT_FREC 40
#define OT_TREC 24

enum { FR_IDLE = 0, FR_FLIGHT = 1, FR_DONE = 2 };

typedef struct ot_tensor {
    char *name;
    size_t n;
    size_t frag, slot; /* fragment, index in its bucket */
    float *sync;       /* w_sync */
    float *mom;        /* outer momentum b; NULL when mu = 0 */
    float *pg;         /* pseudo-gradient in flight, then the average d */
} ot_tensor;

typedef struct ot_frag {
    gcomp_mpi_bucket *b;
    size_t nt;
    size_t *idx;  /* tensors of this fragment, in bucket order */
    float **data; /* their pg, as the bucket takes them */
    int state;
    gcomp_status result; /* FR_DONE: the exchange's outcome */
    gcomp_error result_err;
    uint64_t started; /* step of the sync held (FLIGHT or DONE) */
    uint64_t applied; /* step of the last apply; 0: none yet */
    uint64_t syncs;
    uint64_t offset;
} ot_frag;

struct gcomp_mpi_outer {
    gcomp_mpi_comm *comm;
    gcomp_mpi_outer_options opt; /* fragment_of: NULL here; see frag_of */
    unsigned delay;
    size_t nt, nf;
    ot_tensor *t;
    ot_frag *f;
    unsigned *frag_of;
    uint64_t step;
    uint64_t fingerprint;
    int rank, size;
};

/* ---- options -------------------------------------------------------------------------- */

void gcomp_mpi_outer_options_default(gcomp_mpi_outer_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->local_steps = 16;
    o->optimizer = GCOMP_MPI_OUTER_NESTEROV;
    o->lr = 0.7;
    o->momentum = 0.9;
    o->fragments = 1;
    o->delay = -1;
    o->mix = 0.0;
    o->ef_decay = 1.0;
    o->fragment_of = NULL;
    o->bucket_bytes = (size_t)4 << 20;
}

static gcomp_status check_options(const gcomp_mpi_outer_options *o, size_t count,
                                  gcomp_error *err) {
    if (o->local_steps == 0)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "local_steps (H) is 0: the inner steps between syncs must be >= 1 "
                           "(1 is data-parallel training)");
    if (o->optimizer != GCOMP_MPI_OUTER_SGD && o->optimizer != GCOMP_MPI_OUTER_NESTEROV)
        return gcomp__fail(err, GCOMP_E_ARG, "unknown outer optimizer %d (0 sgd, 1 nesterov)",
                           o->optimizer);
    if (!(o->lr > 0) || !isfinite(o->lr))
        return gcomp__fail(err, GCOMP_E_ARG, "outer lr %g: must be finite and > 0", o->lr);
    if (!(o->momentum >= 0 && o->momentum < 1))
        return gcomp__fail(err, GCOMP_E_ARG, "outer momentum %g: must be in [0, 1)", o->momentum);
    if (o->fragments == 0 || o->fragments > count)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "fragments %u: must be 1..%zu (a fragment is a group of whole tensors, "
                           "and there are %zu)",
                           o->fragments, count, count);
    if (o->fragments > o->local_steps)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "fragments %u > local_steps %u: each fragment starts on its own step "
                           "of the H, so streaming needs H >= F",
                           o->fragments, o->local_steps);
    if (o->delay < -1 || (o->delay >= 0 && (unsigned)o->delay >= o->local_steps))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "delay %d: must be -1 (automatic) or 0..%u (below local_steps, so a "
                           "fragment's sync completes before its next one starts)",
                           o->delay, o->local_steps - 1);
    if (!(o->mix >= 0 && o->mix < 1))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "mix (alpha) %g: must be in [0, 1) (1 would never take the outer "
                           "update)",
                           o->mix);
    if (!(o->ef_decay >= 0 && o->ef_decay <= 1))
        return gcomp__fail(err, GCOMP_E_ARG, "ef_decay (beta) %g: must be in [0, 1]", o->ef_decay);
    if (o->fragment_of) {
        for (size_t i = 0; i < count; i++)
            if (o->fragment_of[i] >= o->fragments)
                return gcomp__fail(err, GCOMP_E_ARG, "fragment_of[%zu] = %u: must be < %u", i,
                                   o->fragment_of[i], o->fragments);
        for (unsigned f = 0; f < o->fragments; f++) {
            size_t used = 0;
            for (size_t i = 0; i < count; i++) used += o->fragment_of[i] == f;
            if (!used)
                return gcomp__fail(err, GCOMP_E_ARG, "fragment %u has no tensor (fragment_of)", f);
        }
    }
    return GCOMP_OK;
}

/* The default assignment: largest tensor first, each to the fragment with the fewest
 * elements so far (ties to the lower index; LPT scheduling), so the fragments' syncs
 * carry similar bytes and the link stays evenly busy. */
static void balance(const gcomp_mpi_tensor *t, size_t count, unsigned nf, unsigned *out) {
    size_t *order = gcomp__alloc(count * sizeof *order);
    uint64_t *load = ocalloc(nf, sizeof *load);
    if (!order || !load) { /* the caller checked memory with its own allocations */
        for (size_t i = 0; i < count; i++) out[i] = (unsigned)(i % nf);
        gcomp__free(order);
        gcomp__free(load);
        return;
    }
    for (size_t i = 0; i < count; i++) order[i] = i;
    for (size_t i = 1; i < count; i++) { /* insertion sort: n descending, index ascending */
        size_t x = order[i], j = i;
        while (j > 0 && t[order[j - 1]].n < t[x].n) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = x;
    }
    for (size_t k = 0; k < count; k++) {
        unsigned best = 0;
        for (unsigned f = 1; f < nf; f++)
            if (load[f] < load[best]) best = f;
        out[order[k]] = best;
        load[best] += t[order[k]].n;
    }
    gcomp__free(order);
    gcomp__free(load);
}

static uint64_t mix64(uint64_t h, uint64_t v) {
    return gcomp__mix64(h ^ gcomp__mix64(v + 0x9e3779b97f4a7c15ull));
}

static uint64_t dbits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* What must match across ranks and between a save and a load. */
static uint64_t fingerprint(const gcomp_mpi_outer_options *o, unsigned delay, const unsigned *fo,
                            size_t count) {
    uint64_t h = mix64(0x6f75746572ull, OT_VERSION);
    h = mix64(h, o->local_steps);
    h = mix64(h, (uint64_t)o->optimizer);
    h = mix64(h, dbits(o->lr));
    h = mix64(h, dbits(o->momentum));
    h = mix64(h, o->fragments);
    h = mix64(h, delay);
    h = mix64(h, dbits(o->mix));
    h = mix64(h, dbits(o->ef_decay));
    h = mix64(h, o->bucket_bytes);
    h = mix64(h, count);
    for (size_t i = 0; fo && i < count; i++) h = mix64(h, fo[i]);
    return h;
}

/* ---- set-up check through a bucket ------------------------------------------------------ */

#define CK_FLOATS 32 /* per value: 16 nibbles and their squares */

static void ck_put(float *p, uint64_t v) {
    for (int k = 0; k < 16; k++) {
        float c = (float)((v >> (4 * k)) & 15u);
        p[2 * k] = c;
        p[2 * k + 1] = c * c;
    }
}

static bool ck_same(const float *p, int P) {
    for (int k = 0; k < 16; k++) {
        double s = p[2 * k], s2 = p[2 * k + 1];
        if ((double)P * s2 != s * s) return false;
    }
    return true;
}

/* Values: [0] the options fingerprint, [1 + i] the hash of tensor i's initial weights.
 * Returns GCOMP_OK when every rank is fine and agrees; else the error for this rank. */
static gcomp_status setup_check(gcomp_mpi_comm *comm, const uint64_t *vals, size_t nvals,
                                gcomp_status local, const gcomp_mpi_tensor *t, double timeout_s,
                                gcomp_error *err) {
    size_t n = 1 + CK_FLOATS * nvals;
    float *buf = vals ? ocalloc(n, sizeof(float)) : NULL;
    if (!buf && local == GCOMP_OK) local = gcomp__fail(err, GCOMP_E_NOMEM, "out of memory");
    /* A rank without the buffer (out of memory here, or before: vals NULL) takes part: its
     * check bucket's spec names no codec, so the bucket's own set-up check fails every
     * rank's create and no rank waits for it in the allreduce. */
    gcomp_mpi_tensor ct = {
        "outer-step set-up check", buf ? "none" : NO_CODEC, n, 0, 0, GCOMP_MPI_AUTO};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error e = {0};
    if (buf) {
        buf[0] = local != GCOMP_OK ? 1.0f : 0.0f;
        for (size_t k = 0; k < nvals; k++) ck_put(buf + 1 + CK_FLOATS * k, vals[k]);
    }
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, &ct, 1, NULL, timeout_s, &e);
    if (st == GCOMP_OK && buf) st = gcomp_mpi_allreduce(b, &buf, GCOMP_MPI_SUM, timeout_s, &e);
    gcomp_mpi_bucket_free(b);
    if (local != GCOMP_OK) { /* this rank's own reason is already in *err */
        gcomp__free(buf);
        return local;
    }
    if (st != GCOMP_OK) {
        gcomp__free(buf);
        return gcomp__fail(err, st, "outer-step set-up check: %s", e.message);
    }
    int P = gcomp_mpi_comm_size(comm);
    if (buf[0] != 0) {
        int bad = (int)buf[0];
        gcomp__free(buf);
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "%d other rank%s could not create the outer step (bad arguments "
                           "there); no rank uses it",
                           bad, bad > 1 ? "s" : "");
    }
    if (!ck_same(buf + 1, P)) {
        gcomp__free(buf);
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "outer-step options differ across ranks (local_steps, optimizer, lr, "
                           "momentum, fragments, delay, mix, ef_decay, bucket_bytes, tensor "
                           "count or fragment assignment)");
    }
    for (size_t i = 1; i < nvals; i++)
        if (!ck_same(buf + 1 + CK_FLOATS * i, P)) {
            const char *nm = t[i - 1].name ? t[i - 1].name : "?";
            gcomp__free(buf);
            return gcomp__fail(err, GCOMP_E_MISMATCH,
                               "tensor '%s' (#%zu): the initial weights differ across ranks "
                               "(every rank must start from the same weights: broadcast them "
                               "first)",
                               nm, i - 1);
        }
    gcomp__free(buf);
    return GCOMP_OK;
}

/* ---- create / free ------------------------------------------------------------------------- */

void gcomp_mpi_outer_free(gcomp_mpi_outer *o) {
    if (!o) return;
    /* A bucket must not be freed with its exchange in flight on a healthy communicator
     * (gcomp_mpi_bucket_free): MPI would still write into it.  Wait for such a sync (the
     * other ranks, freeing at the same step, complete it too; a peer that does not makes
     * the wait time out and fail the communicator, after which freeing is allowed). */
    for (size_t f = 0; o->f && f < o->nf; f++)
        if (o->f[f].b && o->f[f].state == FR_FLIGHT &&
            gcomp_mpi_comm_status(o->comm, NULL) == GCOMP_OK)
            gcomp_mpi_wait(o->f[f].b, 0, NULL);
    for (size_t f = 0; o->f && f < o->nf; f++) {
        gcomp_mpi_bucket_free(o->f[f].b);
        gcomp__free(o->f[f].idx);
        gcomp__free(o->f[f].data);
    }
    for (size_t i = 0; o->t && i < o->nt; i++) {
        gcomp__free(o->t[i].name);
        gcomp__free(o->t[i].sync);
        gcomp__free(o->t[i].mom);
        gcomp__free(o->t[i].pg);
    }
    gcomp__free(o->t);
    gcomp__free(o->f);
    gcomp__free(o->frag_of);
    gcomp__free(o);
}

/* FNV-1a 64 of the tensor's initial weights, with its size: the set-up check. */
static uint64_t weights_hash(const gcomp_mpi_tensor *t, const float *w) {
    return mix64(gcomp__fnv1a64(w, t->n * sizeof(float)), t->n);
}

/* A bucket that refuses a spec does not always pass the core's reason on (some paths say
 * only "invalid spec"); the user needs it, e.g. why feedback=ef around a codec that is no
 * contraction is refused.  So ask the core itself, tensor by tensor (local, and only on
 * this failure path).  Returns the bucket's status, with the best message in *err. */
static gcomp_status spec_reason(const gcomp_mpi_tensor *t, size_t nt, gcomp_status bs,
                                const gcomp_error *be, gcomp_error *err) {
    if (bs == GCOMP_E_SPEC || bs == GCOMP_E_UNKNOWN_CODEC || bs == GCOMP_E_ARG)
        for (size_t j = 0; j < nt; j++) {
            gcomp_compressor *c = NULL;
            gcomp_error ce = {0};
            gcomp_status cs =
                gcomp_compressor_create(&c, t[j].spec, t[j].n, t[j].rows, t[j].cols, &ce);
            gcomp_compressor_free(c);
            if (cs != GCOMP_OK)
                return gcomp__fail(err, bs, "tensor '%s': %s", t[j].name ? t[j].name : "?",
                                   ce.message);
        }
    return gcomp__fail(err, bs, "%s", be->message);
}

/* Everything the object needs, allocated before the set-up check so that running out of
 * memory is a local failure the check shares.  Returns false when out of memory. */
static bool allocate(gcomp_mpi_outer *x, const gcomp_mpi_tensor *tensors, float *const *weights) {
    x->t = ocalloc(x->nt, sizeof *x->t);
    x->f = ocalloc(x->nf, sizeof *x->f);
    if (!x->t || !x->f) return false;
    for (size_t i = 0; i < x->nt; i++) {
        ot_tensor *t = &x->t[i];
        char nb[32];
        snprintf(nb, sizeof nb, "#%zu", i);
        t->name = ostrdup(tensors[i].name ? tensors[i].name : nb);
        t->n = tensors[i].n;
        t->frag = x->frag_of[i];
        t->sync = gcomp__alloc(t->n * sizeof(float));
        t->pg = gcomp__calloc(t->n * sizeof(float));
        t->mom = x->opt.momentum > 0 ? gcomp__calloc(t->n * sizeof(float)) : NULL;
        if (!t->name || !t->sync || !t->pg || (x->opt.momentum > 0 && !t->mom)) return false;
        memcpy(t->sync, weights[i], t->n * sizeof(float));
    }
    for (size_t f = 0; f < x->nf; f++) {
        ot_frag *fr = &x->f[f];
        for (size_t i = 0; i < x->nt; i++) fr->nt += x->frag_of[i] == f;
        fr->idx = ocalloc(fr->nt, sizeof *fr->idx);
        fr->data = ocalloc(fr->nt, sizeof *fr->data);
        if (!fr->idx || !fr->data) return false;
        size_t j = 0;
        for (size_t i = 0; i < x->nt; i++)
            if (x->frag_of[i] == f) {
                fr->idx[j] = i;
                fr->data[j] = x->t[i].pg;
                x->t[i].slot = j++;
            }
        fr->offset = ((f + 1) * (uint64_t)x->opt.local_steps) / x->nf;
    }
    return true;
}

gcomp_status gcomp_mpi_outer_create(gcomp_mpi_outer **out, gcomp_mpi_comm *comm,
                                    const gcomp_mpi_tensor *tensors, size_t count,
                                    float *const *weights, const gcomp_mpi_outer_options *opt,
                                    double timeout_s, gcomp_error *err) {
    if (out) *out = NULL;
    if (!out || !comm) return gcomp__fail(err, GCOMP_E_ARG, "out and comm must not be NULL");
    gcomp_mpi_outer_options o;
    if (opt)
        o = *opt;
    else
        gcomp_mpi_outer_options_default(&o);

    /* Local validation first; its verdict travels with the set-up check. */
    gcomp_status local = GCOMP_OK;
    if (!tensors || count == 0 || !weights)
        local = gcomp__fail(err, GCOMP_E_ARG, "tensors and weights must not be NULL, count >= 1");
    for (size_t i = 0; local == GCOMP_OK && i < count; i++) {
        if (!weights[i])
            local = gcomp__fail(err, GCOMP_E_ARG, "weights[%zu] is NULL", i);
        else if (tensors[i].n == 0 || tensors[i].n > (size_t)INT_MAX)
            local = gcomp__fail(err, GCOMP_E_ARG, "tensor #%zu has n = %zu: 1..%d (MPI counts)", i,
                                tensors[i].n, INT_MAX);
    }
    if (local == GCOMP_OK) local = check_options(&o, count, err);
    for (size_t i = 0; local == GCOMP_OK && i < count; i++)
        for (size_t k = 0; k < tensors[i].n; k++)
            if (!isfinite(weights[i][k])) {
                local = gcomp__fail(
                    err, GCOMP_E_NONFINITE, "tensor '%s' (#%zu): initial weight [%zu] is %g",
                    tensors[i].name ? tensors[i].name : "?", i, k, (double)weights[i][k]);
                break;
            }

    gcomp_mpi_outer *x = ocalloc(1, sizeof *x);
    size_t nvals = 1 + count; /* the same on every rank that was given the same count */
    uint64_t *vals = ocalloc(nvals, sizeof *vals);
    if (!x || !vals) { /* the check still runs, to tell the other ranks */
        gcomp__free(x);
        gcomp__free(vals);
        return setup_check(comm, NULL, nvals, gcomp__fail(err, GCOMP_E_NOMEM, "out of memory"),
                           tensors, timeout_s, err);
    }
    if (local == GCOMP_OK) {
        x->comm = comm;
        x->opt = o;
        x->opt.fragment_of = NULL;
        x->nt = count;
        x->nf = o.fragments;
        x->frag_of = ocalloc(count, sizeof *x->frag_of);
        if (x->frag_of && o.fragment_of)
            memcpy(x->frag_of, o.fragment_of, count * sizeof *x->frag_of);
        else if (x->frag_of)
            balance(tensors, count, o.fragments, x->frag_of);
        x->delay = o.delay >= 0      ? (unsigned)o.delay
                   : o.fragments > 1 ? (o.local_steps + o.fragments - 1) / o.fragments
                                     : 0;
        x->rank = gcomp_mpi_comm_rank(comm);
        x->size = gcomp_mpi_comm_size(comm);
        if (!x->frag_of || !allocate(x, tensors, weights)) {
            local = gcomp__fail(err, GCOMP_E_NOMEM, "out of memory");
        } else {
            x->fingerprint = fingerprint(&o, x->delay, x->frag_of, count);
            vals[0] = x->fingerprint;
            for (size_t i = 0; i < count; i++) vals[1 + i] = weights_hash(&tensors[i], weights[i]);
        }
    }
    gcomp_status st = setup_check(comm, vals, nvals, local, tensors, timeout_s, err);
    gcomp__free(vals);
    if (st != GCOMP_OK) {
        gcomp_mpi_outer_free(x);
        return st;
    }

    /* Every rank got here: the buckets' own set-up checks share any failure from now on. */
    gcomp_mpi_tensor *ft = ocalloc(count, sizeof *ft);
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.bucket_bytes = o.bucket_bytes;
    for (size_t f = 0; f < x->nf; f++) {
        ot_frag *fr = &x->f[f];
        gcomp_mpi_tensor one;
        for (size_t j = 0; ft && j < fr->nt; j++) {
            ft[j] = tensors[fr->idx[j]];
            ft[j].name = x->t[fr->idx[j]].name;
        }
        if (!ft) { /* out of memory: a spec no codec has tells the other ranks */
            one = tensors[0];
            one.spec = NO_CODEC;
        }
        gcomp_error e = {0};
        gcomp_status bs = gcomp_mpi_bucket_create(&fr->b, comm, ft ? ft : &one, ft ? fr->nt : 1,
                                                  &bo, timeout_s, &e);
        if (bs != GCOMP_OK && st == GCOMP_OK)
            st = !ft ? gcomp__fail(err, GCOMP_E_NOMEM, "out of memory")
                     : spec_reason(ft, fr->nt, bs, &e, err);
    }
    gcomp__free(ft);
    /* SparseLoCo's decayed residual reads each tensor's residual: one compressor per
     * tensor that keeps one (the strategy and spec are the same on every rank, so every
     * rank reaches the same verdict). */
    for (size_t i = 0; st == GCOMP_OK && o.ef_decay < 1 && i < count; i++) {
        ot_tensor *t = &x->t[i];
        gcomp_mpi_bucket *b = x->f[t->frag].b;
        int strat = gcomp_mpi_bucket_strategy(b, t->slot);
        gcomp_compressor *c = gcomp_mpi_compressor(b, t->slot);
        if (strat == GCOMP_MPI_RSAG || (strat & GCOMP_MPI_HIERARCHICAL) || !c)
            st = gcomp__fail(err, GCOMP_E_UNSUPPORTED,
                             "tensor '%s': ef_decay < 1 decays the tensor's residual, which the "
                             "%s strategy does not keep in one compressor (use allgather, "
                             "sparse or allreduce)",
                             t->name, gcomp_mpi_strategy_name(strat));
        else if (!gcomp_compressor_residual(c))
            st = gcomp__fail(err, GCOMP_E_ARG,
                             "tensor '%s': ef_decay < 1 decays the error-feedback residual, but "
                             "its spec keeps none (add feedback=ef)",
                             t->name);
    }
    if (st != GCOMP_OK) {
        gcomp_mpi_outer_free(x);
        return st;
    }
    *out = x;
    return GCOMP_OK;
}

/* ---- the outer step ------------------------------------------------------------------------ */

/* The pseudo-gradient of one tensor into pg.  DiLoCo's outer gradient d_r = w_sync - w_r;
 * with SparseLoCo's decayed error feedback e <- beta e + d_r (Sarfi et al. 2025, Alg. 1)
 * the compressor adds e itself, so it is handed d_r - (1 - beta) e. */
static void form_pseudo_gradient(const gcomp_mpi_outer *o, ot_tensor *t, const float *w) {
    const float *restrict s = t->sync;
    float *restrict pg = t->pg;
    const size_t n = t->n;
    for (size_t k = 0; k < n; k++) pg[k] = s[k] - w[k];
    if (o->opt.ef_decay < 1) {
        const float *e = gcomp_compressor_residual(gcomp_mpi_compressor(o->f[t->frag].b, t->slot));
        const float keep = (float)(1.0 - o->opt.ef_decay);
        if (e)
            for (size_t k = 0; k < n; k++) pg[k] -= keep * e[k];
    }
}

/* The outer optimizer on one tensor's average d (in pg), then the merge into the live
 * weights.  PyTorch's SGD (dampening 0), which DiLoCo uses as OuterOpt (Douillard et al.
 * 2023, Alg. 1): b = mu b + d; w_sync -= lr (nesterov ? d + mu b : b); then Streaming
 * DiLoCo's mixing (Douillard et al. 2025): w = (1 - alpha) w_sync + alpha w. */
static void apply_tensor(const gcomp_mpi_outer *o, ot_tensor *t, float *w, bool no_mix) {
    const float lr = (float)o->opt.lr, mu = (float)o->opt.momentum;
    const float a = no_mix ? 0.0f : (float)o->opt.mix;
    const bool nesterov = o->opt.optimizer == GCOMP_MPI_OUTER_NESTEROV;
    float *restrict s = t->sync, *restrict b = t->mom;
    const float *restrict d = t->pg;
    const size_t n = t->n;
    if (!b)
        for (size_t k = 0; k < n; k++) s[k] -= lr * d[k];
    else if (nesterov)
        for (size_t k = 0; k < n; k++) {
            float bk = mu * b[k] + d[k];
            b[k] = bk;
            s[k] -= lr * (d[k] + mu * bk);
        }
    else
        for (size_t k = 0; k < n; k++) {
            float bk = mu * b[k] + d[k];
            b[k] = bk;
            s[k] -= lr * bk;
        }
    if (a == 0.0f)
        memcpy(w, s, n * sizeof(float));
    else
        for (size_t k = 0; k < n; k++) w[k] = (1.0f - a) * s[k] + a * w[k];
}

static gcomp_status start_fragment(gcomp_mpi_outer *o, size_t f, float *const *w,
                                   gcomp_error *err) {
    ot_frag *fr = &o->f[f];
    for (size_t j = 0; j < fr->nt; j++) {
        size_t i = fr->idx[j];
        form_pseudo_gradient(o, &o->t[i], w[i]);
    }
    gcomp_error e = {0};
    gcomp_status st = gcomp_mpi_start(fr->b, fr->data, GCOMP_MPI_AVERAGE, &e);
    if (st != GCOMP_OK) return gcomp__fail(err, st, "fragment %zu: %s", f, e.message);
    fr->state = FR_FLIGHT;
    fr->started = o->step;
    return GCOMP_OK;
}

/* Waits for fragment f's exchange (FLIGHT -> DONE with its outcome). */
static void wait_fragment(gcomp_mpi_outer *o, size_t f, double timeout_s) {
    ot_frag *fr = &o->f[f];
    if (fr->state != FR_FLIGHT) return;
    memset(&fr->result_err, 0, sizeof fr->result_err);
    fr->result = gcomp_mpi_wait(fr->b, timeout_s, &fr->result_err);
    fr->state = FR_DONE;
}

/* Completes fragment f: waits if needed, then applies its average (or drops the sync
 * when the exchange failed, leaving w_sync, momentum and the weights as they were). */
static gcomp_status complete_fragment(gcomp_mpi_outer *o, size_t f, float *const *w, bool no_mix,
                                      double timeout_s, gcomp_error *err) {
    ot_frag *fr = &o->f[f];
    wait_fragment(o, f, timeout_s);
    if (fr->state != FR_DONE) return GCOMP_OK;
    fr->state = FR_IDLE;
    if (fr->result != GCOMP_OK)
        return gcomp__fail(err, fr->result, "fragment %zu (sync of step %llu): %s", f,
                           (unsigned long long)fr->started, fr->result_err.message);
    for (size_t j = 0; j < fr->nt; j++) {
        size_t i = fr->idx[j];
        apply_tensor(o, &o->t[i], w[i], no_mix);
    }
    fr->syncs++;
    fr->applied = o->step;
    return GCOMP_OK;
}

static gcomp_status check_weights(const gcomp_mpi_outer *o, float *const *w, gcomp_error *err) {
    if (!o || !w) return gcomp__fail(err, GCOMP_E_ARG, "outer step and weights must not be NULL");
    for (size_t i = 0; i < o->nt; i++)
        if (!w[i]) return gcomp__fail(err, GCOMP_E_ARG, "weights[%zu] is NULL", i);
    return GCOMP_OK;
}

static bool due_to_start(const gcomp_mpi_outer *o, size_t f, uint64_t t) {
    return t >= 1 && t % o->opt.local_steps == o->f[f].offset % o->opt.local_steps;
}

gcomp_status gcomp_mpi_outer_step(gcomp_mpi_outer *o, float *const *weights, double timeout_s,
                                  gcomp_error *err) {
    gcomp_status st = check_weights(o, weights, err);
    if (st != GCOMP_OK) return st;
    uint64_t t = ++o->step;
    for (size_t f = 0; f < o->nf; f++) {
        ot_frag *fr = &o->f[f];
        if (fr->state != FR_IDLE && fr->started + o->delay <= t) {
            st = complete_fragment(o, f, weights, false, timeout_s, err);
            if (st != GCOMP_OK) return st;
        }
    }
    st = gcomp_mpi_outer_progress(o, err);
    if (st != GCOMP_OK) return st;
    for (size_t f = 0; f < o->nf; f++) {
        if (o->f[f].state != FR_IDLE || !due_to_start(o, f, t)) continue;
        st = start_fragment(o, f, weights, err);
        if (st == GCOMP_OK && o->delay == 0)
            st = complete_fragment(o, f, weights, false, timeout_s, err);
        if (st != GCOMP_OK) return st;
    }
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_outer_progress(gcomp_mpi_outer *o, gcomp_error *err) {
    if (!o) return gcomp__fail(err, GCOMP_E_ARG, "outer step is NULL");
    for (size_t f = 0; f < o->nf; f++) {
        ot_frag *fr = &o->f[f];
        if (fr->state != FR_FLIGHT) continue;
        int done = 0;
        gcomp_error e = {0};
        gcomp_status st = gcomp_mpi_test(fr->b, &done, &e);
        if (st != GCOMP_OK || done) { /* its outcome waits for the step that completes it */
            fr->result = st;
            fr->result_err = e;
            fr->state = FR_DONE;
        }
    }
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_outer_flush(gcomp_mpi_outer *o, float *const *weights, double timeout_s,
                                   gcomp_error *err) {
    gcomp_status st = check_weights(o, weights, err);
    if (st != GCOMP_OK) return st;
    for (size_t f = 0; f < o->nf; f++) {
        st = complete_fragment(o, f, weights, false, timeout_s, err);
        if (st != GCOMP_OK) return st;
    }
    /* A fragment applied at this very step without mixing already is w_sync: a sync of its
     * zero pseudo-gradient would still move it by the outer momentum (Nesterov: lr mu^2 b),
     * an outer step nobody asked for.  The test is on step counts, the same on every rank. */
    for (size_t f = 0; f < o->nf; f++) {
        if (o->f[f].applied == o->step && o->step > 0 && o->opt.mix == 0) continue;
        st = start_fragment(o, f, weights, err);
        if (st == GCOMP_OK) st = complete_fragment(o, f, weights, true, timeout_s, err);
        if (st != GCOMP_OK) return st;
    }
    return GCOMP_OK;
}

/* ---- queries ------------------------------------------------------------------------------- */

const float *gcomp_mpi_outer_global(const gcomp_mpi_outer *o, size_t i) {
    return o && i < o->nt ? o->t[i].sync : NULL;
}

const float *gcomp_mpi_outer_average(const gcomp_mpi_outer *o, size_t i) {
    if (!o || i >= o->nt || o->f[o->t[i].frag].state == FR_FLIGHT) return NULL;
    return o->t[i].pg;
}

size_t gcomp_mpi_outer_count(const gcomp_mpi_outer *o) {
    return o ? o->nt : 0;
}

size_t gcomp_mpi_outer_fragments(const gcomp_mpi_outer *o) {
    return o ? o->nf : 0;
}

gcomp_status gcomp_mpi_outer_locate(const gcomp_mpi_outer *o, size_t i, size_t *fragment,
                                    size_t *index) {
    if (!o || i >= o->nt) return GCOMP_E_ARG;
    if (fragment) *fragment = o->t[i].frag;
    if (index) *index = o->t[i].slot;
    return GCOMP_OK;
}

gcomp_mpi_bucket *gcomp_mpi_outer_bucket(const gcomp_mpi_outer *o, size_t f) {
    return o && f < o->nf ? o->f[f].b : NULL;
}

unsigned gcomp_mpi_outer_local_steps(const gcomp_mpi_outer *o) {
    return o ? o->opt.local_steps : 0;
}

unsigned gcomp_mpi_outer_delay(const gcomp_mpi_outer *o) {
    return o ? o->delay : 0;
}

uint64_t gcomp_mpi_outer_offset(const gcomp_mpi_outer *o, size_t f) {
    return o && f < o->nf ? o->f[f].offset : UINT64_MAX;
}

uint64_t gcomp_mpi_outer_steps(const gcomp_mpi_outer *o) {
    return o ? o->step : 0;
}

uint64_t gcomp_mpi_outer_syncs(const gcomp_mpi_outer *o, size_t f) {
    return o && f < o->nf ? o->f[f].syncs : 0;
}

int gcomp_mpi_outer_in_flight(const gcomp_mpi_outer *o, size_t f) {
    return o && f < o->nf && o->f[f].state != FR_IDLE;
}

gcomp_status gcomp_mpi_outer_stats(const gcomp_mpi_outer *o, gcomp_mpi_stats *out) {
    if (!o || !out) return GCOMP_E_ARG;
    memset(out, 0, sizeof *out);
    for (size_t f = 0; f < o->nf; f++) {
        gcomp_mpi_stats s;
        if (gcomp_mpi_stats_get(o->f[f].b, (size_t)-1, &s) != GCOMP_OK) continue;
        out->calls += s.calls;
        out->bytes_sent += s.bytes_sent;
        out->bytes_received += s.bytes_received;
        out->node_bytes += s.node_bytes;
        out->codec_ns += s.codec_ns;
        out->wire_ns += s.wire_ns;
        out->elapsed_ns += s.elapsed_ns;
        out->overlap_ns += s.overlap_ns;
    }
    return GCOMP_OK;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

static size_t tensor_bytes(const gcomp_mpi_outer *o, size_t i, bool held) {
    const ot_tensor *t = &o->t[i];
    return OT_TREC + 4 * t->n * (1 + (t->mom != NULL) + held);
}

size_t gcomp_mpi_outer_state_size(const gcomp_mpi_outer *o) {
    if (!o) return 0;
    size_t total = OT_HDR + OT_FREC * o->nf + 4;
    for (size_t i = 0; i < o->nt; i++) total += tensor_bytes(o, i, true);
    for (size_t f = 0; f < o->nf; f++) total += gcomp_mpi_bucket_state_size(o->f[f].b);
    return total;
}

gcomp_status gcomp_mpi_outer_save_state(gcomp_mpi_outer *o, void *dst, size_t cap, size_t *len,
                                        double timeout_s, gcomp_error *err) {
    if (len) *len = 0;
    if (!o || !dst || !len)
        return gcomp__fail(err, GCOMP_E_ARG, "outer step, dst and len must not be NULL");
    size_t bound = gcomp_mpi_outer_state_size(o);
    if (cap < bound)
        return gcomp__fail(err, GCOMP_E_DST_SIZE, "state needs up to %zu bytes, dst has %zu", bound,
                           cap);
    /* Exchanges in flight: on a healthy communicator wait for them (their averages are
     * saved and applied when due); on a failed one they can never finish: drop them. */
    bool healthy = gcomp_mpi_comm_status(o->comm, NULL) == GCOMP_OK;
    for (size_t f = 0; f < o->nf; f++) {
        ot_frag *fr = &o->f[f];
        if (fr->state == FR_FLIGHT && healthy) wait_fragment(o, f, timeout_s);
        if (fr->state == FR_FLIGHT) fr->state = FR_IDLE;
        if (fr->state == FR_DONE && fr->result != GCOMP_OK) {
            fr->state = FR_IDLE;
            if (healthy)
                return gcomp__fail(err, fr->result,
                                   "fragment %zu (sync of step %llu): %s; that sync is dropped "
                                   "and nothing was written (save again)",
                                   f, (unsigned long long)fr->started, fr->result_err.message);
        }
    }
    uint8_t *p = dst;
    memcpy(p, OT_MAGIC, 4);
    gcomp__put32(p + 4, OT_VERSION);
    gcomp__put32(p + 16, (uint32_t)o->size);
    gcomp__put32(p + 20, (uint32_t)o->rank);
    gcomp__put32(p + 24, (uint32_t)o->nt);
    gcomp__put32(p + 28, (uint32_t)o->nf);
    gcomp__put64(p + 32, o->fingerprint);
    gcomp__put64(p + 40, o->step);
    uint8_t *q = p + OT_HDR + OT_FREC * o->nf;
    for (size_t i = 0; i < o->nt; i++) {
        const ot_tensor *t = &o->t[i];
        bool held = o->f[t->frag].state == FR_DONE;
        gcomp__put64(q, t->n);
        gcomp__put64(q + 8, gcomp__fnv1a64(t->name, strlen(t->name)));
        gcomp__put32(q + 16, (uint32_t)t->frag);
        gcomp__put32(q + 20, t->mom ? 1u : 0u);
        q += OT_TREC;
        memcpy(q, t->sync, 4 * t->n);
        q += 4 * t->n;
        if (t->mom) {
            memcpy(q, t->mom, 4 * t->n);
            q += 4 * t->n;
        }
        if (held) {
            memcpy(q, t->pg, 4 * t->n);
            q += 4 * t->n;
        }
    }
    uint32_t crc = 0;
    uint8_t *blobs = q;
    for (size_t f = 0; f < o->nf; f++) {
        ot_frag *fr = &o->f[f];
        uint8_t *r = p + OT_HDR + OT_FREC * f;
        size_t l = 0;
        gcomp_error e = {0};
        gcomp_status st = gcomp_mpi_bucket_save_state(fr->b, q, (size_t)(p + cap - q), &l, &e);
        if (st != GCOMP_OK) return gcomp__fail(err, st, "fragment %zu's bucket: %s", f, e.message);
        gcomp__put64(r, fr->syncs);
        gcomp__put64(r + 8, fr->state == FR_DONE ? fr->started : 0);
        gcomp__put64(r + 16, fr->applied);
        gcomp__put32(r + 24, fr->state == FR_DONE ? 1u : 0u);
        gcomp__put32(r + 28, 0);
        gcomp__put64(r + 32, l);
        q += l;
    }
    size_t total = (size_t)(q - p) + 4;
    if (total > cap)
        return gcomp__fail(err, GCOMP_E_DST_SIZE, "state needs %zu bytes, dst has %zu", total, cap);
    gcomp__put64(p + 8, total);
    crc = gcomp__crc32c(0, p, (size_t)(blobs - p));
    for (size_t f = 0, off = 0; f < o->nf; f++) {
        size_t l = (size_t)gcomp__get64(p + OT_HDR + OT_FREC * f + 32);
        off += l;
        if (l >= 4) crc = gcomp__crc32c(crc, blobs + off - 4, 4);
    }
    gcomp__put32(q, crc);
    *len = total;
    return GCOMP_OK;
}

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

gcomp_status gcomp_mpi_outer_load_state(gcomp_mpi_outer *o, const void *src, size_t len,
                                        gcomp_error *err) {
    if (!o || !src) return gcomp__fail(err, GCOMP_E_ARG, "outer step and src must not be NULL");
    for (size_t f = 0; f < o->nf; f++)
        if (o->f[f].state == FR_FLIGHT)
            return gcomp__fail(err, GCOMP_E_PROTOCOL,
                               "fragment %zu has a sync in flight: load between syncs (into a "
                               "fresh object)",
                               f);
    const uint8_t *p = src;
    if (len < OT_HDR + 4)
        return gcomp__fail(err, GCOMP_E_TRUNCATED, "outer-step state of %zu bytes: too short", len);
    if (memcmp(p, OT_MAGIC, 4) != 0)
        return gcomp__fail(err, GCOMP_E_BAD_MAGIC, "not an outer-step state (magic)");
    uint32_t ver = gcomp__get32(p + 4);
    if (ver > OT_VERSION)
        return gcomp__fail(err, GCOMP_E_VERSION,
                           "outer-step state version %u: this library reads up to %u", ver,
                           OT_VERSION);
    if (ver == 0) return gcomp__fail(err, GCOMP_E_STATE, "outer-step state version 0");
    uint64_t total = gcomp__get64(p + 8);
    if (total > len)
        return gcomp__fail(err, GCOMP_E_TRUNCATED, "outer-step state says %llu bytes, got %zu",
                           (unsigned long long)total, len);
    if (total != len)
        return gcomp__fail(err, GCOMP_E_STATE, "outer-step state says %llu bytes, got %zu",
                           (unsigned long long)total, len);
    uint32_t nt = gcomp__get32(p + 24), nf = gcomp__get32(p + 28);
    /* Walk the layout with untrusted lengths before anything is read or checked. */
    if (nf == 0 || nt == 0 || (uint64_t)nf > len / OT_FREC || (uint64_t)nt > len / OT_TREC)
        return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: %u tensors, %u fragments", nt,
                           nf);
    size_t pos = OT_HDR + (size_t)OT_FREC * nf;
    if (pos + 4 > len)
        return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: fragment records overrun");
    const uint8_t *tpos = p + pos;
    for (uint32_t i = 0; i < nt; i++) {
        if (pos + OT_TREC + 4 > len)
            return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: tensor %u overruns", i);
        uint64_t n = gcomp__get64(p + pos);
        uint32_t fr = gcomp__get32(p + pos + 16), flags = gcomp__get32(p + pos + 20);
        if (fr >= nf || (flags & ~1u) || n == 0 || n > (len - pos) / 4)
            return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: tensor %u record", i);
        uint32_t held = gcomp__get32(p + OT_HDR + (size_t)OT_FREC * fr + 24);
        uint64_t arrays = 1 + (flags & 1u) + (held == 1);
        if (n * arrays > (len - pos - OT_TREC) / 4)
            return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: tensor %u overruns", i);
        pos += OT_TREC + (size_t)(4 * n * arrays);
    }
    size_t blobs = pos;
    for (uint32_t f = 0; f < nf; f++) {
        uint64_t l = gcomp__get64(p + OT_HDR + (size_t)OT_FREC * f + 32);
        if (l < 4 || l > len - 4 - pos)
            return gcomp__fail(err, GCOMP_E_STATE,
                               "outer-step state: fragment %u's bucket state length", f);
        pos += (size_t)l;
    }
    if (pos + 4 != len)
        return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: lengths do not add up");
    uint32_t crc = gcomp__crc32c(0, p, blobs);
    for (size_t f = 0, off = 0; f < nf; f++) {
        size_t l = (size_t)gcomp__get64(p + OT_HDR + OT_FREC * f + 32);
        off += l;
        crc = gcomp__crc32c(crc, p + blobs + off - 4, 4);
    }
    if (crc != gcomp__get32(p + len - 4))
        return gcomp__fail(err, GCOMP_E_CHECKSUM, "outer-step state: CRC-32C mismatch (corrupt)");
    /* Intact: now what it belongs to. */
    if (gcomp__get32(p + 16) != (uint32_t)o->size || gcomp__get32(p + 20) != (uint32_t)o->rank)
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "outer-step state of rank %u of %u; this is rank %d of %d",
                           gcomp__get32(p + 20), gcomp__get32(p + 16), o->rank, o->size);
    if (nt != o->nt || nf != o->nf)
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "outer-step state of %u tensors in %u fragments; this object has %zu "
                           "in %zu",
                           nt, nf, o->nt, o->nf);
    if (gcomp__get64(p + 32) != o->fingerprint)
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "outer-step state saved with other options (local_steps, optimizer, "
                           "lr, momentum, fragments, delay, mix, ef_decay, bucket_bytes or "
                           "fragment assignment)");
    uint64_t step = gcomp__get64(p + 40);
    for (uint32_t f = 0; f < nf; f++) {
        const uint8_t *r = p + OT_HDR + (size_t)OT_FREC * f;
        uint64_t started = gcomp__get64(r + 8), applied = gcomp__get64(r + 16);
        uint32_t held = gcomp__get32(r + 24);
        if (held > 1 || gcomp__get32(r + 28) != 0 || applied > step ||
            (held && (started == 0 || started > step || started + o->delay <= step ||
                      !due_to_start(o, f, started))))
            return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: fragment %u record", f);
    }
    const uint8_t *q = tpos;
    for (size_t i = 0; i < o->nt; i++) {
        const ot_tensor *t = &o->t[i];
        uint64_t n = gcomp__get64(q);
        uint32_t flags = gcomp__get32(q + 20);
        if (n != t->n || gcomp__get64(q + 8) != gcomp__fnv1a64(t->name, strlen(t->name)) ||
            gcomp__get32(q + 16) != t->frag)
            return gcomp__fail(err, GCOMP_E_MISMATCH,
                               "outer-step state: tensor #%zu is not '%s' of %zu elements in "
                               "fragment %zu",
                               i, t->name, t->n, t->frag);
        if ((flags & 1u) != (t->mom != NULL))
            return gcomp__fail(err, GCOMP_E_STATE, "outer-step state: tensor '%s' momentum flag",
                               t->name);
        bool held = gcomp__get32(p + OT_HDR + (size_t)OT_FREC * t->frag + 24) == 1;
        q += OT_TREC + 4 * n * (1 + (t->mom != NULL) + held);
    }
    /* The buckets: keep their current states aside, so a failure can put them back. */
    blob *old = ocalloc(o->nf, sizeof *old);
    if (!old) return gcomp__fail(err, GCOMP_E_NOMEM, "out of memory");
    gcomp_status st = GCOMP_OK;
    for (size_t f = 0; st == GCOMP_OK && f < o->nf; f++) {
        size_t cap = gcomp_mpi_bucket_state_size(o->f[f].b);
        old[f].p = gcomp__alloc(cap);
        if (!old[f].p) {
            st = gcomp__fail(err, GCOMP_E_NOMEM, "out of memory");
            break;
        }
        gcomp_error e = {0};
        st = gcomp_mpi_bucket_save_state(o->f[f].b, old[f].p, cap, &old[f].len, &e);
        if (st != GCOMP_OK) st = gcomp__fail(err, st, "fragment %zu's bucket: %s", f, e.message);
    }
    size_t loaded = 0;
    for (size_t f = 0, off = blobs; st == GCOMP_OK && f < o->nf; f++) {
        size_t l = (size_t)gcomp__get64(p + OT_HDR + (size_t)OT_FREC * f + 32);
        gcomp_error e = {0};
        st = gcomp_mpi_bucket_load_state(o->f[f].b, p + off, l, &e);
        if (st != GCOMP_OK) {
            st = gcomp__fail(err, st, "fragment %zu's bucket: %s", f, e.message);
            break;
        }
        loaded++;
        off += l;
    }
    if (st != GCOMP_OK)
        for (size_t f = 0; f < loaded; f++)
            gcomp_mpi_bucket_load_state(o->f[f].b, old[f].p, old[f].len, NULL);
    for (size_t f = 0; f < o->nf; f++) gcomp__free(old[f].p);
    gcomp__free(old);
    if (st != GCOMP_OK) return st;
    /* Everything checks: take it. */
    o->step = step;
    for (size_t f = 0; f < o->nf; f++) {
        const uint8_t *r = p + OT_HDR + OT_FREC * f;
        ot_frag *fr = &o->f[f];
        fr->syncs = gcomp__get64(r);
        fr->state = gcomp__get32(r + 24) ? FR_DONE : FR_IDLE;
        fr->started = gcomp__get64(r + 8);
        fr->applied = gcomp__get64(r + 16);
        fr->result = GCOMP_OK;
        memset(&fr->result_err, 0, sizeof fr->result_err);
    }
    q = tpos;
    for (size_t i = 0; i < o->nt; i++) {
        ot_tensor *t = &o->t[i];
        q += OT_TREC;
        memcpy(t->sync, q, 4 * t->n);
        q += 4 * t->n;
        if (t->mom) {
            memcpy(t->mom, q, 4 * t->n);
            q += 4 * t->n;
        }
        if (o->f[t->frag].state == FR_DONE) {
            memcpy(t->pg, q, 4 * t->n);
            q += 4 * t->n;
        } else {
            memset(t->pg, 0, 4 * t->n);
        }
    }
    return GCOMP_OK;
}

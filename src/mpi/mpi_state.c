/*
 * mpi_state.c - checkpoints of a bucket's state on one rank: every compressor the bucket
 * keeps for this rank (worker side, owner side, rsag's chunks...) in one versioned blob.
 * Which compressors a tensor has, and in which slot, is its strategy component's answer
 * (gm_strategy.state_slots / state_slot); this file knows the frame only.
 *
 * A bucket's state is exactly its compressors' (residuals, DGC momentum, PowerSGD's
 * residual and warm start, step counters that key the random streams); everything else
 * lives for one call.  So the blob is a small frame around the core's own state blobs
 * (gcomp_state_save, "GCst", each with its CRC-32C over all of its bytes), with what must
 * match for them to mean the same thing again: the communicator's shape (size, this
 * rank, nodes), and per tensor its spec fingerprint, name, shape, strategy and number of
 * compressor slots.  Layout, little-endian (version 1):
 *
 *   0   4 bytes  magic "GCmb"
 *   4   u32      version, 1
 *   8   u64      total length of the blob
 *   16  u32 x 6  communicator size, rank, nodes, node index, rank in the node,
 *                ranks_per_node option
 *   40  u32      T, tensors;  44 u32 reserved, 0
 *   48  T records: u64 spec fingerprint, u64 FNV-1a of the name, u64 n, rows, cols,
 *       u32 strategy (as gcomp_mpi_bucket_strategy), u32 K slots; then K slots, each a
 *       u32 length L and L bytes of a core state blob (L = 0: no compressor on this rank).
 *       Slots: 0 the tensor's compressor, 1 the owner's, 2.. rsag's chunk 0, 1, ...
 *   end u32      CRC-32C of the frame: every byte above except the slots' contents, but
 *                with each slot's last 4 bytes (its own CRC-32C).
 *
 * The frame's CRC and the slots' own CRCs together cover every byte, without reading a
 * large checkpoint twice.  Rejected: a collective save/load (a trainer writes one file per
 * rank, at its own pace; random-k, whose ranks must share the step counter, checks it at
 * run time through its key hash).
 */
#include "mpi_strategy.h"

#include <stdio.h>
#include <stdlib.h>

#define ST_MAGIC "GCmb"
#define ST_VERSION 1u
#define ST_HDR 48
#define ST_REC 48

/* The strategy component says which compressors fill a tensor's slots (mpi_strategy.h). */
static int nslots(const gm_tensor *t, const gcomp_mpi_comm *c) {
    (void)c;
    return t->S->state_slots ? t->S->state_slots(t) : 2;
}

static gcomp_compressor *slot(const gm_tensor *t, int k) {
    if (t->S->state_slot) return t->S->state_slot(t, k);
    return k == 0 ? t->c : NULL;
}

static bool failed(const gcomp_mpi_bucket *b) {
    return b->dead || b->comm->failed != GCOMP_OK || b->epoch != b->comm->epoch;
}

size_t gcomp_mpi_bucket_state_size(const gcomp_mpi_bucket *b) {
    if (!b) return 0;
    size_t total = ST_HDR + 4;
    for (size_t i = 0; i < b->nt; i++) {
        total += ST_REC;
        for (int k = 0; k < nslots(&b->t[i], b->comm); k++)
            total += 4 + gcomp_state_bound(slot(&b->t[i], k));
    }
    return total;
}

static void put_header(const gcomp_mpi_bucket *b, uint8_t *p, uint64_t total) {
    const gcomp_mpi_comm *c = b->comm;
    memcpy(p, ST_MAGIC, 4);
    gcomp__put32(p + 4, ST_VERSION);
    gcomp__put64(p + 8, total);
    gcomp__put32(p + 16, (uint32_t)c->size);
    gcomp__put32(p + 20, (uint32_t)c->rank);
    gcomp__put32(p + 24, (uint32_t)c->nnodes);
    gcomp__put32(p + 28, (uint32_t)c->node_index);
    gcomp__put32(p + 32, (uint32_t)c->node_rank);
    gcomp__put32(p + 36, (uint32_t)c->opt.ranks_per_node);
    gcomp__put32(p + 40, (uint32_t)b->nt);
    gcomp__put32(p + 44, 0);
}

static void put_record(const gcomp_mpi_bucket *b, size_t i, uint8_t *p) {
    const gm_tensor *t = &b->t[i];
    gcomp__put64(p, t->fp);
    gcomp__put64(p + 8, gcomp__fnv1a64(t->name, strlen(t->name)));
    gcomp__put64(p + 16, t->n);
    gcomp__put64(p + 24, t->rows);
    gcomp__put64(p + 32, t->cols);
    gcomp__put32(p + 40, (uint32_t)gcomp_mpi_bucket_strategy(b, i));
    gcomp__put32(p + 44, (uint32_t)nslots(t, b->comm));
}

gcomp_status gcomp_mpi_bucket_save_state(gcomp_mpi_bucket *b, void *dst, size_t cap, size_t *len,
                                         gcomp_error *err) {
    if (len) *len = 0;
    if (!b || !dst || !len)
        return gm_fail(err, GCOMP_E_ARG, "bucket, dst and len must not be NULL");
    if (b->busy && !failed(b))
        return gm_fail(err, GCOMP_E_PROTOCOL,
                       "this bucket's allreduce is in flight: save after it completes");
    size_t total = gcomp_mpi_bucket_state_size(b);
    if (cap < total)
        return gm_fail(err, GCOMP_E_DST_SIZE, "state needs %zu bytes, dst has %zu", total, cap);
    /* After a failure a PowerSGD step may be half done: abandon it, which the failure
     * meant anyway (its state goes back to before the call). */
    if (b->busy)
        for (size_t i = 0; i < b->nt; i++)
            if (b->t[i].S->abandon) b->t[i].S->abandon(&b->t[i]);
    uint8_t *p = dst, *q = p + ST_HDR;
    put_header(b, p, total);
    uint32_t crc = gcomp__crc32c(0, p, ST_HDR);
    for (size_t i = 0; i < b->nt; i++) {
        const gm_tensor *t = &b->t[i];
        put_record(b, i, q);
        crc = gcomp__crc32c(crc, q, ST_REC);
        q += ST_REC;
        for (int k = 0; k < nslots(t, b->comm); k++) {
            gcomp_compressor *c = slot(t, k);
            size_t l = 0;
            if (c) {
                gcomp_status st = gcomp_state_save(c, q + 4, (size_t)(p + total - q) - 4, &l);
                if (st != GCOMP_OK)
                    return gm_fail(err, st, "tensor '%s' (#%zu), slot %d: %s", t->name, i, k,
                                   gcomp_status_str(st));
            }
            gcomp__put32(q, (uint32_t)l);
            crc = gcomp__crc32c(crc, q, 4);
            if (l) crc = gcomp__crc32c(crc, q + 4 + l - 4, 4);
            q += 4 + l;
        }
    }
    gcomp__put32(q, crc);
    *len = total;
    return GCOMP_OK;
}

/* A parsed blob: where each tensor's slots are. */
typedef struct slot_ref {
    const uint8_t *p;
    size_t len;
} slot_ref;

/* Walks the frame, checks lengths, the CRC, the version and that the blob describes this
 * bucket on this rank; fills refs (one per slot of every tensor, in order). */
static gcomp_status parse(const gcomp_mpi_bucket *b, const uint8_t *p, size_t len, slot_ref *refs,
                          gcomp_error *err) {
    const gcomp_mpi_comm *c = b->comm;
    if (len < 4 || memcmp(p, ST_MAGIC, 4) != 0)
        return len < 4 ? gm_fail(err, GCOMP_E_TRUNCATED, "state: %zu bytes", len)
                       : gm_fail(err, GCOMP_E_BAD_MAGIC, "state: not a bucket state blob");
    if (len < ST_HDR + 4) return gm_fail(err, GCOMP_E_TRUNCATED, "state: %zu bytes", len);
    uint32_t version = gcomp__get32(p + 4);
    if (version > ST_VERSION)
        return gm_fail(err, GCOMP_E_VERSION, "state: version %u; this library reads %u",
                       (unsigned)version, ST_VERSION);
    uint64_t total = gcomp__get64(p + 8);
    if (total > len)
        return gm_fail(err, GCOMP_E_TRUNCATED, "state: %zu bytes of %llu", len,
                       (unsigned long long)total);
    if (total < len || version == 0 || gcomp__get32(p + 44) != 0)
        return gm_fail(err, GCOMP_E_STATE, "state: inconsistent header");
    uint32_t crc = gcomp__crc32c(0, p, ST_HDR), T = gcomp__get32(p + 40);
    size_t off = ST_HDR, r = 0;
    /* Walk first (bounded by len at every step), compare after the CRC has passed: a
     * corrupt blob is CHECKSUM, not a misleading MISMATCH. */
    for (uint32_t i = 0; i < T; i++) {
        if (len - 4 - off < ST_REC) return gm_fail(err, GCOMP_E_STATE, "state: tensor %u cut", i);
        crc = gcomp__crc32c(crc, p + off, ST_REC);
        uint32_t K = gcomp__get32(p + off + 44);
        off += ST_REC;
        for (uint32_t k = 0; k < K; k++) {
            if (len - 4 - off < 4) return gm_fail(err, GCOMP_E_STATE, "state: slot cut");
            size_t l = gcomp__get32(p + off);
            crc = gcomp__crc32c(crc, p + off, 4);
            if (len - 4 - off - 4 < l || (l && l < 4))
                return gm_fail(err, GCOMP_E_STATE, "state: slot of %zu bytes past the end", l);
            if (l) crc = gcomp__crc32c(crc, p + off + 4 + l - 4, 4);
            off += 4 + l;
        }
    }
    if (off != len - 4) return gm_fail(err, GCOMP_E_STATE, "state: trailing bytes");
    if (crc != gcomp__get32(p + off))
        return gm_fail(err, GCOMP_E_CHECKSUM, "state: frame checksum mismatch (corrupt)");

    const uint32_t have[6] = {gcomp__get32(p + 16), gcomp__get32(p + 20), gcomp__get32(p + 24),
                              gcomp__get32(p + 28), gcomp__get32(p + 32), gcomp__get32(p + 36)};
    const uint32_t want[6] = {(uint32_t)c->size,      (uint32_t)c->rank,
                              (uint32_t)c->nnodes,    (uint32_t)c->node_index,
                              (uint32_t)c->node_rank, (uint32_t)c->opt.ranks_per_node};
    if (have[0] != want[0])
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "state: saved with %u ranks; this communicator has %u", have[0], want[0]);
    if (have[1] != want[1])
        return gm_fail(err, GCOMP_E_MISMATCH, "state: saved by rank %u; this is rank %u", have[1],
                       want[1]);
    if (memcmp(have + 2, want + 2, 4 * sizeof have[0]))
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "state: saved on node %u of %u (rank %u there, ranks_per_node %u); this "
                       "rank is on node %u of %u (rank %u, ranks_per_node %u)",
                       have[3], have[2], have[4], have[5], want[3], want[2], want[4], want[5]);
    if (T != b->nt)
        return gm_fail(err, GCOMP_E_MISMATCH, "state: %u tensors; this bucket has %zu", T, b->nt);
    off = ST_HDR;
    for (size_t i = 0; i < b->nt; i++) {
        const gm_tensor *t = &b->t[i];
        uint8_t rec[ST_REC];
        put_record(b, i, rec);
        static const char *const field[] = {"codec spec (fingerprint)", "name (tensor order?)",
                                            "size", "rows", "cols"};
        for (int f = 0; f < 5; f++)
            if (memcmp(rec + 8 * f, p + off + 8 * f, 8))
                return gm_fail(err, GCOMP_E_MISMATCH,
                               "state: tensor '%s' (#%zu): %s differs from the saved one "
                               "(this bucket: %s, n=%zu)",
                               t->name, i, field[f], t->spec, t->n);
        if (memcmp(rec + 40, p + off + 40, 8))
            return gm_fail(err, GCOMP_E_MISMATCH,
                           "state: tensor '%s' (#%zu): saved with strategy %s, this bucket uses %s",
                           t->name, i, gcomp_mpi_strategy_name((int)gcomp__get32(p + off + 40)),
                           gcomp_mpi_strategy_name(gcomp_mpi_bucket_strategy(b, i)));
        off += ST_REC;
        for (int k = 0; k < nslots(t, c); k++) {
            size_t l = gcomp__get32(p + off);
            if ((l != 0) != (slot(t, k) != NULL))
                return gm_fail(err, GCOMP_E_STATE, "state: tensor '%s' (#%zu): slot %d %s", t->name,
                               i, k,
                               l ? "has a state this rank has no compressor for" : "is empty");
            refs[r++] = (slot_ref){p + off + 4, l};
            off += 4 + l;
        }
    }
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_bucket_load_state(gcomp_mpi_bucket *b, const void *src, size_t len,
                                         gcomp_error *err) {
    if (!b || !src) return gm_fail(err, GCOMP_E_ARG, "bucket and src must not be NULL");
    if (failed(b))
        return gm_fail(err, GCOMP_E_FAILED,
                       "this bucket failed (or its communicator was reset): load the state into a "
                       "new bucket");
    if (b->busy)
        return gm_fail(err, GCOMP_E_PROTOCOL,
                       "this bucket's allreduce is in flight: load after it completes");
    /* Whatever comes of it, a rank may now stand at another step than the others (its load
     * failed while theirs worked): the next start checks.  Not for a parameter server's
     * bucket, whose servers never start it. */
    b->resync = b->opt.ps == NULL;
    size_t nref = 0;
    for (size_t i = 0; i < b->nt; i++) nref += (size_t)nslots(&b->t[i], b->comm);
    slot_ref *refs = gm_calloc(nref ? nref : 1, sizeof *refs);
    if (!refs) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    gcomp_status st = parse(b, src, len, refs, err);
    if (st != GCOMP_OK) {
        gm_free(refs);
        return st;
    }
    /* Each core load is all-or-nothing; the bucket's is too: keep the current states and
     * put them back if a later slot is refused. */
    size_t cap = gcomp_mpi_bucket_state_size(b);
    uint8_t *backup = gm_alloc(cap);
    size_t *blen = gm_calloc(nref ? nref : 1, sizeof *blen);
    if (!backup || !blen) {
        gm_free(refs);
        gm_free(backup);
        gm_free(blen);
        return gm_fail(err, GCOMP_E_NOMEM, "out of memory keeping the current state");
    }
    size_t r = 0, off = 0, done = 0;
    for (size_t i = 0; i < b->nt; i++)
        for (int k = 0; k < nslots(&b->t[i], b->comm); k++, r++) {
            gcomp_compressor *c = slot(&b->t[i], k);
            if (c && gcomp_state_save(c, backup + off, cap - off, &blen[r]) != GCOMP_OK) {
                st = gm_fail(err, GCOMP_E_NOMEM, "cannot keep the current state");
                goto out;
            }
            off += blen[r];
        }
    r = 0;
    for (size_t i = 0; i < b->nt && st == GCOMP_OK; i++)
        for (int k = 0; k < nslots(&b->t[i], b->comm) && st == GCOMP_OK; k++, r++) {
            gcomp_compressor *c = slot(&b->t[i], k);
            if (!c) continue;
            st = gcomp_state_load(c, refs[r].p, refs[r].len);
            if (st != GCOMP_OK)
                gm_fail(err, st, "state: tensor '%s' (#%zu), slot %d: %s", b->t[i].name, i, k,
                        gcomp_status_str(st));
            else
                done = r + 1;
        }
    if (st != GCOMP_OK) { /* put back what was loaded */
        off = 0;
        r = 0;
        for (size_t i = 0; i < b->nt; i++)
            for (int k = 0; k < nslots(&b->t[i], b->comm); k++, r++) {
                gcomp_compressor *c = slot(&b->t[i], k);
                if (c && r < done) gcomp_state_load(c, backup + off, blen[r]);
                off += blen[r];
            }
    }
out:
    gm_free(refs);
    gm_free(backup);
    gm_free(blen);
    return st;
}

/*
 * mpi_ps_state.c - checkpoints of what a parameter server keeps beyond compressors: per
 * part it owns, the stored values (weights, or the last round's sum), the momentum, the
 * update count and the optimizer.  The compressors themselves (workers' residuals, the
 * servers' pull residuals) are in the bucket's own state blob (mpi_state.c, slots 2p and
 * 2p + 1), so a PS job checkpoints with both calls and a collective job with one.
 *
 * Layout (docs/FORMAT.md, "MPI parameter-server state"), little-endian, version 2:
 *   0   "GCps"; u32 version; u64 total length
 *   16  u32 communicator size, rank, servers S, this rank's server index (~0: a worker)
 *   32  u32 mode | update << 8; u32 T tensors; u64 part_bytes
 *   48  T records: u64 spec fingerprint, u64 FNV-1a of the name, u64 n, u32 parts, u32 K
 *       parts kept here; then K part records: u32 part, u32 flags (bit 0 initialised,
 *       bit 1 momentum follows), u64 offset, u64 n, u64 updates, f32 lr, momentum,
 *       weight decay, rescale, u32 nesterov, u32 reserved 0, then n f32 stored values and,
 *       with bit 1, n f32 momentum; on a worker (K = 0) instead, since version 2, `parts`
 *       u64: the update count of its last reply for each part
 *   end u32 CRC-32C of every byte before it
 * A worker's update counts are what the staleness of its next async push is counted from:
 * a version-1 blob lacks them, so loading one sets them to 0 and each worker's first push
 * counts from there (with max_staleness, it is dropped as stale; pull once after loading
 * such a blob).
 * One CRC over everything: the blob is read once on load anyway (every value is checked
 * finite before anything is copied), unlike the bucket blob, whose compressor states
 * carry CRCs of their own.
 */
#include "mpi_ps.h"

#include <math.h>

#define PSS_MAGIC "GCps"
#define PSS_VERSION 2u
#define PSS_HDR 48
#define PSS_REC 32
#define PSS_PART 56

static bool owned(const ps_tensor *pt, const ps_part *p) {
    return pt->server && p->server == pt->ps->me_srv;
}

static size_t part_bytes(const ps_part *p) {
    return PSS_PART + 4 * p->n + (p->mom.p ? 4 * p->n : 0);
}

/* A worker's part versions follow its tensor's record (version 2 on). */
static size_t versions_bytes(const ps_tensor *pt) {
    return pt && !pt->server ? 8 * pt->nparts : 0;
}

size_t gcomp_mpi_ps_state_size(const gcomp_mpi_bucket *b) {
    if (!b || !b->opt.ps) return 0;
    size_t total = PSS_HDR + 4;
    for (size_t i = 0; i < b->nt; i++) {
        total += PSS_REC;
        const ps_tensor *pt = b->t[i].priv;
        total += versions_bytes(pt);
        for (size_t j = 0; pt && j < pt->nparts; j++)
            if (owned(pt, &pt->part[j])) total += part_bytes(&pt->part[j]);
    }
    return total;
}

static void put_header(const gcomp_mpi_bucket *b, uint8_t *p, uint64_t total) {
    const gcomp_mpi_ps *ps = b->opt.ps;
    memcpy(p, PSS_MAGIC, 4);
    gcomp__put32(p + 4, PSS_VERSION);
    gcomp__put64(p + 8, total);
    gcomp__put32(p + 16, (uint32_t)ps->P);
    gcomp__put32(p + 20, (uint32_t)ps->rank);
    gcomp__put32(p + 24, (uint32_t)ps->S);
    gcomp__put32(p + 28, ps->me_srv >= 0 ? (uint32_t)ps->me_srv : UINT32_MAX);
    gcomp__put32(p + 32, (uint32_t)ps->opt.mode | (uint32_t)ps->opt.update << 8);
    gcomp__put32(p + 36, (uint32_t)b->nt);
    gcomp__put64(p + 40, ps->opt.part_bytes);
}

static size_t kept(const ps_tensor *pt) {
    size_t k = 0;
    for (size_t j = 0; pt && j < pt->nparts; j++) k += owned(pt, &pt->part[j]);
    return k;
}

static void put_record(const gcomp_mpi_bucket *b, size_t i, uint8_t *p) {
    const gm_tensor *t = &b->t[i];
    const ps_tensor *pt = t->priv;
    gcomp__put64(p, t->fp);
    gcomp__put64(p + 8, gcomp__fnv1a64(t->name, strlen(t->name)));
    gcomp__put64(p + 16, t->n);
    gcomp__put32(p + 24, pt ? (uint32_t)pt->nparts : 0);
    gcomp__put32(p + 28, (uint32_t)kept(pt));
}

static gcomp_status ps_state_usable(const gcomp_mpi_bucket *b, gcomp_error *err) {
    if (!b || !b->opt.ps || b->t[0].strategy != GCOMP_MPI_PS)
        return gm_fail(err, GCOMP_E_ARG, "not a parameter-server bucket");
    if (b->opt.ps->serving || b->busy)
        return gm_fail(err, GCOMP_E_PROTOCOL,
                       "the bucket is in use (serving, or an exchange in flight)");
    return GCOMP_OK;
}

gcomp_status gcomp_mpi_ps_save_state(const gcomp_mpi_bucket *b, void *dst, size_t cap, size_t *len,
                                     gcomp_error *err) {
    if (len) *len = 0;
    if (!dst || !len) return gm_fail(err, GCOMP_E_ARG, "dst and len must not be NULL");
    gcomp_status st = ps_state_usable(b, err);
    if (st != GCOMP_OK) return st;
    size_t total = gcomp_mpi_ps_state_size(b);
    if (cap < total)
        return gm_fail(err, GCOMP_E_DST_SIZE, "state needs %zu bytes, dst has %zu", total, cap);
    uint8_t *p = dst, *q = p + PSS_HDR;
    put_header(b, p, total);
    for (size_t i = 0; i < b->nt; i++) {
        put_record(b, i, q);
        q += PSS_REC;
        const ps_tensor *pt = b->t[i].priv;
        for (size_t j = 0; versions_bytes(pt) && j < pt->nparts; j++, q += 8)
            gcomp__put64(q, pt->part[j].version);
        for (size_t j = 0; pt && j < pt->nparts; j++) {
            const ps_part *x = &pt->part[j];
            if (!owned(pt, x)) continue;
            gcomp__put32(q, (uint32_t)j);
            gcomp__put32(q + 4, (x->inited ? 1u : 0u) | (x->mom.p ? 2u : 0u));
            gcomp__put64(q + 8, x->off);
            gcomp__put64(q + 16, x->n);
            gcomp__put64(q + 24, x->sversion);
            gcomp__putf(q + 32, x->opt.lr);
            gcomp__putf(q + 36, x->opt.momentum);
            gcomp__putf(q + 40, x->opt.weight_decay);
            gcomp__putf(q + 44, x->opt.rescale);
            gcomp__put32(q + 48, (uint32_t)x->opt.nesterov);
            gcomp__put32(q + 52, 0);
            q += PSS_PART;
            for (size_t k = 0; k < x->n; k++, q += 4)
                gcomp__putf(q, ((const float *)x->store.p)[k]);
            if (x->mom.p)
                for (size_t k = 0; k < x->n; k++, q += 4)
                    gcomp__putf(q, ((const float *)x->mom.p)[k]);
        }
    }
    gcomp__put32(q, gcomp__crc32c(0, p, (size_t)(q - p)));
    *len = total;
    return GCOMP_OK;
}

static bool finite_run(const uint8_t *q, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (!isfinite(gcomp__getf(q + 4 * k))) return false;
    return true;
}

gcomp_status gcomp_mpi_ps_load_state(gcomp_mpi_bucket *b, const void *src, size_t len,
                                     gcomp_error *err) {
    if (!src) return gm_fail(err, GCOMP_E_ARG, "src must not be NULL");
    gcomp_status st = ps_state_usable(b, err);
    if (st != GCOMP_OK) return st;
    const uint8_t *p = src;
    if (len < 4) return gm_fail(err, GCOMP_E_TRUNCATED, "ps state: %zu bytes", len);
    if (memcmp(p, PSS_MAGIC, 4))
        return gm_fail(err, GCOMP_E_BAD_MAGIC, "ps state: not a parameter-server state blob");
    if (len < PSS_HDR + 4) return gm_fail(err, GCOMP_E_TRUNCATED, "ps state: %zu bytes", len);
    uint32_t version = gcomp__get32(p + 4);
    if (version > PSS_VERSION)
        return gm_fail(err, GCOMP_E_VERSION, "ps state: version %u; this library reads %u",
                       (unsigned)version, PSS_VERSION);
    uint64_t total = gcomp__get64(p + 8);
    if (total > len)
        return gm_fail(err, GCOMP_E_TRUNCATED, "ps state: %zu bytes of %llu", len,
                       (unsigned long long)total);
    if (total < len || version == 0)
        return gm_fail(err, GCOMP_E_STATE, "ps state: inconsistent header");
    if (gcomp__crc32c(0, p, len - 4) != gcomp__get32(p + len - 4))
        return gm_fail(err, GCOMP_E_CHECKSUM, "ps state: checksum mismatch (corrupt)");
    uint8_t hdr[PSS_HDR];
    put_header(b, hdr, 0);
    static const char *const field[] = {"number of ranks", "rank", "number of servers",
                                        "server index",    "mode", "number of tensors"};
    for (int f = 0; f < 6; f++)
        if (memcmp(hdr + 16 + 4 * f, p + 16 + 4 * f, 4))
            return gm_fail(err, GCOMP_E_MISMATCH, "ps state: saved with another %s (%u; here %u)",
                           field[f], (unsigned)gcomp__get32(p + 16 + 4 * f),
                           (unsigned)gcomp__get32(hdr + 16 + 4 * f));
    if (memcmp(hdr + 40, p + 40, 8))
        return gm_fail(err, GCOMP_E_MISMATCH, "ps state: saved with another part size");
    /* Walk and check everything; copy only after. */
    size_t off = PSS_HDR, end = len - 4;
    for (size_t i = 0; i < b->nt; i++) {
        const ps_tensor *pt = b->t[i].priv;
        uint8_t rec[PSS_REC];
        if (end - off < PSS_REC) return gm_fail(err, GCOMP_E_STATE, "ps state: tensor %zu cut", i);
        put_record(b, i, rec);
        if (memcmp(rec, p + off, PSS_REC))
            return gm_fail(err, GCOMP_E_MISMATCH,
                           "ps state: tensor '%s' (#%zu): spec, name, size or partition differs "
                           "from the saved one",
                           b->t[i].name, i);
        off += PSS_REC;
        size_t vb = version >= 2 ? versions_bytes(pt) : 0;
        if (end - off < vb) return gm_fail(err, GCOMP_E_STATE, "ps state: tensor %zu cut", i);
        off += vb;
        for (size_t j = 0; pt && j < pt->nparts; j++) {
            const ps_part *x = &pt->part[j];
            if (!owned(pt, x)) continue;
            if (end - off < PSS_PART) return gm_fail(err, GCOMP_E_STATE, "ps state: part cut");
            const uint8_t *q = p + off;
            uint32_t flags = gcomp__get32(q + 4);
            gcomp_mpi_ps_optimizer o = {gcomp__getf(q + 32), gcomp__getf(q + 36),
                                        gcomp__getf(q + 40), gcomp__getf(q + 44),
                                        (int)gcomp__get32(q + 48)};
            if (gcomp__get32(q) != j || gcomp__get64(q + 8) != x->off ||
                gcomp__get64(q + 16) != x->n || ((flags & 2u) != 0) != (x->mom.p != NULL))
                return gm_fail(err, GCOMP_E_MISMATCH,
                               "ps state: tensor '%s': part %zu differs from the saved one",
                               b->t[i].name, j);
            if ((flags & ~3u) || gcomp__get32(q + 52) || !gm_ps_opt_ok(&o))
                return gm_fail(err, GCOMP_E_STATE, "ps state: tensor '%s': bad part record",
                               b->t[i].name);
            size_t need = part_bytes(x);
            if (end - off < need) return gm_fail(err, GCOMP_E_STATE, "ps state: part cut");
            if (!finite_run(q + PSS_PART, need / 4 - PSS_PART / 4))
                return gm_fail(err, GCOMP_E_STATE, "ps state: tensor '%s': a value is not finite",
                               b->t[i].name);
            off += need;
        }
    }
    if (off != end) return gm_fail(err, GCOMP_E_STATE, "ps state: trailing bytes");
    off = PSS_HDR;
    for (size_t i = 0; i < b->nt; i++) {
        ps_tensor *pt = b->t[i].priv;
        off += PSS_REC;
        for (size_t j = 0; versions_bytes(pt) && j < pt->nparts; j++) {
            pt->part[j].version = version >= 2 ? gcomp__get64(p + off) : 0;
            off += version >= 2 ? 8 : 0;
        }
        for (size_t j = 0; pt && j < pt->nparts; j++) {
            ps_part *x = &pt->part[j];
            if (!owned(pt, x)) continue;
            const uint8_t *q = p + off;
            x->inited = gcomp__get32(q + 4) & 1u;
            x->sversion = gcomp__get64(q + 24);
            x->opt = (gcomp_mpi_ps_optimizer){gcomp__getf(q + 32), gcomp__getf(q + 36),
                                              gcomp__getf(q + 40), gcomp__getf(q + 44),
                                              (int)gcomp__get32(q + 48)};
            q += PSS_PART;
            float *s = x->store.p, *m = x->mom.p;
            for (size_t k = 0; k < x->n; k++, q += 4) s[k] = gcomp__getf(q);
            for (size_t k = 0; m && k < x->n; k++, q += 4) m[k] = gcomp__getf(q);
            off += part_bytes(x);
        }
    }
    return GCOMP_OK;
}

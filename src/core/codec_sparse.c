/*
 * codec_sparse.c - the generic "selector + value coder + index coder" pipeline.
 *
 * Every codec except the low-rank ones is this pipeline with a different selector
 * (topk, threshold, random-k, ...) or none (dense quantizers).  The payload is the
 * sparse section of docs/FORMAT.md:
 *
 *   u32 k | u32 nvals | u8 index coding | u8 value coder | u8 expand | u8 0 |
 *   u32 unit | u32 stride | u32 index bytes | index bytes | value bytes
 *
 * Encode makes one pass over the selected values (value coder) and, with feedback, writes
 * the residual x - decoded at exactly the positions that were sent; everything else in
 * the residual is already x.  A dense message whose value coder fuses the residual
 * (vcoder.encode_fused) gets e and g instead of x when the ef feedback left the sum to it
 * (c->x_add): the coder forms x in its own pass.  Decode validates the whole section (indices and
 * values) before it adds anything to the accumulator.
 */
#include "core/internal.h"

#define SECTION 24

bool gcomp__fuses_residual(const gcomp__spec *s) {
    return !s->codec->select && !s->codec->encode && s->vcoder && s->vcoder->encode_fused;
}

gcomp_status gcomp__sel_reserve(gcomp_compressor *c, size_t k, size_t nv, gcomp__selection *sel) {
    if (gcomp__buf_reserve(&c->sel_idx, (k ? k : 1) * sizeof(uint32_t)) != GCOMP_OK ||
        gcomp__buf_reserve(&c->sel_val, (nv ? nv : 1) * sizeof(float)) != GCOMP_OK)
        return GCOMP_E_NOMEM;
    sel->idx = c->sel_idx.p;
    sel->val = c->sel_val.p;
    return GCOMP_OK;
}

size_t gcomp__sparse_payload_bound(const gcomp_compressor *c) {
    const gcomp__vcoder *vc = c->spec.vcoder;
    size_t ix = c->codec->select ? gcomp__index_bound(c->max_entries, c->n) : 0;
    return SECTION + ix + vc->bound(&c->vp, c->max_values);
}

/* The residual x - decoded of a sent element, where the coder gave v - decoded(v) = r for
 * the value v the selector sent: r itself when v is x unscaled (exact; re-forming decoded =
 * v - r first could round past FLT_MAX and leave an infinite residual behind a finite
 * message: fuzz, regress/roundtrip/ternary-clip-residual-inf), else x - (v - r) (random-k,
 * bernoulli and importance send x scaled).  Keeps the largest |residual| bits in *mx. */
static inline float sent_residual(float x, float v, float r, uint32_t *mx) {
    float e = v == x ? r : x - (v - r);
    uint32_t b;
    memcpy(&b, &e, 4);
    b &= 0x7fffffffu;
    *mx = b > *mx ? b : *mx;
    return e;
}

/* Calls fn(j, pos) for the j-th value of a selection: its element position. */
#define FOR_EACH_POS(sel, n, BODY)                                                                 \
    do {                                                                                           \
        size_t j_ = 0;                                                                             \
        for (size_t e_ = 0; e_ < (sel)->k; e_++) {                                                 \
            size_t b_ = (sel)->idx[e_];                                                            \
            if ((sel)->expand == GCOMP__EXPAND_ELEM) {                                             \
                size_t j = j_++, pos = b_;                                                         \
                BODY;                                                                              \
            } else if ((sel)->expand == GCOMP__EXPAND_RUN) {                                       \
                size_t end_ = (b_ + 1) * (sel)->unit < (n) ? (b_ + 1) * (sel)->unit : (n);         \
                for (size_t pos = b_ * (sel)->unit; pos < end_; pos++) {                           \
                    size_t j = j_++;                                                               \
                    BODY;                                                                          \
                }                                                                                  \
            } else {                                                                               \
                for (size_t r_ = 0; r_ < (sel)->unit; r_++) {                                      \
                    size_t j = j_++, pos = b_ + r_ * (sel)->stride;                                \
                    BODY;                                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

gcomp_status gcomp__sparse_encode(gcomp_compressor *c, const float *x, float *res, uint8_t *payload,
                                  size_t cap, size_t *len) {
    const gcomp__vcoder *vc = c->spec.vcoder;
    gcomp__selection sel = {0};
    bool dense = c->codec->select == NULL;
    gcomp_status st;
    if (dense) {
        sel.k = sel.nvals = c->n;
        sel.val = (float *)x;
        sel.index_kind = GCOMP__IX_NONE;
        sel.unit = 1;
    } else {
        st = c->codec->select(c, x, &sel);
        if (st != GCOMP_OK) return st;
    }
    if (cap < SECTION) return GCOMP_E_DST_SIZE;
    uint8_t *p = payload + SECTION;
    size_t room = cap - SECTION, ilen = 0;
    unsigned kind = dense ? GCOMP__IX_NONE : sel.index_kind;
    if (kind == GCOMP__IX_SEEDED) {
        if (room < 8) return GCOMP_E_DST_SIZE;
        gcomp__put64(p, sel.seed_key);
        ilen = 8;
    } else if (!dense) {
        size_t universe = sel.expand == GCOMP__EXPAND_ELEM  ? c->n
                          : sel.expand == GCOMP__EXPAND_RUN ? (c->n + sel.unit - 1) / sel.unit
                                                            : sel.stride;
        st = gcomp__index_encode(sel.idx, sel.k, universe, p, room, &ilen, &kind);
        if (st != GCOMP_OK) return st;
    }
    p += ilen;
    room -= ilen;

    /* Values.  Dense: the residual is written in place by the coder.  Sparse: the coder
     * writes v - decoded(v) into a scratch array, scattered below. */
    uint64_t key = gcomp__stream(c->seed, c->step, 1);
    size_t vlen = 0;
    float *vres = NULL;
    if (res && !dense) {
        if (gcomp__buf_reserve(&c->sel_res, (sel.nvals ? sel.nvals : 1) * 4) != GCOMP_OK)
            return GCOMP_E_NOMEM;
        vres = c->sel_res.p;
    } else if (res) {
        vres = res;
    }
    if (dense && c->x_add) /* the feedback left e + g for the coder to form (fused) */
        st = vc->encode_fused(&c->vp, c->x_add, x, sel.nvals, vres, key, p, room, &vlen);
    else
        st = vc->encode(&c->vp, sel.val, sel.nvals, vres, key, p, room, &vlen);
    if (st != GCOMP_OK) return st;
    if (res && !dense) {
        const float *val = sel.val;
        uint32_t mx = 0;
        FOR_EACH_POS(&sel, c->n, res[pos] = sent_residual(x[pos], val[j], vres[j], &mx));
        if (mx >= 0x7f800000u) return GCOMP_E_NONFINITE; /* nothing committed */
    }

    gcomp__put32(payload, (uint32_t)sel.k);
    gcomp__put32(payload + 4, (uint32_t)sel.nvals);
    payload[8] = (uint8_t)kind;
    payload[9] = vc->id;
    payload[10] = (uint8_t)sel.expand;
    payload[11] = 0;
    gcomp__put32(payload + 12, dense ? 1 : sel.unit);
    gcomp__put32(payload + 16, sel.stride);
    gcomp__put32(payload + 20, (uint32_t)ilen);
    *len = SECTION + ilen + vlen;
    c->last = sel;
    c->last.index_kind = kind;
    c->last_dense = dense || sel.nvals == c->n;
    return GCOMP_OK;
}

typedef struct section {
    uint32_t k, nvals, unit, stride, ilen;
    uint8_t kind, vid, expand;
    const gcomp__vcoder *vc;
    const uint8_t *ix, *vals;
    size_t vlen;
} section;

static gcomp_status read_section(const uint8_t *payload, size_t len, size_t n, section *s) {
    if (len < SECTION) return GCOMP_E_CORRUPT;
    s->k = gcomp__get32(payload);
    s->nvals = gcomp__get32(payload + 4);
    s->kind = payload[8];
    s->vid = payload[9];
    s->expand = payload[10];
    s->unit = gcomp__get32(payload + 12);
    s->stride = gcomp__get32(payload + 16);
    s->ilen = gcomp__get32(payload + 20);
    if (payload[11] != 0 || s->ilen > len - SECTION) return GCOMP_E_CORRUPT;
    s->vc = gcomp__vcoder_by_id(s->vid);
    if (!s->vc) return GCOMP_E_CORRUPT;
    s->ix = payload + SECTION;
    s->vals = s->ix + s->ilen;
    s->vlen = len - SECTION - s->ilen;
    if (s->nvals > n) return GCOMP_E_CORRUPT;
    switch (s->expand) {
    case GCOMP__EXPAND_ELEM:
        if (s->unit != 1 || s->stride != 0 || s->nvals != s->k) return GCOMP_E_CORRUPT;
        break;
    case GCOMP__EXPAND_RUN:
        if (s->unit == 0 || s->stride != 0 || s->k > (n + s->unit - 1) / s->unit)
            return GCOMP_E_CORRUPT;
        break;
    case GCOMP__EXPAND_STRIDE:
        if (s->unit == 0 || s->stride == 0 || (uint64_t)s->unit * s->stride != n ||
            s->k > s->stride || (uint64_t)s->k * s->unit != s->nvals)
            return GCOMP_E_CORRUPT;
        break;
    default:
        return GCOMP_E_CORRUPT;
    }
    switch (s->kind) {
    case GCOMP__IX_NONE:
        if (s->expand != GCOMP__EXPAND_ELEM || s->k != n || s->ilen != 0) return GCOMP_E_CORRUPT;
        break;
    case GCOMP__IX_SEEDED:
        if (s->expand != GCOMP__EXPAND_ELEM || s->ilen != 8) return GCOMP_E_CORRUPT;
        break;
    case GCOMP__IX_BITMAP:
    case GCOMP__IX_VARINT:
    case GCOMP__IX_ELIAS_FANO:
        break;
    default:
        return GCOMP_E_CORRUPT;
    }
    return GCOMP_OK;
}

gcomp_status gcomp__sparse_info(const uint8_t *payload, size_t len, gcomp_message_info *info) {
    section s;
    gcomp_status st = read_section(payload, len, (size_t)info->n, &s);
    if (st != GCOMP_OK) return st;
    info->elements_sent = s.nvals;
    info->index_coding = gcomp__index_name(s.kind);
    info->value_coding = s.vc->name;
    return GCOMP_OK;
}

/* Order of the checks (DESIGN.md: the decoder never allocates past a limit): the section
 * header, then the index bytes against k and the value bytes against nvals, and only then
 * the workspace.  Allocating k + nvals entries from the header's counts first let a 68-byte
 * message ask for 5.7 GB (tests/fuzz/regress/decode/sparse_bigalloc.gcm) and fail with
 * GCOMP_E_NOMEM instead of GCOMP_E_CORRUPT.  Once the index length matches k (every coding
 * spends at least a bit per entry, gcomp__index_check_len) and the value coder has accepted
 * exactly nvals values, the workspace is at most a few bytes per message byte, or, for seeded
 * positions, 4 (k + nvals) <= 8 n bytes of a receiver that holds n floats.  Validation alone
 * (acc NULL) never regenerates seeded positions: k <= n is all they need to be valid, and
 * their n-bit scratch is sized by the header's n (512 MB for n = 2^32 - 1), not by the
 * message. */
gcomp_status gcomp__sparse_decode(const uint8_t *payload, size_t len, size_t n, float *acc,
                                  float scale, gcomp__buf *ws) {
    section s;
    gcomp_status st = read_section(payload, len, n, &s);
    if (st != GCOMP_OK) return st;
    if (s.kind == GCOMP__IX_NONE) return s.vc->decode(s.vals, s.vlen, n, acc, scale);
    size_t universe = s.expand == GCOMP__EXPAND_ELEM  ? n
                      : s.expand == GCOMP__EXPAND_RUN ? (n + s.unit - 1) / s.unit
                                                      : s.stride;
    if (s.kind == GCOMP__IX_SEEDED) {
        if (s.k > n) return GCOMP_E_CORRUPT;
    } else if ((st = gcomp__index_check_len(s.kind, s.ilen, s.k, universe)) != GCOMP_OK) {
        return st;
    }
    st = s.vc->decode(s.vals, s.vlen, s.nvals, NULL, 0.0f);
    if (st != GCOMP_OK) return st;
    if (s.kind == GCOMP__IX_SEEDED && !acc) return GCOMP_OK;

    /* Workspace: k indices, then nvals floats when values are added. */
    size_t ibytes = ((size_t)s.k * 4 + 63) & ~(size_t)63;
    size_t vbytes = acc ? (size_t)s.nvals * 4 : 0;
    if (gcomp__buf_reserve(ws, ibytes + vbytes + 64) != GCOMP_OK) return GCOMP_E_NOMEM;
    gcomp__selection sel = {0};
    sel.idx = ws->p;
    sel.val = (float *)(void *)((uint8_t *)ws->p + ibytes);
    sel.k = s.k;
    sel.nvals = s.nvals;
    sel.expand = s.expand;
    sel.unit = s.unit;
    sel.stride = s.stride;
    if (s.kind == GCOMP__IX_SEEDED) {
        gcomp__buf bits = {0};
        st = gcomp__seeded_indices(gcomp__get64(s.ix), n, s.k, sel.idx, &bits);
        gcomp__buf_free(&bits);
    } else {
        st = gcomp__index_decode(s.kind, s.ix, s.ilen, s.k, universe, sel.idx);
    }
    if (st != GCOMP_OK) return st;
    if (s.expand == GCOMP__EXPAND_RUN) { /* nvals must be what the runs cover */
        uint64_t total = 0;
        for (size_t e = 0; e < s.k; e++) {
            uint64_t b = sel.idx[e], end = (b + 1) * s.unit < n ? (b + 1) * s.unit : n;
            total += end - b * s.unit;
        }
        if (total != s.nvals) return GCOMP_E_CORRUPT;
    }
    if (!acc) return GCOMP_OK;
    memset(sel.val, 0, (size_t)s.nvals * 4);
    st = s.vc->decode(s.vals, s.vlen, s.nvals, sel.val, 1.0f);
    if (st != GCOMP_OK) return st;
    const float *val = sel.val;
    FOR_EACH_POS(&sel, n, acc[pos] += scale * val[j]);
    return GCOMP_OK;
}

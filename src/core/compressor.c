/*
 * compressor.c - the compressor object, the message header and the state blob.
 *
 * Message (docs/FORMAT.md, "header"), 40 bytes, little-endian:
 *   0 magic "GCmp" | 4 u8 version | 5 u8 header length | 6 u16 codec id | 8 u32 flags |
 *   12 u32 payload length | 16 u64 n | 24 u64 spec fingerprint | 32 u32 payload CRC-32C |
 *   36 u32 header CRC-32C (of bytes 0..35)
 * The header CRC is checked before the version, so a damaged header reads as corrupt and
 * a genuine newer version as unsupported (liblzma's rule).
 */
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>

#define MAGIC "GCmp"
#define STATE_MAGIC "GCst"
#define STATE_VERSION 1u
#define STATE_VERSION_CARRY 2u /* a version-1 blob plus the retune carry (only when pending) */

/* ---- creation ---------------------------------------------------------------------------- */

void gcomp_compressor_free(gcomp_compressor *c) {
    if (!c) return;
    if (c->codec && c->codec->fini) c->codec->fini(c);
    if (c->spec.feedback && c->spec.feedback->fini) c->spec.feedback->fini(c);
    gcomp__buf_free(&c->sel_idx);
    gcomp__buf_free(&c->sel_val);
    gcomp__buf_free(&c->sel_tmp);
    gcomp__buf_free(&c->sel_res);
    gcomp__buf_free(&c->scratch);
    gcomp__buf_free(&c->dec_ws);
    gcomp__free(c->carry);
    gcomp__free(c->carry_ws);
    gcomp__free(c);
}

gcomp_status gcomp__compressor_build(gcomp_compressor **out, const gcomp__spec *parsed, size_t n,
                                     size_t rows, size_t cols, gcomp_error *err) {
    *out = NULL;
    if (n == 0) return gcomp__fail(err, GCOMP_E_ARG, "tensor size n must be > 0");
    if (n > UINT32_MAX)
        return gcomp__fail(err, GCOMP_E_LIMIT, "tensor of %zu elements: at most 2^32-1", n);
    if (!gcomp__shape_holds(n, rows, cols))
        return gcomp__fail(err, GCOMP_E_ARG, "shape %zux%zu does not hold %zu elements", rows, cols,
                           n);
    gcomp_compressor *c = gcomp__calloc(sizeof *c);
    if (!c) return gcomp__fail(err, GCOMP_E_NOMEM, "out of memory creating a compressor");
    c->spec = *parsed;
    c->n = n;
    c->rows = rows;
    c->cols = cols;
    c->seed = (uint64_t)gcomp__spec_num(parsed, "seed", 0);
    c->vp.spec = &c->spec;
    c->vp.seed = c->seed;
    c->max_entries = c->max_values = n;
    const gcomp__feedback *fb = parsed->feedback;
    gcomp_status st;
    if (fb->init && (st = fb->init(c)) != GCOMP_OK) {
        gcomp_compressor_free(c);
        return gcomp__fail(err, st, "%s: cannot allocate feedback state for %zu elements",
                           parsed->codec->info.name, n);
    }
    c->codec = parsed->codec;
    if (c->codec->init) {
        gcomp_error local;
        local.message[0] = 0;
        st = c->codec->init(c, &local);
        if (st != GCOMP_OK) {
            gcomp_compressor_free(c);
            if (local.message[0]) return gcomp__fail(err, st, "%s", local.message);
            return gcomp__fail(err, st, "%s: %s", parsed->codec->info.name, gcomp_status_str(st));
        }
    }
    if (fb != &gcomp__feedback_none) {
        gcomp_error why;
        st = gcomp__ef_refusal(&c->spec, &c->vp, c->max_values, fb->info.name, why.message,
                               sizeof why.message);
        if (st != GCOMP_OK) {
            gcomp_compressor_free(c);
            return gcomp__fail(err, st, "%s", why.message);
        }
    }
    *out = c;
    return GCOMP_OK;
}

gcomp_status gcomp_compressor_create(gcomp_compressor **out, const char *spec, size_t n,
                                     size_t rows, size_t cols, gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "out must not be NULL");
    *out = NULL;
    if (!spec) return gcomp__fail(err, GCOMP_E_ARG, "spec must not be NULL");
    gcomp__spec parsed;
    gcomp_status st = gcomp__spec_parse(spec, &parsed, err);
    if (st != GCOMP_OK) return st;
    return gcomp__compressor_build(out, &parsed, n, rows, cols, err);
}

const char *gcomp_compressor_spec(const gcomp_compressor *c) {
    return c ? c->spec.canonical : NULL;
}
uint64_t gcomp_compressor_fingerprint(const gcomp_compressor *c) {
    return c ? c->spec.fingerprint : 0;
}
const gcomp_codec_info *gcomp_compressor_codec(const gcomp_compressor *c) {
    return c ? &c->codec->info : NULL;
}
size_t gcomp_compressor_size(const gcomp_compressor *c) {
    return c ? c->n : 0;
}
uint64_t gcomp_compressor_step(const gcomp_compressor *c) {
    return c ? c->step : 0;
}

gcomp_status gcomp_compressor_skip_step(gcomp_compressor *c) {
    if (!c) return GCOMP_E_ARG;
    if (c->codec->busy && c->codec->busy(c)) return GCOMP_E_PROTOCOL;
    c->step++;
    return GCOMP_OK;
}

gcomp_status gcomp_compressor_set_epoch(gcomp_compressor *c, double epoch) {
    if (!c || !(epoch >= 0.0) || epoch > 1e15) return GCOMP_E_ARG;
    c->epoch = epoch;
    return GCOMP_OK;
}

const float *gcomp_compressor_residual(const gcomp_compressor *c) {
    if (!c) return NULL;
    if (c->spec.feedback->residual) return c->spec.feedback->residual(c);
    return c->carry; /* a retune's held-back vector, waiting for the next message */
}

size_t gcomp_encode_bound(const gcomp_compressor *c) {
    if (!c) return 0;
    size_t p =
        c->codec->payload_bound ? c->codec->payload_bound(c) : gcomp__sparse_payload_bound(c);
    return GCOMP_HEADER_SIZE + p;
}

/* ---- encode -------------------------------------------------------------------------------- */

gcomp_status gcomp_encode(gcomp_compressor *c, const float *grad, void *dst, size_t dst_cap,
                          size_t *dst_len) {
    if (!c || !grad || !dst || !dst_len) return GCOMP_E_ARG;
    *dst_len = 0;
    if (dst_cap < GCOMP_HEADER_SIZE) return GCOMP_E_DST_SIZE;
    uint64_t t0 = gcomp__now_ns();
    const float *x;
    float *res;
    c->x_add = NULL;
    if (c->carry) { /* a retune left a held-back vector: it joins this message (retune.c) */
        for (size_t i = 0; i < c->n; i++) c->carry_ws[i] = grad[i] + c->carry[i];
        grad = c->carry_ws;
    }
    gcomp_status st = c->spec.feedback->prepare(c, grad, &x, &res);
    if (st != GCOMP_OK) return st;
    uint8_t *h = dst, *payload = h + GCOMP_HEADER_SIZE;
    size_t cap = dst_cap - GCOMP_HEADER_SIZE;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    size_t plen = 0;
    st = c->codec->encode ? c->codec->encode(c, x, res, payload, cap, &plen)
                          : gcomp__sparse_encode(c, x, res, payload, cap, &plen);
    if (st != GCOMP_OK) return st;

    memcpy(h, MAGIC, 4);
    h[4] = GCOMP_FORMAT_VERSION;
    h[5] = GCOMP_HEADER_SIZE;
    gcomp__put16(h + 6, c->codec->info.id);
    gcomp__put32(h + 8, 0);
    gcomp__put32(h + 12, (uint32_t)plen);
    gcomp__put64(h + 16, c->n);
    gcomp__put64(h + 24, c->spec.fingerprint);
    gcomp__put32(h + 32, gcomp__crc32c(0, payload, plen));
    gcomp__put32(h + 36, gcomp__crc32c(0, h, 36));

    if (c->spec.feedback->commit) c->spec.feedback->commit(c);
    if (c->carry) {
        gcomp__free(c->carry);
        gcomp__free(c->carry_ws);
        c->carry = c->carry_ws = NULL;
    }
    c->step++;
    *dst_len = GCOMP_HEADER_SIZE + plen;
    c->stats.messages++;
    c->stats.bytes_in += 4 * (uint64_t)c->n;
    c->stats.bytes_out += *dst_len;
    c->stats.elements_sent += c->last.nvals;
    c->stats.encode_ns += gcomp__now_ns() - t0;
    return GCOMP_OK;
}

/* ---- decode -------------------------------------------------------------------------------- */

typedef struct header {
    uint16_t codec_id;
    uint32_t flags, payload_len, payload_crc;
    uint64_t n, fingerprint;
    const uint8_t *payload;
} header;

static gcomp_status read_header(const void *msg, size_t len, header *hd) {
    const uint8_t *h = msg;
    if (!msg) return GCOMP_E_ARG;
    if (len < 4) return GCOMP_E_TRUNCATED;
    if (memcmp(h, MAGIC, 4) != 0) return GCOMP_E_BAD_MAGIC;
    if (len < GCOMP_HEADER_SIZE) return GCOMP_E_TRUNCATED;
    size_t hlen = h[5];
    if (hlen < GCOMP_HEADER_SIZE) return GCOMP_E_CORRUPT;
    if (len < hlen) return GCOMP_E_TRUNCATED;
    if (gcomp__crc32c(0, h, hlen - 4) != gcomp__get32(h + hlen - 4)) return GCOMP_E_CHECKSUM;
    if (h[4] != GCOMP_FORMAT_VERSION)
        return h[4] > GCOMP_FORMAT_VERSION ? GCOMP_E_VERSION : GCOMP_E_CORRUPT;
    if (hlen != GCOMP_HEADER_SIZE) return GCOMP_E_CORRUPT;
    hd->codec_id = gcomp__get16(h + 6);
    hd->flags = gcomp__get32(h + 8);
    hd->payload_len = gcomp__get32(h + 12);
    hd->n = gcomp__get64(h + 16);
    hd->fingerprint = gcomp__get64(h + 24);
    hd->payload_crc = gcomp__get32(h + 32);
    hd->payload = h + GCOMP_HEADER_SIZE;
    if (hd->flags != 0) return GCOMP_E_CORRUPT; /* reserved bits */
    if (hd->n == 0 || hd->n > UINT32_MAX) return GCOMP_E_CORRUPT;
    if (len - GCOMP_HEADER_SIZE < hd->payload_len) return GCOMP_E_TRUNCATED;
    if (len - GCOMP_HEADER_SIZE > hd->payload_len) return GCOMP_E_CORRUPT; /* trailing bytes */
    if (gcomp__crc32c(0, hd->payload, hd->payload_len) != hd->payload_crc) return GCOMP_E_CHECKSUM;
    if (!gcomp__codec_by_id(hd->codec_id)) return GCOMP_E_CODEC_ID;
    return GCOMP_OK;
}

static gcomp_status decode_with(const header *hd, float *acc, size_t n, float scale,
                                gcomp__buf *ws) {
    if (acc && hd->n != n) return GCOMP_E_MISMATCH;
    /* An infinite scale turns every value sent into +-Inf (and 0 * Inf into NaN): never a
     * sum a caller meant, so it is refused like NaN, before the message is read. */
    if (!isfinite(scale)) return GCOMP_E_ARG;
    const gcomp__codec *codec = gcomp__codec_by_id(hd->codec_id);
    if (codec->decode)
        return codec->decode(hd->payload, hd->payload_len, (size_t)hd->n, acc, scale, ws);
    return gcomp__sparse_decode(hd->payload, hd->payload_len, (size_t)hd->n, acc, scale, ws);
}

gcomp_status gcomp_decode_add(const void *msg, size_t len, float *acc, size_t n, float scale) {
    header hd;
    gcomp_status st = read_header(msg, len, &hd);
    if (st != GCOMP_OK) return st;
    gcomp__buf ws = {0};
    st = decode_with(&hd, acc, n, scale, &ws);
    gcomp__buf_free(&ws);
    return st;
}

gcomp_status gcomp_compressor_decode_add(gcomp_compressor *c, const void *msg, size_t len,
                                         float *acc, float scale) {
    if (!c || !acc) return GCOMP_E_ARG;
    uint64_t t0 = gcomp__now_ns();
    header hd;
    gcomp_status st = read_header(msg, len, &hd);
    if (st != GCOMP_OK) return st;
    if (hd.fingerprint != c->spec.fingerprint || hd.n != c->n || hd.codec_id != c->codec->info.id)
        return GCOMP_E_MISMATCH;
    st = decode_with(&hd, acc, c->n, scale, &c->dec_ws);
    if (st == GCOMP_OK) {
        c->stats.decoded++;
        c->stats.decode_ns += gcomp__now_ns() - t0;
    }
    return st;
}

gcomp_status gcomp_message_inspect(const void *msg, size_t len, gcomp_message_info *info) {
    if (!info) return GCOMP_E_ARG;
    memset(info, 0, sizeof *info);
    info->codec_name = "?";
    info->index_coding = "";
    info->value_coding = "";
    if (msg && len >= 6 && memcmp(msg, MAGIC, 4) == 0)
        info->format_version = ((const uint8_t *)msg)[4];
    header hd;
    gcomp_status st = read_header(msg, len, &hd);
    if (st != GCOMP_OK) return st;
    const gcomp__codec *codec = gcomp__codec_by_id(hd.codec_id);
    info->codec_id = hd.codec_id;
    info->codec_name = codec->info.name;
    info->flags = hd.flags;
    info->n = hd.n;
    info->payload_len = hd.payload_len;
    info->fingerprint = hd.fingerprint;
    info->payload_crc = hd.payload_crc;
    if (!codec->decode) return gcomp__sparse_info(hd.payload, hd.payload_len, info);
    return codec->inspect ? codec->inspect(hd.payload, hd.payload_len, info) : GCOMP_OK;
}

/* ---- state ----------------------------------------------------------------------------------- */
/*
 * Blob (docs/FORMAT.md, "state"): "GCst" | u32 version | u32 total length | u32 spec
 * length | u64 n | u64 rows | u64 cols | u64 step | f64 epoch | spec bytes |
 * u32 feedback length | feedback bytes | u32 codec length | codec bytes | u32 CRC-32C of
 * everything before it.  Version 2 (written only while a retune's carry is pending, so
 * every other blob stays version 1) adds u32 carry length | carry bytes (n floats) before
 * the CRC.
 */

#define STATE_FIXED 56

static size_t fb_size(const gcomp_compressor *c) {
    return c->spec.feedback->state_size ? c->spec.feedback->state_size(c) : 0;
}
static size_t codec_size(const gcomp_compressor *c) {
    return c->codec->state_size ? c->codec->state_size(c) : 0;
}

static size_t carry_size(const gcomp_compressor *c) {
    return c->carry ? 4 + c->n * sizeof(float) : 0;
}

size_t gcomp_state_bound(const gcomp_compressor *c) {
    if (!c) return 0;
    return STATE_FIXED + strlen(c->spec.canonical) + 4 + fb_size(c) + 4 + codec_size(c) +
           carry_size(c) + 4;
}

gcomp_status gcomp_state_save(const gcomp_compressor *c, void *dst, size_t cap, size_t *len) {
    if (!c || !dst || !len) return GCOMP_E_ARG;
    size_t total = gcomp_state_bound(c);
    if (cap < total) return GCOMP_E_DST_SIZE;
    if (total > UINT32_MAX) return GCOMP_E_LIMIT;
    uint8_t *p = dst;
    size_t sl = strlen(c->spec.canonical), fl = fb_size(c), cl = codec_size(c);
    memcpy(p, STATE_MAGIC, 4);
    gcomp__put32(p + 4, c->carry ? STATE_VERSION_CARRY : STATE_VERSION);
    gcomp__put32(p + 8, (uint32_t)total);
    gcomp__put32(p + 12, (uint32_t)sl);
    gcomp__put64(p + 16, c->n);
    gcomp__put64(p + 24, c->rows);
    gcomp__put64(p + 32, c->cols);
    gcomp__put64(p + 40, c->step);
    memcpy(p + 48, &c->epoch, 8);
    uint8_t *q = p + STATE_FIXED;
    memcpy(q, c->spec.canonical, sl);
    q += sl;
    gcomp__put32(q, (uint32_t)fl);
    if (fl) c->spec.feedback->state_save(c, q + 4);
    q += 4 + fl;
    gcomp__put32(q, (uint32_t)cl);
    if (cl) c->codec->state_save(c, q + 4);
    q += 4 + cl;
    if (c->carry) {
        gcomp__put32(q, (uint32_t)(c->n * sizeof(float)));
        memcpy(q + 4, c->carry, c->n * sizeof(float));
        q += carry_size(c);
    }
    gcomp__put32(q, gcomp__crc32c(0, p, (size_t)(q - p)));
    *len = total;
    return GCOMP_OK;
}

typedef struct blob {
    uint64_t n, rows, cols, step;
    double epoch;
    const char *spec;
    size_t spec_len;
    const uint8_t *fb, *cs, *carry;
    size_t fb_len, cs_len, carry_len;
} blob;

static gcomp_status read_blob(const void *src, size_t len, blob *b) {
    const uint8_t *p = src;
    if (!src) return GCOMP_E_ARG;
    if (len < STATE_FIXED + 12)
        return len >= 4 && memcmp(p, STATE_MAGIC, 4) ? GCOMP_E_BAD_MAGIC : GCOMP_E_STATE;
    if (memcmp(p, STATE_MAGIC, 4) != 0) return GCOMP_E_BAD_MAGIC;
    if (gcomp__get32(p + 8) != len) return GCOMP_E_STATE;
    if (gcomp__crc32c(0, p, len - 4) != gcomp__get32(p + len - 4)) return GCOMP_E_CHECKSUM;
    const uint32_t version = gcomp__get32(p + 4);
    if (version != STATE_VERSION && version != STATE_VERSION_CARRY)
        return version > STATE_VERSION_CARRY ? GCOMP_E_VERSION : GCOMP_E_STATE;
    b->spec_len = gcomp__get32(p + 12);
    b->n = gcomp__get64(p + 16);
    b->rows = gcomp__get64(p + 24);
    b->cols = gcomp__get64(p + 32);
    b->step = gcomp__get64(p + 40);
    memcpy(&b->epoch, p + 48, 8);
    size_t off = STATE_FIXED;
    if (b->spec_len >= GCOMP__SPEC_MAX || b->spec_len > len - off - 12) return GCOMP_E_STATE;
    b->spec = (const char *)p + off;
    off += b->spec_len;
    b->fb_len = gcomp__get32(p + off);
    if (b->fb_len > len - off - 12) return GCOMP_E_STATE;
    b->fb = p + off + 4;
    off += 4 + b->fb_len;
    b->cs_len = gcomp__get32(p + off);
    b->carry = NULL;
    b->carry_len = 0;
    if (version == STATE_VERSION_CARRY) {
        /* off <= len - 8 here: the carry's length word needs 4 more bytes than that */
        if (len - off < 12 || b->cs_len > len - off - 12) return GCOMP_E_STATE;
        b->cs = p + off + 4;
        off += 4 + b->cs_len;
        b->carry_len = gcomp__get32(p + off);
        if (b->carry_len != len - off - 8 || b->carry_len != 4 * b->n) return GCOMP_E_STATE;
        b->carry = p + off + 4;
    } else {
        if (b->cs_len != len - off - 8) return GCOMP_E_STATE;
        b->cs = p + off + 4;
    }
    /* The fixed fields must describe a tensor a compressor can have (create's own checks,
     * which would otherwise answer GCOMP_E_ARG or GCOMP_E_LIMIT for a damaged blob), the
     * epoch one that set_epoch accepts, and the spec text no NUL (it would parse as its
     * prefix). */
    if (b->n == 0 || b->n > UINT32_MAX) return GCOMP_E_STATE;
    if ((b->rows || b->cols) && (b->rows == 0 || b->cols == 0 || b->rows > b->n || b->n % b->rows ||
                                 b->n / b->rows != b->cols))
        return GCOMP_E_STATE;
    if (!(b->epoch >= 0.0) || b->epoch > 1e15) return GCOMP_E_STATE;
    if (memchr(b->spec, 0, b->spec_len)) return GCOMP_E_STATE;
    return GCOMP_OK;
}

gcomp_status gcomp_state_load(gcomp_compressor *c, const void *src, size_t len) {
    if (!c) return GCOMP_E_ARG;
    blob b;
    gcomp_status st = read_blob(src, len, &b);
    if (st != GCOMP_OK) return st;
    if (b.n != c->n || b.rows != c->rows || b.cols != c->cols ||
        b.spec_len != strlen(c->spec.canonical) || memcmp(b.spec, c->spec.canonical, b.spec_len))
        return GCOMP_E_MISMATCH;
    if (b.fb_len != fb_size(c) || b.cs_len != codec_size(c)) return GCOMP_E_STATE;
    /* A retune leaves a carry only in a spec that has nowhere else to keep it (retune.c) */
    if (b.carry && gcomp__keeps_held(c)) return GCOMP_E_STATE;
    float *carry = NULL, *carry_ws = NULL;
    if (b.carry) { /* checked and allocated before anything changes */
        for (size_t i = 0; i < c->n; i++)
            if ((gcomp__get32(b.carry + 4 * i) & 0x7f800000u) == 0x7f800000u) return GCOMP_E_STATE;
        carry = gcomp__alloc(b.carry_len);
        carry_ws = gcomp__alloc(b.carry_len);
        if (!carry || !carry_ws) {
            gcomp__free(carry);
            gcomp__free(carry_ws);
            return GCOMP_E_NOMEM;
        }
        memcpy(carry, b.carry, b.carry_len);
    }
    /* Feedback first, codec second; if the codec part is refused, put feedback back. */
    uint8_t *backup = NULL;
    if (b.fb_len) {
        if (b.cs_len) {
            backup = gcomp__alloc(b.fb_len);
            if (!backup) {
                gcomp__free(carry);
                gcomp__free(carry_ws);
                return GCOMP_E_NOMEM;
            }
            c->spec.feedback->state_save(c, backup);
        }
        st = c->spec.feedback->state_load(c, b.fb, b.fb_len);
        if (st != GCOMP_OK) {
            gcomp__free(backup);
            gcomp__free(carry);
            gcomp__free(carry_ws);
            return st;
        }
    }
    if (b.cs_len) {
        st = c->codec->state_load(c, b.cs, b.cs_len);
        if (st != GCOMP_OK) {
            if (backup) c->spec.feedback->state_load(c, backup, b.fb_len);
            gcomp__free(backup);
            gcomp__free(carry);
            gcomp__free(carry_ws);
            return st;
        }
    }
    gcomp__free(backup);
    gcomp__free(c->carry);
    gcomp__free(c->carry_ws);
    c->carry = carry;
    c->carry_ws = carry_ws;
    c->step = b.step;
    c->epoch = b.epoch;
    return GCOMP_OK;
}

gcomp_status gcomp_compressor_from_state(gcomp_compressor **out, const void *src, size_t len,
                                         gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "out must not be NULL");
    *out = NULL;
    blob b;
    gcomp_status st = read_blob(src, len, &b);
    if (st != GCOMP_OK) return gcomp__fail(err, st, "state: %s", gcomp_status_str(st));
    char spec[GCOMP__SPEC_MAX];
    memcpy(spec, b.spec, b.spec_len);
    spec[b.spec_len] = 0;
    gcomp__spec parsed;
    st = gcomp__spec_parse(spec, &parsed, err);
    if (st != GCOMP_OK) return st;
    /* The sections must have the sizes this spec and shape keep, checked before create
     * allocates state for n elements: a blob of a few bytes that claims n = 2^32 - 1 would
     * otherwise cost tens of GB and fail with GCOMP_E_NOMEM instead of GCOMP_E_STATE.  The
     * state_size functions read only the spec and the shape (internal.h), so a compressor
     * with no state answers them. */
    gcomp_compressor *shell = gcomp__calloc(sizeof *shell);
    if (!shell) return gcomp__fail(err, GCOMP_E_NOMEM, "state: out of memory");
    shell->spec = parsed;
    shell->codec = parsed.codec;
    shell->n = (size_t)b.n;
    shell->rows = (size_t)b.rows;
    shell->cols = (size_t)b.cols;
    bool sized = b.fb_len == fb_size(shell) && b.cs_len == codec_size(shell);
    gcomp__free(shell);
    if (!sized)
        return gcomp__fail(err, GCOMP_E_STATE,
                           "state: sections do not match '%s' for %llu elements", spec,
                           (unsigned long long)b.n);
    gcomp_compressor *c;
    st = gcomp__compressor_build(&c, &parsed, (size_t)b.n, (size_t)b.rows, (size_t)b.cols, err);
    if (st != GCOMP_OK) return st;
    st = gcomp_state_load(c, src, len);
    if (st != GCOMP_OK) {
        gcomp_compressor_free(c);
        return gcomp__fail(err, st, "state: %s", gcomp_status_str(st));
    }
    *out = c;
    return GCOMP_OK;
}

void gcomp_state_reset(gcomp_compressor *c) {
    if (!c) return;
    if (c->spec.feedback->state_reset) c->spec.feedback->state_reset(c);
    if (c->codec->state_reset) c->codec->state_reset(c);
    gcomp__free(c->carry);
    gcomp__free(c->carry_ws);
    c->carry = c->carry_ws = NULL;
    c->step = 0;
    c->epoch = 0;
}

/* ---- statistics --------------------------------------------------------------------------------
 */

void gcomp_compressor_stats(const gcomp_compressor *c, gcomp_stats *out) {
    if (!out) return;
    if (c)
        *out = c->stats;
    else
        memset(out, 0, sizeof *out);
}

void gcomp_compressor_stats_reset(gcomp_compressor *c) {
    if (c) memset(&c->stats, 0, sizeof c->stats);
}

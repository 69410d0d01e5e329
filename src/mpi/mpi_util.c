/*
 * mpi_util.c - small pieces the MPI layer needs beyond libgradcomp's public API and the
 * utilities it shares with the core (src/common/common.h: errors, buffers, the clock,
 * scalar half casts, varints, random-k positions).
 *
 * - Wait-loop backoff, and FNV-1a over specs and names at set-up.
 * - The layer's allocation wrappers over libgradcomp's allocator, and the test hook that
 *   fails its N-th allocation (tests/mpi/test_mpi_nomem.c).
 * - Vector half casts and the MPI_Op that sums f16/bf16 words.  The op widens each pair
 *   to float, adds and rounds back (nearest even; f16 saturates at +-65504 like the f16
 *   value coder, so a large partial sum clips instead of poisoning every rank with Inf).
 *   It is the only arithmetic inside an MPI_Op in this library: nothing is ever decoded
 *   there (an MPI_Op sees raw words in arbitrary pieces and cannot report errors).
 *   Rejected: summing in f32 (twice the bytes on the wire: the point of f16 is lost).
 * - The header fields and the dense/seeded value layout of docs/FORMAT.md, read
 *   directly: the layout is normative, and the allreduce of a linear codec needs to know
 *   where the values are.  CRCs are left to gcomp_decode_add, which checks them before
 *   it writes anything.
 * - The slice format of the sparse allreduce (docs/FORMAT.md, "MPI sparse-allreduce
 *   slice"): the non-zeros of one region of a rank's decoded contribution as
 *   (LEB128 gap, f32 value) pairs, or the region dense when that is smaller (SparCML's
 *   switch to dense when a sparse vector fills up).  Values travel as f32 so the owner
 *   sums exactly what each rank's decoder produced.  Rejected: re-encoding each slice
 *   with the tensor's codec (its k is per tensor, a slice has whatever the selection
 *   left in that region, and a lossy value coder would change the numbers again).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nanosleep when built outside CMake */
#endif
#include "mpi_internal.h"

#include <sched.h>
#include <time.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

void gm_backoff(unsigned *spins, uint64_t waited_ns) {
    /* MPI moves non-blocking collectives only inside MPI calls, one round of the
     * algorithm per call at best (a pipelined reduce of 8 MB is a hundred rounds), so a
     * wait first polls with sched_yield - which still lets a rank on the same core run,
     * as Open MPI's own mpi_yield_when_idle does.  Only a wait that has already lasted
     * 20 ms (a slow peer, a long transfer) sleeps between polls, 50 us: short against
     * the wait, and the socket buffers keep a 1 Gbit link busy for longer than that. */
    (*spins)++;
    if (waited_ns < 20000000ull) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000L};
    nanosleep(&ts, NULL);
}

char *gm_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = gm_alloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

gcomp_status gm_grow(void **p, size_t old, size_t want) {
    void *q = gm_alloc(want);
    if (!q) return GCOMP_E_NOMEM;
    if (*p && old) memcpy(q, *p, old < want ? old : want);
    gm_free(*p);
    *p = q;
    return GCOMP_OK;
}

size_t gcomp__mpi_test_fail_alloc_after(size_t n) {
    size_t left = gcomp__alloc_fail_after;
    gcomp__alloc_fail_after = n;
    return left;
}

uint64_t gm_fnv1a(const void *p, size_t len, uint64_t h) {
    const uint8_t *s = p;
    if (!h) h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

/* ---- half precision ------------------------------------------------------------------- */

/* Eight running maxima: GCC 12 at -O2 vectorises this form (8 lanes: 0.32 ms for 4M
 * floats with -march=native, faster than memcpy) but not a single running maximum
 * (2.35 ms). */
bool gm_finite(const float *x, size_t n) {
    uint32_t m[8] = {0}, mx = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            uint32_t u = gm_abs_bits(x[i + (size_t)j]);
            m[j] = u > m[j] ? u : m[j];
        }
    for (; i < n; i++) {
        uint32_t u = gm_abs_bits(x[i]);
        mx = u > mx ? u : mx;
    }
    for (int j = 0; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    return mx < GM_INF_BITS;
}

uint32_t gm_scale_max(float *out, const float *in, size_t n, float scale) {
    uint32_t m[8] = {0}, mx = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            float y = scale * in[i + (size_t)j];
            uint32_t u = gm_abs_bits(y);
            out[i + (size_t)j] = y;
            m[j] = u > m[j] ? u : m[j];
        }
    for (; i < n; i++) {
        float y = scale * in[i];
        uint32_t u = gm_abs_bits(y);
        out[i] = y;
        mx = u > mx ? u : mx;
    }
    for (int j = 0; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    return mx;
}

void gm_halves_to_f32(const uint16_t *in, size_t n, int bf16, float scale, float *out) {
    size_t i = 0;
    if (bf16) {
        for (; i < n; i++) out[i] = scale * gm_bf16_to_f32(in[i]);
        return;
    }
#if defined(__F16C__)
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_cvtph_ps(h)));
    }
#endif
    for (; i < n; i++) out[i] = scale * gm_f16_to_f32(in[i]);
}

void gm_f32_to_halves(const float *in, size_t n, int bf16, uint16_t *out) {
    size_t i = 0;
    if (bf16) {
        for (; i < n; i++) out[i] = gm_f32_to_bf16(in[i]);
        return;
    }
#if defined(__F16C__)
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(in + i), lo), hi);
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < n; i++) out[i] = gm_f32_to_f16(in[i]);
}

void gm_op_f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    size_t n = *len > 0 ? (size_t)*len : 0, i = 0;
#if defined(__F16C__)
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(a + i)));
        __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b + i)));
        __m256 s = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(x, y), lo), hi);
        _mm_storeu_si128((__m128i *)(void *)(b + i),
                         _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < n; i++) b[i] = gm_f32_to_f16(gm_f16_to_f32(a[i]) + gm_f16_to_f32(b[i]));
}

void gm_op_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    size_t n = *len > 0 ? (size_t)*len : 0;
    for (size_t i = 0; i < n; i++)
        b[i] = gm_f32_to_bf16(gm_bf16_to_f32(a[i]) + gm_bf16_to_f32(b[i]));
}

/* ---- wire format fields ------------------------------------------------------------------ */

gcomp_status gm_read_hdr(const void *msg, size_t len, gm_hdr *h) {
    const uint8_t *p = msg;
    if (!msg || len < 4) return GCOMP_E_TRUNCATED;
    if (memcmp(p, "GCmp", 4) != 0) return GCOMP_E_BAD_MAGIC;
    if (len < GM_HDR) return GCOMP_E_TRUNCATED;
    h->codec_id = gcomp__get16(p + 6);
    h->payload_len = gcomp__get32(p + 12);
    h->n = gcomp__get64(p + 16);
    h->fingerprint = gcomp__get64(p + 24);
    return GCOMP_OK;
}

gcomp_status gm_decode_checked(gcomp_compressor *c, const void *msg, size_t len, uint64_t fp,
                               size_t n, float *acc, float scale) {
    gm_hdr h;
    gcomp_status st = gm_read_hdr(msg, len, &h);
    if (st != GCOMP_OK) return st;
    if (h.fingerprint != fp || h.n != n) return GCOMP_E_MISMATCH;
    if (c && gcomp_compressor_size(c) == n && gcomp_compressor_fingerprint(c) == fp)
        return gcomp_compressor_decode_add(c, msg, len, acc, scale);
    return gcomp_decode_add(msg, len, acc, n, scale);
}

gcomp_status gm_linear_values(const void *msg, size_t len, size_t n, int vid, const uint8_t **vals,
                              size_t *nvals, uint64_t *key) {
    const uint8_t *p = msg;
    gm_hdr h;
    gcomp_status st = gm_read_hdr(msg, len, &h);
    if (st != GCOMP_OK) return st;
    if (h.n != n || (uint64_t)h.payload_len + GM_HDR != len || h.payload_len < GM_SECTION)
        return GCOMP_E_CORRUPT;
    const uint8_t *s = p + GM_HDR;
    uint32_t k = gcomp__get32(s), nv = gcomp__get32(s + 4), ilen = gcomp__get32(s + 20);
    uint8_t kind = s[8], wire_vid = s[9], expand = s[10];
    size_t width = gm_vid_width(vid);
    if (wire_vid != (uint8_t)vid || expand != 0 || s[11] != 0 || nv != k || nv > n)
        return GCOMP_E_UNSUPPORTED;
    if (kind == 0) {
        if (k != n || ilen != 0) return GCOMP_E_UNSUPPORTED;
        *key = 0;
    } else if (kind == 4) {
        if (ilen != 8) return GCOMP_E_UNSUPPORTED;
        *key = gcomp__get64(s + GM_SECTION);
    } else {
        return GCOMP_E_UNSUPPORTED;
    }
    if ((uint64_t)GM_SECTION + ilen + (uint64_t)nv * width != h.payload_len) return GCOMP_E_CORRUPT;
    *vals = s + GM_SECTION + ilen;
    *nvals = nv;
    return GCOMP_OK;
}

/* ---- slices ------------------------------------------------------------------------------ */

static inline uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

size_t gm_slice_encode(float *x, size_t len, uint8_t *dst) {
    if (len == 0) return 0;
    const size_t dense = GM_SLICE_HDR + 4 * len;
    size_t p = GM_SLICE_HDR, m = 0, i = 0, prev = (size_t)-1;
    bool f16ok = true, bf16ok = true; /* every value exact in that format */
    while (i < len) {
        /* Skip runs of zeros 16 at a time: a selection leaves almost everything zero. */
        if (i + 16 <= len) {
            uint32_t any = 0;
            for (int j = 0; j < 16; j++) any |= fbits(x[i + (size_t)j]);
            if ((any & 0x7fffffffu) == 0) {
                i += 16;
                continue;
            }
        }
        size_t end = i + 16 <= len ? i + 16 : len;
        for (; i < end; i++) {
            if ((fbits(x[i]) & 0x7fffffffu) == 0) continue;
            uint32_t gap = (uint32_t)(i - prev - 1);
            if (p + gcomp__varint_size(gap) + 4 >= dense) goto go_dense;
            p += gcomp__varint_put(dst + p, gap);
            memcpy(dst + p, &x[i], 4);
            p += 4;
            f16ok = f16ok && gm_f16_to_f32(gm_f32_to_f16(x[i])) == x[i];
            bf16ok = bf16ok && (fbits(x[i]) & 0xffffu) == 0;
            x[i] = 0.0f;
            prev = i;
            m++;
        }
    }
    if (m == 0) return 0;
    dst[0] = GM_SLICE_SPARSE_F32;
    if (f16ok || bf16ok) {
        /* The values came from a half value coder: send them as halves, exactly.  The
         * stream only shrinks as it is rewritten, so in place from the front is safe. */
        size_t q = GM_SLICE_HDR, w = GM_SLICE_HDR;
        while (q < p) {
            uint32_t gap = 0;
            size_t used = gcomp__varint_get(dst + q, p - q, &gap);
            memmove(dst + w, dst + q, used);
            q += used;
            w += used;
            float v;
            memcpy(&v, dst + q, 4);
            q += 4;
            uint16_t h = f16ok ? gm_f32_to_f16(v) : (uint16_t)(fbits(v) >> 16);
            memcpy(dst + w, &h, 2);
            w += 2;
        }
        p = w;
        dst[0] = f16ok ? GM_SLICE_SPARSE_F16 : GM_SLICE_SPARSE_BF16;
    }
    dst[1] = dst[2] = dst[3] = 0;
    memcpy(dst + 4, &(uint32_t){(uint32_t)m}, 4);
    return p;

go_dense : {
    /* Put back what was taken, then send the region as it is. */
    size_t q = GM_SLICE_HDR, pos = (size_t)-1;
    while (q < p) {
        uint32_t gap = 0;
        q += gcomp__varint_get(dst + q, p - q, &gap);
        pos = pos + 1 + gap;
        memcpy(&x[pos], dst + q, 4);
        q += 4;
    }
    dst[0] = GM_SLICE_DENSE_F32;
    dst[1] = dst[2] = dst[3] = 0;
    memcpy(dst + 4, &(uint32_t){(uint32_t)len}, 4);
    memcpy(dst + GM_SLICE_HDR, x, 4 * len);
    memset(x, 0, 4 * len);
    return dense;
}
}

gcomp_status gm_slice_decode_add(const uint8_t *src, size_t n, size_t len, float *acc) {
    if (n == 0) return GCOMP_OK; /* nothing from this rank in this region */
    if (n < GM_SLICE_HDR || src[1] || src[2] || src[3]) return GCOMP_E_CORRUPT;
    uint32_t m = gcomp__get32(src + 4);
    uint8_t kind = src[0];
    if (kind == GM_SLICE_DENSE_F32) {
        if (m != len || n != GM_SLICE_HDR + 4 * (size_t)len) return GCOMP_E_CORRUPT;
        for (size_t i = 0; i < len; i++)
            if ((gcomp__get32(src + GM_SLICE_HDR + 4 * i) & 0x7f800000u) == 0x7f800000u)
                return GCOMP_E_CORRUPT;
        for (size_t i = 0; i < len; i++) {
            float v;
            memcpy(&v, src + GM_SLICE_HDR + 4 * i, 4);
            acc[i] += v;
        }
        return GCOMP_OK;
    }
    if (kind != GM_SLICE_SPARSE_F32 && kind != GM_SLICE_SPARSE_F16 && kind != GM_SLICE_SPARSE_BF16)
        return GCOMP_E_CORRUPT;
    if (m == 0 || m > len) return GCOMP_E_CORRUPT;
    size_t width = kind == GM_SLICE_SPARSE_F32 ? 4 : 2;
    /* Validate everything before the first write. */
    size_t q = GM_SLICE_HDR;
    uint64_t pos = (uint64_t)-1;
    for (uint32_t e = 0; e < m; e++) {
        uint32_t gap = 0;
        size_t used = gcomp__varint_get(src + q, n - q, &gap);
        if (!used) return GCOMP_E_CORRUPT;
        q += used;
        pos = pos + 1 + gap;
        if (pos >= len || n - q < width) return GCOMP_E_CORRUPT;
        bool bad = kind == GM_SLICE_SPARSE_F32
                       ? (gcomp__get32(src + q) & 0x7f800000u) == 0x7f800000u
                   : kind == GM_SLICE_SPARSE_F16 ? (gcomp__get16(src + q) & 0x7c00u) == 0x7c00u
                                                 : (gcomp__get16(src + q) & 0x7f80u) == 0x7f80u;
        if (bad) return GCOMP_E_CORRUPT;
        q += width;
    }
    if (q != n) return GCOMP_E_CORRUPT;
    q = GM_SLICE_HDR;
    pos = (uint64_t)-1;
    for (uint32_t e = 0; e < m; e++) {
        uint32_t gap = 0;
        q += gcomp__varint_get(src + q, n - q, &gap);
        pos = pos + 1 + gap;
        float v;
        if (kind == GM_SLICE_SPARSE_F32)
            memcpy(&v, src + q, 4);
        else if (kind == GM_SLICE_SPARSE_F16)
            v = gm_f16_to_f32(gcomp__get16(src + q));
        else
            v = gm_bf16_to_f32(gcomp__get16(src + q));
        acc[pos] += v;
        q += width;
    }
    return GCOMP_OK;
}

void gm_count_size_words(gcomp_mpi_bucket *b, gm_group *g) {
    uint64_t per_tensor = 8 * (uint64_t)(g->xsize - 1);
    g->bytes_sent += per_tensor * g->nt;
    g->bytes_recv += per_tensor * g->nt;
    for (size_t k = 0; k < g->nt; k++) {
        b->t[g->t0 + k].call.bytes_sent += per_tensor;
        b->t[g->t0 + k].call.bytes_received += per_tensor;
    }
}

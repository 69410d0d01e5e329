/*
 * mpi_util.c - small pieces the MPI layer needs beyond libgradcomp's public API.
 *
 * - Half casts and the MPI_Op that sums f16/bf16 words.  The op widens each pair to
 *   float, adds and rounds back (nearest even; f16 saturates at +-65504 like the f16
 *   value coder, so a large partial sum clips instead of poisoning every rank with Inf).
 *   It is the only arithmetic inside an MPI_Op in this library: nothing is ever decoded
 *   there (an MPI_Op sees raw words in arbitrary pieces and cannot report errors).
 *   Rejected: summing in f32 (twice the bytes on the wire: the point of f16 is lost).
 * - The header fields and the dense/seeded value layout of docs/FORMAT.md, read
 *   directly: the layout is normative, and the allreduce of a linear codec needs to know
 *   where the values are.  CRCs are left to gcomp_decode_add, which checks them before
 *   it writes anything.
 * - random-k positions by Floyd's algorithm as FORMAT.md specifies (an independent
 *   implementation of the normative text; the tests compare it with the core decoder).
 * - The slice format of the sparse allreduce (docs/FORMAT.md, "MPI sparse-allreduce
 *   slice"): the non-zeros of one region of a rank's decoded contribution as
 *   (LEB128 gap, f32 value) pairs, or the region dense when that is smaller (SparCML's
 *   switch to dense when a sparse vector fills up).  Values travel as f32 so the owner
 *   sums exactly what each rank's decoder produced.  Rejected: re-encoding each slice
 *   with the tensor's codec (its k is per tensor, a slice has whatever the selection
 *   left in that region, and a lossy value coder would change the numbers again).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, nanosleep, madvise when built outside CMake */
#endif
#include "mpi_internal.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

uint64_t gm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

gcomp_status gm_fail(gcomp_error *err, gcomp_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return st;
}

uint64_t gm_fnv1a(const void *p, size_t len, uint64_t h) {
    const uint8_t *s = p;
    if (!h) h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

gcomp_status gm_reserve(gm_buf *b, size_t bytes) {
    if (b->p && b->cap >= bytes) return GCOMP_OK;
    size_t want = bytes + bytes / 4 + 64;
    want = (want + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, want);
    if (!p) return GCOMP_E_NOMEM;
#ifdef MADV_HUGEPAGE
    if (want >= ((size_t)2 << 20)) madvise(p, want, MADV_HUGEPAGE);
#endif
    free(b->p);
    b->p = p;
    b->cap = want;
    return GCOMP_OK;
}

void gm_buf_free(gm_buf *b) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* ---- half precision ------------------------------------------------------------------- */

uint16_t gm_f32_to_f16(float f) {
    if (f > 65504.0f)
        f = 65504.0f;
    else if (f < -65504.0f)
        f = -65504.0f;
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u; /* NaN stays NaN */
    if (ax >= 0x38800000u) {                     /* normal in f16 (>= 2^-14) */
        uint32_t r = ax - 0x38000000u;           /* rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);          /* nearest even on the 13 dropped bits */
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u) return sign; /* below half the smallest subnormal */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
}

float gm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * (1.0f / 16777216.0f);
        return (h & 0x8000u) ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &x, 4);
    return f;
}

uint16_t gm_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float gm_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
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

static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

gcomp_status gm_read_hdr(const void *msg, size_t len, gm_hdr *h) {
    const uint8_t *p = msg;
    if (!msg || len < 4) return GCOMP_E_TRUNCATED;
    if (memcmp(p, "GCmp", 4) != 0) return GCOMP_E_BAD_MAGIC;
    if (len < GM_HDR) return GCOMP_E_TRUNCATED;
    h->codec_id = rd16(p + 6);
    h->payload_len = rd32(p + 12);
    h->n = rd64(p + 16);
    h->fingerprint = rd64(p + 24);
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

gcomp_status gm_linear_values(const void *msg, size_t len, size_t n, int vtype,
                              const uint8_t **vals, size_t *nvals, uint64_t *key) {
    const uint8_t *p = msg;
    gm_hdr h;
    gcomp_status st = gm_read_hdr(msg, len, &h);
    if (st != GCOMP_OK) return st;
    if (h.n != n || (uint64_t)h.payload_len + GM_HDR != len || h.payload_len < GM_SECTION)
        return GCOMP_E_CORRUPT;
    const uint8_t *s = p + GM_HDR;
    uint32_t k = rd32(s), nv = rd32(s + 4), ilen = rd32(s + 20);
    uint8_t kind = s[8], vid = s[9], expand = s[10];
    size_t width = vtype == 0 ? 4 : 2;
    if (vid != (uint8_t)vtype || expand != 0 || s[11] != 0 || nv != k || nv > n)
        return GCOMP_E_UNSUPPORTED;
    if (kind == 0) {
        if (k != n || ilen != 0) return GCOMP_E_UNSUPPORTED;
        *key = 0;
    } else if (kind == 4) {
        if (ilen != 8) return GCOMP_E_UNSUPPORTED;
        *key = rd64(s + GM_SECTION);
    } else {
        return GCOMP_E_UNSUPPORTED;
    }
    if ((uint64_t)GM_SECTION + ilen + (uint64_t)nv * width != h.payload_len) return GCOMP_E_CORRUPT;
    *vals = s + GM_SECTION + ilen;
    *nvals = nv;
    return GCOMP_OK;
}

gcomp_status gm_seeded_positions(uint64_t key, size_t n, size_t k, uint32_t *idx, gm_buf *bits) {
    if (k > n) return GCOMP_E_CORRUPT;
    size_t words = (n + 63) / 64;
    if (gm_reserve(bits, words * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint64_t *set = bits->p;
    memset(set, 0, words * 8);
    uint64_t draw = 0;
    for (size_t j = n - k; j < n; j++) {
        /* draw(c) = mix(key + (c+1) * golden); t = floor(draw * (j+1) / 2^64) */
        uint64_t r = gm_mix(key + (draw + 1) * 0x9e3779b97f4a7c15ull);
        draw++;
        size_t t = (size_t)(((unsigned __int128)r * (j + 1)) >> 64);
        if (set[t >> 6] >> (t & 63) & 1) t = j;
        set[t >> 6] |= 1ull << (t & 63);
    }
    size_t m = 0;
    for (size_t w = 0; w < words && m < k; w++) {
        uint64_t v = set[w];
        while (v) {
            idx[m++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(v));
            v &= v - 1;
        }
    }
    return m == k ? GCOMP_OK : GCOMP_E_CORRUPT;
}

/* ---- slices ------------------------------------------------------------------------------ */

static size_t put_varint(uint8_t *p, uint32_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        p[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[i++] = (uint8_t)v;
    return i;
}

static size_t varint_len(uint32_t v) {
    return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}

/* Reads one LEB128 value of at most 5 bytes (< 2^32).  Returns bytes used, 0 if bad. */
static size_t get_varint(const uint8_t *p, size_t room, uint32_t *out) {
    uint64_t v = 0;
    for (size_t i = 0; i < 5 && i < room; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            if (v > UINT32_MAX) return 0;
            *out = (uint32_t)v;
            return i + 1;
        }
    }
    return 0;
}

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
            if (p + varint_len(gap) + 4 >= dense) goto go_dense;
            p += put_varint(dst + p, gap);
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
            size_t used = get_varint(dst + q, p - q, &gap);
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
        q += get_varint(dst + q, p - q, &gap);
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
    uint32_t m = rd32(src + 4);
    uint8_t kind = src[0];
    if (kind == GM_SLICE_DENSE_F32) {
        if (m != len || n != GM_SLICE_HDR + 4 * (size_t)len) return GCOMP_E_CORRUPT;
        for (size_t i = 0; i < len; i++)
            if ((rd32(src + GM_SLICE_HDR + 4 * i) & 0x7f800000u) == 0x7f800000u)
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
        size_t used = get_varint(src + q, n - q, &gap);
        if (!used) return GCOMP_E_CORRUPT;
        q += used;
        pos = pos + 1 + gap;
        if (pos >= len || n - q < width) return GCOMP_E_CORRUPT;
        bool bad = kind == GM_SLICE_SPARSE_F32   ? (rd32(src + q) & 0x7f800000u) == 0x7f800000u
                   : kind == GM_SLICE_SPARSE_F16 ? (rd16(src + q) & 0x7c00u) == 0x7c00u
                                                 : (rd16(src + q) & 0x7f80u) == 0x7f80u;
        if (bad) return GCOMP_E_CORRUPT;
        q += width;
    }
    if (q != n) return GCOMP_E_CORRUPT;
    q = GM_SLICE_HDR;
    pos = (uint64_t)-1;
    for (uint32_t e = 0; e < m; e++) {
        uint32_t gap = 0;
        q += get_varint(src + q, n - q, &gap);
        pos = pos + 1 + gap;
        float v;
        if (kind == GM_SLICE_SPARSE_F32)
            memcpy(&v, src + q, 4);
        else if (kind == GM_SLICE_SPARSE_F16)
            v = gm_f16_to_f32(rd16(src + q));
        else
            v = gm_bf16_to_f32(rd16(src + q));
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

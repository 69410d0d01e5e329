/*
 * index_coding.c - how the positions of a sparse message travel.
 *
 * Three codings, and the encoder sends whichever is smallest for this message:
 *   bitmap      n bits; best above density ~1/10
 *   varint      first index, then (gap - 1) as LEB128; exact size known after one pass
 *   elias-fano  k * (2 + log2(n/k)) bits (Elias 1974, Fano 1971): the low l bits of each
 *               index packed, the high parts as a unary bit vector.  At density 0.001 it
 *               is ~12 bits per index against ~15 for varint, which is what lets top-k
 *               with f16 values clear 1000x.
 * Random-k needs none of them: the k positions are regenerated from a 64-bit key
 * (Floyd's sampling, then an ascending scan of an n-bit set; src/common/seeded.c, shared
 * with the MPI layer).  The varint helpers are shared too (src/common/common.h).
 *
 * Decoders treat the bytes as hostile: every loop is bounded by len or k, every index is
 * checked strictly ascending and below n, and the byte count must match exactly.
 */
#include "core/internal.h"

const char *gcomp__index_name(unsigned kind) {
    switch (kind) {
    case GCOMP__IX_NONE:
        return "none";
    case GCOMP__IX_BITMAP:
        return "bitmap";
    case GCOMP__IX_VARINT:
        return "varint";
    case GCOMP__IX_ELIAS_FANO:
        return "elias-fano";
    case GCOMP__IX_SEEDED:
        return "seeded";
    }
    return "?";
}

static unsigned ef_low_bits(size_t k, size_t n) {
    unsigned l = 0;
    if (k == 0) return 0;
    size_t q = n / k;
    while (q > 1) {
        q >>= 1;
        l++;
    }
    return l;
}

static size_t ef_size(size_t k, size_t n) {
    unsigned l = ef_low_bits(k, n);
    size_t high_bits = k + (n >> l) + 1;
    return (k * l + 7) / 8 + (high_bits + 7) / 8;
}

static size_t bitmap_size(size_t n) {
    return (n + 7) / 8;
}

size_t gcomp__index_bound(size_t k, size_t n) {
    /* Elias-Fano's size is nearly monotone in k; the slack covers the steps where
     * floor(log2(n/k)) changes, so the bound holds for every k' <= k. */
    size_t b = bitmap_size(n), e = ef_size(k, n) + (k + 7) / 8 + 16;
    return 8 + (b < e ? b : e);
}

static size_t varint_size(const uint32_t *idx, size_t k) {
    size_t bytes = 0;
    uint32_t prev = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t g = i ? idx[i] - prev - 1 : idx[0];
        prev = idx[i];
        bytes += gcomp__varint_size(g);
    }
    return bytes;
}

gcomp_status gcomp__index_encode(const uint32_t *idx, size_t k, size_t n, uint8_t *dst, size_t cap,
                                 size_t *len, unsigned *kind) {
    size_t sb = bitmap_size(n), se = ef_size(k, n);
    size_t sv = varint_size(idx, k);
    if (sv <= sb && sv <= se) {
        if (cap < sv) return GCOMP_E_DST_SIZE;
        uint8_t *p = dst;
        uint32_t prev = 0;
        for (size_t i = 0; i < k; i++) {
            uint32_t g = i ? idx[i] - prev - 1 : idx[0];
            prev = idx[i];
            p += gcomp__varint_put(p, g);
        }
        *len = sv;
        *kind = GCOMP__IX_VARINT;
    } else if (se < sb) {
        if (cap < se) return GCOMP_E_DST_SIZE;
        memset(dst, 0, se);
        unsigned l = ef_low_bits(k, n);
        uint8_t *low = dst, *high = dst + (k * l + 7) / 8;
        uint32_t lmask = l ? (uint32_t)((1ull << l) - 1) : 0;
        for (size_t i = 0; i < k; i++) {
            uint64_t bit = (uint64_t)i * l;
            uint32_t lo = idx[i] & lmask;
            for (unsigned b = 0; b < l; b++, bit++) /* l <= 32; k*l bits in total */
                if (lo >> b & 1) low[bit >> 3] |= (uint8_t)(1u << (bit & 7));
            size_t pos = (size_t)(idx[i] >> l) + i;
            high[pos >> 3] |= (uint8_t)(1u << (pos & 7));
        }
        *len = se;
        *kind = GCOMP__IX_ELIAS_FANO;
    } else {
        if (cap < sb) return GCOMP_E_DST_SIZE;
        memset(dst, 0, sb);
        for (size_t i = 0; i < k; i++) dst[idx[i] >> 3] |= (uint8_t)(1u << (idx[i] & 7));
        *len = sb;
        *kind = GCOMP__IX_BITMAP;
    }
    return GCOMP_OK;
}

gcomp_status gcomp__index_check_len(unsigned kind, size_t len, size_t k, size_t n) {
    if (k > n) return GCOMP_E_CORRUPT;
    switch (kind) {
    case GCOMP__IX_BITMAP:
        return len == bitmap_size(n) ? GCOMP_OK : GCOMP_E_CORRUPT;
    case GCOMP__IX_VARINT: /* 1 to 5 bytes per entry */
        return len >= k && len <= 5 * (uint64_t)k ? GCOMP_OK : GCOMP_E_CORRUPT;
    case GCOMP__IX_ELIAS_FANO:
        return len == ef_size(k, n) ? GCOMP_OK : GCOMP_E_CORRUPT;
    default:
        return GCOMP_E_CORRUPT;
    }
}

gcomp_status gcomp__index_decode(unsigned kind, const uint8_t *src, size_t len, size_t k, size_t n,
                                 uint32_t *idx) {
    if (k > n) return GCOMP_E_CORRUPT;
    switch (kind) {
    case GCOMP__IX_BITMAP: {
        if (len != bitmap_size(n)) return GCOMP_E_CORRUPT;
        size_t m = 0;
        for (size_t byte = 0; byte < len; byte++) {
            unsigned v = src[byte];
            while (v) {
                unsigned b = (unsigned)__builtin_ctz(v);
                size_t pos = byte * 8 + b;
                if (pos >= n || m == k) return GCOMP_E_CORRUPT;
                idx[m++] = (uint32_t)pos;
                v &= v - 1;
            }
        }
        return m == k ? GCOMP_OK : GCOMP_E_CORRUPT;
    }
    case GCOMP__IX_VARINT: {
        size_t p = 0;
        uint64_t prev = 0;
        for (size_t i = 0; i < k; i++) {
            uint32_t g;
            size_t used = gcomp__varint_get(src + p, len - p, &g);
            if (!used) return GCOMP_E_CORRUPT;
            p += used;
            uint64_t v = i ? prev + 1 + g : g;
            if (v >= n) return GCOMP_E_CORRUPT;
            idx[i] = (uint32_t)v;
            prev = v;
        }
        return p == len ? GCOMP_OK : GCOMP_E_CORRUPT;
    }
    case GCOMP__IX_ELIAS_FANO: {
        if (len != ef_size(k, n)) return GCOMP_E_CORRUPT;
        unsigned l = ef_low_bits(k, n);
        const uint8_t *low = src, *high = src + (k * l + 7) / 8;
        size_t hbytes = len - (size_t)(high - src), hbits = k + (n >> l) + 1;
        size_t m = 0;
        uint64_t prev = 0;
        for (size_t byte = 0; byte < hbytes; byte++) {
            unsigned v = high[byte];
            while (v) {
                unsigned b = (unsigned)__builtin_ctz(v);
                size_t pos = byte * 8 + b;
                if (pos >= hbits || m == k) return GCOMP_E_CORRUPT;
                uint64_t hi = pos - m, lo = 0, bit = (uint64_t)m * l;
                for (unsigned t = 0; t < l; t++, bit++)
                    lo |= (uint64_t)(low[bit >> 3] >> (bit & 7) & 1) << t;
                uint64_t val = hi << l | lo;
                if (val >= n || (m && val <= prev)) return GCOMP_E_CORRUPT;
                idx[m++] = (uint32_t)val;
                prev = val;
                v &= v - 1;
            }
        }
        if (m != k) return GCOMP_E_CORRUPT;
        /* Padding bits of the low array must be zero too. */
        for (uint64_t bit = (uint64_t)k * l; bit < (uint64_t)((k * l + 7) / 8) * 8; bit++)
            if (low[bit >> 3] >> (bit & 7) & 1) return GCOMP_E_CORRUPT;
        return GCOMP_OK;
    }
    default:
        return GCOMP_E_CORRUPT;
    }
}

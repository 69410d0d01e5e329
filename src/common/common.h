/*
 * common.h - the utilities libgradcomp and libgradcomp_mpi share (never installed).
 *
 * Both shared libraries are built with hidden visibility, so neither can call the other's
 * internals, and the MPI layer used to carry its own copies of these.  Instead the sources
 * in src/common/ are compiled once, as position-independent code with hidden visibility,
 * into an OBJECT library that is linked into each .so (src/common/CMakeLists.txt): each
 * library carries its own private copy, nothing new is exported, and the code exists once
 * in the tree.  zstd's lib/common and liblzma's common/ are shared the same way.
 *
 * What belongs here: small pieces with no codec knowledge that both layers need - error
 * detail, the allocator and growable buffers, a clock, little-endian access, the
 * counter-based generator, half casts, LEB128 varints, CRC-32C and FNV-1a, and random-k
 * positions (which the MPI layer regenerates from a message's key, docs/FORMAT.md "Seeded
 * entries").  Codec
 * internals stay in core/internal.h; MPI internals in mpi/mpi_internal.h.
 */
#ifndef GCOMP_COMMON_H
#define GCOMP_COMMON_H

#include "gradcomp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- errors (error.c) ------------------------------------------------------------------- */

/* Sets err (may be NULL) and returns st. printf-style. */
gcomp_status gcomp__fail(gcomp_error *err, gcomp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- memory and time (mem.c) ------------------------------------------------------------- */

/* 64-byte aligned; from 4 MiB on 2 MiB-aligned on transparent huge pages (huge_alloc.h:
 * a fresh 4 KiB page costs ~10 us to touch here).  gcomp__free(NULL) is a no-op.  Every
 * library allocation goes through these so the anomaly tests can fail the N-th one. */
void *gcomp__alloc(size_t bytes);
void *gcomp__calloc(size_t bytes);
void gcomp__free(void *p);
/* Allocations left before gcomp__alloc fails; (size_t)-1: never.  Each library has its own
 * copy; only libgradcomp's is set (gcomp__test_fail_alloc_after, core/mem.c). */
extern size_t gcomp__alloc_fail_after;

/* A growable scratch buffer, reused every call; never shrinks. */
typedef struct gcomp__buf {
    void *p;
    size_t cap;
} gcomp__buf;
gcomp_status gcomp__buf_reserve(gcomp__buf *b, size_t bytes);
void gcomp__buf_free(gcomp__buf *b);

/* Monotonic clock in ns. */
uint64_t gcomp__now_ns(void);

/* ---- little-endian I/O ------------------------------------------------------------------ */

/* Whether a rows x cols shape holds n elements (0 x 0: a vector, no shape).  By division:
 * rows * cols can wrap in size_t, and a wrapped product that equals n let a 2 x (2^63 + 5)
 * shape through for n = 10, whose codecs then sized their buffers by the huge side. */
static inline bool gcomp__shape_holds(size_t n, size_t rows, size_t cols) {
    if (!rows && !cols) return true;
    return rows && cols && n % rows == 0 && n / rows == cols;
}

static inline void gcomp__put16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}
static inline void gcomp__put32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static inline void gcomp__put64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static inline void gcomp__putf(uint8_t *p, float v) {
    memcpy(p, &v, 4);
}
static inline uint16_t gcomp__get16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t gcomp__get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t gcomp__get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline float gcomp__getf(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gradcomp's wire code assumes a little-endian host; add byte swaps before porting"
#endif

/* ---- counter-based random numbers ---------------------------------------------------------- */

/* The i-th draw of stream `key` is mix(key + (i + 1) * golden), so any element's random
 * number is computed independently (vectorisable, thread-splittable, identical on every
 * platform).  splitmix64's finaliser (Steele et al., 2014).  docs/FORMAT.md fixes it. */
static inline uint64_t gcomp__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t gcomp__rand64(uint64_t key, uint64_t i) {
    return gcomp__mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
}

/* ---- half precision (half.c) --------------------------------------------------------------- */

uint16_t gcomp__f32_to_f16(float f); /* round to nearest even; overflow -> inf */
/* The same, but finite and infinite values beyond +-65504 become +-65504 (the f16 value
 * coder and the MPI half sums: an outlier clips instead of turning a sum into Inf). */
uint16_t gcomp__f32_to_f16_sat(float f);
float gcomp__f16_to_f32(uint16_t h);
/* bfloat16: the top half of a float, rounded to nearest even; NaN stays NaN (quiet). */
static inline uint16_t gcomp__f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
static inline float gcomp__bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- LEB128 varints (index coding, MPI slices) --------------------------------------------- */

/* Bytes gcomp__varint_put writes for v (1..5). */
static inline size_t gcomp__varint_size(uint32_t v) {
    return 1 + (size_t)(v >= (1u << 7)) + (size_t)(v >= (1u << 14)) + (size_t)(v >= (1u << 21)) +
           (size_t)(v >= (1u << 28));
}
/* Writes v, 7 bits a byte, low bits first; returns the bytes written. */
static inline size_t gcomp__varint_put(uint8_t *p, uint32_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        p[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[i++] = (uint8_t)v;
    return i;
}
/* Reads one value from p[0..room), untrusted: at most 5 bytes and below 2^32.  Returns
 * the bytes used, or 0 when the value is truncated, longer or too large. */
static inline size_t gcomp__varint_get(const uint8_t *p, size_t room, uint32_t *out) {
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

/* ---- checksums and hashing (checksum.c) ------------------------------------------------- */

/* CRC-32C (Castagnoli) of data[0..len), continuing from crc (0 to start): hardware crc32
 * in three streams where the CPU has it, else a byte table.  Message, state and MPI state
 * blob checksums (docs/FORMAT.md). */
uint32_t gcomp__crc32c(uint32_t crc, const void *data, size_t len);
/* The byte-table CRC-32C alone: the reference the tests check the fast path against. */
uint32_t gcomp__crc32c_portable(uint32_t crc, const void *data, size_t len);
/* FNV-1a 64 of data[0..len) from the standard offset basis (spec fingerprints, names). */
uint64_t gcomp__fnv1a64(const void *data, size_t len);

/* ---- random-k positions (seeded.c) ------------------------------------------------------- */

/* The k distinct positions of random-k for (key, n), ascending (docs/FORMAT.md, "Seeded
 * entries").  `scratch` holds n bits.  GCOMP_E_CORRUPT when k > n, GCOMP_E_NOMEM. */
gcomp_status gcomp__seeded_indices(uint64_t key, size_t n, size_t k, uint32_t *idx,
                                   gcomp__buf *scratch);

#endif /* GCOMP_COMMON_H */

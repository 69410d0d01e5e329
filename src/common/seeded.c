/*
 * seeded.c - the positions of random-k, regenerated from a 64-bit key.
 *
 * docs/FORMAT.md ("Seeded entries") makes this normative: the core's decoder and the MPI
 * layer's linear allreduce (which sums the values of seeded messages without decoding
 * them, then scatters the sum) must agree on every position, so both use this one copy.
 * Floyd's sampling (Bentley & Floyd, CACM 1987): k draws, each O(1), exactly k distinct;
 * then an ascending scan of an n-bit set.
 */
#include "common.h"

gcomp_status gcomp__seeded_indices(uint64_t key, size_t n, size_t k, uint32_t *idx,
                                   gcomp__buf *scratch) {
    if (k > n) return GCOMP_E_CORRUPT;
    size_t words = (n + 63) / 64;
    if (gcomp__buf_reserve(scratch, words * 8) != GCOMP_OK) return GCOMP_E_NOMEM;
    uint64_t *set = scratch->p;
    memset(set, 0, words * 8);
    uint64_t draw = 0;
    for (size_t j = n - k; j < n; j++) {
        /* t = floor(draw * (j + 1) / 2^64): uniform in [0, j] without a division. */
        uint64_t r = gcomp__rand64(key, draw++);
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
    return GCOMP_OK;
}

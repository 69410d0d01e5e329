/*
 * check.h - the few macros the C tests use.  A failed CHECK prints file:line and the
 * expression and counts a failure; main returns non-zero when any check failed.
 */
#ifndef GCOMP_TEST_CHECK_H
#define GCOMP_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures_, check_count_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        check_count_++;                                                                            \
        if (!(cond)) {                                                                             \
            check_failures_++;                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        check_count_++;                                                                            \
        if (!(cond)) {                                                                             \
            check_failures_++;                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int st_ = (int)(expr);                                                                     \
        CHECK_MSG(st_ == 0, "status %d (%s)", st_, gcomp_status_str((gcomp_status)st_));           \
    } while (0)

#define CHECK_DONE()                                                                               \
    (printf("%s: %d checks, %d failed\n", __FILE__, check_count_, check_failures_),                \
     check_failures_ ? 1 : 0)

/* Seeded test data: Gaussian with a heavy tail, like real gradients. */
static inline unsigned long long test_rng_next_(unsigned long long *s) {
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double test_uniform(unsigned long long *s) {
    return ((double)(test_rng_next_(s) >> 11) + 0.5) / 9007199254740992.0;
}
static inline float test_gauss(unsigned long long *s) {
    double u = test_uniform(s), v = test_uniform(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static inline void test_fill(float *x, size_t n, unsigned long long seed) {
    for (size_t i = 0; i < n; i++) {
        float g = test_gauss(&seed);
        x[i] = (i % 97 == 0) ? g * 20.0f : g; /* heavy tail */
    }
}

#endif

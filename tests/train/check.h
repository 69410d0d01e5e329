/*
 * check.h — the few helpers the src/train tests share: a non-fatal CHECK that counts failures
 * (so one run reports every broken property, not just the first), and ctest's skip code.
 * Rejected: a unit-test framework (one more dependency for five small programs).
 */
#ifndef GTRAIN_TEST_CHECK_H
#define GTRAIN_TEST_CHECK_H

#include <stdio.h>

#define SKIP_CODE 77 /* SKIP_RETURN_CODE in tests/train/CMakeLists.txt */

static int check_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

#endif

/*
 * mem.c - the one allocator, growable buffers and the clock, for both libraries.
 *
 * Every allocation of both libraries goes through gcomp__alloc: big workspaces (4 MiB and
 * more) on 2 MiB-aligned transparent huge pages, the rest 64-byte aligned (huge_alloc.h,
 * shared with the trainer, says why and how).  Workspaces are allocated once per
 * compressor and reused.
 *
 * The anomaly tests fail the N-th allocation through gcomp__alloc_fail_after so every
 * API path can be checked for clean errors and no leaks (SQLite's malloc tests).  Each
 * library linking this file has its own counter; the setter is libgradcomp's test hook
 * (core/mem.c), so only the core's allocations can be failed.  Production code never
 * sets it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* madvise, clock_gettime */
#endif
#include "common.h"

#include "huge_alloc.h"

#include <stdlib.h>
#include <time.h>

size_t gcomp__alloc_fail_after = (size_t)-1;

void *gcomp__alloc(size_t bytes) {
    if (gcomp__alloc_fail_after != (size_t)-1) {
        if (gcomp__alloc_fail_after == 0) return NULL;
        gcomp__alloc_fail_after--;
    }
    return gcomp__huge_alloc(bytes);
}

void *gcomp__calloc(size_t bytes) {
    void *p = gcomp__alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void gcomp__free(void *p) {
    free(p);
}

gcomp_status gcomp__buf_reserve(gcomp__buf *b, size_t bytes) {
    if (b->cap >= bytes && b->p) return GCOMP_OK;
    /* Grow geometrically so a slowly rising k does not reallocate every step. */
    size_t want = bytes + bytes / 4 + 64;
    void *p = gcomp__alloc(want);
    if (!p) return GCOMP_E_NOMEM;
    gcomp__free(b->p);
    b->p = p;
    b->cap = want;
    return GCOMP_OK;
}

void gcomp__buf_free(gcomp__buf *b) {
    gcomp__free(b->p);
    b->p = NULL;
    b->cap = 0;
}

uint64_t gcomp__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * fuzz_alloc.h - allocation accounting for the fuzz targets (fuzz_alloc.c).
 */
#ifndef GCOMP_FUZZ_ALLOC_H
#define GCOMP_FUZZ_ALLOC_H

#include <stddef.h>

/* Bytes the library allocated since fuzz_alloc_begin. */
extern size_t fuzz_alloc_bytes;
/* From now on, abort() when the library's allocations would pass `limit` bytes in all. */
void fuzz_alloc_begin(size_t limit);
/* The same, but an allocation past the limit fails (returns NULL) instead of aborting:
 * for calls that may legitimately need what their input claims, which must then answer
 * GCOMP_E_NOMEM cleanly. */
void fuzz_alloc_begin_soft(size_t limit);
/* No limit any more. */
void fuzz_alloc_end(void);
/* Aborts unless the library's allocations are being counted. */
void fuzz_alloc_selftest(void);

#endif

/*
 * fuzz_alloc.c - counts the bytes the library asks its allocator for, so the fuzz targets
 * and the repro check can assert "no allocation beyond a small multiple of what the
 * receiver's tensor needs" (DESIGN.md: the decoder never allocates past a limit).
 *
 * Every library allocation is gcomp__alloc, which calls aligned_alloc (or, for big
 * workspaces on huge pages, posix_memalign).  The targets link the library statically with
 * -Wl,--wrap=aligned_alloc,--wrap=posix_memalign, so the library's calls land here and go
 * on to the C library (or to ASan's allocator under the sanitizers) through __real_*.  Rejected:
 * interposing malloc itself (ASan and libFuzzer own it) and a counter inside the library (a test
 * hook in production code for one property). fuzz_alloc_selftest() proves the wrap is in effect, so
 * a library that stops calling aligned_alloc makes the targets fail instead of silently counting
 * zero.
 */
#include "fuzz_alloc.h"

#include "gradcomp.h"

#include <stdio.h>
#include <stdlib.h>

size_t fuzz_alloc_bytes;
size_t fuzz_alloc_limit = (size_t)-1;
static int soft;

void *__real_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);
int __real_posix_memalign(void **p, size_t align, size_t size);
int __wrap_posix_memalign(void **p, size_t align, size_t size);

/* 1 when `size` more bytes fit the limit (and counts them); 0 for a soft refusal. */
static int admit(size_t size) {
    if (size > fuzz_alloc_limit - fuzz_alloc_bytes) {
        if (soft) return 0; /* the library must answer GCOMP_E_NOMEM */
        fprintf(stderr, "fuzz_alloc: the library asked for %zu bytes after %zu, limit %zu\n", size,
                fuzz_alloc_bytes, fuzz_alloc_limit);
        abort();
    }
    fuzz_alloc_bytes += size;
    return 1;
}

void *__wrap_aligned_alloc(size_t align, size_t size) {
    return admit(size) ? __real_aligned_alloc(align, size) : NULL;
}

int __wrap_posix_memalign(void **p, size_t align, size_t size) {
    return admit(size) ? __real_posix_memalign(p, align, size) : 12 /* ENOMEM */;
}

void fuzz_alloc_begin(size_t limit) {
    fuzz_alloc_bytes = 0;
    fuzz_alloc_limit = limit;
    soft = 0;
}

void fuzz_alloc_begin_soft(size_t limit) {
    fuzz_alloc_begin(limit);
    soft = 1;
}

void fuzz_alloc_end(void) {
    fuzz_alloc_limit = (size_t)-1;
    soft = 0;
}

void fuzz_alloc_selftest(void) {
    static int done;
    if (done) return;
    done = 1;
    fuzz_alloc_begin((size_t)-1);
    gcomp_compressor *c = NULL;
    if (gcomp_compressor_create(&c, "topk:feedback=ef", 4096, 0, 0, NULL) != GCOMP_OK) abort();
    gcomp_compressor_free(c);
    if (fuzz_alloc_bytes < 4096 * sizeof(float)) {
        fprintf(stderr, "fuzz_alloc: allocations are not counted (link with "
                        "-Wl,--wrap=aligned_alloc against the static library)\n");
        abort();
    }
    fuzz_alloc_end();
}

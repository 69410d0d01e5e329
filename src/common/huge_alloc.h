/*
 * huge_alloc.h - how big buffers are allocated, for every part of gradcomp: the core and
 * the MPI layer (through gcomp__alloc, mem.c) and the reference trainer (train_alloc.h).
 *
 * A fresh 4 KiB page costs ~10 us to fault in on these machines, so a 100 MB workspace
 * touched for the first time costs a quarter of a second in page faults alone.  Transparent
 * huge pages cut that 512-fold, but the kernel backs only whole 2 MiB pages of a region
 * marked MADV_HUGEPAGE (the usual THP setting is "madvise"), and madvise() refuses an
 * address that is not page-aligned.  So a buffer of 4 MiB or more is aligned to 2 MiB and
 * rounded up to whole 2 MiB pages, then advised; smaller ones are 64-byte aligned (a cache
 * line: AVX-512 loads never split) and left to 4 KiB pages, where rounding up to 2 MiB
 * would waste more than a third.  Nothing here is required for correctness: when the
 * 2 MiB-aligned block cannot be had, a plain one is used, and when the advice is refused
 * (a kernel without THP) the buffer works with small pages; both quietly, errno as it was.
 *
 * Rejected: aligned_alloc(64) followed by madvise (what the core did until gradcomp 0.1:
 * glibc serves big blocks from mmap with a 16-byte header, so the address is never
 * page-aligned and every madvise failed with EINVAL); mmap of our own (a second free path
 * for every caller); pre-faulting (MAP_POPULATE: the caller decides when to touch).
 *
 * Header-only so the trainer, which links neither library's internals, uses the same code;
 * blocks are released with free().  The caller must have _GNU_SOURCE or _DEFAULT_SOURCE
 * defined (posix_memalign, madvise under -std=c11).
 */
#ifndef GCOMP_HUGE_ALLOC_H
#define GCOMP_HUGE_ALLOC_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define GCOMP__HUGE_PAGE ((size_t)2 << 20)
/* From this size on a buffer gets 2 MiB pages: rounding wastes at most a third. */
#define GCOMP__HUGE_MIN (2 * GCOMP__HUGE_PAGE)

/* A block of at least `bytes` (0 is taken as 1), 64-byte aligned, or NULL. */
static inline void *gcomp__huge_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    /* No object may exceed PTRDIFF_MAX; refusing here also keeps sanitizers, which abort
     * on such requests instead of returning NULL, on the documented path. */
    if (bytes > (size_t)PTRDIFF_MAX) return NULL;
    if (bytes >= GCOMP__HUGE_MIN) {
        size_t rounded = (bytes + GCOMP__HUGE_PAGE - 1) & ~(GCOMP__HUGE_PAGE - 1);
        void *p = NULL;
        int saved = errno;
        if (rounded >= bytes && posix_memalign(&p, GCOMP__HUGE_PAGE, rounded) == 0) {
#ifdef MADV_HUGEPAGE
            if (madvise(p, rounded, MADV_HUGEPAGE) != 0) errno = saved; /* small pages serve */
#endif
            return p;
        }
        errno = saved; /* no aligned block: a plain one below */
    }
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return rounded < bytes ? NULL : aligned_alloc(64, rounded);
}

#endif /* GCOMP_HUGE_ALLOC_H */

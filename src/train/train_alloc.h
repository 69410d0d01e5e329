/*
 * train_alloc.h - the trainer's allocator for big buffers: aligned, and from 4 MiB on
 * advised as transparent huge pages (a fresh 4 KiB page costs ~10 us to touch here,
 * shared/TORCH.md).  Not pre-touched: callers that need it zeroed do that themselves.
 */
#ifndef GTRAIN_ALLOC_H
#define GTRAIN_ALLOC_H

#include <stdlib.h>
#include <sys/mman.h>

static inline void *gtrain_huge_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    size_t align = bytes >= 2 * huge ? huge : 64;
    size_t rounded = (bytes + align - 1) / align * align;
    void *p = NULL;
    if (rounded == 0) rounded = align;
    if (posix_memalign(&p, align, rounded) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

#endif

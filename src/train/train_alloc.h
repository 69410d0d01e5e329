/*
 * train_alloc.h - the trainer's allocator for big buffers: the libraries' own policy
 * (src/common/huge_alloc.h: 2 MiB-aligned transparent huge pages from 4 MiB on, 64-byte
 * alignment below), so weights, activations and data sets are placed as the codecs'
 * workspaces are.  Not pre-touched: callers that need it zeroed do that themselves.
 * Blocks are released with free().
 */
#ifndef GTRAIN_ALLOC_H
#define GTRAIN_ALLOC_H

#include "../common/huge_alloc.h"

static inline void *gtrain_huge_alloc(size_t bytes) {
    return gcomp__huge_alloc(bytes);
}

#endif

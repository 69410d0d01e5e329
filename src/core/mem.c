/*
 * mem.c - the anomaly-test hook, libgradcomp's one exported internal.
 *
 * The allocator itself is in src/common/mem.c, shared with libgradcomp_mpi.  The hook
 * stays here so that only libgradcomp exports it: the MPI library's copy of the counter
 * is never set, and its export list does not grow.
 */
#include "core/internal.h"

void gcomp__test_fail_alloc_after(size_t n) {
    gcomp__alloc_fail_after = n;
}

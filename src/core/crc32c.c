/*
 * crc32c.c - the CRC-32C reference hook, one of libgradcomp's exported internals.
 *
 * CRC-32C itself is in src/common/checksum.c, shared with libgradcomp_mpi, and hidden in
 * both.  The tests (tests/unit/test_core.c, tests/python/test_core.py) check the fast
 * path against the byte-table reference through this export, which stays here so that
 * only libgradcomp has it and the MPI library's export list does not grow.
 */
#include "core/internal.h"

GCOMP_API uint32_t gcomp__crc32c_ref(uint32_t crc, const void *data, size_t len);
uint32_t gcomp__crc32c_ref(uint32_t crc, const void *data, size_t len) {
    return gcomp__crc32c_portable(crc, data, len);
}

/*
 * status.c - status names and the version (error detail: gcomp__fail, src/common/error.c).
 */
#include "core/internal.h"

const char *gcomp_status_str(gcomp_status s) {
    switch (s) {
    case GCOMP_OK:
        return "ok";
    case GCOMP_E_ARG:
        return "invalid argument";
    case GCOMP_E_NOMEM:
        return "out of memory";
    case GCOMP_E_SPEC:
        return "invalid spec";
    case GCOMP_E_UNKNOWN_CODEC:
        return "unknown codec";
    case GCOMP_E_DST_SIZE:
        return "destination buffer too small";
    case GCOMP_E_TRUNCATED:
        return "message truncated";
    case GCOMP_E_BAD_MAGIC:
        return "not a gradcomp message (bad magic)";
    case GCOMP_E_VERSION:
        return "unsupported format version";
    case GCOMP_E_CODEC_ID:
        return "unknown codec id in message";
    case GCOMP_E_CHECKSUM:
        return "checksum mismatch (corrupt data)";
    case GCOMP_E_CORRUPT:
        return "corrupt message (invalid content)";
    case GCOMP_E_MISMATCH:
        return "settings or sizes differ";
    case GCOMP_E_NONFINITE:
        return "gradient contains NaN or Inf";
    case GCOMP_E_STATE:
        return "invalid or foreign saved state";
    case GCOMP_E_LIMIT:
        return "size limit exceeded";
    case GCOMP_E_PROTOCOL:
        return "calls made in the wrong order";
    case GCOMP_E_TIMEOUT:
        return "timed out";
    case GCOMP_E_MPI:
        return "MPI error";
    case GCOMP_E_FAILED:
        return "object is in a failed state";
    case GCOMP_E_UNSUPPORTED:
        return "not supported";
    case GCOMP_E_IO:
        return "I/O error";
    }
    return "unknown status";
}

const char *gcomp_version(void) {
    return "0.1.0";
}

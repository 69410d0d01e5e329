/*
 * repro_check.c - messages that must be refused with one exact status, whatever the
 * receiver does with them: `repro_check STATUS FILE...` (STATUS a number or a name such as
 * CORRUPT).  Each file is decoded into a zeroed accumulator of the size its header claims
 * (when that is at most 2^24 elements) and validated alone (acc = NULL), at scales from
 * 1e-30 to 1e30 of both signs.  Passes only when every call returns STATUS, the
 * accumulator is untouched, and the library allocated at most 64 bytes per message byte
 * plus 16 per accumulator element (fuzz_alloc.c).  ctest runs it once more under
 * `ulimit -v` in builds without sanitizers, so an allocation from the header's counts is
 * also seen as GCOMP_E_NOMEM instead of the expected status.
 *
 * The inputs are the ones the fuzzers found (tests/fuzz/regress/decode/): a PowerSGD
 * message whose product overflows float below scale 1 (psgd_overflow.gcm) and a 68-byte
 * sparse message whose counts ask for 5.7 GB (sparse_bigalloc.gcm).
 */
#include "fuzz_alloc.h"
#include "gradcomp.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {
    "OK",        "ARG",       "NOMEM",       "SPEC",     "UNKNOWN_CODEC", "DST_SIZE",
    "TRUNCATED", "BAD_MAGIC", "VERSION",     "CODEC_ID", "CHECKSUM",      "CORRUPT",
    "MISMATCH",  "NONFINITE", "STATE",       "LIMIT",    "PROTOCOL",      "TIMEOUT",
    "MPI",       "FAILED",    "UNSUPPORTED", "IO"};

static int parse_status(const char *s) {
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i])) return (int)i;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 ? -1 : (int)v;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len == cap) {
            uint8_t *nb = realloc(buf, cap = cap ? 2 * cap : 4096);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + *len, 1, cap - *len, f);
        if (!got) break;
        *len += got;
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: repro_check STATUS FILE...\n");
        return 2;
    }
    int want = parse_status(argv[1]);
    if (want < 0) {
        fprintf(stderr, "repro_check: unknown status %s\n", argv[1]);
        return 2;
    }
    fuzz_alloc_selftest();
    static const float scales[] = {1.0f,   0.5f,    0.25f,    1e-3f,  1e-30f, 0.0f,
                                   -0.0f,  -0.5f,   -1.0f,    2.0f,   1e10f,  1e30f,
                                   -1e30f, FLT_MIN, 1.0f / 3, 0.999f, 0.1f};
    int bad = 0;
    for (int a = 2; a < argc; a++) {
        size_t len;
        uint8_t *msg = read_all(argv[a], &len);
        if (!msg) {
            fprintf(stderr, "repro_check: cannot read %s\n", argv[a]);
            return 2;
        }
        gcomp_message_info info;
        gcomp_status ist = gcomp_message_inspect(msg, len, &info);
        size_t n = ist == GCOMP_OK || info.n ? (size_t)info.n : 0;
        float *acc = n && n <= ((size_t)1 << 24) ? calloc(n, sizeof(float)) : NULL;
        for (size_t s = 0; s < sizeof scales / sizeof *scales; s++) {
            for (int mode = 0; mode < 2; mode++) {
                float *dst = mode ? NULL : acc;
                if (!mode && !acc) continue;
                fuzz_alloc_begin((size_t)-1);
                gcomp_status st = gcomp_decode_add(msg, len, dst, dst ? n : 0, scales[s]);
                size_t used = fuzz_alloc_bytes;
                fuzz_alloc_end();
                size_t limit = 64 * len + (dst ? 16 * n : 0) + 4096;
                if ((int)st != want) {
                    fprintf(stderr, "%s: scale %g, acc %s: status %s (%d), want %s\n", argv[a],
                            (double)scales[s], dst ? "given" : "NULL", gcomp_status_str(st),
                            (int)st, argv[1]);
                    bad++;
                }
                if (used > limit) {
                    fprintf(stderr, "%s: scale %g, acc %s: allocated %zu bytes, limit %zu\n",
                            argv[a], (double)scales[s], dst ? "given" : "NULL", used, limit);
                    bad++;
                }
                for (size_t i = 0; dst && i < n; i++)
                    if (dst[i] != 0.0f || signbit(dst[i])) {
                        fprintf(stderr, "%s: scale %g: accumulator changed at %zu (%g)\n", argv[a],
                                (double)scales[s], i, (double)dst[i]);
                        memset(dst, 0, n * sizeof(float));
                        bad++;
                        break;
                    }
            }
        }
        free(acc);
        free(msg);
    }
    printf("repro_check: %d file(s), %d failure(s)\n", argc - 2, bad);
    return bad != 0;
}

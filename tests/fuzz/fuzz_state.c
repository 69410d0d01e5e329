/*
 * fuzz_state.c - libFuzzer target: state blobs (checkpoints) into the core's loaders,
 * gcomp_compressor_from_state and gcomp_state_load.
 *
 * Input: one parameter byte, then the blob.
 *   bit 0    repair: set the blob's total length and its CRC-32C (docs/FORMAT.md, "state"),
 *            so the fuzzer gets past the checksum to the fields and sections
 *   bits 1-7 which compressor of the table below gcomp_state_load is tried on
 * The seed corpus (make_corpus.c) holds real blobs of every codec after a few steps.
 *
 * Properties:
 *   - no crash (ASan, UBSan);
 *   - gcomp_state_load either succeeds or leaves the compressor's state byte-identical;
 *   - a blob that from_state accepts is a working compressor: its state survives
 *     save -> from_state -> save byte for byte, every residual it holds is finite, and it
 *     encodes a finite gradient (GCOMP_OK, or GCOMP_E_NONFINITE only when its residual is
 *     beyond 1e6 -- then with the state unchanged);
 *   - allocation: a blob claiming n elements may cost what a compressor of n costs, so
 *     above 2^16 elements the allocator refuses past 64 bytes per blob byte (fuzz_alloc.c,
 *     soft limit) and the loader must answer a clean status, never crash.
 *
 * An input with the adaptive controllers' magic ("GCad", gcomp_adapt_load_state) also goes
 * into fz_adapt_make's object after a few steps (the repair bit fixes its length's low word
 * and its CRC the same way): a refused load leaves that object's saved state byte-identical; an
 * accepted one survives save -> load -> save byte for byte, every tensor's level is on the
 * ladder (its spec the ladder's), and the object still decides.
 *
 * The MPI layer's bucket blob ("GCmb", gcomp_mpi_bucket_load_state) is not fuzzed here: its
 * loader checks the blob against a live bucket (communicator size, rank, node layout,
 * per-tensor fingerprints), and a bucket exists only on an MPI communicator, so loading it
 * needs MPI_Init; the core blobs it frames are the ones fuzzed here.
 */
#include "fuzz_alloc.h"
#include "fuzz_common.h"
#include "gradcomp.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct target {
    const char *spec;
    size_t n, rows, cols;
} target;

/* Compressors with state of every kind: none, ef, dgc, twobit's residual, PowerSGD. */
static const target targets[] = {
    {"topk:density=0.1", 64, 0, 0},
    {"topk:density=0.1,feedback=ef", 64, 0, 0},
    {"dgc:density=0.1,warmup=2", 64, 0, 0},
    {"twobit:threshold=0.5", 64, 0, 0},
    {"powersgd:rank=2,min_compression_rate=0", 64, 8, 8},
    {"powersgd:rank=2,start_iter=1,values=f16", 64, 8, 8},
    {"sign:feedback=ef", 100, 10, 10},
    {"randomk:density=0.25,seed=5", 64, 0, 0},
};
#define NTARGETS (sizeof targets / sizeof targets[0])

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static blob save(const gcomp_compressor *c) {
    blob b;
    size_t cap = gcomp_state_bound(c);
    b.p = malloc(cap ? cap : 1);
    if (!b.p || gcomp_state_save(c, b.p, cap, &b.len) != GCOMP_OK) abort();
    return b;
}

static blob adapt_save(const gcomp_adapt *a) {
    blob b;
    size_t cap = gcomp_adapt_state_bound(a);
    b.p = malloc(cap);
    if (!b.p || gcomp_adapt_save_state(a, b.p, cap, &b.len) != GCOMP_OK) abort();
    return b;
}

static int same(blob a, blob b) {
    return a.len == b.len && !memcmp(a.p, b.p, a.len);
}

static void check_loaded(gcomp_compressor *c) {
    size_t n = gcomp_compressor_size(c);
    float *e = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    if (!e || !g) abort();
    const float *r = gcomp_compressor_residual(c);
    if (r)
        memcpy(e, r, n * sizeof(float));
    else if (gcomp_lowrank_residual(c, e) != GCOMP_OK)
        memset(e, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(e[i])) abort(); /* a loaded residual holds Inf or NaN */
    blob s1 = save(c);
    gcomp_compressor *c2 = NULL;
    if (gcomp_compressor_from_state(&c2, s1.p, s1.len, NULL) != GCOMP_OK) abort();
    blob s2 = save(c2);
    if (!same(s1, s2)) abort(); /* save -> load -> save changed the state */
    gcomp_compressor_free(c2);
    free(s2.p);
    for (size_t i = 0; i < n; i++) g[i] = (float)((int)(i % 11) - 5) * 0.25f;
    size_t cap = gcomp_encode_bound(c), len;
    uint8_t *m = malloc(cap);
    if (!m) abort();
    gcomp_status st = gcomp_encode(c, g, m, cap, &len);
    if (st == GCOMP_E_NONFINITE) {
        /* Fine when a residual (or DGC's momentum, which it does not show) is huge. */
        const char *spec = gcomp_compressor_spec(c);
        int dgc = strstr(spec, "feedback=dgc") != NULL || !strncmp(spec, "dgc:", 4);
        if (fz_maxabs(e, n) <= 1e6f && !dgc) abort(); /* refused a sane step */
        blob s3 = save(c);
        if (!same(s1, s3)) abort(); /* the refusal changed the state */
        free(s3.p);
    } else if (st != GCOMP_OK) {
        abort();
    }
    free(m);
    free(s1.p);
    free(e);
    free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc_selftest();
    if (size < 1 || size > ((size_t)1 << 20)) return 0;
    const unsigned p0 = data[0];
    size_t len = size - 1;
    uint8_t *b = malloc(len ? len : 1);
    if (!b) return 0;
    memcpy(b, data + 1, len);
    if ((p0 & 1) && len >= 16) {
        fz_put32(b + 8, (uint32_t)len);
        fz_put32(b + len - 4, fz_crc32c(b, len - 4));
    }
    const uint64_t claimed = len >= 24 ? fz_get64(b + 16) : 0;
    const size_t limit = 64 * len + ((size_t)1 << 20);

    /* from_state: what the blob claims may be allocated, up to 2^16 elements. */
    gcomp_compressor *c = NULL;
    if (claimed <= 65536)
        fuzz_alloc_begin(limit + 64 * (size_t)claimed);
    else
        fuzz_alloc_begin_soft(limit);
    gcomp_status st = gcomp_compressor_from_state(&c, b, len, NULL);
    fuzz_alloc_end();
    if ((st == GCOMP_OK) != (c != NULL)) abort();
    if (c) {
        /* A state without per-element parts (feedback none) legitimately claims any n; the
         * encode of check_loaded would then take minutes (found as a timeout). */
        if (gcomp_compressor_size(c) <= 65536) check_loaded(c);
        gcomp_compressor_free(c);
    }

    /* state_load into a live compressor: all or nothing. */
    const target *t = &targets[(p0 >> 1) % NTARGETS];
    gcomp_compressor *live = NULL;
    if (gcomp_compressor_create(&live, t->spec, t->n, t->rows, t->cols, NULL) != GCOMP_OK) abort();
    float g[128];
    for (size_t i = 0; i < t->n; i++) g[i] = (float)((int)(i * 7 % 13) - 6) * 0.5f;
    size_t cap = gcomp_encode_bound(live), mlen;
    uint8_t *m = malloc(cap);
    if (!m || gcomp_encode(live, g, m, cap, &mlen) != GCOMP_OK) abort();
    free(m);
    blob before = save(live);
    fuzz_alloc_begin(limit);
    st = gcomp_state_load(live, b, len);
    fuzz_alloc_end();
    blob after = save(live);
    if (st != GCOMP_OK && !same(before, after)) abort(); /* a refused load changed state */
    if (st == GCOMP_OK) check_loaded(live);
    free(before.p);
    free(after.p);
    gcomp_compressor_free(live);

    /* the adaptive controllers' state: all or nothing, then a working object.  Only for
     * inputs with its magic: any other is refused at the first check, and building the
     * object costs 30 times a compressor blob's load (the fuzzer's throughput). */
    if (len < 4 || memcmp(b, "GCad", 4)) {
        free(b);
        return 0;
    }
    gcomp_adapt *ad = fz_adapt_make();
    if (!ad) abort();
    fz_adapt_run(ad, 3);
    blob ab = adapt_save(ad);
    fuzz_alloc_begin(limit);
    st = gcomp_adapt_load_state(ad, b, len, NULL);
    fuzz_alloc_end();
    blob aa = adapt_save(ad);
    if (st != GCOMP_OK && !same(ab, aa)) abort(); /* a refused load changed the state */
    if (st == GCOMP_OK) {
        gcomp_adapt *ad2 = fz_adapt_make();
        if (!ad2 || gcomp_adapt_load_state(ad2, aa.p, aa.len, NULL) != GCOMP_OK) abort();
        blob a2 = adapt_save(ad2);
        if (!same(aa, a2)) abort(); /* save -> load -> save changed the state */
        free(a2.p);
        gcomp_adapt_free(ad2);
        for (size_t i = 0; i < gcomp_adapt_count(ad); i++) { /* what a caller retunes to */
            int lv = gcomp_adapt_level(ad, i);
            const char *sp = gcomp_adapt_spec(ad, i);
            if (!sp || lv >= (int)gcomp_adapt_ladder_size(ad) ||
                (lv >= 0 && strcmp(sp, gcomp_adapt_candidate(ad, (size_t)lv))))
                abort(); /* a loaded level outside the ladder */
        }
        fz_adapt_run(ad, 5); /* decides from the loaded state */
    }
    free(ab.p);
    free(aa.p);
    gcomp_adapt_free(ad);
    free(b);
    return 0;
}

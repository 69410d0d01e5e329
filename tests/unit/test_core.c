/*
 * test_core.c - the core's building blocks: CRC-32C, half conversions, index codings,
 * the spec grammar and canonical form, the message header.
 */
#include "check.h"
#include "core/internal.h"

GCOMP_API uint32_t gcomp__crc32c_ref(uint32_t crc, const void *data, size_t len);

static void test_crc(void) {
    CHECK(gcomp__crc32c(0, "123456789", 9) == 0xe3069283u);
    CHECK(gcomp__crc32c_ref(0, "123456789", 9) == 0xe3069283u);
    /* The 3-stream hardware path against the byte-table reference, at sizes around its
     * split points and at odd alignments. */
    size_t n = 200000;
    uint8_t *buf = malloc(n + 8);
    unsigned long long s = 1;
    for (size_t i = 0; i < n + 8; i++) buf[i] = (uint8_t)test_rng_next_(&s);
    size_t sizes[] = {0, 1, 7, 8, 63, 4096, 24575, 24576, 24577, 24583, 100000, 199999};
    for (size_t a = 0; a < 3; a++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            CHECK_MSG(gcomp__crc32c(0x1234, buf + a, sizes[i]) ==
                          gcomp__crc32c_ref(0x1234, buf + a, sizes[i]),
                      "size %zu offset %zu", sizes[i], a);
    free(buf);
}

static void test_half(void) {
    /* Every f16 bit pattern that is finite round-trips exactly through f32. */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u) continue;
        float f = gcomp__f16_to_f32((uint16_t)h);
        CHECK_MSG(gcomp__f32_to_f16(f) == h || (f == 0.0f && (h & 0x7fffu) == 0), "h=%04x", h);
    }
    CHECK(gcomp__f32_to_f16(65504.0f) == 0x7bffu);
    CHECK(gcomp__f32_to_f16(65520.0f) == 0x7c00u);              /* rounds to inf, as IEEE says */
    CHECK(gcomp__f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3c00u); /* tie -> even */
    CHECK(gcomp__f32_to_f16(1.0f + 3.0f / 2048.0f) == 0x3c02u);
    CHECK(gcomp__bf16_to_f32(gcomp__f32_to_bf16(1.0f)) == 1.0f);
    CHECK(gcomp__f32_to_bf16(1.0f + 1.0f / 256.0f) == 0x3f80u); /* tie -> even */
}

static void roundtrip_index(const uint32_t *idx, size_t k, size_t n) {
    size_t cap = gcomp__index_bound(k, n), len;
    uint8_t *buf = malloc(cap + 1);
    uint32_t *out = malloc((k + 1) * 4);
    unsigned kind;
    CHECK_OK(gcomp__index_encode(idx, k, n, buf, cap, &len, &kind));
    CHECK(len <= cap);
    CHECK_OK(gcomp__index_decode(kind, buf, len, k, n, out));
    CHECK(memcmp(idx, out, k * 4) == 0);
    /* Every other coding of the same set must be refused or decode to the same set;
     * a truncated one is refused. */
    if (len > 0) CHECK(gcomp__index_decode(kind, buf, len - 1, k, n, out) != GCOMP_OK);
    free(buf);
    free(out);
}

static void test_index(void) {
    unsigned long long s = 7;
    size_t ns[] = {1, 2, 7, 64, 1000, 100003};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        size_t n = ns[a];
        uint32_t *idx = malloc(n * 4);
        double dens[] = {0.0, 0.0005, 0.01, 0.2, 0.7, 1.0};
        for (size_t d = 0; d < sizeof dens / sizeof *dens; d++) {
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (test_uniform(&s) < dens[d]) idx[k++] = (uint32_t)i;
            roundtrip_index(idx, k, n);
        }
        free(idx);
    }
    /* Choice: very sparse -> Elias-Fano, dense -> bitmap. */
    uint32_t sparse[3] = {5, 500000, 999999};
    uint8_t buf[4096];
    size_t len;
    unsigned kind;
    CHECK_OK(gcomp__index_encode(sparse, 3, 1000000, buf, sizeof buf, &len, &kind));
    CHECK(kind == GCOMP__IX_VARINT || kind == GCOMP__IX_ELIAS_FANO);
    /* Hostile input: a varint that runs past 32 bits, duplicates, out of range. */
    uint8_t evil[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    uint32_t out[4];
    CHECK(gcomp__index_decode(GCOMP__IX_VARINT, evil, sizeof evil, 1, 1000, out) ==
          GCOMP_E_CORRUPT);
    uint8_t big[] = {0xe8, 0x07}; /* 1000 */
    CHECK(gcomp__index_decode(GCOMP__IX_VARINT, big, 2, 1, 1000, out) == GCOMP_E_CORRUPT);
    CHECK(gcomp__index_decode(GCOMP__IX_VARINT, big, 2, 1, 1001, out) == GCOMP_OK &&
          out[0] == 1000);
    uint8_t bm[] = {0xff};
    CHECK(gcomp__index_decode(GCOMP__IX_BITMAP, bm, 1, 8, 7, out) ==
          GCOMP_E_CORRUPT); /* bit 7 >= n */
    CHECK(gcomp__index_decode(99, bm, 1, 1, 8, out) == GCOMP_E_CORRUPT);
    /* Seeded: distinct, ascending, reproducible. */
    gcomp__buf scratch = {0};
    uint32_t a1[100], a2[100];
    CHECK_OK(gcomp__seeded_indices(42, 1000, 100, a1, &scratch));
    CHECK_OK(gcomp__seeded_indices(42, 1000, 100, a2, &scratch));
    CHECK(memcmp(a1, a2, sizeof a1) == 0);
    for (int i = 1; i < 100; i++) CHECK(a1[i] > a1[i - 1]);
    CHECK(a1[99] < 1000);
    CHECK_OK(gcomp__seeded_indices(43, 1000, 100, a2, &scratch));
    CHECK(memcmp(a1, a2, sizeof a1) != 0);
    gcomp__buf_free(&scratch);
}

static void test_spec(void) {
    char out[600];
    uint64_t f1, f2;
    gcomp_error err;
    CHECK_OK(gcomp_spec_canonical("topk:density=0.001", out, sizeof out, &f1, &err));
    CHECK(strcmp(out, "topk:density=0.001,values=f32,feedback=none,seed=0") == 0);
    CHECK_OK(gcomp_spec_canonical(" topk : values = f32 , density=1e-3,feedback=none ", out,
                                  sizeof out, &f2, &err));
    CHECK(f1 == f2); /* spelled differently, same method */
    CHECK_OK(gcomp_spec_canonical("topk:density=0.002", out, sizeof out, &f2, &err));
    CHECK(f1 != f2);
    struct {
        const char *spec;
        gcomp_status st;
        const char *says;
    } bad[] = {
        {"", GCOMP_E_SPEC, "empty codec name"},
        {"tpok", GCOMP_E_UNKNOWN_CODEC, "known: none, topk"},
        {"topk:densty=0.1", GCOMP_E_SPEC, "unknown key 'densty'; allowed: density, min_k, values"},
        {"topk:density=0", GCOMP_E_SPEC, "must be a number in (0, 1]"},
        {"topk:density=1.5", GCOMP_E_SPEC, "density=1.5"},
        {"topk:density=abc", GCOMP_E_SPEC, "density=abc"},
        {"topk:density=nan", GCOMP_E_SPEC, "density=nan"},
        {"topk:density", GCOMP_E_SPEC, "expected key=value"},
        {"topk:density=0.1,density=0.2", GCOMP_E_SPEC, "given twice"},
        {"topk:values=f17", GCOMP_E_SPEC, "values=f17 is not a value coder"},
        {"topk:feedback=maybe", GCOMP_E_SPEC, "feedback=maybe"},
        {"topk:seed=-1", GCOMP_E_SPEC, "seed=-1"},
        {"topk:seed=18446744073709551615", GCOMP_E_SPEC,
         "seed must be an integer in [0, 9007199254740991]"},
        {"topk:density=0.1,", GCOMP_E_SPEC, "empty item"},
        {"topk:,", GCOMP_E_SPEC, "empty item"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&err, 0, sizeof err);
        gcomp_status st = gcomp_spec_canonical(bad[i].spec, out, sizeof out, NULL, &err);
        CHECK_MSG(st == bad[i].st, "'%s' gave %d", bad[i].spec, st);
        CHECK_MSG(err.status == st && strstr(err.message, bad[i].says), "'%s': message '%s'",
                  bad[i].spec, err.message);
    }
    CHECK(gcomp_spec_canonical("topk", out, 10, NULL, NULL) == GCOMP_E_DST_SIZE);
    /* Every registered codec parses with its defaults and names itself first. */
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        CHECK_MSG(gcomp_spec_canonical(ci->name, out, sizeof out, NULL, &err) == GCOMP_OK, "%s: %s",
                  ci->name, err.message);
        CHECK(strncmp(out, ci->name, strlen(ci->name)) == 0);
        CHECK(gcomp_codec_by_id(ci->id) == ci);
        CHECK(gcomp_codec_find(ci->name) == ci);
    }
    CHECK(gcomp_codec_at(gcomp_codec_count()) == NULL);
    CHECK(strcmp(gcomp_status_str(GCOMP_E_CHECKSUM), "checksum mismatch (corrupt data)") == 0);
}

static void test_create_errors(void) {
    gcomp_compressor *c = (gcomp_compressor *)1;
    gcomp_error err;
    CHECK(gcomp_compressor_create(&c, "topk", 0, 0, 0, &err) == GCOMP_E_ARG && c == NULL);
    CHECK(gcomp_compressor_create(&c, "topk", 10, 3, 3, &err) == GCOMP_E_ARG);
    CHECK(strstr(err.message, "3x3") != NULL);
    CHECK(gcomp_compressor_create(&c, "topk", (size_t)1 << 33, 0, 0, &err) == GCOMP_E_LIMIT);
    CHECK(gcomp_compressor_create(&c, NULL, 10, 0, 0, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_compressor_create(NULL, "topk", 10, 0, 0, NULL) == GCOMP_E_ARG);
    gcomp_compressor_free(NULL);
    CHECK(gcomp_encode_bound(NULL) == 0);
}

int main(void) {
    test_crc();
    test_half();
    test_index();
    test_spec();
    test_create_errors();
    return CHECK_DONE();
}

/*
 * test_spec_info.c - specs that describe themselves: gcomp_spec_describe, and reading and
 * setting one parameter (gcomp_spec_get / _get_number / _set).
 *
 * The expectations below are the contract a transport codes against (the MPI layer picks
 * its strategy and seeds from these flags), written out per spec by hand.  The agreement
 * test then holds GCOMP_SPEC_CONTRACTION to what gcomp_compressor_create really does with
 * feedback=ef, over every codec, value coder and a grid of sizes and parameters.
 */
#include "check.h"
#include "gradcomp.h"

#include <stdint.h>

#define ALL_FLAGS 0x3fffu

/* Copies the next `sep`-separated word of *p into out and moves *p past it; 0 at the end. */
static int next_word(const char **p, char sep, char *out, size_t cap) {
    if (!*p) return 0;
    const char *end = strchr(*p, sep);
    size_t len = end ? (size_t)(end - *p) : strlen(*p);
    snprintf(out, cap, "%.*s", (int)len, *p);
    *p = end ? end + 1 : NULL;
    return 1;
}

typedef struct expect {
    const char *spec;
    size_t n;
    unsigned flags; /* exactly these */
    gcomp_value_type type;
    double bits, density;
    unsigned phases;
    const char *values, *feedback;
} expect;

enum {
    SP = GCOMP_SPEC_SPARSE,
    LIN = GCOMP_SPEC_LINEAR,
    SEED = GCOMP_SPEC_SEEDED_POSITIONS,
    PRIV = GCOMP_SPEC_PRIVATE_DRAWS,
    SHARED = GCOMP_SPEC_SHARED_DRAWS,
    MULTI = GCOMP_SPEC_MULTIPHASE,
    SHAPE = GCOMP_SPEC_NEEDS_SHAPE,
    QUANT = GCOMP_SPEC_QUANTIZER,
    CONTR = GCOMP_SPEC_CONTRACTION,
    SAT = GCOMP_SPEC_SATURATING,
    FB = GCOMP_SPEC_FEEDBACK,
    MOM = GCOMP_SPEC_MOMENTUM,
    FIXED = GCOMP_SPEC_FIXED_FEEDBACK,
    UNB = GCOMP_SPEC_UNBIASED,
};

static const expect table[] = {
    {"none", 0, LIN | CONTR | UNB, GCOMP_VALUES_F32, 32, 1, 0, "f32", "none"},
    {"none:values=f16", 1000, LIN | CONTR, GCOMP_VALUES_F16, 16, 1, 0, "f16", "none"},
    {"none:values=bf16,feedback=ef", 0, LIN | CONTR | FB, GCOMP_VALUES_BF16, 16, 1, 0, "bf16",
     "ef"},
    {"none:values=int8", 0, QUANT | CONTR, GCOMP_VALUES_OTHER, 8, 1, 0, "int8", "none"},
    {"topk", 0, SP | CONTR, GCOMP_VALUES_F32, 32, 0.01, 0, "f32", "none"},
    {"topk", 150, SP | CONTR, GCOMP_VALUES_F32, 32, 2.0 / 150, 0, "f32", "none"},
    {"topk:values=qsgd", 0, SP | PRIV | CONTR, GCOMP_VALUES_OTHER, 6, 0.01, 0, "qsgd", "none"},
    {"topk:feedback=dgc", 0, SP | CONTR | FB | MOM, GCOMP_VALUES_F32, 32, 0.01, 0, "f32", "dgc"},
    {"threshold", 0, SP | CONTR, GCOMP_VALUES_F32, 32, 1, 0, "f32", "none"},
    {"sampled:density=0.002", 0, SP | PRIV | CONTR, GCOMP_VALUES_F32, 32, 0.002, 0, "f32", "none"},
    {"randomk:values=f16", 0, SP | LIN | SEED | SHARED | CONTR, GCOMP_VALUES_F16, 16, 0.01, 0,
     "f16", "none"},
    {"randomk:unbiased=1", 0, SP | LIN | SEED | SHARED | UNB, GCOMP_VALUES_F32, 32, 0.01, 0, "f32",
     "none"},
    {"randomk:unbiased=1,values=qsgd", 0, SP | SEED | SHARED | PRIV | UNB, GCOMP_VALUES_OTHER, 6,
     0.01, 0, "qsgd", "none"},
    {"randomk:values=int8", 0, SP | SEED | SHARED | CONTR, GCOMP_VALUES_OTHER, 8, 0.01, 0, "int8",
     "none"},
    {"bernoulli:density=0.05", 4096, SP | PRIV | UNB, GCOMP_VALUES_F32, 32, 0.05, 0, "f32", "none"},
    {"importance", 0, SP | PRIV | UNB, GCOMP_VALUES_F32, 32, 0.01, 0, "f32", "none"},
    {"block:density=0.5,block=10", 25, SP | CONTR, GCOMP_VALUES_F32, 32, 20.0 / 25, 0, "f32",
     "none"},
    {"rows", 0, SP | SHAPE | CONTR, GCOMP_VALUES_F32, 32, 0.01, 0, "f32", "none"},
    {"cols:values=sign", 4096, SP | SHAPE | CONTR, GCOMP_VALUES_OTHER, 1, 0.01, 0, "sign", "none"},
    {"dgc", 0, SP | CONTR | FB | MOM | FIXED, GCOMP_VALUES_F32, 32, 0.001, 0, "f32", "dgc"},
    {"int8", 0, QUANT | CONTR, GCOMP_VALUES_OTHER, 8, 1, 0, "int8", "none"},
    {"int4:rounding=stochastic", 0, QUANT | CONTR | PRIV | UNB, GCOMP_VALUES_OTHER, 4, 1, 0, "int4",
     "none"},
    {"sign:feedback=ef", 0, QUANT | CONTR | FB, GCOMP_VALUES_OTHER, 1, 1, 0, "sign", "ef"},
    {"twobit", 0, QUANT | CONTR | SAT | FB | FIXED, GCOMP_VALUES_OTHER, 2, 1, 0, "twobit", "ef"},
    {"ternary", 0, QUANT | PRIV | UNB, GCOMP_VALUES_OTHER, 2, 1, 0, "ternary", "none"},
    {"ternary:bucket=8", 0, QUANT | PRIV | UNB | CONTR, GCOMP_VALUES_OTHER, 2, 1, 0, "ternary",
     "none"},
    {"qsgd", 0, QUANT | PRIV | UNB | CONTR, GCOMP_VALUES_OTHER, 6, 1, 0, "qsgd", "none"},
    {"qsgd:levels=4", 0, QUANT | PRIV | UNB, GCOMP_VALUES_OTHER, 4, 1, 0, "qsgd", "none"},
    /* In buckets of at most 16 values, 4 levels are a contraction: d/4s^2 = 1/4. */
    {"qsgd:levels=4", 16, QUANT | PRIV | UNB | CONTR, GCOMP_VALUES_OTHER, 4, 1, 0, "qsgd", "none"},
    {"qsgd:levels=255,bucket=0", 0, QUANT | PRIV | UNB, GCOMP_VALUES_OTHER, 9, 1, 0, "qsgd",
     "none"},
    {"natural", 0, QUANT | PRIV | UNB | CONTR, GCOMP_VALUES_OTHER, 9, 1, 0, "natural", "none"},
    {"bernoulli:values=natural", 0, SP | PRIV | UNB, GCOMP_VALUES_OTHER, 9, 0.01, 0, "natural",
     "none"},
    {"powersgd", 0, MULTI | SHAPE | SHARED | FB | FIXED, GCOMP_VALUES_F32, 32, 1, 2, "f32", "none"},
    {"powersgd:iters=3,values=f16", 4096, MULTI | SHAPE | SHARED | FB | FIXED, GCOMP_VALUES_F16, 16,
     1, 6, "f16", "none"},
};

static void test_describe_table(void) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const expect *e = &table[i];
        gcomp_spec_info info;
        gcomp_error err;
        gcomp_status st = gcomp_spec_describe(e->spec, e->n, &info, &err);
        CHECK_MSG(st == GCOMP_OK, "%s: %s", e->spec, err.message);
        if (st != GCOMP_OK) continue;
        CHECK_MSG(info.flags == e->flags, "%s n=%zu: flags %#x, expected %#x (differ %#x)", e->spec,
                  e->n, info.flags, e->flags, info.flags ^ e->flags);
        CHECK_MSG(info.value_type == e->type, "%s: value_type %d", e->spec, (int)info.value_type);
        CHECK_MSG(info.value_bits == e->bits, "%s: bits %g", e->spec, info.value_bits);
        CHECK_MSG(fabs(info.density - e->density) < 1e-12, "%s n=%zu: density %.17g", e->spec, e->n,
                  info.density);
        CHECK_MSG(info.phases == e->phases, "%s: phases %u", e->spec, info.phases);
        CHECK_MSG(!strcmp(info.values, e->values), "%s: values '%s'", e->spec, info.values);
        CHECK_MSG(!strcmp(info.feedback, e->feedback), "%s: feedback '%s'", e->spec, info.feedback);
        size_t name_len = strcspn(e->spec, ":");
        CHECK(info.codec && strlen(info.codec->name) == name_len &&
              !strncmp(info.codec->name, e->spec, name_len));
        uint64_t fp;
        CHECK_OK(gcomp_spec_canonical(e->spec, NULL, 0, &fp, NULL));
        CHECK(info.fingerprint == fp);
        CHECK(info.seed == 0);
        CHECK((info.flags & ~ALL_FLAGS) == 0);
    }
    gcomp_spec_info info;
    CHECK_OK(gcomp_spec_describe("randomk:seed=12345", 0, &info, NULL));
    CHECK(info.seed == 12345);
    /* Errors: the spec's own, NULLs, a size the format cannot hold. */
    gcomp_error err;
    CHECK(gcomp_spec_describe("topk:densty=1", 0, &info, &err) == GCOMP_E_SPEC);
    CHECK(strstr(err.message, "densty") != NULL);
    CHECK(info.codec == NULL && info.flags == 0);
    CHECK(gcomp_spec_describe("nosuch", 0, &info, NULL) == GCOMP_E_UNKNOWN_CODEC);
    CHECK(gcomp_spec_describe(NULL, 0, &info, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_spec_describe("topk", 0, NULL, NULL) == GCOMP_E_ARG);
    if (sizeof(size_t) > 4)
        CHECK(gcomp_spec_describe("topk", (size_t)UINT32_MAX + 1, &info, NULL) == GCOMP_E_LIMIT);
}

/* ---- CONTRACTION agrees with what create does with feedback=ef ------------------------- */

/* spec with key=value when the spec has that key; false when it does not. */
static int try_set(char *spec, size_t cap, const char *key, const char *value) {
    char tmp[512];
    if (gcomp_spec_get(spec, key, tmp, sizeof tmp, NULL) != GCOMP_OK) return 0;
    gcomp_error err;
    gcomp_status st = gcomp_spec_set(spec, key, value, spec, cap, &err);
    CHECK_MSG(st == GCOMP_OK, "%s with %s=%s: %s", spec, key, value, err.message);
    return st == GCOMP_OK;
}

static size_t agreement_checked;

static void agree(const char *spec, int needs_shape) {
    static const size_t sizes[] = {1, 7, 16, 64, 100, 513, 4096, 65536};
    gcomp_spec_info any;
    gcomp_error err;
    gcomp_status st0 = gcomp_spec_describe(spec, 0, &any, &err);
    CHECK_MSG(st0 == GCOMP_OK, "%s: %s", spec, err.message);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        gcomp_spec_info info;
        st0 = gcomp_spec_describe(spec, n, &info, &err);
        CHECK_MSG(st0 == GCOMP_OK, "%s n=%zu: %s", spec, n, err.message);
        int contraction = (info.flags & GCOMP_SPEC_CONTRACTION) != 0;
        /* The worst case over every size implies the case at every size. */
        if (any.flags & GCOMP_SPEC_CONTRACTION) CHECK_MSG(contraction, "%s n=%zu", spec, n);
        if (info.flags & GCOMP_SPEC_FIXED_FEEDBACK) continue;
        char with_ef[512];
        st0 = gcomp_spec_set(spec, "feedback", "ef", with_ef, sizeof with_ef, &err);
        CHECK_MSG(st0 == GCOMP_OK, "%s: %s", spec, err.message);
        size_t rows = needs_shape ? (n % 4 == 0 ? 4 : 1) : 0, cols = needs_shape ? n / rows : 0;
        gcomp_compressor *c = NULL;
        gcomp_status st = gcomp_compressor_create(&c, with_ef, n, rows, cols, &err);
        gcomp_compressor_free(c);
        if (needs_shape) {
            /* n bounds the values of every shape: a contraction at n is one at any shape. */
            if (contraction)
                CHECK_MSG(st == GCOMP_OK, "%s n=%zu: describe says contraction, create: %s",
                          with_ef, n, err.message);
        } else {
            CHECK_MSG((st == GCOMP_OK) == contraction,
                      "%s n=%zu: describe says contraction=%d, create gives %s (%s)", with_ef, n,
                      contraction, gcomp_status_str(st), st ? err.message : "");
            if (st != GCOMP_OK) CHECK(st == GCOMP_E_SPEC);
        }
        agreement_checked++;
    }
}

static void test_contraction_agrees_with_create(void) {
    static const struct {
        const char *key, *value;
    } variants[] = {
        {NULL, NULL},
        {"levels", "4"},
        {"levels", "8"},
        {"levels", "12"},
        {"levels", "255"},
        {"bucket", "0"},
        {"bucket", "8"},
        {"bucket", "9"},
        {"bucket", "64"},
        {"unbiased", "1"},
        {"rounding", "stochastic"},
        {"density", "0.5"},
        {"density", "1"},
    };
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        const char *choices = NULL;
        for (size_t j = 0; j < ci->nparams; j++)
            if (!strcmp(ci->params[j].name, "values")) choices = ci->params[j].choices;
        const char *cursor = choices ? choices : "";
        char v[32];
        while (next_word(&cursor, '|', v, sizeof v)) {
            char base[512];
            snprintf(base, sizeof base, "%s", ci->name);
            if (choices) try_set(base, sizeof base, "values", v);
            for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
                char spec[512];
                snprintf(spec, sizeof spec, "%s", base);
                if (variants[k].key &&
                    !try_set(spec, sizeof spec, variants[k].key, variants[k].value))
                    continue;
                agree(spec, (ci->flags & GCOMP_CODEC_NEEDS_SHAPE) != 0);
                /* qsgd and ternary together with a bucket: the bound depends on both. */
                if (variants[k].key && !strcmp(variants[k].key, "levels")) {
                    if (try_set(spec, sizeof spec, "bucket", "16"))
                        agree(spec, (ci->flags & GCOMP_CODEC_NEEDS_SHAPE) != 0);
                }
            }
        }
    }
    printf("contraction agreement: %zu (spec, n) pairs\n", agreement_checked);
    CHECK(agreement_checked > 1000);
}

/* ---- get, get_number, set ---------------------------------------------------------------- */

static void expect_canonical(const char *got, const char *spec) {
    char want[512];
    CHECK_OK(gcomp_spec_canonical(spec, want, sizeof want, NULL, NULL));
    CHECK_MSG(!strcmp(got, want), "got %s, want %s", got, want);
}

static void test_get(void) {
    char out[64];
    double v;
    gcomp_error err;
    CHECK_OK(gcomp_spec_get("topk", "density", out, sizeof out, NULL));
    CHECK(!strcmp(out, "0.01"));
    CHECK_OK(gcomp_spec_get("topk:density=0.25,values=qsgd", "levels", out, sizeof out, NULL));
    CHECK(!strcmp(out, "16"));
    CHECK_OK(gcomp_spec_get("int8", "rounding", out, sizeof out, NULL));
    CHECK(!strcmp(out, "nearest"));
    CHECK_OK(gcomp_spec_get("randomk:seed=9", "seed", out, sizeof out, NULL));
    CHECK(!strcmp(out, "9"));
    CHECK_OK(gcomp_spec_get("dgc", "feedback", out, sizeof out, NULL));
    CHECK(!strcmp(out, "dgc"));
    CHECK_OK(gcomp_spec_get_number("int8:rounding=stochastic", "rounding", &v, NULL));
    CHECK(v == 1);
    CHECK_OK(gcomp_spec_get_number("topk:values=f16", "values", &v, NULL));
    CHECK(v == 1);
    CHECK_OK(gcomp_spec_get_number("randomk:unbiased=yes", "unbiased", &v, NULL));
    CHECK(v == 1);
    CHECK_OK(gcomp_spec_get_number("topk:density=0.125", "density", &v, NULL));
    CHECK(v == 0.125);
    /* Not a key of this spec: the message lists those that are. */
    CHECK(gcomp_spec_get("topk", "levels", out, sizeof out, &err) == GCOMP_E_SPEC);
    CHECK(strstr(err.message, "levels") && strstr(err.message, "density") &&
          strstr(err.message, "seed"));
    CHECK(gcomp_spec_get_number("int8", "values", &v, &err) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_get("topk", "density", out, 4, &err) == GCOMP_E_DST_SIZE);
    CHECK(gcomp_spec_get("topk", "density", out, 5, NULL) == GCOMP_OK);
    CHECK(gcomp_spec_get("topk:density=2", "density", out, sizeof out, NULL) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_get("nosuch", "density", out, sizeof out, NULL) == GCOMP_E_UNKNOWN_CODEC);
    CHECK(gcomp_spec_get(NULL, "density", out, sizeof out, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_spec_get("topk", NULL, out, sizeof out, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_spec_get_number("topk", "density", NULL, NULL) == GCOMP_E_ARG);
}

static void test_set(void) {
    char out[512];
    gcomp_error err;
    CHECK_OK(gcomp_spec_set("topk", "density", "0.5", out, sizeof out, NULL));
    expect_canonical(out, "topk:density=0.5");
    CHECK_OK(gcomp_spec_set("topk:density=0.5", "seed", "77", out, sizeof out, NULL));
    expect_canonical(out, "topk:density=0.5,seed=77");
    /* values= swaps the coder's keys: bucket is int8's too and stays, levels goes,
     * rounding comes with its default. */
    CHECK_OK(gcomp_spec_set("topk:values=qsgd,levels=4,bucket=64", "values", "int8", out,
                            sizeof out, NULL));
    expect_canonical(out, "topk:values=int8,bucket=64");
    CHECK_OK(gcomp_spec_set("topk:values=int8,rounding=stochastic", "values", "f16", out,
                            sizeof out, NULL));
    expect_canonical(out, "topk:values=f16");
    /* feedback= swaps the feedback's keys. */
    CHECK_OK(gcomp_spec_set("topk:feedback=dgc,momentum=0.5,warmup=2", "feedback", "ef", out,
                            sizeof out, NULL));
    expect_canonical(out, "topk:feedback=ef");
    CHECK_OK(gcomp_spec_set("topk:feedback=ef,seed=3", "feedback", "dgc", out, sizeof out, NULL));
    expect_canonical(out, "topk:feedback=dgc,seed=3");
    /* A key of the dgc feedback once it is there. */
    CHECK_OK(gcomp_spec_set(out, "momentum", "0.5", out, sizeof out, NULL));
    expect_canonical(out, "topk:feedback=dgc,seed=3,momentum=0.5");
    /* Fixed feedback: only the codec's own. */
    CHECK(gcomp_spec_set("dgc", "feedback", "ef", out, sizeof out, &err) == GCOMP_E_SPEC);
    CHECK(strstr(err.message, "feedback") != NULL);
    CHECK(gcomp_spec_set("twobit", "feedback", "none", out, sizeof out, NULL) == GCOMP_E_SPEC);
    CHECK_OK(gcomp_spec_set("twobit", "feedback", "ef", out, sizeof out, NULL));
    expect_canonical(out, "twobit");
    /* Bad keys and values. */
    CHECK(gcomp_spec_set("int8", "values", "f16", out, sizeof out, &err) == GCOMP_E_SPEC);
    CHECK(strstr(err.message, "bucket") != NULL);
    CHECK(gcomp_spec_set("topk", "density", "2", out, sizeof out, &err) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_set("topk", "density", "0.1,seed=3", out, sizeof out, NULL) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_set("topk", "density", "", out, sizeof out, NULL) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_set("topk", "values", "nosuch", out, sizeof out, &err) == GCOMP_E_SPEC);
    CHECK(strstr(err.message, "nosuch") != NULL);
    CHECK(gcomp_spec_set("topk", "density", "0.5", out, 8, NULL) == GCOMP_E_DST_SIZE);
    CHECK(gcomp_spec_set("topk", "density", NULL, out, sizeof out, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_spec_set("topk", "density", "0.5", NULL, sizeof out, NULL) == GCOMP_E_ARG);

    /* Setting every key of a spec to its own value is the canonical form. */
    static const char *specs[] = {"topk:values=qsgd,levels=5,feedback=dgc,warmup=2",
                                  "dgc:density=0.01,momentum=0.8",
                                  "block:block=16,values=ternary,bucket=8,feedback=ef",
                                  "powersgd:rank=2,values=f16",
                                  "int8:rounding=stochastic,seed=4",
                                  "randomk:unbiased=1,values=bf16"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        char canon[512], item[128], value[64];
        CHECK_OK(gcomp_spec_canonical(specs[i], canon, sizeof canon, NULL, NULL));
        const char *cursor = strchr(canon, ':') + 1;
        while (next_word(&cursor, ',', item, sizeof item)) {
            char *eq = strchr(item, '=');
            *eq = 0;
            const char *key = item;
            CHECK_OK(gcomp_spec_get(specs[i], key, value, sizeof value, NULL));
            CHECK_MSG(!strcmp(value, eq + 1), "%s: %s=%s, get gives %s", specs[i], key, eq + 1,
                      value);
            CHECK_OK(gcomp_spec_set(specs[i], key, value, out, sizeof out, NULL));
            CHECK_MSG(!strcmp(out, canon), "%s: set %s=%s gives %s", specs[i], key, value, out);
        }
    }
}

int main(void) {
    test_describe_table();
    test_contraction_agrees_with_create();
    test_get();
    test_set();
    return CHECK_DONE();
}

/*
 * test_policy.c - the layer-wise policy (gcomp_policy_*) and the bytes-per-step estimate:
 *   - the decision table for the tensors of a 784-1024-1024-10 MLP and of a LeNet-like
 *     CNN, under the default policy and under one with overrides;
 *   - the estimate equals the encode bound of a real compressor in the steady state
 *     (after warm-up), and real messages never exceed it;
 *   - the grammar: whitespace, empty items, globs (*, ?), first match wins, overrides
 *     beat the 1-D and size rules, dense_1d=0, dense=SPEC; every malformed policy is
 *     refused with GCOMP_E_SPEC (or UNKNOWN_CODEC) and a message naming the item;
 *   - a spec that needs a shape on a vector is refused at choose, naming the tensor;
 *   - min_k= floors the default spec's count, and only where the codec has the key;
 *   - failing allocations in create are clean.
 */
#include "check.h"
#include "gradcomp.h"
#include "core/internal.h"

typedef struct expect {
    const char *name;
    size_t rows, cols; /* cols 0: a vector of `rows` elements */
    gcomp_policy_rule rule;
    const char *spec;
} expect;

#define TOPK "topk:density=0.001,feedback=ef"

/* nn.Linear weights are out x in; conv weights out x (in * kh * kw). */
static const expect mlp_default[] = {
    {"fc1.weight", 1024, 784, GCOMP_RULE_DEFAULT, TOPK},
    {"fc1.bias", 1024, 0, GCOMP_RULE_1D, "none"},
    {"fc2.weight", 1024, 1024, GCOMP_RULE_DEFAULT, TOPK},
    {"fc2.bias", 1024, 0, GCOMP_RULE_1D, "none"},
    {"fc3.weight", 10, 1024, GCOMP_RULE_SMALL, "none"}, /* 10240 < 16384 */
    {"fc3.bias", 10, 0, GCOMP_RULE_1D, "none"},
};

static const expect lenet_default[] = {
    {"conv1.weight", 6, 25, GCOMP_RULE_SMALL, "none"},
    {"conv1.bias", 6, 0, GCOMP_RULE_1D, "none"},
    {"conv2.weight", 16, 150, GCOMP_RULE_SMALL, "none"},
    {"conv2.bias", 16, 0, GCOMP_RULE_1D, "none"},
    {"fc1.weight", 120, 400, GCOMP_RULE_DEFAULT, TOPK}, /* 48000 */
    {"fc1.bias", 120, 0, GCOMP_RULE_1D, "none"},
    {"fc2.weight", 84, 120, GCOMP_RULE_SMALL, "none"}, /* 10080 */
    {"fc2.bias", 84, 0, GCOMP_RULE_1D, "none"},
    {"fc3.weight", 10, 84, GCOMP_RULE_SMALL, "none"},
    {"fc3.bias", 10, 0, GCOMP_RULE_1D, "none"},
};

#define DGC "dgc:density=0.001,warmup=4"
#define POLICY2                                                                                    \
    " spec = " DGC " ; min_elements=10000;; dense=none:values=f16; fc3.*=topk:density=0.1 ;"       \
    "conv?.weight=block:density=0.1,block=8;"

static const expect mlp_2[] = {
    {"fc1.weight", 1024, 784, GCOMP_RULE_DEFAULT, DGC},
    {"fc1.bias", 1024, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"fc2.weight", 1024, 1024, GCOMP_RULE_DEFAULT, DGC},
    {"fc2.bias", 1024, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"fc3.weight", 10, 1024, GCOMP_RULE_OVERRIDE, "topk:density=0.1"},
    {"fc3.bias", 10, 0, GCOMP_RULE_OVERRIDE, "topk:density=0.1"}, /* override beats 1-D */
};

static const expect lenet_2[] = {
    {"conv1.weight", 6, 25, GCOMP_RULE_OVERRIDE, "block:density=0.1,block=8"},
    {"conv1.bias", 6, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"conv2.weight", 16, 150, GCOMP_RULE_OVERRIDE, "block:density=0.1,block=8"},
    {"conv2.bias", 16, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"fc1.weight", 120, 400, GCOMP_RULE_DEFAULT, DGC},
    {"fc1.bias", 120, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"fc2.weight", 84, 120, GCOMP_RULE_DEFAULT, DGC}, /* 10080 >= 10000 */
    {"fc2.bias", 84, 0, GCOMP_RULE_1D, "none:values=f16"},
    {"fc3.weight", 10, 84, GCOMP_RULE_OVERRIDE, "topk:density=0.1"},
    {"fc3.bias", 10, 0, GCOMP_RULE_OVERRIDE, "topk:density=0.1"},
};

/* The bound of the spec in the steady state: a real compressor without warm-up. */
static size_t steady_bound(const char *spec, size_t n, size_t rows, size_t cols) {
    char plain[256];
    snprintf(plain, sizeof plain, "%s", spec);
    char *w = strstr(plain, ",warmup=4");
    if (w) memmove(w, w + 9, strlen(w + 9) + 1);
    gcomp_compressor *c = NULL;
    CHECK_OK(gcomp_compressor_create(&c, plain, n, rows, cols, NULL));
    size_t b = gcomp_encode_bound(c);
    gcomp_compressor_free(c);
    return b;
}

static void check_table(const char *policy, const expect *e, size_t count, const char *model) {
    gcomp_policy *p = NULL;
    gcomp_error err;
    CHECK_MSG(gcomp_policy_create(&p, policy, &err) == GCOMP_OK, "%s", err.message);
    if (!p) return;
    double bytes = 0, dense = 0;
    printf("%s under \"%s\":\n", model, policy);
    for (size_t i = 0; i < count; i++) {
        size_t n = e[i].cols ? e[i].rows * e[i].cols : e[i].rows;
        gcomp_tensor_desc t = {e[i].name, n, e[i].cols ? e[i].rows : 0, e[i].cols};
        gcomp_layer_plan pl;
        CHECK_MSG(gcomp_policy_choose(p, &t, &pl, &err) == GCOMP_OK, "%s", err.message);
        CHECK_MSG(pl.rule == e[i].rule, "%s %s: rule %s", model, e[i].name, pl.reason);
        CHECK_MSG(pl.spec && !strcmp(pl.spec, e[i].spec), "%s %s: spec %s, want %s", model,
                  e[i].name, pl.spec, e[i].spec);
        CHECK((pl.rule == GCOMP_RULE_OVERRIDE) == (pl.pattern != NULL));
        CHECK_EQ_INT(pl.dense_bytes, 4 * n);
        CHECK_EQ_INT(pl.bytes, steady_bound(pl.spec, n, t.rows, t.cols));
        /* A real message of that spec, after warm-up, fits the estimate. */
        gcomp_compressor *c = NULL;
        CHECK_OK(gcomp_compressor_create(&c, pl.spec, n, t.rows, t.cols, NULL));
        if (c) {
            float *g = malloc(n * 4);
            uint8_t *m = malloc(gcomp_encode_bound(c));
            size_t len;
            test_fill(g, n, 7);
            CHECK_OK(gcomp_compressor_set_epoch(c, 10));
            CHECK_OK(gcomp_encode(c, g, m, gcomp_encode_bound(c), &len));
            CHECK_MSG(len <= pl.bytes && len * 1.05 + 32 >= pl.bytes, "%s: %zu bytes, estimate %zu",
                      e[i].name, len, pl.bytes);
            free(g);
            free(m);
            gcomp_compressor_free(c);
        }
        printf("  %-13s %-8s %-32s %8zu / %8zu bytes\n", e[i].name, pl.reason, pl.spec, pl.bytes,
               pl.dense_bytes);
        bytes += (double)pl.bytes;
        dense += (double)pl.dense_bytes;
    }
    printf("  total %.0f / %.0f bytes per step (%.1fx)\n", bytes, dense, dense / bytes);
    gcomp_policy_free(p);
}

static void test_tables(void) {
    check_table("", mlp_default, sizeof mlp_default / sizeof *mlp_default, "MLP 784-1024-1024-10");
    check_table("", lenet_default, sizeof lenet_default / sizeof *lenet_default, "LeNet");
    check_table(POLICY2, mlp_2, sizeof mlp_2 / sizeof *mlp_2, "MLP 784-1024-1024-10");
    check_table(POLICY2, lenet_2, sizeof lenet_2 / sizeof *lenet_2, "LeNet");
}

static gcomp_policy_rule rule_of(const char *policy, const char *name, size_t n, size_t rows,
                                 size_t cols, const char **spec) {
    gcomp_policy *p = NULL;
    gcomp_error err;
    CHECK_MSG(gcomp_policy_create(&p, policy, &err) == GCOMP_OK, "%s: %s", policy, err.message);
    if (!p) return (gcomp_policy_rule)-1;
    gcomp_tensor_desc t = {name, n, rows, cols};
    gcomp_layer_plan pl;
    CHECK_MSG(gcomp_policy_choose(p, &t, &pl, &err) == GCOMP_OK, "%s", err.message);
    static char keep[256];
    snprintf(keep, sizeof keep, "%s", pl.spec ? pl.spec : "");
    *spec = keep;
    gcomp_policy_free(p);
    return pl.rule;
}

static void test_grammar(void) {
    const char *spec;
    /* Globs. */
    CHECK(rule_of("x*=none", "x", 100000, 1000, 100, &spec) == GCOMP_RULE_OVERRIDE);
    CHECK(rule_of("a?c=none", "abc", 100000, 1000, 100, &spec) == GCOMP_RULE_OVERRIDE);
    CHECK(rule_of("a?c=none", "ac", 100000, 1000, 100, &spec) == GCOMP_RULE_DEFAULT);
    CHECK(rule_of("*.w*t=none", "layer.0.weight", 100000, 1000, 100, &spec) == GCOMP_RULE_OVERRIDE);
    CHECK(rule_of("*.w*t=none", "layer.0.weights", 100000, 1000, 100, &spec) == GCOMP_RULE_DEFAULT);
    CHECK(rule_of("embed*=topk:density=0.0005", "embedding", 100000, 1000, 100, &spec) ==
              GCOMP_RULE_OVERRIDE &&
          !strcmp(spec, "topk:density=0.0005"));
    /* First match wins, in policy order. */
    rule_of("fc*=none;fc1.*=topk:density=0.1", "fc1.weight", 100000, 1000, 100, &spec);
    CHECK(!strcmp(spec, "none"));
    rule_of("fc1.*=topk:density=0.1;fc*=none", "fc1.weight", 100000, 1000, 100, &spec);
    CHECK(!strcmp(spec, "topk:density=0.1"));
    /* Sizes and 1-D. */
    CHECK(rule_of("min_elements=100", "w", 100, 10, 10, &spec) == GCOMP_RULE_DEFAULT);
    CHECK(rule_of("min_elements=101", "w", 100, 10, 10, &spec) == GCOMP_RULE_SMALL);
    CHECK(rule_of("min_elements=0", "b", 100000, 0, 0, &spec) == GCOMP_RULE_1D);
    CHECK(rule_of("min_elements=0", "b", 100000, 1, 100000, &spec) == GCOMP_RULE_1D);
    CHECK(rule_of("min_elements=0", "b", 100000, 100000, 1, &spec) == GCOMP_RULE_1D);
    CHECK(rule_of("dense_1d=0;min_elements=0", "b", 100000, 0, 0, &spec) == GCOMP_RULE_DEFAULT);
    CHECK(rule_of("dense_1d=0", "b", 1000, 0, 0, &spec) == GCOMP_RULE_SMALL);
    CHECK(rule_of("dense=none:values=bf16", "b", 1000, 0, 0, &spec) == GCOMP_RULE_1D &&
          !strcmp(spec, "none:values=bf16"));
    CHECK(rule_of("  ;;\t spec=randomk:density=0.01,seed=3 ;  ", "w", 1 << 20, 1024, 1024, &spec) ==
              GCOMP_RULE_DEFAULT &&
          !strcmp(spec, "randomk:density=0.01,seed=3"));
    rule_of("", "w", 1 << 20, 1024, 1024, &spec);
    CHECK(!strcmp(spec, TOPK));
    CHECK(rule_of("", NULL, 1 << 20, 1024, 1024, &spec) == GCOMP_RULE_DEFAULT);

    struct {
        const char *policy;
        gcomp_status st;
        const char *in_message;
    } bad[] = {
        {"spec", GCOMP_E_SPEC, "key=value"},
        {"=none", GCOMP_E_SPEC, "empty key"},
        {"spec=", GCOMP_E_SPEC, "empty value"},
        {"spec=none;spec=none", GCOMP_E_SPEC, "twice"},
        {"a*=none;a*=none", GCOMP_E_SPEC, "twice"},
        {"min_elements=-1", GCOMP_E_SPEC, "min_elements"},
        {"min_elements=1k", GCOMP_E_SPEC, "min_elements"},
        {"min_elements=99999999999999999999999", GCOMP_E_SPEC, "min_elements"},
        {"dense_1d=yes", GCOMP_E_SPEC, "dense_1d"},
        {"spec=topk:densty=0.1", GCOMP_E_SPEC, "densty"},
        {"min_element=100", GCOMP_E_UNKNOWN_CODEC, "min_element"},
        {"fc1.*=nonsense", GCOMP_E_UNKNOWN_CODEC, "fc1.*"},
        {"dense=topk:density=7", GCOMP_E_SPEC, "dense"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gcomp_policy *p = (gcomp_policy *)1;
        gcomp_error err;
        gcomp_status st = gcomp_policy_create(&p, bad[i].policy, &err);
        CHECK_MSG(st == bad[i].st && p == NULL, "'%s' gave %s", bad[i].policy,
                  gcomp_status_str(st));
        CHECK_MSG(strstr(err.message, bad[i].in_message), "'%s': message '%s'", bad[i].policy,
                  err.message);
    }
    gcomp_policy *p = NULL;
    CHECK_EQ_INT(gcomp_policy_create(NULL, "", NULL), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_policy_create(&p, NULL, NULL), GCOMP_E_ARG);
    gcomp_policy_free(NULL);

    /* choose: bad tensors, and a shape-needing spec on a vector. */
    CHECK_OK(gcomp_policy_create(&p, "spec=rows:density=0.1;dense_1d=0;min_elements=0", NULL));
    if (p) {
        gcomp_layer_plan pl;
        gcomp_error err;
        gcomp_tensor_desc v = {"flat", 5000, 0, 0}, z = {"z", 0, 0, 0}, s = {"s", 10, 3, 3},
                          m = {"m", 5000, 50, 100};
        CHECK_EQ_INT(gcomp_policy_choose(p, &v, &pl, &err), GCOMP_E_ARG);
        CHECK(strstr(err.message, "flat") && strstr(err.message, "shape"));
        CHECK_EQ_INT(gcomp_policy_choose(p, &z, &pl, &err), GCOMP_E_ARG);
        CHECK_EQ_INT(gcomp_policy_choose(p, &s, &pl, &err), GCOMP_E_ARG);
        CHECK_EQ_INT(gcomp_policy_choose(p, NULL, &pl, &err), GCOMP_E_ARG);
        CHECK_OK(gcomp_policy_choose(p, &m, &pl, &err));
        CHECK(pl.rule == GCOMP_RULE_DEFAULT);
        gcomp_policy_free(p);
    }

    size_t bytes = 1;
    CHECK_OK(gcomp_spec_bytes_estimate("none", 1000, 0, 0, &bytes, NULL));
    CHECK_EQ_INT(bytes, GCOMP_HEADER_SIZE + 24 + 4000);
    CHECK_EQ_INT(gcomp_spec_bytes_estimate("none", 0, 0, 0, &bytes, NULL), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_spec_bytes_estimate("nope", 10, 0, 0, &bytes, NULL), GCOMP_E_UNKNOWN_CODEC);
    CHECK_EQ_INT(gcomp_spec_bytes_estimate("none", (size_t)1 << 33, 0, 0, &bytes, NULL),
                 GCOMP_E_LIMIT);
    CHECK_EQ_INT(gcomp_spec_bytes_estimate("cols", 10, 0, 0, &bytes, NULL), GCOMP_E_ARG);
}

static void test_alloc_failures(void) {
    for (size_t k = 0; k < 8; k++) {
        gcomp_policy *p = NULL;
        gcomp__test_fail_alloc_after(k);
        gcomp_status st = gcomp_policy_create(&p, "spec=dgc;a*=none", NULL);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK(st == GCOMP_OK || (st == GCOMP_E_NOMEM && !p));
        if (!p) continue;
        gcomp_tensor_desc t = {"w", 100000, 1000, 100};
        gcomp_layer_plan pl;
        gcomp__test_fail_alloc_after(k % 3);
        st = gcomp_policy_choose(p, &t, &pl, NULL);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK(st == GCOMP_OK || st == GCOMP_E_NOMEM);
        gcomp_policy_free(p);
    }
}

/* min_k=K: a floor of K elements a step written into spec= where its codec takes min_k and
 * the spec sets none; overrides, dense tensors and codecs without the key are left alone. */
static void test_min_k(void) {
    const char *spec;
    CHECK(rule_of("spec=dgc:density=0.001;min_elements=8192;min_k=512", "fc3.weight", 10240, 10,
                  1024, &spec) == GCOMP_RULE_DEFAULT);
    CHECK_MSG(strstr(spec, "dgc:density=0.001,min_k=512,"), "%s", spec);
    rule_of("spec=dgc:density=0.001,min_k=64;min_k=512", "w", 100000, 100, 1000, &spec);
    CHECK_MSG(strstr(spec, "min_k=64") && !strstr(spec, "min_k=512"), "%s", spec);
    rule_of("spec=powersgd:rank=4;min_k=512", "w", 100000, 100, 1000, &spec);
    CHECK_MSG(!strcmp(spec, "powersgd:rank=4"), "%s", spec);
    rule_of("spec=dgc;min_k=512;fc3*=topk:density=0.01", "fc3.weight", 10240, 10, 1024, &spec);
    CHECK_MSG(!strcmp(spec, "topk:density=0.01"), "%s", spec);
    rule_of("spec=dgc;min_k=512;dense=none:values=f16", "b", 1000, 0, 0, &spec);
    CHECK_MSG(!strcmp(spec, "none:values=f16"), "%s", spec);
    rule_of("min_k=0", "w", 1 << 20, 1024, 1024, &spec);
    CHECK(!strcmp(spec, TOPK));

    /* The estimate follows the floor: 512 values, not 11. */
    gcomp_policy *p = NULL, *q = NULL;
    CHECK_OK(gcomp_policy_create(&p, "spec=dgc:density=0.001;min_elements=0;min_k=512", NULL));
    CHECK_OK(gcomp_policy_create(&q, "spec=dgc:density=0.001;min_elements=0", NULL));
    if (p && q) {
        gcomp_tensor_desc t = {"fc3.weight", 10240, 10, 1024};
        gcomp_layer_plan a, b;
        CHECK_OK(gcomp_policy_choose(p, &t, &a, NULL));
        CHECK_OK(gcomp_policy_choose(q, &t, &b, NULL));
        CHECK_MSG(a.bytes >= b.bytes + 4 * (512 - 11), "%zu vs %zu bytes", a.bytes, b.bytes);
    }
    gcomp_policy_free(p);
    gcomp_policy_free(q);

    const char *bad[] = {"min_k=-1", "min_k=1k", "min_k=4294967296;spec=topk", "min_k=1;min_k=2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gcomp_error err;
        p = (gcomp_policy *)1;
        CHECK_MSG(gcomp_policy_create(&p, bad[i], &err) == GCOMP_E_SPEC && !p &&
                      strstr(err.message, "min_k"),
                  "'%s': %s", bad[i], err.message);
    }
    for (size_t k = 0; k < 6; k++) {
        gcomp__test_fail_alloc_after(k);
        gcomp_status st = gcomp_policy_create(&p, "spec=dgc;min_k=512", NULL);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK(st == GCOMP_OK || (st == GCOMP_E_NOMEM && !p));
        gcomp_policy_free(p);
    }
}

int main(void) {
    test_tables();
    test_grammar();
    test_min_k();
    test_alloc_failures();
    return CHECK_DONE();
}

/*
 * test_adapt.c - the adaptive controllers (src/adapt/adapt*.c): the method grammar and its
 * errors, the ladder, each controller's rule on statistics made for it, the L-GreCo
 * dynamic programme against exhaustive search, and the property every decision rests on:
 * ranks with different local observations that exchange their statistics take the same
 * decision, and a rank with another configuration makes the decision fail.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "adapt/adapt_internal.h"
#include "check.h"

#include <stdint.h>
#include <time.h>

/* mlp-like tensors: two big weights, a small classifier, biases. */
static const gcomp_tensor_desc MLP[] = {
    {"fc1.weight", 256 * 196, 256, 196}, {"fc1.bias", 256, 0, 0},
    {"fc2.weight", 256 * 256, 256, 256}, {"fc2.bias", 256, 0, 0},
    {"fc3.weight", 10 * 256, 10, 256},   {"fc3.bias", 10, 0, 0},
};
#define NMLP (sizeof MLP / sizeof MLP[0])

static gcomp_status make(gcomp_adapt **a, const char *method, uint64_t total, gcomp_error *e) {
    gcomp_adapt_options o = {0};
    o.total_steps = total;
    o.workers = 4;
    o.min_elements = 4096;
    return gcomp_adapt_create(a, method, MLP, NMLP, &o, e);
}

static void expect_spec_error(const char *method, const char *needle) {
    gcomp_adapt *a = (gcomp_adapt *)1;
    gcomp_error e = {0};
    gcomp_status st = make(&a, method, 1000, &e);
    CHECK_MSG(st == GCOMP_E_SPEC, "%s: status %d (%s)", method, st, e.message);
    CHECK_MSG(a == NULL, "%s: out not cleared", method);
    CHECK_MSG(strstr(e.message, needle) != NULL, "%s: message '%s' lacks '%s'", method, e.message,
              needle);
}

/* Which controllers a method string names, before anything is created: parsed as
 * gcomp_adapt_create parses it. */
static void test_method_uses(void) {
    CHECK(gcomp_adapt_method_uses("adapt:accuracy", "accuracy"));
    CHECK(gcomp_adapt_method_uses("adapt: layers + accuracy ;target=0.8", "accuracy"));
    CHECK(gcomp_adapt_method_uses("adapt:bandwidth+layers;base=topk:density=0.01", "layers"));
    CHECK(!gcomp_adapt_method_uses("adapt:bandwidth+layers", "accuracy"));
    CHECK(!gcomp_adapt_method_uses("adapt:norm;ladder=accuracy", "accuracy")); /* an item */
    CHECK(!gcomp_adapt_method_uses("topk:density=0.01", "accuracy"));
    CHECK(!gcomp_adapt_method_uses("adapt:accuracy+nosuch", "accuracy")); /* create refuses */
    CHECK(!gcomp_adapt_method_uses("adapt:accuracy", "accura"));
    CHECK(!gcomp_adapt_method_uses(NULL, "accuracy") &&
          !gcomp_adapt_method_uses("adapt:norm", NULL));
}

static void test_grammar(void) {
    expect_spec_error("adapt:nrom", "unknown controller 'nrom'");
    expect_spec_error("adapt:", "name at least one controller");
    expect_spec_error("adapt:norm+norm", "named twice");
    expect_spec_error("adapt:bandwidth,layers", "join controllers with '+'");
    expect_spec_error("adapt:norm;etta=0.5", "unknown key 'etta'");
    expect_spec_error("adapt:norm;slack=0.1", "belongs to the bandwidth controller");
    expect_spec_error("adapt:norm;eta=abc", "eta=abc");
    expect_spec_error("adapt:accuracy", "target=T is required");
    expect_spec_error("adapt:accuracy;target=100", "out of range");
    expect_spec_error("adapt:accuracy;target=-0.5", "out of range");
    expect_spec_error("adapt:accuracy;target=0", "out of range");
    expect_spec_error("adapt:accuracy;target=150", "out of range");
    expect_spec_error("adapt:accuracy;target=nan", "out of range or no number: 0 < T < 1");
    expect_spec_error("adapt:accuracy;target=inf", "out of range or no number: 0 < T < 1");
    expect_spec_error("adapt:accuracy;target=high", "out of range or no number: 0 < T < 1");
    /* a method that manages nothing would run as a fixed one */
    expect_spec_error("adapt:layers;min_elements=100000000", "no tensor of the 6 is managed");
    expect_spec_error("adapt:layers;fc*=none", "no tensor of the 6 is managed");
    /* a knob that takes words: f17 is neither one of its values nor a spec */
    expect_spec_error("adapt:layers;base=topk:density=0.01;knob=values;ladder=f32/f17",
                      "ladder entry 'f17' refused (as values=: topk: values=f17 is not a value");
    expect_spec_error("adapt:accuracy;target=0.9;hold=2", "hold=2");
    expect_spec_error("adapt:layers;ladder=", "ladder is empty");
    expect_spec_error("adapt:layers;ladder=/ /", "empty entry");
    expect_spec_error("adapt:layers;ladder=2", "): '2'");
    /* accuracy without the run's length: every metric would read as the run's end */
    {
        gcomp_adapt *a = (gcomp_adapt *)1;
        gcomp_error e = {0};
        CHECK_EQ_INT(make(&a, "adapt:accuracy;target=0.9", 0, &e), GCOMP_E_ARG);
        CHECK(a == NULL && strstr(e.message, "run's length") != NULL);
    }
    /* counts and flags are whole numbers */
    expect_spec_error("adapt:accuracy;target=0.9;window=2.5", "whole number");
    expect_spec_error("adapt:accuracy;target=0.9;dwell=1.5", "whole number");
    expect_spec_error("adapt:bandwidth;confirm=1.5", "whole number");
    expect_spec_error("adapt:bandwidth;with_dense=0.5", "whole number");
    /* empty items are refused, not skipped */
    expect_spec_error("adapt:norm+", "empty controller name");
    expect_spec_error("adapt: +norm", "empty controller name");
    expect_spec_error("adapt:norm+ +layers", "empty controller name");
    expect_spec_error("adapt:layers;ladder=0.01//0.001", "empty entry");
    expect_spec_error("adapt:layers;ladder=/0.01", "empty entry");
    expect_spec_error("adapt:layers;ladder=0.1/ ", "empty entry");
    /* the reason comes before the specs, which a 256-byte message would cut off */
    expect_spec_error("adapt:layers;base=dgc:density=0.01;ladder=0.01/0.010000001",
                      "send the same bytes"); /* density 2 out of range */
    expect_spec_error("adapt:layers;base=twobit:threshold=0.5", "ladder=auto needs");
    expect_spec_error("adapt:layers;base=twobit:threshold=0.5;ladder=twobit:threshold=0.1",
                      "send the same bytes");
    expect_spec_error("adapt:norm;low=0.0001", "must send more than base");
    expect_spec_error("adapt:norm;low=0.5", "not in the ladder");
    /* the refusal lists the ladder's values, so the near entry can be picked */
    expect_spec_error("adapt:norm;base=topk:density=0.00316;low=0.01",
                      "not in the ladder (density=0.316/0.0999/0.0316/0.00999/0.00316");
    expect_spec_error("adapt:layers;budget=10", "below the lightest");
    expect_spec_error("adapt:layers;margin=1", "margin=1");
    expect_spec_error("adapt:norm;interval=0", "interval=0");
    expect_spec_error("adapt:norm;base=topk:densty=0.1", "densty");
    expect_spec_error("adapt:norm;;x", "'x' is not KEY=VALUE");
}

static void test_ladder(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:layers;base=topk:density=0.001,feedback=ef", 1000, &e));
    if (!a) return;
    /* auto: density x 100 .. x 0.1, most bytes first; base at its place. */
    CHECK_EQ_INT(gcomp_adapt_ladder_size(a), 7);
    CHECK(strstr(gcomp_adapt_candidate(a, 0), "density=0.1,") != NULL);
    CHECK(strstr(gcomp_adapt_candidate(a, 4), "density=0.001,") != NULL);
    CHECK(strstr(gcomp_adapt_candidate(a, 6), "density=0.0001,") != NULL);
    /* managed: the three weights (>= 4096 elements and 2-D? fc3 has 2560 < 4096). */
    CHECK_EQ_INT(gcomp_adapt_managed(a, 0), 1);
    CHECK_EQ_INT(gcomp_adapt_managed(a, 1), 0);
    CHECK_EQ_INT(gcomp_adapt_managed(a, 2), 1);
    CHECK_EQ_INT(gcomp_adapt_managed(a, 4), 0);
    CHECK(!strncmp(gcomp_adapt_spec(a, 1), "none:", 5));
    /* The first plan is base everywhere (no norm controller). */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    CHECK_EQ_INT(gcomp_adapt_level(a, 1), -1);
    CHECK(strstr(gcomp_adapt_spec(a, 0), "density=0.001,") != NULL);
    CHECK_EQ_INT(gcomp_adapt_interval(a), 25); /* 1000 / 40 */
    CHECK_EQ_INT(gcomp_adapt_measure_interval(a), 100);
    gcomp_adapt_free(a);

    /* explicit ladder with values, specs and dense; bandwidth adds dense by default */
    CHECK_OK(make(&a,
                  "adapt:bandwidth;base=topk:density=0.01,feedback=ef;ladder=0.1/0.001/"
                  "none:values=f16;interval=7;measure=10",
                  0, &e));
    if (!a) return;
    CHECK_EQ_INT(gcomp_adapt_ladder_size(a), 5);
    CHECK(!strncmp(gcomp_adapt_candidate(a, 0), "none:", 5));
    CHECK(strstr(gcomp_adapt_candidate(a, 1), "values=f16") != NULL);
    CHECK(strstr(gcomp_adapt_candidate(a, 2), "density=0.1,") != NULL);
    CHECK(strstr(gcomp_adapt_candidate(a, 3), "density=0.01,") != NULL);
    CHECK_EQ_INT(gcomp_adapt_interval(a), 7);
    CHECK_EQ_INT(gcomp_adapt_measure_interval(a), 14); /* rounded up to whole intervals */
    gcomp_adapt_free(a);

    /* policy keys: a glob takes fc2 out of the controllers' hands */
    CHECK_OK(make(&a, "adapt:layers;fc2.*=topk:density=0.05", 0, &e));
    if (a) {
        CHECK_EQ_INT(gcomp_adapt_managed(a, 2), 0);
        CHECK(strstr(gcomp_adapt_spec(a, 2), "density=0.05") != NULL);
        CHECK_EQ_INT(gcomp_adapt_interval(a), 100); /* unknown length */
        gcomp_adapt_free(a);
    }
    /* rank ladder for PowerSGD */
    CHECK_OK(make(&a, "adapt:layers;base=powersgd:rank=4", 0, &e));
    if (a) {
        CHECK_EQ_INT(gcomp_adapt_ladder_size(a), 4); /* 16, 8, 4, 2 */
        CHECK(strstr(gcomp_adapt_candidate(a, 0), "rank=16") != NULL);
        gcomp_adapt_free(a);
    }
}

/* One decision from a single rank's statistics. */
static size_t decide1(gcomp_adapt *a) {
    size_t len, changed = 0;
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), &len));
    gcomp_error e = {0};
    CHECK_OK(gcomp_adapt_decide(a, buf, len, 1, &changed, &e));
    free(buf);
    return changed;
}

/* Runs `steps` steps giving each managed tensor a gradient of norm scale(step) and, when
 * lr is not NaN, observing that learning rate; returns the tensors the last decision held
 * critical (0 when none was due). */
static size_t run_norm_lr(gcomp_adapt *a, size_t steps, double (*scale)(size_t), double lr,
                          size_t *step, unsigned long long *seed) {
    float *g = malloc(256 * 256 * sizeof(float));
    size_t critical = 0;
    for (size_t s = 0; s < steps; s++, (*step)++) {
        for (size_t i = 0; i < NMLP; i++) {
            if (!gcomp_adapt_managed(a, i)) continue;
            /* a consistent direction plus noise: the accumulated norm follows scale */
            for (size_t k = 0; k < MLP[i].n; k++)
                g[k] = (float)(scale(*step) * (1.0 + 0.1 * test_gauss(seed)));
            CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
        }
        if (!isnan(lr)) gcomp_adapt_observe_lr(a, lr);
        int due;
        gcomp_adapt_end_step(a, &due);
        if (due) {
            decide1(a);
            gcomp_adapt_report r;
            gcomp_adapt_get_report(a, &r);
            critical = r.critical;
        }
    }
    free(g);
    return critical;
}

static void run_norm(gcomp_adapt *a, size_t steps, double (*scale)(size_t), size_t *step,
                     unsigned long long *seed) {
    run_norm_lr(a, steps, scale, NAN, step, seed);
}

static double steady(size_t s) {
    return s < 60 ? 1.0 / (1.0 + 0.2 * (double)s) : 1.0 / 13.0;
}
static double jump(size_t s) {
    return s < 120 ? steady(s) : 1.0;
}

static void test_norm(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:norm;base=topk:density=0.001,feedback=ef;interval=20", 0, &e));
    if (!a) return;
    /* starts critical: low = two steps lighter = density 0.01 */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    CHECK(strstr(gcomp_adapt_spec(a, 0), "density=0.01,") != NULL);
    unsigned long long seed = 7;
    size_t step = 0;
    run_norm(a, 20, steady, &step, &seed); /* first interval: no reference yet */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    run_norm(a, 20, steady, &step, &seed); /* norm fell by far more than half */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    run_norm(a, 60, steady, &step, &seed); /* steady from step 60: high compression */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    CHECK_EQ_INT(gcomp_adapt_level(a, 2), 4);
    gcomp_adapt_report r;
    gcomp_adapt_get_report(a, &r);
    CHECK_EQ_INT(r.critical, 0);
    gcomp_adapt_free(a);

    /* a jump (as after a learning-rate change) is critical again for one interval */
    CHECK_OK(make(&a, "adapt:norm;interval=20", 0, &e));
    if (!a) return;
    step = 0;
    run_norm(a, 120, jump, &step, &seed);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    run_norm(a, 20, jump, &step, &seed);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    run_norm(a, 20, jump, &step, &seed);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    gcomp_adapt_free(a);
}

/* Accordion's rule at a learning-rate decay: the interval after a fall of the rate by
 * lr_drop (default 0.8, an exact /5 included) is critical for every tensor, whatever the norms say;
 * a slow fall is not a decay, lr_drop=1 turns the rule off, and the rule holds across a save and
 * load (the last decision's rate is in the state). */
static double flat(size_t s) {
    (void)s;
    return 0.1; /* steady norms */
}

static size_t run_lr(gcomp_adapt *a, size_t steps, double lr, size_t *step,
                     unsigned long long *seed) {
    return run_norm_lr(a, steps, flat, lr, step, seed);
}

static void test_norm_lr_decay(void) {
    const char *methods[] = {"adapt:norm;interval=10", "adapt:norm;interval=10;lr_drop=1",
                             "adapt:norm;interval=10;lr_drop=0.95"};
    for (int v = 0; v < 3; v++) {
        gcomp_adapt *a, *b;
        gcomp_error e = {0};
        CHECK_OK(make(&a, methods[v], 0, &e));
        CHECK_OK(make(&b, methods[v], 0, &e));
        if (!a || !b) return;
        unsigned long long seed = 11;
        size_t step = 0;
        run_lr(a, 30, 0.1, &step, &seed); /* steady norms: leaves the critical regime */
        CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
        CHECK_EQ_INT(run_lr(a, 10, 0.05, &step, &seed), 0); /* halved: not a decay at 0.8 */
        CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
        /* saved between the decay and the decision that sees it */
        run_lr(a, 5, 0.01, &step, &seed);
        size_t cap = gcomp_adapt_state_bound(a), len;
        uint8_t *blob = malloc(cap);
        CHECK_OK(gcomp_adapt_save_state(a, blob, cap, &len));
        CHECK_OK(gcomp_adapt_load_state(b, blob, len, &e));
        if (v == 0) {
            /* version 2: the same blob less the two rates (the body's last 16 bytes, before
             * the norm controller's section of 8 + 2 * 16 bytes for its two tensors, and the
             * CRC) loads, and knows no rate before the load: no decay to see */
            size_t sec = 8 + 2 * 16, at = len - 4 - sec - 16, l2 = len - 16;
            memmove(blob + at, blob + at + 16, sec + 4);
            gcomp__put32(blob + 4, 2);
            gcomp__put64(blob + 8, l2);
            gcomp__put32(blob + l2 - 4, gcomp__crc32c(0, blob, l2 - 4));
            gcomp_adapt *c;
            CHECK_OK(make(&c, methods[v], 0, &e));
            if (c) {
                CHECK_MSG(gcomp_adapt_load_state(c, blob, l2, &e) == GCOMP_OK, "version 2: %s",
                          e.message);
                size_t st = step;
                unsigned long long sd = seed;
                CHECK_EQ_INT(run_lr(c, 5, 0.01, &st, &sd), 0);
                gcomp_adapt_free(c);
            }
        }
        free(blob);
        for (int k = 0; k < 2; k++) {
            gcomp_adapt *x = k ? b : a;
            size_t st = step;
            unsigned long long sd = seed;
            /* an exact /5, which 1 - 0.8 (0.19999999999999996) times 0.05 would miss */
            size_t crit = run_lr(x, 5, 0.01, &st, &sd);
            bool expect = v == 0; /* lr_drop 0.8: yes; off; 0.95 asks for /20 */
            CHECK_MSG(crit == (expect ? 2 : 0), "%s, %s: %zu tensors critical after a decay",
                      methods[v], k ? "loaded" : "unbroken", crit);
            CHECK_EQ_INT(gcomp_adapt_level(x, 0), expect ? 2 : 4);
            /* one interval only: the norms are steady again at the next decision */
            CHECK_EQ_INT(run_lr(x, 10, 0.01, &st, &sd), 0);
            CHECK_EQ_INT(gcomp_adapt_level(x, 2), 4);
        }
        gcomp_adapt_free(a);
        gcomp_adapt_free(b);
    }
    expect_spec_error("adapt:norm;lr_drop=1.5", "lr_drop");
}

/* A NaN gradient is refused with nothing kept: the run after it decides as one without it. */
static void test_observe_nonfinite(void) {
    gcomp_adapt *a, *b;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:norm;interval=20", 0, &e));
    CHECK_OK(make(&b, "adapt:norm;interval=20", 0, &e));
    if (!a || !b) return;
    size_t n = MLP[0].n;
    float *g = calloc(n, sizeof(float)), *res = calloc(n, sizeof(float));
    g[5] = NAN;
    CHECK(gcomp_adapt_observe(a, 0, g, NULL) == GCOMP_E_NONFINITE);
    g[5] = 1.0f;
    res[n - 1] = INFINITY;
    CHECK(gcomp_adapt_observe(a, 0, g, res) == GCOMP_E_NONFINITE);
    free(g);
    free(res);
    unsigned long long sa = 7, sb = 7;
    size_t step_a = 0, step_b = 0;
    run_norm(a, 60, steady, &step_a, &sa);
    run_norm(b, 60, steady, &step_b, &sb);
    for (size_t i = 0; i < 3; i++) CHECK_EQ_INT(gcomp_adapt_level(a, i), gcomp_adapt_level(b, i));
    size_t len = gcomp_adapt_stats_size(a), la, lb;
    double *sta = malloc(len * sizeof(double)), *stb = malloc(len * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, sta, len, &la));
    CHECK_OK(gcomp_adapt_stats(b, stb, len, &lb));
    /* the same but for the wall clock */
    CHECK(la == lb && la > GCOMP__ADAPT_STATS_FIXED);
    sta[GCOMP__ADAPT_STATS_FIXED - 2] = stb[GCOMP__ADAPT_STATS_FIXED - 2] = 0;
    CHECK(memcmp(sta, stb, la * sizeof(double)) == 0);
    free(sta);
    free(stb);
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
}

/* ---- layers: the DP against exhaustive search ------------------------------------------ */

/* Errors falling with bytes, at random rates per tensor. */
static void random_errors(double *err2, size_t nm, size_t K, unsigned long long *seed) {
    for (size_t m = 0; m < nm; m++) {
        double rate = 0.2 + 3 * test_uniform(seed), base = 1 + 100 * test_uniform(seed);
        for (size_t j = 0; j < K; j++) err2[m * K + j] = base * pow((double)j + 1, rate);
    }
}

static double plan_error(const double *err2, const int *level, size_t nm, size_t K) {
    double v = 0;
    for (size_t m = 0; m < nm; m++) v += err2[m * K + (size_t)level[m]];
    return v;
}

static void test_layers_dp(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:layers;ladder=0.1/0.03/0.01/0.003/0.001;margin=0", 0, &e));
    if (!a) return;
    const size_t nm = a->nm, K = a->K;
    CHECK_EQ_INT(nm, 2);
    unsigned long long seed = 99;
    double *err2 = calloc(nm * K, sizeof(double));
    int *level = calloc(nm, sizeof(int));
    for (int trial = 0; trial < 200; trial++) {
        random_errors(err2, nm, K, &seed);
        int uni = (int)(test_uniform(&seed) * (double)K);
        if (uni >= (int)K) uni = (int)K - 1;
        gcomp__adapt_in in = {0};
        in.measured = true;
        in.err2 = err2;
        gcomp__adapt_plan p = {0};
        p.level = level;
        gcomp__adapt_plan_uniform(a, &p, uni);
        double B = p.budget;
        void *st = NULL;
        CHECK_OK(gcomp__adapt_layers.create(a, &st, &e));
        gcomp__adapt_layers.decide(a, st, &in, &p);
        gcomp__adapt_layers.free(st);
        /* exhaustive: the least error with bytes <= B (ties: fewer bytes) */
        double best = INFINITY, bestb = 0;
        for (size_t j0 = 0; j0 < K; j0++)
            for (size_t j1 = 0; j1 < K; j1++) {
                double b = a->bytes[j0] + a->bytes[K + j1];
                double v = err2[j0] + err2[K + j1];
                if (b <= B && (v < best || (v == best && b < bestb))) best = v, bestb = b;
            }
        double got = err2[level[0]] + err2[K + level[1]];
        double gotb = a->bytes[level[0]] + a->bytes[K + level[1]];
        CHECK_MSG(fabs(got - best) <= 1e-9 * best, "trial %d: DP error %g, exhaustive %g", trial,
                  got, best);
        CHECK_MSG(gotb <= B * (1 + 2.0 * nm / 4096), "trial %d: %g bytes over budget %g", trial,
                  gotb, B);
        CHECK(fabs(p.error - got) <= 1e-9 * got);
    }
    free(err2);
    free(level);
    gcomp_adapt_free(a);
}

/* Hysteresis: over two measurements on one state, the plan in force (uniform at first)
 * gives way to the DP's plan (margin=0's choice on the same errors) exactly when that has
 * at least `margin` less error. */
static void test_layers_margin(void) {
    gcomp_adapt *a0, *a1;
    gcomp_error e = {0};
    CHECK_OK(make(&a0, "adapt:layers;ladder=0.014/0.012/0.01/0.008/0.006;margin=0", 0, &e));
    CHECK_OK(make(&a1, "adapt:layers;ladder=0.014/0.012/0.01/0.008/0.006;margin=0.05", 0, &e));
    if (!a0 || !a1) return;
    const size_t nm = a0->nm, K = a0->K;
    unsigned long long seed = 7;
    double *err2 = calloc(nm * K, sizeof(double));
    int *dp = calloc(nm, sizeof(int)), *got = calloc(nm, sizeof(int)),
        *want = calloc(nm, sizeof(int));
    int kept = 0, switched = 0;
    for (int trial = 0; trial < 300; trial++) {
        void *st = NULL;
        CHECK_OK(gcomp__adapt_layers.create(a1, &st, &e));
        for (size_t m = 0; m < nm; m++) want[m] = 2; /* in force: uniform */
        for (int step = 0; step < 2; step++) {
            random_errors(err2, nm, K, &seed);
            gcomp__adapt_in in = {0};
            in.measured = true;
            in.err2 = err2;
            gcomp__adapt_plan p0 = {0}, p1 = {0};
            p0.level = dp;
            p1.level = got;
            gcomp__adapt_plan_uniform(a0, &p0, 2);
            gcomp__adapt_plan_uniform(a1, &p1, 2);
            void *st0 = NULL;
            CHECK_OK(gcomp__adapt_layers.create(a0, &st0, &e));
            gcomp__adapt_layers.decide(a0, st0, &in, &p0);
            gcomp__adapt_layers.free(st0);
            gcomp__adapt_layers.decide(a1, st, &in, &p1);
            bool differ = memcmp(dp, want, nm * sizeof(int)) != 0;
            bool take = plan_error(err2, dp, nm, K) < 0.95 * plan_error(err2, want, nm, K);
            if (differ) take ? switched++ : kept++;
            if (take) memcpy(want, dp, nm * sizeof(int));
            CHECK_MSG(!memcmp(got, want, nm * sizeof(int)),
                      "trial %d step %d: levels %d/%d, want %d/%d", trial, step, got[0], got[1],
                      want[0], want[1]);
            CHECK(fabs(p1.error - plan_error(err2, want, nm, K)) <= 1e-9 * p1.error);
        }
        gcomp__adapt_layers.free(st);
    }
    CHECK_MSG(kept > 10 && switched > 10, "cases: %d kept, %d switched", kept, switched);
    free(err2);
    free(dp);
    free(got);
    free(want);
    gcomp_adapt_free(a0);
    gcomp_adapt_free(a1);
}

/* Real gradients: fc1's energy sits in a few large entries (one in 97), which top-k at
 * density 0.001 mostly cuts and at 0.01 keeps, so its absolute error falls steeply with
 * density; fc2 is flat Gaussian and loses about the same share at every density.  At the
 * uniform setting's bytes the DP must move density from fc2 to fc1 and end with less total
 * error than uniform. */
static void test_layers_measured(void) {
    static const gcomp_tensor_desc T[] = {{"fc1.weight", 512 * 512, 512, 512},
                                          {"fc1.bias", 512, 0, 0},
                                          {"fc2.weight", 512 * 512, 512, 512}};
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(gcomp_adapt_create(&a,
                                "adapt:layers;ladder=0.002/0.0014/0.001/0.0007/0.0005;"
                                "interval=5;measure=5",
                                T, 3, NULL, &e));
    if (!a) return;
    unsigned long long seed = 5;
    float *g = malloc(512 * 512 * sizeof(float));
    double uniform_err = 0;
    for (int s = 0; s < 5; s++) {
        CHECK_EQ_INT(gcomp_adapt_measuring(a), s == 4);
        for (size_t i = 0; i < 3; i++) {
            for (size_t k = 0; k < T[i].n; k++) {
                float x = test_gauss(&seed);
                g[k] = i == 0 ? (k % 97 == 0 ? 50 * x : 0.01f * x) : x; /* fc1 peaky, fc2 flat */
            }
            CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
        }
        int due;
        gcomp_adapt_end_step(a, &due);
        CHECK_EQ_INT(due, s == 4);
    }
    size_t len;
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), &len));
    /* the measured errors fall with density, per tensor */
    const double *meas = buf + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (size_t m = 0; m < a->nm; m++) {
        for (size_t j = 0; j + 1 < a->K; j++)
            CHECK(meas[4 * (m * a->K + j)] <= meas[4 * (m * a->K + j + 1)]);
        uniform_err += meas[4 * (m * a->K + (size_t)a->base)];
    }
    CHECK_OK(gcomp_adapt_decide(a, buf, len, 1, NULL, &e));
    int l0 = gcomp_adapt_level(a, 0), l2 = gcomp_adapt_level(a, 2);
    CHECK_MSG(l0 < a->base && l2 > a->base, "peaky fc1 should get the bytes: levels fc1 %d fc2 %d",
              l0, l2);
    gcomp_adapt_report r;
    gcomp_adapt_get_report(a, &r);
    CHECK_MSG(r.error < 0.9 * uniform_err, "DP error %g, uniform %g", r.error, uniform_err);
    double bytes = a->bytes[(size_t)l0] + a->bytes[a->K + (size_t)l2];
    CHECK(bytes <= a->total[a->base] * 1.01);
    free(buf);
    free(g);
    gcomp_adapt_free(a);
}

/* The errors one measuring step records for tensor fc1 (gaussian g, residual r = g / 2 on
 * every other element, or none). */
static void errors_with_residual(const char *method, bool residual, double *err, size_t K) {
    static const gcomp_tensor_desc T[] = {{"fc1.weight", 128 * 128, 128, 128}};
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(gcomp_adapt_create(&a, method, T, 1, NULL, &e));
    if (!a) return;
    CHECK_EQ_INT((int)a->K, (int)K);
    unsigned long long seed = 21;
    float *g = malloc(T[0].n * sizeof(float)), *r = malloc(T[0].n * sizeof(float));
    for (size_t k = 0; k < T[0].n; k++) {
        g[k] = test_gauss(&seed);
        r[k] = k % 2 ? 0.5f * g[k] : 0;
    }
    CHECK(gcomp_adapt_measuring(a));
    CHECK_OK(gcomp_adapt_observe(a, 0, g, residual ? r : NULL));
    gcomp_adapt_end_step(a, NULL);
    size_t len;
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), &len));
    const double *meas = buf + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (size_t j = 0; j < K; j++) err[j] = meas[4 * j];
    free(buf);
    free(r);
    free(g);
    gcomp_adapt_free(a);
}

/* A managed tensor the caller did not observe in a measuring step (the DDP hook never sees
 * a parameter DDP does not bucket; an observe refused as non-finite) reports NaN, not what
 * its row held before: neither memory never written nor an earlier measurement. */
static void test_unobserved_reports_nan(void) {
    static const gcomp_tensor_desc T[] = {{"a", 128 * 128, 128, 128}, {"b", 128 * 128, 128, 128}};
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(gcomp_adapt_create(&a, "adapt:layers;base=topk:density=0.01;interval=1;measure=1", T,
                                2, NULL, &e));
    if (!a) return;
    unsigned long long seed = 5;
    float *g = malloc(T[0].n * sizeof(float));
    for (size_t k = 0; k < T[0].n; k++) g[k] = test_gauss(&seed);
    CHECK_EQ_INT((int)a->nm, 2);
    size_t cap = gcomp_adapt_stats_size(a), len, K = a->K;
    double *buf = malloc(cap * sizeof(double));
    const double *meas = buf + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (int round = 0; round < 2; round++) {
        CHECK(gcomp_adapt_measuring(a));
        CHECK_OK(gcomp_adapt_observe(a, 0, g, NULL));
        if (round == 0) CHECK_OK(gcomp_adapt_observe(a, 1, g, NULL)); /* b: only the first */
        gcomp_adapt_end_step(a, NULL);
        CHECK_OK(gcomp_adapt_stats(a, buf, cap, &len));
        for (size_t q = 0; q < 4 * K; q++) {
            CHECK_MSG(isfinite(meas[q]), "round %d: a's measurement %zu is %g", round, q, meas[q]);
            CHECK_MSG(round == 0 ? isfinite(meas[4 * K + q]) : isnan(meas[4 * K + q]),
                      "round %d: b's measurement %zu is %g", round, q, meas[4 * K + q]);
        }
    }
    free(buf);
    free(g);
    gcomp_adapt_free(a);
}

/* A candidate is measured in its steady state, as its bytes are: DGC's warm-up on a fresh
 * scratch compressor (epoch 0) sent warmup_start for every density, so all candidates
 * lighter than it measured the same error and the DP starved the big layers. */
static void test_measure_steady_state(void) {
    double warm[3] = {0}, plain[3] = {0};
    errors_with_residual("adapt:layers;base=dgc:density=0.001,warmup=1,warmup_stages=4,"
                         "warmup_start=0.05;ladder=0.01/0.001/0.0001;interval=1;measure=1",
                         false, warm, 3);
    errors_with_residual("adapt:layers;base=dgc:density=0.001;ladder=0.01/0.001/0.0001;"
                         "interval=1;measure=1",
                         false, plain, 3);
    for (size_t j = 0; j < 3; j++)
        CHECK_MSG(warm[j] == plain[j], "entry %zu: error %g with a warm-up, %g without", j, warm[j],
                  plain[j]);
    CHECK_MSG(warm[0] < warm[1] && warm[1] < warm[2], "errors %g %g %g do not rise", warm[0],
              warm[1], warm[2]);
}

/* error_on=gradient: the layers' errors are of the gradient alone, whatever residual the
 * caller hands in; error_on=input (the default) measures the gradient plus the residual. */
static void test_layers_error_on(void) {
    expect_spec_error("adapt:layers;error_on=residual", "error_on=residual");
    expect_spec_error("adapt:norm;error_on=gradient", "layers");
    const char *const M = "adapt:layers;ladder=0.1/0.01/0.001;interval=1;measure=1";
    char grad_m[128];
    snprintf(grad_m, sizeof grad_m, "%s;error_on=gradient", M);
    double in_r[3], in_none[3], grad_r[3], input_r[3];
    errors_with_residual(M, true, in_r, 3);
    errors_with_residual(M, false, in_none, 3);
    errors_with_residual(grad_m, true, grad_r, 3);
    char input_m[128];
    snprintf(input_m, sizeof input_m, "%s;error_on=input", M);
    errors_with_residual(input_m, true, input_r, 3);
    for (size_t j = 0; j < 3; j++) {
        CHECK_MSG(grad_r[j] == in_none[j],
                  "entry %zu: %g with error_on=gradient, %g without a residual", j, grad_r[j],
                  in_none[j]);
        CHECK_MSG(in_r[j] != in_none[j], "entry %zu: the residual changed nothing (%g)", j,
                  in_r[j]);
        CHECK_MSG(input_r[j] == in_r[j], "entry %zu: error_on=input %g, default %g", j, input_r[j],
                  in_r[j]);
    }
}

/* ---- measurement: the sample block, its spacing, its cost out of compute ------------------ */

/* One measuring step over MLP with gradient g, then the statistics. */
static double *measured_stats(gcomp_adapt *a, const float *g, double bwd, size_t *len) {
    CHECK(gcomp_adapt_measuring(a));
    for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
    gcomp_adapt_observe_compute(a, 0.001, bwd, 0);
    gcomp_adapt_end_step(a, NULL);
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), len));
    return buf;
}

/* A block of whole rows stands for the tensor: on a homogeneous gradient its scaled |x|^2
 * and error match the whole tensor's within a few per cent; the cost of measuring comes
 * out of backward. */
static void test_measure_sample(void) {
    expect_spec_error("adapt:layers;sample=0", "sample=0");
    expect_spec_error("adapt:layers;sample=lots", "sample=lots");
    expect_spec_error("adapt:layers;measure=8;measure_cost=0.1", "measure_cost=");
    expect_spec_error("adapt:layers;measure_cost=2", "measure_cost=2");
    unsigned long long seed = 3;
    float *g = malloc(256 * 256 * sizeof(float));
    for (size_t k = 0; k < 256 * 256; k++) g[k] = test_gauss(&seed);
    double *st[2];
    size_t len[2];
    gcomp_adapt *a[2];
    gcomp_error e = {0};
    const char *m[2] = {"adapt:layers;interval=1;sample=all",
                        "adapt:layers;interval=1;sample=5000"};
    for (int v = 0; v < 2; v++) {
        CHECK_OK(make(&a[v], m[v], 0, &e));
        if (!a[v]) return;
        st[v] = measured_stats(a[v], g, 10.0, &len[v]);
        /* what measuring cost came out of backward, exactly */
        double bwd = st[v][6] /* S_BWD */, mt = st[v][GCOMP__ADAPT_STATS_FIXED - 1];
        CHECK_MSG(mt > 0 && fabs(bwd + mt - 10.0) < 1e-9, "backward %g + measuring %g != 10", bwd,
                  mt);
    }
    CHECK_EQ_INT(a[1]->t[0].sample_rows, 25); /* 5000 / 196 whole rows of fc1 */
    CHECK_EQ_INT(a[1]->t[2].sample_rows, 19); /* 5000 / 256 of fc2 */
    size_t K = a[0]->K;
    for (size_t q = 0; q < a[0]->nm * K; q++) {
        const double *w = st[0] + GCOMP__ADAPT_STATS_FIXED + a[0]->nm + 4 * q;
        const double *b = st[1] + GCOMP__ADAPT_STATS_FIXED + a[1]->nm + 4 * q;
        CHECK_MSG(fabs(b[1] / w[1] - 1) < 0.05, "|x|^2 %g from the block, %g whole", b[1], w[1]);
        CHECK_MSG(fabs(b[0] / w[0] - 1) < 0.10, "error %g from the block, %g whole", b[0], w[0]);
        CHECK(b[2] > 0 && b[3] > 0);
    }
    for (int v = 0; v < 2; v++) {
        free(st[v]);
        gcomp_adapt_free(a[v]);
    }
    free(g);
}

/* measure=auto: the next measurement where its cost is measure_cost of the time between,
 * from the slowest rank (ranks that measured different costs space alike); never sooner
 * than `measure`; a fixed measure= is not moved. */
static uint64_t next_measure(const char *method, double wall0, double cost0, double cost1) {
    gcomp_adapt *a[2];
    gcomp_error e = {0};
    for (int r = 0; r < 2; r++) CHECK_OK(make(&a[r], method, 0, &e));
    if (!a[0] || !a[1]) return 0;
    float *g = calloc(256 * 256, sizeof(float));
    size_t len = gcomp_adapt_stats_size(a[0]), got;
    double *all = malloc(2 * len * sizeof(double));
    for (int r = 0; r < 2; r++) {
        CHECK_EQ_INT(gcomp_adapt_measuring(a[r]), 0);
        gcomp_adapt_end_step(a[r], NULL); /* step 0; step 1 ends the first interval */
        free(measured_stats(a[r], g, 0.01, &got));
        for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a[r], i, g, NULL));
        CHECK_OK(gcomp_adapt_stats(a[r], all + r * len, len, &got));
    }
    /* replayed: the measuring step's statistics with the costs this test names */
    for (int r = 0; r < 2; r++) {
        double *b = all + r * len;
        b[4] = 2;                                /* S_STEP */
        b[GCOMP__ADAPT_STATS_FIXED - 3] = 1;     /* S_MEASURED */
        b[GCOMP__ADAPT_STATS_FIXED - 2] = wall0; /* S_WALL */
        b[GCOMP__ADAPT_STATS_FIXED - 1] = r ? cost1 : cost0;
    }
    gcomp_adapt_report rep[2];
    for (int r = 0; r < 2; r++) {
        CHECK_OK(gcomp_adapt_decide(a[r], all, len, 2, NULL, &e));
        gcomp_adapt_get_report(a[r], &rep[r]);
    }
    CHECK_EQ_INT(rep[0].next_measure_step, rep[1].next_measure_step);
    CHECK(rep[0].measure_s == fmax(cost0, cost1));
    /* and the schedule holds: no measuring step before it, one at it */
    uint64_t next = rep[0].next_measure_step;
    for (uint64_t s = 2; s <= next && s < 400; s++) {
        CHECK_EQ_INT(gcomp_adapt_measuring(a[0]), s == next);
        gcomp_adapt_end_step(a[0], NULL);
    }
    for (int r = 0; r < 2; r++) gcomp_adapt_free(a[r]);
    free(all);
    free(g);
    return next;
}

static void test_measure_spacing(void) {
    /* interval 2: measure auto is 8 steps at least; the first measurement at step 1 */
    const char *m = "adapt:layers;interval=2";
    /* 0.5 s against 0.5 s of training: ceil(0.5 / (0.02 * 0.5)) = 50 intervals = 100 steps */
    CHECK_EQ_INT(next_measure(m, 0.5, 0.5, 0.01), 101);
    CHECK_EQ_INT(next_measure(m, 0.5, 0.01, 0.5), 101);  /* the slowest rank, whichever */
    CHECK_EQ_INT(next_measure(m, 1.0, 0.001, 0.001), 9); /* cheap: `measure` steps on */
    CHECK_EQ_INT(next_measure("adapt:layers;interval=2;measure_cost=0.5", 1.0, 0.5, 0.5), 9);
    CHECK_EQ_INT(next_measure("adapt:layers;interval=2;measure=4", 1.0, 0.5, 0.5), 5);
}

/* ---- bandwidth ------------------------------------------------------------------------ */

/* The level the bandwidth controller takes on `link` (bytes/s); *rule_ok is 0 when the
 * choice breaks the documented rule on its own predictions: the lightest level whose
 * T_L * (1 + penalty)^(L - base) is within slack (0.05) of the best. */
/* One decision of a bandwidth method with interval=2 on `link` (50 us latency): two steps
 * observed, compressed candidates measured at codec_s a tensor (dense at nothing), so that
 * the outcome does not depend on this machine's speed.  Returns the level of tensor 0;
 * sc[j] (K entries) gets each level's score under `penalty`, *best the lowest. */
static int bandwidth_decide(gcomp_adapt *a, double penalty, double link, double codec_s, double *sc,
                            double *best) {
    gcomp_error e = {0};
    float *g = calloc(256 * 256, sizeof(float));
    for (size_t k = 0; k < 256 * 256; k++) g[k] = (float)((k * 2654435761u) % 1000) - 500;
    for (int s = 0; s < 2; s++) {
        gcomp_adapt_observe_compute(a, 0.002, 0.004, 0.001); /* first: see predict_with */
        for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
        gcomp_adapt_observe_link(a, link, 50e-6);
        int due;
        gcomp_adapt_end_step(a, &due);
    }
    size_t len;
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), &len));
    double *meas = buf + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (size_t m = 0; m < a->nm; m++)
        for (size_t j = 0; j < a->K; j++) {
            bool dense = !strncmp(a->ladder[j], "none:", 5);
            meas[4 * (m * a->K + j) + 2] = dense ? 0 : codec_s;
            meas[4 * (m * a->K + j) + 3] = dense ? 0 : codec_s / 10;
        }
    CHECK_OK(gcomp_adapt_decide(a, buf, len, 1, NULL, &e));
    *best = INFINITY;
    for (size_t j = 0; j < a->K; j++) {
        sc[j] = gcomp_adapt_predicted(a, j) * pow(1 + penalty, (double)j - a->base);
        *best = fmin(*best, sc[j]);
    }
    free(buf);
    free(g);
    return gcomp_adapt_level(a, 0);
}

static int bandwidth_level_with(const char *method, double penalty, double link, double codec_s,
                                int *rule_ok) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    *rule_ok = 0;
    CHECK_OK(make(&a, method, 0, &e));
    if (!a) return -1;
    double best, sc[64];
    int lvl = bandwidth_decide(a, penalty, link, codec_s, sc, &best);
    *rule_ok = sc[lvl] <= 1.05 * best;
    for (int j = 0; j < lvl; j++) *rule_ok &= sc[j] > 1.05 * best;
    /* every candidate's prediction is on record, the chosen one's in the report */
    gcomp_adapt_report rep;
    gcomp_adapt_get_report(a, &rep);
    for (size_t j = 0; j < a->K; j++) CHECK(gcomp_adapt_predicted(a, j) > 0);
    CHECK(gcomp_adapt_predicted(a, (size_t)lvl) == rep.predicted_step_s);
    CHECK(isnan(gcomp_adapt_predicted(a, a->K)));
    gcomp_adapt_free(a);
    return lvl;
}

/* After the first decision the level in force stays while its score is within slack (5 %)
 * of the best; otherwise the lightest level within slack of the best is taken.  Over links
 * from 1 MB/s to 1 GB/s, each second decision follows a first on another link; some of them
 * must fall in the band where the rule without it would have moved. */
static void test_bandwidth_band(void) {
    int held = 0;
    for (double first = 1e6; first <= 1e9; first *= 10)
        for (double link = 1e6; link <= 1e9; link *= 1.2589) {
            gcomp_adapt *a;
            gcomp_error e = {0};
            CHECK_OK(make(&a, "adapt:bandwidth;interval=2;measure=2;confirm=1", 0, &e));
            if (!a) return;
            double sc[64], best;
            int was = bandwidth_decide(a, 0.3, first, 1e-4, sc, &best);
            int now = bandwidth_decide(a, 0.3, link, 1e-4, sc, &best);
            int lightest = 0;
            while (lightest < (int)a->K - 1 && !(sc[lightest] <= 1.05 * best)) lightest++;
            if (sc[was] <= 1.05 * best) {
                CHECK_MSG(now == was, "first %g, then %g: level %d left for %d inside the band",
                          first, link, was, now);
                held += lightest != was;
            } else {
                CHECK_MSG(now == lightest, "first %g, then %g: level %d, the rule says %d", first,
                          link, now, lightest);
            }
            gcomp_adapt_free(a);
        }
    CHECK_MSG(held > 0, "no second decision fell in the band");
}

static int bandwidth_level(double link, double codec_s) {
    int ok;
    int l = bandwidth_level_with("adapt:bandwidth;interval=2;measure=2;confirm=1", 0.3, link,
                                 codec_s, &ok);
    CHECK(ok);
    return l;
}

static void test_bandwidth(void) {
    /* with neither base nor ladder: the cross-codec ladder, PowerSGD first */
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:bandwidth", 0, &e));
    if (a) {
        CHECK_EQ_INT(gcomp_adapt_ladder_size(a), 4);
        CHECK(!strncmp(gcomp_adapt_candidate(a, 0), "none:", 5));
        CHECK(!strncmp(gcomp_adapt_candidate(a, 1), "powersgd:", 9));
        CHECK(!strncmp(gcomp_adapt_candidate(a, 2), "topk:density=0.001,", 19));
        CHECK(!strncmp(gcomp_adapt_candidate(a, 3), "topk:density=0.0001,", 20));
        CHECK(!strncmp(gcomp_adapt_spec(a, 0), "powersgd:", 9));
        CHECK(isnan(gcomp_adapt_predicted(a, 0))); /* no decision yet */
        gcomp_adapt_free(a);
    }
    /* a ladder without base keeps the engine's base */
    CHECK_OK(make(&a, "adapt:bandwidth;ladder=0.01/0.001", 0, &e));
    if (a) {
        CHECK(!strncmp(gcomp_adapt_spec(a, 0), "topk:", 5));
        gcomp_adapt_free(a);
    }
    int slow = bandwidth_level(1e6, 1e-4), mid = bandwidth_level(1e8, 1e-4),
        fast = bandwidth_level(1e12, 1e-4);
    CHECK_MSG(fast == 0, "a very fast link should send dense: level %d", fast);
    CHECK_MSG(slow > mid && mid > fast, "levels slow %d mid %d fast %d", slow, mid, fast);
    /* the rule, with and without the penalty, over links from 100 kB/s to 1 TB/s; leaving
     * base must pay for itself, so somewhere the penalty keeps a lighter level */
    int differ = 0;
    for (double link = 1e5; link <= 1e12; link *= 1.7783) {
        int ok0, ok1;
        int l0 = bandwidth_level_with("adapt:bandwidth;interval=2;measure=2;confirm=1;penalty=0", 0,
                                      link, 1e-4, &ok0);
        int l1 = bandwidth_level_with("adapt:bandwidth;interval=2;measure=2;confirm=1", 0.3, link,
                                      1e-4, &ok1);
        CHECK_MSG(ok0 && ok1, "link %g: levels %d (penalty 0), %d (0.3) break the rule", link, l0,
                  l1);
        CHECK_MSG(l1 <= l0 || l1 <= 1, "link %g: the penalty chose heavier (%d > %d)", link, l1,
                  l0);
        differ += l0 != l1;
    }
    CHECK_MSG(differ > 0, "the penalty never changed a choice");
}

/* One decision of the bandwidth controller on a 10 ms link with the tensors grouped as
 * `groups` (NULL: a message a tensor); every candidate's predicted step into pred[].  One
 * exchange at a time (concurrent=0, as the DDP hook sends), unless `method` says. */
static void predict_with(const char *method, const unsigned *groups, size_t run_bytes, double *pred,
                         size_t *K) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, method, 0, &e));
    if (!a) return;
    CHECK_OK(gcomp_adapt_set_exchanges(a, groups, groups ? NMLP : 0, run_bytes, &e));
    float *g = calloc(256 * 256, sizeof(float));
    for (size_t k = 0; k < 256 * 256; k++) g[k] = (float)((k * 2654435761u) % 1000) - 500;
    /* The compute first: observed after, it would lose this step's measuring time, which
     * a loaded machine stretches (1.5 ms of prediction with two busy loops beside it). */
    gcomp_adapt_observe_compute(a, 0.002, 0.004, 0.001);
    for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
    gcomp_adapt_observe_link(a, 1e8, 10e-3);
    gcomp_adapt_end_step(a, NULL);
    size_t len;
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, gcomp_adapt_stats_size(a), &len));
    double *meas = buf + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (size_t q = 0; q < a->nm * a->K; q++) meas[4 * q + 2] = meas[4 * q + 3] = 1e-5;
    CHECK_OK(gcomp_adapt_decide(a, buf, len, 1, NULL, &e));
    *K = a->K;
    for (size_t j = 0; j < a->K; j++) pred[j] = gcomp_adapt_predicted(a, j);
    free(buf);
    free(g);
    gcomp_adapt_free(a);
}

/* One measured step of `a` (the same gradients, compute and link every time); its
 * statistics into buf when buf is not NULL, the measured codec times set to 10 us. */
static void measured_step(gcomp_adapt *a, const float *g, double *buf, size_t *len) {
    gcomp_adapt_observe_compute(a, 0.002, 0.004, 0.001); /* first: see predict_with */
    for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
    gcomp_adapt_observe_link(a, 1e7, 1e-3);
    gcomp_adapt_end_step(a, NULL);
    size_t cap = gcomp_adapt_stats_size(a);
    double *mine = buf ? buf : malloc(cap * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, mine, cap, len));
    double *meas = mine + GCOMP__ADAPT_STATS_FIXED + a->nm;
    for (size_t q = 0; q < a->nm * a->K; q++) meas[4 * q + 2] = meas[4 * q + 3] = 1e-5;
    if (!buf) free(mine);
}

/* Out of memory at any allocation of a decision: GCOMP_E_NOMEM and nothing changes (the
 * state saved before is the state after, controllers' memory and predictions included),
 * and the decision taken once memory is back is the one a twin that never failed takes,
 * twice in a row: no rank takes half a decision.  (Before, the bandwidth controller kept
 * its level and the layer DP its plan without a word: the rank that ran out went on with
 * another decision than its peers'.) */
static void test_decide_out_of_memory(void) {
    const char *method = "adapt:bandwidth+layers;interval=1;measure=1";
    gcomp_adapt *a = NULL, *b = NULL;
    gcomp_error e = {0};
    CHECK_OK(make(&a, method, 0, &e));
    CHECK_OK(make(&b, method, 0, &e));
    float *g = malloc(256 * 256 * sizeof(float));
    if (!a || !b || !g) return;
    for (size_t k = 0; k < 256 * 256; k++) g[k] = (float)((k * 2654435761u) % 1000) - 500;
    size_t cap = gcomp_adapt_state_bound(a), l0, l1, len;
    uint8_t *s0 = malloc(cap), *s1 = malloc(cap);
    double *buf = malloc(gcomp_adapt_stats_size(a) * sizeof(double));
    int failed = 0;
    for (int round = 0; round < 2; round++) {
        measured_step(a, g, buf, &len);
        measured_step(b, g, NULL, &len);
        for (size_t n = 0;; n++) {
            CHECK_OK(gcomp_adapt_save_state(a, s0, cap, &l0));
            gcomp__alloc_fail_after = n;
            gcomp_status st = gcomp_adapt_decide(a, buf, len, 1, NULL, &e);
            gcomp__alloc_fail_after = (size_t)-1;
            if (st == GCOMP_OK) break;
            CHECK_MSG(st == GCOMP_E_NOMEM, "allocation %zu: status %d", n, (int)st);
            CHECK_OK(gcomp_adapt_save_state(a, s1, cap, &l1));
            CHECK_MSG(l0 == l1 && !memcmp(s0, s1, l0),
                      "round %d, allocation %zu: a failed decision changed the state", round, n);
            failed++;
            if (n > 10000) break;
        }
        CHECK_OK(gcomp_adapt_decide(b, buf, len, 1, NULL, &e));
        for (size_t i = 0; i < NMLP; i++)
            CHECK_MSG(gcomp_adapt_level(a, i) == gcomp_adapt_level(b, i),
                      "round %d: tensor %zu at level %d, its twin at %d", round, i,
                      gcomp_adapt_level(a, i), gcomp_adapt_level(b, i));
        for (size_t j = 0; j < a->K; j++)
            CHECK_MSG(gcomp_adapt_predicted(a, j) == gcomp_adapt_predicted(b, j),
                      "round %d: candidate %zu predicted %g, by its twin %g", round, j,
                      gcomp_adapt_predicted(a, j), gcomp_adapt_predicted(b, j));
    }
    CHECK_MSG(failed >= 6, "only %d allocations in two decisions", failed);
    free(buf);
    free(s0);
    free(s1);
    free(g);
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
}

static void predict_grouped(const unsigned *groups, size_t run_bytes, double *pred, size_t *K) {
    predict_with("adapt:bandwidth;interval=1;measure=1;concurrent=0", groups, run_bytes, pred, K);
}

/* By default the controller prices gradcomp's own buckets, every exchange in flight at once
 * (gcomp_mpi_wait_all): the six tensors' chains of 10 ms latencies overlap instead of
 * adding up, so every candidate's step is shorter than one exchange at a time - by at
 * least the two longest chains' worth for the compressed ones.  Anything but 0 or 1 is
 * refused. */
static void test_bandwidth_concurrent(void) {
    double serial[8], together[8];
    size_t K = 0, K2 = 0;
    predict_with("adapt:bandwidth;interval=1;measure=1;concurrent=0", NULL, 0, serial, &K);
    predict_with("adapt:bandwidth;interval=1;measure=1", NULL, 0, together, &K2);
    CHECK_EQ_INT(K, K2);
    for (size_t j = 0; j < K && j < 8; j++)
        CHECK_MSG(together[j] < serial[j] - 0.04, "candidate %zu: %g together, %g serial", j,
                  together[j], serial[j]);
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK(make(&a, "adapt:bandwidth;concurrent=2", 0, &e) == GCOMP_E_SPEC && !a);
    CHECK_MSG(strstr(e.message, "concurrent=2"), "%s", e.message);
}

/* The caller's exchange groups (DDP's buckets) reach the predictions.  On 4 ranks a small
 * allreduce (MPI_Iallreduce: libnbc's binomial reduce + broadcast) pays 2 log2 4 = 4
 * latencies of 10 ms and an allgather 2 phases of log2 4 = 2.  Alone, the four tensors
 * left dense (under min_elements) pay 16 latencies, the two managed weights 8 under a top-k
 * candidate (gathered) and 16 under PowerSGD (an allreduce of P and one of Q each).  In one
 * group the dense four are one allreduce (4), the weights one allgather (4) or PowerSGD's
 * factors of both one allreduce of P and one of Q (8), and these exchanges run side by
 * side: the group pays its longest, 4 (top-k: 20 saved) or 8 (PowerSGD: 24 saved).  Less
 * the decodes the fused transfer no longer hides, plus the check words sent once (1e-3
 * at most).  The codec and compute times are set, not measured: a second run predicts
 * the same to the bit, however loaded the machine.  The groups are part of the
 * configuration: a rank without them makes the decision fail on every rank. */
static void test_bandwidth_exchanges(void) {
    static const unsigned one[NMLP] = {1, 1, 1, 1, 1, 1}, pairs[NMLP] = {2, 2, 1, 1, 1, 1};
    static const double saved[4] = {0, 0.24, 0.20, 0.20}; /* PowerSGD, top-k, top-k */
    double alone[8], fused[8], split[8], again[8];
    size_t K = 0, K2 = 0;
    predict_grouped(NULL, 0, alone, &K);
    predict_grouped(one, 0, fused, &K2);
    CHECK_EQ_INT(K, 4);
    CHECK_EQ_INT(K2, K);
    for (size_t j = 0; j < K && j < 8; j++)
        CHECK_MSG(fused[j] < alone[j], "candidate %zu: %g grouped, %g alone", j, fused[j],
                  alone[j]);
    for (size_t j = 1; j < K && j < 4; j++)
        CHECK_MSG(fabs(alone[j] - fused[j] - saved[j]) < 1e-3, "candidate %zu saves %g s", j,
                  alone[j] - fused[j]);
    /* fc1's two in their own group, side by side: fc1.bias's 4 latencies hide behind
     * fc1.weight's (4 or 8); in the other group fc2.bias and fc3's two are one allreduce
     * (8 saved) beside fc2.weight (4 more): 16 latencies, whichever the candidate. */
    predict_grouped(pairs, 0, split, &K2);
    for (size_t j = 1; j < K && j < 8; j++)
        CHECK_MSG(fabs(alone[j] - split[j] - 0.16) < 1e-3, "candidate %zu saves %g s", j,
                  alone[j] - split[j]);
    predict_grouped(NULL, 0, again, &K2);
    for (size_t j = 0; j < K && j < 8; j++)
        CHECK_MSG(alone[j] == again[j], "%zu: %.17g, then %.17g", j, alone[j], again[j]);
    /* As a gcomp_mpi bucket sends (run_bytes > 0): only consecutive tensors of one strategy
     * and spec, in backward order.  For the compressed candidates that is fc3.bias, fc3.weight
     * (under min_elements: dense) and fc2.bias, one allreduce instead of three (8
     * latencies); fc2.weight, fc1.bias and fc1.weight alternate and go alone, PowerSGD's
     * always.  A cap of 10,280 bytes (fc3's two) cuts fc2.bias off: 4 latencies. */
    double runs[8], capped[8];
    predict_grouped(one, SIZE_MAX, runs, &K2);
    predict_grouped(one, 4 * (10 + 2560), capped, &K2);
    for (size_t j = 1; j < K && j < 8; j++) {
        CHECK_MSG(fabs(alone[j] - runs[j] - 0.08) < 1e-3, "runs: candidate %zu saves %g s", j,
                  alone[j] - runs[j]);
        CHECK_MSG(fabs(alone[j] - capped[j] - 0.04) < 1e-3, "capped: candidate %zu saves %g s", j,
                  alone[j] - capped[j]);
    }

    gcomp_adapt *a, *b;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:bandwidth;interval=1", 0, &e));
    CHECK_OK(make(&b, "adapt:bandwidth;interval=1", 0, &e));
    if (!a || !b) return;
    CHECK_EQ_INT(gcomp_adapt_set_exchanges(a, one, NMLP - 1, 0, &e), GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "5 groups for 6 tensors"), "%s", e.message);
    CHECK_EQ_INT(gcomp_adapt_set_exchanges(NULL, one, NMLP, 0, &e), GCOMP_E_ARG);
    CHECK_OK(gcomp_adapt_set_exchanges(a, one, NMLP, 0, &e));
    size_t len = gcomp_adapt_stats_size(a), got;
    double *all = calloc(2 * len, sizeof(double));
    gcomp_adapt *r[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        gcomp_adapt_observe_compute(r[k], 0.002, 0.004, 0.001);
        gcomp_adapt_end_step(r[k], NULL);
        CHECK_OK(gcomp_adapt_stats(r[k], all + k * len, len, &got));
    }
    for (int k = 0; k < 2; k++)
        CHECK_EQ_INT(gcomp_adapt_decide(r[k], all, len, 2, NULL, &e), GCOMP_E_MISMATCH);
    /* the same groups with another run_bytes: another configuration */
    CHECK_OK(gcomp_adapt_set_exchanges(b, one, NMLP, SIZE_MAX, &e));
    for (int k = 0; k < 2; k++) {
        gcomp_adapt_end_step(r[k], NULL);
        CHECK_OK(gcomp_adapt_stats(r[k], all + k * len, len, &got));
    }
    for (int k = 0; k < 2; k++)
        CHECK_EQ_INT(gcomp_adapt_decide(r[k], all, len, 2, NULL, &e), GCOMP_E_MISMATCH);
    /* the same groups on both: one decision */
    CHECK_OK(gcomp_adapt_set_exchanges(b, one, NMLP, 0, &e));
    for (int k = 0; k < 2; k++) {
        gcomp_adapt_end_step(r[k], NULL);
        CHECK_OK(gcomp_adapt_stats(r[k], all + k * len, len, &got));
    }
    for (int k = 0; k < 2; k++) CHECK_OK(gcomp_adapt_decide(r[k], all, len, 2, NULL, &e));
    free(all);
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
}

/* One interval of two "ranks", then the decision on both: where the decision asks for a
 * link probe (gcomp_adapt_link_due, which must agree on both), rank r observes link bw[r]
 * and a probe of probe_s[r] seconds; the interval's wall clock is replayed as `wall`
 * seconds.  Returns whether the probe was due. */
static int probe_interval(gcomp_adapt *a[2], const float *g, const double *bw,
                          const double *probe_s, double wall) {
    gcomp_error e = {0};
    size_t len = gcomp_adapt_stats_size(a[0]), got;
    double *all = malloc(2 * len * sizeof(double));
    int due[2];
    for (int r = 0; r < 2; r++) {
        for (uint64_t s = 0; s < gcomp_adapt_interval(a[r]); s++) {
            for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a[r], i, g, NULL));
            gcomp_adapt_observe_compute(a[r], 0.002, 0.004, 0.001);
            gcomp_adapt_end_step(a[r], NULL);
        }
        due[r] = gcomp_adapt_link_due(a[r]);
        if (due[r]) {
            gcomp_adapt_observe_link(a[r], bw[r], 50e-6);
            gcomp_adapt_observe_link_time(a[r], probe_s[r]);
        }
        CHECK_OK(gcomp_adapt_stats(a[r], all + r * len, len, &got));
    }
    CHECK_EQ_INT(due[0], due[1]);
    for (int r = 0; r < 2; r++) all[r * len + GCOMP__ADAPT_STATS_FIXED - 2] = wall; /* S_WALL */
    for (int r = 0; r < 2; r++) CHECK_OK(gcomp_adapt_decide(a[r], all, len, 2, NULL, &e));
    free(all);
    return due[0];
}

/* The time probes and measurements are spaced against is the interval's training: the
 * median gap between its steps times its steps, so a pause between two steps (an
 * evaluation) does not count; with too few steps, the wall time. */
static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_training_seconds(void) {
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:bandwidth;interval=10", 0, &e));
    if (!a) return;
    size_t len = gcomp_adapt_stats_size(a), got;
    double *st = malloc(len * sizeof(double));
    for (int s = 0; s < 10; s++) {
        sleep_ms(s == 5 ? 400 : 2); /* step 5's gap: an evaluation */
        gcomp_adapt_end_step(a, NULL);
    }
    CHECK_OK(gcomp_adapt_stats(a, st, len, &got));
    double w = st[GCOMP__ADAPT_STATS_FIXED - 2]; /* S_WALL */
    CHECK_MSG(w > 0.01 && w < 0.2, "10 steps of 2 ms and a 400 ms pause: %g s of training", w);
    /* two steps: too few gaps for a median, the wall time */
    for (int s = 0; s < 2; s++) {
        sleep_ms(s ? 300 : 2);
        gcomp_adapt_end_step(a, NULL);
    }
    CHECK_OK(gcomp_adapt_stats(a, st, len, &got));
    w = st[GCOMP__ADAPT_STATS_FIXED - 2];
    CHECK_MSG(w >= 0.3, "two steps and a 300 ms pause: %g s", w);
    free(st);
    gcomp_adapt_free(a);
}

/* The link probes are spaced by their cost (probe_cost of the training time, from the
 * slowest rank's probe), identically on every rank; the decisions between probes use the
 * last probe's link; a checkpoint keeps the spacing, and a version-1 checkpoint (before
 * it) loads and probes at its next decision. */
static void test_probe_spacing(void) {
    const char *m = "adapt:bandwidth;interval=2;confirm=1";
    gcomp_adapt *a[2], *x;
    gcomp_error e = {0};
    CHECK_OK(make(&x, "adapt:layers", 0, &e));
    CHECK_EQ_INT(gcomp_adapt_link_due(x), 0); /* no bandwidth controller, no probe */
    gcomp_adapt_free(x);
    CHECK_EQ_INT(gcomp_adapt_link_due(NULL), 0);
    for (int r = 0; r < 2; r++) CHECK_OK(make(&a[r], m, 0, &e));
    if (!a[0] || !a[1]) return;
    float *g = calloc(256 * 256, sizeof(float));
    for (size_t k = 0; k < 256 * 256; k++) g[k] = (float)((k * 2654435761u) % 1000) - 500;
    const double bw[2] = {1e7, 3e7}, fast[2] = {0.001, 0.002}, dear[2] = {0.1, 0.5};
    /* cheap probes: every decision probes (steps 2 and 4) */
    CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 1);
    CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 1);
    /* step 6: 0.5 s (the slowest rank's) of 10 s: ceil(0.5 / (0.02 * 10)) = 3 intervals on,
     * the next probe at step 12 */
    CHECK_EQ_INT(probe_interval(a, g, bw, dear, 10.0), 1);
    gcomp_adapt_report rep;
    gcomp_adapt_get_report(a[0], &rep);
    CHECK(rep.bandwidth == 2e7); /* the median of the two ranks' links */
    size_t cap = gcomp_adapt_state_bound(a[0]), blen = 0;
    uint8_t *blob = malloc(cap);
    CHECK_OK(gcomp_adapt_save_state(a[0], blob, cap, &blen));
    for (int k = 0; k < 2; k++) { /* steps 8 and 10: no probe, the last probe's link */
        CHECK_EQ_INT(probe_interval(a, g, bw, dear, 10.0), 0);
        gcomp_adapt_get_report(a[1], &rep);
        CHECK(rep.bandwidth == 2e7 && rep.decisions == 4 + (uint64_t)k);
        for (size_t j = 0; j < a[1]->K; j++) CHECK(gcomp_adapt_predicted(a[1], j) > 0);
    }
    CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 1); /* step 12 */
    CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 1); /* cheap again: step 14 */
    /* a stalled probe (100 s) waits at most 10 intervals for the next: step 16 + 20 */
    const double stall[2] = {100, 0.1};
    CHECK_EQ_INT(probe_interval(a, g, bw, stall, 10.0), 1);
    for (int k = 0; k < 9; k++) CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 0);
    CHECK_EQ_INT(probe_interval(a, g, bw, fast, 10.0), 1);
    /* the checkpoint taken after step 6: the same spacing */
    CHECK_OK(make(&x, m, 0, &e));
    if (x) {
        CHECK_OK(gcomp_adapt_load_state(x, blob, blen, &e));
        for (int k = 0; k < 3; k++) {
            for (uint64_t s = 0; s < gcomp_adapt_interval(x); s++) gcomp_adapt_end_step(x, NULL);
            CHECK_EQ_INT(gcomp_adapt_link_due(x), k == 2);
            decide1(x);
        }
        gcomp_adapt_free(x);
    }
    /* version 1: the same blob less the four fields it did not have (u64 next probe step,
     * f64 probe seconds; version 3's two f64 learning rates: the body's last 32 bytes,
     * before the bandwidth controller's section of 8 + 4 * 8 + K * 16 bytes and the CRC) */
    size_t sec = 8 + 32 + 16 * a[0]->K, at = blen - 4 - sec - 32;
    memmove(blob + at, blob + at + 32, sec + 4);
    size_t l1 = blen - 32;
    gcomp__put32(blob + 4, 1);
    gcomp__put64(blob + 8, l1);
    gcomp__put32(blob + l1 - 4, gcomp__crc32c(0, blob, l1 - 4));
    CHECK_OK(make(&x, m, 0, &e));
    if (x) {
        CHECK_MSG(gcomp_adapt_load_state(x, blob, l1, &e) == GCOMP_OK, "version 1: %s", e.message);
        for (uint64_t s = 0; s < gcomp_adapt_interval(x); s++) gcomp_adapt_end_step(x, NULL);
        CHECK_EQ_INT(gcomp_adapt_link_due(x), 1);
        gcomp_adapt_get_report(x, &rep);
        CHECK(rep.bandwidth == 2e7);
        gcomp_adapt_free(x);
    }
    /* version 0 and a future version are refused as versions */
    for (unsigned v = 0; v < 5; v += 4) {
        gcomp__put32(blob + 4, v);
        CHECK_OK(make(&x, m, 0, &e));
        if (x) {
            CHECK_EQ_INT(gcomp_adapt_load_state(x, blob, l1, &e), GCOMP_E_VERSION);
            gcomp_adapt_free(x);
        }
    }
    free(blob);
    free(g);
    for (int r = 0; r < 2; r++) gcomp_adapt_free(a[r]);
    /* statistics out of any rank's range are refused, never cast: a step beyond 2^53, a
     * fingerprint word that is no 32-bit half */
    CHECK_OK(make(&x, m, 0, &e));
    if (x) {
        size_t len = gcomp_adapt_stats_size(x), got;
        double *st = malloc(len * sizeof(double));
        for (int k = 0; k < 3; k++) {
            for (uint64_t s = 0; s < gcomp_adapt_interval(x); s++) gcomp_adapt_end_step(x, NULL);
            CHECK_OK(gcomp_adapt_stats(x, st, len, &got));
            if (k == 0) st[4] = 0x1p64; /* S_STEP */
            if (k == 1) st[1] = NAN;    /* S_FP_LO */
            if (k == 2) st[2] = -1;     /* S_FP_HI */
            CHECK_EQ_INT(gcomp_adapt_decide(x, st, len, 1, NULL, &e), GCOMP_E_MISMATCH);
        }
        free(st);
        gcomp_adapt_free(x);
    }
    /* a bad probe_cost is refused at create */
    expect_spec_error("adapt:bandwidth;probe_cost=0", "probe_cost");
    expect_spec_error("adapt:layers;probe_cost=0.1", "bandwidth");
}

/* ---- accuracy -------------------------------------------------------------------------- */

/* One interval, its metric taken at its end (as the trainer evaluates), then the decision. */
static void acc_step(gcomp_adapt *a, double metric) {
    for (uint64_t s = 0; s < gcomp_adapt_interval(a); s++) gcomp_adapt_end_step(a, NULL);
    gcomp_adapt_observe_metric(a, metric);
    decide1(a);
}

static void test_accuracy(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    /* 100 steps, a decision every 10: progress 0.1, 0.2, ... */
    CHECK_OK(make(&a, "adapt:accuracy;target=88;interval=10;dwell=2;start=0.1", 100, &e));
    if (!a) return;
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    acc_step(a, 0.80); /* p 0.1: required 0.862: far behind -> lighter */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    acc_step(a, 0.80); /* dwell: holds */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    acc_step(a, 0.80); /* moves again */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    acc_step(a, 0.90); /* ahead of 0.868: heavier, after the dwell */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 2);
    acc_step(a, 0.90);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    acc_step(a, 0.872); /* within the band around required 0.872: holds */
    acc_step(a, 0.872);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    gcomp_adapt_free(a);
    /* bounded: far behind for ever stops at level 0 and comes back at once */
    CHECK_OK(make(&a, "adapt:accuracy;target=0.88;interval=10;dwell=1", 1000, &e));
    if (!a) return;
    for (int k = 0; k < 20; k++) acc_step(a, 0.5);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 0);
    acc_step(a, 0.99);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 1);
    gcomp_adapt_free(a);
}

/* The loop judges the mean deviation from its course since the last move, not one
 * evaluation; and from `hold` (0.8) on it never compresses harder. */
static void test_accuracy_noise_hold(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    /* 100 steps, a decision every 10; course 0.88 - 0.02 (1 - p), band 0.002 */
    CHECK_OK(make(&a, "adapt:accuracy;target=0.88;interval=10;dwell=2", 100, &e));
    if (!a) return;
    acc_step(a, 0.862 - 0.001); /* p 0.1: 0.1 pp behind: within the band */
    acc_step(a, 0.864 + 0.004); /* p 0.2: 0.4 pp ahead alone, mean 0.15 pp: holds */
    CHECK_MSG(gcomp_adapt_level(a, 0) == 4, "one evaluation moved it: level %d",
              gcomp_adapt_level(a, 0));
    acc_step(a, 0.866 + 0.004); /* p 0.3: mean 0.23 pp ahead: heavier */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 5);
    gcomp_adapt_free(a);

    CHECK_OK(make(&a, "adapt:accuracy;target=0.88;interval=10;dwell=1", 100, &e));
    if (!a) return;
    for (int k = 1; k <= 4; k++) acc_step(a, 0.5); /* p 0.1-0.4: far behind: 4 -> 0 */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 0);
    for (int k = 5; k <= 7; k++) acc_step(a, 0.99); /* p 0.5-0.7: far ahead: 0 -> 3 */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    for (int k = 8; k <= 10; k++) acc_step(a, 0.99); /* p 0.8-1.0: held */
    CHECK_MSG(gcomp_adapt_level(a, 0) == 3, "heavier after hold: level %d",
              gcomp_adapt_level(a, 0));
    gcomp_adapt_free(a);
}

/* The mean is over the latest `window` (4) deviations: a long stretch slightly ahead of the
 * course must not hide a drift below it (the mean of all nine below is -0.03 pp, in the
 * band; of the latest four -0.26 pp). */
static void test_accuracy_window(void) {
    gcomp_adapt *a;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:accuracy;target=0.88;interval=10;dwell=1;start=0", 1000, &e));
    if (!a) return;
    for (int k = 1; k <= 9; k++) {
        double p = 10.0 * k / 1000, course = 0.88 - 0.02 * (1 - p);
        acc_step(a, course + (k <= 6 ? 0.0015 : -0.004));
        CHECK_MSG(gcomp_adapt_level(a, 0) == (k < 9 ? 4 : 3), "metric %d: level %d", k,
                  gcomp_adapt_level(a, 0));
    }
    gcomp_adapt_free(a);
    expect_spec_error("adapt:accuracy;target=0.9;window=0", "window=0");
    expect_spec_error("adapt:accuracy;target=0.9;window=65", "window=65");
}

/* A reference curve gives the course its shape.  The curve here rises slowly and jumps at
 * the end, as accuracy does under a cosine rate: a run that follows it 0.3 pp below holds
 * its setting, where the glide path reads the same run as behind and lightens. */
static void test_accuracy_course(void) {
    double prog[10], ref[10], target = 0.877;
    for (int k = 0; k < 10; k++) {
        prog[k] = (k + 1) / 10.0;
        ref[k] = 0.80 + 0.08 * prog[k] * prog[k] * prog[k]; /* ends at 0.88 */
    }
    gcomp_adapt *a, *g;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:accuracy;target=0.877;interval=10;dwell=1", 100, &e));
    CHECK_OK(make(&g, "adapt:accuracy;target=0.877;interval=10;dwell=1;course=glide", 100, &e));
    if (!a || !g) return;
    CHECK_OK(gcomp_adapt_set_course(a, prog, ref, 10, &e));
    CHECK_OK(gcomp_adapt_set_course(g, prog, ref, 10, &e));
    for (int k = 0; k < 10; k++) {
        acc_step(a, ref[k] - (0.88 - target));
        acc_step(g, ref[k] - (0.88 - target));
    }
    CHECK_MSG(gcomp_adapt_level(a, 0) == 4, "on its course, it moved to level %d",
              gcomp_adapt_level(a, 0));
    CHECK_MSG(gcomp_adapt_level(g, 0) < 4, "the glide path did not read it as behind");
    gcomp_adapt_free(a);
    gcomp_adapt_free(g);

    /* 0.5 pp below the course: lighter; 0.5 pp above, before hold: heavier */
    CHECK_OK(make(&a, "adapt:accuracy;target=0.877;interval=10;dwell=1", 100, &e));
    if (!a) return;
    CHECK_OK(gcomp_adapt_set_course(a, prog, ref, 10, &e));
    acc_step(a, ref[0] - 0.003 - 0.005);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    acc_step(a, ref[1] - 0.003 + 0.005);
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    /* the point between two of the curve's: interpolated (0.25 is halfway from 0.2 to 0.3) */
    for (int s = 0; s < 5; s++) gcomp_adapt_end_step(a, NULL);
    gcomp_adapt_observe_metric(a, 0.5 * (ref[1] + ref[2]) - 0.003 - 0.001);
    for (int s = 0; s < 5; s++) gcomp_adapt_end_step(a, NULL);
    decide1(a); /* 0.1 pp behind at its own progress (0.25): within the band */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);

    /* bad curves are refused and leave the course as it was */
    double bad[10];
    memcpy(bad, prog, sizeof bad);
    bad[4] = bad[3];
    CHECK_EQ_INT(gcomp_adapt_set_course(a, bad, ref, 10, &e), GCOMP_E_ARG);
    CHECK(strstr(e.message, "progress[4]") != NULL);
    bad[0] = 0;
    CHECK_EQ_INT(gcomp_adapt_set_course(a, bad, ref, 1, &e), GCOMP_E_ARG);
    CHECK(strstr(e.message, "progress[0]=0") != NULL);
    memcpy(bad, ref, sizeof bad);
    bad[9] = 88.0;
    CHECK_EQ_INT(gcomp_adapt_set_course(a, prog, bad, 10, &e), GCOMP_E_ARG);
    CHECK(strstr(e.message, "fraction") != NULL);
    bad[9] = NAN;
    CHECK_EQ_INT(gcomp_adapt_set_course(a, prog, bad, 10, &e), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_adapt_set_course(a, NULL, ref, 10, &e), GCOMP_E_ARG);
    gcomp_adapt *l;
    CHECK_OK(make(&l, "adapt:layers", 100, &e));
    if (l) {
        CHECK_EQ_INT(gcomp_adapt_set_course(l, prog, ref, 10, &e), GCOMP_E_ARG);
        CHECK(strstr(e.message, "accuracy") != NULL);
        gcomp_adapt_free(l);
    }

    /* the curve is part of the configuration: a rank given another one is a mismatch */
    CHECK_OK(make(&g, "adapt:accuracy;target=0.877;interval=10;dwell=1", 100, &e));
    if (g) {
        for (int k = 0; k < 3; k++) acc_step(g, 0.9); /* the same decision index as a */
        size_t len = gcomp_adapt_stats_size(a), la, lg;
        double *all = malloc(2 * len * sizeof(double));
        CHECK_OK(gcomp_adapt_stats(a, all, len, &la));
        CHECK_OK(gcomp_adapt_stats(g, all + len, len, &lg));
        CHECK_EQ_INT(gcomp_adapt_decide(a, all, len, 2, NULL, &e), GCOMP_E_MISMATCH);
        /* the same curve on both: they agree again */
        CHECK_OK(gcomp_adapt_set_course(g, prog, ref, 10, &e));
        CHECK_OK(gcomp_adapt_stats(a, all, len, &la));
        CHECK_OK(gcomp_adapt_stats(g, all + len, len, &lg));
        CHECK_OK(gcomp_adapt_decide(a, all, len, 2, NULL, &e));
        free(all);
        gcomp_adapt_free(g);
    }
    /* course=bogus is a spec error */
    expect_spec_error("adapt:accuracy;target=0.9;course=dense", "course=dense");
    gcomp_adapt_free(a);

    /* target=ref-0.3: 0.3 pp below the curve's end, so the same course as target=0.877 */
    expect_spec_error("adapt:accuracy;target=ref-x", "expected ref-X");
    expect_spec_error("adapt:accuracy;target=ref-100", "expected ref-X");
    expect_spec_error("adapt:accuracy;target=ref-0.3;course=glide", "course=glide ignores");
    CHECK_OK(make(&a, "adapt:accuracy;target=ref-0.3;interval=10;dwell=1", 100, &e));
    if (!a) return;
    for (uint64_t s = 0; s < gcomp_adapt_interval(a); s++) gcomp_adapt_end_step(a, NULL);
    gcomp_adapt_observe_metric(a, 0.8);
    size_t len = gcomp_adapt_stats_size(a), l1;
    double *buf = malloc(len * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, buf, len, &l1));
    CHECK_EQ_INT(gcomp_adapt_decide(a, buf, len, 1, NULL, &e), GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "needs a reference curve") != NULL, "message: %s", e.message);
    free(buf);
    CHECK_OK(gcomp_adapt_set_course(a, prog, ref, 10, &e));
    acc_step(a, ref[1] - 0.003 - 0.001); /* within the band of ref - 0.3 pp: holds */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 4);
    acc_step(a, ref[2] - 0.003 - 0.005); /* 0.5 pp behind: lighter */
    CHECK_EQ_INT(gcomp_adapt_level(a, 0), 3);
    gcomp_adapt_free(a);
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* Step `step` of a synthetic run, the same whatever object runs it: gradients, compute and
 * (every third step) a metric from the step's own seed; a decision when due. */
static void state_step(gcomp_adapt *a, size_t step, float *g) {
    unsigned long long seed = 1000 + step;
    /* first: see predict_with */
    gcomp_adapt_observe_compute(a, 0.001, 0.002 + 0.0001 * (double)(step % 5), 0.0005);
    for (size_t i = 0; i < NMLP; i++) {
        if (!gcomp_adapt_managed(a, i)) continue;
        /* a consistent direction whose accumulated norm falls, then jumps (Accordion) */
        double scale = step < 40 ? 1.0 / (1.0 + 0.2 * (double)step) : step < 56 ? 0.1 : 1.0;
        for (size_t k = 0; k < MLP[i].n; k++)
            g[k] = (float)(scale * (1.0 + 0.3 * test_gauss(&seed)));
        CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
    }
    if (step % 3 == 2) gcomp_adapt_observe_metric(a, 0.5 + 0.01 * (double)(step % 11));
    int due;
    gcomp_adapt_end_step(a, &due);
    if (due) decide1(a);
}

static bool same_decisions(gcomp_adapt *x, gcomp_adapt *y) {
    bool same = true;
    for (size_t i = 0; i < NMLP; i++)
        same &= !strcmp(gcomp_adapt_spec(x, i), gcomp_adapt_spec(y, i));
    gcomp_adapt_report rx, ry;
    gcomp_adapt_get_report(x, &rx);
    gcomp_adapt_get_report(y, &ry);
    return same && rx.decisions == ry.decisions && rx.step == ry.step &&
           rx.critical == ry.critical && rx.error == ry.error &&
           rx.error_uniform == ry.error_uniform && rx.uniform_level == ry.uniform_level &&
           (rx.metric == ry.metric || (isnan(rx.metric) && isnan(ry.metric)));
}

/* Saved mid-interval and loaded into a fresh object, a run decides from there exactly as the
 * uninterrupted one (every controller but bandwidth, whose inputs are wall-clock times); a
 * fresh object without the load does not.  Bad blobs are refused and change nothing. */
static void test_state(void) {
    const char *method = "adapt:accuracy+layers+norm;target=0.6;interval=4;measure=8;dwell=1";
    gcomp_adapt *a, *b, *c;
    gcomp_error e = {0};
    CHECK_OK(make(&a, method, 200, &e));
    CHECK_OK(make(&b, method, 200, &e));
    CHECK_OK(make(&c, method, 200, &e));
    if (!a || !b || !c) return;
    double prog[3] = {0.2, 0.5, 1.0}, ref[3] = {0.5, 0.55, 0.6};
    CHECK_OK(gcomp_adapt_set_course(a, prog, ref, 3, &e));
    CHECK_OK(gcomp_adapt_set_course(c, prog, ref, 3, &e));
    float *g = malloc(256 * 256 * sizeof(float));
    size_t step = 0;
    for (; step < 30; step++) state_step(a, step, g); /* 7 decisions, 2 steps into the 8th */
    size_t cap = gcomp_adapt_state_bound(a), len;
    uint8_t *blob = malloc(cap), *bad = malloc(cap + 8);
    CHECK_EQ_INT(gcomp_adapt_save_state(a, blob, cap - 1, &len), GCOMP_E_DST_SIZE);
    CHECK_OK(gcomp_adapt_save_state(a, blob, cap, &len));
    CHECK_EQ_INT(len, cap);

    /* refused, and b is left as it was (its own blob does not change) */
    size_t blen;
    uint8_t *before = malloc(cap), *after = malloc(cap); /* b's blob has no course: smaller */
    CHECK_OK(gcomp_adapt_save_state(b, before, cap, &blen));
    CHECK_EQ_INT(gcomp_adapt_load_state(b, blob, len - 1, &e), GCOMP_E_TRUNCATED);
    memcpy(bad, blob, len);
    bad[0] ^= 1;
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_BAD_MAGIC);
    memcpy(bad, blob, len);
    bad[4] = 4; /* a version after this library's */
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_VERSION);
    memcpy(bad, blob, len);
    bad[len / 2] ^= 0x40;
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_CHECKSUM);
    /* a level beyond the ladder, with a valid checksum: read field by field, refused */
    memcpy(bad, blob, len);
    gcomp__put64(bad + 288, 99); /* the first managed tensor's level */
    gcomp__put32(bad + len - 4, gcomp__crc32c(0, bad, len - 4));
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_STATE);
    CHECK_MSG(strstr(e.message, "beyond the ladder") != NULL, "message: %s", e.message);
    /* a controller's field out of range (the norm controller's last flag is 2) */
    memcpy(bad, blob, len);
    gcomp__put64(bad + len - 4 - 8, 2);
    gcomp__put32(bad + len - 4, gcomp__crc32c(0, bad, len - 4));
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_STATE);
    CHECK_MSG(strstr(e.message, "norm") != NULL, "message: %s", e.message);
    size_t alen;
    CHECK_OK(gcomp_adapt_save_state(b, after, cap, &alen));
    CHECK(alen == blen && memcmp(before, after, blen) == 0);
    gcomp_adapt *other;
    CHECK_OK(make(&other, "adapt:accuracy+layers+norm;target=0.6;interval=5;measure=10;dwell=1",
                  200, &e));
    if (other) {
        CHECK_EQ_INT(gcomp_adapt_load_state(other, blob, len, &e), GCOMP_E_MISMATCH);
        gcomp_adapt_free(other);
    }

    CHECK_OK(gcomp_adapt_load_state(b, blob, len, &e));
    CHECK_OK(gcomp_adapt_save_state(b, after, cap, &alen)); /* everything saved came back */
    CHECK(alen == len && memcmp(after, blob, len) == 0);
    int differ_c = 0;
    for (; step < 80; step++) {
        state_step(a, step, g);
        state_step(b, step, g);
        state_step(c, step, g);
        CHECK_MSG(same_decisions(a, b), "step %zu: the loaded run decides otherwise", step);
        differ_c += !same_decisions(a, c);
    }
    CHECK_MSG(differ_c > 0, "a fresh object decides as the loaded one: the test proves nothing");
    /* the course came with the blob: b's statistics still match a's configuration */
    size_t sl = gcomp_adapt_stats_size(a), got;
    double *all = malloc(2 * sl * sizeof(double));
    CHECK_OK(gcomp_adapt_stats(a, all, sl, &got));
    CHECK_OK(gcomp_adapt_stats(b, all + sl, sl, &got));
    CHECK_OK(gcomp_adapt_decide(a, all, sl, 2, NULL, &e));
    free(all);
    free(before);
    free(after);
    free(bad);
    free(blob);
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
    gcomp_adapt_free(c);

    /* the bandwidth controller's memory (streak, codec rates) too: saved, loaded, saved again
     * gives the same bytes */
    const char *bw = "adapt:bandwidth+layers+norm;interval=4;measure=4;confirm=3";
    CHECK_OK(make(&a, bw, 0, &e));
    CHECK_OK(make(&b, bw, 0, &e));
    if (a && b) {
        for (step = 0; step < 14; step++) {
            gcomp_adapt_observe_link(a, 1e7 * (double)(1 + step % 4), 1e-5);
            state_step(a, step, g);
        }
        cap = gcomp_adapt_state_bound(a);
        blob = malloc(cap);
        after = malloc(cap);
        CHECK_OK(gcomp_adapt_save_state(a, blob, cap, &len));
        CHECK_OK(gcomp_adapt_load_state(b, blob, len, &e));
        CHECK_OK(gcomp_adapt_save_state(b, after, cap, &alen));
        CHECK(alen == len && memcmp(after, blob, len) == 0);
        gcomp_adapt_report r;
        gcomp_adapt_get_report(b, &r);
        CHECK(r.decisions == 3 && r.bandwidth > 0);
        free(blob);
        free(after);
    }
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
    free(g);
}

/* A saved state with a valid checksum whose fields no run can produce is refused, field by
 * field, and nothing of it applied: a next measurement behind the step (no measurement
 * would ever come again), observations that are not finite, a streak at or past
 * `confirm` (it overflowed int on the next decision), NaN deviations and errors, half a
 * layer plan, negative codec rates, an infinite norm, NaN in a gradient sum. */
enum { SEC_BW, SEC_ACC, SEC_LAYERS, SEC_NORM, NSEC };

/* Where controller k's section starts in a blob of IMPOSSIBLE's method (docs/FORMAT.md:
 * the sections' sizes, each after its u64 length, and the CRC at the end). */
static size_t section_at(const gcomp_adapt *a, size_t len, int k) {
    const size_t nm = a->nm, K = a->K;
    const size_t size[NSEC] = {32 + 16 * K, 24 + 8 * 64, 8 + 8 * nm + 8 * nm * K, 16 * nm};
    size_t at = len - 4;
    for (int q = NSEC - 1; q >= k; q--) at -= size[q] + (q > k ? 8 : 0);
    return at;
}

static void put_f64(uint8_t *p, double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    gcomp__put64(p, b);
}

static void refit_crc(uint8_t *blob, size_t len) {
    gcomp__put32(blob + len - 4, gcomp__crc32c(0, blob, len - 4));
}

static void test_state_refuses_impossible(void) {
    const char *method = "adapt:bandwidth+accuracy+layers+norm;target=0.9;interval=5;measure=5;"
                         "confirm=3;dwell=1";
    gcomp_adapt *a = NULL, *b = NULL;
    gcomp_error e = {0};
    CHECK_OK(make(&a, method, 1000, &e));
    CHECK_OK(make(&b, method, 1000, &e));
    if (!a || !b) {
        gcomp_adapt_free(a);
        gcomp_adapt_free(b);
        return;
    }
    float *g = malloc(256 * 256 * sizeof(float));
    for (size_t step = 0; step < 12; step++) {
        gcomp_adapt_observe_link(a, 1e7, 1e-4);
        state_step(a, step, g);
    }
    size_t cap = gcomp_adapt_state_bound(a), len, blen;
    uint8_t *blob = malloc(cap), *bad = malloc(cap), *before = malloc(cap), *after = malloc(cap);
    CHECK_OK(gcomp_adapt_save_state(a, blob, cap, &len));
    CHECK_OK(gcomp_adapt_save_state(b, before, cap, &blen));
    /* the layout the cases below rely on: each section's u64 length before it */
    for (int k = 0; k < NSEC; k++) {
        size_t at = section_at(a, len, k),
               next = k + 1 < NSEC ? section_at(a, len, k + 1) - 8 : len - 4;
        CHECK_MSG(gcomp__get64(blob + at - 8) == next - at, "section %d at %zu: length %llu", k, at,
                  (unsigned long long)gcomp__get64(blob + at - 8));
    }
    const size_t nm = a->nm, K = a->K, bw = section_at(a, len, SEC_BW),
                 acc = section_at(a, len, SEC_ACC), lay = section_at(a, len, SEC_LAYERS),
                 nrm = section_at(a, len, SEC_NORM);
    const double inf = INFINITY, nan = NAN;
    struct {
        const char *what;
        size_t at;
        int is_double;
        double v;
        uint64_t u;
        const char *needle;
    } cases[] = {
        {"next measurement behind the step", 40 + 16, 0, 0, 3, "next measurement 3"},
        {"forward time -1e300", 96, 1, -1e300, 0, "observation 0"},
        {"a link of +Inf", 96 + 8 * 3, 1, inf, 0, "observation 3"},
        {"a metric sum of NaN", 96 + 8 * 5, 1, nan, 0, "observation 5"},
        {"the last link's latency NaN", 96 + 8 * 9, 1, nan, 0, "observation 9"},
        {"a streak of INT32_MAX", bw + 16, 0, 0, 2147483647, "bandwidth"},
        {"a streak at confirm", bw + 16, 0, 0, 3, "bandwidth"},
        {"an encode rate of -5", bw + 32, 1, -5, 0, "bandwidth"},
        {"an encode rate without its decode rate", bw + 32 + 8, 1, nan, 0, "bandwidth"},
        {"a deviation of NaN", acc + 24, 1, nan, 0, "accuracy"},
        {"half a layer plan", lay + 8 + 8, 0, 0, UINT64_MAX, "layers"},
        {"a squared error of NaN", lay + 8 + 8 * nm, 1, nan, 0, "layers"},
        {"a negative squared error", lay + 8 + 8 * nm + 8 * (K - 1), 1, -1, 0, "layers"},
        {"a previous norm of +Inf", nrm, 1, inf, 0, "norm"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(bad, blob, len);
        if (cases[c].is_double)
            put_f64(bad + cases[c].at, cases[c].v);
        else
            gcomp__put64(bad + cases[c].at, cases[c].u);
        if (!strcmp(cases[c].what, "half a layer plan")) /* tensor 0 in a plan, tensor 1 not */
            gcomp__put64(bad + lay + 8, 1);
        refit_crc(bad, len);
        gcomp_status st = gcomp_adapt_load_state(b, bad, len, &e);
        CHECK_MSG(st == GCOMP_E_STATE, "%s: load gave %d (%s)", cases[c].what, st, e.message);
        CHECK_MSG(st != GCOMP_E_STATE || strstr(e.message, cases[c].needle), "%s: message '%s'",
                  cases[c].what, e.message);
        size_t alen;
        CHECK_OK(gcomp_adapt_save_state(b, after, cap, &alen));
        CHECK_MSG(alen == blen && !memcmp(before, after, blen), "%s: b changed", cases[c].what);
    }
    /* a NaN in the norm controller's gradient sum: the last float of the sums */
    memcpy(bad, blob, len);
    /* before the first section's length: the probe spacing, its seconds, two rates */
    size_t sums_end = bw - 8 - 4 * 8;
    gcomp__putf(bad + sums_end - 4, NAN);
    refit_crc(bad, len);
    CHECK_EQ_INT(gcomp_adapt_load_state(b, bad, len, &e), GCOMP_E_STATE);
    CHECK_MSG(strstr(e.message, "NaN or Inf") != NULL, "message '%s'", e.message);
    /* the blob itself loads, and the load is the object saved */
    CHECK_OK(gcomp_adapt_load_state(b, blob, len, &e));
    size_t alen;
    CHECK_OK(gcomp_adapt_save_state(b, after, cap, &alen));
    CHECK(alen == len && !memcmp(after, blob, len));
    free(blob);
    free(bad);
    free(before);
    free(after);
    free(g);
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
}

/* A compute time of +Inf is ignored like a NaN one: one rank's would be every rank's
 * slowest compute, every prediction Inf, and the bandwidth controller frozen; and a decide
 * that fails leaves no tensor flagged as changed by it. */
static void test_observe_compute_inf_and_failed_decide(void) {
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:bandwidth;interval=2;confirm=1", 0, &e));
    if (!a) return;
    size_t len = gcomp_adapt_stats_size(a), got;
    double *all = malloc(len * sizeof(double));
    float *g = calloc(256 * 256, sizeof(float));
    for (size_t k = 0; k < 256 * 256; k++) g[k] = (float)(k % 7) - 3;
    /* slow: compress hard; fast: dense; fast again, with a rank's compute of +Inf */
    double link[3] = {1e6, 1e12, 1e12};
    for (int d = 0; d < 3; d++) {
        for (int s = 0; s < 2; s++) {
            for (size_t i = 0; i < NMLP; i++) CHECK_OK(gcomp_adapt_observe(a, i, g, NULL));
            gcomp_adapt_observe_compute(a, d == 2 ? INFINITY : 0.01, 0.02, 0.001);
            gcomp_adapt_observe_link(a, link[d], 1e-5);
            gcomp_adapt_end_step(a, NULL);
        }
        size_t changed;
        CHECK_OK(gcomp_adapt_stats(a, all, len, &got));
        CHECK_OK(gcomp_adapt_decide(a, all, len, 1, &changed, &e));
        gcomp_adapt_report r;
        gcomp_adapt_get_report(a, &r);
        CHECK_MSG(isfinite(r.compute_s) && isfinite(gcomp_adapt_predicted(a, 0)),
                  "decision %d: compute %g, predicted %g", d, r.compute_s,
                  gcomp_adapt_predicted(a, 0));
        if (d != 1) continue;
        /* the link's change moved tensors; a decide that fails (statistics of the wrong
         * length) then leaves none flagged */
        CHECK_MSG(changed > 0 && gcomp_adapt_changed(a, 0),
                  "nothing moved: the test proves nothing");
        CHECK_EQ_INT(gcomp_adapt_decide(a, all, len - 1, 1, NULL, &e), GCOMP_E_MISMATCH);
        for (size_t i = 0; i < NMLP; i++)
            CHECK_MSG(!gcomp_adapt_changed(a, i), "tensor %zu still flagged after a failed decide",
                      i);
    }
    free(all);
    free(g);
    gcomp_adapt_free(a);
}

/* ---- the same decision on every rank ----------------------------------------------------- */

static void test_ranks_agree(void) {
    const char *method = "adapt:bandwidth+layers+norm;interval=4;measure=4;confirm=1";
    enum { R = 3 };
    gcomp_adapt *a[R];
    gcomp_error e = {0};
    for (int r = 0; r < R; r++) CHECK_OK(make(&a[r], method, 0, &e));
    if (!a[0] || !a[1] || !a[2]) return;
    unsigned long long seed = 11;
    float *g = malloc(256 * 256 * sizeof(float));
    size_t len = gcomp_adapt_stats_size(a[0]);
    double *all = malloc(R * len * sizeof(double));
    for (int d = 0; d < 6; d++) {
        for (int s = 0; s < 4; s++) {
            for (int r = 0; r < R; r++) {
                /* every rank sees other gradients, timings and link speeds */
                for (size_t i = 0; i < NMLP; i++) {
                    for (size_t k = 0; k < MLP[i].n; k++)
                        g[k] = (float)(test_gauss(&seed) * (1 + r) / (1 + d));
                    CHECK_OK(gcomp_adapt_observe(a[r], i, g, NULL));
                }
                gcomp_adapt_observe_compute(a[r], 0.001 * (r + 1), 0.002 * (d + 1), 0.0005);
                gcomp_adapt_observe_link(a[r], 1e7 * (1 + r * 3) * (d + 1), 1e-5 * (R - r));
                gcomp_adapt_end_step(a[r], NULL);
            }
        }
        size_t got;
        for (int r = 0; r < R; r++) CHECK_OK(gcomp_adapt_stats(a[r], all + r * len, len, &got));
        for (int r = 0; r < R; r++) CHECK_OK(gcomp_adapt_decide(a[r], all, len, R, NULL, &e));
        for (size_t i = 0; i < NMLP; i++)
            for (int r = 1; r < R; r++)
                CHECK_MSG(!strcmp(gcomp_adapt_spec(a[r], i), gcomp_adapt_spec(a[0], i)),
                          "decision %d tensor %zu: rank %d '%s' rank 0 '%s'", d, i, r,
                          gcomp_adapt_spec(a[r], i), gcomp_adapt_spec(a[0], i));
    }
    /* the decisions moved at all (a test that cannot fail proves nothing) */
    gcomp_adapt_report rep;
    gcomp_adapt_get_report(a[0], &rep);
    CHECK(rep.decisions == 6 && rep.bandwidth > 0);

    /* a rank of another configuration, or one a decision behind, fails every rank */
    gcomp_adapt *other;
    CHECK_OK(make(&other, "adapt:bandwidth+layers+norm;interval=4;measure=8;confirm=1", 0, &e));
    if (other) {
        for (int s = 0; s < 4; s++) gcomp_adapt_end_step(other, NULL);
        size_t got;
        CHECK_OK(gcomp_adapt_stats(other, all + len, len, &got));
        CHECK_OK(gcomp_adapt_stats(a[0], all, len, &got));
        CHECK_EQ_INT(gcomp_adapt_decide(a[0], all, len, 2, NULL, &e), GCOMP_E_MISMATCH);
        CHECK(strstr(e.message, "rank 1") != NULL);
        gcomp_adapt_free(other);
    }
    CHECK_EQ_INT(gcomp_adapt_decide(a[1], all, len + 1, 1, NULL, &e), GCOMP_E_MISMATCH);
    for (int r = 0; r < R; r++) gcomp_adapt_free(a[r]);
    free(all);
    free(g);
}

/* Every option a decision reads is part of the configuration the statistics carry: ranks
 * given another run length, worker count, node count, dense spec, exchange strategy or
 * calibration fail together at the first decision instead of predicting apart (a host
 * with its own calibration file would otherwise steer its own way, without a word). */
static gcomp_cost_calibration *int8_calibration(double per_elem) {
    char txt[256];
    snprintf(txt, sizeof txt,
             "gradcomp-calibration 3\ncodec int8:feedback=ef encode_fixed_s=0 "
             "encode_per_elem=%g decode_fixed_s=0 decode_per_elem=%g\n",
             per_elem, per_elem);
    gcomp_cost_calibration *cal = NULL;
    gcomp_error e = {0};
    CHECK_OK(gcomp_cost_calibration_parse(&cal, txt, strlen(txt), &e));
    return cal;
}

static int allgather_strategy(void *ctx, const char *spec) {
    (void)ctx;
    (void)spec;
    return GCOMP_COST_ALLGATHER;
}

/* The fingerprint follows what a method means, not how it is written: a number by its
 * value, an explicit default as its absence, options in any order; name overrides keep
 * their order (the first match wins).  A state saved under one spelling loads under another. */
static uint64_t fingerprint_of(const char *method) {
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_MSG(make(&a, method, 1000, &e) == GCOMP_OK, "%s: %s", method, e.message);
    uint64_t fp = a ? gcomp_adapt_fingerprint(a) : 0;
    gcomp_adapt_free(a);
    return fp;
}

static void test_fingerprint_spelling(void) {
    const char *same[][2] = {
        {"adapt:norm;eta=0.5", "adapt:norm;eta=0.50"},
        {"adapt:norm;eta=0.5", "adapt:norm;eta=5e-1"},
        {"adapt:norm;eta=0.5", "adapt:norm"},
        {"adapt:norm;eta=0.7;interval=10", "adapt:norm;interval=10;eta=0.70"},
        {"adapt:norm;interval=auto", "adapt:norm"},
        {"adapt:bandwidth;confirm=2;slack=0.05", "adapt:bandwidth"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        CHECK_MSG(fingerprint_of(same[i][0]) == fingerprint_of(same[i][1]), "'%s' and '%s' differ",
                  same[i][0], same[i][1]);
    const char *other[][2] = {
        {"adapt:norm;eta=0.5", "adapt:norm;eta=0.6"},
        {"adapt:norm;interval=10", "adapt:norm;interval=20"},
        {"adapt:norm", "adapt:layers"},
        {"adapt:layers;fc1.*=none;fc1*=int8", "adapt:layers;fc1*=int8;fc1.*=none"},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        CHECK_MSG(fingerprint_of(other[i][0]) != fingerprint_of(other[i][1]),
                  "'%s' and '%s' are taken for one configuration", other[i][0], other[i][1]);

    gcomp_adapt *a = NULL, *b = NULL;
    gcomp_error e = {0};
    CHECK_OK(make(&a, "adapt:norm;eta=0.5;interval=10", 1000, &e));
    CHECK_OK(make(&b, "adapt:norm; eta=5e-1 ;interval=10", 1000, &e));
    if (a && b) {
        size_t cap = gcomp_adapt_state_bound(a), len = 0;
        uint8_t *blob = malloc(cap);
        CHECK_OK(gcomp_adapt_save_state(a, blob, cap, &len));
        CHECK_MSG(gcomp_adapt_load_state(b, blob, len, &e) == GCOMP_OK, "load: %s", e.message);
        free(blob);
    }
    gcomp_adapt_free(a);
    gcomp_adapt_free(b);
}

/* Name overrides: a tensor's whole name (no glob characters) is one, and SPEC may be
 * `dense` as in ladder=; a key that is neither an option nor a name is refused by name. */
static void test_name_overrides(void) {
    const gcomp_tensor_desc t[] = {{"embedding", 512 * 128, 512, 128},
                                   {"proj", 256 * 256, 256, 256},
                                   {"head", 128 * 256, 128, 256}};
    gcomp_adapt_options o = {0};
    o.total_steps = 1000;
    o.min_elements = 4096;
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_MSG(gcomp_adapt_create(&a, "adapt:layers;embedding=topk:density=0.01;h*=dense", t, 3, &o,
                                 &e) == GCOMP_OK,
              "%s", e.message);
    if (a) {
        CHECK(!gcomp_adapt_managed(a, 0) && gcomp_adapt_managed(a, 1) &&
              !gcomp_adapt_managed(a, 2));
        CHECK_MSG(!strncmp(gcomp_adapt_spec(a, 0), "topk:density=0.01,", 18), "%s",
                  gcomp_adapt_spec(a, 0));
        CHECK_MSG(!strncmp(gcomp_adapt_spec(a, 2), "none", 4), "%s", gcomp_adapt_spec(a, 2));
        gcomp_adapt_free(a);
    }
    a = (gcomp_adapt *)1;
    gcomp_status st = gcomp_adapt_create(&a, "adapt:layers;embeding=none", t, 3, &o, &e);
    CHECK_MSG(st == GCOMP_E_SPEC && !a && strstr(e.message, "unknown key 'embeding'") &&
                  strstr(e.message, "no tensor has that name"),
              "a misspelt name: %d (%s)", st, e.message);
}

/* knob=values: the ladder's words are the knob's values (f32, int8), not codecs. */
static void test_word_knob(void) {
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_MSG(make(&a, "adapt:layers;base=topk:density=0.01;knob=values;ladder=f32/int8", 1000,
                   &e) == GCOMP_OK,
              "%s", e.message);
    if (!a) return;
    CHECK_EQ_INT(gcomp_adapt_ladder_size(a), 2);
    int seen = 0;
    for (size_t j = 0; j < gcomp_adapt_ladder_size(a); j++) {
        const char *c = gcomp_adapt_candidate(a, j);
        seen |= strstr(c, "values=f32") ? 1 : strstr(c, "values=int8") ? 2 : 0;
        CHECK_MSG(!strncmp(c, "topk:density=0.01,", 18), "%s", c);
    }
    CHECK_EQ_INT(seen, 3);
    gcomp_adapt_free(a);
}

static void test_options_in_fingerprint(void) {
    const char *method = "adapt:bandwidth+accuracy;target=0.6;interval=4";
    gcomp_cost_calibration *slow = int8_calibration(2e-5), *fast = int8_calibration(1e-9);
    gcomp_adapt_options base = {0};
    base.total_steps = 1000;
    base.workers = 4;
    base.nodes = 2;
    base.min_elements = 4096;
    base.dense_spec = "int8:feedback=ef";
    base.calibration = fast;
    gcomp_adapt_options var[7];
    const char *what[7] = {"total_steps", "workers",  "nodes", "dense_spec",
                           "calibration", "strategy", "same"};
    for (int v = 0; v < 7; v++) var[v] = base;
    var[0].total_steps = 2000;
    var[1].workers = 8;
    var[2].nodes = 1;
    var[3].dense_spec = "none";
    var[4].calibration = slow;
    var[5].strategy = allgather_strategy;
    /* var[6]: the same options, a calibration object of its own with the same rates */
    gcomp_cost_calibration *fast2 = int8_calibration(1e-9);
    var[6].calibration = fast2;
    gcomp_adapt *a0 = NULL;
    gcomp_error e = {0};
    CHECK_OK(gcomp_adapt_create(&a0, method, MLP, NMLP, &base, &e));
    size_t len = a0 ? gcomp_adapt_stats_size(a0) : 0, got;
    double *all = malloc(2 * len * sizeof(double) + 1);
    for (int v = 0; a0 && v < 7; v++) {
        gcomp_adapt *a1 = NULL, *b0 = NULL;
        CHECK_OK(gcomp_adapt_create(&a1, method, MLP, NMLP, &var[v], &e));
        CHECK_OK(gcomp_adapt_create(&b0, method, MLP, NMLP, &base, &e));
        if (!a1 || !b0) {
            gcomp_adapt_free(a1);
            gcomp_adapt_free(b0);
            continue;
        }
        for (int s = 0; s < 4; s++) {
            gcomp_adapt_end_step(a1, NULL);
            gcomp_adapt_end_step(b0, NULL);
        }
        CHECK_OK(gcomp_adapt_stats(b0, all, len, &got));
        CHECK_OK(gcomp_adapt_stats(a1, all + len, len, &got));
        gcomp_status st0 = gcomp_adapt_decide(b0, all, len, 2, NULL, &e);
        gcomp_status st1 = gcomp_adapt_decide(a1, all, len, 2, NULL, &e);
        if (v == 6) {
            CHECK_MSG(st0 == GCOMP_OK && st1 == GCOMP_OK, "the same options: %d %d (%s)", st0, st1,
                      e.message);
        } else {
            CHECK_MSG(st0 == GCOMP_E_MISMATCH && st1 == GCOMP_E_MISMATCH,
                      "another %s on rank 1: decide gave %d and %d", what[v], st0, st1);
            CHECK_MSG(strstr(e.message, "rank") != NULL, "%s: message '%s'", what[v], e.message);
        }
        gcomp_adapt_free(a1);
        gcomp_adapt_free(b0);
    }
    /* a saved state still loads where only those options differ (a checkpoint resumes on
     * other workers or another machine's calibration) */
    gcomp_adapt *w8 = NULL;
    CHECK_OK(gcomp_adapt_create(&w8, method, MLP, NMLP, &var[1], &e));
    if (a0 && w8) {
        size_t cap = gcomp_adapt_state_bound(a0), sl;
        uint8_t *blob = malloc(cap);
        CHECK_OK(gcomp_adapt_save_state(a0, blob, cap, &sl));
        CHECK_OK(gcomp_adapt_load_state(w8, blob, sl, &e));
        free(blob);
    }
    gcomp_adapt_free(w8);
    /* without the bandwidth controller nothing reads the calibration or the workers:
     * ranks may differ there */
    gcomp_adapt_options lo = var[4];
    lo.workers = 8;
    gcomp_adapt *l0 = NULL, *l1 = NULL;
    CHECK_OK(gcomp_adapt_create(&l0, "adapt:layers;interval=4", MLP, NMLP, &base, &e));
    CHECK_OK(gcomp_adapt_create(&l1, "adapt:layers;interval=4", MLP, NMLP, &lo, &e));
    CHECK(l0 && l1 && gcomp_adapt_fingerprint(l0) == gcomp_adapt_fingerprint(l1));
    gcomp_adapt_free(l0);
    gcomp_adapt_free(l1);
    gcomp_adapt_free(a0);
    free(all);
    gcomp_cost_calibration_free(slow);
    gcomp_cost_calibration_free(fast);
    gcomp_cost_calibration_free(fast2);
}

int main(void) {
    test_method_uses();
    test_grammar();
    test_ladder();
    test_norm();
    test_norm_lr_decay();
    test_observe_nonfinite();
    test_layers_dp();
    test_layers_margin();
    test_layers_measured();
    test_measure_steady_state();
    test_unobserved_reports_nan();
    test_decide_out_of_memory();
    test_layers_error_on();
    test_measure_sample();
    test_measure_spacing();
    test_bandwidth();
    test_bandwidth_exchanges();
    test_bandwidth_concurrent();
    test_bandwidth_band();
    test_probe_spacing();
    test_accuracy();
    test_accuracy_noise_hold();
    test_accuracy_window();
    test_accuracy_course();
    test_state();
    test_ranks_agree();
    test_options_in_fingerprint();
    test_training_seconds();
    test_fingerprint_spelling();
    test_name_overrides();
    test_word_knob();
    test_state_refuses_impossible();
    test_observe_compute_inf_and_failed_decide();
    return CHECK_DONE();
}

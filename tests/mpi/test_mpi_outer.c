/*
 * test_mpi_outer.c - the outer step of local SGD / DiLoCo (gcomp_mpi_outer_*).
 *
 * A toy model trains on every rank: four tensors, a quadratic loss around a fixed target
 * plus noise of the rank's own and the step's (so the ranks drift apart between syncs),
 * and the inner optimizer SGD with momentum, kept per rank.
 *
 *  replay        H = 1, spec none, outer SGD lr 1, mu 0 against data-parallel SGD whose
 *                gradients are averaged by a bucket: equal up to float rounding (the
 *                pseudo-gradient is w - (w - lr v), not lr v), within a bound derived
 *                from it; the same model with lr 0.5 must differ by far more.
 *  identical     after every step, w_sync hashes the same on every rank; after each sync
 *                that completed, so do the synced fragment's live weights (mix 0), for
 *                DiLoCo (Nesterov) with top-k + error feedback, int8 by rsag, sign by
 *                allgather, PowerSGD, streaming with overlap; with mix 0.5 the live weights
 *                must differ across ranks while w_sync stays the same.  Each sync's w_sync
 *                is checked against the outer optimizer's formula on the average d, and d
 *                against the ranks' messages decoded in float64.
 *  conservation  sign and twobit values with feedback=ef: for every sync and rank the
 *                decoded message plus the residual's change equals the pseudo-gradient
 *                (SparseLoCo's decayed residual: the pseudo-gradient minus (1-beta) e),
 *                and summed over ranks and syncs, messages + residuals = pseudo-gradients.
 *  schedule      streaming: every fragment starts exactly at t = offset (mod H) and
 *                completes `delay` steps later, once per H steps; with the default delay
 *                some fragment is in flight at every step of the steady state (the link
 *                never idle), never two when F divides H.
 *  checkpoint    save while a fragment is in flight, go on; a fresh object loaded with the
 *                blob repeats the same steps bit for bit (weights, w_sync); a fresh one
 *                without the load differs.  Refusals (truncated, magic, version, a flipped
 *                byte, another rank, other options, a load in flight) change nothing.
 *  bad input     every refused option with its reason, the core's refusal of feedback=ef
 *                around a non-contraction with its message, options and initial weights
 *                that differ across ranks, one rank alone with bad arguments; a good
 *                create still works afterwards.
 *  out of memory the last rank's k-th allocation fails, for every k the create reaches:
 *                every rank fails alike, none times out, the communicator stays usable.
 */
#include "mpi_check.h"

#include <stdbool.h>
#include <stdint.h>

#define NT 4
static const size_t SIZES[NT] = {3000, 40, 1200, 10};
static const char *const NAMES[NT] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
#define INNER_LR 0.05f
#define INNER_MU 0.9f

typedef struct model {
    float *w[NT], *v[NT], *c[NT], *g[NT];
} model;

static void model_init(model *m) {
    for (int i = 0; i < NT; i++) {
        m->w[i] = malloc(SIZES[i] * sizeof(float));
        m->v[i] = calloc(SIZES[i], sizeof(float));
        m->c[i] = malloc(SIZES[i] * sizeof(float));
        m->g[i] = malloc(SIZES[i] * sizeof(float));
        test_fill(m->w[i], SIZES[i], 1000 + (unsigned)i); /* the same on every rank */
        test_fill(m->c[i], SIZES[i], 2000 + (unsigned)i);
    }
}

static void model_free(model *m) {
    for (int i = 0; i < NT; i++) {
        free(m->w[i]);
        free(m->v[i]);
        free(m->c[i]);
        free(m->g[i]);
    }
}

static void model_copy(model *dst, const model *src) {
    for (int i = 0; i < NT; i++) {
        memcpy(dst->w[i], src->w[i], SIZES[i] * sizeof(float));
        memcpy(dst->v[i], src->v[i], SIZES[i] * sizeof(float));
    }
}

/* g = (w - c) / 2 + noise of this rank and step. */
static void gradient(model *m, int step) {
    for (int i = 0; i < NT; i++) {
        unsigned long long s =
            77ull * (unsigned)mc_rank + 1000003ull * (unsigned)step + 31ull * (unsigned)i;
        for (size_t k = 0; k < SIZES[i]; k++)
            m->g[i][k] = 0.5f * (m->w[i][k] - m->c[i][k]) + 0.3f * test_gauss(&s);
    }
}

/* The inner optimizer on g: SGD with momentum (PyTorch's, dampening 0), local. */
static void sgd(model *m) {
    for (int i = 0; i < NT; i++)
        for (size_t k = 0; k < SIZES[i]; k++) {
            m->v[i][k] = INNER_MU * m->v[i][k] + m->g[i][k];
            m->w[i][k] -= INNER_LR * m->v[i][k];
        }
}

static uint64_t hash(const float *x, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)x;
    for (size_t k = 0; k < 4 * n; k++) h = (h ^ p[k]) * 0x100000001b3ull;
    return h;
}

/* 1 when x hashes the same on every rank. */
static int same_everywhere(const float *x, size_t n) {
    uint64_t h[2] = {hash(x, n), 0};
    h[1] = ~h[0];
    MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return h[0] == ~h[1];
}

static void tensors_of(gcomp_mpi_tensor *t, const char *const *specs, int strategy) {
    for (int i = 0; i < NT; i++) {
        t[i].name = NAMES[i];
        t[i].spec = specs[i];
        t[i].n = SIZES[i];
        t[i].rows = t[i].cols = 0;
        t[i].strategy = strategy;
    }
    if (strategy == GCOMP_MPI_AUTO) { /* matrices, so PowerSGD has a shape */
        t[0].rows = 60, t[0].cols = 50;
        t[2].rows = 40, t[2].cols = 30;
    }
}

static gcomp_mpi_outer *make(gcomp_mpi_comm *comm, const gcomp_mpi_tensor *t, model *m,
                             const gcomp_mpi_outer_options *o) {
    gcomp_mpi_outer *x = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_outer_create(&x, comm, t, NT, m->w, o, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "create: %s (%s)", gcomp_status_str(st), err.message);
    return x;
}

/* ---- replay: H = 1 with `none` is data-parallel SGD -------------------------------------- */

static double replay(gcomp_mpi_comm *comm, float outer_lr, int steps, double *scale) {
    model a, b; /* a: outer step, b: data parallel */
    model_init(&a);
    model_init(&b);
    const char *specs[NT] = {"none", "none", "none", "none"};
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, GCOMP_MPI_AUTO);
    gcomp_mpi_outer_options o;
    gcomp_mpi_outer_options_default(&o);
    o.local_steps = 1;
    o.optimizer = GCOMP_MPI_OUTER_SGD;
    o.lr = outer_lr;
    o.momentum = 0;
    gcomp_mpi_outer *x = make(comm, t, &a, &o);
    gcomp_mpi_bucket *dp = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_bucket_create(&dp, comm, t, NT, NULL, 60.0, &err));
    double worst = 0, big = 0;
    for (int s = 0; x && dp && s < steps; s++) {
        gradient(&a, s);
        sgd(&a);
        gcomp_status st = gcomp_mpi_outer_step(x, a.w, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "outer step %d: %s", s, err.message);
        gradient(&b, s);
        st = gcomp_mpi_allreduce(dp, b.g, GCOMP_MPI_AVERAGE, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "data-parallel step %d: %s", s, err.message);
        sgd(&b);
        for (int i = 0; i < NT; i++)
            for (size_t k = 0; k < SIZES[i]; k++) {
                double d = fabs((double)a.w[i][k] - (double)b.w[i][k]);
                worst = d > worst ? d : worst;
                double mag = fabs((double)b.w[i][k]);
                big = mag > big ? mag : big;
            }
    }
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *scale = big;
    gcomp_mpi_outer_free(x);
    gcomp_mpi_bucket_free(dp);
    model_free(&a);
    model_free(&b);
    return worst;
}

static void test_replay(gcomp_mpi_comm *comm) {
    const int steps = 30;
    double scale = 0;
    double worst = replay(comm, 1.0f, steps, &scale);
    /* Each step the two paths round differently.  Outer: w - lr v rounds once (half an
     * ulp of w), w - (w - lr v) is then exact (Sterbenz), the average of P of them and
     * w_sync - d round once each; data parallel rounds its average and its update.  So
     * about 4 half-ulps of |w| per step on each side, 8 in all, passed on through
     * dynamics that contract; summed over the steps (2^-24 |w| each) that bounds the
     * drift, and a wrong outer step moves the weights by lr v, far beyond it. */
    double bound = 8.0 * steps * scale * 0x1p-24;
    if (mc_rank == 0)
        printf("replay: max |outer - data parallel| = %.3g (bound %.3g)\n", worst, bound);
    CHECK_MSG(worst <= bound, "H=1 outer SGD lr=1 drifts from data-parallel SGD by %g > %g", worst,
              bound);
    /* A wrong outer step is far outside that bound: lr 0.5 moves half as far. */
    double off = replay(comm, 0.5f, 3, &scale);
    if (mc_rank == 0) printf("replay: outer lr 0.5 is %.3g away\n", off);
    CHECK_MSG(off > 100 * bound, "outer lr 0.5 stays within %g of data parallel (%g)", bound, off);
}

/* ---- identical weights, the outer formula, the average --------------------------------------- */

typedef struct run_cfg {
    const char *label;
    const char *specs[NT];
    int strategy;
    unsigned H, F;
    int delay;
    int optimizer;
    double lr, mu, mix, decay;
} run_cfg;

/* Runs `steps` inner steps; checks after each one what the header promises. */
static void run_identical(gcomp_mpi_comm *comm, const run_cfg *rc, int steps) {
    model m;
    model_init(&m);
    gcomp_mpi_tensor t[NT];
    tensors_of(t, rc->specs, rc->strategy);
    gcomp_mpi_outer_options o;
    gcomp_mpi_outer_options_default(&o);
    o.local_steps = rc->H;
    o.fragments = rc->F;
    o.delay = rc->delay;
    o.optimizer = rc->optimizer;
    o.lr = rc->lr;
    o.momentum = rc->mu;
    o.mix = rc->mix;
    o.ef_decay = rc->decay;
    gcomp_mpi_outer *x = make(comm, t, &m, &o);
    if (!x) {
        model_free(&m);
        return;
    }
    size_t nf = gcomp_mpi_outer_fragments(x);
    CHECK_EQ_INT(nf, rc->F);
    /* Replicas of w_sync and the outer momentum, to check the formula. */
    double *sync[NT], *mom[NT];
    for (int i = 0; i < NT; i++) {
        sync[i] = malloc(SIZES[i] * sizeof(double));
        mom[i] = calloc(SIZES[i], sizeof(double));
        for (size_t k = 0; k < SIZES[i]; k++) sync[i][k] = m.w[i][k];
    }
    uint64_t before[16] = {0};
    int completions = 0, live_differ = 0, formula_bad = 0, avg_bad = 0;
    gcomp_error err = {0};
    for (int s = 0; s < steps; s++) {
        gradient(&m, s);
        sgd(&m);
        for (size_t f = 0; f < nf; f++) before[f] = gcomp_mpi_outer_syncs(x, f);
        gcomp_status st = gcomp_mpi_outer_step(x, m.w, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "%s step %d: %s", rc->label, s, err.message);
        if (st != GCOMP_OK) break;
        for (int i = 0; i < NT; i++) {
            const float *g = gcomp_mpi_outer_global(x, i);
            CHECK_MSG(same_everywhere(g, SIZES[i]), "%s step %d: w_sync of %s differs across ranks",
                      rc->label, s, NAMES[i]);
            size_t f, slot;
            gcomp_mpi_outer_locate(x, (size_t)i, &f, &slot);
            if (gcomp_mpi_outer_syncs(x, f) == before[f]) continue;
            /* Fragment f completed a sync at this step. */
            completions++;
            int same = same_everywhere(m.w[i], SIZES[i]);
            if (rc->mix == 0)
                CHECK_MSG(same, "%s step %d: %s differs across ranks after its sync", rc->label, s,
                          NAMES[i]);
            else
                live_differ += !same;
            if (rc->mix == 0)
                CHECK_MSG(memcmp(g, m.w[i], SIZES[i] * sizeof(float)) == 0,
                          "%s step %d: weights of %s are not w_sync", rc->label, s, NAMES[i]);
            /* d against the ranks' messages (not PowerSGD: it has none). */
            const float *d = gcomp_mpi_outer_average(x, (size_t)i);
            CHECK(d != NULL);
            if (!d) continue;
            gcomp_mpi_bucket *b = gcomp_mpi_outer_bucket(x, f);
            if (gcomp_mpi_message_count(b, slot) > 0 &&
                !((gcomp_mpi_bucket_strategy(b, slot) & 0xff) == GCOMP_MPI_RSAG ||
                  (gcomp_mpi_bucket_strategy(b, slot) & 0xff) == GCOMP_MPI_SPARSE)) {
                double *ref = malloc(SIZES[i] * sizeof(double)),
                       *abs = malloc(SIZES[i] * sizeof(double));
                long msgs = mc_reference(MPI_COMM_WORLD, b, slot, SIZES[i], ref, abs);
                CHECK(msgs > 0);
                /* f16 values by allreduce are summed as halves (gradcomp_mpi.h). */
                double rel = strstr(rc->specs[i], "f16") ? 2e-3 : 1e-6;
                for (size_t k = 0; k < SIZES[i]; k++) {
                    double want = ref[k] / mc_size, tol = rel * abs[k] / mc_size + 1e-30;
                    if (fabs((double)d[k] - want) > tol + 1e-6 * fabs(want)) avg_bad++;
                }
                free(ref);
                free(abs);
            }
            /* w_sync = w_sync - lr (nesterov ? d + mu b : b), b = mu b + d. */
            for (size_t k = 0; k < SIZES[i]; k++) {
                double bk = rc->mu * mom[i][k] + d[k];
                mom[i][k] = bk;
                double u = rc->optimizer == GCOMP_MPI_OUTER_NESTEROV ? d[k] + rc->mu * bk
                                                                     : (rc->mu > 0 ? bk : d[k]);
                sync[i][k] -= rc->lr * u;
                if (fabs(sync[i][k] - g[k]) > 1e-5 * (1 + fabs(sync[i][k]))) formula_bad++;
                sync[i][k] = g[k]; /* track the float path, so errors do not compound */
            }
        }
    }
    CHECK_MSG(completions >= NT * (steps / (int)rc->H - 1), "%s: only %d tensor syncs", rc->label,
              completions);
    CHECK_MSG(formula_bad == 0, "%s: %d elements of w_sync off the outer optimizer's formula",
              rc->label, formula_bad);
    CHECK_MSG(avg_bad == 0, "%s: %d elements of d off the ranks' average", rc->label, avg_bad);
    if (rc->mix > 0 && mc_size > 1)
        CHECK_MSG(live_differ > 0, "%s: mix %.2f, yet the live weights agree across ranks",
                  rc->label, rc->mix);
    /* flush: every rank ends on the same weights, whatever the mix. */
    gcomp_status st = gcomp_mpi_outer_flush(x, m.w, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s flush: %s", rc->label, err.message);
    for (int i = 0; i < NT; i++) {
        CHECK_MSG(same_everywhere(m.w[i], SIZES[i]), "%s: %s differs after flush", rc->label,
                  NAMES[i]);
        CHECK(memcmp(gcomp_mpi_outer_global(x, i), m.w[i], SIZES[i] * sizeof(float)) == 0);
    }
    for (size_t f = 0; f < nf; f++) CHECK(!gcomp_mpi_outer_in_flight(x, f));
    gcomp_mpi_stats ms;
    CHECK_OK(gcomp_mpi_outer_stats(x, &ms));
    CHECK(mc_size == 1 || ms.bytes_sent > 0);
    for (int i = 0; i < NT; i++) {
        free(sync[i]);
        free(mom[i]);
    }
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

static void test_identical(gcomp_mpi_comm *comm) {
    const run_cfg cfgs[] = {
        {"diloco dense",
         {"none", "none", "none", "none"},
         0,
         4,
         1,
         -1,
         GCOMP_MPI_OUTER_NESTEROV,
         0.7,
         0.9,
         0,
         1},
        {"diloco topk+ef",
         {"topk:density=0.05,feedback=ef", "none", "topk:density=0.05,values=f16,feedback=ef",
          "none:values=f16"},
         0,
         5,
         1,
         -1,
         GCOMP_MPI_OUTER_NESTEROV,
         0.7,
         0.9,
         0,
         1},
        {"int8 rsag",
         {"int8", "int8", "int8:feedback=ef", "int8:bucket=4"},
         GCOMP_MPI_RSAG,
         3,
         1,
         -1,
         GCOMP_MPI_OUTER_SGD,
         1.0,
         0.5,
         0,
         1},
        {"sparseloco sign",
         {"topk:density=0.1,values=sign,feedback=ef", "sign:feedback=ef",
          "topk:density=0.1,values=sign,feedback=ef", "sign:feedback=ef"},
         GCOMP_MPI_ALLGATHER,
         4,
         1,
         -1,
         GCOMP_MPI_OUTER_SGD,
         1.0,
         0,
         0,
         0.9},
        {"powersgd",
         {"powersgd:rank=2", "none", "powersgd:rank=2", "none"},
         0,
         2,
         1,
         -1,
         GCOMP_MPI_OUTER_NESTEROV,
         0.5,
         0.8,
         0,
         1},
        {"streaming",
         {"topk:density=0.1,feedback=ef", "none", "int8", "none"},
         0,
         8,
         4,
         -1,
         GCOMP_MPI_OUTER_NESTEROV,
         0.7,
         0.9,
         0,
         1},
        {"streaming blocking",
         {"none", "none", "none", "none"},
         0,
         6,
         3,
         0,
         GCOMP_MPI_OUTER_SGD,
         1.0,
         0,
         0,
         1},
        {"streaming mix",
         {"none", "none", "none", "none"},
         0,
         8,
         2,
         3,
         GCOMP_MPI_OUTER_NESTEROV,
         0.7,
         0.9,
         0.5,
         1},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) run_identical(comm, &cfgs[k], 26);
}

/* ---- conservation of the pseudo-gradient by error feedback --------------------------------- */

static void test_conservation(gcomp_mpi_comm *comm, const char *spec, double decay) {
    model m;
    model_init(&m);
    const char *specs[NT] = {spec, spec, spec, spec};
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, GCOMP_MPI_ALLGATHER);
    gcomp_mpi_outer_options o;
    gcomp_mpi_outer_options_default(&o);
    o.local_steps = 3;
    o.optimizer = GCOMP_MPI_OUTER_SGD;
    o.lr = 1.0;
    o.momentum = 0;
    o.ef_decay = decay;
    gcomp_mpi_outer *x = make(comm, t, &m, &o);
    if (!x) {
        model_free(&m);
        return;
    }
    /* Per tensor, in float64: sum of pseudo-gradients, of decoded messages, over syncs. */
    double *sum_pg[NT], *sum_msg[NT];
    float *e0[NT], *pg[NT];
    for (int i = 0; i < NT; i++) {
        sum_pg[i] = calloc(SIZES[i], sizeof(double));
        sum_msg[i] = calloc(SIZES[i], sizeof(double));
        e0[i] = malloc(SIZES[i] * sizeof(float));
        pg[i] = malloc(SIZES[i] * sizeof(float));
    }
    int bad = 0, syncs = 0;
    double worst = 0;
    gcomp_error err = {0};
    for (int s = 0; s < 24; s++) {
        gradient(&m, s);
        sgd(&m);
        /* What the object will send if it syncs now: its own pseudo-gradient, and the
         * residual before. */
        for (int i = 0; i < NT; i++) {
            size_t f, slot;
            gcomp_mpi_outer_locate(x, (size_t)i, &f, &slot);
            const float *g = gcomp_mpi_outer_global(x, i);
            const float *e =
                gcomp_compressor_residual(gcomp_mpi_compressor(gcomp_mpi_outer_bucket(x, f), slot));
            CHECK(e != NULL);
            for (size_t k = 0; k < SIZES[i]; k++) {
                pg[i][k] = g[k] - m.w[i][k];
                e0[i][k] = e ? e[k] : 0;
            }
        }
        uint64_t before = gcomp_mpi_outer_syncs(x, 0);
        gcomp_status st = gcomp_mpi_outer_step(x, m.w, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "%s step %d: %s", spec, s, err.message);
        if (st != GCOMP_OK || gcomp_mpi_outer_syncs(x, 0) == before) continue;
        syncs++;
        for (int i = 0; i < NT; i++) {
            size_t f, slot;
            gcomp_mpi_outer_locate(x, (size_t)i, &f, &slot);
            gcomp_mpi_bucket *b = gcomp_mpi_outer_bucket(x, f);
            const float *e1 = gcomp_compressor_residual(gcomp_mpi_compressor(b, slot));
            float *dec = calloc(SIZES[i], sizeof(float));
            CHECK_EQ_INT(gcomp_mpi_message_count(b, slot), 1);
            const void *msg;
            size_t len, off, cnt;
            CHECK_OK(gcomp_mpi_message(b, slot, 0, &msg, &len, &off, &cnt));
            CHECK_OK(gcomp_decode_add(msg, len, dec, SIZES[i], 1.0f));
            for (size_t k = 0; k < SIZES[i]; k++) {
                /* e0 + (d - (1 - beta) e0) = msg + e1 */
                double want = (double)pg[i][k] - (1.0 - decay) * (double)e0[i][k];
                double got = (double)dec[k] + (double)e1[k] - (double)e0[i][k];
                double scale = fabs(want) + fabs((double)dec[k]) + fabs((double)e1[k]) +
                               fabs((double)e0[i][k]);
                double diff = fabs(got - want);
                worst = diff > worst ? diff : worst;
                if (diff > 4 * 0x1p-24 * scale + 1e-30) bad++;
                sum_pg[i][k] += want;
                sum_msg[i][k] += dec[k];
            }
            free(dec);
        }
    }
    CHECK_MSG(syncs == 24 / 3, "%s: %d syncs", spec, syncs);
    CHECK_MSG(bad == 0,
              "%s: %d elements where message + residual change != pseudo-gradient (worst %g)", spec,
              bad, worst);
    /* Over the run and all ranks: sum of messages + the residuals = sum of pseudo-gradients. */
    double tot[2] = {0, 0}, scale = 0;
    for (int i = 0; i < NT; i++) {
        size_t f, slot;
        gcomp_mpi_outer_locate(x, (size_t)i, &f, &slot);
        const float *e =
            gcomp_compressor_residual(gcomp_mpi_compressor(gcomp_mpi_outer_bucket(x, f), slot));
        double *a = malloc(SIZES[i] * sizeof(double)), *b = malloc(SIZES[i] * sizeof(double));
        for (size_t k = 0; k < SIZES[i]; k++) {
            a[k] = sum_msg[i][k] + e[k];
            b[k] = sum_pg[i][k];
        }
        MPI_Allreduce(MPI_IN_PLACE, a, (int)SIZES[i], MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, b, (int)SIZES[i], MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (size_t k = 0; k < SIZES[i]; k++) {
            double d = fabs(a[k] - b[k]);
            tot[0] = d > tot[0] ? d : tot[0];
            scale = fabs(b[k]) > scale ? fabs(b[k]) : scale;
        }
        free(a);
        free(b);
    }
    (void)tot[1];
    if (mc_rank == 0)
        printf("conservation %s (beta %.2f): %d syncs, per-sync worst %.3g, run %.3g of %.3g\n",
               spec, decay, syncs, worst, tot[0], scale);
    CHECK_MSG(tot[0] <= 1e-5 * (scale + 1),
              "%s: messages + residuals miss the pseudo-gradients by %g", spec, tot[0]);
    for (int i = 0; i < NT; i++) {
        free(sum_pg[i]);
        free(sum_msg[i]);
        free(e0[i]);
        free(pg[i]);
    }
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

/* ---- the streaming schedule ------------------------------------------------------------------ */

static void test_schedule(gcomp_mpi_comm *comm, unsigned H, unsigned F, int delay) {
    model m;
    model_init(&m);
    const char *specs[NT] = {"none", "none", "none", "none"};
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, GCOMP_MPI_AUTO);
    gcomp_mpi_outer_options o;
    gcomp_mpi_outer_options_default(&o);
    o.local_steps = H;
    o.fragments = F;
    o.delay = delay;
    gcomp_mpi_outer *x = make(comm, t, &m, &o);
    if (!x) {
        model_free(&m);
        return;
    }
    unsigned tau = gcomp_mpi_outer_delay(x);
    if (delay < 0) CHECK_EQ_INT(tau, (H + F - 1) / F);
    /* Offsets are distinct, and fragment F-1 syncs on the plain schedule. */
    for (size_t f = 0; f < F; f++)
        for (size_t g = f + 1; g < F; g++)
            CHECK(gcomp_mpi_outer_offset(x, f) % H != gcomp_mpi_outer_offset(x, g) % H);
    CHECK(gcomp_mpi_outer_offset(x, F - 1) % H == 0);
    const int steps = (int)(5 * H);
    int wrong_start = 0, wrong_end = 0, idle = 0, two = 0;
    uint64_t first = UINT64_MAX;
    for (size_t f = 0; f < F; f++)
        if (gcomp_mpi_outer_offset(x, f) < first) first = gcomp_mpi_outer_offset(x, f);
    uint64_t started_at[8] = {0};
    int was[8] = {0};
    gcomp_error err = {0};
    for (int s = 1; s <= steps; s++) {
        gradient(&m, s);
        sgd(&m);
        uint64_t syncs_before[8];
        for (size_t f = 0; f < F; f++) syncs_before[f] = gcomp_mpi_outer_syncs(x, f);
        CHECK_OK(gcomp_mpi_outer_step(x, m.w, 60.0, &err));
        CHECK_EQ_INT(gcomp_mpi_outer_steps(x), s);
        int busy = 0;
        for (size_t f = 0; f < F; f++) {
            uint64_t off = gcomp_mpi_outer_offset(x, f) % H;
            bool due = (uint64_t)s % H == off;
            int now = gcomp_mpi_outer_in_flight(x, f);
            bool completed = gcomp_mpi_outer_syncs(x, f) != syncs_before[f];
            /* A start is a step after which the fragment is in flight and was not, or
             * (delay 0) one that completed a sync at once. */
            bool started = (now && (!was[f] || completed)) || (tau == 0 && completed);
            if (started != due) wrong_start++;
            if (started) started_at[f] = (uint64_t)s;
            if (completed &&
                !(tau == 0 ? started_at[f] == (uint64_t)s : started_at[f] + tau == (uint64_t)s))
                wrong_end++;
            busy += now;
            was[f] = now;
        }
        /* The link during the next inner step: steady state once the first fragment went. */
        if ((uint64_t)s >= first && s < steps) {
            idle += busy == 0;
            two += busy > 1;
        }
    }
    for (size_t f = 0; f < F; f++) {
        uint64_t off = gcomp_mpi_outer_offset(x, f), want = 0;
        for (uint64_t s = 1; s + tau <= (uint64_t)steps; s++) want += s % H == off % H;
        CHECK_MSG(gcomp_mpi_outer_syncs(x, f) == want,
                  "H=%u F=%u: fragment %zu synced %llu times, want %llu", H, F, f,
                  (unsigned long long)gcomp_mpi_outer_syncs(x, f), (unsigned long long)want);
    }
    CHECK_MSG(wrong_start == 0, "H=%u F=%u: %d starts off the schedule", H, F, wrong_start);
    CHECK_MSG(wrong_end == 0, "H=%u F=%u: %d completions not delay=%u steps after their start", H,
              F, wrong_end, tau);
    if (delay < 0) {
        CHECK_MSG(idle == 0, "H=%u F=%u delay %u: the link is idle at %d steps", H, F, tau, idle);
        if (H % F == 0)
            CHECK_MSG(two == 0, "H=%u F=%u: two fragments in flight at %d steps", H, F, two);
    }
    if (mc_rank == 0)
        printf("schedule H=%u F=%u delay %u: idle steps %d, steps with two in flight %d\n", H, F,
               tau, idle, two);
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

/* ---- checkpoints ------------------------------------------------------------------------------
 */

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static blob save(gcomp_mpi_outer *x) {
    blob b = {NULL, 0};
    size_t cap = gcomp_mpi_outer_state_size(x);
    b.p = malloc(cap + 64);
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_outer_save_state(x, b.p, cap, &b.len, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK && b.len > 0 && b.len <= cap, "save: %s", err.message);
    return b;
}

static void expect_load(gcomp_mpi_outer *x, const void *p, size_t len, gcomp_status want,
                        const char *what) {
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_outer_load_state(x, p, len, &err);
    CHECK_MSG(st == want, "%s: load gave %s (%s), want %s", what, gcomp_status_str(st), err.message,
              gcomp_status_str(want));
}

static void checkpoint_opts(gcomp_mpi_outer_options *o) {
    gcomp_mpi_outer_options_default(o);
    o->local_steps = 4;
    o->fragments = 2;
    o->delay = 2;
}

static void test_checkpoint(gcomp_mpi_comm *comm) {
    const char *specs[NT] = {"topk:density=0.05,feedback=ef", "none", "int8:feedback=ef",
                             "sign:feedback=ef"};
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, GCOMP_MPI_AUTO);
    t[2].strategy = GCOMP_MPI_RSAG; /* owner residuals too */
    gcomp_mpi_outer_options o;
    checkpoint_opts(&o);
    model init, m, saved;
    model_init(&init);
    model_init(&m);
    model_init(&saved);
    gcomp_mpi_outer *x = make(comm, t, &m, &o);
    if (!x) return;
    const int K = 11, M = 9; /* K: a step after which a fragment is in flight */
    gcomp_error err = {0};
    for (int s = 0; s < K; s++) {
        gradient(&m, s);
        sgd(&m);
        CHECK_OK(gcomp_mpi_outer_step(x, m.w, 60.0, &err));
    }
    int inflight = 0;
    for (size_t f = 0; f < 2; f++) inflight += gcomp_mpi_outer_in_flight(x, f);
    CHECK_MSG(inflight == 1, "want a fragment in flight at the save, have %d", inflight);
    blob b = save(x);
    model_copy(&saved, &m);
    float *trace[32][NT];
    for (int s = 0; s < M; s++) {
        gradient(&m, K + s);
        sgd(&m);
        CHECK_OK(gcomp_mpi_outer_step(x, m.w, 60.0, &err));
        for (int i = 0; i < NT; i++) {
            trace[s][i] = malloc(2 * SIZES[i] * sizeof(float));
            memcpy(trace[s][i], m.w[i], SIZES[i] * sizeof(float));
            memcpy(trace[s][i] + SIZES[i], gcomp_mpi_outer_global(x, i), SIZES[i] * sizeof(float));
        }
    }
    /* Resume: a fresh object from the initial weights, the blob, the saved live weights. */
    for (int pass = 0; pass < 2; pass++) {
        gcomp_mpi_outer *y = make(comm, t, &init, &o);
        if (!y) break;
        if (pass == 0) expect_load(y, b.p, b.len, GCOMP_OK, "resume");
        model_copy(&m, &saved);
        int differ = 0;
        for (int s = 0; s < M; s++) {
            gradient(&m, K + s);
            sgd(&m);
            CHECK_OK(gcomp_mpi_outer_step(y, m.w, 60.0, &err));
            for (int i = 0; i < NT; i++)
                differ += memcmp(trace[s][i], m.w[i], SIZES[i] * sizeof(float)) != 0 ||
                          memcmp(trace[s][i] + SIZES[i], gcomp_mpi_outer_global(y, i),
                                 SIZES[i] * sizeof(float)) != 0;
        }
        if (pass == 0)
            CHECK_MSG(differ == 0, "resumed run differs from the original at %d tensor-steps",
                      differ);
        else
            CHECK_MSG(differ > 0,
                      "a run without the load matches the original: the check is blind");
        gcomp_mpi_outer_free(y);
    }
    /* Refusals, each leaving the object as it was: its own blob, saved again, is the same. */
    gcomp_mpi_outer *y = make(comm, t, &init, &o);
    if (y) {
        expect_load(y, b.p, b.len, GCOMP_OK, "load");
        blob ref = save(y);
        uint8_t *c = malloc(b.len);
        expect_load(y, b.p, b.len - 1, GCOMP_E_TRUNCATED, "truncated");
        expect_load(y, b.p, 20, GCOMP_E_TRUNCATED, "header only");
        memcpy(c, b.p, b.len);
        c[0] ^= 1;
        expect_load(y, c, b.len, GCOMP_E_BAD_MAGIC, "magic");
        memcpy(c, b.p, b.len);
        c[4] = 9;
        expect_load(y, c, b.len, GCOMP_E_VERSION, "version");
        for (size_t at = 48; at < b.len; at += b.len / 7) { /* frame, weights, bucket blobs */
            memcpy(c, b.p, b.len);
            c[at] ^= 0x10;
            gcomp_error e = {0};
            gcomp_status st = gcomp_mpi_outer_load_state(y, c, b.len, &e);
            CHECK_MSG(st == GCOMP_E_CHECKSUM || st == GCOMP_E_STATE,
                      "flipped byte %zu of %zu: %s (%s)", at, b.len, gcomp_status_str(st),
                      e.message);
        }
        free(c);
        /* Another rank's blob (each rank sends its own to the next). */
        if (mc_size > 1) {
            unsigned long long mine = b.len, theirs = 0;
            int to = (mc_rank + 1) % mc_size, from = (mc_rank + mc_size - 1) % mc_size;
            MPI_Sendrecv(&mine, 1, MPI_UNSIGNED_LONG_LONG, to, 1, &theirs, 1,
                         MPI_UNSIGNED_LONG_LONG, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            uint8_t *other = malloc(theirs);
            MPI_Sendrecv(b.p, (int)b.len, MPI_BYTE, to, 2, other, (int)theirs, MPI_BYTE, from, 2,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            expect_load(y, other, theirs, GCOMP_E_MISMATCH, "another rank's blob");
            free(other);
        }
        blob now = save(y);
        CHECK_MSG(now.len == ref.len && memcmp(now.p, ref.p, ref.len) == 0,
                  "a refused load changed the state");
        free(now.p);
        free(ref.p);
        /* Other options. */
        gcomp_mpi_outer_options o2;
        checkpoint_opts(&o2);
        o2.lr = 0.5;
        gcomp_mpi_outer *z = make(comm, t, &init, &o2);
        if (z) expect_load(z, b.p, b.len, GCOMP_E_MISMATCH, "other options");
        gcomp_mpi_outer_free(z);
        /* A load while a sync is in flight. */
        model_copy(&m, &init);
        for (int s = 0; s < 2; s++) {
            gradient(&m, s);
            sgd(&m);
            CHECK_OK(gcomp_mpi_outer_step(y, m.w, 60.0, &err));
        }
        CHECK(gcomp_mpi_outer_in_flight(y, 0) || gcomp_mpi_outer_in_flight(y, 1));
        expect_load(y, b.p, b.len, GCOMP_E_PROTOCOL, "in flight");
        CHECK_OK(gcomp_mpi_outer_flush(y, m.w, 60.0, &err));
        gcomp_mpi_outer_free(y);
    }
    for (int s = 0; s < M; s++)
        for (int i = 0; i < NT; i++) free(trace[s][i]);
    free(b.p);
    gcomp_mpi_outer_free(x);
    model_free(&init);
    model_free(&m);
    model_free(&saved);
}

/* ---- bad input --------------------------------------------------------------------------------
 */

/* Creates with `o` (rank `who` only, or every rank with who = -1); the ranks that were given
 * the bad option must get `want` with `needle` in the message, the others MISMATCH. */
static void refuse(gcomp_mpi_comm *comm, const char *what, const gcomp_mpi_outer_options *bad,
                   const char *const *specs, int strategy, int who, gcomp_status want,
                   const char *needle) {
    model m;
    model_init(&m);
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, strategy);
    gcomp_mpi_outer_options good;
    gcomp_mpi_outer_options_default(&good);
    bool mine = who < 0 || who == mc_rank;
    gcomp_mpi_outer *x = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_outer_create(&x, comm, t, NT, m.w, mine ? bad : &good, 60.0, &err);
    gcomp_status expect = mine ? want : GCOMP_E_MISMATCH;
    CHECK_MSG(st == expect && x == NULL, "%s: %s (%s), want %s", what, gcomp_status_str(st),
              err.message, gcomp_status_str(expect));
    if (mine && needle)
        CHECK_MSG(strstr(err.message, needle) != NULL, "%s: the message '%s' does not say '%s'",
                  what, err.message, needle);
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

static void test_bad_input(gcomp_mpi_comm *comm) {
    const char *dense[NT] = {"none", "none", "none", "none"};
    gcomp_mpi_outer_options o;
#define BAD(field, value, want, needle)                                                            \
    do {                                                                                           \
        gcomp_mpi_outer_options_default(&o);                                                       \
        o.field = value;                                                                           \
        refuse(comm, #field " = " #value, &o, dense, GCOMP_MPI_AUTO, -1, want, needle);            \
    } while (0)
    BAD(local_steps, 0, GCOMP_E_ARG, "local_steps (H) is 0"); /* not the fragments check's */
    BAD(lr, 0.0, GCOMP_E_ARG, "outer lr");
    BAD(lr, -0.7, GCOMP_E_ARG, "outer lr");
    BAD(lr, NAN, GCOMP_E_ARG, "outer lr");
    BAD(lr, INFINITY, GCOMP_E_ARG, "outer lr");
    BAD(momentum, 1.0, GCOMP_E_ARG, "momentum");
    BAD(momentum, -0.1, GCOMP_E_ARG, "momentum");
    BAD(momentum, NAN, GCOMP_E_ARG, "momentum");
    BAD(optimizer, 7, GCOMP_E_ARG, "optimizer");
    BAD(fragments, 0, GCOMP_E_ARG, "fragments");
    BAD(fragments, NT + 1, GCOMP_E_ARG, "fragments");
    BAD(delay, 16, GCOMP_E_ARG, "delay");
    BAD(delay, -2, GCOMP_E_ARG, "delay");
    BAD(mix, 1.0, GCOMP_E_ARG, "mix");
    BAD(ef_decay, 1.5, GCOMP_E_ARG, "ef_decay");
    gcomp_mpi_outer_options_default(&o);
    o.local_steps = 2;
    o.fragments = 3;
    refuse(comm, "fragments > H", &o, dense, GCOMP_MPI_AUTO, -1, GCOMP_E_ARG, "H >= F");
    static const unsigned gap[NT] = {0, 0, 2, 2};
    gcomp_mpi_outer_options_default(&o);
    o.fragments = 3;
    o.fragment_of = gap;
    refuse(comm, "an empty fragment", &o, dense, GCOMP_MPI_AUTO, -1, GCOMP_E_ARG, "no tensor");
    static const unsigned beyond[NT] = {0, 1, 2, 3};
    o.fragment_of = beyond;
    refuse(comm, "fragment_of beyond F", &o, dense, GCOMP_MPI_AUTO, -1, GCOMP_E_ARG, "fragment_of");
    /* ef_decay < 1 without a residual, or without one compressor per tensor. */
    gcomp_mpi_outer_options_default(&o);
    o.ef_decay = 0.9;
    refuse(comm, "ef_decay without feedback", &o, dense, GCOMP_MPI_AUTO, -1, GCOMP_E_ARG,
           "feedback=ef");
    const char *int8ef[NT] = {"int8:feedback=ef", "int8:feedback=ef", "int8:feedback=ef",
                              "int8:feedback=ef"};
    refuse(comm, "ef_decay with rsag", &o, int8ef, GCOMP_MPI_RSAG, -1, GCOMP_E_UNSUPPORTED, "rsag");
    /* Error feedback around a codec that is no contraction: the core's reason, in full. */
    gcomp_mpi_outer_options_default(&o);
    const char *qsgd[NT] = {"qsgd:levels=4,feedback=ef", "none", "none", "none"};
    refuse(comm, "qsgd:levels=4 with feedback=ef", &o, qsgd, GCOMP_MPI_AUTO, -1, GCOMP_E_SPEC,
           "contraction");
    /* Options that differ across ranks: every rank learns it. */
    if (mc_size > 1) {
        gcomp_mpi_outer_options_default(&o);
        o.local_steps = mc_rank == 1 ? 8 : 16;
        model m;
        model_init(&m);
        gcomp_mpi_tensor t[NT];
        tensors_of(t, dense, GCOMP_MPI_AUTO);
        gcomp_mpi_outer *x = NULL;
        gcomp_error err = {0};
        gcomp_status st = gcomp_mpi_outer_create(&x, comm, t, NT, m.w, &o, 60.0, &err);
        CHECK_MSG(st == GCOMP_E_MISMATCH && strstr(err.message, "options differ"),
                  "H differs across ranks: %s (%s)", gcomp_status_str(st), err.message);
        gcomp_mpi_outer_free(x);
        /* Initial weights that differ (one element on the last rank). */
        gcomp_mpi_outer_options_default(&o);
        if (mc_rank == mc_size - 1) m.w[2][17] += 1e-3f;
        st = gcomp_mpi_outer_create(&x, comm, t, NT, m.w, &o, 60.0, &err);
        CHECK_MSG(st == GCOMP_E_MISMATCH && strstr(err.message, "fc2.weight") &&
                      strstr(err.message, "initial weights"),
                  "weights differ across ranks: %s (%s)", gcomp_status_str(st), err.message);
        gcomp_mpi_outer_free(x);
        /* A NaN weight on rank 0 only. */
        model_free(&m);
        model_init(&m);
        if (mc_rank == 0) m.w[1][3] = NAN;
        st = gcomp_mpi_outer_create(&x, comm, t, NT, m.w, &o, 60.0, &err);
        CHECK_MSG(st == (mc_rank == 0 ? GCOMP_E_NONFINITE : GCOMP_E_MISMATCH),
                  "NaN weight: %s (%s)", gcomp_status_str(st), err.message);
        gcomp_mpi_outer_free(x);
        model_free(&m);
        /* Bad arguments on one rank alone (H = 0 on rank 0). */
        gcomp_mpi_outer_options_default(&o);
        o.local_steps = 0;
        refuse(comm, "H = 0 on rank 0 only", &o, dense, GCOMP_MPI_AUTO, 0, GCOMP_E_ARG,
               "local_steps (H) is 0");
    }
#undef BAD
    /* NULL arguments. */
    gcomp_mpi_outer *x = (gcomp_mpi_outer *)&o;
    CHECK(gcomp_mpi_outer_create(&x, NULL, NULL, 0, NULL, NULL, 1.0, NULL) == GCOMP_E_ARG);
    CHECK(x == NULL);
    CHECK(gcomp_mpi_outer_step(NULL, NULL, 1.0, NULL) == GCOMP_E_ARG);
    gcomp_mpi_outer_free(NULL);
    /* After every refusal the communicator still works. */
    CHECK(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK);
    model m;
    model_init(&m);
    gcomp_mpi_tensor t[NT];
    tensors_of(t, dense, GCOMP_MPI_AUTO);
    gcomp_mpi_outer_options_default(&o);
    x = make(comm, t, &m, &o);
    CHECK(x != NULL);
    gcomp_error err = {0};
    if (x) CHECK_OK(gcomp_mpi_outer_flush(x, m.w, 60.0, &err));
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

/* ---- out of memory: the create fails on every rank alike ------------------------------- */

size_t gcomp__mpi_test_fail_alloc_after(size_t n); /* the MPI layer's test hook */

/* gcomp_mpi_outer_create with the last rank out of memory from its k-th allocation on, for
 * every k until the create needs fewer (DiLoCo on top-k + error feedback, two fragments):
 * every rank returns an error or none together, the communicator stays usable, and a
 * create after the sweep works.  The object and its check values (k = 0, 1) and the
 * check's buffer used to be allocated on the failing rank before it took part in anything,
 * and the others timed out in the check. */
static void test_create_nomem(gcomp_mpi_comm *comm) {
    const char *specs[NT] = {"topk:density=0.1,feedback=ef", "none", "topk:density=0.1,feedback=ef",
                             "none"};
    gcomp_mpi_tensor t[NT];
    tensors_of(t, specs, GCOMP_MPI_AUTO);
    model m;
    model_init(&m);
    gcomp_mpi_outer_options o;
    gcomp_mpi_outer_options_default(&o);
    o.fragments = 2;
    size_t k = 0;
    for (; k < 4096; k++) {
        gcomp_mpi_outer *x = NULL;
        gcomp_error err = {0};
        if (mc_rank == mc_size - 1) gcomp__mpi_test_fail_alloc_after(k);
        gcomp_status st = gcomp_mpi_outer_create(&x, comm, t, NT, m.w, &o, 10.0, &err);
        size_t left = gcomp__mpi_test_fail_alloc_after((size_t)-1);
        CHECK_MSG(mc_same_everywhere(st != GCOMP_OK),
                  "k=%zu: the create failed on some ranks only: %s (%s)", k, gcomp_status_str(st),
                  err.message);
        CHECK_MSG(st != GCOMP_E_TIMEOUT, "k=%zu: %s", k, err.message);
        CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK, "k=%zu: %s", k, err.message);
        CHECK((st == GCOMP_OK) == (x != NULL));
        gcomp_mpi_outer_free(x);
        if (mc_sweep_done(left)) break;
    }
    CHECK_MSG(k > 2 && k < 4096, "the create's allocations: %zu", k);
    if (mc_rank == 0) printf("create out of memory: swept %zu allocations\n", k);
    gcomp_mpi_outer *x = make(comm, t, &m, &o);
    gcomp_mpi_outer_free(x);
    model_free(&m);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "comm: %s", err.message);
    if (st == GCOMP_OK) {
        test_replay(comm);
        test_identical(comm);
        test_conservation(comm, "topk:density=0.1,values=sign,feedback=ef", 1.0);
        test_conservation(comm, "sign:feedback=ef", 1.0);
        test_conservation(comm, "twobit:threshold=0.05", 1.0);
        test_conservation(comm, "topk:density=0.1,values=twobit,threshold=0.05,feedback=ef", 0.9);
        test_schedule(comm, 8, 4, -1);
        test_schedule(comm, 10, 4, -1);
        test_schedule(comm, 12, 3, 1);
        test_schedule(comm, 6, 1, 2);
        test_schedule(comm, 5, 1, 0);
        test_checkpoint(comm);
        test_bad_input(comm);
        test_create_nomem(comm);
    }
    gcomp_mpi_comm_free(comm);
    return mc_done("test_mpi_outer");
}

/*
 * test_mpi_sum.c - every strategy x codec family gives the sum of what the ranks'
 * decoders produce.
 *
 * For each case, a bucket of tensors with awkward sizes (1 element, fewer elements than
 * ranks, odd sizes, a few thousand) runs two steps (so error-feedback state is non-zero
 * in the second).  After each allreduce, every rank gathers all ranks' messages
 * (gcomp_mpi_message), decodes them in float64 in rank order, and compares:
 *   allgather, allreduce f32     |result - sum| <= 1e-5 * sum|.|  (float summation order)
 *   allreduce f16 / bf16         within P-1 half roundings of the partial sums
 *   sparse, rsag                 |result + (owner residual after - before) - sum| tiny:
 *                                what an owner did not send is exactly in its residual
 * plus empty selections (a threshold nothing reaches), the average op, hierarchical
 * (one node, and two fake nodes of two ranks at -np 4), and a non-finite gradient on one
 * rank, which every rank must report while the communicator stays usable.
 */
#include "mpi_check.h"

#include <stdbool.h>

#define STEPS 2

static const size_t std_sizes[] = {1, 3, 5, 1000, 1001, 4099};
#define NSIZES (sizeof std_sizes / sizeof std_sizes[0])

typedef struct tcase {
    const char *spec;
    int strategy;
    double rel; /* tolerance relative to the sum of |decoded| per element */
    int expect; /* expected resolved strategy (without the hierarchical flag), or -1 */
} tcase;

/* Owners without a residual (random codecs that are no contraction) send an unbiased
 * estimate of their region's sum y: each element within own_rel |y_i| + own_l2 |y|_2 of
 * it (QSGD: |y_bucket|_2 / levels; ternary: max |y_bucket|; bernoulli at density p:
 * (1/p - 1) |y_i|).  Both 0: an owner must keep a residual (exact accounting). */
typedef struct owner_bound {
    double own_rel, own_l2;
} owner_bound;
static const owner_bound exact = {0, 0};

static void run_case_bound(gcomp_mpi_comm *comm, const tcase *tc, owner_bound ob, gcomp_mpi_op op,
                           const size_t *sizes, size_t nt) {
    gcomp_mpi_tensor t[NSIZES];
    char names[NSIZES][64];
    float *data[NSIZES];
    for (size_t k = 0; k < nt; k++) {
        snprintf(names[k], sizeof names[k], "%s/%zu", tc->spec, sizes[k]);
        t[k] = (gcomp_mpi_tensor){names[k], tc->spec, sizes[k], 0, 0, tc->strategy};
        data[k] = malloc(sizes[k] * sizeof(float));
    }
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.bucket_bytes = 8192; /* several sub-buckets: exercises the pipeline */
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, t, nt, &bo, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s [%s]: create: %s", tc->spec,
              gcomp_mpi_strategy_name(tc->strategy), err.message);
    if (st != GCOMP_OK) goto out;
    if (tc->expect >= 0)
        CHECK_MSG((gcomp_mpi_bucket_strategy(b, 0) & 0xff) == tc->expect, "%s: strategy %s",
                  tc->spec, gcomp_mpi_strategy_name(gcomp_mpi_bucket_strategy(b, 0)));
    int P = gcomp_mpi_comm_size(comm);
    bool single_node = (tc->strategy & GCOMP_MPI_HIERARCHICAL) && gcomp_mpi_comm_nodes(comm) == 1;
    double scale = op == GCOMP_MPI_AVERAGE ? 1.0 / P : 1.0;
    for (int step = 0; step < STEPS; step++) {
        float *before[NSIZES] = {0}, *input[NSIZES] = {0};
        for (size_t k = 0; k < nt; k++) {
            test_fill(data[k], sizes[k],
                      1000003ull * (unsigned)mc_rank + 7919ull * (unsigned)step + k);
            input[k] = malloc(sizes[k] * sizeof(float));
            memcpy(input[k], data[k], sizes[k] * sizeof(float));
            const float *res;
            size_t off, cnt;
            gcomp_mpi_owner_residual(b, k, &res, &off, &cnt);
            if (res) {
                before[k] = malloc(cnt * sizeof(float));
                memcpy(before[k], res, cnt * sizeof(float));
            }
        }
        st = gcomp_mpi_allreduce(b, data, op, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "%s: allreduce: %s", tc->spec, err.message);
        for (size_t k = 0; k < nt && st == GCOMP_OK; k++) {
            size_t n = sizes[k];
            double *ref = calloc(n, sizeof(double)), *abs_sum = calloc(n, sizeof(double)),
                   *delta = calloc(n, sizeof(double)), *dsum = calloc(n, sizeof(double)),
                   *bound = calloc(n, sizeof(double));
            if (single_node) {
                /* One node: the leader's dense sum is exact, nothing is compressed. */
                for (size_t i = 0; i < n; i++) delta[i] = input[k][i];
                MPI_Allreduce(delta, ref, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                for (size_t i = 0; i < n; i++) delta[i] = fabs(delta[i]);
                MPI_Allreduce(delta, abs_sum, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                memset(delta, 0, n * sizeof(double));
                CHECK(gcomp_mpi_message_count(b, k) == 0);
            } else {
                long msgs = mc_reference(MPI_COMM_WORLD, b, k, n, ref, abs_sum);
                CHECK_MSG(msgs > 0, "%s n=%zu: %ld messages", tc->spec, n, msgs);
            }
            const float *res;
            size_t off = 0, cnt = 0;
            gcomp_mpi_owner_residual(b, k, &res, &off, &cnt);
            const char *ospec = gcomp_mpi_owner_spec(b, k);
            bool estimate = ospec && strstr(ospec, ",feedback=none,");
            CHECK_MSG(!ospec || estimate == (ob.own_rel + ob.own_l2 > 0),
                      "%s: owner spec '%s' (feedback=none expected: %d)", tc->spec, ospec,
                      ob.own_rel + ob.own_l2 > 0);
            if (estimate) {
                /* |result - y| within the codec's bound, y = the sum of every rank's
                 * decoded chunks or slices over the owner's region */
                int xs = P;
                for (int j = 0; j < xs; j++) {
                    size_t r0 = n * (size_t)j / (size_t)xs, r1 = n * (size_t)(j + 1) / (size_t)xs;
                    double l2 = 0;
                    for (size_t i = r0; i < r1; i++) l2 += ref[i] * ref[i];
                    for (size_t i = r0; i < r1; i++)
                        bound[i] = ob.own_rel * fabs(ref[i]) + ob.own_l2 * sqrt(l2);
                }
            }
            for (size_t j = 0; res && j < cnt; j++) {
                double b0 = before[k] ? before[k][j] : 0.0;
                delta[off + j] = (double)res[j] - b0;
                abs_sum[off + j] += fabs(b0) + fabs((double)res[j]); /* local only: fine */
            }
            MPI_Allreduce(delta, dsum, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            double worst = 0;
            size_t at = 0;
            for (size_t i = 0; i < n; i++) {
                double want = ref[i] - dsum[i];
                double e = fabs((double)data[k][i] / scale - want) - tc->rel * abs_sum[i] -
                           bound[i] - 1e-5;
                if (e > worst) worst = e, at = i;
            }
            CHECK_MSG(worst <= 0, "%s [%s] n=%zu step %d: element %zu: %g vs %g (excess %g)",
                      tc->spec, gcomp_mpi_strategy_name(gcomp_mpi_bucket_strategy(b, k)), n, step,
                      at, (double)data[k][at] / scale, ref[at] - dsum[at], worst);
            free(ref);
            free(abs_sum);
            free(delta);
            free(dsum);
            free(bound);
        }
        for (size_t k = 0; k < nt; k++) {
            free(before[k]);
            free(input[k]);
        }
    }
    gcomp_mpi_stats s;
    CHECK_OK(gcomp_mpi_stats_get(b, (size_t)-1, &s));
    CHECK(s.calls == STEPS);
    CHECK(P == 1 || s.bytes_sent > 0 || (tc->strategy & GCOMP_MPI_HIERARCHICAL));
out:
    gcomp_mpi_bucket_free(b);
    for (size_t k = 0; k < nt; k++) free(data[k]);
}

static void run_case_sizes(gcomp_mpi_comm *comm, const tcase *tc, gcomp_mpi_op op,
                           const size_t *sizes, size_t nt) {
    run_case_bound(comm, tc, exact, op, sizes, nt);
}

/* One rank's gradient holds a NaN: every rank gets GCOMP_E_NONFINITE, and the next call
 * (all finite) works on the same bucket. */
static void nonfinite_shaped(gcomp_mpi_comm *comm, const char *spec, int strategy, size_t rows,
                             size_t cols) {
    size_t n = rows ? rows * cols : 257;
    gcomp_mpi_tensor t = {"nan", spec, n, rows, cols, strategy};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    if (!b) return;
    float x[1200], *d = x;
    test_fill(x, n, 5);
    if (mc_rank == mc_size - 1) x[100] = NAN;
    gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE, "%s [%s]: NaN on one rank gave %s (%s)", spec,
              gcomp_mpi_strategy_name(strategy), gcomp_status_str(st), err.message);
    CHECK(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK);
    test_fill(x, n, 6);
    st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: after a NaN step: %s", spec, err.message);
    gcomp_mpi_bucket_free(b);
}

static void nonfinite(gcomp_mpi_comm *comm, const char *spec, int strategy) {
    nonfinite_shaped(comm, spec, strategy, 0, 0);
}

/* PowerSGD: one rank's finite gradient whose Q = M^T P^ overflows (one column of 8e37),
 * so that rank fails after the P reduction, not at begin.  Its Q reduction must keep the
 * others' size (r x cols, not its P's rows x r): every rank gets GCOMP_E_NONFINITE, the
 * communicator stays usable and the next step goes through. */
static void lowrank_local_overflow(gcomp_mpi_comm *comm) {
    enum { ROWS = 40, COLS = 30 };
    gcomp_mpi_tensor t = {"big", "powersgd:rank=2", ROWS * COLS, ROWS, COLS, GCOMP_MPI_AUTO};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    if (!b) return;
    float x[ROWS * COLS], *d = x;
    test_fill(x, ROWS * COLS, 13);
    if (mc_rank == mc_size - 1)
        for (size_t i = 0; i < ROWS; i++) x[i * COLS] = 8e37f; /* under begin's FLT_MAX / 4 */
    gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE, "PowerSGD, Q overflowing on one rank gave %s (%s)",
              gcomp_status_str(st), err.message);
    CHECK(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK);
    test_fill(x, ROWS * COLS, 14);
    st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "PowerSGD: after a local overflow: %s", err.message);
    gcomp_mpi_bucket_free(b);
}

/* A hierarchical sub-bucket beside a flat one.  On one rank the hierarchical one has no
 * collective at all (a node of one, one node), and the engine used to wait for it to take
 * its turn, so the flat one never issued its collectives: a timeout (np 1). */
static void hier_then_flat(gcomp_mpi_comm *comm) {
    enum { N = 1000 };
    gcomp_mpi_tensor t[2] = {
        {"h", "topk:density=0.1", N, 0, 0, GCOMP_MPI_HIERARCHICAL | GCOMP_MPI_ALLGATHER},
        {"f", "topk:density=0.1", N, 0, 0, GCOMP_MPI_ALLGATHER}};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, 2, NULL, 60.0, &err));
    if (!b) return;
    static float x0[N], x1[N];
    float *d[2] = {x0, x1};
    test_fill(x0, N, 1);
    test_fill(x1, N, 2);
    gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_SUM, 20.0, &err);
    CHECK_MSG(st == GCOMP_OK, "a hierarchical and a flat sub-bucket: %s", err.message);
    gcomp_mpi_bucket_free(b);
}

/* Finite gradients whose sum overflows float at the owner (each rank 2e38 in one element):
 * the owner's re-compression refuses the Inf (a diverging residual ends the same way), and
 * every rank gets GCOMP_E_NONFINITE naming the owner step, never an Inf or NaN result. */
static void overflow(gcomp_mpi_comm *comm, const char *spec, int strategy) {
    gcomp_mpi_tensor t = {"big", spec, 1000, 0, 0, strategy};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    if (!b) return;
    float x[1000], *d = x;
    test_fill(x, 1000, 11);
    for (size_t i = 0; i < 1000; i += 100) x[i] = 2e38f; /* in every rank's region */
    gcomp_status st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE && strstr(err.message, "owner re-compression"),
              "%s [%s]: an overflowing sum gave %s (%s)", spec, gcomp_mpi_strategy_name(strategy),
              gcomp_status_str(st), err.message);
    CHECK(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK);
    test_fill(x, 1000, 12);
    st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: after an overflow: %s", spec, err.message);
    for (size_t i = 0; i < 1000; i++) CHECK_MSG(isfinite(x[i]), "%s: x[%zu] = %g", spec, i, x[i]);
    gcomp_mpi_bucket_free(b);
}

/* E (this rank's PowerSGD residual) in double, zeros where this rank has no compressor. */
static void lowrank_residual(gcomp_mpi_bucket *b, size_t n, double *out) {
    float *e = calloc(n, sizeof(float));
    gcomp_compressor *c = gcomp_mpi_compressor(b, 0);
    if (c) CHECK_OK(gcomp_lowrank_residual(c, e));
    for (size_t i = 0; i < n; i++) out[i] = e[i];
    free(e);
}

/*
 * PowerSGD through the multi-phase protocol.  No messages to gather; instead:
 *  - step 0 equals what one process computes from the summed gradient (the property that
 *    makes allreduce of P and Q exact), up to float rounding;
 *  - every step conserves: sum(grad) + sum(E before) = result + sum(E after);
 *  - start_iter steps and 1-D tensors are exact dense sums.
 */
static void lowrank_case(gcomp_mpi_comm *comm, const char *spec, size_t rows, size_t cols,
                         int strategy) {
    size_t n = rows * cols;
    gcomp_mpi_tensor t = {"w", spec, n, cols > 1 ? rows : 0, cols > 1 ? cols : 0, strategy};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: %s", spec, err.message);
    if (!b) return;
    bool dense_first = strstr(spec, "start_iter=1") != NULL || cols <= 1;
    float *x = malloc(n * sizeof(float)), *d = x;
    double *g = malloc(n * sizeof(double)), *gs = malloc(n * sizeof(double)),
           *e0 = malloc(n * sizeof(double)), *e1 = malloc(n * sizeof(double)),
           *es0 = malloc(n * sizeof(double)), *es1 = malloc(n * sizeof(double));
    for (int step = 0; step < 3; step++) {
        test_fill(x, n, 4242ull * (unsigned)mc_rank + (unsigned)step);
        for (size_t i = 0; i < n; i++) g[i] = x[i];
        MPI_Allreduce(g, gs, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        lowrank_residual(b, n, e0);
        MPI_Allreduce(e0, es0, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "%s step %d: %s", spec, step, err.message);
        lowrank_residual(b, n, e1);
        MPI_Allreduce(e1, es1, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double worst = 0, big = 0;
        for (size_t i = 0; i < n; i++) {
            double want = gs[i] + es0[i] - es1[i];
            if (fabs(x[i] - want) > worst) worst = fabs(x[i] - want);
            if (fabs(gs[i]) > big) big = fabs(gs[i]);
        }
        CHECK_MSG(worst <= 1e-4 * big + 1e-4, "%s step %d: conservation off by %g (max %g)", spec,
                  step, worst, big);
        if (step == 0 && dense_first) {
            double w2 = 0;
            for (size_t i = 0; i < n; i++) w2 = fmax(w2, fabs(x[i] - gs[i]));
            CHECK_MSG(w2 <= 1e-5 * big + 1e-5, "%s: dense step off by %g", spec, w2);
        }
        if (step == 0 && !dense_first && !(strategy & GCOMP_MPI_HIERARCHICAL)) {
            /* one process with the summed gradient */
            gcomp_compressor *c;
            CHECK_OK(gcomp_compressor_create(&c, spec, n, rows, cols, NULL));
            float *sum = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float)), *p, *q;
            size_t np, nq;
            unsigned rounds;
            for (size_t i = 0; i < n; i++) sum[i] = (float)gs[i];
            CHECK_OK(gcomp_lowrank_begin(c, sum, &p, &np, &rounds));
            for (unsigned k = 0; k < rounds; k++) {
                if (k) CHECK_OK(gcomp_lowrank_after_q(c, &p, &np));
                CHECK_OK(gcomp_lowrank_after_p(c, &q, &nq));
            }
            CHECK_OK(gcomp_lowrank_finish(c, out, 1.0f));
            double w3 = 0;
            for (size_t i = 0; i < n; i++) w3 = fmax(w3, fabs((double)x[i] - out[i]));
            CHECK_MSG(w3 <= 1e-3 * big + 1e-3, "%s: differs from one process by %g", spec, w3);
            free(sum);
            free(out);
            gcomp_compressor_free(c);
        }
    }
    gcomp_mpi_bucket_free(b);
    free(x);
    free(g);
    free(gs);
    free(e0);
    free(e1);
    free(es0);
    free(es1);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm = NULL, *comm2 = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err));
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.ranks_per_node = 2; /* two fake nodes at -np 4 */
    CHECK_OK(gcomp_mpi_comm_create(&comm2, MPI_COMM_WORLD, &o, 60.0, &err));
    if (!comm || !comm2) return mc_done("test_mpi_sum");
    const double f32 = 1e-5, f16 = (mc_size - 1) * 0x1p-11 + 1e-5,
                 bf16 = (mc_size - 1) * 0x1p-8 + 1e-5;
    const int H = GCOMP_MPI_HIERARCHICAL;
    const tcase cases[] = {
        /* sparse selectors: allgather (auto), sparse allreduce, rsag */
        {"topk:density=0.05,feedback=ef", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER},
        {"topk:density=0.05,values=f16,feedback=ef", GCOMP_MPI_SPARSE, f32, -1},
        {"topk:density=0.3", GCOMP_MPI_SPARSE, f32, -1}, /* slices go dense */
        {"topk:density=0.05", GCOMP_MPI_RSAG, f32, -1},
        {"threshold:tau=1e30", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER}, /* empty */
        {"threshold:tau=1e30", GCOMP_MPI_SPARSE, f32, -1},
        {"threshold:tau=1e30", GCOMP_MPI_RSAG, f32, -1},
        {"bernoulli:density=0.1,seed=3", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER},
        {"dgc:density=0.05", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER},
        {"block:density=0.2,block=8,values=bf16", GCOMP_MPI_SPARSE, f32, -1},
        /* linear: allreduce */
        {"none", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLREDUCE},
        {"none:values=f16,feedback=ef", GCOMP_MPI_AUTO, f16, GCOMP_MPI_ALLREDUCE},
        {"none:values=bf16", GCOMP_MPI_AUTO, bf16, GCOMP_MPI_ALLREDUCE},
        {"randomk:density=0.1,seed=7,feedback=ef", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLREDUCE},
        {"randomk:density=0.2,values=f16,seed=9", GCOMP_MPI_AUTO, f16, GCOMP_MPI_ALLREDUCE},
        {"none:values=f16", GCOMP_MPI_ALLGATHER, f32, -1},
        {"none:values=f16", GCOMP_MPI_RSAG, f32, -1},
        /* quantizers: rsag (auto), but not twobit and sign */
        {"int8", GCOMP_MPI_AUTO, f32, GCOMP_MPI_RSAG},
        {"int4:bucket=64", GCOMP_MPI_AUTO, f32, GCOMP_MPI_RSAG},
        {"sign:feedback=ef", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER}, /* see auto */
        {"sign:feedback=ef", GCOMP_MPI_RSAG, f32, -1},
        {"twobit:threshold=0.5", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER}, /* see auto */
        {"twobit:threshold=0.5", GCOMP_MPI_RSAG, f32, -1},
        {"int4:rounding=stochastic,seed=2", GCOMP_MPI_AUTO, f32, GCOMP_MPI_RSAG},
        {"qsgd:levels=16,seed=5", GCOMP_MPI_AUTO, f32, GCOMP_MPI_RSAG},
        /* random codecs that are no contraction: allgather; their owners keep no residual */
        {"ternary:seed=4", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER},
        {"qsgd:levels=4,seed=5", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLGATHER},

        /* hierarchical */
        {"topk:density=0.05,feedback=ef", H | GCOMP_MPI_ALLGATHER, f32, -1},
        {"int8", H | GCOMP_MPI_AUTO, f32, GCOMP_MPI_RSAG},
        {"none:values=f16", H | GCOMP_MPI_AUTO, f16, GCOMP_MPI_ALLREDUCE},
        {"topk:density=0.05", H | GCOMP_MPI_SPARSE, f32, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(cases[i].spec, ":"), cases[i].spec);
        if (!gcomp_codec_find(name)) {
            if (mc_rank == 0) printf("skip %s: codec not built\n", cases[i].spec);
            continue;
        }
        run_case_sizes(comm, &cases[i], GCOMP_MPI_SUM, std_sizes, NSIZES);
        if (cases[i].strategy & H)
            run_case_sizes(comm2, &cases[i], GCOMP_MPI_SUM, std_sizes, NSIZES);
    }
    /* ... unless asked for: their owners keep no residual, and send an estimate */
    const struct {
        tcase c;
        owner_bound ob;
    } estimates[] = {
        {{"ternary:seed=4", GCOMP_MPI_RSAG, f32, -1}, {0, 1.0}},
        {{"qsgd:levels=4,seed=5", GCOMP_MPI_RSAG, f32, -1}, {0, 0.25}},
        {{"qsgd:levels=4,seed=5", GCOMP_MPI_SPARSE, f32, -1}, {0, 0.25}},
        {{"bernoulli:density=0.1,seed=3", GCOMP_MPI_SPARSE, f32, -1}, {9.0, 0}},
    };
    for (size_t i = 0; i < sizeof estimates / sizeof estimates[0]; i++)
        run_case_bound(comm, &estimates[i].c, estimates[i].ob, GCOMP_MPI_SUM, std_sizes, NSIZES);
    tcase avg = {"topk:density=0.1,feedback=ef", GCOMP_MPI_SPARSE, f32, -1};
    run_case_sizes(comm, &avg, GCOMP_MPI_AVERAGE, std_sizes, NSIZES);
    tcase avg2 = {"int8", GCOMP_MPI_HIERARCHICAL, f32, -1};
    run_case_sizes(comm2, &avg2, GCOMP_MPI_AVERAGE, std_sizes, NSIZES);
    /* Packs of 256 KB and more go around the library's own ring instead of
     * MPI_Iallreduce: both must give the sum. */
    const size_t big[] = {300001, 7};
    const tcase ring[] = {
        {"none", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLREDUCE},
        {"none:values=f16,feedback=ef", GCOMP_MPI_AUTO, f16, GCOMP_MPI_ALLREDUCE},
        {"none:values=bf16", GCOMP_MPI_AUTO, bf16, GCOMP_MPI_ALLREDUCE},
        {"randomk:density=0.5,seed=3", GCOMP_MPI_AUTO, f32, GCOMP_MPI_ALLREDUCE},
        {"none:values=f16", H | GCOMP_MPI_AUTO, f16, GCOMP_MPI_ALLREDUCE},
    };
    for (size_t i = 0; i < sizeof ring / sizeof ring[0]; i++) {
        run_case_sizes(comm, &ring[i], GCOMP_MPI_SUM, big, 2);
        if (ring[i].strategy & H) run_case_sizes(comm2, &ring[i], GCOMP_MPI_AVERAGE, big, 2);
    }

    if (gcomp_codec_find("powersgd")) {
        lowrank_case(comm, "powersgd:rank=2", 40, 30, GCOMP_MPI_AUTO);
        lowrank_case(comm, "powersgd:rank=3,iters=2", 17, 50, GCOMP_MPI_AUTO);
        lowrank_case(comm, "powersgd:rank=2,start_iter=1", 25, 25, GCOMP_MPI_AUTO);
        lowrank_case(comm, "powersgd:rank=2", 301, 1, GCOMP_MPI_AUTO); /* 1-D: dense */
        lowrank_case(comm2, "powersgd:rank=2", 40, 30, GCOMP_MPI_HIERARCHICAL);
        nonfinite(comm, "powersgd:rank=1", GCOMP_MPI_AUTO);                /* a dense step */
        nonfinite_shaped(comm, "powersgd:rank=2", GCOMP_MPI_AUTO, 40, 30); /* a low-rank one */
        nonfinite_shaped(comm2, "powersgd:rank=2", GCOMP_MPI_HIERARCHICAL, 40, 30);
        if (mc_size > 1) lowrank_local_overflow(comm);
    }
    hier_then_flat(comm2);
    nonfinite(comm, "topk:density=0.1", GCOMP_MPI_ALLGATHER);
    nonfinite(comm, "topk:density=0.1", GCOMP_MPI_SPARSE);
    nonfinite(comm, "int8", GCOMP_MPI_RSAG);
    nonfinite(comm, "none:values=f16", GCOMP_MPI_ALLREDUCE);
    nonfinite(comm, "randomk:density=0.05", GCOMP_MPI_ALLREDUCE); /* positions by the step */
    nonfinite(comm2, "randomk:density=0.05,values=f16", GCOMP_MPI_HIERARCHICAL);
    nonfinite(comm2, "topk:density=0.1", GCOMP_MPI_HIERARCHICAL | GCOMP_MPI_ALLGATHER);
    if (mc_size > 1) {
        overflow(comm, "int8", GCOMP_MPI_RSAG);           /* owner with a residual */
        overflow(comm, "ternary:seed=1", GCOMP_MPI_RSAG); /* and without */
        overflow(comm, "topk:density=0.2", GCOMP_MPI_SPARSE);
    }

    CHECK_OK(gcomp_mpi_comm_free(comm));
    CHECK_OK(gcomp_mpi_comm_free(comm2));
    return mc_done("test_mpi_sum");
}

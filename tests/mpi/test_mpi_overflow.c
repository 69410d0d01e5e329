/*
 * test_mpi_overflow.c - a sum of finite gradients that overflows float is an error on
 * every rank, at the step where it happens, for every strategy.
 *
 * Every rank puts 3e38 (FLT_MAX is 3.4e38) in a third of the elements of each tensor: each
 * contribution is finite, their sum over 2 or more ranks is not.  Every rank must return
 * GCOMP_E_NONFINITE for that call (never Inf as GCOMP_OK, never an error one step later
 * from the next encode), all ranks the same status; then a step with small values must
 * succeed on the same bucket (exact sum for the lossless specs).  A control: when only
 * rank 0 holds the big values, the sum is finite and the lossless specs return it.
 */
#include "mpi_check.h"

#include <float.h>
#include <math.h>

typedef struct {
    const char *spec;
    int strategy;
    size_t n, rows, cols;
    int lossless; /* feedback none, exact sum expected after recovery */
} tcase;

static const tcase cases[] = {
    {"none", GCOMP_MPI_ALLGATHER, 1000, 0, 0, 1},
    {"topk:density=0.1,feedback=ef", GCOMP_MPI_ALLGATHER, 1000, 0, 0, 0},
    {"none", GCOMP_MPI_ALLREDUCE, 1000, 0, 0, 1},
    {"none", GCOMP_MPI_ALLREDUCE, 100000, 0, 0, 1}, /* the ring (pack >= 256 KB) */
    {"none:values=bf16", GCOMP_MPI_ALLREDUCE, 1000, 0, 0, 0},
    {"randomk:density=0.5,seed=3", GCOMP_MPI_ALLREDUCE, 1000, 0, 0, 0},
    {"powersgd:rank=2", GCOMP_MPI_ALLREDUCE, 40 * 25, 40, 25, 0},
    {"topk:density=0.1", GCOMP_MPI_SPARSE, 1000, 0, 0, 0},
    {"int8", GCOMP_MPI_RSAG, 1000, 0, 0, 0},
    {"none", GCOMP_MPI_ALLREDUCE | GCOMP_MPI_HIERARCHICAL, 1000, 0, 0, 1},
    {"topk:density=0.1", GCOMP_MPI_ALLGATHER | GCOMP_MPI_HIERARCHICAL, 1000, 0, 0, 0},
};

static float small_value(size_t i, int rank) {
    return 0.01f * (float)((i * 7 + (size_t)rank * 3) % 11) - 0.05f;
}

static int same_everywhere(int st) {
    int lo, hi;
    MPI_Allreduce(&st, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&st, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

static void run_case(gcomp_mpi_comm *comm, const tcase *tc) {
    gcomp_mpi_tensor t = {"w", tc->spec, tc->n, tc->rows, tc->cols, tc->strategy};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    if (!b) return;
    float *x = malloc(tc->n * sizeof *x);
    float *data[1] = {x};

    /* 1. Every rank holds 3e38 in a third of the elements: the sum overflows. */
    for (size_t i = 0; i < tc->n; i++) x[i] = i % 3 == 0 ? 3e38f : small_value(i, mc_rank);
    gcomp_status st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE, "%s (strategy %d): overflowing sum gave %s (%s)", tc->spec,
              tc->strategy, gcomp_status_str(st), st ? err.message : "");
    CHECK_MSG(same_everywhere((int)st), "%s: ranks disagree on the overflow", tc->spec);

    /* With error feedback the failed step's encode stands (documented): what the residual
     * held back of the big values is kept, so the next sum overflows again, on every
     * rank alike; nothing it held is dropped. */
    const float *res = gcomp_compressor_residual(gcomp_mpi_compressor(b, 0));
    if (res) {
        size_t held = 0;
        for (size_t i = 0; i < tc->n; i++) held += res[i] == 3e38f;
        CHECK_MSG(held > 0 && held < (tc->n + 2) / 3, "%s: residual holds %zu big values", tc->spec,
                  held);
        for (size_t i = 0; i < tc->n; i++) x[i] = small_value(i, mc_rank);
        st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 60.0, &err);
        CHECK_MSG(st == GCOMP_E_NONFINITE && same_everywhere((int)st),
                  "%s: the held-back values did not come back: %s", tc->spec, gcomp_status_str(st));
        gcomp_state_reset(gcomp_mpi_compressor(b, 0)); /* the trainer's way out */
    }

    /* 2. The bucket is still usable: a step with small values succeeds. */
    for (size_t i = 0; i < tc->n; i++) x[i] = small_value(i, mc_rank);
    st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: step after the overflow: %s (%s)", tc->spec,
              gcomp_status_str(st), st ? err.message : "");
    int bad = 0;
    for (size_t i = 0; st == GCOMP_OK && i < tc->n; i++) {
        double want = 0;
        for (int r = 0; r < mc_size; r++) want += small_value(i, r);
        if (!isfinite(x[i]) || (tc->lossless && fabs(x[i] - want) > 1e-5)) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d wrong elements after recovery", tc->spec, bad);

    /* 3. Control: only rank 0 holds the big values; the sum is finite. */
    if (tc->lossless) {
        for (size_t i = 0; i < tc->n; i++)
            x[i] = i % 3 == 0 ? (mc_rank == 0 ? 3e38f : 0.0f) : small_value(i, mc_rank);
        st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "%s: finite sum near FLT_MAX: %s (%s)", tc->spec,
                  gcomp_status_str(st), st ? err.message : "");
        CHECK(st != GCOMP_OK || x[0] == 3e38f);
    }
    free(x);
    gcomp_mpi_bucket_free(b);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err));
    for (size_t c = 0; comm && c < sizeof cases / sizeof cases[0]; c++) run_case(comm, &cases[c]);
    gcomp_mpi_comm_free(comm);
    return mc_done("test_mpi_overflow");
}

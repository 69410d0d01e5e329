/*
 * test_mpi_seed.c - stochastic codecs draw independently on every rank; random-k does not.
 *
 * Every rank encodes the same gradient.  With one seed everywhere the ranks' rounding
 * errors would be the same draws and the average's error would be a single rank's; with
 * independent draws (a seed per rank, GCOMP_SPEC_PRIVATE_DRAWS) its squared error is 1/P of a
 * single rank's mean squared error.  Checked with 60000 elements (the estimate's relative spread is
 * ~1 %) between 0.6/P and 1.5/P, where shared draws give 1.  Random-k keeps the spec's seed: the
 * positions agree across ranks (allgather), and its allreduce still sums by position.  A
 * seed that differs across ranks in the user's spec is still a set-up mismatch.
 */
#include "mpi_check.h"

#include <math.h>

#define N 60000

static float grad(size_t i) {
    return sinf(0.001f * (float)i) + 0.3f * cosf(0.37f * (float)i);
}

static double sum_all(double x) {
    double s = 0;
    MPI_Allreduce(&x, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return s;
}

static int agree(uint64_t h) {
    uint64_t lo, hi;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* Averages the same gradient over the ranks; *e1 = mean over ranks of a single rank's
 * squared error, *ep = the average's; *pos = a hash of the own message's non-zeros. */
static gcomp_status average(gcomp_mpi_comm *comm, const char *spec, int strategy, double *e1,
                            double *ep, uint64_t *pos) {
    gcomp_mpi_tensor t = {"g", spec, N, 0, 0, strategy};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err;
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: create: %s", spec, st ? err.message : "");
    if (st != GCOMP_OK) return st;
    float *x = malloc(N * sizeof *x), *d = calloc(N, sizeof *d);
    float *data[1] = {x};
    for (size_t i = 0; i < N; i++) x[i] = grad(i);
    st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_AVERAGE, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: allreduce: %s", spec, st ? err.message : "");
    const void *m;
    size_t len;
    double own = 0, avg = 0;
    uint64_t h = 1469598103934665603ull;
    if (st == GCOMP_OK && gcomp_mpi_message(b, 0, 0, &m, &len, NULL, NULL) == GCOMP_OK &&
        gcomp_decode_add(m, len, d, N, 1.0f) == GCOMP_OK) {
        for (size_t i = 0; i < N; i++) {
            double a = d[i] - grad(i), c = x[i] - grad(i);
            own += a * a;
            avg += c * c;
            if (d[i] != 0.0f) h = (h ^ i) * 1099511628211ull;
        }
    } else {
        CHECK_MSG(0, "%s: no own message to decode", spec);
    }
    *e1 = sum_all(own) / mc_size;
    *ep = avg; /* the same on every rank */
    *pos = h;
    free(x);
    free(d);
    gcomp_mpi_bucket_free(b);
    return st;
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err));
    if (!comm) return mc_done("test_mpi_seed");
    static const char *rounding[] = {"qsgd:levels=4,seed=5", "ternary:seed=4",
                                     "int8:rounding=stochastic,seed=6",
                                     "bernoulli:density=0.3,seed=3"};
    for (size_t c = 0; c < sizeof rounding / sizeof rounding[0]; c++) {
        double e1 = 0, ep = 0;
        uint64_t pos;
        if (average(comm, rounding[c], GCOMP_MPI_ALLGATHER, &e1, &ep, &pos) != GCOMP_OK) continue;
        double ratio = ep / e1;
        if (mc_rank == 0)
            printf("%-34s single-rank error %.4g, average's %.4g: ratio %.3f (1/P = %.3f)\n",
                   rounding[c], e1, ep, ratio, 1.0 / mc_size);
        CHECK_MSG(e1 > 0 && ratio > 0.6 / mc_size && ratio < 1.5 / mc_size,
                  "%s: error of the average / single-rank error = %.3f, want ~1/%d", rounding[c],
                  ratio, mc_size);
    }
    /* random-k: one seed on every rank, the same positions; its allreduce sums by position */
    double e1, ep;
    uint64_t pos;
    if (average(comm, "randomk:density=0.1,seed=7", GCOMP_MPI_ALLGATHER, &e1, &ep, &pos) ==
        GCOMP_OK)
        CHECK_MSG(agree(pos), "randomk: positions differ across ranks");
    if (average(comm, "randomk:density=0.1,seed=7", GCOMP_MPI_ALLREDUCE, &e1, &ep, &pos) ==
        GCOMP_OK)
        CHECK_MSG(agree(pos), "randomk (allreduce): positions differ across ranks");
    /* Which worker specs are the rank's own: rounding-only randomness, per strategy. */
    static const struct {
        const char *spec;
        int strategy, own;
    } ws[] = {{"qsgd:levels=16,seed=5", GCOMP_MPI_RSAG, 1},
              {"int4:rounding=stochastic,seed=6", GCOMP_MPI_RSAG, 1},
              {"int8", GCOMP_MPI_RSAG, 0},
              {"ternary:seed=4", GCOMP_MPI_SPARSE, 1},
              {"randomk:density=0.1,seed=7", GCOMP_MPI_ALLGATHER, 0},
              {"topk:density=0.1", GCOMP_MPI_ALLGATHER, 0}};
    for (size_t c = 0; c < sizeof ws / sizeof ws[0]; c++) {
        gcomp_mpi_tensor t = {"g", ws[c].spec, N, 0, 0, ws[c].strategy};
        gcomp_mpi_bucket *b = NULL;
        CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
        const char *w = gcomp_mpi_worker_spec(b, 0);
        uint64_t h = 1469598103934665603ull;
        for (const char *p = w ? w : ""; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
        CHECK_MSG(w != NULL && agree(h) == !ws[c].own, "%s: worker spec '%s' %s across ranks",
                  ws[c].spec, w ? w : "(null)", ws[c].own ? "agrees" : "differs");
        gcomp_mpi_bucket_free(b);
    }
    /* the user's seed itself must still agree */
    char spec[64];
    snprintf(spec, sizeof spec, "qsgd:levels=4,seed=%d", 10 + mc_rank);
    gcomp_mpi_tensor t = {"g", spec, N, 0, 0, GCOMP_MPI_ALLGATHER};
    gcomp_mpi_bucket *b = NULL;
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err);
    CHECK_MSG(st == GCOMP_E_MISMATCH, "different seeds across ranks: %s", gcomp_status_str(st));
    gcomp_mpi_bucket_free(b);
    CHECK_OK(gcomp_mpi_comm_free(comm));
    return mc_done("test_mpi_seed");
}

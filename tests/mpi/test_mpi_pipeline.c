/*
 * test_mpi_pipeline.c - bucketing, pipelining and non-blocking use.
 *
 * A bucket of 40 tensors of three strategies with a small bucket_bytes runs as many
 * sub-buckets; it is started, "computed over" while gcomp_mpi_test is polled, and waited
 * for; a second bucket is started while the first is in flight and the two are waited for
 * in the opposite order (what a trainer does layer by layer), and then with
 * gcomp_mpi_wait_all, which must give the same bits as the waits one by one and name the
 * bucket an error came from.  Every tensor must equal the
 * float64 sum of all ranks' decoded messages, and the statistics must be consistent:
 * overlap <= codec time, bytes counted, per-tensor bytes adding up to the bucket's.
 */
#include "mpi_check.h"

#define NT 40

static const char *spec_of(size_t i) {
    switch (i % 4) {
    case 0:
        return "topk:density=0.02,feedback=ef";
    case 1:
        return "none:values=f16";
    case 2:
        return "int8:bucket=128";
    default:
        return "topk:density=0.05,values=bf16";
    }
}

static void make(gcomp_mpi_comm *comm, gcomp_mpi_bucket **b, float **data, size_t *n,
                 char (*names)[32], unsigned salt) {
    gcomp_mpi_tensor t[NT];
    for (size_t i = 0; i < NT; i++) {
        n[i] = 500 + 997 * (i % 7) + i;
        snprintf(names[i], 32, "layer%zu.%u", i, salt);
        int strategy = (i % 4 == 3) ? GCOMP_MPI_SPARSE : GCOMP_MPI_AUTO;
        t[i] = (gcomp_mpi_tensor){names[i], spec_of(i), n[i], 0, 0, strategy};
        data[i] = malloc(n[i] * sizeof(float));
    }
    gcomp_mpi_bucket_options o;
    gcomp_mpi_bucket_options_default(&o);
    o.bucket_bytes = 16384;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_create(b, comm, t, NT, &o, 60.0, &err));
}

static void fill(float **data, const size_t *n, unsigned salt) {
    for (size_t i = 0; i < NT; i++)
        test_fill(data[i], n[i], 7777u * (unsigned)mc_rank + 31u * i + salt);
}

/* The owners' residuals of every tensor, assembled on every rank (zeros where none). */
static void owner_residuals(gcomp_mpi_bucket *b, const size_t *n, double **out) {
    for (size_t i = 0; i < NT; i++) {
        double *mine = calloc(n[i], sizeof(double));
        if (!out[i]) out[i] = calloc(n[i], sizeof(double));
        const float *res;
        size_t off, cnt;
        gcomp_mpi_owner_residual(b, i, &res, &off, &cnt);
        for (size_t j = 0; res && j < cnt; j++) mine[off + j] = res[j];
        MPI_Allreduce(mine, out[i], (int)n[i], MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        free(mine);
    }
}

/* Checks every tensor against the decoded sum plus what the owners kept since `before`. */
static void verify(gcomp_mpi_bucket *b, float **data, const size_t *n, double **before,
                   const char *label) {
    double worst = 0;
    size_t wi = 0;
    double *after[NT] = {0};
    owner_residuals(b, n, after);
    for (size_t i = 0; i < NT; i++) {
        double *ref = calloc(n[i], sizeof(double)), *abs_sum = calloc(n[i], sizeof(double)),
               *dsum = calloc(n[i], sizeof(double));
        CHECK(mc_reference(MPI_COMM_WORLD, b, i, n[i], ref, abs_sum) > 0);
        for (size_t j = 0; j < n[i]; j++) dsum[j] = after[i][j] - before[i][j];
        free(after[i]);
        double rel = i % 4 == 1 ? (mc_size - 1) * 0x1p-11 + 1e-5 : 1e-5;
        for (size_t j = 0; j < n[i]; j++) {
            double e =
                fabs(data[i][j] + dsum[j] - ref[j]) - rel * (abs_sum[j] + fabs(dsum[j])) - 1e-5;
            if (e > worst) worst = e, wi = i;
        }
        free(ref);
        free(abs_sum);
        free(dsum);
    }
    CHECK_MSG(worst <= 0, "%s: tensor %zu off by %g", label, wi, worst);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err));
    gcomp_mpi_bucket *a = NULL, *b = NULL;
    float *da[NT], *db[NT];
    size_t na[NT], nb[NT];
    char names_a[NT][32], names_b[NT][32];
    make(comm, &a, da, na, names_a, 1);
    make(comm, &b, db, nb, names_b, 2);
    if (!a || !b) return mc_done("test_mpi_pipeline");

    double *ra[NT] = {0}, *rb[NT] = {0};
    /* 1. start, compute while polling, wait */
    fill(da, na, 1);
    owner_residuals(a, na, ra);
    CHECK_OK(gcomp_mpi_start(a, da, GCOMP_MPI_SUM, &err));
    volatile double sink = 0;
    int done = 0, polls = 0;
    for (int round = 0; round < 200 && !done; round++) {
        for (int k = 0; k < 20000; k++) sink += k * 1e-9; /* the caller's own work */
        CHECK_OK(gcomp_mpi_test(a, &done, &err));
        polls++;
    }
    CHECK_OK(gcomp_mpi_wait(a, 60.0, &err));
    verify(a, da, na, ra, "start/test/wait");
    gcomp_mpi_stats s, ts, sum = {0};
    CHECK_OK(gcomp_mpi_stats_get(a, (size_t)-1, &s));
    CHECK(s.calls == 1);
    CHECK(s.overlap_ns <= s.codec_ns);
    CHECK(s.codec_ns > 0 && s.wire_ns > 0 && s.elapsed_ns > 0);
    CHECK(mc_size == 1 || s.bytes_sent > 0);
    for (size_t i = 0; i < NT; i++) {
        CHECK_OK(gcomp_mpi_stats_get(a, i, &ts));
        sum.bytes_sent += ts.bytes_sent;
        sum.codec_ns += ts.codec_ns;
        CHECK(ts.calls == 1 && ts.wire_ns > 0);
    }
    /* per tensor: its own bytes; the bucket adds nothing else except owner size words */
    CHECK_MSG(sum.bytes_sent <= s.bytes_sent &&
                  (double)sum.bytes_sent * 1.05 + 4096 >= (double)s.bytes_sent,
              "per-tensor bytes %llu vs bucket %llu", (unsigned long long)sum.bytes_sent,
              (unsigned long long)s.bytes_sent);
    CHECK(sum.codec_ns <= s.codec_ns);

    /* 2. two buckets in flight, waited for in the opposite order */
    fill(da, na, 2);
    fill(db, nb, 3);
    owner_residuals(a, na, ra);
    owner_residuals(b, nb, rb);
    CHECK_OK(gcomp_mpi_start(a, da, GCOMP_MPI_SUM, &err));
    CHECK_OK(gcomp_mpi_start(b, db, GCOMP_MPI_SUM, &err));
    CHECK_OK(gcomp_mpi_wait(b, 60.0, &err));
    CHECK_OK(gcomp_mpi_wait(a, 60.0, &err));
    verify(a, da, na, ra, "two in flight (a)");
    verify(b, db, nb, rb, "two in flight (b)");
    gcomp_mpi_stats_reset(a);
    CHECK_OK(gcomp_mpi_stats_get(a, (size_t)-1, &s));
    CHECK(s.calls == 0 && s.bytes_sent == 0);

    /* 3. gcomp_mpi_wait_all: twins of a and b (same names, specs and state: fresh) waited
     * for one by one and all at once give the same bits; an idle bucket counts as done */
    gcomp_mpi_bucket *tw[4] = {0};
    float *dt[4][NT];
    size_t nt_[4][NT];
    char names_t[4][NT][32];
    for (int k = 0; k < 4; k++)
        make(comm, &tw[k], dt[k], nt_[k], names_t[k], 1 + (unsigned)(k & 1));
    if (!tw[0] || !tw[1] || !tw[2] || !tw[3]) return mc_done("test_mpi_pipeline");
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 4; k++) fill(dt[k], nt_[k], 10u + (unsigned)(round * 2 + (k & 1)));
        for (int k = 0; k < 4; k++) CHECK_OK(gcomp_mpi_start(tw[k], dt[k], GCOMP_MPI_SUM, &err));
        CHECK_OK(gcomp_mpi_wait(tw[1], 60.0, &err));
        CHECK_OK(gcomp_mpi_wait(tw[0], 60.0, &err));
        gcomp_mpi_bucket *all[3] = {tw[3], a, tw[2]}; /* a is idle */
        size_t failed = 99;
        CHECK_OK(gcomp_mpi_wait_all(all, 3, 60.0, &failed, &err));
        CHECK(failed == 3);
        int same = 1;
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < NT; i++)
                same &= memcmp(dt[k][i], dt[k + 2][i], nt_[k][i] * sizeof(float)) == 0;
        CHECK_MSG(same, "round %d: wait_all differs from waits one by one", round);
    }
    /* a NaN in the second bucket on rank 0: every rank learns it from that bucket (index
     * 1); the first is still in flight or done and is waited on again */
    size_t failed = 99;
    CHECK(gcomp_mpi_wait_all(NULL, 1, 1.0, &failed, &err) == GCOMP_E_ARG && failed == 1);
    CHECK_OK(gcomp_mpi_wait_all(NULL, 0, 1.0, &failed, &err));
    fill(da, na, 4);
    fill(db, nb, 5);
    owner_residuals(a, na, ra);
    if (mc_rank == 0) db[1][3] = NAN;
    CHECK_OK(gcomp_mpi_start(a, da, GCOMP_MPI_SUM, &err));
    CHECK_OK(gcomp_mpi_start(b, db, GCOMP_MPI_SUM, &err));
    gcomp_mpi_bucket *ab[2] = {a, b};
    gcomp_status st = gcomp_mpi_wait_all(ab, 2, 60.0, &failed, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE && failed == 1, "status %d from bucket %zu", (int)st, failed);
    CHECK_OK(gcomp_mpi_wait(a, 60.0, &err));
    verify(a, da, na, ra, "wait_all with an error in the other bucket");

    /* gcomp_mpi_wait_each: the same error, reported against its bucket; the other is
     * finished in the same call, and neither needs another wait */
    gcomp_error each[2];
    CHECK(gcomp_mpi_wait_each(ab, 2, 1.0, NULL, &failed, &err) == GCOMP_E_ARG && failed == 2);
    fill(da, na, 6);
    fill(db, nb, 7);
    owner_residuals(a, na, ra);
    if (mc_rank == 0) db[0][1] = INFINITY;
    CHECK_OK(gcomp_mpi_start(a, da, GCOMP_MPI_SUM, &err));
    CHECK_OK(gcomp_mpi_start(b, db, GCOMP_MPI_SUM, &err));
    st = gcomp_mpi_wait_each(ab, 2, 60.0, each, &failed, &err);
    CHECK_MSG(st == GCOMP_E_NONFINITE && failed == 1 && each[0].status == GCOMP_OK &&
                  each[1].status == GCOMP_E_NONFINITE && !strcmp(err.message, each[1].message),
              "status %d from bucket %zu, each %d %d", (int)st, failed, (int)each[0].status,
              (int)each[1].status);
    verify(a, da, na, ra, "wait_each with an error in the other bucket");
    fill(db, nb, 8); /* b is idle again */
    CHECK_OK(gcomp_mpi_start(b, db, GCOMP_MPI_SUM, &err));
    CHECK_OK(gcomp_mpi_wait_each(ab, 2, 60.0, each, &failed, &err));
    CHECK(failed == 2 && each[0].status == GCOMP_OK && each[1].status == GCOMP_OK);

    for (int k = 0; k < 4; k++) {
        gcomp_mpi_bucket_free(tw[k]);
        for (size_t i = 0; i < NT; i++) free(dt[k][i]);
    }
    gcomp_mpi_bucket_free(a);
    gcomp_mpi_bucket_free(b);
    for (size_t i = 0; i < NT; i++) {
        free(da[i]);
        free(db[i]);
        free(ra[i]);
        free(rb[i]);
    }
    CHECK_OK(gcomp_mpi_comm_free(comm));
    (void)polls;
    return mc_done("test_mpi_pipeline");
}

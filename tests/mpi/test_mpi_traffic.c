/*
 * test_mpi_traffic.c - bytes per rank of the sparse allreduce against allgather, at P = 2
 * (a sub-communicator of ranks 0 and 1) and P = 4 (all ranks), same tensor and density.
 *
 * Each rank's top-k is independent (no overlap), the hard case.  Counting what each rank
 * hands to MPI for its peers (gcomp_mpi_stats.bytes_sent, including the size words):
 *   allgather  (P-1) x one message: x3 from P = 2 to P = 4.
 *   sparse     (P-1)/P x k slice entries to owners + (P-1) x one owner message of k/P
 *              entries: 2(P-1)/P x k entries, bounded by 2k whatever P.  From P = 2 to 4
 *              that is x1.5 (the same law as a ring allreduce), not x1: no algorithm in
 *              which every rank ends with the k-entry result can send less than (P-1)/P
 *              of it, twice.  So the test checks the law, within +-15%: bytes/(2(P-1)/P)
 *              is the same at P = 2 and 4, never above 2 x 1.15 x one allgather message,
 *              and allgather's per-rank bytes grow at least 2.5x.
 * Needs 4 ranks; with fewer it checks only what one P can show.
 */
#include "mpi_check.h"

#define N 1000000
#define SPEC "topk:density=0.01,values=f16,feedback=ef"

/* Max over the ranks of comm of the bytes sent per call, averaged over 3 calls. */
static double per_rank_bytes(MPI_Comm mpi, int strategy, double *msg_bytes) {
    gcomp_mpi_comm *comm;
    gcomp_error err;
    double out = -1;
    CHECK_OK(gcomp_mpi_comm_create(&comm, mpi, NULL, 60.0, &err));
    if (!comm) return -1;
    int rank;
    MPI_Comm_rank(mpi, &rank);
    gcomp_mpi_tensor t = {"w", SPEC, N, 0, 0, strategy};
    gcomp_mpi_bucket *b = NULL;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    float *x = malloc(N * sizeof(float)), *d = x;
    double msg = 0;
    for (int step = 0; b && step < 3; step++) {
        test_fill(x, N, 977ull * (unsigned)rank + 13ull * (unsigned)step);
        CHECK_OK(gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err));
        const void *m;
        size_t len;
        if (gcomp_mpi_message(b, 0, 0, &m, &len, NULL, NULL) == GCOMP_OK) msg += (double)len / 3;
    }
    gcomp_mpi_stats s = {0};
    if (b) gcomp_mpi_stats_get(b, (size_t)-1, &s);
    double mine = (double)s.bytes_sent / 3;
    MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, mpi);
    MPI_Allreduce(&msg, msg_bytes, 1, MPI_DOUBLE, MPI_MAX, mpi);
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_comm_free(comm);
    free(x);
    return out;
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    double msg4, msg2 = 0, ag4, sp4, ag2 = 0, sp2 = 0;
    ag4 = per_rank_bytes(MPI_COMM_WORLD, GCOMP_MPI_ALLGATHER, &msg4);
    sp4 = per_rank_bytes(MPI_COMM_WORLD, GCOMP_MPI_SPARSE, &msg4);
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, mc_rank < 2 ? 0 : MPI_UNDEFINED, mc_rank, &pair);
    if (pair != MPI_COMM_NULL) {
        ag2 = per_rank_bytes(pair, GCOMP_MPI_ALLGATHER, &msg2);
        sp2 = per_rank_bytes(pair, GCOMP_MPI_SPARSE, &msg2);
        MPI_Comm_free(&pair);
    }
    MPI_Bcast(&ag2, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&sp2, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&msg2, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int P = mc_size;
    double law = 2.0 * (P - 1) / P;
    if (mc_rank == 0) {
        printf("one message: %.0f bytes (k = %d)\n", msg4, (int)(0.01 * N));
        printf("P=%d  allgather %.0f  sparse %.0f  sparse/(2(P-1)/P) %.0f\n", P, ag4, sp4,
               sp4 / law);
        if (P >= 4)
            printf("P=2  allgather %.0f  sparse %.0f  sparse/(2(P-1)/P) %.0f\n", ag2, sp2, sp2);
        if (P >= 4)
            printf("P=2 -> %d: allgather x%.2f, sparse x%.2f (law x%.2f)\n", P, ag4 / ag2,
                   sp4 / sp2, law);
    }
    /* Bounded by 2k entries whatever P. */
    CHECK_MSG(sp4 <= 2.0 * 1.15 * msg4, "sparse sends %.0f > 2 x %.0f", sp4, msg4);
    if (P == 4) {
        double norm4 = sp4 / law, norm2 = sp2 / 1.0;
        CHECK_MSG(fabs(norm4 / norm2 - 1.0) <= 0.15,
                  "sparse bytes / (2(P-1)/P): %.0f at P=4 vs %.0f at P=2", norm4, norm2);
        CHECK_MSG(ag4 / ag2 >= 2.5, "allgather grew only x%.2f", ag4 / ag2);
        CHECK_MSG(sp4 < 0.8 * ag4, "sparse %.0f not below allgather %.0f at P=4", sp4, ag4);
    }
    return mc_done("test_mpi_traffic");
}

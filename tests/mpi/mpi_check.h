/*
 * mpi_check.h - what the MPI tests share: start-up, the exact reference (every rank's
 * messages gathered and decoded in rank order in float64), error bounds, and a CHECK
 * whose failures every rank counts.  Public headers only.
 */
#ifndef GCOMP_TEST_MPI_CHECK_H
#define GCOMP_TEST_MPI_CHECK_H

#include "check.h"
#include "gradcomp_mpi.h"

#include <stdint.h>

static int mc_rank, mc_size;

static inline void mc_init(int *argc, char ***argv) {
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mc_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mc_size);
}

/* Ends the test: every rank's failures count; prints one summary line on rank 0. */
static inline int mc_done(const char *name) {
    int mine = check_failures_, all = 0, checks = check_count_, total = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&checks, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (mc_rank == 0) printf("%s (np=%d): %d checks, %d failed\n", name, mc_size, total, all);
    MPI_Finalize();
    return all ? 1 : 0;
}

/* 1 on every rank when every rank holds the same v (collective on MPI_COMM_WORLD). */
static inline int mc_same_everywhere(uint64_t v) {
    uint64_t w[2] = {v, ~v};
    MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return w[0] == ~w[1];
}

/* An allocation sweep's end, the same on every rank: 1 once the last rank, the one made to
 * fail, had allocations left over (`left`, from the test hook), so the operation needed
 * fewer than the sweep's k (collective on MPI_COMM_WORLD). */
static inline int mc_sweep_done(size_t left) {
    int done = mc_rank == mc_size - 1 && left != 0, any = 0;
    MPI_Allreduce(&done, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}
/*
 * ref[0..n) = sum over ranks, in rank order, of the decoded messages this bucket's
 * tensor i produced in the last call (each at its element range), in float64; abs[] the
 * sum of their absolute values (for rounding bounds).  Returns the number of messages in
 * all, or -1 if one did not decode.
 */
static inline long mc_reference(MPI_Comm comm, const gcomp_mpi_bucket *b, size_t i, size_t n,
                                double *ref, double *abs_sum) {
    int P;
    MPI_Comm_size(comm, &P);
    size_t nm = gcomp_mpi_message_count(b, i), bytes = 0;
    for (size_t j = 0; j < nm; j++) {
        const void *m;
        size_t len;
        gcomp_mpi_message(b, i, j, &m, &len, NULL, NULL);
        bytes += 24 + len;
    }
    uint8_t *mine = malloc(bytes + 1), *p = mine;
    for (size_t j = 0; j < nm; j++) {
        const void *m;
        size_t len, off, cnt;
        gcomp_mpi_message(b, i, j, &m, &len, &off, &cnt);
        uint64_t h[3] = {off, cnt, len};
        memcpy(p, h, 24);
        memcpy(p + 24, m, len);
        p += 24 + len;
    }
    int *counts = malloc(sizeof(int) * (size_t)P), *displs = malloc(sizeof(int) * (size_t)P);
    int my = (int)bytes;
    MPI_Allgather(&my, 1, MPI_INT, counts, 1, MPI_INT, comm);
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        displs[r] = (int)total;
        total += (size_t)counts[r];
    }
    uint8_t *all = malloc(total + 1);
    MPI_Allgatherv(mine, my, MPI_BYTE, all, counts, displs, MPI_BYTE, comm);
    for (size_t k = 0; k < n; k++) ref[k] = abs_sum[k] = 0;
    long msgs = 0;
    for (size_t q = 0; q < total;) {
        uint64_t h[3];
        memcpy(h, all + q, 24);
        float *tmp = calloc(h[1] ? h[1] : 1, sizeof(float));
        gcomp_status st = gcomp_decode_add(all + q + 24, h[2], tmp, h[1], 1.0f);
        if (st != GCOMP_OK) msgs = -1000000;
        for (size_t k = 0; k < h[1]; k++) {
            ref[h[0] + k] += tmp[k];
            abs_sum[h[0] + k] += fabs((double)tmp[k]);
        }
        free(tmp);
        q += 24 + h[2];
        msgs++;
    }
    free(mine);
    free(all);
    free(counts);
    free(displs);
    return msgs < 0 ? -1 : msgs;
}

#endif

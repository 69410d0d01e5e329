/*
 * cmd_plan_net.c - the network half of `gradcomp plan --calibrate`, run under mpirun:
 * alpha and beta of the links this job's ranks actually use, for the cost model.
 *
 *   latency     half the round trip of an 8-byte MPI ping-pong between ranks 0 and 1
 *               (median of 200, after 20 untimed)
 *   bandwidth   a 16 MiB one-way MPI_Send from rank 0 to rank 1, acknowledged by a zero-byte
 *               reply: bytes / (time - latency); the median of 3
 *   ring        gcomp_mpi_allreduce of `none` (the library's own ring above 256 KiB) over
 *               all ranks: 2(P-1)/P x bytes / (time - its codec time), the median of 3.
 *               The model adds the pack and unpack (the `none` codec's calibrated rates)
 *               to every allreduce itself, so the link's figure must not hold them: with
 *               them, a 16 MiB ring between two netsim hosts read 675 MB/s where its
 *               transfers ran at 1.2 GB/s, and 64 MiB dense was predicted 1.6x too long.
 *               Codec work done while a transfer is in flight (the ring's sums) stays in.
 *   burst       a token-bucket shaper's allowance (tc tbf's burst, a cloud instance's):
 *               after 0.3 s with the link idle, a 1 MiB one-way send; the bytes that got
 *               through beyond `bandwidth`: 1 MiB - bandwidth x (time - 2 latency), the
 *               median of 3; under a tenth of the transfer it is taken as noise (0).  A
 *               bucket of 1 MiB or more reads as 1 MiB.
 * The record is labelled "inter" when ranks 0 and 1 are on different nodes
 * (MPI_COMM_TYPE_SHARED), "intra" otherwise, so one file can hold both.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "../cli.h"
#include "gradcomp_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A one-way send of `bytes` from rank 0 to rank 1, acknowledged by a zero-byte reply:
 * its time less the two latencies (>= 0), on every rank after a barrier. */
static double one_way(int rank, char *buf, size_t bytes, int tag, double alpha) {
    char word[1];
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (rank == 0) {
        MPI_Send(buf, (int)bytes, MPI_BYTE, 1, tag, MPI_COMM_WORLD);
        MPI_Recv(word, 0, MPI_BYTE, 1, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(word, 0, MPI_BYTE, 0, tag, MPI_COMM_WORLD);
    }
    double t = MPI_Wtime() - t0 - 2 * alpha;
    return t > 0 ? t : 0;
}

int plan_calibrate_net(gcomp_cost_calibration *cal, int *rank_out, int *size_out);

int plan_calibrate_net(gcomp_cost_calibration *cal, int *rank_out, int *size_out) {
    int inited = 0, provided, rank, size;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    *rank_out = rank;
    *size_out = size;
    if (size < 2) return 0; /* nothing to measure: the codecs only */
    /* Are ranks 0 and 1 on one node? */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int nsize;
    MPI_Comm_size(node, &nsize);
    int leader = rank, l0 = 0, l1 = 0;
    MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    if (rank == 0) l0 = leader;
    if (rank == 1) l1 = leader;
    MPI_Allreduce(MPI_IN_PLACE, &l0, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &l1, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const char *label = l0 == l1 ? "intra" : "inter";

    const size_t big = (size_t)16 << 20;
    char *buf = malloc(big);
    int bad = !buf, anybad;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad) {
        free(buf);
        return cli_fail("plan", 1, "out of memory for the network calibration");
    }
    memset(buf, 1, big);
    double lat[200], bw[3], ring[3];
    char word[8] = {0};
    for (int i = 0; i < 220; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(word, 8, MPI_BYTE, 1, 11, MPI_COMM_WORLD);
            MPI_Recv(word, 8, MPI_BYTE, 1, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(word, 8, MPI_BYTE, 0, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(word, 8, MPI_BYTE, 0, 11, MPI_COMM_WORLD);
        }
        if (i >= 20) lat[i - 20] = (MPI_Wtime() - t0) / 2;
    }
    qsort(lat, 200, sizeof lat[0], cmp_d);
    double alpha = lat[100];
    for (int i = 0; i < 4; i++) { /* the first is a warm-up (connection, slow start) */
        double t = one_way(rank, buf, big, 12, alpha);
        if (i > 0) bw[i - 1] = (double)big / (t > 0 ? t : 1e-9);
    }
    qsort(bw, 3, sizeof bw[0], cmp_d);
    const size_t mid = (size_t)1 << 20;
    double burst[3];
    for (int i = 0; i < 3; i++) {
        struct timespec idle = {0, 300000000L};
        MPI_Barrier(MPI_COMM_WORLD);
        nanosleep(&idle, NULL); /* every rank: the links idle, the buckets refill */
        burst[i] = (double)mid - bw[1] * one_way(rank, buf, mid, 13, alpha);
    }
    qsort(burst, 3, sizeof burst[0], cmp_d);
    if (burst[1] < 0.1 * (double)mid) burst[1] = 0;

    /* The library's own ring allreduce over all ranks. */
    gcomp_error err = {0};
    gcomp_mpi_comm *comm = NULL;
    gcomp_mpi_bucket *b = NULL;
    size_t n = big / 4;
    gcomp_mpi_tensor t = {"calibration", "none", n, 0, 0, GCOMP_MPI_AUTO};
    int rc = 0;
    if (gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 120, &err) != GCOMP_OK ||
        gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 120, &err) != GCOMP_OK) {
        rc = cli_fail("plan", 1, "rank %d: %s", rank, err.message);
    }
    float *data = (float *)(void *)buf;
    for (int i = 0; i < 4 && !rc; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        gcomp_mpi_stats_reset(b);
        double t0 = MPI_Wtime();
        if (gcomp_mpi_allreduce(b, &data, GCOMP_MPI_AVERAGE, 120, &err) != GCOMP_OK) {
            rc = cli_fail("plan", 1, "rank %d: %s", rank, err.message);
            break;
        }
        gcomp_mpi_stats s = {0};
        gcomp_mpi_stats_get(b, (size_t)-1, &s);
        double dt = MPI_Wtime() - t0, codec = 1e-9 * (double)(s.codec_ns - s.overlap_ns);
        if (codec > 0 && codec < dt) dt -= codec;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i > 0) ring[i - 1] = 2.0 * (size - 1) / size * (double)big / dt;
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_comm_free(comm);
    free(buf);
    if (rc) return rc;
    qsort(ring, 3, sizeof ring[0], cmp_d);
    /* Every rank keeps rank 0's figures, so the file does not depend on who writes it. */
    double v[4] = {alpha, bw[1], ring[1], burst[1]};
    MPI_Bcast(v, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    gcomp_cost_net_rate r = {0};
    snprintf(r.label, sizeof r.label, "%s", label);
    r.ranks = size;
    r.latency = v[0];
    r.bandwidth = v[1];
    r.ring_bandwidth = v[2];
    r.burst = v[3];
    if (gcomp_cost_calibration_add_net(cal, &r) != GCOMP_OK)
        return cli_fail("plan", 1, "bad network measurement");
    if (rank == 0)
        fprintf(stderr,
                "calibrated net %s (%d ranks): latency %.1f us, bandwidth %.1f MB/s one way, ring "
                "allreduce %.1f MB/s, burst %.0f KiB\n",
                label, size, 1e6 * v[0], v[1] / 1e6, v[2] / 1e6, v[3] / 1024);
    return 0;
}

void plan_net_finalize(void);

void plan_net_finalize(void) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
    }
}

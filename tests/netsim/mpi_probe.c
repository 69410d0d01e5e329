/* mpi_probe - proves that a scripts/netsim job really spans shaped "hosts".
 *
 * usage: mpi_probe [BYTES [MAX_MBIT [EXIT_CODE]]]      (defaults: 2 MiB, 150, 0)
 *
 * 1. Every rank's MPI_Get_processor_name must differ: netsim puts rank i in namespace
 *    gc-h{i mod H} with its own hostname, so this holds for NP <= H.
 * 2. Ranks 2k and 2k+1 exchange BYTES with one MPI_Sendrecv (both directions at once, like
 *    one ring step) and check the data. The rate per direction, from the slowest pair, must
 *    stay below MAX_MBIT: at a tbf rate of 100mbit it comes out near 100 Mbit/s (a little
 *    above for short messages, which the 256 kB token bucket lets through at once), while
 *    an unshaped veth gives several Gbit/s.
 * 3. On success it exits with EXIT_CODE, so the caller can check that netsim passes a
 *    program's status through; any failed check exits 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long bytes_arg = argc > 1 ? atol(argv[1]) : 2L << 20;
    double max_mbit = argc > 2 ? atof(argv[2]) : 150.0;
    int exit_code = argc > 3 ? atoi(argv[3]) : 0;
    if (bytes_arg < 1 || bytes_arg > (1L << 30)) bytes_arg = 2L << 20;
    int bytes = (int)bytes_arg;
    int failed = 0;

    /* 1: distinct hosts */
    char name[MPI_MAX_PROCESSOR_NAME];
    memset(name, 0, sizeof name);
    int len;
    MPI_Get_processor_name(name, &len);
    char *names = NULL;
    if (rank == 0) names = calloc((size_t)size, MPI_MAX_PROCESSOR_NAME);
    MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
        for (int i = 0; i < size; i++) {
            const char *ni = names + (size_t)i * MPI_MAX_PROCESSOR_NAME;
            printf("probe: rank %d runs on %s\n", i, ni);
            for (int j = 0; j < i; j++) {
                if (strcmp(ni, names + (size_t)j * MPI_MAX_PROCESSOR_NAME) == 0) {
                    printf("probe: FAIL ranks %d and %d share host %s\n", j, i, ni);
                    failed = 1;
                }
            }
        }
        free(names);
    }

    /* 2: shaped exchange */
    int peer = rank ^ 1;
    double elapsed = 0.0;
    long bad = 0;
    if (peer < size) {
        unsigned char *out = malloc((size_t)bytes), *in = malloc((size_t)bytes);
        for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(rank * 31 + i);
        char ping = 0, pong;
        /* Opens the TCP connections, so the timed exchange measures the link only. */
        MPI_Sendrecv(&ping, 1, MPI_CHAR, peer, 1, &pong, 1, MPI_CHAR, peer, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Sendrecv(out, bytes, MPI_BYTE, peer, 0, in, bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        elapsed = MPI_Wtime() - t0;
        for (int i = 0; i < bytes; i++) bad += in[i] != (unsigned char)(peer * 31 + i);
        free(out);
        free(in);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
    double slowest;
    long bad_total;
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bad, &bad_total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (size < 2) {
            printf("probe: FAIL needs at least 2 ranks\n");
            failed = 1;
        } else {
            double mbit = (double)bytes * 8.0 / slowest / 1e6;
            printf("probe: %d B Sendrecv in %.1f ms = %.1f Mbit/s per direction (limit %.0f)\n",
                   bytes, slowest * 1e3, mbit, max_mbit);
            if (bad_total) {
                printf("probe: FAIL %ld bytes corrupted\n", bad_total);
                failed = 1;
            }
            if (!(mbit < max_mbit)) {
                printf("probe: FAIL rate %.1f Mbit/s is not below %.0f: link not shaped?\n", mbit,
                       max_mbit);
                failed = 1;
            }
        }
        if (!failed) printf("probe: PASS\n");
        fflush(stdout);
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed ? 1 : exit_code;
}

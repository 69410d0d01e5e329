/* link_probe - gcomp_mpi_link_probe on a shaped netsim link against the rate it is shaped to.
 *
 * usage: link_probe BYTES RATE_BYTES_PER_S TOLERANCE [LATENCY_S LATENCY_TOLERANCE]
 * Every rank probes (collective); rank 0 prints each rank's reading and exits 1 when one of
 * them is more than TOLERANCE (a fraction) away from RATE, or, given LATENCY_S, more than
 * LATENCY_TOLERANCE from that one-way latency; 2 on an error.  netsim's tbf lets a 256 KiB
 * burst pass at the speed of the veth, so a probe that times one large message against an
 * 8-byte one reads the burst as bandwidth: up to 2x a slow link; and one 8-byte step after
 * a barrier pays the ranks' skew leaving it, about a second latency.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "gradcomp_mpi.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4 && argc != 6) {
        if (rank == 0)
            fprintf(stderr, "usage: link_probe BYTES RATE_BYTES_PER_S TOLERANCE [LATENCY_S "
                            "LATENCY_TOLERANCE]\n");
        MPI_Finalize();
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10);
    double rate = strtod(argv[2], NULL), tol = strtod(argv[3], NULL);
    double want_lat = argc == 6 ? strtod(argv[4], NULL) : 0;
    double lat_tol = argc == 6 ? strtod(argv[5], NULL) : 0;
    gcomp_mpi_comm *c = NULL;
    gcomp_error e = {0};
    double bw = 0, lat = 0;
    int rc = gcomp_mpi_comm_create(&c, MPI_COMM_WORLD, NULL, 60.0, &e) != GCOMP_OK ||
             gcomp_mpi_link_probe(c, bytes, 60.0, &bw, &lat, &e) != GCOMP_OK;
    if (rc) fprintf(stderr, "link_probe: rank %d: %s\n", rank, e.message);
    double mine[2] = {bw, lat}, *all = malloc(2 * (size_t)size * sizeof(double));
    MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int bad = 0;
    if (rank == 0)
        for (int r = 0; r < size; r++) {
            double b = all[2 * r], err = fabs(b / rate - 1);
            printf("link_probe: rank %d read %.2f MB/s (shaped %.2f MB/s, %+.0f %%), latency "
                   "%.2f ms\n",
                   r, b / 1e6, rate / 1e6, 100 * (b / rate - 1), 1e3 * all[2 * r + 1]);
            bad |= !(err <= tol);
            if (want_lat > 0) {
                double lerr = fabs(all[2 * r + 1] / want_lat - 1);
                printf("link_probe: rank %d latency %.2f ms against %.2f ms one way (%+.0f %%)\n",
                       r, 1e3 * all[2 * r + 1], 1e3 * want_lat,
                       100 * (all[2 * r + 1] / want_lat - 1));
                bad |= !(lerr <= lat_tol);
            }
        }
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(all);
    gcomp_mpi_comm_free(c);
    MPI_Finalize();
    return rc ? 2 : bad;
}

/*
 * test_mpi_ps_mxnet.c - MXNet's 2-bit gradient compression on the parameter-server path,
 * replayed step by step (issue 13).
 *
 * MXNet (src/kvstore/gradient_compression-inl.h, quantize_2bit / dequantize_2bit), with
 * compression_params={'type': '2bit', 'threshold': t}: on each worker, per element,
 *     r += g;  if (r >= t) { q = +t; r -= t; } else if (r <= -t) { q = -t; r += t; } else q = 0
 * the worker pushes q (2 bits), the dist_sync server dequantises every worker's push and
 * sums them, and every worker pulls the sum uncompressed.  Here every worker replays the
 * rule for all workers (the gradients are a function of step and worker) in float, and
 * checks after each step: its own residual (gcomp_mpi_ps_residual) equals the replay's bit
 * for bit, and the pulled values equal the sum of every worker's q bit for bit (sums of
 * +-t and 0 are exact in float in any order).  Keys of one part and keys cut into parts on
 * two servers (-np 5), gradients of both signs around the threshold.
 */
#include "test_mpi_ps_common.h"

#define STEPS 6
#define THRESHOLD 0.5f
static const size_t sizes[] = {7, 1000, 5000};
#define NT (sizeof sizes / sizeof sizes[0])

static void grad(float *g, size_t n, int step, int w, size_t k) {
    unsigned long long s = 0x2b17ull * (unsigned)step + 131ull * (unsigned)w + 7ull * k + 1;
    for (size_t i = 0; i < n; i++) g[i] = 0.6f * test_gauss(&s);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    ps_env E;
    ps_env_init(&E, mc_size >= 5 ? 2 : 1, 0, 60.0);
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = E.S;
    o.part_bytes = 4096; /* 5000 floats: five parts over the servers */
    gcomp_mpi_ps *ps = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_ps_create(&ps, E.world, &o, 30.0, &err));
    gcomp_mpi_tensor t[NT];
    char names[NT][16];
    for (size_t k = 0; k < NT; k++) {
        snprintf(names[k], sizeof names[k], "w%zu", k);
        /* MXNet's compression_params={'type': '2bit', 'threshold': 0.5} */
        t[k] = (gcomp_mpi_tensor){names[k], "twobit:threshold=0.5", sizes[k], 0, 0, GCOMP_MPI_PS};
    }
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL;
    CHECK_MSG(gcomp_mpi_bucket_create(&b, E.world, t, NT, &bo, 60.0, &err) == GCOMP_OK, "%s",
              err.message);
    if (E.server) {
        ps_serve_ok(ps, 60.0, "2bit");
    } else if (b) {
        float *r[NT], *x[NT], *g = malloc(5000 * sizeof(float)),
                              *mine = malloc(5000 * sizeof(float));
        float *sum = malloc(5000 * sizeof(float));
        for (size_t k = 0; k < NT; k++) {
            r[k] = calloc(sizes[k] * (size_t)E.W, sizeof(float)); /* every worker's residual */
            x[k] = malloc(sizes[k] * sizeof(float));
        }
        size_t nonzero = 0, total = 0;
        for (int step = 0; step < STEPS; step++) {
            for (size_t k = 0; k < NT; k++) grad(x[k], sizes[k], step, E.widx, k);
            CHECK_MSG(gcomp_mpi_allreduce(b, x, GCOMP_MPI_SUM, 60.0, &err) == GCOMP_OK, "%s",
                      err.message);
            for (size_t k = 0; k < NT; k++) {
                size_t n = sizes[k];
                memset(sum, 0, n * sizeof(float));
                for (int w = 0; w < E.W; w++) {
                    float *rw = r[k] + (size_t)w * n;
                    grad(g, n, step, w, k);
                    for (size_t i = 0; i < n; i++) { /* MXNet's quantize_2bit */
                        rw[i] += g[i];
                        float q = 0.0f;
                        if (rw[i] >= THRESHOLD) {
                            q = THRESHOLD;
                            rw[i] -= THRESHOLD;
                        } else if (rw[i] <= -THRESHOLD) {
                            q = -THRESHOLD;
                            rw[i] += THRESHOLD;
                        }
                        sum[i] += q; /* the server's dequantise-and-sum */
                    }
                }
                CHECK_OK(gcomp_mpi_ps_residual(b, k, mine));
                CHECK_MSG(!memcmp(mine, r[k] + (size_t)E.widx * n, n * sizeof(float)),
                          "step %d tensor %zu: worker residual differs from MXNet's rule", step, k);
                CHECK_MSG(!memcmp(x[k], sum, n * sizeof(float)),
                          "step %d tensor %zu: pulled sum differs from MXNet's", step, k);
                for (size_t i = 0; i < n; i++) nonzero += sum[i] != 0.0f;
                total += n;
            }
        }
        /* the replay exercised both outcomes */
        CHECK_MSG(nonzero > total / 10 && nonzero < total, "%zu of %zu sums non-zero", nonzero,
                  total);
        CHECK(gcomp_mpi_ps_part_count(b, 2) == 5);
        ps_shutdown_ok(ps, "2bit");
        for (size_t k = 0; k < NT; k++) {
            free(r[k]);
            free(x[k]);
        }
        free(g);
        free(mine);
        free(sum);
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
    ps_env_free(&E);
    return mc_done("test_mpi_ps_mxnet");
}

/*
 * test_mpi_ps.c - the parameter server in sync mode gives what the collective strategies
 * give (issue 13).  The last rank serves (two servers at -np 5); the others are workers, and
 * the workers alone also run the collective strategy on their own communicator with the
 * same gradients.
 *
 *   codecs    every codec family (dense f32/f16/bf16, top-k, threshold, sampled, random-k,
 *             bernoulli, importance, block, rows, cols, int8, int4, sign, twobit, ternary,
 *             qsgd, dgc): a key of one part gives bit for bit the allgather strategy's
 *             result (same decoders, same order, same scale) and the same worker residual;
 *             a key cut into parts equals the sum of its messages decoded in float64.
 *   SGD       server-side SGD (momentum, Nesterov, none; a learning-rate schedule sent with
 *             the pushes) gives bit for bit the weights of aggregate mode plus the
 *             reference trainer's update on the workers.
 *   device    hierarchical:ps with two workers per node (-np 5) equals hierarchical:allgather
 *             on the workers bit for bit.
 *   BytePS    compressed pulls (pull=same): pulled + server residual after - before equals
 *             the exact sum, for twobit and top-k.
 */
#include "test_mpi_ps_common.h"

#define STEPS 2
#define TIMEOUT 60.0

typedef struct shape {
    size_t n, rows, cols;
} shape;
/* Up to 1024 floats a key is one part (part_bytes 4096); 2000 and 4099 are cut. */
static const shape shapes[] = {
    {1, 1, 1}, {5, 1, 5}, {1001, 7, 143}, {2000, 40, 50}, {4099, 4099, 1}};
#define NT (sizeof shapes / sizeof shapes[0])

static const char *const specs[] = {
    "none",
    "none:values=f16",
    "none:values=bf16",
    "topk:density=0.05,feedback=ef",
    "topk:density=0.05,values=f16",
    "threshold:tau=0.8",
    "sampled:density=0.05",
    "randomk:density=0.1,seed=5",
    "bernoulli:density=0.3",
    "importance:density=0.2",
    "block:density=0.2,block=16",
    "rows:density=0.3",
    "cols:density=0.3",
    "int8",
    "int4:feedback=ef",
    "sign:feedback=ef",
    "twobit:threshold=0.5",
    "ternary",
    "qsgd:levels=16",
    "dgc:density=0.05",
};
#define NSPECS (sizeof specs / sizeof specs[0])

static ps_env E;

static void fill(float *x, size_t n, unsigned spec, unsigned step, int w) {
    test_fill(x, n, 1000003ull * spec + 7919ull * step + (unsigned)w);
}

static gcomp_mpi_ps *make_ps(gcomp_mpi_comm *c, const gcomp_mpi_ps_options *o) {
    gcomp_mpi_ps *ps = NULL;
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_ps_create(&ps, c, o, 30.0, &err) == GCOMP_OK, "ps_create: %s", err.message);
    return ps;
}

static gcomp_mpi_bucket *make_bucket(gcomp_mpi_comm *c, const char *spec, int strategy,
                                     gcomp_mpi_ps *ps, const char *tag) {
    gcomp_mpi_tensor t[NT];
    char names[NT][48];
    for (size_t k = 0; k < NT; k++) {
        snprintf(names[k], sizeof names[k], "%s%zu", tag, k);
        t[k] = (gcomp_mpi_tensor){names[k],       spec,           shapes[k].n,
                                  shapes[k].rows, shapes[k].cols, strategy};
    }
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.bucket_bytes = 8192; /* several sub-buckets */
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_bucket_create(&b, c, t, NT, &bo, TIMEOUT, &err);
    CHECK_MSG(st == GCOMP_OK, "%s [%s]: create: %s", spec, gcomp_mpi_strategy_name(strategy),
              err.message);
    return b;
}

/* ---- every codec family ------------------------------------------------------------------- */

static void codec_case(unsigned si, int strategy_ps, int strategy_ag, gcomp_mpi_comm *world,
                       gcomp_mpi_comm *wc) {
    const char *spec = specs[si];
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = E.S;
    o.part_bytes = 4096;
    gcomp_mpi_ps *ps = make_ps(world, &o);
    if (!ps) return;
    gcomp_mpi_bucket *pb = make_bucket(world, spec, strategy_ps, ps, "k");
    if (!pb) {
        gcomp_mpi_ps_free(ps);
        return;
    }
    if (E.server) {
        ps_serve_ok(ps, TIMEOUT, spec);
        gcomp_mpi_ps_stats s;
        gcomp_mpi_ps_stats_get(ps, -1, &s);
        CHECK_MSG(s.refused == 0 && s.pushes > 0, "%s: server refused %llu of %llu pushes", spec,
                  (unsigned long long)s.refused, (unsigned long long)s.pushes);
        gcomp_mpi_bucket_free(pb);
        CHECK_OK(gcomp_mpi_ps_free(ps));
        return;
    }
    gcomp_mpi_bucket *ab = make_bucket(wc, spec, strategy_ag, NULL, "k");
    float *A[NT], *B[NT];
    for (size_t k = 0; k < NT; k++) {
        A[k] = malloc(shapes[k].n * sizeof(float));
        B[k] = malloc(shapes[k].n * sizeof(float));
    }
    for (unsigned step = 0; step < STEPS && ab; step++) {
        for (size_t k = 0; k < NT; k++) {
            fill(A[k], shapes[k].n, si * 16 + (unsigned)k, step, E.widx);
            memcpy(B[k], A[k], shapes[k].n * sizeof(float));
        }
        gcomp_error e1 = {0}, e2 = {0};
        gcomp_status s1 = gcomp_mpi_allreduce(ab, A, GCOMP_MPI_AVERAGE, TIMEOUT, &e1);
        gcomp_status s2 = gcomp_mpi_allreduce(pb, B, GCOMP_MPI_AVERAGE, TIMEOUT, &e2);
        CHECK_MSG(s1 == GCOMP_OK, "%s: collective: %s", spec, e1.message);
        CHECK_MSG(s2 == GCOMP_OK, "%s: ps: %s", spec, e2.message);
        if (s1 != GCOMP_OK || s2 != GCOMP_OK) break;
        for (size_t k = 0; k < NT; k++) {
            size_t n = shapes[k].n;
            /* The same branch on every worker (hierarchical non-leaders have no parts). */
            long nparts = (long)gcomp_mpi_ps_part_count(pb, k);
            MPI_Allreduce(MPI_IN_PLACE, &nparts, 1, MPI_LONG, MPI_MAX, E.wcomm);
            if (nparts == 1) {
                /* One part: the allgather strategy's floats, bit for bit. */
                CHECK_MSG(!memcmp(A[k], B[k], n * sizeof(float)),
                          "%s: tensor %zu (n=%zu) step %u: ps differs from %s", spec, k, n, step,
                          gcomp_mpi_strategy_name(strategy_ag));
                if (gcomp_mpi_ps_part_count(pb, k) == 1) {
                    float *r = malloc(n * sizeof(float));
                    const float *ra = gcomp_compressor_residual(gcomp_mpi_compressor(ab, k));
                    CHECK_OK(gcomp_mpi_ps_residual(pb, k, r));
                    if (ra)
                        CHECK_MSG(!memcmp(ra, r, n * sizeof(float)), "%s: residual %zu", spec, k);
                    free(r);
                }
                continue;
            }
            /* Parts: the sum of every worker's messages (one per part), in float64. */
            double *ref = malloc(n * sizeof(double)), *abs_sum = malloc(n * sizeof(double));
            long msgs = mc_reference(E.wcomm, pb, k, n, ref, abs_sum);
            /* every pusher sends one message per part (hierarchical: node leaders only) */
            long want = (long)gcomp_mpi_message_count(pb, k), parts = want;
            MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_LONG, MPI_SUM, E.wcomm);
            MPI_Allreduce(MPI_IN_PLACE, &parts, 1, MPI_LONG, MPI_MAX, E.wcomm);
            CHECK_MSG(msgs == want && parts == nparts && want % nparts == 0,
                      "%s: tensor %zu: %ld messages, want %ld", spec, k, msgs, want);
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)B[k][i] - ref[i] / E.W) - 1e-5 * abs_sum[i] / E.W - 1e-30;
                if (d > worst) worst = d;
            }
            CHECK_MSG(worst <= 0, "%s: tensor %zu (%zu parts): off by %g", spec, k,
                      gcomp_mpi_ps_part_count(pb, k), worst);
            free(ref);
            free(abs_sum);
        }
    }
    ps_shutdown_ok(ps, spec);
    for (size_t k = 0; k < NT; k++) {
        free(A[k]);
        free(B[k]);
    }
    gcomp_mpi_bucket_free(ab);
    gcomp_mpi_bucket_free(pb);
    CHECK_OK(gcomp_mpi_ps_free(ps));
}

/* ---- server-side SGD ---------------------------------------------------------------------- */

#define SGD_N 3000
#define SGD_STEPS 5

/* The reference trainer's update (src/train/model.c, gtrain_sgd_step), on the workers. */
static void worker_sgd(float *w, float *v, const float *g, size_t n,
                       const gcomp_mpi_ps_optimizer *o, float lr) {
    const float r = o->rescale, wd = o->weight_decay, mu = o->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++) w[i] -= lr * (r * g[i] + wd * w[i]);
    } else if (o->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float d = r * g[i] + wd * w[i];
            float vi = mu * v[i] + d;
            v[i] = vi;
            w[i] -= lr * (d + mu * vi);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float vi = mu * v[i] + r * g[i] + wd * w[i];
            v[i] = vi;
            w[i] -= lr * vi;
        }
    }
}

static void sgd_case(const gcomp_mpi_ps_optimizer *opt, const char *spec) {
    float *w_ref = calloc(SGD_N, sizeof(float)), *v_ref = calloc(SGD_N, sizeof(float));
    float *g = malloc(SGD_N * sizeof(float)), *w_ps = malloc(SGD_N * sizeof(float));
    test_fill(w_ref, SGD_N, 4242);
    memcpy(w_ps, w_ref, SGD_N * sizeof(float));
    gcomp_mpi_tensor t = {"w", spec, SGD_N, 0, 0, GCOMP_MPI_PS};
    for (int update = 0; update < 2; update++) {
        gcomp_mpi_ps_options o;
        gcomp_mpi_ps_options_default(&o);
        o.servers = E.S;
        o.part_bytes = 4096; /* three parts */
        o.update = update;
        o.optimizer = *opt;
        gcomp_mpi_ps *ps = make_ps(E.world, &o);
        gcomp_mpi_bucket_options bo;
        gcomp_mpi_bucket_options_default(&bo);
        bo.ps = ps;
        gcomp_mpi_bucket *b = NULL;
        gcomp_error err = {0};
        CHECK_MSG(gcomp_mpi_bucket_create(&b, E.world, &t, 1, &bo, TIMEOUT, &err) == GCOMP_OK, "%s",
                  err.message);
        if (!b) return;
        if (E.server) {
            ps_serve_ok(ps, TIMEOUT, "sgd");
        } else {
            float *d[1] = {w_ps};
            if (update)
                CHECK_MSG(gcomp_mpi_ps_init(b, d, TIMEOUT, &err) == GCOMP_OK, "init: %s",
                          err.message);
            for (int s = 0; s < SGD_STEPS; s++) {
                float lr = opt->lr * (1.0f - 0.15f * (float)s); /* a schedule */
                gcomp_mpi_ps_set_lr(ps, lr);
                test_fill(g, SGD_N, 77ull * (unsigned)s + (unsigned)E.widx);
                float *x[1] = {update ? memcpy(w_ps, g, SGD_N * sizeof(float)) : g};
                CHECK_MSG(gcomp_mpi_allreduce(b, x, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK,
                          "step: %s", err.message);
                if (!update) worker_sgd(w_ref, v_ref, g, SGD_N, opt, lr);
            }
            if (update) {
                CHECK_MSG(!memcmp(w_ps, w_ref, SGD_N * sizeof(float)),
                          "server-side SGD (momentum %g, nesterov %d) differs from the workers'",
                          (double)opt->momentum, opt->nesterov);
                CHECK(gcomp_mpi_ps_version(b, 0) == SGD_STEPS);
                /* kv.pull returns the same weights */
                float *y = malloc(SGD_N * sizeof(float)), *py[1] = {y};
                CHECK_OK(gcomp_mpi_ps_pull(b, py, TIMEOUT, &err));
                CHECK(!memcmp(y, w_ref, SGD_N * sizeof(float)));
                free(y);
            }
            ps_shutdown_ok(ps, "sgd");
        }
        gcomp_mpi_bucket_free(b);
        gcomp_mpi_ps_free(ps);
    }
    free(w_ref);
    free(v_ref);
    free(g);
    free(w_ps);
}

/* ---- BytePS: compressed pulls with the server's error feedback ------------------------------ */

static void pull_case(const char *spec) {
    enum { N = 900 };
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = E.S;
    o.pull = "same";
    if (E.S > 1) o.part_bytes = 2048; /* a part per server: a server without one is refused */
    gcomp_mpi_ps *ps = make_ps(E.world, &o);
    gcomp_mpi_tensor t = {"p", spec, N, 0, 0, GCOMP_MPI_PS};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = ps;
    gcomp_mpi_bucket *b = NULL, *ab = NULL;
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_bucket_create(&b, E.world, &t, 1, &bo, TIMEOUT, &err) == GCOMP_OK, "%s",
              err.message);
    /* The reference: the same parts as tensors of their own, compressed alike. */
    size_t np = gcomp_mpi_ps_part_count(b, 0);
    CHECK(np == (size_t)E.S);
    gcomp_mpi_tensor ta[2] = {{"p0", spec, N / np, 0, 0, GCOMP_MPI_ALLGATHER},
                              {"p1", spec, N / np, 0, 0, GCOMP_MPI_ALLGATHER}};
    if (!E.server) CHECK_OK(gcomp_mpi_bucket_create(&ab, E.wc, ta, np, NULL, TIMEOUT, &err));
    float *res0 = calloc(N, sizeof(float)), *res1 = calloc(N, sizeof(float));
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int step = 0; step < 3; step++) {
        /* One step per session, so that the server can report its residual between them. */
        if (E.server) {
            ps_serve_ok(ps, TIMEOUT, "pull");
            const float *r = NULL;
            size_t off = 0, cnt = 0;
            gcomp_mpi_owner_residual(b, 0, &r, &off, &cnt);
            int has[3] = {r != NULL, (int)off, (int)cnt};
            MPI_Send(has, 3, MPI_INT, 0, 9, MPI_COMM_WORLD);
            if (has[0]) MPI_Send(r, (int)cnt, MPI_FLOAT, 0, 10, MPI_COMM_WORLD);
            continue;
        }
        test_fill(x, N, 99ull * (unsigned)step + (unsigned)E.widx);
        memcpy(y, x, sizeof(float) * N);
        float *px[2] = {x, x + N / np}, *py[1] = {y};
        CHECK_OK(gcomp_mpi_allreduce(ab, px, GCOMP_MPI_AVERAGE, TIMEOUT, &err));
        CHECK_MSG(gcomp_mpi_allreduce(b, py, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK, "%s",
                  err.message);
        ps_shutdown_ok(ps, "pull");
        if (E.widx == 0) {
            memcpy(res0, res1, sizeof(float) * N);
            int covered = 0;
            for (int s = 0; s < E.S; s++) {
                int has[3] = {0, 0, 0};
                MPI_Recv(has, 3, MPI_INT, E.W + s, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (!has[0]) continue; /* a pull codec without feedback keeps none */
                CHECK(has[1] >= 0 && has[2] > 0 && has[1] + has[2] <= N);
                MPI_Recv(res1 + has[1], has[2], MPI_FLOAT, E.W + s, 10, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                covered += has[2];
            }
            CHECK_MSG(covered == 0 || covered == N, "%s: the servers' residuals cover %d of %d",
                      spec, covered, N);
            /* e = sum + r0; pulled = C(e); r1 = e - pulled */
            double worst = 0, moved = 0;
            for (int i = 0; i < N; i++) {
                double d = fabs((double)y[i] + res1[i] - res0[i] - x[i]);
                worst = d > worst ? d : worst;
                moved += fabs((double)y[i] - x[i]);
            }
            CHECK_MSG(worst < 1e-4, "%s: pulled + residual change differs from the sum by %g", spec,
                      worst);
            CHECK_MSG(moved > 0, "%s: the pull was not compressed at all", spec);
        }
    }
    free(res0);
    free(res1);
    free(x);
    free(y);
    gcomp_mpi_bucket_free(ab);
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    int S = mc_size >= 5 ? 2 : 1;
    if (mc_size < 3) {
        if (mc_rank == 0) printf("test_mpi_ps: needs 3 ranks or more\n");
        MPI_Finalize();
        return 1;
    }
    ps_env_init(&E, S, 0, TIMEOUT);
    for (unsigned si = 0; si < NSPECS; si++)
        codec_case(si, GCOMP_MPI_PS, GCOMP_MPI_ALLGATHER, E.world, E.wc);

    gcomp_mpi_ps_optimizer opts[3] = {
        {0.05f, 0.9f, 1e-4f, 1.0f, 0}, {0.05f, 0.9f, 1e-4f, 0.5f, 1}, {0.1f, 0.0f, 0.0f, 1.0f, 0}};
    for (int k = 0; k < 3; k++) sgd_case(&opts[k], k == 2 ? "none" : "twobit:threshold=0.5");

    pull_case("twobit:threshold=0.5");
    pull_case("topk:density=0.1");
    ps_env_free(&E);

    /* dist_sync_device: two workers per node, the server alone in the last node. */
    if (mc_size == 5) {
        ps_env_init(&E, 1, 2, TIMEOUT);
        for (unsigned si = 0; si < NSPECS; si++)
            if (si == 0 || si == 3 || si == 8 || si == 16)
                codec_case(si, GCOMP_MPI_PS | GCOMP_MPI_HIERARCHICAL,
                           GCOMP_MPI_ALLGATHER | GCOMP_MPI_HIERARCHICAL, E.world, E.wc);
        ps_env_free(&E);
    }
    return mc_done("test_mpi_ps");
}

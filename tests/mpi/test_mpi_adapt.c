/*
 * test_mpi_adapt.c - adaptive compression across ranks:
 *  - gcomp_mpi_bucket_retune through every kind of switch (within allgather, to a dense
 *    allreduce and back, to PowerSGD, to a PowerSGD that sends dense, and back) keeps the
 *    exchange exact: over the ranks, sum of gradients = sum of results + what the
 *    compressors hold back, after every phase, and every rank ends each step with
 *    bit-identical results;
 *  - controllers fed different local timings and link speeds on every rank take the same
 *    decisions (gcomp_mpi_adapt_decide), applied live;
 *  - mismatched settings are an error on every rank, never wrong numbers: a local switch
 *    made by one rank only fails the next allreduce everywhere; a structural switch to
 *    different specs, or one a rank could not prepare, is refused everywhere and leaves
 *    the bucket as it was; ranks with another adaptive configuration fail the decision.
 */
#include "mpi_check.h"

#include <stdio.h>

/* The library's allocation-failure hook (tests only). */
GCOMP_API size_t gcomp__mpi_test_fail_alloc_after(size_t n);
GCOMP_API void gcomp__test_fail_alloc_after(size_t n); /* the core's allocations */

#define R1 100
#define C1 80
#define N1 (R1 * C1)
#define NB 80
#define R2 40
#define C2 80
#define N2 (R2 * C2)
#define NT 3
static const size_t n_of[NT] = {N1, NB, N2};

static float *data[NT];
static double *gsum[NT], *rsum[NT];
static uint64_t step_no;

static void gradients(void) {
    for (size_t i = 0; i < NT; i++) {
        unsigned long long s = 0x9e37ull * (step_no + 1) + 7919ull * (unsigned)mc_rank + i;
        for (size_t k = 0; k < n_of[i]; k++) {
            data[i][k] = test_gauss(&s) * (k % 13 == 0 ? 4.0f : 1.0f);
            gsum[i][k] += data[i][k];
        }
    }
    step_no++;
}

/* Results must be bit-identical on every rank. */
static int same_everywhere(void) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < NT; i++)
        for (size_t k = 0; k < n_of[i]; k++) {
            uint32_t u;
            memcpy(&u, &data[i][k], 4);
            h = (h ^ u) * 0x100000001b3ull;
        }
    uint64_t w[2] = {h, ~h};
    MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return w[0] == ~w[1];
}

static void steps(gcomp_mpi_bucket *b, int count, const char *what) {
    for (int s = 0; s < count; s++) {
        gradients();
        gcomp_error e = {0};
        gcomp_status st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e);
        CHECK_MSG(st == GCOMP_OK, "%s step %d: %s", what, s, e.message);
        CHECK_MSG(same_everywhere(), "%s step %d: results differ across ranks", what, s);
        for (size_t i = 0; i < NT; i++)
            for (size_t k = 0; k < n_of[i]; k++) rsum[i][k] += data[i][k];
    }
}

/* sum over ranks of (gradients - held back) == sum of results. */
static void conservation(gcomp_mpi_bucket *b, const char *what) {
    for (size_t i = 0; i < NT; i++) {
        size_t n = n_of[i];
        double *v = malloc(n * sizeof(double));
        float *held = calloc(n, sizeof(float));
        gcomp_compressor *c = gcomp_mpi_compressor(b, i);
        const float *r = c ? gcomp_compressor_residual(c) : NULL;
        if (r)
            memcpy(held, r, n * sizeof(float));
        else if (c)
            gcomp_lowrank_residual(c, held); /* PowerSGD; other codecs: unsupported, zeros */
        for (size_t k = 0; k < n; k++) v[k] = gsum[i][k] - held[k];
        MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double worst = 0, scale = 1e-30;
        for (size_t k = 0; k < n; k++) {
            worst = fmax(worst, fabs(v[k] - rsum[i][k]));
            scale = fmax(scale, fabs(v[k]));
        }
        CHECK_MSG(worst <= 1e-4 * scale, "%s, tensor %zu: sum g - held - sum results = %g (of %g)",
                  what, i, worst, scale);
        free(v);
        free(held);
    }
}

static void retune(gcomp_mpi_bucket *b, size_t i, const char *spec) {
    gcomp_error e = {0};
    gcomp_status st = gcomp_mpi_bucket_retune(b, i, spec, 30, &e);
    CHECK_MSG(st == GCOMP_OK, "retune %zu to %s: %s", i, spec, e.message);
}

/* Tensor 0 to a spec that sends it dense and keeps no residual: what was held back rides
 * in the next step, and after it nothing is. */
static void to_dense(gcomp_mpi_bucket *b, const char *spec) {
    retune(b, 0, spec);
    conservation(b, spec); /* right after the switch: what is held back is the carry */
    steps(b, 3, spec);
    conservation(b, spec);
    CHECK_MSG(gcomp_compressor_residual(gcomp_mpi_compressor(b, 0)) == NULL, "%s: not flushed",
              spec);
}

static void test_switches(gcomp_mpi_bucket *b) {
    steps(b, 4, "topk 0.05");
    conservation(b, "topk 0.05");
    retune(b, 0, "topk:density=0.01,feedback=ef"); /* local: allgather stays */
    retune(b, 2, "topk:density=0.02,values=f16,feedback=ef");
    steps(b, 4, "topk 0.01");
    conservation(b, "topk 0.01");
    to_dense(b, "none"); /* a dense allreduce */
    CHECK_EQ_INT(gcomp_mpi_bucket_strategy(b, 0), GCOMP_MPI_ALLREDUCE);
    retune(b, 0, "powersgd:rank=3");
    steps(b, 4, "powersgd");
    conservation(b, "powersgd");
    /* at rank 30 low rank does not pay for 100 x 80: every step dense, so E rides in the
     * next one (once refused: GCOMP_E_UNSUPPORTED, "cannot keep ... held back") */
    to_dense(b, "powersgd:rank=30");
    retune(b, 0, "powersgd:rank=3");
    steps(b, 2, "powersgd again");
    conservation(b, "powersgd again");
    retune(b, 0, "dgc:density=0.02,momentum=0");
    CHECK_EQ_INT(gcomp_mpi_bucket_strategy(b, 0), GCOMP_MPI_ALLGATHER);
    steps(b, 4, "dgc");
    conservation(b, "dgc");
    retune(b, 0, "topk:density=0.05,feedback=ef");
    retune(b, 0, "topk:density=0.05,feedback=ef"); /* the same spec: nothing happens */
    steps(b, 3, "topk again");
    conservation(b, "topk again");
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t specs_hash(const gcomp_adapt *a) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < NT; i++) h = fnv(h, gcomp_adapt_spec(a, i));
    return h;
}

/* Controllers for the bucket's three tensors (the weights managed, the bias not). */
static gcomp_adapt *make_adapt(const char *method, uint64_t total_steps) {
    gcomp_tensor_desc td[NT] = {{"w1", N1, R1, C1}, {"b1", NB, 0, 0}, {"w2", N2, R2, C2}};
    gcomp_adapt_options o = {0};
    o.workers = mc_size;
    o.total_steps = total_steps;
    o.min_elements = 1000;
    gcomp_adapt *a = NULL;
    gcomp_error e = {0};
    CHECK_MSG(gcomp_adapt_create(&a, method, td, NT, &o, &e) == GCOMP_OK, "%s: %s", method,
              e.message);
    return a;
}

/* Decisions from different local observations must agree, and be applied live. */
static void test_decisions(gcomp_mpi_comm *comm, gcomp_mpi_bucket *b) {
    gcomp_error e = {0};
    gcomp_adapt *a = make_adapt("adapt:bandwidth+layers+norm;base=topk:density=0.01,feedback=ef;"
                                "interval=3;measure=6;confirm=1;ladder=0.1/0.03/0.003/0.001",
                                60);
    if (!a) return;
    for (size_t i = 0; i < NT; i++) retune(b, i, gcomp_adapt_spec(a, i));
    size_t decisions = 0, switches = 0;
    for (int s = 0; s < 30; s++) {
        gradients();
        for (size_t i = 0; i < NT; i++) {
            gcomp_compressor *c = gcomp_mpi_compressor(b, i);
            CHECK_OK(gcomp_adapt_observe(a, i, data[i], c ? gcomp_compressor_residual(c) : NULL));
        }
        /* every rank its own clock and its own view of the link */
        gcomp_adapt_observe_compute(a, 0.001 * (mc_rank + 1), 0.002 + 0.0005 * mc_rank, 1e-4);
        gcomp_status st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e);
        CHECK_MSG(st == GCOMP_OK, "adaptive step %d: %s", s, e.message);
        for (size_t i = 0; i < NT; i++)
            for (size_t k = 0; k < n_of[i]; k++) rsum[i][k] += data[i][k];
        int due;
        gcomp_adapt_end_step(a, &due);
        if (!due) continue;
        double bw, lat;
        CHECK_OK(gcomp_mpi_link_probe(comm, 65536, 30, &bw, &lat, &e));
        CHECK(bw > 0 && lat > 0);
        /* rank-skewed measurements, and a link that gets 100x slower half-way */
        double slow = s < 15 ? 1.0 : 0.01;
        gcomp_adapt_observe_link(a, bw * slow * (1 + 0.37 * mc_rank), lat * (1 + mc_rank));
        size_t changed;
        st = gcomp_mpi_adapt_decide(comm, a, 30, &changed, &e);
        CHECK_MSG(st == GCOMP_OK, "decision: %s", e.message);
        decisions++;
        for (size_t i = 0; i < NT; i++) {
            const char *sp = gcomp_adapt_spec(a, i);
            CHECK_MSG(mc_same_everywhere(fnv(0xcbf29ce484222325ull, sp)),
                      "decision %zu: ranks chose different specs for tensor %zu", decisions, i);
            if (gcomp_adapt_changed(a, i)) {
                retune(b, i, sp);
                switches++;
            }
        }
    }
    CHECK_EQ_INT(decisions, 10);
    CHECK_MSG(switches > 0, "the controllers never switched a tensor");
    conservation(b, "adaptive run");

    /* a rank with another configuration fails the decision on every rank */
    gcomp_adapt *x = make_adapt(mc_rank == 1 ? "adapt:layers;interval=3;measure=6"
                                             : "adapt:layers;interval=3;measure=3",
                                60);
    if (x) {
        for (int s = 0; s < 3; s++) gcomp_adapt_end_step(x, NULL);
        CHECK_EQ_INT(gcomp_mpi_adapt_decide(comm, x, 30, NULL, &e), GCOMP_E_MISMATCH);
        gcomp_adapt_free(x);
    }
    gcomp_adapt_free(a);
}

/* A decision that one rank cannot take (out of memory: in the MPI layer before the
 * exchange, or in the controllers while they decide) fails on every rank, with the ranks'
 * decisions and specs still the same everywhere, and the next decision goes through.
 * The controllers' allocations come after the exchange: a rank whose decision stood puts
 * its state back. */
static void test_decide_nomem(gcomp_mpi_comm *comm) {
    gcomp_error e = {0};
    gcomp_adapt *a = make_adapt("adapt:layers+norm;base=topk:density=0.01,feedback=ef;interval=2;"
                                "measure=2;ladder=0.1/0.03/0.003/0.001",
                                400);
    if (!a) return;
    int failures = 0;
    for (int k = -1; k < 60; k++) { /* k: the allocation that fails on the last rank */
        for (int s = 0; s < 2; s++) {
            gradients();
            for (size_t i = 0; i < NT; i++) CHECK_OK(gcomp_adapt_observe(a, i, data[i], NULL));
            gcomp_adapt_end_step(a, NULL);
        }
        const int layer = k >= 0 && k < 4; /* the MPI layer's first allocations, then the core's */
        if (mc_rank == mc_size - 1 && k >= 0) {
            if (layer)
                gcomp__mpi_test_fail_alloc_after((size_t)k);
            else
                gcomp__test_fail_alloc_after((size_t)(k - 4));
        }
        gcomp_status st = gcomp_mpi_adapt_decide(comm, a, 30, NULL, &e);
        gcomp__mpi_test_fail_alloc_after((size_t)-1);
        gcomp__test_fail_alloc_after((size_t)-1);
        CHECK_MSG(mc_same_everywhere((uint64_t)st), "k=%d: rank %d: %s (%s)", k, mc_rank,
                  gcomp_status_str(st), e.message);
        CHECK(st == GCOMP_OK || st == GCOMP_E_NOMEM);
        CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK, "k=%d: %s", k, e.message);
        CHECK_MSG(mc_same_everywhere(specs_hash(a)), "k=%d: the ranks' specs differ", k);
        gcomp_adapt_report r;
        gcomp_adapt_get_report(a, &r);
        CHECK_MSG(mc_same_everywhere(r.decisions), "k=%d: the ranks' decision counts differ", k);
        failures += st != GCOMP_OK;
        if (st == GCOMP_OK && k > 4) break; /* past the decision's last allocation */
    }
    CHECK_MSG(failures > 4, "only %d decisions failed: the injection missed", failures);
    gcomp_adapt_free(a);
}

/* A retune while the last rank runs out of memory from its k-th allocation on (memory that
 * stays short: every later allocation fails too, until the hook is reset), for every k
 * until the retune needs no more: the ranks roll back together and the next allreduce works
 * on every rank.  A local (negotiated) retune may fail on that rank alone; the next call
 * then fails alike everywhere, with the communicator up.  The roll-back of a plan used to
 * allocate, and where that failed the bucket died on that rank alone: the others timed out
 * in their next call. */
static void retune_sweep(const char *from, const char *to, int strategy, int local) {
    gcomp_mpi_options mo;
    gcomp_mpi_options_default(&mo);
    mo.timeout_s = 5;
    gcomp_mpi_comm *comm = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, &mo, 5.0, &err));
    if (!comm) return;
    enum { NN = 1000 };
    gcomp_mpi_tensor t[2] = {{"a", from, NN, 0, 0, strategy}, {"b", from, NN, 0, 0, strategy}};
    static float x0[NN], x1[NN];
    float *d[2] = {x0, x1};
    for (int k = 0; k < 200; k++) {
        gcomp_mpi_bucket *b = NULL;
        CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, 2, NULL, 5.0, &err));
        if (!b) break;
        test_fill(x0, NN, 1);
        test_fill(x1, NN, 2);
        CHECK_OK(gcomp_mpi_allreduce(b, d, GCOMP_MPI_SUM, 5.0, &err));
        if (mc_rank == mc_size - 1) gcomp__mpi_test_fail_alloc_after((size_t)k);
        gcomp_error e = {0}, e2 = {0};
        gcomp_status rs = gcomp_mpi_bucket_retune(b, 0, to, 5.0, &e);
        size_t left = gcomp__mpi_test_fail_alloc_after((size_t)-1);
        test_fill(x0, NN, 3);
        test_fill(x1, NN, 4);
        gcomp_status st = gcomp_mpi_allreduce(b, d, GCOMP_MPI_SUM, 5.0, &e2);
        int failed = rs != GCOMP_OK;
        CHECK_MSG(local || mc_same_everywhere((uint64_t)failed),
                  "%s -> %s, k=%d: the retune failed on some ranks only (%s)", from, to, k,
                  e.message);
        CHECK_MSG(mc_same_everywhere((uint64_t)st) && (local || st == GCOMP_OK),
                  "%s -> %s, k=%d: the next allreduce: %s (%s)", from, to, k, gcomp_status_str(st),
                  e2.message);
        CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK, "%s -> %s, k=%d: %s", from, to, k,
                  e2.message);
        gcomp_mpi_bucket_free(b);
        /* the last rank's allocations left over: the retune needed fewer than k */
        if (mc_sweep_done(left)) break;
    }
    gcomp_mpi_comm_free(comm);
}

/* A link probe with the last rank out of memory from its k-th allocation on, for every k
 * until the probe needs fewer: every rank returns the same status (GCOMP_E_NOMEM while the
 * last rank is short, then GCOMP_OK), the communicator up.  The others used to wait in
 * the probe's first barrier until their timeout (k = 0: the pass's buffers), and at k >= 3
 * in a later barrier or the times' maximum, which allocated a request each.  Then a probe
 * goes through. */
static void probe_nomem(void) {
    gcomp_mpi_options mo;
    gcomp_mpi_options_default(&mo);
    mo.timeout_s = 5;
    gcomp_mpi_comm *comm = NULL;
    gcomp_error e = {0};
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, &mo, 5.0, &e));
    if (!comm || mc_size < 2) {
        gcomp_mpi_comm_free(comm);
        return;
    }
    double bw, lat;
    int k = 0;
    for (; k < 64; k++) {
        if (mc_rank == mc_size - 1) gcomp__mpi_test_fail_alloc_after((size_t)k);
        gcomp_status st = gcomp_mpi_link_probe(comm, 65536, 5.0, &bw, &lat, &e);
        size_t left = gcomp__mpi_test_fail_alloc_after((size_t)-1);
        CHECK_MSG(mc_same_everywhere((uint64_t)st) && (st == GCOMP_OK || st == GCOMP_E_NOMEM),
                  "probe, the last rank out of memory from allocation %d: %s (%s)", k,
                  gcomp_status_str(st), e.message);
        CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK, "k=%d: %s", k, e.message);
        if (mc_sweep_done(left)) break;
    }
    CHECK_MSG(k > 0 && k < 64, "the probe's allocations: %d", k);
    CHECK_OK(gcomp_mpi_link_probe(comm, 65536, 5.0, &bw, &lat, &e));
    gcomp_mpi_comm_free(comm);
}

static void test_mismatch(gcomp_mpi_bucket *b) {
    gcomp_error e = {0};
    retune(b, 0, "topk:density=0.05,feedback=ef");
    /* a local switch on one rank only: the next allreduce fails on every rank */
    if (mc_rank == 1) retune(b, 0, "topk:density=0.02,feedback=ef");
    gradients();
    gcomp_status st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e);
    CHECK_MSG(st == GCOMP_E_MISMATCH, "one rank switched alone: status %d (%s)", st, e.message);
    if (mc_rank == 1) retune(b, 0, "topk:density=0.05,feedback=ef");
    gradients();
    CHECK_OK(gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e));
    CHECK(same_everywhere());

    /* a structural switch to different specs: refused everywhere, bucket unchanged */
    st = gcomp_mpi_bucket_retune(b, 0, mc_rank == 1 ? "none" : "none:values=f16", 30, &e);
    CHECK_MSG(st == GCOMP_E_MISMATCH, "structural switch to different specs: %d (%s)", st,
              e.message);
    CHECK(strstr(gcomp_mpi_worker_spec(b, 0), "topk:density=0.05") != NULL);
    CHECK_EQ_INT(gcomp_mpi_bucket_strategy(b, 0), GCOMP_MPI_ALLGATHER);
    gradients();
    CHECK_OK(gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e));
    CHECK(same_everywhere());

    /* a rank that cannot prepare the switch (out of memory) makes every rank refuse it */
    if (mc_rank == 1) gcomp__mpi_test_fail_alloc_after(0);
    st = gcomp_mpi_bucket_retune(b, 0, "none", 30, &e);
    if (mc_rank == 1) gcomp__mpi_test_fail_alloc_after((size_t)-1);
    CHECK_MSG(st == (mc_rank == 1 ? GCOMP_E_NOMEM : GCOMP_E_MISMATCH), "rank %d: %d (%s)", mc_rank,
              st, e.message);
    CHECK_EQ_INT(gcomp_mpi_bucket_strategy(b, 0), GCOMP_MPI_ALLGATHER);
    gradients();
    CHECK_OK(gcomp_mpi_allreduce(b, data, GCOMP_MPI_SUM, 30, &e));
    CHECK(same_everywhere());

    /* bad input: the same error on every rank, nothing changes */
    CHECK_EQ_INT(gcomp_mpi_bucket_retune(b, 0, "topk:densty=1", 30, &e), GCOMP_E_SPEC);
    CHECK_EQ_INT(gcomp_mpi_bucket_retune(b, 7, "none", 30, &e), GCOMP_E_ARG);
    CHECK_EQ_INT(gcomp_mpi_bucket_retune(b, 0, "powersgd:rank=2", 30, &e), GCOMP_OK);
    CHECK_EQ_INT(gcomp_mpi_bucket_retune(b, 1, "powersgd:rank=2", 30, &e), GCOMP_OK);
}

/* A probe whose ranks disagree on the size (one rank waits for chunks nobody sends) ends
 * in an error on every rank within the timeout, never a hang; the communicator is failed
 * afterwards, and freeing it frees or keeps what MPI may still write into. */
static void test_probe_fail(void) {
    gcomp_mpi_comm *c;
    gcomp_error e = {0};
    CHECK_OK(gcomp_mpi_comm_create(&c, MPI_COMM_WORLD, NULL, 30, &e));
    if (!c) return;
    double bw = -1, lat = -1, t0 = MPI_Wtime();
    gcomp_status st =
        gcomp_mpi_link_probe(c, mc_rank == 1 ? (size_t)1 << 17 : (size_t)1 << 16, 2, &bw, &lat, &e);
    double took = MPI_Wtime() - t0;
    CHECK_MSG(st == GCOMP_E_TIMEOUT || st == GCOMP_E_MPI, "rank %d: probe of mismatched sizes: %s",
              mc_rank, e.message);
    CHECK_MSG(strstr(e.message, "link probe") != NULL, "rank %d: %s", mc_rank, e.message);
    CHECK_MSG(took < 20, "rank %d: the failed probe took %.1f s", mc_rank, took);
    CHECK(bw == 0 && lat == 0);
    CHECK_EQ_INT(gcomp_mpi_link_probe(c, 65536, 2, &bw, &lat, &e), GCOMP_E_FAILED);
    gcomp_mpi_comm_free(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    for (size_t i = 0; i < NT; i++) {
        data[i] = malloc(n_of[i] * sizeof(float));
        gsum[i] = calloc(n_of[i], sizeof(double));
        rsum[i] = calloc(n_of[i], sizeof(double));
    }
    gcomp_mpi_comm *comm;
    gcomp_error e = {0};
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 30, &e));
    gcomp_mpi_tensor t[NT] = {{"w1", "topk:density=0.05,feedback=ef", N1, R1, C1, 0},
                              {"b1", "none", NB, 0, 0, 0},
                              {"w2", "topk:density=0.05,feedback=ef", N2, R2, C2, 0}};
    gcomp_mpi_bucket *b;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, NT, NULL, 30, &e));
    if (b) {
        test_switches(b);
        test_decisions(comm, b);
        test_mismatch(b);
        test_decide_nomem(comm);
        gcomp_mpi_bucket_free(b);
    }
    gcomp_mpi_comm_free(comm);
    test_probe_fail();
    probe_nomem();
    retune_sweep("none", "none:values=f16", GCOMP_MPI_AUTO, 0);                 /* structural */
    retune_sweep("topk:density=0.1", "topk:density=0.05", GCOMP_MPI_SPARSE, 1); /* local */
    for (size_t i = 0; i < NT; i++) {
        free(data[i]);
        free(gsum[i]);
        free(rsum[i]);
    }
    return mc_done("test_mpi_adapt");
}

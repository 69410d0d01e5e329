/*
 * test_cost.c - the cost model (gradcomp.h, "Cost model") against values computed by
 * hand: each strategy's traffic law, the alpha-beta time, the overlap with backward, the
 * break-even bandwidth, the calibration's text form, and the errors.  The byte counts are
 * checked against the MPI layer's own counters in tests/mpi/test_cost_bytes.sh.
 */
#include "check.h"

#include "adapt/cost_internal.h"
#include "gradcomp.h"

#include <math.h>
#include <string.h>

static double rel(double a, double b) {
    return fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1);
}

/* One tensor: its model's bytes and result on a net with latency 0, bandwidth B. */
static int one(const char *spec, size_t n, size_t rows, size_t cols, int strategy, int P, double B,
               const gcomp_cost_calibration *cal, gcomp_cost_result *r,
               gcomp_cost_tensor_result *tr) {
    gcomp_cost_tensor t = {"t", spec, n, rows, cols, strategy, 0, 0};
    gcomp_cost_model *m = NULL;
    gcomp_error e = {0};
    int st = gcomp_cost_model_create(&m, &t, 1, P, P, cal, &e);
    if (st != GCOMP_OK) {
        fprintf(stderr, "create %s: %s\n", spec, e.message);
        return st;
    }
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = P;
    net.nodes = P;
    net.inter.bandwidth = B;
    net.inter.latency = 0;
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    st = gcomp_cost_eval(m, &net, &c, r, tr);
    gcomp_cost_model_free(m);
    return st;
}

static size_t est(const char *spec, size_t n) {
    size_t b = 0;
    gcomp_spec_bytes_estimate(spec, n, 0, 0, &b, NULL);
    return b;
}

static void test_laws(void) {
    gcomp_cost_result r;
    gcomp_cost_tensor_result tr;
    /* Ring allreduce of 1M f32 over 4 ranks: 2*3/4 * 4e6 = 6e6 bytes, 6e6 / 1e8 s. */
    CHECK_OK(one("none", 1000000, 0, 0, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_MSG(r.bytes_sent == 6e6, "%.17g", r.bytes_sent);
    CHECK_MSG(rel(tr.comm_s, 0.06) < 1e-12, "%.17g", tr.comm_s);
    /* f16: half of it. */
    CHECK_OK(one("none:values=f16", 1000000, 0, 0, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_MSG(r.bytes_sent == 3e6, "%.17g", r.bytes_sent);
    /* Below 256 KiB: MPI_Iallreduce with 24 check bytes, floor(1.5 * 4024) = 6036; time
     * by libnbc's binomial reduce + broadcast (an in-place MPI_Iallreduce takes it at any
     * size), 2 log2(4) = 4 steps of the whole 4024 bytes. */
    CHECK_OK(one("none", 1000, 0, 0, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_EQ_INT(r.bytes_sent, 6036);
    CHECK_MSG(rel(tr.comm_s, 4 * 4024 / 1e8) < 1e-12, "%.17g", tr.comm_s);
    /* Over 32 KiB the pack goes in slices, all in flight at once (gm_start_pack_reduce):
     * 160000 bytes in 5.  The root's link carries log2(4) packs each way, the broadcast of
     * one slice beside the reduction of the next, and one slice more fills the pipe. */
    CHECK_OK(one("none", 40000, 0, 0, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_MSG(rel(tr.comm_s, 2 * 160024 * 1.2 / 1e8) < 1e-12, "%.17g", tr.comm_s);
    /* 200000 bytes on 2 ranks: 7 slices, one reduction and one broadcast hop. */
    CHECK_OK(one("none", 50000, 0, 0, GCOMP_COST_ALLREDUCE, 2, 1e8, NULL, &r, &tr));
    CHECK_MSG(rel(tr.comm_s, 200024 * (1 + 1 / 7.0) / 1e8) < 1e-12, "%.17g", tr.comm_s);
    /* PowerSGD's factors take the same path at any size, in at most 16 slices: P of
     * 65536 x 4 f32 (1 MiB, 32 slices' worth) in 16, Q (1 KiB) in one. */
    CHECK_OK(
        one("powersgd:rank=4", 65536 * 64, 65536, 64, GCOMP_COST_ALLREDUCE, 2, 1e8, NULL, &r, &tr));
    CHECK_MSG(rel(tr.comm_s, ((1048576 + 24) * (1 + 1 / 16.0) + 2 * (1024 + 8)) / 1e8) < 1e-12,
              "%.17g", tr.comm_s);
    /* One rank: nothing travels. */
    CHECK_OK(one("none", 1000, 0, 0, GCOMP_COST_ALLREDUCE, 1, 1e8, NULL, &r, &tr));
    CHECK_EQ_INT(r.bytes_sent, 0);
    CHECK(tr.comm_s == 0);

    /* Allgather grows with P: 8(P-1) size words + (P-1) messages. */
    const char *tk = "topk:density=0.01";
    double m = (double)est(tk, 100000);
    CHECK(m > 1000);
    for (int P = 2; P <= 64; P *= 2) {
        CHECK_OK(one(tk, 100000, 0, 0, GCOMP_COST_ALLGATHER, P, 1e8, NULL, &r, &tr));
        CHECK_MSG(r.bytes_sent == 8.0 * (P - 1) + (P - 1) * m, "P=%d %.17g", P, r.bytes_sent);
        CHECK(tr.message_bytes == m);
    }

    /* rsag: 16(P-1) + 2(P-1)/P * sum of the P chunk messages; 1000003 elements over 4:
     * chunks of 250000, 250001, 250001, 250001 (floor((j+1)n/P) - floor(jn/P)). */
    double c0 = (double)est("int8", 250000), c1 = (double)est("int8", 250001);
    double sum = c0 + 3 * c1;
    CHECK_OK(one("int8", 1000003, 0, 0, GCOMP_COST_RSAG, 4, 1e8, NULL, &r, &tr));
    CHECK_MSG(rel(r.bytes_sent, 48 + 1.5 * sum) < 1e-15, "%.17g vs %.17g", r.bytes_sent,
              48 + 1.5 * sum);

    /* PowerSGD rank 4 on 1000x500, 4 ranks: per iteration floor(1.5 (1000*4*4 + 24)) +
     * floor(1.5 (500*4*4 + 8)) = 24036 + 12012; iters=2 adds floor(1.5 (16000+8)) + 12012. */
    CHECK_OK(
        one("powersgd:rank=4", 500000, 1000, 500, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_EQ_INT(r.bytes_sent, 24036 + 12012);
    CHECK_OK(one("powersgd:rank=4,iters=2", 500000, 1000, 500, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL,
                 &r, &tr));
    CHECK_EQ_INT(r.bytes_sent, 24036 + 12012 + 24012 + 12012);
    /* A vector goes dense: the f32 ring of 2e6 bytes. */
    CHECK_OK(one("powersgd:rank=4", 500000, 0, 0, GCOMP_COST_ALLREDUCE, 4, 1e8, NULL, &r, &tr));
    CHECK_MSG(r.bytes_sent == 1.5 * 2e6, "%.17g", r.bytes_sent);

    /* Sparse allreduce stays bounded as P grows, where allgather grows linearly. */
    gcomp_cost_result ra, rs;
    CHECK_OK(one(tk, 1 << 20, 0, 0, GCOMP_COST_ALLGATHER, 64, 1e8, NULL, &ra, &tr));
    CHECK_OK(one(tk, 1 << 20, 0, 0, GCOMP_COST_SPARSE, 64, 1e8, NULL, &rs, &tr));
    CHECK_MSG(rs.bytes_sent < 3 * (double)est(tk, 1 << 20) && ra.bytes_sent > 10 * rs.bytes_sent,
              "sparse %.0f allgather %.0f", rs.bytes_sent, ra.bytes_sent);
    /* Fill-in: at density 0.9 every region's slice goes dense (8 + 4 * region). */
    CHECK_OK(one("topk:density=0.9", 1 << 20, 0, 0, GCOMP_COST_SPARSE, 4, 1e8, NULL, &rs, &tr));
    double own = (double)est("topk:density=0.9", 1 << 18);
    CHECK_MSG(rel(rs.bytes_sent, 48 + 3 * (8 + 4.0 * (1 << 18)) + 3 * own) < 1e-12, "%.17g",
              rs.bytes_sent);

    /* Parameter server: the worker pushes its message and pulls the dense sum; the
     * servers' NICs carry P/S of it. */
    gcomp_cost_tensor t = {"t", tk, 100000, 0, 0, GCOMP_COST_PS, 0, 0};
    gcomp_cost_model *pm;
    CHECK_OK(gcomp_cost_model_create(&pm, &t, 1, 8, 8, NULL, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 8;
    net.inter.bandwidth = 1e8;
    net.inter.latency = 0;
    net.servers = 2;
    gcomp_cost_compute c0c = {0, 0, 0, 1, 0};
    CHECK_OK(gcomp_cost_eval(pm, &net, &c0c, &r, &tr));
    CHECK(r.bytes_sent == (double)est(tk, 100000));
    CHECK_MSG(rel(tr.comm_s, 8.0 / 2 * 4e5 / 1e8) < 1e-12, "%.17g", tr.comm_s);
    gcomp_cost_model_free(pm);
}

static void test_hierarchical(void) {
    /* 8 ranks on 2 nodes: 2 rounds of 4n inside the node each way, then the allreduce
     * between the 2 leaders: bytes 2*1/2*4n = 4n, node bytes 2*2*4n. */
    size_t n = 1 << 20;
    gcomp_cost_tensor t = {"t", "none", n, 0, 0, GCOMP_COST_ALLREDUCE | GCOMP_COST_HIERARCHICAL,
                           0,   0};
    gcomp_cost_model *m;
    CHECK_OK(gcomp_cost_model_create(&m, &t, 1, 8, 2, NULL, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = 8;
    net.nodes = 2;
    net.inter = (gcomp_cost_link){1e8, 0, 0};
    net.intra = (gcomp_cost_link){1e10, 0, 0};
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    gcomp_cost_result r;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, NULL));
    CHECK(r.bytes_sent == 4.0 * n);
    CHECK(r.node_bytes == 16.0 * n);
    double want = 4.0 * n / 1e8 + 2 * 2 * 4.0 * n / 1e10;
    CHECK_MSG(rel(r.comm_s, want) < 1e-12, "%.17g vs %.17g", r.comm_s, want);
    gcomp_cost_model_free(m);
}

/* A calibration in which dense f32 costs nothing: only the link's time is left. */
static gcomp_cost_calibration *free_dense(void) {
    gcomp_cost_calibration *cal = NULL;
    CHECK_OK(gcomp_cost_calibration_create(&cal));
    gcomp_cost_codec_rate zero = {"none", 0, 0, 0, 0, 0};
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &zero, NULL));
    return cal;
}

/* Overlap: two equal tensors, backward 1 s; the later layer's gradient is final after
 * 0.5 s and its 0.4 s transfer hides in the remaining 0.5 s; the first layer's does not. */
static void test_overlap(void) {
    gcomp_cost_tensor t[2] = {{"a", "none", 1 << 20, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
                              {"b", "none", 1 << 20, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_calibration *cal = free_dense();
    gcomp_cost_model *m;
    CHECK_OK(gcomp_cost_model_create(&m, t, 2, 2, 2, cal, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 2;
    double comm = 0.4, B = 4.0 * (1 << 20) / comm; /* 2 ranks: the ring sends 4n bytes */
    net.inter = (gcomp_cost_link){B, 0, 0};
    gcomp_cost_compute c = {0.25, 1.0, 0.1, 1.0, 0};
    gcomp_cost_result r;
    gcomp_cost_tensor_result tr[2];
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, tr));
    CHECK(r.calibrated == 2);
    /* b ready at 0.75, on the wire until 1.15, decoded once backward ends (1.25); a ready
     * at 1.25, done 1.65; + optimizer 0.1 */
    CHECK_MSG(rel(tr[1].ready_s, 0.75) < 1e-12 && rel(tr[1].done_s, 1.25) < 1e-12, "%.17g %.17g",
              tr[1].ready_s, tr[1].done_s);
    CHECK_MSG(rel(r.step_s, 1.75) < 1e-12, "%.17g", r.step_s);
    CHECK_MSG(rel(r.exposed_s, 0.4) < 1e-12, "%.17g", r.exposed_s);
    /* overlap 0: b's transfer waits for the worker: 1.25 + 0.8 + 0.1. */
    c.overlap = 0;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, NULL));
    CHECK_MSG(rel(r.step_s, 2.15) < 1e-12, "%.17g", r.step_s);
    /* Pure: the same inputs give the same bits. */
    gcomp_cost_result r2;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r2, NULL));
    CHECK(memcmp(&r, &r2, sizeof r) == 0);
    gcomp_cost_model_free(m);
    gcomp_cost_calibration_free(cal);
}

/* Creates the model of t[0..count) on 2 ranks (2 nodes), evaluates it into *r and per (may
 * be NULL), frees it. */
static void eval2(const gcomp_cost_tensor *t, size_t count, const gcomp_cost_calibration *cal,
                  const gcomp_cost_net *net, const gcomp_cost_compute *c, gcomp_cost_result *r,
                  gcomp_cost_tensor_result *per) {
    gcomp_cost_model *m;
    CHECK_OK(gcomp_cost_model_create(&m, t, count, 2, 2, cal, NULL));
    CHECK_OK(gcomp_cost_eval(m, net, c, r, per));
    gcomp_cost_model_free(m);
}

/* The setting of test_overlap (backward 1 s, forward 0.25, optimizer 0.1, a 0.4 s transfer
 * a tensor) with the backward spread by work and the two tensors in one bucket. */
static void test_work_and_buckets(void) {
    size_t n = 1 << 20;
    gcomp_cost_tensor t[3] = {{"a", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 1, 0},
                              {"b", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 3, 0},
                              {"c", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_calibration *cal = free_dense();
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 2;
    double comm = 0.4, B = 4.0 * (double)n / comm;
    net.inter = (gcomp_cost_link){B, 0, 0};
    gcomp_cost_compute c = {0.25, 1.0, 0.1, 1.0, 0};
    gcomp_cost_result r;
    gcomp_cost_tensor_result tr[2];
    gcomp_cost_model *m;
    /* Work 1 and 3: b (last layer) is final after 0.75 s of backward, at 1.0, on the wire
     * until 1.4; a is final at 1.25 and waits for the link: done 1.8, step 1.9.  By elements
     * (test_overlap) the step is 1.75. */
    eval2(t, 2, cal, &net, &c, &r, tr);
    CHECK_MSG(rel(tr[1].ready_s, 1.0) < 1e-12, "%.17g", tr[1].ready_s);
    CHECK_MSG(rel(r.step_s, 1.9) < 1e-12, "%.17g", r.step_s);
    /* A tensor of work 0 is final with the one before it in backward order: c at 0.25. */
    gcomp_cost_tensor_result tr3[3];
    eval2(t, 3, cal, &net, &c, &r, tr3);
    CHECK_MSG(rel(tr3[2].ready_s, 0.25) < 1e-12, "%.17g", tr3[2].ready_s);
    /* One bucket: one message of 2n, carried by a and sent once a is final (1.25): 0.8 s on
     * the wire, step 2.15; with a latency the bucket pays it once, the pair twice. */
    t[0].bucket = t[1].bucket = 7;
    net.inter.latency = 0.01;
    eval2(t, 2, cal, &net, &c, &r, tr);
    CHECK(tr[0].bytes_sent == 8.0 * (double)n && tr[1].bytes_sent == 0);
    CHECK(r.bytes_sent == 8.0 * (double)n);
    CHECK_MSG(rel(r.comm_s, 0.8 + 2 * 0.01) < 1e-12, "%.17g", r.comm_s);
    CHECK_MSG(rel(r.step_s, 2.15 + 2 * 0.01) < 1e-12, "%.17g", r.step_s);
    t[0].bucket = t[1].bucket = 0;
    eval2(t, 2, cal, &net, &c, &r, NULL);
    CHECK_MSG(rel(r.comm_s, 0.8 + 4 * 0.01) < 1e-12, "%.17g", r.comm_s);

    /* A bucket need not be adjacent: c (work 0) is final at 0.25 but travels with a, once a
     * is final (1.25).  b goes alone first, 1.0 to 1.42 (0.4 s and two ring latencies of
     * 0.01); a+c then wait for the link: 1.42 to 2.24; step 2.34. */
    t[0].bucket = t[2].bucket = 1;
    eval2(t, 3, cal, &net, &c, &r, tr3);
    CHECK(tr3[0].bytes_sent == 8.0 * (double)n && tr3[2].bytes_sent == 0);
    CHECK_MSG(rel(r.comm_s, 1.2 + 4 * 0.01) < 1e-12, "%.17g", r.comm_s);
    CHECK_MSG(rel(r.step_s, 2.34) < 1e-12, "%.17g", r.step_s);
    t[0].bucket = t[2].bucket = 0;
    net.inter.latency = 0;

    /* Refused, naming the tensor: a bad work, or a bucket whose transfers do not line up or
     * that holds a strategy other than allreduce and allgather. */
    gcomp_error e = {0};
    t[1].work = -1;
    CHECK(gcomp_cost_model_create(&m, t, 2, 2, 2, cal, &e) == GCOMP_E_ARG && !m);
    CHECK_MSG(strstr(e.message, "'b'") && strstr(e.message, "work"), "%s", e.message);
    t[1].work = NAN;
    CHECK(gcomp_cost_model_create(&m, t, 2, 2, 2, cal, &e) == GCOMP_E_ARG);
    t[1].work = 3;
    t[0].bucket = t[1].bucket = 1;
    t[1].spec = "none:values=f32"; /* the same spec as "none", written out */
    CHECK_OK(gcomp_cost_model_create(&m, t, 2, 2, 2, cal, &e));
    gcomp_cost_model_free(m);
    /* PowerSGD tensors of one spec under one hierarchical strategy, one of them a vector the
     * codec sends dense: their transfers do not line up (the hook's buckets are flat). */
    gcomp_cost_tensor p[2] = {
        {"p", "powersgd:rank=2", 1 << 16, 256, 256, GCOMP_COST_ALLREDUCE | GCOMP_COST_HIERARCHICAL,
         0, 2},
        {"v", "powersgd:rank=2", 256, 0, 0, GCOMP_COST_ALLREDUCE | GCOMP_COST_HIERARCHICAL, 0, 2}};
    CHECK(gcomp_cost_model_create(&m, p, 2, 4, 2, cal, &e) == GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "'v'") && strstr(e.message, "bucket 2") &&
                  strstr(e.message, "line up"),
              "%s", e.message);
    gcomp_cost_tensor s2[2] = {{"s", "topk:density=0.01", 4096, 0, 0, GCOMP_COST_SPARSE, 0, 4},
                               {"u", "topk:density=0.01", 4096, 0, 0, GCOMP_COST_SPARSE, 0, 4}};
    CHECK(gcomp_cost_model_create(&m, s2, 2, 2, 2, cal, &e) == GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "'s'") && strstr(e.message, "allgather"), "%s", e.message);
    gcomp_cost_tensor mixed[2] = {{"g", "none", 4096, 0, 0, GCOMP_COST_ALLGATHER, 0, 5},
                                  {"h", "topk:density=0.01", 4096, 0, 0, GCOMP_COST_SPARSE, 0, 5}};
    CHECK(gcomp_cost_model_create(&m, mixed, 2, 2, 2, cal, &e) == GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "'h'") && strstr(e.message, "allgather"), "%s", e.message);
    /* One exchange is a way to gather: refused on any other strategy. */
    mixed[1].strategy = GCOMP_COST_ALLREDUCE | GCOMP_COST_ONE_EXCHANGE;
    mixed[1].bucket = 0;
    CHECK(gcomp_cost_model_create(&m, mixed + 1, 1, 2, 2, cal, &e) == GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "'h'") && strstr(e.message, "one-exchange"), "%s", e.message);
    gcomp_cost_calibration_free(cal);
}

/* Tensors t[0..n) on P ranks (1e8 B/s, 1 ms a latency, overlap 0) sent alone, then all in
 * one bucket: both results and, where per_* are not NULL, per tensor. */
static void alone_and_fused(gcomp_cost_tensor *t, size_t n, int P, gcomp_cost_result *alone,
                            gcomp_cost_result *fused, gcomp_cost_tensor_result *per_alone,
                            gcomp_cost_tensor_result *per_fused) {
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = P;
    net.inter = (gcomp_cost_link){1e8, 1e-3, 0};
    gcomp_cost_compute c = {0.01, 0.02, 0.005, 0, 0};
    gcomp_cost_model *m;
    for (int f = 0; f < 2; f++) {
        for (size_t i = 0; i < n; i++) t[i].bucket = f ? 9 : 0;
        CHECK_OK(gcomp_cost_model_create(&m, t, n, P, P, NULL, NULL));
        CHECK_OK(gcomp_cost_eval(m, &net, &c, f ? fused : alone, f ? per_fused : per_alone));
        gcomp_cost_model_free(m);
    }
}

/* A PowerSGD bucket, as the DDP hook sends one: each round's P factors of all its matrices
 * in one allreduce and the Qs in another, a vector the codec sends dense riding in the
 * first.  On 2 ranks each allreduce is 2 steps (binomial reduce + broadcast): the two
 * matrices and the vector pay 4 + 4 + 2 latencies alone, 4 in the bucket. */
static void test_powersgd_bucket(void) {
    gcomp_cost_tensor p[3] = {
        {"p", "powersgd:rank=2", 1 << 16, 256, 256, GCOMP_COST_ALLREDUCE, 0, 0},
        {"v", "powersgd:rank=2", 256, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
        {"q", "powersgd:rank=2", 1 << 16, 256, 256, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_result alone, fused;
    alone_and_fused(p, 3, 2, &alone, &fused, NULL, NULL);
    CHECK(rel(fused.bytes_sent, alone.bytes_sent) < 1e-12);
    CHECK(rel(fused.codec_s, alone.codec_s) < 1e-12);
    /* (the vector rides without its own 24 check bytes: 0.24 us) */
    CHECK_MSG(fabs(alone.comm_s - fused.comm_s - 6e-3) < 1e-6, "%.17g",
              alone.comm_s - fused.comm_s);
    /* A bucket of PowerSGD tensors that all go dense is one vector, whatever its order:
     * priced as the same bucket of `none` (on 8 ranks the small vector alone would take
     * recursive doubling's law, the large one the ring's). */
    gcomp_cost_tensor v[2] = {
        {"small", "powersgd:rank=2", 1000, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
        {"large", "powersgd:rank=2", 200000, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_result a1, f1, a2, f2, fn;
    alone_and_fused(v, 2, 8, &a1, &f1, NULL, NULL);
    gcomp_cost_tensor swap = v[0];
    v[0] = v[1];
    v[1] = swap;
    alone_and_fused(v, 2, 8, &a2, &f2, NULL, NULL);
    v[0].spec = v[1].spec = "none";
    alone_and_fused(v, 2, 8, &a2, &fn, NULL, NULL);
    CHECK_MSG(rel(f1.comm_s, f2.comm_s) < 1e-12 && rel(f1.comm_s, fn.comm_s) < 1e-12,
              "%.17g %.17g %.17g", f1.comm_s, f2.comm_s, fn.comm_s);
}

/* The allgather zeroes its output while the messages travel (mpi_allgather.c, ag_zero):
 * that pass runs beside the transfer, so a tensor alone takes encode + max(transfer,
 * zeroing) + decode, whichever of the two is longer. */
static void test_hidden_work(void) {
    gcomp_cost_result r;
    gcomp_cost_tensor_result tr;
    for (int slow = 0; slow < 2; slow++) {
        double B = slow ? 1e6 : 1e12;
        CHECK_OK(
            one("topk:density=0.01", 1000000, 0, 0, GCOMP_COST_ALLGATHER, 2, B, NULL, &r, &tr));
        CHECK(tr.hidden_s > 0 && (slow ? tr.comm_s > tr.hidden_s : tr.comm_s < tr.hidden_s));
        CHECK_MSG(rel(r.step_s, tr.encode_s + fmax(tr.comm_s, tr.hidden_s) + tr.decode_s) < 1e-12,
                  "%.17g", r.step_s);
        CHECK(rel(r.codec_s, tr.encode_s + tr.decode_s + tr.hidden_s) < 1e-12);
    }
    /* One rank: nothing travels, the zeroing is plain decode work. */
    CHECK_OK(one("topk:density=0.01", 1000000, 0, 0, GCOMP_COST_ALLGATHER, 1, 1e8, NULL, &r, &tr));
    CHECK(tr.hidden_s == 0 && rel(r.step_s, tr.encode_s + tr.decode_s) < 1e-12);
}

/* A shaper's burst (gcomp_cost_link.burst): in steady state the bucket holds what the
 * step's idle time refilled, at most the burst, and the first transfers take it. */
static void test_burst(void) {
    gcomp_cost_tensor t = {"t", "none", 100000, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0};
    gcomp_cost_model *m = NULL;
    CHECK_OK(gcomp_cost_model_create(&m, &t, 1, 2, 2, NULL, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 2;
    net.inter = (gcomp_cost_link){1e8, 0, 0};
    gcomp_cost_compute c = {0.010, 0, 0, 1, 0}; /* 10 ms with the link idle */
    gcomp_cost_result r0, r;
    gcomp_cost_tensor_result tr;
    /* The ring: 400000 bytes, 4 ms on the wire. */
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r0, &tr));
    CHECK_MSG(rel(tr.comm_s, 4e-3) < 1e-12, "%.17g", tr.comm_s);
    net.inter.burst = 100000; /* 1 ms of the link's bytes */
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, &tr));
    CHECK_MSG(rel(r.step_s, r0.step_s - 1e-3) < 1e-12, "%.17g %.17g", r.step_s, r0.step_s);
    CHECK(rel(tr.comm_s, 3e-3) < 1e-12);
    net.inter.burst = 1e9; /* the whole exchange fits */
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, &tr));
    CHECK_MSG(rel(r.step_s, r0.step_s - 4e-3) < 1e-12, "%.17g", r.step_s);
    /* Back to back, the bucket refills only during the pack and unpack (0.2 ms at the
     * default 1 ns an element): 20000 bytes' worth. */
    c.forward_s = 0;
    net.inter.burst = 0;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r0, &tr));
    double idle = r0.step_s - tr.comm_s;
    CHECK(rel(idle, 2e-4) < 1e-9);
    net.inter.burst = 1e9;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, &tr));
    CHECK_MSG(rel(r.step_s, r0.step_s - idle) < 1e-12, "%.17g", r.step_s);
    net.inter.burst = -1;
    CHECK(gcomp_cost_eval(m, &net, &c, &r, &tr) == GCOMP_E_ARG);
    net.inter.burst = INFINITY;
    CHECK(gcomp_cost_eval(m, &net, &c, &r, &tr) == GCOMP_E_ARG);
    gcomp_cost_model_free(m);
}

/* An allgather bucket (gcomp_mpi's sub-buckets, the DDP hook's gather path): the members'
 * messages back to back, specs may differ; bytes and codec time add up, latency once. */
static void test_allgather_bucket(void) {
    gcomp_cost_tensor g[3] = {
        {"g", "topk:density=0.01", 100000, 0, 0, GCOMP_COST_ALLGATHER, 0, 0},
        {"h", "int8", 50000, 0, 0, GCOMP_COST_ALLGATHER, 0, 0},
        {"k", "topk:density=0.001", 200000, 0, 0, GCOMP_COST_ALLGATHER, 0, 0}};
    gcomp_cost_result alone, fused;
    gcomp_cost_tensor_result pa[3], pf[3];
    alone_and_fused(g, 3, 8, &alone, &fused, pa, pf);
    /* The same bytes and codec time, all on the carrier; each tensor paid 2 phases of
     * log2(8) = 3 latencies, the bucket pays them once: 12 ms less on the link.  The step
     * (overlap 0: every transfer after the backward pass) gains that less the decodes of k
     * and h, which alone ran while the next tensor was on the wire and now follow it. */
    CHECK(rel(fused.bytes_sent, alone.bytes_sent) < 1e-12);
    CHECK(rel(fused.codec_s, alone.codec_s) < 1e-12);
    CHECK(pf[1].bytes_sent == 0 && pf[2].bytes_sent == 0 && pf[1].encode_s == 0);
    CHECK(rel(pf[0].bytes_sent, pa[0].bytes_sent + pa[1].bytes_sent + pa[2].bytes_sent) < 1e-12);
    CHECK_MSG(rel(alone.comm_s - fused.comm_s, 2 * 2 * 3 * 1e-3) < 1e-9, "%.17g",
              alone.comm_s - fused.comm_s);
    CHECK_MSG(rel(alone.step_s - fused.step_s, 12e-3 - pa[1].decode_s - pa[2].decode_s) < 1e-9,
              "%.17g", alone.step_s - fused.step_s);
}

/* A DDP bucket as the hook sends it: its fp32 tensors in one all_reduce, PowerSGD's factors
 * in their own, the other messages in one all_gather with the lengths in front, all three
 * started together on one link.  2 ranks, 1 ms a latency, 1e8 B/s, overlap 0. */
static void test_concurrent_bucket(void) {
    gcomp_cost_tensor b[4] = {
        {"d", "none", 4096, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
        {"g", "topk:density=0.01", 100000, 0, 0, GCOMP_COST_ALLGATHER | GCOMP_COST_ONE_EXCHANGE, 0,
         0},
        {"p", "powersgd:rank=2", 1 << 16, 256, 256, GCOMP_COST_ALLREDUCE, 0, 0},
        {"e", "none", 1024, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_result alone, fused;
    gcomp_cost_tensor_result pa[4], pf[4];
    alone_and_fused(b, 4, 2, &alone, &fused, pa, pf);
    /* The gather is one phase of one latency (log2 2), the same bytes as in two. */
    double m = (double)est("topk:density=0.01", 100000);
    CHECK_MSG(rel(pa[1].comm_s, 1e-3 + (8 + m) / 1e8) < 1e-12, "%.17g", pa[1].comm_s);
    CHECK(pa[1].bytes_sent == 8 + m);
    /* Alone: d and e 2 latencies each (binomial reduce and broadcast), g 1, p 2 x 2.  In the
     * bucket d and e are one vector, and the lanes run side by side: PowerSGD's 4 latencies
     * are the longest lane, every byte still crosses the link. */
    double bytes = 0;
    for (int i = 0; i < 4; i++) bytes += pa[i].bytes_sent;
    CHECK(fused.bytes_sent == bytes - 24 && pf[0].bytes_sent == fused.bytes_sent); /* one check */
    CHECK(pf[1].bytes_sent == 0 && pf[2].bytes_sent == 0 && pf[3].bytes_sent == 0);
    CHECK(rel(fused.codec_s, alone.codec_s) < 1e-12);
    double wire = 2 * (4.0 * (4096 + 1024) + 24) / 1e8 + (8 + m) / 1e8 +
                  2 * (256 * 2 * 4 + 24) / 1e8 + 2 * (256 * 2 * 4 + 8) / 1e8;
    CHECK_MSG(rel(pf[0].comm_s, 4e-3 + wire) < 1e-12, "%.17g", pf[0].comm_s);
    CHECK_MSG(rel(alone.comm_s - fused.comm_s, (2 + 2 + 1 + 4 - 4) * 1e-3 + 2 * 24 / 1e8) < 1e-9,
              "%.17g", alone.comm_s - fused.comm_s);
    /* Without one exchange the gather is a lane of 2 latencies: still not the longest. */
    b[1].strategy = GCOMP_COST_ALLGATHER;
    gcomp_cost_result two;
    alone_and_fused(b, 4, 2, &alone, &two, pa, pf);
    CHECK_MSG(rel(pf[0].comm_s, 4e-3 + wire) < 1e-12, "%.17g", pf[0].comm_s);
    CHECK_MSG(rel(pa[1].comm_s, 2e-3 + (8 + m) / 1e8) < 1e-12, "%.17g", pa[1].comm_s);
    /* Two allreduce specs in one bucket are two vectors side by side, not one. */
    gcomp_cost_tensor h[2] = {{"x", "none", 4096, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
                              {"y", "none:values=f16", 4096, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    alone_and_fused(h, 2, 2, &alone, &fused, pa, pf);
    CHECK_MSG(rel(pf[0].comm_s, 2e-3 + (pa[0].bytes_sent + pa[1].bytes_sent) / 1e8 * 2) < 1e-12,
              "%.17g", pf[0].comm_s);
}

/* One exchange pads each message to its bound, and the law counts the estimate: for the
 * fixed-size messages the DDP hook sends that way the two are the same bytes. */
static void test_one_exchange_bound(void) {
    static const char *const specs[] = {"topk:density=0.001,values=f16,feedback=ef",
                                        "dgc:density=0.001,values=f16",
                                        "int8",
                                        "sign:feedback=ef",
                                        "twobit:threshold=0.5",
                                        "none:values=f16",
                                        "qsgd:levels=16",
                                        "randomk:density=0.01"};
    static const size_t sizes[] = {512 * 512, 1000003, 4096 * 784};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            gcomp_compressor *c = NULL;
            CHECK_OK(gcomp_compressor_create(&c, specs[i], sizes[k], 0, 0, NULL));
            size_t bound = gcomp_encode_bound(c);
            CHECK_MSG(est(specs[i], sizes[k]) == bound, "%s, %zu elements: estimate %zu, bound %zu",
                      specs[i], sizes[k], est(specs[i], sizes[k]), bound);
            gcomp_compressor_free(c);
        }
}

/* Break-even: dense f32 ring (2 ranks: 4n bytes, free codec) against top-k by allgather
 * (8 + m bytes, encode 1 ns/elem): equal when 4n/B = 1e-9 n + (8 + m)/B. */
static void test_break_even(void) {
    size_t n = 1 << 22;
    const char *tk = "topk:density=0.001";
    gcomp_cost_calibration *cal;
    CHECK_OK(gcomp_cost_calibration_create(&cal));
    gcomp_cost_codec_rate zero = {"none", 0, 0, 0, 0, 0}, topk = {"", 0, 1e-9, 0, 0, 0};
    snprintf(topk.spec, sizeof topk.spec, "%s", tk);
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &zero, NULL));
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &topk, NULL));
    gcomp_cost_tensor td = {"t", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
                      tc = {"t", tk, n, 0, 0, GCOMP_COST_ALLGATHER, 0, 0};
    gcomp_cost_model *md, *mc;
    CHECK_OK(gcomp_cost_model_create(&md, &td, 1, 2, 2, cal, NULL));
    CHECK_OK(gcomp_cost_model_create(&mc, &tc, 1, 2, 2, cal, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 2;
    net.inter.latency = 0;
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    double B = 0, want = (4.0 * n - 8 - (double)est(tk, n)) / (1e-9 * n);
    CHECK_OK(gcomp_cost_break_even(mc, md, (size_t)-1, &net, &c, &B));
    CHECK_MSG(rel(B, want) < 1e-6, "%.17g vs %.17g", B, want);
    CHECK_OK(gcomp_cost_break_even(mc, md, 0, &net, &c, &B));
    CHECK_MSG(rel(B, want) < 1e-6, "%.17g vs %.17g", B, want);
    /* Against itself it never pays. */
    CHECK_OK(gcomp_cost_break_even(md, md, (size_t)-1, &net, &c, &B));
    CHECK(B == 0);
    gcomp_cost_model_free(md);
    gcomp_cost_model_free(mc);
    gcomp_cost_calibration_free(cal);
}

static void test_calibration_text(void) {
    gcomp_cost_calibration *cal, *back;
    CHECK_OK(gcomp_cost_calibration_create(&cal));
    gcomp_cost_codec_rate r = {"topk:density=0.01,seed=5", 1.5e-6, 3.25e-9, 2e-7, 1.0 / 3e9, 0};
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &r, NULL));
    gcomp_cost_net_rate nr = {"inter", 4, 24.5e-6, 119e6, 110e6, 262144};
    CHECK_OK(gcomp_cost_calibration_add_net(cal, &nr));
    gcomp_cost_net_rate bad = nr;
    bad.burst = -1;
    CHECK(gcomp_cost_calibration_add_net(cal, &bad) == GCOMP_E_ARG);
    char a[4096], b[4096];
    size_t la, lb;
    CHECK_OK(gcomp_cost_calibration_format(cal, a, sizeof a, &la));
    CHECK(strstr(a, "seed=") == NULL); /* the seed changes no speed */
    CHECK(gcomp_cost_calibration_format(cal, b, 10, &lb) == GCOMP_E_DST_SIZE && lb == la);
    gcomp_error e = {0};
    CHECK_OK(gcomp_cost_calibration_parse(&back, a, la, &e));
    CHECK_OK(gcomp_cost_calibration_format(back, b, sizeof b, &lb));
    CHECK(la == lb && memcmp(a, b, la) == 0);
    const gcomp_cost_codec_rate *g = gcomp_cost_calibration_codec(back, 0);
    CHECK(g && g->decode_per_elem == 1.0 / 3e9 && g->encode_per_elem == 3.25e-9);
    const gcomp_cost_net_rate *gn = gcomp_cost_calibration_net(back, "inter");
    CHECK(gn && gn->ranks == 4 && gn->latency == 24.5e-6 && gn->burst == 262144);
    CHECK(strncmp(a, "gradcomp-calibration 3\n", 23) == 0 && strstr(a, " burst=262144\n"));
    gcomp_cost_link lk;
    CHECK_OK(gcomp_cost_link_measured(gn, &lk));
    CHECK(lk.burst == 262144 && lk.bandwidth == 110e6);
    /* Lookup: same codec at another density is scaled (decode by density). */
    gcomp_cost_tensor t = {"t", "topk:density=0.001", 1000000, 0, 0, GCOMP_COST_ALLGATHER, 0, 0};
    gcomp_cost_model *m;
    CHECK_OK(gcomp_cost_model_create(&m, &t, 1, 1, 1, back, NULL));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    gcomp_cost_result res;
    gcomp_cost_tensor_result tr;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &res, &tr));
    CHECK(tr.calibrated == 1);
    /* Plus the allgather's zeroing and overflow check of the output: two streams of 4-byte
     * values, each a third of the dense decode-add (uncalibrated here: 1 ns/element). */
    CHECK_MSG(rel(tr.decode_s, 2e-7 + 1e6 / 3e9 / 10 + 2 * 1e6 * 1e-9 / 3) < 1e-12, "%.17g",
              tr.decode_s);
    gcomp_cost_model_free(m);
    /* A min_k floor raises the kept fraction of a small tensor: 512 of 10240 is 0.05, five
     * times the calibrated 0.01. */
    gcomp_cost_tensor t2 = {.name = "t2",
                            .spec = "topk:density=0.001,min_k=512",
                            .n = 10240,
                            .strategy = GCOMP_COST_ALLGATHER};
    CHECK_OK(gcomp_cost_model_create(&m, &t2, 1, 1, 1, back, NULL));
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &res, &tr));
    CHECK_MSG(rel(tr.decode_s, 2e-7 + 10240 / 3e9 * 5 + 2 * 10240 * 1e-9 / 3) < 1e-12, "%.17g",
              tr.decode_s);
    gcomp_cost_model_free(m);
    gcomp_cost_calibration_free(back);

    /* Errors: not a calibration, a newer version, a bad line named by its number. */
    const char *bad1 = "hello\n", *bad2 = "gradcomp-calibration 99\n",
               *bad3 = "gradcomp-calibration 1\n# ok\ncodec none encode_fixed_s=1 "
                       "encode_per_elem=x decode_fixed_s=0 decode_per_elem=0\n",
               *bad4 = "gradcomp-calibration 1\nnet inter ranks=2 latency=1e-5 bandwith=1e8\n";
    CHECK(gcomp_cost_calibration_parse(&back, bad1, strlen(bad1), &e) == GCOMP_E_BAD_MAGIC);
    CHECK(back == NULL);
    CHECK(gcomp_cost_calibration_parse(&back, bad2, strlen(bad2), &e) == GCOMP_E_VERSION);
    CHECK(gcomp_cost_calibration_parse(&back, bad3, strlen(bad3), &e) == GCOMP_E_CORRUPT);
    CHECK_MSG(strstr(e.message, "line 3") != NULL, "%s", e.message);
    CHECK(gcomp_cost_calibration_parse(&back, bad4, strlen(bad4), &e) == GCOMP_E_CORRUPT);
    CHECK_MSG(strstr(e.message, "line 2") && strstr(e.message, "bandwith"), "%s", e.message);
    const char *bad5 = "gradcomp-calibration 3\nnet inter ranks=2 latency=1e-5 bandwidth=1e8 "
                       "burst=-5\n";
    CHECK(gcomp_cost_calibration_parse(&back, bad5, strlen(bad5), &e) == GCOMP_E_CORRUPT);
    CHECK_MSG(strstr(e.message, "line 2") && strstr(e.message, "burst"), "%s", e.message);
    gcomp_cost_calibration_free(cal);
}

/* Rates at several sizes: a tensor between two is blended in log n, one outside takes the
 * nearest; the sizes survive the text form; a rate for any size replaces the sized ones. */
static double encode_at(const gcomp_cost_calibration *cal, size_t n) {
    gcomp_cost_tensor t = {"t", "topk:density=0.01", n, 0, 0, GCOMP_COST_ALLGATHER, 0, 0};
    gcomp_cost_model *m;
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    gcomp_cost_result res;
    gcomp_cost_tensor_result tr = {0};
    CHECK_OK(gcomp_cost_model_create(&m, &t, 1, 1, 1, cal, NULL));
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &res, &tr));
    CHECK(tr.calibrated == 2);
    gcomp_cost_model_free(m);
    return tr.encode_s;
}

/* Measuring: PowerSGD is timed through the protocol its transports drive (begin and the
 * rounds, then finish), its dense steps included; a codec without phases by encode and
 * decode-add.  Both fit a law through the two sizes. */
static void test_calibrate_codec(void) {
    const char *specs[] = {"powersgd:rank=2", "powersgd:rank=2,iters=2",
                           "powersgd:rank=2,start_iter=100", "topk:density=0.01"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        gcomp_cost_codec_rate r;
        gcomp_error e = {0};
        bool shaped = specs[i][0] == 'p';
        CHECK_MSG(gcomp_cost_calibrate_codec(specs[i], 256 * 128, shaped ? 256 : 0,
                                             shaped ? 128 : 0, 3, &r, &e) == GCOMP_OK,
                  "%s: %s", specs[i], e.message);
        CHECK(r.elements == 256 * 128 && r.encode_per_elem + r.encode_fixed_s > 0);
        CHECK(strstr(r.spec, "seed=") == NULL);
    }
    gcomp_cost_codec_rate r;
    CHECK(gcomp_cost_calibrate_codec("powersgd:rank=2", 100, 10, 11, 3, &r, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_cost_calibrate_codec("nosuch", 100, 0, 0, 3, &r, NULL) != GCOMP_OK);
}

static void test_calibration_sizes(void) {
    gcomp_cost_calibration *cal, *back;
    CHECK_OK(gcomp_cost_calibration_create(&cal));
    gcomp_cost_codec_rate small = {"topk:density=0.01", 0, 1e-9, 0, 0, 1 << 20},
                          big = {"topk:density=0.01", 1e-3, 2e-9, 0, 0, 1 << 24};
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &big, NULL));
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &small, NULL));
    CHECK(gcomp_cost_calibration_codecs(cal) == 2);
    /* 4M is halfway in log n: (0 + 1e-3)/2 + (1e-9 + 2e-9)/2 * n */
    double n = 1 << 22;
    CHECK_MSG(rel(encode_at(cal, 1 << 22), 0.5e-3 + 1.5e-9 * n) < 1e-12, "%.17g",
              encode_at(cal, 1 << 22));
    CHECK(rel(encode_at(cal, 1 << 20), 1e-9 * (1 << 20)) < 1e-12);
    CHECK(rel(encode_at(cal, 1 << 16), 1e-9 * (1 << 16)) < 1e-12);
    CHECK(rel(encode_at(cal, 1 << 26), 1e-3 + 2e-9 * (1 << 26)) < 1e-12);
    char a[4096], b[4096];
    size_t la, lb;
    CHECK_OK(gcomp_cost_calibration_format(cal, a, sizeof a, &la));
    CHECK_MSG(strstr(a, "elements=1048576") && strstr(a, "elements=16777216"), "%s", a);
    CHECK_OK(gcomp_cost_calibration_parse(&back, a, la, NULL));
    CHECK_OK(gcomp_cost_calibration_format(back, b, sizeof b, &lb));
    CHECK(la == lb && memcmp(a, b, la) == 0);
    CHECK(encode_at(back, 1 << 22) == encode_at(cal, 1 << 22));
    gcomp_cost_calibration_free(back);
    /* The same size again replaces; a rate for any size replaces both. */
    small.encode_per_elem = 4e-9;
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &small, NULL));
    CHECK(gcomp_cost_calibration_codecs(cal) == 2);
    CHECK(rel(encode_at(cal, 1 << 16), 4e-9 * (1 << 16)) < 1e-12);
    gcomp_cost_codec_rate any = {"topk:density=0.01", 0, 3e-9, 0, 0, 0};
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &any, NULL));
    CHECK(gcomp_cost_calibration_codecs(cal) == 1);
    CHECK(rel(encode_at(cal, 1 << 22), 3e-9 * n) < 1e-12);
    /* and a sized one replaces the rate for any size */
    CHECK_OK(gcomp_cost_calibration_add_codec(cal, &big, NULL));
    CHECK(gcomp_cost_calibration_codecs(cal) == 1);
    CHECK(rel(encode_at(cal, 1 << 22), 1e-3 + 2e-9 * n) < 1e-12);
    /* A size that is no whole number is a bad line. */
    const char *bad = "gradcomp-calibration 2\ncodec none elements=1.5 encode_fixed_s=0 "
                      "encode_per_elem=0 decode_fixed_s=0 decode_per_elem=0\n";
    CHECK(gcomp_cost_calibration_parse(&back, bad, strlen(bad), NULL) == GCOMP_E_CORRUPT);
    gcomp_cost_calibration_free(cal);
}

/* The fitted law gives the measured time at the size measured, whatever the small size
 * did: a small size much faster per element (from the caches) must not leave a negative
 * intercept clamped to 0, which over-predicted n itself. */
static void test_calibration_fit(void) {
    double f, pe;
    gcomp__cost_fit(1000, 2e-3, 125, 5e-4, &f, &pe); /* ordinary: fixed + slope */
    CHECK(rel(f + pe * 1000, 2e-3) < 1e-12 && rel(f + pe * 125, 5e-4) < 1e-12 && f > 0);
    gcomp__cost_fit(1000, 1e-3, 125, 1e-5, &f, &pe); /* the line would cross zero at 116 */
    CHECK_MSG(f == 0 && rel(pe * 1000, 1e-3) < 1e-12, "%.17g %.17g", f, pe);
    gcomp__cost_fit(1000, 1e-3, 125, 2e-3, &f, &pe); /* the small size slower: no slope < 0 */
    CHECK(f == 0 && rel(pe * 1000, 1e-3) < 1e-12);
    gcomp__cost_fit(1000, 1e-3, 1000, 1e-3, &f, &pe); /* one size */
    CHECK(f == 0 && rel(pe * 1000, 1e-3) < 1e-12);
}

/* The link a collective sees: the ring allreduce's rate where measured and lower. */
static void test_link_measured(void) {
    gcomp_cost_link l;
    gcomp_cost_net_rate r = {"inter", 4, 2e-5, 1.85e9, 4.47e8, 0};
    CHECK_OK(gcomp_cost_link_measured(&r, &l));
    CHECK(l.bandwidth == 4.47e8 && l.latency == 2e-5);
    r.ring_bandwidth = 0; /* not measured */
    CHECK_OK(gcomp_cost_link_measured(&r, &l));
    CHECK(l.bandwidth == 1.85e9);
    r.ring_bandwidth = 2e9; /* higher than one way: the one-way figure */
    CHECK_OK(gcomp_cost_link_measured(&r, &l));
    CHECK(l.bandwidth == 1.85e9);
    r.bandwidth = 0;
    CHECK(gcomp_cost_link_measured(&r, &l) == GCOMP_E_ARG);
    CHECK(gcomp_cost_link_measured(NULL, &l) == GCOMP_E_ARG);
}

static void test_errors(void) {
    gcomp_cost_model *m = NULL;
    gcomp_error e = {0};
    gcomp_cost_tensor t = {"w", "topk:density=0.01", 1000, 0, 0, 0, 0, 0};
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e) == GCOMP_E_ARG);
    CHECK_MSG(strstr(e.message, "'w'") && strstr(e.message, "auto"), "%s", e.message);
    t.strategy = GCOMP_COST_ALLREDUCE; /* top-k does not sum */
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e) == GCOMP_E_UNSUPPORTED);
    t.strategy = GCOMP_COST_ALLGATHER;
    CHECK(gcomp_cost_model_create(&m, &t, 1, 0, 1, NULL, &e) == GCOMP_E_ARG);
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 5, NULL, &e) == GCOMP_E_ARG);
    t.spec = "topk:densty=0.01";
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e) == GCOMP_E_SPEC);
    t.spec = "nosuch";
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e) == GCOMP_E_UNKNOWN_CODEC);
    t.spec = "topk:density=0.01";
    t.rows = 7;
    t.cols = 7;
    CHECK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e) == GCOMP_E_ARG);
    CHECK(m == NULL);
    t.rows = t.cols = 0;
    CHECK_OK(gcomp_cost_model_create(&m, &t, 1, 4, 4, NULL, &e));
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 4;
    gcomp_cost_compute c = {0, 0, 0, 1, 0};
    gcomp_cost_result r;
    CHECK_OK(gcomp_cost_eval(m, &net, &c, &r, NULL));
    net.inter.bandwidth = 0;
    CHECK(gcomp_cost_eval(m, &net, &c, &r, NULL) == GCOMP_E_ARG);
    net.inter.bandwidth = 1e9;
    net.workers = 8;
    CHECK(gcomp_cost_eval(m, &net, &c, &r, NULL) == GCOMP_E_ARG);
    net.workers = 4;
    c.overlap = 1.5;
    CHECK(gcomp_cost_eval(m, &net, &c, &r, NULL) == GCOMP_E_ARG);
    gcomp_cost_model_free(m);
    gcomp_cost_model_free(NULL);
    gcomp_cost_calibration_free(NULL);
}

/* Exchanges in flight at once (compute.concurrent): two small allreduces on 2 ranks, each
 * a binomial reduce and broadcast (2 latencies) of 4096 + 24 bytes, after the backward
 * pass (overlap 0).  One at a time they pay 4 latencies; side by side 2, while their bytes
 * still queue on the link.  With no latency the two agree to the bit. */
static void test_concurrent_exchanges(void) {
    size_t n = 1024;
    gcomp_cost_tensor t[2] = {{"a", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0},
                              {"b", "none", n, 0, 0, GCOMP_COST_ALLREDUCE, 0, 0}};
    gcomp_cost_calibration *cal = free_dense();
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = net.nodes = 2;
    net.inter = (gcomp_cost_link){1e9, 0.01, 0};
    gcomp_cost_compute c = {0, 0, 0, 0, 0};
    gcomp_cost_result serial, side;
    gcomp_cost_tensor_result per[2];
    double w = 2.0 * (4.0 * (double)n + 24) / 1e9;
    eval2(t, 2, cal, &net, &c, &serial, NULL);
    CHECK_MSG(rel(serial.step_s, 2 * (0.02 + w)) < 1e-12, "%.17g", serial.step_s);
    c.concurrent = 1;
    eval2(t, 2, cal, &net, &c, &side, per);
    CHECK_MSG(rel(side.step_s, 0.02 + w) < 1e-12, "%.17g", side.step_s);
    CHECK(side.bytes_sent == serial.bytes_sent && side.comm_s == serial.comm_s);
    CHECK_MSG(rel(per[0].done_s, 0.02 + w) < 1e-12, "%.17g", per[0].done_s);
    /* bandwidth-bound: the bytes queue, nothing to overlap */
    net.inter.latency = 0;
    eval2(t, 2, cal, &net, &c, &side, NULL);
    c.concurrent = 0;
    eval2(t, 2, cal, &net, &c, &serial, NULL);
    CHECK(memcmp(&side, &serial, sizeof side) == 0);
    /* neither 0 nor 1 */
    gcomp_cost_model *m;
    CHECK_OK(gcomp_cost_model_create(&m, t, 2, 2, 2, cal, NULL));
    c.concurrent = 2;
    CHECK(gcomp_cost_eval(m, &net, &c, &side, NULL) == GCOMP_E_ARG);
    gcomp_cost_model_free(m);
    gcomp_cost_calibration_free(cal);
}

int main(void) {
    test_laws();
    test_hierarchical();
    test_overlap();
    test_work_and_buckets();
    test_allgather_bucket();
    test_concurrent_bucket();
    test_concurrent_exchanges();
    test_one_exchange_bound();
    test_powersgd_bucket();
    test_hidden_work();
    test_burst();
    test_calibrate_codec();
    test_break_even();
    test_calibration_text();
    test_calibration_sizes();
    test_calibration_fit();
    test_link_measured();
    test_errors();
    return CHECK_DONE();
}

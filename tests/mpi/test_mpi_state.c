/*
 * test_mpi_state.c - checkpoints of a bucket: save, restart, continue bit for bit.
 *
 * A bucket with a tensor of every strategy and kind of state (allgather with EF and with
 * DGC momentum; sparse and rsag with owner residuals; rsag with a random codec whose
 * owner keeps no residual but whose streams follow the step counters; seeded random-k
 * and f16 by allreduce; PowerSGD's residual and warm start; a tensor smaller than the
 * number of ranks, so some regions are empty) runs K steps and saves its state; it runs
 * M more steps, recording every result.  A fresh bucket loads the blob and runs the same
 * M steps: every result must be bit-identical, and so must the state after them.  A
 * fresh bucket without the load must differ (so the check can see a load that does
 * nothing).  The same through the hierarchical strategy on two fake nodes.
 *
 * Then the refusals, each leaving the state exactly as it was (the blob saved before and
 * after is byte-identical): truncated, trailing bytes, bad magic, newer version, a flipped
 * byte in the frame, a flipped byte in a compressor's state after others loaded fine
 * (the bucket puts those back), and blobs of another rank, another number of ranks,
 * another spec, size or strategy; plus a load or save while an allreduce is in flight.
 */
#include "mpi_check.h"

#include <stdbool.h>

#define K_STEPS 3
#define M_STEPS 3
#define MAXT 16

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static void fill(float *x, size_t n, size_t tensor, int step) {
    test_fill(x, n, 7777ull * (unsigned)mc_rank + 131ull * (unsigned)step + tensor);
}

static gcomp_mpi_bucket *make(gcomp_mpi_comm *comm, const gcomp_mpi_tensor *t, size_t nt) {
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.bucket_bytes = 8192; /* several sub-buckets */
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, t, nt, &bo, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "create: %s", err.message);
    return b;
}

static blob save(gcomp_mpi_bucket *b) {
    blob s = {NULL, 0};
    gcomp_error err = {0};
    size_t cap = gcomp_mpi_bucket_state_size(b);
    CHECK(cap > 0);
    s.p = malloc(cap + 16);
    gcomp_status st = gcomp_mpi_bucket_save_state(b, s.p, cap, &s.len, &err);
    CHECK_MSG(st == GCOMP_OK && s.len == cap, "save: %s (%zu of %zu bytes)", err.message, s.len,
              cap);
    return s;
}

/* Runs steps [s0, s1) on b; out (may be NULL) receives every result, or is compared. */
static void run_steps(gcomp_mpi_bucket *b, const gcomp_mpi_tensor *t, size_t nt, int s0, int s1,
                      float **out, bool compare, int *differ) {
    float *data[MAXT];
    for (size_t k = 0; k < nt; k++) data[k] = malloc(t[k].n * sizeof(float));
    for (int step = s0; step < s1; step++) {
        for (size_t k = 0; k < nt; k++) fill(data[k], t[k].n, k, step);
        gcomp_error err = {0};
        gcomp_status st = gcomp_mpi_allreduce(b, data, GCOMP_MPI_AVERAGE, 60.0, &err);
        CHECK_MSG(st == GCOMP_OK, "step %d: %s", step, err.message);
        if (!out) continue;
        for (size_t k = 0; k < nt; k++) {
            float *o = out[(size_t)(step - s0) * nt + k];
            if (!compare) {
                memcpy(o, data[k], t[k].n * sizeof(float));
            } else if (memcmp(o, data[k], t[k].n * sizeof(float)) != 0) {
                if (differ)
                    (*differ)++;
                else
                    CHECK_MSG(0, "tensor '%s' step %d: result differs after the restart", t[k].name,
                              step);
            }
        }
    }
    for (size_t k = 0; k < nt; k++) free(data[k]);
}

/* K steps, save, M steps recorded; a fresh bucket loads and repeats the M steps. */
static void roundtrip(gcomp_mpi_comm *comm, const gcomp_mpi_tensor *t, size_t nt,
                      const char *label) {
    float *out[M_STEPS * MAXT];
    for (size_t i = 0; i < M_STEPS * nt; i++) out[i] = malloc(t[i % nt].n * sizeof(float));
    gcomp_mpi_bucket *a = make(comm, t, nt);
    if (!a) return;
    run_steps(a, t, nt, 0, K_STEPS, NULL, false, NULL);
    blob s = save(a);
    run_steps(a, t, nt, K_STEPS, K_STEPS + M_STEPS, out, false, NULL);
    blob a2 = save(a);
    gcomp_mpi_bucket_free(a);

    gcomp_mpi_bucket *b = make(comm, t, nt);
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_bucket_load_state(b, s.p, s.len, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: load: %s", label, err.message);
    run_steps(b, t, nt, K_STEPS, K_STEPS + M_STEPS, out, true, NULL);
    blob b2 = save(b);
    CHECK_MSG(a2.len == b2.len && !memcmp(a2.p, b2.p, a2.len),
              "%s: state after the same steps differs from the uninterrupted run's", label);
    gcomp_mpi_bucket_free(b);

    /* Without the load the results differ: the state is what carried them. */
    gcomp_mpi_bucket *c = make(comm, t, nt);
    int differ = 0;
    run_steps(c, t, nt, K_STEPS, K_STEPS + M_STEPS, out, true, &differ);
    CHECK_MSG(differ > 0, "%s: a fresh bucket gives the same results: the test cannot tell", label);
    gcomp_mpi_bucket_free(c);
    for (size_t i = 0; i < M_STEPS * nt; i++) free(out[i]);
    free(s.p);
    free(a2.p);
    free(b2.p);
}

/* Offset and length of the last non-empty compressor state in a blob (the layout in
 * src/mpi/mpi_state.c), or 0. */
static size_t last_slot(const blob *s, size_t *len) {
    size_t off = 48, last = 0;
    uint32_t T;
    memcpy(&T, s->p + 40, 4);
    for (uint32_t i = 0; i < T; i++) {
        uint32_t K;
        memcpy(&K, s->p + off + 44, 4);
        off += 48;
        for (uint32_t k = 0; k < K; k++) {
            uint32_t l;
            memcpy(&l, s->p + off, 4);
            if (l) last = off + 4, *len = l;
            off += 4 + l;
        }
    }
    return last;
}

static void expect_refused(gcomp_mpi_bucket *b, const blob *before, const void *p, size_t len,
                           gcomp_status want, const char *must, const char *what) {
    gcomp_error err = {0};
    gcomp_status st = gcomp_mpi_bucket_load_state(b, p, len, &err);
    CHECK_MSG(st == want, "%s: got %s (%s), wanted %s", what, gcomp_status_str(st), err.message,
              gcomp_status_str(want));
    if (must)
        CHECK_MSG(strstr(err.message, must) != NULL, "%s: message '%s' does not say '%s'", what,
                  err.message, must);
    blob now = save(b);
    CHECK_MSG(now.len == before->len && !memcmp(now.p, before->p, now.len),
              "%s: a refused load changed the state", what);
    free(now.p);
}

/* A blob saved by a bucket like `t` except for tensor `which`, on `comm`. */
static blob foreign(gcomp_mpi_comm *comm, const gcomp_mpi_tensor *t, size_t nt, size_t which,
                    gcomp_mpi_tensor changed) {
    gcomp_mpi_tensor u[MAXT];
    memcpy(u, t, nt * sizeof *t);
    u[which] = changed;
    gcomp_mpi_bucket *f = make(comm, u, nt);
    blob s = {NULL, 0};
    if (!f) return s;
    run_steps(f, u, nt, 0, 1, NULL, false, NULL);
    s = save(f);
    gcomp_mpi_bucket_free(f);
    return s;
}

static void refusals(gcomp_mpi_comm *comm, const gcomp_mpi_tensor *t, size_t nt) {
    gcomp_mpi_bucket *b = make(comm, t, nt);
    if (!b) return;
    run_steps(b, t, nt, 0, 2, NULL, false, NULL);
    blob good = save(b);
    run_steps(b, t, nt, 2, 3, NULL, false, NULL); /* now b's state differs from `good` */
    blob before = save(b);
    CHECK(good.len == before.len && memcmp(good.p, before.p, good.len) != 0);
    uint8_t *x = malloc(good.len + 1);

    expect_refused(b, &before, good.p, good.len - 1, GCOMP_E_TRUNCATED, NULL, "one byte short");
    expect_refused(b, &before, good.p, 40, GCOMP_E_TRUNCATED, NULL, "40 bytes");
    expect_refused(b, &before, good.p, 2, GCOMP_E_TRUNCATED, NULL, "2 bytes");
    memcpy(x, good.p, good.len);
    x[good.len] = 0;
    expect_refused(b, &before, x, good.len + 1, GCOMP_E_STATE, NULL, "a byte too many");
    x[0] ^= 1;
    expect_refused(b, &before, x, good.len, GCOMP_E_BAD_MAGIC, NULL, "bad magic");
    memcpy(x, good.p, good.len);
    x[4] = 2;
    expect_refused(b, &before, x, good.len, GCOMP_E_VERSION, NULL, "version 2");
    memcpy(x, good.p, good.len);
    x[20] ^= 0x10; /* the rank field: the frame's CRC catches it before the rank check */
    expect_refused(b, &before, x, good.len, GCOMP_E_CHECKSUM, NULL, "flipped frame byte");
    memcpy(x, good.p, good.len);
    x[48 + 16] ^= 1; /* tensor 0's n */
    expect_refused(b, &before, x, good.len, GCOMP_E_CHECKSUM, NULL, "flipped record byte");
    size_t sl = 0, so = last_slot(&good, &sl);
    CHECK(so > 0 && sl > 8);
    if (so) {
        memcpy(x, good.p, good.len);
        x[so + sl / 2] ^= 0x40; /* inside the last compressor's state: others loaded first */
        expect_refused(b, &before, x, good.len, GCOMP_E_CHECKSUM, "slot", "flipped state byte");
    }
    /* Another rank's blob. */
    int P = mc_size, next = (mc_rank + 1) % P, prev = (mc_rank + P - 1) % P;
    unsigned long long mine = good.len, theirs = 0;
    MPI_Sendrecv(&mine, 1, MPI_UNSIGNED_LONG_LONG, prev, 1, &theirs, 1, MPI_UNSIGNED_LONG_LONG,
                 next, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    uint8_t *other = malloc(theirs ? theirs : 1);
    MPI_Sendrecv(good.p, (int)good.len, MPI_BYTE, prev, 2, other, (int)theirs, MPI_BYTE, next, 2,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (P > 1)
        expect_refused(b, &before, other, theirs, GCOMP_E_MISMATCH, "rank", "another rank's blob");
    free(other);
    /* Another number of ranks: the same bucket on half the ranks (or on one). */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, mc_rank % 2, mc_rank, &half);
    gcomp_mpi_comm *hc = NULL;
    CHECK_OK(gcomp_mpi_comm_create(&hc, half, NULL, 60.0, NULL));
    if (hc) {
        gcomp_mpi_bucket *h = make(hc, t, nt);
        if (h) {
            blob hs = save(h);
            expect_refused(b, &before, hs.p, hs.len, GCOMP_E_MISMATCH, "ranks",
                           "a blob of a smaller communicator");
            free(hs.p);
            gcomp_mpi_bucket_free(h);
        }
        CHECK_OK(gcomp_mpi_comm_free(hc));
    }
    MPI_Comm_free(&half);
    /* Another bucket: spec, size, strategy, name, tensor count. */
    gcomp_mpi_tensor ch = t[0];
    ch.spec = "topk:density=0.06,feedback=ef";
    blob f = foreign(comm, t, nt, 0, ch);
    expect_refused(b, &before, f.p, f.len, GCOMP_E_MISMATCH, t[0].name, "another density");
    free(f.p);
    ch = t[0];
    ch.n += 1;
    f = foreign(comm, t, nt, 0, ch);
    expect_refused(b, &before, f.p, f.len, GCOMP_E_MISMATCH, "size", "another size");
    free(f.p);
    ch = t[1];
    ch.strategy = GCOMP_MPI_ALLGATHER;
    f = foreign(comm, t, nt, 1, ch);
    expect_refused(b, &before, f.p, f.len, GCOMP_E_MISMATCH, "strategy", "another strategy");
    free(f.p);
    ch = t[1];
    ch.name = "renamed";
    f = foreign(comm, t, nt, 1, ch);
    expect_refused(b, &before, f.p, f.len, GCOMP_E_MISMATCH, "name", "another name");
    free(f.p);
    gcomp_mpi_bucket *one = make(comm, t, 1);
    if (one) {
        blob os = save(one);
        expect_refused(b, &before, os.p, os.len, GCOMP_E_MISMATCH, "tensors", "one tensor");
        free(os.p);
        gcomp_mpi_bucket_free(one);
    }
    /* Arguments and the in-flight rule. */
    gcomp_error err = {0};
    size_t len = 0;
    CHECK(gcomp_mpi_bucket_load_state(b, NULL, 10, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_bucket_load_state(NULL, good.p, good.len, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_bucket_save_state(b, x, good.len - 1, &len, &err) == GCOMP_E_DST_SIZE);
    CHECK(gcomp_mpi_bucket_save_state(b, NULL, good.len, &len, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_bucket_state_size(NULL) == 0);
    float *data[MAXT];
    for (size_t k = 0; k < nt; k++) {
        data[k] = malloc(t[k].n * sizeof(float));
        fill(data[k], t[k].n, k, 9);
    }
    CHECK_OK(gcomp_mpi_start(b, data, GCOMP_MPI_SUM, &err));
    CHECK(gcomp_mpi_bucket_save_state(b, x, good.len, &len, &err) == GCOMP_E_PROTOCOL);
    CHECK(gcomp_mpi_bucket_load_state(b, good.p, good.len, &err) == GCOMP_E_PROTOCOL);
    CHECK_OK(gcomp_mpi_wait(b, 60.0, &err));
    for (size_t k = 0; k < nt; k++) free(data[k]);
    /* After all that, the good blob still loads. */
    CHECK_OK(gcomp_mpi_bucket_load_state(b, good.p, good.len, &err));
    blob again = save(b);
    CHECK(again.len == good.len && !memcmp(again.p, good.p, good.len));
    free(again.p);
    free(x);
    free(good.p);
    free(before.p);
    gcomp_mpi_bucket_free(b);
}

/* A checkpoint that is corrupt on one rank only: that rank's load fails and it stays at its
 * step while the others go back to the checkpoint's.  PowerSGD with start_iter=1 then sends
 * n values on the rank at step 0 and rows x r on the others, and Open MPI aborted the job
 * with MPI_ERR_TRUNCATE.  Now the first call after a load checks the steps: every rank gets
 * GCOMP_E_MISMATCH, the communicator stays up, and once every rank has loaded the same blob
 * the call goes through. */
static void load_failed_on_one_rank(gcomp_mpi_comm *comm, const char *spec) {
    enum { ROWS = 40, COLS = 30, N = ROWS * COLS };
    gcomp_mpi_tensor t = {"w", spec, N, ROWS, COLS, GCOMP_MPI_AUTO};
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 60.0, &err));
    if (!b) return;
    size_t cap = gcomp_mpi_bucket_state_size(b), len = 0;
    unsigned char *good = malloc(cap), *bad = malloc(cap);
    CHECK_OK(gcomp_mpi_bucket_save_state(b, good, cap, &len, &err)); /* step 0 */
    static float x[N];
    float *d = x;
    test_fill(x, N, 1 + (unsigned)mc_rank);
    CHECK_OK(gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err)); /* step 0: dense */
    memcpy(bad, good, len);
    if (mc_rank == mc_size - 1) bad[len / 2] ^= 0x55;
    gcomp_status st = gcomp_mpi_bucket_load_state(b, bad, len, &err);
    CHECK(st == (mc_rank == mc_size - 1 ? GCOMP_E_CHECKSUM : GCOMP_OK));
    for (int k = 0; k < 2; k++) { /* refused again while out of step */
        test_fill(x, N, 10 + (unsigned)mc_rank);
        st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
        CHECK_MSG(st == (mc_size > 1 ? GCOMP_E_MISMATCH : GCOMP_OK),
                  "%s: a call after a load that failed on one rank: %s (%s)", spec,
                  gcomp_status_str(st), err.message);
        CHECK(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK);
    }
    CHECK_OK(gcomp_mpi_bucket_load_state(b, good, len, &err)); /* every rank, the same blob */
    test_fill(x, N, 20 + (unsigned)mc_rank);
    st = gcomp_mpi_allreduce(b, &d, GCOMP_MPI_SUM, 60.0, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: after every rank loaded the same blob: %s", spec, err.message);
    gcomp_mpi_bucket_free(b);
    free(good);
    free(bad);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    gcomp_mpi_comm *comm = NULL, *comm2 = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err));
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.ranks_per_node = 2; /* two fake nodes at -np 4 */
    CHECK_OK(gcomp_mpi_comm_create(&comm2, MPI_COMM_WORLD, &o, 60.0, &err));
    if (!comm || !comm2) return mc_done("test_mpi_state");
    gcomp_mpi_tensor t[MAXT] = {
        {"ag.topk", "topk:density=0.05,feedback=ef", 3001, 0, 0, GCOMP_MPI_AUTO},
        {"sp.topk", "topk:density=0.05", 4099, 0, 0, GCOMP_MPI_SPARSE},
        {"rs.int8", "int8:feedback=ef", 2050, 0, 0, GCOMP_MPI_RSAG},
        {"rs.qsgd", "qsgd:levels=4,seed=3", 1500, 0, 0, GCOMP_MPI_RSAG},
        {"ag.dgc", "dgc:density=0.05", 2000, 0, 0, GCOMP_MPI_AUTO},
        {"ar.randomk", "randomk:density=0.1,seed=7,feedback=ef", 1000, 0, 0, GCOMP_MPI_AUTO},
        {"ar.f16", "none:values=f16,feedback=ef", 777, 0, 0, GCOMP_MPI_AUTO},
        {"rs.tiny", "int8:feedback=ef", 3, 0, 0, GCOMP_MPI_RSAG},
    };
    size_t nt = 8;
    if (gcomp_codec_find("powersgd"))
        t[nt++] = (gcomp_mpi_tensor){"psgd", "powersgd:rank=2", 40 * 30, 40, 30, GCOMP_MPI_AUTO};
    roundtrip(comm, t, nt, "flat");
    const int H = GCOMP_MPI_HIERARCHICAL;
    const gcomp_mpi_tensor th[] = {
        {"h.int8", "int8:feedback=ef", 2000, 0, 0, H | GCOMP_MPI_RSAG},
        {"h.topk", "topk:density=0.05,feedback=ef", 1000, 0, 0, H | GCOMP_MPI_ALLGATHER},
        {"h.sparse", "topk:density=0.05", 1001, 0, 0, H | GCOMP_MPI_SPARSE},
    };
    if (gcomp_mpi_comm_nodes(comm2) > 1) roundtrip(comm2, th, 3, "hierarchical");
    refusals(comm, t, nt);
    if (gcomp_codec_find("powersgd")) load_failed_on_one_rank(comm, "powersgd:rank=2,start_iter=1");
    load_failed_on_one_rank(comm, "randomk:density=0.05");
    CHECK_OK(gcomp_mpi_comm_free(comm));
    CHECK_OK(gcomp_mpi_comm_free(comm2));
    return mc_done("test_mpi_state");
}

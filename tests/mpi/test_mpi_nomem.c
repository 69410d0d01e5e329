/*
 * test_mpi_nomem.c - the anomaly sweep of libgradcomp_mpi (SQLite's malloc tests): each
 * rank fails its own N-th allocation, for N = 0, 1, 2, ... until the operation completes
 * without reaching it, through bucket creation, allreduce and state load, for a bucket of
 * every strategy component (and the hierarchical wrapper on two fake nodes).
 *
 *   create   every rank returns an error together when any rank ran out (the rank that
 *            did says GCOMP_E_NOMEM, the others learn it through the set-up check), the
 *            communicator stays usable, and the bucket that finally succeeds gives the
 *            same bits as one made without any failure.  Both the layer's own allocations
 *            (gcomp__mpi_test_fail_alloc_after) and the core's (compressors: its own hook)
 *            are swept.
 *   allreduce  the layer allocates nothing in a call (every buffer is reserved at set-up,
 *            where a failure can be shared): with the first allocation failing, every call
 *            still succeeds with the right bits.
 *   load     a failed load returns GCOMP_E_NOMEM and leaves the state byte-identical
 *            (the blob saved after equals the one saved before), through the layer's
 *            and the core's allocations.
 * Leaks: run under -DGCOMP_SANITIZE=ON with LeakSanitizer (tests/mpi/lsan.supp hides
 * Open MPI's own); every failed create and load must free what it took.
 */
#include "mpi_check.h"

#include <stdbool.h>

/* Test hooks: the layer's (src/mpi/mpi_util.c) and the core's (src/core/mem.c), both
 * exported for tests only. */
size_t gcomp__mpi_test_fail_alloc_after(size_t n);
void gcomp__test_fail_alloc_after(size_t n);

#define NT 3
#define N 3000
#define MAX_SWEEP 5000

typedef struct tcase {
    const char *spec;
    int strategy;
    size_t rows, cols; /* 0: a vector */
    int ranks_per_node;
} tcase;

static const tcase cases[] = {
    {"topk:density=0.1,feedback=ef", GCOMP_MPI_AUTO, 0, 0, 0},              /* allgather */
    {"qsgd:levels=4", GCOMP_MPI_ALLGATHER, 0, 0, 0},                        /* per-rank seeds */
    {"none:values=f16,feedback=ef", GCOMP_MPI_AUTO, 0, 0, 0},               /* allreduce */
    {"randomk:density=0.05,values=bf16", GCOMP_MPI_AUTO, 0, 0, 0},          /* seeded */
    {"int8:feedback=ef", GCOMP_MPI_RSAG, 0, 0, 0},                          /* rsag */
    {"qsgd:levels=4", GCOMP_MPI_RSAG, 0, 0, 0},                             /* rsag, peers */
    {"topk:density=0.1,feedback=ef", GCOMP_MPI_SPARSE, 0, 0, 0},            /* sparse */
    {"powersgd:rank=2", GCOMP_MPI_AUTO, 50, 60, 0},                         /* lowrank */
    {"topk:density=0.1", GCOMP_MPI_HIERARCHICAL | GCOMP_MPI_RSAG, 0, 0, 1}, /* two nodes */
    {"int8", GCOMP_MPI_HIERARCHICAL, 0, 0, 2},                              /* one node */
};

static void describe(const tcase *c, gcomp_mpi_tensor *t) {
    static const char *names[NT] = {"a", "b", "c"};
    for (int i = 0; i < NT; i++) {
        size_t n = c->rows ? c->rows * c->cols : (size_t)N + 17 * (size_t)i;
        t[i] = (gcomp_mpi_tensor){names[i], c->spec, n, c->rows, c->cols, c->strategy};
    }
}

static gcomp_mpi_bucket_options small_buckets(void) {
    gcomp_mpi_bucket_options o;
    gcomp_mpi_bucket_options_default(&o);
    o.bucket_bytes = 2 * 4 * N; /* two sub-buckets: [a, b] [c] */
    return o;
}

static void fill(float *x, size_t n, int i, int step) {
    test_fill(x, n, 1000ull * (unsigned)mc_rank + 31ull * (unsigned)step + (unsigned)i);
}

/* Runs `steps` allreduces from step `first`; results into out[i] (N + 40 floats each). */
static gcomp_status run(gcomp_mpi_bucket *b, const gcomp_mpi_tensor *t, int first, int steps,
                        float **out) {
    gcomp_status st = GCOMP_OK;
    for (int s = first; s < first + steps && st == GCOMP_OK; s++) {
        for (int i = 0; i < NT; i++) fill(out[i], t[i].n, i, s);
        gcomp_error err;
        st = gcomp_mpi_allreduce(b, out, GCOMP_MPI_AVERAGE, 60.0, &err);
    }
    return st;
}

static bool any_rank(bool mine) {
    int m = mine, all = 0;
    MPI_Allreduce(&m, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all != 0;
}

/* Sets this rank's failure point in the layer (core = false) or in the core. */
static void fail_after(bool core, size_t n) {
    if (core)
        gcomp__test_fail_alloc_after(n);
    else
        gcomp__mpi_test_fail_alloc_after(n);
}

static void sweep_create(gcomp_mpi_comm *comm, const tcase *c, bool core, float **ref,
                         float **got) {
    gcomp_mpi_tensor t[NT];
    describe(c, t);
    gcomp_mpi_bucket_options o = small_buckets();
    int sweeps = 0;
    for (size_t k = 0; k < MAX_SWEEP; k++) {
        gcomp_mpi_bucket *b = NULL;
        gcomp_error err = {0};
        fail_after(core, k);
        gcomp_status st = gcomp_mpi_bucket_create(&b, comm, t, NT, &o, 60.0, &err);
        fail_after(core, (size_t)-1);
        bool failed = st != GCOMP_OK, anyone = any_rank(failed);
        CHECK_MSG(failed == anyone, "%s [%s] %s N=%zu: this rank %s, another failed", c->spec,
                  gcomp_mpi_strategy_name(c->strategy), core ? "core" : "mpi", k,
                  gcomp_status_str(st));
        CHECK_MSG(!failed || st == GCOMP_E_NOMEM || st == GCOMP_E_MISMATCH,
                  "%s N=%zu: create gave %s (%s)", c->spec, k, gcomp_status_str(st), err.message);
        CHECK_MSG(!failed || b == NULL, "%s N=%zu: failed create left a bucket", c->spec, k);
        CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK,
                  "%s N=%zu: the communicator failed", c->spec, k);
        if (anyone) {
            gcomp_mpi_bucket_free(b);
            sweeps++;
            continue;
        }
        /* Made at last: it must compute what a bucket made without failures does. */
        CHECK_OK(run(b, t, 0, 2, got));
        for (int i = 0; i < NT; i++)
            CHECK_MSG(!memcmp(got[i], ref[i], t[i].n * sizeof(float)),
                      "%s: tensor %d differs after the sweep", c->spec, i);
        gcomp_mpi_bucket_free(b);
        break;
    }
    /* (One node: the dense sum is the answer, no rank has a compressor.) */
    if (!core || c->ranks_per_node < mc_size)
        CHECK_MSG(sweeps > 0, "%s: the %s sweep never failed an allocation", c->spec,
                  core ? "core" : "mpi");
}

/* The layer allocates nothing during a call: every call succeeds with the first
 * allocation failing, and gives the bits of a call without the hook. */
static void sweep_allreduce(gcomp_mpi_comm *comm, const tcase *c, float **ref, float **got) {
    gcomp_mpi_tensor t[NT];
    describe(c, t);
    gcomp_mpi_bucket_options o = small_buckets();
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, NT, &o, 60.0, &err));
    if (!b) return;
    fail_after(false, 0);
    gcomp_status st = run(b, t, 0, 2, got);
    size_t left = gcomp__mpi_test_fail_alloc_after((size_t)-1);
    CHECK_MSG(st == GCOMP_OK, "%s [%s]: allreduce with no allocation left: %s", c->spec,
              gcomp_mpi_strategy_name(c->strategy), gcomp_status_str(st));
    CHECK_MSG(left == 0, "%s: hook not consumed as expected", c->spec);
    for (int i = 0; st == GCOMP_OK && i < NT; i++)
        CHECK_MSG(!memcmp(got[i], ref[i], t[i].n * sizeof(float)), "%s: tensor %d differs", c->spec,
                  i);
    gcomp_mpi_bucket_free(b);
}

static uint8_t *save(gcomp_mpi_bucket *b, size_t *len) {
    size_t cap = gcomp_mpi_bucket_state_size(b);
    uint8_t *p = malloc(cap);
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_save_state(b, p, cap, len, &err));
    return p;
}

/* A failed load changes nothing; a load that completes restores the saved state. */
static void sweep_load(gcomp_mpi_comm *comm, const tcase *c, bool core, float **got) {
    gcomp_mpi_tensor t[NT];
    describe(c, t);
    gcomp_mpi_bucket_options o = small_buckets();
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, NT, &o, 60.0, &err));
    if (!b) return;
    size_t la, lb;
    CHECK_OK(run(b, t, 0, 2, got));
    uint8_t *a = save(b, &la);
    CHECK_OK(run(b, t, 2, 1, got));
    uint8_t *now = save(b, &lb);
    int sweeps = 0;
    bool done = false;
    for (size_t k = 0; k < MAX_SWEEP && !done; k++) {
        fail_after(core, k);
        gcomp_status st = gcomp_mpi_bucket_load_state(b, a, la, &err);
        fail_after(core, (size_t)-1);
        size_t l2;
        uint8_t *after = save(b, &l2);
        if (st == GCOMP_OK) {
            CHECK_MSG(l2 == la && !memcmp(after, a, la),
                      "%s: a load that succeeded at N=%zu "
                      "did not restore the state",
                      c->spec, k);
            done = true;
        } else {
            sweeps++;
            CHECK_MSG(st == GCOMP_E_NOMEM, "%s %s N=%zu: load gave %s (%s)", c->spec,
                      core ? "core" : "mpi", k, gcomp_status_str(st), err.message);
            CHECK_MSG(l2 == lb && !memcmp(after, now, lb),
                      "%s %s N=%zu: a failed load changed the state", c->spec,
                      core ? "core" : "mpi", k);
        }
        free(after);
    }
    /* The core loads a compressor's state in place, without allocating: its sweep ends at
     * once, which is a property too. */
    CHECK_MSG(done && (core || sweeps > 0),
              "%s: the %s load sweep did not run through (%d "
              "failures)",
              c->spec, core ? "core" : "mpi", sweeps);
    free(a);
    free(now);
    gcomp_mpi_bucket_free(b);
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    float *ref[NT], *got[NT];
    for (int i = 0; i < NT; i++) {
        ref[i] = calloc(N + 64, sizeof(float));
        got[i] = calloc(N + 64, sizeof(float));
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const tcase *c = &cases[ci];
        gcomp_mpi_options mo;
        gcomp_mpi_options_default(&mo);
        mo.ranks_per_node = c->ranks_per_node;
        gcomp_mpi_comm *comm = NULL;
        gcomp_error err;
        CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, &mo, 60.0, &err));
        if (!comm) break;
        /* The reference: two steps of a bucket made without failures. */
        gcomp_mpi_tensor t[NT];
        describe(c, t);
        gcomp_mpi_bucket_options o = small_buckets();
        gcomp_mpi_bucket *b = NULL;
        CHECK_OK(gcomp_mpi_bucket_create(&b, comm, t, NT, &o, 60.0, &err));
        if (b) CHECK_OK(run(b, t, 0, 2, ref));
        gcomp_mpi_bucket_free(b);

        sweep_create(comm, c, false, ref, got);
        sweep_create(comm, c, true, ref, got);
        sweep_allreduce(comm, c, ref, got);
        sweep_load(comm, c, false, got);
        sweep_load(comm, c, true, got);
        CHECK_OK(gcomp_mpi_comm_free(comm));
    }
    for (int i = 0; i < NT; i++) {
        free(ref[i]);
        free(got[i]);
    }
    return mc_done("test_mpi_nomem");
}

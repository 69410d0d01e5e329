/*
 * test_mpi_ps_state.c - checkpoints of a parameter-server job resume bit for bit (issue 13).
 *
 * Two configurations, each: K steps, then every rank saves what it keeps - the bucket blob
 * (worker residuals; the servers' pull residuals) and the server blob
 * (gcomp_mpi_ps_save_state: weights, momentum, last sums, update counts, optimizers) -
 * then M more steps give the reference; a fresh server object and bucket on the same
 * ranks load the blobs and run the same M steps: every worker's results must be the same
 * bits, step by step.
 *   update   sync, server-side SGD with momentum, twobit pushes (worker residuals)
 *   bytepss  sync aggregate, compressed pulls (pull=same: the servers' own residuals)
 *   async    dist_async with max_staleness = W - 1, the workers pushing in turn (so the
 *            order, and the bits, are the same in every run): a push's staleness is then
 *            W - 1 in every run, also the first after loading, which counts from the
 *            update count of the worker's last reply; a worker blob without it (version
 *            1) made that first push stale and dropped (no server may drop any push here)
 * And the blob is untrusted: a flipped byte is GCOMP_E_CHECKSUM, a short one
 * GCOMP_E_TRUNCATED, another magic GCOMP_E_BAD_MAGIC, another rank's GCOMP_E_MISMATCH, and
 * none of them changes the state (the next step still matches the reference).
 */
#include "test_mpi_ps_common.h"

#define K 3
#define M 3
#define TIMEOUT 30.0
static const size_t sizes[] = {700, 2500};
#define NT 2

enum { UPDATE, BYTEPSS, ASYNC };
static const char *const cfg_name[] = {"update", "bytepss", "async"};

static gcomp_mpi_bucket *make(ps_env *E, gcomp_mpi_ps **ps, int cfg) {
    gcomp_mpi_ps_options o;
    gcomp_mpi_ps_options_default(&o);
    o.servers = E->S;
    o.part_bytes = 4096;
    o.update = cfg == UPDATE;
    o.mode = cfg == ASYNC ? GCOMP_MPI_PS_ASYNC : GCOMP_MPI_PS_SYNC;
    o.max_staleness = cfg == ASYNC ? (uint64_t)(E->W - 1) : 0;
    o.optimizer = (gcomp_mpi_ps_optimizer){0.05f, 0.9f, 1e-3f, 1.0f, 0};
    o.pull = cfg == BYTEPSS ? "same" : NULL;
    gcomp_error err = {0};
    *ps = NULL;
    CHECK_MSG(gcomp_mpi_ps_create(ps, E->world, &o, 30.0, &err) == GCOMP_OK, "%s", err.message);
    gcomp_mpi_tensor t[NT] = {{"a", "twobit:threshold=0.5", sizes[0], 0, 0, GCOMP_MPI_PS},
                              {"b", "twobit:threshold=0.5", sizes[1], 0, 0, GCOMP_MPI_PS}};
    gcomp_mpi_bucket_options bo;
    gcomp_mpi_bucket_options_default(&bo);
    bo.ps = *ps;
    gcomp_mpi_bucket *b = NULL;
    CHECK_MSG(gcomp_mpi_bucket_create(&b, E->world, t, NT, &bo, TIMEOUT, &err) == GCOMP_OK, "%s",
              err.message);
    return b;
}

/* Runs steps [s0, s1) as one session; workers keep each step's results in out (if given).
 * in_turn: one worker's exchange after another's, in worker order (async: the order the
 * server applies them in).  A server returns its count of dropped pushes. */
static uint64_t session(ps_env *E, gcomp_mpi_ps *ps, gcomp_mpi_bucket *b, int s0, int s1,
                        float **out, bool in_turn) {
    if (E->server) {
        ps_serve_ok(ps, TIMEOUT, "state");
        gcomp_mpi_ps_stats st;
        CHECK(gcomp_mpi_ps_stats_get(ps, -1, &st) == GCOMP_OK);
        return st.dropped;
    }
    gcomp_error err = {0};
    float *x[NT];
    for (int k = 0; k < NT; k++) x[k] = malloc(sizes[k] * sizeof(float));
    for (int s = s0; s < s1; s++) {
        for (int k = 0; k < NT; k++)
            test_fill(x[k], sizes[k],
                      500ull * (unsigned)s + 10ull * (unsigned)k + (unsigned)E->widx);
        for (int w = 0; w < (in_turn ? E->W : 1); w++) {
            if (!in_turn || w == E->widx)
                CHECK_MSG(gcomp_mpi_allreduce(b, x, GCOMP_MPI_AVERAGE, TIMEOUT, &err) == GCOMP_OK,
                          "%s", err.message);
            if (in_turn) MPI_Barrier(E->wcomm);
        }
        if (out)
            for (int k = 0; k < NT; k++)
                memcpy(out[(s - s0) * NT + k], x[k], sizes[k] * sizeof(float));
    }
    ps_shutdown_ok(ps, "state");
    for (int k = 0; k < NT; k++) free(x[k]);
    return 0;
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c >> 1 ^ (0x82f63b78u & -(c & 1u));
    }
    return ~c;
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> 8 * k);
}

/* A worker's version-2 blob as version 1 wrote it: without the part versions that follow
 * each tensor's record (docs/FORMAT.md); *len1 its length. */
static uint8_t *worker_blob_v1(const uint8_t *v2, size_t len2, size_t *len1) {
    uint8_t *v1 = malloc(len2);
    size_t in = 48, out = 48;
    memcpy(v1, v2, 48);
    for (int i = 0; i < NT; i++) {
        uint32_t parts = get32(v2 + in + 24);
        CHECK(get32(v2 + in + 28) == 0); /* a worker keeps no parts */
        memcpy(v1 + out, v2 + in, 32);
        in += 32 + 8 * (size_t)parts;
        out += 32;
    }
    CHECK(in + 4 == len2);
    put32(v1 + 4, 1);
    put32(v1 + 8, (uint32_t)(out + 4)); /* u64 total length: small, high word stays 0 */
    put32(v1 + out, crc32c(v1, out));
    *len1 = out + 4;
    return v1;
}

static uint8_t *save_bucket(gcomp_mpi_bucket *b, size_t *len) {
    size_t cap = gcomp_mpi_bucket_state_size(b);
    uint8_t *p = malloc(cap);
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_bucket_save_state(b, p, cap, len, &err) == GCOMP_OK, "%s", err.message);
    return p;
}

static uint8_t *save_ps(gcomp_mpi_bucket *b, size_t *len) {
    size_t cap = gcomp_mpi_ps_state_size(b);
    uint8_t *p = malloc(cap);
    gcomp_error err = {0};
    CHECK_MSG(gcomp_mpi_ps_save_state(b, p, cap, len, &err) == GCOMP_OK, "%s", err.message);
    CHECK(*len == cap);
    return p;
}

static void run(ps_env *E, int cfg) {
    const char *name = cfg_name[cfg];
    bool in_turn = cfg == ASYNC;
    float *ref[M * NT], *got[M * NT];
    for (int s = 0; s < M; s++)
        for (int k = 0; k < NT; k++) {
            ref[s * NT + k] = malloc(sizes[k] * sizeof(float));
            got[s * NT + k] = malloc(sizes[k] * sizeof(float));
        }
    gcomp_mpi_ps *ps;
    gcomp_mpi_bucket *b = make(E, &ps, cfg);
    gcomp_error err = {0};
    if (cfg != BYTEPSS && !E->server) {
        float *w[NT];
        for (int k = 0; k < NT; k++) {
            w[k] = malloc(sizes[k] * sizeof(float));
            test_fill(w[k], sizes[k], 77 + (unsigned)k);
        }
        CHECK_OK(gcomp_mpi_ps_init(b, w, TIMEOUT, &err));
        for (int k = 0; k < NT; k++) free(w[k]);
    }
    session(E, ps, b, 0, K, NULL, in_turn);
    size_t blen = 0, plen = 0;
    uint8_t *bb = save_bucket(b, &blen), *pb = save_ps(b, &plen);
    uint64_t dropped = session(E, ps, b, K, K + M, ref, in_turn); /* both sessions' */
    CHECK_MSG(dropped == 0, "%s: %llu pushes dropped as stale without a checkpoint", name,
              (unsigned long long)dropped);
    /* Another rank's blob (the server's, at the last worker; a worker's, at the server). */
    int peer = mc_rank == mc_size - 1 ? 0 : mc_size - 1;
    bool swap = mc_rank == 0 || mc_rank == mc_size - 1;
    size_t olen = 0;
    uint8_t *other = NULL;
    if (swap) {
        size_t l2;
        MPI_Sendrecv(&plen, 1, MPI_UNSIGNED_LONG, peer, 1, &l2, 1, MPI_UNSIGNED_LONG, peer, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        other = malloc(l2);
        MPI_Sendrecv(pb, (int)plen, MPI_BYTE, peer, 2, other, (int)l2, MPI_BYTE, peer, 2,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        olen = l2;
    }
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);

    b = make(E, &ps, cfg);
    /* Untrusted blobs first: each refused with its status, nothing changed. */
    uint8_t *bad = malloc(plen);
    memcpy(bad, pb, plen);
    bad[plen / 2] ^= 0x10;
    CHECK_MSG(gcomp_mpi_ps_load_state(b, bad, plen, &err) == GCOMP_E_CHECKSUM, "%s: flip: %s", name,
              err.message);
    CHECK(gcomp_mpi_ps_load_state(b, pb, plen - 1, &err) == GCOMP_E_TRUNCATED ||
          gcomp_mpi_ps_load_state(b, pb, plen - 1, &err) == GCOMP_E_CHECKSUM);
    memcpy(bad, pb, plen);
    bad[0] = 'X';
    CHECK(gcomp_mpi_ps_load_state(b, bad, plen, &err) == GCOMP_E_BAD_MAGIC);
    if (swap)
        CHECK_MSG(gcomp_mpi_ps_load_state(b, other, olen, &err) == GCOMP_E_MISMATCH, "%s: %s", name,
                  err.message);
    if (cfg == ASYNC && !E->server) { /* a version-1 worker blob still loads: versions 0 */
        size_t l1 = 0;
        uint8_t *v1 = worker_blob_v1(pb, plen, &l1);
        CHECK_MSG(gcomp_mpi_ps_load_state(b, pb, plen, &err) == GCOMP_OK, "%s: %s", name,
                  err.message);
        CHECK(gcomp_mpi_ps_version(b, 0) > 0 && gcomp_mpi_ps_version(b, 1) > 0);
        CHECK_MSG(gcomp_mpi_ps_load_state(b, v1, l1, &err) == GCOMP_OK, "%s: version 1: %s", name,
                  err.message);
        CHECK_MSG(gcomp_mpi_ps_version(b, 0) == 0 && gcomp_mpi_ps_version(b, 1) == 0,
                  "%s: version 1 left the versions of the blob before", name);
        free(v1);
    }
    CHECK_MSG(gcomp_mpi_bucket_load_state(b, bb, blen, &err) == GCOMP_OK, "%s: %s", name,
              err.message);
    CHECK_MSG(gcomp_mpi_ps_load_state(b, pb, plen, &err) == GCOMP_OK, "%s: %s", name, err.message);
    { /* saving what was loaded gives the same bytes */
        size_t l2 = 0, l3 = 0;
        uint8_t *again = save_ps(b, &l2), *bagain = save_bucket(b, &l3);
        CHECK_MSG(l2 == plen && !memcmp(again, pb, plen), "%s: server blob round trip", name);
        CHECK_MSG(l3 == blen && !memcmp(bagain, bb, blen), "%s: bucket blob round trip", name);
        free(again);
        free(bagain);
    }
    dropped = session(E, ps, b, K, K + M, got, in_turn);
    CHECK_MSG(dropped == 0, "%s: %llu pushes dropped as stale after loading", name,
              (unsigned long long)dropped);
    if (!E->server)
        for (int s = 0; s < M; s++)
            for (int k = 0; k < NT; k++)
                CHECK_MSG(!memcmp(ref[s * NT + k], got[s * NT + k], sizes[k] * sizeof(float)),
                          "%s: step %d tensor %d after loading differs from the run it saved", name,
                          K + s, k);
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_ps_free(ps);
    free(bad);
    free(other);
    free(bb);
    free(pb);
    for (int i = 0; i < M * NT; i++) {
        free(ref[i]);
        free(got[i]);
    }
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    ps_env E;
    ps_env_init(&E, mc_size >= 5 ? 2 : 1, 0, TIMEOUT);
    run(&E, UPDATE);
    run(&E, BYTEPSS);
    run(&E, ASYNC);
    ps_env_free(&E);
    return mc_done("test_mpi_ps_state");
}

/*
 * test_mpi_setup.c - the set-up check and the API contract.
 *
 * One rank with a different density, codec, size, strategy, tensor order or tensor count
 * makes bucket creation fail with GCOMP_E_MISMATCH on every rank, naming the tensor; a
 * rank with an invalid spec gets GCOMP_E_SPEC and the others GCOMP_E_MISMATCH; nobody
 * hangs, and the communicator stays usable afterwards.  Also: strategy names, the
 * in-flight rule, idle test/wait, NULL arguments.
 */
#include "mpi_check.h"

#include <stdbool.h>

static const int odd_rank_default = 1;

/* Every rank creates a bucket of three tensors; `odd` describes rank `who`'s version of
 * tensor 1.  Expect `want` on every rank except `who`, which expects `want_who`. */
static void expect_create(gcomp_mpi_comm *comm, const char *label, gcomp_mpi_tensor odd,
                          size_t count_who, gcomp_status want, gcomp_status want_who,
                          const char *must_name) {
    int who = odd_rank_default < mc_size ? odd_rank_default : 0;
    gcomp_mpi_tensor t[3] = {
        {"embed", "topk:density=0.01,feedback=ef", 5000, 0, 0, GCOMP_MPI_AUTO},
        {"fc1", "topk:density=0.01", 3001, 0, 0, GCOMP_MPI_AUTO},
        {"bias", "none", 17, 0, 0, GCOMP_MPI_AUTO},
    };
    size_t count = 3;
    if (mc_rank == who) {
        t[1] = odd;
        count = count_who;
    }
    gcomp_mpi_bucket *b = NULL;
    gcomp_error err = {0};
    double t0 = MPI_Wtime();
    gcomp_status st = gcomp_mpi_bucket_create(&b, comm, t, count, NULL, 30.0, &err);
    gcomp_status w = mc_rank == who ? want_who : want;
    CHECK_MSG(st == w, "%s: rank %d got %s (%s), wanted %s", label, mc_rank, gcomp_status_str(st),
              err.message, gcomp_status_str(w));
    CHECK_MSG(MPI_Wtime() - t0 < 10.0, "%s: took %.1f s", label, MPI_Wtime() - t0);
    if (st != GCOMP_OK) CHECK(b == NULL);
    if (must_name && st == GCOMP_E_MISMATCH)
        CHECK_MSG(strstr(err.message, must_name) != NULL, "%s: message '%s' does not name '%s'",
                  label, err.message, must_name);
    gcomp_mpi_bucket_free(b);
    CHECK_MSG(gcomp_mpi_comm_status(comm, NULL) == GCOMP_OK, "%s: communicator failed", label);
}

static void strategies(void) {
    const char *names[] = {"auto",
                           "allgather",
                           "sparse",
                           "allreduce",
                           "rsag",
                           "hierarchical",
                           "hierarchical:rsag",
                           "hierarchical:allgather"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int s = -1;
        CHECK_OK(gcomp_mpi_strategy_parse(names[i], &s));
        CHECK_MSG(!strcmp(gcomp_mpi_strategy_name(s), names[i]), "%s -> %s", names[i],
                  gcomp_mpi_strategy_name(s));
    }
    int s;
    CHECK(gcomp_mpi_strategy_parse("ring", &s) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_strategy_parse("hierarchical:", &s) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_strategy_parse(NULL, &s) == GCOMP_E_ARG);
    CHECK(!strcmp(gcomp_mpi_strategy_name(77), "?"));
    struct {
        const char *spec;
        int want;
    } autos[] = {{"topk:density=0.01", GCOMP_MPI_ALLGATHER},
                 {"none", GCOMP_MPI_ALLREDUCE},
                 {"none:values=bf16", GCOMP_MPI_ALLREDUCE},
                 {"randomk", GCOMP_MPI_ALLREDUCE},
                 {"int8", GCOMP_MPI_RSAG},
                 {"sign:feedback=ef", GCOMP_MPI_ALLGATHER},
                 {"twobit", GCOMP_MPI_ALLGATHER},
                 {"none:values=int8", GCOMP_MPI_ALLGATHER},
                 {"powersgd:rank=2", GCOMP_MPI_ALLREDUCE}};
    for (size_t i = 0; i < sizeof autos / sizeof autos[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(autos[i].spec, ":"), autos[i].spec);
        if (!gcomp_codec_find(name)) continue; /* not built (yet) */
        CHECK_OK(gcomp_mpi_strategy_auto(autos[i].spec, 4, &s));
        CHECK_MSG(s == autos[i].want, "auto(%s) = %s", autos[i].spec, gcomp_mpi_strategy_name(s));
    }
    CHECK(gcomp_mpi_strategy_auto("nosuch", 4, &s) == GCOMP_E_UNKNOWN_CODEC);
}

static void contract(gcomp_mpi_comm *comm) {
    gcomp_error err;
    gcomp_mpi_tensor t = {"w", "topk:density=0.1", 1000, 0, 0, GCOMP_MPI_AUTO};
    gcomp_mpi_bucket *b = NULL;
    CHECK_OK(gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 30.0, &err));
    if (!b) return;
    float x[1000], *d = x, *dn = NULL;
    test_fill(x, 1000, (unsigned)mc_rank);
    int done = 0;
    CHECK_OK(gcomp_mpi_test(b, &done, &err)); /* idle */
    CHECK(done == 1);
    CHECK_OK(gcomp_mpi_wait(b, 1.0, &err));
    CHECK(gcomp_mpi_start(b, &dn, GCOMP_MPI_SUM, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_start(b, NULL, GCOMP_MPI_SUM, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_start(b, &d, (gcomp_mpi_op)7, &err) == GCOMP_E_ARG);
    CHECK_OK(gcomp_mpi_start(b, &d, GCOMP_MPI_SUM, &err));
    CHECK(gcomp_mpi_start(b, &d, GCOMP_MPI_SUM, &err) == GCOMP_E_PROTOCOL);
    CHECK(gcomp_mpi_message_count(b, 0) == 0); /* not while in flight */
    CHECK_OK(gcomp_mpi_wait(b, 30.0, &err));
    CHECK(gcomp_mpi_message_count(b, 0) == 1);
    CHECK(gcomp_mpi_bucket_count(b) == 1);
    CHECK(gcomp_mpi_bucket_strategy(b, 0) == GCOMP_MPI_ALLGATHER);
    CHECK(gcomp_mpi_bucket_strategy(b, 1) == -1);
    CHECK(gcomp_mpi_compressor(b, 0) != NULL);
    const void *m;
    size_t len;
    CHECK(gcomp_mpi_message(b, 0, 1, &m, &len, NULL, NULL) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_comm_free(comm) == GCOMP_E_ARG); /* a bucket is alive */
    gcomp_mpi_bucket_free(b);
    gcomp_mpi_bucket_free(NULL);
    CHECK(gcomp_mpi_bucket_create(&b, comm, &t, 0, NULL, 1, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_bucket_create(NULL, comm, &t, 1, NULL, 1, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_comm_create(NULL, MPI_COMM_WORLD, NULL, 1, &err) == GCOMP_E_ARG);
    gcomp_mpi_comm *c2;
    CHECK(gcomp_mpi_comm_create(&c2, MPI_COMM_NULL, NULL, 1, &err) == GCOMP_E_ARG);
    gcomp_mpi_options o;
    gcomp_mpi_options_default(&o);
    o.timeout_s = -1;
    CHECK(gcomp_mpi_comm_create(&c2, MPI_COMM_WORLD, &o, 1, &err) == GCOMP_E_ARG);
    CHECK(gcomp_mpi_comm_free(NULL) == GCOMP_OK);
    /* Every rank asks for a strategy the codec cannot use: a local error everywhere. */
    gcomp_mpi_tensor bad = {"w", "topk:density=0.1", 1000, 0, 0, GCOMP_MPI_ALLREDUCE};
    CHECK(gcomp_mpi_bucket_create(&b, comm, &bad, 1, NULL, 30.0, &err) == GCOMP_E_UNSUPPORTED);
}

/*
 * Every codec of the registry, alone and (selectors) with every value coder of its values=
 * choices, as the layer sees it through gcomp_spec_describe, never by name: auto answers
 * (a codec without parameters of its own used to canonicalise to "name:feedback=..." and
 * make auto fail), a bucket of that choice can be made, and a rank's worker spec has a seed
 * of its own exactly when the description says its draws are private and not shared (a
 * value coder with no codec of its name used to get none).
 */
static void every_codec(gcomp_mpi_comm *comm) {
    for (size_t c = 0; c < gcomp_codec_count(); c++) {
        const gcomp_codec_info *ci = gcomp_codec_at(c);
        const char *choices = "";
        for (size_t k = 0; k < ci->nparams; k++)
            if (!strcmp(ci->params[k].name, "values") && ci->params[k].choices)
                choices = ci->params[k].choices;
        for (const char *v = choices;; v += strcspn(v, "|") + (v[strcspn(v, "|")] ? 1 : 0)) {
            char spec[96];
            if (v == choices)
                snprintf(spec, sizeof spec, "%s", ci->name);
            else
                snprintf(spec, sizeof spec, "%s:values=%.*s", ci->name, (int)strcspn(v, "|"), v);
            gcomp_spec_info d;
            gcomp_error err;
            int s = -1;
            bool shaped = (ci->flags & GCOMP_CODEC_NEEDS_SHAPE) != 0;
            CHECK_MSG(gcomp_spec_describe(spec, 0, &d, &err) == GCOMP_OK, "%s: %s", spec,
                      err.message);
            /* A canonical form that does not parse again (keys that two stages both claim:
             * the core renames them) cannot be re-derived by anyone; the core's own
             * combination test owns that. */
            char c1[512], c2[512];
            if (gcomp_spec_canonical(spec, c1, sizeof c1, NULL, NULL) != GCOMP_OK ||
                gcomp_spec_canonical(c1, c2, sizeof c2, NULL, NULL) != GCOMP_OK)
                continue;
            gcomp_status st = gcomp_mpi_strategy_auto(spec, mc_size, &s);
            CHECK_MSG(st == GCOMP_OK, "auto(%s): %s", spec, gcomp_status_str(st));
            gcomp_mpi_tensor t = {"w",           spec, 4096, shaped ? 64 : 0, shaped ? 64 : 0,
                                  GCOMP_MPI_AUTO};
            gcomp_mpi_bucket *b = NULL;
            st = gcomp_mpi_bucket_create(&b, comm, &t, 1, NULL, 30.0, &err);
            CHECK_MSG(st == GCOMP_OK, "%s: create: %s", spec, st ? err.message : "");
            if (b) {
                CHECK_MSG(gcomp_mpi_bucket_strategy(b, 0) == s, "%s: bucket %s, auto %s", spec,
                          gcomp_mpi_strategy_name(gcomp_mpi_bucket_strategy(b, 0)),
                          gcomp_mpi_strategy_name(s));
                const char *w = gcomp_mpi_worker_spec(b, 0);
                uint64_t fp = 0;
                char canon[512];
                if (w) CHECK_OK(gcomp_spec_canonical(w, canon, sizeof canon, &fp, NULL));
                uint64_t lo, hi;
                MPI_Allreduce(&fp, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
                MPI_Allreduce(&fp, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
                bool own = (d.flags & GCOMP_SPEC_PRIVATE_DRAWS) &&
                           !(d.flags & GCOMP_SPEC_SHARED_DRAWS) && s != GCOMP_MPI_ALLREDUCE;
                if (mc_size > 1)
                    CHECK_MSG((lo != hi) == own, "%s [%s]: worker seeds %s across ranks", spec,
                              gcomp_mpi_strategy_name(s), lo != hi ? "differ" : "agree");
            }
            gcomp_mpi_bucket_free(b);
            if (!v[strcspn(v, "|")]) break;
        }
    }
}

int main(int argc, char **argv) {
    mc_init(&argc, &argv);
    strategies();
    gcomp_mpi_comm *comm = NULL;
    gcomp_error err;
    CHECK_OK(gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 30.0, &err));
    if (!comm) return mc_done("test_mpi_setup");
    const gcomp_status M = GCOMP_E_MISMATCH;
    if (mc_size > 1) {
        expect_create(comm, "density",
                      (gcomp_mpi_tensor){"fc1", "topk:density=0.02", 3001, 0, 0, 0}, 3, M, M,
                      "fc1");
        expect_create(comm, "codec",
                      (gcomp_mpi_tensor){"fc1", "randomk:density=0.01", 3001, 0, 0, 0}, 3, M, M,
                      "fc1");
        expect_create(comm, "values",
                      (gcomp_mpi_tensor){"fc1", "topk:density=0.01,values=f16", 3001, 0, 0, 0}, 3,
                      M, M, "fc1");
        expect_create(comm, "size", (gcomp_mpi_tensor){"fc1", "topk:density=0.01", 3000, 0, 0, 0},
                      3, M, M, "fc1");
        expect_create(comm, "shape",
                      (gcomp_mpi_tensor){"fc1", "topk:density=0.01", 3001, 3001, 1, 0}, 3, M, M,
                      "fc1");
        expect_create(comm, "strategy",
                      (gcomp_mpi_tensor){"fc1", "topk:density=0.01", 3001, 0, 0, GCOMP_MPI_SPARSE},
                      3, M, M, "fc1");
        expect_create(comm, "order", (gcomp_mpi_tensor){"fc2", "topk:density=0.01", 3001, 0, 0, 0},
                      3, M, M, "name");
        expect_create(comm, "count", (gcomp_mpi_tensor){"fc1", "topk:density=0.01", 3001, 0, 0, 0},
                      2, M, M, NULL);
        expect_create(comm, "bad spec",
                      (gcomp_mpi_tensor){"fc1", "topk:densty=0.01", 3001, 0, 0, 0}, 3, M,
                      GCOMP_E_SPEC, NULL);
        expect_create(comm, "unknown codec", (gcomp_mpi_tensor){"fc1", "nosuch", 3001, 0, 0, 0}, 3,
                      M, GCOMP_E_UNKNOWN_CODEC, NULL);
        expect_create(comm, "same", (gcomp_mpi_tensor){"fc1", "topk:density=0.01", 3001, 0, 0, 0},
                      3, GCOMP_OK, GCOMP_OK, NULL);
    }
    contract(comm);
    every_codec(comm);
    CHECK_OK(gcomp_mpi_comm_free(comm));
    return mc_done("test_mpi_setup");
}

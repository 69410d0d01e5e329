/*
 * test_oom.c - out-of-memory through every core API, SQLite's way (malloc.html, "anomaly
 * testing"): each scenario runs with the allocator failing from its N-th allocation on, for
 * N = 0, 1, 2, ... until a run allocates fewer than N times and so completes untouched.
 * At every N:
 *   - each call returns GCOMP_OK or GCOMP_E_NOMEM (never another status, never a crash),
 *     and a failed create/from_state/policy_create leaves *out NULL;
 *   - a call that failed left the object's state byte-identical (state blobs compared
 *     before and after) and the accumulator untouched;
 *   - nothing leaks: the library's allocations are tracked (-Wl,--wrap=aligned_alloc,
 *     --wrap=posix_memalign and --wrap=free, see tests/unit/CMakeLists.txt) and every one is freed
 * once the scenario has freed its objects -- in every build, not only under LeakSanitizer;
 *   - after the failure, the same object still works (the next call, with memory back,
 *     succeeds).
 * Scenarios: create (every codec, with error feedback, DGC and PowerSGD shapes), encode
 * (first step, and a second step whose DGC warm-up grows the selection), compressor decode,
 * stateless decode (sparse, seeded, low-rank), state load, from_state, policy create and
 * choose, gcomp_spec_bytes_estimate and the PowerSGD protocol.
 * The MPI layer has its own sweep (its allocations go through the same allocator).
 */
#include "check.h"
#include "core/internal.h"

#include <stdbool.h>

/* ---- allocation tracking ---------------------------------------------------------------- */

void *__real_aligned_alloc(size_t align, size_t size);
int __real_posix_memalign(void **p, size_t align, size_t size);
void __real_free(void *p);
void *__wrap_aligned_alloc(size_t align, size_t size);
int __wrap_posix_memalign(void **p, size_t align, size_t size);
void __wrap_free(void *p);

#define SLOTS 65536 /* open addressing; the scenarios hold a few hundred at most */
static void *live[SLOTS];
static size_t nlive, nallocs;

static size_t slot_of(void *p) {
    return (size_t)(((uintptr_t)p >> 6) * 0x9e3779b97f4a7c15ull >> 48) & (SLOTS - 1);
}

static void track(void *p) {
    size_t i = slot_of(p);
    while (live[i]) i = (i + 1) & (SLOTS - 1);
    live[i] = p;
    nlive++;
    nallocs++;
}

void *__wrap_aligned_alloc(size_t align, size_t size) {
    void *p = __real_aligned_alloc(align, size);
    if (p) track(p);
    return p;
}

/* Big workspaces on 2 MiB pages (src/common). */
int __wrap_posix_memalign(void **p, size_t align, size_t size) {
    int rc = __real_posix_memalign(p, align, size);
    if (rc == 0) track(*p);
    return rc;
}

void __wrap_free(void *p) {
    if (p) {
        size_t i = slot_of(p);
        for (size_t k = 0; k < SLOTS && live[i]; k++, i = (i + 1) & (SLOTS - 1))
            if (live[i] == p) {
                /* backward-shift deletion keeps every probe chain intact */
                size_t j = i;
                for (;;) {
                    live[i] = NULL;
                    for (;;) {
                        j = (j + 1) & (SLOTS - 1);
                        if (!live[j]) goto done;
                        size_t h = slot_of(live[j]);
                        if ((i <= j) ? (i < h && h <= j) : (i < h || h <= j)) continue;
                        break;
                    }
                    live[i] = live[j];
                    i = j;
                }
            done:
                nlive--;
                break;
            }
    }
    __real_free(p);
}

/* ---- the sweep ---------------------------------------------------------------------------- */

/* A scenario: run once with the allocator armed; return the first status that is not OK
 * (or OK).  Objects made before arming come from setup and go in teardown. */
typedef struct scenario {
    const char *name;
    void (*setup)(void *ctx);
    gcomp_status (*run)(void *ctx);
    void (*teardown)(void *ctx);
    void *ctx;
} scenario;

static int sweep_failures;

static void sweep(scenario *s) {
    size_t n;
    for (n = 0; n < 10000; n++) {
        size_t before = nlive;
        if (s->setup) s->setup(s->ctx);
        gcomp__test_fail_alloc_after(n);
        gcomp_status st = s->run(s->ctx);
        bool exhausted = gcomp__alloc_fail_after == 0;
        gcomp__test_fail_alloc_after((size_t)-1);
        if (s->teardown) s->teardown(s->ctx);
        if (st != GCOMP_OK && st != GCOMP_E_NOMEM) {
            CHECK_MSG(0, "%s, failing from allocation %zu: %s", s->name, n, gcomp_status_str(st));
            sweep_failures++;
            return;
        }
        if (nlive != before) {
            CHECK_MSG(0, "%s, failing from allocation %zu: %zu allocation(s) leaked", s->name, n,
                      nlive - before);
            sweep_failures++;
            return;
        }
        if (st == GCOMP_OK && !exhausted) break; /* fewer than n allocations: all paths seen */
    }
    CHECK_MSG(n < 10000, "%s: never completed", s->name);
    printf("  %-58s %3zu allocation(s), each failed in turn\n", s->name, n ? n - 1 : 0);
}

/* ---- helpers ----------------------------------------------------------------------------------
 */

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static blob snap(const gcomp_compressor *c) {
    blob b = {NULL, 0};
    size_t cap = gcomp_state_bound(c);
    b.p = malloc(cap);
    if (gcomp_state_save(c, b.p, cap, &b.len) != GCOMP_OK) CHECK(0);
    return b;
}

static bool same(blob a, blob b) {
    return a.len == b.len && !memcmp(a.p, b.p, a.len);
}

static void shape_for(const char *spec, size_t n, size_t *rows, size_t *cols) {
    *rows = *cols = 0;
    if (!strncmp(spec, "powersgd", 8) || !strncmp(spec, "rows", 4) || !strncmp(spec, "cols", 4)) {
        *rows = 40;
        *cols = n / 40;
    }
}

#define N 4000
static float grad[N], grad2[N];

/* Every codec, and the feedback kinds and shapes that allocate differently. */
static const char *const specs[] = {
    "none",
    "none:values=f16,feedback=ef",
    "topk:density=0.01",
    "topk:density=0.01,feedback=ef,values=int8",
    "threshold:tau=1.5,feedback=ef",
    "sampled:density=0.01",
    "randomk:density=0.02,seed=3",
    "bernoulli:density=0.05",
    "importance:density=0.05",
    "block:density=0.05,block=16,values=sign",
    "rows:density=0.1",
    "cols:density=0.1,norm=l1",
    "dgc:density=0.01,warmup=3",
    "topk:feedback=dgc,density=0.01,values=qsgd,coding=elias",
    "int8:feedback=ef",
    "int4:rounding=stochastic",
    "sign:feedback=ef",
    "twobit:threshold=0.5",
    "ternary:bucket=0",
    "qsgd:levels=64",
    "powersgd:rank=3",
    "powersgd:rank=2,values=f16,iters=2",
    "powersgd:rank=2,start_iter=1",
};
#define NSPECS (sizeof specs / sizeof specs[0])

typedef struct ctx {
    const char *spec;
    size_t rows, cols;
    gcomp_compressor *c;
    blob before;
    uint8_t *msg;
    size_t len;
    float *acc;
} ctx;

static gcomp_compressor *make(const ctx *x) {
    gcomp_compressor *c = NULL;
    gcomp_error err;
    if (gcomp_compressor_create(&c, x->spec, N, x->rows, x->cols, &err) != GCOMP_OK)
        CHECK_MSG(0, "%s: %s", x->spec, err.message);
    return c;
}

/* create */
static gcomp_status run_create(void *p) {
    ctx *x = p;
    gcomp_compressor *c = (gcomp_compressor *)1;
    gcomp_status st = gcomp_compressor_create(&c, x->spec, N, x->rows, x->cols, NULL);
    if (st != GCOMP_OK && c != NULL) CHECK_MSG(0, "%s: failed create left *out set", x->spec);
    gcomp_compressor_free(c);
    return st;
}

/* encode: the first step, and (second scenario) a step after the epoch moved */
static void setup_encode(void *p) {
    ctx *x = p;
    x->c = make(x);
    x->before = snap(x->c);
    x->msg = malloc(gcomp_encode_bound(x->c));
}
static void setup_encode2(void *p) {
    ctx *x = p;
    x->c = make(x);
    x->msg = malloc(gcomp_encode_bound(x->c));
    CHECK_OK(gcomp_encode(x->c, grad, x->msg, gcomp_encode_bound(x->c), &x->len));
    gcomp_compressor_set_epoch(x->c, 2.5);
    x->before = snap(x->c);
}
static gcomp_status run_encode(void *p) {
    ctx *x = p;
    gcomp_status st = gcomp_encode(x->c, grad2, x->msg, gcomp_encode_bound(x->c), &x->len);
    if (st != GCOMP_OK) {
        gcomp__test_fail_alloc_after((size_t)-1);
        blob after = snap(x->c);
        CHECK_MSG(same(x->before, after), "%s: failed encode changed the state", x->spec);
        free(after.p);
        /* and the compressor still works */
        CHECK_OK(gcomp_encode(x->c, grad2, x->msg, gcomp_encode_bound(x->c), &x->len));
    }
    return st;
}
static void teardown_c(void *p) {
    ctx *x = p;
    gcomp_compressor_free(x->c);
    x->c = NULL;
    free(x->before.p);
    x->before.p = NULL;
    free(x->msg);
    x->msg = NULL;
    free(x->acc);
    x->acc = NULL;
}

/* decode: through the compressor (its workspace) and stateless */
static void setup_decode(void *p) {
    ctx *x = p;
    gcomp_compressor *enc = make(x);
    size_t cap = gcomp_encode_bound(enc);
    x->msg = malloc(cap);
    CHECK_OK(gcomp_encode(enc, grad, x->msg, cap, &x->len));
    gcomp_compressor_free(enc);
    x->c = make(x);
    x->acc = calloc(N, sizeof(float));
}
static gcomp_status check_acc(ctx *x, gcomp_status st) {
    if (st != GCOMP_OK)
        for (size_t i = 0; i < N; i++)
            if (x->acc[i] != 0.0f) {
                CHECK_MSG(0, "%s: failed decode wrote the accumulator", x->spec);
                break;
            }
    return st;
}
static gcomp_status run_cdecode(void *p) {
    ctx *x = p;
    return check_acc(x, gcomp_compressor_decode_add(x->c, x->msg, x->len, x->acc, 0.5f));
}
static gcomp_status run_decode(void *p) {
    ctx *x = p;
    gcomp_status st = check_acc(x, gcomp_decode_add(x->msg, x->len, x->acc, N, 0.5f));
    if (st == GCOMP_OK) st = gcomp_decode_add(x->msg, x->len, NULL, 0, 1.0f);
    return st;
}

/* state: load into a live compressor, and from_state */
static void setup_state(void *p) {
    ctx *x = p;
    gcomp_compressor *src = make(x);
    size_t cap = gcomp_encode_bound(src), len;
    uint8_t *m = malloc(cap);
    CHECK_OK(gcomp_encode(src, grad, m, cap, &len));
    CHECK_OK(gcomp_encode(src, grad2, m, cap, &len));
    free(m);
    blob b = snap(src);
    gcomp_compressor_free(src);
    x->msg = b.p;
    x->len = b.len;
    x->c = make(x);
    x->before = snap(x->c);
}
static gcomp_status run_load(void *p) {
    ctx *x = p;
    gcomp_status st = gcomp_state_load(x->c, x->msg, x->len);
    if (st != GCOMP_OK) {
        gcomp__test_fail_alloc_after((size_t)-1);
        blob after = snap(x->c);
        CHECK_MSG(same(x->before, after), "%s: failed state_load changed the state", x->spec);
        free(after.p);
    }
    return st;
}
static gcomp_status run_from_state(void *p) {
    ctx *x = p;
    gcomp_compressor *c = (gcomp_compressor *)1;
    gcomp_status st = gcomp_compressor_from_state(&c, x->msg, x->len, NULL);
    if (st != GCOMP_OK && c != NULL) CHECK_MSG(0, "%s: failed from_state left *out set", x->spec);
    if (st == GCOMP_OK) {
        blob b = snap(c);
        CHECK_MSG(b.len == x->len && !memcmp(b.p, x->msg, b.len), "%s: from_state changed it",
                  x->spec);
        free(b.p);
    }
    gcomp_compressor_free(c);
    return st;
}

/* PowerSGD's protocol, driven as one rank (the reductions are no-ops) */
static gcomp_status run_protocol(void *p) {
    ctx *x = p;
    float *pp, *q;
    size_t np, nq;
    unsigned rounds;
    gcomp_status st = gcomp_lowrank_begin(x->c, grad2, &pp, &np, &rounds);
    for (unsigned k = 0; st == GCOMP_OK && k < rounds; k++) {
        if (k) st = gcomp_lowrank_after_q(x->c, &pp, &np);
        if (st == GCOMP_OK) st = gcomp_lowrank_after_p(x->c, &q, &nq);
    }
    if (st == GCOMP_OK) st = gcomp_lowrank_finish(x->c, rounds ? x->acc : NULL, 1.0f);
    if (st != GCOMP_OK) {
        gcomp_lowrank_abort(x->c);
        gcomp__test_fail_alloc_after((size_t)-1);
        blob after = snap(x->c);
        CHECK_MSG(same(x->before, after), "%s: failed step changed the state", x->spec);
        free(after.p);
    }
    return st;
}
static void setup_protocol(void *p) {
    ctx *x = p;
    x->c = make(x);
    x->before = snap(x->c);
    x->acc = calloc(N, sizeof(float));
}

/* policy and estimates */
static const char *const policy_text =
    "spec=topk:density=0.001,feedback=ef;min_elements=1000;dense=none:values=f16;"
    "conv*=powersgd:rank=2;emb?=randomk:density=0.01";
static gcomp_status run_policy(void *p) {
    (void)p;
    gcomp_policy *pol = (gcomp_policy *)1;
    gcomp_status st = gcomp_policy_create(&pol, policy_text, NULL);
    if (st != GCOMP_OK) {
        CHECK_MSG(pol == NULL, "failed policy_create left *out set");
        return st;
    }
    static const gcomp_tensor_desc t[] = {
        {"fc1.weight", 4000, 40, 100}, {"fc1.bias", 100, 0, 0}, {"conv1.weight", 4000, 40, 100},
        {"emb1", 50000, 0, 0},         {"small", 10, 2, 5},
    };
    for (size_t i = 0; st == GCOMP_OK && i < sizeof t / sizeof t[0]; i++) {
        gcomp_layer_plan plan;
        st = gcomp_policy_choose(pol, &t[i], &plan, NULL);
    }
    gcomp_policy_free(pol);
    return st;
}
static gcomp_status run_estimate(void *p) {
    ctx *x = p;
    size_t bytes = 0;
    return gcomp_spec_bytes_estimate(x->spec, N, x->rows, x->cols, &bytes, NULL);
}

int main(void) {
    test_fill(grad, N, 1);
    test_fill(grad2, N, 2);
    for (size_t i = 0; i < N; i += 7) grad2[i] *= 3.0f; /* another selection */
    for (size_t s = 0; s < NSPECS; s++) {
        ctx x = {0};
        x.spec = specs[s];
        shape_for(x.spec, N, &x.rows, &x.cols);
        char name[6][160];
        const char *what[6] = {
            "create",  "encode", "encode, 2nd step", "decode (compressor)", "decode (stateless)",
            "estimate"};
        for (int k = 0; k < 6; k++) snprintf(name[k], sizeof name[k], "%s: %s", x.spec, what[k]);
        scenario sc[] = {
            {name[0], NULL, run_create, NULL, &x},
            {name[1], setup_encode, run_encode, teardown_c, &x},
            {name[2], setup_encode2, run_encode, teardown_c, &x},
            {name[3], setup_decode, run_cdecode, teardown_c, &x},
            {name[4], setup_decode, run_decode, teardown_c, &x},
            {name[5], NULL, run_estimate, NULL, &x},
        };
        for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++) sweep(&sc[k]);
        char n1[160], n2[160], n3[160];
        snprintf(n1, sizeof n1, "%s: state_load", x.spec);
        snprintf(n2, sizeof n2, "%s: from_state", x.spec);
        snprintf(n3, sizeof n3, "%s: low-rank protocol", x.spec);
        scenario st[] = {
            {n1, setup_state, run_load, teardown_c, &x},
            {n2, setup_state, run_from_state, teardown_c, &x},
        };
        for (size_t k = 0; k < 2; k++) sweep(&st[k]);
        if (!strncmp(x.spec, "powersgd", 8)) {
            scenario pr = {n3, setup_protocol, run_protocol, teardown_c, &x};
            sweep(&pr);
        }
    }
    scenario pol = {"policy create + choose", NULL, run_policy, NULL, NULL};
    sweep(&pol);
    CHECK_MSG(nlive == 0, "%zu library allocations still live at exit", nlive);
    CHECK_MSG(nallocs > 0, "allocations are not tracked (link with --wrap)");
    printf("test_oom: %d scenario(s) failed\n", sweep_failures);
    return CHECK_DONE();
}

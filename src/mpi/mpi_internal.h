/*
 * mpi_internal.h - what the files of libgradcomp_mpi share (never installed).
 *
 * The MPI layer sees libgradcomp through its public header and src/common/common.h only
 * (the core's internal symbols are hidden in the shared library; the common utilities are
 * linked into this library as its own hidden copy).  Everything else it needs beyond that
 * API is here: the engine's objects (tensors, groups, buckets), the helpers strategies
 * share, the normative wire-format fields it reads (docs/FORMAT.md), the half-precision
 * sums, and the slice format of the sparse allreduce.  The strategies themselves are
 * components behind the table of mpi_strategy.h.
 *
 * Engine (mpi_bucket.c): a bucket is cut into groups (sub-buckets); each group runs a
 * fixed list of steps, LOCAL (codec work) or COLL (issues non-blocking collectives).
 * COLL steps are issued in one global order on every rank - group by group, step by
 * step - because MPI matches collectives on a communicator by issue order.  LOCAL steps
 * of later groups (compression) run while earlier groups' collectives are in flight.
 *
 * Errors inside a call: a rank that cannot produce or accept a message must still take
 * part in every collective the others will issue, or they hang.  So a local failure is
 * written into the next size word it sends (a marker: bit 63, the status, the rank), and
 * a COLL step skips its transfer only when every rank has seen the same markers.  Only
 * MPI errors and timeouts break that rule; they fail the whole communicator.  For the
 * same reason an allreduce allocates nothing in this layer: every buffer a call can need
 * is reserved when the bucket is created, where a failure is shared by the set-up check.
 */
#ifndef GCOMP_MPI_INTERNAL_H
#define GCOMP_MPI_INTERNAL_H

#include "gradcomp_mpi.h"
#include "../common/common.h"
#include "../common/mpi_wire.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The revision of what the MPI layer sends besides gcomp messages (tags, frames, words).
 * It is part of the bucket set-up hash, so ranks running different revisions fail at
 * bucket creation (GCOMP_E_MISMATCH) instead of waiting on messages the other never
 * sends.  2: parameter-server init replies on a tag of their own, shutdown words carry
 * the session. */
#define GM_WIRE_REVISION 2

/* ---- markers in size words ------------------------------------------------------------- */

#define GM_MARK (1ull << 63)
static inline uint64_t gm_marker(gcomp_status st, int rank) {
    return GM_MARK | ((uint64_t)st << 32) | (uint32_t)rank;
}
static inline gcomp_status gm_marker_status(uint64_t m) {
    return (gcomp_status)((m >> 32) & 0xffff);
}
static inline int gm_marker_rank(uint64_t m) {
    return (int)(uint32_t)m;
}
/* Or'ed into a marker by an owner whose own re-compression failed (its sum, or sum plus
 * residual, is not finite), as opposed to a contribution it received. */
#define GM_MARK_OWNER (1ull << 48)

/* Size words that are not markers: bits 0..31 a length, bits 32..62 a tag of the tensor's
 * spec (its fingerprint, hashed), so that ranks whose specs for a tensor differ - a retune
 * one rank did not make - see it in the words they exchange anyway, before sizes that
 * belong to different specs are used (gm_scan_specs): no extra round trip. */
static inline uint32_t gm_spec_tag(uint64_t fp) {
    uint64_t z = fp * 0x9e3779b97f4a7c15ull;
    return (uint32_t)((z ^ (z >> 29)) >> 33); /* 31 bits */
}
static inline uint64_t gm_size_word(uint64_t fp, size_t len) {
    return (uint64_t)gm_spec_tag(fp) << 32 | (uint32_t)len;
}
static inline size_t gm_size_len(uint64_t w) {
    return (size_t)(uint32_t)w;
}

/* ---- memory --------------------------------------------------------------------------------- */

/* Every allocation of this layer goes through libgradcomp's allocator (src/common/mem.c,
 * this library's own copy), so the anomaly test (tests/mpi/test_mpi_nomem.c) can fail the
 * N-th one with gcomp__mpi_test_fail_alloc_after.  Memory from these is freed with gm_free
 * only, never free(). */
static inline void *gm_alloc(size_t bytes) {
    return gcomp__alloc(bytes);
}
/* n * size zeroed bytes; NULL on overflow. */
static inline void *gm_calloc(size_t n, size_t size) {
    if (size && n > (size_t)-1 / size) return NULL;
    return gcomp__calloc(n * size);
}
static inline void gm_free(void *p) {
    gcomp__free(p);
}
char *gm_strdup(const char *s);
/* Grows *p (from gm_alloc, `old` bytes used) to `want` bytes keeping its contents (realloc;
 * the allocator has none).  On failure *p is untouched and GCOMP_E_NOMEM returned. */
gcomp_status gm_grow(void **p, size_t old, size_t want);
/* Test hook (exported for tests/mpi only): the allocation after `n` more succeed fails;
 * (size_t)-1 disables.  Returns how many were left before the call (so a test learns
 * whether its operation reached the failure).  This library's counter only; the core's is
 * gcomp__test_fail_alloc_after. */
GCOMP_API size_t gcomp__mpi_test_fail_alloc_after(size_t n);

/* ---- utilities ---------------------------------------------------------------------------- */

/* Errors, buffers, the clock, the generator and the scalar half casts are libgradcomp's own
 * (src/common/, linked into this library as a private copy).  The gm_ names below are the
 * ones this layer's files use; they add nothing. */
#define gm_fail gcomp__fail /* printf-style: (err, status, fmt, ...) -> status */
typedef gcomp__buf gm_buf;  /* growable, huge pages when big, never shrinks */
static inline gcomp_status gm_reserve(gm_buf *b, size_t bytes) {
    return gcomp__buf_reserve(b, bytes);
}
static inline void gm_buf_free(gm_buf *b) {
    gcomp__buf_free(b);
}
static inline uint64_t gm_now_ns(void) {
    return gcomp__now_ns();
}
static inline uint64_t gm_mix(uint64_t z) {
    return gcomp__mix64(z);
}
/* Half casts: round to nearest even; f16 saturates at +-65504 (as values_float.c). */
static inline uint16_t gm_f32_to_f16(float f) {
    return gcomp__f32_to_f16_sat(f);
}
static inline float gm_f16_to_f32(uint16_t h) {
    return gcomp__f16_to_f32(h);
}
static inline uint16_t gm_f32_to_bf16(float f) {
    return gcomp__f32_to_bf16(f);
}
static inline float gm_bf16_to_f32(uint16_t h) {
    return gcomp__bf16_to_f32(h);
}
/* random-k positions for (key, n, k), ascending (docs/FORMAT.md "Seeded entries"), the
 * same code the core decoder runs; `bits` is scratch of gm_seeded_scratch(n) bytes. */
static inline gcomp_status gm_seeded_positions(uint64_t key, size_t n, size_t k, uint32_t *idx,
                                               gm_buf *bits) {
    return gcomp__seeded_indices(key, n, k, idx, bits);
}
static inline size_t gm_seeded_scratch(size_t n) {
    return (n + 63) / 64 * 8;
}

/* The layer's own (mpi_util.c). */
/* One step of a wait loop that has waited `waited_ns` so far: yield, or sleep 50 us
 * once the wait is long. */
void gm_backoff(unsigned *spins, uint64_t waited_ns);
uint64_t gm_fnv1a(const void *p, size_t len, uint64_t h);
/* |bits| of a float, for checks folded into an existing loop: finite iff < GM_INF_BITS. */
#define GM_INF_BITS 0x7f800000u
static inline uint32_t gm_abs_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}
/* Whether x[0..n) holds no Inf or NaN (one pass; integer max of |bits|, vectorised). */
bool gm_finite(const float *x, size_t n);
/* out[i] = scale * in[i], returning the largest |bits| written (>= GM_INF_BITS: Inf/NaN):
 * the finiteness check folded into a copy pass. */
uint32_t gm_scale_max(float *out, const float *in, size_t n, float scale);
/* out[i] = scale * half(in[i]) for n values; bf16 selects the format. */
void gm_halves_to_f32(const uint16_t *in, size_t n, int bf16, float scale, float *out);
void gm_f32_to_halves(const float *in, size_t n, int bf16, uint16_t *out);
/* MPI_Op callbacks that sum 16-bit floats (the only arithmetic in an MPI_Op here). */
void gm_op_f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt);
void gm_op_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt);

/* ---- wire format fields the layer reads (docs/FORMAT.md, normative) ------------------- */

#define GM_HDR 40     /* GCOMP_HEADER_SIZE */
#define GM_SECTION 24 /* sparse section header */
typedef struct gm_hdr {
    uint16_t codec_id;
    uint32_t payload_len;
    uint64_t n, fingerprint;
} gm_hdr;
/* Reads the header fields without checking CRCs (gcomp_decode_add does that before it
 * writes anything).  GCOMP_E_TRUNCATED / GCOMP_E_BAD_MAGIC on obviously bad input. */
gcomp_status gm_read_hdr(const void *msg, size_t len, gm_hdr *h);
/* Decodes a message that must carry fingerprint `fp` and `n` elements and adds `scale`
 * times it into acc[0..n).  With `c` (same spec and n) its decode workspace is reused. */
gcomp_status gm_decode_checked(gcomp_compressor *c, const void *msg, size_t len, uint64_t fp,
                               size_t n, float *acc, float scale);

/* Wire ids of the plain-float value coders in a sparse section (docs/FORMAT.md), and the
 * width of one value. */
enum { GM_VID_F32 = 0, GM_VID_F16 = 1, GM_VID_BF16 = 2 };
static inline size_t gm_vid_width(int vid) {
    return vid == GM_VID_F32 ? 4 : 2;
}
/* A dense or seeded-sparse message's values, for the linear allreduce: checks the
 * layout (index coding none or seeded, value coder f32/f16/bf16 = vid, lengths) and
 * returns where the values are.  *key receives the seeded key (0 for dense). */
gcomp_status gm_linear_values(const void *msg, size_t len, size_t n, int vid, const uint8_t **vals,
                              size_t *nvals, uint64_t *key);

/* ---- sparse-allreduce slices (docs/FORMAT.md, "MPI sparse-allreduce slice") ------------ */

enum {
    GM_SLICE_SPARSE_F32 = 0,
    GM_SLICE_DENSE_F32 = 1,
    GM_SLICE_SPARSE_F16 = 2,
    GM_SLICE_SPARSE_BF16 = 3
};
/* Largest slice for a region of `len` elements (dense form, which the encoder falls back
 * to whenever sparse would be larger). */
static inline size_t gm_slice_bound(size_t len) {
    return len ? GM_SLICE_HDR + 4 * len : 0;
}
/* Encodes the non-zeros of x[0..len) and sets them to zero (x is left all zero).  A slice
 * with no non-zero is 0 bytes (nothing to send).  dst holds gm_slice_bound(len). */
size_t gm_slice_encode(float *x, size_t len, uint8_t *dst);
/* Validates the whole slice, then adds it into acc[0..len).  Hostile input. */
gcomp_status gm_slice_decode_add(const uint8_t *src, size_t n, size_t len, float *acc);

/* ---- communicator ----------------------------------------------------------------------- */

/* Buffers and communicators that an abandoned operation may still use: kept until the
 * communicator is freed.  Communicators are not freed early on purpose: Open MPI may reuse
 * a freed communicator's context id at once, and a late message of the abandoned
 * collective then lands in the new communicator (seen: a crash in mca_pml_ob1_add_comm). */
typedef struct gm_grave {
    struct gm_grave *next;
    MPI_Request *req;
    int nreq;
    void **bufs;
    size_t nbufs;
    MPI_Comm comms[3];
} gm_grave;

/* What a bucket set-up's collectives write: the bucket's duplicate communicators and the
 * check words.  The communicator keeps them, so that a rank short of memory still takes
 * part in those collectives (and shares its failure through the check instead of leaving
 * the others to time out); after a timeout a request may still write them, so they are
 * then left to the communicator's end (`pending`). */
#define GM_SETUP_WORDS 8
typedef struct gm_setup_cells {
    MPI_Comm bc, bnode, bleaders;
    uint64_t in[GM_SETUP_WORDS], out[GM_SETUP_WORDS];
    bool pending;
} gm_setup_cells;

struct gcomp_mpi_comm {
    MPI_Comm user;    /* the caller's; not owned */
    MPI_Comm comm;    /* our duplicate, MPI_ERRORS_RETURN */
    MPI_Comm node;    /* ranks of this node (dup) */
    MPI_Comm leaders; /* node leaders; MPI_COMM_NULL on other ranks */
    int rank, size, node_rank, node_size, nnodes, node_index;
    gcomp_mpi_options opt;
    MPI_Op op_f16, op_bf16;
    unsigned epoch;  /* bumped by reset; buckets of an older epoch are failed */
    size_t nbuckets; /* live buckets */
    gcomp_status failed;
    gcomp_error failure;
    gm_grave *graves;
    gm_setup_cells *cells; /* for bucket set-up */
};

/* Marks the communicator failed (first failure wins) and fills err. */
gcomp_status gm_comm_fail(gcomp_mpi_comm *c, gcomp_error *err, gcomp_status st, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));
/* GCOMP_E_FAILED with the original failure, or GCOMP_OK. */
gcomp_status gm_comm_check(const gcomp_mpi_comm *c, gcomp_error *err);
/* MPI error code -> comm failure with MPI's text. */
gcomp_status gm_comm_mpi_fail(gcomp_mpi_comm *c, gcomp_error *err, int rc, const char *what);
/* Waits for n requests until `deadline` (ns, gm_now_ns clock) with MPI_Test loops. */
gcomp_status gm_wait_all(gcomp_mpi_comm *c, MPI_Request *req, int n, uint64_t deadline,
                         const char *what, gcomp_error *err);
uint64_t gm_deadline(const gcomp_mpi_comm *c, double timeout_s);
/* Keeps req, bufs (and the arrays themselves, from gm_alloc) and comms until the
 * communicator is freed.  Without memory for the grave they are leaked, never freed. */
void gm_comm_bury(gcomp_mpi_comm *c, MPI_Request *req, int nreq, void **bufs, size_t nbufs,
                  const MPI_Comm *comms, int ncomms);
/* One round of agreement over c's own duplicate: out[k] = the maximum of in[k] over the
 * ranks, n <= GM_SETUP_WORDS, through the communicator's set-up cells, so that a rank short
 * of memory still takes part; a timeout leaves them pending (MPI may still write them) and
 * the communicator failed.  GCOMP_E_FAILED where an earlier round left them pending. */
gcomp_status gm_comm_agree(gcomp_mpi_comm *c, const uint64_t *in, int n, uint64_t *out,
                           uint64_t deadline, const char *what, gcomp_error *err);
/* The same over `on`, a duplicate of c's (a bucket's own), still in c's cells. */
gcomp_status gm_comm_agree_on(gcomp_mpi_comm *c, MPI_Comm on, const uint64_t *in, int n,
                              uint64_t *out, uint64_t deadline, const char *what, gcomp_error *err);

/* ---- bucket ------------------------------------------------------------------------------ */

typedef struct gm_strategy gm_strategy;

typedef struct gm_msgref {
    const uint8_t *p;
    size_t len, offset, count;
} gm_msgref;

/* One tensor of a bucket: what every strategy has.  A strategy's own per-tensor state
 * (its compressors beyond `c`, regions, decoders, positions...) is behind `priv`. */
typedef struct gm_tensor {
    char *name;
    char spec[512];       /* canonical */
    uint64_t fp;          /* of the canonical spec */
    gcomp_spec_info info; /* gcomp_spec_describe(spec, GM_PROBE_N): the same on every rank */
    size_t n, rows, cols;
    const gm_strategy *S; /* its component */
    int strategy;         /* S->id: resolved, without the HIERARCHICAL flag */
    int req_strategy;     /* as the caller asked (AUTO or an override, with the flag) */
    bool hier;            /* the hierarchical wrapper around S */
    int xsize, xrank;     /* the exchange S runs in: its ranks (nodes) and this rank's index */
    bool exchange;        /* this rank takes part in the exchange (set up by S) */
    void *priv;           /* S's per-tensor state (S->tensor_setup / S->tensor_free) */
    gcomp_compressor *c;  /* the worker compressor, for strategies with one per tensor */
    char wspec[512];      /* this rank's worker spec (gm_worker_spec); "" off the exchange */
    gm_buf work;          /* hierarchical: n floats, the node's partial sums */
    gm_buf tmp;           /* hierarchical: n floats received from a child */

    /* per call */
    float *data;     /* the caller's */
    float *io;       /* what the codec reads and the decoder writes: data or work */
    size_t nmsg;     /* messages this rank produced (gcomp_mpi_message) */
    gm_msgref *msgs; /* capacity xsize */

    gcomp_mpi_stats stats, call;
} gm_tensor;

typedef struct gm_group gm_group;
typedef gcomp_status (*gm_step_fn)(gcomp_mpi_bucket *b, gm_group *g);
typedef struct gm_step {
    bool coll;        /* issues collectives (in the global order) */
    bool member_only; /* only ranks that take part in the exchange (node leaders) run it */
    gm_step_fn fn;
    const char *what;   /* for timeout messages */
    gm_step_fn overlap; /* COLL: codec work run right after issuing, while it is in flight */
} gm_step;

/* Words a group exchanges, in its `words` buffer (MPI writes them: they live and die with
 * the group's other MPI buffers). */
enum { GM_CHK = 3 };

/* A sub-bucket: consecutive tensors of one strategy that travel together.  Every buffer
 * handed to MPI is one of the engine's gm_buf below, never in a strategy's private state,
 * so that a call abandoned after a failure can keep them alive (gm_grave). */
struct gm_group {
    const gm_strategy *S;
    bool hier, single_node;
    size_t t0, t1, nt; /* tensors [t0, t1) */
    MPI_Comm xc;       /* exchange communicator (bucket dup, or leaders dup) */
    int xsize, xrank;
    bool member;    /* takes part in the exchange */
    void *priv;     /* S's per-group state (S->reserve / S->group_free) */
    gm_step *steps; /* grown by gm_add_step */
    int steps_cap;
    bool steps_nomem;
    int nsteps, stage, last_coll;
    bool inflight;
    MPI_Request *req;
    int nreq, req_cap;

    gm_buf send, recv, gsend, grecv, pack, words;
    /* In `words`: */
    uint64_t *sz_send, *sz_recv;        /* xsize * nt size words (or markers) each */
    uint64_t *gsz_send, *gsz_recv;      /* nt and xsize * nt: the second round (owners) */
    uint64_t *chk, *chk_out;            /* GM_CHK check words of a pack reduction, and the MAX */
    uint64_t *hstat;                    /* hierarchical: the leader's verdict, sent down */
    int *cnt_s, *dsp_s, *cnt_r, *dsp_r; /* xsize each: v-collective counts, displacements */
    size_t *pos;                        /* xsize + 1 running read positions */
    size_t send_len, gsend_len;
    int hround, hdown; /* hierarchical: tree rounds up and down */

    gcomp_status st; /* an outcome every rank of the exchange agrees on */
    char msg[256];
    gcomp_status local_st; /* this rank's own first problem, for a better message */
    char local_msg[224];

    uint64_t wire_first, wire_last, codec_ns;
    uint64_t bytes_sent, bytes_recv, node_bytes;
};

struct gcomp_mpi_bucket {
    gcomp_mpi_comm *comm;
    unsigned epoch;
    MPI_Comm bc, bnode, bleaders;
    size_t nt, ng;
    gm_tensor *t;
    gm_group *g;
    gcomp_mpi_bucket_options opt;

    bool busy, dead;
    /* A load_state was tried here (failed or not): the next start first checks, in one small
     * reduction, that every rank's compressors stand at the same step (mpi_bucket.c). */
    bool resync;
    float scale;
    size_t issue_group;
    int inflight; /* groups with collectives in flight */
    uint64_t t_start, wire_t0;
    gcomp_mpi_stats stats, call;
};

/* ---- the engine's own steps, shared with retune (mpi_bucket.c, mpi_retune.c) ------------ */

gcomp_status gm_bucket_usable(gcomp_mpi_bucket *b, gcomp_error *err);
/* Sets up tensor t (index i) from d: canonical spec, component, compressors.  t zeroed. */
gcomp_status gm_tensor_setup(gcomp_mpi_bucket *b, gm_tensor *t, size_t i, const gcomp_mpi_tensor *d,
                             gcomp_error *err);
void gm_tensor_free(gm_tensor *t);
/* Cuts b's tensors into sub-buckets: g[k].t0 / t1 for k < the count returned. */
size_t gm_groups_plan(const gcomp_mpi_bucket *b, gm_group *g);
gcomp_status gm_group_setup(gcomp_mpi_bucket *b, gm_group *g);
/* Frees a group's buffers and private state (nothing of it may be in flight). */
void gm_group_release(gm_group *g);

/* ---- what strategies share (mpi_bucket.c, mpi_spec.c) ---------------------------------- */

/* Appends a step (on allocation failure sets steps_nomem; set-up then fails). */
void gm_add_step(gm_group *g, bool coll, gm_step_fn fn, const char *what);
/* Work for the last added COLL step to do while its transfer is in flight. */
static inline void gm_add_overlap(gm_group *g, gm_step_fn fn) {
    if (g->nsteps > 0) g->steps[g->nsteps - 1].overlap = fn;
}
/* Zeroes n floats in pieces, testing the group's requests between pieces: MPI moves
 * large (rendezvous) transfers only inside MPI calls.  Returns an MPI error code. */
int gm_zero_progress(gm_group *g, float *x, size_t n);
gcomp_status gm_issue_fail(gcomp_mpi_bucket *b, int rc, const char *what);
/* Starts a pack's reductions, the ones every allreduce-shaped exchange issues: the first
 * nchk u64 check words of g->chk, MAX into g->chk_out, and `count` values of wire type vid
 * (GM_VID_*) summed in place in g->pack, in slices of GM_SLICE_BYTES (at most
 * GM_SLICES_MAX); g->nreq = 1 + the slices.  `what` names the pair in errors
 * ("values", "PowerSGD factors"). */
gcomp_status gm_start_pack_reduce(gcomp_mpi_bucket *b, gm_group *g, int vid, size_t count, int nchk,
                                  const char *what);
/* Counts one exchange of a u64 size word per tensor with every peer (group and tensors). */
void gm_count_size_words(gcomp_mpi_bucket *b, gm_group *g);
/* Records a failure every exchange rank knows about (first one wins). */
void gm_group_shared_fail(gcomp_mpi_bucket *b, gm_group *g, gcomp_status st, int rank,
                          size_t tensor);
void gm_group_local_fail(gcomp_mpi_bucket *b, gm_group *g, gcomp_status st, size_t tensor,
                         const char *what);
/* The reduced sum of tensor `tensor` is not finite although every contribution was (a sum
 * of finite values overflowed float): GCOMP_E_NONFINITE for the group.  Every rank holds
 * the same reduced values, so every rank finds it in its own output and all fail alike. */
void gm_group_overflow(gcomp_mpi_bucket *b, gm_group *g, size_t tensor, const char *where);
/* Scans size words (count of them) for markers; records the first as a shared failure;
 * returns true when one was found. */
bool gm_scan_markers(gcomp_mpi_bucket *b, gm_group *g, const uint64_t *w, size_t count,
                     size_t per_rank);
uint64_t gm_ring_bytes(size_t bytes, int p);
/* Checks that every size word (count of them, per_rank per rank) carries the tag of this
 * rank's spec for its tensor; records GCOMP_E_MISMATCH and returns true when one does not.
 * Symmetric: when the ranks' specs are not all equal every rank finds a word that differs
 * from its own, so all skip together.  Call after gm_scan_markers. */
bool gm_scan_specs(gcomp_mpi_bucket *b, gm_group *g, const uint64_t *w, size_t count,
                   size_t per_rank);
/* Sizes of a v-collective from `count` size words per rank (xsize * per_rank words in w):
 * fills g->cnt_r / g->dsp_r and *total.  GCOMP_E_LIMIT when a count passes MPI's int
 * (every rank computes the same sums from the same words, so all agree). */
gcomp_status gm_gather_counts(gm_group *g, const uint64_t *w, size_t per_rank, size_t *total);

/* Element j's region when n elements are cut into `parts` equal regions: [lo(j), lo(j+1)). */
static inline size_t gm_region_lo(size_t n, int parts, int j) {
    return (size_t)(((unsigned __int128)n * (unsigned)j) / (unsigned)parts);
}

/* ---- the hierarchical wrapper (mpi_hier.c) ------------------------------------------------ */

/* The node-internal dense sum before a group's exchange and the broadcast after it. */
void gm_steps_hier_prefix(gm_group *g, int node_size);
void gm_steps_hier_suffix(gm_group *g, int node_size);

/* ---- specs, through the core's describe / get / set (mpi_spec.c) ----------------------- */

/*
 * The size at which the layer asks the core whether a spec is a contraction (auto's rsag
 * choice, the owner's feedback): the core's worst-case bounds grow with d = min(bucket, n),
 * so a spec accepted at this size is accepted for any smaller chunk, and every rank and
 * every region takes the same decision.
 */
#define GM_PROBE_N 65536

/* Canonical form, fingerprint and description of a spec (for auto and the set-up). */
gcomp_status gm_spec_describe(const char *spec, char *canon, size_t cap, uint64_t *fp,
                              gcomp_spec_info *info, gcomp_error *err);
/*
 * This rank's worker spec (allgather, sparse, rsag): with a seed of the rank's own when the
 * spec's draws are private (GCOMP_SPEC_PRIVATE_DRAWS without SHARED_DRAWS: rounding or
 * sampling values whose positions travel), so that the ranks' errors are independent and
 * the variance of the mean shrinks by P; else the spec itself.  Writes the spec for exchange
 * rank `rank` into out (cap bytes) with its fingerprint; *own says whether it differs.
 */
gcomp_status gm_rank_spec(const gm_tensor *t, int rank, char *out, size_t cap, uint64_t *fp,
                          bool *own);

/*
 * Decoders of the other ranks' worker messages, for strategies whose receivers decode what
 * each rank compressed (allgather; rsag's owners) when the ranks have seeds of their own
 * (gm_rank_spec): the core checks a message's fingerprint against its decoder's spec.
 */
typedef struct gm_peers {
    gcomp_compressor **dec; /* xsize; NULL for this rank (its own compressor decodes) */
    uint64_t *fp;           /* xsize: the fingerprint of each rank's messages */
    int count;
} gm_peers;
/* Sets t->wspec (this rank's worker spec) and, when the ranks' specs differ, one decoder of
 * `n` elements (shape rows x cols) per other rank.  Errors name the tensor in err. */
gcomp_status gm_peers_setup(gm_peers *p, gm_tensor *t, size_t n, size_t rows, size_t cols,
                            gcomp_error *err);
void gm_peers_free(gm_peers *p);
static inline gcomp_compressor *gm_peer_decoder(const gm_peers *p, int r, gcomp_compressor *mine) {
    return p->dec && p->dec[r] ? p->dec[r] : mine;
}
static inline uint64_t gm_peer_fp(const gm_peers *p, int r, uint64_t spec_fp) {
    return p->fp ? p->fp[r] : spec_fp;
}

#endif /* GCOMP_MPI_INTERNAL_H */

/*
 * internal.h - what the codec stages share inside libgradcomp (never installed).
 *
 * A compressor is three parts (GRACE's split): feedback (what is remembered between
 * steps), codec (one tensor in, one message out) and, outside this library, comm.
 *
 *   gcomp_encode(c, g)
 *     feedback->prepare : working vector x (g itself, or e + g into a fresh buffer)
 *     codec->encode     : header + payload; when the feedback keeps a residual, the codec
 *                         overwrites x[i] with x[i] - decoded[i] where it sent something
 *     feedback->commit  : only after success (swap buffers, momentum masking, step++)
 *
 * Most codecs are "selector + value coder": the generic pipeline in codec_sparse.c runs
 * a selector (which elements), a value coder (how each value travels) and an index coder
 * (how positions travel), and lays them out as the sparse section of docs/FORMAT.md.
 * Quantizers are the dense selector with a fixed value coder.  A codec that fits none of
 * that (PowerSGD) overrides encode/decode wholesale.
 */
#ifndef GCOMP_INTERNAL_H
#define GCOMP_INTERNAL_H

#include "gradcomp.h"
#include "../common/common.h" /* errors, memory, clock, LE access, rng, halves, varints */

#include <stdbool.h>
#include <string.h>

#define GCOMP__MAX_ITEMS 32 /* parameters in one parsed spec */
#define GCOMP__SPEC_MAX 512 /* canonical spec length */

/* Entries of a static array: parameter tables count themselves. */
#define GCOMP__COUNTOF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the registry (registry.def): wire ids and choices, from one list ---------------------- */

/* Value coder ids (docs/FORMAT.md, "Value coders"): GCOMP__V_f32, GCOMP__V_int8, ... */
enum {
#define GCOMP__VALUES(name, vid) GCOMP__V_##name = vid,
#define GCOMP__QUANTIZER(name, vid, id) GCOMP__V_##name = vid,
#include "core/registry.def"
};
/* Codec ids (docs/FORMAT.md, "Codec ids"): GCOMP__C_topk, GCOMP__C_int8, ... */
enum {
#define GCOMP__CODEC(name, id) GCOMP__C_##name = id,
#define GCOMP__QUANTIZER(name, vid, id) GCOMP__C_##name = id,
#include "core/registry.def"
};
/* "|f32|f16|..." and "|none|ef|dgc" in registry order (registry.c); the choices of values=
 * and feedback= start one character in, which is still a constant for static tables. */
extern const char gcomp__values_choices[];
extern const char gcomp__feedback_choices[];
#define GCOMP__VALUES_CHOICES (gcomp__values_choices + 1)
#define GCOMP__FEEDBACK_CHOICES (gcomp__feedback_choices + 1)
/* Name and wire id of a registered codec or value coder, for its definition: a name that
 * has no registry line does not compile. */
#define GCOMP__CODEC_NAME_ID(name) #name, GCOMP__C_##name
#define GCOMP__VCODER_NAME_ID(n_) .name = #n_, .id = GCOMP__V_##n_

/* ---- parsed spec ---------------------------------------------------------------------- */

typedef struct gcomp__vcoder gcomp__vcoder;

/* What a stage says about itself, combined by gcomp_spec_describe (spec_info.c). */
typedef struct gcomp__desc {
    unsigned traits; /* GCOMP_SPEC_* bits, and GCOMP__T_* below */
    double bits;     /* value coder: nominal bits per value */
    unsigned phases; /* multi-phase codec: reductions per step at most */
} gcomp__desc;
/* Codec trait: E|C(x) - x|^2 may reach |x|^2 whatever the value coder: the 1/p-scaled
 * selectors (feedback is refused at create, gcomp__ef_refusal) and low rank. */
#define GCOMP__T_NOT_CONTRACTION (1u << 31)

/* How many elements a codec's message carries (gcomp_spec_info.density). */
typedef enum gcomp__count {
    GCOMP__COUNT_ALL = 0,  /* every element (dense codecs, low rank) */
    GCOMP__COUNT_FIXED,    /* ceil(density * units), exactly: max_values at init */
    GCOMP__COUNT_EXPECTED, /* density= on average or within a tolerance */
    GCOMP__COUNT_DATA      /* depends on the data (threshold): at most all */
} gcomp__count;
typedef struct gcomp__codec gcomp__codec;
typedef struct gcomp__feedback gcomp__feedback;

/* The parameter tables of a spec, in canonical order. */
enum { GCOMP__TABLE_CODEC, GCOMP__TABLE_VALUES, GCOMP__TABLE_COMMON, GCOMP__TABLE_FEEDBACK };

typedef struct gcomp__spec {
    const gcomp__codec *codec;
    const gcomp__vcoder *vcoder;     /* value coder chosen by values= (or fixed) */
    const gcomp__feedback *feedback; /* none, ef, dgc */
    size_t count;
    struct {
        const gcomp_param_info *p;
        double v;
        unsigned table; /* whose key: GCOMP__TABLE_* */
    } items[GCOMP__MAX_ITEMS];
    char canonical[GCOMP__SPEC_MAX];
    uint64_t fingerprint;
} gcomp__spec;

/* Value of a parameter by name; the parser guarantees every table entry is present, so a
 * missing name is a programming error and returns `dflt`. */
double gcomp__spec_num(const gcomp__spec *s, const char *name, double dflt);
gcomp_status gcomp__spec_parse(const char *text, gcomp__spec *out, gcomp_error *err);

/* ---- memory ----------------------------------------------------------------------------- */

/* Test hook: fail the allocation after `n` more succeed; (size_t)-1 disables.  Sets this
 * library's gcomp__alloc_fail_after (common.h). */
GCOMP_API void gcomp__test_fail_alloc_after(size_t n);

/* ---- checksums, hashing, random numbers --------------------------------------------------- */

/* CRC-32C (gcomp__crc32c) and FNV-1a 64 (gcomp__fnv1a64) are in common.h, as is the
 * counter-based generator (gcomp__mix64, gcomp__rand64). */

/* Uniform in [0, 1) with 24 bits. */
static inline float gcomp__rand01(uint64_t key, uint64_t i) {
    return (float)(gcomp__rand64(key, i) >> 40) * (1.0f / 16777216.0f);
}
/* Stream key of (seed, step, purpose): ranks with the same seed and step agree. */
static inline uint64_t gcomp__stream(uint64_t seed, uint64_t step, uint64_t purpose) {
    return gcomp__mix64(gcomp__mix64(seed ^ 0x6a09e667f3bcc909ull) + step * 0x3c6ef372fe94f82bull +
                        purpose);
}

/* ---- value coders --------------------------------------------------------------------------- */

/* Parameters a value coder reads from the spec, resolved once at create. */
typedef struct gcomp__vparams {
    const gcomp__spec *spec; /* for coder-specific keys */
    uint64_t seed;
} gcomp__vparams;

struct gcomp__vcoder {
    const char *name;
    uint8_t id;
    const gcomp_param_info *params; /* keys this coder adds to the spec (bucket=, ...) */
    size_t nparams;
    /* Bytes for `nv` values at most. */
    size_t (*bound)(const gcomp__vparams *p, size_t nv);
    /* Codes v[0..nv).  `res` is NULL or may alias v: res[i] = v[i] - decoded(v[i]).
     * `key` seeds stochastic rounding.  Non-finite input: GCOMP_E_NONFINITE. */
    gcomp_status (*encode)(const gcomp__vparams *p, const float *v, size_t nv, float *res,
                           uint64_t key, uint8_t *dst, size_t cap, size_t *len);
    /* Optional, the fused residual of error feedback: codes x = e[i] + g[i] (that sum, e
     * first, as feedback_ef.c would form it) in the same pass, writing res[i] = x -
     * decoded(x) (res may alias e).  e and g are read once and x is never stored, so
     * error feedback costs the coder no pass of its own: MXNet's 2-bit kernel reads the
     * residual and the gradient and writes the residual once.  The bytes and the residual
     * must be exactly encode's on the formed sum (tests/unit/test_twobit.c).  Non-finite
     * x: GCOMP_E_NONFINITE.  Used by the ef feedback when the codec sends every element
     * (gcomp__fuses_residual). */
    gcomp_status (*encode_fused)(const gcomp__vparams *p, const float *e, const float *g, size_t nv,
                                 float *res, uint64_t key, uint8_t *dst, size_t cap, size_t *len);
    /* Untrusted input: src[0..len) must describe exactly nv values.  acc NULL validates
     * only; otherwise acc[i] += scale * value_i for i < nv.  Every error is detected
     * before the first write to acc. */
    gcomp_status (*decode)(const uint8_t *src, size_t len, size_t nv, float *acc, float scale);
    /* Optional, for coders that draw random numbers: a bound, over every input of at most
     * nv values, on E|C(v) - v|^2 / |v|^2.  Error feedback converges for a contraction,
     * a bound below 1 (Stich et al. 2018, Karimireddy et al. 2019); at 1 or more the
     * compressor refuses feedback (gcomp__compressor_build).  `fix` receives what to change
     * instead.  NULL: a contraction by construction (deterministic, or error within a
     * fraction of the bucket's range). */
    double (*ef_ratio)(const gcomp__vparams *p, size_t nv, char *fix, size_t fixcap);

    /* What the coding is (gcomp_spec_describe): the plain-float wire type, or OTHER; the
     * nominal bits per value; GCOMP_SPEC_UNBIASED (E[decoded] = v), _PRIVATE_DRAWS,
     * _SATURATING as they hold at the default parameters. */
    gcomp_value_type type;
    double bits;
    unsigned traits;
    /* Optional: corrects bits and traits for the spec's parameters (int8's rounding=,
     * qsgd's levels=). */
    void (*describe)(const gcomp__vparams *p, gcomp__desc *d);
};

const gcomp__vcoder *gcomp__vcoder_find(const char *name);
const gcomp__vcoder *gcomp__vcoder_by_id(uint8_t id);

/* ---- index coders ---------------------------------------------------------------------------- */

enum {
    GCOMP__IX_NONE = 0,   /* dense: every position, in order */
    GCOMP__IX_BITMAP = 1, /* one bit per position */
    GCOMP__IX_VARINT = 2, /* gaps as LEB128 */
    GCOMP__IX_ELIAS_FANO = 3,
    GCOMP__IX_SEEDED = 4 /* k positions drawn from a 64-bit key (random-k) */
};
const char *gcomp__index_name(unsigned kind);
/* Chooses the smallest of bitmap / varint / Elias-Fano for k strictly ascending idx < n
 * and writes it; *kind receives the choice. */
size_t gcomp__index_bound(size_t k, size_t n);
gcomp_status gcomp__index_encode(const uint32_t *idx, size_t k, size_t n, uint8_t *dst, size_t cap,
                                 size_t *len, unsigned *kind);
/* Checks, before any allocation, that `len` index bytes of `kind` can hold k entries below
 * n: bitmap and Elias-Fano sizes are exact, varint takes 1..5 bytes an entry.  So k is at
 * most 8 * len and a decoder may size its workspace by k.  GCOMP_E_CORRUPT otherwise. */
gcomp_status gcomp__index_check_len(unsigned kind, size_t len, size_t k, size_t n);
/* Decodes and validates (strictly ascending, < n, exact length). */
gcomp_status gcomp__index_decode(unsigned kind, const uint8_t *src, size_t len, size_t k, size_t n,
                                 uint32_t *idx);
/* The positions of random-k: gcomp__seeded_indices (common.h). */

/* ---- selection --------------------------------------------------------------------------------
 */

/* How index entries expand to element positions (docs/FORMAT.md, sparse section). */
enum {
    GCOMP__EXPAND_ELEM = 0,  /* entry i is element i */
    GCOMP__EXPAND_RUN = 1,   /* entry b covers [b*unit, min(n, (b+1)*unit)) (blocks, rows) */
    GCOMP__EXPAND_STRIDE = 2 /* entry j covers j, j+stride, ... (unit of them) (columns) */
};

/* What a selector hands the generic pipeline.  Buffers belong to the compressor's
 * workspace (gcomp__sel_reserve). */
typedef struct gcomp__selection {
    uint32_t *idx; /* k entries, strictly ascending */
    float *val;    /* nvals values in expansion order, already scaled (1/p for unbiased) */
    size_t k, nvals;
    unsigned index_kind; /* GCOMP__IX_SEEDED, or anything else: the smallest coding */
    uint64_t seed_key;   /* GCOMP__IX_SEEDED */
    unsigned expand;
    uint32_t unit, stride;
} gcomp__selection;

/* Finds the k largest |x| exactly (ties: lower index first); idx ascending, val = x[idx].
 * O(n): a sampled threshold and one SIMD compaction pass, with an exact radix select as
 * the fallback.  Sets *nonfinite when x holds NaN/Inf (then the output is unspecified). */
gcomp_status gcomp__topk(gcomp_compressor *c, const float *x, size_t n, size_t k,
                         gcomp__selection *sel, bool *nonfinite);
/* Which branch gcomp__topk took last (c->topk_path; tests check that each is reached). */
enum {
    GCOMP__TOPK_SMALL,   /* n <= 8192, k = 0 or k = n: every element is a candidate */
    GCOMP__TOPK_SAMPLED, /* sampled threshold, one compaction pass over x */
    GCOMP__TOPK_PREPASS, /* the candidates came from the feedback's pass (gcomp__topk_plan_make) */
    GCOMP__TOPK_RETRY,   /* too few at the first threshold; a pass at a lower one */
    GCOMP__TOPK_RADIX    /* exact radix select (ties, a zero threshold, a misleading sample) */
};

/* ---- top-k selected in the pass that builds x ----------------------------------------------
 * A feedback builds the working vector x in a pass of its own (ef: e + g; dgc: the
 * momentum update).  When the codec selects by exact top-k (codec->topk_k), that pass can
 * also collect the candidates, so that the selection does not read x again.  DGC does
 * the same (Lin et al. 2018: the top-k of a small sample estimates the threshold, and a
 * precise one is taken among the gradients above it); here the result stays exact:
 *   1. gcomp__topk_plan_make, before the pass: the threshold t from a sample of x, which the
 *      feedback computes at the sampled positions only (`fill`), and room for the
 *      candidates in the selection buffers;
 *   2. the pass: x_i as before, and every |x_i| >= t appended to (p.idx, p.val) up to
 *      p.cap, counting past it (select/collect.h);
 *   3. gcomp__topk_plan_done, after a successful pass: hands the count to the selector's
 *      gcomp__topk(c, x, n, k), which keeps the top k of the candidates (exact whenever at
 *      least k were collected) and otherwise falls back on its own: a second pass only then.
 * The selection is the same elements in the same order as without the plan. */
typedef void (*gcomp__sample_fn)(const void *ctx, const uint32_t *pos, size_t count, float *out);
typedef struct gcomp__topk_plan {
    bool active;   /* false: the fused path does not apply (small n, k = 0 or n, fuse_off) */
    float t;       /* collect |x| >= t (+inf: collect nothing, the selection uses radix) */
    size_t k, cap; /* the selection's k; room in idx/val */
    uint32_t *idx; /* the compressor's selection buffers */
    float *val;
} gcomp__topk_plan;
/* `fill(ctx, pos, count, out)` writes out[j] = x[pos[j]] as the pass will compute it
 * (pos ascending, in runs of 8).  Returns
 * GCOMP_E_NOMEM when the buffers cannot grow (nothing changed), else GCOMP_OK. */
gcomp_status gcomp__topk_plan_make(gcomp_compressor *c, size_t k, gcomp__sample_fn fill,
                                   const void *ctx, gcomp__topk_plan *p);
/* After the pass over x found m candidates (m may exceed p->cap). */
void gcomp__topk_plan_done(gcomp_compressor *c, const gcomp__topk_plan *p, const float *x,
                           size_t m);

/* Effective density of this step (select_topk.c): c->density_override when > 0 (DGC's
 * warm-up sets it per epoch), else the spec's density=; and k = ceil(density * n), raised
 * to min_k= where the codec has it, and at most n.
 * Selectors that take a count from density= read these, so schedules apply to them. */
double gcomp__density(const gcomp_compressor *c);
size_t gcomp__density_k(const gcomp_compressor *c);
/* Collects every i with |x[i]| >= t into idx/val (ascending) up to `cap`; returns the total
 * count (which may exceed cap: then only cap were written). */
size_t gcomp__collect_ge(const float *x, size_t n, float t, uint32_t *idx, float *val, size_t cap);
/* 1 when x[0..n) is all finite. */
bool gcomp__all_finite(const float *x, size_t n);

/* ---- codecs ------------------------------------------------------------------------------------
 */

struct gcomp__codec {
    gcomp_codec_info info;
    /* Quantizer codecs: dense selection with this fixed value coder; NULL: `values=`. */
    const gcomp__vcoder *fixed_values;
    /* Generic pipeline: choose elements of x (the working vector).  NULL for dense. */
    gcomp_status (*select)(gcomp_compressor *c, const float *x, gcomp__selection *sel);
    /* Optional: validate shape/params and allocate codec state (c->codec_state). */
    gcomp_status (*init)(gcomp_compressor *c, gcomp_error *err);
    void (*fini)(gcomp_compressor *c);
    /* Optional overrides of the whole pipeline (multi-phase codecs). */
    size_t (*payload_bound)(const gcomp_compressor *c);
    gcomp_status (*encode)(gcomp_compressor *c, const float *x, float *res, uint8_t *payload,
                           size_t cap, size_t *len);
    gcomp_status (*decode)(const uint8_t *payload, size_t len, size_t n, float *acc, float scale,
                           gcomp__buf *ws);
    /* Optional: for a selector that keeps exactly the k largest |x| through gcomp__topk,
     * the k of this step.  A feedback that builds x in a pass of its own then collects the
     * candidates in that pass (gcomp__topk_plan_make) instead of the selector reading x again. */
    size_t (*topk_k)(const gcomp_compressor *c);
    /* Optional, with a custom decode: fills elements_sent, index_coding, value_coding of a
     * message whose header was checked (gcomp_message_inspect); the payload is untrusted. */
    gcomp_status (*inspect)(const uint8_t *payload, size_t len, gcomp_message_info *info);
    /* Optional, for a codec that keeps its own residual (GCOMP_SPEC_FEEDBACK in `traits`:
     * PowerSGD), used by retune (retune.c): `held` writes what it holds back (n floats,
     * overwriting out); `absorb` takes a replaced compressor's held-back vector into its
     * residual, and its warm start when `from` has the same codec and shape
     * (GCOMP_E_UNSUPPORTED: it cannot keep it); `busy` says a multi-phase step is in flight
     * (retune then refuses); `dense_only` says every step is dense (PowerSGD on a vector,
     * or where low rank does not pay): there is no residual to absorb into, so a retune
     * leaves what was held back as the carry, which the next message sends, as for a spec
     * without feedback. */
    void (*held)(const gcomp_compressor *c, float *out);
    gcomp_status (*absorb)(gcomp_compressor *c, const float *held, const gcomp_compressor *from);
    bool (*busy)(const gcomp_compressor *c);
    bool (*dense_only)(const gcomp_compressor *c);
    /* Optional codec-private state (beyond feedback buffers), for save/load.  state_size
     * reads only the spec, n and the shape, never codec_state: from_state sizes a blob's
     * sections with it before anything is allocated. */
    size_t (*state_size)(const gcomp_compressor *c);
    void (*state_save)(const gcomp_compressor *c, uint8_t *dst);
    gcomp_status (*state_load)(gcomp_compressor *c, const uint8_t *src, size_t len);
    void (*state_reset)(gcomp_compressor *c);
    /* Feedback this codec implies and does not let the spec change (MXNet 2-bit keeps a
     * residual by definition: "ef"; the dgc codec: "dgc").  NULL: the spec chooses. */
    const char *fixed_feedback;

    /* What the codec is, with an exact value coder (gcomp_spec_describe): GCOMP_SPEC_*
     * traits of its selection -- _SEEDED_POSITIONS, _SHARED_DRAWS, _PRIVATE_DRAWS,
     * _UNBIASED (the dense selection is exact: unbiased), _FEEDBACK (a residual of its
     * own) -- and GCOMP__T_NOT_CONTRACTION; how many elements it sends.  SPARSE, LINEAR
     * (positions alike on every rank), MULTIPHASE and NEEDS_SHAPE are info.flags. */
    unsigned traits;
    gcomp__count count;
    /* Optional: corrects traits (and phases) for the spec's parameters (randomk's
     * unbiased=, powersgd's iters=). */
    void (*describe)(const gcomp__spec *s, gcomp__desc *d);
};

const gcomp__codec *gcomp__codec_find(const char *name);
/* Parameters most selectors share, so their tables do not repeat them. */
#define GCOMP__PARAM_VALUES                                                                        \
    {                                                                                              \
        "values", GCOMP_PARAM_ENUM, 0, 0, 0, "f32", GCOMP__VALUES_CHOICES,                         \
            "how each kept value travels (a value coder; its own keys are accepted too)"           \
    }
#define GCOMP__PARAM_DENSITY(dflt)                                                                 \
    {                                                                                              \
        "density", GCOMP_PARAM_FLOAT, 0, 1, 1, dflt, NULL,                                         \
            "fraction of elements sent: k = ceil(density * n)"                                     \
    }
/* The floor on that count, next to density= in every codec that takes a count from it. */
#define GCOMP__PARAM_MIN_K                                                                         \
    {                                                                                              \
        "min_k", GCOMP_PARAM_INT, 0, 4294967295.0, 0, "0", NULL,                                   \
            "at least this many elements a step (all of them when n is smaller): "                 \
            "k = max(ceil(density * n), min(min_k, n))"                                            \
    }
/* The dense codec of a value coder registered with GCOMP__QUANTIZER: every element, coded
 * by gcomp__vcoder_<name>, whose parameter table is the codec's own.  `feedback`: NULL, or
 * the feedback that is part of the method (twobit: "ef"). */
#define GCOMP__QUANTIZER_CODEC(name_, params_, nparams_, flags_, feedback_, help_)                 \
    const gcomp__codec gcomp__codec_##name_ = {                                                    \
        .info = {GCOMP__CODEC_NAME_ID(name_), GCOMP_CODEC_QUANTIZER | (flags_), help_, params_,    \
                 nparams_},                                                                        \
        .fixed_values = &gcomp__vcoder_##name_,                                                    \
        .fixed_feedback = feedback_,                                                               \
        .traits = GCOMP_SPEC_UNBIASED, /* the dense selection: every element */                    \
        .count = GCOMP__COUNT_ALL,                                                                 \
    }
const gcomp__codec *gcomp__codec_by_id(uint16_t id);

/* Generic sparse/dense pipeline (codec_sparse.c). */
size_t gcomp__sparse_payload_bound(const gcomp_compressor *c);
gcomp_status gcomp__sparse_encode(gcomp_compressor *c, const float *x, float *res, uint8_t *payload,
                                  size_t cap, size_t *len);
gcomp_status gcomp__sparse_decode(const uint8_t *payload, size_t len, size_t n, float *acc,
                                  float scale, gcomp__buf *ws);
gcomp_status gcomp__sparse_info(const uint8_t *payload, size_t len, gcomp_message_info *info);

/* ---- feedback -----------------------------------------------------------------------------------
 */

struct gcomp__feedback {
    gcomp_feedback_info info; /* name, help and the keys it adds (momentum=, ...) */
    gcomp_status (*init)(gcomp_compressor *c);
    void (*fini)(gcomp_compressor *c);
    /* Working vector for this step: *x = g (no feedback) or a workspace holding e + g.
     * *res is where the codec writes x - decoded (NULL: no residual kept).  Must not
     * change the saved state; checks g for NaN/Inf. */
    gcomp_status (*prepare)(gcomp_compressor *c, const float *g, const float **x, float **res);
    /* Called only after a successful encode: make the new state current. */
    void (*commit)(gcomp_compressor *c);
    /* Reads only the spec, n and the shape (see the codec's state_size). */
    size_t (*state_size)(const gcomp_compressor *c);
    void (*state_save)(const gcomp_compressor *c, uint8_t *dst);
    gcomp_status (*state_load)(gcomp_compressor *c, const uint8_t *src, size_t len);
    void (*state_reset)(gcomp_compressor *c);
    const float *(*residual)(const gcomp_compressor *c);
    unsigned traits; /* GCOMP_SPEC_FEEDBACK, _MOMENTUM (gcomp_spec_describe) */
    /* Retune (retune.c): adds `held` (n floats that the compressor being replaced still
     * held back) into what this feedback holds back, and takes over `from`'s momentum when
     * `from` keeps momentum of its kind.  NULL for a feedback that keeps nothing (none):
     * the held-back vector then rides in the next message (gcomp_compressor.carry). */
    void (*absorb)(gcomp_compressor *c, const float *held, const gcomp_compressor *from);
    /* For a feedback that keeps the momentum (GCOMP_SPEC_MOMENTUM): its momentum m and,
     * when u is not NULL, its momentum vector (n floats).  Retune converts what is held
     * back across the momentum boundary with it (retune.c). */
    float (*momentum)(const gcomp_compressor *c, const float **u);
};
const gcomp__feedback *gcomp__feedback_find(const char *name);
#define GCOMP__FEEDBACK(name) extern const gcomp__feedback gcomp__feedback_##name;
#include "core/registry.def"

/* Whether the value coder forms the error-feedback sum e + g in its own pass
 * (vcoder.encode_fused): the codec sends every element through the generic pipeline. */
bool gcomp__fuses_residual(const gcomp__spec *s);

/* ---- the compressor object ---------------------------------------------------------------------
 */

struct gcomp_compressor {
    gcomp__spec spec;
    const gcomp__codec *codec;
    size_t n, rows, cols;
    uint64_t seed;
    uint64_t step; /* successful encodes */
    double epoch;  /* set by the caller; schedules read it */
    /* > 0: the density selectors use instead of density= (gcomp__density), set by the dgc
     * feedback for its warm-up; at create it holds the largest density the schedule will
     * use, so codec init sizes max_entries (and encode_bound) for the warm-up start. */
    double density_override;

    gcomp__vparams vp;
    size_t max_entries, max_values; /* selection size bound, set by codec init (default n) */
    void *codec_state;
    void *fb_state;
    /* Set by the feedback's prepare for this step: when not NULL the working vector is
     * x + x_add, left for the value coder to form (vcoder.encode_fused). */
    const float *x_add;

    /* Workspace for selection (reused every step). */
    gcomp__buf sel_idx, sel_val, sel_tmp, sel_res, scratch;
    gcomp__selection last; /* the last successful selection (DGC masking reads it) */
    struct {               /* candidates a feedback pass collected (gcomp__topk_plan_done) */
        const float *x;    /* the vector they came from; NULL: none */
        size_t k, m, cap, rank, s;
        bool radix;
    } topk_pre;
    unsigned topk_path; /* GCOMP__TOPK_*: the branch the last gcomp__topk took */
    bool fuse_off;      /* tests: build x and select in separate passes (the reference) */
    bool last_dense;    /* the last message carried every element */
    gcomp__buf dec_ws;  /* decode workspace */
    /* What a retune left that this spec's feedback cannot hold (it keeps no residual):
     * n floats the next successful encode adds to its gradient, then frees; carry_ws is
     * that step's sum.  NULL when nothing is pending (retune.c). */
    float *carry, *carry_ws;

    gcomp_stats stats;
};

/* Whether c keeps what a retune hands it (its feedback's residual, or the codec's own, as
 * PowerSGD's E) rather than a carry for its next message (retune.c, gcomp_state_load). */
static inline bool gcomp__keeps_held(const gcomp_compressor *c) {
    if (c->spec.feedback->absorb) return true;
    return c->codec->absorb && !(c->codec->dense_only && c->codec->dense_only(c));
}

/* gcomp_compressor_create after the spec is parsed: checks n and the shape, allocates the
 * feedback and codec state.  The policy's size estimate builds one with feedback none. */
gcomp_status gcomp__compressor_build(gcomp_compressor **out, const gcomp__spec *parsed, size_t n,
                                     size_t rows, size_t cols, gcomp_error *err);

/* Whether error feedback around the codec of `s` converges when the codec hands the value
 * coder at most `max_values` values (SIZE_MAX: any number): GCOMP_OK, or GCOMP_E_SPEC with
 * the reason and what to change in `msg`.  The one rule behind both the refusal at create
 * and GCOMP_SPEC_CONTRACTION. */
gcomp_status gcomp__ef_refusal(const gcomp__spec *s, const gcomp__vparams *vp, size_t max_values,
                               const char *feedback, char *msg, size_t cap);

/* Grows the selection buffers to hold k index entries and nv values. */
gcomp_status gcomp__sel_reserve(gcomp_compressor *c, size_t k, size_t nv, gcomp__selection *sel);

#endif /* GCOMP_INTERNAL_H */

/*
 * gradcomp.h - gradient compression for data-parallel training (core API, no MPI).
 *
 * A compressor turns one float32 gradient tensor into one self-describing message and
 * keeps whatever it must remember between steps (error-feedback residual, momentum,
 * warm-started factors, the step counter).  Decoding needs only the message: the
 * receiver adds the decoded tensor, scaled, into a float32 accumulator.
 *
 *     gcomp_compressor *c;
 *     gcomp_error err;
 *     if (gcomp_compressor_create(&c, "topk:density=0.001,values=f16,feedback=ef",
 *                                 n, 0, 0, &err) != GCOMP_OK) { puts(err.message); ... }
 *     size_t cap = gcomp_encode_bound(c), len;
 *     void *msg = malloc(cap);
 *     gcomp_encode(c, grad, msg, cap, &len);                 // once per training step
 *     gcomp_decode_add(msg, len, sum, n, 1.0f / nranks);      // on every receiver
 *
 * Spec strings
 *   `name[:key=value,...]`, e.g. `topk:density=0.001,values=f16,feedback=ef`,
 *   `twobit:threshold=0.5`, `qsgd:levels=16`, `randomk:density=0.01,seed=7`.  The same
 *   string works in C, the CLI and Python.  Every codec publishes its parameter table
 *   (gcomp_codec_info); unknown names, keys and out-of-range values are rejected with a
 *   status and a message naming the culprit and what is allowed.
 *
 * Threading
 *   An object (compressor, decoder) is used by one thread at a time; distinct objects are
 *   independent.  Functions that take no object are thread-safe.  The library has no
 *   mutable global state, never prints, never exits and never aborts.
 *   The hot loops split over OpenMP threads (OMP_NUM_THREADS).  PowerSGD from rank 9 on
 *   also decodes, and from rank 16 on encodes, through OpenBLAS, which runs a thread pool
 *   of its own.  With both pools at their defaults they contend for the cores: on 2 cores
 *   a 1024 x 1024 rank-16 encode took 7.0-9.5 ms on average instead of 3.0-4.3 ms with
 *   either pool at one thread (`gradcomp bench --pairs`; likely each pool's threads
 *   spinning between calls, not taken apart).  There, give one of them one thread
 *   (OPENBLAS_NUM_THREADS=1 or OMP_NUM_THREADS=1); `gradcomp train` sets both to 1 for
 *   every rank.  Up to rank 8 PowerSGD calls no BLAS.
 *
 * Ownership
 *   Every `create` has a `free`; `free(NULL)` is a no-op; a failed `create` leaves nothing
 *   allocated and sets *out to NULL.  Buffers passed in are borrowed for the call only.
 *
 * Wire format: docs/FORMAT.md (normative).  Little-endian, versioned, checksummed.
 */
#ifndef GRADCOMP_H
#define GRADCOMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GCOMP_BUILDING)
#define GCOMP_API __attribute__((visibility("default")))
#else
#define GCOMP_API
#endif

#define GCOMP_VERSION_MAJOR 0
#define GCOMP_VERSION_MINOR 1
#define GCOMP_VERSION_PATCH 0
/** Wire format version written by this library (docs/FORMAT.md). */
#define GCOMP_FORMAT_VERSION 1
/** Size in bytes of the fixed message header. */
#define GCOMP_HEADER_SIZE 40

/**
 * Status codes.  Values are never renumbered once released; new ones are appended.
 * gcomp_status_str() names each one.
 */
typedef enum gcomp_status {
    GCOMP_OK = 0,
    GCOMP_E_ARG = 1,           /**< invalid argument (NULL where not allowed, size 0, ...) */
    GCOMP_E_NOMEM = 2,         /**< an allocation failed */
    GCOMP_E_SPEC = 3,          /**< spec string: syntax, unknown key or bad value */
    GCOMP_E_UNKNOWN_CODEC = 4, /**< spec names a codec this library does not have */
    GCOMP_E_DST_SIZE = 5,      /**< destination buffer too small (never with encode_bound) */
    GCOMP_E_TRUNCATED = 6,     /**< message shorter than its header says */
    GCOMP_E_BAD_MAGIC = 7,     /**< not a gradcomp message (or state blob) */
    GCOMP_E_VERSION = 8,       /**< format version newer than this library supports */
    GCOMP_E_CODEC_ID = 9,      /**< message names a codec id this library does not know */
    GCOMP_E_CHECKSUM = 10,     /**< header or payload checksum mismatch: corrupt data */
    GCOMP_E_CORRUPT = 11,      /**< checksums fine but the content violates the format */
    GCOMP_E_MISMATCH = 12,     /**< sizes, spec fingerprints or settings differ */
    GCOMP_E_NONFINITE = 13,    /**< gradient contains NaN or Inf; nothing was changed */
    GCOMP_E_STATE = 14,        /**< saved state is corrupt or belongs to another tensor */
    GCOMP_E_LIMIT = 15,        /**< a size exceeds what the format or a limit allows */
    GCOMP_E_PROTOCOL = 16,     /**< calls made in the wrong order (multi-phase codecs) */
    GCOMP_E_TIMEOUT = 17,      /**< a collective did not complete in time (MPI layer) */
    GCOMP_E_MPI = 18,          /**< an MPI call failed (MPI layer) */
    GCOMP_E_FAILED = 19,       /**< the object is in a failed state until reset (MPI layer) */
    GCOMP_E_UNSUPPORTED = 20,  /**< operation not available for this codec or build */
    GCOMP_E_IO = 21            /**< file or data-set I/O error (tools, trainer) */
} gcomp_status;

/** Returns a static, human-readable name for a status ("checksum mismatch", ...). */
GCOMP_API const char *gcomp_status_str(gcomp_status s);

/** Library version as "MAJOR.MINOR.PATCH". */
GCOMP_API const char *gcomp_version(void);

/**
 * Optional detail for a failed call: the status and a message a user can act on
 * (e.g. "topk: unknown key 'densty'; allowed: density, values, feedback, seed").
 * Every function that takes a `gcomp_error *` accepts NULL.
 */
typedef struct gcomp_error {
    gcomp_status status;
    char message[256];
} gcomp_error;

/* ------------------------------------------------------------------------------------- */
/* Codec registry                                                                          */

typedef enum gcomp_param_type {
    GCOMP_PARAM_INT = 0,   /**< unsigned 64-bit integer */
    GCOMP_PARAM_FLOAT = 1, /**< double */
    GCOMP_PARAM_ENUM = 2,  /**< one of `choices` ("a|b|c") */
    GCOMP_PARAM_BOOL = 3   /**< 0 or 1 */
} gcomp_param_type;

/** One parameter of a codec, as the parser, `gradcomp list-codecs` and Python see it. */
typedef struct gcomp_param_info {
    const char *name;
    gcomp_param_type type;
    double min, max;     /**< inclusive range (INT, FLOAT) */
    int min_exclusive;   /**< 1 when `min` itself is not allowed (e.g. density > 0) */
    const char *deflt;   /**< default, as it would be written in a spec */
    const char *choices; /**< ENUM: "a|b|c"; NULL otherwise */
    const char *help;
} gcomp_param_info;

/** Codec properties (bit flags in gcomp_codec_info.flags).  What a whole spec (codec, value
 *  coder and feedback together) does is gcomp_spec_describe's. */
enum {
    GCOMP_CODEC_SPARSE = 1u << 0, /**< sends a subset of elements (indices travel or are seeded) */
    GCOMP_CODEC_LINEAR = 1u << 1, /**< positions alike on every rank (all, or from the shared
                                       seed): with plain-float values its messages sum by a
                                       dense allreduce (a whole spec: GCOMP_SPEC_LINEAR) */
    GCOMP_CODEC_STOCHASTIC = 1u << 2, /**< uses the seed; same seed and input give the same bytes */
    GCOMP_CODEC_QUANTIZER = 1u << 3,  /**< a value coder usable as `values=` of any selector */
    GCOMP_CODEC_MULTIPHASE = 1u << 4, /**< has a multi-round protocol (PowerSGD) besides encode */
    GCOMP_CODEC_NEEDS_SHAPE = 1u << 5 /**< uses the tensor's matrix shape */
};

typedef struct gcomp_codec_info {
    const char *name;
    uint16_t id; /**< codec id on the wire */
    unsigned flags;
    const char *help;
    const gcomp_param_info *params; /**< this codec's own parameters */
    size_t nparams;
} gcomp_codec_info;

/** Number of codecs in the registry, and the i-th one (NULL when out of range). */
GCOMP_API size_t gcomp_codec_count(void);
GCOMP_API const gcomp_codec_info *gcomp_codec_at(size_t i);
/** Looks a codec up by name or by wire id; NULL when there is none. */
GCOMP_API const gcomp_codec_info *gcomp_codec_find(const char *name);
GCOMP_API const gcomp_codec_info *gcomp_codec_by_id(uint16_t id);

/** Parameters every codec accepts: feedback= and seed=.  The keys a feedback stage adds
 *  (feedback=dgc's momentum=, ...) are its own (gcomp_feedback_at). */
GCOMP_API const gcomp_param_info *gcomp_common_params(size_t *count);

/** A feedback stage, a choice of `feedback=`: what a compressor remembers between steps. */
typedef struct gcomp_feedback_info {
    const char *name; /**< "none", "ef", "dgc" */
    const char *help;
    const gcomp_param_info *params; /**< the keys it adds to a spec that chooses it */
    size_t nparams;
} gcomp_feedback_info;

/** Number of feedback stages, and the i-th one (NULL when out of range). */
GCOMP_API size_t gcomp_feedback_count(void);
GCOMP_API const gcomp_feedback_info *gcomp_feedback_at(size_t i);

/**
 * Validates `spec` and writes its canonical form (codec name, then every parameter in
 * table order with its value, defaults included) into `out` (NUL-terminated).
 * Returns GCOMP_OK, GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC or GCOMP_E_DST_SIZE.
 * `fingerprint` (may be NULL) receives the 64-bit fingerprint of the canonical form: the
 * value every message made with this spec carries in its header.
 */
GCOMP_API gcomp_status gcomp_spec_canonical(const char *spec, char *out, size_t out_cap,
                                            uint64_t *fingerprint, gcomp_error *err);

/* ---- what a whole spec is: for transports and bindings, which must not parse specs ---- */

/**
 * Properties of a whole spec: its codec, value coder and feedback together (bit flags in
 * gcomp_spec_info.flags).  Each stage states its own in the registry (src/core, the
 * codec's file); gcomp_spec_describe combines them, so a transport decides on flags and
 * never on codec names.
 */
enum {
    /** Sends a subset of the elements (indices travel, or are drawn from the seed). */
    GCOMP_SPEC_SPARSE = 1u << 0,
    /** Every rank's message has the same positions (all of them, or drawn from the shared
     *  seed and the step) and float values of `value_type`, so messages sum by a dense
     *  allreduce of their values: `none` and `randomk` with f32/f16/bf16 values. */
    GCOMP_SPEC_LINEAR = 1u << 1,
    /** Positions come from seed= and the step (random-k): ranks must share the seed. */
    GCOMP_SPEC_SEEDED_POSITIONS = 1u << 2,
    /** Draws random numbers only to round or sample values whose positions travel (qsgd,
     *  ternary, int8/int4 with rounding=stochastic, natural, bernoulli, importance, the
     *  sample of `sampled`): each rank should use a seed of its own, so that the ranks'
     *  errors are independent and average out.  When GCOMP_SPEC_SHARED_DRAWS is set too
     *  (randomk with values=qsgd), the shared seed wins. */
    GCOMP_SPEC_PRIVATE_DRAWS = 1u << 3,
    /** Draws that every rank must make alike (random-k positions, PowerSGD's starting and
     *  replacement Q columns): seed= must be equal on all ranks. */
    GCOMP_SPEC_SHARED_DRAWS = 1u << 4,
    /** Runs the gcomp_lowrank_* protocol: at most `phases` reductions per step. */
    GCOMP_SPEC_MULTIPHASE = 1u << 5,
    /** Uses the tensor's matrix shape (rows, cols, powersgd). */
    GCOMP_SPEC_NEEDS_SHAPE = 1u << 6,
    /** Dense, every element travels, in a value coding that is not a plain float (int8,
     *  int4, sign, twobit, ternary, qsgd, natural; `none:values=int8` too).  Dense plain
     *  floats (`none:values=f16`) are GCOMP_SPEC_LINEAR instead. */
    GCOMP_SPEC_QUANTIZER = 1u << 7,
    /** Error feedback around it converges, so this spec with feedback=ef is accepted by
     *  gcomp_compressor_create for a tensor of `n` elements (exactly then, for specs whose
     *  feedback can be set): a contraction, E|C(x) - x|^2 < |x|^2 (top-k, random-k,
     *  sign, int8/int4, qsgd and ternary where their worst-case bound is below 1), or an
     *  error bounded per element whatever the input (threshold, twobit: below t).  Not:
     *  the 1/p-scaled selectors (bernoulli, importance, randomk:unbiased=1), qsgd/ternary
     *  whose bound reaches 1 at that size, and powersgd (its remainder after projection is
     *  at most |x|^2, not less for every input; it keeps its own residual anyway). */
    GCOMP_SPEC_CONTRACTION = 1u << 8,
    /** A value travels as at most a fixed magnitude (twobit's +-t): a message cannot carry
     *  more than t per element, so re-compressing the sum of P gradients falls behind. */
    GCOMP_SPEC_SATURATING = 1u << 9,
    /** Keeps a residual between steps: feedback=ef or dgc, or a codec's own (powersgd). */
    GCOMP_SPEC_FEEDBACK = 1u << 10,
    /** Keeps the optimizer's momentum (DGC's momentum correction): apply no momentum of
     *  your own to this tensor (see gcomp_compressor_set_epoch). */
    GCOMP_SPEC_MOMENTUM = 1u << 11,
    /** The feedback is part of the method (twobit: ef, dgc: dgc, powersgd: its own) and
     *  cannot be set: gcomp_spec_set refuses another feedback=. */
    GCOMP_SPEC_FIXED_FEEDBACK = 1u << 12,
    /** E[decode(C(x))] = x: exact (none with f32) or unbiased by construction (randomk with
     *  unbiased=1, bernoulli, importance, qsgd, ternary without clip, natural, int8/int4
     *  with rounding=stochastic), selection and value coding both.  About the codec C on
     *  its input: feedback, which changes the input, is not considered. */
    GCOMP_SPEC_UNBIASED = 1u << 13
};

/** Wire type of values that travel as plain floats. */
typedef enum gcomp_value_type {
    GCOMP_VALUES_OTHER = 0, /**< not a plain float (a quantizer's coding), or no values */
    GCOMP_VALUES_F32 = 1,
    GCOMP_VALUES_F16 = 2,
    GCOMP_VALUES_BF16 = 3
} gcomp_value_type;

/** A spec described (gcomp_spec_describe).  Every pointer is static: valid for ever. */
typedef struct gcomp_spec_info {
    const gcomp_codec_info *codec;
    /** Value coder name ("f16", "int8", ...; powersgd: "f32" or "f16", its factors'); ""
     *  when the codec has none. */
    const char *values;
    const char *feedback; /**< "none", "ef" or "dgc" */
    unsigned flags;       /**< GCOMP_SPEC_* */
    /** The values' plain-float wire type (PowerSGD's factors' too), else OTHER. */
    gcomp_value_type value_type;
    /** Nominal bits per value sent, per-bucket scales and indices excluded: 32, 16, 8, 4,
     *  2 (twobit, ternary), 1 (sign), 1 + bitlen(levels) (qsgd), 9 (natural). */
    double value_bits;
    /** Nominal fraction of the elements sent per step in the steady state:
     *  ceil(density * n) / n for fixed-count selectors when n is given, else density=; its
     *  expectation for bernoulli and importance; 1 for dense codecs, low rank (every
     *  element is approximated) and threshold (data-dependent: at most all).  Bytes per
     *  step: gcomp_spec_bytes_estimate. */
    double density;
    /** GCOMP_SPEC_MULTIPHASE: reductions per step at most (PowerSGD: 2 * iters); else 0. */
    unsigned phases;
    uint64_t seed;        /**< seed= */
    uint64_t fingerprint; /**< of the canonical spec, as gcomp_spec_canonical gives it */
} gcomp_spec_info;

/**
 * Describes `spec` for a tensor of `n` elements.  n = 0 asks for the worst case over every
 * size (GCOMP_SPEC_CONTRACTION only when it holds at any size; density is density=).
 * For codecs that need a shape, n is taken as a bound on the values they send.
 * Does not allocate the tensor's state (a codec's own small per-tensor tables may be
 * built and freed to size the selection).  Thread-safe.
 * Returns GCOMP_OK, GCOMP_E_ARG (NULL), GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, GCOMP_E_LIMIT
 * (n above 2^32-1) or GCOMP_E_NOMEM.  On failure *out is zeroed.
 */
GCOMP_API gcomp_status gcomp_spec_describe(const char *spec, size_t n, gcomp_spec_info *out,
                                           gcomp_error *err);

/**
 * Writes the value of parameter `key` of `spec` (given, or its default) into `out`
 * (NUL-terminated), as the canonical form writes it: e.g. gcomp_spec_get("topk", "density")
 * gives "0.01", ("int8", "rounding") gives "nearest".
 * Returns GCOMP_OK, GCOMP_E_ARG (NULL), GCOMP_E_SPEC (a bad spec, or `key` is not a
 * parameter of this spec: the message lists the allowed keys), GCOMP_E_UNKNOWN_CODEC or
 * GCOMP_E_DST_SIZE (cap too small; nothing written).
 */
GCOMP_API gcomp_status gcomp_spec_get(const char *spec, const char *key, char *out, size_t cap,
                                      gcomp_error *err);

/**
 * As gcomp_spec_get, as a number: INT and FLOAT parameters their value, BOOL 0 or 1, ENUM
 * the index of the choice in gcomp_param_info.choices (values=f16 of "f32|f16|..." is 1).
 */
GCOMP_API gcomp_status gcomp_spec_get_number(const char *spec, const char *key, double *out,
                                             gcomp_error *err);

/**
 * Writes the canonical form of `spec` with `key` set to `value` into `out` (what a
 * transport does to derive one spec from another: a rank's own seed, a retuned density).
 * `key` must be a parameter of `spec` (GCOMP_E_SPEC otherwise, listing the allowed keys);
 * the result is checked as any spec is (a value out of range is GCOMP_E_SPEC).  values=
 * and feedback= change which keys exist: keys of the old value coder or feedback that the
 * new one also has keep their values, the others are dropped, and the new one's other
 * keys take their defaults.  A codec with GCOMP_SPEC_FIXED_FEEDBACK accepts only its own
 * feedback= (a no-op).  `out` may be the same buffer as `spec`.
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC or GCOMP_E_DST_SIZE.
 */
GCOMP_API gcomp_status gcomp_spec_set(const char *spec, const char *key, const char *value,
                                      char *out, size_t cap, gcomp_error *err);

/* ------------------------------------------------------------------------------------- */
/* Compressor: one per tensor, holds the tensor's state between steps                      */

typedef struct gcomp_compressor gcomp_compressor;

/**
 * Creates a compressor for a tensor of `n` float32 elements.
 *  spec        the method (see above); copied.
 *  rows, cols  optional matrix shape (both 0 for a plain vector; otherwise rows*cols == n).
 *              Codecs that need a shape (powersgd, rows, cols) reject a vector with
 *              GCOMP_E_ARG unless they document a fallback.
 *  err         may be NULL.
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, GCOMP_E_LIMIT
 * (n above 2^32-1) or GCOMP_E_NOMEM.  On failure *out is NULL.
 */
GCOMP_API gcomp_status gcomp_compressor_create(gcomp_compressor **out, const char *spec, size_t n,
                                               size_t rows, size_t cols, gcomp_error *err);

/** Frees a compressor and its state. NULL is a no-op. */
GCOMP_API void gcomp_compressor_free(gcomp_compressor *c);

/** The canonical spec (owned by `c`, valid until free) and its fingerprint. */
GCOMP_API const char *gcomp_compressor_spec(const gcomp_compressor *c);
GCOMP_API uint64_t gcomp_compressor_fingerprint(const gcomp_compressor *c);
GCOMP_API const gcomp_codec_info *gcomp_compressor_codec(const gcomp_compressor *c);
GCOMP_API size_t gcomp_compressor_size(const gcomp_compressor *c);

/**
 * Largest message `gcomp_encode` can produce for this compressor, header included.
 * Encoding into that many bytes cannot fail with GCOMP_E_DST_SIZE.
 */
GCOMP_API size_t gcomp_encode_bound(const gcomp_compressor *c);

/**
 * Encodes one step's gradient.
 *  grad     n float32 values; borrowed, never written.
 *  dst      caller's buffer of `dst_cap` bytes; *dst_len receives the message size.
 * With feedback, the residual (and momentum) are updated; they change only when the
 * call returns GCOMP_OK.  A NaN or Inf in `grad` gives GCOMP_E_NONFINITE and leaves the
 * state as it was (nothing held back is lost); so does a finite step whose residual or
 * scaled values would leave float (e.g. powersgd with residual + gradient above FLT_MAX/4).
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_DST_SIZE, GCOMP_E_NONFINITE, GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_encode(gcomp_compressor *c, const float *grad, void *dst,
                                    size_t dst_cap, size_t *dst_len);

/**
 * Decodes a message made by this compressor's spec and adds `scale` times its tensor
 * into `acc` (n floats).  Also checks that the message's fingerprint and size are this
 * compressor's (GCOMP_E_MISMATCH otherwise) and counts the time in the statistics.
 * The decode workspace of `c` is reused: no allocation on the steady path.
 */
GCOMP_API gcomp_status gcomp_compressor_decode_add(gcomp_compressor *c, const void *msg, size_t len,
                                                   float *acc, float scale);

/**
 * Decodes any message (stateless; the message is untrusted) and adds `scale` times its
 * tensor into `acc`, which holds `n` floats.  `acc` may be NULL to validate only.
 * `scale` must be finite (GCOMP_E_ARG otherwise, before the message is read).  For
 * |scale| <= 1 every value added is finite; a larger scale can overflow, as any float
 * product can.  Workspace is allocated only after the payload's lengths are checked: at most
 * a few bytes per message byte, or per element of `acc`.
 * On any error `acc` is untouched: every format error is found, and the workspace
 * allocated, before the first write (tests/unit/test_oom.c and the fuzz targets check it).
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_TRUNCATED, GCOMP_E_BAD_MAGIC, GCOMP_E_VERSION,
 * GCOMP_E_CODEC_ID, GCOMP_E_CHECKSUM, GCOMP_E_CORRUPT, GCOMP_E_MISMATCH (n differs),
 * GCOMP_E_LIMIT, GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_decode_add(const void *msg, size_t len, float *acc, size_t n,
                                        float scale);

/** Header fields of a message, as read by gcomp_message_inspect. */
typedef struct gcomp_message_info {
    unsigned format_version;
    uint16_t codec_id;
    const char *codec_name; /**< static; "?" for an unknown id */
    uint32_t flags;
    uint64_t n;               /**< elements of the tensor */
    uint32_t payload_len;     /**< bytes after the header */
    uint64_t fingerprint;     /**< of the canonical spec that made it */
    uint32_t payload_crc;     /**< CRC-32C of the payload */
    uint64_t elements_sent;   /**< values carried (k for sparse, n for dense) when known */
    const char *index_coding; /**< "none", "bitmap", "varint", "elias-fano", "seeded", ... */
    const char *value_coding; /**< "f32", "f16", "int8", ... or "" */
} gcomp_message_info;

/**
 * Reads and checks a message's header (and, when `len` covers it, the payload checksum
 * and the sparse section header).  Does not decode the values.
 * Returns the same header statuses as gcomp_decode_add.
 */
GCOMP_API gcomp_status gcomp_message_inspect(const void *msg, size_t len, gcomp_message_info *info);

/* ---- per-tensor state ---------------------------------------------------------------- */

/** Bytes needed to save the compressor's state (versioned blob, docs/FORMAT.md). */
GCOMP_API size_t gcomp_state_bound(const gcomp_compressor *c);
/** Saves the state. Returns GCOMP_OK, GCOMP_E_ARG or GCOMP_E_DST_SIZE. */
GCOMP_API gcomp_status gcomp_state_save(const gcomp_compressor *c, void *dst, size_t cap,
                                        size_t *len);
/**
 * Loads a saved state into `c`.  The blob must come from a compressor with the same
 * canonical spec and shape (GCOMP_E_MISMATCH otherwise); a corrupt blob gives
 * GCOMP_E_STATE or GCOMP_E_CHECKSUM, a newer version GCOMP_E_VERSION.  On any error the
 * state of `c` is unchanged.
 */
GCOMP_API gcomp_status gcomp_state_load(gcomp_compressor *c, const void *src, size_t len);
/**
 * Creates a compressor from a saved blob alone (spec and shape come from the blob).  A blob
 * whose fields do not describe a tensor (n = 0, rows * cols != n, ...) or whose sections do
 * not have the sizes its spec and shape keep is GCOMP_E_STATE, found before anything of the
 * claimed size is allocated.  Other statuses as gcomp_state_load and create.
 */
GCOMP_API gcomp_status gcomp_compressor_from_state(gcomp_compressor **out, const void *src,
                                                   size_t len, gcomp_error *err);
/** Forgets residuals, momentum, warm starts and the step counter. */
GCOMP_API void gcomp_state_reset(gcomp_compressor *c);

/**
 * Read-only view of what the compressor holds back (n floats): the error-feedback residual,
 * DGC's accumulated velocity, or, for a spec that keeps none, what a retune left for the
 * next message (gcomp_compressor_retune); NULL when there is nothing of the kind
 * (PowerSGD: gcomp_lowrank_residual).  Valid until the next call on `c`.
 */
GCOMP_API const float *gcomp_compressor_residual(const gcomp_compressor *c);

/**
 * Changes the compressor's spec between two steps (adaptive compression: a new density,
 * rank, bit width, value coder or codec, dense included) keeping what it holds back, so
 * that with error feedback sum(decoded messages) + held back = sum(gradients) holds across
 * any number of retunes.  The same n and shape; `spec` is copied.  What carries over is
 * decided from what the two specs are (gcomp_spec_describe):
 *   held back (GCOMP_SPEC_FEEDBACK: the ef residual, DGC's velocity v, PowerSGD's
 *     residual, a pending carry) -> the new spec's feedback (ef: added to e; dgc: to v),
 *     else its codec's residual (PowerSGD), else, when the new spec keeps none
 *     (feedback=none, e.g. dense `none`), into the next message: the next gcomp_encode
 *     sends grad + held back ("switching to dense flushes the residual");
 *   momentum (GCOMP_SPEC_MOMENTUM on both: dgc to dgc) is kept; from dgc to any other
 *     spec the caller's optimizer takes momentum back for the tensor (from zero), and the
 *     held-back velocity v becomes gradient: (1 - m) v + m u, what DGC owed plus the tail
 *     its momentum u would still have added, so an optimizer with the same momentum m
 *     applies it once, not 1/(1 - m) times; the other way, held back h joins v as
 *     h / (1 - m) and u starts at zero; the caller's own momentum buffer M for the tensor
 *     still owes the weights m M / (1 - m): keep applying it as it decays, with no new
 *     gradient added (gradcomp train and the Python DistributedOptimizer do), or that
 *     tail is lost;
 *   warm start (powersgd to powersgd, same shape): the first min(r, r') columns of Q;
 *   the step counter, the epoch and the statistics continue.
 * Ranks that exchange a tensor must retune it at the same step to the same spec (the MPI
 * layer checks: gcomp_mpi_bucket_retune).
 * Returns GCOMP_OK; GCOMP_E_ARG; the spec's status (GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC,
 * GCOMP_E_LIMIT); GCOMP_E_PROTOCOL (a PowerSGD step in flight); GCOMP_E_UNSUPPORTED
 * (PowerSGD for a tensor it always sends dense cannot keep a nonzero held-back vector);
 * GCOMP_E_NONFINITE (what is held back overflows float in the new spec's units: into DGC
 * it is divided by 1 - momentum); GCOMP_E_NOMEM.  On any error `c` is unchanged.
 */
GCOMP_API gcomp_status gcomp_compressor_retune(gcomp_compressor *c, const char *spec,
                                               gcomp_error *err);

/**
 * The same conversion into another compressor: dst (of src's n and shape; typically fresh
 * from gcomp_compressor_create) becomes what gcomp_compressor_retune(copy of src, dst's
 * spec) would make, and src is only read, so a caller that must be able to go back keeps
 * it as it was without copying it (the MPI layer's switch: gcomp_mpi_bucket_retune).
 * dst's own state is replaced.  Returns what gcomp_compressor_retune returns, and
 * GCOMP_E_ARG for sizes that differ or dst == src; GCOMP_E_PROTOCOL also for a step in
 * flight on dst.  On any error dst and src are unchanged.
 */
GCOMP_API gcomp_status gcomp_compressor_retune_from(gcomp_compressor *dst,
                                                    const gcomp_compressor *src, gcomp_error *err);

/** Number of successful encodes since creation (or reset, or as loaded), plus the steps
 *  gcomp_compressor_skip_step counted. */
GCOMP_API uint64_t gcomp_compressor_step(const gcomp_compressor *c);

/**
 * Counts a step this rank could not encode (its gradient was refused, GCOMP_E_NONFINITE)
 * while the other ranks encoded theirs: the step counter advances, nothing else changes
 * (the residual, momentum and everything held back stay as they were).  Draws keyed by the
 * step, which ranks must share (random-k's positions, GCOMP_SPEC_SHARED_DRAWS: the MPI
 * layer sums them by position), then stay together after a failed call instead of
 * differing from it on.  Only between steps (a PowerSGD step in flight:
 * GCOMP_E_PROTOCOL).  Returns GCOMP_OK, GCOMP_E_ARG (NULL) or GCOMP_E_PROTOCOL.
 */
GCOMP_API gcomp_status gcomp_compressor_skip_step(gcomp_compressor *c);

/**
 * Tells the compressor which training epoch (fractional) the next encode belongs to;
 * schedules such as DGC's warm-up read it.  Negative or non-finite: GCOMP_E_ARG.
 *
 * DGC (`feedback=dgc`, or the `dgc` codec; docs/DGC.md): the compressor keeps the
 * momentum itself (u = m*u + g, v = v + u; top-k of v is sent), so the optimizer must
 * apply NO momentum of its own to a DGC-compressed tensor: plain SGD on the decoded sum
 * (w -= lr * sum / nranks), weight decay added to g before encode.  With `warmup=W`, call
 * set_epoch at least once per epoch: epochs 0..W-1 use a density that falls exponentially
 * to density= (e.g. 25%, 6.25%, 1.56%, 0.4%, then 0.1%); the encode bound already covers
 * the largest.  `clip=` takes the per-rank threshold (DGC: the global one times N^-1/2).
 */
GCOMP_API gcomp_status gcomp_compressor_set_epoch(gcomp_compressor *c, double epoch);

/* ---- statistics ---------------------------------------------------------------------- */

typedef struct gcomp_stats {
    uint64_t messages;      /**< successful encodes */
    uint64_t bytes_in;      /**< 4 * n per encode */
    uint64_t bytes_out;     /**< message bytes produced, headers included */
    uint64_t elements_sent; /**< values carried by the messages */
    uint64_t encode_ns;     /**< wall time spent in gcomp_encode */
    uint64_t decoded;       /**< messages decoded through gcomp_compressor_decode_add */
    uint64_t decode_ns;     /**< wall time spent there */
} gcomp_stats;

GCOMP_API void gcomp_compressor_stats(const gcomp_compressor *c, gcomp_stats *out);
GCOMP_API void gcomp_compressor_stats_reset(gcomp_compressor *c);

/* ------------------------------------------------------------------------------------- */
/* Layer-wise policy: which spec each tensor of a model gets (src/adapt/policy.c)          */

/**
 * A policy turns a model's tensor list into one spec per tensor: small and 1-D tensors
 * (biases, norms: cheap to send, sensitive to error) dense, the big ones compressed,
 * with per-name overrides.  Policy string: items separated by ';', each `key=value`; the
 * key ends at the item's first '=' and the value runs to the next ';' (a spec has its own
 * ':', ',' and '=', never ';').  Keys:
 *   spec=SPEC        tensors no other rule takes      (default topk:density=0.001,feedback=ef)
 *   dense=SPEC       small and 1-D tensors            (default none)
 *   min_elements=N   fewer elements than N: dense     (default 16384)
 *   min_k=K          spec= sends at least K elements of a tensor a step where its codec
 *                    counts from density= (topk, dgc, randomk, sampled: their min_k key),
 *                    unless spec= sets a nonzero min_k of its own (an explicit min_k=0
 *                    reads as unset); globs are left as written (default 0)
 *   dense_1d=0|1     1-D tensors (a vector, or a dimension of 1) dense (default 1)
 *   GLOB=SPEC        any other key is a glob on the tensor name (`*` any run, `?` one
 *                    character); the first matching glob wins over every other rule.
 * Example: `spec=topk:density=0.001,feedback=ef;min_elements=16384;embed*=topk:density=0.0005`.
 * Whitespace around items is ignored, empty items are skipped.  Every spec is validated at
 * create.  A policy is immutable: gcomp_policy_choose may run on it from several threads.
 */
typedef struct gcomp_policy gcomp_policy;

/**
 * Parses `policy` (copied).  Returns GCOMP_OK, GCOMP_E_ARG (NULL), GCOMP_E_SPEC (syntax,
 * a bad number, a duplicate key or glob, or an invalid spec: the message names the item),
 * GCOMP_E_UNKNOWN_CODEC or GCOMP_E_NOMEM.  On failure *out is NULL.
 */
GCOMP_API gcomp_status gcomp_policy_create(gcomp_policy **out, const char *policy,
                                           gcomp_error *err);
/** Frees a policy; NULL is a no-op.  Strings it handed out become invalid. */
GCOMP_API void gcomp_policy_free(gcomp_policy *p);

/** One tensor of a model: the arguments it would give gcomp_compressor_create. */
typedef struct gcomp_tensor_desc {
    const char *name;  /**< borrowed; NULL is read as "" */
    size_t n;          /**< elements */
    size_t rows, cols; /**< matrix shape (rows*cols == n), or both 0 for a vector */
} gcomp_tensor_desc;

/** Which rule chose a tensor's spec. */
typedef enum gcomp_policy_rule {
    GCOMP_RULE_OVERRIDE = 0, /**< a name glob matched */
    GCOMP_RULE_1D = 1,       /**< 1-D tensor with dense_1d=1 */
    GCOMP_RULE_SMALL = 2,    /**< fewer than min_elements */
    GCOMP_RULE_DEFAULT = 3   /**< spec= */
} gcomp_policy_rule;

/** A policy's decision for one tensor. */
typedef struct gcomp_layer_plan {
    const char *spec; /**< the spec to create its compressor with; owned by the policy */
    gcomp_policy_rule rule;
    const char *reason;  /**< static name of the rule: "override", "1-D", "small", "default" */
    const char *pattern; /**< the matching glob for GCOMP_RULE_OVERRIDE (owned by the
                              policy), else NULL */
    size_t bytes;        /**< estimated message bytes per step (gcomp_spec_bytes_estimate) */
    size_t dense_bytes;  /**< 4 * n: the gradient uncompressed */
} gcomp_layer_plan;

/**
 * Chooses the spec for tensor `t` (rules in this order: first matching glob, 1-D, small,
 * default) and estimates its bytes per step.  Thread-safe on a shared policy.
 * Returns GCOMP_OK, GCOMP_E_ARG (NULL, n = 0, a shape that does not hold n, or a chosen
 * spec that needs a shape the tensor lacks: the message names the tensor), GCOMP_E_LIMIT
 * or GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_policy_choose(const gcomp_policy *p, const gcomp_tensor_desc *t,
                                           gcomp_layer_plan *out, gcomp_error *err);

/**
 * Bytes of one message that `spec` makes for a tensor of n elements (shape as for
 * gcomp_compressor_create) in the steady state, i.e. after any warm-up: the encode bound
 * at the spec's own density, computed without allocating the tensor's state.  Exact up to
 * the index coding's choice for fixed-count codecs (top-k, dgc, block, rows, cols,
 * random-k, dense ones: within a few percent, never below); the worst case for
 * data-dependent counts (threshold, sampled).
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, GCOMP_E_LIMIT or
 * GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_spec_bytes_estimate(const char *spec, size_t n, size_t rows,
                                                 size_t cols, size_t *bytes, gcomp_error *err);

/* ------------------------------------------------------------------------------------- */
/* Cost model: predicted step time of compressed data-parallel training (src/adapt/cost*.c) */

/*
 * Will compression pay on this link, for this model, at this many workers?  The model
 * (after Agarwal et al., "On the utility of gradient compression in distributed training
 * systems", MLSys 2022) predicts one training step as
 *
 *     step = compute + codec + exposed communication
 *
 *  compute   forward, backward and optimizer time, given by the caller (measured on one
 *            worker: it does not depend on the method).  The backward time is spread over
 *            the tensors in proportion to their work (gcomp_cost_tensor.work; by default
 *            their elements), last tensor first (the order in which a backward pass makes
 *            gradients final).
 *  codec     encode and decode time per tensor, from a calibration measured on this
 *            machine (gcomp_cost_calibrate_codec, `gradcomp plan --calibrate`), times the
 *            number of encodes and decodes the tensor's strategy runs (allgather decodes P
 *            messages, rsag encodes at the worker and again at the owner, ...).
 *  comm      an alpha-beta model (a message costs latency + bytes / bandwidth) of each
 *            strategy's traffic law, with the message size from gcomp_spec_bytes_estimate
 *            (this library's own formats: never re-derived here):
 *              allreduce   2(P-1)/P x the values (ring from 256 KiB; below, MPI_Iallreduce:
 *                          a binomial reduce and broadcast)
 *              powersgd    two allreduces per power iteration, of rows*r and cols*r values
 *              allgather   (P-1) x one message: grows with P
 *              sparse      2(P-1)/P x one message, each region's slice re-coded as
 *                          (gap, value) pairs and sent dense once that is smaller (fill-in)
 *              rsag        2(P-1)/P x the compressed tensor, chunk messages with their
 *                          headers, plus the owner's re-compression
 *              ps          push the message to S servers, pull the result (the parameter
 *                          server's law: GCOMP_MPI_PS with a gcomp_mpi_ps)
 *              hierarchical  a dense float32 binomial-tree reduce and broadcast inside each
 *                          node on the intra-node link, the strategy between node leaders
 *  exposed   the part of the communication not hidden behind the backward pass: each
 *            tensor is encoded when its gradient is final, sent when the link is free
 *            (tensor i+1 is compressed while tensor i is on the wire), and decoded after;
 *            `overlap` says how much of the remaining backward time a transfer can use.
 *
 * Byte counts follow gcomp_mpi_stats.bytes_sent exactly for the deterministic sizes (what
 * one rank hands to MPI for its peers, size words included), so a run's own counters
 * check the model; tests/mpi checks them for every strategy.  Times are seconds, sizes
 * bytes, bandwidths bytes per second of payload (goodput: a 1 Gbit/s Ethernet link
 * carries at most 1448/1514 of 125 MB/s of TCP payload).
 *
 * Strategy: the core library does not link MPI, so the caller names each tensor's
 * strategy; the values are those of gcomp_mpi_strategy (gradcomp_mpi.h), and
 * gcomp_mpi_strategy_auto(spec) gives the one an MPI bucket would use.
 *
 * Evaluation (gcomp_cost_eval) is a pure function of the model, the network and the
 * compute description: plain double arithmetic, no allocation, no clock, no randomness,
 * O(tensors).  Ranks that evaluate the same inputs (the same calibration: broadcast rank
 * 0's) get the same bits and so take the same decision, which a controller that retunes
 * compression at run time needs.  Objects follow the library's threading rule; a model is
 * immutable after create, so several threads may evaluate one model at once.
 */

/** Strategy values for the cost model; the same numbers as gcomp_mpi_strategy. */
typedef enum gcomp_cost_strategy {
    GCOMP_COST_ALLGATHER = 1,    /**< gather every rank's message; (P-1) x message */
    GCOMP_COST_SPARSE = 2,       /**< sparse allreduce: regions, owners, allgather */
    GCOMP_COST_ALLREDUCE = 3,    /**< dense allreduce of linear values (and PowerSGD's factors) */
    GCOMP_COST_RSAG = 4,         /**< reduce-scatter + allgather with owner re-compression */
    GCOMP_COST_PS = 5,           /**< parameter server: push the message to S servers, pull the
                                      dense f32 sum (MXNet dist_sync; issue #13) */
    GCOMP_COST_PS_COMPRESSED = 6 /**< parameter server whose servers re-compress: pull a
                                      message (BytePS's compressed pull) */
} gcomp_cost_strategy;

/** Or'ed into a strategy: dense reduce inside each node, the strategy between nodes. */
#define GCOMP_COST_HIERARCHICAL 0x100
/** Or'ed into GCOMP_COST_ALLGATHER: the length table travels in front of the messages, each
 *  rank's buffer padded to its bound (gcomp_spec_bytes_estimate), so the exchange is one
 *  allgather, not the lengths and then the messages: how the DDP hook sends messages of a
 *  fixed size (gradcomp.torch).  The same bytes, half the latencies. */
#define GCOMP_COST_ONE_EXCHANGE 0x200

/** Version of the calibration text format gcomp_cost_calibration_format writes (2: codec
 *  lines may carry elements=; 3: net lines may carry burst=; older files are read). */
#define GCOMP_COST_CALIBRATION_VERSION 3

/** One link: latency (alpha) and payload bandwidth (1 / beta), and the burst of a
 *  token-bucket shaper.  A shaped link (Linux tc's tbf, a cloud instance's rate limit)
 *  lets `burst` bytes through at once after it has been idle and refills that allowance
 *  at `bandwidth`: a step whose exchange fits in what the idle part of the step refilled
 *  pays latency only.  The model gives each step min(burst, bandwidth x the step's time
 *  without inter-node transfers) bytes free, taken by the step's first transfers. */
typedef struct gcomp_cost_link {
    double bandwidth; /**< bytes per second of payload, each direction (full duplex); > 0 */
    double latency;   /**< seconds per message (one-way, software included); >= 0 */
    double burst;     /**< bytes a shaper lets through at once after idle; 0: a plain wire */
} gcomp_cost_link;

/** The network and the job's shape. */
typedef struct gcomp_cost_net {
    int workers;           /**< P, ranks that exchange gradients (>= 1) */
    int nodes;             /**< nodes the workers are spread over (1..P; P/nodes per node,
                                rounded up); 1 with one worker per "host" on netsim too */
    gcomp_cost_link inter; /**< each node's link to the others (NIC) */
    gcomp_cost_link intra; /**< between ranks of one node (shared memory, NVLink) */
    int servers;           /**< ps: parameter servers S (0: one per node) */
} gcomp_cost_net;

/** Fills *net: P = nodes = 1, 1 Gbit/s Ethernet goodput and 25 us between nodes,
 *  10 GB/s and 1 us inside a node, one server per node. */
GCOMP_API void gcomp_cost_net_default(gcomp_cost_net *net);

/** The compute side of one step (seconds on one worker; the same for every method). */
typedef struct gcomp_cost_compute {
    double forward_s;   /**< forward pass (and data loading): nothing to overlap with */
    double backward_s;  /**< backward pass: gradients become final during it */
    double optimizer_s; /**< after the exchange */
    double overlap;     /**< 0..1: share of the backward time still to run after a tensor's
                             gradient is final during which its transfer progresses (1:
                             transfers run beside compute, as with NCCL or an MPI progress
                             thread; 0: they move only while the worker waits) */
    int concurrent;     /**< 0: one tensor's exchange at a time, each paying its round trips
                             after the one before (NCCL's stream, gloo, Horovod); 1: every
                             tensor's exchange in flight at once (gradcomp's buckets, each on
                             its own communicator, finished by gcomp_mpi_wait_all): their
                             bytes share the link, their latencies overlap */
} gcomp_cost_compute;

/** Measured codec speed for one spec: t(n) = fixed + per_elem * n, near `elements`.
 *  A codec's cost per element is not one number: a tensor that stays in cache runs faster
 *  per element than one that streams from memory.  A calibration may hold one rate per
 *  size for a spec; a tensor's time is interpolated between the two sizes around it (in
 *  log n), the nearest one's outside them.  elements = 0: one rate for every size. */
typedef struct gcomp_cost_codec_rate {
    char spec[512];         /**< canonical spec it was measured with (seed= removed) */
    double encode_fixed_s;  /**< per encode */
    double encode_per_elem; /**< seconds per element of the tensor */
    double decode_fixed_s;  /**< per decode-add of one message */
    double decode_per_elem; /**< seconds per element of the tensor */
    size_t elements;        /**< tensor size it was measured at; 0: any size */
} gcomp_cost_codec_rate;

/** Measured network: alpha and beta of the links the calibration ran on. */
typedef struct gcomp_cost_net_rate {
    char label[64];        /**< what was measured: "inter" or "intra" (or a user's name) */
    int ranks;             /**< ranks of the job that measured it */
    double latency;        /**< alpha: half the round trip of a small ping-pong, seconds */
    double bandwidth;      /**< 1/beta: bytes/s of a large one-way transfer */
    double ring_bandwidth; /**< bytes/s a ring allreduce reached (2(P-1)/P n / time, its
                                codec time not overlapped with a transfer left out); 0 if
                                not measured */
    double burst;          /**< bytes a transfer after idle got through beyond `bandwidth`
                                (a shaper's bucket); 0 if none was seen */
} gcomp_cost_net_rate;

/**
 * The link a collective sees, from a measured network rate: latency as measured; bandwidth
 * the ring allreduce's where it was measured and is the lower, else the one-way
 * transfer's.  Every strategy has all ranks sending at once, which a one-way transfer does
 * not show where the ranks share something: on one machine (netsim hosts, loopback) their
 * TCP copies share the cores, and an oversubscribed switch shares its uplinks.  The burst
 * as measured.  Returns GCOMP_OK, or GCOMP_E_ARG for NULL or a rate without a bandwidth.
 */
GCOMP_API gcomp_status gcomp_cost_link_measured(const gcomp_cost_net_rate *rate,
                                                gcomp_cost_link *out);

/** A set of measurements: codec rates and network rates.  Opaque. */
typedef struct gcomp_cost_calibration gcomp_cost_calibration;

/** Creates an empty calibration.  Returns GCOMP_OK, GCOMP_E_ARG or GCOMP_E_NOMEM. */
GCOMP_API gcomp_status gcomp_cost_calibration_create(gcomp_cost_calibration **out);
/** Frees a calibration; NULL is a no-op. */
GCOMP_API void gcomp_cost_calibration_free(gcomp_cost_calibration *cal);

/**
 * Parses the text form (written by gcomp_cost_calibration_format; docs/COST_MODEL.md):
 * a first line `gradcomp-calibration VERSION`, then `#` comments, `codec SPEC KEY=VALUE...`
 * lines (encode_fixed_s, encode_per_elem, decode_fixed_s, decode_per_elem, and optionally
 * elements), `net LABEL
 * KEY=VALUE...` lines (ranks, latency, bandwidth, ring_bandwidth) and `info KEY VALUE`
 * lines (kept, not interpreted).  Unknown keys are errors (a typo must not go unnoticed).
 * Returns GCOMP_OK; GCOMP_E_ARG (NULL); GCOMP_E_BAD_MAGIC (not a calibration);
 * GCOMP_E_VERSION (newer format); GCOMP_E_CORRUPT (a bad line: *err names its number);
 * GCOMP_E_NOMEM.  On failure *out is NULL.
 */
GCOMP_API gcomp_status gcomp_cost_calibration_parse(gcomp_cost_calibration **out, const char *text,
                                                    size_t len, gcomp_error *err);

/**
 * Writes the text form into `out` (NUL-terminated) and its length, without the NUL, into
 * *len (may be NULL).  With out == NULL or a too small `cap`, *len receives the size needed
 * and GCOMP_E_DST_SIZE is returned.  Values are written with 17 significant digits, so
 * parse(format(c)) evaluates bit for bit as c.
 */
GCOMP_API gcomp_status gcomp_cost_calibration_format(const gcomp_cost_calibration *cal, char *out,
                                                     size_t cap, size_t *len);

/**
 * Adds a codec rate, replacing one for the same (seedless canonical) spec and the same
 * `elements` (a rate for any size, elements = 0, replaces all of the spec's sized rates,
 * and a sized rate the spec's rate for any size).  The spec is
 * canonicalised here.  Returns GCOMP_OK, GCOMP_E_ARG (negative or non-finite times),
 * GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_cost_calibration_add_codec(gcomp_cost_calibration *cal,
                                                        const gcomp_cost_codec_rate *rate,
                                                        gcomp_error *err);
/** Adds (or replaces, by label) a network rate.  GCOMP_OK, GCOMP_E_ARG, GCOMP_E_NOMEM. */
GCOMP_API gcomp_status gcomp_cost_calibration_add_net(gcomp_cost_calibration *cal,
                                                      const gcomp_cost_net_rate *rate);
/** Number of codec rates / network rates, and the i-th one (NULL when out of range). */
GCOMP_API size_t gcomp_cost_calibration_codecs(const gcomp_cost_calibration *cal);
GCOMP_API const gcomp_cost_codec_rate *
gcomp_cost_calibration_codec(const gcomp_cost_calibration *cal, size_t i);
/** The network rate with this label, NULL if none. */
GCOMP_API const gcomp_cost_net_rate *gcomp_cost_calibration_net(const gcomp_cost_calibration *cal,
                                                                const char *label);

/**
 * Measures one spec's encode and decode-add speed on this machine: a tensor of `n`
 * elements (shape rows x cols, or 0 x 0), a synthetic gradient, buffers touched (and
 * asked for huge pages) before timing, `runs` timed encodes and decodes after one
 * untimed; the median, then fitted with a second size of n/8 into fixed + per_elem * n;
 * out->elements = n.  Calibrate at the sizes of the model's tensors (or around them): the
 * model interpolates between sizes.
 * PowerSGD's encode is its whole local protocol (both products, the orthogonalisation
 * and the reconstruction).  Takes about runs x 2 x (encode + decode) of n elements.
 * Returns GCOMP_OK or the compressor's status (GCOMP_E_SPEC, GCOMP_E_ARG, GCOMP_E_NOMEM).
 */
GCOMP_API gcomp_status gcomp_cost_calibrate_codec(const char *spec, size_t n, size_t rows,
                                                  size_t cols, unsigned runs,
                                                  gcomp_cost_codec_rate *out, gcomp_error *err);

/** One tensor of a model, as the model is told it. */
typedef struct gcomp_cost_tensor {
    const char *name;  /**< may be NULL; copied */
    const char *spec;  /**< the method for this tensor ("none" for dense f32); copied */
    size_t n;          /**< elements */
    size_t rows, cols; /**< matrix shape, or 0 x 0 */
    int strategy;      /**< a gcomp_cost_strategy, optionally | GCOMP_COST_HIERARCHICAL
                            (allgather also | GCOMP_COST_ONE_EXCHANGE); never 0 (auto):
                            gcomp_mpi_strategy_auto gives it */
    double work;       /**< >= 0: the backward work between the previous tensor's gradient
                            and this one's, relative to the other tensors' (e.g. the layer's
                            multiply-adds a sample).  0 on every tensor: the elements, right
                            for fully connected layers, not for convolutions */
    unsigned bucket;   /**< 0: the tensor is sent alone.  Tensors with the same nonzero id
                            travel in one exchange (Horovod's tensor fusion, DDP's buckets,
                            gcomp_mpi's sub-buckets) once all of them are final, i.e. with the
                            first of them in the list, which carries the bucket's bytes and
                            codec time; they need not be adjacent.  Allreduce sums the
                            members of one spec as one vector (PowerSGD's: each round's
                            factors of them all in one allreduce, as the DDP hook sends them,
                            a tensor it sends dense riding in the first); allgather sends its
                            members' messages back to back (specs may differ).  Members of
                            different strategies or allreduce specs make one exchange each,
                            all started together and sharing the link (as the DDP hook runs a
                            bucket's all_reduce beside its all_gather): their latencies
                            overlap, their bytes add up */
} gcomp_cost_tensor;

/** A model: tensors in forward order, their message sizes and codec rates.  Opaque. */
typedef struct gcomp_cost_model gcomp_cost_model;

/**
 * Creates a model: validates every tensor, estimates its message bytes
 * (gcomp_spec_bytes_estimate) and, for rsag, the chunk messages, and looks up its codec
 * rate in `cal` (may be NULL): the rate of the same seedless canonical spec (interpolated
 * to the tensor's size between sized rates), else of the same codec with its other
 * parameters (scaled by density or rank where they set the work), else a default of 1 ns per
 * element (marked uncalibrated in the result).  The bytes depend on P (chunks, regions) and the
 * nodes (hierarchical), so `workers` and `nodes` (1..workers) are fixed here; gcomp_cost_eval takes
 * the links.  `cal` is not kept. Returns GCOMP_OK; GCOMP_E_ARG (count 0, n 0, a shape that does not
 * hold n, strategy 0 or unknown, workers < 1, nodes outside 1..workers, work negative or not
 * finite; ONE_EXCHANGE on a strategy other than allgather; a bucket with a strategy other
 * than allreduce and allgather, or transfers that do not line up: *err names the tensor); the
 * spec's status (GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, GCOMP_E_LIMIT); GCOMP_E_UNSUPPORTED
 * (allreduce for a codec that does not sum linearly); GCOMP_E_NOMEM.  On failure *out is NULL.
 */
GCOMP_API gcomp_status gcomp_cost_model_create(gcomp_cost_model **out,
                                               const gcomp_cost_tensor *tensors, size_t count,
                                               int workers, int nodes,
                                               const gcomp_cost_calibration *cal, gcomp_error *err);
/** Frees a model; NULL is a no-op. */
GCOMP_API void gcomp_cost_model_free(gcomp_cost_model *m);
/** Tensor count, workers and nodes the model was made for (0 for NULL). */
GCOMP_API size_t gcomp_cost_model_count(const gcomp_cost_model *m);
GCOMP_API int gcomp_cost_model_workers(const gcomp_cost_model *m);
GCOMP_API int gcomp_cost_model_nodes(const gcomp_cost_model *m);

/** What the model predicts for one tensor (per rank, per step). */
typedef struct gcomp_cost_tensor_result {
    double message_bytes; /**< one message of the whole tensor (gcomp_spec_bytes_estimate);
                               for allreduce the reduced values; powersgd one round's P+Q */
    double bytes_sent;    /**< handed to MPI for other ranks, as gcomp_mpi_stats counts it */
    double node_bytes;    /**< hierarchical: inside the node, sent + received */
    double encode_s;      /**< worker and owner encodes */
    double decode_s;      /**< every decode-add and unpack this rank runs after the transfer */
    double comm_s;        /**< alpha-beta time of its transfers alone */
    double ready_s;       /**< when its gradient is final, from the start of the step */
    double done_s;        /**< when its result is decoded */
    int strategy;         /**< as given */
    int calibrated;       /**< 2 exact spec, 1 same codec (scaled), 0 default rate */
    double hidden_s;      /**< codec work while its transfer is in flight (the allgather
                               zeroes its output for decode-add): on the worker, beside the
                               link */
} gcomp_cost_tensor_result;

/** The step as a whole. */
typedef struct gcomp_cost_result {
    double step_s;     /**< predicted step time */
    double compute_s;  /**< forward + backward + optimizer */
    double codec_s;    /**< encode + decode (+ hidden) of every tensor */
    double comm_s;     /**< alpha-beta time of every transfer, hidden or not */
    double exposed_s;  /**< step - compute - codec: the communication not hidden */
    double bytes_sent; /**< per rank per step */
    double node_bytes; /**< hierarchical, inside nodes */
    int calibrated;    /**< the smallest of the tensors' `calibrated` */
} gcomp_cost_result;

/**
 * Predicts one step.  `per_tensor` may be NULL, else gcomp_cost_model_count entries.
 * Returns GCOMP_OK or GCOMP_E_ARG (NULL model/net/compute/out, a net whose workers or
 * nodes differ from the model's, a bandwidth <= 0 or not finite, a negative
 * latency or compute time, overlap outside 0..1, concurrent not 0 or 1).  Pure and cheap:
 * see above.
 */
GCOMP_API gcomp_status gcomp_cost_eval(const gcomp_cost_model *m, const gcomp_cost_net *net,
                                       const gcomp_cost_compute *compute, gcomp_cost_result *out,
                                       gcomp_cost_tensor_result *per_tensor);

/**
 * The break-even link speed: the inter-node bandwidth above which `m` (a compressed
 * method) is no faster than `base` (e.g. dense f32 ring allreduce) for the same tensors;
 * `tensor` = (size_t)-1 compares whole steps, otherwise that tensor alone (its codec and
 * communication, no compute, and no shaper's burst: the link's `burst` counts for whole
 * steps only, which have idle time to refill it).  The two models must have the same
 * tensor count and workers.  Searched by bisection on log(bandwidth) over [1e5, 1e13]
 * bytes/s with the rest of `net` held fixed.  *bandwidth receives the speed; 0 when `m`
 * is slower at every speed in that range, INFINITY when it is faster at every speed.
 * Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_cost_break_even(const gcomp_cost_model *m,
                                             const gcomp_cost_model *base, size_t tensor,
                                             const gcomp_cost_net *net,
                                             const gcomp_cost_compute *compute, double *bandwidth);

/* ------------------------------------------------------------------------------------- */
/* Adaptive compression: controllers that retune tensors at run time (src/adapt/adapt*.c)  */

/*
 * A controller decides, every few hundred steps and identically on every rank, which spec
 * each compressed tensor of a model uses next; the caller applies the decision with
 * gcomp_compressor_retune (or gcomp_mpi_bucket_retune), which keeps what the compressors
 * hold back.  docs/ADAPTIVE.md has the methods, their options and measurements.
 *
 * Method string (one grammar, parsed here, the same in C, the CLI and Python):
 *
 *     adapt:CONTROLLER[+CONTROLLER...][;KEY=VALUE...]
 *
 * e.g. `adapt:norm;base=topk:density=0.001,feedback=ef`, `adapt:bandwidth+layers`,
 * `adapt:accuracy;target=0.884;base=dgc:density=0.001`.  Controllers (each one file in
 * src/adapt/, applied in this order whatever order they are written in):
 *   bandwidth  the cost model (gcomp_cost_eval) fed with the measured link, the measured
 *              codec time of every candidate and the measured compute: the lightest
 *              setting whose predicted step, weighed by `penalty` per ladder step away
 *              from base, is within `slack` of the best, dense included (Agarwal et al.
 *              MLSys 2022's question, asked at run time);
 *   accuracy   a closed loop on a validation metric (gcomp_adapt_observe_metric): one
 *              ladder step lighter when the metric falls below its course to `target` (a
 *              glide path, or a reference curve: gcomp_adapt_set_course), one heavier
 *              when above it, with a dead band and a dwell time;
 *   layers     L-GreCo (Markov et al., MLSys 2024): per tensor the candidate that
 *              minimises the total compression error, sum_i |C_i(x_i) - x_i|^2 measured on
 *              the real gradients, under the byte budget the controllers before it left
 *              (by default the uniform setting's), by dynamic programming;
 *   norm       Accordion (Agarwal et al., MLSys 2021): a tensor is in a critical regime
 *              when the norm of its gradient accumulated over an interval changed by
 *              |G_k - G_k-1| / G_k-1 >= eta; it is then sent at the `low` setting.
 * Keys (an unknown key, or one no listed controller reads, is an error naming it):
 *   base=SPEC        the setting of the compressed tensors (default
 *                    topk:density=0.001,feedback=ef; with bandwidth, when neither base nor
 *                    ladder is given, powersgd:rank=4 on the cross-codec ladder
 *                    dense / powersgd:rank=4 / topk:density=0.001,values=f16,feedback=ef /
 *                    topk:density=0.0001,values=f16,feedback=ef)
 *   ladder=A/B/...   the candidates, '/'-separated: values of the base's knob (density=,
 *                    rank=, levels=; knob=KEY picks another) or whole specs, `dense` for
 *                    the dense spec; sorted by the bytes they send, most first.  Default
 *                    `auto`: density x 100, 31.6, 10, 3.16, 1, 1/3.16, 1/10 (capped at 1)
 *                    or rank x 4, 2, 1, 1/2, and `dense` first when with_dense=1
 *   with_dense=0|1   dense as a candidate (default 1 with bandwidth, else 0)
 *   interval=N|auto  steps between decisions (auto: the run's steps / 40 in 10..500; 100
 *                    when the length is unknown)
 *   measure=N|auto   steps between measurements of every candidate's error and codec time
 *                    on the real gradients (the first interval measures).  auto: at least
 *                    4 intervals, and spaced so that measuring takes at most measure_cost
 *                    (default 0.02) of the time between measurements, from the slowest
 *                    rank's measured cost
 *   sample=N|all     elements of each tensor a measurement compresses, at most (default
 *                    1048576): a block of whole rows (a run of a vector), another one at
 *                    each measurement; errors and times are scaled to the whole tensor
 *   min_elements=N, dense_1d=0|1, GLOB=SPEC   which tensors are compressed: the layer
 *                    policy's keys (gcomp_policy_create; tensors the policy sends dense or
 *                    by a glob are left alone)
 *   bandwidth: slack=0.05 (relative), overlap=0..1 (as gcomp_cost_compute), confirm=N
 *              (decisions a new choice must repeat, default 2), penalty=0.3 (the share
 *              more steps to the same accuracy each ladder step heavier than base is
 *              taken to cost: level L scores T_L * (1 + penalty)^(L - base)),
 *              probe_cost=0.02 (the share of the training time link probes may take:
 *              gcomp_adapt_link_due)
 *   accuracy:  target=T (0 < T < 1, or a percentage), band=0.002, margin=0.02 (the glide
 *              path target - margin * (1 - progress)), start=0.1 (progress before which it
 *              holds), dwell=2 (metric decisions between moves), window=4 (the latest
 *              deviations from the course it averages, since its last move), hold=0.8
 *              (progress from which it only lightens), course=auto|glide (auto: the
 *              reference curve of gcomp_adapt_set_course when one is set, else the glide
 *              path)
 *   layers:    budget=uniform|BYTES (bytes per step of the compressed tensors),
 *              margin=0.05 (the least relative error reduction for which a new plan
 *              replaces the plan in force), error_on=input|gradient (what the measured
 *              errors are of: the gradient plus the residual, or the gradient alone)
 *   norm:      eta=0.5, low=VALUE|SPEC (the critical setting; default two ladder steps
 *              lighter than base), lr_drop=0.8 (a fall of the learning rate by at least
 *              this fraction since the last decision makes the next interval critical,
 *              Accordion's rule at a decay; 1: off; needs gcomp_adapt_observe_lr)
 *
 * One decision, on every rank:
 *     for each step:  gcomp_adapt_observe(a, i, grad, residual) for each tensor i
 *                     gcomp_adapt_observe_compute(a, fwd, bwd, opt)
 *                     gcomp_adapt_end_step(a, &due)
 *     when due:       if gcomp_adapt_link_due(a): probe the link (gcomp_mpi_link_probe),
 *                       gcomp_adapt_observe_link and gcomp_adapt_observe_link_time
 *                     gcomp_adapt_stats(a, mine, cap, &len)        this rank's statistics
 *                     allgather `mine` (len doubles) from every rank, in rank order
 *                     gcomp_adapt_decide(a, all, len, nranks, &changed, &err)
 *                     for each i with gcomp_adapt_changed(a, i): retune tensor i to
 *                     gcomp_adapt_spec(a, i)
 * Every decision is a pure function of the gathered statistics (combined in rank order:
 * sums, maxima and medians over ranks, bit for bit the same wherever they are computed) and
 * of the previous decisions, never of this rank's own observations, so ranks never
 * disagree; statistics from a rank with another configuration (the method, the tensors,
 * and every gcomp_adapt_options field a decision reads: total_steps, and with the
 * bandwidth controller workers, nodes, strategy, calibration and the policy's dense spec)
 * are GCOMP_E_MISMATCH.
 * (gcomp_mpi_adapt_decide in gradcomp_mpi.h does the allgather on an MPI communicator.)
 * Thread-safety as for every object.
 */
typedef struct gcomp_adapt gcomp_adapt;

/** The run as the controllers need to know it (zero fields: defaults). */
typedef struct gcomp_adapt_options {
    uint64_t total_steps; /**< steps of the run (interval=auto scales with it; accuracy needs it);
                             0: unknown */
    int workers;          /**< ranks that exchange gradients (the cost model's P); 0: 1 */
    int nodes;            /**< nodes they are on (1..workers); 0: 1 */
    /** The exchange's strategy for a spec (gcomp_cost_strategy values; the MPI layer's
     *  gcomp_mpi_strategy_auto).  NULL: allreduce for linear and multi-phase specs,
     *  allgather for the others. */
    int (*strategy)(void *ctx, const char *spec);
    void *strategy_ctx;
    /** Codec rates for the bandwidth controller before the first measurement (may be NULL;
     *  read at create, not kept). */
    const gcomp_cost_calibration *calibration;
    /** The layer policy's defaults where the method string sets none: min_elements
     *  (0: the policy's) and the spec of the tensors it leaves dense (NULL: "none"). */
    size_t min_elements;
    const char *dense_spec;
} gcomp_adapt_options;

/**
 * Parses `method` (with or without the "adapt:" prefix; copied), applies the layer policy
 * to the `count` tensors (gcomp_tensor_desc: name, n, shape; copied), builds every managed
 * tensor's ladder and the first decision (Accordion starts in the critical setting; the
 * others at base).  `opt` may be NULL.
 * Returns GCOMP_OK; GCOMP_E_ARG (NULL, count 0, a bad tensor); GCOMP_E_SPEC (the grammar:
 * an unknown controller or key, a key no listed controller reads, a value out of range such
 * as target=150 or target=0 (1 < T < 100 reads as a percentage), an empty ladder or one whose
 * entries send the same bytes, a ladder value the base's knob refuses; *err names the culprit and
 * what is allowed); GCOMP_E_UNKNOWN_CODEC; GCOMP_E_LIMIT; GCOMP_E_NOMEM.  On failure *out is NULL.
 */
GCOMP_API gcomp_status gcomp_adapt_create(gcomp_adapt **out, const char *method,
                                          const gcomp_tensor_desc *tensors, size_t count,
                                          const gcomp_adapt_options *opt, gcomp_error *err);
/** Frees the object; NULL is a no-op. */
GCOMP_API void gcomp_adapt_free(gcomp_adapt *a);

/** Tensors given at create. */
GCOMP_API size_t gcomp_adapt_count(const gcomp_adapt *a);
/** Tensor i's current spec (canonical; owned by `a`, valid until the next decide or free);
 *  NULL when i is out of range. */
GCOMP_API const char *gcomp_adapt_spec(const gcomp_adapt *a, size_t i);
/** 1 when the controllers manage tensor i (the policy compresses it with base), else 0. */
GCOMP_API int gcomp_adapt_managed(const gcomp_adapt *a, size_t i);
/** Tensor i's ladder position (0: the candidate that sends most); -1 when not managed. */
GCOMP_API int gcomp_adapt_level(const gcomp_adapt *a, size_t i);
/** 1 when the last gcomp_adapt_decide changed tensor i's spec (0 after one that failed). */
GCOMP_API int gcomp_adapt_changed(const gcomp_adapt *a, size_t i);
/** Candidates in the ladder, and candidate j as a spec (canonical, owned by `a`). */
GCOMP_API size_t gcomp_adapt_ladder_size(const gcomp_adapt *a);
GCOMP_API const char *gcomp_adapt_candidate(const gcomp_adapt *a, size_t j);
/** 1 when the method uses the controller named `name` ("bandwidth", "accuracy", "layers",
 *  "norm"): e.g. whether to measure the link for it. */
GCOMP_API int gcomp_adapt_uses(const gcomp_adapt *a, const char *name);
/** The same for a method string before any gcomp_adapt is created ("adapt:accuracy+layers;
 *  ..."; the `adapt:` prefix is required): its controller list parsed as gcomp_adapt_create
 *  parses it.  0 for a method that is not adaptive or whose controller list is invalid
 *  (gcomp_adapt_create says why). */
GCOMP_API int gcomp_adapt_method_uses(const char *method, const char *name);
/** The configuration fingerprint the statistics carry (method, ladder, tensors, the options
 *  decisions read, the course and the exchange groups): equal on every rank of one run.  The
 *  method enters by meaning: options in any order, a number by its value (eta=0.5 is
 *  eta=5e-1), one given at its default as if absent; name overrides in their order.  A
 *  front end may compare it across ranks before the first decision, where a rank with
 *  other settings would otherwise enter the decision's collective at another step.  0 for
 *  NULL. */
GCOMP_API uint64_t gcomp_adapt_fingerprint(const gcomp_adapt *a);
/** Steps between decisions and between measurements, as resolved (auto included; with
 *  measure=auto the least spacing, gcomp_adapt_report.next_measure_step the next one). */
GCOMP_API uint64_t gcomp_adapt_interval(const gcomp_adapt *a);
GCOMP_API uint64_t gcomp_adapt_measure_interval(const gcomp_adapt *a);
/** bandwidth: the last decision's predicted step time of candidate j, seconds (the cost
 *  model's, from the measured link, codec times and compute); NaN before the first
 *  decision with a measured link, without the controller or j out of range. */
GCOMP_API double gcomp_adapt_predicted(const gcomp_adapt *a, size_t j);

/**
 * Observes this step's gradient of tensor i (n floats, borrowed for the call), before it is
 * exchanged; `residual` (may be NULL) is what its compressor holds back
 * (gcomp_compressor_residual), so measurements see the vector the codec will compress.
 * Accumulates the gradient for the norm controller and, on measurement steps
 * (gcomp_adapt_measuring), compresses it with every candidate: error and codec time.
 * Unmanaged tensors are ignored.  Local.  Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_NOMEM, or
 * GCOMP_E_NONFINITE for a NaN or Inf in grad or residual, where the tensor is read (the
 * norm controller, a measurement step) - then nothing of it is kept.
 */
GCOMP_API gcomp_status gcomp_adapt_observe(gcomp_adapt *a, size_t i, const float *grad,
                                           const float *residual);
/** 1 when the current step measures every candidate (call observe with the residual). */
GCOMP_API int gcomp_adapt_measuring(const gcomp_adapt *a);
/** This step's compute on this rank, seconds: forward, backward, optimizer.  Local.  The
 *  time this step's gcomp_adapt_observe calls spent measuring candidates is taken out of
 *  backward (then forward): it is the controllers' cost, not the model's compute.  A call
 *  with a value that is negative, NaN or infinite is ignored, as a bad link reading is. */
GCOMP_API void gcomp_adapt_observe_compute(gcomp_adapt *a, double forward_s, double backward_s,
                                           double optimizer_s);
/** This rank's measurement of its link: payload bytes/s and one-way latency in seconds
 *  (the latest replaces earlier ones of the interval).  Local. */
GCOMP_API void gcomp_adapt_observe_link(gcomp_adapt *a, double bandwidth, double latency);
/** The seconds this rank spent measuring its link for the coming decision (the probe's wall
 *  time; added up over the interval).  Local.  The slowest rank's figure spaces the probes:
 *  one that cost p seconds against w seconds of training in its interval (the median gap
 *  between its gcomp_adapt_end_step calls times its steps, so that an evaluation or a
 *  decision between two steps does not count) puts the next
 *  ceil(p / (probe_cost * w)) intervals on, at most 10 (one stalled probe must not stop
 *  the link from being followed).  Without it every decision probes. */
GCOMP_API void gcomp_adapt_observe_link_time(gcomp_adapt *a, double seconds);
/** 1 when the decision now due should carry a fresh link measurement: the method uses the
 *  bandwidth controller and the probes' spacing has run out (always at the first decision
 *  and after a load of a version-1 state).  A decision without one uses the last measured
 *  link.  The same on every rank (it follows from gathered statistics only), so every
 *  rank enters the collective probe together; 0 for NULL. */
GCOMP_API int gcomp_adapt_link_due(const gcomp_adapt *a);
/** The learning rate of the steps to come (the schedule's rate for the next step, the
 *  same on every rank; > 0).  Local; the latest call of the interval counts, and a
 *  decision sees the least over the ranks that gave one.  Only the norm controller reads
 *  it (lr_drop); without calls it sees no decay.  A loop that only knows the rate it just
 *  used may pass that: a decay on a decision's step is then seen one decision late. */
GCOMP_API void gcomp_adapt_observe_lr(gcomp_adapt *a, double lr);
/** A validation metric to steer by (accuracy as a fraction, higher is better).  Local;
 *  its mean over ranks is what the accuracy controller sees.  A value outside [0, 1] (a
 *  percentage, NaN) is ignored: read as a fraction it would steer the wrong way. */
GCOMP_API void gcomp_adapt_observe_metric(gcomp_adapt *a, double value);
/**
 * accuracy: a reference learning curve to steer by instead of the glide path, typically the
 * evaluations of a dense run with the same schedule: n points, progress[k] the share of the
 * run's steps done when metric[k] was taken (strictly increasing, in (0, 1]), metric[k] a
 * fraction.  The course becomes that curve shifted to end at `target`,
 *     course(p) = ref(p) - (ref(last) - target)
 * (linear between the points, flat beyond them), so a target of "dense - 0.3 pp" asks for
 * 0.3 pp below dense at every evaluation, whatever the learning-rate schedule makes of the
 * curve's shape.  Copied; n = 0 goes back to the glide path; `course=glide` in the method
 * keeps the glide path even with a curve.  The curve enters the configuration fingerprint:
 * every rank must give the same points, else the next decide is GCOMP_E_MISMATCH on every
 * rank.  Returns GCOMP_OK; GCOMP_E_ARG (NULL, a method without the accuracy controller, a
 * progress out of (0, 1] or not increasing, a metric outside [0, 1]: *err says which);
 * GCOMP_E_NOMEM (the previous course stays).
 */
GCOMP_API gcomp_status gcomp_adapt_set_course(gcomp_adapt *a, const double *progress,
                                              const double *metric, size_t n, gcomp_error *err);
/**
 * bandwidth: how the caller's transport groups the tensors, so that the predicted step sees
 * its messages as they travel: groups[i] names tensor i's exchange group, 0 for a tensor
 * sent alone; `count` must be the tensor count.  With run_bytes 0, inside a group the
 * tensors an allreduce sums with one spec are predicted as one vector (PowerSGD's: one
 * allreduce of their factors a round) and the gathered ones as one allgather, wherever they
 * sit (the latency paid once), these exchanges started together (gcomp_cost_tensor.bucket):
 * how the DDP hook sends a DDP bucket.  With run_bytes > 0, as a gcomp_mpi bucket sends (its
 * sub-buckets): only consecutive tensors of one strategy and spec travel together, in backward
 * order (from the end of the list), each run cut before a tensor that would take it past run_bytes
 * of f32 gradient (SIZE_MAX: no cap, a bucket_bytes of 0), PowerSGD's a tensor at a time.  NULL
 * goes back to a message a tensor (the default, as the trainer sends them).  The groups and
 * run_bytes enter the configuration fingerprint: every rank must give the same ones, else
 * the next decide is GCOMP_E_MISMATCH on every rank.  They are not part of the saved state
 * (they describe the transport: give them again after a restore).  Returns GCOMP_OK;
 * GCOMP_E_ARG (NULL, count other than the tensor count); GCOMP_E_NOMEM (the previous groups
 * stay).
 */
GCOMP_API gcomp_status gcomp_adapt_set_exchanges(gcomp_adapt *a, const unsigned *groups,
                                                 size_t count, size_t run_bytes, gcomp_error *err);
/** Ends the step; *due (may be NULL) becomes 1 when a decision is due now. */
GCOMP_API void gcomp_adapt_end_step(gcomp_adapt *a, int *due);

/** Doubles this rank's statistics take (the same on every rank of one configuration). */
GCOMP_API size_t gcomp_adapt_stats_size(const gcomp_adapt *a);
/**
 * Writes this rank's statistics since the last call into out (cap doubles, at least
 * gcomp_adapt_stats_size) and their count into *len, and starts a new interval.  Local.
 * Returns GCOMP_OK, GCOMP_E_ARG or GCOMP_E_DST_SIZE.
 */
GCOMP_API gcomp_status gcomp_adapt_stats(gcomp_adapt *a, double *out, size_t cap, size_t *len);
/**
 * Takes the decision from every rank's statistics: `all` holds nranks blocks of `len`
 * doubles, rank 0's first (an allgather of gcomp_adapt_stats).  *changed (may be NULL)
 * receives how many tensors changed spec (gcomp_adapt_changed says which).
 * Returns GCOMP_OK; GCOMP_E_ARG; GCOMP_E_MISMATCH (a block of another configuration,
 * size or decision index: every rank that holds the same blocks returns it; nothing
 * changes); GCOMP_E_NOMEM (nothing changes).
 */
GCOMP_API gcomp_status gcomp_adapt_decide(gcomp_adapt *a, const double *all, size_t len, int nranks,
                                          size_t *changed, gcomp_error *err);

/** What the last decision saw (combined over ranks), for logs and plots. */
typedef struct gcomp_adapt_report {
    uint64_t decisions;         /**< decisions taken */
    uint64_t step;              /**< steps observed when it was taken */
    double bandwidth;           /**< the link used (bytes/s); 0 none */
    double latency;             /**< seconds */
    double compute_s;           /**< forward + backward + optimizer per step */
    double predicted_step_s;    /**< bandwidth: the chosen level's predicted step; 0 none */
    double metric;              /**< accuracy: the metric; NaN none */
    int uniform_level;          /**< the level the byte budget was set from */
    double budget;              /**< bytes per step of the managed tensors */
    size_t critical;            /**< norm: tensors in a critical regime */
    double error;               /**< layers: total compression error of the choice (0 none) */
    double error_uniform;       /**< layers: that measurement's error of the uniform setting */
    double measure_s;           /**< the last measurement's cost, slowest rank (0 none) */
    uint64_t next_measure_step; /**< the step (0-based) that measures next (0 none) */
} gcomp_adapt_report;
GCOMP_API void gcomp_adapt_get_report(const gcomp_adapt *a, gcomp_adapt_report *out);

/**
 * Checkpoints (docs/FORMAT.md, "Adaptive controllers' state"): one rank's state, taken
 * between two steps (after gcomp_adapt_end_step, or after a decision): the decisions and
 * every controller's memory (Accordion's last norms, L-GreCo's plan and measurement, the
 * bandwidth controller's confirmation streak and codec rates, the accuracy loop's offset
 * and deviations), the course, and this rank's observations since the last statistics.
 * Loaded into an object created with the same method, tensors and options, the run decides
 * from there as the uninterrupted one would have.  Local: each rank saves and loads its own.
 */
GCOMP_API size_t gcomp_adapt_state_bound(const gcomp_adapt *a);
/** Returns GCOMP_OK, GCOMP_E_ARG or GCOMP_E_DST_SIZE (cap below gcomp_adapt_state_bound). */
GCOMP_API gcomp_status gcomp_adapt_save_state(const gcomp_adapt *a, void *dst, size_t cap,
                                              size_t *len);
/**
 * All or nothing: GCOMP_E_TRUNCATED (shorter than it says), GCOMP_E_BAD_MAGIC,
 * GCOMP_E_VERSION (newer), GCOMP_E_CHECKSUM, GCOMP_E_MISMATCH (another method, ladder,
 * tensors or interval), GCOMP_E_STATE (lengths or fields that do not add up: a level beyond
 * the ladder, a flag other than 0 or 1, ...), GCOMP_E_NOMEM; on any error `a` is unchanged
 * and *err names the cause.
 */
GCOMP_API gcomp_status gcomp_adapt_load_state(gcomp_adapt *a, const void *src, size_t len,
                                              gcomp_error *err);

/* ------------------------------------------------------------------------------------- */
/* Low-rank (PowerSGD) multi-phase protocol: the transport runs the reductions             */

/**
 * PowerSGD (`powersgd:rank=r`, Vogels et al. 2019) needs two reductions per step, so a
 * transport (the MPI layer, the PyTorch hook, your own) drives it through this small state
 * machine instead of gcomp_encode.  The tensor is the row-major rows x cols matrix given at
 * create; P is rows x r and Q is stored transposed, r x cols (both row-major float32).  One
 * step, on every rank, with the same spec, shape, seed and step count:
 *
 *     float *p, *q;  size_t np, nq;  unsigned rounds;
 *     gcomp_lowrank_begin(c, grad, &p, &np, &rounds);
 *     if (rounds == 0) {                         // dense step
 *         allreduce_sum(p ? p : grad -> out);    // the transport's own dense path
 *         scale out;
 *         gcomp_lowrank_finish(c, NULL, 0.0f);   // commits the step
 *     } else {
 *         for (unsigned k = 0; k < rounds; k++) {
 *             if (k > 0) gcomp_lowrank_after_q(c, &p, &np);
 *             allreduce_sum_in_place(p, np);     // reduction 1
 *             gcomp_lowrank_after_p(c, &q, &nq);
 *             allreduce_sum_in_place(q, nq);     // reduction 2
 *         }
 *         gcomp_lowrank_finish(c, out, 1.0f / world);  // out = P^ Q^T / world
 *     }
 *
 * What each call computes (E is this rank's residual, kept by the compressor):
 *   begin     M = grad + E; P = M * normalise(Q_warm) (Q_warm: the last step's summed Q,
 *             or a random Q drawn from seed= when there is none or warm_start=0).
 *   after_p   P (now summed) -> P^ with orthonormal columns (modified Gram-Schmidt; a
 *             numerically dependent column is replaced by a shared pseudo-random one, so
 *             P^ is always finite); Q_local = M^T * P^ into the Q buffer.
 *   after_q   (only when rounds > 1, between rounds) P = M * normalise(Q summed).
 *   finish    out = scale * P^ * Q^T (Q summed); E = M - P^ * Q_local^T; Q becomes the
 *             next warm start; the step counter advances.
 * The sum of the residuals over ranks is sum(M) - P^ Q^T whatever `scale` is, and a single
 * rank holding the summed gradient computes the same P^, Q and out (up to float rounding):
 * that is what makes allreduce of P and Q exact.
 *
 * Dense steps (rounds == 0): before `start_iter=` steps, when (rows + cols) * r *
 * min_compression_rate >= rows * cols, and always for a tensor created without a shape
 * (1-D).  The compressor does not read `grad` then: the transport reduces the gradient
 * itself, then calls finish with out = NULL.  E is not touched by a dense step (it is zero
 * unless compressed steps came before; if not, it joins the next compressed step).  One
 * exception: after gcomp_compressor_retune into a spec whose every step is dense here,
 * what the old spec held back must go out with the next step, so that step's *p is
 * grad plus it (*p_len = n) and the transport reduces *p instead of grad; *p is NULL on
 * every other dense step.  finish commits it as sent; abort keeps it for the next begin.
 *
 * Buffers: *p and *q point into the compressor (never free them); the caller sums them in
 * place, all ranks must end with identical sums, and they are valid until the next call on
 * `c`.  The protocol buffers are always float32 and the transport chooses its wire type;
 * with `values=f16` each rank's P and Q are already rounded to f16 (saturating at +-65504)
 * when handed out, so sending them as f16 loses nothing more per rank, and the rounding of
 * Q_local is inside E (error feedback keeps it).  The summation precision is the
 * transport's.  `grad` is read during begin only; `out` may be the same buffer as `grad`.
 *
 * Errors: calls out of order give GCOMP_E_PROTOCOL and change nothing (the step in
 * flight, if any, continues).  GCOMP_E_ARG (NULL pointers, non-finite scale, out == NULL
 * on a compressed step) also changes nothing.  GCOMP_E_NONFINITE (NaN/Inf in grad, in a
 * summed buffer, or an overflowing product) abandons the step: the state is exactly as it
 * was before begin, and the next call must be begin.  gcomp_lowrank_abort abandons a step
 * the same way (e.g. when a reduction failed or timed out), as do gcomp_state_load and
 * gcomp_state_reset.  gcomp_encode during a step gives GCOMP_E_PROTOCOL.
 * Every rank must take the same path: a rank whose step failed must make the others
 * abort too, keeping the sizes of its reductions (gcomp_lowrank_shape; the MPI layer and
 * the DDP hook do).  A compressor of another codec gives GCOMP_E_UNSUPPORTED.
 *
 * Statistics: a finished step counts as one message: bytes_out is what one rank sent
 * (rounds * (np + nq) values at 4 or 2 bytes; 4 * n for a dense step) and encode_ns the time
 * spent inside these calls.  gcomp_encode on the same compressor runs the whole step
 * locally (one rank: no reductions) and writes a message whose decode adds P^ Q^T.
 */
GCOMP_API gcomp_status gcomp_lowrank_begin(gcomp_compressor *c, const float *grad, float **p,
                                           size_t *p_len, unsigned *rounds);

/**
 * The shape of the step that gcomp_lowrank_begin starts next (or of the one in flight),
 * without starting it: *rounds as begin gives it (0: a dense step of n values), and the
 * lengths, in floats, of each round's P and Q buffers (0 on a dense step).  It reads the
 * compressor's settings and step counter only, never a gradient, so it answers alike on
 * every rank whose state agrees.  A transport whose begin failed on this rank (a NaN
 * gradient) takes part in the step's reductions with that many zeros and a failure flag,
 * so that no reduction's size differs across ranks and all abandon the step together.
 * Returns GCOMP_OK, GCOMP_E_ARG (a NULL pointer) or GCOMP_E_UNSUPPORTED (another codec).
 */
GCOMP_API gcomp_status gcomp_lowrank_shape(const gcomp_compressor *c, unsigned *rounds,
                                           size_t *p_len, size_t *q_len);

/** After the P reduction: returns the Q buffer (r * cols floats) to sum.  See above. */
GCOMP_API gcomp_status gcomp_lowrank_after_p(gcomp_compressor *c, float **q, size_t *q_len);

/** After a Q reduction that is not the last one (rounds > 1): returns the next P to sum. */
GCOMP_API gcomp_status gcomp_lowrank_after_q(gcomp_compressor *c, float **p, size_t *p_len);

/**
 * After the last Q reduction: writes out[i] = scale * (P^ Q^T)[i] for all n elements
 * (overwrites, does not add), updates E and commits the step.  On a dense step, commits
 * the step only; `out` is not touched and may be NULL.
 */
GCOMP_API gcomp_status gcomp_lowrank_finish(gcomp_compressor *c, float *out, float scale);

/** Abandons the step in flight, if any; the state stays as it was before begin. */
GCOMP_API void gcomp_lowrank_abort(gcomp_compressor *c);

/**
 * Copies this rank's residual E (n floats, row-major) into `out`; zeros for a tensor that is
 * always sent dense.  (gcomp_compressor_residual returns NULL for powersgd: its residual is
 * kept in factored form, E = W - P^ Q_local^T, and is formed here on demand.)
 * Returns GCOMP_OK, GCOMP_E_ARG or GCOMP_E_UNSUPPORTED (another codec).
 */
GCOMP_API gcomp_status gcomp_lowrank_residual(const gcomp_compressor *c, float *out);

#ifdef __cplusplus
}
#endif
#endif /* GRADCOMP_H */

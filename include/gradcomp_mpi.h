/*
 * gradcomp_mpi.h - compressed collectives on MPI (libgradcomp_mpi).
 *
 * Moves compressed gradients between the ranks of an MPI communicator and leaves, in
 * each rank's own float32 buffers, the sum (or average) of what every rank's decoder
 * produces.  Standard MPI-3 only (non-blocking collectives), so Open MPI and MPICH work.
 *
 *     gcomp_mpi_comm *comm;
 *     gcomp_mpi_comm_create(&comm, MPI_COMM_WORLD, NULL, 60.0, &err);
 *     gcomp_mpi_tensor t[2] = {{"fc1.weight", "topk:density=0.001,feedback=ef", n1},
 *                              {"fc1.bias", "none", n2}};
 *     gcomp_mpi_bucket *b;
 *     gcomp_mpi_bucket_create(&b, comm, t, 2, NULL, 60.0, &err);     // collective
 *     float *data[2] = {grad1, grad2};
 *     gcomp_mpi_allreduce(b, data, GCOMP_MPI_AVERAGE, 60.0, &err);  // every step
 *     // or: gcomp_mpi_start(b, data, ...); ...compute...; gcomp_mpi_wait(b, 60.0, &err);
 *
 * Objects
 *   A communicator (gcomp_mpi_comm) wraps a duplicate of the caller's MPI_Comm with
 *   MPI_ERRORS_RETURN, so MPI errors come back as statuses instead of aborting.  A
 *   bucket (gcomp_mpi_bucket) is a fixed list of tensors, each with its own codec spec
 *   and its own compressor state (error-feedback residuals, ...), which the library
 *   creates from the spec and owns.  Each bucket has its own duplicate communicator, so
 *   several buckets may be in flight at once (one per layer, started as soon as the
 *   layer's gradient is ready).  Every rank must create the same buckets in the same
 *   order, and start the allreduces of one bucket in the same order.
 *
 * Strategies (chosen per tensor from its spec's description; overridable per tensor)
 *   Each strategy is a component of the library (src/mpi/mpi_strategy.h, in the manner of
 *   Open MPI's coll framework): one file and one line in a table of them, which the
 *   bucket engine calls through.  Parsing, names, the auto choice (each component's
 *   query scores the spec's gcomp_spec_describe; gcomp_spec_describe and the spec API are
 *   all the layer reads of a spec - it never parses spec text or tests a codec's name),
 *   set-up, scheduling and checkpoints all come from that table, so adding a strategy
 *   touches no other strategy and no shared switch.  The built-in ones:
 *   allgather   sizes, then MPI_Allgatherv of the messages (no padding), and every rank
 *               decodes every message.  Any codec.  Traffic per rank grows with P.
 *               Default for sparse and other non-linear codecs.
 *   sparse      sparse allreduce whose traffic per rank is bounded by 2(P-1)/P of one
 *               message (Ok-Topk / SparCML "split allgather"): the index space is cut
 *               into P regions; each rank sends each region's slice of its decoded
 *               contribution to the region's owner (MPI_Alltoallv), the owner sums,
 *               re-compresses its region with the same codec (and error feedback, the
 *               owner-side residual, as for rsag below), and the owners' messages are
 *               allgathered.
 *   allreduce   a sum of the codec's values for codecs that sum linearly (MPI_Iallreduce;
 *               packs of 256 KB and more go around the library's own ring of
 *               MPI_Isend/Irecv, which moves them twice as fast as Open MPI's
 *               non-blocking MPI_Iallreduce):
 *               `none` in f32, f16 or bf16 (f16/bf16 are summed as halves by a
 *               user-defined MPI_Op that only casts and adds), `randomk` with the same
 *               seed on every rank (values only; the positions are re-derived from the
 *               seed), and PowerSGD's P and Q factors through the multi-phase protocol
 *               of gradcomp.h (gcomp_lowrank_*; one PowerSGD tensor per sub-bucket,
 *               iters <= 8).  Two components provide it (the linear pack and the
 *               multi-phase protocol); the spec's description picks.
 *   rsag        reduce-scatter + allgather with re-compression at the owner and error
 *               feedback on both sides (DeepSpeed's 1-bit compressed allreduce): each
 *               rank compresses chunk j of its gradient with its own chunk compressor
 *               and sends it to rank j (MPI_Alltoallv); rank j decodes and sums the P
 *               chunks, compresses the sum with the owner-side residual, and the owners'
 *               messages are allgathered.
 *               The owner's error feedback needs a codec that is a contraction,
 *               E|C(x)-x|^2 < |x|^2: deterministic codecs are (sign, twobit, nearest
 *               int8/int4, top-k, ...); for a codec that draws random numbers the owner
 *               asks the core, whose worst-case bound per codec refuses feedback=ef
 *               around non-contractions (gcomp_compressor_create).  QSGD at few levels is not
 *               (levels=4, buckets of 512: 3.5), nor is ternary (1.6) or bernoulli
 *               (1/p - 1): fed back, the owner's residual grows by that factor each step
 *               (qsgd:levels=4 gave NaN at step 18 on a 4-rank MLP).  Their owners
 *               re-compress without feedback (the re-compression of an unbiased codec is
 *               unbiased; its variance is added a second time), with a seed of their own
 *               (gcomp_mpi_owner_spec).  Auto's choice for quantizers that are contractions
 *               (int8, int4, qsgd at 16 levels; not twobit, sign, ternary, qsgd at few
 *               levels: see gcomp_mpi_strategy_auto).  Its owners quantise a second
 *               time: fine for 8 and 4 bits, but for 1-bit sign the second quantisation
 *               doubles what the residuals hold back and EF-signSGD on gradients can
 *               diverge (a 4-rank MLP: 38 % after one epoch against 84 % by allgather);
 *               choose it for sign only where that was measured to train (1-bit Adam's
 *               compressed momentum).
 *   ps          parameter server (MXNet's kvstore dist_sync / dist_async, BytePS): S ranks
 *               of the communicator serve, the others push compressed gradients to them
 *               and pull the sum, or the weights the servers' optimizer updated.  Asked
 *               for by name only, on buckets created with a gcomp_mpi_ps (see "Parameter
 *               server" below); `hierarchical:ps` is MXNet's dist_sync_device.
 *   hierarchical (flag, combined with any of the above): a dense float32 sum inside a
 *               node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); a binomial tree of
 *               point-to-point messages to the node leader), the compressed exchange
 *               between node leaders only, and the result sent back inside the node.
 *               With one node the leader's dense sum is exact and nothing is compressed.
 *
 * Pipelining
 *   Inside a bucket, consecutive tensors with the same strategy are grouped into
 *   sub-buckets of about `bucket_bytes` (dense bytes).  Sub-bucket i+1 is compressed
 *   while sub-bucket i is on the wire (MPI_Iallgatherv / MPI_Ialltoallv /
 *   MPI_Iallreduce), and sub-bucket i is decoded while i+1 is on the wire.  Collectives
 *   are issued in the same order on every rank (a fixed schedule), which MPI requires.
 *   MPI makes progress only inside MPI calls: gcomp_mpi_start does all the compression
 *   and issues what it can; call gcomp_mpi_test now and then during the caller's own
 *   computation so large transfers keep moving, then gcomp_mpi_wait.  Several buckets in
 *   flight (one per layer) are best finished by one gcomp_mpi_wait_all: a bucket's next
 *   round (PowerSGD's second factor, an allgather's messages after their lengths) is
 *   issued by a call on that bucket, so waiting on them one after another holds each
 *   bucket's later rounds back until the wait reaches it.
 *
 * Set-up checks
 *   Bucket creation compares, across all ranks, every tensor's canonical spec
 *   fingerprint, size and shape, strategy, name and the wire format version (an
 *   MPI_Allreduce of a hash and its complement with MPI_MAX, so every rank learns the
 *   minimum and maximum and all of them agree).  A difference is GCOMP_E_MISMATCH on
 *   every rank, naming the first tensor that differs: never wrong numbers.  At run time
 *   every message is checked again (fingerprint, size, checksums) before it is decoded.
 *
 * Random draws
 *   A spec whose random draws only round or sample values whose positions travel
 *   (GCOMP_SPEC_PRIVATE_DRAWS: qsgd, ternary, int8/int4 rounding=stochastic, bernoulli,
 *   importance, the sample of `sampled`, as values= of any selector too; allgather, sparse
 *   and rsag workers) draws on each rank from a seed of that rank's own, derived from the
 *   spec's seed and the rank (on node leaders, the node; gcomp_mpi_worker_spec), so the
 *   ranks' rounding errors are independent and the variance of the average shrinks by P
 *   (with one seed on every rank, ranks with similar gradients made the same draws and
 *   it did not shrink).  Each
 *   rank's messages carry the fingerprint of its own spec; every rank knows all of them
 *   and still rejects a message that is not the sender's.  The set-up check compares the
 *   specs as given, so different seed= values across ranks are still GCOMP_E_MISMATCH.
 *   Kept on the spec's seed: draws every rank must make alike (GCOMP_SPEC_SHARED_DRAWS,
 *   which wins when a spec has both): random-k (the positions come from it; allreduce
 *   sums by position), PowerSGD (its starting Q must agree); the owners of rsag and
 *   sparse have their own seed (gcomp_mpi_owner_spec).
 *
 * Errors, timeouts, failures
 *   Every blocking call takes `timeout_s` (seconds; <= 0 means the communicator's
 *   default from gcomp_mpi_options).  Waiting is an MPI_Test loop with a deadline (it
 *   yields the core between tests, and sleeps 50 us between them once a wait has lasted
 *   20 ms), never a blocking MPI wait, so a dead or stalled peer gives
 *   GCOMP_E_TIMEOUT (or GCOMP_E_MPI when MPI itself reports the error) instead of a hang.
 *   After a timeout or an MPI error the communicator and all its buckets report
 *   GCOMP_E_FAILED until gcomp_mpi_comm_reset or free.
 *   A problem one rank finds in its own data (a NaN gradient, a corrupt message from a
 *   peer) is sent along with the exchange, so every rank returns an error for that call
 *   (the status of the rank that found it) and the communicator stays usable.
 *   What MPI cannot do: after a peer process has died, Open MPI 4.1 (without ULFM) cannot
 *   repair or shrink a communicator; the contract here is "an error instead of a hang".
 *   The surviving ranks should then save what they need (gcomp_mpi_bucket_save_state
 *   works on a failed bucket) and exit; MPI_Finalize may itself
 *   hang waiting for the dead peer, and mpirun aborts the job unless told otherwise
 *   (`--mca orte_enable_recovery 1` keeps the survivors alive long enough to report).
 *   Requests that never completed keep their buffers: the library keeps those buffers
 *   allocated (never freed under MPI's feet) until the communicator is freed, and a
 *   pending request at that point is leaked on purpose.
 *   MPI_Comm_split_type and MPI_Comm_split have no non-blocking form; they run only in
 *   gcomp_mpi_comm_create and gcomp_mpi_comm_reset, so a peer that dies exactly there
 *   can hang those two calls.  Every other call is bounded by its timeout.
 *   After a failed allreduce (any status), the tensors' data is unspecified and the
 *   compressors' residuals have advanced as if the step had been sent: at most one
 *   step's compressed content is lost (PowerSGD abandons the step instead: its state
 *   stays as before the call).
 *   Overflow: when every rank's gradient is finite but their sum is not (finite values
 *   near FLT_MAX; a diverging run or a loss scale too high), every strategy returns
 *   GCOMP_E_NONFINITE on every rank for that call, naming the tensor - never Inf or NaN
 *   as GCOMP_OK, and never a failure one step later from the next encode.  Where it is
 *   found: allgather and allreduce check their output (all ranks hold the same summed
 *   values, so all reach the same verdict; folded into the unpack pass for allreduce, one
 *   read pass after decoding for allgather and the owner strategies); rsag and sparse
 *   owners find it when they re-compress their region's sum (an owner's encode fails and
 *   changes nothing in the owner residual); hierarchical with one node checks the node
 *   sum; PowerSGD checks each summed factor before handing it back, so the step is
 *   abandoned with its state unchanged.  State after it, as for any failed call: the
 *   worker compressors' encode of that step stands - what each rank sent of the step is
 *   dropped (the way mixed-precision training skips a step whose gradients overflowed)
 *   and what its residual held back is kept, so with error feedback the held-back part
 *   re-enters, and may overflow, the next sum; gcomp_state_reset on
 *   gcomp_mpi_compressor(b, i) forgets it.  The data buffers hold no usable result.
 *
 * Threads
 *   The library never calls MPI_Init, MPI_Finalize or MPI_Abort, never prints, exits or
 *   aborts.  It needs MPI_THREAD_FUNNELED (the codecs may run OpenMP worker threads that
 *   never call MPI) or MPI_THREAD_SERIALIZED: a communicator and its buckets are used by
 *   one thread at a time, the one allowed to call MPI.  Distinct communicators made from
 *   distinct MPI communicators are independent.
 *
 * Ownership
 *   `create` / `free` pairs; free(NULL) is a no-op; a failed create leaves nothing
 *   allocated and sets *out to NULL.  Strings and arrays passed to create are copied.
 *   Tensor data passed to start/allreduce is borrowed until the call completes.
 */
#ifndef GRADCOMP_MPI_H
#define GRADCOMP_MPI_H

#include <mpi.h>

#include "gradcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gcomp_mpi_comm gcomp_mpi_comm;
typedef struct gcomp_mpi_bucket gcomp_mpi_bucket;
typedef struct gcomp_mpi_ps gcomp_mpi_ps;

/* ------------------------------------------------------------------------------------- */
/* Strategies                                                                              */

/** How a tensor's messages meet across ranks (see the top of this file). */
typedef enum gcomp_mpi_strategy {
    GCOMP_MPI_AUTO = 0,      /**< from the codec's flags (see gcomp_mpi_strategy_auto) */
    GCOMP_MPI_ALLGATHER = 1, /**< allgather messages, decode all */
    GCOMP_MPI_SPARSE = 2,    /**< sparse allreduce (regions, owners, allgather) */
    GCOMP_MPI_ALLREDUCE = 3, /**< dense allreduce of linear values */
    GCOMP_MPI_RSAG = 4,      /**< reduce-scatter + allgather with owner re-compression */
    GCOMP_MPI_PS = 5         /**< parameter server (a bucket with a gcomp_mpi_ps) */
} gcomp_mpi_strategy;

/** Or'ed into a strategy: dense reduce inside each node, the strategy between nodes. */
#define GCOMP_MPI_HIERARCHICAL 0x100

/**
 * Parses "auto", "allgather", "sparse", "allreduce", "rsag", "ps", "hierarchical" (= auto
 * between nodes) or "hierarchical:NAME" into *out.  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_strategy_parse(const char *s, int *out);

/** Static name of a strategy value ("allgather", "hierarchical:rsag", ...), "?" if bad. */
GCOMP_API const char *gcomp_mpi_strategy_name(int strategy);

/**
 * The strategy GCOMP_MPI_AUTO picks for a codec spec (never AUTO, never HIERARCHICAL).
 * Each strategy component scores the spec's description, gcomp_spec_describe(spec,
 * 65536) (the size at which the core's contraction bounds are asked, so the answer does
 * not depend on a tensor's or a region's size), and the highest score wins.  The rule
 * the built-in scores make, in terms of that description:
 *   ALLREDUCE  GCOMP_SPEC_MULTIPHASE (PowerSGD), or GCOMP_SPEC_LINEAR with a value_type of
 *              f32, f16 or bf16 (`none`, `randomk`): the values themselves are summed;
 *   RSAG       a codec that is itself a quantizer (its gcomp_codec_info has
 *              GCOMP_CODEC_QUANTIZER: int8, int4, qsgd, ...; not a value coder under a
 *              selector, `none:values=int8` included) that is a GCOMP_SPEC_CONTRACTION (so
 *              its owners keep error feedback, see rsag above), not GCOMP_SPEC_SATURATING,
 *              with value_bits >= 4;
 *   ALLGATHER  everything else; SPARSE only when asked for by name.
 * Why the quantizers that fail the rsag test go by allgather, each measured: twobit
 * (saturating) - its fixed +-t cannot carry the sum of P ranks' +-t, so an owner
 * re-compressing it falls ever further behind, as MXNet's server never does; sign (1 bit)
 * - an owner's second 1-bit quantisation doubles the gradient held back in residuals, see
 * rsag above; ternary and qsgd at few levels (no contraction) - an owner without feedback
 * adds the codec's variance a second time, 78.6 % against 85.0 % by allgather for
 * qsgd:levels=4 on a 4-rank MLP after one epoch, 80.0 % against 84.2 % for ternary.
 * Thread-safe; allocates nothing that outlives the call.
 * `nranks` is the number of ranks that exchange (reserved for size-dependent choices;
 * today unused).
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC or GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_mpi_strategy_auto(const char *spec, int nranks, int *out);

/* ------------------------------------------------------------------------------------- */
/* Communicator                                                                            */

typedef struct gcomp_mpi_options {
    /** Timeout for blocking calls that pass timeout_s <= 0.  Default 300 s. */
    double timeout_s;
    /**
     * How ranks are grouped into nodes for the hierarchical strategy.  0 (default):
     * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), i.e. real shared-memory nodes.  k > 0:
     * consecutive groups of k ranks (rank / k), to exercise the hierarchical path on one
     * machine.  Must be the same on every rank.
     */
    int ranks_per_node;
} gcomp_mpi_options;

/** Fills *o with the defaults. */
GCOMP_API void gcomp_mpi_options_default(gcomp_mpi_options *o);

/**
 * Creates a communicator over `comm` (collective over `comm`; MPI must be initialised).
 * The library duplicates `comm` (MPI_Comm_idup, bounded by `timeout_s`), sets
 * MPI_ERRORS_RETURN on its duplicates, and splits them into nodes and node leaders
 * (MPI_Comm_split_type / MPI_Comm_split: blocking, see the top of this file).  `comm`
 * stays the caller's and must outlive the object.
 *  opt        may be NULL (defaults); copied.
 *  err        may be NULL.
 * Returns GCOMP_OK, GCOMP_E_ARG (NULL out, MPI not initialised, MPI_COMM_NULL, bad
 * option), GCOMP_E_NOMEM, GCOMP_E_MPI, GCOMP_E_TIMEOUT.
 */
GCOMP_API gcomp_status gcomp_mpi_comm_create(gcomp_mpi_comm **out, MPI_Comm comm,
                                             const gcomp_mpi_options *opt, double timeout_s,
                                             gcomp_error *err);

/**
 * Frees the communicator and its MPI duplicates (local).  Its buckets must be freed
 * first: otherwise GCOMP_E_ARG and nothing is freed.  NULL is a no-op (GCOMP_OK).
 * Buffers and communicators of operations abandoned after a failure are freed only if
 * those operations have completed by now; otherwise they are leaked on purpose (MPI may
 * still write into them).  A process that goes on using MPI after a peer failed should
 * not free a communicator toward which that peer may still have operations pending (a
 * collective this rank never joined): Open MPI reuses the context id, and the late
 * messages can land in a later communicator (seen as a crash at 4 ranks); keep it
 * instead.  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_comm_free(gcomp_mpi_comm *c);

/**
 * GCOMP_OK while usable; GCOMP_E_FAILED after a timeout or MPI error, with the original
 * failure in *err (may be NULL).
 */
GCOMP_API gcomp_status gcomp_mpi_comm_status(const gcomp_mpi_comm *c, gcomp_error *err);

/**
 * Collective: makes a failed communicator usable again by re-duplicating the caller's
 * MPI communicator (idup with `timeout_s`, then the node split).  Every rank must call
 * it.  Buckets created before the reset stay failed: free and create them again.
 * Helps only when every peer is alive and all ranks saw the failure (a stall that ended,
 * a timeout set too short); after a peer died it fails again with GCOMP_E_TIMEOUT or
 * GCOMP_E_MPI.  The old duplicates are kept (not freed) until gcomp_mpi_comm_free: a
 * late message of an abandoned collective must not reach a new communicator that
 * reuses a freed one's context id.  Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_NOMEM, GCOMP_E_MPI,
 * GCOMP_E_TIMEOUT.
 */
GCOMP_API gcomp_status gcomp_mpi_comm_reset(gcomp_mpi_comm *c, double timeout_s, gcomp_error *err);

/** This rank, the number of ranks, the number of nodes, and this rank's node index. */
GCOMP_API int gcomp_mpi_comm_rank(const gcomp_mpi_comm *c);
GCOMP_API int gcomp_mpi_comm_size(const gcomp_mpi_comm *c);
GCOMP_API int gcomp_mpi_comm_nodes(const gcomp_mpi_comm *c);
GCOMP_API int gcomp_mpi_comm_node(const gcomp_mpi_comm *c);

/* ------------------------------------------------------------------------------------- */
/* Buckets                                                                                 */

/** One tensor of a bucket. */
typedef struct gcomp_mpi_tensor {
    const char *name;  /**< for messages and the set-up check; may be NULL ("#i"); copied */
    const char *spec;  /**< codec spec, e.g. "topk:density=0.001,feedback=ef"; copied */
    size_t n;          /**< elements (float32) */
    size_t rows, cols; /**< optional matrix shape (0, 0 for a vector), as for compressors */
    int strategy;      /**< GCOMP_MPI_AUTO or an override, optionally | HIERARCHICAL */
} gcomp_mpi_tensor;

typedef struct gcomp_mpi_bucket_options {
    /**
     * Sub-bucket size for pipelining, in dense bytes (4 n per tensor): consecutive
     * tensors with the same strategy are grouped until this size is reached.  A tensor is
     * never split.  0 means no limit (one sub-bucket per run of same-strategy tensors).
     * Default 4 MiB.  Must be the same on every rank.
     */
    size_t bucket_bytes;
    /**
     * The parameter server the bucket's tensors go through (strategy GCOMP_MPI_PS; see
     * "Parameter server" below), or NULL (default).  A bucket with a server carries only
     * `ps` tensors (GCOMP_MPI_PS, optionally | GCOMP_MPI_HIERARCHICAL).  Borrowed: the
     * server object must outlive the bucket.  Every rank passes its own object of the
     * same collective gcomp_mpi_ps_create.
     */
    gcomp_mpi_ps *ps;
} gcomp_mpi_bucket_options;

GCOMP_API void gcomp_mpi_bucket_options_default(gcomp_mpi_bucket_options *o);

/**
 * Creates a bucket (collective over the communicator): duplicates its MPI communicator,
 * creates each tensor's compressors from its spec, reserves every buffer the steady
 * state needs, and runs the set-up check described at the top of this file.
 *  tensors    `count` descriptions (count >= 1); copied.
 *  opt        may be NULL (defaults).
 * Returns GCOMP_OK; GCOMP_E_ARG (bad arguments; n too large for an MPI count); the
 * compressor's status for a bad spec (GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC, ...), with
 * the tensor named in *err; GCOMP_E_UNSUPPORTED (a strategy override the codec cannot
 * use, e.g. allreduce for topk); GCOMP_E_MISMATCH (ranks differ: every rank returns it);
 * GCOMP_E_NOMEM; GCOMP_E_TIMEOUT, GCOMP_E_MPI (the communicator is then failed);
 * GCOMP_E_FAILED.
 * A status that only this rank can see (a bad spec, out of memory) is still reported to
 * the other ranks through the set-up check, which then fails there with
 * GCOMP_E_MISMATCH: every rank returns an error together, and the communicator stays
 * usable.
 * Memory: every buffer an allreduce can need is reserved here, so that an allreduce
 * allocates nothing in this layer (an out-of-memory in the middle of an exchange could not
 * be shared with the other ranks); receive buffers are reserved for the largest messages
 * the specs allow (gcomp_encode_bound, times P for allgather) in virtual memory, whose
 * pages are touched only as far as the messages reach.
 */
GCOMP_API gcomp_status gcomp_mpi_bucket_create(gcomp_mpi_bucket **out, gcomp_mpi_comm *comm,
                                               const gcomp_mpi_tensor *tensors, size_t count,
                                               const gcomp_mpi_bucket_options *opt,
                                               double timeout_s, gcomp_error *err);

/**
 * Frees a bucket (local).  Must not be called while an allreduce is in flight unless the
 * communicator has failed; pending requests' buffers then move to the communicator.
 * NULL is a no-op.
 */
GCOMP_API void gcomp_mpi_bucket_free(gcomp_mpi_bucket *b);

/** Number of tensors, and the strategy actually used for tensor i (-1 if out of range). */
GCOMP_API size_t gcomp_mpi_bucket_count(const gcomp_mpi_bucket *b);
GCOMP_API int gcomp_mpi_bucket_strategy(const gcomp_mpi_bucket *b, size_t i);

typedef enum gcomp_mpi_op {
    GCOMP_MPI_SUM = 0,    /**< sum over ranks of the decoded tensors */
    GCOMP_MPI_AVERAGE = 1 /**< the sum divided by the number of ranks */
} gcomp_mpi_op;

/**
 * Allreduce of the bucket, blocking: on return data[i] (n_i floats, each rank's own
 * gradient on entry) holds the sum or average of the decoded tensors of all ranks.
 * Equivalent to gcomp_mpi_start followed by gcomp_mpi_wait(timeout_s).
 * Returns GCOMP_OK or the first error: GCOMP_E_ARG, GCOMP_E_NONFINITE (a NaN/Inf
 * gradient on some rank, or finite gradients whose sum overflows float: every rank
 * returns it, see "Overflow" at the top), GCOMP_E_CORRUPT, GCOMP_E_CHECKSUM,
 * GCOMP_E_MISMATCH (a message that does not belong: every rank that sees it, and the
 * owner strategies forward it to all), GCOMP_E_LIMIT (an exchange above 2 GiB),
 * GCOMP_E_NOMEM, GCOMP_E_PROTOCOL (already in flight), GCOMP_E_TIMEOUT, GCOMP_E_MPI,
 * GCOMP_E_FAILED.  *err (may be NULL) names the tensor and the rank where it can.
 */
GCOMP_API gcomp_status gcomp_mpi_allreduce(gcomp_mpi_bucket *b, float *const *data, gcomp_mpi_op op,
                                           double timeout_s, gcomp_error *err);

/**
 * Starts a non-blocking allreduce: compresses every tensor (pipelined with the first
 * transfers) and returns with the rest in flight.  data[i] is borrowed until
 * gcomp_mpi_test reports done or gcomp_mpi_wait returns: do not read or write it before.
 * Returns GCOMP_OK (in flight), GCOMP_E_PROTOCOL (this bucket is already in flight),
 * GCOMP_E_ARG, GCOMP_E_FAILED, GCOMP_E_MPI, GCOMP_E_NOMEM.  A local error that the other
 * ranks must learn about (GCOMP_E_NONFINITE) is not returned here but by test/wait,
 * after it has been shared.
 */
GCOMP_API gcomp_status gcomp_mpi_start(gcomp_mpi_bucket *b, float *const *data, gcomp_mpi_op op,
                                       gcomp_error *err);

/**
 * Makes progress without blocking: tests the transfers in flight, issues the next ones,
 * decodes what has arrived.  *done becomes 1 when the allreduce has finished (then the
 * status is its outcome, and the bucket is idle again), 0 otherwise.
 * Returns GCOMP_OK while in flight or finished successfully, else as gcomp_mpi_allreduce.
 * Called on an idle bucket: GCOMP_OK with *done = 1.
 */
GCOMP_API gcomp_status gcomp_mpi_test(gcomp_mpi_bucket *b, int *done, gcomp_error *err);

/**
 * Waits, at most `timeout_s` seconds from this call (<= 0: the communicator's default),
 * for the allreduce in flight to finish.  Idle bucket: GCOMP_OK at once.
 * On timeout returns GCOMP_E_TIMEOUT and the communicator is failed.
 */
GCOMP_API gcomp_status gcomp_mpi_wait(gcomp_mpi_bucket *b, double timeout_s, gcomp_error *err);

/**
 * Waits for the allreduces in flight on n buckets (idle ones count as finished), as
 * gcomp_mpi_wait does for one, moving all of them at once: a bucket whose exchange takes
 * several rounds (PowerSGD's two factors, a sparse allreduce) issues its next round as
 * soon as its last one is in, instead of when a wait on it begins, so on a link with
 * latency the buckets' round trips overlap.  Waiting on them one after another gives the
 * same results, later.  The first error ends the wait: *failed (may be NULL) is then the
 * index of the bucket it came from, else n.  The others are left as they are (finished
 * ones idle, the rest in flight, before that index or after it): wait on them again, or
 * use gcomp_mpi_wait_each, which finishes every bucket and reports each one's outcome.  On
 * timeout (timeout_s, else the first busy bucket's communicator's default) GCOMP_E_TIMEOUT,
 * and that communicator is failed.
 */
GCOMP_API gcomp_status gcomp_mpi_wait_all(gcomp_mpi_bucket *const *b, size_t n, double timeout_s,
                                          size_t *failed, gcomp_error *err);

/**
 * As gcomp_mpi_wait_all, but every bucket is waited for whatever happens to the others,
 * and each one's outcome is reported: each[i] (n of them, required) is bucket i's status
 * and message, GCOMP_OK and "" for one that finished (or was idle).  A bucket that fails
 * leaves the wait; the others go on moving.  One deadline covers them all: on timeout every
 * bucket still in flight gets GCOMP_E_TIMEOUT naming its own step, and their communicators
 * are failed.  Returns GCOMP_OK when every bucket finished well, else the status of the
 * lowest index that failed (*failed, may be NULL, is that index, else n), its message in
 * err.  No bucket is left in flight, so none needs another wait: a caller that finishes
 * many buckets and reports each one's error needs no loop around this call.
 */
GCOMP_API gcomp_status gcomp_mpi_wait_each(gcomp_mpi_bucket *const *b, size_t n, double timeout_s,
                                           gcomp_error *each, size_t *failed, gcomp_error *err);

/* ---- what this rank sent (for references, tests and benchmarks) ----------------------- */

/**
 * The j-th message this rank produced for tensor i in the last completed allreduce,
 * and the element range [*offset, *offset + *count) of the tensor it describes (its
 * decoder's output goes there).  allgather, sparse, allreduce: one message for the
 * whole tensor; rsag: one per non-empty chunk; hierarchical: only node leaders have
 * messages (of the node's sum), other ranks none.  Summing, over all ranks, the decoded
 * messages at their ranges gives the exact result of allgather and allreduce (up to float
 * rounding and, for f16/bf16 sums, half rounding), and of sparse and rsag up to what the
 * owners kept in their residuals (gcomp_mpi_owner_residual), or, for owners that keep
 * none (gcomp_mpi_owner_spec with feedback=none), up to their unbiased re-compression.
 * The pointer is valid until the next start or free.  No message for a PowerSGD tensor.
 * Returns GCOMP_OK, GCOMP_E_ARG (out of range: j >= the count in *nmsg of
 * gcomp_mpi_message_count).
 */
GCOMP_API gcomp_status gcomp_mpi_message(const gcomp_mpi_bucket *b, size_t i, size_t j,
                                         const void **msg, size_t *len, size_t *offset,
                                         size_t *count);
GCOMP_API size_t gcomp_mpi_message_count(const gcomp_mpi_bucket *b, size_t i);

/**
 * The owner-side error-feedback residual of tensor i on this rank (sparse and rsag;
 * hierarchical: node leaders only; ps with compressed pulls: a server's pull residual of
 * the one part of the tensor it keeps, NULL when it keeps several): *count floats
 * describing elements [*offset, *offset + *count) of the tensor.  *res is NULL (count 0)
 * when this rank owns nothing of the tensor, its strategy keeps no owner residual, or its
 * codec is no contraction (gcomp_mpi_owner_spec says feedback=none).  Valid until the next
 * start.
 * Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_owner_residual(const gcomp_mpi_bucket *b, size_t i,
                                                const float **res, size_t *offset, size_t *count);

/**
 * The canonical spec tensor i's owner re-compresses its region with (sparse and rsag;
 * hierarchical: node leaders only), NULL otherwise.  It is the tensor's spec with a seed
 * of its own (the owner's random draws must not be the workers') and feedback=ef when the
 * spec is a contraction (GCOMP_SPEC_CONTRACTION, see rsag above), feedback=none when it is
 * not, its own feedback when the method fixes it (GCOMP_SPEC_FIXED_FEEDBACK: dgc,
 * twobit); the owners' messages carry its fingerprint.  Owned by the bucket.  For
 * references and tests.
 */
GCOMP_API const char *gcomp_mpi_owner_spec(const gcomp_mpi_bucket *b, size_t i);

/**
 * The canonical spec this rank's worker compressors of tensor i encode with: the
 * tensor's spec, with a seed of this rank's own for codecs whose draws only round (see
 * "Random draws" at the top), else the spec itself; its messages carry its fingerprint.
 * NULL for ranks that compress nothing (hierarchical, not a leader).  Owned by the
 * bucket.  For references and tests.
 */
GCOMP_API const char *gcomp_mpi_worker_spec(const gcomp_mpi_bucket *b, size_t i);

/**
 * The compressor holding tensor i's worker-side state for the strategies with one
 * compressor per tensor (allgather, sparse, allreduce; for hierarchical, on leaders),
 * e.g. to read its residual or statistics (PowerSGD: gcomp_lowrank_residual; its spec
 * may carry this rank's own seed, see "Random draws" at the top); NULL
 * otherwise (rsag has one per chunk).  Owned by the bucket; do not call its encode or
 * protocol functions yourself.
 */
GCOMP_API gcomp_compressor *gcomp_mpi_compressor(const gcomp_mpi_bucket *b, size_t i);

/* ---- checkpoints ----------------------------------------------------------------------- */

/*
 * A bucket's state on this rank is what its compressors remember between steps: the
 * worker-side residuals (or DGC momentum, PowerSGD's residual and warm-started Q), rsag's
 * chunk compressors, the owner-side residuals of rsag and sparse, and the step counters
 * that key every random stream.  A trainer that checkpoints saves it next to its model
 * and optimizer, so a restarted job resumes without losing the gradient the residuals
 * held back: a fresh bucket created with the same tensors on the same communicator shape,
 * loaded with the blob, continues bit for bit where the saved one stood.
 *
 * Each rank saves and loads its own blob (local calls, no communication: a trainer
 * writes one file per rank at its own pace).  All ranks must load blobs saved at the
 * same step: random-k, whose positions come from the step, then fails the next allreduce
 * with GCOMP_E_MISMATCH, but other codecs would silently mix the residuals of different
 * steps.
 *
 * The blob is versioned and CRC-32C-checked (src/mpi/mpi_state.c has the layout): a
 * frame naming the communicator's size, this rank and its node, and per tensor its spec
 * fingerprint, name, size, shape, strategy and the core's own state blob
 * (gcomp_state_save) of each of its compressors.  Thread-safety as for the bucket.
 */

/** Exact size in bytes of this rank's state blob (constant for a bucket); 0 for NULL. */
GCOMP_API size_t gcomp_mpi_bucket_state_size(const gcomp_mpi_bucket *b);

/**
 * Writes this rank's state blob into dst (`cap` bytes, at least
 * gcomp_mpi_bucket_state_size) and its length into *len.  Local.
 * Allowed on a bucket whose allreduce failed (GCOMP_E_FAILED, a timeout...): the
 * residuals are then as documented under "Errors" above; a PowerSGD step the failure
 * interrupted is abandoned first (gcomp_lowrank_abort), so its state is as before that
 * call.  Returns GCOMP_OK; GCOMP_E_ARG (NULL); GCOMP_E_DST_SIZE; GCOMP_E_PROTOCOL (an
 * allreduce in flight on a healthy bucket: save between steps); GCOMP_E_LIMIT (a
 * compressor state above 4 GiB).  *err (may be NULL) says which.
 */
GCOMP_API gcomp_status gcomp_mpi_bucket_save_state(gcomp_mpi_bucket *b, void *dst, size_t cap,
                                                   size_t *len, gcomp_error *err);

/**
 * Loads a blob saved by gcomp_mpi_bucket_save_state on this rank into `b`.  Local.  The
 * blob is untrusted: it must be complete, uncorrupted and describe this bucket on this
 * rank.  On any error nothing changes.
 * Returns GCOMP_OK;
 *  GCOMP_E_ARG (NULL); GCOMP_E_PROTOCOL (an allreduce in flight); GCOMP_E_FAILED (the
 *   bucket failed: load into a new one);
 *  GCOMP_E_BAD_MAGIC (not a bucket state); GCOMP_E_TRUNCATED (shorter than it says);
 *  GCOMP_E_VERSION (saved by a newer library); GCOMP_E_CHECKSUM (corrupt); GCOMP_E_STATE
 *   (inconsistent, or a compressor state the core refuses);
 *  GCOMP_E_MISMATCH (saved with another number of ranks, by another rank, on another node
 *   layout, or for another bucket: tensor count, spec, name, size, shape or strategy;
 *   *err names what and which tensor);
 *  GCOMP_E_NOMEM (the current state is kept aside while loading: as much memory again).
 * Loaded or not, the bucket's next allreduce first checks, in one small blocking
 * reduction, that every rank's compressors stand at the same step (each rank must have
 * called this): where a load failed on some rank only, or the blobs are of different
 * steps, that allreduce and each after it give GCOMP_E_MISMATCH on every rank, sending
 * nothing, until the ranks agree again (load the same checkpoint everywhere).  Not for a
 * parameter server's bucket.
 */
GCOMP_API gcomp_status gcomp_mpi_bucket_load_state(gcomp_mpi_bucket *b, const void *src, size_t len,
                                                   gcomp_error *err);

/* ---- statistics ------------------------------------------------------------------------ */

/**
 * Counters accumulated over completed allreduces since creation or the last reset.
 * Bytes are what this rank hands to MPI for other ranks and receives from them, per the
 * algorithm, not counted on the wire: allgatherv counts its message once per peer,
 * alltoallv the slices for peers, a dense allreduce 2(P-1)/P of its buffer each way
 * (the ring algorithm's volume); size exchanges included.  Node-internal traffic of the
 * hierarchical strategy is counted apart (node_bytes).
 */
typedef struct gcomp_mpi_stats {
    uint64_t calls;          /**< allreduces completed */
    uint64_t bytes_sent;     /**< to other ranks (between nodes for hierarchical) */
    uint64_t bytes_received; /**< from other ranks */
    uint64_t node_bytes;     /**< hierarchical: sent + received inside the node */
    uint64_t codec_ns;       /**< encode, owner re-compression and decode time */
    uint64_t wire_ns;        /**< time with at least one transfer of it in flight */
    uint64_t elapsed_ns;     /**< start to completion (bucket); unused per tensor */
    uint64_t overlap_ns;     /**< codec time spent while a transfer was in flight */
} gcomp_mpi_stats;

/**
 * Per bucket (`i` = (size_t)-1) or per tensor.  A tensor's wire time is that of its
 * sub-bucket (the tensors of a sub-bucket travel together).
 * Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_stats_get(const gcomp_mpi_bucket *b, size_t i,
                                           gcomp_mpi_stats *out);
GCOMP_API void gcomp_mpi_stats_reset(gcomp_mpi_bucket *b);

/* ------------------------------------------------------------------------------------- */
/* Parameter server                                                                        */

/*
 * The exchange of MXNet's kvstore (dist_sync, dist_async, dist_sync_device) and of BytePS,
 * on one MPI job: of the communicator's P ranks, S serve and W = P - S are workers
 * (`mpirun -np W+S`; by default the last S ranks serve).  docs/PARAMETER_SERVER.md maps
 * MXNet's and BytePS's calls and settings onto these.
 *
 * Keys.  Every tensor of a bucket created with gcomp_mpi_bucket_options.ps is a key.  A
 * tensor is cut into parts of at most `part_bytes` dense bytes (nearly equal parts; whole
 * rows when its codec needs the matrix shape), and each part goes to the server that
 * carries the fewest bytes so far (ties: the lowest server index), counting every live
 * bucket of this server object in creation order: BytePS's partitioning, so that servers
 * carry equal bytes.  The assignment is the same on every rank (every rank creates the
 * same buckets in the same order) and gcomp_mpi_ps_part reports it.
 *
 * How the servers learn the keys.  Servers create the same buckets as the workers, with
 * the same tensors, in the same order (bucket creation is collective over the whole
 * communicator): the set-up check then compares every rank's specs, sizes, names and
 * strategies, servers included, and each server sets up the state of the parts it owns.
 * Nothing about a key travels at run time but its part id and its messages, which the
 * server checks against what it set up.
 *
 * Roles.  Workers call the ordinary bucket functions: gcomp_mpi_allreduce (or start / test /
 * wait) is MXNet's kv.pushpull: each worker compresses its gradient (with its own
 * residual), pushes the parts to their servers, and receives the pulled result into the
 * same buffers; gcomp_mpi_ps_init is kv.init, gcomp_mpi_ps_pull kv.pull.  Servers call
 * gcomp_mpi_ps_serve, which serves every bucket of the server object until every worker
 * has called gcomp_mpi_ps_shutdown (a session; serve may be called again for the next
 * one, e.g. after a checkpoint), or until an error.  gcomp_mpi_start on a server is
 * GCOMP_E_PROTOCOL.
 *
 * Modes (gcomp_mpi_ps_options.mode and .update)
 *   sync, aggregate (update = 0; dist_sync with the optimizer on the workers, BytePS):
 *          each server waits for the push of every worker, decodes them in worker order
 *          (reproducible: the same floats as the allgather strategy's decode, for W
 *          ranks) into the sum (times 1/W for GCOMP_MPI_AVERAGE), and every worker pulls
 *          that same sum.
 *   sync, update (update = 1; dist_sync with kv.set_optimizer): the same sum, then the
 *          server's SGD step on the weights it holds (gcomp_mpi_ps_init gave them), and
 *          every worker pulls the new weights: data[] holds weights, not gradients, after
 *          the call.  The step is the reference trainer's: v = m v + rescale g + wd w,
 *          w -= lr v (Nesterov: d = rescale g + wd w, v = m v + d, w -= lr (d + m v)).
 *   async (update is implied; dist_async): the server applies each push when it arrives
 *          (the gradient times 1/W for GCOMP_MPI_AVERAGE, so W pushes move the weights as
 *          much as one sync step) and answers that worker alone with the current weights.
 *          No barrier: a slow worker slows only itself.  The staleness of a push (updates
 *          the server applied since the weights it was computed on were pulled) is in
 *          the statistics; with max_staleness > 0 a staler push is dropped, not applied,
 *          and its worker receives the current weights.
 *   device (dist_sync_device): tensors with strategy GCOMP_MPI_PS | GCOMP_MPI_HIERARCHICAL
 *          ("hierarchical:ps"): the ranks of a node first sum densely inside the node (the
 *          hierarchical wrapper), and only node leaders push and pull, in either mode;
 *          W is then the number of worker nodes in the decode order and the scale 1/W of
 *          AVERAGE counts worker ranks.  No node may hold both workers and servers, and
 *          each server must be alone in its node (gcomp_mpi_options.ranks_per_node groups
 *          ranks into nodes for tests on one machine).
 *
 * Compression.  Pushes use each tensor's own spec, with the worker's residual (per part;
 * codecs that draw random numbers get a seed of each worker's own, as for allgather).
 * Pulls are dense float32, as in MXNet (its 2-bit compression is worker to server only;
 * `twobit:threshold=0.5` is compression_params={'type': '2bit', 'threshold': 0.5}), unless
 * options.pull names a spec (BytePS): then the server compresses the sum of each part with
 * a compressor of its own, keeping its own error-feedback residual (the owner-side rule of
 * rsag: feedback=ef when the codec is a contraction, its own feedback when the method fixes
 * it, none otherwise; a seed of its own), and sends that one message to every worker.
 * Compressed pulls need sync aggregate mode (pulled weights would lose what was dropped).
 *
 * Faults.  Every wait is bounded: workers by their call's timeout, servers by serve's.
 * sync: a worker that dies or stalls leaves its servers' round incomplete: the surviving
 * workers get GCOMP_E_TIMEOUT from their wait and the servers from serve, within the
 * timeout.  async: a worker that sends nothing for serve's timeout (and has not shut down)
 * is declared lost, and one that never pushes to this server (a hierarchical non-leader)
 * when it has not shut down a timeout after every worker that pushes settled; the servers
 * go on serving the others, the count of lost workers comes with every later reply
 * (gcomp_mpi_ps_stats.workers_lost) and serve returns GCOMP_OK when every other worker has
 * shut down.  A push from a lost worker is refused (GCOMP_E_FAILED there).  A push that is
 * not what the server expects - an unknown or foreign part id, another spec's fingerprint,
 * a corrupt frame or message, a round or settings that differ from the other workers' - is
 * refused with that status (GCOMP_E_MISMATCH, GCOMP_E_CHECKSUM, GCOMP_E_CORRUPT, ...) and
 * nothing of it is applied: the server's weights, sums and residuals stay as they were.  In
 * sync mode every worker of the round gets the status (the round is void); in async mode
 * the worker that sent it.  A worker's own failure (a NaN gradient) travels in its push the
 * same way.
 *
 * Checkpoints.  The compressors (worker residuals, the servers' pull residuals) are in
 * the bucket's state blob as for every strategy (gcomp_mpi_bucket_save_state; slots 2p and
 * 2p+1 of a tensor are part p's worker and server compressors; hierarchical non-leaders
 * have two empty slots); what else a server keeps per part - weights, momentum, the last
 * sum, the update count, its optimizer - is in gcomp_mpi_ps_save_state's blob
 * (docs/FORMAT.md, "MPI parameter-server state").  Both are local, versioned and
 * CRC-checked; loaded into fresh buckets on the same layout they resume bit for bit.
 *
 * Threads and ownership as for the rest of this header; a server object is used by one
 * thread at a time, with its buckets.
 */

/** Modes of a parameter server (see above). */
typedef enum gcomp_mpi_ps_mode {
    GCOMP_MPI_PS_SYNC = 0, /**< dist_sync: every worker's push, in worker order, per round */
    GCOMP_MPI_PS_ASYNC = 1 /**< dist_async: each push applied on arrival */
} gcomp_mpi_ps_mode;

/** The servers' optimizer (MXNet's kv.set_optimizer with SGD). */
typedef struct gcomp_mpi_ps_optimizer {
    float lr;           /**< learning rate (a worker may override it per push) */
    float momentum;     /**< in [0, 1) */
    float weight_decay; /**< >= 0 */
    float rescale;      /**< the gradient is multiplied by this (MXNet's rescale_grad) */
    int nesterov;       /**< 0 or 1 */
} gcomp_mpi_ps_optimizer;

typedef struct gcomp_mpi_ps_options {
    int servers;             /**< S, 1 <= S < communicator size.  Default 1 */
    const int *server_ranks; /**< S distinct ranks, or NULL (default): the last S; copied */
    int mode;                /**< GCOMP_MPI_PS_SYNC (default) or GCOMP_MPI_PS_ASYNC */
    int update;              /**< 1: servers hold the weights and update them (implied by
                                  ASYNC); 0 (default): servers aggregate gradients */
    gcomp_mpi_ps_optimizer optimizer; /**< for every key (default lr 0.01, momentum 0,
                                           weight_decay 0, rescale 1, nesterov 0) */
    const char *pull;                 /**< NULL or "" (default): dense pulls; "same": each key's own
                                           spec; else a spec for every key (BytePS); copied */
    size_t part_bytes;                /**< largest part, dense bytes (default 4 MiB, BytePS's) */
    uint64_t max_staleness; /**< async: drop pushes staler than this; 0 (default): never */
} gcomp_mpi_ps_options;

/** Fills *o with the defaults. */
GCOMP_API void gcomp_mpi_ps_options_default(gcomp_mpi_ps_options *o);

/**
 * Creates the parameter-server object (collective over the communicator; every rank, both
 * roles, with the same options): checks the options, compares them across ranks
 * (GCOMP_E_MISMATCH on every rank if they differ), learns the node layout, and duplicates
 * the communicator for shutdown messages.  `o` may be NULL (defaults); copied.
 * Returns GCOMP_OK, GCOMP_E_ARG (bad options: S, ranks, mode, optimizer values, part_bytes
 * below 1 KiB, a pull spec with update or async), GCOMP_E_SPEC / GCOMP_E_UNKNOWN_CODEC (the
 * pull spec), GCOMP_E_MISMATCH, GCOMP_E_NOMEM, GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.
 */
GCOMP_API gcomp_status gcomp_mpi_ps_create(gcomp_mpi_ps **out, gcomp_mpi_comm *comm,
                                           const gcomp_mpi_ps_options *o, double timeout_s,
                                           gcomp_error *err);

/**
 * Frees the object (local).  Its buckets must be freed first: otherwise GCOMP_E_ARG and
 * nothing is freed.  NULL is a no-op (GCOMP_OK).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_free(gcomp_mpi_ps *ps);

/** This rank's role: 1 server, 0 worker, -1 for NULL. */
GCOMP_API int gcomp_mpi_ps_is_server(const gcomp_mpi_ps *ps);
/** This rank's index among the workers or among the servers (-1 for NULL). */
GCOMP_API int gcomp_mpi_ps_index(const gcomp_mpi_ps *ps);
/** W and S. */
GCOMP_API int gcomp_mpi_ps_workers(const gcomp_mpi_ps *ps);
GCOMP_API int gcomp_mpi_ps_servers(const gcomp_mpi_ps *ps);

/**
 * Servers: serves every bucket of `ps` until every worker has called
 * gcomp_mpi_ps_shutdown (async: or was declared lost), then returns GCOMP_OK.  The buckets
 * must have been created before.  `timeout_s` (<= 0: the communicator's default) bounds a
 * sync round (from its first push to its last), the silence of the whole job (no message
 * from any worker), and in async mode the silence of one worker (it is then lost).
 * Returns GCOMP_OK; GCOMP_E_ARG (NULL, a worker rank, a server that owns no part of any
 * bucket: nothing would reach it, and the object can then only be freed); GCOMP_E_PROTOCOL
 * (already serving);
 * GCOMP_E_TIMEOUT (sync: a worker did not push; the communicator is then failed);
 * GCOMP_E_MPI; GCOMP_E_FAILED; GCOMP_E_NOMEM.  A refused push is not an error of serve:
 * it is answered and counted (gcomp_mpi_ps_stats.refused).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_serve(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err);

/**
 * Workers: tells every server this worker is done with the session (its buckets must be
 * idle).  Local to the worker apart from S small messages.  Returns GCOMP_OK,
 * GCOMP_E_ARG (NULL, a server rank), GCOMP_E_PROTOCOL (a bucket in flight),
 * GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.
 */
GCOMP_API gcomp_status gcomp_mpi_ps_shutdown(gcomp_mpi_ps *ps, double timeout_s, gcomp_error *err);

/**
 * Workers (kv.init): worker 0's data[i] becomes the value every server stores for tensor i
 * (the weights in update and async modes), and every worker's data[i] is overwritten with
 * it; the update counts restart at 0 and the servers' momentum at 0.  Every worker of the
 * bucket calls it (for a hierarchical bucket, the node leaders talk to the servers and
 * pass the values on inside the node).  Blocking, bounded by timeout_s.
 * Returns GCOMP_OK or as gcomp_mpi_allreduce; GCOMP_E_NONFINITE for a NaN/Inf in worker
 * 0's values (every worker returns it; nothing stored).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_init(gcomp_mpi_bucket *b, float *const *data, double timeout_s,
                                         gcomp_error *err);

/**
 * Workers (kv.pull): data[i] receives what the servers store for tensor i now: the
 * weights (update and async modes) or the last round's sum (aggregate).  Dense float32.
 * Any worker alone (hierarchical: a node together).  Blocking, bounded by timeout_s.
 * Returns as gcomp_mpi_allreduce; GCOMP_E_PROTOCOL when update mode has no weights yet
 * (call gcomp_mpi_ps_init first).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_pull(gcomp_mpi_bucket *b, float *const *data, double timeout_s,
                                         gcomp_error *err);

/**
 * Workers: the learning rate this worker's next pushes carry (a schedule; MXNet's
 * lr_scheduler runs on the server, ours on the worker).  NaN (default): the servers'
 * optimizer.lr.  In sync mode every worker of a round must send the same value
 * (GCOMP_E_MISMATCH otherwise).  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_ps_set_lr(gcomp_mpi_ps *ps, float lr);

/**
 * Servers: the optimizer of tensor i of b (i = (size_t)-1: every tensor), e.g. no weight
 * decay for biases.  Local; call it before serving, on every server.  Returns GCOMP_OK or
 * GCOMP_E_ARG (bad values, a worker rank, i out of range).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_set_optimizer(gcomp_mpi_bucket *b, size_t i,
                                                  const gcomp_mpi_ps_optimizer *o);

/**
 * The partition of tensor i of a `ps` bucket: *count parts; part j covers elements
 * [*offset, *offset + *n) and lives on server *server (an index into the servers; its rank
 * is gcomp_mpi_ps_server_rank).  Hierarchical non-leaders have no partition (0 parts).
 * Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API size_t gcomp_mpi_ps_part_count(const gcomp_mpi_bucket *b, size_t i);
GCOMP_API gcomp_status gcomp_mpi_ps_part(const gcomp_mpi_bucket *b, size_t i, size_t j,
                                         size_t *offset, size_t *n, int *server);
/** The rank of server s (-1 when out of range), and of worker w. */
GCOMP_API int gcomp_mpi_ps_server_rank(const gcomp_mpi_ps *ps, int s);
GCOMP_API int gcomp_mpi_ps_worker_rank(const gcomp_mpi_ps *ps, int w);

/**
 * Workers: the compressor of part j of tensor i (its residual, statistics, or the epoch
 * DGC's warm-up reads: gcomp_compressor_set_epoch); NULL on servers or out of range.  Owned
 * by the bucket; do not call its encode yourself.  (gcomp_mpi_compressor gives part 0's
 * when a key has one part, NULL otherwise.)
 */
GCOMP_API gcomp_compressor *gcomp_mpi_ps_compressor(const gcomp_mpi_bucket *b, size_t i, size_t j);

/**
 * Workers: copies this worker's error-feedback residual of tensor i (its parts' residuals
 * at their offsets; zeros where a part keeps none) into out[0..n).  Returns GCOMP_OK,
 * GCOMP_E_ARG (NULL, a server, no partition here).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_residual(const gcomp_mpi_bucket *b, size_t i, float *out);

/**
 * Servers: copies what this server stores for tensor i (weights or last sum) at the parts
 * it owns into out[0..n) (other elements untouched); *parts receives how many parts it
 * owns.  For tests and checkpoints' users.  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_ps_stored(const gcomp_mpi_bucket *b, size_t i, float *out,
                                           size_t *parts);

/**
 * Workers: the servers' update count of tensor i as of this worker's last reply (the
 * smallest over its parts): sync rounds applied, or async pushes applied.  0 before any.
 */
GCOMP_API uint64_t gcomp_mpi_ps_version(const gcomp_mpi_bucket *b, size_t i);

/**
 * Statistics of a server object on this rank (a worker's view or a server's), since
 * creation or the last reset.
 */
typedef struct gcomp_mpi_ps_stats {
    uint64_t pushes;       /**< worker: pushes sent; server: pushes received (frames) */
    uint64_t applied;      /**< server: pushes summed or applied; worker: replies taken */
    uint64_t pulls;        /**< pull requests (gcomp_mpi_ps_pull) sent / answered */
    uint64_t bytes_pushed; /**< push frames, worker to server, headers included */
    uint64_t bytes_pulled; /**< reply frames, server to worker */
    uint64_t busy_ns;      /**< server: checking, decoding, summing, updating, encoding */
    uint64_t queue_max;    /**< server: most pushes waiting (arrived, not yet taken) */
    uint64_t queue_sum;    /**< server: pushes waiting, summed at each push taken */
    uint64_t stale_max;    /**< async: largest staleness of a push (updates in between) */
    uint64_t stale_sum;    /**< async: their sum (mean = stale_sum / applied) */
    uint64_t dropped;      /**< async: pushes staler than max_staleness, not applied */
    uint64_t refused;      /**< pushes refused (corrupt, foreign, mismatched, lost) */
    uint32_t workers_lost; /**< async: workers declared lost (servers, and workers as
                                the replies reported it) */
    uint32_t reserved;
} gcomp_mpi_ps_stats;

/**
 * This rank's statistics: all of them (peer = -1), or only the traffic with rank `peer`
 * (a server's view of one worker, a worker's of one server).  Returns GCOMP_OK or
 * GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_ps_stats_get(const gcomp_mpi_ps *ps, int peer,
                                              gcomp_mpi_ps_stats *out);
/** This rank's statistics of tensor i of a `ps` bucket (its parts).  GCOMP_OK or GCOMP_E_ARG. */
GCOMP_API gcomp_status gcomp_mpi_ps_key_stats(const gcomp_mpi_bucket *b, size_t i,
                                              gcomp_mpi_ps_stats *out);
GCOMP_API void gcomp_mpi_ps_stats_reset(gcomp_mpi_ps *ps);

/** Exact size of this rank's server-state blob of bucket b (a worker's is small). */
GCOMP_API size_t gcomp_mpi_ps_state_size(const gcomp_mpi_bucket *b);
/**
 * Writes what this rank keeps for b's tensors as a server, beyond compressors (weights,
 * momentum, last sums, update counts, optimizers: docs/FORMAT.md "MPI parameter-server
 * state"), or as a worker (the update count of its last reply per part, which its next
 * async push's staleness counts from) into dst.  Local; not while serving.  Returns
 * GCOMP_OK, GCOMP_E_ARG, GCOMP_E_DST_SIZE, GCOMP_E_PROTOCOL (serving, or the bucket in
 * flight).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_save_state(const gcomp_mpi_bucket *b, void *dst, size_t cap,
                                               size_t *len, gcomp_error *err);
/**
 * Loads a blob saved by gcomp_mpi_ps_save_state on this rank into b (untrusted; all or
 * nothing).  Returns GCOMP_OK; GCOMP_E_ARG; GCOMP_E_PROTOCOL; GCOMP_E_BAD_MAGIC;
 * GCOMP_E_TRUNCATED; GCOMP_E_VERSION; GCOMP_E_CHECKSUM; GCOMP_E_STATE (inconsistent, a
 * non-finite weight); GCOMP_E_MISMATCH (another rank, layout, tensor or partition).
 */
GCOMP_API gcomp_status gcomp_mpi_ps_load_state(gcomp_mpi_bucket *b, const void *src, size_t len,
                                               gcomp_error *err);

/* ---- adaptive compression (gradcomp.h, "Adaptive compression") --------------------------- */

/**
 * Changes tensor i's spec between two allreduces, keeping what its compressors hold back
 * (gcomp_compressor_retune for each of them: worker, owner and chunk compressors; a dense
 * spec sends the held-back vector with its next message).  The tensor keeps its strategy
 * request (AUTO: the new spec's default strategy); its component, sub-bucket plan and
 * buffers follow the new spec.  Every rank must retune the same tensor to the same spec
 * before the same allreduce (gcomp_adapt_decide gives every rank the same decision).
 * What guards that, cheaply:
 *  - a switch within allgather, sparse or rsag that keeps the sub-bucket plan is local (no
 *    communication): their exchanges negotiate sizes every call and every message carries
 *    its spec's fingerprint, which each receiver checks, so a rank that switched alone
 *    makes the next allreduce fail with GCOMP_E_MISMATCH on every rank;
 *  - any other switch (another strategy, another sub-bucket plan, a dense allreduce whose
 *    counts follow from the spec) is collective: one small MPI_Iallreduce on the
 *    communicator's own duplicate (never the bucket's data communicator) compares every
 *    rank's new specs and strategies, and any difference, or a rank whose preparation
 *    failed, leaves the bucket unchanged on every rank with GCOMP_E_MISMATCH.  A rank that
 *    does not call retune then makes the others time out (GCOMP_E_TIMEOUT), never match a
 *    data collective.
 * A retune to the spec the tensor already has does nothing.  Between strategies that keep
 * an owner side (sparse, rsag) and the others the owners' residuals would be lost:
 * GCOMP_E_UNSUPPORTED (on every rank alike).  Checkpoints: gcomp_mpi_bucket_state_size
 * changes with the specs (save after the retune, and create the bucket to load into with
 * the specs in force then).
 * Returns GCOMP_OK; GCOMP_E_ARG; GCOMP_E_PROTOCOL (an allreduce in flight); the spec's
 * status (GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC); GCOMP_E_UNSUPPORTED (the strategy request
 * cannot carry the spec, the owner rule above, or a parameter-server bucket: its servers
 * take no part in a switch; on every rank, before any communication); GCOMP_E_MISMATCH;
 * GCOMP_E_NOMEM; GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.  On any error the bucket is as
 * before.
 */
GCOMP_API gcomp_status gcomp_mpi_bucket_retune(gcomp_mpi_bucket *b, size_t i, const char *spec,
                                               double timeout_s, gcomp_error *err);

/**
 * One adaptive decision over the communicator (collective): allgathers every rank's
 * gcomp_adapt_stats (after an agreement on their size and on every rank's readiness: ranks
 * of another configuration, or a rank short of memory, fail together) and runs
 * gcomp_adapt_decide on the blocks in rank order, so every rank takes the same decision;
 * then agrees on its outcome: where it failed on some rank only (out of memory while the
 * controllers decide), every rank whose decision stood puts its controllers' state back as
 * it was before the call, and all return that failure.  Every failure is every rank's.
 * Apply it with gcomp_mpi_bucket_retune for each tensor gcomp_adapt_changed names.
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_MISMATCH, GCOMP_E_LIMIT, GCOMP_E_NOMEM,
 * GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.
 */
GCOMP_API gcomp_status gcomp_mpi_adapt_decide(gcomp_mpi_comm *c, gcomp_adapt *a, double timeout_s,
                                              size_t *changed, gcomp_error *err);

/**
 * Measures the ring's link (collective): after one untimed step of `bytes`, ring steps -
 * a message to rank + 1 while one arrives from rank - 1, after a barrier - of 8 bytes,
 * chains of five 8-byte steps back to back, and pairs of bytes/2 and `bytes` (1 KiB..1 GiB),
 * three of each.  A step's time is its slowest rank's: *latency = what a step adds to the
 * fastest chain (one step after a barrier also pays the ranks' skew leaving it, about a
 * second latency), *bandwidth = payload bytes per second in each direction, (bytes -
 * bytes/2) / (the fastest `bytes` step - the median bytes/2 step), so a start-up cost of
 * any size (a shaper's burst, TCP slow start) cancels.  Where a `bytes` step lasts less
 * than twenty latencies (a link with a large bandwidth-delay product: TCP's window would
 * set the time) the pairs are measured again at 4x the size, twice at most.  The same on
 * every rank: the slowest link of the ring.  Size `bytes` to at least twice a shaper's
 * burst (netsim's is 256 KiB: 512 KiB).  One rank: both 0.  Feed them to
 * gcomp_adapt_observe_link.  Runs on the communicator's own duplicate.
 * Returns GCOMP_OK, GCOMP_E_ARG, GCOMP_E_NOMEM, GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.
 */
GCOMP_API gcomp_status gcomp_mpi_link_probe(gcomp_mpi_comm *c, size_t bytes, double timeout_s,
                                            double *bandwidth, double *latency, gcomp_error *err);

/* ---- helpers the tools share ----------------------------------------------------------- */

/**
 * The MPI_Op that sums IEEE binary16 (f16) or bfloat16 values stored as 16-bit words
 * (datatype MPI_UINT16_T): each pair is widened to float, added, and rounded back to
 * nearest-even (f16 saturates at +-65504).  This is the only arithmetic the library
 * runs inside an MPI_Op; nothing is ever decoded there.  Created with the communicator,
 * valid until it is freed.  `bf16` 0: f16, 1: bf16.
 */
GCOMP_API MPI_Op gcomp_mpi_half_sum_op(const gcomp_mpi_comm *c, int bf16);

/* ------------------------------------------------------------------------------------- */
/* The outer step: local SGD, DiLoCo, Streaming DiLoCo, SparseLoCo (src/mpi/mpi_outer.c)   */

/*
 * For training over slow links (between data centres, from edge devices): every rank
 * takes H inner optimizer steps on its own, then the ranks synchronise the weights
 * instead of exchanging a gradient every step.  At a sync each rank forms its
 * pseudo-gradient, the weights of the last sync minus its weights now; the ranks average
 * it through a bucket (so with any codec and strategy, and the codec's own error
 * feedback); an outer optimizer applies the average to the weights of the last sync, and
 * every rank goes on from the result (DiLoCo, Douillard et al. 2023; FedOpt, Reddi et
 * al. 2021):
 *
 *     d_r = w_sync - w_r                   this rank's pseudo-gradient
 *     d   = (1/P) sum_r C_r(d_r)           averaged by the bucket; C_r: the tensor's spec
 *                                          with this rank's residual (feedback=ef)
 *     SGD        b = mu b + d;  w_sync -= lr b              (mu = 0: w_sync -= lr d)
 *     Nesterov   b = mu b + d;  w_sync -= lr (d + mu b)     (DiLoCo: lr 0.7, mu 0.9)
 *     w_r = w_sync                         on every rank, bit for bit
 *
 * (b is the outer momentum; these are PyTorch's SGD formulas with dampening 0, DiLoCo's
 * outer optimizer.)  H = 1 with spec `none` and SGD at lr 1, mu 0 is plain data-parallel
 * SGD (the average of the ranks' inner updates), up to float rounding only: d_r is the
 * inner update recovered as w - (w - u_r), two roundings away from u_r itself.
 *
 * The pseudo-gradient is compressed by the tensor's spec exactly as a gradient is: `int8`
 * (OpenDiLoCo / INTELLECT-1's 8-bit pseudo-gradients), `topk:density=0.01,values=sign,
 * feedback=ef` (SparseLoCo's top-k with few-bit values and error feedback), `none`
 * (DiLoCo).  With feedback=ef the residual is the compressor's own, kept from sync to sync
 * as from step to step, so nothing held back is lost.  SparseLoCo (Sarfi et al. 2025)
 * lets that residual replace the outer momentum: SGD with mu = 0; its decayed residual
 * e <- beta e + d_r is ef_decay = beta (the compressor adds e itself, so it is handed
 * d_r - (1 - beta) e).
 *
 * Streaming (Streaming DiLoCo, Douillard et al. 2025): the tensors are cut into F
 * fragments (one bucket each) that synchronise on a staggered schedule, fragment f after
 * the inner steps t with t mod H = offset(f) mod H, offset(f) = floor((f + 1) H / F)
 * (fragment F - 1 on the plain schedule, t mod H = 0): each fragment still syncs once
 * every H steps, but one fragment's bytes are on the link at a time.  A sync is started
 * after inner step t (its pseudo-gradient formed and compressed then) and completed after
 * inner step t + delay: the exchange overlaps the next `delay` inner steps, in which the
 * rank keeps training its live weights.  The outer update computed from d then meets
 * weights that have moved on; the two are merged with Streaming DiLoCo's mixing factor
 * alpha (`mix`):
 *
 *     w_sync <- the outer update of w_sync by d     (identical on every rank)
 *     w_r    <- (1 - alpha) w_sync + alpha w_r     (alpha = 0, the default: w_r = w_sync,
 *                                                   dropping the fragment's local progress
 *                                                   of the delay steps, as torchft does)
 *
 * With alpha = 0 every rank ends each completion with bit-identical weights for the
 * fragment; with alpha > 0 each rank keeps a share of its own (only w_sync, see
 * gcomp_mpi_outer_global, is then the same everywhere).  delay = ceil(H / F), the default
 * for F > 1, hands the link from one fragment to the next as the previous one completes,
 * so it is busy at every inner step instead of in bursts; delay 0, the default for F = 1,
 * synchronises at once (blocking: plain DiLoCo).
 *
 * Use, every rank the same:
 *
 *     gcomp_mpi_outer_options o;
 *     gcomp_mpi_outer_options_default(&o);          // DiLoCo: Nesterov, lr 0.7, mu 0.9
 *     o.local_steps = 32;
 *     gcomp_mpi_outer *out;
 *     gcomp_mpi_outer_create(&out, comm, tensors, n, weights, &o, 60.0, &err);
 *     for (each inner step) {
 *         ...forward, backward, the inner optimizer's step on weights (local)...
 *         gcomp_mpi_outer_step(out, weights, 60.0, &err);   // syncs when one is due
 *     }
 *     gcomp_mpi_outer_flush(out, weights, 60.0, &err);      // every fragment, now
 *
 * gcomp_mpi_outer_progress moves the exchanges in flight forward: call it during the
 * inner steps when streaming (MPI makes progress only inside MPI calls).  Weights are
 * plain float32 arrays (`count` of them, in tensor order), read and written only inside
 * gcomp_mpi_outer_create / step / flush; between calls they are the caller's.  The object
 * owns copies of all else (last-sync weights, outer momentum, the pseudo-gradients in
 * flight).  Every set-up check, timeout and error rule of buckets applies to the
 * fragments' buckets.  Thread-safety as for buckets: one thread at a time per object.
 */
typedef struct gcomp_mpi_outer gcomp_mpi_outer;

/** The outer optimizer. */
typedef enum gcomp_mpi_outer_optimizer {
    GCOMP_MPI_OUTER_SGD = 0,     /**< b = mu b + d; w_sync -= lr b */
    GCOMP_MPI_OUTER_NESTEROV = 1 /**< b = mu b + d; w_sync -= lr (d + mu b) */
} gcomp_mpi_outer_optimizer;

typedef struct gcomp_mpi_outer_options {
    unsigned local_steps; /**< H >= 1: inner steps between syncs of a fragment. Default 16 */
    int optimizer;        /**< gcomp_mpi_outer_optimizer. Default NESTEROV */
    double lr;            /**< outer learning rate, finite and > 0. Default 0.7 */
    double momentum;      /**< mu in [0, 1). Default 0.9 */
    unsigned fragments;   /**< F, 1..min(tensors, H): streaming when > 1. Default 1 */
    /**
     * Inner steps between a fragment's start and its completion, 0..H-1; -1 (default):
     * 0 for F = 1 (blocking), ceil(H / F) for F > 1 (the link never idle).
     */
    int delay;
    double mix;      /**< alpha in [0, 1): weight of the live weights at a completion. Default 0 */
    double ef_decay; /**< beta in [0, 1]: SparseLoCo's residual decay (1 = plain feedback=ef,
                          the default); beta < 1 needs every tensor's spec to keep a residual
                          (feedback=ef) and a strategy with one compressor per tensor
                          (allgather, sparse, allreduce; not rsag or hierarchical) */
    /**
     * NULL (default): tensors go to fragments balanced by size (largest first, each to
     * the fragment with the fewest elements so far, ties to the lower index).  Else
     * `count` entries, fragment_of[i] < F the fragment of tensor i, every fragment used;
     * copied.  Streaming DiLoCo assigns layers to fragments strided (layer i to i mod F).
     */
    const unsigned *fragment_of;
    size_t bucket_bytes; /**< the fragments' buckets' sub-bucket size (bucket options) */
} gcomp_mpi_outer_options;

/** Fills *o with the defaults above (DiLoCo's outer Nesterov, H = 16, one fragment). */
GCOMP_API void gcomp_mpi_outer_options_default(gcomp_mpi_outer_options *o);

/**
 * Creates an outer step over `count` tensors (collective over the communicator).
 *  tensors   name, spec, size, shape and strategy of each tensor, as for buckets; copied.
 *            The spec compresses its pseudo-gradient (feedback=ef keeps the residual).
 *  weights   `count` arrays, the initial weights (read only): they become the weights of
 *            the last sync, and must be bit-identical on every rank.
 *  opt       may be NULL (defaults); copied (fragment_of too).
 * First a set-up check across ranks (through a small bucket of its own): the options and
 * the fragment assignment must be the same on every rank, and so must the initial
 * weights of every tensor (hash); then one bucket per fragment is created (its own
 * set-up check compares specs, sizes, shapes, strategies and names).
 * Returns GCOMP_OK;
 *  GCOMP_E_ARG with the reason in *err: NULL out, comm, tensors or weights, count 0,
 *   local_steps 0, lr <= 0 or not finite, momentum outside [0, 1), an unknown optimizer,
 *   fragments 0 or more than the tensors or than local_steps, delay outside -1..H-1, mix
 *   outside [0, 1), ef_decay outside [0, 1] or below 1 where a tensor keeps no residual
 *   of its own (GCOMP_E_UNSUPPORTED for a strategy without one), a fragment_of entry >= F
 *   or a fragment left empty;
 *  GCOMP_E_NONFINITE (an initial weight is NaN or Inf);
 *  a bucket's status for a bad spec, with the core's reason and the tensor named in *err
 *   (GCOMP_E_SPEC for error feedback around a codec that is no contraction, e.g.
 *   qsgd:levels=4,feedback=ef; GCOMP_E_UNKNOWN_CODEC; GCOMP_E_UNSUPPORTED for a strategy
 *   the codec cannot use);
 *  GCOMP_E_MISMATCH (options or initial weights differ across ranks, or another rank
 *   failed: every rank returns it, naming what differs);
 *  GCOMP_E_NOMEM, GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED.
 * A rank whose own arguments are bad still takes part in the set-up check, so the other
 * ranks learn of it instead of waiting; only NULL out or comm return at once.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_create(gcomp_mpi_outer **out, gcomp_mpi_comm *comm,
                                              const gcomp_mpi_tensor *tensors, size_t count,
                                              float *const *weights,
                                              const gcomp_mpi_outer_options *opt, double timeout_s,
                                              gcomp_error *err);

/**
 * Frees the object and its buckets.  NULL is a no-op.  A sync still in flight is waited
 * for first (up to the communicator's default timeout), since its buckets must not be
 * freed under MPI: so call it on every rank at the same step, or flush first; on a failed
 * communicator nothing is waited for (the buckets' pending buffers go to it).
 */
GCOMP_API void gcomp_mpi_outer_free(gcomp_mpi_outer *o);

/**
 * Call after every inner optimizer step, with the live weights (`count` arrays, read and
 * written).  Counts the step t, then: completes the fragments whose sync started at
 * t - delay (waits for their exchange, applies the outer optimizer, merges into the
 * weights, see above), moves the other exchanges in flight forward, and starts the
 * fragments due at t (forms and compresses their pseudo-gradients; with delay 0 it also
 * completes them).  Between syncs it only counts.
 * On an error from a fragment's exchange that fragment's sync is dropped: its last-sync
 * weights and momentum stay as they were and the weights are not touched, so its next
 * pseudo-gradient (w_sync - w) carries the dropped one again (the compressor's residual
 * has advanced as the bucket documents); the rest of that call is skipped, and the later
 * calls complete what is due.  Every rank gets the same error for local errors (a NaN
 * weight: GCOMP_E_NONFINITE), as for buckets.
 * Returns GCOMP_OK, GCOMP_E_ARG (NULL), or the bucket's status (GCOMP_E_NONFINITE,
 * GCOMP_E_TIMEOUT, GCOMP_E_MPI, GCOMP_E_FAILED, ...), with the tensor named in *err.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_step(gcomp_mpi_outer *o, float *const *weights,
                                            double timeout_s, gcomp_error *err);

/**
 * Moves the exchanges in flight forward without blocking (gcomp_mpi_test on each).  For
 * streaming, call it now and then during the inner steps.  A failed exchange is
 * reported by the gcomp_mpi_outer_step that completes it, not here.
 * Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_progress(gcomp_mpi_outer *o, gcomp_error *err);

/**
 * Synchronises every fragment now (collective): completes the exchanges in flight (as
 * when due), then starts and completes a sync of every fragment and sets the weights to
 * the result (alpha ignored), so every rank ends with the same weights.  A fragment that
 * completed a sync at this very step with alpha = 0 is skipped: its weights are that
 * sync's already, and a sync of its zero pseudo-gradient would still move it by the outer
 * momentum.  For the end of training, or before an evaluation that must see all of it.
 * The schedule goes on by the step count.  Returns as gcomp_mpi_outer_step.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_flush(gcomp_mpi_outer *o, float *const *weights,
                                             double timeout_s, gcomp_error *err);

/**
 * w_sync of tensor i: the weights of its fragment's last sync, the same on every rank
 * (the model to evaluate between syncs).  n floats owned by the object, valid until free.
 * NULL when i is out of range.
 */
GCOMP_API const float *gcomp_mpi_outer_global(const gcomp_mpi_outer *o, size_t i);

/**
 * d of tensor i from its fragment's last completed sync (the averaged pseudo-gradient
 * before the outer optimizer; zeros before the first), or NULL while its fragment's
 * exchange is in flight or i is out of range.  For tests and diagnostics.
 */
GCOMP_API const float *gcomp_mpi_outer_average(const gcomp_mpi_outer *o, size_t i);

/** Number of tensors, and of fragments; 0 for NULL. */
GCOMP_API size_t gcomp_mpi_outer_count(const gcomp_mpi_outer *o);
GCOMP_API size_t gcomp_mpi_outer_fragments(const gcomp_mpi_outer *o);

/**
 * Where tensor i lives: its fragment and its index in that fragment's bucket (for
 * gcomp_mpi_message, gcomp_mpi_compressor, statistics).  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_locate(const gcomp_mpi_outer *o, size_t i, size_t *fragment,
                                              size_t *index);

/** The bucket of fragment f (owned by the object; do not start it yourself), or NULL. */
GCOMP_API gcomp_mpi_bucket *gcomp_mpi_outer_bucket(const gcomp_mpi_outer *o, size_t f);

/**
 * The schedule, as resolved at create: H, the delay, and fragment f's offset (it starts
 * after the inner steps t >= 1 with t mod H = offset mod H); UINT64_MAX for a bad f.
 */
GCOMP_API unsigned gcomp_mpi_outer_local_steps(const gcomp_mpi_outer *o);
GCOMP_API unsigned gcomp_mpi_outer_delay(const gcomp_mpi_outer *o);
GCOMP_API uint64_t gcomp_mpi_outer_offset(const gcomp_mpi_outer *o, size_t f);

/** Inner steps counted so far (by gcomp_mpi_outer_step; a loaded state sets it). */
GCOMP_API uint64_t gcomp_mpi_outer_steps(const gcomp_mpi_outer *o);
/** Syncs of fragment f completed and applied (flush included); 0 for a bad f. */
GCOMP_API uint64_t gcomp_mpi_outer_syncs(const gcomp_mpi_outer *o, size_t f);
/** 1 while fragment f has a sync started and not yet applied, else 0. */
GCOMP_API int gcomp_mpi_outer_in_flight(const gcomp_mpi_outer *o, size_t f);

/**
 * The fragments' bucket counters summed (gcomp_mpi_stats_get of each, per bucket):
 * bytes_sent is what this rank sent over the run.  Returns GCOMP_OK or GCOMP_E_ARG.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_stats(const gcomp_mpi_outer *o, gcomp_mpi_stats *out);

/* ---- outer-step checkpoints ----------------------------------------------------------- */

/*
 * The state of an outer step on this rank: the step count, per tensor its last-sync
 * weights and outer momentum, per fragment its sync count and a sync whose average has
 * arrived but is not applied yet (with that average), and every fragment bucket's own
 * state blob (the residuals).  Versioned and CRC-32C-checked like a bucket's (layout in
 * docs/FORMAT.md, "MPI outer-step state").  Save it next to the live
 * weights and the inner optimizer's state; a fresh object created with the same tensors,
 * options and communicator shape, loaded with it, continues bit for bit.
 *
 * Streaming keeps a fragment in flight at almost every step, so saving first completes
 * the exchanges in flight (waits for them, as a later step would) without applying them:
 * their averages are saved and applied at their scheduled step after a load.  So every
 * rank must save at the same step (as for buckets, whose residuals must be of one step).
 */

/** Upper bound of this rank's state blob in bytes; 0 for NULL. */
GCOMP_API size_t gcomp_mpi_outer_state_size(const gcomp_mpi_outer *o);

/**
 * Writes this rank's state into dst (`cap` bytes, at least gcomp_mpi_outer_state_size)
 * and its length into *len.  Waits for the exchanges in flight first (at most
 * timeout_s), see above; on a failed communicator it drops them (their syncs are lost,
 * as after any failure) and saves the rest.
 * Returns GCOMP_OK; GCOMP_E_ARG (NULL); GCOMP_E_DST_SIZE; an exchange's error (nothing
 * is written; that sync is dropped, as in gcomp_mpi_outer_step; save again); a bucket's
 * save status.  *err says which.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_save_state(gcomp_mpi_outer *o, void *dst, size_t cap,
                                                  size_t *len, double timeout_s, gcomp_error *err);

/**
 * Loads a blob saved by gcomp_mpi_outer_save_state on this rank (local).  The blob is
 * untrusted; on any error nothing changes.
 * Returns GCOMP_OK; GCOMP_E_ARG (NULL); GCOMP_E_PROTOCOL (a sync in flight: load into an
 * object between syncs, e.g. a fresh one); GCOMP_E_BAD_MAGIC; GCOMP_E_TRUNCATED;
 * GCOMP_E_VERSION (a newer library); GCOMP_E_CHECKSUM (corrupt); GCOMP_E_STATE
 * (inconsistent); GCOMP_E_MISMATCH (another rank, number of ranks, options, fragment
 * assignment, tensor size or name; *err names it); a bucket's load status; GCOMP_E_NOMEM.
 */
GCOMP_API gcomp_status gcomp_mpi_outer_load_state(gcomp_mpi_outer *o, const void *src, size_t len,
                                                  gcomp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GRADCOMP_MPI_H */

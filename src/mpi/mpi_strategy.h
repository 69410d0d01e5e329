/*
 * mpi_strategy.h - strategies as components: the table the bucket engine calls through.
 *
 * A strategy is how a tensor's messages meet across ranks (gradcomp_mpi.h lists them).  As
 * in Open MPI's coll framework (ompi/mca/coll/coll.h), each one is a component: a file that
 * defines one `const gm_strategy` - its name, its public id, a query, and the functions the
 * engine calls - and one line in the table of mpi_strategy.c.  The engine (mpi_bucket.c,
 * mpi_state.c, mpi_hier.c) calls through the table and knows no strategy by name or id;
 * the helpers strategies share (size words and markers, pack reductions, decoders per rank,
 * derived specs, the buffers handed to MPI) live in the engine, so dependencies run from a
 * component to the engine only, never between components or back.
 *
 * Adding a strategy
 *   1. append its value to gcomp_mpi_strategy in gradcomp_mpi.h (never renumber);
 *   2. write mpi_NAME.c defining `const gm_strategy gm_strategy_NAME` (below);
 *   3. add X(NAME) to GM_COMPONENTS in mpi_strategy.c.
 *   Parsing and naming (gcomp_mpi_strategy_parse/_name), auto, the set-up check, grouping,
 *   scheduling, reservation, checkpoints (docs/FORMAT.md "MPI bucket state": the component
 *   says which compressors fill its slots) and introspection then find it.
 *
 * Versioning.  Members are only ever appended.  A component sets .version to the
 * GM_STRATEGY_VERSION it was written against; the engine treats members added after that
 * version as absent (gm_has), so a component written today keeps working when the table
 * grows.  Every optional member may be NULL: the engine's default is stated beside it.
 *
 * Choosing.  gcomp_mpi_strategy_auto and GCOMP_MPI_AUTO ask every component's query about
 * the tensor's spec description (gcomp_spec_describe, the same on every rank) and take the
 * highest score; a tie goes to the earlier table entry.  A score below 0 means "cannot carry
 * it" and is also what refuses an explicit override, with the component's reason.  Score 0
 * means "can, when asked by name": auto never picks it.  Several components may provide
 * one strategy id (as several of Open MPI's coll components provide allreduce): a strategy
 * named by the caller goes to the best-scoring component with that id.  The rule the
 * built-in scores make is stated once, at gcomp_mpi_strategy_auto in gradcomp_mpi.h.
 *
 * Life of a tensor and of a group (sub-bucket), on each rank:
 *   query         every rank, every tensor (also for auto without a bucket: n = 0).
 *   tensor_setup  ranks that take part in the exchange (t->exchange): all ranks, or the
 *                 node leaders under the hierarchical wrapper (none with one node, where the
 *                 node's dense sum is the answer).  Creates compressors, t->priv.
 *   groups_with   every rank: grouping decides the schedule, which every rank must share,
 *                 so it may read only what every rank has (spec, info, n, shape).
 *   reserve       members of the exchange: g->priv and every buffer a call can need (an
 *                 allreduce allocates nothing: a failure there could not be shared).  May
 *                 be called again on a group it set up, g->priv still in place (a retune's
 *                 roll-back recomputes what planning others overwrote): it then reuses
 *                 g->priv and, its buffers being large enough, allocates nothing.
 *   steps         members of the exchange, after reserve: gm_add_step, LOCAL and COLL.
 *   (per call)    the steps, in the engine's global COLL order; markers in size words.
 *   state_*       checkpoints: the compressors this rank keeps, in a fixed slot order.
 *   tensor_free / group_free   on free, also after a failed create (fields may be NULL).
 * The hierarchical flag is the engine's wrapper (mpi_hier.c), not a component: it wraps any
 * component's steps with the node-internal dense sum and broadcast, and hands the
 * component an exchange of node leaders (t->xsize = nodes).
 *
 * Roles.  Nothing here assumes that every rank of the exchange holds a gradient or gets the
 * result.  A parameter server (issue #13) plugs in as a component whose tensor_setup reads
 * the rank's role from t->xrank (e.g. the last S ranks serve) and sets up only what that
 * role needs: servers keep the owner-side compressors and no worker compressor (t->c NULL),
 * workers the reverse.  Its steps list must contain the same COLL steps on every rank of
 * the exchange, in the same order (a step with nothing to do on some role issues nothing:
 * g->nreq = 0), and may use point-to-point messages on g->xc between workers and servers.
 * A server reads and writes t->io only if the caller passes it a buffer (gcomp_mpi_start
 * requires one per tensor on every rank; a server may pass scratch and ignore the result),
 * and its checkpoint slots are those of its role (the slot count depends on the tensor,
 * not the role, so every rank's blob has the same shape).
 */
#ifndef GCOMP_MPI_STRATEGY_H
#define GCOMP_MPI_STRATEGY_H

#include "mpi_internal.h"

#define GM_STRATEGY_VERSION 2

/* What a strategy is asked about one tensor. */
typedef struct gm_query {
    const char *spec;            /* canonical */
    const gcomp_spec_info *info; /* gcomp_spec_describe(spec, GM_PROBE_N) */
    size_t n, rows, cols;        /* 0 when unknown (gcomp_mpi_strategy_auto) */
    int nranks;                  /* ranks (nodes, under the wrapper) of the exchange */
} gm_query;

/* The owner side a strategy keeps for a tensor on this rank (gcomp_mpi_owner_*). */
typedef struct gm_owner_view {
    const char *spec;     /* the owner's canonical spec, or NULL when the strategy has none */
    gcomp_compressor *c;  /* this rank's owner compressor, NULL when it owns nothing */
    size_t offset, count; /* the elements c describes */
} gm_owner_view;

struct gm_strategy {
    /* ---- version 1 ---- */
    unsigned version;      /* GM_STRATEGY_VERSION when written */
    const char *name;      /* "allgather": gcomp_mpi_strategy_parse / _name (GM_NAMES) */
    const char *hier_name; /* "hierarchical:allgather" */
    int id;                /* its gcomp_mpi_strategy value, > 0 and < 256, unique */

    /* Required.  Whether this strategy can carry the tensor: < 0 no, with a static reason
     * in *why for GCOMP_E_UNSUPPORTED (-2: not this component's kind of codec, -1: its kind
     * but past a limit; when no component accepts, the highest refusal's reason is the
     * message); 0 yes but never chosen by auto; > 0 auto's preference.  With q->n == 0 (the
     * spec alone, gcomp_mpi_strategy_auto) limits that depend on the tensor are not
     * checked.  A pure function of the query: every rank must get the same answer. */
    int (*query)(const gm_query *q, const char **why);

    /* Creates the tensor's compressors on a rank of the exchange: t->c (or not), t->priv,
     * t->wspec (gm_peers_setup / gm_rank_spec; the engine sets it to t->spec first).
     * Errors go to err naming the tensor.  NULL: t->c from t->spec alone. */
    gcomp_status (*tensor_setup)(gcomp_mpi_bucket *b, gm_tensor *t, gcomp_error *err);
    /* Frees t->priv (t->c and what the engine owns are freed by the engine). */
    void (*tensor_free)(gm_tensor *t);

    /* Whether t may travel in the sub-bucket that starts with `first` (same component and
     * wrapper already checked; the size limit is the engine's).  NULL: always. */
    bool (*groups_with)(const gm_tensor *first, const gm_tensor *t);
    /* Reserves everything a call can need: g->priv, the engine's gm_buf buffers (send,
     * recv, gsend, grecv, pack: the only ones that may be handed to MPI).  GCOMP_E_LIMIT
     * when an exchange would pass MPI's int counts.  NULL: nothing. */
    gcomp_status (*reserve)(gcomp_mpi_bucket *b, gm_group *g);
    /* Required.  Appends the group's steps (gm_add_step, gm_add_overlap). */
    void (*steps)(gcomp_mpi_bucket *b, gm_group *g);
    /* Frees g->priv.  NULL: gm_free(g->priv). */
    void (*group_free)(gm_group *g);

    /* Checkpoint slots (docs/FORMAT.md "MPI bucket state"): how many compressor slots the
     * tensor's record has - a function of the tensor and the exchange only, the same on
     * every rank - and which compressor fills slot k on this rank (NULL: empty).  The
     * format fixes slot 0 = the worker compressor, 1 = the owner's.  NULL: 2 slots,
     * t->c and none. */
    int (*state_slots)(const gm_tensor *t);
    gcomp_compressor *(*state_slot)(const gm_tensor *t, int k);
    /* A call failed half-way: put the tensor's state back to before it, if the strategy
     * can (PowerSGD abandons its step), before a checkpoint is taken.  NULL: nothing. */
    void (*abandon)(gm_tensor *t);
    /* The owner side (gcomp_mpi_owner_spec / _residual).  NULL: none. */
    void (*owner)(const gm_tensor *t, gm_owner_view *v);

    /* ---- version 2 ---- */
    /* Every call exchanges its sizes in size words and every message carries its spec's
     * fingerprint, so ranks whose specs for a tensor differ still issue the same
     * collectives and fail on the fingerprints: a retune that stays within this component
     * (and its sub-bucket) is local (gcomp_mpi_bucket_retune, mpi_retune.c).  false: the
     * exchange's counts follow from the spec (a dense allreduce), and a retune checks
     * collectively that every rank switched alike. */
    bool negotiated;
};

/* Both names from one literal: GM_NAMES("rsag") in a component's initializer. */
#define GM_NAMES(s) .name = s, .hier_name = "hierarchical:" s

/* Whether component S was written with member `m` (appended in a later version). */
#define gm_has(S, m, since) ((S)->version >= (since) && (S)->m != NULL)

/* The table (mpi_strategy.c). */
size_t gm_strategy_count(void);
const gm_strategy *gm_strategy_at(size_t i);
const gm_strategy *gm_strategy_by_id(int id); /* the first providing it; NULL if none */
/* The component that carries a query for strategy `id` (GCOMP_MPI_AUTO: any strategy):
 * the highest score among the components providing it, > 0 for auto, >= 0 for a strategy
 * the caller named.  NULL when none will, with the closest refusal's reason in *why. */
const gm_strategy *gm_strategy_choose(const gm_query *q, int id, const char **why);

#endif /* GCOMP_MPI_STRATEGY_H */

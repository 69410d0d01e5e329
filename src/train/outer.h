/*
 * outer.h - local SGD / DiLoCo in the reference trainer: the inner steps are the
 * trainer's own SGD with momentum on each rank's gradient (no exchange), and every H
 * steps (per fragment, when streaming) libgradcomp_mpi's outer step averages the
 * compressed pseudo-gradients and applies the outer optimizer (gcomp_mpi_outer_*).
 * The method's spec (the layer policy, as for data-parallel runs) compresses each
 * tensor's pseudo-gradient.
 */
#ifndef GTRAIN_OUTER_H
#define GTRAIN_OUTER_H

#include <mpi.h>
#include <stddef.h>

#include "exchange.h"
#include "model.h"

typedef struct gtrain_outer_cfg {
    unsigned local_steps; /* H; 0: data-parallel training, no outer step */
    int optimizer;        /* GCOMP_MPI_OUTER_SGD or GCOMP_MPI_OUTER_NESTEROV */
    double lr, momentum;  /* outer */
    unsigned stream;      /* fragments (Streaming DiLoCo); 0 or 1: the whole model at once */
    int delay;            /* inner steps a fragment's sync overlaps; -1: automatic */
    double mix;           /* Streaming DiLoCo's alpha */
    double ef_decay;      /* SparseLoCo's residual decay beta (1: plain feedback=ef) */
} gtrain_outer_cfg;

/* local_steps 0 (off); the outer optimizer as "nesterov" gives it (lr 0.7, momentum 0.9). */
void gtrain_outer_cfg_default(gtrain_outer_cfg *c);

/* Parses "sgd|nesterov[:lr=X,momentum=M]" into c (sgd: lr 1, momentum 0; nesterov: lr
 * 0.7, momentum 0.9, DiLoCo's).  Returns 0, or 1 with the reason in err. */
int gtrain_outer_parse(const char *s, gtrain_outer_cfg *c, char *err, size_t errlen);

/* Takes the outer-step items out of a method "SPEC;KEY=VALUE;..." (local_steps=H,
 * outer=sgd|nesterov[:...], stream=F, stream_delay=D, mix=A, ef_decay=B), applying them
 * over *c, and writes the rest of the method into core (cap bytes).  Returns 0, or 1. */
int gtrain_outer_method(const char *method, gtrain_outer_cfg *c, char *core, size_t cap, char *err,
                        size_t errlen);

/* "H=32 nesterov lr=0.7 momentum=0.9[ stream=4 delay=8 mix=0.5 ef_decay=0.9]" or "". */
void gtrain_outer_cfg_describe(const gtrain_outer_cfg *c, char *out, size_t cap);

typedef struct gtrain_outer gtrain_outer;

/* Collective.  The weights of `t` are the starting point (the same on every rank). */
int gtrain_outer_create(gtrain_outer **out, const gtrain_outer_cfg *c, const char *method,
                        gtrain_tensor *t, size_t nt, const gtrain_policy_defaults *pd, int strategy,
                        double timeout_s, MPI_Comm comm, char *err, size_t errlen);
void gtrain_outer_free(gtrain_outer *o);
/* The specs of the tensors' pseudo-gradients, as gtrain_exchange_describe. */
void gtrain_outer_describe(const gtrain_outer *o, char *out, size_t cap);
/* Call during the backward pass: moves the syncs in flight forward. */
void gtrain_outer_progress(gtrain_outer *o);
/* After every inner optimizer step.  Returns 0, or 1 (gtrain_outer_error says why). */
int gtrain_outer_step(gtrain_outer *o);
/* Syncs every fragment now (the end of a run): every rank ends on the same weights. */
int gtrain_outer_flush(gtrain_outer *o);
/* Puts the global weights (the last syncs', the same on every rank) into the model for an
 * evaluation, and the live ones back afterwards. */
void gtrain_outer_eval_begin(gtrain_outer *o);
void gtrain_outer_eval_end(gtrain_outer *o);
double gtrain_outer_bytes_sent(const gtrain_outer *o);
/* bytes_sent, msg_bytes, codec_s as for the exchange; comm_s: time blocked in syncs. */
void gtrain_outer_get_stats(const gtrain_outer *o, gtrain_exchange_stats *out);
const char *gtrain_outer_error(const gtrain_outer *o);

#endif

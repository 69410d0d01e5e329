/*
 * exchange.h - the trainer's per-layer gradient exchange: one compressor per tensor
 * (chosen by the layer policy), started tensor by tensor as the backward pass makes each
 * gradient final, finished once per step.  After finish, every tensor's g holds the mean
 * over ranks of the decoded messages.  Built on libgradcomp_mpi.
 */
#ifndef GTRAIN_EXCHANGE_H
#define GTRAIN_EXCHANGE_H

#include <mpi.h>
#include <stddef.h>

#include "gradcomp_mpi.h"
#include "model.h"
#include "plan.h"

#include "gradcomp.h"
#include "gradcomp_mpi.h"

typedef struct gtrain_exchange gtrain_exchange;

typedef struct gtrain_exchange_stats {
    double bytes_sent; /* by this rank on the wire (per the algorithm), all steps */
    double msg_bytes;  /* bytes of the compressed tensors this rank produced, all steps:
                          its messages, or for allreduced tensors the reduced buffer */
    double codec_s;    /* compress + decompress */
    double comm_s;     /* waiting on the network (not hidden behind compute) */
} gtrain_exchange_stats;

/* method: "dense", "dense-f16", a spec, or "policy:<policy string>".  strategy: a
 * gcomp_mpi strategy for the tensors the policy compresses (0: each codec's default).
 * specs: NULL, or one spec per tensor that replaces the policy (an adaptive method's first
 * decision; every tensor then goes by its codec's default strategy). */
int gtrain_exchange_create(gtrain_exchange **out, const char *method, gtrain_tensor *t, size_t nt,
                           const char *const *specs, const gtrain_policy_defaults *pd, int strategy,
                           double timeout_s, MPI_Comm comm, char *err, size_t errlen);
/* The same on the caller's communicator (not freed by the exchange), every tensor through
 * the parameter server `ps` when it is not NULL (strategy GCOMP_MPI_PS, with `hierarchical`
 * the node-first dist_sync_device form): dense tensors too, since the servers hold every
 * key.  Collective over comm (servers included). */
int gtrain_exchange_create_on(gtrain_exchange **out, const char *method, gtrain_tensor *t,
                              size_t nt, const char *const *specs, const gtrain_policy_defaults *pd,
                              int strategy, double timeout_s, gcomp_mpi_comm *comm,
                              gcomp_mpi_ps *ps, int hierarchical, char *err, size_t errlen);
/* Tensor i's bucket (one tensor per bucket). */
gcomp_mpi_bucket *gtrain_exchange_bucket(const gtrain_exchange *ex, size_t i);
/* Switches tensor i to `spec` between steps (gcomp_mpi_bucket_retune: collective when the
 * switch is structural; every rank must make it).  Updates what owns_momentum says. */
int gtrain_exchange_retune(gtrain_exchange *ex, size_t i, const char *spec);
const char *gtrain_exchange_spec(const gtrain_exchange *ex, size_t i);
/* What tensor i's compressor holds back (NULL: nothing of the kind). */
const float *gtrain_exchange_residual(const gtrain_exchange *ex, size_t i);
gcomp_mpi_comm *gtrain_exchange_comm(const gtrain_exchange *ex);
void gtrain_exchange_free(gtrain_exchange *ex);
/* One line naming the spec of each group of tensors. */
void gtrain_exchange_describe(const gtrain_exchange *ex, char *out, size_t cap);
/* 1 when tensor i's compressor keeps its momentum (DGC): the optimizer must skip it. */
int gtrain_exchange_owns_momentum(const gtrain_exchange *ex, size_t i);
void gtrain_exchange_set_epoch(gtrain_exchange *ex, double epoch);
int gtrain_exchange_begin_step(gtrain_exchange *ex);
/* Starts exchanging tensor i (its g is final).  Non-blocking. */
int gtrain_exchange_start(gtrain_exchange *ex, size_t i);
/* Waits for every tensor of this step; g then holds the averaged gradient. */
int gtrain_exchange_finish(gtrain_exchange *ex);
const char *gtrain_exchange_error(const gtrain_exchange *ex);
double gtrain_exchange_bytes_sent(const gtrain_exchange *ex);
void gtrain_exchange_get_stats(const gtrain_exchange *ex, gtrain_exchange_stats *out);
/* The cost model's view of the exchange (gradcomp.h, "Cost model"): out[i] is tensor i with
 * its spec and the strategy its bucket actually uses; the strings belong to ex.  Also the
 * number of nodes the ranks are on. */
void gtrain_exchange_cost_tensors(const gtrain_exchange *ex, gcomp_cost_tensor *out);
int gtrain_exchange_nodes(const gtrain_exchange *ex);

#endif

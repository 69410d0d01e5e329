/*
 * trainer.h - gradcomp's reference data-parallel trainer: one method (a spec or a layer
 * policy) trained on every rank of an MPI communicator, gradients exchanged per layer
 * through libgradcomp_mpi while the backward pass of the earlier layers still runs.
 *
 * Every rank calls gtrain_run with the same configuration; each trains on its shard of
 * the data (strided, reshuffled per epoch from the seed), all start from the same weights
 * (same seed), and after every step the weights are bit-identical on every rank (checked
 * by a hash at each evaluation; a difference is an error, not a footnote).
 *
 * Methods: "dense" (f32 allreduce), "dense-f16", any spec (applied to the tensors the
 * layer policy compresses; small and 1-D tensors go dense), a full policy string
 * "policy:spec=...;min_elements=...", or an adaptive method "adapt:..." (gradcomp.h,
 * "Adaptive compression"; train_adapt.h): controllers retune the tensors during the run.  A spec
 * with DGC (codec dgc, or feedback=dgc) owns the momentum of the tensors it compresses: the
 * optimizer skips its own momentum there (Lin et al. 2018).  PowerSGD runs its two reductions per
 * step.
 */
#ifndef GTRAIN_TRAINER_H
#define GTRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "data.h"
#include "gradcomp.h"

enum { GTRAIN_LR_CONST = 0, GTRAIN_LR_COSINE = 1, GTRAIN_LR_STEP = 2 };

typedef struct gtrain_config {
    const char *model;  /* mlp, mlp-large, cnn */
    const char *hidden; /* NULL: the model's default */
    int epochs;
    size_t batch; /* per rank */
    float lr, momentum, weight_decay;
    int nesterov;
    int summed_loss; /* 1: gradients of the batch's summed loss (MXNet's unit), 0: of its mean */
    int lr_schedule; /* GTRAIN_LR_CONST, _COSINE or _STEP (see gtrain_lr_at) */
    uint64_t seed;
    int evals_per_epoch;        /* test-set evaluations per epoch (>= 1) */
    size_t min_elements;        /* policy: tensors smaller than this go dense */
    int strategy;               /* gcomp_mpi strategy for compressed tensors (0: auto) */
    const char *dense_spec;     /* policy: spec of those and of 1-D tensors (none:values=f16) */
    double timeout_s;           /* per collective */
    int progress;               /* 0 quiet, 1 lines, 2 a live bar (rank 0 only) */
    double max_steps_per_epoch; /* 0: all; else cap (smoke runs) */
    double time_budget_s;       /* 0: none; else stop at the first evaluation after this much
                                   training time (the slowest rank's) */
    /* The cost model's prediction beside the measured step (gradcomp.h, "Cost model"):
     * codec rates and the network from `calibration` (may be NULL: no prediction unless
     * link_bps is given), the inter-node link `link_bps` bits/s of Ethernet (0: the
     * calibration's measured one). */
    const gcomp_cost_calibration *calibration;
    double link_bps;
} gtrain_config;

typedef struct gtrain_point {
    double epoch;      /* fractional */
    double wall_s;     /* training time so far, evaluations excluded */
    double bytes;      /* bytes sent by this rank so far */
    double train_loss; /* mean over ranks of the recent steps */
    double test_acc;   /* fraction */
    double test_loss;
} gtrain_point;

typedef struct gtrain_result {
    char method[256];
    char detail[512]; /* the specs actually used, e.g. "fc1.weight,fc2.weight: dgc:...; rest: none"
                       */
    double final_acc, final_loss, best_acc;
    double bytes_per_step;       /* mean bytes sent per step per rank, all tensors */
    double dense_bytes_per_step; /* 4 * parameters */
    double ratio;                /* compression: 4 * parameters * steps / compressed bytes produced,
                                    over the whole run, warm-up included */
    double traffic_ratio;        /* dense f32 ring allreduce bytes / bytes this method sent */
    double step_ms, codec_ms, comm_ms, compute_ms; /* per step, means over ranks */
    /* The cost model's prediction for this run (predicted = 0: none could be made): step
     * from the compute measured before training (forward+backward without exchange, max
     * over ranks) and the run's optimizer time, codec from the calibration, communication
     * from the link; no overlap (MPI moves data only inside MPI calls on this trainer). */
    int predicted;
    double pred_step_ms, pred_codec_ms, pred_exposed_ms, pred_bytes_per_step, pure_compute_ms;
    double wall_s;
    size_t steps;
    size_t params;
    int weights_identical; /* 1 when every rank ended with the same weights */
    int stopped_by_budget; /* 1 when cfg->time_budget_s ended the run before its epochs */
    gtrain_point *points;
    size_t npoints;
    /* Adaptive methods ("adapt:..."): every setting change (the first decision included),
     * the model's tensor names they index, the decisions taken and the time they took (the
     * slowest rank's; already part of wall_s and step_ms). */
    struct gtrain_setting *settings;
    size_t nsettings;
    char **tensor_names;
    size_t ntensors;
    size_t decisions;
    double adapt_s;
    double error, error_uniform; /* layers: mean total compression error, chosen vs uniform */
} gtrain_result;

/* Trains one method.  Collective over `comm`.  `test` may be evaluated in shards.
 * Returns 0, or non-zero with a message in err (the same on every rank where possible). */
int gtrain_run(const gtrain_config *cfg, const char *method, const gtrain_data *train,
               const gtrain_data *test, MPI_Comm comm, gtrain_result *out, char *err,
               size_t errlen);
void gtrain_result_free(gtrain_result *r);

/* The learning rate at `progress` (steps done / steps in the run, in [0, 1]): cfg->lr for
 * GTRAIN_LR_CONST; lr·(1 + cos(π·progress))/2 for GTRAIN_LR_COSINE (Loshchilov & Hutter,
 * no restarts); lr, then lr/10 from half the run and lr/100 from three quarters for
 * GTRAIN_LR_STEP (the classic ImageNet/CIFAR decay, scaled to the run). Every method of a
 * comparison follows the same schedule. */
float gtrain_lr_at(const gtrain_config *cfg, double progress);

/* The first wall time at which test accuracy reached `target` (fraction); -1 if never. */
double gtrain_time_to(const gtrain_result *r, double target);

#endif

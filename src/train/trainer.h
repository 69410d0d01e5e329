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
 * "Adaptive compression"; train_adapt.h): controllers retune the tensors during the run.
 * A spec with DGC (codec dgc, or feedback=dgc) owns the momentum of the tensors it
 * compresses: the optimizer skips its own momentum there (Lin et al. 2018).  PowerSGD runs
 * its two reductions per step.
 *
 * Local SGD / DiLoCo (cfg->outer.local_steps = H > 0, or a method's local_steps=H): no
 * exchange per step; each rank's SGD runs on its own gradient and the outer step (outer.h)
 * syncs the weights every H steps, the method's spec compressing the pseudo-gradients.
 * Evaluations then see the global weights (the last syncs'), and a last sync of every
 * fragment ends the run.
 */
#ifndef GTRAIN_TRAINER_H
#define GTRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "data.h"
#include "gradcomp.h"
#include "outer.h"

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
    int evals_per_epoch;           /* test-set evaluations per epoch (>= 1) */
    gtrain_policy_defaults policy; /* --min-elements, --min-k, --dense-spec (none:values=f16) */
    int strategy;                  /* gcomp_mpi strategy for compressed tensors (0: auto) */
    double timeout_s;              /* per collective */
    int progress;                  /* 0 quiet, 1 lines, 2 a live bar (rank 0 only) */
    double max_steps_per_epoch;    /* 0: all; else cap (smoke runs) */
    double time_budget_s;          /* 0: none; else stop at the first evaluation after this much
                                      training time (the slowest rank's) */
    /* The cost model's prediction beside the measured step (gradcomp.h, "Cost model"):
     * codec rates and the network from `calibration` (may be NULL: no prediction unless
     * link_bps is given), the inter-node link `link_bps` bits/s of Ethernet (0: the
     * calibration's measured one) with `link_delay_s` of one-way delay on top of the
     * calibration's latency (netsim's --delay-us). */
    const gcomp_cost_calibration *calibration;
    double link_bps, link_delay_s;
    gtrain_outer_cfg outer; /* local SGD / DiLoCo (outer.local_steps > 0); a method's own
                               items (local_steps=, outer=, ...) override it */
    /* Accuracy-driven adaptive methods: a reference run's evaluations, whose curve (shifted
     * to end at the target) is the course they steer by (gcomp_adapt_set_course); the
     * trainer's CLI passes the dense run of the same command.  NULL: the glide path. */
    const struct gtrain_point *reference;
    size_t nreference;
    /* A validation split held out of the training set (gtrain_data_hold_out; NULL: none):
     * evaluated beside the test set at every evaluation, and then the metric accuracy-driven
     * methods steer by and their reference curve, so no decision looks at the test set. */
    const gtrain_data *val;
    int slow_rank;      /* with slow_factor > 1: this (worker) rank computes each step */
    double slow_factor; /* slow_factor times slower (it sleeps the difference) */
} gtrain_config;

typedef struct gtrain_point {
    double epoch;      /* fractional */
    double wall_s;     /* training time so far, evaluations excluded */
    double bytes;      /* bytes sent by this rank so far */
    double train_loss; /* mean over ranks of the recent steps */
    double test_acc;   /* fraction */
    double test_loss;
    double val_acc, val_loss; /* on cfg->val; NaN without one */
} gtrain_point;

/* A model's verdict on each of n samples: right[i] is 1 where it predicts sample i's label. */
typedef struct gtrain_verdicts {
    unsigned char *right; /* NULL: none */
    size_t n;
} gtrain_verdicts;

typedef struct gtrain_result {
    char method[256];
    char detail[512]; /* the specs actually used, e.g. "fc1.weight,fc2.weight: dgc:...; rest: none"
                       */
    double final_acc, final_loss, best_acc;
    double final_val_acc;        /* on cfg->val at the end; NaN without one */
    char outer[160];             /* the outer step ("H=32 nesterov lr=0.7 ..."), "" for
                                    data-parallel training */
    unsigned local_steps;        /* H; 0 for data-parallel training */
    double bytes_per_step;       /* mean bytes sent per step per rank, all tensors */
    double bytes_total;          /* bytes sent per rank over the whole run */
    double dense_bytes_per_step; /* 4 * parameters */
    double ratio;                /* compression: 4 * parameters * steps / compressed bytes produced,
                                    over the whole run, warm-up included */
    double traffic_ratio;        /* dense f32 ring allreduce bytes / bytes this method sent */
    double step_ms, codec_ms, comm_ms, compute_ms; /* per step, means over ranks */
    /* The first step alone and the mean of the steps after it (means over ranks; 0 when
     * the run had one step, and in parameter-server runs, which time per worker step
     * otherwise): the first pays one-time costs (the first touch of every
     * compressor's state and workspace), the others are what the cost model predicts. */
    double first_step_ms, steady_step_ms;
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
    /* Parameter-server runs (ps_train.h); "" and zeros for the collectives. */
    char exchange[48];                  /* e.g. "ps 1 sync", "ps 1 async" */
    double ps_pushed_per_step;          /* bytes a worker pushes per step (its steps), mean */
    double ps_pulled_per_step;          /* bytes a worker pulls per step, mean */
    double ps_server_busy;              /* fraction of the run the busiest server was busy */
    double ps_stale_mean, ps_stale_max; /* async: updates between a push's pull and itself */
    double ps_queue_max;                /* most pushes waiting at a server */
    double ps_worker_steps_min, ps_worker_steps_max; /* async: steps made by each worker */
    int ps_workers_lost;
    double ps_momentum; /* the momentum of the run's optimizer (async: the servers') */
    /* Adaptive methods ("adapt:..."): every setting change (the first decision included),
     * the model's tensor names they index, the decisions taken and the time they took (the
     * slowest rank's; already part of wall_s and step_ms). */
    struct gtrain_setting *settings;
    size_t nsettings;
    char **tensor_names;
    size_t ntensors;
    size_t decisions;
    int steered_by_reference; /* accuracy: the course was cfg->reference's curve */
    double adapt_s;
    double error, error_uniform;  /* layers: mean total compression error, chosen vs uniform */
    struct gtrain_decision *dlog; /* every decision, a row per ladder candidate */
    size_t ndlog;
    char **ladder; /* the ladder's specs, most bytes first */
    size_t nladder;
    /* The final model's verdict on each sample of the test set and of the validation split
     * (cfg->val), for the paired standard error of the difference between two methods
     * (gtrain_paired_se; in parameter-server runs, the workers'); empty without a split, or
     * when gtrain_final_verdicts found them off the last evaluation. */
    gtrain_verdicts test_verdicts, val_verdicts;
} gtrain_result;

/* The accuracy decisions are taken on (the accuracy controller's metric and course, the
 * sensitivity probe's costs): the validation split's when the run holds one out. */
static inline double gtrain_decision_acc(const gtrain_point *p, int use_val) {
    return use_val ? p->val_acc : p->test_acc;
}

/* Trains one method.  Collective over `comm`.  `test` may be evaluated in shards.
 * Returns 0, or non-zero with a message in err (the same on every rank where possible). */
int gtrain_run(const gtrain_config *cfg, const char *method, const gtrain_data *train,
               const gtrain_data *test, MPI_Comm comm, gtrain_result *out, char *err,
               size_t errlen);
void gtrain_result_free(gtrain_result *r);

/* The standard error of a's accuracy minus b's, from the two models' verdicts on the same
 * samples (paired: only the samples they disagree on count), as a fraction: how far the
 * difference would move on another sample of this size.  It is the sample's share of the
 * uncertainty, not the seed's.  NaN without both verdicts or for sets of other sizes. */
double gtrain_paired_se(const gtrain_verdicts *a, const gtrain_verdicts *b);

/* m's verdict on each of set's samples, the set split across the ranks of comm as
 * gtrain_evaluate splits it, and checked against the accuracy an evaluation of the same
 * model reported (acc).  Empty (on every rank) when out of memory or when they disagree,
 * which rank 0 says, naming `method` and `what` set.  Collective. */
gtrain_verdicts gtrain_final_verdicts(gtrain_model *m, const gtrain_data *set, double acc,
                                      MPI_Comm comm, const char *method, const char *what);

/* The learning rate at `progress` (steps done / steps in the run, in [0, 1]): cfg->lr for
 * GTRAIN_LR_CONST; lr·(1 + cos(π·progress))/2 for GTRAIN_LR_COSINE (Loshchilov & Hutter,
 * no restarts); lr, then lr/10 from half the run and lr/100 from three quarters for
 * GTRAIN_LR_STEP (the classic ImageNet/CIFAR decay, scaled to the run). Every method of a
 * comparison follows the same schedule. */
float gtrain_lr_at(const gtrain_config *cfg, double progress);

/* Test accuracy and loss of m, the test set split across the ranks of comm (collective). */
int gtrain_evaluate(gtrain_model *m, const gtrain_data *test, MPI_Comm comm, double *acc,
                    double *loss);
/* p's test_acc/test_loss on `test`, and its val_acc/val_loss on cfg->val (NaN without one).
 * Collective. */
int gtrain_evaluate_point(gtrain_model *m, const gtrain_config *cfg, const gtrain_data *test,
                          MPI_Comm comm, gtrain_point *p);
/* 1 when every rank of comm holds bit-identical weights (collective). */
int gtrain_same_weights(gtrain_model *m, MPI_Comm comm);
/* Sleeps (factor - 1) x compute_s: how --slow-rank emulates a slower device. */
void gtrain_slow_down(double compute_s, double factor);

/* The first wall time at which test accuracy reached `target` (fraction); -1 if never. */
double gtrain_time_to(const gtrain_result *r, double target);

#endif

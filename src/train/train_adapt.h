/*
 * train_adapt.h - the trainer's side of adaptive compression: an "adapt:..." method (the grammar
 * of gradcomp.h, "Adaptive compression") run inside gtrain_run.  It owns the controllers
 * (gcomp_adapt), feeds them this rank's observations (each tensor's gradient as backward
 * makes it final, the step's compute time, a link probe, the validation or test accuracy), takes
 * the decision with every rank at the controllers' interval (gcomp_mpi_adapt_decide) and applies it
 * to the live buckets (gtrain_exchange_retune), and keeps the history of every tensor's setting for
 * metrics.csv and the plots.
 */
#ifndef GTRAIN_ADAPT_H
#define GTRAIN_ADAPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "exchange.h"
#include "model.h"

/* One tensor's setting from a step on. */
typedef struct gtrain_setting {
    size_t step;    /* steps done when it took effect */
    double epoch;   /* fractional */
    size_t tensor;  /* index in the model's tensor list */
    double density; /* gcomp_spec_info.density */
    double bits;    /* gcomp_spec_info.value_bits */
    double bytes;   /* one message, gcomp_spec_bytes_estimate */
    int level;      /* ladder position (gcomp_adapt_level): the spec is the ladder's entry */
} gtrain_setting;

/* One ladder candidate at one decision: the decision's inputs (gcomp_adapt_report) and the
 * candidate's predicted step (the bandwidth controller; NaN otherwise). */
typedef struct gtrain_decision {
    size_t decision, step;
    double epoch;
    double bandwidth, latency, compute_s; /* bytes/s, s, s per step */
    double measure_s;                     /* the last measurement's cost, slowest rank */
    double probe_s;                       /* its link probe on this rank (0: none) */
    size_t next_measure;                  /* the step that measures next */
    size_t candidate;                     /* its ladder index, most bytes first */
    double predicted_s;
    int chosen;    /* 1 for the uniform level the decision took */
    double metric; /* the accuracy controller's metric at the decision (NaN: none) */
} gtrain_decision;

typedef struct gtrain_adapt gtrain_adapt;
struct gtrain_point; /* trainer.h */

/* 1 when `method` is an adaptive method ("adapt:..."). */
int gtrain_adapt_is_method(const char *method);
/* 1 when `method` is an adaptive method whose controller list ("adapt:CTL+CTL;...", before
 * any ';' or '@') names `controller`: e.g. whether the run needs a validation split.  Only
 * the list is read; gtrain_adapt_create judges the rest. */
int gtrain_adapt_method_uses(const char *method, const char *controller);
/* Parses the method and takes the first decision for the model's tensors.  Collective over
 * comm (counts the nodes).  total_steps: the run's length; pd: the trainer's layer-policy
 * defaults, of which the adaptive policy takes min_elements and dense_spec (not min_k: a
 * floor would collapse the ladder's light end); cal may be NULL. */
int gtrain_adapt_create(gtrain_adapt **out, const char *method, const gtrain_tensor *t, size_t nt,
                        uint64_t total_steps, const gtrain_policy_defaults *pd,
                        const gcomp_cost_calibration *cal, MPI_Comm comm, char *err, size_t errlen);
void gtrain_adapt_free(gtrain_adapt *a);
/* The current spec of every tensor (for gtrain_exchange_create). */
const char *const *gtrain_adapt_specs(const gtrain_adapt *a);
/* Tensor i's gradient is final: observe it (with what its compressor holds back). */
int gtrain_adapt_observe(gtrain_adapt *a, const gtrain_exchange *ex, size_t i);
/* The accuracy controller's course: a reference run's evaluations (epochs of `epochs`),
 * those after the start (gcomp_adapt_set_course), their validation accuracy with use_val
 * (the reference must then have one), else their test accuracy.  *used = 1 when the method
 * steers by it (it has the accuracy controller); 0 with nothing done otherwise. */
int gtrain_adapt_set_reference(gtrain_adapt *a, const struct gtrain_point *pts, size_t n,
                               int epochs, int use_val, int *used, char *err, size_t errlen);
/* An accuracy to steer by, validation or test (every rank, the same value). */
void gtrain_adapt_metric(gtrain_adapt *a, double accuracy);
/* The learning rate of the next step (the norm controller's decay rule). */
void gtrain_adapt_lr(gtrain_adapt *a, double lr);
/* After the optimizer step: this step's compute; at a decision, decides with every rank
 * and retunes the tensors that change, zeroing the optimizer momentum of a tensor whose
 * momentum moves to or from a compressor (skip[] is updated).  Collective at decisions.
 * *spent_s receives the time the decision took (0 on other steps). */
int gtrain_adapt_end_step(gtrain_adapt *a, gtrain_exchange *ex, gtrain_model *m,
                          unsigned char *skip, size_t step, double epoch, double compute_s,
                          double optimizer_s, double *spent_s, char *err, size_t errlen);
/* Every decision, a row per ladder candidate, in order; the ladder's specs. */
const gtrain_decision *gtrain_adapt_log(const gtrain_adapt *a, size_t *count);
size_t gtrain_adapt_ladder_size(const gtrain_adapt *a);
const char *gtrain_adapt_candidate(const gtrain_adapt *a, size_t j);
/* Every setting change, the first decision included, in order. */
const gtrain_setting *gtrain_adapt_history(const gtrain_adapt *a, size_t *count);
size_t gtrain_adapt_decisions(const gtrain_adapt *a);
/* The layers controller: the total compression error of its choices and of the uniform
 * setting on the same gradients, each the mean over the decisions (summed over ranks);
 * 0 when it never measured. */
void gtrain_adapt_errors(const gtrain_adapt *a, double *chosen, double *uniform);

#endif

/*
 * adapt_internal.h - what the adaptive controllers share (src/adapt/adapt*.c): the object
 * the engine (adapt.c) builds from a method string, the statistics every rank contributes
 * to a decision, and the small interface a controller implements.
 *
 * A decision is a plan: a ladder level for each managed tensor (0 = the candidate that
 * sends most), the uniform level the byte budget comes from, and the budget.  It starts at
 * base each time and each controller, in a fixed order, transforms it from the combined
 * statistics and its own state, which only decisions change:
 *
 *     bandwidth -> uniform level (the lightest the cost model calls fast enough)
 *     accuracy  -> shifts the uniform level by its closed loop's offset
 *     layers    -> per-tensor levels under the uniform level's byte budget (L-GreCo DP)
 *     norm      -> tensors in a critical regime to at most the `low` level (Accordion)
 *
 * so "layer sensitivity inside a bandwidth-chosen budget" is `adapt:bandwidth+layers`.
 */
#ifndef GCOMP_ADAPT_INTERNAL_H
#define GCOMP_ADAPT_INTERNAL_H

#include "core/internal.h"

#include <math.h>
#include <stdbool.h>

/* The statistics of one decision, combined over ranks in rank order (adapt.c). */
typedef struct gcomp__adapt_in {
    uint64_t decision; /* index of this decision (0 = the first after create) */
    uint64_t step;     /* steps observed */
    double progress;   /* step / total_steps; NaN when the length is unknown */
    bool initial;      /* the plan at create: no statistics at all */
    double forward_s, backward_s, optimizer_s; /* per step, the slowest rank's mean */
    double interval_s;         /* training seconds since the last decision (the median step
                                * gap times the steps), the slowest rank's */
    double measure_s;          /* of which measuring, the slowest rank's (0 when none) */
    double probe_s;            /* of which probing the link, the slowest rank's (0 when none) */
    double bandwidth, latency; /* median over ranks that measured, else the last decision's
                                  link (gcomp_adapt_link_due spaces the probes); 0: none */
    bool has_metric;
    double metric;          /* mean over ranks */
    double metric_progress; /* when the metrics were observed: steps then / total steps (mean
                               over them and over ranks); NaN when the length is unknown */
    double lr, lr_prev;     /* the learning rate now (least over ranks that observed one) and
                               at the last decision that had one; NaN: none */
    /* Per managed tensor m: |sum of its gradients over the interval|^2, summed over ranks;
     * NaN when not tracked. */
    const double *norm2;
    /* Per managed tensor m and candidate j, at [m * K + j], when `measured`: squared
     * compression error and |x|^2 summed over ranks, encode and decode seconds (the
     * slowest rank's). */
    bool measured;
    const double *err2, *x2, *enc_s, *dec_s;
} gcomp__adapt_in;

typedef struct gcomp__adapt_plan {
    int *level;           /* per managed tensor */
    int uniform;          /* the level the budget is set from */
    double budget;        /* bytes per step of the managed tensors */
    double pred_s;        /* bandwidth: predicted step of the uniform level (0: none) */
    size_t critical;      /* norm: tensors held at low */
    double error;         /* layers: total error of the choice (0: none) */
    double error_uniform; /* layers: the same measurement's error of the uniform setting */
} gcomp__adapt_plan;

/* Words of a statistics block before the per-tensor part (adapt.c's S_FIXED). */
#define GCOMP__ADAPT_STATS_FIXED 17
/* Step gaps an interval keeps for its training time (odd: the median is one of them). */
#define GCOMP__ADAPT_GAPS 63

/* One key=value of the method string. */
typedef struct gcomp__adapt_item {
    char *key, *val;
    bool used;
    /* Read as a number: the fingerprint hashes the value, not its spelling (eta=0.5 and
     * eta=5e-1 are one configuration), and leaves out an item that gives the default. */
    bool numeric, is_default;
    double num;
} gcomp__adapt_item;

/* A managed tensor's view for the controllers. */
typedef struct gcomp__adapt_tensor {
    char *name;
    size_t n, rows, cols;
    bool managed;
    int m;       /* index among managed tensors, -1 */
    char *fixed; /* unmanaged: its spec (canonical) */
    int fixed_strategy;
    size_t sample_rows, sample_n; /* the block a measurement compresses (== n: all of it) */
    float *acc; /* norm: the gradient accumulated over the interval (managed only) */
    bool acc_used;
} gcomp__adapt_tensor;

typedef struct gcomp__adapt_ctl gcomp__adapt_ctl;

/* Sequential little-endian fields of a saved state (adapt.c, gcomp_adapt_save_state).  With
 * w NULL a writer only counts: the size of a section is its save run dry.  A reader's input
 * has the exact size a dry save gives, checked before any field is read. */
typedef struct gcomp__adapt_cursor {
    uint8_t *w;
    const uint8_t *r;
    size_t at;
} gcomp__adapt_cursor;

static inline void gcomp__adapt_w64(gcomp__adapt_cursor *c, uint64_t v) {
    if (c->w) gcomp__put64(c->w + c->at, v);
    c->at += 8;
}
static inline void gcomp__adapt_wf(gcomp__adapt_cursor *c, double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    gcomp__adapt_w64(c, b);
}
static inline uint64_t gcomp__adapt_r64(gcomp__adapt_cursor *c) {
    uint64_t v = gcomp__get64(c->r + c->at);
    c->at += 8;
    return v;
}
static inline double gcomp__adapt_rf(gcomp__adapt_cursor *c) {
    uint64_t b = gcomp__adapt_r64(c);
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

struct gcomp_adapt {
    char *method; /* canonical text: controllers and items as given */
    size_t nt, nm, K;
    gcomp__adapt_tensor *t;
    size_t *mt;    /* managed index -> tensor index */
    char **ladder; /* K canonical specs, most bytes first */
    int *strategy; /* K: each candidate's strategy */
    double *bytes; /* nm * K: one message of candidate j for managed tensor m */
    double *total; /* K: sum over managed tensors */
    int base;      /* base's level */
    uint64_t interval, measure, total_steps;
    bool measure_auto;   /* measure=auto: spaced by what measuring costs */
    double measure_cost; /* measure=auto: the share of the run's time measuring may take */
    double probe_cost;   /* bandwidth (set by its create): the share link probes may take;
                            0 without the controller */
    size_t sample;       /* elements a measurement compresses per tensor, at most */
    bool error_on_grad;  /* layers (set by its create): errors of the gradient alone, not of
                            the gradient plus the compressor's residual */
    int workers, nodes;
    gcomp_cost_calibration *cal; /* codec rates before measurements (copied), may be NULL */

    gcomp__adapt_item *items;
    size_t nitems;
    const gcomp__adapt_ctl *ctl[4];
    void *ctl_state[4];
    size_t nctl;
    bool track_norm, need_measure;
    uint64_t fp;     /* configuration fingerprint: every rank's statistics carry it */
    uint64_t fp0;    /* the fingerprint of the method, ladder and tensors alone */
    uint64_t fp_run; /* of the options decisions read: run length, workers, nodes, the
                        candidates' and fixed tensors' specs and strategies, calibration */
    double *course;  /* accuracy: a reference curve, ncourse (progress, metric) pairs */
    size_t ncourse;
    unsigned *exchange; /* nt: the caller's exchange groups (gcomp_adapt_set_exchanges), or
                           NULL: a message a tensor */
    size_t run_bytes;   /* 0: a group's routes travel whole; else consecutive runs, capped */

    /* decisions (identical on every rank) */
    int *level, *prev;
    unsigned char *changed;
    uint64_t decisions;
    gcomp_adapt_report report;
    double last_link_bw, last_link_lat; /* the link the last decision used (bandwidth) */
    double last_lr;                     /* the learning rate the last decision saw; NaN */
    uint64_t next_probe;                /* the first step whose decision probes the link */
    double *pred;                       /* K: bandwidth's predicted steps, NaN when none */
    uint64_t next_measure;              /* the step (0-based) that measures next */
    uint64_t measurements;              /* measuring steps so far (picks the sample block) */

    /* this rank's observations since the last gcomp_adapt_stats */
    uint64_t step;
    double fwd, bwd, opt;
    uint64_t ncompute;
    double link_bw, link_lat;
    double ptime; /* seconds spent probing the link for this interval's decision */
    double metric_sum, metric_step_sum;
    uint64_t metric_n;
    double lr; /* the latest gcomp_adapt_observe_lr; NaN: none yet */
    bool measuring, measured;
    double mtime_step, mtime; /* seconds spent measuring: this step, this interval */
    uint64_t wall_ns;         /* when the last statistics were taken (or create) */
    /* The gaps between this interval's gcomp_adapt_end_step calls (the latest
     * GCOMP__ADAPT_GAPS), whose median times its steps is its training time. */
    uint64_t end_ns, stats_step;
    double gap_s[GCOMP__ADAPT_GAPS];
    uint64_t ngap;
    double *meas; /* nm * K * 4: err2, x2, enc_s, dec_s */
    float *xbuf, *dbuf;
    size_t scratch_n;
};

/* A controller: one file, one const instance (adapt_norm.c, ...). */
struct gcomp__adapt_ctl {
    const char *name;
    int order;               /* position in the fixed order above */
    const char *const *keys; /* the option keys it reads, NULL-terminated (for errors) */
    bool needs_measure;      /* candidate errors / codec times */
    bool needs_norm;         /* accumulated gradients */
    /* The base and ladder when the method names neither (NULL: the engine's, and the auto
     * ladder of the base's knob); the first controller in the order that has them wins. */
    const char *default_base, *default_ladder;
    /* Reads its options (gcomp__adapt_opt), allocates its state. */
    gcomp_status (*create)(gcomp_adapt *a, void **state, gcomp_error *err);
    void (*free)(void *state);
    /* Before each decision (NULL: always ready): GCOMP_OK, or the error that stops the
     * decision on every rank alike, for an input the controller needs and lacks. */
    gcomp_status (*check)(const gcomp_adapt *a, const void *state, gcomp_error *err);
    /* Its state in a saved blob (NULL: it keeps none between decisions): save writes it
     * through the cursor (dry when c->w is NULL); load reads the same fields, checks them
     * and, only when `apply`, puts them in place (adapt.c calls every controller's load
     * without apply first, so a blob loads whole or not at all). */
    void (*save)(const gcomp_adapt *a, const void *state, gcomp__adapt_cursor *c);
    gcomp_status (*load)(const gcomp_adapt *a, void *state, gcomp__adapt_cursor *c, bool apply,
                         gcomp_error *err);
    /* Transforms the plan; may update its state (decisions only).  Returns GCOMP_OK, or
     * GCOMP_E_NOMEM: the engine then puts every controller's state back as it was before
     * the decision (from their save and load), so no rank takes half a decision. */
    gcomp_status (*decide)(gcomp_adapt *a, void *state, const gcomp__adapt_in *in,
                           gcomp__adapt_plan *plan);
};

extern const gcomp__adapt_ctl gcomp__adapt_bandwidth;
extern const gcomp__adapt_ctl gcomp__adapt_accuracy;
extern const gcomp__adapt_ctl gcomp__adapt_layers;
extern const gcomp__adapt_ctl gcomp__adapt_norm;

/* The value of option `key` (NULL when absent); marks it read. */
const char *gcomp__adapt_opt(gcomp_adapt *a, const char *key);
/* Option `key` as a number in [lo, hi] (dflt when absent); GCOMP_E_SPEC naming it. */
gcomp_status gcomp__adapt_num(gcomp_adapt *a, const char *ctl, const char *key, double dflt,
                              double lo, double hi, double *out, gcomp_error *err);
/* The same for a count or a 0/1 flag: a whole number in [lo, hi]. */
gcomp_status gcomp__adapt_whole(gcomp_adapt *a, const char *ctl, const char *key, double dflt,
                                double lo, double hi, double *out, gcomp_error *err);
/* Option `key` as one of the words in `words` (NULL-terminated; the first when absent):
 * *out its index; GCOMP_E_SPEC naming it and `expected` (what the words mean). */
gcomp_status gcomp__adapt_word(gcomp_adapt *a, const char *ctl, const char *key,
                               const char *const *words, const char *expected, int *out,
                               gcomp_error *err);
/* GCOMP_E_STATE for a saved controller section whose fields are out of range. */
gcomp_status gcomp__adapt_bad_state(gcomp_error *err, const char *ctl);
/* The level of a ladder item (a knob value or a spec) or -1 with *err filled. */
int gcomp__adapt_find_level(gcomp_adapt *a, const char *item, gcomp_error *err);
/* Sets every managed tensor to `level` and the budget to that level's bytes. */
void gcomp__adapt_plan_uniform(const gcomp_adapt *a, gcomp__adapt_plan *p, int level);

#endif /* GCOMP_ADAPT_INTERNAL_H */

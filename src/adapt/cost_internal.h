/*
 * cost_internal.h - what the cost model's files share (src/adapt/cost*.c): a model is a
 * list of tensors, each reduced at create to its byte count, codec time and the transfer
 * phases of its strategy's traffic law, so that evaluation is arithmetic only.
 */
#ifndef GCOMP_COST_INTERNAL_H
#define GCOMP_COST_INTERNAL_H

#include "core/internal.h"

#include <stdbool.h>

/* How a phase meets the links (cost.c, phase_time). */
enum { PH_RING = 0, PH_SPREAD = 1, PH_INTRA = 2, PH_PS = 3 };

/* One transfer phase of a strategy. */
typedef struct cost_phase {
    unsigned char kind;
    unsigned char leaders; /* runs between node leaders only (hierarchical) */
    unsigned char lane;    /* exchanges started together (a bucket's): each lane's phases run
                              one after another, the lanes side by side on the same link */
    int group;             /* ranks taking part */
    double bytes;          /* bytes this rank sends in it */
    double steps;          /* message latencies it pays, one after the other */
    double server_bytes;   /* PH_PS: bytes one worker makes a server receive and send */
} cost_phase;

#define COST_MAX_PHASES 24

typedef struct cost_tensor {
    char name[64];
    size_t n, rows, cols;
    int strategy;
    double work; /* backward work before the gradient is final (gcomp_cost_tensor.work, or n) */
    double message_bytes, bytes_sent, node_bytes;
    double encode_s, decode_s;
    double hidden_s; /* codec work the strategy does on the worker while its transfer is in
                        flight (zeroing the output for decode-add): beside the link, not
                        after it */
    int calibrated;
    int nphase;
    cost_phase phase[COST_MAX_PHASES];
} cost_tensor;

struct gcomp_cost_model {
    size_t count;
    int workers, nodes;
    double total_work;
    cost_tensor *t;
};

/* The rate for a spec on a tensor of n elements and how close the match is (2 exact, 1
 * same codec, 0 none); the rate is scaled to the spec and interpolated to n
 * (cost_calib.c). */
int gcomp__cost_rate(const gcomp_cost_calibration *cal, const char *canon, size_t n,
                     gcomp_cost_codec_rate *out);
/* fixed + per_elem x m through the medians t at n and t2 at n2 < n, both >= 0.  Where
 * the line through them would cross zero above 0 (the small size ran from the caches,
 * much faster per element), it is the line through (n, t) and the origin instead: the law
 * must give the measured time at the size it was measured at, which a clamped negative
 * intercept did not (it over-predicted n itself). */
void gcomp__cost_fit(size_t n, double t, size_t n2, double t2, double *fixed, double *per_elem);
/* The value of `key` in a canonical spec, or `dflt`. */
double gcomp__cost_spec_num(const char *canon, const char *key, double dflt);
/* `canon` without its seed= item (calibration keys do not depend on the seed). */
void gcomp__cost_seedless(const char *canon, char *out, size_t cap);
gcomp_status gcomp__cost_check_net(const gcomp_cost_net *net, int workers, int nodes);

#endif

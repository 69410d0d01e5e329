/*
 * adapt_bandwidth.c - bandwidth-aware compression: on a slow link compress hard, on a fast
 * one less, down to dense where compression does not pay (the question of Agarwal et al.,
 * "On the utility of gradient compression in distributed training systems", MLSys 2022,
 * answered at run time instead of once).
 *
 * At each decision the cost model (gcomp_cost_eval, src/adapt/cost*.c) predicts the step
 * time of every uniform ladder level, dense included, from what this run measured:
 *   link     the link's payload bandwidth and latency, as the ranks measured them (the
 *            median over ranks; gcomp_adapt_observe_link): the trainer and the Python
 *            optimizer probe it with timed ring steps (gcomp_mpi_link_probe) at the
 *            decisions gcomp_adapt_link_due names: each probe's cost spaces the next, so
 *            that probing takes at most `probe_cost` of the training time (a probe moves
 *            2.8 MB through each link, 2.4 s at 10 Mbit/s), and the decisions between
 *            probes use the last probe's link;
 *   codec    each candidate's encode and decode time measured on the real gradients at
 *            the last measurement (the slowest rank's), as a calibration the model reads;
 *            before the first one, the caller's calibration or the model's default;
 *   compute  forward, backward and optimizer time (the slowest rank's), `overlap`, the
 *            share of the backward pass a transfer can hide behind, and `concurrent`:
 *            every exchange in flight at once (1, gradcomp's buckets) or one after
 *            another (0, gloo's, which the DDP hook passes).
 * A step time is half the question: "per-iteration speed-up must exceed the convergence
 * slowdown" (Agarwal et al.), and the model predicts only the first.  The second enters as
 * a prior, `penalty`: each ladder step heavier than base is taken to cost that share more
 * steps to the same accuracy, each step lighter that share fewer, so level L scores
 * T_L * (1 + penalty)^(L - base), and leaving base must pay for it.  (Measured compression
 * errors do not rank this across codecs: DGC at density 0.001 sends one element in a
 * thousand and on mlp-large was as accurate per step as PowerSGD's rank 4.)
 * It then takes the LIGHTEST level whose score is within `slack` of the best: past the
 * point where the link stops being the bottleneck more compression buys no time and costs
 * accuracy, so among near-equal scores the one that loses least wins.  The level in force
 * stays while its own score is within `slack` of the best: where two levels' scores cross,
 * that is a band instead of a line, which noise would have the setting cross back and
 * forth (on the DDP hook, PowerSGD and top-k scored within 1-8 % of each other for 150
 * steps, and the rule without the band switched twice).  A new level must also come out of
 * `confirm` decisions in a row before it is taken; the first decision with a measured link
 * takes it at once.
 *
 * The default ladder, when the method names neither base nor ladder, spans codecs, because
 * no one codec's knob covers every link: dense where compression does not pay; PowerSGD
 * rank 4 where the link is the bottleneck but not by far (on CPUs it encodes fastest of
 * the compressed codecs, and its all-reduce keeps the bytes a rank sends flat in P);
 * top-k with error feedback and f16 values at 0.001 and 0.0001 where even rank 4 is too
 * much.  Every entry leaves momentum to the caller's optimizer, so no switch crosses the
 * momentum boundary of DGC, which keeps it in the compressor: the trainer and
 * DistributedOptimizer carry the momentum across it (retune.c, gtrain_sgd_release_tensor),
 * but the DDP hook does not own the optimizer and refuses a ladder that crosses it, and
 * the default must serve every front end.  The base is
 * PowerSGD: the setting before the first measured link.  It is sorted by bytes like any
 * ladder, so the order follows the model's shapes.
 *
 * Rejected: a fixed bandwidth threshold per codec (the break-even depends on the model,
 * the worker count and the codec speed of this machine - gcomp_cost_break_even shows it
 * moving by 10x); choosing the fastest level outright (on a fast link every compressed
 * level is "fast" and the heaviest would win by a rounding error).
 */
#include "adapt_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct bw_state {
    double slack, overlap, confirm, penalty;
    int chosen, candidate, streak, concurrent;
    bool have_link;
    double *enc_pe, *dec_pe; /* K: measured seconds per element, NaN before a measurement */
} bw_state;

static const char *const bw_keys[] = {"slack",      "overlap",    "confirm", "penalty",
                                      "probe_cost", "concurrent", NULL};

static void bw_free(void *p) {
    bw_state *s = p;
    if (!s) return;
    gcomp__free(s->enc_pe);
    gcomp__free(s->dec_pe);
    gcomp__free(s);
}

static gcomp_status bw_create(gcomp_adapt *a, void **out, gcomp_error *err) {
    bw_state *s = gcomp__calloc(sizeof *s);
    if (!s) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    *out = s;
    gcomp_status st;
    if ((st = gcomp__adapt_num(a, "bandwidth", "slack", 0.05, 0, 10, &s->slack, err)) ||
        (st = gcomp__adapt_num(a, "bandwidth", "overlap", 0, 0, 1, &s->overlap, err)) ||
        (st = gcomp__adapt_whole(a, "bandwidth", "confirm", 2, 1, 1000, &s->confirm, err)) ||
        (st = gcomp__adapt_num(a, "bandwidth", "penalty", 0.3, 0, 10, &s->penalty, err)) ||
        (st = gcomp__adapt_num(a, "bandwidth", "probe_cost", 0.02, 1e-4, 1, &a->probe_cost, err)))
        return st;
    /* gradcomp's buckets (the trainer, DistributedOptimizer) finish together; the DDP hook
     * passes concurrent=0 (gloo runs a bucket's collectives one after another). */
    static const char *const one_zero[] = {"1", "0", NULL};
    int serial;
    if ((st = gcomp__adapt_word(a, "bandwidth", "concurrent", one_zero,
                                "0 (one exchange at a time) or 1 (all in flight at once)", &serial,
                                err)))
        return st;
    s->concurrent = !serial;
    s->chosen = s->candidate = a->base;
    s->enc_pe = gcomp__alloc((a->K + 1) * sizeof(double));
    s->dec_pe = gcomp__alloc((a->K + 1) * sizeof(double));
    if (!s->enc_pe || !s->dec_pe) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    for (size_t j = 0; j < a->K; j++) s->enc_pe[j] = s->dec_pe[j] = NAN;
    return GCOMP_OK;
}

/* The candidates' measured rates, per element over the managed tensors measured (a tensor
 * no rank measured, NaN, counts neither its time nor its elements). */
static void take_rates(gcomp_adapt *a, bw_state *s, const gcomp__adapt_in *in) {
    if (!in->measured || !in->enc_s) return;
    for (size_t j = 0; j < a->K; j++) {
        double e = 0, d = 0, n = 0;
        for (size_t m = 0; m < a->nm; m++) {
            double em = in->enc_s[m * a->K + j], dm = in->dec_s[m * a->K + j];
            if (!isfinite(em) || !isfinite(dm)) continue;
            e += em;
            d += dm;
            n += (double)a->t[a->mt[m]].n;
        }
        if (isfinite(e) && isfinite(d) && n > 0) {
            s->enc_pe[j] = e / n;
            s->dec_pe[j] = d / n;
        }
    }
}

/* Whether tensor i can share an exchange with others, and what it must share with them. */
static bool fusable(const gcomp_adapt *a, const gcomp_cost_tensor *t, size_t i, bool runs) {
    int base = t->strategy & 0xff; /* hierarchical or not */
    if (!a->exchange[i] || (base != GCOMP_COST_ALLREDUCE && base != GCOMP_COST_ALLGATHER))
        return false;
    gcomp_spec_info info; /* gcomp_mpi sends a PowerSGD tensor a sub-bucket */
    return !runs || gcomp_spec_describe(t->spec, t->n, &info, NULL) != GCOMP_OK ||
           !(info.flags & GCOMP_SPEC_MULTIPHASE);
}

static bool travel_together(const gcomp_cost_tensor *x, const gcomp_cost_tensor *y) {
    return x->strategy == y->strategy &&
           ((x->strategy & 0xff) == GCOMP_COST_ALLGATHER || !strcmp(x->spec, y->spec));
}

/* The caller's exchange groups (gcomp_adapt_set_exchanges) as the cost model's buckets for
 * the specs of one candidate.
 *   run_bytes 0 (the DDP hook's buckets): a group is one bucket of the model.  The tensors
 *     an allreduce sums with one spec travel as one vector (PowerSGD's: each round's
 *     factors in one allreduce), the gathered ones as one allgather, wherever they sit, and
 *     these exchanges start together, as the hook runs them.  (The hook also lets the dense
 *     tensors ride in PowerSGD's first allreduce: here they are an exchange beside it.)
 *   run_bytes > 0 (gcomp_mpi's buckets, gm_groups_plan): only consecutive tensors of one
 *     strategy and spec, in the bucket's order (backward, from the end of the list), cut
 *     before a tensor that would take the run past run_bytes of f32 gradient; PowerSGD's
 *     alone. */
static void exchange_buckets(const gcomp_adapt *a, gcomp_cost_tensor *ct) {
    unsigned next = 1;
    for (size_t i = 0; i < a->nt; i++) ct[i].bucket = 0;
    if (!a->exchange) return;
    if (a->run_bytes) {
        double bytes = 0, cap = (double)a->run_bytes;
        size_t head = 0;
        bool open = false;
        for (size_t i = a->nt; i-- > 0;) {
            double b = 4.0 * (double)ct[i].n;
            if (!fusable(a, &ct[i], i, true)) {
                open = false;
                continue;
            }
            if (open && a->exchange[i] == a->exchange[head] && travel_together(&ct[head], &ct[i]) &&
                bytes + b <= cap) {
                ct[i].bucket = ct[head].bucket;
                bytes += b;
                continue;
            }
            head = i;
            ct[i].bucket = next++;
            bytes = b;
            open = true;
        }
        return;
    }
    for (size_t i = 0; i < a->nt; i++) /* the group is the bucket */
        ct[i].bucket = fusable(a, &ct[i], i, false) ? a->exchange[i] : 0;
}

/* *T: the predicted step of uniform level L; +inf when the model refuses it.  Returns
 * GCOMP_OK, or GCOMP_E_NOMEM. */
static gcomp_status predict(gcomp_adapt *a, bw_state *s, gcomp_cost_calibration *cal,
                            const gcomp_cost_net *net, const gcomp_cost_compute *cc, size_t L,
                            gcomp_cost_tensor *ct, double *T) {
    for (size_t i = 0; i < a->nt; i++) {
        const gcomp__adapt_tensor *t = &a->t[i];
        ct[i] = (gcomp_cost_tensor){.name = t->name,
                                    .spec = t->managed ? a->ladder[L] : t->fixed,
                                    .n = t->n,
                                    .rows = t->rows,
                                    .cols = t->cols,
                                    .strategy = t->managed ? a->strategy[L] : t->fixed_strategy};
    }
    (void)s;
    exchange_buckets(a, ct);
    gcomp_cost_model *cm = NULL;
    gcomp_cost_result r;
    *T = INFINITY;
    gcomp_status st = gcomp_cost_model_create(&cm, ct, a->nt, a->workers, a->nodes, cal, NULL);
    if (st == GCOMP_E_ARG && a->exchange) { /* a group the model cannot fuse: per tensor */
        for (size_t i = 0; i < a->nt; i++) ct[i].bucket = 0;
        st = gcomp_cost_model_create(&cm, ct, a->nt, a->workers, a->nodes, cal, NULL);
    }
    if (st == GCOMP_E_NOMEM) return st;
    if (st == GCOMP_OK && gcomp_cost_eval(cm, net, cc, &r, NULL) == GCOMP_OK) *T = r.step_s;
    gcomp_cost_model_free(cm);
    return GCOMP_OK;
}

static void bw_save(const gcomp_adapt *a, const void *p, gcomp__adapt_cursor *c) {
    const bw_state *s = p;
    gcomp__adapt_w64(c, (uint64_t)s->chosen);
    gcomp__adapt_w64(c, (uint64_t)s->candidate);
    gcomp__adapt_w64(c, (uint64_t)s->streak);
    gcomp__adapt_w64(c, s->have_link);
    for (size_t j = 0; j < a->K; j++) {
        gcomp__adapt_wf(c, s->enc_pe[j]);
        gcomp__adapt_wf(c, s->dec_pe[j]);
    }
}

static gcomp_status bw_load(const gcomp_adapt *a, void *p, gcomp__adapt_cursor *c, bool apply,
                            gcomp_error *err) {
    bw_state *s = p;
    uint64_t chosen = gcomp__adapt_r64(c), candidate = gcomp__adapt_r64(c);
    uint64_t streak = gcomp__adapt_r64(c), have = gcomp__adapt_r64(c);
    /* A streak reaches confirm only to be taken and reset: saved, it is below confirm. */
    if (chosen >= a->K || candidate >= a->K || streak >= (uint64_t)s->confirm || have > 1)
        return gcomp__adapt_bad_state(err, "bandwidth");
    size_t at = c->at;
    for (size_t j = 0; j < a->K; j++) { /* rates: both NaN (not measured) or both >= 0 */
        double e = gcomp__adapt_rf(c), d = gcomp__adapt_rf(c);
        if (!((isnan(e) && isnan(d)) || (isfinite(e) && isfinite(d) && e >= 0 && d >= 0)))
            return gcomp__adapt_bad_state(err, "bandwidth");
    }
    c->at = at;
    if (!apply) return GCOMP_OK;
    s->chosen = (int)chosen;
    s->candidate = (int)candidate;
    s->streak = (int)streak;
    s->have_link = have != 0;
    for (size_t j = 0; j < a->K; j++) {
        s->enc_pe[j] = gcomp__adapt_rf(c);
        s->dec_pe[j] = gcomp__adapt_rf(c);
    }
    return GCOMP_OK;
}

static gcomp_status bw_decide(gcomp_adapt *a, void *p, const gcomp__adapt_in *in,
                              gcomp__adapt_plan *plan) {
    bw_state *s = p;
    take_rates(a, s, in);
    if (in->initial || !(in->bandwidth > 0) || a->nm == 0) {
        gcomp__adapt_plan_uniform(a, plan, s->chosen);
        return GCOMP_OK;
    }
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    net.workers = a->workers;
    net.nodes = a->nodes;
    net.inter.bandwidth = in->bandwidth;
    net.inter.latency = in->latency;
    if (net.nodes == 1) net.intra = net.inter; /* one node: the measured link is the node's */
    gcomp_cost_compute cc = {in->forward_s, in->backward_s, in->optimizer_s, s->overlap,
                             s->concurrent};
    gcomp_cost_calibration *cal = NULL;
    gcomp_cost_tensor *ct = gcomp__alloc(a->nt * sizeof *ct);
    double *T = gcomp__alloc(2 * a->K * sizeof(double)); /* predictions, then scores */
    /* Out of memory ends the decision (the engine restores the state); a rate the
     * calibration refuses is left out, the same on every rank (the rates are all ranks'). */
    gcomp_status st = ct && T ? gcomp_cost_calibration_create(&cal) : GCOMP_E_NOMEM;
    for (size_t i = 0; st == GCOMP_OK && a->cal && i < gcomp_cost_calibration_codecs(a->cal); i++)
        if (gcomp_cost_calibration_add_codec(cal, gcomp_cost_calibration_codec(a->cal, i), NULL) ==
            GCOMP_E_NOMEM)
            st = GCOMP_E_NOMEM;
    for (size_t j = 0; st == GCOMP_OK && j < a->K; j++) {
        if (!isfinite(s->enc_pe[j])) continue;
        gcomp_cost_codec_rate r = {0};
        snprintf(r.spec, sizeof r.spec, "%s", a->ladder[j]);
        r.encode_per_elem = s->enc_pe[j];
        r.decode_per_elem = s->dec_pe[j];
        if (gcomp_cost_calibration_add_codec(cal, &r, NULL) == GCOMP_E_NOMEM) st = GCOMP_E_NOMEM;
    }
    for (size_t L = 0; st == GCOMP_OK && L < a->K; L++)
        st = predict(a, s, cal, &net, &cc, L, ct, &T[L]);
    bool ok = st == GCOMP_OK;
    int target = s->chosen;
    double best = INFINITY, *score = T ? T + a->K : NULL;
    if (ok) {
        for (size_t L = 0; L < a->K; L++) {
            a->pred[L] = T[L]; /* gcomp_adapt_predicted: why it chose what it chose */
            score[L] = T[L] * pow(1 + s->penalty, (double)L - (double)a->base);
            best = score[L] < best ? score[L] : best;
        }
        if (isfinite(best)) {
            for (size_t L = 0; L < a->K; L++)
                if (score[L] <= (1 + s->slack) * best) {
                    target = (int)L; /* the lightest within slack */
                    break;
                }
            if (s->have_link && score[s->chosen] <= (1 + s->slack) * best)
                target = s->chosen; /* within the band: it stays */
            if (!s->have_link) {
                s->chosen = target;
                s->streak = 0;
            } else if (target == s->chosen) {
                s->streak = 0;
            } else {
                s->streak = target == s->candidate ? s->streak + 1 : 1;
                s->candidate = target;
                if (s->streak >= (int)s->confirm) {
                    s->chosen = target;
                    s->streak = 0;
                }
            }
            s->have_link = true;
        }
    }
    gcomp__adapt_plan_uniform(a, plan, s->chosen);
    if (ok && isfinite(best)) plan->pred_s = T[s->chosen];
    gcomp_cost_calibration_free(cal);
    gcomp__free(ct);
    gcomp__free(T);
    return st;
}

const gcomp__adapt_ctl gcomp__adapt_bandwidth = {
    .name = "bandwidth",
    .order = 0,
    .keys = bw_keys,
    .needs_measure = true,
    .default_base = "powersgd:rank=4",
    .default_ladder = "dense/powersgd:rank=4/topk:density=0.001,values=f16,feedback=ef/"
                      "topk:density=0.0001,values=f16,feedback=ef",
    .create = bw_create,
    .free = bw_free,
    .save = bw_save,
    .load = bw_load,
    .decide = bw_decide,
};

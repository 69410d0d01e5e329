/*
 * cost_laws.c - each strategy's traffic law and codec work, one component per strategy in
 * a const table (as the MPI layer's strategies are), turned at model creation into the
 * bytes gcomp_mpi_stats counts, the transfer phases gcomp_cost_eval times and the codec
 * seconds from the calibration.
 *
 * Bytes per rank and step, for a group of G ranks (G = P, or the nodes for hierarchical),
 * m one message of the whole tensor (gcomp_spec_bytes_estimate), c_j the message of chunk
 * j (elements [jn/G, (j+1)n/G)), 8-byte size words:
 *   allreduce  2(G-1)/G x S, S the values summed: n x width for `none`, k x width for
 *              random-k; packs under 256 KiB go through MPI_Iallreduce and
 *              carry 24 check bytes; the time law is the ring's 2(G-1) steps above that,
 *              below it Open MPI's (libnbc's) for an in-place MPI_Iallreduce, which is a
 *              binomial reduce to one rank and a binomial broadcast back whatever the size:
 *              2 log2 G steps of the whole S (on netsim with 5 ms each way, 1 KiB took
 *              10.3 ms on 2 ranks and 20.6 ms on 4).  A pack over 32 KiB goes as s
 *              slices (at most 16) in flight at once: the root's link then carries
 *              log2 G x S each way, the broadcast of one slice beside the reduction of the
 *              next, so (1 + 1/s) log2 G x S on the wire where one pack takes 2 log2 G x S
 *   powersgd   per power iteration, allreduces of rows x r and cols x r values (+ check
 *              words; MPI_Iallreduce, as above), or a dense allreduce on the dense steps the
 *              codec takes
 *   allgather  8(G-1) + (G-1) m                                  (grows with G)
 *              in two exchanges (the lengths, then the messages), or one with
 *              GCOMP_COST_ONE_EXCHANGE (the lengths in front, padded to the bound m)
 *   sparse     16(G-1) + (G-1) s + (G-1) o, s a region's slice: k/G (gap varint, value)
 *              pairs, or the region dense once that is smaller (the fill-in), o the
 *              owner's message of a region (Renggli et al. 2019; Li & Hoefler 2022)
 *   rsag       16(G-1) + 2 (G-1)/G sum_j c_j  (on average over ranks; Tang et al. 2021)
 *   ps         push m to S servers, pull 4n (or m): the worker NIC carries m and the pull,
 *              each server's NIC P/S of every worker's (Li et al. 2014; Jiang et al. 2020)
 *   hierarchical  a binomial tree inside the node (ceil(log2 L) rounds of 4n each way on
 *              the leader), then the strategy between the node leaders
 * Codec seconds per rank (e(x), d(x): encode and decode-add of x elements):
 *   allreduce e(n) + d(n) (pack and unpack), powersgd e(n) (its whole local protocol),
 *   allgather e(n) + G d(n), sparse e(n) + 2 d(n) + e(n/G) + G d(n/G),
 *   rsag G e(n/G) + e(n/G) + 2G d(n/G), ps e(n) (+ d(n) when the pull is compressed).
 */
#include "cost_internal.h"
#include "common/mpi_wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct law_in {
    const gcomp_cost_tensor *t;
    const char *canon;
    const gcomp_codec_info *ci;
    int G;       /* ranks that exchange */
    int leaders; /* between node leaders */
    double m;    /* one message of the whole tensor */
    gcomp_cost_codec_rate rate;
    double stream_s; /* one pass of 4 bytes per element over a dense tensor, per element */
    gcomp_error *err;
} law_in;

static double ring_bytes(double bytes, int G) {
    return G > 1 ? floor(2.0 * (G - 1) / G * bytes) : 0;
}

static int log2up(int G) {
    int r = 0;
    while ((1 << r) < G) r++;
    return r;
}

static double enc(const law_in *in, double n) {
    return n > 0 ? in->rate.encode_fixed_s + in->rate.encode_per_elem * n : 0;
}

static double dec(const law_in *in, double n) {
    return n > 0 ? in->rate.decode_fixed_s + in->rate.decode_per_elem * n : 0;
}

static void add_phase(cost_tensor *ct, int kind, int group, double bytes, double steps,
                      int leaders) {
    if (ct->nphase == COST_MAX_PHASES || group < 2) return;
    cost_phase *p = &ct->phase[ct->nphase++];
    memset(p, 0, sizeof *p);
    p->kind = (unsigned char)kind;
    p->leaders = (unsigned char)leaders;
    p->group = group;
    p->bytes = bytes;
    p->steps = steps;
}

static gcomp_status estimate(const law_in *in, size_t n, size_t rows, size_t cols, double *out) {
    size_t b = 0;
    gcomp_status st = gcomp_spec_bytes_estimate(in->t->spec, n, rows, cols, &b, in->err);
    *out = (double)b;
    return st;
}

/* A pack of S value bytes (+ its check words) through MPI_Iallreduce: libnbc's binomial
 * reduce and broadcast, the pack in slices (gm_start_pack_reduce). */
static void pack_reduce(cost_tensor *ct, const law_in *in, double S, double check) {
    int G = in->G, L = log2up(G);
    if (G < 2) return;
    double slices = S > (double)GM_SLICE_BYTES
                        ? fmin(ceil(S / (double)GM_SLICE_BYTES), (double)GM_SLICES_MAX)
                        : 1;
    ct->bytes_sent += ring_bytes(S + check, G);
    add_phase(ct, PH_RING, G, L * (S + check) * (1 + 1 / slices), 2 * L, in->leaders);
}

/* An allreduce of S value bytes (+ check words below the ring's size): bytes and time. */
static void allreduce_values(cost_tensor *ct, const law_in *in, double S, double check) {
    int G = in->G;
    if (G < 2) return;
    if (S >= (double)GM_RING_MIN_BYTES) {
        ct->bytes_sent += 2.0 * (G - 1) / G * S;
        add_phase(ct, PH_RING, G, 2.0 * (G - 1) / G * S, 2.0 * (G - 1), in->leaders);
    } else {
        pack_reduce(ct, in, S, check);
    }
}

/* Bytes a kept value takes when it travels as a plain float (f16/bf16: 2), else 4. */
static double value_width(const char *canon) {
    gcomp_spec_info info;
    if (gcomp_spec_describe(canon, 0, &info, NULL) != GCOMP_OK) return 4;
    return info.value_type == GCOMP_VALUES_F16 || info.value_type == GCOMP_VALUES_BF16 ? 2 : 4;
}

/* Expected bytes of a varint (7 bits a byte) of a gap between k uniformly scattered
 * positions in n: the gap is geometric with p = k/n. */
static double varint_bytes(double k, double n) {
    if (k <= 0 || n <= 0) return 1;
    double p = k / n < 1 ? k / n : 1, q = 1 - p, e = 1;
    for (int b = 7; b <= 28; b += 7) e += pow(q, ldexp(1.0, b));
    return e;
}

/* The elements a sparse codec keeps: k = density x n, at least min_k (dense codecs: all
 * of them). */
static double kept(const law_in *in) {
    double n = (double)in->t->n;
    if (!(in->ci->flags & GCOMP_CODEC_SPARSE)) return n;
    double d = gcomp__cost_spec_num(in->canon, "density", 1);
    double k = ceil(d * n), floor_k = gcomp__cost_spec_num(in->canon, "min_k", 0);
    if (k < floor_k) k = floor_k;
    return k < 1 ? 1 : k > n ? n : k;
}

static gcomp_status law_allreduce(cost_tensor *ct, const law_in *in) {
    const gcomp_cost_tensor *t = in->t;
    double w = value_width(in->canon), n = (double)t->n;
    if (in->ci->flags & GCOMP_CODEC_MULTIPHASE) {
        /* PowerSGD (src/lowrank/powersgd.c): dense steps for vectors and where the
         * factors would not compress (rows+cols) r * min_compression_rate >= rows cols. */
        double r = gcomp__cost_spec_num(in->canon, "rank", 1);
        double iters = gcomp__cost_spec_num(in->canon, "iters", 1);
        double mcr = gcomp__cost_spec_num(in->canon, "min_compression_rate", 2);
        double R = (double)t->rows, C = (double)t->cols;
        if (r > R) r = R;
        if (r > C) r = C;
        bool dense = t->rows == 0 || t->cols == 0 || (R + C) * r * mcr >= R * C;
        if (dense) {
            ct->message_bytes = n * w;
            allreduce_values(ct, in, n * w, 24);
            ct->encode_s = 0;
            ct->decode_s = 0;
            return GCOMP_OK;
        }
        ct->message_bytes = iters * (R + C) * r * w;
        /* The factors go through MPI_Iallreduce whatever their size (mpi_lowrank.c). */
        for (int k = 0; k < (int)iters; k++) {
            pack_reduce(ct, in, R * r * w, k == 0 ? 24 : 8);
            pack_reduce(ct, in, C * r * w, 8);
        }
        /* Encode forms P = MQ and Q = M^T P; decode writes M ~ P Q^T into the output. */
        ct->encode_s = enc(in, n);
        ct->decode_s = dec(in, n);
        return GCOMP_OK;
    }
    if (!(in->ci->flags & GCOMP_CODEC_LINEAR))
        return gcomp__fail(in->err, GCOMP_E_UNSUPPORTED,
                           "cost model: tensor '%s': allreduce needs a codec that sums linearly "
                           "(%s does not)",
                           ct->name, in->ci->name);
    /* The sum runs over the values the message carries: all n for `none`, k = density x n
     * for random-k (its positions come from the seed and never travel). */
    double S = kept(in) * w;
    ct->message_bytes = S;
    allreduce_values(ct, in, S, 24);
    ct->encode_s = enc(in, n);
    ct->decode_s = dec(in, n);
    return GCOMP_OK;
}

static gcomp_status law_allgather(cost_tensor *ct, const law_in *in) {
    int G = in->G;
    double n = (double)in->t->n;
    ct->message_bytes = in->m;
    if (G > 1) {
        ct->bytes_sent += 8.0 * (G - 1) + (G - 1) * in->m;
        if (in->t->strategy & GCOMP_COST_ONE_EXCHANGE) {
            add_phase(ct, PH_SPREAD, G, (G - 1) * (8.0 + in->m), log2up(G), in->leaders);
        } else {
            add_phase(ct, PH_SPREAD, G, 8.0 * (G - 1), log2up(G), in->leaders);
            add_phase(ct, PH_SPREAD, G, (G - 1) * in->m, log2up(G), in->leaders);
        }
    }
    ct->encode_s = enc(in, n);
    /* Decode-add of the G messages into the output, which the strategy zeroes while the
     * messages travel (a write pass) and checks for an overflowed sum after (a read pass):
     * mpi_allgather.c. */
    double pass = in->stream_s * n;
    ct->decode_s = G * dec(in, n) + (G > 1 ? pass : 2 * pass);
    ct->hidden_s = G > 1 ? pass : 0;
    return GCOMP_OK;
}

static gcomp_status law_sparse(cost_tensor *ct, const law_in *in) {
    int G = in->G;
    double n = (double)in->t->n, k = kept(in);
    ct->message_bytes = in->m;
    double region = n / G, per = k / G;
    double vw = value_width(in->canon);
    double slice = fmin(GM_SLICE_HDR + per * (varint_bytes(k, n) + vw), GM_SLICE_HDR + 4 * region);
    double owner = 0;
    gcomp_status st = estimate(in, (size_t)ceil(region), 0, 0, &owner);
    if (st != GCOMP_OK) return st;
    if (G > 1) {
        ct->bytes_sent += 16.0 * (G - 1) + (G - 1) * slice + (G - 1) * owner;
        add_phase(ct, PH_SPREAD, G, 8.0 * (G - 1), 1, in->leaders);
        add_phase(ct, PH_SPREAD, G, (G - 1) * slice, 1, in->leaders);
        add_phase(ct, PH_SPREAD, G, 8.0 * (G - 1), log2up(G), in->leaders);
        add_phase(ct, PH_SPREAD, G, (G - 1) * owner, log2up(G), in->leaders);
    }
    ct->encode_s = enc(in, n) + enc(in, region);
    ct->decode_s = 2 * dec(in, n) + G * dec(in, region);
    return GCOMP_OK;
}

static gcomp_status law_rsag(cost_tensor *ct, const law_in *in) {
    int G = in->G;
    size_t n = in->t->n, lo = n / (size_t)G, nhi = n % (size_t)G;
    double c_lo = 0, c_hi = 0;
    gcomp_status st = lo ? estimate(in, lo, 0, 0, &c_lo) : GCOMP_OK;
    if (st == GCOMP_OK && nhi) st = estimate(in, lo + 1, 0, 0, &c_hi);
    if (st != GCOMP_OK) return st;
    /* Chunk j holds floor((j+1)n/G) - floor(jn/G) elements: n mod G of them one more. */
    double sum = (double)((size_t)G - nhi) * c_lo + (double)nhi * c_hi;
    ct->message_bytes = sum;
    if (G > 1) {
        double half = (G - 1.0) / G * sum;
        ct->bytes_sent += 16.0 * (G - 1) + 2 * half;
        add_phase(ct, PH_SPREAD, G, 8.0 * (G - 1), 1, in->leaders);
        add_phase(ct, PH_SPREAD, G, half, 1, in->leaders);
        add_phase(ct, PH_SPREAD, G, 8.0 * (G - 1), log2up(G), in->leaders);
        add_phase(ct, PH_SPREAD, G, half, log2up(G), in->leaders);
    }
    double chunk = (double)n / G;
    ct->encode_s = G * enc(in, chunk) + enc(in, chunk);
    ct->decode_s = 2 * G * dec(in, chunk);
    return GCOMP_OK;
}

/* The parameter server's law, for issue #13's strategy (not in the MPI layer yet, so no
 * byte counter checks it): the worker pushes its message, split over the S servers, and
 * pulls the result; a server receives P/S workers' shares and sends as much back. */
static gcomp_status law_ps(cost_tensor *ct, const law_in *in, int pull_dense) {
    double n = (double)in->t->n, pull = pull_dense ? 4 * n : in->m;
    ct->message_bytes = in->m;
    ct->bytes_sent = in->m;
    if (ct->nphase < COST_MAX_PHASES && in->G > 1) {
        cost_phase *p = &ct->phase[ct->nphase++];
        memset(p, 0, sizeof *p);
        p->kind = PH_PS;
        p->group = in->G;
        p->bytes = fmax(in->m, pull);
        p->server_bytes = fmax(in->m, pull);
        p->steps = 2;
        p->leaders = (unsigned char)in->leaders;
    }
    ct->encode_s = enc(in, n);
    ct->decode_s = pull_dense ? 0 : dec(in, n);
    return GCOMP_OK;
}

static gcomp_status law_ps_dense(cost_tensor *ct, const law_in *in) {
    return law_ps(ct, in, 1);
}

static gcomp_status law_ps_compressed(cost_tensor *ct, const law_in *in) {
    return law_ps(ct, in, 0);
}

/* The strategy table: one line per strategy, numbered as gcomp_mpi_strategy. */
typedef gcomp_status (*law_fn)(cost_tensor *, const law_in *);
static const struct {
    int id;
    const char *name;
    law_fn fn;
} laws[] = {
    {GCOMP_COST_ALLGATHER, "allgather", law_allgather},
    {GCOMP_COST_SPARSE, "sparse", law_sparse},
    {GCOMP_COST_ALLREDUCE, "allreduce", law_allreduce},
    {GCOMP_COST_RSAG, "rsag", law_rsag},
    {GCOMP_COST_PS, "ps", law_ps_dense},
    {GCOMP_COST_PS_COMPRESSED, "ps-compressed", law_ps_compressed},
};

static bool known_strategy(int s) {
    int base = s & 0xff;
    if (s & ~(GCOMP_COST_HIERARCHICAL | GCOMP_COST_ONE_EXCHANGE | 0xff)) return false;
    if ((s & GCOMP_COST_ONE_EXCHANGE) && base != GCOMP_COST_ALLGATHER) return false;
    for (size_t i = 0; i < sizeof laws / sizeof laws[0]; i++)
        if (laws[i].id == base) return true;
    return false;
}

static gcomp_status build_tensor(cost_tensor *ct, const gcomp_cost_tensor *t, size_t idx, int P,
                                 int nodes, const gcomp_cost_calibration *cal, gcomp_error *err) {
    memset(ct, 0, sizeof *ct);
    snprintf(ct->name, sizeof ct->name, "%s", t->name ? t->name : "");
    if (!ct->name[0]) snprintf(ct->name, sizeof ct->name, "#%zu", idx);
    if (!t->spec)
        return gcomp__fail(err, GCOMP_E_ARG, "cost model: tensor '%s': NULL spec", ct->name);
    if (t->n == 0)
        return gcomp__fail(err, GCOMP_E_ARG, "cost model: tensor '%s' has 0 elements", ct->name);
    if (!gcomp__shape_holds(t->n, t->rows, t->cols))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "cost model: tensor '%s': shape %zux%zu does not hold %zu elements",
                           ct->name, t->rows, t->cols, t->n);
    if (!known_strategy(t->strategy))
        return gcomp__fail(
            err, GCOMP_E_ARG,
            "cost model: tensor '%s': strategy %d is not one of allgather (1), "
            "sparse (2), allreduce (3), rsag (4), ps (5), ps-compressed (6), optionally | "
            "hierarchical (0x100), allgather also | one-exchange (0x200); auto (0) must be "
            "resolved first "
            "(gcomp_mpi_strategy_auto)",
            ct->name, t->strategy);
    ct->n = t->n;
    ct->rows = t->rows;
    ct->cols = t->cols;
    ct->strategy = t->strategy;
    char canon[GCOMP__SPEC_MAX], name[64];
    gcomp_error local = {0};
    gcomp_status st = gcomp_spec_canonical(t->spec, canon, sizeof canon, NULL, &local);
    if (st != GCOMP_OK)
        return gcomp__fail(err, st, "cost model: tensor '%s': %s", ct->name, local.message);
    snprintf(name, sizeof name, "%.*s", (int)strcspn(canon, ":"), canon);
    law_in in = {0};
    in.t = t;
    in.canon = canon;
    in.ci = gcomp_codec_find(name);
    in.err = &local;
    if (!in.ci) return gcomp__fail(err, GCOMP_E_UNKNOWN_CODEC, "cost model: codec '%s'", name);
    size_t m = 0;
    st = gcomp_spec_bytes_estimate(t->spec, t->n, t->rows, t->cols, &m, &local);
    if (st != GCOMP_OK)
        return gcomp__fail(err, st, "cost model: tensor '%s': %s", ct->name, local.message);
    in.m = (double)m;
    ct->calibrated = gcomp__cost_rate(cal, canon, t->n, &in.rate);
    /* A pass of the strategy's own over the dense output (zeroing, a finiteness check)
     * moves one stream of 4-byte values; a dense decode-add moves three (message in,
     * accumulator in and out), so a stream costs a third of none:values=f32's decode. */
    gcomp_cost_codec_rate none;
    gcomp__cost_rate(cal, "none:values=f32", t->n, &none);
    in.stream_s = none.decode_per_elem / 3;

    bool hier = (t->strategy & GCOMP_COST_HIERARCHICAL) != 0;
    int L = (P + nodes - 1) / nodes, base = t->strategy & 0xff;
    in.G = hier ? nodes : P;
    in.leaders = hier;
    double intra_add = 0;
    if (hier && L > 1) {
        /* The leader receives ceil(log2 L) partial sums and sends the result back down. */
        int r = log2up(L);
        double n = (double)t->n;
        add_phase(ct, PH_INTRA, L, r * 4 * n, r, 0);
        ct->node_bytes = 2.0 * r * 4 * n;
        intra_add = r * (3 * in.stream_s * n); /* a dense decode-add per partial sum */
    }
    if (hier && nodes == 1) { /* one node: the leader's dense sum is the result */
        ct->message_bytes = (double)m;
        if (L > 1) add_phase(ct, PH_INTRA, L, log2up(L) * 4.0 * (double)t->n, log2up(L), 0);
        ct->decode_s = intra_add;
        return GCOMP_OK;
    }
    for (size_t i = 0; i < sizeof laws / sizeof laws[0]; i++)
        if (laws[i].id == base) st = laws[i].fn(ct, &in);
    if (st != GCOMP_OK) {
        if (st == GCOMP_E_UNSUPPORTED) return gcomp__fail(err, st, "%s", local.message);
        return gcomp__fail(err, st, "cost model: tensor '%s': %s", ct->name, local.message);
    }
    if (hier && L > 1) {
        add_phase(ct, PH_INTRA, L, log2up(L) * 4.0 * (double)t->n, log2up(L), 0);
        ct->decode_s += intra_add;
    }
    return GCOMP_OK;
}

/* Clears bucket member j after its bucket's figures moved to the carrier: it keeps its own
 * name, shape and work (its place in the backward pass), nothing to send. */
static void clear_member(cost_tensor *t, int calibrated) {
    cost_tensor keep = *t;
    memset(t, 0, sizeof *t);
    memcpy(t->name, keep.name, sizeof keep.name);
    t->n = keep.n;
    t->rows = keep.rows;
    t->cols = keep.cols;
    t->work = keep.work;
    t->strategy = keep.strategy;
    t->calibrated = calibrated;
}

/* Sums the members at[1..cnt) into the carrier at[0]: bytes, codec time, and each transfer
 * phase's bytes with the latencies paid once.  The members' phases must line up: the same
 * phases (one strategy and group), except that a PowerSGD tensor the codec sends dense (one
 * allreduce) rides in the first factor allreduce, as the DDP hook sends it, priced by that
 * allreduce's law (steps x its values).  The phases are those of the member with the most. */
static gcomp_status sum_members(cost_tensor *t, const gcomp_cost_tensor *in, const size_t *at,
                                size_t cnt, gcomp_error *err) {
    size_t tmpl = at[0];
    for (size_t k = 1; k < cnt; k++)
        if (t[at[k]].nphase > t[tmpl].nphase) tmpl = at[k];
    cost_tensor sum = t[at[0]];
    sum.nphase = t[tmpl].nphase;
    memcpy(sum.phase, t[tmpl].phase, sizeof sum.phase);
    for (int p = 0; p < sum.nphase; p++) sum.phase[p].bytes = sum.phase[p].server_bytes = 0;
    sum.message_bytes = sum.bytes_sent = sum.node_bytes = sum.encode_s = sum.decode_s = 0;
    sum.hidden_s = 0;
    bool hier = (in[at[0]].strategy & GCOMP_COST_HIERARCHICAL) != 0;
    for (size_t k = 0; k < cnt; k++) {
        const cost_tensor *o = &t[at[k]];
        bool same = o->nphase == sum.nphase;
        for (int p = 0; same && p < o->nphase; p++) same = o->phase[p].kind == sum.phase[p].kind;
        if (!same && !(o->nphase == 1 && !hier))
            return gcomp__fail(err, GCOMP_E_ARG,
                               "cost model: tensor '%s': bucket %u: its transfers do not line up "
                               "with those of '%s' (%s)",
                               o->name, in[at[0]].bucket, t[tmpl].name, in[at[0]].spec);
        if (same) {
            for (int p = 0; p < o->nphase; p++) {
                sum.phase[p].bytes += o->phase[p].bytes;
                sum.phase[p].server_bytes += o->phase[p].server_bytes;
            }
        } else {
            sum.phase[0].bytes += sum.phase[0].steps * o->message_bytes;
        }
        sum.message_bytes += o->message_bytes;
        sum.bytes_sent += o->bytes_sent;
        sum.node_bytes += o->node_bytes;
        sum.encode_s += o->encode_s;
        sum.decode_s += o->decode_s;
        sum.hidden_s += o->hidden_s;
        if (o->calibrated < sum.calibrated) sum.calibrated = o->calibrated;
    }
    t[at[0]] = sum;
    for (size_t k = 1; k < cnt; k++) clear_member(&t[at[k]], sum.calibrated);
    return GCOMP_OK;
}

/* Tensors at[0..cnt) (ascending) of one bucket and one exchange (one strategy; under
 * allreduce one spec) travel together, carried by at[0], the last of them to become final
 * (backward runs from the end of the list).
 *   allreduce  one vector of all their elements, so they must share the spec: the law of
 *              the whole;
 *   powersgd   (allreduce of a multi-phase spec, one spec) each round's factors of all of
 *              them in one allreduce of P and one of Q, as the DDP hook sends a bucket;
 *   allgather  their messages back to back in one allgather, the length table in front
 *              (gcomp_mpi's sub-buckets, the DDP hook's gather path), so specs may differ.
 * The last two: the members' bytes and codec times add up, the latencies are paid once. */
static gcomp_status fuse_exchange(cost_tensor *t, const gcomp_cost_tensor *in, const size_t *at,
                                  size_t cnt, int P, int nodes, const gcomp_cost_calibration *cal,
                                  gcomp_error *err) {
    size_t i = at[0], n = 0;
    for (size_t k = 0; k < cnt; k++) n += in[at[k]].n;
    if ((in[i].strategy & 0xff) == GCOMP_COST_ALLGATHER) return sum_members(t, in, at, cnt, err);
    gcomp_spec_info info;
    gcomp_error local = {0};
    if (gcomp_spec_describe(in[i].spec, n, &info, &local) != GCOMP_OK)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "cost model: tensor '%s': bucket %u as one vector of %zu elements: %s",
                           t[i].name, in[i].bucket, n, local.message);
    /* PowerSGD: factors to sum, unless every member goes dense (vectors, matrices too small
     * to compress): then it is one vector, as below. */
    bool factors = false;
    for (size_t k = 0; k < cnt; k++) factors |= t[at[k]].nphase > 1;
    if ((info.flags & GCOMP_SPEC_MULTIPHASE) && factors) return sum_members(t, in, at, cnt, err);
    gcomp_cost_tensor whole = in[i];
    whole.n = n;
    whole.rows = whole.cols = 0;
    cost_tensor fused;
    gcomp_status st = build_tensor(&fused, &whole, i, P, nodes, cal, err);
    if (st != GCOMP_OK) return st;
    memcpy(fused.name, t[i].name, sizeof fused.name); /* keep the carrier's name and shape */
    fused.n = t[i].n;
    fused.rows = t[i].rows;
    fused.cols = t[i].cols;
    fused.work = t[i].work;
    t[i] = fused;
    for (size_t k = 1; k < cnt; k++) clear_member(&t[at[k]], fused.calibrated);
    return GCOMP_OK;
}

/* Moves the carriers c[1..lanes) of a bucket's other exchanges onto c[0], each exchange's
 * phases in a lane of its own: they start together and share the link. */
static gcomp_status merge_lanes(cost_tensor *t, const size_t *c, size_t lanes, unsigned id,
                                gcomp_error *err) {
    cost_tensor *to = &t[c[0]];
    unsigned char lane = 0;
    for (size_t e = 1; e < lanes; e++) {
        const cost_tensor *o = &t[c[e]];
        if (to->nphase + o->nphase > COST_MAX_PHASES)
            return gcomp__fail(err, GCOMP_E_ARG,
                               "cost model: tensor '%s': bucket %u: more than %d transfers to "
                               "price in one bucket",
                               o->name, id, COST_MAX_PHASES);
        if (o->nphase && to->nphase) lane++;
        for (int p = 0; p < o->nphase; p++) {
            to->phase[to->nphase] = o->phase[p];
            to->phase[to->nphase++].lane = lane;
        }
        to->message_bytes += o->message_bytes;
        to->bytes_sent += o->bytes_sent;
        to->node_bytes += o->node_bytes;
        to->encode_s += o->encode_s;
        to->decode_s += o->decode_s;
        to->hidden_s += o->hidden_s;
        if (o->calibrated < to->calibrated) to->calibrated = o->calibrated;
    }
    for (size_t e = 1; e < lanes; e++) clear_member(&t[c[e]], to->calibrated);
    return GCOMP_OK;
}

/* Tensors at[0..cnt) (ascending) share a bucket id.  Those of one strategy (and under
 * allreduce one spec) make one exchange (fuse_exchange); a bucket's exchanges start
 * together once the last of its members is final, and at[0] carries them all. */
static gcomp_status fuse_bucket(cost_tensor *t, const gcomp_cost_tensor *in, const size_t *at,
                                size_t cnt, int P, int nodes, const gcomp_cost_calibration *cal,
                                gcomp_error *err) {
    for (size_t k = 0; k < cnt; k++) {
        const gcomp_cost_tensor *x = &in[at[k]];
        int base = x->strategy & 0xff;
        if (base != GCOMP_COST_ALLREDUCE && base != GCOMP_COST_ALLGATHER)
            return gcomp__fail(err, GCOMP_E_ARG,
                               "cost model: tensor '%s': bucket %u: only tensors reduced by "
                               "allreduce or gathered by allgather can share an exchange ('%s', "
                               "strategy %d)",
                               t[at[k]].name, x->bucket, x->spec, x->strategy);
    }
    /* The canonical specs (build_tensor has accepted each), the exchanges' members. */
    char *canon = gcomp__alloc(cnt * GCOMP__SPEC_MAX);
    size_t *sub = gcomp__alloc(2 * cnt * sizeof *sub), *carrier = sub + cnt;
    bool *taken = gcomp__calloc(cnt * sizeof *taken);
    gcomp_status st = canon && sub && taken
                          ? GCOMP_OK
                          : gcomp__fail(err, GCOMP_E_NOMEM, "cost model: out of memory");
    for (size_t k = 0; st == GCOMP_OK && k < cnt; k++)
        if (gcomp_spec_canonical(in[at[k]].spec, canon + k * GCOMP__SPEC_MAX, GCOMP__SPEC_MAX, NULL,
                                 NULL) != GCOMP_OK)
            canon[k * GCOMP__SPEC_MAX] = 0;
    size_t lanes = 0;
    for (size_t k = 0; st == GCOMP_OK && k < cnt; k++) {
        if (taken[k]) continue;
        const gcomp_cost_tensor *x = &in[at[k]];
        size_t m = 0;
        for (size_t j = k; j < cnt; j++) {
            const gcomp_cost_tensor *y = &in[at[j]];
            if (taken[j] || y->strategy != x->strategy ||
                ((x->strategy & 0xff) == GCOMP_COST_ALLREDUCE &&
                 strcmp(canon + j * GCOMP__SPEC_MAX, canon + k * GCOMP__SPEC_MAX)))
                continue;
            taken[j] = true;
            sub[m++] = at[j];
        }
        carrier[lanes++] = sub[0];
        if (m > 1) st = fuse_exchange(t, in, sub, m, P, nodes, cal, err);
    }
    if (st == GCOMP_OK && lanes > 1) st = merge_lanes(t, carrier, lanes, in[at[0]].bucket, err);
    gcomp__free(canon);
    gcomp__free(sub);
    gcomp__free(taken);
    return st;
}

/* A tensor's bucket and place, sorted so that each bucket's members form a run, ascending. */
typedef struct member {
    unsigned id;
    size_t at;
} member;

static int by_bucket(const void *x, const void *y) {
    const member *a = x, *b = y;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

gcomp_status gcomp_cost_model_create(gcomp_cost_model **out, const gcomp_cost_tensor *tensors,
                                     size_t count, int workers, int nodes,
                                     const gcomp_cost_calibration *cal, gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "cost model: out must not be NULL");
    *out = NULL;
    if (!tensors || count == 0) return gcomp__fail(err, GCOMP_E_ARG, "cost model: no tensors");
    if (workers < 1)
        return gcomp__fail(err, GCOMP_E_ARG, "cost model: workers %d: must be >= 1", workers);
    if (nodes < 1 || nodes > workers)
        return gcomp__fail(err, GCOMP_E_ARG, "cost model: nodes %d: must be 1..workers (%d)", nodes,
                           workers);
    gcomp_cost_model *m = gcomp__calloc(sizeof *m);
    cost_tensor *t = m ? gcomp__calloc(count * sizeof *t) : NULL;
    if (!t) {
        gcomp__free(m);
        return gcomp__fail(err, GCOMP_E_NOMEM, "cost model: out of memory");
    }
    m->t = t;
    m->count = count;
    m->workers = workers;
    m->nodes = nodes;
    bool given = false; /* any tensor's work: then every tensor's, zeros included */
    for (size_t i = 0; i < count; i++) given |= tensors[i].work != 0;
    for (size_t i = 0; i < count; i++) {
        gcomp_status st = build_tensor(&t[i], &tensors[i], i, workers, nodes, cal, err);
        double w = tensors[i].work;
        if (st == GCOMP_OK && !(w >= 0 && w < INFINITY))
            st = gcomp__fail(err, GCOMP_E_ARG,
                             "cost model: tensor '%s': work %g: must be finite and >= 0", t[i].name,
                             w);
        if (st != GCOMP_OK) {
            gcomp_cost_model_free(m);
            return st;
        }
        t[i].work = given ? w : (double)t[i].n;
        m->total_work += t[i].work;
    }
    /* Buckets: each id's members, wherever they sit in the list (DDP's buckets follow the
     * order gradients became ready, and a bucket's routes interleave). */
    member *order = gcomp__alloc(count * sizeof *order);
    size_t *at = gcomp__alloc(count * sizeof *at);
    gcomp_status st =
        order && at ? GCOMP_OK : gcomp__fail(err, GCOMP_E_NOMEM, "cost model: out of memory");
    for (size_t i = 0; st == GCOMP_OK && i < count; i++) order[i] = (member){tensors[i].bucket, i};
    if (st == GCOMP_OK) qsort(order, count, sizeof *order, by_bucket);
    for (size_t a = 0, e; st == GCOMP_OK && a < count; a = e) {
        for (e = a + 1; e < count && order[e].id == order[a].id; e++) continue;
        if (!order[a].id || e - a < 2) continue;
        for (size_t k = a; k < e; k++) at[k - a] = order[k].at;
        st = fuse_bucket(t, tensors, at, e - a, workers, nodes, cal, err);
    }
    gcomp__free(order);
    gcomp__free(at);
    if (st != GCOMP_OK) {
        gcomp_cost_model_free(m);
        return st;
    }
    *out = m;
    return GCOMP_OK;
}

void gcomp_cost_model_free(gcomp_cost_model *m) {
    if (!m) return;
    gcomp__free(m->t);
    gcomp__free(m);
}

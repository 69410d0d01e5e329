/*
 * cost.c - the cost model: predicted step time of data-parallel training with compressed
 * gradients (include/gradcomp.h, "Cost model"), after Agarwal et al., "On the utility of
 * gradient compression in distributed training systems" (MLSys 2022):
 *
 *     step = compute + codec + exposed communication
 *
 * Model creation does everything that needs the spec parser or an allocation: each
 * tensor's message size (gcomp_spec_bytes_estimate, the library's own formats), the
 * strategy's traffic law turned into a list of transfer phases (cost_laws.c), the byte
 * count gcomp_mpi_stats would report, and the codec time from the calibration.  What is
 * left for gcomp_cost_eval is arithmetic on the link parameters: alpha-beta time of each
 * phase, then the overlap of transfers with the backward pass, simulated tensor by
 * tensor in the order backward makes gradients final:
 *
 *     cpu:  forward | bwd(t_last) enc(t_last) | bwd(t_last-1) enc(..) | ... | decodes | opt
 *     link:                     [comm(t_last)]        [comm(t_last-1)] ...
 *
 * A transfer starts when its tensor is encoded and the link is free (one link per rank:
 * the transfers of a step share it, first come first served), and moves at rate `overlap`
 * while the worker still computes, at full rate once it waits.  With `concurrent` (every
 * tensor's exchange in flight at once, as gradcomp's buckets are) only the bytes queue
 * for the link; each tensor's chain of latencies runs from its own ready time, beside
 * the others'.  Decoding runs on the worker after the backward pass, each tensor as soon
 * as its transfer is done; work a strategy does while its own transfer is in flight
 * (allgather zeroes its output) runs on the worker beside the link.  The break-even
 * bandwidth is found by bisection on log(bandwidth).
 *
 * Rejected: a closed form max(compute, comm) (Agarwal et al.'s "perfect overlap" bound;
 * it cannot see that the first layer's gradient is final only at the very end of the
 * backward pass, so its transfer is never hidden, nor the codec time on the worker's own
 * cores); a packet-level simulation (the model must be cheap enough for a controller to
 * evaluate at every decision).
 */
#include "cost_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void gcomp_cost_net_default(gcomp_cost_net *net) {
    if (!net) return;
    memset(net, 0, sizeof *net);
    net->workers = 1;
    net->nodes = 1;
    net->inter.bandwidth = 1e9 / 8 * (1448.0 / 1514.0); /* TCP payload of 1 Gbit/s Ethernet */
    net->inter.latency = 25e-6;
    net->intra.bandwidth = 10e9;
    net->intra.latency = 1e-6;
}

static bool bad_link(const gcomp_cost_link *l) {
    return !(l->bandwidth > 0) || !isfinite(l->bandwidth) || !(l->latency >= 0) ||
           !isfinite(l->latency) || !(l->burst >= 0) || !isfinite(l->burst);
}

static bool bad_time(double t) {
    return !(t >= 0) || !isfinite(t);
}

gcomp_status gcomp__cost_check_net(const gcomp_cost_net *net, int workers, int nodes) {
    if (!net || net->workers != workers || net->nodes != nodes) return GCOMP_E_ARG;
    if (bad_link(&net->inter) || bad_link(&net->intra) || net->servers < 0) return GCOMP_E_ARG;
    return GCOMP_OK;
}

/*
 * Time of one phase on the links, as its latencies (*lat) and its bytes' time on the wire
 * (*wire); returns whether that time is on the nodes' links (inter), not inside a node.
 * `group` ranks take part, L of them per node (L = 1 when the phase runs between node
 * leaders or there is one rank per node).
 *  ring       each step sends to the next rank: the ring crosses each node boundary once
 *             per direction, so it moves at the slower of the two links
 *  spread     the rank's bytes go to all group-1 peers: the share bound for other nodes
 *             leaves through the NIC, which the L ranks of a node share
 *  intra      inside a node only
 */
static bool phase_time(const cost_phase *ph, const gcomp_cost_net *net, int L, double *lat,
                       double *wire) {
    const gcomp_cost_link *in = &net->inter, *sh = &net->intra;
    double g = ph->group;
    bool inside = ph->kind == PH_INTRA || (ph->kind != PH_PS && L > 1 && g <= L);
    *lat = ph->steps * (inside ? sh->latency : in->latency);
    switch (ph->kind) {
    case PH_INTRA:
        *wire = ph->bytes / sh->bandwidth;
        return false;
    case PH_RING:
        *wire = ph->bytes / (L <= 1   ? in->bandwidth
                             : inside ? sh->bandwidth
                                      : fmin(in->bandwidth, sh->bandwidth));
        return !inside;
    case PH_SPREAD:
    default: {
        if (L <= 1 || inside) {
            *wire = ph->bytes / (inside ? sh->bandwidth : in->bandwidth);
            return !inside;
        }
        double off = (g - L) / (g - 1), on = (L - 1) / (g - 1);
        *wire = fmax(L * ph->bytes * off / in->bandwidth, ph->bytes * on / sh->bandwidth);
        return true;
    }
    case PH_PS: {
        /* Push to S servers and pull back: the worker's NIC carries its own bytes, each
         * server's NIC those of all workers divided over the S servers. */
        double S = net->servers > 0 ? net->servers : net->nodes;
        *wire = fmax(ph->bytes / in->bandwidth, ph->server_bytes * g / S / in->bandwidth);
        return true;
    }
    }
}

/* A carrier's time on the link: each lane pays its phases' latencies one after another,
 * the lanes side by side; the bytes of every lane share the link.  *wire_s receives the
 * bytes' share, of it *inter_s the time on the nodes' links (either may be NULL). */
static double tensor_comm(const cost_tensor *t, const gcomp_cost_net *net, int per_node,
                          double *wire_s, double *inter_s) {
    double lat[COST_MAX_PHASES] = {0}, wire = 0, inter = 0, slowest = 0;
    for (int k = 0; k < t->nphase; k++) {
        const cost_phase *ph = &t->phase[k];
        double l, w;
        if (phase_time(ph, net, ph->leaders ? 1 : per_node, &l, &w)) inter += w;
        lat[ph->lane] += l;
        wire += w;
    }
    for (int k = 0; k < t->nphase; k++) slowest = fmax(slowest, lat[k]);
    if (wire_s) *wire_s = wire;
    if (inter_s) *inter_s = inter;
    return slowest + wire;
}

/* Work left after `start` when `work` seconds of transfer must be done, moving at rate
 * `rate` until `until` (the worker computes) and at rate 1 after. */
static double advance(double start, double work, double rate, double until) {
    if (work <= 0) return start;
    if (start >= until) return start + work;
    double can = rate * (until - start);
    if (can >= work) return start + work / rate;
    return until + (work - can);
}

static int per_node_of(int P, int nodes) {
    return (P + nodes - 1) / nodes;
}

/* One step, the first `free_s` seconds of the nodes' links' transfers taking no time (a
 * shaper's burst); *busy_s receives the time those links carry the step's bytes. */
static void run_step(const gcomp_cost_model *m, const gcomp_cost_net *net,
                     const gcomp_cost_compute *c, double free_s, gcomp_cost_result *out,
                     gcomp_cost_tensor_result *per, double *busy_s) {
    memset(out, 0, sizeof *out);
    *busy_s = 0;
    int L = per_node_of(m->workers, m->nodes);
    /* Backward: last tensor first; each encoded on the worker as soon as it is final. */
    double cpu = c->forward_s, link = 0, bwd_end;
    double rate = c->overlap > 0 ? c->overlap : 1e-300;
    out->calibrated = 2;
    for (size_t k = m->count; k-- > 0;) {
        const cost_tensor *t = &m->t[k];
        cpu += c->backward_s * t->work / m->total_work + t->encode_s + t->hidden_s;
    }
    bwd_end = cpu;
    /* Second pass: the link takes the tensors in the order they became ready; the worker
     * decodes each after the backward pass, as soon as its transfer is done. */
    double dec = bwd_end;
    cpu = c->forward_s;
    for (size_t k = m->count; k-- > 0;) {
        const cost_tensor *t = &m->t[k];
        cpu += c->backward_s * t->work / m->total_work + t->encode_s;
        double wire, inter, comm = tensor_comm(t, net, L, &wire, &inter);
        double burst = fmin(free_s, inter);
        *busy_s += inter;
        free_s -= burst;
        wire -= burst;
        comm -= burst;
        /* One at a time, its whole exchange queues for the link.  Side by side, only its
         * bytes do; its round trips run beside the others', from when it is ready. */
        link = advance(cpu > link ? cpu : link, c->concurrent ? wire : comm, rate, bwd_end);
        double done = c->concurrent ? fmax(link, advance(cpu, comm, rate, bwd_end)) : link;
        double ready = cpu;
        cpu += t->hidden_s; /* on the worker, while its transfer moves */
        dec = (dec > done ? dec : done) + t->decode_s;
        if (per) {
            gcomp_cost_tensor_result *r = &per[k];
            memset(r, 0, sizeof *r);
            r->message_bytes = t->message_bytes;
            r->bytes_sent = t->bytes_sent;
            r->node_bytes = t->node_bytes;
            r->encode_s = t->encode_s;
            r->decode_s = t->decode_s;
            r->hidden_s = t->hidden_s;
            r->comm_s = comm;
            r->ready_s = ready;
            r->done_s = dec;
            r->strategy = t->strategy;
            r->calibrated = t->calibrated;
        }
        out->comm_s += comm;
        out->codec_s += t->encode_s + t->decode_s + t->hidden_s;
        out->bytes_sent += t->bytes_sent;
        out->node_bytes += t->node_bytes;
        if (t->calibrated < out->calibrated) out->calibrated = t->calibrated;
    }
    cpu = dec;
    out->compute_s = c->forward_s + c->backward_s + c->optimizer_s;
    out->step_s = cpu + c->optimizer_s;
    out->exposed_s = out->step_s - out->compute_s - out->codec_s;
    if (out->exposed_s < 0) out->exposed_s = 0; /* rounding */
}

gcomp_status gcomp_cost_eval(const gcomp_cost_model *m, const gcomp_cost_net *net,
                             const gcomp_cost_compute *c, gcomp_cost_result *out,
                             gcomp_cost_tensor_result *per) {
    if (!m || !c || !out) return GCOMP_E_ARG;
    if (gcomp__cost_check_net(net, m->workers, m->nodes) != GCOMP_OK) return GCOMP_E_ARG;
    if (bad_time(c->forward_s) || bad_time(c->backward_s) || bad_time(c->optimizer_s) ||
        !(c->overlap >= 0 && c->overlap <= 1) || (c->concurrent != 0 && c->concurrent != 1))
        return GCOMP_E_ARG;
    double busy;
    run_step(m, net, c, 0, out, per, &busy);
    /* A shaper refills its bucket while the link is idle: in steady state, step after
     * step, the step's time without transfers on the nodes' links (which the burst does
     * not change: what it saves comes off the transfers and the step alike).  The
     * burst's bytes go at the wire's speed, taken as instant. */
    const gcomp_cost_link *in = &net->inter;
    if (in->burst > 0 && busy > 0) {
        double idle = fmax(0, out->step_s - busy);
        run_step(m, net, c, fmin(in->burst, in->bandwidth * idle) / in->bandwidth, out, per, &busy);
    }
    return GCOMP_OK;
}

/* Step time of tensor `k` alone (no compute), or of the whole step. */
static double time_at(const gcomp_cost_model *m, size_t k, const gcomp_cost_net *net,
                      const gcomp_cost_compute *c) {
    if (k == (size_t)-1) {
        gcomp_cost_result r;
        if (gcomp_cost_eval(m, net, c, &r, NULL) != GCOMP_OK) return NAN;
        return r.step_s;
    }
    const cost_tensor *t = &m->t[k];
    double comm = tensor_comm(t, net, per_node_of(m->workers, m->nodes), NULL, NULL);
    return t->encode_s + fmax(comm, t->hidden_s) + t->decode_s;
}

gcomp_status gcomp_cost_break_even(const gcomp_cost_model *m, const gcomp_cost_model *base,
                                   size_t tensor, const gcomp_cost_net *net,
                                   const gcomp_cost_compute *c, double *bandwidth) {
    if (!m || !base || !net || !c || !bandwidth) return GCOMP_E_ARG;
    if (m->count != base->count || m->workers != base->workers || m->nodes != base->nodes)
        return GCOMP_E_ARG;
    if (tensor != (size_t)-1 && tensor >= m->count) return GCOMP_E_ARG;
    gcomp_cost_result probe;
    if (gcomp_cost_eval(m, net, c, &probe, NULL) != GCOMP_OK) return GCOMP_E_ARG;
    gcomp_cost_net n = *net;
    /* f(B) = t_m(B) - t_base(B): < 0 where compression pays.  Links faster than the
     * intra-node one are not raised with it, so f can be flat at the top: bisect for the
     * first speed where it stops paying. */
    double lo = log(1e5), hi = log(1e13);
    n.inter.bandwidth = exp(lo);
    double flo = time_at(m, tensor, &n, c) - time_at(base, tensor, &n, c);
    n.inter.bandwidth = exp(hi);
    double fhi = time_at(m, tensor, &n, c) - time_at(base, tensor, &n, c);
    if (!(flo < 0)) {
        *bandwidth = 0;
        return GCOMP_OK;
    }
    if (fhi < 0) {
        *bandwidth = INFINITY;
        return GCOMP_OK;
    }
    for (int it = 0; it < 80; it++) {
        double mid = 0.5 * (lo + hi);
        n.inter.bandwidth = exp(mid);
        double f = time_at(m, tensor, &n, c) - time_at(base, tensor, &n, c);
        if (f < 0)
            lo = mid;
        else
            hi = mid;
    }
    *bandwidth = exp(0.5 * (lo + hi));
    return GCOMP_OK;
}

size_t gcomp_cost_model_count(const gcomp_cost_model *m) {
    return m ? m->count : 0;
}

int gcomp_cost_model_workers(const gcomp_cost_model *m) {
    return m ? m->workers : 0;
}

int gcomp_cost_model_nodes(const gcomp_cost_model *m) {
    return m ? m->nodes : 0;
}

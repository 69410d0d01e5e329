/*
 * mpi_retune.c - changing a tensor's spec in a live bucket between two allreduces
 * (gcomp_mpi_bucket_retune, gradcomp_mpi.h), keeping what its compressors hold back.
 *
 * A retune builds the tensor again from the new spec (its component, compressors, peer
 * decoders) beside the old one, moves every compressor's state across slot by slot (the
 * checkpoint slots of mpi_strategy.h: worker, owner, rsag's chunks) through the core's own
 * retune - a copy of the old compressor is retuned to the new slot's spec and its state
 * loaded into the new compressor, so the residual, DGC's momentum, PowerSGD's warm start
 * and a carry for a dense spec all survive - then plans the sub-buckets and reserves their
 * buffers again.  Only when all of that has worked (and, below, every rank agrees) does the
 * new tensor and plan replace the old ones; any failure leaves the bucket as it was.
 *
 * The set-up guarantee after a switch (mismatched settings are an error on every rank,
 * never wrong numbers) holds in two ways, chosen from the components alone, so every rank
 * makes the same choice:
 *   local       the tensor stays with a component whose exchange negotiates its sizes
 *               (allgather, sparse, rsag: gm_strategy.negotiated) in the same sub-bucket:
 *               no communication.  A rank that did not switch, or switched to another
 *               spec, still issues the same collectives, and its messages carry the
 *               fingerprint of its own spec, which every receiver checks against the spec
 *               it expects from that rank: GCOMP_E_MISMATCH on every rank that decodes
 *               them (allgather: all; the owner strategies forward it).
 *   checked     anything else (another component, another sub-bucket plan, or a dense
 *               allreduce whose counts follow from the spec): the ranks could otherwise
 *               issue different collectives, so the retune itself runs one MPI_Iallreduce
 *               (MAX) of a hash of every tensor's spec and strategy and its complement,
 *               with a failure marker, on the communicator's own duplicate - never on the
 *               bucket's data communicator, so a rank that did not call retune cannot match
 *               it with a data collective (it times out instead).  A difference, or a rank
 *               whose local preparation failed, rolls the retune back on every rank.  The
 *               allreduce's per-call check words also fold in the specs' fingerprints.
 * So a decision taken alike on every rank (gcomp_adapt_decide) costs no extra round trip
 * per step, and at most one small collective per structural switch.
 *
 * Moving state needs the same compressors on both sides: between components only when
 * neither keeps an owner side (allgather, allreduce, PowerSGD: one worker compressor of n
 * elements), within rsag or sparse for any spec they carry.  Rejected: rebuilding the whole
 * bucket (every tensor's state would move for one tensor's switch), and dropping the owner
 * residuals of rsag/sparse on a switch to another component (what they hold back would be
 * lost; switching those is refused instead, the same way on every rank).
 */
#include "mpi_strategy.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static int slots_of(const gm_tensor *t) {
    return t->S->state_slots ? t->S->state_slots(t) : 2;
}

static gcomp_compressor *slot_of(const gm_tensor *t, int k) {
    if (t->S->state_slot) return t->S->state_slot(t, k);
    return k == 0 ? t->c : NULL;
}

/* Moves old's compressor states into nt's: each new compressor takes what its old
 * counterpart holds back, converted by the core (gcomp_compressor_retune_from), which only
 * reads the old one, so a roll-back has it as it was.  (Through a saved state, a copy of
 * the old compressor retuned and saved again, a switch of a 4096 x 4096 tensor from
 * PowerSGD to top-k took 0.3 s on one rank, most of it faulting in the blobs' fresh
 * pages, and 0.9 s with two ranks on two cores.) */
static gcomp_status transplant(const gm_tensor *old, gm_tensor *nt, gcomp_error *err) {
    int ko = slots_of(old), kn = slots_of(nt);
    for (int k = 0; k < ko; k++) {
        gcomp_compressor *oc = slot_of(old, k), *nc = k < kn ? slot_of(nt, k) : NULL;
        if (!oc) continue;
        if (!nc || gcomp_compressor_size(oc) != gcomp_compressor_size(nc))
            return gm_fail(err, GCOMP_E_UNSUPPORTED,
                           "tensor '%s': slot %d of '%s' has no counterpart in '%s'", old->name, k,
                           old->spec, nt->spec);
        gcomp_error e2 = {0};
        gcomp_status st = gcomp_compressor_retune_from(nc, oc, &e2);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "tensor '%s': moving slot %d's state to '%s': %s", old->name, k,
                           nt->spec, e2.message[0] ? e2.message : gcomp_status_str(st));
    }
    return GCOMP_OK;
}

static bool same_plan(const gm_group *a, size_t na, const gm_group *b, size_t nb) {
    if (na != nb) return false;
    for (size_t k = 0; k < na; k++)
        if (a[k].t0 != b[k].t0 || a[k].t1 != b[k].t1) return false;
    return true;
}

/* The collective agreement of a structural retune (see the top of the file).  Its words
 * live in the communicator's set-up cells, so a rank short of memory still takes part. */
static gcomp_status retune_check(gcomp_mpi_bucket *b, size_t i, gcomp_status local,
                                 double timeout_s, gcomp_error *err) {
    gcomp_mpi_comm *c = b->comm;
    uint64_t h = 0x7265747566e65ull; /* "retune" */
    for (size_t k = 0; k < b->nt; k++)
        h = gm_mix(h ^ b->t[k].fp) + gm_mix((uint64_t)(unsigned)b->t[k].strategy + k);
    const uint64_t in[3] = {local != GCOMP_OK ? gm_marker(local, c->rank) : 0, h, ~h};
    uint64_t out[3];
    gcomp_status st =
        gm_comm_agree(c, in, 3, out, gm_deadline(c, timeout_s), "the retune check", err);
    if (st != GCOMP_OK) return st;
    if (out[0] & GM_MARK) {
        if (local != GCOMP_OK) return local;
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "tensor '%s': rank %d could not retune (%s); no rank switched", b->t[i].name,
                       gm_marker_rank(out[0]), gcomp_status_str(gm_marker_status(out[0])));
    }
    if (out[1] != ~out[2])
        return gm_fail(err, GCOMP_E_MISMATCH,
                       "tensor '%s': the ranks retuned to different specs or strategies (this "
                       "rank: %s); no rank switched",
                       b->t[i].name, b->t[i].spec);
    return GCOMP_OK;
}

/* Planning the new sub-buckets let the components write per-tensor offsets of the tensors
 * they share with the old plan (the allreduce's pack offsets): on a roll-back each old
 * group reserves again, its private state in place, which recomputes them and allocates
 * nothing (mpi_strategy.h: its buffers are large enough already).  A roll-back that could
 * fail on one rank alone would leave that bucket dead there and the others waiting for it
 * at the next call. */
static void restore_plan(gcomp_mpi_bucket *b) {
    for (size_t k = 0; k < b->ng; k++) {
        gm_group *g = &b->g[k];
        if (!g->member || g->single_node || !g->S->reserve) continue;
        if (g->S->reserve(b, g) != GCOMP_OK) b->dead = true; /* cannot be: nothing allocated */
    }
}

gcomp_status gcomp_mpi_bucket_retune(gcomp_mpi_bucket *b, size_t i, const char *spec,
                                     double timeout_s, gcomp_error *err) {
    gcomp_status st = gm_bucket_usable(b, err);
    if (st != GCOMP_OK) return st;
    if (b->busy)
        return gm_fail(err, GCOMP_E_PROTOCOL, "retune: the bucket's allreduce is in flight");
    if (i >= b->nt || !spec)
        return gm_fail(err, GCOMP_E_ARG, "retune: tensor %zu of %zu", i, b->nt);
    gm_tensor *old = &b->t[i];

    /* 1. What the switch is, from the specs alone (the same answer on every rank). */
    char canon[sizeof old->spec];
    uint64_t fp;
    gcomp_spec_info info;
    gcomp_error e2 = {0};
    st = gm_spec_describe(spec, canon, sizeof canon, &fp, &info, &e2);
    if (st != GCOMP_OK) return gm_fail(err, st, "tensor '%s': %s", old->name, e2.message);
    if (!strcmp(canon, old->spec)) return GCOMP_OK;
    /* The servers, inside gcomp_mpi_ps_serve, take part in no collective of the bucket: a
     * switch would leave their keys on the old spec (or wait for them for ever). */
    if (b->opt.ps)
        return gm_fail(err, GCOMP_E_UNSUPPORTED,
                       "tensor '%s': a parameter-server bucket cannot be retuned (its servers "
                       "take no part in a switch)",
                       old->name);
    gm_query q = {canon, &info, old->n, old->rows, old->cols, old->xsize};
    const char *why = NULL;
    const gm_strategy *S = gm_strategy_choose(&q, old->req_strategy & 0xff, &why);
    if (!S)
        return gm_fail(err, GCOMP_E_UNSUPPORTED, "tensor '%s': %s cannot carry '%s': %s", old->name,
                       gcomp_mpi_strategy_name(old->req_strategy), canon, why);
    if (S != old->S && (S->owner || old->S->owner))
        return gm_fail(err, GCOMP_E_UNSUPPORTED,
                       "tensor '%s': a retune from %s to %s would drop the owners' residuals; "
                       "switch between owner strategies only within one of them",
                       old->name, old->S->name, S->name);
    bool structural = S != old->S || !(old->S->version >= 2 && old->S->negotiated);

    /* 2. The new tensor and plan, beside the old ones; a failure becomes `local`. */
    gcomp_mpi_tensor d = {old->name, canon, old->n, old->rows, old->cols, old->req_strategy};
    gm_tensor nt, saved = *old;
    memset(&nt, 0, sizeof nt);
    gm_group *ng = gm_calloc(b->nt, sizeof *ng);
    size_t nng = 0;
    gcomp_error lerr = {0};
    gcomp_status local = ng ? GCOMP_OK : gm_fail(&lerr, GCOMP_E_NOMEM, "out of memory");
    if (local == GCOMP_OK) local = gm_tensor_setup(b, &nt, i, &d, &lerr);
    if (local == GCOMP_OK) local = transplant(old, &nt, &lerr);
    if (local == GCOMP_OK) {
        nt.stats = old->stats;
        b->t[i] = nt; /* planned with the new tensor in place, put back below */
        nng = gm_groups_plan(b, ng);
        structural |= !same_plan(ng, nng, b->g, b->ng);
        for (size_t k = 0; k < nng && local == GCOMP_OK; k++) {
            local = gm_group_setup(b, &ng[k]);
            if (local != GCOMP_OK)
                gm_fail(&lerr, local, "tensor '%s': sub-bucket plan: %s", old->name,
                        gcomp_status_str(local));
        }
        b->t[i] = saved;
    }

    /* 3. Agreement, where the ranks could otherwise issue different collectives. */
    st = local;
    if (structural && b->comm->size > 1) {
        b->t[i] = local == GCOMP_OK ? nt : saved; /* hash what this rank would run */
        st = retune_check(b, i, local, timeout_s, local == GCOMP_OK ? err : NULL);
        b->t[i] = saved;
        if (st != GCOMP_OK && local != GCOMP_OK && err) *err = lerr;
    } else if (st != GCOMP_OK && err) {
        *err = lerr;
    }

    /* 4. Commit or roll back. */
    if (st != GCOMP_OK) {
        for (size_t k = 0; ng && k < nng; k++) gm_group_release(&ng[k]);
        gm_free(ng);
        if (nng) restore_plan(b);
        gm_tensor_free(&nt);
        gm_buf_free(&nt.work);
        gm_buf_free(&nt.tmp);
        return st;
    }
    for (size_t k = 0; k < b->ng; k++) gm_group_release(&b->g[k]);
    gm_free(b->g);
    b->g = ng;
    b->ng = nng;
    b->t[i] = nt;
    gm_tensor_free(&saved);
    gm_buf_free(&saved.work);
    gm_buf_free(&saved.tmp);
    return GCOMP_OK;
}

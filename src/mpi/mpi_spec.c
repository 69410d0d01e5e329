/*
 * mpi_spec.c - what the layer derives from a spec, through the core's public spec API only
 * (gcomp_spec_describe, gcomp_spec_set): never by reading or editing spec text, and never by
 * a codec's name.  A new codec that describes itself correctly is carried correctly here.
 *
 * - The description a tensor is set up from (gm_spec_describe): the same on every rank,
 *   taken at GM_PROBE_N elements so that the contraction answer (auto's rsag choice, the
 *   owners' feedback) does not depend on a region's size.
 * - Per-rank worker specs (gm_rank_spec): a spec whose draws are private (qsgd, ternary,
 *   stochastic int8/int4 rounding, bernoulli, importance, the sample of `sampled`: each
 *   says so with GCOMP_SPEC_PRIVATE_DRAWS) gets a seed of the rank's own, derived from the
 *   spec's seed and the rank, so the ranks' rounding errors are independent and the
 *   variance of the average shrinks by P (with one seed on every rank, ranks with similar
 *   gradients made the same draws and it did not).  Draws every rank must make alike
 *   (GCOMP_SPEC_SHARED_DRAWS: random-k positions, which allreduce sums by position;
 *   PowerSGD's starting Q) keep the spec's seed, and win when a spec has both.  Decoders
 *   never need the seed (a random-k message carries its key), so only the fingerprint each
 *   rank's messages carry changes, and the receivers keep a decoder per rank (gm_peers) so
 *   that the core can still check that a message is the sender's.
 */
#include "mpi_internal.h"

#include <stdio.h>

gcomp_status gm_spec_describe(const char *spec, char *canon, size_t cap, uint64_t *fp,
                              gcomp_spec_info *info, gcomp_error *err) {
    uint64_t f = 0;
    gcomp_status st = gcomp_spec_canonical(spec, canon, cap, &f, err);
    if (st == GCOMP_OK) st = gcomp_spec_describe(spec, GM_PROBE_N, info, err);
    if (st == GCOMP_OK && fp) *fp = f;
    return st;
}

gcomp_status gm_rank_spec(const gm_tensor *t, int rank, char *out, size_t cap, uint64_t *fp,
                          bool *own) {
    unsigned f = t->info.flags;
    *own = (f & GCOMP_SPEC_PRIVATE_DRAWS) && !(f & GCOMP_SPEC_SHARED_DRAWS);
    if (!*own) {
        if (strlen(t->spec) >= cap) return GCOMP_E_DST_SIZE;
        memcpy(out, t->spec, strlen(t->spec) + 1);
        if (fp) *fp = t->fp;
        return GCOMP_OK;
    }
    uint64_t rseed = gm_mix(gm_mix(t->info.seed ^ 0x72616e6bull /* "rank" */) + (uint64_t)rank) &
                     ((1ull << 53) - 1); /* the spec's seed range */
    char num[24];
    snprintf(num, sizeof num, "%llu", (unsigned long long)rseed);
    char tmp[512];
    gcomp_status st = gcomp_spec_set(t->spec, "seed", num, tmp, sizeof tmp, NULL);
    if (st != GCOMP_OK) return st;
    return gcomp_spec_canonical(tmp, out, cap, fp, NULL);
}

gcomp_status gm_peers_setup(gm_peers *p, gm_tensor *t, size_t n, size_t rows, size_t cols,
                            gcomp_error *err) {
    bool own = false;
    uint64_t fp;
    memset(p, 0, sizeof *p);
    gcomp_status st = gm_rank_spec(t, t->xrank, t->wspec, sizeof t->wspec, &fp, &own);
    if (st != GCOMP_OK)
        return gm_fail(err, st, "tensor '%s': no per-rank spec for '%s'", t->name, t->spec);
    if (!own) return GCOMP_OK;
    p->count = t->xsize;
    p->fp = gm_calloc((size_t)t->xsize, sizeof *p->fp);
    p->dec = gm_calloc((size_t)t->xsize, sizeof *p->dec);
    if (!p->fp || !p->dec) return gm_fail(err, GCOMP_E_NOMEM, "out of memory");
    for (int r = 0; r < t->xsize; r++) {
        char rs[512];
        bool o;
        gcomp_error e2;
        st = gm_rank_spec(t, r, rs, sizeof rs, &p->fp[r], &o);
        if (st == GCOMP_OK && r != t->xrank && n)
            st = gcomp_compressor_create(&p->dec[r], rs, n, rows, cols, &e2);
        if (st != GCOMP_OK)
            return gm_fail(err, st, "tensor '%s': decoder for rank %d: %s", t->name, r,
                           gcomp_status_str(st));
    }
    return GCOMP_OK;
}

void gm_peers_free(gm_peers *p) {
    if (p->dec)
        for (int r = 0; r < p->count; r++) gcomp_compressor_free(p->dec[r]);
    gm_free(p->dec);
    gm_free(p->fp);
    memset(p, 0, sizeof *p);
}

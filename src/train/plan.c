/*
 * plan.c - a method's spec and strategy for each tensor (plan.h), through the core's layer
 * policy (gcomp_policy): small and 1-D tensors dense, the rest the method's spec.  Moved
 * out of exchange.c when the outer step (outer.c) needed the same decisions.
 */
#define _POSIX_C_SOURCE 200809L
#include "plan.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pfail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

void gtrain_plan_free(gtrain_plan *p) {
    if (!p) return;
    for (size_t i = 0; p->spec && i < p->nt; i++) free(p->spec[i]);
    free(p->spec);
    free(p->mt);
    free(p->dgc);
    memset(p, 0, sizeof *p);
}

int gtrain_plan_create(gtrain_plan *p, const char *method, const gtrain_tensor *t, size_t nt,
                       const char *const *specs, const gtrain_policy_defaults *pd, int strategy,
                       char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->nt = nt;
    p->spec = calloc(nt, sizeof *p->spec);
    p->mt = calloc(nt, sizeof *p->mt);
    p->dgc = calloc(nt, 1);
    if (!p->spec || !p->mt || !p->dgc) {
        gtrain_plan_free(p);
        return pfail(err, errlen, "out of memory");
    }
    /* "SPEC@STRATEGY" picks the strategy of this method's compressed tensors. */
    char mbuf[1024], pol[1200];
    snprintf(mbuf, sizeof mbuf, "%s", method);
    char *at = strrchr(mbuf, '@');
    if (at) {
        *at = 0;
        if (gcomp_mpi_strategy_parse(at + 1, &strategy) != GCOMP_OK) {
            gtrain_plan_free(p);
            return pfail(err, errlen, "method '%s': unknown strategy '%s'", method, at + 1);
        }
    }
    if (gtrain_method_policy(mbuf, pd, pol, sizeof pol)) {
        gtrain_plan_free(p);
        return pfail(err, errlen, "method '%s': too long", method);
    }
    gcomp_error e = {0};
    gcomp_policy *policy = NULL;
    if (!specs && gcomp_policy_create(&policy, pol, &e) != GCOMP_OK) {
        gtrain_plan_free(p);
        return pfail(err, errlen, "method '%s': %s", method, e.message);
    }
    int rc = 0;
    for (size_t i = 0; i < nt && !rc; i++) {
        size_t rows = t[i].is_bias || t[i].cols == 1 ? 0 : t[i].rows;
        size_t cols = rows ? t[i].cols : 0;
        gcomp_tensor_desc d = {t[i].name, t[i].n, rows, cols};
        gcomp_layer_plan plan = {0};
        plan.spec = specs ? specs[i] : NULL;
        plan.rule = GCOMP_RULE_DEFAULT;
        gcomp_spec_info info;
        if ((!specs && gcomp_policy_choose(policy, &d, &plan, &e) != GCOMP_OK) ||
            !(p->spec[i] = strdup(plan.spec)) ||
            gcomp_spec_describe(plan.spec, t[i].n, &info, &e) != GCOMP_OK) {
            rc = pfail(err, errlen, "%s: %s", t[i].name, p->spec[i] ? e.message : "out of memory");
            break;
        }
        /* DGC's momentum correction keeps the momentum: the optimizer must not add its own. */
        p->dgc[i] = (info.flags & GCOMP_SPEC_MOMENTUM) != 0;
        /* A codec that neither selects, quantizes nor factorises sends the tensor as it is:
         * the method's strategy is for the compressed tensors, these go by auto. */
        bool uncompressed = !(info.flags & (GCOMP_SPEC_SPARSE | GCOMP_SPEC_MULTIPHASE)) &&
                            !(info.codec->flags & GCOMP_CODEC_QUANTIZER);
        bool dense = plan.rule == GCOMP_RULE_1D || plan.rule == GCOMP_RULE_SMALL || uncompressed;
        gcomp_mpi_tensor mt = {t[i].name, p->spec[i], t[i].n,
                               rows,      cols,       dense ? GCOMP_MPI_AUTO : strategy};
        p->mt[i] = mt;
    }
    gcomp_policy_free(policy);
    if (rc) gtrain_plan_free(p);
    return rc;
}

int gtrain_plan_set_spec(gtrain_plan *p, size_t i, const char *spec, char *err, size_t errlen) {
    gcomp_error e = {0};
    gcomp_spec_info info;
    if (i >= p->nt) return pfail(err, errlen, "no tensor %zu", i);
    if (gcomp_spec_describe(spec, p->mt[i].n, &info, &e) != GCOMP_OK)
        return pfail(err, errlen, "%s: %s", p->mt[i].name, e.message);
    char *copy = strdup(spec);
    if (!copy) return pfail(err, errlen, "out of memory");
    free(p->spec[i]);
    p->spec[i] = copy;
    p->mt[i].spec = copy;
    p->dgc[i] = (info.flags & GCOMP_SPEC_MOMENTUM) != 0;
    return 0;
}

void gtrain_plan_describe(const gtrain_plan *p, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < p->nt; i++) {
        bool seen = false;
        for (size_t j = 0; j < i; j++) seen |= !strcmp(p->spec[j], p->spec[i]);
        if (seen) continue;
        int w = snprintf(out + used, cap - used, "%s%s: ", used ? "; " : "", p->spec[i]);
        if (w < 0 || (size_t)w >= cap - used) return;
        used += (size_t)w;
        bool first = true;
        for (size_t j = i; j < p->nt; j++) {
            if (strcmp(p->spec[j], p->spec[i])) continue;
            w = snprintf(out + used, cap - used, "%s%s", first ? "" : ",", p->mt[j].name);
            if (w < 0 || (size_t)w >= cap - used) return;
            used += (size_t)w;
            first = false;
        }
    }
}

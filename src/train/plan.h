/*
 * plan.h - what a method gives each tensor of a model: its spec (the layer policy) and
 * its MPI strategy.  Shared by the per-step gradient exchange (exchange.c) and the outer
 * step of local SGD (outer.c), so a method compresses the same tensors the same way in
 * both.
 */
#ifndef GTRAIN_PLAN_H
#define GTRAIN_PLAN_H

#include <stddef.h>

#include "gradcomp_mpi.h"
#include "method.h"
#include "model.h"

typedef struct gtrain_plan {
    size_t nt;
    char **spec;          /* per tensor, malloc'd */
    gcomp_mpi_tensor *mt; /* per tensor: name, spec (= spec[i]), n, shape, strategy */
    unsigned char *dgc;   /* 1 where the spec keeps DGC's momentum (feedback=dgc) */
} gtrain_plan;

/* method: "dense", "dense-f16", "policy:<policy string>", or "SPEC[;KEY=VALUE...]" (a
 * spec for the compressed tensors plus policy items of this method only), optionally
 * "...@STRATEGY".  The policy's items the method leaves out come from `pd`: tensors under
 * min_elements and 1-D tensors get dense_spec, and a "SPEC" method's spec gets min_k; the
 * compressed tensors get `strategy` (0: the codec's
 * default) and the dense ones GCOMP_MPI_AUTO.  specs: NULL, or one spec per tensor that
 * replaces the policy (an adaptive method's first decision).  Returns 0, or 1 with a
 * message in err. */
int gtrain_plan_create(gtrain_plan *p, const char *method, const gtrain_tensor *t, size_t nt,
                       const char *const *specs, const gtrain_policy_defaults *pd, int strategy,
                       char *err, size_t errlen);
/* Tensor i's spec becomes `spec` (a live retune): its text and whether it keeps DGC's
 * momentum.  Returns 0, or 1 with a message in err (a bad spec, out of memory). */
int gtrain_plan_set_spec(gtrain_plan *p, size_t i, const char *spec, char *err, size_t errlen);
void gtrain_plan_free(gtrain_plan *p);
/* One line naming the spec of each group of tensors: "SPEC: a,b; SPEC2: c". */
void gtrain_plan_describe(const gtrain_plan *p, char *out, size_t cap);

#endif

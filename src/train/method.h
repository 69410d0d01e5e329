/*
 * method.h - what a trainer method means as a layer policy: the one reading of "dense",
 * "dense-f16", "policy:<policy>" and "SPEC[;KEY=VALUE...]" that `gradcomp train` (plan.c)
 * and `gradcomp plan` (tools/cmd_plan.c) share.  Public API only (gradcomp.h): no MPI, no
 * BLAS, so the CLI's plan builds it where the trainer is not built.
 */
#ifndef GTRAIN_METHOD_H
#define GTRAIN_METHOD_H

#include <stddef.h>

/* The layer policy's items where a method sets none (the trainer's --min-elements, --min-k
 * and --dense-spec). */
typedef struct gtrain_policy_defaults {
    size_t min_elements;    /* tensors with fewer elements go dense */
    size_t min_k;           /* a floor on k for codecs that count from density= (0: none) */
    const char *dense_spec; /* the spec of those and of 1-D tensors (NULL: "none") */
} gtrain_policy_defaults;

/* Writes the policy string (gcomp_policy_create) that `method` stands for into out:
 *   "dense"            every tensor dense f32;
 *   "dense-f16"        every tensor the dense codec with f16 values;
 *   "policy:<policy>"  <policy> as written;
 *   "SPEC[;ITEMS]"     SPEC for the compressed tensors plus policy items of this method
 *                      only (twobit:threshold=0.5;min_elements=16384); min_elements=,
 *                      min_k= (when pd->min_k is not 0) and dense= come from `pd` where
 *                      ITEMS leave them out.
 * Returns 0, or -1 when the policy does not fit in cap (out then holds a truncated string
 * that the policy parser refuses). */
int gtrain_method_policy(const char *method, const gtrain_policy_defaults *pd, char *out,
                         size_t cap);

#endif

/*
 * cmd_train_sensitivity.c - the per-layer sensitivity probe of `gradcomp train`: how much
 * accuracy compressing one layer costs, layer by layer, measured directly (the seeds'
 * "measure each layer's accuracy sensitivity"; L-GreCo measures compression error instead,
 * which the `layers` controller does at run time).
 *
 * One run with every tensor dense (f32), then one run per tensor the layer policy would
 * compress with SPEC, that tensor alone compressed and everything else dense, all from the
 * same weights and batches (the trainer's seed), for the trainer's --epochs / --max-steps:
 * meant to be short.  A layer's cost is the dense run's final accuracy minus its run's, on
 * the validation split when the trainer holds one out (`--val`, by default for the probe),
 * so the policy it writes was not chosen on the test set.  Each cost comes with its paired
 * standard error (the samples the two runs' final models disagree on), which says where a
 * cost is within the noise of the split.
 * Layers whose cost exceeds the threshold and two standard errors get SPEC one decade
 * lighter (density x 10, rank x 4: the knob the adaptive ladder uses).  A cost within the
 * split's noise is no evidence, and a policy built on it would be the noise's: one epoch
 * of the MLP on 5,000 validation samples put every layer's cost within 2 SE (0.29-0.35 pp).
 * The policy is written as a method for --compare:
 * `policy:spec=SPEC;min_elements=...;dense=...;NAME=LIGHTER;...`.  SPEC is what the
 * trainer's policy gives a plain SPEC method, --min-k's floor included.
 *
 * Rejected: removing one layer's compression from a fully compressed run ("leave one
 * out"): it measures how much a layer's compression hurts next to the others' errors,
 * which is what matters at the end, but with one layer of a few compressed (the MLP has
 * three) the difference is within the run-to-run noise of the short runs; one layer at a
 * time isolates each effect.
 */
#define _GNU_SOURCE
#include "sensitivity.h"

#include "model.h"

#include "gradcomp.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* SPEC a decade lighter: density x 10 (capped at 1) or rank x 4; NULL when it has neither. */
static int lighter(const char *spec, char *out, size_t cap) {
    double v;
    char num[32];
    if (gcomp_spec_get_number(spec, "density", &v, NULL) == GCOMP_OK) {
        snprintf(num, sizeof num, "%.3g", v * 10 < 1 ? v * 10 : 1);
        return gcomp_spec_set(spec, "density", num, out, cap, NULL) != GCOMP_OK;
    }
    if (gcomp_spec_get_number(spec, "rank", &v, NULL) == GCOMP_OK) {
        snprintf(num, sizeof num, "%.0f", v * 4);
        return gcomp_spec_set(spec, "rank", num, out, cap, NULL) != GCOMP_OK;
    }
    return 1;
}

int train_sensitivity(const gtrain_config *cfg, const char *spec, double threshold_pp,
                      const gtrain_data *train, const gtrain_data *test, const char *outdir,
                      MPI_Comm comm) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    char light[512];
    gcomp_error e = {0};
    char canon[512];
    if (gcomp_spec_canonical(spec, canon, sizeof canon, NULL, &e) != GCOMP_OK) {
        if (rank == 0) fprintf(stderr, "gradcomp train: --sensitivity %s: %s\n", spec, e.message);
        return 2;
    }
    if (lighter(canon, light, sizeof light)) {
        if (rank == 0)
            fprintf(stderr,
                    "gradcomp train: --sensitivity %s: the spec needs density= or rank= to "
                    "suggest a lighter setting\n",
                    spec);
        return 2;
    }
    /* Which tensors the trainer's policy compresses with SPEC. */
    gtrain_model *m = NULL;
    if (gtrain_model_create(cfg->model, cfg->hidden, cfg->seed, 1, &m)) {
        if (rank == 0) fprintf(stderr, "gradcomp train: model %s: bad model\n", cfg->model);
        return 2;
    }
    size_t nt;
    gtrain_tensor *t = gtrain_model_tensors(m, &nt);
    /* The trainer's policy for a plain SPEC method, --min-k included: the spec it gives its
     * compressed tensors is the one each probe run uses. */
    char pol[1024];
    snprintf(pol, sizeof pol, "spec=%s;min_elements=%zu;min_k=%zu;dense=%s", canon,
             cfg->policy.min_elements, cfg->policy.min_k, cfg->policy.dense_spec);
    gcomp_policy *policy = NULL;
    if (gcomp_policy_create(&policy, pol, &e) != GCOMP_OK) {
        if (rank == 0) fprintf(stderr, "gradcomp train: --sensitivity: %s\n", e.message);
        gtrain_model_free(m);
        return 2;
    }
    char **names = calloc(nt, sizeof *names);
    size_t *sizes = calloc(nt, sizeof *sizes), nc = 0;
    for (size_t i = 0; i < nt; i++) {
        size_t rows = t[i].is_bias || t[i].cols == 1 ? 0 : t[i].rows;
        gcomp_tensor_desc d = {t[i].name, t[i].n, rows, rows ? t[i].cols : 0};
        gcomp_layer_plan plan;
        if (gcomp_policy_choose(policy, &d, &plan, NULL) == GCOMP_OK &&
            plan.rule == GCOMP_RULE_DEFAULT) {
            if (!nc) { /* SPEC with the floor, the same for every tensor */
                snprintf(canon, sizeof canon, "%s", plan.spec);
                if (lighter(canon, light, sizeof light)) light[0] = 0;
            }
            names[nc] = strdup(t[i].name);
            sizes[nc++] = t[i].n;
        }
    }
    gcomp_policy_free(policy);
    gtrain_model_free(m);

    double *acc = calloc(nc + 1, sizeof *acc), *se = calloc(nc + 1, sizeof *se);
    gtrain_verdicts dense_v = {NULL, 0}; /* the dense run's, on the set the costs are taken on */
    int rc = !acc || !se;                /* on every rank, before the collective runs */
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, comm);
    if (rc && rank == 0) fprintf(stderr, "gradcomp train: --sensitivity: out of memory\n");
    char err[512], method[1024];
    for (size_t k = 0; k <= nc && !rc; k++) {
        gtrain_result r;
        if (k == 0)
            snprintf(method, sizeof method, "dense");
        else /* names match themselves as globs; everything else dense f32 */
            snprintf(method, sizeof method, "policy:spec=none;dense=none;%s=%s", names[k - 1],
                     canon);
        if (gtrain_run(cfg, method, train, test, comm, &r, err, sizeof err)) {
            if (rank == 0) fprintf(stderr, "gradcomp train: --sensitivity: %s: %s\n", method, err);
            rc = 1;
            break;
        }
        acc[k] = gtrain_decision_acc(&r.points[r.npoints - 1], cfg->val != NULL);
        gtrain_verdicts *v = cfg->val ? &r.val_verdicts : &r.test_verdicts;
        if (k == 0) { /* kept for the layers' runs */
            dense_v = *v;
            *v = (gtrain_verdicts){NULL, 0};
        } else {
            se[k] = gtrain_paired_se(v, &dense_v);
        }
        gtrain_result_free(&r);
    }
    if (rank == 0 && !rc) {
        char path[PATH_MAX];
        mkdir(outdir, 0755);
        snprintf(path, sizeof path, "%s/sensitivity.txt", outdir);
        FILE *f = fopen(path, "w");
        int w = snprintf(pol, sizeof pol, "policy:spec=%s;min_elements=%zu;dense=%s", canon,
                         cfg->policy.min_elements, cfg->policy.dense_spec);
        const char *on = cfg->val ? "validation" : "test";
        printf("\nlayer sensitivity to %s (dense: %.2f%%; threshold %.2f pp; %s accuracy)\n", canon,
               100 * acc[0], threshold_pp, on);
        printf("%-20s %10s %9s %9s %6s  %s\n", "tensor", "elements",
               cfg->val ? "val acc" : "test acc", "cost pp", "±SE", "suggest");
        if (f)
            fprintf(f,
                    "# gradcomp train --sensitivity %s: dense %.4f (%s accuracy)\ntensor "
                    "elements accuracy cost_pp se_pp suggested\n",
                    canon, acc[0], on);
        bool noise = false;
        for (size_t k = 0; k < nc; k++) {
            double cost = 100 * (acc[0] - acc[k + 1]), sd = 100 * se[k + 1];
            /* above the threshold and clear of the split's noise (NaN sd: no verdicts) */
            bool within = fabs(cost) < 2 * sd;
            bool sensitive = cost > threshold_pp && !within;
            noise |= within;
            printf("%-20s %10zu %8.2f%% %+9.2f %6.2f  %s%s\n", names[k], sizes[k], 100 * acc[k + 1],
                   cost, sd, sensitive ? light : canon,
                   !within               ? ""
                   : cost > threshold_pp ? "  (within 2 SE of dense: kept)"
                                         : "  (within 2 SE of dense)");
            if (f)
                fprintf(f, "%s %zu %.4f %.3f %.3f %s\n", names[k], sizes[k], acc[k + 1], cost, sd,
                        sensitive ? light : canon);
            if (sensitive && w > 0 && (size_t)w < sizeof pol)
                w += snprintf(pol + w, sizeof pol - (size_t)w, ";%s=%s", names[k], light);
        }
        if (f) fclose(f);
        if (noise)
            printf("±SE: the standard error of the difference to dense from the %s samples the "
                   "two models disagree on; a cost within 2 SE of zero may be the sample's noise, "
                   "and such a layer keeps SPEC whatever the threshold (a longer probe or a "
                   "larger --val separates them)\n",
                   on);
        snprintf(path, sizeof path, "%s/layer_policy.txt", outdir);
        f = fopen(path, "w");
        if (f) {
            fprintf(f, "%s\n", pol);
            fclose(f);
        }
        printf("layer policy (a --compare method): %s\nwrote %s/sensitivity.txt, "
               "%s/layer_policy.txt\n",
               pol, outdir, outdir);
    }
    for (size_t k = 0; k < nc; k++) free(names[k]);
    free(names);
    free(sizes);
    free(acc);
    free(se);
    free(dense_v.right);
    return rc;
}

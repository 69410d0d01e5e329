/*
 * cmd_train.c - `gradcomp train`: data-parallel training on Fashion-MNIST, one run per
 * method from the same initial weights and seed, and a table of what each method cost
 * and gained (accuracy, bytes per step, effective ratio, step / codec / comm time, time to
 * the target accuracy), with results.json, metrics.csv and PNG plots.
 *
 * Launching: `--np P` re-executes this program under `mpirun -np P` (as torchrun does);
 * with `--link RATE` the ranks run on P bandwidth-shaped hosts (scripts/netsim, root).
 * Started by mpirun directly, it simply runs.
 */
#define _GNU_SOURCE
#include "../cli.h"

#include "data.h"
#include "model.h"
#include "gradcomp_mpi.h"
#include "ps_train.h"
#include "sensitivity.h"
#include "train_adapt.h"
#include "trainer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef GCOMP_SOURCE_DIR
#define GCOMP_SOURCE_DIR "."
#endif

#define MAX_METHODS 16
#define MAX_RUNS (4 * MAX_METHODS) /* each method through the collectives and up to 3 PS modes */

#define MAX_HOST_RATES 8

typedef struct opts {
    gtrain_config cfg;
    int np;
    const char *link, *out, *data, *calibration, *sensitivity;
    double threshold_pp;      /* --sensitivity: a layer costing more goes a decade lighter */
    double target, tolerance; /* --target-acc (fraction, < 0: dense's); --target-tolerance */
    long val;                 /* --val: samples held out for validation (-1: auto) */
    const char *host_rate[MAX_HOST_RATES]; /* netsim: "I:RATE", host I's own link */
    int nhost_rates;
    const char *delay_us; /* netsim: one-way delay per host */
    char *methods[MAX_METHODS];
    int nmethods;
    /* --ps S[:MODE,...] (ps_train.h): S servers after the --np workers */
    int ps_servers, ps_modes[3], ps_nmodes, ps_only;
    gtrain_ps_config ps;
} opts;

static const char *usage_text =
    "usage: gradcomp train [--np P] [--link RATE] [--model mlp|mlp-large|cnn] [--hidden H]\n"
    "                      [--epochs E] [--batch B] [--lr LR] [--momentum M] [--wd WD]\n"
    "                      [--compare M1,M2,...] [--target-acc A] [--target-tolerance PP]\n"
    "                      [--out DIR]\n"
    "                      [--data DIR|synthetic] [--seed S] [--evals N] [--min-elements N]\n"
    "                      [--min-k K] [--dense-spec SPEC] [--strategy S] [--max-steps N] "
    "[--timeout SEC]\n"
    "                      [--lr-schedule const|cosine|step] [--loss mean|sum]\n"
    "                      [--time-budget SEC] [--calibration FILE] [--val N|auto] [--quiet]\n"
    "                      [--local-steps H] [--outer sgd|nesterov[:lr=X,momentum=M]]\n"
    "                      [--stream F] [--stream-delay D] [--mix A] [--ef-decay B]\n"
    "                      [--ps S[:sync|async|device,...]] [--ps-only] [--ps-update]\n"
    "                      [--ps-pull SPEC|same] [--ps-momentum M] [--ranks-per-node K]\n"
    "                      [--slow-rank R:FACTOR] [--host-rate I:RATE]... [--delay-us D]\n"
    "       gradcomp train --sensitivity SPEC [--threshold PP] [the options above]\n"
    "methods: dense, dense-f16, any spec (e.g. dgc:density=0.001, powersgd:rank=4,\n"
    "         twobit:threshold=0.5, sign:feedback=ef), policy:<policy string>, or an\n"
    "         adaptive method adapt:CTL[+CTL...][;KEY=VALUE...] with controllers norm,\n"
    "         layers, bandwidth, accuracy (e.g. adapt:norm;base=dgc:density=0.001,\n"
    "         adapt:bandwidth+layers, adapt:accuracy;target=88.4; docs/ADAPTIVE.md);\n"
    "         --compare splits on commas, and a piece KEY=VALUE (no ':' or ';' before the\n"
    "         '=') or ;KEY=VALUE continues the previous one (dgc:density=0.001,momentum=0.9\n"
    "         stays one);\n"
    "         METHOD@STRATEGY picks the MPI strategy for one method (sign@allgather);\n"
    "         SPEC;KEY=VALUE sets policy items for one method (twobit;min_elements=16384).\n"
    "policy:  tensors under --min-elements (default 8192) and 1-D tensors use --dense-spec\n"
    "         (default none:values=f16) in every method but dense and dense-f16; a SPEC\n"
    "         method whose codec counts from density= (topk, dgc, randomk, sampled) sends\n"
    "         at least --min-k values of a tensor a step (default 512; 0: exactly\n"
    "         ceil(density * n)), so the 10 x 1024 classifier is not cut to 11 values.\n"
    "--lr-schedule: const (default), cosine (to 0 at the end of the run), or step (/10 at\n"
    "         1/2 and 3/4 of the run); the same for every method.\n"
    "--time-budget: each method stops at the first evaluation after SEC seconds of\n"
    "         training (--evals sets how often that is); time to the target accuracy\n"
    "         then compares methods on equal time, in one command.\n"
    "--target-acc A: the accuracy time to target is measured to (85 or 0.85); by default\n"
    "         the dense run's final accuracy minus --target-tolerance PP percentage points\n"
    "         (default 0), so that a run cut by --time-budget while still improving gives\n"
    "         the compressed methods a target dense itself reached before its last\n"
    "         evaluation.\n"
    "--val N: hold N training samples out as a validation split (the same samples for every\n"
    "         --seed), evaluated beside the test set; accuracy-driven methods and\n"
    "         --sensitivity then decide on it, never on the test set the table reports.\n"
    "         auto (default): a twelfth of the training set (5000 of Fashion-MNIST's 60000)\n"
    "         when a method has the accuracy controller or with --sensitivity, else none;\n"
    "         every method of the command trains on the same remaining samples.\n"
    "--loss:  the gradient the methods compress: of the batch's mean loss (default,\n"
    "         PyTorch's unit) or of its summed loss (MXNet's, where the optimizer divides by\n"
    "         the batch); dense training is the same, but absolute thresholds (twobit's,\n"
    "         threshold's) mean B times less in the summed unit.\n"
    "--sensitivity: one run with every tensor dense, then one per layer the policy\n"
    "         compresses with SPEC alone (keep it short: --max-steps, --epochs); prints each\n"
    "         layer's accuracy cost and writes a layer policy (OUT/layer_policy.txt) that\n"
    "         sends layers costing more than --threshold pp (default 0.1) and more than\n"
    "         two standard errors (the validation samples' noise) a decade lighter.\n"
    "--calibration: the cost model's calibration (gradcomp plan --calibrate; default\n"
    "         $GRADCOMP_CALIBRATION or ~/.cache/gradcomp/calibration.txt): each method's\n"
    "         predicted step time is recorded beside the measured one.\n"
    "--local-steps H: local SGD / DiLoCo (docs/LOCAL_SGD.md): each rank takes H steps of\n"
    "         its own SGD, then the method's spec compresses the pseudo-gradient (weights at\n"
    "         the last sync minus weights now), the ranks average it and --outer applies it\n"
    "         (sgd: lr 1, momentum 0; nesterov: DiLoCo's lr 0.7, momentum 0.9). --stream F\n"
    "         syncs F fragments of the model on a staggered schedule, each overlapping\n"
    "         --stream-delay inner steps (default ceil(H/F)), merged with --mix alpha\n"
    "         (Streaming DiLoCo); --ef-decay beta decays the residual (SparseLoCo).\n"
    "         One method alone: SPEC;local_steps=H;outer=...;stream=F;stream_delay=D;mix=A;\n"
    "         ef_decay=B (dense;local_steps=32;outer=nesterov is DiLoCo next to dense).\n"
    "--host-rate I:RATE, --delay-us D (with --link): host I gets its own link rate (an\n"
    "         edge device), every host D microseconds of one-way delay (scripts/netsim;\n"
    "         ranks are placed one per host, the parameter servers last).\n"
    "--ps:    S parameter-server ranks besides the --np workers (MXNet kvstore / BytePS):\n"
    "         every method also runs through them in each MODE (sync = dist_sync, async =\n"
    "         dist_async with the optimizer on the servers, device = dist_sync_device,\n"
    "         workers summing densely in nodes of --ranks-per-node K, default 2), after its\n"
    "         collective run (skipped with --ps-only); --ps-update puts the optimizer on\n"
    "         the servers in sync mode too; --ps-pull compresses pulls (BytePS; sync);\n"
    "         --ps-momentum: the servers' momentum in async mode (default\n"
    "         1 - W (1 - --momentum), at least 0: asynchrony adds momentum by itself).\n"
    "--slow-rank: worker R computes FACTOR times slower (it sleeps the difference).\n";

/* Splits a --compare list into methods (see usage_text). */
static int split_methods(opts *o, const char *list) {
    char *copy = strdup(list), *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ') p++;
        if (!*p) continue;
        /* KEY=VALUE with a bare key continues the previous method (its spec's next key), as
         * does ";KEY=VALUE" (a policy item, an adaptive method's ;base=...); "dense;local_steps=8"
         * or "topk:..." starts a new one. */
        size_t kl = strcspn(p, "=");
        if (((p[kl] == '=' && strcspn(p, ":;") >= kl) || p[0] == ';') && o->nmethods > 0) {
            char *prev = o->methods[o->nmethods - 1];
            size_t l = strlen(prev) + strlen(p) + 2;
            char *joined = malloc(l);
            snprintf(joined, l, "%s,%s", prev, p);
            free(prev);
            o->methods[o->nmethods - 1] = joined;
        } else {
            if (o->nmethods == MAX_METHODS) {
                free(copy);
                return cli_fail("train", 2, "at most %d methods", MAX_METHODS);
            }
            o->methods[o->nmethods++] = strdup(p);
        }
    }
    free(copy);
    return 0;
}

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    gtrain_config *c = &o->cfg;
    c->model = "mlp";
    c->epochs = 2;
    c->batch = 32;
    c->lr = 0.05f;
    c->momentum = 0.9f;
    c->weight_decay = 1e-4f;
    c->seed = 1;
    c->evals_per_epoch = 4;
    c->policy.min_elements = 8192;
    c->policy.min_k = 512;
    c->policy.dense_spec = "none:values=f16";
    c->timeout_s = 120;
    c->slow_rank = -1;
    o->ps.async_momentum = -1; /* auto: gtrain_ps_momentum */
    c->progress = isatty(2) ? 2 : 1;
    gtrain_outer_cfg_default(&c->outer);
    o->out = "out";
    o->target = -1;
    o->val = -1;
    o->threshold_pp = 0.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t cnt;
        if (!strcmp(a, "--quiet")) {
            c->progress = 0;
            continue;
        }
        if (!strcmp(a, "--ps-only") || !strcmp(a, "--ps-update")) {
            *(!strcmp(a, "--ps-only") ? &o->ps_only : &o->ps.update) = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!v) return cli_fail("train", 2, "option %s needs a value\n%s", a, usage_text);
        i++;
        if (!strcmp(a, "--np")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 256)
                return cli_fail("train", 2, "--np %s: 1..256", v);
            o->np = (int)cnt;
        } else if (!strcmp(a, "--link"))
            o->link = v;
        else if (!strcmp(a, "--model"))
            c->model = v;
        else if (!strcmp(a, "--hidden"))
            c->hidden = v;
        else if (!strcmp(a, "--epochs")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1000)
                return cli_fail("train", 2, "--epochs %s: 1..1000", v);
            c->epochs = (int)cnt;
        } else if (!strcmp(a, "--batch")) {
            if (cli_parse_count(v, &c->batch) || c->batch < 1 || c->batch > 65536)
                return cli_fail("train", 2, "--batch %s: 1..65536", v);
        } else if (!strcmp(a, "--lr"))
            c->lr = strtof(v, NULL);
        else if (!strcmp(a, "--momentum"))
            c->momentum = strtof(v, NULL);
        else if (!strcmp(a, "--wd"))
            c->weight_decay = strtof(v, NULL);
        else if (!strcmp(a, "--compare") || !strcmp(a, "--method")) {
            if (split_methods(o, v)) return 2;
        } else if (!strcmp(a, "--target-acc")) {
            o->target = strtod(v, NULL);
            if (o->target > 1) o->target /= 100; /* 85 means 85 % */
        } else if (!strcmp(a, "--target-tolerance")) {
            char *end;
            o->tolerance = strtod(v, &end);
            if (*end || !(o->tolerance >= 0 && o->tolerance < 100))
                return cli_fail("train", 2, "--target-tolerance %s: percentage points, 0..100", v);
        } else if (!strcmp(a, "--val")) {
            if (strcmp(v, "auto") && (cli_parse_count(v, &cnt) || cnt > LONG_MAX))
                return cli_fail("train", 2, "--val %s: a sample count or auto", v);
            o->val = strcmp(v, "auto") ? (long)cnt : -1;
        } else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--data"))
            o->data = v;
        else if (!strcmp(a, "--seed")) {
            size_t s;
            if (cli_parse_count(v, &s)) return cli_fail("train", 2, "--seed %s: an integer", v);
            c->seed = s;
        } else if (!strcmp(a, "--evals")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1000)
                return cli_fail("train", 2, "--evals %s: 1..1000", v);
            c->evals_per_epoch = (int)cnt;
        } else if (!strcmp(a, "--min-elements")) {
            if (cli_parse_count(v, &c->policy.min_elements))
                return cli_fail("train", 2, "--min-elements %s", v);
        } else if (!strcmp(a, "--min-k")) {
            if (cli_parse_count(v, &cnt) || cnt > UINT32_MAX)
                return cli_fail("train", 2, "--min-k %s: 0..4294967295", v);
            c->policy.min_k = (size_t)cnt;
        } else if (!strcmp(a, "--strategy")) {
            if (gcomp_mpi_strategy_parse(v, &c->strategy) != GCOMP_OK)
                return cli_fail("train", 2,
                                "--strategy %s: auto, allgather, sparse, allreduce, rsag, "
                                "hierarchical[:NAME]",
                                v);
        } else if (!strcmp(a, "--dense-spec")) {
            c->policy.dense_spec = v;
        } else if (!strcmp(a, "--max-steps")) {
            if (cli_parse_count(v, &cnt)) return cli_fail("train", 2, "--max-steps %s", v);
            c->max_steps_per_epoch = (double)cnt;
        } else if (!strcmp(a, "--time-budget")) {
            char *end;
            c->time_budget_s = strtod(v, &end);
            if (*end || !(c->time_budget_s > 0) || !isfinite(c->time_budget_s))
                return cli_fail("train", 2, "--time-budget %s: seconds > 0", v);
        } else if (!strcmp(a, "--lr-schedule")) {
            static const char *const names[] = {"const", "cosine", "step"};
            c->lr_schedule = -1;
            for (int k = 0; k < 3; k++)
                if (!strcmp(v, names[k])) c->lr_schedule = k;
            if (c->lr_schedule < 0)
                return cli_fail("train", 2, "--lr-schedule %s: const, cosine or step", v);
        } else if (!strcmp(a, "--loss")) {
            if (strcmp(v, "mean") && strcmp(v, "sum"))
                return cli_fail("train", 2, "--loss %s: mean or sum", v);
            c->summed_loss = !strcmp(v, "sum");
        } else if (!strcmp(a, "--calibration")) {
            o->calibration = v;
        } else if (!strcmp(a, "--sensitivity")) {
            o->sensitivity = v;
        } else if (!strcmp(a, "--threshold")) {
            char *end;
            o->threshold_pp = strtod(v, &end);
            if (*end || !isfinite(o->threshold_pp))
                return cli_fail("train", 2, "--threshold %s: percentage points", v);
        } else if (!strcmp(a, "--timeout")) {
            c->timeout_s = strtod(v, NULL);
        } else if (!strcmp(a, "--local-steps")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1000000)
                return cli_fail("train", 2, "--local-steps %s: 1..1000000 inner steps", v);
            c->outer.local_steps = (unsigned)cnt;
        } else if (!strcmp(a, "--outer")) {
            char e[256];
            if (gtrain_outer_parse(v, &c->outer, e, sizeof e))
                return cli_fail("train", 2, "--outer: %s", e);
        } else if (!strcmp(a, "--stream")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1024)
                return cli_fail("train", 2, "--stream %s: 1..1024 fragments", v);
            c->outer.stream = (unsigned)cnt;
        } else if (!strcmp(a, "--stream-delay")) {
            if (cli_parse_count(v, &cnt) || cnt > 1000000)
                return cli_fail("train", 2, "--stream-delay %s: inner steps", v);
            c->outer.delay = (int)cnt;
        } else if (!strcmp(a, "--mix")) {
            char *end;
            c->outer.mix = strtod(v, &end);
            if (*end || !(c->outer.mix >= 0 && c->outer.mix < 1))
                return cli_fail("train", 2, "--mix %s: alpha in [0, 1)", v);
        } else if (!strcmp(a, "--ef-decay")) {
            char *end;
            c->outer.ef_decay = strtod(v, &end);
            if (*end || !(c->outer.ef_decay >= 0 && c->outer.ef_decay <= 1))
                return cli_fail("train", 2, "--ef-decay %s: beta in [0, 1]", v);
        } else if (!strcmp(a, "--host-rate")) {
            if (o->nhost_rates == MAX_HOST_RATES)
                return cli_fail("train", 2, "at most %d --host-rate", MAX_HOST_RATES);
            if (!strchr(v, ':'))
                return cli_fail("train", 2, "--host-rate %s: I:RATE, e.g. 3:10mbit", v);
            o->host_rate[o->nhost_rates++] = v;
        } else if (!strcmp(a, "--delay-us")) {
            if (cli_parse_count(v, &cnt))
                return cli_fail("train", 2, "--delay-us %s: microseconds", v);
            o->delay_us = v;
        } else if (!strcmp(a, "--ps")) {
            char e[160];
            if (gtrain_ps_parse(v, &o->ps_servers, o->ps_modes, &o->ps_nmodes, e, sizeof e))
                return cli_fail("train", 2, "%s", e);
        } else if (!strcmp(a, "--ps-pull")) {
            o->ps.pull = v;
        } else if (!strcmp(a, "--ps-momentum")) {
            o->ps.async_momentum = strtof(v, NULL);
            if (!(o->ps.async_momentum >= 0 && o->ps.async_momentum < 1))
                return cli_fail("train", 2, "--ps-momentum %s: in [0, 1)", v);
        } else if (!strcmp(a, "--ranks-per-node")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 256)
                return cli_fail("train", 2, "--ranks-per-node %s: 1..256", v);
            o->ps.ranks_per_node = (int)cnt;
        } else if (!strcmp(a, "--slow-rank")) {
            char *end;
            long r = strtol(v, &end, 10);
            double f = *end == ':' ? strtod(end + 1, &end) : 0;
            if (r < 0 || *end || !(f >= 1) || !isfinite(f))
                return cli_fail("train", 2, "--slow-rank %s: R:FACTOR, FACTOR >= 1", v);
            c->slow_rank = (int)r;
            c->slow_factor = f;
        } else
            return cli_fail("train", 2, "unknown option '%s'\n%s", a, usage_text);
    }
    if (!(c->lr > 0) || !(c->momentum >= 0 && c->momentum < 1) || !(c->weight_decay >= 0))
        return cli_fail("train", 2, "--lr must be > 0, --momentum in [0, 1), --wd >= 0");
    if (o->nmethods == 0) split_methods(o, "dense");
    if ((o->nhost_rates || o->delay_us) && !o->link)
        return cli_fail("train", 2,
                        "--host-rate and --delay-us shape netsim links: add --link RATE");
    if (o->sensitivity && (o->ps_servers || c->outer.local_steps))
        return cli_fail("train", 2,
                        "--sensitivity measures the collectives' per-step exchange: "
                        "drop --ps and --local-steps");
    if (o->ps_servers && c->outer.local_steps)
        return cli_fail("train", 2,
                        "--local-steps and --ps: local SGD syncs weights over the "
                        "collectives, the parameter server does not run it");
    if ((o->ps_only || o->ps.update || o->ps.pull) && !o->ps_servers)
        return cli_fail("train", 2, "--ps-only, --ps-update and --ps-pull need --ps S");
    return 0;
}

static int under_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* Re-executes this program under mpirun (or netsim for --link) without --np/--link. */
static int relaunch(int argc, char **argv, const opts *o) {
    char self[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    if (l <= 0) return cli_fail("train", 1, "cannot find my own executable: %s", strerror(errno));
    self[l] = 0;
    char **av = calloc((size_t)argc + 64, sizeof *av);
    int n = 0;
    char np[16], cores[16];
    snprintf(np, sizeof np, "%d", o->np + o->ps_servers); /* workers, then the servers */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(cores, sizeof cores, "%ld", ncpu);
    if (o->link) {
        if (geteuid() != 0)
            return cli_fail(
                "train", 1,
                "--link %s shapes network namespaces and needs root (run as root, or drop --link)",
                o->link);
        /* netsim stops a job after 300 s unless told otherwise; a training run is longer. */
        setenv("NETSIM_TIMEOUT", "86400", 0);
        av[n++] = "bash";
        av[n++] = GCOMP_SOURCE_DIR "/scripts/netsim";
        av[n++] = "job";
        av[n++] = np;
        av[n++] = (char *)o->link;
        av[n++] = np;
        for (int k = 0; k < o->nhost_rates; k++) {
            av[n++] = "--host-rate";
            av[n++] = (char *)o->host_rate[k];
        }
        if (o->delay_us) {
            av[n++] = "--delay-us";
            av[n++] = (char *)o->delay_us;
        }
        av[n++] = "-x";
        av[n++] = "OPENBLAS_NUM_THREADS=1";
        av[n++] = "-x";
        av[n++] = "OMP_NUM_THREADS=1";
        static char linkvar[96]; /* so the ranks can name the link in results and plots */
        snprintf(linkvar, sizeof linkvar, "GCOMP_TRAIN_LINK=%s", o->link);
        av[n++] = "-x";
        av[n++] = linkvar;
        static char delayvar[64]; /* and predict with its delay */
        snprintf(delayvar, sizeof delayvar, "GCOMP_TRAIN_DELAY_US=%s",
                 o->delay_us ? o->delay_us : "0");
        av[n++] = "-x";
        av[n++] = delayvar;
        av[n++] = "--";
    } else {
        av[n++] = "mpirun";
        if (geteuid() == 0) av[n++] = "--allow-run-as-root";
        if (o->np + o->ps_servers > ncpu) av[n++] = "--oversubscribe";
        av[n++] = "-np";
        av[n++] = np;
        /* One rank per core: BLAS and OpenMP threads inside a rank would only fight the
         * other ranks for the cores (busy-waiting barriers make that very costly). */
        av[n++] = "-x";
        av[n++] = "OPENBLAS_NUM_THREADS=1";
        av[n++] = "-x";
        av[n++] = "OMP_NUM_THREADS=1";
    }
    av[n++] = self;
    av[n++] = "train";
    static char outabs[PATH_MAX + 8], dataabs[PATH_MAX + 8];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--np") || !strcmp(argv[i], "--link") ||
            !strcmp(argv[i], "--host-rate") || !strcmp(argv[i], "--delay-us")) {
            i++;
            continue;
        }
        av[n++] = argv[i];
        /* Ranks may start elsewhere (netsim): make paths absolute. */
        if ((!strcmp(argv[i], "--out") || !strcmp(argv[i], "--data")) && i + 1 < argc &&
            argv[i + 1][0] != '/' && strcmp(argv[i + 1], "synthetic")) {
            char *dst = !strcmp(argv[i], "--out") ? outabs : dataabs;
            char cwd[PATH_MAX];
            if (!getcwd(cwd, sizeof cwd))
                return cli_fail("train", 1, "getcwd: %s", strerror(errno));
            snprintf(dst, PATH_MAX + 8, "%s/%s", cwd, argv[i + 1]);
            av[n++] = dst;
            i++;
        }
    }
    bool has_out = false;
    for (int i = 1; i < argc; i++) has_out |= !strcmp(argv[i], "--out");
    if (!has_out) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return cli_fail("train", 1, "getcwd: %s", strerror(errno));
        snprintf(outabs, sizeof outabs, "%s/%s", cwd, o->out);
        av[n++] = "--out";
        av[n++] = outabs;
    }
    av[n] = NULL;
    fflush(NULL);
    execvp(av[0], av);
    return cli_fail("train", 1, "cannot run %s: %s (apt-get install openmpi-bin)", av[0],
                    strerror(errno));
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* ,"name":value, null for NaN or Inf (a target never reached, a missing baseline). */
static void json_num(FILE *f, const char *name, double v) {
    fprintf(f, ",\"%s\":", name);
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* mkdir -p: the output directory and any parent it lacks (out/run-1 on a fresh clone). */
static void make_dirs(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

/* The setting of tensor `ti` in force at `epoch` (the last change at or before it), or NULL. */
static const gtrain_setting *setting_at(const gtrain_result *r, size_t ti, double epoch) {
    const gtrain_setting *s = NULL;
    for (size_t k = 0; k < r->nsettings; k++)
        if (r->settings[k].tensor == ti && r->settings[k].epoch <= epoch + 1e-9)
            s = &r->settings[k];
    return s;
}

/* "name=density/bits;..." for every tensor an adaptive method manages, at `epoch`. */
static void settings_text(const gtrain_result *r, double epoch, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t ti = 0; ti < r->ntensors; ti++) {
        const gtrain_setting *s = setting_at(r, ti, epoch);
        if (!s) continue;
        int w = snprintf(out + used, cap - used, "%s%s=%.3g/%g", used ? ";" : "",
                         r->tensor_names[ti], s->density, s->bits);
        if (w < 0 || (size_t)w >= cap - used) return;
        used += (size_t)w;
    }
}

/* Per adaptive method, every decision's inputs and each candidate's predicted step
 * (decisions.csv, a row per decision and candidate): why it chose what it chose.  metric:
 * what the accuracy controller saw (the validation split's accuracy when there is one). */
static void write_decisions(const opts *o, const gtrain_result *r, int nr) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/decisions.csv", o->out);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "method,decision,step,epoch,link_MBps,latency_ms,compute_ms,measure_s,probe_s,"
               "next_measure_step,level,candidate,predicted_ms,chosen,metric\n");
    for (int i = 0; i < nr; i++)
        for (size_t k = 0; k < r[i].ndlog; k++) {
            const gtrain_decision *d = &r[i].dlog[k];
            fprintf(f, "\"%s\",%zu,%zu,%.4f,%.6g,%.6g,%.6g,%.4g,%.4g,%zu,%zu,\"%s\",%.6g,%d,%.6f\n",
                    r[i].method, d->decision, d->step, d->epoch, d->bandwidth / 1e6,
                    1e3 * d->latency, 1e3 * d->compute_s, d->measure_s, d->probe_s, d->next_measure,
                    d->candidate, d->candidate < r[i].nladder ? r[i].ladder[d->candidate] : "",
                    1e3 * d->predicted_s, d->chosen, d->metric);
        }
    fclose(f);
}

/* Every plot is 900 pixels wide; a plot of more panels is taller. */
static void gp_terminal(FILE *gp, int height) {
    fprintf(gp, "set terminal pngcairo noenhanced size 900,%d font 'sans,10'\n", height);
}

/* The link the method measured, one point per decision that had a reading (link-N.dat:
 * epoch, MB/s); the number of points.  A link reshaped mid-run shows here, beside the
 * settings that followed it. */
static size_t write_link(const opts *o, const gtrain_result *r, int i) {
    size_t n = 0;
    FILE *d = NULL;
    for (size_t k = 0; k < r->ndlog; k++) {
        const gtrain_decision *x = &r->dlog[k];
        if (!x->chosen || !(x->bandwidth > 0) || !isfinite(x->bandwidth)) continue;
        if (!d) {
            char dp[PATH_MAX];
            snprintf(dp, sizeof dp, "%s/link-%d.dat", o->out, i);
            if (!(d = fopen(dp, "w"))) return 0;
        }
        fprintf(d, "%.6g %.6g\n", x->epoch, x->bandwidth / 1e6);
        n++;
    }
    if (d) fclose(d);
    return n;
}

/* Per adaptive method: its settings over time (settings.csv) and a plot of each tensor's
 * message bytes against the epoch beside the test accuracy, and below them the link it
 * measured where it measured one (bandwidth).  The method, often longer than the plot is
 * wide, has the title's second line; in the panel its curve is "adaptive". */
static void write_adaptive(const opts *o, gtrain_result *r, int nr, const char *head, double target,
                           FILE *gp) {
    char path[PATH_MAX];
    write_decisions(o, r, nr);
    snprintf(path, sizeof path, "%s/settings.csv", o->out);
    FILE *f = fopen(path, "w");
    /* density is gcomp_spec_info's (1 for a codec without one, PowerSGD); spec names it */
    if (f) fprintf(f, "method,step,epoch,tensor,density,value_bits,message_bytes,spec\n");
    int dense = -1;
    for (int i = 0; i < nr; i++)
        if (!strcmp(r[i].method, "dense")) dense = i;
    for (int i = 0; i < nr; i++) {
        if (!r[i].nsettings) continue;
        for (size_t k = 0; f && k < r[i].nsettings; k++) {
            const gtrain_setting *s = &r[i].settings[k];
            const char *spec =
                s->level >= 0 && (size_t)s->level < r[i].nladder ? r[i].ladder[s->level] : "";
            fprintf(f, "\"%s\",%zu,%.4f,%s,%.6g,%g,%.0f,\"%s\"\n", r[i].method, s->step, s->epoch,
                    r[i].tensor_names[s->tensor], s->density, s->bits, s->bytes, spec);
        }
        /* one data file per managed tensor: a step line to the end of the run */
        double end = r[i].npoints ? r[i].points[r[i].npoints - 1].epoch : 0;
        size_t nlink = write_link(o, &r[i], i);
        if (nlink) gp_terminal(gp, 800); /* three panels */
        fprintf(gp,
                "set output '%s/adapt-%d.png'\nset multiplot layout %d,1 title \"%s\\n%s\" font "
                "',8'\nset lmargin 12\nunset title\nunset arrow 1\nunset label 1\n"
                "set xlabel 'epoch'\nunset logscale x\nset xrange [0:%g]\nset ylabel 'test "
                "accuracy (%%)'\nset yrange [*:*]\nunset logscale y\nplot '%s/curve-%d.dat' using "
                "4:3 with linespoints title 'adaptive'",
                o->out, i, nlink ? 3 : 2, head, r[i].method, end > 0 ? end : 1, o->out, i);
        if (dense >= 0)
            fprintf(gp, ", '%s/curve-%d.dat' using 4:3 with linespoints title 'dense'", o->out,
                    dense);
        /* the target in the key: a label on its line would sit on the curves or the title */
        if (isfinite(target))
            fprintf(gp, ", %.4f with lines dashtype 2 lc rgb 'gray30' title 'target %.2f %%'",
                    100 * target, 100 * target);
        /* bytes, not density: a cross-codec ladder (PowerSGD has no density) ranks by them */
        fprintf(gp, "\nset ylabel 'message bytes per step'\nset logscale y\nplot ");
        int first = 1;
        for (size_t ti = 0; ti < r[i].ntensors; ti++) {
            if (!setting_at(&r[i], ti, end)) continue;
            char dp[PATH_MAX];
            snprintf(dp, sizeof dp, "%s/settings-%d-%zu.dat", o->out, i, ti);
            FILE *d = fopen(dp, "w");
            if (!d) continue;
            for (size_t k = 0; k < r[i].nsettings; k++)
                if (r[i].settings[k].tensor == ti)
                    fprintf(d, "%.6g %.6g %g %.0f\n", r[i].settings[k].epoch,
                            r[i].settings[k].density, r[i].settings[k].bits,
                            r[i].settings[k].bytes);
            const gtrain_setting *s = setting_at(&r[i], ti, end);
            fprintf(d, "%.6g %.6g %g %.0f\n", end, s->density, s->bits, s->bytes);
            fclose(d);
            fprintf(gp, "%s'%s' using 1:4 with steps lw 2 title '%s'", first ? "" : ", ", dp,
                    r[i].tensor_names[ti]);
            first = 0;
        }
        if (nlink)
            fprintf(gp,
                    "\nset ylabel 'measured link (MB/s)'\nplot '%s/link-%d.dat' using 1:2 with "
                    "steps lw 2 title 'at each decision'",
                    o->out, i);
        fprintf(gp,
                "\nunset multiplot\nunset lmargin\nunset logscale y\nset yrange [*:*]\nset xrange "
                "[*:*]\n");
        if (nlink) gp_terminal(gp, 560);
    }
    if (f) fclose(f);
}

/* Whether any method sent a byte.  A single rank sends nothing, and a log axis of bytes has
 * then no point to draw: gnuplot would refuse the whole script. */
static bool sends_bytes(const gtrain_result *r, int nr) {
    for (int i = 0; i < nr; i++)
        for (size_t j = 0; j < r[i].npoints; j++)
            if (r[i].points[j].bytes > 0) return true;
    return false;
}

/* The dense run the others are compared with: the first (the collective's, where a
 * parameter-server dense follows it); NULL without one. */
static const gtrain_result *dense_of(const gtrain_result *r, int nr) {
    for (int i = 0; i < nr; i++)
        if (!strcmp(r[i].method, "dense")) return &r[i];
    return NULL;
}

/* *plotted: gnuplot drew the plots (the bytes plot only where sends_bytes). */
static int write_outputs(const opts *o, gtrain_result *r, int nr, double target, int P,
                         bool bytes_plot, bool *plotted) {
    make_dirs(o->out);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.json", o->out);
    FILE *f = fopen(path, "w");
    if (!f) return cli_fail("train", 1, "cannot write %s: %s", path, strerror(errno));
    const gtrain_result *dense = dense_of(r, nr);
    double dense_acc = dense ? dense->final_acc : NAN;
    fprintf(f, "{\"model\":");
    json_string(f, o->cfg.model);
    fprintf(f,
            ",\"ranks\":%d,\"epochs\":%d,\"batch_per_rank\":%zu,\"lr\":%g,\"momentum\":%g,"
            "\"lr_schedule\":\"%s\",\"loss\":\"%s\",\"seed\":%llu,\"link\":",
            P, o->cfg.epochs, o->cfg.batch, o->cfg.lr, o->cfg.momentum,
            o->cfg.lr_schedule == GTRAIN_LR_COSINE ? "cosine"
            : o->cfg.lr_schedule == GTRAIN_LR_STEP ? "step"
                                                   : "const",
            o->cfg.summed_loss ? "sum" : "mean", (unsigned long long)o->cfg.seed);
    if (o->link)
        json_string(f, o->link);
    else
        fputs("null", f);
    json_num(f, "target_accuracy", target);
    json_num(f, "time_budget_s", o->cfg.time_budget_s > 0 ? o->cfg.time_budget_s : NAN);
    fprintf(f, ",\"servers\":%d,\"validation_samples\":%zu", o->ps_servers,
            o->cfg.val ? o->cfg.val->n : 0);
    if (o->cfg.slow_factor > 1)
        fprintf(f, ",\"slow_rank\":%d,\"slow_factor\":%g", o->cfg.slow_rank, o->cfg.slow_factor);
    fprintf(f, ",\"methods\":[");
    for (int i = 0; i < nr; i++) {
        gtrain_result *x = &r[i];
        fprintf(f, "%s\n {\"method\":", i ? "," : "");
        json_string(f, x->method);
        fprintf(f, ",\"specs\":");
        json_string(f, x->detail);
        fprintf(f, ",\"local_steps\":%u,\"outer\":", x->local_steps);
        if (x->local_steps)
            json_string(f, x->outer);
        else
            fputs("null", f);
        json_num(f, "test_accuracy", x->final_acc);
        json_num(f, "best_accuracy", x->best_acc);
        json_num(f, "validation_accuracy", x->final_val_acc);
        json_num(f, "delta_vs_dense_pp", 100 * (x->final_acc - dense_acc));
        bool other = dense && dense != x;
        json_num(f, "delta_vs_dense_se_pp",
                 other ? 100 * gtrain_paired_se(&x->test_verdicts, &dense->test_verdicts) : NAN);
        json_num(f, "validation_delta_vs_dense_pp",
                 other ? 100 * (x->final_val_acc - dense->final_val_acc) : NAN);
        json_num(f, "validation_delta_vs_dense_se_pp",
                 other ? 100 * gtrain_paired_se(&x->val_verdicts, &dense->val_verdicts) : NAN);
        json_num(f, "bytes_per_step", x->bytes_per_step);
        json_num(f, "bytes_per_worker", x->bytes_total);
        json_num(f, "dense_bytes_per_step", x->dense_bytes_per_step);
        json_num(f, "effective_ratio", x->ratio);
        json_num(f, "traffic_ratio", x->traffic_ratio);
        json_num(f, "step_ms", x->step_ms);
        json_num(f, "first_step_ms", x->first_step_ms > 0 ? x->first_step_ms : NAN);
        json_num(f, "steady_step_ms", x->steady_step_ms > 0 ? x->steady_step_ms : NAN);
        json_num(f, "compute_ms", x->compute_ms);
        json_num(f, "codec_ms", x->codec_ms);
        json_num(f, "comm_ms", x->comm_ms);
        json_num(f, "train_seconds", x->wall_s);
        json_num(f, "predicted_step_ms", x->predicted ? x->pred_step_ms : NAN);
        json_num(f, "predicted_codec_ms", x->predicted ? x->pred_codec_ms : NAN);
        json_num(f, "predicted_exposed_comm_ms", x->predicted ? x->pred_exposed_ms : NAN);
        json_num(f, "predicted_bytes_per_step", x->predicted ? x->pred_bytes_per_step : NAN);
        json_num(f, "compute_only_ms", x->predicted ? x->pure_compute_ms : NAN);
        double tt = gtrain_time_to(x, target);
        json_num(f, "time_to_target_s", tt >= 0 ? tt : NAN);
        fprintf(f, ",\"stopped_by_budget\":%s", x->stopped_by_budget ? "true" : "false");
        fprintf(f, ",\"exchange\":");
        json_string(f, x->exchange[0] ? x->exchange : "collective");
        if (x->exchange[0]) {
            json_num(f, "ps_momentum", x->ps_momentum);
            json_num(f, "ps_pushed_bytes_per_step", x->ps_pushed_per_step);
            json_num(f, "ps_pulled_bytes_per_step", x->ps_pulled_per_step);
            json_num(f, "ps_server_busy", x->ps_server_busy);
            json_num(f, "ps_staleness_mean", x->ps_stale_mean);
            json_num(f, "ps_staleness_max", x->ps_stale_max);
            json_num(f, "ps_queue_max", x->ps_queue_max);
            json_num(f, "ps_worker_steps_min", x->ps_worker_steps_min);
            json_num(f, "ps_worker_steps_max", x->ps_worker_steps_max);
            fprintf(f, ",\"ps_workers_lost\":%d", x->ps_workers_lost);
        }
        if (x->nsettings) {
            char st[2048];
            settings_text(x, x->npoints ? x->points[x->npoints - 1].epoch : 0, st, sizeof st);
            fprintf(f, ",\"adaptive_decisions\":%zu", x->decisions);
            if (x->steered_by_reference) fprintf(f, ",\"accuracy_course\":\"dense\"");
            json_num(f, "adaptive_seconds", x->adapt_s);
            if (x->error_uniform > 0) {
                json_num(f, "compression_error", x->error);
                json_num(f, "compression_error_uniform", x->error_uniform);
            }
            fprintf(f, ",\"final_settings\":");
            json_string(f, st);
        }
        fprintf(f, ",\"steps\":%zu,\"parameters\":%zu,\"weights_identical\":%s}", x->steps,
                x->params, x->weights_identical ? "true" : "false");
    }
    fprintf(f, "\n]}\n");
    fclose(f);

    snprintf(path, sizeof path, "%s/metrics.csv", o->out);
    f = fopen(path, "w");
    if (!f) return cli_fail("train", 1, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "method,epoch,train_seconds,bytes_sent,train_loss,test_loss,test_accuracy,"
               "val_loss,val_accuracy,settings\n");
    for (int i = 0; i < nr; i++)
        for (size_t j = 0; j < r[i].npoints; j++) {
            gtrain_point *p = &r[i].points[j];
            char st[2048] = "";
            settings_text(&r[i], p->epoch, st, sizeof st); /* adaptive: name=density/bits;... */
            fprintf(f, "\"%s%s%s%s\",%.4f,%.4f,%.0f,%.6g,%.6g,%.6f,", r[i].method,
                    r[i].exchange[0] ? " [" : "", r[i].exchange, r[i].exchange[0] ? "]" : "",
                    p->epoch, p->wall_s, p->bytes, p->train_loss, p->test_loss, p->test_acc);
            if (o->cfg.val) /* empty fields without a validation split */
                fprintf(f, "%.6g,%.6f", p->val_loss, p->val_acc);
            else
                fputc(',', f);
            fprintf(f, ",\"%s\"\n", st);
        }
    fclose(f);

    /* Plots through gnuplot (Debian's gnuplot-nox), one data file per method. */
    snprintf(path, sizeof path, "%s/plot.gp", o->out);
    f = fopen(path, "w");
    if (!f) return cli_fail("train", 1, "cannot write %s", path);
    for (int i = 0; i < nr; i++) {
        char dp[PATH_MAX];
        snprintf(dp, sizeof dp, "%s/curve-%d.dat", o->out, i);
        FILE *d = fopen(dp, "w");
        if (!d) continue;
        /* The starting point (0 bytes, 0 s) has no place on a log axis: NaN hides it there. */
        for (size_t j = 0; j < r[i].npoints; j++) {
            const gtrain_point *p = &r[i].points[j];
            if (p->bytes > 0)
                fprintf(d, "%.6g", p->bytes);
            else
                fputs("NaN", d);
            fprintf(d, " %.6g %.6g %.6g\n", p->wall_s, 100 * p->test_acc, p->epoch);
        }
        fclose(d);
    }
    gp_terminal(f, 560);
    fprintf(f, "set grid\nset key bottom right\n"
               "set ylabel 'test accuracy (%%)'\n");
    if (isfinite(target)) /* the target of the table's time column, as a dashed line */
        fprintf(f,
                "set arrow 1 from graph 0, first %.4f to graph 1, first %.4f nohead dashtype 2 "
                "lc rgb 'gray30'\nset label 1 'target %.2f %%' at graph 0.01, first %.4f "
                "offset 0,0.7\n",
                100 * target, 100 * target, 100 * target, 100 * target);
    const char *plots[2][3] = {{"accuracy_vs_bytes.png", "bytes sent per rank (log scale)", "1"},
                               {"accuracy_vs_time.png", "training time (s)", "2"}};
    if (!bytes_plot) { /* nor an earlier run's plot, which would read as this one's */
        snprintf(path, sizeof path, "%s/%s", o->out, plots[0][0]);
        remove(path);
    }
    char head[256]; /* the plots' title */
    snprintf(head, sizeof head, "gradcomp train: %s, %d rank%s%s%s", o->cfg.model, P,
             P == 1 ? "" : "s", o->link ? ", link " : "", o->link ? o->link : "");
    for (int k = bytes_plot ? 0 : 1; k < 2; k++) {
        /* Over time, the part of the curves around the target is what tells them apart. */
        if (k == 1 && isfinite(target) && target > 0.2)
            fprintf(f, "set yrange [%.0f:*]\n", 100 * target - 15);
        fprintf(f, "set output '%s/%s'\nset xlabel '%s'\n%s\nset title '%s'\nplot ", o->out,
                plots[k][0], plots[k][1], k == 0 ? "set logscale x" : "unset logscale x", head);
        for (int i = 0; i < nr; i++)
            fprintf(f, "%s'%s/curve-%d.dat' using %s:3 with linespoints title '%s%s%s%s'",
                    i ? ", " : "", o->out, i, plots[k][2], r[i].method,
                    r[i].exchange[0] ? " [" : "", r[i].exchange, r[i].exchange[0] ? "]" : "");
        fprintf(f, "\n");
    }
    write_adaptive(o, r, nr, head, target, f);
    fclose(f);
    char gp[PATH_MAX];
    snprintf(gp, sizeof gp, "%s/plot.gp", o->out);
    *plotted = cli_gnuplot("train", gp, "results.json and metrics.csv are written") == 0;
    return 0;
}

static int any_adaptive(const gtrain_result *r, int nr) {
    for (int i = 0; i < nr; i++)
        if (r[i].nsettings) return 1;
    return 0;
}

/* s right-aligned in `width` columns, counting characters, not bytes (Δ and ± are two). */
static void put_right(const char *s, int width) {
    int cols = 0;
    for (const char *c = s; *c; c++) cols += ((unsigned char)*c & 0xC0) != 0x80;
    printf("%*s%s", cols < width ? width - cols : 0, "", s);
}

static void print_table(gtrain_result *r, int nr, double target, const char *why) {
    const gtrain_result *dense = dense_of(r, nr);
    double dense_acc = dense ? dense->final_acc : NAN;
    double dense_tt = dense ? gtrain_time_to(dense, target) : -1;
    bool any_se = false;
    bool outer = false;
    for (int i = 0; i < nr; i++) outer |= r[i].local_steps > 0;
    printf("\n%-46s %8s ", "method", "test acc");
    put_right("Δ dense ±SE", 12);
    printf(" %12s %9s %9s %8s %8s %8s %8s %8s %16s\n", "bytes/step", "MB/rank", "ratio", "traffic",
           "step ms", "pred ms", "codec ms", "comm ms", "t→target");
    for (int i = 0; i < nr; i++) {
        double tt = gtrain_time_to(&r[i], target);
        char tts[32], delta[32];
        if (tt > 0 && dense_tt > 0 && strcmp(r[i].method, "dense"))
            snprintf(tts, sizeof tts, "%.1f s (%.1fx)", tt, dense_tt / tt);
        else if (tt >= 0)
            snprintf(tts, sizeof tts, "%.1f s", tt);
        else
            snprintf(tts, sizeof tts, "never");
        double se = dense && dense != &r[i]
                        ? gtrain_paired_se(&r[i].test_verdicts, &dense->test_verdicts)
                        : NAN;
        any_se |= isfinite(se);
        if (isfinite(se))
            snprintf(delta, sizeof delta, "%+.2f ±%.2f", 100 * (r[i].final_acc - dense_acc),
                     100 * se);
        else if (isfinite(dense_acc))
            snprintf(delta, sizeof delta, "%+.2f", 100 * (r[i].final_acc - dense_acc));
        else
            snprintf(delta, sizeof delta, "-");
        char pred[16] = "-";
        if (r[i].predicted) snprintf(pred, sizeof pred, "%.2f", r[i].pred_step_ms);
        char name[96]; /* method (30) + " [exchange]" (up to 50) */
        if (r[i].exchange[0])
            snprintf(name, sizeof name, "%.30s [%s]", r[i].method, r[i].exchange);
        else
            snprintf(name, sizeof name, "%.60s", r[i].method);
        printf("%-46.46s %7.2f%% ", name, 100 * r[i].final_acc);
        put_right(delta, 12);
        printf(" %12.0f %9.2f %8.1fx %7.1fx %8.2f %8s %8.2f %8.2f %16s%s", r[i].bytes_per_step,
               r[i].bytes_total / 1e6, r[i].ratio, r[i].traffic_ratio, r[i].step_ms, pred,
               r[i].codec_ms, r[i].comm_ms, tts,
               !r[i].weights_identical  ? "  RANKS DIVERGED"
               : r[i].stopped_by_budget ? "  (time budget: stopped at epoch "
                                        : "");
        if (r[i].weights_identical && r[i].stopped_by_budget)
            printf("%.2f)\n", r[i].npoints ? r[i].points[r[i].npoints - 1].epoch : 0.0);
        else
            printf("\n");
        if (r[i].nsettings) {
            char st[2048];
            settings_text(&r[i], r[i].npoints ? r[i].points[r[i].npoints - 1].epoch : 0, st,
                          sizeof st);
            printf("    adaptive: %zu decisions (%.2f s of the training time), ended at %s\n",
                   r[i].decisions, r[i].adapt_s, st);
            if (r[i].steered_by_reference)
                printf("    accuracy: steered by dense's curve in this command, shifted to end at "
                       "the target\n");
            if (isfinite(r[i].final_val_acc) && gtrain_adapt_method_uses(r[i].method, "accuracy"))
                printf("    accuracy: steered by the validation split, where it ended at %.2f%%; "
                       "the table is the test set's\n",
                       100 * r[i].final_val_acc);
            else if (gtrain_adapt_method_uses(r[i].method, "accuracy"))
                printf("    accuracy: steered by the test set the table reports (--val 0: no "
                       "validation split), so its accuracy is tuned to the figure it is judged "
                       "by\n");
            if (r[i].error_uniform > 0)
                printf("    layers: total compression error %.4g against %.4g for the uniform "
                       "setting on the same gradients (%.1f%% less)\n",
                       r[i].error, r[i].error_uniform, 100 * (1 - r[i].error / r[i].error_uniform));
        }
    }
    if (outer) {
        printf("local SGD (outer step; accuracy of the global weights, the last syncs'):\n");
        for (int i = 0; i < nr; i++)
            if (r[i].local_steps) printf("  %-32.32s %s\n", r[i].method, r[i].outer);
    }
    bool ps = false;
    for (int i = 0; i < nr; i++) ps |= r[i].exchange[0] != 0;
    if (ps) {
        printf("\nparameter server (per worker step; busy: the busiest server's share of its "
               "serving time)\n%-46s %12s %12s %7s %13s %8s %6s %20s\n",
               "method", "pushed B", "pulled B", "busy", "stale mean/max", "queue", "lost",
               "worker steps (momentum)");
        for (int i = 0; i < nr; i++) {
            if (!r[i].exchange[0]) continue;
            char name[96], stale[32], steps[32];
            snprintf(name, sizeof name, "%.30s [%s]", r[i].method, r[i].exchange);
            snprintf(stale, sizeof stale, "%.1f/%.0f", r[i].ps_stale_mean, r[i].ps_stale_max);
            snprintf(steps, sizeof steps, "%.0f-%.0f (%.2f)", r[i].ps_worker_steps_min,
                     r[i].ps_worker_steps_max, r[i].ps_momentum);
            printf("%-46.46s %12.0f %12.0f %6.1f%% %13s %8.0f %6d %20s\n", name,
                   r[i].ps_pushed_per_step, r[i].ps_pulled_per_step, 100 * r[i].ps_server_busy,
                   stale, r[i].ps_queue_max, r[i].ps_workers_lost, steps);
        }
    }
    printf("target accuracy %.2f%% (%s); t→target: training time until the first evaluation at "
           "or above it (N.Nx: that many times sooner than dense)\nbytes/step: sent per rank per "
           "step, all tensors (as the algorithm counts it); MB/rank: sent per rank over the run; "
           "ratio: gradient bytes / compressed bytes over the whole run; traffic: dense f32 ring "
           "allreduce bytes / bytes sent; pred: the cost model's step time (gradcomp plan)\n",
           100 * target, why);
    if (any_se)
        printf("±SE: the standard error of the difference to dense from the test samples the "
               "two models disagree on (paired; another seed moves it further)\n");
}

/* Rank 0's calibration (or its absence) to every rank, as its text; 1 on failure (said). */
static int bcast_calibration(gcomp_cost_calibration **cal, int rank) {
    char *text = NULL;
    unsigned long long len = 0;
    if (rank == 0 && *cal) {
        size_t n = 0;
        gcomp_cost_calibration_format(*cal, NULL, 0, &n);
        if (!(text = malloc(n + 1)) ||
            gcomp_cost_calibration_format(*cal, text, n + 1, &n) != GCOMP_OK) {
            free(text);
            text = NULL;
            n = 0;
        }
        len = text ? n : 0;
    }
    MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (len > INT_MAX) { /* every rank has len: every rank returns here */
        free(text);
        return cli_fail("train", 1, "calibration of %llu bytes: too long to send", len);
    }
    int ok = rank == 0 || !len || (text = malloc(len)) != NULL;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
        free(text);
        return cli_fail("train", 1, "calibration: out of memory on some rank");
    }
    if (len) MPI_Bcast(text, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
    int rc = 0;
    if (rank != 0 && len) {
        gcomp_error e = {0};
        if (gcomp_cost_calibration_parse(cal, text, len, &e) != GCOMP_OK)
            rc = cli_fail("train", 1, "rank 0's calibration: %s", e.message);
    }
    free(text);
    return rc;
}

int cmd_train(int argc, char **argv) {
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    if (o.np > 0 && !under_mpi()) return relaunch(argc, argv, &o);
    if (!o.link) o.link = getenv("GCOMP_TRAIN_LINK");

    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    if (rank != 0) o.cfg.progress = 0;

    gtrain_data train = {0}, test = {0};
    char err[512] = "";
    int bad = 0;
    if (o.data && !strcmp(o.data, "synthetic")) {
        bad = gtrain_data_synthetic(12000, o.cfg.seed, &train) ||
              gtrain_data_synthetic(2000, o.cfg.seed + 1000, &test);
        if (bad) snprintf(err, sizeof err, "cannot make the synthetic dataset");
    } else {
        bad = gtrain_data_load(o.data, "train", &train, err, sizeof err) ||
              gtrain_data_load(o.data, "t10k", &test, err, sizeof err);
    }
    /* The validation split: decisions on accuracy never look at the test set. */
    gtrain_data val = {0};
    size_t nval = o.val >= 0 ? (size_t)o.val : 0;
    if (o.val < 0) { /* auto: a split wherever something decides on accuracy */
        bool decides = o.sensitivity != NULL;
        for (int i = 0; i < o.nmethods; i++)
            decides |= gtrain_adapt_method_uses(o.methods[i], "accuracy") != 0;
        nval = decides ? train.n / 12 : 0;
    }
    if (!bad && nval) {
        int st = gtrain_data_hold_out(&train, nval, &val);
        if (st) {
            snprintf(err, sizeof err, "--val %zu: %s", nval,
                     st == GTRAIN_ERR_ARG ? "leaves no training samples" : "out of memory");
            bad = 1;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) {
        if (rank == 0)
            cli_fail("train", 1, "%s", err[0] ? err : "data could not be loaded on some rank");
        gtrain_data_free(&train);
        gtrain_data_free(&test);
        gtrain_data_free(&val);
        MPI_Finalize();
        return 1;
    }
    o.cfg.val = nval ? &val : NULL;
    if (rank == 0 && o.cfg.progress) {
        fprintf(
            stderr,
            "gradcomp train: %s, %d rank%s, %d epoch%s, batch %zu per rank, %zu training samples",
            o.cfg.model, P, P > 1 ? "s" : "", o.cfg.epochs, o.cfg.epochs > 1 ? "s" : "",
            o.cfg.batch, train.n);
        if (nval)
            fprintf(stderr, " (%zu held out for validation: decisions on accuracy use them)", nval);
        fputc('\n', stderr);
    }

    /* The cost model's calibration: rank 0's, on every rank (each predicts; rank 0
     * reports).  Read on rank 0 and broadcast, not read by each: every rank's adaptive
     * controllers must predict from the same rates (they refuse to decide otherwise), and
     * each host would read its own file. */
    gcomp_cost_calibration *cal = NULL;
    if (rank == 0) {
        char defpath[PATH_MAX];
        const char *cp =
            o.calibration ? o.calibration : cli_default_calibration(defpath, sizeof defpath);
        if (cli_load_calibration("train", cp, o.calibration != NULL, &cal) && o.calibration)
            bad = 1;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!bad && P > 1 && bcast_calibration(&cal, rank)) bad = 1;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) {
        gcomp_cost_calibration_free(cal);
        gtrain_data_free(&train);
        gtrain_data_free(&test);
        gtrain_data_free(&val);
        MPI_Finalize();
        return 2;
    }
    o.cfg.calibration = cal;
    o.cfg.link_bps = o.link && strcmp(o.link, "none") ? cli_parse_rate(o.link) : 0;
    const char *delay = getenv("GCOMP_TRAIN_DELAY_US"); /* set by the netsim launch above */
    o.cfg.link_delay_s = o.cfg.link_bps > 0 && delay ? strtod(delay, NULL) * 1e-6 : 0;
    if (!(o.cfg.link_delay_s >= 0 && o.cfg.link_delay_s < 10)) o.cfg.link_delay_s = 0;

    if (o.sensitivity) {
        rc = train_sensitivity(&o.cfg, o.sensitivity, o.threshold_pp, &train, &test, o.out,
                               MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        for (int i = 0; i < o.nmethods; i++) free(o.methods[i]);
        gcomp_cost_calibration_free(cal);
        gtrain_data_free(&train);
        gtrain_data_free(&test);
        gtrain_data_free(&val);
        MPI_Finalize();
        return rc;
    }
    /* With --ps the last S ranks serve: the collective runs use the workers alone. */
    int S = o.ps_servers, W = P - S;
    if (W < 1) {
        if (rank == 0) cli_fail("train", 1, "--ps %d needs more than %d ranks", S, S);
        MPI_Finalize();
        return 1;
    }
    MPI_Comm wcomm = MPI_COMM_WORLD;
    bool server = rank >= W;
    if (S) MPI_Comm_split(MPI_COMM_WORLD, server ? 1 : 0, rank, &wcomm);
    static gtrain_result res[MAX_RUNS];
    int nr = 0;
    for (int i = 0; i < o.nmethods; i++) {
        for (int k = o.ps_only ? 0 : -1; k < (S ? o.ps_nmodes : 0); k++) {
            int failed;
            if (k < 0) { /* the collectives, on the workers */
                if (server) continue;
                /* An accuracy-driven method steers by the curve of the last dense run before
                 * it: the same model, data, seed and schedule (identical on every rank). */
                o.cfg.reference = NULL;
                o.cfg.nreference = 0;
                for (int j = nr - 1; j >= 0; j--)
                    if (!strcmp(res[j].method, "dense") && !res[j].exchange[0]) {
                        o.cfg.reference = res[j].points;
                        o.cfg.nreference = res[j].npoints;
                        break;
                    }
                failed = gtrain_run(&o.cfg, o.methods[i], &train, &test, wcomm, &res[nr], err,
                                    sizeof err);
            } else {
                gtrain_ps_config pc = o.ps;
                pc.servers = S;
                pc.mode = o.ps_modes[k];
                failed = gtrain_run_ps(&o.cfg, &pc, o.methods[i], &train, &test, MPI_COMM_WORLD,
                                       &res[nr], err, sizeof err);
                if (server) { /* a server's result holds nothing to report */
                    gtrain_result_free(&res[nr]);
                    continue;
                }
            }
            if (failed) {
                if (rank == 0) cli_fail("train", 1, "%s: %s", o.methods[i], err);
                rc = 1;
                continue;
            }
            if (rank == 0 && !res[nr].weights_identical)
                cli_fail("train", 1, "%s: the ranks' weights differ after training", o.methods[i]);
            if (!res[nr].weights_identical) rc = 1;
            nr++;
        }
    }
    if (rank == 0 && nr > 0) {
        double target = o.target;
        char why[320]; /* a method name (up to 255) and the rule */
        snprintf(why, sizeof why, "--target-acc");
        if (target < 0) {
            int d = 0;
            for (int i = nr - 1; i >= 0; i--)
                if (!strcmp(res[i].method, "dense") && (!res[i].exchange[0] || o.ps_only)) d = i;
            target = res[d].final_acc - o.tolerance / 100;
            if (o.tolerance > 0)
                snprintf(why, sizeof why, "%s's final accuracy %.2f%% minus %g pp", res[d].method,
                         100 * res[d].final_acc, o.tolerance);
            else
                snprintf(why, sizeof why, "%s's final accuracy", res[d].method);
        }
        print_table(res, nr, target, why);
        bool plotted = false;
        const bool bytes_plot = sends_bytes(res, nr);
        if (write_outputs(&o, res, nr, target, W, bytes_plot, &plotted) == 0) {
            const bool ad = any_adaptive(res, nr);
            printf("wrote %s/results.json, %s/metrics.csv", o.out, o.out);
            if (plotted && bytes_plot) printf(", %s/accuracy_vs_bytes.png", o.out);
            if (plotted) printf(", %s/accuracy_vs_time.png", o.out);
            printf("%s\n", !ad ? ""
                           : plotted
                               ? ", settings.csv, decisions.csv and adapt-N.png (adaptive methods)"
                               : ", settings.csv and decisions.csv (adaptive methods)");
            if (!bytes_plot)
                printf("no accuracy_vs_bytes.png: no method sent a byte (%d rank%s)\n", W,
                       W == 1 ? "" : "s");
        } else
            rc = 1;
    }
    for (int i = 0; i < nr; i++) gtrain_result_free(&res[i]);
    for (int i = 0; i < o.nmethods; i++) free(o.methods[i]);
    gcomp_cost_calibration_free(cal);
    if (S) MPI_Comm_free(&wcomm);
    gtrain_data_free(&train);
    gtrain_data_free(&test);
    gtrain_data_free(&val);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}

/*
 * cmd_plan.c - `gradcomp plan`: will compression pay on this link, for this model, at this
 * many workers?  The library's cost model (gradcomp.h, "Cost model") evaluated for each
 * method of --compare and each worker count of --workers, beside dense f32 and f16 ring
 * allreduce: bytes per step, predicted step time and its parts, speed-up, the strategy of
 * each tensor and the break-even link speed above which compressing does not pay; a table,
 * --json, or a PNG of step time against link speed (--plot, gnuplot).
 *
 * `gradcomp plan --calibrate` measures what the model needs from this machine: encode
 * and decode speed of each method (a few seconds), and, run under mpirun with two or more
 * ranks, the network's latency (ping-pong), bandwidth (a large one-way transfer) and a
 * ring allreduce (tools/mpi/cmd_plan_net.c).  All ranks measure the codecs at once, so
 * the figures include the contention of the job's own ranks; rank 0 writes the file.
 *
 * Methods are the trainer's (`gradcomp train --compare`): dense, dense-f16, a spec (for
 * the tensors the layer policy compresses; small and 1-D ones use --dense-spec), or
 * policy:<policy string>; METHOD@STRATEGY forces a strategy.  The strategy of each tensor
 * comes from gcomp_mpi_strategy_auto when the CLI has the MPI layer (it always has in this
 * build), so the plan names the strategy a real bucket would pick.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "method.h"

#ifdef GCOMP_CLI_MPI
#include "gradcomp_mpi.h"
#endif
#ifdef GCOMP_CLI_TRAIN
#include "model.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD "plan"
#define MAX_METHODS 16
#define MAX_WORKERS 16
#define TCP_GOODPUT (1448.0 / 1514.0) /* TCP payload per Ethernet frame at MTU 1500 */

#ifdef GCOMP_CLI_MPI
_Static_assert((int)GCOMP_COST_ALLGATHER == (int)GCOMP_MPI_ALLGATHER &&
                   (int)GCOMP_COST_SPARSE == (int)GCOMP_MPI_SPARSE &&
                   (int)GCOMP_COST_ALLREDUCE == (int)GCOMP_MPI_ALLREDUCE &&
                   (int)GCOMP_COST_RSAG == (int)GCOMP_MPI_RSAG &&
                   GCOMP_COST_HIERARCHICAL == GCOMP_MPI_HIERARCHICAL,
               "the cost model numbers strategies as gradcomp_mpi.h does");
int plan_calibrate_net(gcomp_cost_calibration *cal, int *rank, int *size);
void plan_net_finalize(void);
#endif

typedef struct ptensor {
    char name[128];
    size_t n, rows, cols;
    double work; /* macs= of the model file; 0 without */
} ptensor;

typedef struct popts {
    const char *model, *calibration, *plot, *policy_extra, *dense_spec;
    char *methods[MAX_METHODS];
    int nmethods;
    int workers[MAX_WORKERS], nworkers;
    int nodes, json, per_tensor, calibrate, strategy, servers, concurrent;
    size_t min_elements, min_k, batch;
    size_t calib_n[8], ncalib; /* --size: the sizes codecs are calibrated at */
    double link_bps, latency, intra_bps, intra_latency, efficiency, burst;
    double compute_ms, forward_ms, backward_ms, optimizer_ms, overlap, bucket_mb;
    bool have_link, have_compute, have_burst;
} popts;

static const char *usage_text =
    "usage: gradcomp plan [--model mlp|mlp-large|cnn|FILE] [--compare M1,M2,...]\n"
    "                     [--workers P1,P2,...] [--nodes N] [--link RATE] [--latency US]\n"
    "                     [--burst BYTES] [--intra-link RATE] [--intra-latency US]\n"
    "                     [--efficiency E]\n"
    "                     [--compute-ms MS | --forward-ms MS --backward-ms MS] [--optimizer-ms "
    "MS]\n"
    "                     [--overlap X] [--concurrent] [--bucket-mb MB] [--batch B]\n"
    "                     [--min-elements N] [--min-k K] [--dense-spec SPEC] [--strategy S]\n"
    "                     [--servers S]\n"
    "                     [--calibration FILE] [--per-tensor]\n"
    "                     [--json] [--plot FILE.png]\n"
    "       gradcomp plan --calibrate [--compare M1,...] [--calibration FILE] [--size N,...]\n"
    "                     (under mpirun with >= 2 ranks it also measures the network)\n"
    "FILE: one tensor a line, `name d0 [d1 ...] [macs=M]` (# comments); d0 x d1*d2*... is its\n"
    "      matrix; macs=: the backward work before its gradient is final (the layer's\n"
    "      multiply-adds a sample), on every line or none (then: its elements).\n"
    "RATE: 100mbit, 1gbit, 10gbit, 100gbit, 25gbit, ...; the model uses RATE/8 x E bytes/s\n"
    "      (E = --efficiency, default 1448/1514: TCP payload of Ethernet frames).\n"
    "Without --link the calibration's measured network is used (net inter, else intra).\n"
    "--burst: a shaper's bucket on the link (tc tbf's burst: 256kb is 262144; 0: a plain\n"
    "      wire, the default with --link); without it the calibration's measured one.\n"
    "Compute: --compute-ms (split 1/3 forward, 2/3 backward) or forward/backward; for the\n"
    "      built-in models it is measured here (--batch, default 32) when not given.\n"
    "--overlap: share of the remaining backward a transfer can use (default 1: transfers\n"
    "      progress beside compute, as with NCCL; the CPU trainer's MPI needs 0).\n"
    "--concurrent: every tensor's exchange in flight at once, latencies overlapping, as\n"
    "      gradcomp's buckets are (gradcomp train predicts with it); default: one at a\n"
    "      time, as NCCL, gloo and Horovod run them.\n"
    "--bucket-mb: fuse adjacent allreduced tensors of one spec into messages of up to MB\n"
    "      (MiB of f32 gradient), filled in backward order: Horovod's tensor fusion (64),\n"
    "      DDP's buckets (25). Default 0: a message a tensor, as the trainer sends them.\n"
    "Calibration file: --calibration, else $GRADCOMP_CALIBRATION, else\n"
    "      $XDG_CACHE_HOME/gradcomp/calibration.txt (~/.cache/gradcomp/calibration.txt).\n";

/* ---- parsing ------------------------------------------------------------------------------ */

static int parse_double(const char *opt, const char *v, double lo, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < lo)
        return cli_fail(CMD, 2, "%s %s: expected a number >= %g", opt, v, lo);
    *out = x;
    return 0;
}

static int split_methods(popts *o, const char *list) {
    char *copy = strdup(list), *save = NULL;
    if (!copy) return cli_fail(CMD, 1, "out of memory");
    for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ') p++;
        if (!*p) continue;
        /* dgc:density=..,momentum=..: a piece whose text up to its first ';' is key=value
         * without a codec name continues the previous spec. */
        size_t head = strcspn(p, ";@");
        if (memchr(p, '=', head) && !memchr(p, ':', head) && o->nmethods > 0) {
            char *prev = o->methods[o->nmethods - 1];
            size_t l = strlen(prev) + strlen(p) + 2;
            char *joined = malloc(l);
            if (!joined) break;
            snprintf(joined, l, "%s,%s", prev, p);
            free(prev);
            o->methods[o->nmethods - 1] = joined;
        } else if (o->nmethods == MAX_METHODS) {
            free(copy);
            return cli_fail(CMD, 2, "--compare: at most %d methods", MAX_METHODS);
        } else if (!strncmp(p, "adapt:", 6)) {
            int rc = cli_fail(CMD, 2,
                              "--compare %s: an adaptive method decides at run time, from "
                              "what the run measures; plan its candidates instead (e.g. "
                              "--compare powersgd:rank=4,topk:density=0.001), or run it with "
                              "gradcomp train",
                              p);
            free(copy);
            return rc;
        } else {
            o->methods[o->nmethods++] = strdup(p);
        }
    }
    free(copy);
    return 0;
}

static int parse_workers(popts *o, const char *v) {
    o->nworkers = 0;
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ','))
            return cli_fail(CMD, 2, "--workers %s: expected a list of counts like 2,8,64", v);
        if (x < 1 || x > 1 << 24)
            return cli_fail(CMD, 2, "--workers %s: worker count %ld must be in 1..16777216", v, x);
        if (o->nworkers == MAX_WORKERS)
            return cli_fail(CMD, 2, "--workers: at most %d counts", MAX_WORKERS);
        o->workers[o->nworkers++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (!o->nworkers) return cli_fail(CMD, 2, "--workers: empty list");
    return 0;
}

static int parse_args(int argc, char **argv, popts *o) {
    memset(o, 0, sizeof *o);
    o->model = "mlp";
    o->workers[0] = 4;
    o->nworkers = 1;
    o->nodes = 0; /* one per worker */
    o->latency = 25e-6;
    o->intra_bps = 80e9;
    o->intra_latency = 1e-6;
    o->efficiency = TCP_GOODPUT;
    o->overlap = 1;
    o->min_elements = 8192;
    o->min_k = 512; /* the trainer's defaults */
    o->dense_spec = "none:values=f16";
    o->batch = 32;
    o->calib_n[0] = (size_t)1 << 22;
    o->ncalib = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--concurrent")) {
            o->concurrent = 1;
            continue;
        }
        if (!strcmp(a, "--per-tensor")) {
            o->per_tensor = 1;
            continue;
        }
        if (!strcmp(a, "--calibrate")) {
            o->calibrate = 1;
            continue;
        }
        if (i + 1 >= argc) return cli_fail(CMD, 2, "option %s needs a value\n%s", a, usage_text);
        const char *v = argv[++i];
        size_t cnt;
        double us = 0;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--compare") || !strcmp(a, "--method")) {
            if (split_methods(o, v)) return 2;
        } else if (!strcmp(a, "--workers")) {
            if (parse_workers(o, v)) return 2;
        } else if (!strcmp(a, "--nodes")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1 << 24)
                return cli_fail(CMD, 2, "--nodes %s: must be >= 1", v);
            o->nodes = (int)cnt;
        } else if (!strcmp(a, "--link") || !strcmp(a, "--intra-link")) {
            double r = cli_parse_rate(v);
            if (!(r > 0))
                return cli_fail(CMD, 2,
                                "%s %s: the link speed must be a rate > 0 from 1kbit to "
                                "1000tbit, with its unit (100mbit, 1gbit, 10gbit, ...; a bare "
                                "number is bit/s)",
                                a, v);
            if (!strcmp(a, "--link")) {
                o->link_bps = r;
                o->have_link = true;
            } else {
                o->intra_bps = r;
            }
        } else if (!strcmp(a, "--latency") || !strcmp(a, "--intra-latency")) {
            if (parse_double(a, v, 0, &us)) return 2;
            *(!strcmp(a, "--latency") ? &o->latency : &o->intra_latency) = us * 1e-6;
        } else if (!strcmp(a, "--burst")) {
            size_t bytes;
            if (cli_parse_count(v, &bytes))
                return cli_fail(CMD, 2, "--burst %s: expected a byte count (262144, 256k)", v);
            o->burst = (double)bytes;
            o->have_burst = true;
        } else if (!strcmp(a, "--efficiency")) {
            if (parse_double(a, v, 0, &o->efficiency)) return 2;
            if (!(o->efficiency > 0) || o->efficiency > 1)
                return cli_fail(CMD, 2, "--efficiency %s: in (0, 1]", v);
        } else if (!strcmp(a, "--compute-ms")) {
            if (parse_double(a, v, 0, &o->compute_ms)) return 2;
            o->have_compute = true;
        } else if (!strcmp(a, "--forward-ms")) {
            if (parse_double(a, v, 0, &o->forward_ms)) return 2;
            o->have_compute = true;
        } else if (!strcmp(a, "--backward-ms")) {
            if (parse_double(a, v, 0, &o->backward_ms)) return 2;
            o->have_compute = true;
        } else if (!strcmp(a, "--optimizer-ms")) {
            if (parse_double(a, v, 0, &o->optimizer_ms)) return 2;
        } else if (!strcmp(a, "--overlap")) {
            if (parse_double(a, v, 0, &o->overlap) || o->overlap > 1)
                return cli_fail(CMD, 2, "--overlap %s: in 0..1", v);
        } else if (!strcmp(a, "--bucket-mb")) {
            if (parse_double(a, v, 0, &o->bucket_mb)) return 2;
        } else if (!strcmp(a, "--batch")) {
            if (cli_parse_count(v, &o->batch) || o->batch < 1 || o->batch > 65536)
                return cli_fail(CMD, 2, "--batch %s: 1..65536", v);
        } else if (!strcmp(a, "--min-elements")) {
            if (cli_parse_count(v, &o->min_elements))
                return cli_fail(CMD, 2, "--min-elements %s: a count", v);
        } else if (!strcmp(a, "--min-k")) {
            if (cli_parse_count(v, &o->min_k) || o->min_k > UINT32_MAX)
                return cli_fail(CMD, 2, "--min-k %s: 0..4294967295", v);
        } else if (!strcmp(a, "--dense-spec"))
            o->dense_spec = v;
        else if (!strcmp(a, "--strategy")) {
#ifdef GCOMP_CLI_MPI
            if (gcomp_mpi_strategy_parse(v, &o->strategy) != GCOMP_OK)
#endif
                return cli_fail(CMD, 2,
                                "--strategy %s: auto, allgather, sparse, allreduce, rsag, "
                                "hierarchical[:NAME]",
                                v);
        } else if (!strcmp(a, "--servers")) {
            if (cli_parse_count(v, &cnt) || cnt < 1 || cnt > 1 << 20)
                return cli_fail(CMD, 2, "--servers %s: >= 1", v);
            o->servers = (int)cnt;
        } else if (!strcmp(a, "--calibration"))
            o->calibration = v;
        else if (!strcmp(a, "--plot"))
            o->plot = v;
        else if (!strcmp(a, "--size")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            o->ncalib = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                size_t *n = &o->calib_n[o->ncalib];
                if (o->ncalib == sizeof o->calib_n / sizeof o->calib_n[0] ||
                    cli_parse_count(tok, n) || *n < 4096 || *n > 1u << 28)
                    return cli_fail(CMD, 2, "--size %s: up to 8 sizes, each 4096..2^28 elements",
                                    v);
                o->ncalib++;
            }
            if (!o->ncalib) return cli_fail(CMD, 2, "--size: no size given");
        } else
            return cli_fail(CMD, 2, "unknown option '%s'\n%s", a, usage_text);
    }
    if (o->nmethods == 0 && split_methods(o, "dense,dense-f16")) return 2;
    return 0;
}

/* ---- the model's tensors -------------------------------------------------------------------- */

static int read_model_file(const char *path, ptensor **out, size_t *count) {
    FILE *f = fopen(path, "r");
    if (!f)
        return cli_fail(CMD, 2,
                        "--model %s: not a built-in model (mlp, mlp-large, cnn) and cannot open "
                        "it as a file: %s",
                        path, strerror(errno));
    size_t cap = 16, n = 0, lineno = 0;
    ptensor *t = malloc(cap * sizeof *t);
    char line[4096];
    bool with_work = false; /* the first tensor's macs= decides for the file */
    int rc = t ? 0 : cli_fail(CMD, 1, "out of memory");
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok) continue;
        if (n == cap) {
            ptensor *p = realloc(t, 2 * cap * sizeof *t);
            if (!p) {
                rc = cli_fail(CMD, 1, "out of memory");
                break;
            }
            t = p;
            cap *= 2;
        }
        ptensor *x = &t[n];
        if (strlen(tok) >= sizeof x->name) {
            rc = cli_fail(CMD, 2, "%s:%zu: name longer than %zu characters", path, lineno,
                          sizeof x->name - 1);
            break;
        }
        strcpy(x->name, tok);
        size_t dims[8], nd = 0, elems = 1;
        bool has_work = false;
        x->work = 0;
        while (!rc && (tok = strtok_r(NULL, " \t\r\n", &save))) {
            char *end;
            errno = 0;
            if (!strncmp(tok, "macs=", 5)) {
                double w = strtod(tok + 5, &end);
                if (has_work || end == tok + 5 || *end || errno || !isfinite(w) || w < 0)
                    rc = cli_fail(CMD, 2, "%s:%zu: '%s': macs= takes one number >= 0", path, lineno,
                                  tok);
                x->work = w;
                has_work = true;
                continue;
            }
            if (has_work) {
                rc = cli_fail(CMD, 2, "%s:%zu: '%s' after macs=: the dimensions come first", path,
                              lineno, tok);
                break;
            }
            unsigned long long d = strtoull(tok, &end, 10);
            if (!isdigit((unsigned char)tok[0]) || *end || errno || d == 0)
                rc = cli_fail(CMD, 2, "%s:%zu: '%s': dimensions must be positive integers", path,
                              lineno, tok);
            else if (nd == 8)
                rc = cli_fail(CMD, 2, "%s:%zu: more than 8 dimensions", path, lineno);
            else if (elems > UINT32_MAX / d)
                rc = cli_fail(CMD, 2, "%s:%zu: tensor '%s' has more than 2^32-1 elements", path,
                              lineno, x->name);
            else {
                dims[nd++] = (size_t)d;
                elems *= (size_t)d;
            }
        }
        if (rc) break;
        if (nd == 0) {
            rc = cli_fail(CMD, 2, "%s:%zu: '%s' has no dimensions (expected `name d0 [d1 ...]`)",
                          path, lineno, x->name);
            break;
        }
        if (n > 0 && has_work != with_work) {
            rc = cli_fail(CMD, 2,
                          "%s:%zu: '%s' %s macs= and the tensors before it %s: give it on "
                          "every tensor or on none",
                          path, lineno, x->name, has_work ? "has" : "has no",
                          has_work ? "do not" : "do");
            break;
        }
        with_work = has_work;
        x->n = elems;
        x->rows = nd > 1 && dims[0] > 1 && elems / dims[0] > 1 ? dims[0] : 0;
        x->cols = x->rows ? elems / dims[0] : 0;
        n++;
    }
    fclose(f);
    if (!rc && n == 0) rc = cli_fail(CMD, 2, "%s: no tensors in the file", path);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    *count = n;
    return 0;
}

/* Built-in trainer models: their tensor list from src/train, and their compute measured. */
static int builtin_model(const popts *o, ptensor **out, size_t *count, double *fwd_bwd_s) {
#ifdef GCOMP_CLI_TRAIN
    gtrain_model *m = NULL;
    if (gtrain_model_create(o->model, NULL, 1, o->batch, &m) != 0) return -1;
    size_t nt;
    gtrain_tensor *gt = gtrain_model_tensors(m, &nt);
    ptensor *t = calloc(nt, sizeof *t);
    if (!t) {
        gtrain_model_free(m);
        return cli_fail(CMD, 1, "out of memory");
    }
    for (size_t i = 0; i < nt; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", gt[i].name);
        t[i].n = gt[i].n;
        /* As the trainer passes them: biases and columns are vectors. */
        t[i].rows = gt[i].is_bias || gt[i].cols == 1 ? 0 : gt[i].rows;
        t[i].cols = t[i].rows ? gt[i].cols : 0;
        t[i].work = gtrain_model_tensor_macs(m, i);
    }
    *fwd_bwd_s = 0;
    if (!o->have_compute && !o->calibrate) {
        /* Median of 5 forward+backward passes on a synthetic batch, after one warm-up. */
        size_t B = o->batch;
        float *x = malloc(B * GTRAIN_INPUT_DIM * sizeof(float));
        uint8_t *y = malloc(B);
        double ts[6];
        if (x && y) {
            for (size_t i = 0; i < B * GTRAIN_INPUT_DIM; i++)
                x[i] = (float)((i * 7919) % 255) / 255;
            for (size_t i = 0; i < B; i++) y[i] = (uint8_t)(i % GTRAIN_CLASSES);
            for (int r = 0; r < 6; r++) {
                double t0 = cli_now();
                gtrain_model_forward_backward(m, x, y, B, NULL);
                ts[r] = cli_now() - t0;
            }
            for (int a = 1; a < 6; a++)
                for (int b = a + 1; b < 6; b++)
                    if (ts[b] < ts[a]) {
                        double tmp = ts[a];
                        ts[a] = ts[b];
                        ts[b] = tmp;
                    }
            *fwd_bwd_s = ts[3];
        }
        free(x);
        free(y);
    }
    gtrain_model_free(m);
    *out = t;
    *count = nt;
    return 0;
#else
    (void)o;
    (void)out;
    (void)count;
    (void)fwd_bwd_s;
    return -1;
#endif
}

/* ---- methods -> specs and strategies per tensor ---------------------------------------------- */

/* The strategy an MPI bucket would use for `spec` (gcomp_mpi_strategy_auto). */
static int auto_strategy(const char *spec, int P, int *out) {
#ifdef GCOMP_CLI_MPI
    return gcomp_mpi_strategy_auto(spec, P, out) == GCOMP_OK ? 0 : -1;
#else
    /* Without the MPI layer: linear and multi-phase codecs allreduce, the rest allgather. */
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(spec, ":"), spec);
    const gcomp_codec_info *ci = gcomp_codec_find(name);
    if (!ci) return -1;
    (void)P;
    *out = ci->flags & (GCOMP_CODEC_LINEAR | GCOMP_CODEC_MULTIPHASE) ? GCOMP_COST_ALLREDUCE
                                                                     : GCOMP_COST_ALLGATHER;
    return 0;
#endif
}

static const char *strategy_name(int s) {
    static const char *const names[] = {"auto", "allgather", "sparse",       "allreduce",
                                        "rsag", "ps",        "ps-compressed"};
    int b = s & 0xff;
    const char *n = b >= 0 && b <= 6 ? names[b] : "?";
    if (!(s & GCOMP_COST_HIERARCHICAL)) return n;
    static char buf[7][40];
    snprintf(buf[b <= 6 ? b : 0], sizeof buf[0], "hierarchical:%s", n);
    return buf[b <= 6 ? b : 0];
}

typedef struct method_plan {
    const char *label;
    gcomp_cost_tensor *t;
    char **specs;
    size_t nt;
} method_plan;

static void method_plan_free(method_plan *mp) {
    for (size_t i = 0; mp->specs && i < mp->nt; i++) free(mp->specs[i]);
    free(mp->specs);
    free(mp->t);
    mp->specs = NULL;
    mp->t = NULL;
}

/* Tensor fusion: from the last tensor back (the order backward makes them final), adjacent
 * tensors that an allreduce sums as one vector (not PowerSGD's factors) and that share a
 * spec and strategy fill a bucket up to `cap` bytes of f32 gradient; a tensor larger than
 * `cap` goes alone. */
static void assign_buckets(method_plan *mp, double cap) {
    unsigned id = 0;
    double fill = 0;
    for (size_t i = mp->nt; i-- > 0;) {
        gcomp_cost_tensor *t = &mp->t[i];
        gcomp_spec_info info;
        bool fusable = (t->strategy & 0xff) == GCOMP_COST_ALLREDUCE &&
                       gcomp_spec_describe(t->spec, t->n, &info, NULL) == GCOMP_OK &&
                       !(info.flags & GCOMP_SPEC_MULTIPHASE);
        const gcomp_cost_tensor *next = i + 1 < mp->nt ? &mp->t[i + 1] : NULL;
        bool joins = fusable && id && next && next->bucket == id && !strcmp(next->spec, t->spec) &&
                     next->strategy == t->strategy && fill + 4.0 * (double)t->n <= cap;
        if (!fusable) {
            t->bucket = 0;
            continue;
        }
        if (!joins) {
            id++;
            fill = 0;
        }
        t->bucket = id;
        fill += 4.0 * (double)t->n;
    }
}

/* Each tensor's spec (the policy) and strategy (auto, or the method's @STRATEGY). */
static int plan_method(const popts *o, const char *method, const ptensor *pt, size_t nt, int P,
                       method_plan *mp) {
    char mbuf[1024], pol[1400];
    snprintf(mbuf, sizeof mbuf, "%s", method);
    int forced = o->strategy;
    char *at = strrchr(mbuf, '@');
    if (at) {
        *at = 0;
#ifdef GCOMP_CLI_MPI
        if (gcomp_mpi_strategy_parse(at + 1, &forced) != GCOMP_OK)
#endif
            return cli_fail(CMD, 2, "method '%s': unknown strategy '%s'", method, at + 1);
    }
    gtrain_policy_defaults pd = {o->min_elements, o->min_k, o->dense_spec};
    if (gtrain_method_policy(mbuf, &pd, pol, sizeof pol))
        return cli_fail(CMD, 2, "method '%s': too long", method);
    gcomp_error e = {0};
    gcomp_policy *policy = NULL;
    if (gcomp_policy_create(&policy, pol, &e) != GCOMP_OK)
        return cli_fail(CMD, 2, "method '%s': %s", method, e.message);
    mp->label = method;
    mp->nt = nt;
    mp->t = calloc(nt, sizeof *mp->t);
    mp->specs = calloc(nt, sizeof *mp->specs);
    int rc = mp->t && mp->specs ? 0 : cli_fail(CMD, 1, "out of memory");
    for (size_t i = 0; !rc && i < nt; i++) {
        gcomp_tensor_desc d = {pt[i].name, pt[i].n, pt[i].rows, pt[i].cols};
        gcomp_layer_plan lp;
        if (gcomp_policy_choose(policy, &d, &lp, &e) != GCOMP_OK) {
            rc = cli_fail(CMD, 2, "method '%s': %s", method, e.message);
            break;
        }
        mp->specs[i] = strdup(lp.spec);
        int s = 0;
        bool dense = lp.rule == GCOMP_RULE_1D || lp.rule == GCOMP_RULE_SMALL;
        if (!mp->specs[i] || auto_strategy(lp.spec, P, &s)) {
            rc = cli_fail(CMD, 2, "method '%s': spec '%s'", method, lp.spec);
            break;
        }
        /* The trainer forces a strategy on the compressed tensors only (exchange.c). */
        if (forced && !dense && strncmp(lp.spec, "none", 4)) {
            int base = forced & 0xff;
            s = (base ? base : s) | (forced & GCOMP_COST_HIERARCHICAL);
        }
        mp->t[i] = (gcomp_cost_tensor){.name = pt[i].name,
                                       .spec = mp->specs[i],
                                       .n = pt[i].n,
                                       .rows = pt[i].rows,
                                       .cols = pt[i].cols,
                                       .strategy = s,
                                       .work = pt[i].work};
    }
    gcomp_policy_free(policy);
    if (!rc && o->bucket_mb > 0) assign_buckets(mp, o->bucket_mb * 1048576.0);
    if (rc) method_plan_free(mp);
    return rc;
}

/* ---- calibration file ------------------------------------------------------------------- */

static void mkdirs_for(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
}

/* Specs worth calibrating: --compare's and the dense ones every plan uses. */
static int calibrate(popts *o, const char *path) {
    gcomp_cost_calibration *cal = NULL;
    int rank = 0, size = 1;
    if (cli_load_calibration(CMD, path, false, &cal)) return 2;
    if (!cal && gcomp_cost_calibration_create(&cal) != GCOMP_OK)
        return cli_fail(CMD, 1, "out of memory");
#ifdef GCOMP_CLI_MPI
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {
        if (plan_calibrate_net(cal, &rank, &size)) {
            gcomp_cost_calibration_free(cal);
            return 1;
        }
    }
#endif
    const char *specs[MAX_METHODS + 4];
    size_t ns = 0;
    specs[ns++] = "none";
    specs[ns++] = "none:values=f16";
    for (int i = 0; i < o->nmethods; i++) {
        const char *m = o->methods[i];
        if (!strcmp(m, "dense") || !strcmp(m, "dense-f16") || !strncmp(m, "policy:", 7)) continue;
        specs[ns++] = m;
    }
    int rc = 0;
    for (size_t i = 0; i < ns && !rc; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec, "%s", specs[i]);
        spec[strcspn(spec, "@;")] = 0;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(spec, ":"), spec);
        const gcomp_codec_info *ci = gcomp_codec_find(name);
        /* Shaped codecs are measured on a square-ish matrix of about --size elements. */
        for (size_t k = 0; k < o->ncalib && !rc; k++) {
            size_t n = o->calib_n[k], rows = 0, cols = 0;
            if (ci && (ci->flags & GCOMP_CODEC_NEEDS_SHAPE)) {
                rows = (size_t)sqrt((double)n);
                cols = rows;
                n = rows * cols;
            }
            gcomp_cost_codec_rate r;
            gcomp_error e = {0};
            double t0 = cli_now();
            if (gcomp_cost_calibrate_codec(spec, n, rows, cols, 5, &r, &e) != GCOMP_OK) {
                rc = cli_fail(CMD, 2, "--calibrate: %s", e.message);
                break;
            }
            gcomp_cost_calibration_add_codec(cal, &r, NULL);
            if (rank == 0)
                fprintf(stderr,
                        "calibrated %-40s at %9zu: encode %.3f ns/elem + %.1f us, decode %.3f "
                        "ns/elem + %.1f us (%.1f s)\n",
                        r.spec, n, 1e9 * r.encode_per_elem, 1e6 * r.encode_fixed_s,
                        1e9 * r.decode_per_elem, 1e6 * r.decode_fixed_s, cli_now() - t0);
        }
    }
    if (!rc && rank == 0) {
        size_t len = 0;
        gcomp_cost_calibration_format(cal, NULL, 0, &len);
        char *text = malloc(len + 1);
        if (!text || gcomp_cost_calibration_format(cal, text, len + 1, &len) != GCOMP_OK)
            rc = cli_fail(CMD, 1, "out of memory");
        else {
            mkdirs_for(path);
            rc = cli_write_file(CMD, path, text, len) ? 1 : 0;
            if (!rc) fprintf(stderr, "wrote %s (%d rank%s)\n", path, size, size > 1 ? "s" : "");
        }
        free(text);
    }
    gcomp_cost_calibration_free(cal);
#ifdef GCOMP_CLI_MPI
    plan_net_finalize();
#endif
    return rc;
}

/* ---- output ---------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
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

static void json_num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* "1.23 Gbit/s", "never", "always" for a break-even bandwidth in bytes/s of goodput. */
static void fmt_breakeven(char *out, size_t cap, double B, double eff) {
    if (B == 0)
        snprintf(out, cap, "never pays");
    else if (isinf(B))
        snprintf(out, cap, "always pays");
    else {
        double bits = B * 8 / eff;
        if (bits >= 1e9)
            snprintf(out, cap, "%.3g Gbit/s", bits / 1e9);
        else
            snprintf(out, cap, "%.3g Mbit/s", bits / 1e6);
    }
}

typedef struct row {
    gcomp_cost_result r;
    double speed_f32, speed_f16, breakeven;
} row;

static int make_model(const method_plan *mp, int P, int nodes, const gcomp_cost_calibration *cal,
                      gcomp_cost_model **m) {
    gcomp_error e = {0};
    if (gcomp_cost_model_create(m, mp->t, mp->nt, P, nodes, cal, &e) != GCOMP_OK)
        return cli_fail(CMD, 2, "method '%s': %s", mp->label, e.message);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    popts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    char defpath[PATH_MAX];
    const char *calpath =
        o.calibration ? o.calibration : cli_default_calibration(defpath, sizeof defpath);
    if (o.calibrate) {
        rc = calibrate(&o, calpath);
        for (int i = 0; i < o.nmethods; i++) free(o.methods[i]);
        return rc;
    }
    gcomp_cost_calibration *cal = NULL;
    ptensor *pt = NULL;
    size_t nt = 0;
    double fb_s = 0;
    method_plan *plans = NULL, base[2] = {{0}, {0}};
    gcomp_cost_model **models = NULL;
    if (cli_load_calibration(CMD, calpath, o.calibration != NULL, &cal)) return 2;
    if (builtin_model(&o, &pt, &nt, &fb_s) != 0 && (rc = read_model_file(o.model, &pt, &nt)))
        goto out;

    /* The links. */
    gcomp_cost_net net;
    gcomp_cost_net_default(&net);
    const char *link_from = "--link";
    if (o.have_link) {
        net.inter.bandwidth = o.link_bps / 8 * o.efficiency;
        net.inter.latency = o.latency;
    } else {
        const gcomp_cost_net_rate *nr = gcomp_cost_calibration_net(cal, "inter");
        if (!nr) nr = gcomp_cost_calibration_net(cal, "intra");
        if (!nr) {
            rc = cli_fail(CMD, 2,
                          "no link: give --link RATE (e.g. 1gbit), or calibrate the network "
                          "(mpirun -np 2 gradcomp plan --calibrate) into %s",
                          calpath);
            goto out;
        }
        gcomp_cost_link_measured(nr, &net.inter);
        link_from = "calibration";
    }
    if (o.have_burst) net.inter.burst = o.burst;
    net.intra.bandwidth = o.intra_bps / 8;
    net.intra.latency = o.intra_latency;
    net.servers = o.servers;
    gcomp_cost_compute comp = {0};
    if (o.forward_ms > 0 || o.backward_ms > 0) {
        comp.forward_s = o.forward_ms * 1e-3;
        comp.backward_s = o.backward_ms * 1e-3;
    } else {
        double c = o.have_compute ? o.compute_ms * 1e-3 : fb_s;
        comp.forward_s = c / 3;
        comp.backward_s = c - comp.forward_s;
    }
    comp.optimizer_s = o.optimizer_ms * 1e-3;
    comp.overlap = o.overlap;
    comp.concurrent = o.concurrent;

    size_t nm = (size_t)o.nmethods;
    plans = calloc(nm, sizeof *plans);
    models = calloc(nm + 2, sizeof *models);
    row *rows = calloc(nm * (size_t)o.nworkers, sizeof *rows);
    if (!plans || !models || !rows) {
        free(rows);
        rc = cli_fail(CMD, 1, "out of memory");
        goto out;
    }
    if (o.json) {
        printf("{\"model\": ");
        json_str(stdout, o.model);
        printf(", \"tensors\": %zu, \"link_bytes_per_s\": ", nt);
        json_num(stdout, net.inter.bandwidth);
        printf(", \"link_from\": \"%s\", \"latency_s\": ", link_from);
        json_num(stdout, net.inter.latency);
        printf(", \"link_burst_bytes\": ");
        json_num(stdout, net.inter.burst);
        printf(", \"compute_s\": ");
        json_num(stdout, comp.forward_s + comp.backward_s + comp.optimizer_s);
        printf(", \"overlap\": ");
        json_num(stdout, comp.overlap);
        printf(", \"concurrent\": %d", comp.concurrent);
        printf(", \"calibration\": ");
        if (cal)
            json_str(stdout, calpath);
        else
            printf("null");
        printf(", \"results\": [");
    } else {
        printf("plan: model %s (%zu tensors), link %.4g Mbit/s goodput (%s), latency %.1f us, "
               "burst %.0f KiB, compute %.2f ms/step, overlap %.2f, calibration %s\n",
               o.model, nt, net.inter.bandwidth * 8 / 1e6, link_from, 1e6 * net.inter.latency,
               net.inter.burst / 1024, 1e3 * (comp.forward_s + comp.backward_s + comp.optimizer_s),
               comp.overlap, cal ? calpath : "none (1 ns/element defaults)");
    }
    bool first_json = true;
    for (int w = 0; w < o.nworkers && !rc; w++) {
        int P = o.workers[w], nodes = o.nodes ? (o.nodes < P ? o.nodes : P) : P;
        net.workers = P;
        net.nodes = nodes;
        /* Baselines: dense f32 and f16 ring allreduce of every tensor. */
        const char *bl[2] = {"dense", "dense-f16"};
        for (int b = 0; b < 2 && !rc; b++) {
            method_plan_free(&base[b]);
            gcomp_cost_model_free(models[nm + (size_t)b]);
            models[nm + (size_t)b] = NULL;
            if ((rc = plan_method(&o, bl[b], pt, nt, P, &base[b]))) break;
            rc = make_model(&base[b], P, nodes, cal, &models[nm + (size_t)b]);
        }
        gcomp_cost_result rb[2];
        for (int b = 0; b < 2 && !rc; b++)
            if (gcomp_cost_eval(models[nm + (size_t)b], &net, &comp, &rb[b], NULL) != GCOMP_OK)
                rc = cli_fail(CMD, 2, "bad network or compute description");
        if (!o.json && !rc)
            printf("\nP = %d workers on %d node%s\n%-36s %12s %9s %9s %9s %9s %8s %8s %13s  %s\n",
                   P, nodes, nodes > 1 ? "s" : "", "method", "bytes/step", "step ms", "compute",
                   "codec", "exposed", "vs f32", "vs f16", "break-even", "strategies");
        for (size_t i = 0; i < nm && !rc; i++) {
            method_plan_free(&plans[i]);
            gcomp_cost_model_free(models[i]);
            models[i] = NULL;
            if ((rc = plan_method(&o, o.methods[i], pt, nt, P, &plans[i]))) break;
            if ((rc = make_model(&plans[i], P, nodes, cal, &models[i]))) break;
            gcomp_cost_tensor_result *per = calloc(nt, sizeof *per);
            row *r = &rows[(size_t)w * nm + i];
            if (!per || gcomp_cost_eval(models[i], &net, &comp, &r->r, per) != GCOMP_OK) {
                free(per);
                rc = cli_fail(CMD, 2, "bad network or compute description");
                break;
            }
            r->speed_f32 = rb[0].step_s / r->r.step_s;
            r->speed_f16 = rb[1].step_s / r->r.step_s;
            gcomp_cost_break_even(models[i], models[nm], (size_t)-1, &net, &comp, &r->breakeven);
            /* The strategies used, each once. */
            char strat[160] = "";
            for (size_t k = 0; k < nt; k++) {
                const char *s = strategy_name(plans[i].t[k].strategy);
                if (!strstr(strat, s) && strlen(strat) + strlen(s) + 2 < sizeof strat) {
                    if (strat[0]) strcat(strat, ",");
                    strcat(strat, s);
                }
            }
            char be[32];
            fmt_breakeven(be, sizeof be, r->breakeven, o.efficiency);
            if (o.json) {
                printf("%s\n {\"workers\": %d, \"nodes\": %d, \"method\": ", first_json ? "" : ",",
                       P, nodes);
                first_json = false;
                json_str(stdout, o.methods[i]);
                printf(", \"bytes_per_step\": %.0f, \"step_s\": ", r->r.bytes_sent);
                json_num(stdout, r->r.step_s);
                printf(", \"compute_s\": ");
                json_num(stdout, r->r.compute_s);
                printf(", \"codec_s\": ");
                json_num(stdout, r->r.codec_s);
                printf(", \"comm_s\": ");
                json_num(stdout, r->r.comm_s);
                printf(", \"exposed_comm_s\": ");
                json_num(stdout, r->r.exposed_s);
                printf(", \"speedup_vs_dense_f32\": ");
                json_num(stdout, r->speed_f32);
                printf(", \"speedup_vs_dense_f16\": ");
                json_num(stdout, r->speed_f16);
                printf(", \"break_even_link_bits_per_s\": ");
                json_num(stdout, r->breakeven * 8 / o.efficiency);
                printf(", \"calibrated\": %d, \"tensors\": [", r->r.calibrated);
                for (size_t k = 0; k < nt; k++) {
                    double tb = 0;
                    gcomp_cost_break_even(models[i], models[nm], k, &net, &comp, &tb);
                    printf("%s{\"name\": ", k ? ", " : "");
                    json_str(stdout, pt[k].name);
                    printf(", \"n\": %zu, \"spec\": ", pt[k].n);
                    json_str(stdout, plans[i].t[k].spec);
                    printf(", \"strategy\": \"%s\", \"message_bytes\": %.0f, \"bytes_sent\": "
                           "%.0f, \"encode_s\": ",
                           strategy_name(plans[i].t[k].strategy), per[k].message_bytes,
                           per[k].bytes_sent);
                    json_num(stdout, per[k].encode_s);
                    printf(", \"decode_s\": ");
                    json_num(stdout, per[k].decode_s);
                    printf(", \"hidden_s\": ");
                    json_num(stdout, per[k].hidden_s);
                    printf(", \"comm_s\": ");
                    json_num(stdout, per[k].comm_s);
                    printf(", \"ready_s\": ");
                    json_num(stdout, per[k].ready_s);
                    printf(", \"done_s\": ");
                    json_num(stdout, per[k].done_s);
                    printf(", \"bucket\": %u", plans[i].t[k].bucket);
                    printf(", \"break_even_link_bits_per_s\": ");
                    json_num(stdout, tb * 8 / o.efficiency);
                    printf(", \"calibrated\": %d}", per[k].calibrated);
                }
                printf("]}");
            } else {
                printf("%-36.36s %12.0f %9.3f %9.3f %9.3f %9.3f %7.2fx %7.2fx %13s  %s%s\n",
                       o.methods[i], r->r.bytes_sent, 1e3 * r->r.step_s, 1e3 * r->r.compute_s,
                       1e3 * r->r.codec_s, 1e3 * r->r.exposed_s, r->speed_f32, r->speed_f16, be,
                       strat,
                       r->r.calibrated == 2 ? ""
                       : r->r.calibrated    ? " (codec scaled)"
                                            : " (uncalibrated)");
                if (o.per_tensor)
                    for (size_t k = 0; k < nt; k++) {
                        double tb = 0;
                        char tbs[32];
                        gcomp_cost_break_even(models[i], models[nm], k, &net, &comp, &tb);
                        fmt_breakeven(tbs, sizeof tbs, tb, o.efficiency);
                        printf("    %-24.24s %10zu %-28.28s %-10s %10.0f B  codec %8.3f ms  comm "
                               "%8.3f ms  break-even %s\n",
                               pt[k].name, pt[k].n, plans[i].t[k].spec,
                               strategy_name(plans[i].t[k].strategy), per[k].bytes_sent,
                               1e3 * (per[k].encode_s + per[k].decode_s + per[k].hidden_s),
                               1e3 * per[k].comm_s, tbs);
                    }
            }
            free(per);
        }
    }
    if (!rc && o.json) printf("\n]}\n");
    if (!rc && !o.json)
        printf("\nbytes/step: per rank, as gcomp_mpi_stats counts them; vs f32/f16: predicted "
               "speed-up over dense ring allreduce; break-even: link speed above which the "
               "method is no faster than dense f32\n");

    /* Step time against link speed, at the first worker count. */
    if (!rc && o.plot) {
        int P = o.workers[0], nodes = o.nodes ? (o.nodes < P ? o.nodes : P) : P;
        char dat[PATH_MAX], gp[PATH_MAX];
        snprintf(dat, sizeof dat, "%s.dat", o.plot);
        snprintf(gp, sizeof gp, "%s.gp", o.plot);
        FILE *d = fopen(dat, "w");
        if (!d) {
            rc = cli_fail(CMD, 1, "cannot write %s: %s", dat, strerror(errno));
            goto plotted;
        }
        gcomp_cost_model *pm[MAX_METHODS + 2] = {0};
        method_plan pp[MAX_METHODS + 2] = {{0}};
        const char *labels[MAX_METHODS + 2];
        size_t np = 0;
        labels[np++] = "dense";
        labels[np++] = "dense-f16";
        for (size_t i = 0; i < nm; i++)
            if (strcmp(o.methods[i], "dense") && strcmp(o.methods[i], "dense-f16"))
                labels[np++] = o.methods[i];
        for (size_t i = 0; i < np && !rc; i++)
            if (!(rc = plan_method(&o, labels[i], pt, nt, P, &pp[i])))
                rc = make_model(&pp[i], P, nodes, cal, &pm[i]);
        net.workers = P;
        net.nodes = nodes;
        for (double lg = 7; lg <= 12.001 && !rc; lg += 0.05) {
            net.inter.bandwidth = pow(10, lg) / 8 * o.efficiency;
            fprintf(d, "%.6g", pow(10, lg));
            for (size_t i = 0; i < np; i++) {
                gcomp_cost_result r;
                gcomp_cost_eval(pm[i], &net, &comp, &r, NULL);
                fprintf(d, " %.6g", 1e3 * r.step_s);
            }
            fprintf(d, "\n");
        }
        fclose(d);
        for (size_t i = 0; i < np; i++) {
            gcomp_cost_model_free(pm[i]);
            method_plan_free(&pp[i]);
        }
        FILE *g = rc ? NULL : fopen(gp, "w");
        if (!rc && !g) rc = cli_fail(CMD, 1, "cannot write %s: %s", gp, strerror(errno));
        if (g) {
            fprintf(g,
                    "set terminal pngcairo noenhanced size 900,560 font 'sans,10'\n"
                    "set output '%s'\nset logscale xy\nset grid\nset key top right\n"
                    "set xlabel 'link speed (bit/s)'\nset ylabel 'predicted step time (ms)'\n"
                    "set title 'gradcomp plan: %s, %d workers'\nplot ",
                    o.plot, o.model, P);
            for (size_t i = 0; i < np; i++)
                fprintf(g, "%s'%s' using 1:%zu with lines lw 2 title '%s'", i ? ", " : "", dat,
                        i + 2, labels[i]);
            fprintf(g, "\n");
            fclose(g);
            char kept[PATH_MAX + 32];
            snprintf(kept, sizeof kept, "the data is in %s", dat);
            if (cli_gnuplot(CMD, gp, kept))
                rc = 1;
            else if (!o.json)
                printf("wrote %s\n", o.plot);
        }
    }
plotted:
    free(rows);
out:
    for (size_t i = 0; plans && i < (size_t)o.nmethods; i++) method_plan_free(&plans[i]);
    for (size_t i = 0; models && i < (size_t)o.nmethods + 2; i++) gcomp_cost_model_free(models[i]);
    method_plan_free(&base[0]);
    method_plan_free(&base[1]);
    free(plans);
    free(models);
    free(pt);
    gcomp_cost_calibration_free(cal);
    for (int i = 0; i < o.nmethods; i++) free(o.methods[i]);
    return rc;
}

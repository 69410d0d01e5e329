/*
 * adapt.c - the engine behind adaptive compression (include/gradcomp.h, "Adaptive
 * compression"): parses the method string, applies the layer policy, builds each managed
 * tensor's ladder of candidate specs, gathers this rank's observations, combines every
 * rank's statistics in rank order and runs the controllers (adapt_*.c) over a plan.
 *
 * Why the statistics travel raw: a decision must be the same on every rank, bit for bit.
 * A floating-point MPI_Allreduce does not promise that (the reduction order may differ
 * between ranks), so each rank contributes a fixed block of doubles, the caller
 * allgathers the blocks, and every rank combines them in rank order - sums left to right,
 * maxima, medians of sorted values - getting the same bits.  The controllers then read
 * only the combined statistics and their own state, which only decisions change; this
 * rank's observations reach them through its block and nowhere else.  The blocks carry a
 * fingerprint of the configuration (method, ladder, tensors) and the decision index, so a
 * rank with other settings, or one that skipped a decision, makes every rank fail with
 * GCOMP_E_MISMATCH instead of deciding differently.
 *
 * The ladder: the candidates a managed tensor may take, ordered by the bytes they send
 * over all managed tensors (gcomp_spec_bytes_estimate, the library's own formats), most
 * first, so "lighter" and "heavier" compression mean the same thing for every codec (a
 * lower density, a lower rank, fewer levels).  Entries that send the same bytes are
 * refused: a controller could not tell them apart.
 *
 * Measurement (layers' errors, bandwidth's codec times): on a measurement step each
 * managed tensor's gradient plus its compressor's residual (the vector the codec will
 * compress; the gradient alone with layers' error_on=gradient) is compressed by every
 * candidate on a scratch compressor without feedback
 * (specs whose feedback is fixed keep it, from a fresh state) and without warm-up (the
 * steady state, whose bytes the controllers weigh), decoded, and the squared
 * error and the encode and decode times recorded.  Scratch compressors are created and
 * freed per measurement: a measurement runs every few hundred steps, and keeping K of
 * them per tensor would hold K times the model's size in workspaces.
 *
 * Rejected: an MPI_Allreduce of the statistics (see above); letting each controller
 * gather its own statistics (one collective per decision is enough, and a controller
 * written against MPI could not serve the PyTorch hook, which gathers through gloo).
 */
#include "adapt_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#define PREFIX "adapt:"
#define MAGIC 18241.0 /* 'GA', then the version */
/* 2: the interval's wall and measuring seconds; 3: the metric's step; 4: the link probe's
 * seconds; 5: the learning rate */
#define VERSION 5.0
#define MAX_LADDER 32
#define MAX_ITEMS 64
#define DEFAULT_BASE "topk:density=0.001,feedback=ef"
#define DEFAULT_SAMPLE ((size_t)1 << 20) /* elements per tensor a measurement compresses */
#define MEASURE_REPS 3 /* timed encodes and decodes per candidate; the least counts */

/* Fixed words of a statistics block. */
enum {
    S_MAGIC,
    S_FP_LO,
    S_FP_HI,
    S_DECISION,
    S_STEP,
    S_FWD,
    S_BWD,
    S_OPT,
    S_BW,
    S_LAT,
    S_PTIME,
    S_METRIC,
    S_METRIC_STEP,
    S_LR,
    S_MEASURED,
    S_WALL,
    S_MTIME,
    S_FIXED
};
_Static_assert(S_FIXED == GCOMP__ADAPT_STATS_FIXED, "adapt_internal.h names the block's size");

static const gcomp__adapt_ctl *const controllers[] = {
    &gcomp__adapt_bandwidth, &gcomp__adapt_accuracy, &gcomp__adapt_layers, &gcomp__adapt_norm};
#define NCTL (sizeof controllers / sizeof controllers[0])

/* Keys the engine reads itself, and the layer policy's. */
static const char *const engine_keys[] = {"base",     "ladder",  "knob",         "with_dense",
                                          "interval", "measure", "dense",        "min_elements",
                                          "dense_1d", "sample",  "measure_cost", NULL};

static char *dup_str(const char *s) {
    size_t l = strlen(s);
    char *p = gcomp__alloc(l + 1);
    if (p) memcpy(p, s, l + 1);
    return p;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) e--;
    *e = 0;
    return s;
}

static bool is_glob(const char *key) {
    return strpbrk(key, "*?.") != NULL;
}

static bool is_option_key(const char *key) {
    for (const char *const *k = engine_keys; *k; k++)
        if (!strcmp(*k, key)) return true;
    for (size_t c = 0; c < NCTL; c++)
        for (const char *const *k = controllers[c]->keys; k && *k; k++)
            if (!strcmp(*k, key)) return true;
    return false;
}

/* A name override (GLOB=SPEC, as the layer policy takes it): a key with a glob's or a
 * dotted name's characters, or one that is no option and is some tensor's whole name. */
static bool is_override(const gcomp_adapt *a, const char *key) {
    if (is_glob(key)) return true;
    if (is_option_key(key)) return false;
    for (size_t i = 0; i < a->nt; i++)
        if (a->t[i].name && !strcmp(a->t[i].name, key)) return true;
    return false;
}

static gcomp__adapt_item *find_item(gcomp_adapt *a, const char *key) {
    for (size_t i = 0; i < a->nitems; i++)
        if (!strcmp(a->items[i].key, key)) return &a->items[i];
    return NULL;
}

const char *gcomp__adapt_opt(gcomp_adapt *a, const char *key) {
    gcomp__adapt_item *it = find_item(a, key);
    if (!it) return NULL;
    it->used = true;
    return it->val;
}

/* Item `key` read as the number x (its default: dflt, NaN for none). */
static void note_number(gcomp_adapt *a, const char *key, double x, double dflt) {
    gcomp__adapt_item *it = find_item(a, key);
    if (!it) return;
    it->numeric = true;
    it->num = x;
    it->is_default = x == dflt;
}

gcomp_status gcomp__adapt_num(gcomp_adapt *a, const char *ctl, const char *key, double dflt,
                              double lo, double hi, double *out, gcomp_error *err) {
    const char *v = gcomp__adapt_opt(a, key);
    *out = dflt;
    if (!v) return GCOMP_OK;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi)
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: %s: %s=%s: a number in [%g, %g]", ctl, key, v,
                           lo, hi);
    *out = x;
    note_number(a, key, x, dflt);
    return GCOMP_OK;
}

gcomp_status gcomp__adapt_whole(gcomp_adapt *a, const char *ctl, const char *key, double dflt,
                                double lo, double hi, double *out, gcomp_error *err) {
    gcomp_status st = gcomp__adapt_num(a, ctl, key, dflt, lo, hi, out, err);
    if (st == GCOMP_OK && *out != floor(*out))
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: %s: %s=%s: a whole number in [%g, %g]", ctl,
                           key, gcomp__adapt_opt(a, key), lo, hi);
    return st;
}

gcomp_status gcomp__adapt_word(gcomp_adapt *a, const char *ctl, const char *key,
                               const char *const *words, const char *expected, int *out,
                               gcomp_error *err) {
    const char *v = gcomp__adapt_opt(a, key);
    *out = 0;
    if (!v) return GCOMP_OK;
    for (int k = 0; words[k]; k++)
        if (!strcmp(v, words[k])) {
            *out = k;
            return GCOMP_OK;
        }
    return gcomp__fail(err, GCOMP_E_SPEC, "adapt: %s: %s=%s: expected %s", ctl, key, v, expected);
}

void gcomp__adapt_plan_uniform(const gcomp_adapt *a, gcomp__adapt_plan *p, int level) {
    if (level < 0) level = 0;
    if (level >= (int)a->K) level = (int)a->K - 1;
    p->uniform = level;
    for (size_t m = 0; m < a->nm; m++) p->level[m] = level;
    p->budget = a->total[level];
}

/* ---- free ---------------------------------------------------------------------------- */

void gcomp_adapt_free(gcomp_adapt *a) {
    if (!a) return;
    for (size_t k = 0; k < a->nctl; k++)
        if (a->ctl[k]->free) a->ctl[k]->free(a->ctl_state[k]);
    for (size_t i = 0; a->t && i < a->nt; i++) {
        gcomp__free(a->t[i].name);
        gcomp__free(a->t[i].fixed);
        gcomp__free(a->t[i].acc);
    }
    for (size_t j = 0; a->ladder && j < a->K; j++) gcomp__free(a->ladder[j]);
    for (size_t i = 0; a->items && i < a->nitems; i++) {
        gcomp__free(a->items[i].key);
        gcomp__free(a->items[i].val);
    }
    gcomp_cost_calibration_free(a->cal);
    gcomp__free(a->method);
    gcomp__free(a->course);
    gcomp__free(a->exchange);
    gcomp__free(a->t);
    gcomp__free(a->mt);
    gcomp__free(a->ladder);
    gcomp__free(a->strategy);
    gcomp__free(a->bytes);
    gcomp__free(a->total);
    gcomp__free(a->items);
    gcomp__free(a->level);
    gcomp__free(a->prev);
    gcomp__free(a->changed);
    gcomp__free(a->meas);
    gcomp__free(a->xbuf);
    gcomp__free(a->dbuf);
    gcomp__free(a->pred);
    gcomp__free(a);
}

/* ---- parsing ------------------------------------------------------------------------- */

/* Whether a `sep`-separated list has an empty item (blanks count as empty), which strtok
 * would skip without a word: "a//b", "/a", "a+". */
static bool empty_token(const char *list, char sep) {
    bool blank = true; /* the item so far */
    for (const char *p = list;; p++) {
        if (*p == sep || !*p) {
            if (blank && (*p || p != list)) return true;
            if (!*p) return false;
            blank = true;
        } else if (!isspace((unsigned char)*p)) {
            blank = false;
        }
    }
}

static gcomp_status parse_controllers(gcomp_adapt *a, char *list, gcomp_error *err) {
    char names[160] = "";
    for (size_t k = 0; k < NCTL; k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                 controllers[k]->name);
    if (strchr(list, ','))
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: join controllers with '+' (e.g. adapt:bandwidth+layers), "
                           "not ',': '%s'",
                           list);
    if (empty_token(list, '+'))
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: an empty controller name (two '+' in a row, or one at an "
                           "end): '%s'",
                           list);
    bool seen[NCTL] = {false};
    for (char *save = NULL, *p = strtok_r(list, "+", &save); p; p = strtok_r(NULL, "+", &save)) {
        p = trim(p);
        size_t k = 0;
        while (k < NCTL && strcmp(p, controllers[k]->name)) k++;
        if (k == NCTL)
            return gcomp__fail(err, GCOMP_E_SPEC, "adapt: unknown controller '%s'; known: %s", p,
                               names);
        if (seen[k]) return gcomp__fail(err, GCOMP_E_SPEC, "adapt: controller '%s' named twice", p);
        seen[k] = true;
    }
    for (size_t k = 0; k < NCTL; k++) /* the fixed order, whatever the order written */
        if (seen[k]) a->ctl[a->nctl++] = controllers[k];
    if (a->nctl == 0)
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: name at least one controller (%s)", names);
    return GCOMP_OK;
}

static gcomp_status parse_items(gcomp_adapt *a, char *rest, gcomp_error *err) {
    a->items = gcomp__calloc(MAX_ITEMS * sizeof *a->items);
    if (!a->items) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    for (char *save = NULL, *p = strtok_r(rest, ";", &save); p; p = strtok_r(NULL, ";", &save)) {
        p = trim(p);
        if (!*p) continue;
        char *eq = strchr(p, '=');
        if (!eq) return gcomp__fail(err, GCOMP_E_SPEC, "adapt: '%s' is not KEY=VALUE", p);
        *eq = 0;
        char *key = trim(p), *val = trim(eq + 1);
        if (!*key) return gcomp__fail(err, GCOMP_E_SPEC, "adapt: an item has no key ('=%s')", val);
        for (size_t i = 0; i < a->nitems; i++)
            if (!strcmp(a->items[i].key, key))
                return gcomp__fail(err, GCOMP_E_SPEC, "adapt: key '%s' given twice", key);
        if (a->nitems == MAX_ITEMS)
            return gcomp__fail(err, GCOMP_E_SPEC, "adapt: more than %d items", MAX_ITEMS);
        gcomp__adapt_item *it = &a->items[a->nitems];
        it->key = dup_str(key);
        it->val = dup_str(val);
        if (!it->key || !it->val) {
            gcomp__free(it->key);
            gcomp__free(it->val);
            return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        }
        a->nitems++;
    }
    return GCOMP_OK;
}

/* ---- the layer policy: which tensors are managed --------------------------------------- */

static gcomp_status apply_policy(gcomp_adapt *a, const char *base, const gcomp_tensor_desc *t,
                                 const gcomp_adapt_options *opt, gcomp_error *err) {
    const char *dense = gcomp__adapt_opt(a, "dense"), *minel = gcomp__adapt_opt(a, "min_elements"),
               *d1 = gcomp__adapt_opt(a, "dense_1d");
    size_t cap = 256 + strlen(base);
    for (size_t i = 0; i < a->nitems; i++)
        cap += strlen(a->items[i].key) + strlen(a->items[i].val) + 2;
    if (dense) cap += strlen(dense);
    if (opt && opt->dense_spec) cap += strlen(opt->dense_spec);
    char *text = gcomp__alloc(cap);
    if (!text) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    int w = snprintf(text, cap, "spec=%s;dense=%s", base,
                     dense                    ? dense
                     : opt && opt->dense_spec ? opt->dense_spec
                                              : "none");
    if (minel)
        w += snprintf(text + w, cap - (size_t)w, ";min_elements=%s", minel);
    else if (opt && opt->min_elements)
        w += snprintf(text + w, cap - (size_t)w, ";min_elements=%zu", opt->min_elements);
    if (d1) w += snprintf(text + w, cap - (size_t)w, ";dense_1d=%s", d1);
    for (size_t i = 0; i < a->nitems; i++)
        if (is_override(a, a->items[i].key)) {
            /* `dense`, as in ladder=, is the dense spec */
            const char *v = strcmp(a->items[i].val, "dense") ? a->items[i].val : "none";
            a->items[i].used = true;
            w += snprintf(text + w, cap - (size_t)w, ";%s=%s", a->items[i].key, v);
        }
    gcomp_policy *pol = NULL;
    gcomp_error local = {0};
    gcomp_status st = gcomp_policy_create(&pol, text, &local);
    gcomp__free(text);
    if (st != GCOMP_OK) return gcomp__fail(err, st, "adapt: %s", local.message);
    for (size_t i = 0; i < a->nt && st == GCOMP_OK; i++) {
        gcomp_layer_plan plan;
        st = gcomp_policy_choose(pol, &t[i], &plan, &local);
        if (st != GCOMP_OK) {
            gcomp__fail(err, st, "adapt: %s", local.message);
            break;
        }
        gcomp__adapt_tensor *x = &a->t[i];
        x->managed = plan.rule == GCOMP_RULE_DEFAULT;
        x->m = -1;
        if (!x->managed) {
            char canon[GCOMP__SPEC_MAX];
            st = gcomp_spec_canonical(plan.spec, canon, sizeof canon, NULL, err);
            if (st == GCOMP_OK && !(x->fixed = dup_str(canon)))
                st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        } else {
            x->m = (int)a->nm++;
        }
    }
    gcomp_policy_free(pol);
    return st;
}

/* ---- the ladder ---------------------------------------------------------------------- */

/* A ladder item as a canonical spec: a number is a value of the knob, `dense` the dense
 * candidate, a word without ':' a value of the knob if the knob takes it (knob=values,
 * ladder=f32/int8: int8 the value coder, not the codec), anything else a spec. */
static gcomp_status item_spec(const char *base, const char *knob, const char *item, char *out,
                              size_t cap, gcomp_error *err) {
    if (!*item) return gcomp__fail(err, GCOMP_E_SPEC, "adapt: ladder: an empty entry");
    if (!strcmp(item, "dense")) return gcomp_spec_canonical("none", out, cap, NULL, err);
    char *end;
    errno = 0;
    double v = strtod(item, &end);
    gcomp_error local = {0}, kerr = {0};
    gcomp_status st;
    if (end != item && !*end && !errno) {
        (void)v;
        if (!knob)
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: ladder: '%s' is a value, but base '%s' has no knob "
                               "(density=, rank=, levels=); name one with knob=KEY or give specs",
                               item, base);
        st = gcomp_spec_set(base, knob, item, out, cap, &local);
    } else if (knob && !strchr(item, ':') &&
               gcomp_spec_set(base, knob, item, out, cap, &kerr) == GCOMP_OK) {
        return GCOMP_OK;
    } else if ((st = gcomp_spec_canonical(item, out, cap, NULL, &local)) != GCOMP_OK && knob &&
               !strchr(item, ':')) {
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: ladder entry '%s' refused (as %s=: %s; as a spec: %s)", item,
                           knob, kerr.message, local.message);
    }
    if (st != GCOMP_OK)
        return gcomp__fail(err, st, "adapt: ladder entry refused (%s): '%s'", local.message,
                           item); /* the reason first: a long spec would cut it off */
    return GCOMP_OK;
}

/* The knob of a base spec: knob= if given, else the first of density, rank, levels it has. */
static const char *find_knob(gcomp_adapt *a, const char *base, gcomp_error *err, bool *bad) {
    static const char *const knobs[] = {"density", "rank", "levels"};
    const char *k = gcomp__adapt_opt(a, "knob");
    char tmp[64];
    *bad = false;
    if (k) {
        gcomp_error local = {0};
        if (gcomp_spec_get(base, k, tmp, sizeof tmp, &local) != GCOMP_OK) {
            gcomp__fail(err, GCOMP_E_SPEC, "adapt: knob=%s: %s", k, local.message);
            *bad = true;
            return NULL;
        }
        return k;
    }
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        if (gcomp_spec_get(base, knobs[i], tmp, sizeof tmp, NULL) == GCOMP_OK) return knobs[i];
    return NULL;
}

/* The auto ladder's values, as text, around the base's knob value v. */
static size_t auto_values(const char *knob, double v, char vals[][32]) {
    size_t n = 0;
    if (!strcmp(knob, "density")) {
        static const double f[] = {100, 31.6227766, 10, 3.16227766, 1, 0.316227766, 0.1};
        bool capped = false;
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
            double d = v * f[i];
            if (d >= 1) {
                if (capped) continue;
                d = 1;
                capped = true;
            }
            snprintf(vals[n++], 32, "%.3g", d);
        }
    } else if (!strcmp(knob, "rank") || !strcmp(knob, "levels")) {
        static const double f[] = {4, 2, 1, 0.5};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
            double r = floor(v * f[i]);
            if (r < 1 || (!strcmp(knob, "levels") && r < 2)) continue;
            snprintf(vals[n++], 32, "%.0f", r);
        }
    }
    return n;
}

static gcomp_status add_candidate(gcomp_adapt *a, const char *canon, gcomp_error *err) {
    for (size_t j = 0; j < a->K; j++)
        if (!strcmp(a->ladder[j], canon)) return GCOMP_OK;
    if (a->K == MAX_LADDER)
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: ladder: more than %d entries", MAX_LADDER);
    if (!(a->ladder[a->K] = dup_str(canon)))
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    a->K++;
    return GCOMP_OK;
}

static int default_strategy(const char *spec) {
    gcomp_spec_info info;
    if (gcomp_spec_describe(spec, 0, &info, NULL) != GCOMP_OK) return GCOMP_COST_ALLGATHER;
    return info.flags & (GCOMP_SPEC_LINEAR | GCOMP_SPEC_MULTIPHASE) ? GCOMP_COST_ALLREDUCE
                                                                    : GCOMP_COST_ALLGATHER;
}

static int strategy_of(const gcomp_adapt_options *opt, const char *spec) {
    int s = opt && opt->strategy ? opt->strategy(opt->strategy_ctx, spec) : 0;
    return s > 0 ? s : default_strategy(spec);
}

static gcomp_status build_ladder(gcomp_adapt *a, const char *base, const char *dflt,
                                 const gcomp_adapt_options *opt, gcomp_error *err) {
    gcomp_status st;
    char canon[GCOMP__SPEC_MAX], bcanon[GCOMP__SPEC_MAX];
    if ((st = gcomp_spec_canonical(base, bcanon, sizeof bcanon, NULL, err)) != GCOMP_OK) return st;
    bool bad;
    const char *knob = find_knob(a, bcanon, err, &bad);
    if (bad) return GCOMP_E_SPEC;
    const char *ladder = gcomp__adapt_opt(a, "ladder");
    if (!ladder) ladder = dflt;
    double wd;
    bool has_bw = false;
    for (size_t k = 0; k < a->nctl; k++) has_bw |= a->ctl[k] == &gcomp__adapt_bandwidth;
    if ((st = gcomp__adapt_whole(a, "ladder", "with_dense", has_bw ? 1 : 0, 0, 1, &wd, err)) !=
        GCOMP_OK)
        return st;
    if (!(a->ladder = gcomp__calloc(MAX_LADDER * sizeof *a->ladder)))
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    if (ladder && !*ladder)
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: ladder is empty: give A/B/... or auto");
    if (!ladder || !strcmp(ladder, "auto")) {
        double v;
        char vals[16][32];
        size_t nv = 0;
        if (knob && gcomp_spec_get_number(bcanon, knob, &v, NULL) == GCOMP_OK)
            nv = auto_values(knob, v, vals);
        if (nv == 0)
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: ladder=auto needs a base with density=, rank= or levels= "
                               "('%s'); give ladder=SPEC/SPEC/...",
                               bcanon);
        if (wd != 0 &&
            ((st = item_spec(bcanon, knob, "dense", canon, sizeof canon, err)) != GCOMP_OK ||
             (st = add_candidate(a, canon, err)) != GCOMP_OK))
            return st;
        for (size_t i = 0; i < nv; i++) {
            if ((st = item_spec(bcanon, knob, vals[i], canon, sizeof canon, err)) != GCOMP_OK)
                return st;
            if ((st = add_candidate(a, canon, err)) != GCOMP_OK) return st;
        }
    } else {
        size_t len = strlen(ladder);
        if (empty_token(ladder, '/'))
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: ladder: an empty entry (two '/' in a row, or one at an "
                               "end): '%s'",
                               ladder);
        char *copy = gcomp__alloc(len + 1);
        if (!copy) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        memcpy(copy, ladder, len + 1);
        st = GCOMP_OK;
        size_t items = 0;
        for (char *save = NULL, *p = strtok_r(copy, "/", &save); p && st == GCOMP_OK;
             p = strtok_r(NULL, "/", &save)) {
            p = trim(p);
            if (!*p) continue;
            items++;
            st = item_spec(bcanon, knob, p, canon, sizeof canon, err);
            if (st == GCOMP_OK) st = add_candidate(a, canon, err);
        }
        gcomp__free(copy);
        if (st != GCOMP_OK) return st;
        if (items == 0)
            return gcomp__fail(err, GCOMP_E_SPEC, "adapt: ladder '%s' is empty", ladder);
        if (wd != 0 &&
            ((st = item_spec(bcanon, knob, "dense", canon, sizeof canon, err)) != GCOMP_OK ||
             (st = add_candidate(a, canon, err)) != GCOMP_OK))
            return st;
    }
    if ((st = add_candidate(a, bcanon, err)) != GCOMP_OK) return st;

    /* Bytes of every candidate for every managed tensor, then the order. */
    a->bytes = gcomp__calloc(a->nm * a->K * sizeof(double) + 1);
    a->total = gcomp__calloc(a->K * sizeof(double));
    a->strategy = gcomp__calloc(a->K * sizeof(int));
    double *tmp = gcomp__calloc(a->nm * a->K * sizeof(double) + 1);
    if (!a->bytes || !a->total || !a->strategy || !tmp) {
        gcomp__free(tmp);
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    }
    for (size_t j = 0; j < a->K; j++) {
        for (size_t m = 0; m < a->nm; m++) {
            const gcomp__adapt_tensor *x = &a->t[a->mt[m]];
            size_t b;
            gcomp_error local = {0};
            st = gcomp_spec_bytes_estimate(a->ladder[j], x->n, x->rows, x->cols, &b, &local);
            if (st != GCOMP_OK) {
                gcomp__free(tmp);
                return gcomp__fail(err, st,
                                   "adapt: ladder entry refused for tensor '%s' (%s): '%s'",
                                   x->name, local.message, a->ladder[j]);
            }
            a->bytes[m * a->K + j] = (double)b;
            a->total[j] += (double)b;
        }
    }
    /* Stable selection sort by total bytes, most first (K <= 32). */
    for (size_t i = 0; i < a->K; i++) {
        size_t best = i;
        for (size_t j = i + 1; j < a->K; j++)
            if (a->total[j] > a->total[best]) best = j;
        if (best != i) {
            char *s = a->ladder[best];
            double t = a->total[best];
            memmove(a->ladder + i + 1, a->ladder + i, (best - i) * sizeof *a->ladder);
            memmove(a->total + i + 1, a->total + i, (best - i) * sizeof *a->total);
            a->ladder[i] = s;
            a->total[i] = t;
        }
    }
    for (size_t j = 0; j < a->K; j++) {
        for (size_t m = 0; m < a->nm; m++) {
            const gcomp__adapt_tensor *x = &a->t[a->mt[m]];
            size_t b = 0;
            gcomp_spec_bytes_estimate(a->ladder[j], x->n, x->rows, x->cols, &b, NULL);
            tmp[m * a->K + j] = (double)b;
        }
        a->strategy[j] = strategy_of(opt, a->ladder[j]);
        if (!strcmp(a->ladder[j], bcanon)) a->base = (int)j;
    }
    memcpy(a->bytes, tmp, a->nm * a->K * sizeof(double));
    gcomp__free(tmp);
    for (size_t j = 0; a->nm && j + 1 < a->K; j++)
        if (a->total[j] == a->total[j + 1])
            return gcomp__fail(err, GCOMP_E_SPEC,
                               "adapt: ladder entries that send the same bytes, which a "
                               "controller could not tell apart: '%s' and '%s'",
                               a->ladder[j], a->ladder[j + 1]);
    return GCOMP_OK;
}

int gcomp__adapt_find_level(gcomp_adapt *a, const char *item, gcomp_error *err) {
    char canon[GCOMP__SPEC_MAX];
    bool bad;
    const char *base = a->ladder[a->base];
    const char *knob = find_knob(a, base, err, &bad);
    if (bad) return -1;
    if (item_spec(base, knob, item, canon, sizeof canon, err) != GCOMP_OK) return -1;
    for (size_t j = 0; j < a->K; j++)
        if (!strcmp(a->ladder[j], canon)) return (int)j;
    /* Name what is there: the auto ladder's steps are powers of sqrt(10) from the base, so
     * a round value (low=0.01 from base 0.00316) is often near an entry, not on it. */
    char have[160] = "";
    size_t used = 0;
    for (size_t j = 0; knob && j < a->K && used < sizeof have; j++) {
        char v[32];
        if (gcomp_spec_get(a->ladder[j], knob, v, sizeof v, NULL) != GCOMP_OK) strcpy(v, "dense");
        int w = snprintf(have + used, sizeof have - used, "%s%s", j ? "/" : "", v);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (*have)
        gcomp__fail(err, GCOMP_E_SPEC, "adapt: '%s' is not in the ladder (%s=%s)", item, knob,
                    have);
    else
        gcomp__fail(err, GCOMP_E_SPEC, "adapt: '%s' (%s) is not in the ladder", item, canon);
    return -1;
}

/* ---- decisions ----------------------------------------------------------------------- */

static void apply_plan(gcomp_adapt *a, const gcomp__adapt_plan *p, size_t *changed) {
    size_t c = 0;
    for (size_t m = 0; m < a->nm; m++) {
        size_t i = a->mt[m];
        a->prev[m] = a->level[m];
        a->level[m] = p->level[m];
        a->changed[i] = a->level[m] != a->prev[m];
        c += a->changed[i];
    }
    if (changed) *changed = c;
    a->report.uniform_level = p->uniform;
    a->report.budget = p->budget;
    a->report.predicted_step_s = p->pred_s;
    a->report.critical = p->critical;
    a->report.error = p->error;
    a->report.error_uniform = p->error_uniform;
}

/* Every controller's state through its save (c->w NULL: only counts c->at); at[k] (may be
 * NULL) receives where controller k's section starts. */
static void save_controllers(const gcomp_adapt *a, gcomp__adapt_cursor *c, size_t *at) {
    for (size_t k = 0; k < a->nctl; k++) {
        if (at) at[k] = c->at;
        if (a->ctl[k]->save) a->ctl[k]->save(a, a->ctl_state[k], c);
    }
}

/* Runs the controllers in their order and applies their plan.  A controller that runs out
 * of memory ends the decision: every controller's state, and the predictions, are put back
 * as they were (saved first, loaded back), so the decision is taken whole or not at all on
 * this rank. */
static gcomp_status run_controllers(gcomp_adapt *a, const gcomp__adapt_in *in, size_t *changed) {
    gcomp__adapt_plan p = {0};
    gcomp__adapt_cursor c = {0};
    size_t at[sizeof a->ctl / sizeof a->ctl[0]];
    save_controllers(a, &c, NULL);
    size_t preds = a->K * sizeof(double);
    uint8_t *snap = gcomp__alloc(c.at + preds);
    p.level = gcomp__calloc((a->nm + 1) * sizeof(int));
    if (!p.level || !snap) {
        gcomp__free(p.level);
        gcomp__free(snap);
        return GCOMP_E_NOMEM;
    }
    c = (gcomp__adapt_cursor){snap, NULL, 0};
    save_controllers(a, &c, at);
    memcpy(snap + c.at, a->pred, preds);
    gcomp__adapt_plan_uniform(a, &p, a->base);
    gcomp_status st = GCOMP_OK;
    for (size_t k = 0; k < a->nctl && st == GCOMP_OK; k++)
        st = a->ctl[k]->decide(a, a->ctl_state[k], in, &p);
    if (st != GCOMP_OK) {
        for (size_t k = 0; k < a->nctl; k++) {
            if (!a->ctl[k]->save || !a->ctl[k]->load) continue;
            gcomp__adapt_cursor e = {.r = snap + at[k]};
            a->ctl[k]->load(a, a->ctl_state[k], &e, true, NULL);
        }
        memcpy(a->pred, snap + c.at, preds);
        gcomp__free(p.level);
        gcomp__free(snap);
        return st;
    }
    gcomp__free(snap);
    for (size_t m = 0; m < a->nm; m++) {
        if (p.level[m] < 0) p.level[m] = 0;
        if (p.level[m] >= (int)a->K) p.level[m] = (int)a->K - 1;
    }
    apply_plan(a, &p, changed);
    gcomp__free(p.level);
    return GCOMP_OK;
}

/* ---- create -------------------------------------------------------------------------- */

static void refresh_fp(gcomp_adapt *a);

static uint64_t fnv_str(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull;
}
static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h;
}

static int cmp_item_key(const void *x, const void *y) {
    return strcmp((*(const gcomp__adapt_item *const *)x)->key,
                  (*(const gcomp__adapt_item *const *)y)->key);
}

/* The items as the fingerprint sees them: what they mean, not how they were written.  The
 * options in key order (the order written means nothing), a number by its value, one that
 * gives its default left out (as if absent); then the name overrides in the order written
 * (the policy takes the first that matches). */
static uint64_t hash_items(const gcomp_adapt *a, uint64_t h) {
    const gcomp__adapt_item *opts[MAX_ITEMS];
    size_t n = 0;
    for (size_t i = 0; i < a->nitems; i++)
        if (!is_override(a, a->items[i].key)) opts[n++] = &a->items[i];
    qsort(opts, n, sizeof opts[0], cmp_item_key);
    for (size_t i = 0; i < n; i++) {
        if (opts[i]->numeric && opts[i]->is_default) continue;
        h = fnv_str(h, opts[i]->key);
        if (opts[i]->numeric) {
            uint64_t bits;
            double x = opts[i]->num + 0.0; /* -0 is 0 */
            memcpy(&bits, &x, sizeof bits);
            h = fnv_u64(h, bits);
        } else {
            h = fnv_str(h, opts[i]->val);
        }
    }
    for (size_t i = 0; i < a->nitems; i++)
        if (is_override(a, a->items[i].key))
            h = fnv_str(fnv_str(h, a->items[i].key), a->items[i].val);
    return h;
}

/* Option `key` as a count in [1, 1e9]; *given false when absent or equal to `word` (auto,
 * all). */
static gcomp_status count_opt(gcomp_adapt *a, const char *key, const char *word, uint64_t *out,
                              bool *given, gcomp_error *err) {
    const char *v = gcomp__adapt_opt(a, key);
    *given = false;
    if (v && !strcmp(v, word)) {
        note_number(a, key, 0, 0); /* the word means what an absent key means */
        return GCOMP_OK;
    }
    if (!v) return GCOMP_OK;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*v == '-' || end == v || *end || errno || x < 1 || x > 1000000000ull)
        return gcomp__fail(err, GCOMP_E_SPEC, "adapt: %s=%s: a count, 1..1e9, or %s", key, v, word);
    *out = x;
    *given = true;
    note_number(a, key, (double)x, NAN);
    return GCOMP_OK;
}

/* interval, measure (steps), measure_cost and sample. */
static gcomp_status resolve_schedule(gcomp_adapt *a, gcomp_error *err) {
    uint64_t interval = 100, measure, sample;
    bool given;
    gcomp_status st;
    if (a->total_steps) {
        interval = a->total_steps / 40;
        interval = interval < 10 ? 10 : interval > 500 ? 500 : interval;
    }
    if ((st = count_opt(a, "interval", "auto", &interval, &given, err)) != GCOMP_OK) return st;
    if ((st = count_opt(a, "measure", "auto", &measure, &given, err)) != GCOMP_OK) return st;
    a->measure_auto = !given;
    a->measure = given ? (measure + interval - 1) / interval * interval /* whole intervals */
                       : 4 * interval;
    if ((st = gcomp__adapt_num(a, "measure", "measure_cost", 0.02, 1e-4, 1, &a->measure_cost,
                               err)) != GCOMP_OK)
        return st;
    if (!a->measure_auto && gcomp__adapt_opt(a, "measure_cost"))
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: measure_cost= spaces measure=auto; with measure=%s it would "
                           "be ignored",
                           gcomp__adapt_opt(a, "measure"));
    const bool has_sample = gcomp__adapt_opt(a, "sample") != NULL;
    if ((st = count_opt(a, "sample", "all", &sample, &given, err)) != GCOMP_OK) return st;
    a->sample = given ? (size_t)sample : has_sample ? SIZE_MAX /* all */ : DEFAULT_SAMPLE;
    a->interval = interval;
    return GCOMP_OK;
}

/* Every tensor's row is unknown (NaN) until a measuring step observes it, and again once
 * the statistics have taken it: a tensor the caller did not observe (never bucketed, or
 * refused as non-finite) reports NaN, never an earlier measurement or uninitialised
 * memory. */
static void forget_measurements(gcomp_adapt *a) {
    for (size_t q = 0; q < a->nm * a->K * 4; q++) a->meas[q] = NAN;
}

/* The block of tensor t a measurement compresses: whole rows of a matrix (so PowerSGD sees
 * a matrix of the same width), a run of a vector; all of it when it has at most `sample`
 * elements. */
static void sample_shape(const gcomp_adapt *a, gcomp__adapt_tensor *t) {
    t->sample_rows = t->rows;
    t->sample_n = t->n;
    if (t->n <= a->sample) return;
    if (t->rows && t->cols) {
        size_t r = a->sample / t->cols;
        t->sample_rows = r ? r : 1;
        t->sample_n = t->sample_rows * t->cols;
    } else {
        t->sample_n = a->sample;
    }
}

static gcomp_status check_unused(gcomp_adapt *a, gcomp_error *err) {
    for (size_t i = 0; i < a->nitems; i++) {
        if (a->items[i].used) continue;
        char keys[512] = "";
        size_t w = 0;
        for (const char *const *k = engine_keys; *k; k++)
            w += (size_t)snprintf(keys + w, sizeof keys - w, "%s%s", w ? ", " : "", *k);
        for (size_t c = 0; c < a->nctl; c++)
            for (const char *const *k = a->ctl[c]->keys; k && *k && w < sizeof keys; k++)
                w += (size_t)snprintf(keys + w, sizeof keys - w, ", %s", *k);
        /* A key another controller would read names that controller. */
        for (size_t c = 0; c < NCTL; c++)
            for (const char *const *k = controllers[c]->keys; k && *k; k++)
                if (!strcmp(*k, a->items[i].key))
                    return gcomp__fail(err, GCOMP_E_SPEC,
                                       "adapt: key '%s' belongs to the %s controller, which this "
                                       "method does not use; keys here: %s",
                                       a->items[i].key, controllers[c]->name, keys);
        return gcomp__fail(err, GCOMP_E_SPEC,
                           "adapt: unknown key '%s' (no option, and no tensor has that name); "
                           "keys here: %s",
                           a->items[i].key, keys);
    }
    return GCOMP_OK;
}

gcomp_status gcomp_adapt_create(gcomp_adapt **out, const char *method,
                                const gcomp_tensor_desc *tensors, size_t count,
                                const gcomp_adapt_options *opt, gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "adapt: out must not be NULL");
    *out = NULL;
    if (!method || !tensors || count == 0)
        return gcomp__fail(err, GCOMP_E_ARG, "adapt: a method and at least one tensor are needed");
    if (strlen(method) > 16384) return gcomp__fail(err, GCOMP_E_SPEC, "adapt: method too long");
    gcomp_adapt *a = gcomp__calloc(sizeof *a);
    if (!a) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    gcomp_status st = GCOMP_OK;
    const char *body = strncmp(method, PREFIX, strlen(PREFIX)) ? method : method + strlen(PREFIX);
    char *copy = dup_str(body);
    a->method = dup_str(method);
    a->t = gcomp__calloc(count * sizeof *a->t);
    a->nt = count;
    if (!copy || !a->method || !a->t) {
        st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        goto fail;
    }
    a->total_steps = opt ? opt->total_steps : 0;
    a->lr = a->last_lr = NAN;
    a->workers = opt && opt->workers > 0 ? opt->workers : 1;
    a->nodes = opt && opt->nodes > 0 ? opt->nodes : 1;
    if (a->nodes > a->workers) {
        st = gcomp__fail(err, GCOMP_E_ARG, "adapt: nodes %d > workers %d", a->nodes, a->workers);
        goto fail;
    }
    char *semi = strchr(copy, ';');
    if (semi) *semi = 0;
    if ((st = parse_controllers(a, copy, err)) != GCOMP_OK) goto fail;
    if (semi && (st = parse_items(a, semi + 1, err)) != GCOMP_OK) goto fail;
    if (!a->items && !(a->items = gcomp__calloc(sizeof *a->items))) {
        st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < count; i++) {
        const gcomp_tensor_desc *d = &tensors[i];
        if (d->n == 0 || !gcomp__shape_holds(d->n, d->rows, d->cols)) {
            st = gcomp__fail(err, GCOMP_E_ARG, "adapt: tensor %zu ('%s'): bad size or shape", i,
                             d->name ? d->name : "");
            goto fail;
        }
        a->t[i].name = dup_str(d->name ? d->name : "");
        a->t[i].n = d->n;
        a->t[i].rows = d->rows;
        a->t[i].cols = d->cols;
        if (!a->t[i].name) {
            st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
            goto fail;
        }
    }
    /* Neither base nor ladder: the first controller's defaults, else the engine's. */
    const char *base = gcomp__adapt_opt(a, "base"), *dladder = NULL;
    for (size_t k = 0; !base && !gcomp__adapt_opt(a, "ladder") && k < a->nctl; k++)
        if (a->ctl[k]->default_base) {
            base = a->ctl[k]->default_base;
            dladder = a->ctl[k]->default_ladder;
        }
    if (!base) base = DEFAULT_BASE;
    if ((st = apply_policy(a, base, tensors, opt, err)) != GCOMP_OK) goto fail;
    if (a->nm == 0) { /* it would run as a fixed method, and say nothing */
        st = gcomp__fail(err, GCOMP_E_SPEC,
                         "adapt: no tensor of the %zu is managed: each is below min_elements, "
                         "1-D (dense_1d=1) or taken by a name override; lower min_elements or "
                         "drop the override",
                         count);
        goto fail;
    }
    a->mt = gcomp__calloc((a->nm + 1) * sizeof *a->mt);
    a->level = gcomp__calloc((a->nm + 1) * sizeof(int));
    a->prev = gcomp__calloc((a->nm + 1) * sizeof(int));
    a->changed = gcomp__calloc(count);
    if (!a->mt || !a->level || !a->prev || !a->changed) {
        st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < count; i++)
        if (a->t[i].managed) a->mt[a->t[i].m] = i;
    if ((st = build_ladder(a, base, dladder, opt, err)) != GCOMP_OK) goto fail;
    if ((st = resolve_schedule(a, err)) != GCOMP_OK) goto fail;
    for (size_t i = 0; i < count; i++)
        if (!a->t[i].managed) a->t[i].fixed_strategy = strategy_of(opt, a->t[i].fixed);
    /* The options every decision reads go into the fingerprint the statistics carry (not
     * into fp0, which saved states carry: a checkpoint resumes on another number of
     * workers or machine).  Each rank takes them from its own caller, and a rank given
     * another run length, worker count or calibration - a host with its own calibration
     * file - would otherwise predict, and decide, apart from the others without a word.
     * The run length counts for every controller (progress, interval=auto); the rest only
     * for the bandwidth controller's predictions, the only reader. */
    const bool predicts = gcomp_adapt_uses(a, "bandwidth");
    uint64_t hr = fnv_u64(0xcbf29ce484222325ull, a->total_steps);
    if (predicts) {
        hr = fnv_u64(fnv_u64(hr, (uint64_t)a->workers), (uint64_t)a->nodes);
        for (size_t j = 0; j < a->K; j++) hr = fnv_u64(hr, (uint64_t)(int64_t)a->strategy[j]);
        for (size_t i = 0; i < count; i++)
            if (!a->t[i].managed)
                hr = fnv_u64(fnv_str(hr, a->t[i].fixed), (uint64_t)(int64_t)a->t[i].fixed_strategy);
    }
    if (opt && opt->calibration) {
        /* Kept as text: the calibration object has no copy function. */
        size_t len = 0;
        gcomp_cost_calibration_format(opt->calibration, NULL, 0, &len);
        char *text = gcomp__alloc(len + 1);
        if (!text) {
            st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
            goto fail;
        }
        if (gcomp_cost_calibration_format(opt->calibration, text, len + 1, &len) == GCOMP_OK) {
            text[len] = 0;
            if (predicts) hr = fnv_str(hr, text);
            st = gcomp_cost_calibration_parse(&a->cal, text, len, err);
        }
        gcomp__free(text);
        if (st != GCOMP_OK) goto fail;
    }
    a->fp_run = hr;
    for (size_t k = 0; k < a->nctl; k++) {
        if ((st = a->ctl[k]->create(a, &a->ctl_state[k], err)) != GCOMP_OK) goto fail;
        a->track_norm |= a->ctl[k]->needs_norm;
        a->need_measure |= a->ctl[k]->needs_measure;
    }
    if ((st = check_unused(a, err)) != GCOMP_OK) goto fail;
    size_t maxn = 0;
    for (size_t m = 0; m < a->nm; m++) {
        gcomp__adapt_tensor *x = &a->t[a->mt[m]];
        sample_shape(a, x);
        maxn = x->sample_n > maxn ? x->sample_n : maxn;
        if (a->track_norm && !(x->acc = gcomp__calloc(x->n * sizeof(float)))) {
            st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
            goto fail;
        }
    }
    a->meas = gcomp__alloc((a->nm * a->K * 4 + 1) * sizeof(double));
    a->pred = gcomp__alloc(a->K * sizeof(double));
    if (!a->meas || !a->pred) {
        st = gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        goto fail;
    }
    a->scratch_n = maxn;
    for (size_t j = 0; j < a->K; j++) a->pred[j] = NAN;
    forget_measurements(a);

    /* The fingerprint: controllers, items, ladder, tensors. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t k = 0; k < a->nctl; k++) h = fnv_str(h, a->ctl[k]->name);
    h = hash_items(a, h);
    for (size_t j = 0; j < a->K; j++) h = fnv_str(h, a->ladder[j]);
    for (size_t i = 0; i < count; i++)
        h = fnv_u64(fnv_u64(fnv_u64(h, a->t[i].n), a->t[i].rows), (uint64_t)a->t[i].managed);
    h = fnv_u64(fnv_u64(fnv_u64(h, a->interval), a->measure), (uint64_t)a->sample);
    a->fp0 = h;
    refresh_fp(a);

    gcomp__adapt_in in = {0};
    in.initial = true;
    in.progress = NAN;
    in.metric = in.metric_progress = NAN;
    in.lr = in.lr_prev = NAN;
    a->link_bw = a->link_lat = 0;
    if ((st = run_controllers(a, &in, NULL)) != GCOMP_OK) {
        st = gcomp__fail(err, st, "adapt: out of memory");
        goto fail;
    }
    memset(a->changed, 0, count);
    a->report.metric = NAN;
    a->next_measure = a->interval - 1; /* the first interval measures */
    a->measuring = a->need_measure && a->next_measure == 0;
    a->wall_ns = gcomp__now_ns();
    gcomp__free(copy);
    *out = a;
    return GCOMP_OK;
fail:
    gcomp__free(copy);
    gcomp_adapt_free(a);
    return st;
}

/* ---- accessors ------------------------------------------------------------------------ */

size_t gcomp_adapt_count(const gcomp_adapt *a) {
    return a ? a->nt : 0;
}
const char *gcomp_adapt_spec(const gcomp_adapt *a, size_t i) {
    if (!a || i >= a->nt) return NULL;
    const gcomp__adapt_tensor *x = &a->t[i];
    return x->managed ? a->ladder[a->level[x->m]] : x->fixed;
}
int gcomp_adapt_managed(const gcomp_adapt *a, size_t i) {
    return a && i < a->nt && a->t[i].managed;
}
int gcomp_adapt_level(const gcomp_adapt *a, size_t i) {
    if (!a || i >= a->nt || !a->t[i].managed) return -1;
    return a->level[a->t[i].m];
}
int gcomp_adapt_changed(const gcomp_adapt *a, size_t i) {
    return a && i < a->nt && a->changed[i];
}
size_t gcomp_adapt_ladder_size(const gcomp_adapt *a) {
    return a ? a->K : 0;
}
const char *gcomp_adapt_candidate(const gcomp_adapt *a, size_t j) {
    return a && j < a->K ? a->ladder[j] : NULL;
}
int gcomp_adapt_uses(const gcomp_adapt *a, const char *name) {
    for (size_t k = 0; a && name && k < a->nctl; k++)
        if (!strcmp(a->ctl[k]->name, name)) return 1;
    return 0;
}
int gcomp_adapt_method_uses(const char *method, const char *name) {
    if (!method || !name || strncmp(method, PREFIX, strlen(PREFIX))) return 0;
    char *list = dup_str(method + strlen(PREFIX));
    gcomp_adapt *a = gcomp__calloc(sizeof *a);
    int uses = 0;
    if (list && a) {
        list[strcspn(list, ";")] = 0;
        uses = parse_controllers(a, list, NULL) == GCOMP_OK && gcomp_adapt_uses(a, name);
    }
    gcomp__free(list);
    gcomp__free(a);
    return uses;
}
uint64_t gcomp_adapt_fingerprint(const gcomp_adapt *a) {
    return a ? a->fp : 0;
}
uint64_t gcomp_adapt_interval(const gcomp_adapt *a) {
    return a ? a->interval : 0;
}
uint64_t gcomp_adapt_measure_interval(const gcomp_adapt *a) {
    return a ? a->measure : 0;
}
double gcomp_adapt_predicted(const gcomp_adapt *a, size_t j) {
    return a && j < a->K ? a->pred[j] : NAN;
}
void gcomp_adapt_get_report(const gcomp_adapt *a, gcomp_adapt_report *out) {
    if (!out) return;
    if (!a) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = a->report;
}

/* ---- observations (local) --------------------------------------------------------------- */

/* Compresses x (t's sample block) with `spec` from a fresh state, without feedback where
 * the spec lets it be removed, and decodes it: squared error and the two times (warm),
 * scaled from the block to the whole tensor. */
static gcomp_status measure_one(gcomp_adapt *a, const char *spec, const gcomp__adapt_tensor *t,
                                const float *x, double *out) {
    const size_t n = t->sample_n, rows = t->rows ? t->sample_rows : 0;
    char nofb[GCOMP__SPEC_MAX], steady[GCOMP__SPEC_MAX];
    const char *use = spec;
    if (gcomp_spec_set(spec, "feedback", "none", nofb, sizeof nofb, NULL) == GCOMP_OK) use = nofb;
    /* The steady state, as the bytes (gcomp_spec_bytes_estimate): a fresh compressor is at
     * epoch 0, where a warm-up sends warmup_start whatever the density, so every candidate
     * below it measured the same error and the DP took the cheapest. */
    if (gcomp_spec_set(use, "warmup", "0", steady, sizeof steady, NULL) == GCOMP_OK) use = steady;
    gcomp_compressor *c;
    gcomp_status st = gcomp_compressor_create(&c, use, n, rows, rows ? t->cols : 0, NULL);
    if (st != GCOMP_OK) return st;
    size_t cap = gcomp_encode_bound(c), len;
    void *msg = gcomp__alloc(cap);
    if (!msg) {
        gcomp_compressor_free(c);
        return GCOMP_E_NOMEM;
    }
    /* The error from the fresh state; the times from later encodes and decodes of the
     * same block, once the first has touched the compressor's state and workspaces: the
     * first pays the page faults of freshly mapped memory (10x the encode itself for DGC's
     * two state vectors here), which the trainer's long-lived compressors pay once.  The
     * least of MEASURE_REPS: a block's time is scaled by n / block (16x for a 4096 x 4096
     * tensor), so one preemption of an oversubscribed rank would otherwise count 16 times
     * (it put PowerSGD at 776 ms a step on netsim, against the 444 ms it runs). */
    st = gcomp_encode(c, x, msg, cap, &len);
    if (st == GCOMP_OK) {
        memset(a->dbuf, 0, n * sizeof(float));
        st = gcomp_decode_add(msg, len, a->dbuf, n, 1.0f);
    }
    if (st == GCOMP_OK) {
        double e2 = 0, x2 = 0;
        for (size_t k = 0; k < n; k++) {
            double d = (double)a->dbuf[k] - (double)x[k];
            e2 += d * d;
            x2 += (double)x[k] * x[k];
        }
        uint64_t enc = UINT64_MAX, dec = UINT64_MAX;
        for (int rep = 0; rep < MEASURE_REPS && st == GCOMP_OK; rep++) {
            memset(a->dbuf, 0, n * sizeof(float));
            uint64_t t0 = gcomp__now_ns();
            st = gcomp_encode(c, x, msg, cap, &len);
            uint64_t t1 = gcomp__now_ns();
            if (st == GCOMP_OK) st = gcomp_decode_add(msg, len, a->dbuf, n, 1.0f);
            uint64_t t2 = gcomp__now_ns();
            enc = t1 - t0 < enc ? t1 - t0 : enc;
            dec = t2 - t1 < dec ? t2 - t1 : dec;
        }
        const double f = (double)t->n / (double)n; /* block -> tensor */
        out[0] = f * e2;
        out[1] = f * x2;
        out[2] = f * 1e-9 * (double)enc;
        out[3] = f * 1e-9 * (double)dec;
    }
    gcomp__free(msg);
    gcomp_compressor_free(c);
    return st;
}

gcomp_status gcomp_adapt_observe(gcomp_adapt *a, size_t i, const float *grad,
                                 const float *residual) {
    if (!a || i >= a->nt || !grad) return GCOMP_E_ARG;
    gcomp__adapt_tensor *t = &a->t[i];
    if (!t->managed || (!t->acc && !a->measuring)) return GCOMP_OK;
    /* A NaN or Inf would stay in the norm's sum for the whole interval: refused, nothing
     * kept (the exchange of the same gradient fails with it on every rank). */
    if (!gcomp__all_finite(grad, t->n) || (residual && !gcomp__all_finite(residual, t->n)))
        return GCOMP_E_NONFINITE;
    if (t->acc) {
        for (size_t k = 0; k < t->n; k++) t->acc[k] += grad[k];
        t->acc_used = true;
    }
    if (!a->measuring) return GCOMP_OK;
    if (!a->xbuf) {
        a->xbuf = gcomp__alloc(a->scratch_n * sizeof(float));
        a->dbuf = gcomp__alloc(a->scratch_n * sizeof(float));
        if (!a->xbuf || !a->dbuf) {
            gcomp__free(a->xbuf);
            gcomp__free(a->dbuf);
            a->xbuf = a->dbuf = NULL;
            return GCOMP_E_NOMEM;
        }
    }
    uint64_t t0 = gcomp__now_ns();
    /* The block: a different one at each measurement, the same on every rank. */
    size_t off = 0;
    if (t->sample_n < t->n) {
        uint64_t h = (a->measurements + 1) * 0x9E3779B97F4A7C15ull;
        off = t->rows && t->cols ? (size_t)(h >> 11) % (t->rows - t->sample_rows + 1) * t->cols
                                 : (size_t)(h >> 11) % (t->n - t->sample_n + 1);
    }
    const float *r = a->error_on_grad ? NULL : residual;
    for (size_t k = 0; k < t->sample_n; k++)
        a->xbuf[k] = r ? grad[off + k] + r[off + k] : grad[off + k];
    double *row = a->meas + (size_t)t->m * a->K * 4;
    gcomp_status st = GCOMP_OK;
    for (size_t j = 0; j < a->K && st == GCOMP_OK; j++) {
        st = measure_one(a, a->ladder[j], t, a->xbuf, row + 4 * j);
        if (st != GCOMP_OK) /* this candidate and the ones not measured after it */
            for (size_t q = 4 * j; q < 4 * a->K; q++) row[q] = NAN;
    }
    a->mtime_step += 1e-9 * (double)(gcomp__now_ns() - t0);
    return st;
}

int gcomp_adapt_measuring(const gcomp_adapt *a) {
    return a && a->measuring;
}

void gcomp_adapt_observe_compute(gcomp_adapt *a, double forward_s, double backward_s,
                                 double optimizer_s) {
    /* Finite: one rank's Inf would be every rank's slowest compute, and every prediction
     * Inf, which freezes the bandwidth controller where it is. */
    if (!a || !(forward_s >= 0 && isfinite(forward_s)) ||
        !(backward_s >= 0 && isfinite(backward_s)) || !(optimizer_s >= 0 && isfinite(optimizer_s)))
        return;
    /* The measuring done inside gcomp_adapt_observe this step is not the model's compute:
     * it comes out of backward first (where observe runs), then forward. */
    double m = a->mtime_step, b = fmin(m, backward_s);
    backward_s -= b;
    forward_s -= fmin(m - b, forward_s);
    a->fwd += forward_s;
    a->bwd += backward_s;
    a->opt += optimizer_s;
    a->ncompute++;
}

void gcomp_adapt_observe_link(gcomp_adapt *a, double bandwidth, double latency) {
    if (!a || !(bandwidth > 0) || !isfinite(bandwidth) || !(latency >= 0) || !isfinite(latency))
        return;
    a->link_bw = bandwidth;
    a->link_lat = latency;
}

void gcomp_adapt_observe_link_time(gcomp_adapt *a, double seconds) {
    if (!a || !(seconds >= 0) || !isfinite(seconds)) return;
    a->ptime += seconds;
}

int gcomp_adapt_link_due(const gcomp_adapt *a) {
    return a && a->probe_cost > 0 && a->step >= a->next_probe;
}

void gcomp_adapt_observe_lr(gcomp_adapt *a, double lr) {
    if (a && isfinite(lr) && lr > 0) a->lr = lr;
}

void gcomp_adapt_observe_metric(gcomp_adapt *a, double value) {
    if (!a || !(value >= 0 && value <= 1)) return; /* 50 for 50 % would steer the wrong way */
    a->metric_sum += value;
    a->metric_step_sum += (double)a->step;
    a->metric_n++;
}

/* The configuration's fingerprint: fp0 with the run's options, and the course and the
 * exchange groups, the inputs of decisions given after create. */
static void refresh_fp(gcomp_adapt *a) {
    uint64_t h = fnv_u64(a->fp0, a->fp_run);
    if (a->ncourse) {
        for (size_t k = 0; k < 2 * a->ncourse; k++) {
            uint64_t b;
            memcpy(&b, &a->course[k], sizeof b);
            h = fnv_u64(h, b);
        }
        h = fnv_u64(h, (uint64_t)a->ncourse);
    }
    if (a->exchange) {
        for (size_t i = 0; i < a->nt; i++) h = fnv_u64(h, a->exchange[i]);
        h = fnv_u64(h, (uint64_t)a->run_bytes);
        h = fnv_u64(h, 0x65786368ull); /* "exch": groups of all zeros differ from none */
    }
    a->fp = h;
}

/* The course is an input of every decision the accuracy controller takes, so it is part of
 * the configuration: it goes into the fingerprint the statistics carry, and ranks that were
 * given different curves fail together at the next decision instead of steering apart. */
gcomp_status gcomp_adapt_set_course(gcomp_adapt *a, const double *progress, const double *metric,
                                    size_t n, gcomp_error *err) {
    if (!a || (n && (!progress || !metric)))
        return gcomp__fail(err, GCOMP_E_ARG, "adapt: set_course: NULL argument");
    if (!gcomp_adapt_uses(a, "accuracy"))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "adapt: set_course: the method has no accuracy controller to steer");
    for (size_t k = 0; k < n; k++) {
        if (!(progress[k] > 0 && progress[k] <= 1) || (k && !(progress[k] > progress[k - 1])))
            return gcomp__fail(err, GCOMP_E_ARG,
                               "adapt: set_course: progress[%zu]=%g: the points' progress must "
                               "increase strictly within (0, 1]",
                               k, progress[k]);
        if (!(metric[k] >= 0 && metric[k] <= 1))
            return gcomp__fail(err, GCOMP_E_ARG,
                               "adapt: set_course: metric[%zu]=%g is not a fraction in [0, 1] "
                               "(give accuracies as fractions)",
                               k, metric[k]);
    }
    double *c = NULL;
    if (n && !(c = gcomp__alloc(2 * n * sizeof(double))))
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    for (size_t k = 0; k < n; k++) {
        c[2 * k] = progress[k];
        c[2 * k + 1] = metric[k];
    }
    gcomp__free(a->course);
    a->course = c;
    a->ncourse = n;
    refresh_fp(a);
    return GCOMP_OK;
}

/* The exchange groups describe the caller's transport, which the bandwidth controller's
 * predictions must see as it is: DDP's buckets, gcomp_mpi's multi-tensor buckets.  They
 * are an input of its decisions, so they enter the fingerprint like the course. */
gcomp_status gcomp_adapt_set_exchanges(gcomp_adapt *a, const unsigned *groups, size_t count,
                                       size_t run_bytes, gcomp_error *err) {
    if (!a) return gcomp__fail(err, GCOMP_E_ARG, "adapt: set_exchanges: NULL argument");
    if (groups && count != a->nt)
        return gcomp__fail(err, GCOMP_E_ARG,
                           "adapt: set_exchanges: %zu groups for %zu tensors: give one a tensor",
                           count, a->nt);
    unsigned *g = NULL;
    if (groups) {
        if (!(g = gcomp__alloc(a->nt * sizeof *g)))
            return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
        memcpy(g, groups, a->nt * sizeof *g);
    }
    gcomp__free(a->exchange);
    a->exchange = g;
    a->run_bytes = g ? run_bytes : 0;
    refresh_fp(a);
    return GCOMP_OK;
}

void gcomp_adapt_end_step(gcomp_adapt *a, int *due) {
    if (!a) return;
    if (a->measuring) {
        a->measured = true;
        a->measurements++;
        /* at least `measure` steps on; measure=auto may push it further at the decision */
        a->next_measure += a->measure;
    }
    a->mtime += a->mtime_step;
    a->mtime_step = 0;
    uint64_t now = gcomp__now_ns();
    if (a->end_ns && now > a->end_ns)
        a->gap_s[a->ngap++ % GCOMP__ADAPT_GAPS] = 1e-9 * (double)(now - a->end_ns);
    a->end_ns = now;
    a->step++;
    a->measuring = a->need_measure && a->step == a->next_measure;
    if (due) *due = a->step % a->interval == 0;
}

/* ---- statistics and decisions ----------------------------------------------------------- */

static int cmp_double(const void *x, const void *y);

/* The interval's training seconds: the median gap between its steps times its steps, so
 * that what lies between two steps and lasts far longer than one - an evaluation, a
 * checkpoint, the last decision with its probe, a measuring step - does not count (it
 * would let probes and measurements take more than their share of the training).  With
 * fewer than 4 gaps: the wall time less this rank's probing and measuring. */
static double training_seconds(const gcomp_adapt *a, uint64_t now) {
    double wall = 1e-9 * (double)(now - a->wall_ns);
    size_t n = a->ngap < GCOMP__ADAPT_GAPS ? (size_t)a->ngap : GCOMP__ADAPT_GAPS;
    uint64_t steps = a->step - a->stats_step;
    if (n < 4 || steps == 0) return fmax(wall - a->ptime - a->mtime, 0);
    double g[GCOMP__ADAPT_GAPS];
    memcpy(g, a->gap_s, n * sizeof g[0]);
    qsort(g, n, sizeof g[0], cmp_double);
    double med = n % 2 ? g[n / 2] : 0.5 * (g[n / 2 - 1] + g[n / 2]);
    return fmin(wall, med * (double)steps);
}

size_t gcomp_adapt_stats_size(const gcomp_adapt *a) {
    return a ? S_FIXED + a->nm + 4 * a->nm * a->K : 0;
}

gcomp_status gcomp_adapt_stats(gcomp_adapt *a, double *out, size_t cap, size_t *len) {
    if (!a || !out || !len) return GCOMP_E_ARG;
    size_t need = gcomp_adapt_stats_size(a);
    *len = need;
    if (cap < need) return GCOMP_E_DST_SIZE;
    double nc = a->ncompute ? (double)a->ncompute : 1;
    out[S_MAGIC] = MAGIC + VERSION;
    out[S_FP_LO] = (double)(a->fp & 0xffffffffu);
    out[S_FP_HI] = (double)(a->fp >> 32);
    out[S_DECISION] = (double)a->decisions;
    out[S_STEP] = (double)a->step;
    out[S_FWD] = a->fwd / nc;
    out[S_BWD] = a->bwd / nc;
    out[S_OPT] = a->opt / nc;
    out[S_BW] = a->link_bw;
    out[S_LAT] = a->link_lat;
    out[S_PTIME] = a->ptime;
    out[S_METRIC] = a->metric_n ? a->metric_sum / (double)a->metric_n : NAN;
    out[S_METRIC_STEP] = a->metric_n ? a->metric_step_sum / (double)a->metric_n : NAN;
    out[S_MEASURED] = a->measured ? 1 : 0;
    uint64_t now = gcomp__now_ns();
    out[S_WALL] = training_seconds(a, now);
    out[S_MTIME] = a->mtime;
    out[S_LR] = a->lr;
    double *norm = out + S_FIXED, *meas = norm + a->nm;
    for (size_t m = 0; m < a->nm; m++) {
        gcomp__adapt_tensor *t = &a->t[a->mt[m]];
        double s = NAN;
        if (t->acc && t->acc_used) {
            s = 0;
            for (size_t k = 0; k < t->n; k++) s += (double)t->acc[k] * t->acc[k];
            memset(t->acc, 0, t->n * sizeof(float));
            t->acc_used = false;
        }
        norm[m] = s;
    }
    for (size_t q = 0; q < 4 * a->nm * a->K; q++) meas[q] = a->measured ? a->meas[q] : NAN;
    forget_measurements(a);
    a->fwd = a->bwd = a->opt = 0;
    a->ncompute = 0;
    a->link_bw = a->link_lat = a->ptime = 0;
    a->metric_sum = a->metric_step_sum = 0;
    a->metric_n = 0;
    a->measured = false;
    a->mtime = 0;
    a->wall_ns = now;
    a->ngap = 0;
    a->stats_step = a->step;
    return GCOMP_OK;
}

/* measure=auto: the next measurement no sooner than `measure` steps after this one, and far
 * enough on that measuring takes at most `measure_cost` of the time between measurements:
 * cost c against w seconds per interval of training puts it ceil(c / (share * w)) intervals
 * on.  From the slowest rank's times, so every rank spaces alike; a measurement that grows
 * dear (a bigger model, a slower machine) spaces itself out instead of eating the run. */
static void space_measurements(gcomp_adapt *a, const gcomp__adapt_in *in) {
    if (!a->measure_auto || !(in->measure_s > 0)) return;
    double w = fmax(in->interval_s, 1e-9);
    double gap = ceil(in->measure_s / (a->measure_cost * w)) * (double)a->interval;
    if (!(gap <= 1e12)) gap = 1e12;
    if (gap > (double)a->measure) a->next_measure += (uint64_t)gap - a->measure;
}

/* The link probes, likewise: a probe that cost p seconds against w seconds of training per
 * interval puts the next one ceil(p / (probe_cost * w)) intervals on, and the decisions
 * between them use the last probe's link.  A fast link's probe is cheap and comes at every
 * decision, so a link that slows down is seen at the next decision, as before; one that
 * speeds up is seen up to the spacing later.  Unlike a measurement, which only grows dear
 * with the model, a probe can stall once (a retransmission, a neighbour's burst), so the
 * spacing is capped at PROBE_GAP_MAX intervals (a quarter of a run at interval=auto): one
 * bad probe cannot stop the controller from following the link. */
#define PROBE_GAP_MAX 10
static void space_probes(gcomp_adapt *a, const gcomp__adapt_in *in) {
    double w = fmax(in->interval_s, 1e-9);
    double gap = fmax(1, ceil(in->probe_s / (a->probe_cost * w)));
    if (!(gap <= PROBE_GAP_MAX)) gap = PROBE_GAP_MAX;
    a->next_probe = in->step + (uint64_t)gap * a->interval;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

gcomp_status gcomp_adapt_decide(gcomp_adapt *a, const double *all, size_t len, int nranks,
                                size_t *changed, gcomp_error *err) {
    if (changed) *changed = 0;
    /* gcomp_adapt_changed names what this call changed: nothing, should it fail */
    if (a) memset(a->changed, 0, a->nt);
    if (!a || !all || nranks < 1)
        return gcomp__fail(err, GCOMP_E_ARG, "adapt: decide needs the statistics of >= 1 rank");
    const size_t need = gcomp_adapt_stats_size(a), nm = a->nm, K = a->K;
    if (len != need)
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "adapt: statistics of %zu doubles, this configuration has %zu: the "
                           "ranks run different adaptive methods or models",
                           len, need);
    for (int r = 0; r < nranks; r++) {
        const double *b = all + (size_t)r * len;
        /* Words that are not 32-bit halves (NaN included) are no fingerprint, and a cast of
         * them would be undefined. */
        bool halves =
            b[S_FP_LO] >= 0 && b[S_FP_LO] < 0x1p32 && b[S_FP_HI] >= 0 && b[S_FP_HI] < 0x1p32;
        if (b[S_MAGIC] != MAGIC + VERSION || !halves ||
            ((uint64_t)b[S_FP_LO] | (uint64_t)b[S_FP_HI] << 32) != a->fp)
            return gcomp__fail(err, GCOMP_E_MISMATCH,
                               "adapt: rank %d runs another adaptive configuration (method, "
                               "ladder, tensors, or the run's length, workers, dense spec or "
                               "calibration differ)",
                               r);
        if (b[S_DECISION] != (double)a->decisions || b[S_STEP] != all[S_STEP] ||
            b[S_MEASURED] != all[S_MEASURED])
            return gcomp__fail(err, GCOMP_E_MISMATCH,
                               "adapt: rank %d is at decision %.0f step %.0f, rank 0 at %.0f "
                               "step %.0f: every rank must decide at the same steps",
                               r, b[S_DECISION], b[S_STEP], all[S_DECISION], all[S_STEP]);
    }
    /* A step a double carries exactly (a state load refuses more): anything else is not
     * this library's statistics. */
    if (!(all[S_STEP] >= 0 && all[S_STEP] <= 0x1p53))
        return gcomp__fail(err, GCOMP_E_MISMATCH, "adapt: statistics at step %g: out of range",
                           all[S_STEP]);
    for (size_t k = 0; k < a->nctl; k++) {
        gcomp_status cs = a->ctl[k]->check ? a->ctl[k]->check(a, a->ctl_state[k], err) : GCOMP_OK;
        if (cs != GCOMP_OK) return cs;
    }
    double *work = gcomp__calloc((nm + 4 * nm * K + 2 * (size_t)nranks + 1) * sizeof(double));
    if (!work) return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    double *norm = work, *meas = norm + nm, *bws = meas + 4 * nm * K, *lats = bws + nranks;
    gcomp__adapt_in in = {0};
    in.decision = a->decisions;
    in.step = (uint64_t)all[S_STEP];
    in.progress = a->total_steps ? (double)in.step / (double)a->total_steps : NAN;
    in.metric = in.metric_progress = NAN;
    in.lr = NAN;
    in.lr_prev = a->last_lr;
    double msum = 0, mstep = 0;
    int mcount = 0, nbw = 0;
    for (int r = 0; r < nranks; r++) { /* rank order: the same bits on every rank */
        const double *b = all + (size_t)r * len;
        in.forward_s = fmax(in.forward_s, b[S_FWD]);
        in.backward_s = fmax(in.backward_s, b[S_BWD]);
        in.optimizer_s = fmax(in.optimizer_s, b[S_OPT]);
        in.interval_s = fmax(in.interval_s, b[S_WALL]);
        in.measure_s = fmax(in.measure_s, b[S_MTIME]);
        in.probe_s = fmax(in.probe_s, b[S_PTIME]);
        if (b[S_BW] > 0 && isfinite(b[S_BW]) && b[S_LAT] >= 0 && isfinite(b[S_LAT])) {
            bws[nbw] = b[S_BW];
            lats[nbw] = b[S_LAT];
            nbw++;
        }
        if (b[S_LR] > 0 && isfinite(b[S_LR]) && !(in.lr <= b[S_LR])) in.lr = b[S_LR];
        if (isfinite(b[S_METRIC])) {
            msum += b[S_METRIC];
            mstep += b[S_METRIC_STEP];
            mcount++;
        }
        const double *bn = b + S_FIXED, *bm = bn + nm;
        for (size_t m = 0; m < nm; m++) norm[m] = r == 0 ? bn[m] : norm[m] + bn[m];
        for (size_t q = 0; q < nm * K; q++) {
            double *w = meas + 4 * q;
            const double *v = bm + 4 * q;
            if (r == 0) {
                memcpy(w, v, 4 * sizeof(double));
            } else {
                w[0] += v[0];
                w[1] += v[1];
                w[2] = fmax(w[2], v[2]);
                w[3] = fmax(w[3], v[3]);
            }
        }
    }
    if (nbw) {
        qsort(bws, (size_t)nbw, sizeof(double), cmp_double);
        qsort(lats, (size_t)nbw, sizeof(double), cmp_double);
        in.bandwidth = nbw % 2 ? bws[nbw / 2] : 0.5 * (bws[nbw / 2 - 1] + bws[nbw / 2]);
        in.latency = nbw % 2 ? lats[nbw / 2] : 0.5 * (lats[nbw / 2 - 1] + lats[nbw / 2]);
    } else if (a->last_link_bw > 0) { /* not probed this time: the last probe's link */
        in.bandwidth = a->last_link_bw;
        in.latency = a->last_link_lat;
    }
    if (mcount) {
        in.has_metric = true;
        in.metric = msum / mcount;
        in.metric_progress = a->total_steps ? mstep / mcount / (double)a->total_steps : NAN;
    }
    in.norm2 = norm;
    in.measured = all[S_MEASURED] != 0;
    /* Four separate arrays for the controllers: err2, x2, enc, dec at [m * K + j]. */
    double *split = gcomp__alloc((4 * nm * K + 1) * sizeof(double));
    if (!split) {
        gcomp__free(work);
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    }
    for (size_t q = 0; q < nm * K; q++)
        for (size_t f = 0; f < 4; f++) split[f * nm * K + q] = meas[4 * q + f];
    in.err2 = split;
    in.x2 = split + nm * K;
    in.enc_s = split + 2 * nm * K;
    in.dec_s = split + 3 * nm * K;
    gcomp_status st = run_controllers(a, &in, changed);
    if (st == GCOMP_OK) {
        if (in.measured) space_measurements(a, &in);
        if (in.probe_s > 0 && a->probe_cost > 0) space_probes(a, &in);
        if (isfinite(in.lr)) a->last_lr = in.lr;
        if (in.bandwidth > 0) {
            a->last_link_bw = in.bandwidth;
            a->last_link_lat = in.latency;
        }
        a->decisions++;
        a->report.decisions = a->decisions;
        a->report.step = in.step;
        a->report.bandwidth = in.bandwidth > 0 ? in.bandwidth : a->report.bandwidth;
        a->report.latency = in.bandwidth > 0 ? in.latency : a->report.latency;
        a->report.compute_s = in.forward_s + in.backward_s + in.optimizer_s;
        a->report.metric = in.has_metric ? in.metric : a->report.metric;
        a->report.measure_s = in.measured ? in.measure_s : a->report.measure_s;
        a->report.next_measure_step = a->need_measure ? a->next_measure : 0;
    } else {
        gcomp__fail(err, st, "adapt: out of memory");
    }
    gcomp__free(split);
    gcomp__free(work);
    return st;
}

/* ---- saved state ---------------------------------------------------------------------- */

/*
 * One rank's state (docs/FORMAT.md, "Adaptive controllers' state"): the decisions taken and
 * the controllers' memory, identical on every rank, and this rank's observations since the
 * last statistics, its own.  A run that saves between two steps and loads into an object
 * created with the same method, tensors and options decides from there exactly as it would
 * have.  The wall clock of the open interval restarts at load.
 */
#define STATE_MAGIC "GCad"
#define STATE_VERSION 3u /* 2: the link probes' spacing; 3: the learning rate; 1, 2 load */
#define STATE_HEAD 40    /* magic, version, length, fingerprint, nm, K, controllers, course */

/* Everything after the header and before the controllers' sections, in order; `ncourse`
 * points of the course (a dry run sizes a blob holding that many), in the layout of
 * `version`. */
static void state_body(const gcomp_adapt *a, size_t ncourse, unsigned version,
                       gcomp__adapt_cursor *c) {
    const uint64_t u[] = {a->decisions, a->step,     a->next_measure, a->measurements,
                          a->ncompute,  a->metric_n, a->measured};
    for (size_t k = 0; k < sizeof u / sizeof *u; k++) gcomp__adapt_w64(c, u[k]);
    const double f[] = {a->fwd,
                        a->bwd,
                        a->opt,
                        a->link_bw,
                        a->link_lat,
                        a->metric_sum,
                        a->metric_step_sum,
                        a->mtime,
                        a->last_link_bw,
                        a->last_link_lat};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++) gcomp__adapt_wf(c, f[k]);
    const gcomp_adapt_report *r = &a->report;
    gcomp__adapt_w64(c, r->decisions);
    gcomp__adapt_w64(c, r->step);
    const double rf[] = {r->bandwidth, r->latency, r->compute_s,     r->predicted_step_s, r->metric,
                         r->budget,    r->error,   r->error_uniform, r->measure_s};
    for (size_t k = 0; k < sizeof rf / sizeof *rf; k++) gcomp__adapt_wf(c, rf[k]);
    gcomp__adapt_w64(c, (uint64_t)(int64_t)r->uniform_level);
    gcomp__adapt_w64(c, (uint64_t)r->critical);
    gcomp__adapt_w64(c, r->next_measure_step);
    for (size_t m = 0; m < a->nm; m++) gcomp__adapt_w64(c, (uint64_t)a->level[m]);
    for (size_t j = 0; j < a->K; j++) gcomp__adapt_wf(c, a->pred[j]);
    for (size_t q = 0; q < a->nm * a->K * 4; q++)
        gcomp__adapt_wf(c, a->measured ? a->meas[q] : NAN);
    for (size_t k = 0; k < 2 * ncourse; k++) gcomp__adapt_wf(c, c->w ? a->course[k] : 0);
    for (size_t m = 0; m < a->nm; m++) {
        const gcomp__adapt_tensor *t = &a->t[a->mt[m]];
        if (!t->acc) continue;
        gcomp__adapt_w64(c, t->acc_used);
        if (c->w)
            for (size_t k = 0; k < t->n; k++) gcomp__putf(c->w + c->at + 4 * k, t->acc[k]);
        c->at += 4 * t->n;
    }
    if (version >= 2) {
        gcomp__adapt_w64(c, a->next_probe);
        gcomp__adapt_wf(c, a->ptime);
    }
    if (version >= 3) {
        gcomp__adapt_wf(c, a->lr);
        gcomp__adapt_wf(c, a->last_lr);
    }
}

/* The whole blob's size with `ncourse` course points (controllers' sections included). */
static size_t state_size(const gcomp_adapt *a, size_t ncourse, unsigned version) {
    gcomp__adapt_cursor c = {0};
    c.at = STATE_HEAD;
    state_body(a, ncourse, version, &c);
    for (size_t k = 0; k < a->nctl; k++) {
        c.at += 8;
        if (a->ctl[k]->save) a->ctl[k]->save(a, a->ctl_state[k], &c);
    }
    return c.at + 4;
}

gcomp_status gcomp__adapt_bad_state(gcomp_error *err, const char *ctl) {
    return gcomp__fail(err, GCOMP_E_STATE,
                       "adapt: saved state: the %s controller's fields are out of range", ctl);
}

size_t gcomp_adapt_state_bound(const gcomp_adapt *a) {
    return a ? state_size(a, a->ncourse, STATE_VERSION) : 0;
}

gcomp_status gcomp_adapt_save_state(const gcomp_adapt *a, void *dst, size_t cap, size_t *len) {
    if (len) *len = 0;
    if (!a || !dst || !len) return GCOMP_E_ARG;
    size_t need = state_size(a, a->ncourse, STATE_VERSION);
    if (cap < need) return GCOMP_E_DST_SIZE;
    uint8_t *p = dst;
    memcpy(p, STATE_MAGIC, 4);
    gcomp__put32(p + 4, STATE_VERSION);
    gcomp__put64(p + 8, need);
    gcomp__put64(p + 16, a->fp0);
    gcomp__put32(p + 24, (uint32_t)a->nm);
    gcomp__put32(p + 28, (uint32_t)a->K);
    gcomp__put32(p + 32, (uint32_t)a->nctl);
    gcomp__put32(p + 36, (uint32_t)a->ncourse);
    gcomp__adapt_cursor c = {.w = p, .at = STATE_HEAD};
    state_body(a, a->ncourse, STATE_VERSION, &c);
    for (size_t k = 0; k < a->nctl; k++) {
        size_t at = c.at;
        c.at += 8;
        if (a->ctl[k]->save) a->ctl[k]->save(a, a->ctl_state[k], &c);
        gcomp__put64(p + at, c.at - at - 8);
    }
    gcomp__put32(p + c.at, gcomp__crc32c(0, p, c.at));
    *len = need;
    return GCOMP_OK;
}

/* Whether n little-endian floats at p are all finite. */
static bool floats_finite(const uint8_t *p, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (!isfinite(gcomp__getf(p + 4 * k))) return false;
    return true;
}

/* Reads the body of a blob of `version`; checks it, and puts it in place only when
 * `apply`. */
static gcomp_status load_body(gcomp_adapt *a, const uint8_t *p, size_t ncourse, unsigned version,
                              bool apply, gcomp_error *err) {
    gcomp__adapt_cursor c = {.r = p, .at = STATE_HEAD};
    uint64_t u[7];
    for (size_t k = 0; k < 7; k++) u[k] = gcomp__adapt_r64(&c);
    double f[10];
    for (size_t k = 0; k < 10; k++) f[k] = gcomp__adapt_rf(&c);
    /* The step travels in the statistics as a double: at most 2^53, exactly.  The next
     * measuring step is never behind the step (end_step moves it on at each measurement
     * and measures only at it: one behind would never measure again). */
    if (u[6] > 1 || u[1] < u[3] || (u[0] && u[1] < a->interval) || u[1] > (1ull << 53) ||
        (a->need_measure && u[2] < u[1]))
        return gcomp__fail(err, GCOMP_E_STATE,
                           "adapt: saved state: counters that do not add up (step %llu, "
                           "decisions %llu, measurements %llu, next measurement %llu)",
                           (unsigned long long)u[1], (unsigned long long)u[0],
                           (unsigned long long)u[3], (unsigned long long)u[2]);
    /* fwd, bwd, opt, link_bw, link_lat, metric_sum, metric_step_sum, mtime, last_link_bw,
     * last_link_lat: sums of times and rates (>= 0), and two sums of metrics and steps */
    for (size_t k = 0; k < 10; k++)
        if (!isfinite(f[k]) || (k != 5 && k != 6 && f[k] < 0))
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: observation %zu is %g, not a finite %s", k,
                               f[k], k == 5 || k == 6 ? "sum" : "time or rate >= 0");
    gcomp_adapt_report r = {0};
    r.decisions = gcomp__adapt_r64(&c);
    r.step = gcomp__adapt_r64(&c);
    double *rf[] = {&r.bandwidth, &r.latency, &r.compute_s,     &r.predicted_step_s, &r.metric,
                    &r.budget,    &r.error,   &r.error_uniform, &r.measure_s};
    for (size_t k = 0; k < sizeof rf / sizeof *rf; k++) *rf[k] = gcomp__adapt_rf(&c);
    uint64_t uniform = gcomp__adapt_r64(&c), critical = gcomp__adapt_r64(&c);
    r.next_measure_step = gcomp__adapt_r64(&c);
    bool rok = uniform < a->K && critical <= a->nm && (isnan(r.metric) || isfinite(r.metric));
    for (size_t k = 0; k < sizeof rf / sizeof *rf; k++) /* NaN: none; +Inf: no prediction */
        rok &= rf[k] == &r.metric || isnan(*rf[k]) || *rf[k] >= 0;
    if (!rok) return gcomp__fail(err, GCOMP_E_STATE, "adapt: saved state: a report out of range");
    r.uniform_level = (int)uniform;
    r.critical = (size_t)critical;
    size_t lv = c.at;
    for (size_t m = 0; m < a->nm; m++)
        if (gcomp__adapt_r64(&c) >= a->K)
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: tensor %s at a level beyond the ladder's %zu",
                               a->t[a->mt[m]].name, a->K);
    size_t pr = c.at;
    for (size_t j = 0; j < a->K; j++) { /* predictions: NaN none, +Inf infeasible */
        double x = gcomp__adapt_rf(&c);
        if (!(isnan(x) || x >= 0))
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: candidate %zu's predicted step %g", j, x);
    }
    for (size_t q = 0; q < 4 * a->nm * a->K; q++) { /* errors, norms, times: NaN or >= 0 */
        double x = gcomp__adapt_rf(&c);
        if (!(isnan(x) || (isfinite(x) && x >= 0)))
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: a measurement of %g (tensor %s)", x,
                               a->t[a->mt[q / (4 * a->K)]].name);
    }
    double before = 0;
    for (size_t k = 0; k < ncourse; k++) {
        double x = gcomp__adapt_rf(&c), y = gcomp__adapt_rf(&c);
        if (!(x > before && x <= 1) || !(y >= 0 && y <= 1))
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: course point %zu is not a progress in "
                               "(previous, 1] and a fraction",
                               k);
        before = x;
    }
    size_t ac = c.at;
    for (size_t m = 0; m < a->nm; m++) {
        const gcomp__adapt_tensor *t = &a->t[a->mt[m]];
        if (!t->acc) continue;
        if (gcomp__adapt_r64(&c) > 1)
            return gcomp__fail(err, GCOMP_E_STATE, "adapt: saved state: a flag other than 0 or 1");
        if (!floats_finite(p + c.at, t->n))
            return gcomp__fail(err, GCOMP_E_STATE,
                               "adapt: saved state: tensor %s's gradient sum holds NaN or Inf",
                               t->name);
        c.at += 4 * t->n;
    }
    /* Version 1 has no probe spacing: the next decision probes, as at create. */
    uint64_t next_probe = version >= 2 ? gcomp__adapt_r64(&c) : 0;
    double ptime = version >= 2 ? gcomp__adapt_rf(&c) : 0;
    if (!(ptime >= 0 && ptime < 1e12))
        return gcomp__fail(err, GCOMP_E_STATE,
                           "adapt: saved state: link probe seconds %g out of range", ptime);
    /* Versions 1 and 2 have no learning rate: none seen yet, so no decay across the load. */
    double lr = version >= 3 ? gcomp__adapt_rf(&c) : NAN;
    double last_lr = version >= 3 ? gcomp__adapt_rf(&c) : NAN;
    if (!(isnan(lr) || (lr > 0 && isfinite(lr))) ||
        !(isnan(last_lr) || (last_lr > 0 && isfinite(last_lr))))
        return gcomp__fail(err, GCOMP_E_STATE,
                           "adapt: saved state: a learning rate that is not > 0 (%g, %g)", lr,
                           last_lr);
    double *course = NULL;
    if (apply && ncourse && !(course = gcomp__alloc(2 * ncourse * sizeof(double))))
        return gcomp__fail(err, GCOMP_E_NOMEM, "adapt: out of memory");
    if (!apply) return GCOMP_OK;

    a->decisions = u[0];
    a->step = u[1];
    a->next_measure = u[2];
    a->measurements = u[3];
    a->ncompute = u[4];
    a->metric_n = u[5];
    a->measured = u[6] != 0;
    a->next_probe = next_probe;
    a->ptime = ptime;
    a->lr = lr;
    a->last_lr = last_lr;
    double *dst[] = {&a->fwd,
                     &a->bwd,
                     &a->opt,
                     &a->link_bw,
                     &a->link_lat,
                     &a->metric_sum,
                     &a->metric_step_sum,
                     &a->mtime,
                     &a->last_link_bw,
                     &a->last_link_lat};
    for (size_t k = 0; k < 10; k++) *dst[k] = f[k];
    a->report = r;
    c.at = lv;
    for (size_t m = 0; m < a->nm; m++) {
        a->level[m] = a->prev[m] = (int)gcomp__adapt_r64(&c);
        a->changed[a->mt[m]] = 0;
    }
    c.at = pr;
    for (size_t j = 0; j < a->K; j++) a->pred[j] = gcomp__adapt_rf(&c);
    for (size_t q = 0; q < a->nm * a->K * 4; q++) a->meas[q] = gcomp__adapt_rf(&c);
    for (size_t k = 0; k < 2 * ncourse; k++) course[k] = gcomp__adapt_rf(&c);
    gcomp__free(a->course);
    a->course = course;
    a->ncourse = ncourse;
    refresh_fp(a);
    c.at = ac;
    for (size_t m = 0; m < a->nm; m++) {
        gcomp__adapt_tensor *t = &a->t[a->mt[m]];
        if (!t->acc) continue;
        t->acc_used = gcomp__adapt_r64(&c) != 0;
        for (size_t k = 0; k < t->n; k++) t->acc[k] = gcomp__getf(p + c.at + 4 * k);
        c.at += 4 * t->n;
    }
    return GCOMP_OK;
}

gcomp_status gcomp_adapt_load_state(gcomp_adapt *a, const void *src, size_t len, gcomp_error *err) {
    if (!a || !src) return gcomp__fail(err, GCOMP_E_ARG, "adapt: load_state: NULL argument");
    const uint8_t *p = src;
    if (len < STATE_HEAD + 4)
        return gcomp__fail(err, GCOMP_E_TRUNCATED,
                           "adapt: saved state of %zu bytes: shorter than its header", len);
    if (memcmp(p, STATE_MAGIC, 4))
        return gcomp__fail(err, GCOMP_E_BAD_MAGIC,
                           "adapt: not an adaptive controllers' saved state (magic)");
    const unsigned version = gcomp__get32(p + 4);
    if (version > STATE_VERSION || version < 1)
        return gcomp__fail(err, GCOMP_E_VERSION,
                           "adapt: saved state version %u, this library reads 1 to %u", version,
                           STATE_VERSION);
    uint64_t total = gcomp__get64(p + 8);
    if (total > len)
        return gcomp__fail(err, GCOMP_E_TRUNCATED,
                           "adapt: saved state of %zu bytes, its header says %llu", len,
                           (unsigned long long)total);
    if (total != len)
        return gcomp__fail(err, GCOMP_E_STATE,
                           "adapt: saved state of %zu bytes, its header says %llu (version %u)",
                           len, (unsigned long long)total, version);
    if (gcomp__get32(p + len - 4) != gcomp__crc32c(0, p, len - 4))
        return gcomp__fail(err, GCOMP_E_CHECKSUM, "adapt: saved state: checksum mismatch");
    if (gcomp__get64(p + 16) != a->fp0 || gcomp__get32(p + 24) != a->nm ||
        gcomp__get32(p + 28) != a->K || gcomp__get32(p + 32) != a->nctl)
        return gcomp__fail(err, GCOMP_E_MISMATCH,
                           "adapt: saved state of another adaptive configuration (method, "
                           "ladder, tensors or interval differ)");
    size_t ncourse = gcomp__get32(p + 36);
    if (ncourse > (len - STATE_HEAD) / 16 || state_size(a, ncourse, version) != len)
        return gcomp__fail(err, GCOMP_E_STATE,
                           "adapt: saved state of %zu bytes, this configuration's is %zu", len,
                           ncourse > (len - STATE_HEAD) / 16 ? 0 : state_size(a, ncourse, version));
    /* Check everything, then apply: a blob loads whole or not at all. */
    for (int apply = 0; apply < 2; apply++) {
        gcomp_status st = load_body(a, p, ncourse, version, apply, err);
        if (st != GCOMP_OK) return st; /* only NOMEM once applying: nothing applied yet */
        gcomp__adapt_cursor c = {.r = p, .at = STATE_HEAD};
        state_body(a, ncourse, version, &c); /* dry: skips to the controllers' sections */
        for (size_t k = 0; k < a->nctl; k++) {
            uint64_t sec = gcomp__adapt_r64(&c);
            gcomp__adapt_cursor d = {.at = 0};
            if (a->ctl[k]->save) a->ctl[k]->save(a, a->ctl_state[k], &d);
            if (sec != d.at)
                return gcomp__fail(err, GCOMP_E_STATE,
                                   "adapt: saved state: the %s controller's section is %llu "
                                   "bytes, %zu expected",
                                   a->ctl[k]->name, (unsigned long long)sec, d.at);
            if (a->ctl[k]->load) {
                gcomp__adapt_cursor e = {.r = p + c.at};
                st = a->ctl[k]->load(a, a->ctl_state[k], &e, apply, err);
                if (st != GCOMP_OK) return st;
            }
            c.at += d.at;
        }
    }
    a->measuring = a->need_measure && a->step == a->next_measure;
    a->mtime_step = 0;
    a->wall_ns = gcomp__now_ns();
    a->end_ns = 0;
    a->ngap = 0;
    a->stats_step = a->step;
    return GCOMP_OK;
}

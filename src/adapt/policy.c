/*
 * policy.c - layer-wise policies: one spec per tensor of a model, and what it costs.
 *
 * Why: in a real model most of the bytes sit in a few big weight matrices, while the many
 * small tensors (biases, norm scales, the last layer of a classifier) cost almost nothing
 * to send dense and are the ones that suffer most from sparsification.  DGC (Lin et al.
 * 2018) and most systems that followed it (e.g. Horovod's and BytePS's compression hooks)
 * leave tensors below a size threshold uncompressed; the same rule here, plus 1-D tensors
 * and per-name overrides (embeddings usually take a lower density).
 *
 * Grammar (include/gradcomp.h has the user's view): items split on ';', the key ends at
 * the first '=' of the item, so a value can be any spec (which uses ':', ',' and '=',
 * never ';').  Keywords: spec, dense, min_elements, min_k, dense_1d; every other key is a
 * glob.
 * A typo in a keyword becomes a glob whose value must still be a valid spec, so most
 * typos are caught at create (`min_element=100`: "unknown codec '100'").
 *
 * Decision for a tensor: the first glob that matches its name, else 1-D -> dense (when
 * dense_1d), else fewer than min_elements -> dense, else spec.  Overrides come first
 * because they are the user's explicit word about one tensor.  min_k=K puts a floor of K
 * elements a step into spec= (the codec's own min_k, so it travels with the spec through
 * retunes and warm-ups): a tensor just above min_elements is compressed, but not down to a
 * handful of values.  Overrides are left as written.
 *
 * Bytes per step: the encode bound of the spec for that tensor in the steady state (the
 * codec's init at the spec's own density, no warm-up), computed on a compressor object
 * that never gets feedback state, so planning a 100M-parameter model allocates almost
 * nothing.  Rejected: creating real compressors (ef/dgc would allocate and clear 2-4
 * floats per element just to read one number); a closed-form size per codec (would
 * duplicate every codec's bound and drift from it).
 */
#include "core/internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_SPEC "topk:density=0.001,feedback=ef"
#define DEFAULT_DENSE "none"
#define POLICY_MAX 65536

typedef struct override {
    const char *glob, *spec;
} override;

struct gcomp_policy {
    char *buf; /* the policy text, split in place */
    const char *spec, *dense;
    char *spec_k; /* spec with min_k=K (min_k > 0 and the codec takes it), else NULL */
    size_t min_elements, min_k;
    bool dense_1d;
    override *over;
    size_t nover;
};

void gcomp_policy_free(gcomp_policy *p) {
    if (!p) return;
    gcomp__free(p->buf);
    gcomp__free(p->spec_k);
    gcomp__free(p->over);
    gcomp__free(p);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) e--;
    *e = 0;
    return s;
}

static gcomp_status check_spec(const char *key, const char *spec, gcomp_error *err) {
    gcomp__spec parsed;
    gcomp_error local;
    gcomp_status st = gcomp__spec_parse(spec, &parsed, &local);
    if (st != GCOMP_OK) return gcomp__fail(err, st, "policy: %s=%s: %s", key, spec, local.message);
    return GCOMP_OK;
}

static gcomp_status parse_count(const char *key, const char *val, size_t *out, gcomp_error *err) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (!isdigit((unsigned char)val[0]) || *end || errno || v > SIZE_MAX)
        return gcomp__fail(err, GCOMP_E_SPEC, "policy: %s=%s: expected a non-negative integer", key,
                           val);
    *out = (size_t)v;
    return GCOMP_OK;
}

/* spec= with min_k=K, where the codec counts its elements from density= (it has min_k) and
 * the spec sets no floor of its own (min_k=0, given or not: the canonical form cannot tell
 * them apart).  Other codecs keep spec= as it is. */
static gcomp_status floor_spec(gcomp_policy *p, gcomp_error *err) {
    char have[32], num[32];
    if (!p->min_k || gcomp_spec_get(p->spec, "min_k", have, sizeof have, NULL) != GCOMP_OK ||
        strcmp(have, "0"))
        return GCOMP_OK;
    if (p->min_k > UINT32_MAX)
        return gcomp__fail(err, GCOMP_E_SPEC, "policy: min_k=%zu: at most %u", p->min_k,
                           (unsigned)UINT32_MAX);
    snprintf(num, sizeof num, "%zu", p->min_k);
    size_t cap = strlen(p->spec) + sizeof num + GCOMP__SPEC_MAX;
    if (!(p->spec_k = gcomp__alloc(cap)))
        return gcomp__fail(err, GCOMP_E_NOMEM, "policy: out of memory");
    gcomp_error local;
    gcomp_status st = gcomp_spec_set(p->spec, "min_k", num, p->spec_k, cap, &local);
    return st == GCOMP_OK ? st : gcomp__fail(err, st, "policy: min_k=%s: %s", num, local.message);
}

gcomp_status gcomp_policy_create(gcomp_policy **out, const char *policy, gcomp_error *err) {
    if (!out) return gcomp__fail(err, GCOMP_E_ARG, "policy: out must not be NULL");
    *out = NULL;
    if (!policy) return gcomp__fail(err, GCOMP_E_ARG, "policy: NULL policy string");
    size_t len = strlen(policy);
    if (len > POLICY_MAX)
        return gcomp__fail(err, GCOMP_E_SPEC, "policy: longer than %d characters", POLICY_MAX);
    size_t items = 1;
    for (size_t i = 0; i < len; i++) items += policy[i] == ';';
    gcomp_policy *p = gcomp__calloc(sizeof *p);
    if (!p) return gcomp__fail(err, GCOMP_E_NOMEM, "policy: out of memory");
    p->buf = gcomp__alloc(len + 1);
    p->over = gcomp__alloc(items * sizeof *p->over);
    if (!p->buf || !p->over) {
        gcomp_policy_free(p);
        return gcomp__fail(err, GCOMP_E_NOMEM, "policy: out of memory");
    }
    memcpy(p->buf, policy, len + 1);
    p->spec = DEFAULT_SPEC;
    p->dense = DEFAULT_DENSE;
    p->min_elements = 16384;
    p->dense_1d = true;
    bool seen_spec = false, seen_dense = false, seen_min = false, seen_k = false, seen_1d = false;

    gcomp_status st = GCOMP_OK;
    char *item = p->buf;
    for (size_t no = 1; item; no++) {
        char *semi = strchr(item, ';');
        if (semi) *semi = 0;
        char *next = semi ? semi + 1 : NULL;
        char *text = trim(item);
        item = next;
        if (!*text) continue;
        char *eq = strchr(text, '=');
        if (!eq) {
            st = gcomp__fail(err, GCOMP_E_SPEC,
                             "policy: item %zu '%s': expected key=value (spec=, dense=, "
                             "min_elements=, min_k=, dense_1d= or GLOB=SPEC)",
                             no, text);
            break;
        }
        *eq = 0;
        char *key = trim(text), *val = trim(eq + 1);
        if (!*key || !*val) {
            st = gcomp__fail(err, GCOMP_E_SPEC, "policy: item %zu: empty %s", no,
                             *key ? "value" : "key");
            break;
        }
        bool dup = false;
        if (!strcmp(key, "spec")) {
            dup = seen_spec;
            seen_spec = true;
            p->spec = val;
            st = check_spec(key, val, err);
        } else if (!strcmp(key, "dense")) {
            dup = seen_dense;
            seen_dense = true;
            p->dense = val;
            st = check_spec(key, val, err);
        } else if (!strcmp(key, "min_elements")) {
            dup = seen_min;
            seen_min = true;
            st = parse_count(key, val, &p->min_elements, err);
        } else if (!strcmp(key, "min_k")) {
            dup = seen_k;
            seen_k = true;
            st = parse_count(key, val, &p->min_k, err);
        } else if (!strcmp(key, "dense_1d")) {
            dup = seen_1d;
            seen_1d = true;
            if (strcmp(val, "0") && strcmp(val, "1"))
                st = gcomp__fail(err, GCOMP_E_SPEC, "policy: dense_1d=%s: expected 0 or 1", val);
            p->dense_1d = val[0] == '1';
        } else {
            for (size_t j = 0; j < p->nover; j++) dup |= !strcmp(p->over[j].glob, key);
            p->over[p->nover].glob = key;
            p->over[p->nover].spec = val;
            p->nover++;
            st = check_spec(key, val, err);
        }
        if (st == GCOMP_OK && dup)
            st = gcomp__fail(err, GCOMP_E_SPEC, "policy: '%s' given twice", key);
        if (st != GCOMP_OK) break;
    }
    if (st == GCOMP_OK) st = floor_spec(p, err);
    if (st != GCOMP_OK) {
        gcomp_policy_free(p);
        return st;
    }
    *out = p;
    return GCOMP_OK;
}

/* Glob match: '*' any run (also empty), '?' one character, anything else itself.
 * Iterative with one backtrack point, O(|pattern| * |name|) at worst. */
static bool glob_match(const char *pat, const char *name) {
    const char *star = NULL, *resume = NULL;
    while (*name) {
        if (*pat == '*') {
            star = pat++;
            resume = name;
        } else if (*pat == '?' || *pat == *name) {
            pat++;
            name++;
        } else if (star) {
            pat = star + 1;
            name = ++resume;
        } else {
            return false;
        }
    }
    while (*pat == '*') pat++;
    return *pat == 0;
}

gcomp_status gcomp_spec_bytes_estimate(const char *spec, size_t n, size_t rows, size_t cols,
                                       size_t *bytes, gcomp_error *err) {
    if (!spec || !bytes) return gcomp__fail(err, GCOMP_E_ARG, "spec and bytes must not be NULL");
    *bytes = 0;
    gcomp__spec parsed;
    gcomp_status st = gcomp__spec_parse(spec, &parsed, err);
    if (st != GCOMP_OK) return st;
    /* A compressor as gcomp_compressor_create builds it, minus the feedback state: the
     * bound depends only on the codec.  No density override, so the steady-state density
     * counts. */
    parsed.feedback = &gcomp__feedback_none;
    gcomp_compressor *c;
    st = gcomp__compressor_build(&c, &parsed, n, rows, cols, err);
    if (st != GCOMP_OK) return st;
    *bytes = gcomp_encode_bound(c);
    gcomp_compressor_free(c);
    return GCOMP_OK;
}

gcomp_status gcomp_policy_choose(const gcomp_policy *p, const gcomp_tensor_desc *t,
                                 gcomp_layer_plan *out, gcomp_error *err) {
    if (!p || !t || !out) return gcomp__fail(err, GCOMP_E_ARG, "policy: NULL argument");
    memset(out, 0, sizeof *out);
    const char *name = t->name ? t->name : "";
    if (t->n == 0) return gcomp__fail(err, GCOMP_E_ARG, "policy: tensor '%s' has 0 elements", name);
    if (!gcomp__shape_holds(t->n, t->rows, t->cols))
        return gcomp__fail(err, GCOMP_E_ARG,
                           "policy: tensor '%s': shape %zux%zu does not hold %zu "
                           "elements",
                           name, t->rows, t->cols, t->n);
    bool one_d = t->rows == 0 || t->rows == 1 || t->cols == 1;
    out->rule = GCOMP_RULE_DEFAULT;
    out->reason = "default";
    out->spec = p->spec_k ? p->spec_k : p->spec;
    size_t j = 0;
    for (; j < p->nover; j++)
        if (glob_match(p->over[j].glob, name)) break;
    if (j < p->nover) {
        out->rule = GCOMP_RULE_OVERRIDE;
        out->reason = "override";
        out->pattern = p->over[j].glob;
        out->spec = p->over[j].spec;
    } else if (one_d && p->dense_1d) {
        out->rule = GCOMP_RULE_1D;
        out->reason = "1-D";
        out->spec = p->dense;
    } else if (t->n < p->min_elements) {
        out->rule = GCOMP_RULE_SMALL;
        out->reason = "small";
        out->spec = p->dense;
    }
    out->dense_bytes = 4 * t->n;
    gcomp_error local;
    local.message[0] = 0;
    gcomp_status st =
        gcomp_spec_bytes_estimate(out->spec, t->n, t->rows, t->cols, &out->bytes, &local);
    if (st != GCOMP_OK)
        return gcomp__fail(err, st, "policy: tensor '%s' (%s rule, %s): %s", name, out->reason,
                           out->spec, local.message);
    return GCOMP_OK;
}

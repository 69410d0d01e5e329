/*
 * spec.c - the spec grammar `name[:key=value,...]`, shared by C, the CLI and Python.
 *
 * A spec is checked against the parameter tables (the codec's own, its value coder's,
 * the common keys, and the chosen feedback's) -- the same tables `gradcomp list-codecs`
 * prints -- so nothing is hard-coded twice.  The canonical form lists every parameter
 * of those tables in table order with its value, defaults included (but for the few
 * late_key()s, left out at their "off" default); its FNV-1a hash is
 * the fingerprint that every message carries, so two ranks with different settings are
 * caught even when one of them spelled out a default and the other did not.
 */
#include "core/internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Keys added to a codec after its specs were in use, written into the canonical form only
 * when set to something other than their default.  A spec that leaves them alone keeps the
 * canonical form, so the fingerprint, that its messages and saved states already carry;
 * two spellings of the same setting still agree.  Only for keys whose default means "off"
 * and will never change (a changed default must change the fingerprint).  min_k: the
 * floor on k of the density codecs. */
static bool late_key(const gcomp_param_info *p) {
    return !strcmp(p->name, "min_k");
}

static const gcomp_param_info common_params[] = {
    {"feedback", GCOMP_PARAM_ENUM, 0, 0, 0, "none", GCOMP__FEEDBACK_CHOICES,
     "what the compressor remembers: none, ef (error-feedback residual), dgc (momentum "
     "correction, clipping, masking, warm-up)"},
    {"seed", GCOMP_PARAM_INT, 0, 9007199254740991.0, 0, "0", NULL,
     "seed of every random choice; ranks that must agree (random-k) use the same one"},
};

const gcomp_param_info *gcomp_common_params(size_t *count) {
    if (count) *count = GCOMP__COUNTOF(common_params);
    return common_params;
}

double gcomp__spec_num(const gcomp__spec *s, const char *name, double dflt) {
    for (size_t i = 0; i < s->count; i++)
        if (strcmp(s->items[i].p->name, name) == 0) return s->items[i].v;
    return dflt;
}

/* Index of `word` in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *word, size_t wlen) {
    int i = 0;
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == wlen && memcmp(p, word, len) == 0) return i;
        if (!bar) break;
        p = bar + 1;
        i++;
    }
    return -1;
}

static void choice_name(const char *choices, int idx, char *out, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) p = "?";
    size_t len = strcspn(p, "|");
    if (len >= cap) len = cap - 1;
    memcpy(out, p, len);
    out[len] = 0;
}

static void format_value(const gcomp_param_info *p, double v, char *out, size_t cap) {
    switch (p->type) {
    case GCOMP_PARAM_INT:
        snprintf(out, cap, "%llu", (unsigned long long)v);
        break;
    case GCOMP_PARAM_BOOL:
        snprintf(out, cap, "%d", v != 0);
        break;
    case GCOMP_PARAM_ENUM:
        choice_name(p->choices, (int)v, out, cap);
        break;
    default:
        snprintf(out, cap, "%.9g", v);
        break;
    }
}

static void range_text(const gcomp_param_info *p, char *out, size_t cap) {
    switch (p->type) {
    case GCOMP_PARAM_ENUM:
        snprintf(out, cap, "one of %s", p->choices);
        break;
    case GCOMP_PARAM_BOOL:
        snprintf(out, cap, "0 or 1");
        break;
    case GCOMP_PARAM_INT:
        snprintf(out, cap, "an integer in [%.17g, %.17g]", p->min, p->max);
        break;
    default:
        snprintf(out, cap, "a number in %c%.9g, %.9g]", p->min_exclusive ? '(' : '[', p->min,
                 p->max);
        break;
    }
}

/* Parses text[0..len) as a value of p.  Returns 0 on success. */
static int parse_value(const gcomp_param_info *p, const char *text, size_t len, double *out) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    switch (p->type) {
    case GCOMP_PARAM_ENUM: {
        int i = choice_index(p->choices, buf, len);
        if (i < 0) return -1;
        *out = i;
        return 0;
    }
    case GCOMP_PARAM_BOOL:
        if (!strcmp(buf, "1") || !strcmp(buf, "true") || !strcmp(buf, "yes"))
            *out = 1;
        else if (!strcmp(buf, "0") || !strcmp(buf, "false") || !strcmp(buf, "no"))
            *out = 0;
        else
            return -1;
        return 0;
    case GCOMP_PARAM_INT: {
        if (!isdigit((unsigned char)buf[0])) return -1;
        unsigned long long v = strtoull(buf, &end, 10);
        if (errno || *end) return -1;
        *out = (double)v;
        break;
    }
    default: {
        double v = strtod(buf, &end);
        if (errno || *end || !isfinite(v)) return -1;
        *out = v;
        break;
    }
    }
    if (*out > p->max || *out < p->min || (p->min_exclusive && *out == p->min)) return -1;
    return 0;
}

typedef struct table {
    const gcomp_param_info *p;
    size_t n;
    unsigned kind; /* GCOMP__TABLE_* */
} table;

static void list_keys(const table *t, size_t nt, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < nt; i++)
        for (size_t j = 0; j < t[i].n; j++) {
            int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", t[i].p[j].name);
            if (w < 0 || (size_t)w >= cap - used) return;
            used += (size_t)w;
        }
}

static void list_codecs(char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", gcomp_codec_at(i)->name);
        if (w < 0 || (size_t)w >= cap - used) return;
        used += (size_t)w;
    }
}

/* One key=value of the input, before tables are known. */
typedef struct kv {
    const char *key, *val;
    size_t klen, vlen;
    bool used;
} kv;

static const char *trim(const char *s, const char *e, const char **end) {
    while (s < e && isspace((unsigned char)*s)) s++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    *end = e;
    return s;
}

gcomp_status gcomp__spec_parse(const char *text, gcomp__spec *out, gcomp_error *err) {
    char listing[200];
    if (!text || !out) return gcomp__fail(err, GCOMP_E_ARG, "spec: NULL argument");
    memset(out, 0, sizeof *out);
    size_t tlen = strlen(text);
    if (tlen > 1000) return gcomp__fail(err, GCOMP_E_SPEC, "spec: longer than 1000 characters");

    /* Codec name. */
    const char *colon = strchr(text, ':');
    const char *nend, *name = trim(text, colon ? colon : text + tlen, &nend);
    size_t nlen = (size_t)(nend - name);
    char cname[48];
    if (nlen == 0) {
        list_codecs(listing, sizeof listing);
        return gcomp__fail(err, GCOMP_E_SPEC, "spec: empty codec name; known: %s", listing);
    }
    if (nlen >= sizeof cname) nlen = sizeof cname - 1;
    memcpy(cname, name, nlen);
    cname[nlen] = 0;
    const gcomp__codec *codec = gcomp__codec_find(cname);
    if (!codec) {
        list_codecs(listing, sizeof listing);
        return gcomp__fail(err, GCOMP_E_UNKNOWN_CODEC, "unknown codec '%s'; known: %s", cname,
                           listing);
    }

    /* key=value pairs. */
    kv pairs[GCOMP__MAX_ITEMS];
    size_t np = 0;
    if (colon) {
        const char *p = colon + 1, *end = text + tlen;
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *iend = comma ? comma : end;
            const char *ie, *is = trim(p, iend, &ie);
            if (is == ie) {
                if (comma || p != colon + 1)
                    return gcomp__fail(err, GCOMP_E_SPEC, "%s: empty item in '%s'", cname, text);
            } else {
                const char *eq = memchr(is, '=', (size_t)(ie - is));
                if (!eq)
                    return gcomp__fail(err, GCOMP_E_SPEC, "%s: expected key=value, got '%.*s'",
                                       cname, (int)(ie - is), is);
                if (np == GCOMP__MAX_ITEMS)
                    return gcomp__fail(err, GCOMP_E_SPEC, "%s: too many parameters", cname);
                kv *k = &pairs[np++];
                const char *ke, *ks = trim(is, eq, &ke);
                const char *ve, *vs = trim(eq + 1, ie, &ve);
                *k = (kv){ks, vs, (size_t)(ke - ks), (size_t)(ve - vs), false};
                for (size_t j = 0; j + 1 < np; j++)
                    if (pairs[j].klen == k->klen && !memcmp(pairs[j].key, k->key, k->klen))
                        return gcomp__fail(err, GCOMP_E_SPEC, "%s: key '%.*s' given twice", cname,
                                           (int)k->klen, k->key);
            }
            if (!comma) break;
            p = comma + 1;
        }
    }

    /* Which tables apply: codec, value coder, common, feedback. */
    const gcomp__vcoder *vc = codec->fixed_values;
    const gcomp_param_info *values_param = NULL;
    for (size_t j = 0; j < codec->info.nparams; j++)
        if (!strcmp(codec->info.params[j].name, "values")) values_param = &codec->info.params[j];
    if (values_param) {
        const char *vname = values_param->deflt;
        size_t vlen = strlen(vname);
        for (size_t i = 0; i < np; i++)
            if (pairs[i].klen == 6 && !memcmp(pairs[i].key, "values", 6)) {
                vname = pairs[i].val;
                vlen = pairs[i].vlen;
            }
        char vbuf[32];
        if (vlen >= sizeof vbuf) vlen = sizeof vbuf - 1;
        memcpy(vbuf, vname, vlen);
        vbuf[vlen] = 0;
        vc = gcomp__vcoder_find(vbuf);
        if (!vc)
            return gcomp__fail(err, GCOMP_E_SPEC, "%s: values=%s is not a value coder; one of %s",
                               cname, vbuf, values_param->choices);
    }
    const char *fbname = codec->fixed_feedback ? codec->fixed_feedback : "none";
    for (size_t i = 0; i < np; i++)
        if (pairs[i].klen == 8 && !memcmp(pairs[i].key, "feedback", 8)) {
            char fb[16];
            size_t l = pairs[i].vlen < sizeof fb - 1 ? pairs[i].vlen : sizeof fb - 1;
            memcpy(fb, pairs[i].val, l);
            fb[l] = 0;
            if (!gcomp__feedback_find(fb))
                return gcomp__fail(err, GCOMP_E_SPEC, "%s: feedback=%s; one of %s", cname, fb,
                                   common_params[0].choices);
            if (codec->fixed_feedback && strcmp(fb, codec->fixed_feedback))
                return gcomp__fail(err, GCOMP_E_SPEC,
                                   "%s: feedback is always %s for this codec (it is part of the "
                                   "method); remove feedback=%s",
                                   cname, codec->fixed_feedback, fb);
            fbname = gcomp__feedback_find(fb)->info.name;
        }
    const gcomp__feedback *fb = gcomp__feedback_find(fbname);

    table tabs[4];
    size_t nt = 0;
    tabs[nt++] = (table){codec->info.params, codec->info.nparams, GCOMP__TABLE_CODEC};
    /* A quantizer codec's table is its value coder's: listed once. */
    if (vc && vc->nparams && vc->params != codec->info.params)
        tabs[nt++] = (table){vc->params, vc->nparams, GCOMP__TABLE_VALUES};
    tabs[nt++] =
        (table){common_params, sizeof common_params / sizeof common_params[0], GCOMP__TABLE_COMMON};
    if (fb && fb->info.nparams)
        tabs[nt++] = (table){fb->info.params, fb->info.nparams, GCOMP__TABLE_FEEDBACK};

    /* Every parameter of every table, given or default, in table order. */
    int w = snprintf(out->canonical, sizeof out->canonical, "%s", codec->info.name);
    size_t used = (size_t)w;
    char sep = ':';
    for (size_t t = 0; t < nt; t++)
        for (size_t j = 0; j < tabs[t].n; j++) {
            const gcomp_param_info *p = &tabs[t].p[j];
            if (out->count == GCOMP__MAX_ITEMS)
                return gcomp__fail(err, GCOMP_E_SPEC, "%s: too many parameters", cname);
            /* One key, one meaning: two stages claiming a name would take one value for
             * both and write the key twice.  Keys are renamed so that this never happens
             * (tests/unit/test_registry.c builds every combination). */
            for (size_t i = 0; i < out->count; i++)
                if (!strcmp(out->items[i].p->name, p->name))
                    return gcomp__fail(err, GCOMP_E_SPEC,
                                       "%s: key '%s' is claimed by two stages of this spec (a "
                                       "registry bug: rename one)",
                                       cname, p->name);
            double v;
            kv *given = NULL;
            for (size_t i = 0; i < np; i++)
                if (pairs[i].klen == strlen(p->name) &&
                    !memcmp(pairs[i].key, p->name, pairs[i].klen))
                    given = &pairs[i];
            const char *src = given ? given->val : p->deflt;
            /* A codec's fixed feedback is its default: the canonical form must name it. */
            if (!given && p == &common_params[0] && codec->fixed_feedback)
                src = codec->fixed_feedback;
            size_t slen = given ? given->vlen : strlen(src);
            if (parse_value(p, src, slen, &v) != 0) {
                char range[160];
                range_text(p, range, sizeof range);
                return gcomp__fail(err, GCOMP_E_SPEC, "%s: %s=%.*s is not allowed; %s must be %s",
                                   cname, p->name, (int)slen, src, p->name, range);
            }
            if (given) given->used = true;
            out->items[out->count].p = p;
            out->items[out->count].v = v;
            out->items[out->count].table = tabs[t].kind;
            out->count++;
            char vbuf[64];
            format_value(p, v, vbuf, sizeof vbuf);
            if (late_key(p) && !strcmp(vbuf, p->deflt)) continue;
            w = snprintf(out->canonical + used, sizeof out->canonical - used, "%c%s=%s", sep,
                         p->name, vbuf);
            if (w < 0 || (size_t)w >= sizeof out->canonical - used)
                return gcomp__fail(err, GCOMP_E_SPEC, "%s: canonical spec too long", cname);
            used += (size_t)w;
            sep = ',';
        }
    for (size_t i = 0; i < np; i++)
        if (!pairs[i].used) {
            list_keys(tabs, nt, listing, sizeof listing);
            return gcomp__fail(err, GCOMP_E_SPEC, "%s: unknown key '%.*s'; allowed: %s", cname,
                               (int)pairs[i].klen, pairs[i].key, listing);
        }
    out->codec = codec;
    out->vcoder = vc;
    out->feedback = fb;
    out->fingerprint = gcomp__fnv1a64(out->canonical, used);
    return GCOMP_OK;
}

gcomp_status gcomp_spec_canonical(const char *spec, char *out, size_t out_cap,
                                  uint64_t *fingerprint, gcomp_error *err) {
    gcomp__spec s;
    gcomp_status st = gcomp__spec_parse(spec, &s, err);
    if (st != GCOMP_OK) return st;
    size_t len = strlen(s.canonical);
    if (out) {
        if (out_cap <= len)
            return gcomp__fail(err, GCOMP_E_DST_SIZE, "canonical spec needs %zu bytes", len + 1);
        memcpy(out, s.canonical, len + 1);
    }
    if (fingerprint) *fingerprint = s.fingerprint;
    return GCOMP_OK;
}

/* ---- one parameter of a spec: read it, set it ----------------------------------------------- */

/* Index of `key` among the parsed items, or -1 (then err says which keys there are). */
static int find_key(const gcomp__spec *s, const char *key, gcomp_error *err) {
    for (size_t i = 0; i < s->count; i++)
        if (!strcmp(s->items[i].p->name, key)) return (int)i;
    char listing[400];
    size_t used = 0;
    listing[0] = 0;
    for (size_t i = 0; i < s->count; i++) {
        int w = snprintf(listing + used, sizeof listing - used, "%s%s", used ? ", " : "",
                         s->items[i].p->name);
        if (w < 0 || (size_t)w >= sizeof listing - used) break;
        used += (size_t)w;
    }
    gcomp__fail(err, GCOMP_E_SPEC, "%s: '%s' is not a parameter of this spec; allowed: %s",
                s->codec->info.name, key, listing);
    return -1;
}

gcomp_status gcomp_spec_get(const char *spec, const char *key, char *out, size_t cap,
                            gcomp_error *err) {
    if (!spec || !key || !out)
        return gcomp__fail(err, GCOMP_E_ARG, "spec_get: spec, key and out must not be NULL");
    gcomp__spec s;
    gcomp_status st = gcomp__spec_parse(spec, &s, err);
    if (st != GCOMP_OK) return st;
    int i = find_key(&s, key, err);
    if (i < 0) return GCOMP_E_SPEC;
    char v[64];
    format_value(s.items[i].p, s.items[i].v, v, sizeof v);
    size_t len = strlen(v);
    if (cap <= len)
        return gcomp__fail(err, GCOMP_E_DST_SIZE, "%s=%s needs %zu bytes", key, v, len + 1);
    memcpy(out, v, len + 1);
    return GCOMP_OK;
}

gcomp_status gcomp_spec_get_number(const char *spec, const char *key, double *out,
                                   gcomp_error *err) {
    if (!spec || !key || !out)
        return gcomp__fail(err, GCOMP_E_ARG, "spec_get_number: spec, key and out must not be NULL");
    gcomp__spec s;
    gcomp_status st = gcomp__spec_parse(spec, &s, err);
    if (st != GCOMP_OK) return st;
    int i = find_key(&s, key, err);
    if (i < 0) return GCOMP_E_SPEC;
    *out = s.items[i].v;
    return GCOMP_OK;
}

/* Whether `table` (n entries) has a parameter called `name`. */
static bool table_has(const gcomp_param_info *tab, size_t n, const char *name) {
    for (size_t j = 0; j < n; j++)
        if (!strcmp(tab[j].name, name)) return true;
    return false;
}

/*
 * The spec is rewritten from its parsed items (every key, defaults included) with the one
 * value replaced, and parsed again: the parser stays the only judge of what is valid.
 * values= and feedback= choose a table of keys, so their old table's keys are carried over
 * only where the new table has the same key.
 */
gcomp_status gcomp_spec_set(const char *spec, const char *key, const char *value, char *out,
                            size_t cap, gcomp_error *err) {
    if (!spec || !key || !value || !out)
        return gcomp__fail(err, GCOMP_E_ARG, "spec_set: spec, key, value and out must not be NULL");
    gcomp__spec s;
    gcomp_status st = gcomp__spec_parse(spec, &s, err);
    if (st != GCOMP_OK) return st;
    int at = find_key(&s, key, err);
    if (at < 0) return GCOMP_E_SPEC;
    if (strlen(value) > 64 || strpbrk(value, ",:="))
        return gcomp__fail(err, GCOMP_E_SPEC, "%s: %s=%s is not a value", s.codec->info.name, key,
                           value);
    /* Which table the new value brings (NULL: the old one goes and nothing replaces it). */
    unsigned swapped = 0; /* GCOMP__TABLE_* whose keys are replaced, or 0 */
    const gcomp_param_info *ntab = NULL;
    size_t nn = 0;
    if (s.items[at].table == GCOMP__TABLE_CODEC && !strcmp(key, "values")) {
        const gcomp__vcoder *vc = gcomp__vcoder_find(value);
        swapped = GCOMP__TABLE_VALUES;
        if (vc) ntab = vc->params, nn = vc->nparams;
    } else if (s.items[at].table == GCOMP__TABLE_COMMON && !strcmp(key, "feedback")) {
        const gcomp__feedback *fb = gcomp__feedback_find(value);
        swapped = GCOMP__TABLE_FEEDBACK;
        if (fb) ntab = fb->info.params, nn = fb->info.nparams;
    }
    char text[2 * GCOMP__SPEC_MAX];
    int w = snprintf(text, sizeof text, "%s", s.codec->info.name);
    size_t used = (size_t)w;
    char sep = ':';
    for (size_t i = 0; i < s.count; i++) {
        const gcomp_param_info *p = s.items[i].p;
        char v[64];
        if ((int)i == at) {
            snprintf(v, sizeof v, "%s", value);
        } else {
            if (swapped && s.items[i].table == swapped && !table_has(ntab, nn, p->name)) continue;
            format_value(p, s.items[i].v, v, sizeof v);
        }
        w = snprintf(text + used, sizeof text - used, "%c%s=%s", sep, p->name, v);
        if (w < 0 || (size_t)w >= sizeof text - used)
            return gcomp__fail(err, GCOMP_E_SPEC, "%s: spec too long", s.codec->info.name);
        used += (size_t)w;
        sep = ',';
    }
    gcomp__spec t;
    if ((st = gcomp__spec_parse(text, &t, err)) != GCOMP_OK) return st;
    size_t len = strlen(t.canonical);
    if (cap <= len)
        return gcomp__fail(err, GCOMP_E_DST_SIZE, "canonical spec needs %zu bytes", len + 1);
    memcpy(out, t.canonical, len + 1);
    return GCOMP_OK;
}

/*
 * test_registry.c - the one registration (src/core/registry.def) and what is derived from
 * it, and every spec the registry can make.
 *
 * Every selector x value coder x feedback, and every codec alone x feedback, is built and
 * must: parse; claim each key once (a key of two stages would take one value for both);
 * have a canonical form that is a fixed point (canonical(canonical(s)) == canonical(s),
 * same fingerprint); and be described by gcomp_spec_describe.  The tables derived from the
 * list -- wire ids, the values= and feedback= choices, list-codecs' feedback stages -- are
 * checked against the registries they come from.
 */
#include "check.h"
#include "core/internal.h"

/* Copies the next `sep`-separated word of *p into out and moves *p past it; 0 at the end. */
static int next_word(const char **p, char sep, char *out, size_t cap) {
    if (!*p) return 0;
    const char *end = strchr(*p, sep);
    size_t len = end ? (size_t)(end - *p) : strlen(*p);
    snprintf(out, cap, "%.*s", (int)len, *p);
    *p = end ? end + 1 : NULL;
    return 1;
}

static const char *choices_of(const gcomp_param_info *p, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].name, key)) return p[i].choices;
    return NULL;
}

static int has_key(const gcomp_param_info *p, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].name, key)) return 1;
    return 0;
}

static size_t built;

/* Every check a spec of the registry must pass. */
static void check_spec(const char *spec) {
    char c1[GCOMP__SPEC_MAX], c2[GCOMP__SPEC_MAX];
    uint64_t f1 = 0, f2 = 1;
    gcomp_error err;
    gcomp_status st = gcomp_spec_canonical(spec, c1, sizeof c1, &f1, &err);
    CHECK_MSG(st == GCOMP_OK, "%s: %s", spec, err.message);
    if (st != GCOMP_OK) return;
    /* Each key once. */
    char keys[64][128];
    size_t nk = 0;
    char item[128];
    const char *cursor = strchr(c1, ':');
    cursor = cursor ? cursor + 1 : NULL;
    while (next_word(&cursor, ',', item, sizeof item) && nk < 64) {
        item[strcspn(item, "=")] = 0;
        for (size_t j = 0; j < nk; j++)
            CHECK_MSG(strcmp(keys[j], item) != 0, "%s: key '%s' twice in %s", spec, item, c1);
        snprintf(keys[nk++], sizeof keys[0], "%s", item);
    }
    /* A fixed point, with the same fingerprint. */
    st = gcomp_spec_canonical(c1, c2, sizeof c2, &f2, &err);
    CHECK_MSG(st == GCOMP_OK, "canonical of %s does not parse: %s", spec, err.message);
    CHECK_MSG(st != GCOMP_OK || (!strcmp(c1, c2) && f1 == f2), "%s: %s -> %s", spec, c1, c2);
    /* Described, at every size and the worst case. */
    gcomp_spec_info info;
    st = gcomp_spec_describe(c1, 0, &info, &err);
    CHECK_MSG(st == GCOMP_OK, "describe %s: %s", c1, err.message);
    st = gcomp_spec_describe(c1, 1000, &info, &err);
    CHECK_MSG(st == GCOMP_OK, "describe %s n=1000: %s", c1, err.message);
    CHECK(st != GCOMP_OK || info.fingerprint == f1);
    built++;
}

static void test_every_combination(void) {
    size_t nfb = gcomp_feedback_count();
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        const char *vals = choices_of(ci->params, ci->nparams, "values");
        for (size_t f = 0; f < nfb; f++) {
            const char *fb = gcomp_feedback_at(f)->name;
            char spec[256];
            snprintf(spec, sizeof spec, "%s:feedback=%s", ci->name, fb);
            gcomp_spec_info alone;
            /* A codec with a feedback of its own takes only that one. */
            if (gcomp_spec_describe(ci->name, 0, &alone, NULL) == GCOMP_OK &&
                (alone.flags & GCOMP_SPEC_FIXED_FEEDBACK) && strcmp(alone.feedback, fb)) {
                CHECK_MSG(gcomp_spec_canonical(spec, NULL, 0, NULL, NULL) == GCOMP_E_SPEC, "%s",
                          spec);
                continue;
            }
            check_spec(spec);
            if (!vals) continue;
            const char *cursor = vals;
            char v[32];
            while (next_word(&cursor, '|', v, sizeof v)) {
                snprintf(spec, sizeof spec, "%s:values=%s,feedback=%s", ci->name, v, fb);
                check_spec(spec);
            }
        }
    }
    printf("combinations built: %zu\n", built);
    CHECK(built > 300);
}

/* Wire ids unique, names resolve, choices are the registry's. */
static void test_derived_tables(void) {
    size_t nc = gcomp_codec_count();
    CHECK(gcomp_codec_at(nc) == NULL);
    for (size_t i = 0; i < nc; i++) {
        const gcomp_codec_info *a = gcomp_codec_at(i);
        CHECK(gcomp_codec_find(a->name) == a && gcomp_codec_by_id(a->id) == a);
        for (size_t j = 0; j < i; j++) CHECK(gcomp_codec_at(j)->id != a->id);
        /* Parameter counts are the tables' own (GCOMP__COUNTOF): every entry complete. */
        for (size_t k = 0; k < a->nparams; k++)
            CHECK_MSG(a->params[k].name && a->params[k].deflt && a->params[k].help, "%s #%zu",
                      a->name, k);
    }
    /* values=: every choice a value coder, ids unique, and every value coder a choice. */
    const char *vals =
        choices_of(gcomp_codec_find("topk")->params, gcomp_codec_find("topk")->nparams, "values");
    CHECK(vals && !strcmp(vals, GCOMP__VALUES_CHOICES));
    const char *cursor = vals;
    char v[32];
    size_t nv = 0;
    uint8_t ids[64];
    while (next_word(&cursor, '|', v, sizeof v)) {
        const gcomp__vcoder *vc = gcomp__vcoder_find(v);
        CHECK_MSG(vc != NULL, "values=%s has no coder", v);
        if (!vc) continue;
        CHECK(gcomp__vcoder_by_id(vc->id) == vc);
        for (size_t j = 0; j < nv; j++) CHECK(ids[j] != vc->id);
        ids[nv++] = vc->id;
        /* A quantizer codec of the same name is dense with that coder. */
        const gcomp__codec *qc = gcomp__codec_find(v);
        if (qc) CHECK(qc->fixed_values == vc && (qc->info.flags & GCOMP_CODEC_QUANTIZER));
    }
    for (uint8_t id = 0; id < 64; id++) {
        const gcomp__vcoder *vc = gcomp__vcoder_by_id(id);
        if (!vc) continue;
        int listed = 0;
        for (size_t j = 0; j < nv; j++) listed |= ids[j] == id;
        CHECK_MSG(listed, "value coder %s is not a values= choice", vc->name);
    }
    /* Every codec that takes values= offers the same choices (powersgd: its own f32|f16). */
    for (size_t i = 0; i < nc; i++) {
        const gcomp_codec_info *a = gcomp_codec_at(i);
        const char *c = choices_of(a->params, a->nparams, "values");
        if (c && !(a->flags & GCOMP_CODEC_MULTIPHASE)) CHECK_MSG(c == vals, "%s", a->name);
    }
    /* feedback=: the feedback stages, in order. */
    size_t ncommon;
    const gcomp_param_info *common = gcomp_common_params(&ncommon);
    const char *fbs = choices_of(common, ncommon, "feedback");
    CHECK(fbs != NULL);
    cursor = fbs;
    size_t f = 0;
    while (fbs && next_word(&cursor, '|', v, sizeof v)) {
        const gcomp_feedback_info *fi = gcomp_feedback_at(f++);
        CHECK(fi && !strcmp(fi->name, v) && fi->help && fi->help[0]);
    }
    CHECK(f == gcomp_feedback_count() && gcomp_feedback_at(f) == NULL);
    /* DGC's keys are listed with its stage. */
    const gcomp_feedback_info *dgc = NULL;
    for (size_t i = 0; i < gcomp_feedback_count(); i++)
        if (!strcmp(gcomp_feedback_at(i)->name, "dgc")) dgc = gcomp_feedback_at(i);
    static const char *dgc_keys[] = {"momentum", "nesterov",      "clip",        "masking",
                                     "warmup",   "warmup_stages", "warmup_start"};
    CHECK(dgc != NULL);
    for (size_t i = 0; dgc && i < GCOMP__COUNTOF(dgc_keys); i++)
        CHECK_MSG(has_key(dgc->params, dgc->nparams, dgc_keys[i]), "dgc lacks %s", dgc_keys[i]);
}

/* The renamed keys (docs/FORMAT.md, change log) mean one thing each. */
static void test_renamed_keys(void) {
    char out[64];
    CHECK_OK(gcomp_spec_get("threshold:tau=2,values=twobit,threshold=0.25", "tau", out, sizeof out,
                            NULL));
    CHECK(!strcmp(out, "2"));
    CHECK_OK(gcomp_spec_get("threshold:tau=2,values=twobit,threshold=0.25", "threshold", out,
                            sizeof out, NULL));
    CHECK(!strcmp(out, "0.25"));
    CHECK_OK(gcomp_spec_get("ternary:clip_sigma=2.5,feedback=dgc,clip=3", "clip", out, sizeof out,
                            NULL));
    CHECK(!strcmp(out, "3"));
    CHECK(gcomp_spec_canonical("threshold:threshold=2", NULL, 0, NULL, NULL) == GCOMP_E_SPEC);
    CHECK(gcomp_spec_canonical("ternary:clip=2.5", NULL, 0, NULL, NULL) == GCOMP_E_SPEC);
    /* MXNet's compression_params={'type':'2bit','threshold':0.5}. */
    CHECK_OK(gcomp_spec_canonical("twobit:threshold=0.5", out, sizeof out, NULL, NULL));
    CHECK(!strcmp(out, "twobit:threshold=0.5,feedback=ef,seed=0"));
}

int main(void) {
    test_every_combination();
    test_derived_tables();
    test_renamed_keys();
    return CHECK_DONE();
}

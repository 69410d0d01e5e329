/*
 * registry.c - the static tables of codecs, value coders and feedback kinds.
 *
 * Wire ids are allocated here and in docs/FORMAT.md, never reused.  Each codec lives in
 * its own file under src/select, src/values or src/lowrank and is listed below; the
 * spec parser, the decoder and `gradcomp list-codecs` read only these tables.
 */
#include "core/internal.h"

extern const gcomp__codec gcomp__codec_none;
extern const gcomp__codec gcomp__codec_topk;
extern const gcomp__codec gcomp__codec_threshold;
extern const gcomp__codec gcomp__codec_sampled;
extern const gcomp__codec gcomp__codec_randomk;
extern const gcomp__codec gcomp__codec_bernoulli;
extern const gcomp__codec gcomp__codec_importance;
extern const gcomp__codec gcomp__codec_block;
extern const gcomp__codec gcomp__codec_rows;
extern const gcomp__codec gcomp__codec_cols;
extern const gcomp__codec gcomp__codec_dgc;
extern const gcomp__codec gcomp__codec_int8;
extern const gcomp__codec gcomp__codec_int4;
extern const gcomp__codec gcomp__codec_sign;
extern const gcomp__codec gcomp__codec_twobit;
extern const gcomp__codec gcomp__codec_ternary;
extern const gcomp__codec gcomp__codec_qsgd;
extern const gcomp__codec gcomp__codec_powersgd;

static const gcomp__codec *const codecs[] = {
    &gcomp__codec_none,    &gcomp__codec_topk,      &gcomp__codec_threshold,  &gcomp__codec_sampled,
    &gcomp__codec_randomk, &gcomp__codec_bernoulli, &gcomp__codec_importance, &gcomp__codec_block,
    &gcomp__codec_rows,    &gcomp__codec_cols,      &gcomp__codec_dgc,        &gcomp__codec_int8,
    &gcomp__codec_int4,    &gcomp__codec_sign,      &gcomp__codec_twobit,     &gcomp__codec_ternary,
    &gcomp__codec_qsgd,    &gcomp__codec_powersgd,
};
#define NCODECS (sizeof codecs / sizeof codecs[0])

extern const gcomp__vcoder gcomp__vcoder_f32;
extern const gcomp__vcoder gcomp__vcoder_f16;
extern const gcomp__vcoder gcomp__vcoder_bf16;
extern const gcomp__vcoder gcomp__vcoder_int8;
extern const gcomp__vcoder gcomp__vcoder_int4;
extern const gcomp__vcoder gcomp__vcoder_sign;
extern const gcomp__vcoder gcomp__vcoder_twobit;
extern const gcomp__vcoder gcomp__vcoder_ternary;
extern const gcomp__vcoder gcomp__vcoder_qsgd;

static const gcomp__vcoder *const vcoders[] = {
    &gcomp__vcoder_f32,    &gcomp__vcoder_f16,     &gcomp__vcoder_bf16,
    &gcomp__vcoder_int8,   &gcomp__vcoder_int4,    &gcomp__vcoder_sign,
    &gcomp__vcoder_twobit, &gcomp__vcoder_ternary, &gcomp__vcoder_qsgd,
};
#define NVCODERS (sizeof vcoders / sizeof vcoders[0])

static const gcomp__feedback *const feedbacks[] = {
    &gcomp__feedback_none,
    &gcomp__feedback_ef,
    &gcomp__feedback_dgc,
};
#define NFEEDBACKS (sizeof feedbacks / sizeof feedbacks[0])

size_t gcomp_codec_count(void) {
    return NCODECS;
}

const gcomp_codec_info *gcomp_codec_at(size_t i) {
    return i < NCODECS ? &codecs[i]->info : NULL;
}

const gcomp__codec *gcomp__codec_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < NCODECS; i++)
        if (!strcmp(codecs[i]->info.name, name)) return codecs[i];
    return NULL;
}

const gcomp__codec *gcomp__codec_by_id(uint16_t id) {
    for (size_t i = 0; i < NCODECS; i++)
        if (codecs[i]->info.id == id) return codecs[i];
    return NULL;
}

const gcomp_codec_info *gcomp_codec_find(const char *name) {
    const gcomp__codec *c = gcomp__codec_find(name);
    return c ? &c->info : NULL;
}

const gcomp_codec_info *gcomp_codec_by_id(uint16_t id) {
    const gcomp__codec *c = gcomp__codec_by_id(id);
    return c ? &c->info : NULL;
}

const gcomp__vcoder *gcomp__vcoder_find(const char *name) {
    for (size_t i = 0; i < NVCODERS; i++)
        if (!strcmp(vcoders[i]->name, name)) return vcoders[i];
    return NULL;
}

const gcomp__vcoder *gcomp__vcoder_by_id(uint8_t id) {
    for (size_t i = 0; i < NVCODERS; i++)
        if (vcoders[i]->id == id) return vcoders[i];
    return NULL;
}

const gcomp__feedback *gcomp__feedback_find(const char *name) {
    for (size_t i = 0; i < NFEEDBACKS; i++)
        if (!strcmp(feedbacks[i]->name, name)) return feedbacks[i];
    return NULL;
}

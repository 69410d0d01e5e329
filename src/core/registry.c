/*
 * registry.c - the static tables of codecs, value coders and feedback stages, and the
 * choices of `values=` and `feedback=`, all made from the one list in registry.def.
 *
 * Each codec lives in its own file under src/select, src/values, src/feedback or
 * src/lowrank; the spec parser, the decoder, gcomp_spec_describe and `gradcomp
 * list-codecs` read only these tables.  Rejected: a hand-kept table per kind (a value
 * coder was listed in four places, and forgetting one made its key "unknown").
 */
#include "core/internal.h"

#define GCOMP__CODEC(name, id) extern const gcomp__codec gcomp__codec_##name;
#define GCOMP__VALUES(name, vid) extern const gcomp__vcoder gcomp__vcoder_##name;
#define GCOMP__QUANTIZER(name, vid, id)                                                            \
    extern const gcomp__codec gcomp__codec_##name;                                                 \
    extern const gcomp__vcoder gcomp__vcoder_##name;
#include "core/registry.def"

static const gcomp__codec *const codecs[] = {
#define GCOMP__CODEC(name, id) &gcomp__codec_##name,
#define GCOMP__QUANTIZER(name, vid, id) &gcomp__codec_##name,
#include "core/registry.def"
};
#define NCODECS GCOMP__COUNTOF(codecs)

static const gcomp__vcoder *const vcoders[] = {
#define GCOMP__VALUES(name, vid) &gcomp__vcoder_##name,
#define GCOMP__QUANTIZER(name, vid, id) &gcomp__vcoder_##name,
#include "core/registry.def"
};
#define NVCODERS GCOMP__COUNTOF(vcoders)

static const gcomp__feedback *const feedbacks[] = {
#define GCOMP__FEEDBACK(name) &gcomp__feedback_##name,
#include "core/registry.def"
};
#define NFEEDBACKS GCOMP__COUNTOF(feedbacks)

const char gcomp__values_choices[] = ""
#define GCOMP__VALUES(name, vid) "|" #name
#define GCOMP__QUANTIZER(name, vid, id) "|" #name
#include "core/registry.def"
    ;
const char gcomp__feedback_choices[] = ""
#define GCOMP__FEEDBACK(name) "|" #name
#include "core/registry.def"
    ;

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
        if (!strcmp(feedbacks[i]->info.name, name)) return feedbacks[i];
    return NULL;
}

size_t gcomp_feedback_count(void) {
    return NFEEDBACKS;
}

const gcomp_feedback_info *gcomp_feedback_at(size_t i) {
    return i < NFEEDBACKS ? &feedbacks[i]->info : NULL;
}

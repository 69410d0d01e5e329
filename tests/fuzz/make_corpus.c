/*
 * make_corpus.c - writes the seed corpus of every fuzz target under ROOT/TARGET/:
 *   decode     one valid message per codec at sizes 1, 17, 300 and 4096 (and a second step
 *              of the codecs with state), as the raw decode target reads them
 *   repair     the same messages behind the repair target's two parameter bytes
 *   roundtrip  one input per codec, with and without parameters, feedback and a shape
 *   state      the state blob of every codec after two steps, plain and repaired
 *   spec       every codec's name, its parameters at their limits, and a few odd texts
 * Generated at test time from the registry, never checked in (STYLE.md: fixtures come from
 * a program in the tree); the inputs the fuzzers found live in tests/fuzz/regress/.
 * usage: make_corpus ROOT
 */
#include "fuzz_common.h"
#include "gradcomp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

static void put2(const char *target, const char *name, const void *pre, size_t plen, const void *p,
                 size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (plen) fwrite(pre, 1, plen, f);
    fwrite(p, 1, len, f);
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}
static void put(const char *target, const char *name, const void *p, size_t len) {
    put2(target, name, NULL, 0, p, len);
}

static void mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

/* The spec used for codec ci's messages and blobs: its defaults, plus feedback=ef where
 * that makes state (refused specs fall back to the plain name). */
static gcomp_compressor *make(const gcomp_codec_info *ci, size_t n, int ef) {
    size_t rows = 0, cols = 0;
    if (ci->flags & GCOMP_CODEC_NEEDS_SHAPE) {
        for (rows = (size_t)sqrt((double)n); rows > 1 && n % rows; rows--) {
        }
        cols = n / rows;
    }
    char spec[256];
    snprintf(spec, sizeof spec, "%s%s", ci->name,
             ef                              ? ":feedback=ef"
             : !strcmp(ci->name, "powersgd") ? ":min_compression_rate=0"
                                             : "");
    gcomp_compressor *c = NULL;
    if (gcomp_compressor_create(&c, spec, n, rows, cols, NULL) != GCOMP_OK) c = NULL;
    return c;
}

static void messages(void) {
    const size_t sizes[] = {1, 17, 300, 4096};
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            gcomp_compressor *c = make(ci, n, 0);
            if (!c) continue;
            float *g = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++) g[j] = sinf((float)j * 0.7f) * (float)(j % 13);
            size_t cap = gcomp_encode_bound(c), mlen;
            unsigned char *m = malloc(cap);
            for (int step = 0; step < 2; step++) {
                if (gcomp_encode(c, g, m, cap, &mlen) != GCOMP_OK) break;
                char name[256];
                snprintf(name, sizeof name, "%s-%zu-%d.gcm", ci->name, n, step);
                put("decode", name, m, mlen);
                /* repair: scale 0.5, accumulator of n; the message's own codec id */
                const unsigned char pre[2] = {0x01, 0xff};
                put2("repair", name, pre, 2, m, mlen);
                const unsigned char pre2[2] = {0x21, (unsigned char)i};
                snprintf(name, sizeof name, "%s-%zu-%d-validate.gcm", ci->name, n, step);
                put2("repair", name, pre2, 2, m, mlen);
            }
            free(m);
            free(g);
            gcomp_compressor_free(c);
        }
    }
}

static void blobs(void) {
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        for (int ef = 0; ef < 2; ef++) {
            size_t n = 64;
            gcomp_compressor *c = make(ci, n, ef);
            if (!c) continue;
            float g[64];
            for (size_t j = 0; j < n; j++) g[j] = cosf((float)j) * (float)(1 + j % 5);
            size_t cap = gcomp_encode_bound(c), mlen;
            unsigned char *m = malloc(cap);
            for (int step = 0; step < 2; step++) gcomp_encode(c, g, m, cap, &mlen);
            free(m);
            size_t sl = gcomp_state_bound(c), got;
            unsigned char *b = malloc(sl);
            if (gcomp_state_save(c, b, sl, &got) == GCOMP_OK) {
                char name[256];
                for (unsigned char mode = 0; mode < 2; mode++) {
                    unsigned char pre = (unsigned char)(mode | (unsigned char)(i << 1));
                    snprintf(name, sizeof name, "%s%s-%u.gcst", ci->name, ef ? "-ef" : "", mode);
                    put2("state", name, &pre, 1, b, got);
                }
            }
            free(b);
            gcomp_compressor_free(c);
        }
    }
}

/* The adaptive controllers' state (fuzz_state loads it into fz_adapt_make's object): after
 * a decision, mid-interval, and with a course; plain and repaired. */
static void adapt_blobs(void) {
    for (int k = 0; k < 3; k++) {
        gcomp_adapt *a = fz_adapt_make();
        if (!a) continue;
        if (k == 2) {
            double p[2] = {0.5, 1.0}, m[2] = {0.7, 0.8};
            gcomp_adapt_set_course(a, p, m, 2, NULL);
        }
        fz_adapt_run(a, k == 0 ? 4 : 7);
        size_t cap = gcomp_adapt_state_bound(a), got;
        unsigned char *b = malloc(cap);
        if (b && gcomp_adapt_save_state(a, b, cap, &got) == GCOMP_OK)
            for (unsigned char mode = 0; mode < 2; mode++) {
                char name[64];
                snprintf(name, sizeof name, "adapt-%d-%u.gcad", k, mode);
                put2("state", name, &mode, 1, b, got);
            }
        free(b);
        gcomp_adapt_free(a);
    }
}

static void roundtrips(void) {
    /* codec byte, then parameter bytes (odd: set), then n, shape, steps, huge, data. */
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        for (unsigned v = 0; v < 4; v++) {
            unsigned char in[96];
            in[0] = (unsigned char)i;
            for (size_t j = 1; j < sizeof in; j++)
                in[j] = (unsigned char)(v == 0 ? 0 : (j * 37 + v * 11 + i) & 0xff);
            char name[64];
            snprintf(name, sizeof name, "%s-%u.rt", gcomp_codec_at(i)->name, v);
            put("roundtrip", name, in, sizeof in);
        }
    }
}

static void specs(void) {
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        char name[256], text[1024];
        int len = snprintf(text, sizeof text, "%c%s", 7, ci->name);
        snprintf(name, sizeof name, "%s.spec", ci->name);
        put("spec", name, text, (size_t)len);
        /* every parameter at its maximum, then at its minimum */
        for (int end = 0; end < 2; end++) {
            len = snprintf(text, sizeof text, "%c%s", 3, ci->name);
            for (size_t p = 0; p < ci->nparams; p++) {
                const gcomp_param_info *pi = &ci->params[p];
                char v[64];
                if (pi->type == GCOMP_PARAM_ENUM)
                    snprintf(v, sizeof v, "%.*s", (int)strcspn(pi->choices, "|"), pi->choices);
                else
                    snprintf(v, sizeof v, "%.17g", end ? pi->max : pi->min);
                len += snprintf(text + len, sizeof text - (size_t)len, "%c%s=%s", p ? ',' : ':',
                                pi->name, v);
            }
            snprintf(name, sizeof name, "%s-%s.spec", ci->name, end ? "max" : "min");
            put("spec", name, text, (size_t)len);
        }
    }
    const char *extra[] = {"\x01topk:density=0.001,values=f16,feedback=ef",
                           "\x02topk: density = 1e-3 , values=bf16",
                           "\x03randomk:density=0.5,seed=9007199254740991",
                           "\x04threshold:tau=3e38",
                           "\x05sampled:density=1,exact=1",
                           "\x06none:values=f16,feedback=ef,seed=1",
                           "\x07topk:values=qsgd,levels=3,coding=elias",
                           "\x08dgc:density=0.01,momentum=0.9,warmup=4,clip=2",
                           "\x09powersgd:rank=1024,iters=64"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
        char name[32];
        snprintf(name, sizeof name, "extra-%zu.spec", i);
        put("spec", name, extra[i], strlen(extra[i]));
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus ROOT\n");
        return 2;
    }
    root = argv[1];
    const char *targets[] = {"decode", "repair", "roundtrip", "state", "spec"};
    for (size_t t = 0; t < sizeof targets / sizeof *targets; t++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, targets[t]);
        mkdir_p(dir);
    }
    messages();
    blobs();
    adapt_blobs();
    roundtrips();
    specs();
    return 0;
}

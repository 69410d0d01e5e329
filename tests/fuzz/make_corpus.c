/*
 * make_corpus.c - writes the seed corpus for the fuzz targets: one valid message per
 * codec and a few sizes, and the spec strings of every codec with defaults and edges.
 * Generated, never checked in (STYLE.md: fixtures come from a script in the tree).
 * usage: make_corpus DECODE_DIR SPEC_DIR
 */
#include "gradcomp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void put(const char *dir, const char *name, const void *p, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(p, 1, len, f);
    fclose(f);
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

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    mkdir_p(argv[1]);
    mkdir_p(argv[2]);
    size_t sizes[] = {1, 17, 300, 4096};
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *ci = gcomp_codec_at(i);
        char name[256];
        snprintf(name, sizeof name, "%s.spec", ci->name);
        char text[256];
        int len = snprintf(text, sizeof text, "%c%s", 7, ci->name);
        put(argv[2], name, text, (size_t)len);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s], rows = 0, cols = 0;
            if (ci->flags & GCOMP_CODEC_NEEDS_SHAPE) {
                for (rows = (size_t)sqrt((double)n); rows > 1 && n % rows; rows--) {
                }
                cols = n / rows;
            }
            gcomp_compressor *c;
            if (gcomp_compressor_create(&c, ci->name, n, rows, cols, NULL) != GCOMP_OK) continue;
            float *g = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++) g[j] = sinf((float)j * 0.7f) * (float)(j % 13);
            size_t cap = gcomp_encode_bound(c), mlen;
            unsigned char *m = malloc(cap);
            if (gcomp_encode(c, g, m, cap, &mlen) == GCOMP_OK) {
                snprintf(name, sizeof name, "%s-%zu.gcm", ci->name, n);
                put(argv[1], name, m, mlen);
            }
            free(m);
            free(g);
            gcomp_compressor_free(c);
        }
    }
    const char *specs[] = {"\x01topk:density=0.001,values=f16,feedback=ef",
                           "\x02topk: density = 1e-3 , values=bf16",
                           "\x03randomk:density=0.5,seed=9007199254740991",
                           "\x04threshold:tau=3e38",
                           "\x05sampled:density=1,exact=1",
                           "\x06none:values=f16,feedback=ef,seed=1"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        char name[32];
        snprintf(name, sizeof name, "extra-%zu.spec", i);
        put(argv[2], name, specs[i], strlen(specs[i]));
    }
    return 0;
}

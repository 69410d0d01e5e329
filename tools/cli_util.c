#define _POSIX_C_SOURCE 200809L
/*
 * cli_util.c - file I/O, argument parsing and timing shared by the CLI commands.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cli_fail(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gradcomp %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int cli_read_file(const char *cmd, const char *path, uint8_t **data, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return cli_fail(cmd, 1, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, used = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            if (f != stdin) fclose(f);
            return cli_fail(cmd, 1, "out of memory reading %s", path);
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (used < cap) break;
        cap *= 2;
        uint8_t *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) {
        free(buf);
        return cli_fail(cmd, 1, "error reading %s", path);
    }
    *data = buf;
    *len = used;
    return 0;
}

int cli_write_file(const char *cmd, const char *path, const void *data, size_t len) {
    if (!strcmp(path, "-")) {
        if (fwrite(data, 1, len, stdout) != len || fflush(stdout))
            return cli_fail(cmd, 1, "error writing to stdout");
        return 0;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return cli_fail(cmd, 1, "out of memory");
    snprintf(tmp, plen + 16, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int e = errno;
        free(tmp);
        return cli_fail(cmd, 1, "cannot write %s: %s", path, strerror(e));
    }
    int ok = fwrite(data, 1, len, f) == len;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        free(tmp);
        return cli_fail(cmd, 1, "cannot write %s", path);
    }
    free(tmp);
    return 0;
}

int cli_parse_count(const char *s, size_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return -1;
    double mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1e3, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1e6, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1e9, end++;
    if (*end) return -1;
    v *= mul;
    if (v != floor(v) || v > 1e15) return -1;
    *out = (size_t)v;
    return 0;
}

int cli_parse_shape(const char *s, size_t *rows, size_t *cols) {
    const char *x = strchr(s, 'x');
    if (!x) return -1;
    char buf[32];
    size_t l = (size_t)(x - s);
    if (l == 0 || l >= sizeof buf) return -1;
    memcpy(buf, s, l);
    buf[l] = 0;
    if (cli_parse_count(buf, rows) || cli_parse_count(x + 1, cols) || !*rows || !*cols) return -1;
    return 0;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cli_synthetic_gradient(float *x, size_t n, uint64_t seed, uint64_t step) {
    uint64_t key = mix(seed * 0x9e3779b97f4a7c15ull + step + 1);
    for (size_t i = 0; i + 1 < n + 1; i += 2) {
        /* Box-Muller on two counter-based uniforms: reproducible at any n. */
        uint64_t a = mix(key + i), b = mix(key ^ (i + 0x632be59bd9b4e019ull));
        double u = ((double)(a >> 11) + 0.5) / 9007199254740992.0;
        double v = ((double)(b >> 11) + 0.5) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u));
        float g0 = (float)(r * cos(6.283185307179586 * v)),
              g1 = (float)(r * sin(6.283185307179586 * v));
        x[i] = (i % 97 == 0) ? 20.0f * g0 : g0;
        if (i + 1 < n) x[i + 1] = ((i + 1) % 97 == 0) ? 20.0f * g1 : g1;
    }
}

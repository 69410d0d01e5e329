#define _POSIX_C_SOURCE 200809L
/*
 * cli_util.c - file I/O, argument parsing and timing shared by the CLI commands.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

int cli_gnuplot(const char *cmd, const char *script, const char *kept) {
    char line[PATH_MAX + 32];
    snprintf(line, sizeof line, "gnuplot '%s' 2>&1", script);
    int rc = system(line);
    if (rc == 0) return 0;
    /* sh -c exits 127 when it cannot find the command; anything else came from gnuplot,
     * whose message (a data range it cannot draw, say) is already on the terminal. */
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
        return cli_fail(cmd, 1, "gnuplot is not installed (apt-get install gnuplot-nox); %s", kept);
    return cli_fail(cmd, 1, "gnuplot could not draw %s (its message is above); %s", script, kept);
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

/* "1gbit", "100mbit", "2.5gbit", "10g", "1e9" (bit/s) -> bits per second; 0 on error and
 * outside [1 kbit/s, 1000 tbit/s] (a bare 1.5 is 1.5 bit/s: a unit left out, not a link). */
double cli_parse_rate(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || !isfinite(v)) return 0;
    static const struct {
        const char *u;
        double mul;
    } units[] = {{"", 1},       {"bit", 1},     {"kbit", 1e3}, {"mbit", 1e6},
                 {"gbit", 1e9}, {"tbit", 1e12}, {"k", 1e3},    {"m", 1e6},
                 {"g", 1e9},    {"t", 1e12},    {"kbps", 1e3}, {"mbps", 1e6},
                 {"gbps", 1e9}, {"gb/s", 1e9},  {"mb/s", 1e6}, {"tbps", 1e12}};
    char low[16];
    size_t i = 0;
    for (; end[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)end[i]);
    low[i] = 0;
    if (end[i]) return 0;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
        if (!strcmp(low, units[k].u)) {
            double bps = v * units[k].mul;
            return bps >= 1e3 && bps <= 1e15 ? bps : 0;
        }
    return 0;
}

const char *cli_default_calibration(char *buf, size_t cap) {
    const char *env = getenv("GRADCOMP_CALIBRATION");
    if (env && *env) return env;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, cap, "%s/gradcomp/calibration.txt", xdg);
    else if (home && *home)
        snprintf(buf, cap, "%s/.cache/gradcomp/calibration.txt", home);
    else
        snprintf(buf, cap, "gradcomp-calibration.txt");
    return buf;
}

/* Loads the calibration; a missing default file is not an error (*cal stays NULL). */
int cli_load_calibration(const char *cmd, const char *path, bool explicit_path,
                         gcomp_cost_calibration **cal) {
    *cal = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (!explicit_path && errno == ENOENT) return 0;
        return cli_fail(cmd, 2, "--calibration %s: %s", path, strerror(errno));
    }
    fclose(f);
    uint8_t *data;
    size_t len;
    if (cli_read_file(cmd, path, &data, &len)) return 2;
    gcomp_error e = {0};
    gcomp_status st = gcomp_cost_calibration_parse(cal, (const char *)data, len, &e);
    free(data);
    if (st != GCOMP_OK) return cli_fail(cmd, 2, "%s: %s", path, e.message);
    return 0;
}

/*
 * cmd_bench.c - `gradcomp bench`: encode and decode speed of one spec on a seeded
 * synthetic gradient, with a memcpy of the same buffer timed in the same run, so every
 * figure stands beside its limit.
 *
 * Two regimes, both measured: the first call on a fresh compressor (its workspaces are
 * touched for the first time: page faults, ~10 us per 4 KiB page here, which is what huge
 * pages are for), beside a memcpy into a fresh, untouched buffer; and the steady state,
 * the median of --runs calls after that first one, beside a memcpy between touched
 * buffers; the steady state's mean too, which a stall moves and the median does not.
 * --pairs runs each encode straight after the previous decode, as a rank that encodes its
 * gradient and then decodes what it received, and times the memcpys on their own before.
 * Without it the memcpy between the calls gives a thread pool time to stop spinning, which
 * hides two pools spinning against each other on the same cores (OpenMP's and OpenBLAS's:
 * PowerSGD from rank 9 on).  The process's AnonHugePages (/proc/self/smaps_rollup) and
 * the kernel's THP mode are reported with them: the bench's own buffers come from malloc
 * (no advice), so under THP mode "madvise" the huge pages counted are the library's.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AnonHugePages of this process in kB, or -1 when /proc does not say. */
static long anon_huge_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) kb = strtol(line + 14, NULL, 10);
    fclose(f);
    return kb;
}

/* The kernel's transparent huge page mode, the bracketed word of its setting. */
static void thp_mode(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return;
    char line[128];
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b) snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v; its median.  v[0] is then the fastest run: on a shared machine the closest to
 * what the code does alone. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench", *spec = NULL;
    size_t n = 0, rows = 0, cols = 0, runs = 7;
    bool json = false, pairs = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if ((!strcmp(a, "-c") || !strcmp(a, "--codec")) && has)
            spec = argv[++i];
        else if (!strcmp(a, "-n") && has) {
            if (cli_parse_count(argv[++i], &n) || n == 0)
                return cli_fail(cmd, 2, "-n %s: expected a positive count (25000000, 25M)",
                                argv[i]);
        } else if (!strcmp(a, "--shape") && has) {
            if (cli_parse_shape(argv[++i], &rows, &cols))
                return cli_fail(cmd, 2, "--shape %s: expected ROWSxCOLS", argv[i]);
        } else if (!strcmp(a, "--runs") && has) {
            if (cli_parse_count(argv[++i], &runs) || runs == 0 || runs > 1000)
                return cli_fail(cmd, 2, "--runs %s: expected 1..1000", argv[i]);
        } else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--pairs"))
            pairs = true;
        else
            return cli_fail(cmd, 2, "unknown or incomplete option '%s'", a);
    }
    if (!spec) return cli_fail(cmd, 2, "-c SPEC is required");
    if (!n && rows) n = rows * cols;
    if (!n) return cli_fail(cmd, 2, "-n N is required");
    if (rows && rows * cols != n)
        return cli_fail(cmd, 2, "--shape %zux%zu does not hold -n %zu", rows, cols, n);

    gcomp_compressor *c;
    gcomp_error err;
    gcomp_status st = gcomp_compressor_create(&c, spec, n, rows, cols, &err);
    if (st != GCOMP_OK) return cli_fail(cmd, 2, "%s", err.message);
    size_t cap = gcomp_encode_bound(c);
    float *g = malloc(n * sizeof(float)), *acc = malloc(n * sizeof(float)),
          *copy = malloc(n * sizeof(float)), *fresh = malloc(n * sizeof(float));
    uint8_t *msg = malloc(cap);
    double *te = malloc(runs * sizeof(double)), *td = malloc(runs * sizeof(double)),
           *tm = malloc(runs * sizeof(double));
    int rc = 1;
    if (!g || !acc || !copy || !fresh || !msg || !te || !td || !tm) {
        cli_fail(cmd, 1, "out of memory for n = %zu", n);
        goto out;
    }
    cli_synthetic_gradient(g, n, 42, 0);
    memset(acc, 0, n * sizeof(float));
    memset(copy, 0, n * sizeof(float));
    memset(msg, 0, cap);
    size_t len = 0, total = 0;
    double first_encode = 0, first_decode = 0;
    /* The limit of a first call: copying into memory nobody has touched yet. */
    double f0 = cli_now();
    memcpy(fresh, g, n * sizeof(float));
    double first_memcpy = cli_now() - f0;
    if (pairs) /* the memcpys on their own, before the pairs */
        for (size_t r = 0; r < runs; r++) {
            double t0 = cli_now();
            memcpy(copy, g, n * sizeof(float));
            tm[r] = cli_now() - t0;
        }
    for (size_t r = 0; r <= runs; r++) { /* run 0 is the first call on a fresh compressor */
        double t0 = cli_now();
        if (!pairs) memcpy(copy, g, n * sizeof(float));
        double t1 = cli_now();
        st = gcomp_encode(c, g, msg, cap, &len);
        double t2 = cli_now();
        if (st != GCOMP_OK) {
            cli_fail(cmd, 1, "encode: %s", gcomp_status_str(st));
            goto out;
        }
        st = gcomp_decode_add(msg, len, acc, n, 1.0f);
        double t3 = cli_now();
        if (st != GCOMP_OK) {
            cli_fail(cmd, 1, "decode: %s", gcomp_status_str(st));
            goto out;
        }
        if (r == 0) {
            first_encode = t2 - t1;
            first_decode = t3 - t2;
        } else {
            if (!pairs) tm[r - 1] = t1 - t0;
            te[r - 1] = t2 - t1;
            td[r - 1] = t3 - t2;
            total += len;
        }
    }
    double ae = 0, ad = 0;
    for (size_t r = 0; r < runs; r++) ae += te[r], ad += td[r];
    ae /= (double)runs, ad /= (double)runs;
    double me = median(te, (int)runs), md = median(td, (int)runs), mm = median(tm, (int)runs);
    double bytes_in = 4.0 * (double)n, bytes_out = (double)total / (double)runs;
    gcomp_stats s;
    gcomp_compressor_stats(c, &s);
    double sent = (double)s.elements_sent / (double)s.messages;
    long huge_kb = anon_huge_kb();
    char thp[32];
    thp_mode(thp, sizeof thp);
    if (json) {
        printf("{\"spec\":\"%s\",\"canonical\":\"%s\",\"n\":%zu,\"rows\":%zu,\"cols\":%zu,"
               "\"runs\":%zu,\"bytes_in\":%.0f,\"bytes_out\":%.0f,\"ratio\":%.2f,"
               "\"elements_sent\":%.0f,\"encode_ms\":%.4f,\"decode_ms\":%.4f,\"memcpy_ms\":%.4f,"
               "\"encode_gbps\":%.3f,\"decode_gbps\":%.3f,\"memcpy_gbps\":%.3f,"
               "\"encode_vs_memcpy\":%.3f,\"first_encode_ms\":%.4f,\"first_decode_ms\":%.4f,"
               "\"first_memcpy_ms\":%.4f,\"first_encode_gbps\":%.3f,\"first_memcpy_gbps\":%.3f,"
               "\"anon_huge_kb\":%ld,\"thp\":\"%s\",\"encode_min_ms\":%.4f,\"decode_min_ms\":%.4f,"
               "\"memcpy_min_ms\":%.4f,\"encode_mean_ms\":%.4f,\"decode_mean_ms\":%.4f,"
               "\"pairs\":%s}\n",
               spec, gcomp_compressor_spec(c), n, rows, cols, runs, bytes_in, bytes_out,
               bytes_in / bytes_out, sent, me * 1e3, md * 1e3, mm * 1e3, bytes_in / me / 1e9,
               bytes_in / md / 1e9, bytes_in / mm / 1e9, mm / me, first_encode * 1e3,
               first_decode * 1e3, first_memcpy * 1e3, bytes_in / first_encode / 1e9,
               bytes_in / first_memcpy / 1e9, huge_kb, thp, te[0] * 1e3, td[0] * 1e3, tm[0] * 1e3,
               ae * 1e3, ad * 1e3, pairs ? "true" : "false");
    } else {
        printf("spec      %s\n", gcomp_compressor_spec(c));
        printf("tensor    %zu float32 (%.1f MB)%s\n", n, bytes_in / 1e6,
               rows ? " as a matrix" : "");
        printf("message   %.0f bytes, ratio %.1fx, %.0f values sent\n", bytes_out,
               bytes_in / bytes_out, sent);
        printf("encode    %8.3f ms  %7.2f GB/s   (%.2f x memcpy; mean %.3f ms)\n", me * 1e3,
               bytes_in / me / 1e9, mm / me, ae * 1e3);
        printf("decode    %8.3f ms  %7.2f GB/s   (mean %.3f ms)\n", md * 1e3, bytes_in / md / 1e9,
               ad * 1e3);
        printf("memcpy    %8.3f ms  %7.2f GB/s   (same buffer, same run%s)\n", mm * 1e3,
               bytes_in / mm / 1e9, pairs ? "; --pairs: before the pairs" : "");
        printf("first     encode %.3f ms (%.2f GB/s), decode %.3f ms; memcpy into fresh memory "
               "%.3f ms (%.2f GB/s)\n",
               first_encode * 1e3, bytes_in / first_encode / 1e9, first_decode * 1e3,
               first_memcpy * 1e3, bytes_in / first_memcpy / 1e9);
        printf("hugepages AnonHugePages %ld kB (THP %s)\n", huge_kb, thp);
    }
    rc = 0;
out:
    free(g);
    free(acc);
    free(copy);
    free(fresh);
    free(msg);
    free(te);
    free(td);
    free(tm);
    gcomp_compressor_free(c);
    return rc;
}

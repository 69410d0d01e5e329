/*
 * cmd_plan_layers.c - `gradcomp plan-layers POLICY FILE`: the layer-wise policy's
 * decision for every tensor of a model, and the bytes per step against dense.
 *
 * FILE lists one tensor per line: `name d0 [d1 ...]`; `#` starts a comment, blank lines
 * are skipped.  One dimension is a vector (1-D); more are a matrix of d0 rows and
 * d1*d2*... columns (a conv weight `out in kh kw` is out x in*kh*kw, as frameworks flatten
 * it).  Uses the public API only (gcomp_policy_*), like every command.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer {
    char name[128];
    size_t n, rows, cols, ndim;
    size_t dims[8];
    gcomp_layer_plan plan;
} layer;

/* Parses one line into *l; returns 0 (tensor), 1 (blank/comment) or -1 (bad, *why set). */
static int parse_line(char *line, layer *l, const char **why) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *tok = strtok(line, " \t\r\n");
    if (!tok) return 1;
    if (strlen(tok) >= sizeof l->name) {
        *why = "name longer than 127 characters";
        return -1;
    }
    strcpy(l->name, tok);
    l->ndim = 0;
    size_t n = 1;
    while ((tok = strtok(NULL, " \t\r\n"))) {
        char *end;
        errno = 0;
        unsigned long long d = strtoull(tok, &end, 10);
        if (!isdigit((unsigned char)tok[0]) || *end || errno || d == 0) {
            *why = "dimensions must be positive integers";
            return -1;
        }
        if (l->ndim == 8) {
            *why = "more than 8 dimensions";
            return -1;
        }
        if (n > UINT32_MAX / d) {
            *why = "more than 2^32-1 elements";
            return -1;
        }
        l->dims[l->ndim++] = (size_t)d;
        n *= (size_t)d;
    }
    if (l->ndim == 0) {
        *why = "expected `name d0 [d1 ...]`";
        return -1;
    }
    l->n = n;
    l->rows = l->ndim > 1 ? l->dims[0] : 0;
    l->cols = l->ndim > 1 ? n / l->dims[0] : 0;
    return 0;
}

static void shape_text(const layer *l, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < l->ndim && used < cap; i++) {
        int w = snprintf(out + used, cap - used, "%s%zu", i ? "x" : "", l->dims[i]);
        if (w < 0) return;
        used += (size_t)w;
    }
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

int cmd_plan_layers(int argc, char **argv) {
    const char *cmd = "plan-layers", *policy_text = NULL, *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!policy_text)
            policy_text = argv[i];
        else if (!path)
            path = argv[i];
        else
            return cli_fail(cmd, 2, "unexpected argument '%s'", argv[i]);
    }
    if (!policy_text || !path)
        return cli_fail(cmd, 2, "usage: gradcomp plan-layers POLICY FILE [--json]");
    gcomp_policy *pol;
    gcomp_error err;
    if (gcomp_policy_create(&pol, policy_text, &err) != GCOMP_OK)
        return cli_fail(cmd, 2, "%s", err.message);

    uint8_t *data;
    size_t len;
    if (cli_read_file(cmd, path, &data, &len)) {
        gcomp_policy_free(pol);
        return 1;
    }
    int rc = 1;
    layer *layers = NULL;
    size_t nl = 0, capl = 0;
    char *text = malloc(len + 1);
    if (!text) {
        cli_fail(cmd, 1, "out of memory");
        goto out;
    }
    memcpy(text, data, len);
    text[len] = 0;
    size_t lineno = 0;
    for (char *line = text; line;) {
        char *nl_at = strchr(line, '\n');
        if (nl_at) *nl_at = 0;
        lineno++;
        if (nl == capl) {
            capl = capl ? 2 * capl : 64;
            layer *nlayers = realloc(layers, capl * sizeof *layers);
            if (!nlayers) {
                cli_fail(cmd, 1, "out of memory");
                goto out;
            }
            layers = nlayers;
        }
        const char *why = NULL;
        int r = parse_line(line, &layers[nl], &why);
        if (r < 0) {
            cli_fail(cmd, 1, "%s:%zu: %s", path, lineno, why);
            goto out;
        }
        if (r == 0) {
            layer *l = &layers[nl];
            gcomp_tensor_desc t = {l->name, l->n, l->rows, l->cols};
            if (gcomp_policy_choose(pol, &t, &l->plan, &err) != GCOMP_OK) {
                cli_fail(cmd, 1, "%s:%zu: %s", path, lineno, err.message);
                goto out;
            }
            nl++;
        }
        line = nl_at ? nl_at + 1 : NULL;
    }
    if (nl == 0) {
        cli_fail(cmd, 1, "%s: no tensors listed", path);
        goto out;
    }

    double total_n = 0, total_b = 0, total_d = 0;
    int wname = 6, wspec = 4;
    for (size_t i = 0; i < nl; i++) {
        total_n += (double)layers[i].n;
        total_b += (double)layers[i].plan.bytes;
        total_d += (double)layers[i].plan.dense_bytes;
        int a = (int)strlen(layers[i].name), b = (int)strlen(layers[i].plan.spec);
        wname = a > wname ? a : wname;
        wspec = b > wspec ? b : wspec;
    }
    if (json) {
        printf("{\"policy\":");
        json_str(policy_text);
        printf(",\"tensors\":[");
        for (size_t i = 0; i < nl; i++) {
            const layer *l = &layers[i];
            char shape[160];
            shape_text(l, shape, sizeof shape);
            printf("%s{\"name\":", i ? "," : "");
            json_str(l->name);
            printf(",\"shape\":\"%s\",\"elements\":%zu,\"rule\":\"%s\",\"spec\":", shape, l->n,
                   l->plan.reason);
            json_str(l->plan.spec);
            printf(",\"bytes\":%zu,\"dense_bytes\":%zu}", l->plan.bytes, l->plan.dense_bytes);
        }
        printf("],\"elements\":%.0f,\"bytes\":%.0f,\"dense_bytes\":%.0f,\"ratio\":%.2f}\n", total_n,
               total_b, total_d, total_d / total_b);
    } else {
        printf("%-*s  %-14s %10s  %-8s  %-*s %12s %12s %8s\n", wname, "tensor", "shape", "elements",
               "rule", wspec, "spec", "bytes/step", "dense bytes", "ratio");
        for (size_t i = 0; i < nl; i++) {
            const layer *l = &layers[i];
            char shape[160];
            shape_text(l, shape, sizeof shape);
            printf("%-*s  %-14s %10zu  %-8s  %-*s %12zu %12zu %7.1fx\n", wname, l->name, shape,
                   l->n, l->plan.reason, wspec, l->plan.spec, l->plan.bytes, l->plan.dense_bytes,
                   (double)l->plan.dense_bytes / (double)l->plan.bytes);
        }
        printf("%-*s  %-14s %10.0f  %-8s  %-*s %12.0f %12.0f %7.1fx\n", wname, "total", "", total_n,
               "", wspec, "", total_b, total_d, total_d / total_b);
    }
    rc = 0;
out:
    free(layers);
    free(text);
    free(data);
    gcomp_policy_free(pol);
    return rc;
}

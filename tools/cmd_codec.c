/*
 * cmd_codec.c - encode, decode, inspect, verify, state, list-codecs.
 *
 * `encode --state FILE` makes a sequence of CLI calls a sequence of training steps: the
 * compressor state (residual, momentum, step) is loaded when the file exists and saved,
 * atomically, after a successful encode.  A state made with another spec or shape is
 * refused instead of silently restarted.
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Value of the option at argv[*i]; advances *i.  NULL (after printing why) if missing. */
static const char *need_value(const char *cmd, int *i, int argc, char **argv) {
    if (*i + 1 >= argc) {
        cli_fail(cmd, 2, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int status_fail(const char *cmd, const char *what, gcomp_status st) {
    return cli_fail(cmd, 1, "%s: %s", what, gcomp_status_str(st));
}

int cmd_encode(int argc, char **argv) {
    const char *cmd = "encode", *spec = NULL, *in = "-", *out = "-", *state = NULL, *seed = NULL,
               *shape = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "-c") || !strcmp(argv[i], "--codec") ? &spec
                            : !strcmp(argv[i], "-i")                              ? &in
                            : !strcmp(argv[i], "-o")                              ? &out
                            : !strcmp(argv[i], "--state")                         ? &state
                            : !strcmp(argv[i], "--seed")                          ? &seed
                            : !strcmp(argv[i], "--shape")                         ? &shape
                                                                                  : NULL;
        if (!slot) return cli_fail(cmd, 2, "unknown option '%s' (see gradcomp --help)", argv[i]);
        if (!(*slot = need_value(cmd, &i, argc, argv))) return 2;
    }
    if (!spec) return cli_fail(cmd, 2, "-c SPEC is required (gradcomp list-codecs shows them)");
    char full[1100];
    if (seed) {
        size_t s;
        if (cli_parse_count(seed, &s)) return cli_fail(cmd, 2, "--seed %s: not an integer", seed);
        snprintf(full, sizeof full, "%s%cseed=%s", spec, strchr(spec, ':') ? ',' : ':', seed);
    } else {
        snprintf(full, sizeof full, "%s", spec);
    }
    size_t rows = 0, cols = 0;
    if (shape && cli_parse_shape(shape, &rows, &cols))
        return cli_fail(cmd, 2, "--shape %s: expected ROWSxCOLS, e.g. 5000x5000", shape);

    uint8_t *raw;
    size_t len;
    if (cli_read_file(cmd, in, &raw, &len)) return 1;
    if (len == 0 || len % 4) {
        free(raw);
        return cli_fail(cmd, 1, "%s: %zu bytes is not a non-empty array of float32", in, len);
    }
    size_t n = len / 4;
    if (shape && rows * cols != n) {
        free(raw);
        return cli_fail(cmd, 1, "--shape %zux%zu holds %zu elements, the input has %zu", rows, cols,
                        rows * cols, n);
    }
    gcomp_compressor *c = NULL;
    gcomp_error err;
    gcomp_status st;
    struct stat sb;
    int rc = 1;
    if ((st = gcomp_compressor_create(&c, full, n, rows, cols, &err)) != GCOMP_OK) {
        rc = cli_fail(cmd, st == GCOMP_E_SPEC || st == GCOMP_E_UNKNOWN_CODEC ? 2 : 1, "%s",
                      err.message);
        goto done;
    }
    if (state && stat(state, &sb) == 0) {
        /* The saved state must be this call's: same canonical spec, size and shape (a
         * PowerSGD state for 100x200 is not one for 200x100).  gcomp_state_load checks all
         * three; from_state only describes the file when it does not match. */
        uint8_t *blob;
        size_t blen;
        if (cli_read_file(cmd, state, &blob, &blen)) goto done;
        st = gcomp_state_load(c, blob, blen);
        if (st == GCOMP_E_MISMATCH) {
            gcomp_compressor *saved = NULL;
            if (gcomp_compressor_from_state(&saved, blob, blen, NULL) != GCOMP_OK)
                cli_fail(cmd, 1, "%s: %s", state, gcomp_status_str(st));
            else if (!strcmp(gcomp_compressor_spec(saved), gcomp_compressor_spec(c)) &&
                     gcomp_compressor_size(saved) == n)
                cli_fail(cmd, 1,
                         "%s was saved for another matrix shape of these %zu elements than %s; "
                         "give the --shape it was saved with, or delete it to start afresh",
                         state, n, shape ? shape : "a vector (no --shape)");
            else
                cli_fail(cmd, 1,
                         "%s was saved by '%s' for %zu elements, not '%s' for %zu; use another "
                         "state file or delete it to start afresh",
                         state, gcomp_compressor_spec(saved), gcomp_compressor_size(saved),
                         gcomp_compressor_spec(c), n);
            gcomp_compressor_free(saved);
            free(blob);
            goto done;
        }
        free(blob);
        if (st != GCOMP_OK) {
            cli_fail(cmd, 1, "%s: %s", state, gcomp_status_str(st));
            goto done;
        }
    }
    size_t cap = gcomp_encode_bound(c), mlen;
    uint8_t *msg = malloc(cap);
    if (!msg) {
        cli_fail(cmd, 1, "out of memory (%zu bytes)", cap);
        goto done;
    }
    float *g = malloc(n * sizeof(float));
    if (!g) {
        free(msg);
        cli_fail(cmd, 1, "out of memory");
        goto done;
    }
    memcpy(g, raw, len); /* alignment */
    st = gcomp_encode(c, g, msg, cap, &mlen);
    free(g);
    if (st != GCOMP_OK) {
        free(msg);
        status_fail(cmd, in, st);
        goto done;
    }
    rc = cli_write_file(cmd, out, msg, mlen);
    free(msg);
    if (rc == 0 && state) {
        size_t sl = gcomp_state_bound(c), got;
        uint8_t *blob = malloc(sl);
        if (!blob || gcomp_state_save(c, blob, sl, &got) != GCOMP_OK)
            rc = cli_fail(cmd, 1, "cannot save state");
        else
            rc = cli_write_file(cmd, state, blob, got);
        free(blob);
    }
done:
    gcomp_compressor_free(c);
    free(raw);
    return rc;
}

int cmd_decode(int argc, char **argv) {
    const char *cmd = "decode", *in = "-", *out = "-";
    for (int i = 1; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "-i") ? &in : !strcmp(argv[i], "-o") ? &out : NULL;
        if (!slot) return cli_fail(cmd, 2, "unknown option '%s'", argv[i]);
        if (!(*slot = need_value(cmd, &i, argc, argv))) return 2;
    }
    uint8_t *msg;
    size_t len;
    if (cli_read_file(cmd, in, &msg, &len)) return 1;
    gcomp_message_info info;
    gcomp_status st = gcomp_message_inspect(msg, len, &info);
    /* Validate the whole message before allocating its n floats: a corrupt message whose
     * header claims billions of elements is corrupt, not out of memory. */
    if (st == GCOMP_OK) st = gcomp_decode_add(msg, len, NULL, 0, 1.0f);
    if (st != GCOMP_OK) {
        free(msg);
        return status_fail(cmd, in, st);
    }
    float *acc = calloc(info.n, sizeof(float));
    if (!acc) {
        free(msg);
        return cli_fail(cmd, 1, "out of memory for %llu elements", (unsigned long long)info.n);
    }
    st = gcomp_decode_add(msg, len, acc, info.n, 1.0f);
    free(msg);
    int rc = st == GCOMP_OK ? cli_write_file(cmd, out, acc, info.n * sizeof(float))
                            : status_fail(cmd, in, st);
    free(acc);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    const char *cmd = "inspect";
    if (argc != 2) return cli_fail(cmd, 2, "usage: gradcomp inspect FILE");
    uint8_t *msg;
    size_t len;
    if (cli_read_file(cmd, argv[1], &msg, &len)) return 1;
    gcomp_message_info info;
    gcomp_status st = gcomp_message_inspect(msg, len, &info);
    if (st == GCOMP_OK) st = gcomp_decode_add(msg, len, NULL, 0, 1.0f);
    free(msg);
    if (st != GCOMP_OK) return status_fail(cmd, argv[1], st);
    printf("file           %s\n", argv[1]);
    printf("format         version %u, %d-byte header\n", info.format_version, GCOMP_HEADER_SIZE);
    printf("codec          %s (id %u)\n", info.codec_name, info.codec_id);
    printf("flags          0x%08x\n", info.flags);
    printf("elements       %llu (%llu bytes as float32)\n", (unsigned long long)info.n,
           (unsigned long long)info.n * 4);
    printf("sent           %llu values (%.4g%%)\n", (unsigned long long)info.elements_sent,
           100.0 * (double)info.elements_sent / (double)info.n);
    if (*info.index_coding) printf("indices        %s\n", info.index_coding);
    if (*info.value_coding) printf("values         %s\n", info.value_coding);
    printf("message        %zu bytes (payload %u)\n", len, info.payload_len);
    printf("ratio          %.2fx\n", 4.0 * (double)info.n / (double)len);
    printf("fingerprint    %016llx\n", (unsigned long long)info.fingerprint);
    printf("payload crc32c %08x (ok)\n", info.payload_crc);
    return 0;
}

int cmd_verify(int argc, char **argv) {
    const char *cmd = "verify";
    if (argc < 2) return cli_fail(cmd, 2, "usage: gradcomp verify FILE...");
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        uint8_t *msg;
        size_t len;
        if (cli_read_file(cmd, argv[i], &msg, &len)) {
            bad++;
            continue;
        }
        gcomp_message_info info;
        gcomp_status st = gcomp_message_inspect(msg, len, &info);
        if (st == GCOMP_OK) st = gcomp_decode_add(msg, len, NULL, 0, 1.0f);
        free(msg);
        if (st == GCOMP_OK) {
            printf("%s: ok (%s, %llu elements, %zu bytes)\n", argv[i], info.codec_name,
                   (unsigned long long)info.n, len);
        } else {
            printf("%s: INVALID: %s\n", argv[i], gcomp_status_str(st));
            bad++;
        }
    }
    if (bad) return cli_fail(cmd, 1, "%d of %d messages invalid", bad, argc - 1);
    return 0;
}

int cmd_state(int argc, char **argv) {
    const char *cmd = "state", *file = NULL, *resid_out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--residual")) {
            if (!(resid_out = need_value(cmd, &i, argc, argv))) return 2;
        } else if (!file && argv[i][0] != '-') {
            file = argv[i];
        } else {
            return cli_fail(cmd, 2, "usage: gradcomp state FILE [--residual OUT]");
        }
    }
    if (!file) return cli_fail(cmd, 2, "usage: gradcomp state FILE [--residual OUT]");
    uint8_t *blob;
    size_t len;
    if (cli_read_file(cmd, file, &blob, &len)) return 1;
    gcomp_compressor *c;
    gcomp_error err;
    gcomp_status st = gcomp_compressor_from_state(&c, blob, len, &err);
    free(blob);
    if (st != GCOMP_OK) return cli_fail(cmd, 1, "%s: %s", file, err.message);
    size_t n = gcomp_compressor_size(c);
    const float *r = gcomp_compressor_residual(c);
    float *formed = NULL; /* PowerSGD keeps its residual factored: form it */
    if (!r && (formed = malloc(n * sizeof(float))) != NULL) {
        if (gcomp_lowrank_residual(c, formed) == GCOMP_OK) {
            r = formed;
        } else {
            free(formed);
            formed = NULL;
        }
    }
    printf("spec           %s\n", gcomp_compressor_spec(c));
    printf("elements       %zu\n", n);
    printf("step           %llu\n", (unsigned long long)gcomp_compressor_step(c));
    printf("state          %zu bytes\n", len);
    int rc = 0;
    if (r) {
        double s2 = 0, mx = 0;
        size_t nz = 0;
        for (size_t i = 0; i < n; i++) {
            s2 += (double)r[i] * r[i];
            mx = fabs(r[i]) > mx ? fabs(r[i]) : mx;
            nz += r[i] != 0;
        }
        printf("residual       L2 %.6g, max |r| %.6g, %zu non-zero\n", sqrt(s2), mx, nz);
        if (resid_out) rc = cli_write_file(cmd, resid_out, r, n * sizeof(float));
    } else {
        printf("residual       none (feedback=none)\n");
        if (resid_out) rc = cli_fail(cmd, 1, "this state keeps no residual");
    }
    free(formed);
    gcomp_compressor_free(c);
    return rc;
}

static const char *type_name(gcomp_param_type t) {
    return t == GCOMP_PARAM_INT     ? "int"
           : t == GCOMP_PARAM_FLOAT ? "float"
           : t == GCOMP_PARAM_ENUM  ? "enum"
                                    : "bool";
}

static void json_str(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void print_params(const gcomp_param_info *p, size_t n, bool json) {
    for (size_t j = 0; j < n; j++) {
        if (json) {
            printf("%s{\"name\":", j ? "," : "");
            json_str(p[j].name);
            printf(",\"type\":\"%s\",\"min\":%.17g,\"max\":%.17g,\"min_exclusive\":%s,\"default\":",
                   type_name(p[j].type), p[j].min, p[j].max, p[j].min_exclusive ? "true" : "false");
            json_str(p[j].deflt);
            printf(",\"choices\":");
            if (p[j].choices)
                json_str(p[j].choices);
            else
                printf("null");
            printf(",\"help\":");
            json_str(p[j].help);
            printf("}");
        } else {
            char range[96];
            if (p[j].type == GCOMP_PARAM_ENUM)
                snprintf(range, sizeof range, "%s", p[j].choices);
            else if (p[j].type == GCOMP_PARAM_BOOL)
                snprintf(range, sizeof range, "0|1");
            else
                snprintf(range, sizeof range, "%c%g, %g]", p[j].min_exclusive ? '(' : '[', p[j].min,
                         p[j].max);
            printf("    %-12s %-5s %-26s default %-8s %s\n", p[j].name, type_name(p[j].type), range,
                   p[j].deflt, p[j].help);
        }
    }
}

int cmd_list_codecs(int argc, char **argv) {
    bool json = argc > 1 && !strcmp(argv[1], "--json");
    if (argc > 2 || (argc == 2 && !json))
        return cli_fail("list-codecs", 2, "usage: gradcomp list-codecs [--json]");
    size_t ncommon;
    const gcomp_param_info *common = gcomp_common_params(&ncommon);
    if (json) printf("{\"codecs\":[");
    for (size_t i = 0; i < gcomp_codec_count(); i++) {
        const gcomp_codec_info *c = gcomp_codec_at(i);
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            json_str(c->name);
            printf(",\"id\":%u,\"flags\":%u,\"help\":", c->id, c->flags);
            json_str(c->help);
            printf(",\"params\":[");
            print_params(c->params, c->nparams, true);
            printf("]}");
        } else {
            printf("%s (id %u)%s%s%s%s\n  %s\n", c->name, c->id,
                   c->flags & GCOMP_CODEC_SPARSE ? " sparse" : "",
                   c->flags & GCOMP_CODEC_LINEAR ? " linear" : "",
                   c->flags & GCOMP_CODEC_STOCHASTIC ? " stochastic" : "",
                   c->flags & GCOMP_CODEC_QUANTIZER ? " quantizer" : "", c->help);
            print_params(c->params, c->nparams, false);
        }
    }
    if (json) {
        printf("],\"common\":[");
        print_params(common, ncommon, true);
        printf("],\"feedback\":[");
    } else {
        printf("\nevery codec also takes:\n");
        print_params(common, ncommon, false);
        printf("\nfeedback stages (feedback=NAME; each adds its keys to the spec):\n");
    }
    for (size_t i = 0; i < gcomp_feedback_count(); i++) {
        const gcomp_feedback_info *f = gcomp_feedback_at(i);
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            json_str(f->name);
            printf(",\"help\":");
            json_str(f->help);
            printf(",\"params\":[");
            print_params(f->params, f->nparams, true);
            printf("]}");
        } else {
            printf("%s\n  %s\n", f->name, f->help);
            print_params(f->params, f->nparams, false);
        }
    }
    if (json) printf("]}\n");
    return 0;
}

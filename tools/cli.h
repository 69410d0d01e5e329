/*
 * cli.h - what the gradcomp CLI's command files share.  Each command is
 * `int cmd_NAME(int argc, char **argv)` (argv[0] is the command name) returning the
 * process exit status: 0 success, 1 a failure of the data (corrupt message, ...),
 * 2 a usage error.  Commands print errors to stderr as "gradcomp CMD: what went wrong".
 */
#ifndef GCOMP_CLI_H
#define GCOMP_CLI_H

#include "gradcomp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *synopsis;
} cli_command;

int cmd_encode(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_state(int argc, char **argv);
int cmd_list_codecs(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_plan_layers(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* Reads a whole file ("-" = stdin) into a malloc'd buffer.  Returns 0 or prints why. */
int cli_read_file(const char *cmd, const char *path, uint8_t **data, size_t *len);
/* Writes len bytes to path ("-" = stdout), atomically (temp file + rename) for files. */
int cli_write_file(const char *cmd, const char *path, const void *data, size_t len);
/* "25000000", "25M", "2.5e7", "64k" -> count.  Returns 0 on success. */
int cli_parse_count(const char *s, size_t *out);
/* "5000x5000" -> rows, cols. */
int cli_parse_shape(const char *s, size_t *rows, size_t *cols);
/* Prints "gradcomp CMD: message" to stderr; returns `code`. */
int cli_fail(const char *cmd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A link rate as tc writes it ("100mbit", "1gbit", "2.5gbit", "10g", bare bit/s) -> bits
 * per second; 0 when it is not one. */
double cli_parse_rate(const char *s);
/* The calibration file `gradcomp plan` and `train` read by default: $GRADCOMP_CALIBRATION,
 * else $XDG_CACHE_HOME/gradcomp/calibration.txt, else ~/.cache/gradcomp/calibration.txt. */
const char *cli_default_calibration(char *buf, size_t cap);
/* Reads a calibration (*cal NULL when a default path does not exist); 0 or prints why. */
int cli_load_calibration(const char *cmd, const char *path, bool explicit_path,
                         gcomp_cost_calibration **cal);
/* Runs gnuplot on SCRIPT.  Returns 0, or says why it drew nothing, "gnuplot is not
 * installed" only when the shell could not find it (else gnuplot's own message is above
 * ours), followed by KEPT (what was written all the same), and returns 1. */
int cli_gnuplot(const char *cmd, const char *script, const char *kept);
/* Seconds from a monotonic clock. */
double cli_now(void);
/* Seeded synthetic gradient: Gaussian with a heavy tail (every 97th element x20). */
void cli_synthetic_gradient(float *x, size_t n, uint64_t seed, uint64_t step);

#endif

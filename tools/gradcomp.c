/*
 * gradcomp.c - the command-line front end: dispatch and help.  Each command lives in its
 * own file and uses only the public headers (as zstd's programs/ does).
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#ifdef GCOMP_CLI_MPI
int cmd_allreduce_bench(int argc, char **argv);
#endif
#ifdef GCOMP_CLI_TRAIN
int cmd_train(int argc, char **argv);
#endif

static const cli_command commands[] = {
    {"encode", cmd_encode,
     "encode -c SPEC [-i IN] [-o OUT] [--shape RxC] [--state FILE] [--seed S]"},
    {"decode", cmd_decode, "decode [-i IN] [-o OUT]       (writes dense float32)"},
    {"inspect", cmd_inspect, "inspect FILE                 (header fields, counts, ratio)"},
    {"verify", cmd_verify, "verify FILE...               (exit 0 only if every message is valid)"},
    {"state", cmd_state, "state FILE [--residual OUT]  (summarise a saved compressor state)"},
    {"list-codecs", cmd_list_codecs, "list-codecs [--json]         (codecs and their parameters)"},
    {"bench", cmd_bench, "bench -c SPEC -n N [--shape RxC] [--runs R] [--pairs] [--json]"},
    {"plan-layers", cmd_plan_layers,
     "plan-layers POLICY FILE [--json]   (spec per tensor, bytes/step)"},
    {"plan", cmd_plan,
     "plan [--model M|FILE] [--compare SPEC,...] [--workers P,...] [--link RATE] [--json] "
     "[--plot F.png]  (predicted step time; --calibrate measures this machine)"},
#ifdef GCOMP_CLI_MPI
    {"allreduce-bench", cmd_allreduce_bench,
     "allreduce-bench -c SPEC -n N [--shape RxC] [--strategy S] [--runs R] [--retune SPEC2] "
     "[--json]  "
     "(under "
     "mpirun)"},
#endif
#ifdef GCOMP_CLI_TRAIN
    {"train", cmd_train, "train [--np P] [--model M] [--compare SPEC,...] [--link RATE] ..."},
#endif
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "gradcomp %s - gradient compression for data-parallel training\n\nusage:\n",
            gcomp_version());
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  gradcomp %s\n", commands[i].synopsis);
    fprintf(f, "\nFiles are raw little-endian float32; '-' is stdin/stdout.\n"
               "SPEC is name[:key=value,...], e.g. topk:density=0.001,values=f16,feedback=ef\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("gradcomp %s (wire format %d)\n", gcomp_version(), GCOMP_FORMAT_VERSION);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "gradcomp: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

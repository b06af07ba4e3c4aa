/* main.c — the `comet` command: dispatches to one subcommand per file; `comet --version`
 * prints the version, the git commit it was configured at and whether CUDA is built in. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"generate", cmd_generate, "generate text from a prompt (chat template applied)"},
    {"perplexity", cmd_perplexity,
     "perplexity of a model on a text file (docs/numerics.md protocol)"},
    {"quantize", cmd_quantize,
     "quantize a model with FMPQ (W4Ax, KV4) into a checkpoint directory"},
    {"bench", cmd_bench, "prefill / decode speed of a model and one decode step per op"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (continuous batching, SSE streaming)"},
};

#ifndef COMET_VERSION /* set by CMakeLists.txt */
#define COMET_VERSION "unknown"
#endif
#ifndef COMET_GIT_COMMIT
#define COMET_GIT_COMMIT "unknown"
#endif
#ifdef COMET_HAVE_CUDA
#define COMET_CUDA_BUILT "yes"
#else
#define COMET_CUDA_BUILT "no"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: comet <command> [options]   (comet <command> --help for details)\n"
               "       comet --version\n\n"
               "Every command that runs a model does so on the CPU unless --device cuda[:N]\n"
               "asks for a GPU.\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-12s %s\n", subcommands[i].name, subcommands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("comet %s (commit %s), CUDA backend: %s\n", COMET_VERSION, COMET_GIT_COMMIT,
               COMET_CUDA_BUILT);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name))
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "comet: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

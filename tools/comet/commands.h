/* commands.h — the comet CLI's subcommands and shared command-line helpers.
 * tools/ is the only layer that prints results to stdout or calls exit(). */
#ifndef COMET_TOOLS_COMMANDS_H
#define COMET_TOOLS_COMMANDS_H

#include <stddef.h>
#include <stdio.h>

#include "comet/sampling.h"

/* Each subcommand gets argv with argv[0] = the subcommand name; returns the exit code. */
int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Path of the bundled default model (SmolLM2-135M-Instruct Q4_1 GGUF), looked up in
 * $COMET_MODELS_DIR, then models/ beside the build directory of this executable, then
 * ./models. Returns a static string; the file may not exist (the caller reports it). */
const char *cli_default_model(void);

/* Route library logs to stderr: progress lines rewrite themselves on a terminal.
 * verbose: also COMET_LOG_DEBUG. */
void cli_log_to_stderr(int verbose);

/* Print "comet <cmd>: <message>" from comet_last_error() (or `what` if empty) to stderr. */
void cli_report_error(const char *cmd, const char *what);

/* Parse a decimal int/float option value; on failure print a one-line error naming the
 * option and return non-zero. */
int cli_parse_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out);
int cli_parse_float(const char *cmd, const char *opt, const char *val, double lo, double hi,
                    double *out);

/* Parse --gpu-memory-fraction's value into *out: a number in (0, 1], the share of the GPU's
 * memory comet may use in all. On failure print one line naming the option, the range and
 * the value, and return non-zero. */
int cli_parse_fraction(const char *cmd, const char *opt, const char *val, double *out);

/* The sampling options generate and serve share, into a comet_sampler_params with a
 * "given" mask: --temperature, --top-k, --top-p, --min-p, --repeat-penalty,
 * --repeat-last-n, --presence-penalty, --frequency-penalty and --logit-bias ID=BIAS
 * (repeatable). The ranges are comet_sampler_params_check's, checked once all options are
 * read (cli_sampling_check). */
typedef struct cli_sampling {
    comet_sampler_params p; /* p.logit_bias points at `bias` */
    unsigned given;         /* COMET_SAMPLER_* bits of the options given */
    comet_logit_bias bias[COMET_SAMPLER_MAX_BIASED];
} cli_sampling;

/* s->p = defaults, nothing given. */
void cli_sampling_init(cli_sampling *s, const comet_sampler_params *defaults);

/* 1 when `opt` is a sampling option, read with its value `val` (the caller skips val);
 * 0 when it is not one; -1 when its value is malformed (printed, naming the option). */
int cli_sampling_option(const char *cmd, cli_sampling *s, const char *opt, const char *val);

/* 0 when s->p is in range (logit_bias ids against n_vocab, 0: not known yet), else prints
 * "comet <cmd>: --<option>: <what is wrong>" and returns 1. */
int cli_sampling_check(const char *cmd, const cli_sampling *s, int n_vocab);

/* Print the sampling options' --help lines, their descriptions starting at column
 * `width` (generate's 23, serve's 25); last_n_default: --repeat-last-n's default, in words. */
void cli_sampling_usage(FILE *f, int width, const char *last_n_default);

/* Read a whole file into a malloc'd buffer (not NUL-terminated) owned by the caller; its
 * size in *len. NULL with errno set when it cannot be opened or read. */
char *cli_read_file(const char *path, size_t *len);

/* 0 when `device` names a backend comet_backend_open knows (cpu, cuda, cuda:N), else prints
 * "comet <cmd>: --device ..." and returns 1: checked before the model loads. */
int cli_device_ok(const char *cmd, const char *device);

/* 0 when host:port can be bound and listened on now (port 0 always can), else prints
 * "comet <cmd>: cannot listen on ..." naming the reason and returns 1: serve checks this
 * before it spends seconds loading a model. The port is released again at once, so a
 * race with another process remains possible; the server's own bind reports that. */
int cli_port_free(const char *cmd, const char *host, int port);

/* The backend for `device` with n_threads CPU threads in all (split between the ranks when
 * tensor_parallel > 0: comet_backend_rank_threads), batch-invariant when batch_invariant
 * (comet/backend.h), or NULL after printing why. */
struct comet_backend;
/* comet_model_load_with for a command running on `device`: a quantized checkpoint keeps
 * only its codes (keep_codes_only) where the threaded CPU backend runs it on integers
 * (device "cpu", no --simulate, no tensor parallelism). Returns comet_model_load's status. */
struct comet_model;
int cli_load_model(const char *path, const char *device, int simulate, int tensor_parallel,
                   struct comet_model **out);

struct comet_backend *cli_open_backend(const char *cmd, const char *device, int n_threads,
                                       int tensor_parallel, int batch_invariant);

#endif

/* cli.c — helpers shared by the subcommands: default model path, logging, option parsing. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netdb.h>
#include <sys/socket.h>

#include "comet/backend.h"
#include "comet/model.h"
#include "comet/log.h"
#include "comet/status.h"
#include "commands.h"

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

const char *cli_default_model(void) {
    static char path[PATH_MAX + 64];
    const char *dir = getenv("COMET_MODELS_DIR");
    if (dir && dir[0]) {
        snprintf(path, sizeof path, "%s/%s", dir, DEFAULT_MODEL_FILE);
        return path;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            /* build/comet -> <repo>/models; also <prefix>/bin/comet -> <prefix>/models */
            snprintf(path, sizeof path, "%s/../models/%s", exe, DEFAULT_MODEL_FILE);
            if (file_exists(path))
                return path;
            snprintf(path, sizeof path, "%s/models/%s", exe, DEFAULT_MODEL_FILE);
            if (file_exists(path))
                return path;
        }
    }
    snprintf(path, sizeof path, "models/%s", DEFAULT_MODEL_FILE);
    return path;
}

static int progress_open; /* a tty progress line is on screen without its newline */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* On a terminal a progress line rewrites itself; into a file or pipe, progress lines are
 * thinned to one every 2 s plus the final (100%) one, so logs stay readable. */
static void stderr_sink(comet_log_level level, int progress, const char *msg, void *user) {
    (void)user;
    static double last_progress = -1e9;
    int tty = isatty(2);
    if (progress && tty) {
        fprintf(stderr, "\r\033[K%s", msg);
        progress_open = 1;
        return;
    }
    if (progress) {
        double t = now_s();
        if (t - last_progress < 2.0 && !strstr(msg, "(100%)"))
            return;
        last_progress = t;
    }
    if (progress_open) {
        fputc('\n', stderr);
        progress_open = 0;
    }
    fprintf(stderr, "%s%s\n",
            level >= COMET_LOG_ERROR  ? "error: "
            : level == COMET_LOG_WARN ? "warning: "
                                      : "",
            msg);
}

void cli_log_to_stderr(int verbose) {
    comet_log_set(stderr_sink, NULL, verbose ? COMET_LOG_DEBUG : COMET_LOG_INFO);
}

void cli_report_error(const char *cmd, const char *what) {
    const char *msg = comet_last_error();
    if (progress_open) {
        fputc('\n', stderr);
        progress_open = 0;
    }
    if (!msg || !msg[0])
        msg = what;
    size_t n = strlen(cmd); /* "perplexity: ..." from the library: don't repeat the command */
    if (!strncmp(msg, cmd, n) && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    fprintf(stderr, "comet %s: %s\n", cmd, msg);
}

int cli_parse_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out) {
    if (!val) {
        fprintf(stderr, "comet %s: %s needs a value\n", cmd, opt);
        return 1;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        fprintf(stderr, "comet %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo,
                hi, val);
        return 1;
    }
    *out = v;
    return 0;
}

/* *v = val as a whole decimal number; 0 when val is one, 1 when not (no message) */
static int parse_double(const char *val, double *v) {
    char *end;
    errno = 0;
    *v = strtod(val, &end);
    return errno || end == val || *end;
}

int cli_parse_float(const char *cmd, const char *opt, const char *val, double lo, double hi,
                    double *out) {
    if (!val) {
        fprintf(stderr, "comet %s: %s needs a value\n", cmd, opt);
        return 1;
    }
    double v;
    if (parse_double(val, &v) || !(v >= lo && v <= hi)) {
        fprintf(stderr, "comet %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi,
                val);
        return 1;
    }
    *out = v;
    return 0;
}

int cli_parse_fraction(const char *cmd, const char *opt, const char *val, double *out) {
    if (!val) {
        fprintf(stderr, "comet %s: %s needs a value\n", cmd, opt);
        return 1;
    }
    double v;
    if (parse_double(val, &v) || !(v > 0.0 && v <= 1.0)) {
        fprintf(stderr,
                "comet %s: %s expects a number in (0, 1], the share of the GPU's memory comet "
                "may use (e.g. 0.9), got '%s'\n",
                cmd, opt, val);
        return 1;
    }
    *out = v;
    return 0;
}

void cli_sampling_init(cli_sampling *s, const comet_sampler_params *defaults) {
    s->p = *defaults;
    s->p.logit_bias = s->bias;
    s->p.n_logit_bias = 0;
    s->given = 0;
}

static const struct {
    const char *opt;
    unsigned bit;
} SAMPLING_OPTS[] = {
    {"--temperature", COMET_SAMPLER_TEMPERATURE},
    {"--top-k", COMET_SAMPLER_TOP_K},
    {"--top-p", COMET_SAMPLER_TOP_P},
    {"--min-p", COMET_SAMPLER_MIN_P},
    {"--repeat-penalty", COMET_SAMPLER_REPEAT_PENALTY},
    {"--repeat-last-n", COMET_SAMPLER_REPEAT_LAST_N},
    {"--presence-penalty", COMET_SAMPLER_PRESENCE_PENALTY},
    {"--frequency-penalty", COMET_SAMPLER_FREQUENCY_PENALTY},
    {"--logit-bias", COMET_SAMPLER_LOGIT_BIAS},
};

int cli_sampling_option(const char *cmd, cli_sampling *s, const char *opt, const char *val) {
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof SAMPLING_OPTS / sizeof SAMPLING_OPTS[0] && !bit; i++)
        if (!strcmp(opt, SAMPLING_OPTS[i].opt))
            bit = SAMPLING_OPTS[i].bit;
    if (!bit)
        return 0;
    comet_sampler_params *p = &s->p;
    long lv;
    double dv;
    if (bit == COMET_SAMPLER_TOP_K || bit == COMET_SAMPLER_REPEAT_LAST_N) {
        if (cli_parse_int(cmd, opt, val, -(1L << 30), 1L << 30, &lv)) /* ranges: below */
            return -1;
        *(bit == COMET_SAMPLER_TOP_K ? &p->top_k : &p->repeat_last_n) = (int)lv;
    } else if (bit == COMET_SAMPLER_LOGIT_BIAS) {
        char *eq = NULL, *end = NULL;
        long id = val ? strtol(val, &eq, 10) : 0;
        if (!val || eq == val || *eq != '=' || id < INT32_MIN || id > INT32_MAX ||
            (dv = strtod(eq + 1, &end), end == eq + 1 || *end)) {
            fprintf(stderr, "comet %s: %s expects ID=BIAS (a token id and a number), got '%s'\n",
                    cmd, opt, val ? val : "");
            return -1;
        }
        if (p->n_logit_bias == COMET_SAMPLER_MAX_BIASED) {
            fprintf(stderr, "comet %s: at most %d %s options\n", cmd, COMET_SAMPLER_MAX_BIASED,
                    opt);
            return -1;
        }
        s->bias[p->n_logit_bias++] = (comet_logit_bias){(int32_t)id, (float)dv};
    } else {
        char *end = NULL;
        dv = val ? strtod(val, &end) : 0;
        if (!val || end == val || *end || !isfinite(dv)) {
            fprintf(stderr, "comet %s: %s expects a number, got '%s'\n", cmd, opt, val ? val : "");
            return -1;
        }
        float *f = bit == COMET_SAMPLER_TEMPERATURE        ? &p->temperature
                   : bit == COMET_SAMPLER_TOP_P            ? &p->top_p
                   : bit == COMET_SAMPLER_MIN_P            ? &p->min_p
                   : bit == COMET_SAMPLER_REPEAT_PENALTY   ? &p->repeat_penalty
                   : bit == COMET_SAMPLER_PRESENCE_PENALTY ? &p->presence_penalty
                                                           : &p->frequency_penalty;
        *f = (float)dv;
    }
    s->given |= bit;
    return 1;
}

void cli_sampling_usage(FILE *f, int width, const char *last_n_default) {
    char last_n[128];
    snprintf(last_n, sizeof last_n, "tokens the penalties look back over, -1 = all (default %s)",
             last_n_default);
    const char *const lines[][2] = {
        {"--temperature T", "0 = greedy, up to 2 (default 0.8)"},
        {"--top-k K", "0 = off (default 40)"},
        {"--top-p P", "nucleus sampling, in (0, 1]; 1 = off (default 0.95)"},
        {"--min-p P", "in [0, 1]; 0 = off (default 0.05)"},
        {"--repeat-penalty R", "> 0; 1 = off (default 1)"},
        {"--repeat-last-n N", last_n},
        {"--presence-penalty P", "OpenAI-style, in [-2, 2]; 0 = off"},
        {"--frequency-penalty P", "OpenAI-style, in [-2, 2]; 0 = off"},
        {"--logit-bias ID=B", "add B in [-100, 100] to token ID's logit (-100 bans it);"},
        {"", "may repeat"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if ((int)strlen(lines[i][0]) < width - 3)
            fprintf(f, "  %-*s%s\n", width - 2, lines[i][0], lines[i][1]);
        else /* the description on a line of its own */
            fprintf(f, "  %s\n%*s%s\n", lines[i][0], width, "", lines[i][1]);
    }
}

int cli_sampling_check(const char *cmd, const cli_sampling *s, int n_vocab) {
    unsigned bad;
    if (comet_sampler_params_check(&s->p, n_vocab, &bad) >= 0)
        return 0;
    const char *opt = "?";
    for (size_t i = 0; i < sizeof SAMPLING_OPTS / sizeof SAMPLING_OPTS[0]; i++)
        if (SAMPLING_OPTS[i].bit == bad)
            opt = SAMPLING_OPTS[i].opt;
    fprintf(stderr, "comet %s: %s: %s\n", cmd, opt, comet_last_error());
    return 1;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
            }
            break;
        }
        char *nb = realloc(buf, cap *= 2);
        if (!nb)
            free(buf);
        buf = nb;
    }
    int e = errno;
    fclose(f);
    errno = e;
    *len = n;
    return buf;
}

int cli_device_ok(const char *cmd, const char *device) {
    if (!strcmp(device, "cpu") || !strcmp(device, "cuda"))
        return 0;
    if (!strncmp(device, "cuda:", 5) && device[5] >= '0' && device[5] <= '9' &&
        strspn(device + 5, "0123456789") == strlen(device + 5))
        return 0;
    fprintf(stderr, "comet %s: --device '%s' is not one of cpu, cuda, cuda:N\n", cmd, device);
    return 1;
}

int cli_load_model(const char *path, const char *device, int simulate, int tensor_parallel,
                   comet_model **out) {
    comet_model_load_params p = comet_model_default_load_params();
    p.keep_codes_only = device && !strcmp(device, "cpu") && !simulate && tensor_parallel <= 1;
    return comet_model_load_with(path, &p, out);
}

comet_backend *cli_open_backend(const char *cmd, const char *device, int n_threads,
                                int tensor_parallel, int batch_invariant) {
    comet_backend *be =
        comet_backend_open(device, comet_backend_rank_threads(n_threads, tensor_parallel));
    if (!be) {
        char what[96];
        snprintf(what, sizeof what, "cannot start the %s backend", device);
        cli_report_error(cmd, what);
        return NULL;
    }
    comet_backend_set_batch_invariant(be, batch_invariant);
    return be;
}

int cli_port_free(const char *cmd, const char *host, int port) {
    if (port == 0)
        return 0;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "comet %s: --host '%s': %s\n", cmd, host, gai_strerror(gai));
        return 1;
    }
    int err = 0;
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd < 0) {
        err = errno;
    } else {
        /* as the HTTP server binds: a port left in TIME_WAIT by an earlier run is free */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1) != 0)
            err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (err) {
        fprintf(stderr, "comet %s: cannot listen on %s port %d: %s%s\n", cmd, host, port,
                strerror(err),
                err == EADDRINUSE ? " (another server runs there? pick another "
                                    "--port, or 0 for a free one)"
                                  : "");
        return 1;
    }
    return 0;
}

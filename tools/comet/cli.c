/* cli.c — helpers shared by the subcommands: default model path, logging, option parsing. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
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

int cli_parse_float(const char *cmd, const char *opt, const char *val, double lo, double hi,
                    double *out) {
    if (!val) {
        fprintf(stderr, "comet %s: %s needs a value\n", cmd, opt);
        return 1;
    }
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "comet %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi,
                val);
        return 1;
    }
    *out = v;
    return 0;
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

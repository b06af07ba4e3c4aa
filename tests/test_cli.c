/* test_cli.c — the comet binary ($COMET_BIN) on bad input: empty prompt, a prompt longer
 * than the context, a missing model, an unreadable text file, an unknown device, each a
 * one-line error on stderr naming the problem (after at most some loading progress),
 * nothing on stdout, non-zero exit; and
 * --help on each subcommand. Cases that need the default model load it from
 * $COMET_SOURCE_DIR/models (fetched by the setup script). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define MODEL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char tmpdir[256];

typedef struct {
    int rc;
    char out[8192];
    char err[8192];
} result;

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Run `$COMET_BIN <args>` (args already shell-quoted) with stdout and stderr captured. */
static void run(const char *args, result *r) {
    const char *bin = getenv("COMET_BIN");
    assert_non_null(bin);
    size_t cap = strlen(args) + 1024;
    char *cmd = malloc(cap);
    snprintf(cmd, cap, "'%s' %s >'%s/out' 2>'%s/err' </dev/null", bin, args, tmpdir, tmpdir);
    int st = system(cmd);
    free(cmd);
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    char p[512];
    snprintf(p, sizeof p, "%s/out", tmpdir);
    slurp(p, r->out, sizeof r->out);
    snprintf(p, sizeof p, "%s/err", tmpdir);
    slurp(p, r->err, sizeof r->err);
}

/* The error is one line starting with "comet <cmd>:", the last line on stderr (lines
 * before it can only be progress/info from loading the model, never another error), and
 * nothing is on stdout. */
static void assert_one_line_error(const result *r, const char *cmd, const char *needle) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "comet %s: ", cmd);
    size_t len = strlen(r->err);
    const char *last = r->err;
    for (const char *p = r->err; len && p < r->err + len - 1; p++)
        if (*p == '\n')
            last = p + 1;
    int n_errors = 0;
    for (const char *p = r->err; (p = strstr(p, "comet ")); p++)
        n_errors += p == r->err || p[-1] == '\n';
    int ok = r->rc != 0 && len && r->err[len - 1] == '\n' &&
             !strncmp(last, prefix, strlen(prefix)) && strstr(last, needle) && n_errors == 1 &&
             !strstr(r->err, "error:") && !r->out[0];
    if (!ok)
        fprintf(stderr, "rc %d, stdout '%s', stderr '%s' (wanted '%s')\n", r->rc, r->out, r->err,
                needle);
    assert_true(ok);
}

static const char *model_path(void) {
    static char p[4096];
    const char *src = getenv("COMET_SOURCE_DIR");
    snprintf(p, sizeof p, "%s/%s", src ? src : ".", MODEL_FILE);
    return p;
}

static void test_empty_prompt(void **state) {
    result r;
    run("generate --prompt ''", &r);
    assert_one_line_error(&r, "generate", "empty");
}

static void test_missing_model(void **state) {
    result r;
    run("generate --model /nonexistent/dir/model.gguf --prompt hi", &r);
    assert_one_line_error(&r, "generate", "/nonexistent/dir/model.gguf");
    run("perplexity --model /nonexistent/dir/model.gguf --text /etc/hostname", &r);
    assert_one_line_error(&r, "perplexity", "/nonexistent/dir/model.gguf");
}

static void test_unreadable_text(void **state) {
    result r;
    run("perplexity --text /nonexistent/text.txt", &r);
    assert_one_line_error(&r, "perplexity", "/nonexistent/text.txt");
}

static void test_cuda_device(void **state) {
    result r;
    run("generate --prompt hi --device cuda", &r);
    assert_one_line_error(&r, "generate", "cuda");
    run("generate --prompt hi --device tpu", &r);
    assert_one_line_error(&r, "generate", "tpu");
}

static void test_bad_option_values(void **state) {
    result r;
    run("generate --prompt hi --top-p 2", &r);
    assert_one_line_error(&r, "generate", "--top-p");
    run("perplexity --text x --ctx 1", &r);
    assert_one_line_error(&r, "perplexity", "--ctx");
    /* --tensor-parallel N: N >= 1 ranks (0, one device, is the default when not given) */
    run("generate --prompt hi --tensor-parallel 0", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "generate",
                          "--tensor-parallel expects an integer in [1, 64], got '0'");
    run("generate --prompt hi --tensor-parallel x", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "generate",
                          "--tensor-parallel expects an integer in [1, 64], got 'x'");
    run("perplexity --text x --tensor-parallel -1", &r);
    assert_one_line_error(&r, "perplexity", "--tensor-parallel expects an integer in [1, 64]");
    run("serve --tensor-parallel 65", &r);
    assert_one_line_error(&r, "serve", "--tensor-parallel expects an integer in [1, 64]");
    run("bench --tensor-parallel 2x", &r);
    assert_one_line_error(&r, "bench", "--tensor-parallel expects an integer in [1, 64]");
}

static void test_prompt_over_context(void **state) {
    /* " the" is one token; 9000 of them exceed SmolLM2's 8192-token context */
    size_t n = 9000, cap = n * 4 + 256;
    char *args = malloc(cap);
    int off = snprintf(args, cap, "generate --model '%s' --raw --prompt '", model_path());
    for (size_t i = 0; i < n; i++)
        off += snprintf(args + off, cap - off, " the");
    snprintf(args + off, cap - off, "'");
    result r;
    run(args, &r);
    free(args);
    assert_one_line_error(&r, "generate", "8192");
    assert_non_null(strstr(r.err, "9000")); /* names both numbers */
}

/* A busy port is reported before the model loads: the model here does not exist, so an
 * error about the port proves the order. */
static void test_busy_port(void **state) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char args[160], port[16];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    snprintf(args, sizeof args, "serve --model /nonexistent/model.gguf --port %s", port);
    result r;
    run(args, &r);
    close(fd);
    assert_one_line_error(&r, "serve", port);
    assert_non_null(strstr(r.err, "in use"));
    assert_null(strstr(r.err, "nonexistent"));
}

/* Sampling without --seed logs the clock's seed; with --seed it does not repeat it. */
static void test_seed_logged(void **state) {
    char args[4200];
    snprintf(args, sizeof args, "generate --model '%s' --raw --prompt hi --max-tokens 1",
             model_path());
    result r;
    run(args, &r);
    assert_int_equal(r.rc, 0);
    const char *s = strstr(r.err, "seed: ");
    assert_non_null(s);
    unsigned long long seed = strtoull(s + 6, NULL, 10);
    char with[4300];
    snprintf(with, sizeof with, "%s --seed %llu", args, seed);
    result a, b;
    run(with, &a);
    assert_int_equal(a.rc, 0);
    assert_null(strstr(a.err, "seed: "));
    assert_string_equal(a.out, r.out); /* the logged seed repeats the run */
    snprintf(with, sizeof with, "%s --temperature 0", args);
    run(with, &b);
    assert_null(strstr(b.err, "seed: ")); /* greedy: no seed in play */
}

/* The sampling options (cli_sampling_*): one range for generate and serve, checked by
 * comet_sampler_params_check; temperatures too small to matter give the temperature-0
 * text; --logit-bias -100 bans a token, and a bad one is named. */
static void test_sampling_options(void **state) {
    result r;
    run("generate --prompt hi --temperature 2.5", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "generate", "--temperature: temperature must be in [0, 2]");
    run("serve --temperature 2.5", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "--temperature: temperature must be in [0, 2]");
    run("generate --prompt hi --presence-penalty 3", &r);
    assert_one_line_error(&r, "generate", "--presence-penalty: presence_penalty must be in");
    run("generate --prompt hi --logit-bias abc", &r);
    assert_one_line_error(&r, "generate", "--logit-bias expects ID=BIAS");
    run("serve --logit-bias 5=101", &r);
    assert_one_line_error(&r, "serve", "the bias of token 5 must be in [-100, 100], got 101");

    char base[4200], args[4400];
    snprintf(base, sizeof base,
             "generate --model '%s' --raw --prompt 'The capital of France is' --max-tokens 8",
             model_path());
    snprintf(args, sizeof args, "%s --temperature 0", base);
    result greedy;
    run(args, &greedy);
    assert_int_equal(greedy.rc, 0);
    assert_true(!strncmp(greedy.out, " Paris", 6));
    const char *tiny[] = {"1e-38", "1e-40", "1e-45"};
    for (int t = 0; t < 3; t++)
        for (int seed = 1; seed <= 3; seed++) {
            snprintf(args, sizeof args, "%s --temperature %s --top-k 0 --seed %d", base, tiny[t],
                     seed);
            run(args, &r);
            assert_int_equal(r.rc, 0);
            if (strcmp(r.out, greedy.out))
                fail_msg("--temperature %s --seed %d: '%s', not the greedy '%s'", tiny[t], seed,
                         r.out, greedy.out);
        }
    snprintf(args, sizeof args, "%s --temperature 0 --logit-bias 7042=-100", base);
    run(args, &r); /* 7042: " Paris" */
    assert_int_equal(r.rc, 0);
    assert_null(strstr(r.out, " Paris"));
    snprintf(args, sizeof args, "%s --logit-bias 49152=1", base);
    run(args, &r);
    assert_one_line_error(&r, "generate", "token id 49152 is outside the vocabulary [0, 49152)");
}

static void test_help(void **state) {
    result r;
    run("generate --help", &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "--max-tokens"));
    assert_non_null(strstr(r.out, "--tensor-parallel N"));
    run("perplexity --help", &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "--max-windows"));
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/comet_test_cli.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char p[512];
    snprintf(p, sizeof p, "%s/out", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/err", tmpdir);
    unlink(p);
    rmdir(tmpdir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_prompt),      cmocka_unit_test(test_busy_port),
        cmocka_unit_test(test_seed_logged),       cmocka_unit_test(test_missing_model),
        cmocka_unit_test(test_unreadable_text),   cmocka_unit_test(test_cuda_device),
        cmocka_unit_test(test_bad_option_values), cmocka_unit_test(test_prompt_over_context),
        cmocka_unit_test(test_sampling_options),  cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

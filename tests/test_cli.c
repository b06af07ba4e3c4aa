/* test_cli.c — the comet binary ($COMET_BIN) on bad input: empty prompt, a prompt longer
 * than the context, a missing model, an unreadable text file, an unknown device, a
 * quantize --out that cannot be written (refused before the model loads), each a
 * one-line error on stderr naming the problem (after at most some loading progress),
 * nothing on stdout, non-zero exit; the no-GPU message of a CUDA build on a machine
 * without a GPU; one default device (cpu) for every command; --max-tokens 0; the
 * llama.cpp perplexity protocol on one window; bench's table, its --throughput mode (table
 * and --json record) and its bad input; the model line of a
 * checkpoint directory; --version; and --help on each subcommand. Cases that need the
 * default model load it from $COMET_SOURCE_DIR/models (fetched by the setup script). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

#define MODEL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define CHECKPOINT_DIR "models/smollm2-w4axkv4" /* made by the setup script */

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

/* serve's model and memory options are checked before anything loads: a missing
 * --model here would be the error otherwise, so the messages prove the order. */
static void test_serve_synthetic_and_memory_options(void **state) {
    result r;
    run("serve --synthetic llama3-13b", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "synthetic model 'llama3-13b': expected llama3-8b or "
                                       "llama3-70b");
    run("serve --synthetic llama3-8b --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "give --model or --synthetic, not both");
    run("serve --fp16 --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "--fp16 picks the variant of a --synthetic model");
    run("serve --synthetic llama3-70b --device cpu", &r);
    assert_one_line_error(&r, "serve", "run with --device cuda");
    run("serve --gpu-memory-fraction 0 --model /nonexistent/model.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "--gpu-memory-fraction expects a number in (0, 1]");
    run("serve --gpu-memory-fraction 1.5 --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "--gpu-memory-fraction expects a number in (0, 1]");
    run("serve --gpu-memory-fraction -1 --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "(0, 1], the share of the GPU's memory comet may use "
                                       "(e.g. 0.9), got '-1'");
    run("serve --gpu-memory-fraction nan --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "got 'nan'");
    run("serve --gpu-memory-fraction x --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "--gpu-memory-fraction expects a number");
    /* --kv-pages fixes the pool the fraction would size: the two together are refused */
    run("serve --gpu-memory-fraction 0.5 --kv-pages 64 --model /nonexistent/model.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "give --kv-pages (a fixed pool) or --gpu-memory-fraction");
    /* the fraction sizes one GPU's pool: elsewhere it would be ignored, so it is refused */
    run("serve --gpu-memory-fraction 0.5 --device cpu --model /nonexistent/model.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "--gpu-memory-fraction sizes the KV pool from one GPU's "
                                       "memory; on --device cpu the pool is --kv-pages N");
    run("serve --gpu-memory-fraction 0.5 --device cuda --tensor-parallel 2 "
        "--model /nonexistent/model.gguf",
        &r);
    assert_one_line_error(&r, "serve", "on --device cuda with --tensor-parallel the pool is");
    /* the engine's limit, as bench and the serving scripts take it */
    run("serve --max-seqs 1025 --model /nonexistent/model.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "serve", "--max-seqs expects an integer in [1, 1024], got '1025'");
    run("serve --max-seqs 0 --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "serve", "--max-seqs expects an integer in [1, 1024], got '0'");
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
    /* the llama.cpp protocol needs a text of two windows, not two windows scored */
    assert_non_null(strstr(r.out, "the text must hold\n"));
    assert_null(strstr(r.out, "two windows at least"));
    /* one default device, said in every --help that takes --device */
    const char *const with_device[] = {"generate", "perplexity", "serve", "bench"};
    for (int i = 0; i < 4; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", with_device[i]);
        run(args, &r);
        assert_int_equal(r.rc, 0);
        if (!strstr(r.out, "cpu, cuda or cuda:N (GPU N) (default cpu)"))
            fail_msg("%s --help does not say the default device is cpu:\n%s", with_device[i],
                     r.out);
    }
    run("--help", &r);
    assert_non_null(strstr(r.out, "on the CPU unless --device"));
}

/* `comet --version`: "comet <version> (commit <12 hex digits or unknown>), CUDA backend:
 * yes|no". */
static void test_version(void **state) {
    result r;
    run("--version", &r);
    assert_int_equal(r.rc, 0);
    char version[32], commit[64], cuda[8];
    if (sscanf(r.out, "comet %31s (commit %63[^)]), CUDA backend: %7s", version, commit, cuda) !=
        3)
        fail_msg("unexpected --version output '%s'", r.out);
    assert_string_equal(version, "0.1.0");
    assert_true(!strcmp(cuda, "yes") || !strcmp(cuda, "no"));
    assert_true(!strcmp(commit, "unknown") ||
                (strlen(commit) == 12 && strspn(commit, "0123456789abcdef") == 12));
}

/* Without --device, bench runs on the CPU (the default of every command), reports "n/a"
 * for the host enqueue time there (a CPU backend computes each op as it is called) and a
 * load time that includes reading the model file. */
static void test_bench_defaults_to_cpu(void **state) {
    char args[4300];
    snprintf(args, sizeof args,
             "bench --model '%s' --prompt-tokens 4 --decode-tokens 2 --reps 1 --threads 1",
             model_path());
    result r;
    run(args, &r);
    if (r.rc != 0)
        fail_msg("rc %d, stderr '%s'", r.rc, r.err);
    /* the speed table's row: | model | weights | device | prefill | decode | ms | enqueue |
     * load | */
    const char *row = strstr(r.out, "\n|---|---|---|---|---|---|---|---|\n");
    assert_non_null(row);
    row += strlen("\n|---|---|---|---|---|---|---|---|\n");
    char cols[9][64];
    int n = 0;
    for (const char *p = row + 1; n < 9 && *p && *p != '\n'; n++) {
        const char *e = strchr(p, '|');
        assert_non_null(e);
        while (*p == ' ')
            p++;
        size_t len = (size_t)(e - p);
        while (len && p[len - 1] == ' ')
            len--;
        snprintf(cols[n], sizeof cols[n], "%.*s", (int)len, p);
        p = e + 1;
    }
    assert_int_equal(n, 8);
    assert_string_equal(cols[2], "cpu");
    assert_string_equal(cols[6], "n/a");
    assert_true(atof(cols[7]) > 0.0); /* the model's file was read within the timing */
}

/* bench --throughput on the CPU: the table, and the --json record with every request's
 * tokens counted (N * O) and the parameters the run was given. */
static void test_bench_throughput(void **state) {
    char args[4600], json[300];
    snprintf(json, sizeof json, "%s/bench.json", tmpdir);
    snprintf(args, sizeof args,
             "bench --model '%s' --throughput --input-len 6 --output-len 3 --requests 3 "
             "--max-seqs 2 --threads 1 --json '%s'",
             model_path(), json);
    result r;
    run(args, &r);
    if (r.rc != 0)
        fail_msg("rc %d, stderr '%s'", r.rc, r.err);
    assert_non_null(strstr(r.out, "| output tok/s | total tok/s |"));
    assert_non_null(strstr(r.out, "| cpu | 3 | 6 / 3 | 2 |"));
    assert_non_null(strstr(r.out, "host share"));
    char text[4096];
    slurp(json, text, sizeof text);
    unlink(json);
    assert_non_null(strchr(text, '\n'));
    assert_ptr_equal(strchr(text, '\n'), text + strlen(text) - 1); /* one line */
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "throughput");
    assert_int_equal(cJSON_GetObjectItem(j, "output_tokens")->valuedouble, 9);
    assert_int_equal(cJSON_GetObjectItem(j, "requests")->valuedouble, 3);
    assert_int_equal(cJSON_GetObjectItem(j, "max_seqs")->valuedouble, 2);
    assert_true(cJSON_GetObjectItem(j, "output_tok_s")->valuedouble > 0);
    assert_true(cJSON_GetObjectItem(j, "mean_batch_seqs")->valuedouble <= 2);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "tpot_p99_ms")));
    assert_int_equal(cJSON_GetObjectItem(j, "lm_head_bits")->valuedouble, 16); /* the FP GGUF */
    cJSON_Delete(j);
}

/* bench's two modes refuse each other's options and impossible lengths, by name. */
static void test_bench_bad_input(void **state) {
    result r;
    run("bench --throughput --input-len 4", &r);
    assert_one_line_error(&r, "bench", "--throughput needs --input-len and --output-len");
    run("bench --input-len 4 --output-len 4", &r);
    assert_one_line_error(&r, "bench", "--input-len needs --throughput");
    run("bench --throughput --input-len 4 --output-len 4 --reps 2", &r);
    assert_one_line_error(&r, "bench", "--reps is an option of the decode benchmark");
    run("bench --decode-batch 8 --throughput --input-len 4 --output-len 4", &r);
    assert_one_line_error(&r, "bench", "--decode-batch is an option of the decode benchmark");
    run("bench --throughput --input-len 0 --output-len 4", &r);
    assert_one_line_error(&r, "bench", "--input-len expects an integer in [1,");
    run("bench --throughput --input-len 4 --output-len 4 --requests 0", &r);
    assert_one_line_error(&r, "bench", "--requests expects an integer in [1,");
    run("bench --throughput --input-len 4 --output-len 4 --max-seqs 1025", &r);
    assert_one_line_error(&r, "bench", "--max-seqs expects an integer in [1, 1024]");
    run("bench --throughput --input-len 4 --output-len 4 --gpu-memory-fraction 0", &r);
    assert_one_line_error(&r, "bench", "--gpu-memory-fraction expects a number in (0, 1]");
    run("bench --throughput --input-len 4 --output-len 4 --gpu-memory-fraction 1.5", &r);
    assert_one_line_error(&r, "bench", "--gpu-memory-fraction expects a number in (0, 1]");
    run("bench --throughput --input-len 4 --output-len 4 --gpu-memory-fraction 0.5 "
        "--model /nonexistent/model.gguf",
        &r);
    assert_one_line_error(&r, "bench", "--gpu-memory-fraction sizes the KV pool from one GPU's "
                                       "memory; on --device cpu the pool is --kv-pages P");
    run("bench --lm-head-bits 8 --model /nonexistent/model.gguf", &r);
    assert_one_line_error(&r, "bench", "--lm-head-bits picks the lm_head of a --synthetic model");
    run("bench --synthetic llama3-8b --lm-head-bits 12", &r);
    assert_one_line_error(&r, "bench", "--lm-head-bits expects 8 or 16, got 12");
    run("bench --fp16 --model /nonexistent/model.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "bench", "--fp16 picks the variant of a --synthetic model");
    /* an unwritable --json is refused before the model loads (the model here is missing) */
    run("bench --model /nonexistent/model.gguf --throughput --input-len 4 --output-len 4 "
        "--json /nonexistent/dir/x.jsonl",
        &r);
    assert_int_equal(r.rc, 2);
    assert_one_line_error(&r, "bench", "cannot append to --json /nonexistent/dir/x.jsonl");
    run("bench --throughput --input-len 4 --output-len 4 --kv-pages 9 --gpu-memory-fraction .5",
        &r);
    assert_one_line_error(&r, "bench", "give --kv-pages (a fixed pool) or --gpu-memory-fraction");
    run("bench --gpu-memory-fraction 0.5", &r);
    assert_one_line_error(&r, "bench", "--gpu-memory-fraction needs --throughput");
    run("bench --decode-batch 0", &r);
    assert_one_line_error(&r, "bench", "--decode-batch expects an integer in [1, 4096]");
    char args[4300];
    snprintf(args, sizeof args,
             "bench --model '%s' --throughput --input-len 8000 --output-len 1000", model_path());
    run(args, &r);
    assert_one_line_error(&r, "bench",
                          "--input-len 8000 + --output-len 1000 exceed the model's context of "
                          "8192 tokens");
    snprintf(args, sizeof args,
             "bench --model '%s' --throughput --input-len 20 --output-len 20 --kv-pages 2",
             model_path());
    run(args, &r);
    assert_one_line_error(&r, "bench",
                          "--kv-pages 2 (32 tokens) cannot hold one request of 20 + 20 tokens; "
                          "it needs 3 pages");
}

/* A CUDA build on a machine without an NVIDIA driver (no /dev/nvidia*) says so and how to
 * run on the CPU, instead of the runtime's "driver version is insufficient". Runs only
 * where that is the situation (`comet --version` says CUDA is built in, no device nodes). */
static void test_no_gpu_message(void **state) {
    result r;
    run("--version", &r);
    if (!strstr(r.out, "CUDA backend: yes"))
        skip(); /* a CPU-only build: test_cuda_device covers its message */
    glob_t g;
    int nodes = glob("/dev/nvidia*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
    if (nodes) {
        globfree(&g);
        skip(); /* a driver is there */
    }
    char args[4300];
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --device cuda", model_path());
    run(args, &r);
    assert_one_line_error(&r, "generate", "no NVIDIA GPU/driver found");
    assert_non_null(strstr(r.err, "run with --device cpu"));
    assert_null(strstr(r.err, "insufficient"));
    snprintf(args, sizeof args, "bench --model '%s' --device cuda:0 --prompt-tokens 4",
             model_path());
    run(args, &r);
    assert_one_line_error(&r, "bench", "no NVIDIA GPU/driver found");
}

/* quantize checks --out before it loads the model (here a missing one: an error about the
 * output proves the order, as test_busy_port does for serve). */
static void test_quantize_out_checked_first(void **state) {
    const char *file = tmp_file("a_file");
    write_file(file, "x", 1);
    char args[1200];
    result r;
    snprintf(args, sizeof args,
             "quantize --model /nonexistent/model.gguf --calib-windows 1 --out '%s'", file);
    run(args, &r);
    assert_one_line_error(&r, "quantize", "is not a directory");
    assert_non_null(strstr(r.err, file));
    assert_null(strstr(r.err, "nonexistent"));
    /* --lm-head-bits takes 8 or 16 only, refused before anything loads */
    run("quantize --model /nonexistent/model.gguf --lm-head-bits 12 --out /tmp/x", &r);
    assert_one_line_error(&r, "quantize", "--lm-head-bits expects 8 or 16, got 12");
    run("quantize --model /nonexistent/model.gguf --lm-head-bits 4 --out /tmp/x", &r);
    assert_one_line_error(&r, "quantize", "--lm-head-bits");

    snprintf(args, sizeof args, "quantize --model /nonexistent/model.gguf --out '%s/sub'",
             tmp_file("no_dir"));
    run(args, &r);
    assert_one_line_error(&r, "quantize", "does not exist");
    assert_null(strstr(r.err, "nonexistent/model"));

    /* a non-empty directory that is not a comet checkpoint: refused unless --force */
    const char *full = tmp_file("full");
    assert_int_equal(mkdir(full, 0755), 0);
    char inside[600];
    snprintf(inside, sizeof inside, "%s/notes.txt", full);
    write_file(inside, "keep me", 7);
    snprintf(args, sizeof args, "quantize --model /nonexistent/model.gguf --out '%s'", full);
    run(args, &r);
    assert_one_line_error(&r, "quantize", "not a comet checkpoint");
    assert_non_null(strstr(r.err, "--force"));
    snprintf(args, sizeof args, "quantize --model /nonexistent/model.gguf --force --out '%s'",
             full);
    run(args, &r);
    assert_one_line_error(&r, "quantize", "/nonexistent/model.gguf"); /* got to the model */

    /* an empty directory and an earlier checkpoint (its files are replaced) pass */
    const char *empty = tmp_file("empty");
    assert_int_equal(mkdir(empty, 0755), 0);
    snprintf(args, sizeof args, "quantize --model /nonexistent/model.gguf --out '%s'", empty);
    run(args, &r);
    assert_one_line_error(&r, "quantize", "/nonexistent/model.gguf");
    const char *ck = tmp_file("ck");
    assert_int_equal(mkdir(ck, 0755), 0);
    snprintf(inside, sizeof inside, "%s/config.json", ck);
    const char *cfg = "{\"quantization_config\": {\"quant_method\": \"comet-fmpq\"}}";
    write_file(inside, cfg, strlen(cfg));
    snprintf(args, sizeof args, "quantize --model /nonexistent/model.gguf --out '%s'", ck);
    run(args, &r);
    assert_one_line_error(&r, "quantize", "/nonexistent/model.gguf");
}

/* --max-tokens 0 means "up to the context" for generate as for serve: greedy, the answer
 * to "hi" ends at EOS long before, so it equals a run with a limit it never reaches. */
static void test_max_tokens_zero(void **state) {
    char args[4300];
    result a, b;
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --temperature 0 --max-tokens 0",
             model_path());
    run(args, &a);
    if (a.rc != 0)
        fail_msg("--max-tokens 0: rc %d, stderr '%s'", a.rc, a.err);
    assert_true(strlen(a.out) > 0);
    assert_null(strstr(a.err, "warning"));
    snprintf(args, sizeof args,
             "generate --model '%s' --prompt hi --temperature 0 --max-tokens 4096", model_path());
    run(args, &b);
    assert_int_equal(b.rc, 0);
    assert_string_equal(a.out, b.out);
    run("generate --prompt hi --max-tokens -1", &a);
    assert_one_line_error(&a, "generate", "--max-tokens expects an integer in [0,");
}

/* perplexity --protocol llama.cpp needs a text of two windows but scores as many windows as
 * --max-windows asks, one included. */
static void test_llama_cpp_protocol_one_window(void **state) {
    const char *text = tmp_file("text.txt");
    const char *words = "It is a truth universally acknowledged, that a single man in possession "
                        "of a good fortune, must be in want of a wife. However little known the "
                        "feelings or views of such a man may be on his first entering a "
                        "neighbourhood, this truth is so well fixed in the minds of the "
                        "surrounding families.\n";
    write_file(text, words, strlen(words));
    char args[4600];
    result r;
    snprintf(args, sizeof args,
             "perplexity --model '%s' --text '%s' --protocol llama.cpp --ctx 16 --max-windows 1",
             model_path(), text);
    run(args, &r);
    if (r.rc != 0)
        fail_msg("rc %d, stderr '%s'", r.rc, r.err);
    assert_non_null(strstr(r.out, " ctx 16 windows 1\n"));
    /* 7 tokens scored: the second half of the one window, less its last position */
    assert_non_null(strstr(r.out, " tokens 7 ctx"));
    snprintf(args, sizeof args,
             "perplexity --model '%s' --text '%s' --protocol llama.cpp --ctx 64", model_path(),
             text);
    run(args, &r);
    assert_one_line_error(&r, "perplexity", "two windows");
}

/* A comet checkpoint directory prints the model line on stderr, as a GGUF file does. */
static void test_checkpoint_model_line(void **state) {
    char dir[4096], cfg[4200];
    const char *src = getenv("COMET_SOURCE_DIR");
    snprintf(dir, sizeof dir, "%s/%s", src ? src : ".", CHECKPOINT_DIR);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (access(cfg, R_OK) != 0)
        skip(); /* the set-up has not quantized the default model yet */
    char args[8400];
    snprintf(args, sizeof args,
             "generate --model '%s' --prompt hi --max-tokens 1 --temperature 0", dir);
    result r;
    run(args, &r);
    if (r.rc != 0)
        fail_msg("rc %d, stderr '%s'", r.rc, r.err);
    /* the lm_head the checkpoint records: INT8 from format version 3's default */
    char text[1 << 16], line[4200];
    slurp(cfg, text, sizeof text);
    snprintf(line, sizeof line,
             "%s: llama, 30 layers, C=576, F=1536, H=9/3, D=64, V=49152, "
             "comet checkpoint W4A4 KV4, %s lm_head\n",
             dir, strstr(text, "\"lm_head_bits\":\t8") ? "INT8" : "fp16");
    if (!strstr(r.err, line))
        fail_msg("no model line '%s' in stderr '%s'", line, r.err);
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --max-tokens 1", model_path());
    run(args, &r);
    assert_non_null(strstr(r.err, ": llama, 30 layers, C=576, F=1536, H=9/3, D=64, V=49152\n"));
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
        cmocka_unit_test(test_empty_prompt),
        cmocka_unit_test(test_busy_port),
        cmocka_unit_test(test_seed_logged),
        cmocka_unit_test(test_missing_model),
        cmocka_unit_test(test_unreadable_text),
        cmocka_unit_test(test_cuda_device),
        cmocka_unit_test(test_bad_option_values),
        cmocka_unit_test(test_serve_synthetic_and_memory_options),
        cmocka_unit_test(test_prompt_over_context),
        cmocka_unit_test(test_sampling_options),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_bench_defaults_to_cpu),
        cmocka_unit_test(test_bench_throughput),
        cmocka_unit_test(test_bench_bad_input),
        cmocka_unit_test(test_no_gpu_message),
        cmocka_unit_test(test_quantize_out_checked_first),
        cmocka_unit_test(test_max_tokens_zero),
        cmocka_unit_test(test_llama_cpp_protocol_one_window),
        cmocka_unit_test(test_checkpoint_model_line),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

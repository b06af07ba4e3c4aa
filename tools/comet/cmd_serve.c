/* cmd_serve.c — `comet serve`: the OpenAI-compatible HTTP server over the engine.
 * Binds 127.0.0.1 unless --host says otherwise; SIGINT/SIGTERM stop accepting
 * connections, let requests in flight finish (up to --drain-timeout seconds), then exit. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comet/engine.h"
#include "comet/log.h"
#include "comet/model.h"
#include "comet/server.h"
#include "comet/tokenizer.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: comet serve [--model M | --synthetic llama3-8b|llama3-70b] [options]\n"
               "\n"
               "Serve the model over an OpenAI-compatible HTTP API: GET /health, GET /v1/models,\n"
               "POST /v1/completions, POST /v1/chat/completions (stream: true for SSE),\n"
               "GET /metrics (Prometheus).\n"
               "\n"
               "  --model M              .gguf file or HF directory (default: the bundled model)\n"
               "  --synthetic NAME       a model of that shape with random W4AxKV4 weights made\n"
               "                         on the device (llama3-8b, llama3-70b); prompts are\n"
               "                         token ids, token i reads \" <i>\"; needs --device cuda\n"
               "  --fp16                 with --synthetic: FP16 weights and KV cache\n"
               "  --host H               address to bind (default 127.0.0.1)\n"
               "  --port N               TCP port (default 8000; 0 picks a free one, printed)\n"
               "  --api-key K            require 'Authorization: Bearer K' on /v1/ routes\n"
               "                         (default: $COMET_API_KEY if set)\n"
               "  --model-id ID          model name clients send (default: the file's base name)\n"
               "  --max-seqs N           sequences per step, 1..1024 (default 64)\n"
               "  --max-batch-tokens N   tokens per step (default: 512, or --max-seqs if more)\n"
               "  --kv-pages N           KV pool pages of 16 tokens (default: sized from memory\n"
               "                         on one GPU, else 512)\n"
               "  --gpu-memory-fraction F  share of the GPU's memory comet may use in all:\n"
               "                         weights, workspace and KV pool, with what other\n"
               "                         processes hold counted (0 < F <= 1, default 0.9);\n"
               "                         one GPU only, not with --kv-pages\n"
               "  --max-waiting N        queued requests before 503 (default 256)\n"
               "  --max-body-bytes N     request body limit (default 4194304)\n"
               "  --chat-template T      a Jinja file, or chatml | llama3 | llama2 (default: the model's)\n"
               "  --allow-special-in-messages   special-token text in a chat message's\n"
               "                         content (<|im_start|>...) becomes that control token;\n"
               "                         lets any client forge system turns: trusted clients only\n"
               "                         (default off: message contents are plain text)\n"
               "  --device D             cpu, cuda or cuda:N (GPU N) (default cpu)\n"
               "  --threads N            CPU threads in all, split between the ranks with\n"
               "                         --tensor-parallel (default: all cores)\n"
               "  --tensor-parallel N    split the model over N devices of --device's kind\n"
               "                         (cuda:d..d+N-1, or N CPU ranks) (default: one device)\n"
               "  --batch-invariant      a request's tokens do not depend on the other requests\n"
               "                         in its steps, bit for bit, on the GPU too, at some\n"
               "                         speed (docs/numerics.md)\n"
               "  --drain-timeout S      seconds to let requests finish on SIGTERM (default 30)\n"
               "  --verbose              debug logs on stderr\n"
               "\n"
               "Defaults for the fields a request leaves out (the request's own values win;\n"
               "default: the model's generation_config.json, else comet generate's):\n");
    cli_sampling_usage(f, 25, "-1");
    fprintf(f, "  --max-tokens N         completion length, both routes (default: chat 256,\n"
               "                         completions 16; 0: up to the context)\n");
}

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

/* The model id from a path: its base name without .gguf, or the directory name. */
static void model_id_from_path(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    size_t len = n - b;
    if (len > 5 && !strncmp(path + n - 5, ".gguf", 5))
        len -= 5;
    snprintf(out, cap, "%.*s", (int)len, path + b);
}

static double gib(size_t bytes) { return (double)bytes / (double)(1u << 30); }

/* The start-up lines on memory: what the weights, workspace and KV pool take, and how many
 * sequences of the context length (and of 2048 tokens) the pool holds at once. */
static void log_memory(const comet_engine_memory *mem, int n_ctx) {
    if (mem->device_total)
        comet_log(COMET_LOG_INFO,
                  "memory: weights %.2f GiB, workspace %.2f GiB, KV pool %.2f GiB (%d pages "
                  "of %d = %d tokens); %.2f of %.2f GiB on the GPU in use",
                  gib(mem->weights), gib(mem->workspace), gib(mem->kv_pool), mem->kv_pool_pages,
                  mem->page_size, mem->kv_pool_tokens, gib(mem->device_used_peak),
                  gib(mem->device_total));
    else
        comet_log(COMET_LOG_INFO,
                  "memory: workspace %.2f GiB, KV pool %.2f GiB (%d pages of %d = %d tokens) "
                  "in host memory",
                  gib(mem->workspace), gib(mem->kv_pool), mem->kv_pool_pages, mem->page_size,
                  mem->kv_pool_tokens);
    comet_log(COMET_LOG_INFO,
              "capacity: %d sequences of the full context (%d tokens), %d of 2048 tokens, at "
              "once",
              mem->max_seqs_ctx, n_ctx, mem->max_seqs_2048);
}

int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *api_key = getenv("COMET_API_KEY");
    const char *model_id = NULL, *template_name = NULL, *device = "cpu", *synthetic = NULL;
    long port = 8000, max_seqs = 64, max_batch = 0, pages = 0, max_waiting = 256;
    double mem_fraction = 0.9;
    int fp16 = 0, fraction_given = 0;
    long max_body = 4L << 20, threads = 0, drain = 30, tensor_parallel = 0;
    int verbose = 0, allow_special_in_messages = 0, batch_invariant = 0;
    /* request defaults given on the command line */
    comet_sampler_params dflt = comet_sampler_default_params();
    cli_sampling smp;
    cli_sampling_init(&smp, &dflt);
    long opt_max_tokens = -1; /* -1: not given */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int got = cli_sampling_option("serve", &smp, a, val);
        if (got < 0)
            return 2;
        if (got > 0) {
            i++;
            continue;
        }
#define INT_OPT(name, var, lo, hi)                                                                 \
    if (!strcmp(a, name)) {                                                                        \
        if (cli_parse_int("serve", name, val, lo, hi, &var))                                       \
            return 2;                                                                              \
        i++;                                                                                       \
        continue;                                                                                  \
    }
#define STR_OPT(name, var)                                                                         \
    if (!strcmp(a, name)) {                                                                        \
        if (!val) {                                                                                \
            fprintf(stderr, "comet serve: %s needs a value\n", name);                              \
            return 2;                                                                              \
        }                                                                                          \
        var = val;                                                                                 \
        i++;                                                                                       \
        continue;                                                                                  \
    }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        STR_OPT("--model", model_path)
        STR_OPT("--host", host)
        STR_OPT("--api-key", api_key)
        STR_OPT("--model-id", model_id)
        STR_OPT("--chat-template", template_name)
        STR_OPT("--device", device)
        STR_OPT("--synthetic", synthetic)
        if (!strcmp(a, "--gpu-memory-fraction")) {
            if (cli_parse_fraction("serve", a, val, &mem_fraction))
                return 2;
            fraction_given = 1;
            i++;
            continue;
        }
        if (!strcmp(a, "--fp16")) {
            fp16 = 1;
            continue;
        }
        INT_OPT("--port", port, 0, 65535)
        INT_OPT("--max-seqs", max_seqs, 1, COMET_ENGINE_MAX_SEQS)
        INT_OPT("--max-batch-tokens", max_batch, 1, 1 << 20)
        INT_OPT("--kv-pages", pages, 1, 1 << 24)
        INT_OPT("--max-waiting", max_waiting, 1, 1 << 20)
        INT_OPT("--max-body-bytes", max_body, 1024, 1L << 30)
        INT_OPT("--threads", threads, 0, 1024)
        INT_OPT("--tensor-parallel", tensor_parallel, 1, COMET_MAX_TENSOR_PARALLEL)
        INT_OPT("--drain-timeout", drain, 0, 3600)
        INT_OPT("--max-tokens", opt_max_tokens, 0, 1 << 30)
        if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            verbose = 1;
            continue;
        }
        if (!strcmp(a, "--batch-invariant")) {
            batch_invariant = 1;
            continue;
        }
        if (!strcmp(a, "--allow-special-in-messages")) {
            allow_special_in_messages = 1;
            continue;
        }
        fprintf(stderr, "comet serve: unknown option '%s' (see comet serve --help)\n", a);
        return 2;
#undef INT_OPT
#undef STR_OPT
    }
    cli_log_to_stderr(verbose);
    if (cli_device_ok("serve", device) || cli_sampling_check("serve", &smp, 0))
        return 2;
    if (model_path && synthetic) {
        fprintf(stderr, "comet serve: give --model or --synthetic, not both\n");
        return 2;
    }
    if (pages && fraction_given) { /* the fraction only sizes a pool --kv-pages fixes */
        fprintf(stderr, "comet serve: give --kv-pages (a fixed pool) or --gpu-memory-fraction "
                        "(a pool sized from the GPU's memory), not both\n");
        return 2;
    }
    if (fraction_given && (strncmp(device, "cuda", 4) || tensor_parallel)) {
        fprintf(stderr, "comet serve: --gpu-memory-fraction sizes the KV pool from one GPU's "
                        "memory; on --device %s%s the pool is --kv-pages N (default %d)\n",
                device, tensor_parallel ? " with --tensor-parallel" : "",
                COMET_ENGINE_FIXED_PAGES);
        return 2;
    }
    if (fp16 && !synthetic) {
        fprintf(stderr, "comet serve: --fp16 picks the variant of a --synthetic model; a "
                        "--model is served as its file stores it\n");
        return 2;
    }
    comet_model *m = NULL;
    if (synthetic) { /* no weights yet: the device makes them when the engine starts */
        if (comet_model_synthetic(synthetic, !fp16, 1, &m) < 0) {
            cli_report_error("serve", "cannot make the synthetic model");
            return 2;
        }
        if (strncmp(device, "cuda", 4)) {
            fprintf(stderr, "comet serve: --synthetic models get their weights from the CUDA "
                            "backend; run with --device cuda\n");
            comet_model_free(m);
            return 2;
        }
    }
    if (cli_port_free("serve", host, (int)port)) {
        comet_model_free(m);
        return 1;
    }
    if (!model_path && !synthetic)
        model_path = cli_default_model();
    char id_buf[256];
    if (!model_id) {
        if (synthetic)
            snprintf(id_buf, sizeof id_buf, "%s%s", synthetic, fp16 ? "-fp16" : "");
        else
            model_id_from_path(model_path, id_buf, sizeof id_buf);
        model_id = id_buf;
    }

    if (!m && cli_load_model(model_path, device, 0, (int)tensor_parallel, &m) < 0) {
        cli_report_error("serve", "cannot load the model");
        return 1;
    }
    comet_engine_params ep = comet_engine_default_params();
    ep.max_seqs = (int)max_seqs;
    /* a decode step of every sequence fits one step's tokens */
    ep.max_batch_tokens = max_batch > 0 ? (int)max_batch : max_seqs > 512 ? (int)max_seqs : 512;
    ep.n_pages = (int)pages; /* 0: from memory on one GPU, else COMET_ENGINE_FIXED_PAGES */
    ep.gpu_memory_fraction = mem_fraction;
    ep.max_waiting = (int)max_waiting;
    ep.n_threads = (int)threads;
    ep.device = device;
    ep.batch_invariant = batch_invariant;
    ep.tensor_parallel = (int)tensor_parallel;
    comet_engine *e = comet_engine_init(m, &ep);
    if (!e) {
        cli_report_error("serve", "cannot start the engine");
        comet_model_free(m);
        return 1;
    }
    comet_openai_server_params sp = comet_openai_server_default_params();
    sp.host = host;
    sp.port = (int)port;
    sp.api_key = api_key;
    sp.max_body_bytes = (size_t)max_body;
    sp.model_id = model_id;
    sp.chat_template = template_name;
    sp.allow_special_in_messages = allow_special_in_messages;
    comet_engine_memory mem;
    comet_engine_get_memory(e, &mem);
    log_memory(&mem, m->cfg.n_ctx);
    sp.kv_tokens = mem.kv_pool_tokens;
    sp.sampling = smp.p; /* logit_bias: smp's, alive while the server runs */
    sp.sampling_given = smp.given;
    sp.max_tokens = (int)opt_max_tokens;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    comet_chat *probe = template_name ? comet_chat_init(m->chat_template, template_name) : NULL;
    int bad_template = template_name && !probe;
    comet_chat_free(probe);
    comet_openai_server *srv = NULL;
    if (bad_template || comet_openai_server_start(e, m, &sp, &srv) < 0) {
        cli_report_error("serve",
                         bad_template ? "bad --chat-template" : "cannot start the HTTP server");
        comet_engine_free(e);
        comet_model_free(m);
        return bad_template ? 2 : 1;
    }
    comet_log(COMET_LOG_INFO, "serving '%s' on http://%s:%d (ctx %d, %d KV pages, max %ld seqs)",
              model_id, host, comet_openai_server_port(srv), m->cfg.n_ctx, mem.kv_pool_pages,
              max_seqs);
    /* one line on stdout for scripts that start the server on port 0 */
    printf("listening on %s:%d\n", host, comet_openai_server_port(srv));
    fflush(stdout);

    while (!stop_requested)
        usleep(100 * 1000);

    comet_log(COMET_LOG_INFO, "draining: no new connections; %d requests in flight",
              comet_openai_server_in_flight(srv));
    comet_openai_server_quiesce(srv);
    for (long waited = 0; comet_openai_server_in_flight(srv) > 0 && waited < drain * 10; waited++)
        usleep(100 * 1000);
    if (comet_openai_server_in_flight(srv) > 0)
        comet_log(COMET_LOG_WARN, "drain timeout: closing %d requests",
                  comet_openai_server_in_flight(srv));
    comet_engine_cancel_all(e); /* what is left ends as cancelled; its streams close */
    comet_openai_server_stop(srv);
    comet_engine_free(e);
    comet_model_free(m);
    comet_log(COMET_LOG_INFO, "stopped");
    return 0;
}

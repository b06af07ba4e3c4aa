/* cmd_bench.c — `comet bench`: end-to-end speed of one model on one backend.
 *
 * Default mode (comet_bench, comet/bench.h): prefill tokens/s, decode tokens/s at a batch
 * of --decode-batch B sequences (default 1), and where one decode step's time goes per op.
 * Output: markdown tables on stdout — the speeds, with "host enqueue" n/a on a host-memory
 * backend or with --tensor-parallel and "load s" the model's load from its file (or the
 * synthetic model's creation) plus its set-up on the backend, then the profiled decode
 * step op by op (rank 0's with --tensor-parallel).
 *
 * --throughput (comet_bench_throughput): the engine's offline serving throughput over N
 * requests of fixed input and output lengths submitted at once; a markdown table of the
 * figures and the engine step's host/forward split.
 *
 * --json FILE appends one JSON object per run (every figure and the parameters) to FILE.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "comet/backend.h"
#include "comet/bench.h"
#include "comet/engine.h"
#include "comet/model.h"
#include "commands.h"

/* Seconds on the monotonic clock (the load time the table reports). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: comet bench [--model M | --synthetic llama3-8b|llama3-70b] [options]\n"
               "       comet bench [--model M | --synthetic ...] --throughput --input-len I\n"
               "                   --output-len O [throughput options]\n"
               "\n"
               "Prefill and decode speed of a model at a batch of B sequences, and one decode\n"
               "step's time per op; or, with --throughput, the serving engine's offline\n"
               "throughput over N requests submitted at once.\n"
               "\n"
               "  --model M            .gguf file, HF directory or comet checkpoint\n"
               "                       (default: the bundled model)\n"
               "  --synthetic NAME     random weights of that shape made by the backend\n"
               "                       (W4AxKV4; with --fp16 FP16 weights and KV)\n"
               "  --fp16               with --synthetic: the floating-point variant\n"
               "  --lm-head-bits 8|16  with --synthetic: an INT8 (default with W4AxKV4) or\n"
               "                       fp16 lm_head (docs/numerics.md \"lm_head\")\n"
               "  --batch-invariant    the batch-invariant plans (docs/numerics.md)\n"
               "  --device D           cpu, cuda or cuda:N (GPU N) (default cpu)\n"
               "  --threads N          CPU threads in all, split between the ranks with\n"
               "                       --tensor-parallel (default: all cores)\n"
               "  --tensor-parallel N  split the model over N devices of --device's kind\n"
               "                       (cuda:d..d+N-1, or N CPU ranks); the per-op table\n"
               "                       is rank 0's (default: one device)\n"
               "  --seed S             token ids and synthetic weights (default 1)\n"
               "  --json FILE          also append the run's figures and parameters to FILE\n"
               "                       as one JSON object (one line)\n"
               "\n"
               "Decode speed (default mode):\n"
               "  --simulate           CPU: run a quantized checkpoint by its fp32 simulation\n"
               "                       (the reference) instead of on integer codes\n"
               "  --prompt-tokens N    prefill prompt length (default 512)\n"
               "  --decode-tokens N    decode steps after it (default 128)\n"
               "  --decode-batch B     sequences decoded together, each with its own random\n"
               "                       prompt (prefilled up to 2048 tokens a step); the\n"
               "                       per-op table is a decode step at batch B (default 1)\n"
               "  --reps N             repetitions; medians are reported (default 5)\n"
               "\n"
               "Offline throughput (--throughput):\n"
               "  --input-len I        prompt tokens per request (random ids)\n"
               "  --output-len O       generated tokens per request (greedy, EOS ignored)\n"
               "  --requests N         requests, all submitted at once\n"
               "                       (default: max(4, --max-seqs))\n"
               "  --max-seqs C         sequences per engine step, 1..1024 (default 64)\n"
               "  --max-batch-tokens T tokens per engine step (default: max(2048, C))\n"
               "  --kv-pages P         KV pool pages of 16 tokens (default: on a GPU, sized\n"
               "                       from its memory; on the CPU, enough for min(N, C)\n"
               "                       requests of I + O tokens)\n"
               "  --gpu-memory-fraction F  share of the GPU's memory comet may use in all:\n"
               "                       weights, workspace and KV pool (0 < F <= 1, default\n"
               "                       0.9); the pool takes what is left; one GPU only,\n"
               "                       not with --kv-pages\n");
}

/* The options of one `comet bench` run. */
typedef struct opts {
    const char *model_path, *synthetic, *device, *json;
    long prompt_n, decode_n, reps, threads, seed, tensor_parallel, decode_batch, lm_head_bits;
    int fp16, batch_invariant, simulate, throughput;
    long input_len, output_len, requests, max_seqs, max_batch_tokens, kv_pages;
    double mem_fraction;                       /* 0: not given */
    const char *decode_only, *throughput_only; /* the first option given of each mode */
} opts;

/* Parse argv into *o. 0, or 2 after printing the problem; 1 for --help (printed). */
static int parse(int argc, char **argv, opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--fp16")) {
            o->fp16 = 1;
            continue;
        } else if (!strcmp(a, "--batch-invariant")) {
            o->batch_invariant = 1;
            continue;
        } else if (!strcmp(a, "--simulate")) {
            o->simulate = 1;
            o->decode_only = o->decode_only ? o->decode_only : a;
            continue;
        } else if (!strcmp(a, "--throughput")) {
            o->throughput = 1;
            continue;
        }
        if (!val) {
            fprintf(stderr, "comet bench: %s needs a value (see comet bench --help)\n", a);
            return 2;
        }
        i++;
        int bad = 0;
        const char **mode = NULL; /* the mode the option belongs to, if only one */
        if (!strcmp(a, "--model")) {
            o->model_path = val;
        } else if (!strcmp(a, "--synthetic")) {
            o->synthetic = val;
        } else if (!strcmp(a, "--device")) {
            o->device = val;
            bad = cli_device_ok("bench", val);
        } else if (!strcmp(a, "--json")) {
            o->json = val;
        } else if (!strcmp(a, "--lm-head-bits")) {
            bad = cli_parse_int("bench", a, val, 8, 16, &o->lm_head_bits);
            if (!bad && o->lm_head_bits != 8 && o->lm_head_bits != 16) {
                fprintf(stderr, "comet bench: --lm-head-bits expects 8 or 16, got %ld\n",
                        o->lm_head_bits);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            bad = cli_parse_int("bench", a, val, 1, 1024, &o->threads);
        } else if (!strcmp(a, "--tensor-parallel")) {
            bad = cli_parse_int("bench", a, val, 1, COMET_MAX_TENSOR_PARALLEL, &o->tensor_parallel);
        } else if (!strcmp(a, "--seed")) {
            bad = cli_parse_int("bench", a, val, 1, 1L << 40, &o->seed);
        } else if (!strcmp(a, "--prompt-tokens")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 16, &o->prompt_n);
            mode = &o->decode_only;
        } else if (!strcmp(a, "--decode-tokens")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 16, &o->decode_n);
            mode = &o->decode_only;
        } else if (!strcmp(a, "--decode-batch")) {
            bad = cli_parse_int("bench", a, val, 1, COMET_BENCH_MAX_BATCH, &o->decode_batch);
            mode = &o->decode_only;
        } else if (!strcmp(a, "--reps")) {
            bad = cli_parse_int("bench", a, val, 1, COMET_BENCH_MAX_REPS, &o->reps);
            mode = &o->decode_only;
        } else if (!strcmp(a, "--input-len")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 20, &o->input_len);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--output-len")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 20, &o->output_len);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--requests")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 20, &o->requests);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--max-seqs")) {
            bad = cli_parse_int("bench", a, val, 1, COMET_ENGINE_MAX_SEQS, &o->max_seqs);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 20, &o->max_batch_tokens);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--kv-pages")) {
            bad = cli_parse_int("bench", a, val, 1, 1 << 24, &o->kv_pages);
            mode = &o->throughput_only;
        } else if (!strcmp(a, "--gpu-memory-fraction")) {
            bad = cli_parse_fraction("bench", a, val, &o->mem_fraction);
            mode = &o->throughput_only;
        } else {
            fprintf(stderr, "comet bench: unknown option '%s' (see comet bench --help)\n", a);
            return 2;
        }
        if (bad)
            return 2;
        if (mode && !*mode)
            *mode = a;
    }
    if (o->model_path && o->synthetic) {
        fprintf(stderr, "comet bench: give --model or --synthetic, not both\n");
        return 2;
    }
    if (o->lm_head_bits && !o->synthetic) {
        fprintf(stderr, "comet bench: --lm-head-bits picks the lm_head of a --synthetic model; a "
                        "checkpoint's is chosen by comet quantize --lm-head-bits\n");
        return 2;
    }
    if (o->fp16 && !o->synthetic) {
        fprintf(stderr, "comet bench: --fp16 picks the variant of a --synthetic model; a "
                        "--model runs as its file stores it\n");
        return 2;
    }
    if (o->throughput && o->decode_only) {
        fprintf(stderr,
                "comet bench: %s is an option of the decode benchmark, not of --throughput "
                "(which takes --input-len, --output-len, --requests, --max-seqs, "
                "--max-batch-tokens, --kv-pages, --gpu-memory-fraction)\n",
                o->decode_only);
        return 2;
    }
    if (!o->throughput && o->throughput_only) {
        fprintf(stderr, "comet bench: %s needs --throughput\n", o->throughput_only);
        return 2;
    }
    if (o->kv_pages && o->mem_fraction > 0) {
        fprintf(stderr, "comet bench: give --kv-pages (a fixed pool) or --gpu-memory-fraction "
                        "(a pool sized from the GPU's memory), not both\n");
        return 2;
    }
    if (o->mem_fraction > 0 && (strncmp(o->device, "cuda", 4) || o->tensor_parallel)) {
        char dflt[48] = "enough for the requests at once"; /* a host backend's pool */
        if (!strncmp(o->device, "cuda", 4))
            snprintf(dflt, sizeof dflt, "%d pages", COMET_ENGINE_FIXED_PAGES);
        fprintf(stderr,
                "comet bench: --gpu-memory-fraction sizes the KV pool from one GPU's memory; "
                "on --device %s%s the pool is --kv-pages P (default: %s)\n",
                o->device, o->tensor_parallel ? " with --tensor-parallel" : "", dflt);
        return 2;
    }
    if (o->throughput && (!o->input_len || !o->output_len)) {
        fprintf(stderr, "comet bench: --throughput needs --input-len and --output-len\n");
        return 2;
    }
    /* a --json that cannot be appended to is refused before a run's minutes are spent;
     * opening for append creates the file the run appends its line to */
    FILE *f = o->json ? fopen(o->json, "a") : NULL;
    if (o->json && !f) {
        fprintf(stderr, "comet bench: cannot append to --json %s: %s\n", o->json,
                strerror(errno));
        return 2;
    }
    if (f)
        fclose(f);
    return 0;
}

/* The weights' format as the tables name it. */
static const char *quant_name(const opts *o, const comet_model *m) {
    if (!strcmp(o->device, "cpu") || !strcmp(o->device, "cpu-ref"))
        return !m->quant                                      ? "FP32"
               : o->simulate || !strcmp(o->device, "cpu-ref") ? "W4AxKV4 (simulated)"
                                                              : "W4AxKV4 (integer)";
    return m->quant || (m->synthetic_seed && !o->fp16) ? "W4AxKV4" : "FP16";
}

/* Append obj as one line to the file `path`; frees obj. 0, or 1 after printing why. */
static int json_append(const char *path, cJSON *obj) {
    char *text = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    FILE *f = text ? fopen(path, "a") : NULL;
    int bad = !f || fprintf(f, "%s\n", text) < 0;
    if (f && fclose(f))
        bad = 1;
    free(text);
    if (bad)
        fprintf(stderr, "comet bench: cannot append to --json %s\n", path);
    return bad;
}

/* The parameters every JSON record carries. */
static cJSON *json_record(const opts *o, const comet_model *m, const char *name, const char *mode) {
    cJSON *j = cJSON_CreateObject();
    char when[32];
    time_t t = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_AddStringToObject(j, "mode", mode);
    cJSON_AddStringToObject(j, "date", when);
    cJSON_AddStringToObject(j, "model", name);
    cJSON_AddStringToObject(j, "weights", quant_name(o, m));
    cJSON_AddNumberToObject(j, "lm_head_bits", m->lm_head_bits == 8 ? 8 : 16);
    cJSON_AddStringToObject(j, "device", o->device);
    cJSON_AddNumberToObject(j, "tensor_parallel", (double)o->tensor_parallel);
    cJSON_AddBoolToObject(j, "batch_invariant", o->batch_invariant);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    return j;
}

/* The decode benchmark (default mode). 0 or 1. */
static int run_decode(const opts *o, const comet_model *m, const char *name, double t_load) {
    if (o->prompt_n + o->decode_n + 2 > m->cfg.n_ctx) { /* before a backend starts for nothing */
        fprintf(stderr, "comet bench: %ld + %ld tokens exceed the model's context of %d\n",
                o->prompt_n, o->decode_n, m->cfg.n_ctx);
        return 1;
    }
    comet_backend *be = cli_open_backend("bench", o->device, (int)o->threads,
                                         (int)o->tensor_parallel, o->batch_invariant);
    if (!be)
        return 1;
    comet_backend_set_simulate(be, o->simulate);
    const long B = o->decode_batch, prompt_n = o->prompt_n, decode_n = o->decode_n;
    comet_bench_params bp = {.prompt_tokens = (int)prompt_n,
                             .decode_tokens = (int)decode_n,
                             .reps = (int)o->reps,
                             .seed = (uint64_t)o->seed,
                             .tensor_parallel = (int)o->tensor_parallel,
                             .decode_batch = (int)B};
    comet_bench_result r;
    if (comet_bench(m, be, &bp, &r) < 0) {
        cli_report_error("bench", "a step failed");
        comet_backend_free(be);
        return 1;
    }
    comet_backend_free(be);
    const char *quant = quant_name(o, m);
    char batch[48] = ""; /* batch 1 keeps its historical header */
    if (B > 1)
        snprintf(batch, sizeof batch, " at batch %ld", B);
    printf("| model | weights | device | prefill %ld tok/s | decode tok/s%s (ctx %ld..%ld) | "
           "ms / decode step | host enqueue ms | load s (file + backend) |\n",
           prompt_n, batch, prompt_n, prompt_n + decode_n);
    printf("|---|---|---|---|---|---|---|---|\n");
    char enqueue[32] = "n/a"; /* a host-memory backend computes as it goes; not measured with
                               * --tensor-parallel */
    if (r.enqueue_ms > 0)
        snprintf(enqueue, sizeof enqueue, "%.3f", r.enqueue_ms);
    char tp[32] = ""; /* the devices the model is split over */
    if (o->tensor_parallel)
        snprintf(tp, sizeof tp, " x%ld tensor-parallel", o->tensor_parallel);
    printf("| %s | %s | %s%s%s | %.0f | %.1f | %.3f | %s | %.2f |\n\n", name, quant, o->device, tp,
           o->batch_invariant ? " batch-invariant" : "", r.prefill_tok_s, r.decode_tok_s,
           1e3 * (double)B / r.decode_tok_s, enqueue, t_load + r.load_s);
    double total = 0.0;
    for (int i = 0; i < r.n_ops; i++)
        total += r.ops[i].seconds;
    char rank0[96] = ""; /* the other ranks are not profiled */
    if (o->tensor_parallel)
        snprintf(rank0, sizeof rank0,
                 " on rank 0 of %ld (gather heads and all_reduce wait for every rank)",
                 o->tensor_parallel);
    printf("One decode step%s at ctx %ld%s, op by op (each op waited for: %.3f ms in all):\n\n",
           batch, prompt_n + decode_n + 2, rank0, 1e3 * total);
    printf("| op | calls | ms | share |\n|---|---|---|---|\n");
    for (int i = 0; i < r.n_ops; i++)
        printf("| %s | %d | %.3f | %.1f%% |\n", r.ops[i].name, r.ops[i].calls,
               1e3 * r.ops[i].seconds, 100.0 * r.ops[i].seconds / total);
    if (!o->json)
        return 0;
    cJSON *j = json_record(o, m, name, "decode");
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)prompt_n);
    cJSON_AddNumberToObject(j, "decode_tokens", (double)decode_n);
    cJSON_AddNumberToObject(j, "decode_batch", (double)B);
    cJSON_AddNumberToObject(j, "reps", (double)o->reps);
    cJSON_AddNumberToObject(j, "prefill_tok_s", r.prefill_tok_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", r.decode_tok_s);
    cJSON_AddNumberToObject(j, "decode_step_ms", 1e3 * (double)B / r.decode_tok_s);
    if (r.enqueue_ms > 0)
        cJSON_AddNumberToObject(j, "host_enqueue_ms", r.enqueue_ms);
    else
        cJSON_AddNullToObject(j, "host_enqueue_ms");
    cJSON_AddNumberToObject(j, "load_s", t_load + r.load_s);
    cJSON *ops = cJSON_AddArrayToObject(j, "ops");
    for (int i = 0; i < r.n_ops; i++) {
        cJSON *op = cJSON_CreateObject();
        cJSON_AddStringToObject(op, "name", r.ops[i].name);
        cJSON_AddNumberToObject(op, "calls", r.ops[i].calls);
        cJSON_AddNumberToObject(op, "ms", 1e3 * r.ops[i].seconds);
        cJSON_AddItemToArray(ops, op);
    }
    return json_append(o->json, j);
}

/* The offline throughput benchmark (--throughput). 0 or 1. */
static int run_throughput(const opts *o, const comet_model *m, const char *name, double t_load) {
    comet_bench_throughput_params tp = comet_bench_throughput_default_params();
    comet_engine_params *ep = &tp.engine;
    tp.input_len = (int)o->input_len;
    tp.output_len = (int)o->output_len;
    tp.seed = (uint64_t)o->seed;
    if (o->max_seqs)
        ep->max_seqs = (int)o->max_seqs;
    tp.n_requests = o->requests ? (int)o->requests : ep->max_seqs > 4 ? ep->max_seqs : 4;
    ep->max_batch_tokens = o->max_batch_tokens   ? (int)o->max_batch_tokens
                           : ep->max_seqs > 2048 ? ep->max_seqs
                                                 : 2048;
    const long seq_pages = (o->input_len + o->output_len + ep->page_size - 1) / ep->page_size;
    const long at_once = tp.n_requests < ep->max_seqs ? tp.n_requests : ep->max_seqs;
    const int on_cpu = !strncmp(o->device, "cpu", 3);
    /* without --kv-pages: a GPU's pool from its memory, a CPU's for the requests at once */
    ep->n_pages = o->kv_pages ? (int)o->kv_pages : on_cpu ? (int)(at_once * seq_pages) : 0;
    if (o->mem_fraction > 0)
        ep->gpu_memory_fraction = o->mem_fraction;
    ep->device = o->device;
    ep->n_threads = (int)o->threads;
    ep->batch_invariant = o->batch_invariant;
    ep->tensor_parallel = (int)o->tensor_parallel;
    if (o->input_len + o->output_len > m->cfg.n_ctx) { /* before the engine loads weights */
        fprintf(stderr,
                "comet bench: --input-len %ld + --output-len %ld exceed the model's context of "
                "%d tokens\n",
                o->input_len, o->output_len, m->cfg.n_ctx);
        return 1;
    }
    if (ep->n_pages > 0 && ep->n_pages < seq_pages) {
        fprintf(stderr,
                "comet bench: --kv-pages %d (%d tokens) cannot hold one request of %ld + %ld "
                "tokens; it needs %ld pages\n",
                ep->n_pages, ep->n_pages * ep->page_size, o->input_len, o->output_len, seq_pages);
        return 1;
    }
    comet_bench_throughput_result r;
    if (comet_bench_throughput(m, &tp, &r) < 0) {
        cli_report_error("bench", "the throughput run failed");
        return 1;
    }
    const char *quant = quant_name(o, m);
    char tpar[32] = "";
    if (o->tensor_parallel)
        snprintf(tpar, sizeof tpar, " x%ld tensor-parallel", o->tensor_parallel);
    printf("| model | weights | device | requests | in / out | max seqs | output tok/s | "
           "total tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | mean batch (seqs / tokens) | "
           "preemptions | KV pool tokens (seqs) | peak device GiB | wall s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    char tpot[64] = "n/a"; /* one output token has no time per output token */
    if (o->output_len > 1)
        snprintf(tpot, sizeof tpot, "%.2f / %.2f", 1e3 * r.tpot_p50_s, 1e3 * r.tpot_p99_s);
    const comet_engine_memory *mem = &r.memory;
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    char peak[32] = "n/a"; /* a host backend has no device memory */
    if (mem->device_used_peak)
        snprintf(peak, sizeof peak, "%.2f", (double)mem->device_used_peak / GiB);
    printf("| %s | %s | %s%s%s | %d | %ld / %ld | %d | %.1f | %.1f | %.1f / %.1f | %s | "
           "%.1f / %.1f | %llu | %d (%d) | %s | %.2f |\n\n",
           name, quant, o->device, tpar, o->batch_invariant ? " batch-invariant" : "",
           tp.n_requests, o->input_len, o->output_len, ep->max_seqs, r.output_tok_s, r.total_tok_s,
           1e3 * r.ttft_p50_s, 1e3 * r.ttft_p99_s, tpot, r.mean_batch_seqs, r.mean_batch_tokens,
           (unsigned long long)r.preemptions, r.kv_pool_tokens, r.kv_pool_seqs, peak, r.wall_s);
    printf("Engine step, mean of %llu: %.3f ms = host before %.3f ms (scheduling, batch, block "
           "tables) + forward and sampling %.3f ms + host after %.3f ms (tokens, "
           "detokenization, events); host share %.2f%%. Load %.2f s (file) + %.2f s (engine).\n",
           (unsigned long long)r.steps, 1e3 * r.step_s, 1e3 * r.host_before_s, 1e3 * r.forward_s,
           1e3 * r.host_after_s, 100.0 * r.host_share, t_load, r.init_s);
    if (mem->device_total)
        printf("Device memory: %.2f GiB in all; weights %.2f GiB, workspace %.2f GiB, KV pool "
               "%.2f GiB (%d pages of %d tokens), peak in use %.2f GiB (every process's).\n",
               (double)mem->device_total / GiB, (double)mem->weights / GiB,
               (double)mem->workspace / GiB, (double)mem->kv_pool / GiB, mem->kv_pool_pages,
               mem->page_size, (double)mem->device_used_peak / GiB);
    if (!o->json)
        return 0;
    cJSON *j = json_record(o, m, name, "throughput");
    cJSON_AddNumberToObject(j, "requests", tp.n_requests);
    cJSON_AddNumberToObject(j, "input_len", (double)o->input_len);
    cJSON_AddNumberToObject(j, "output_len", (double)o->output_len);
    cJSON_AddNumberToObject(j, "max_seqs", ep->max_seqs);
    cJSON_AddNumberToObject(j, "max_batch_tokens", ep->max_batch_tokens);
    cJSON_AddNumberToObject(j, "kv_pages", mem->kv_pool_pages);
    if (mem->device_total)
        cJSON_AddNumberToObject(j, "gpu_memory_fraction", ep->gpu_memory_fraction);
    cJSON_AddNumberToObject(j, "page_size", ep->page_size);
    cJSON_AddNumberToObject(j, "output_tokens", (double)r.output_tokens);
    cJSON_AddNumberToObject(j, "wall_s", r.wall_s);
    cJSON_AddNumberToObject(j, "submit_s", r.submit_s);
    cJSON_AddNumberToObject(j, "output_tok_s", r.output_tok_s);
    cJSON_AddNumberToObject(j, "total_tok_s", r.total_tok_s);
    cJSON_AddNumberToObject(j, "ttft_p50_ms", 1e3 * r.ttft_p50_s);
    cJSON_AddNumberToObject(j, "ttft_p99_ms", 1e3 * r.ttft_p99_s);
    if (o->output_len > 1) {
        cJSON_AddNumberToObject(j, "tpot_p50_ms", 1e3 * r.tpot_p50_s);
        cJSON_AddNumberToObject(j, "tpot_p99_ms", 1e3 * r.tpot_p99_s);
    } else {
        cJSON_AddNullToObject(j, "tpot_p50_ms");
        cJSON_AddNullToObject(j, "tpot_p99_ms");
    }
    cJSON_AddNumberToObject(j, "mean_batch_seqs", r.mean_batch_seqs);
    cJSON_AddNumberToObject(j, "mean_batch_tokens", r.mean_batch_tokens);
    cJSON_AddNumberToObject(j, "steps", (double)r.steps);
    cJSON_AddNumberToObject(j, "preemptions", (double)r.preemptions);
    cJSON_AddNumberToObject(j, "kv_pool_tokens", r.kv_pool_tokens);
    cJSON_AddNumberToObject(j, "kv_pool_seqs", r.kv_pool_seqs);
    cJSON_AddNumberToObject(j, "kv_pool_bytes", (double)mem->kv_pool);
    cJSON_AddNumberToObject(j, "workspace_bytes", (double)mem->workspace);
    if (mem->device_total) { /* a host backend has no device memory to report */
        cJSON_AddNumberToObject(j, "device_total_bytes", (double)mem->device_total);
        cJSON_AddNumberToObject(j, "weights_bytes", (double)mem->weights);
        cJSON_AddNumberToObject(j, "device_used_peak_bytes", (double)mem->device_used_peak);
    } else {
        cJSON_AddNullToObject(j, "device_total_bytes");
        cJSON_AddNullToObject(j, "weights_bytes");
        cJSON_AddNullToObject(j, "device_used_peak_bytes");
    }
    cJSON_AddNumberToObject(j, "step_ms", 1e3 * r.step_s);
    cJSON_AddNumberToObject(j, "host_before_ms", 1e3 * r.host_before_s);
    cJSON_AddNumberToObject(j, "forward_ms", 1e3 * r.forward_s);
    cJSON_AddNumberToObject(j, "host_after_ms", 1e3 * r.host_after_s);
    cJSON_AddNumberToObject(j, "host_share", r.host_share);
    cJSON_AddNumberToObject(j, "load_s", t_load);
    cJSON_AddNumberToObject(j, "engine_init_s", r.init_s);
    return json_append(o->json, j);
}

int cmd_bench(int argc, char **argv) {
    opts o = {
        .device = "cpu", .prompt_n = 512, .decode_n = 128, .reps = 5, .seed = 1, .decode_batch = 1};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    cli_log_to_stderr(0);
    comet_model *m = NULL;
    double t_load = now_s();
    if (o.synthetic) {
        if (comet_model_synthetic(o.synthetic, !o.fp16, (uint64_t)o.seed, &m) < 0) {
            cli_report_error("bench", "cannot make the synthetic model");
            return 2;
        }
        if (o.lm_head_bits)
            m->lm_head_bits = (int)o.lm_head_bits;
    } else {
        if (!o.model_path)
            o.model_path = cli_default_model();
        if (cli_load_model(o.model_path, o.device, o.simulate, (int)o.tensor_parallel, &m) < 0) {
            cli_report_error("bench", "cannot load the model");
            return 1;
        }
    }
    t_load = now_s() - t_load;
    const char *name = o.synthetic ? o.synthetic : m->name ? m->name : o.model_path;
    rc = o.throughput ? run_throughput(&o, m, name, t_load) : run_decode(&o, m, name, t_load);
    comet_model_free(m);
    return rc;
}

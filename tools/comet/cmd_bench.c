/* cmd_bench.c — `comet bench`: end-to-end speed of one model on one backend (comet_bench,
 * comet/bench.h: prefill tokens/s on one prompt, batch-1 decode tokens/s, and where one
 * decode step's time goes per op). Output: markdown tables on stdout — the speeds, with
 * "host enqueue" n/a on a host-memory backend or with --tensor-parallel and "load s" the
 * model's load from its file (or the synthetic model's creation) plus its set-up on the
 * backend, then the profiled decode step op by op (rank 0's with --tensor-parallel).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comet/backend.h"
#include "comet/bench.h"
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
               "\n"
               "Prefill and batch-1 decode speed of a model, and one decode step's time per op.\n"
               "\n"
               "  --model M            .gguf file, HF directory or comet checkpoint\n"
               "                       (default: the bundled model)\n"
               "  --synthetic NAME     random weights of that shape made by the backend\n"
               "                       (W4AxKV4; with --fp16 FP16 weights and KV)\n"
               "  --fp16               with --synthetic: the floating-point variant\n"
               "  --batch-invariant    the batch-invariant plans (docs/numerics.md)\n"
               "  --simulate           CPU: run a quantized checkpoint by its fp32 simulation\n"
               "                       (the reference) instead of on integer codes\n"
               "  --device D           cpu, cuda or cuda:N (GPU N) (default cpu)\n"
               "  --prompt-tokens N    prefill prompt length (default 512)\n"
               "  --decode-tokens N    decode steps after it (default 128)\n"
               "  --reps N             repetitions; medians are reported (default 5)\n"
               "  --threads N          CPU threads in all, split between the ranks with\n"
               "                       --tensor-parallel (default: all cores)\n"
               "  --tensor-parallel N  split the model over N devices of --device's kind\n"
               "                       (cuda:d..d+N-1, or N CPU ranks); the per-op table\n"
               "                       is rank 0's (default: one device)\n"
               "  --seed S             token ids and synthetic weights (default 1)\n");
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *synthetic = NULL, *device = "cpu";
    long prompt_n = 512, decode_n = 128, reps = 5, threads = 0, seed = 1, tensor_parallel = 0;
    int fp16 = 0, batch_invariant = 0, simulate = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--fp16")) {
            fp16 = 1;
            continue;
        } else if (!strcmp(a, "--batch-invariant")) {
            batch_invariant = 1;
            continue;
        } else if (!strcmp(a, "--simulate")) {
            simulate = 1;
            continue;
        }
        if (!val) {
            fprintf(stderr, "comet bench: %s needs a value (see comet bench --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) {
            model_path = val;
        } else if (!strcmp(a, "--synthetic")) {
            synthetic = val;
        } else if (!strcmp(a, "--device")) {
            device = val;
            if (cli_device_ok("bench", device))
                return 2;
        } else if (!strcmp(a, "--prompt-tokens")) {
            if (cli_parse_int("bench", a, val, 1, 1 << 16, &prompt_n))
                return 2;
        } else if (!strcmp(a, "--decode-tokens")) {
            if (cli_parse_int("bench", a, val, 1, 1 << 16, &decode_n))
                return 2;
        } else if (!strcmp(a, "--reps")) {
            if (cli_parse_int("bench", a, val, 1, COMET_BENCH_MAX_REPS, &reps))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int("bench", a, val, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(a, "--tensor-parallel")) {
            if (cli_parse_int("bench", a, val, 1, COMET_MAX_TENSOR_PARALLEL, &tensor_parallel))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_int("bench", a, val, 1, 1L << 40, &seed))
                return 2;
        } else {
            fprintf(stderr, "comet bench: unknown option '%s' (see comet bench --help)\n", a);
            return 2;
        }
    }
    cli_log_to_stderr(0);
    if (model_path && synthetic) {
        fprintf(stderr, "comet bench: give --model or --synthetic, not both\n");
        return 2;
    }
    comet_model *m = NULL;
    double t_load = now_s();
    if (synthetic) {
        if (comet_model_synthetic(synthetic, !fp16, (uint64_t)seed, &m) < 0) {
            cli_report_error("bench", "cannot make the synthetic model");
            return 2;
        }
    } else {
        if (!model_path)
            model_path = cli_default_model();
        if (cli_load_model(model_path, device, simulate, (int)tensor_parallel, &m) < 0) {
            cli_report_error("bench", "cannot load the model");
            return 1;
        }
    }
    t_load = now_s() - t_load;
    int rc = 1;
    comet_backend *be = NULL;
    if (prompt_n + decode_n + 2 > m->cfg.n_ctx) { /* before a backend starts for nothing */
        fprintf(stderr, "comet bench: %ld + %ld tokens exceed the model's context of %d\n",
                prompt_n, decode_n, m->cfg.n_ctx);
        goto out;
    }
    if (!(be = cli_open_backend("bench", device, (int)threads, (int)tensor_parallel,
                                batch_invariant)))
        goto out;
    comet_backend_set_simulate(be, simulate);
    comet_bench_params bp = {.prompt_tokens = (int)prompt_n,
                             .decode_tokens = (int)decode_n,
                             .reps = (int)reps,
                             .seed = (uint64_t)seed,
                             .tensor_parallel = (int)tensor_parallel};
    comet_bench_result r;
    if (comet_bench(m, be, &bp, &r) < 0) {
        cli_report_error("bench", "a step failed");
        goto out;
    }
    const char *name = synthetic ? synthetic : m->name ? m->name : model_path;
    const char *quant = m->quant || (m->synthetic_seed && !fp16) ? "W4AxKV4" : "FP16";
    if (!strcmp(device, "cpu") || !strcmp(device, "cpu-ref"))
        quant = !m->quant ? "FP32"
                : simulate || !strcmp(device, "cpu-ref") ? "W4AxKV4 (simulated)"
                                                          : "W4AxKV4 (integer)";
    printf("| model | weights | device | prefill %ld tok/s | decode tok/s (ctx %ld..%ld) | "
           "ms / decode step | host enqueue ms | load s (file + backend) |\n",
           prompt_n, prompt_n, prompt_n + decode_n);
    printf("|---|---|---|---|---|---|---|---|\n");
    char enqueue[32] = "n/a"; /* a host-memory backend computes as it goes; not measured with
                               * --tensor-parallel */
    if (r.enqueue_ms > 0)
        snprintf(enqueue, sizeof enqueue, "%.3f", r.enqueue_ms);
    char tp[32] = ""; /* the devices the model is split over */
    if (tensor_parallel)
        snprintf(tp, sizeof tp, " x%ld tensor-parallel", tensor_parallel);
    printf("| %s | %s | %s%s%s | %.0f | %.1f | %.3f | %s | %.2f |\n\n", name, quant, device, tp,
           batch_invariant ? " batch-invariant" : "", r.prefill_tok_s, r.decode_tok_s,
           1e3 / r.decode_tok_s, enqueue, t_load + r.load_s);
    double total = 0.0;
    for (int i = 0; i < r.n_ops; i++)
        total += r.ops[i].seconds;
    char rank0[96] = ""; /* the other ranks are not profiled */
    if (tensor_parallel)
        snprintf(rank0, sizeof rank0,
                 " on rank 0 of %ld (gather heads and all_reduce wait for every rank)",
                 tensor_parallel);
    printf("One decode step at ctx %ld%s, op by op (each op waited for: %.3f ms in all):\n\n",
           prompt_n + decode_n + 2, rank0, 1e3 * total);
    printf("| op | calls | ms | share |\n|---|---|---|---|\n");
    for (int i = 0; i < r.n_ops; i++)
        printf("| %s | %d | %.3f | %.1f%% |\n", r.ops[i].name, r.ops[i].calls,
               1e3 * r.ops[i].seconds, 100.0 * r.ops[i].seconds / total);
    rc = 0;
out:
    comet_backend_free(be);
    comet_model_free(m);
    return rc;
}

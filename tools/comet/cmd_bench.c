/* cmd_bench.c — `comet bench`: end-to-end speed of one model on one backend: prefill tokens/s
 * on one prompt, batch-1 decode tokens/s, and where one decode step's time goes (per op).
 *
 * Token ids are random (seeded), so a synthetic model without a tokenizer runs the same way
 * as a real one. Every step ends with greedy sampling as `generate` does it (on the GPU the
 * backend's op `sample`: only the token id comes back; on the CPU the host's sampler).
 * Times are host wall-clock around whole steps (a step returns when its token is on the
 * host); medians over --reps runs. The per-op table comes from one extra
 * decode step run op by op: the profiler waits for the backend after each op, so each row
 * includes one synchronization and the total exceeds the plain step time; its last row,
 * "sample", is the sampling call after the forward pass. "host enqueue" is the time from a
 * decode step's first op to its last op enqueued, without waiting: when it is close to the
 * step time, the step is bound by the host's launches.
 * Output: a markdown table on stdout.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "comet/log.h"
#include "comet/model.h"
#include "commands.h"
#include "engine/runner.h"
#include "engine/sampler.h"

#define MAX_OPS 32
#define MAX_REPS 101

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
               "  --device D           cpu, cuda or cuda:N (default cuda)\n"
               "  --prompt-tokens N    prefill prompt length (default 512)\n"
               "  --decode-tokens N    decode steps after it (default 128)\n"
               "  --reps N             repetitions; medians are reported (default 5)\n"
               "  --threads N          CPU threads (default: all cores)\n"
               "  --seed S             token ids and synthetic weights (default 1)\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Per-op profile of one step: each op's interval closes when the next op starts. */
typedef struct prof {
    comet_backend *be;
    int wait;        /* wait for the backend at each op (per-op times), else host times only */
    double t_start;  /* the step's first op */
    double t_queued; /* the last op of the forward pass enqueued */
    const char *cur;
    double t;
    int n;
    const char *name[MAX_OPS];
    double sec[MAX_OPS];
    int calls[MAX_OPS];
} prof;

static void on_op(void *user, const char *op) {
    prof *p = user;
    if (!p->wait) { /* how long the host takes to enqueue the step */
        double t = now_s();
        if (!p->t_start)
            p->t_start = t;
        if (!op)
            p->t_queued = t;
        return;
    }
    p->be->ops->sync(p->be);
    double t = now_s();
    if (p->cur) {
        int i = 0;
        while (i < p->n && strcmp(p->name[i], p->cur))
            i++;
        if (i == p->n && p->n < MAX_OPS)
            p->name[p->n++] = p->cur;
        if (i < MAX_OPS) {
            p->sec[i] += t - p->t;
            p->calls[i]++;
        }
    }
    p->cur = op;
    p->t = now_s();
}

static uint64_t rng_state;
static int32_t random_token(int V) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int32_t)(rng_state % (uint64_t)V);
}

/* Run the step built in run->bb and pick its one token greedily into *id (logits [V]: the
 * host scratch comet_runner_step_sample needs). */
static comet_status step_greedy(comet_runner *run, comet_sampler *smp, float *logits, int32_t *id) {
    comet_runner_draw draw = {smp, NULL, 0};
    COMET_TRY(comet_runner_step_sample(run, &draw, logits, id));
    return *id >= 0 ? COMET_OK
                    : comet_set_error(COMET_ERR_NUMERIC, "bench: the logits are not finite");
}

/* Append token *id to seq, run one decode step and pick the next token into *id. */
static comet_status decode_step(comet_runner *run, comet_sampler *smp, comet_kv_seq *seq,
                                int32_t *id, float *logits) {
    COMET_TRY(comet_kv_seq_reserve(&run->pool, seq, 1));
    comet_batch_builder_reset(&run->bb);
    COMET_TRY(comet_batch_builder_add(&run->bb, seq, id, 1, 1));
    return step_greedy(run, smp, logits, id);
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *synthetic = NULL, *device = "cuda";
    long prompt_n = 512, decode_n = 128, reps = 5, threads = 0, seed = 1;
    int fp16 = 0, batch_invariant = 0;
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
            if (cli_parse_int("bench", a, val, 1, MAX_REPS, &reps))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int("bench", a, val, 1, 1024, &threads))
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
    if (synthetic) {
        if (comet_model_synthetic(synthetic, !fp16, (uint64_t)seed, &m) < 0) {
            cli_report_error("bench", "cannot make the synthetic model");
            return 2;
        }
    } else {
        if (!model_path)
            model_path = cli_default_model();
        if (comet_model_load(model_path, &m) < 0) {
            cli_report_error("bench", "cannot load the model");
            return 1;
        }
    }
    const comet_model_config *c = &m->cfg;
    int rc = 1, P = 16, V = c->n_vocab;
    int ctx = (int)(prompt_n + decode_n + 2); /* + the two profiled steps */
    comet_runner run = {0};
    comet_kv_seq seq = {0};
    int32_t *prompt = malloc((size_t)prompt_n * sizeof *prompt);
    float *logits = malloc((size_t)V * sizeof *logits);
    comet_backend *be = NULL;
    comet_sampler_params sp = comet_sampler_default_params();
    sp.temperature = 0.0f; /* greedy */
    comet_sampler *smp = comet_sampler_init(&sp, V);
    if (!prompt || !logits || !smp) {
        fprintf(stderr, "comet bench: out of memory\n");
        goto out;
    }
    if (ctx > c->n_ctx) {
        fprintf(stderr, "comet bench: %ld + %ld tokens exceed the model's context of %d\n",
                prompt_n, decode_n, c->n_ctx);
        goto out;
    }
    if (!(be = cli_open_backend("bench", device, (int)threads, batch_invariant)))
        goto out;
    comet_runner_params rp = {.max_batch_tokens = (int)prompt_n,
                              .max_seqs = 1,
                              .n_pages = (ctx + P - 1) / P + 1,
                              .page_size = P};
    double t_load = now_s();
    if (comet_runner_init(&run, m, be, &rp) < 0 || comet_kv_seq_init(&seq, ctx, P) < 0) {
        cli_report_error("bench", "cannot set up the model on the backend");
        goto out;
    }
    t_load = now_s() - t_load;
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)seed;
    for (long i = 0; i < prompt_n; i++)
        prompt[i] = random_token(V);

    double pre[MAX_REPS], dec[MAX_REPS];
    int32_t id = 0;
    for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
        comet_kv_seq_release(&run.pool, &seq);
        if (comet_kv_seq_reserve(&run.pool, &seq, (int)prompt_n) < 0)
            goto step_fail;
        comet_batch_builder_reset(&run.bb);
        double t0 = now_s();
        if (comet_batch_builder_add(&run.bb, &seq, prompt, (int)prompt_n, 1) < 0 ||
            step_greedy(&run, smp, logits, &id) < 0)
            goto step_fail;
        double t1 = now_s();
        for (long s = 0; s < decode_n; s++)
            if (decode_step(&run, smp, &seq, &id, logits) != COMET_OK)
                goto step_fail;
        double t2 = now_s();
        if (r > 0) {
            pre[r - 1] = (double)prompt_n / (t1 - t0);
            dec[r - 1] = (double)decode_n / (t2 - t1);
        }
    }
    /* two more decode steps: the host's enqueue time, then op by op */
    prof hq = {.be = be, .wait = 0}, pf = {.be = be, .wait = 1};
    prof *passes[2] = {&hq, &pf};
    for (int k = 0; k < 2; k++) {
        comet_forward_set_profiler(run.fc, on_op, passes[k]);
        comet_status st = decode_step(&run, smp, &seq, &id, logits);
        comet_forward_set_profiler(run.fc, NULL, NULL);
        if (st != COMET_OK)
            goto step_fail;
    }
    if (pf.n < MAX_OPS) { /* the sampling call after the forward pass's last op */
        pf.name[pf.n] = "sample";
        pf.sec[pf.n] = now_s() - pf.t;
        pf.calls[pf.n++] = 1;
    }

    double pre_med = median(pre, (int)reps), dec_med = median(dec, (int)reps);
    const char *name = synthetic ? synthetic : m->name ? m->name : model_path;
    const char *quant = m->quant || (m->synthetic_seed && !fp16) ? "W4AxKV4" : "FP16";
    if (!strcmp(device, "cpu") || !strcmp(device, "cpu-ref"))
        quant = m->quant ? "W4AxKV4 (simulated)" : "FP32";
    double enqueue_ms = hq.t_queued > 0 ? 1e3 * (hq.t_queued - hq.t_start) : 0.0;
    printf("| model | weights | device | prefill %ld tok/s | decode tok/s (ctx %ld..%ld) | "
           "ms / decode step | host enqueue ms | load s |\n",
           prompt_n, prompt_n, prompt_n + decode_n);
    printf("|---|---|---|---|---|---|---|---|\n");
    char enqueue[32] = "n/a"; /* a host-memory backend computes as it goes */
    if (enqueue_ms > 0)
        snprintf(enqueue, sizeof enqueue, "%.3f", enqueue_ms);
    printf("| %s | %s | %s%s | %.0f | %.1f | %.3f | %s | %.1f |\n\n", name, quant, device,
           batch_invariant ? " batch-invariant" : "", pre_med, dec_med, 1e3 / dec_med, enqueue,
           t_load);
    double total = 0.0;
    for (int i = 0; i < pf.n; i++)
        total += pf.sec[i];
    printf("One decode step at ctx %ld, op by op (each op waited for: %.3f ms in all):\n\n",
           prompt_n + decode_n + 2, 1e3 * total);
    printf("| op | calls | ms | share |\n|---|---|---|---|\n");
    for (int i = 0; i < pf.n; i++)
        printf("| %s | %d | %.3f | %.1f%% |\n", pf.name[i], pf.calls[i], 1e3 * pf.sec[i],
               100.0 * pf.sec[i] / total);
    goto report;
step_fail:
    cli_report_error("bench", "a step failed");
    goto out;
report:
    rc = 0;
out:
    comet_kv_seq_free(&seq);
    comet_runner_free(&run);
    comet_sampler_free(smp);
    comet_backend_free(be);
    comet_model_free(m);
    free(prompt);
    free(logits);
    return rc;
}

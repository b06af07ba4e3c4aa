/* comet/bench.h — end-to-end speed of one model on one backend: prefill tokens/s, decode
 * tokens/s at a fixed batch of B sequences (default 1), and where one decode step's time
 * goes (per op); and the offline serving throughput of the engine (comet_bench_throughput).
 *
 * Token ids are random (seeded), so a synthetic model without a tokenizer
 * (comet_model_synthetic) runs the same way as a real one. Every step ends with greedy
 * sampling as comet_generate does it (on the GPU the backend samples: only the token id
 * comes back; on the CPU the host's sampler). Times are host wall-clock around whole
 * steps (a step returns when its token is on the host); medians over the repetitions.
 * The per-op profile comes from one extra decode step run op by op: the profiler waits
 * for the backend after each op, so each op's time includes one synchronization and the
 * total exceeds the plain step time; its last op, "sample", is the sampling call after
 * the forward pass. The host enqueue time is from a decode step's first op to its last
 * op enqueued, without waiting: when it is close to the step time, the step is bound by
 * the host's launches. With tensor_parallel != 0 the ops are rank 0's ("gather heads" and
 * "all_reduce", the collectives, include waiting for the other ranks) and the enqueue time
 * is not measured (0).
 */
#ifndef COMET_BENCH_H
#define COMET_BENCH_H

#include <stdint.h>

#include "comet/backend.h"
#include "comet/engine.h"
#include "comet/model.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COMET_BENCH_MAX_REPS 101   /* repetitions at most */
#define COMET_BENCH_MAX_OPS 32     /* ops the per-op profile tells apart */
#define COMET_BENCH_MAX_BATCH 4096 /* decode_batch at most */

typedef struct comet_bench_params {
    int prompt_tokens;   /* prefill prompt length (default 512) */
    int decode_tokens;   /* decode steps after it (default 128) */
    int reps;            /* timed repetitions, 1..COMET_BENCH_MAX_REPS, after one warm-up
                        * (default 5) */
    uint64_t seed;       /* the random token ids (default 1) */
    int tensor_parallel; /* 0 (default): one device; N >= 1: the model split over N devices
                          * of the backend's kind (tensor parallelism: cuda:d..d+N-1, or N CPU
                          * ranks); N <= COMET_MAX_TENSOR_PARALLEL. No per-op profile then */
    int decode_batch;    /* B sequences decoded together, 1..COMET_BENCH_MAX_BATCH (default 1):
                          * sequence b's prompt is random from seed + b (so sequence b at batch
                          * B is the batch-1 run with seed + b); the prompts are prefilled
                          * max(1, 2048 / prompt_tokens) to a step, then every decode step
                          * feeds the B of them */
    int32_t *tokens;     /* NULL, or caller-owned [decode_batch, decode_tokens + 1]: sequence
                          * b's greedy tokens of the last timed repetition (the token after
                          * the prompt, then one per decode step) */
} comet_bench_params;

comet_bench_params comet_bench_default_params(void);

/* One op of the profiled decode step. */
typedef struct comet_bench_op {
    const char *name; /* the forward pass's op name ("matmul q", ..., "sample"); static */
    int calls;        /* times it ran in the step */
    double seconds;   /* its time in the step, each call waited for */
} comet_bench_op;

typedef struct comet_bench_result {
    double prefill_tok_s; /* median B * prompt_tokens / seconds of the B prefills */
    double decode_tok_s;  /* median B * decode_tokens / decode seconds */
    double enqueue_ms;    /* host enqueue time of one decode step; 0 for a host-memory
                           * backend, which computes as it goes, and with tensor_parallel */
    double load_s;        /* seconds to set the model up on the backend */
    int n_ops;
    comet_bench_op ops[COMET_BENCH_MAX_OPS]; /* [n_ops] in order of first call (rank 0's
                                              * with tensor_parallel) */
} comet_bench_result;

/* Benchmark `m` on `be` (both borrowed): load the weights onto the backend, then
 * reps + 1 runs of B prefills of prompt_tokens and decode_tokens greedy decode steps at
 * batch B (the first run a warm-up), then the profiled decode steps at batch B (one with
 * tensor_parallel). Fills *r and returns COMET_OK, or COMET_ERR_INVALID_ARG for counts,
 * decode_batch or tensor_parallel out of range or prompt_tokens + decode_tokens + 2
 * positions beyond the model's context (named),
 * COMET_ERR_NUMERIC when the logits are not finite, COMET_ERR_NOMEM, or the error of the
 * setup or of a failed step. */
comet_status comet_bench(const comet_model *m, comet_backend *be, const comet_bench_params *p,
                         comet_bench_result *r);

/* ---- offline serving throughput (like vLLM's benchmark_throughput) ----
 *
 * n_requests requests, each a prompt of exactly input_len random token ids (seeded) and
 * output_len generated tokens (greedy, EOS ignored), all submitted at once to an engine
 * (comet/engine.h) that the benchmark starts over the model and frees at the end. One
 * warm-up request (input_len tokens, min(2, output_len) generated) runs first and is not
 * counted. Times are host wall-clock: the run starts at the first submit and ends at the
 * last FINISHED event.
 */

typedef struct comet_bench_throughput_params {
    int input_len;              /* I prompt tokens per request (>= 1) */
    int output_len;             /* O generated tokens per request (>= 1); I + O <= the
                                 * model's context */
    int n_requests;             /* N requests (>= 1) */
    uint64_t seed;              /* the prompts' token ids (default 1) */
    comet_engine_params engine; /* the engine's batch limits, KV pool (n_pages <= 0: sized
                                 * from device memory under gpu_memory_fraction), device,
                                 * threads; max_waiting is raised to n_requests */
} comet_bench_throughput_params;

/* I = O = 128, N = 64, seed 1, the engine's defaults. */
comet_bench_throughput_params comet_bench_throughput_default_params(void);

typedef struct comet_bench_throughput_result {
    uint64_t output_tokens; /* N * O: checked, every request produced exactly O */
    double wall_s;          /* first submit to last FINISHED */
    /* first submit to the last submit's return (the engine copies each prompt and primes
     * its detokenizer; steps run meanwhile) */
    double submit_s;
    double output_tok_s;           /* output_tokens / wall_s */
    double total_tok_s;            /* (I + O) * N / wall_s */
    double ttft_p50_s, ttft_p99_s; /* submit to the first TOKEN event, over the requests */
    double tpot_p50_s, tpot_p99_s; /* per request (last token - first token) / (O - 1);
                                    * 0 when O == 1 */
    double mean_batch_seqs;        /* sequences per engine step, mean over the steps */
    double mean_batch_tokens;      /* tokens per engine step (prefill chunks and decodes), mean */
    uint64_t steps, preemptions;
    double step_s;        /* mean engine step (host before + forward + host after) */
    double host_before_s; /* mean per step: scheduling and the batch before the forward pass */
    double forward_s;     /* mean per step: the forward pass and sampling */
    double host_after_s;  /* mean per step: tokens, detokenization, events after it */
    double host_share;    /* (host before + host after) / step time, over all steps */
    int kv_pool_tokens;   /* the KV pool's capacity: pages * page_size */
    int kv_pool_seqs;     /* sequences of I + O tokens the pool holds at once */
    double init_s;        /* the engine's start: backend, weights, KV pool */
    comet_engine_memory memory; /* the engine's memory at the end of the run: weights,
                                 * workspace, KV pool, the peak device use (0 on a host
                                 * backend) */
} comet_bench_throughput_result;

/* Run the offline throughput benchmark of `m` (borrowed; it must have a tokenizer, which
 * the engine's detokenization needs) as described above; fill *r. Returns COMET_OK;
 * COMET_ERR_INVALID_ARG for I, O or N < 1 or I + O beyond the model's context or the KV
 * pool (given, or as sized from memory) (named); the engine's failure to start or a refused request (comet_last_error()
 * names it); COMET_ERR_INTERNAL when a request finished with fewer or more than O tokens
 * or not by its length (named: a benchmark that drops tokens is a defect);
 * COMET_ERR_NOMEM. */
comet_status comet_bench_throughput(const comet_model *m, const comet_bench_throughput_params *p,
                                    comet_bench_throughput_result *r);

#ifdef __cplusplus
}
#endif
#endif

/* comet/bench.h — end-to-end speed of one model on one backend: prefill tokens/s on one
 * prompt, batch-1 decode tokens/s, and where one decode step's time goes (per op).
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
#include "comet/model.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COMET_BENCH_MAX_REPS 101 /* repetitions at most */
#define COMET_BENCH_MAX_OPS 32   /* ops the per-op profile tells apart */

typedef struct comet_bench_params {
    int prompt_tokens;   /* prefill prompt length (default 512) */
    int decode_tokens;   /* decode steps after it (default 128) */
    int reps;            /* timed repetitions, 1..COMET_BENCH_MAX_REPS, after one warm-up
                        * (default 5) */
    uint64_t seed;       /* the random token ids (default 1) */
    int tensor_parallel; /* 0 (default): one device; N >= 1: the model split over N devices
                          * of the backend's kind (tensor parallelism: cuda:d..d+N-1, or N CPU
                          * ranks); N <= COMET_MAX_TENSOR_PARALLEL. No per-op profile then */
} comet_bench_params;

comet_bench_params comet_bench_default_params(void);

/* One op of the profiled decode step. */
typedef struct comet_bench_op {
    const char *name; /* the forward pass's op name ("matmul q", ..., "sample"); static */
    int calls;        /* times it ran in the step */
    double seconds;   /* its time in the step, each call waited for */
} comet_bench_op;

typedef struct comet_bench_result {
    double prefill_tok_s; /* median prompt_tokens / prefill seconds */
    double decode_tok_s;  /* median decode_tokens / decode seconds */
    double enqueue_ms;    /* host enqueue time of one decode step; 0 for a host-memory
                           * backend, which computes as it goes, and with tensor_parallel */
    double load_s;        /* seconds to set the model up on the backend */
    int n_ops;
    comet_bench_op ops[COMET_BENCH_MAX_OPS]; /* [n_ops] in order of first call (rank 0's
                                              * with tensor_parallel) */
} comet_bench_result;

/* Benchmark `m` on `be` (both borrowed): load the weights onto the backend, then
 * reps + 1 runs of a prefill of prompt_tokens and decode_tokens greedy decode steps (the
 * first a warm-up), then the profiled decode steps (one with tensor_parallel). Fills
 * *r and returns COMET_OK, or COMET_ERR_INVALID_ARG for counts or tensor_parallel out of
 * range or prompt_tokens + decode_tokens + 2 positions beyond the model's context (named),
 * COMET_ERR_NUMERIC when the logits are not finite, COMET_ERR_NOMEM, or the error of the
 * setup or of a failed step. */
comet_status comet_bench(const comet_model *m, comet_backend *be, const comet_bench_params *p,
                         comet_bench_result *r);

#ifdef __cplusplus
}
#endif
#endif

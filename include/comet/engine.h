/* comet/engine.h — the serving engine: a request queue, a continuous-batching scheduler
 * with chunked prefill and preemption, and the KV page pool, driven by one engine thread.
 *
 * Callers submit requests (prompt token ids, sampling parameters, stop conditions) from
 * any thread and receive tokens through a callback run on the engine thread. Each step
 * the scheduler builds one batch: decode tokens of running sequences first, then prefill
 * chunks (FCFS) up to max_batch_tokens tokens and max_seqs sequences. When the page pool
 * cannot hold a step, the newest running sequence is preempted: its pages are freed and
 * it is recomputed later from its tokens (sampled tokens are kept). A cancelled request
 * frees its pages at the next step boundary. Greedy output does not depend on what else
 * shares the batch (within fp rounding). See docs/architecture.md "Batches and the KV cache".
 */
#ifndef COMET_ENGINE_H
#define COMET_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "comet/model.h"
#include "comet/sampling.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comet_engine comet_engine;

typedef struct comet_engine_params {
    int max_seqs;         /* sequences per step (default 64) */
    int max_batch_tokens; /* tokens per step (default 512) */
    int n_pages;          /* KV pool pages; <= 0 (the default): sized from memory on one
                           * device (comet_engine_plan_memory), COMET_ENGINE_FIXED_PAGES on a
                           * backend whose memory is the host's or with tensor_parallel */
    int page_size;        /* tokens per page (default 16) */
    int max_waiting;      /* queued requests before submit answers COMET_QUEUE_FULL (256) */
    int n_threads;        /* CPU backend threads in all (split between tensor-parallel
                           * ranks); <= 0: all cores */
    const char *device;   /* backend: "cpu" (NULL), "cuda" or "cuda:N" (comet/backend.h
                           * comet_backend_open); borrowed for comet_engine_init */
    int batch_invariant;  /* 1: a request's tokens do not depend on the other requests in
                           * its steps, bit for bit (docs/numerics.md "Reproducibility");
                           * slower on the GPU. Default 0 */
    int tensor_parallel;  /* 0 (default): one device; N >= 1: the model split over N devices
                           * of device's kind (tensor parallelism: cuda:d..d+N-1, or N CPU
                           * ranks); N <= COMET_MAX_TENSOR_PARALLEL */
    double gpu_memory_fraction; /* the fraction of the device's total memory comet may use in
                                 * all, in (0, 1] (default 0.9, as vLLM's): the weights, the
                                 * workspace and the KV pool, with what other processes
                                 * already hold counted against it. Used when the pool is
                                 * sized from memory (n_pages <= 0 on a device) */
} comet_engine_params;

/* KV pool pages when n_pages <= 0 and the pool is not sized from memory (a host-memory
 * backend, or tensor parallelism): 512 pages of 16 tokens. */
#define COMET_ENGINE_FIXED_PAGES 512

/* The most sequences one step takes (max_seqs). */
#define COMET_ENGINE_MAX_SEQS 1024

comet_engine_params comet_engine_default_params(void);

/* What the engine holds in memory (comet_engine_get_memory). */
typedef struct comet_engine_memory {
    size_t device_total;     /* bytes of device memory (0: host-memory backend) */
    size_t weights;          /* bytes the model's weights take on the backend (measured: the
                              * drop of the device's free memory across their load; 0 on a
                              * host backend, whose weights are the model's arrays) */
    size_t workspace;        /* bytes of the forward pass's workspace (activations, logits)
                              * as allocated at start; what the backend grows during steps
                              * (split-K and attention partials, graphs) is in the plan's
                              * headroom and shows in device_used_peak */
    size_t kv_pool;          /* bytes of the KV page pool */
    int kv_pool_pages, kv_pool_tokens;
    size_t device_used_peak; /* highest device bytes in use (total - free, every process's
                              * use) seen at init and at step boundaries (asked at most every
                              * 10 ms); 0 for a host backend */
    int page_size;           /* tokens per page */
    int max_seqs_ctx;        /* sequences of the model's whole context the pool holds */
    int max_seqs_2048;       /* sequences of 2048 tokens the pool holds */
} comet_engine_memory;

/* A snapshot of e's memory; thread-safe. With tensor parallelism the figures are rank 0's
 * device, weights and workspace, and kv_pool is 0 (each rank holds its own pool). */
void comet_engine_get_memory(comet_engine *e, comet_engine_memory *out);

/* How the KV pool of model m is sized on a device (comet_engine_plan_memory). */
typedef struct comet_engine_memory_plan {
    size_t budget;     /* gpu_memory_fraction * device_total: what comet may use in all */
    size_t used;       /* device_total - device_free: held already (this process and others) */
    size_t weights;    /* the weights' bytes estimated from the model's config: W4Ax linears
                        * 4-bit codes + fp16 block scales, other linears 2 bytes a weight,
                        * the fp32 embedding, the fp16 lm_head and fp32 norms */
    size_t workspace;  /* the forward pass's workspace (comet_forward_init's buffers) */
    size_t headroom;   /* kept free for what the backend allocates during steps:
                        * COMET_ENGINE_HEADROOM_BYTES plus twice the largest stacked GEMM
                        * output of a step (max_batch_tokens x the widest group, fp32) */
    size_t page_bytes; /* one KV page: every layer, K and V, codes and scales in the
                        * model's KV format as the CUDA backend lays them out */
    int page_size;
    int n_pages;       /* pages the pool gets (0 when none fit) */
    int pages_per_seq; /* pages one sequence of the model's context (n_ctx) takes */
    int max_seqs_ctx;  /* n_pages / pages_per_seq */
    int max_seqs_2048; /* sequences of 2048 tokens */
} comet_engine_memory_plan;

/* Room for the backend's step-time allocations: split-K and attention partials, decode
 * graphs and the CUDA context's own growth (1 GiB). */
#define COMET_ENGINE_HEADROOM_BYTES ((size_t)1 << 30)

/* Plan the KV pool of model m under p (page_size, max_batch_tokens, gpu_memory_fraction)
 * on a device of device_total bytes with device_free bytes free now. `loaded` 0: the
 * weights and workspace are not on the device yet, so their estimates are taken from what
 * is left; 1: they are, and device_free already shows them. Then
 *   n_pages = (budget - used - [weights + workspace if !loaded] - headroom) / page_bytes.
 * The engine checks with loaded 0 before any weight goes to the device and sizes the pool
 * with loaded 1 after, through this one function, so the two agree but for the estimates.
 * COMET_OK with *out filled; COMET_ERR_INVALID_ARG for a fraction outside (0, 1], no
 * device memory (device_total 0) or bad sizes; COMET_ERR_NOMEM (with *out filled) when the
 * pool cannot hold one sequence of the model's context, naming the numbers and what would
 * help. */
comet_status comet_engine_plan_memory(const comet_model *m, const comet_engine_params *p,
                                      size_t device_total, size_t device_free, int loaded,
                                      comet_engine_memory_plan *out);

#define COMET_ENGINE_MAX_STOP 4
#define COMET_ENGINE_MAX_TOP 20

/* One request. Arrays and strings are copied by submit. */
typedef struct comet_request_params {
    const int32_t *prompt; /* [n_prompt] ids, BOS/chat template already applied */
    int n_prompt;
    int max_tokens;                /* new tokens at most; <= 0: up to the context */
    comet_sampler_params sampling; /* checked at submit (comet_sampler_params_check); the
                                    * penalties look at the generated tokens (the window
                                    * repeat_last_n of them); logit_bias is copied */
    int has_seed;                  /* 0: sampling.seed is ignored, a seed is drawn from the
                                    * clock */
    const char *const *stop;       /* [n_stop] stop strings, never emitted */
    int n_stop;
    int ignore_eos;
    int logprobs;        /* report each generated token's logprob ... */
    int top_logprobs;    /* ... and the top N (0..20) alternatives */
    int prompt_logprobs; /* also report logprobs of the prompt tokens (echo) */
} comet_request_params;

/* Zeroed params with sampling temperature 1, top_k 0, top_p 1, min_p 0, penalties off
 * (repeat_last_n -1: all generated tokens), no logit_bias. */
comet_request_params comet_request_default_params(void);

typedef enum comet_event_kind {
    COMET_EVENT_PROMPT_TOKEN, /* prompt token i (in order) with its logprob (i > 0) */
    COMET_EVENT_TOKEN,        /* a generated token, its logprobs and newly released text */
    COMET_EVENT_FINISHED,     /* the request is over; last event of every request */
    COMET_EVENT_KIND_COUNT
} comet_event_kind;

typedef enum comet_finish_reason {
    COMET_FINISH_STOP,      /* EOS or a stop string */
    COMET_FINISH_LENGTH,    /* max_tokens or the context is full */
    COMET_FINISH_CANCELLED, /* comet_engine_cancel, or the engine shut down */
    COMET_FINISH_ERROR,     /* a step failed; `error` says why */
    COMET_FINISH_REASON_COUNT
} comet_finish_reason;

/* Everything pointed to is valid only during the callback. */
typedef struct comet_engine_event {
    comet_event_kind kind;
    uint64_t request_id;
    int32_t token;   /* PROMPT_TOKEN, TOKEN */
    int has_logprob; /* 0 for the first prompt token, or when not asked for */
    float logprob;   /* log-softmax of the model's logits (before sampling) */
    int n_top;
    const int32_t *top_ids;    /* [n_top] best first */
    const float *top_logprobs; /* [n_top] */
    const char *text;          /* TOKEN: text released by this token (may be empty: held
                                  while it could start a stop string, or mid-character);
                                  FINISHED: the rest of the text */
    size_t text_len;
    comet_finish_reason finish; /* FINISHED */
    int n_prompt, n_generated;  /* FINISHED */
    int n_preemptions;          /* FINISHED: times this request was preempted */
    const char *error;          /* FINISHED with COMET_FINISH_ERROR */
} comet_engine_event;

/* Called on the engine thread; must not block and must not call back into the engine
 * except comet_engine_cancel. */
typedef void (*comet_engine_cb)(void *user, const comet_engine_event *ev);

/* Start an engine over a loaded model (borrowed; must outlive the engine). NULL +
 * comet_last_error() on bad params (named) or no memory. */
comet_engine *comet_engine_init(const comet_model *m, const comet_engine_params *p);

/* Stop the engine thread; requests still queued or running finish with CANCELLED
 * (their callbacks run before this returns). NULL is a no-op. */
void comet_engine_free(comet_engine *e);

/* Submit a request; thread-safe. On COMET_OK, *id is the request's id and `cb` will see
 * its events, ending with exactly one FINISHED. Otherwise no callback is made:
 * COMET_QUEUE_FULL (soft) when max_waiting requests are queued; COMET_ERR_CONTEXT when
 * the prompt leaves no room in the context or in the whole page pool (names the numbers);
 * COMET_ERR_INVALID_ARG for an empty prompt, ids outside the vocabulary, bad sampling
 * params (named). */
comet_status comet_engine_submit(comet_engine *e, const comet_request_params *rp,
                                 comet_engine_cb cb, void *user, uint64_t *id);

/* Cancel a request; thread-safe, idempotent. Its pages are freed and its FINISHED
 * (CANCELLED) event sent at the next step boundary. Unknown/finished ids are ignored. */
void comet_engine_cancel(comet_engine *e, uint64_t id);

/* Cancel every queued and running request (shutdown). Thread-safe. */
void comet_engine_cancel_all(comet_engine *e);

typedef enum comet_request_state {
    COMET_REQUEST_UNKNOWN, /* never submitted, or finished */
    COMET_REQUEST_WAITING,
    COMET_REQUEST_RUNNING,
    COMET_REQUEST_STATE_COUNT
} comet_request_state;

comet_request_state comet_engine_request_state(comet_engine *e, uint64_t id);

/* Counters since the engine started. A step is one forward pass (steps in which nothing
 * could be scheduled are not counted). Its time splits into three host wall-clock parts:
 * before (from the engine loop taking its lock to the forward pass being called: cancels,
 * scheduling, page reservation, the batch and its block tables), forward (the forward pass
 * and the sampling of the step's rows, until the ids are on the host; on a device backend
 * this includes the host's enqueueing of the kernels and the wait for them; on the CPU the
 * computation itself) and after (tokens appended, detokenization, stop strings, events and
 * their callbacks, finished requests freed). */
typedef struct comet_engine_stats {
    int running, waiting;
    int pages_used, pages_free;
    uint64_t steps, preemptions, tokens_generated, prompt_tokens;
    uint64_t step_seqs;   /* sequences in the steps, summed over steps (mean batch size:
                           * step_seqs / steps) */
    uint64_t step_tokens; /* tokens fed to the steps (prefill chunks and decodes), summed */
    double host_before_s, forward_s, host_after_s; /* the steps' parts, seconds summed */
} comet_engine_stats;

void comet_engine_get_stats(comet_engine *e, comet_engine_stats *s);

/* 1: no new step starts (the one running finishes) until comet_engine_pause(e, 0); requests
 * submitted meanwhile wait, and cancellations take effect when stepping resumes. For callers
 * that submit a set of requests "all at once" (the offline throughput benchmark), so that the
 * first step sees them all. Thread-safe. comet_engine_free and cancel_all still stop a
 * paused engine. */
void comet_engine_pause(comet_engine *e, int paused);

/* Block until no request is queued or running and the engine thread has left its last
 * step (every callback of the finished requests has returned and the step counters of
 * comet_engine_get_stats are final), or timeout_s passes (< 0: forever). Returns 1 when
 * idle. */
int comet_engine_wait_idle(comet_engine *e, double timeout_s);

const char *comet_finish_reason_name(comet_finish_reason r); /* "stop", "length", ... */

#ifdef __cplusplus
}
#endif
#endif

/* bench.c — comet_bench (comet/bench.h): prefill and decode at a fixed batch of B
 * sequences through one runner, greedy sampling as comet_generate does it, and a decode
 * step at batch B profiled op by op through the forward pass's profiler hook (with tensor
 * parallelism: rank 0's ops). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "comet/bench.h"
#include "core/clock.h"
#include "engine/runner.h"
#include "engine/sampler.h"

/* Prompt tokens of several sequences prefilled in one step at most (decode batch > 1). */
#define PREFILL_TOKENS 2048

comet_bench_params comet_bench_default_params(void) {
    return (comet_bench_params){.prompt_tokens = 512, .decode_tokens = 128, .reps = 5, .seed = 1};
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
    comet_bench_op *ops; /* [COMET_BENCH_MAX_OPS] */
} prof;

static void on_op(void *user, const char *op) {
    prof *p = user;
    if (!p->wait) { /* how long the host takes to enqueue the step */
        double t = comet_now_s();
        if (!p->t_start)
            p->t_start = t;
        if (!op)
            p->t_queued = t;
        return;
    }
    p->be->ops->sync(p->be);
    double t = comet_now_s();
    if (p->cur) {
        int i = 0;
        while (i < p->n && strcmp(p->ops[i].name, p->cur))
            i++;
        if (i == p->n && p->n < COMET_BENCH_MAX_OPS)
            p->ops[p->n++].name = p->cur;
        if (i < COMET_BENCH_MAX_OPS) {
            p->ops[i].seconds += t - p->t;
            p->ops[i].calls++;
        }
    }
    p->cur = op;
    p->t = comet_now_s();
}

static int32_t random_token(uint64_t *state, int V) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (int32_t)(*state % (uint64_t)V);
}

/* The sequences decoded together and their scratch. */
typedef struct dec_batch {
    int B;
    int prefill_seqs;         /* sequences prefilled together in one step */
    comet_kv_seq *seqs;       /* [B] */
    int32_t *ids;             /* [B] each sequence's last picked token, fed to the next step */
    float *logits;            /* [max(B, 1), V] host scratch of comet_runner_step_sample */
    comet_runner_draw *draws; /* [B] all greedy through one sampler (greedy keeps no state) */
} dec_batch;

/* Run the step built in run->bb and pick its rows' tokens greedily into ids [n_logits]. */
static comet_status step_greedy(comet_runner *run, dec_batch *d, int32_t *ids) {
    COMET_TRY(comet_runner_step_sample(run, d->draws, d->logits, ids));
    for (int i = 0; i < run->bb.batch.n_logits; i++)
        if (ids[i] < 0)
            return comet_set_error(COMET_ERR_NUMERIC, "bench: the logits are not finite");
    return COMET_OK;
}

/* Prefill sequences b .. b + n - 1 (emptied first) with their prompts [n, prompt_n] in one
 * step and pick each one's first token into d->ids[b ..]. */
static comet_status prefill_group(comet_runner *run, dec_batch *d, int b, int n,
                                  const int32_t *prompts, int prompt_n) {
    comet_batch_builder_reset(&run->bb);
    for (int j = 0; j < n; j++) {
        comet_kv_seq *seq = &d->seqs[b + j];
        comet_kv_seq_release(&run->pool, seq);
        COMET_TRY(comet_kv_seq_reserve(&run->pool, seq, prompt_n));
        COMET_TRY(
            comet_batch_builder_add(&run->bb, seq, prompts + (size_t)j * prompt_n, prompt_n, 1));
    }
    return step_greedy(run, d, &d->ids[b]);
}

/* Append each sequence's token d->ids[b] to it, run one decode step of the B of them and
 * pick each one's next token into d->ids[b]. */
static comet_status decode_step(comet_runner *run, dec_batch *d) {
    comet_batch_builder_reset(&run->bb);
    for (int b = 0; b < d->B; b++) {
        COMET_TRY(comet_kv_seq_reserve(&run->pool, &d->seqs[b], 1));
        COMET_TRY(comet_batch_builder_add(&run->bb, &d->seqs[b], &d->ids[b], 1, 1));
    }
    return step_greedy(run, d, d->ids);
}

/* Record each sequence's current token as its token s of the caller's [B, decode_n + 1]. */
static void keep_tokens(const comet_bench_params *p, const dec_batch *d, int s) {
    if (p->tokens)
        for (int b = 0; b < d->B; b++)
            p->tokens[(size_t)b * (p->decode_tokens + 1) + s] = d->ids[b];
}

/* The timed runs, then the two profiled decode steps, into *r. prompts: [B, prompt_n]. */
static comet_status bench_runs(comet_runner *run, dec_batch *d, const comet_bench_params *p,
                               const int32_t *prompts, comet_bench_result *r) {
    const int prompt_n = p->prompt_tokens, decode_n = p->decode_tokens, B = d->B;
    double pre[COMET_BENCH_MAX_REPS], dec[COMET_BENCH_MAX_REPS];
    for (int rep = 0; rep <= p->reps; rep++) { /* rep == 0 warms up */
        double t0 = comet_now_s();
        for (int b = 0; b < B; b += d->prefill_seqs) {
            int n = B - b < d->prefill_seqs ? B - b : d->prefill_seqs;
            COMET_TRY(prefill_group(run, d, b, n, prompts + (size_t)b * prompt_n, prompt_n));
        }
        double t1 = comet_now_s();
        keep_tokens(p, d, 0);
        for (int s = 0; s < decode_n; s++) {
            COMET_TRY(decode_step(run, d));
            keep_tokens(p, d, s + 1);
        }
        double t2 = comet_now_s();
        if (rep > 0) {
            pre[rep - 1] = (double)B * prompt_n / (t1 - t0);
            dec[rep - 1] = (double)B * decode_n / (t2 - t1);
        }
    }
    r->prefill_tok_s = median(pre, p->reps);
    r->decode_tok_s = median(dec, p->reps);
    /* two more decode steps: the host's enqueue time (a device-memory backend on one
     * device only: a host-memory backend computes each op as it is called, so the span
     * would be one unmedianed step's compute, not an enqueue time; with tensor parallelism
     * the ranks' hosts enqueue at once), then op by op on rank 0, whose collectives' times
     * include waiting for the other ranks */
    prof hq = {.be = run->be, .wait = 0, .ops = r->ops};
    prof pf = {.be = run->be, .wait = 1, .ops = r->ops};
    prof *passes[2] = {&hq, &pf};
    int enqueue = !p->tensor_parallel && !run->be->ops->host_memory;
    for (int k = enqueue ? 0 : 1; k < 2; k++) {
        comet_forward_set_profiler(run->fc, on_op, passes[k]);
        comet_status st = decode_step(run, d);
        comet_forward_set_profiler(run->fc, NULL, NULL);
        COMET_TRY(st);
    }
    if (pf.n < COMET_BENCH_MAX_OPS) /* the sampling call after the forward pass's last op */
        r->ops[pf.n++] = (comet_bench_op){"sample", 1, comet_now_s() - pf.t};
    r->n_ops = pf.n;
    r->enqueue_ms = hq.t_queued > 0 ? 1e3 * (hq.t_queued - hq.t_start) : 0.0;
    return COMET_OK;
}

comet_status comet_bench(const comet_model *m, comet_backend *be, const comet_bench_params *p,
                         comet_bench_result *r) {
    const comet_model_config *c = &m->cfg;
    if (p->prompt_tokens < 1 || p->decode_tokens < 1 || p->reps < 1 ||
        p->reps > COMET_BENCH_MAX_REPS)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "bench: prompt_tokens and decode_tokens must be >= 1 and reps in "
                               "[1, %d]",
                               COMET_BENCH_MAX_REPS);
    if (p->tensor_parallel < 0 || p->tensor_parallel > COMET_MAX_TENSOR_PARALLEL)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "bench: tensor_parallel must be 0 (one device) or 1..%d ranks, got "
                               "%d",
                               COMET_MAX_TENSOR_PARALLEL, p->tensor_parallel);
    if (p->decode_batch < 0 || p->decode_batch > COMET_BENCH_MAX_BATCH)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "bench: decode_batch must be in [1, %d] (0: 1), got %d",
                               COMET_BENCH_MAX_BATCH, p->decode_batch);
    const int P = 16, V = c->n_vocab, B = p->decode_batch > 0 ? p->decode_batch : 1;
    const int ctx = p->prompt_tokens + p->decode_tokens + 2; /* + the two profiled steps */
    if (ctx > c->n_ctx)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%d + %d tokens exceed the model's context of %d", p->prompt_tokens,
                               p->decode_tokens, c->n_ctx);
    memset(r, 0, sizeof *r);
    comet_runner run = {0};
    comet_sampler_params sp = comet_sampler_default_params();
    sp.temperature = 0.0f; /* greedy */
    comet_sampler *smp = comet_sampler_init(&sp, V);
    dec_batch d = {.B = B,
                   .seqs = calloc((size_t)B, sizeof *d.seqs),
                   .ids = calloc((size_t)B, sizeof *d.ids),
                   .logits = malloc((size_t)B * V * sizeof *d.logits),
                   .draws = malloc((size_t)B * sizeof *d.draws)};
    int32_t *prompts = malloc((size_t)B * p->prompt_tokens * sizeof *prompts);
    comet_status st = COMET_OK;
    if (!prompts || !smp || !d.seqs || !d.ids || !d.logits || !d.draws) {
        st = comet_set_error(COMET_ERR_NOMEM, "bench: out of memory for a batch of %d", B);
        goto out;
    }
    for (int b = 0; b < B; b++)
        d.draws[b] = (comet_runner_draw){smp, NULL, 0};
    const int pages_per_seq = (ctx + P - 1) / P;
    /* a step holds a whole prompt, a decode of the B sequences, and prompts of several
     * sequences up to PREFILL_TOKENS tokens */
    long group =
        (long)B * p->prompt_tokens < PREFILL_TOKENS ? (long)B * p->prompt_tokens : PREFILL_TOKENS;
    int max_tokens = p->prompt_tokens > B ? p->prompt_tokens : B;
    if (group > max_tokens)
        max_tokens = (int)group;
    d.prefill_seqs = max_tokens / p->prompt_tokens;
    comet_runner_params rp = {.max_batch_tokens = max_tokens,
                              .max_seqs = B,
                              .n_pages = B * pages_per_seq + 1,
                              .page_size = P,
                              .tensor_parallel = p->tensor_parallel};
    double t_load = comet_now_s();
    if ((st = comet_runner_init(&run, m, be, &rp)) < 0)
        goto out;
    for (int b = 0; b < B; b++)
        if ((st = comet_kv_seq_init(&d.seqs[b], ctx, P)) < 0)
            goto out;
    r->load_s = comet_now_s() - t_load;
    for (int b = 0; b < B; b++) { /* sequence b: the batch-1 prompt of seed + b */
        uint64_t rng = 0x9E3779B97F4A7C15ull ^ (p->seed + (uint64_t)b);
        for (int i = 0; i < p->prompt_tokens; i++)
            prompts[(size_t)b * p->prompt_tokens + i] = random_token(&rng, V);
    }
    st = bench_runs(&run, &d, p, prompts, r);
out:
    for (int b = 0; d.seqs && b < B; b++)
        comet_kv_seq_free(&d.seqs[b]);
    comet_runner_free(&run);
    comet_sampler_free(smp);
    free(d.seqs);
    free(d.ids);
    free(d.logits);
    free(d.draws);
    free(prompts);
    return st;
}

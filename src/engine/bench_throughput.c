/* bench_throughput.c — comet_bench_throughput (comet/bench.h): the engine's offline serving
 * throughput, as vLLM's benchmark_throughput measures it: a fixed set of requests with
 * random-token prompts of one length and one output length (EOS ignored), all submitted at
 * once. Each request's events are timed on the engine thread (TTFT, TPOT); the engine's
 * step counters (comet_engine_stats) give the mean batch and the host share of a step.
 * It does not load models or print: the caller (comet bench --throughput) does.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/bench.h"
#include "core/clock.h"

comet_bench_throughput_params comet_bench_throughput_default_params(void) {
    return (comet_bench_throughput_params){.input_len = 128,
                                           .output_len = 128,
                                           .n_requests = 64,
                                           .seed = 1,
                                           .engine = comet_engine_default_params()};
}

struct run;

/* One request's timeline, written by the engine thread in its callback. */
typedef struct timed_req {
    struct run *run;
    double t_submit, t_first, t_last; /* submit, first and latest TOKEN event */
    int n_tokens;                     /* TOKEN events */
    int finished;
    comet_finish_reason why;
    int n_generated; /* FINISHED's count */
    char error[160];
} timed_req;

/* The requests of one run; `mu` and `cv` tell the submitting thread when all finished. */
typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_finished;
    double t_done;      /* the latest FINISHED event */
    double t_submitted; /* the last submit returned */
} run;

static void on_event(void *user, const comet_engine_event *ev) {
    timed_req *q = user;
    double t = comet_now_s();
    if (ev->kind == COMET_EVENT_TOKEN) {
        if (q->n_tokens++ == 0)
            q->t_first = t;
        q->t_last = t;
    } else if (ev->kind == COMET_EVENT_FINISHED) {
        q->why = ev->finish;
        q->n_generated = ev->n_generated;
        if (ev->error)
            snprintf(q->error, sizeof q->error, "%s", ev->error);
        pthread_mutex_lock(&q->run->mu);
        q->finished = 1;
        q->run->n_finished++;
        q->run->t_done = t;
        pthread_cond_broadcast(&q->run->cv);
        pthread_mutex_unlock(&q->run->mu);
    }
}

/* Block until n requests of r finished. */
static void wait_finished(run *r, int n) {
    pthread_mutex_lock(&r->mu);
    while (r->n_finished < n)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v [n] (sorted in place), interpolated linearly between the
 * closest ranks (numpy's default, which vLLM's benchmarks use). */
static double quantile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q * (n - 1);
    int i = (int)pos;
    if (i + 1 >= n)
        return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

/* xorshift64: the prompts' token ids in [0, V). */
static int32_t random_token(uint64_t *state, int V) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (int32_t)(*state % (uint64_t)V);
}

/* Submit the n requests qs [n] with their prompts [n, I] (O tokens each), all at once (the
 * engine paused while they go in, so that its first step sees them all), and wait until they
 * finished and the engine is idle. On a refused submit the ones submitted are cancelled and
 * waited for. */
static comet_status submit_all(comet_engine *e, run *rn, timed_req *qs, int n,
                               const int32_t *prompts, int I, int O) {
    comet_request_params rq = comet_request_default_params();
    rq.n_prompt = I;
    rq.max_tokens = O;
    rq.ignore_eos = 1;
    rq.sampling.temperature = 0.0f; /* greedy */
    rq.has_seed = 1;
    int done0 = rn->n_finished, n_sent = 0;
    comet_status st = COMET_OK;
    comet_engine_pause(e, 1);
    for (; n_sent < n; n_sent++) {
        timed_req *q = &qs[n_sent];
        q->run = rn;
        rq.prompt = prompts + (size_t)n_sent * I;
        q->t_submit = comet_now_s();
        if ((st = comet_engine_submit(e, &rq, on_event, q, NULL)) != COMET_OK)
            break;
    }
    rn->t_submitted = comet_now_s();
    comet_engine_pause(e, 0);
    if (st != COMET_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s",
                 st == COMET_QUEUE_FULL ? "the engine's queue is full" : comet_last_error());
        comet_engine_cancel_all(e);
        wait_finished(rn, done0 + n_sent);
        return comet_set_error(st < 0 ? st : COMET_ERR_INTERNAL,
                               "throughput: request %d of %d was refused: %s", n_sent + 1, n, why);
    }
    wait_finished(rn, done0 + n);
    comet_engine_wait_idle(e, -1); /* the last step's counters are in */
    return COMET_OK;
}

/* Every request finished by its length with exactly O tokens; else a named failure. */
static comet_status check_counts(const timed_req *qs, int n, int O) {
    for (int i = 0; i < n; i++) {
        const timed_req *q = &qs[i];
        if (q->why != COMET_FINISH_LENGTH || q->n_tokens != O || q->n_generated != O)
            return comet_set_error(COMET_ERR_INTERNAL,
                                   "throughput: request %d of %d finished (%s%s%s) with %d token "
                                   "events and %d generated tokens; %d were asked for",
                                   i + 1, n, comet_finish_reason_name(q->why),
                                   q->error[0] ? ": " : "", q->error, q->n_tokens, q->n_generated,
                                   O);
    }
    return COMET_OK;
}

/* The figures of the measured requests qs [N], submitted until t_submitted and done at
 * t_done, and the engine's counters over the run (s1 - s0) into *r. */
static comet_status figures(const comet_bench_throughput_params *p, const timed_req *qs,
                            double t_done, double t_submitted, const comet_engine_stats *s0,
                            const comet_engine_stats *s1, comet_bench_throughput_result *r) {
    const int N = p->n_requests, I = p->input_len, O = p->output_len;
    double *v = malloc((size_t)N * sizeof *v);
    if (!v)
        return comet_set_error(COMET_ERR_NOMEM, "throughput: out of memory");
    r->output_tokens = (uint64_t)N * (uint64_t)O;
    r->wall_s = t_done - qs[0].t_submit;
    r->submit_s = t_submitted - qs[0].t_submit;
    r->output_tok_s = (double)r->output_tokens / r->wall_s;
    r->total_tok_s = (double)(I + O) * N / r->wall_s;
    for (int i = 0; i < N; i++)
        v[i] = qs[i].t_first - qs[i].t_submit;
    r->ttft_p50_s = quantile(v, N, 0.50);
    r->ttft_p99_s = quantile(v, N, 0.99);
    if (O > 1) {
        for (int i = 0; i < N; i++)
            v[i] = (qs[i].t_last - qs[i].t_first) / (O - 1);
        r->tpot_p50_s = quantile(v, N, 0.50);
        r->tpot_p99_s = quantile(v, N, 0.99);
    }
    free(v);
    r->steps = s1->steps - s0->steps;
    r->preemptions = s1->preemptions - s0->preemptions;
    if (s1->tokens_generated - s0->tokens_generated != r->output_tokens)
        return comet_set_error(COMET_ERR_INTERNAL,
                               "throughput: the engine counted %llu generated tokens; %d requests "
                               "x %d are %llu",
                               (unsigned long long)(s1->tokens_generated - s0->tokens_generated), N,
                               O, (unsigned long long)r->output_tokens);
    if (r->steps > 0) {
        double n = (double)r->steps;
        double before = s1->host_before_s - s0->host_before_s;
        double fwd = s1->forward_s - s0->forward_s, after = s1->host_after_s - s0->host_after_s;
        r->mean_batch_seqs = (double)(s1->step_seqs - s0->step_seqs) / n;
        r->mean_batch_tokens = (double)(s1->step_tokens - s0->step_tokens) / n;
        r->host_before_s = before / n;
        r->forward_s = fwd / n;
        r->host_after_s = after / n;
        r->step_s = (before + fwd + after) / n;
        r->host_share = before + fwd + after > 0 ? (before + after) / (before + fwd + after) : 0;
    }
    return COMET_OK;
}

comet_status comet_bench_throughput(const comet_model *m, const comet_bench_throughput_params *p,
                                    comet_bench_throughput_result *r) {
    const int N = p->n_requests, I = p->input_len, O = p->output_len, V = m->cfg.n_vocab;
    memset(r, 0, sizeof *r);
    if (I < 1 || O < 1 || N < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "throughput: input_len, output_len and n_requests must be >= 1, "
                               "got %d, %d and %d",
                               I, O, N);
    if ((long)I + O > m->cfg.n_ctx)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "throughput: %d input + %d output tokens exceed the model's "
                               "context of %d",
                               I, O, m->cfg.n_ctx);
    comet_engine_params ep = p->engine;
    const int P = ep.page_size > 0 ? ep.page_size : 16;
    const int seq_pages = (I + O + P - 1) / P;
    if (ep.n_pages > 0 && ep.n_pages < seq_pages)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "throughput: the KV pool of %d pages of %d tokens cannot hold one "
                               "request of %d + %d tokens (%d pages)",
                               ep.n_pages, P, I, O, seq_pages);
    if (ep.max_waiting < N)
        ep.max_waiting = N;

    run rn = {.n_finished = 0};
    pthread_mutex_init(&rn.mu, NULL);
    pthread_cond_init(&rn.cv, NULL);
    comet_engine *e = NULL;
    timed_req *qs = calloc((size_t)N + 1, sizeof *qs); /* [N] measured, then the warm-up */
    int32_t *prompts = malloc((size_t)(N + 1) * I * sizeof *prompts);
    comet_status st = COMET_OK;
    if (!qs || !prompts) {
        st = comet_set_error(COMET_ERR_NOMEM, "throughput: out of memory for %d prompts of %d", N,
                             I);
        goto out;
    }
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ p->seed;
    for (size_t i = 0; i < (size_t)(N + 1) * I; i++)
        prompts[i] = random_token(&rng, V);
    double t_init = comet_now_s();
    if (!(e = comet_engine_init(m, &ep))) {
        st = comet_last_status();
        goto out;
    }
    r->init_s = comet_now_s() - t_init;
    comet_engine_get_memory(e, &r->memory);
    r->kv_pool_tokens = r->memory.kv_pool_tokens;
    r->kv_pool_seqs = r->memory.kv_pool_pages / seq_pages;
    if (r->kv_pool_seqs < 1) { /* a pool sized from memory can still be too small */
        st = comet_set_error(COMET_ERR_INVALID_ARG,
                             "throughput: the KV pool holds %d tokens (%d pages), less than one "
                             "request of %d + %d tokens",
                             r->kv_pool_tokens, r->memory.kv_pool_pages, I, O);
        goto out;
    }
    /* the warm-up: first-step costs (lazy set-up, caches) stay out of the figures */
    const int warm_o = O < 2 ? O : 2; /* within the context and the pool, as the requests */
    if ((st = submit_all(e, &rn, &qs[N], 1, prompts + (size_t)N * I, I, warm_o)) < 0 ||
        (st = check_counts(&qs[N], 1, warm_o)) < 0)
        goto out;
    comet_engine_stats s0, s1;
    comet_engine_get_stats(e, &s0);
    if ((st = submit_all(e, &rn, qs, N, prompts, I, O)) < 0 || (st = check_counts(qs, N, O)) < 0)
        goto out;
    comet_engine_get_stats(e, &s1);
    comet_engine_get_memory(e, &r->memory); /* the peak over the run */
    st = figures(p, qs, rn.t_done, rn.t_submitted, &s0, &s1, r);
out:
    comet_engine_free(e);
    pthread_cond_destroy(&rn.cv);
    pthread_mutex_destroy(&rn.mu);
    free(qs);
    free(prompts);
    return st;
}

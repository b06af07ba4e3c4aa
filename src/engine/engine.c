/* engine.c — the serving engine (see comet/engine.h): request queue, continuous-batching
 * scheduler with chunked prefill and preemption by recomputation and per-request sampling,
 * on one engine thread. A request's output (detokenization, stop strings, logprobs,
 * events) is request.c's.
 *
 * A request's tokens are its prompt followed by what it generated; KV holds the first
 * n_computed of them. Each step feeds every scheduled sequence tokens[n_computed ..
 * n_computed + k); when that reaches the last token, the step's logits for it give the
 * next token. A decode is the case k = 1. Preemption frees a sequence's pages and sets
 * n_computed = 0: it is recomputed from all its tokens when readmitted, and its sampler
 * state is kept, so nothing it produced changes.
 *
 * Locking: `mu` guards the incoming queue and the waiting/running lists. Only the engine
 * thread changes the lists (under `mu`) and it reads them without the lock; other threads
 * read them under `mu` (state queries, cancel). Callbacks run without the lock.
 */
#define _GNU_SOURCE
#include "comet/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "comet/tokenizer.h"
#include "core/clock.h"
#include "engine/request.h"
#include "engine/runner.h"
#include "engine/sampler.h"

#define PROMPT_LOGIT_ROWS 128 /* logits rows per step for prompt logprobs (echo) */

/* A sequence's part of the step being built. */
typedef struct plan {
    req *r;
    int k;        /* tokens fed */
    int row;      /* first logits row, -1 if none */
    int all_rows; /* logits for every fed token (prompt logprobs) */
} plan;

struct comet_engine {
    const comet_model *m;
    comet_engine_params p;
    comet_backend *be;
    comet_runner run; /* the model on be, its KV pool and the batch builder */
    float *logits;    /* [rows_cap, V] */
    int rows_cap;
    float *raw;               /* [V] a row before sampling (for logprobs) */
    comet_runner_draw *draws; /* [rows_cap] a step's rows to sample where the logits are */
    int32_t *ids;             /* [rows_cap] their tokens */
    plan *plans;              /* [max_seqs] */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle_cv;
    int stopping;
    int busy;   /* the engine thread is in a step (its callbacks may still run) */
    int paused; /* comet_engine_pause: no step starts */
    uint64_t next_id;
    req **incoming, **waiting, **running; /* each [max_waiting + max_seqs] */
    int n_incoming, n_waiting, n_running, list_cap;
    comet_engine_stats stats; /* counters: engine thread writes under mu */
    comet_engine_memory mem;  /* set at init; device_used_peak updated under mu */
    double mem_polled_s;      /* when note_device_use last asked the device */
};

static void note_device_use(comet_engine *e, int force);

comet_engine_params comet_engine_default_params(void) {
    return (comet_engine_params){.max_seqs = 64,
                                 .max_batch_tokens = 512,
                                 .n_pages = 0,
                                 .page_size = 16,
                                 .max_waiting = 256,
                                 .n_threads = 0,
                                 .gpu_memory_fraction = 0.9};
}

comet_request_params comet_request_default_params(void) {
    comet_request_params r;
    memset(&r, 0, sizeof r);
    r.sampling = comet_sampler_default_params();
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.repeat_last_n = -1;
    return r;
}

const char *comet_finish_reason_name(comet_finish_reason r) {
    static const char *names[] = {"stop", "length", "cancelled", "error"};
    return r >= 0 && r < COMET_FINISH_REASON_COUNT ? names[r] : "?";
}

/* ---- list helpers (caller holds mu) ---- */

static void list_remove(req **list, int *n, req *r) {
    for (int i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
    COMET_ASSERT(0 && "request not in list");
}

/* Insert keeping ids (arrival order) ascending. */
static void list_insert_sorted(req **list, int *n, req *r) {
    int i = *n;
    while (i > 0 && list[i - 1]->id > r->id) {
        list[i] = list[i - 1];
        i--;
    }
    list[i] = r;
    (*n)++;
}

/* Release pages, drop from its list, send FINISHED, free. */
static void finish(comet_engine *e, req *r, comet_finish_reason why, const char *error,
                   const char *text, size_t len) {
    pthread_mutex_lock(&e->mu);
    comet_kv_seq_release(&e->run.pool, &r->seq);
    int found = 0;
    for (int i = 0; i < e->n_running && !found; i++)
        found = e->running[i] == r;
    if (found)
        list_remove(e->running, &e->n_running, r);
    else
        list_remove(e->waiting, &e->n_waiting, r);
    pthread_mutex_unlock(&e->mu);
    req_emit_finished(r, why, error, text, len);
    req_free(r);
}

/* Free a running sequence's pages and send it back to the waiting queue (recompute). */
static void preempt(comet_engine *e, req *r) {
    pthread_mutex_lock(&e->mu);
    comet_kv_seq_release(&e->run.pool, &r->seq);
    r->n_computed = 0;
    r->n_preempt++;
    e->stats.preemptions++;
    list_remove(e->running, &e->n_running, r);
    list_insert_sorted(e->waiting, &e->n_waiting, r);
    pthread_mutex_unlock(&e->mu);
}

/* Finish r, sending the text still held (detokenizer tail and stop-string hold): at the
 * end it can no longer start a stop string. */
static void finish_flush(comet_engine *e, req *r, comet_finish_reason why) {
    int stopped;
    size_t n = req_output_flush(r, &stopped);
    finish(e, r, stopped ? COMET_FINISH_STOP : why, NULL, r->out, n);
}

static int is_eos(const comet_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

/* ---- the step ---- */

/* Sample the next token of r from its logits row x [V] (modified), or take `picked` (the
 * step sampled it where the logits are) when x is NULL, and report it.
 * Returns 1 when the request finished (it has been freed). */
static int advance(comet_engine *e, req *r, float *x, int32_t picked) {
    const comet_model_config *c = &e->m->cfg;
    int V = c->n_vocab;
    if (x && comet_logits_check(x, V) < 0) { /* this request only: the others' rows are theirs */
        finish(e, r, COMET_FINISH_ERROR, comet_last_error(), NULL, 0);
        return 1;
    }
    int32_t ids[COMET_ENGINE_MAX_TOP];
    float vals[COMET_ENGINE_MAX_TOP];
    float lse = 0;
    int n_top = 0;
    if (x && r->logprobs) {
        memcpy(e->raw, x, (size_t)V * sizeof(float));
        lse = req_log_sum_exp(x, V);
        n_top = r->top_logprobs;
        if (n_top > 0)
            req_top_n(x, V, n_top, ids, vals);
        for (int i = 0; i < n_top; i++)
            vals[i] -= lse;
    }
    int32_t id =
        x ? comet_sampler_sample(r->smp, x, r->tokens + r->n_prompt, r->n_generated) : picked;
    COMET_ASSERT(id >= 0 && id < V && r->n_tokens < r->cap);
    r->tokens[r->n_tokens++] = id;
    pthread_mutex_lock(&e->mu);
    e->stats.tokens_generated++;
    pthread_mutex_unlock(&e->mu);
    if (!r->ignore_eos && is_eos(c, id)) {
        finish_flush(e, r, COMET_FINISH_STOP);
        return 1;
    }
    r->n_generated++;
    int lp = x && r->logprobs;
    if (req_output_token(r, id, lp, lp ? e->raw[id] - lse : 0, n_top, ids, vals)) {
        finish(e, r, COMET_FINISH_STOP, NULL, NULL, 0);
        return 1;
    }
    if (r->n_generated >= r->max_new || r->n_tokens >= r->cap) {
        finish_flush(e, r, COMET_FINISH_LENGTH);
        return 1;
    }
    return 0;
}

/* The newest running request (highest id). */
static req *newest_running(comet_engine *e) {
    return e->n_running ? e->running[e->n_running - 1] : NULL;
}

static int planned(const comet_engine *e, int n_plans, const req *r) {
    for (int i = 0; i < n_plans; i++)
        if (e->plans[i].r == r)
            return 1;
    return 0;
}

/* Reserve k tokens for r, preempting the newest unplanned running sequences while the
 * pool is full. Returns COMET_OK, COMET_KV_FULL (r itself was preempted or nothing is
 * left to preempt), or a failure. */
static comet_status reserve_or_preempt(comet_engine *e, req *r, int k, int n_plans) {
    for (;;) {
        comet_status st = comet_kv_seq_reserve(&e->run.pool, &r->seq, k);
        if (st != COMET_KV_FULL)
            return st;
        req *victim = newest_running(e);
        if (!victim || planned(e, n_plans, victim))
            return COMET_KV_FULL;
        if (victim == r && e->n_running == 1)
            return comet_set_error(COMET_ERR_CONTEXT, "the sequence fills the whole KV pool");
        preempt(e, victim);
        if (victim == r)
            return COMET_KV_FULL;
    }
}

/* Count a step of n_seqs sequences and n_tokens tokens that began at t0, called its
 * forward pass at t1 and had its results at t2; its host time after ends now. Returns now. */
static double count_step(comet_engine *e, int n_seqs, int n_tokens, double t0, double t1,
                         double t2) {
    double t3 = comet_now_s(), before = t1 - t0, forward = t2 - t1, after = t3 - t2;
    pthread_mutex_lock(&e->mu);
    e->stats.steps++;
    e->stats.step_seqs += (uint64_t)n_seqs;
    e->stats.step_tokens += (uint64_t)n_tokens;
    e->stats.host_before_s += before;
    e->stats.forward_s += forward;
    e->stats.host_after_s += after;
    pthread_mutex_unlock(&e->mu);
    return t3;
}

/* Build and run one step; its host time before the forward pass counts from t0. Returns
 * when the step's counted time ended, or t0 when no forward pass ran (nothing could be
 * scheduled: that time goes to the next step). */
static double step(comet_engine *e, double t0) {
    const int V = e->m->cfg.n_vocab;
    comet_batch_builder_reset(&e->run.bb);
    int n_plans = 0, budget = e->p.max_batch_tokens, rows = 0;

    /* cancelled requests free their pages first */
    for (int i = e->n_running - 1; i >= 0; i--)
        if (atomic_load(&e->running[i]->cancel))
            finish(e, e->running[i], COMET_FINISH_CANCELLED, NULL, NULL, 0);
    for (int i = e->n_waiting - 1; i >= 0; i--)
        if (atomic_load(&e->waiting[i]->cancel))
            finish(e, e->waiting[i], COMET_FINISH_CANCELLED, NULL, NULL, 0);

    /* 1. decodes of running sequences, oldest first */
    for (int i = 0; i < e->n_running && budget > 0 && n_plans < e->p.max_seqs; i++) {
        req *r = e->running[i];
        if (r->n_tokens - r->n_computed != 1)
            continue;
        comet_status st = reserve_or_preempt(e, r, 1, n_plans);
        if (st == COMET_KV_FULL)
            break; /* r (the newest) was preempted: all older ones are planned */
        if (st == COMET_ERR_CONTEXT) { /* alone, it cannot grow within the whole pool */
            finish_flush(e, r, COMET_FINISH_LENGTH);
            i--;
            continue;
        }
        if (st < 0) {
            finish(e, r, COMET_FINISH_ERROR, comet_last_error(), NULL, 0);
            i--;
            continue;
        }
        e->plans[n_plans++] = (plan){r, 1, rows, 0};
        rows++;
        budget--;
    }

    /* 2. prefill chunks: running sequences mid-prefill, then waiting ones in FCFS order */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; budget > 0 && n_plans < e->p.max_seqs;) {
            req **list = pass == 0 ? e->running : e->waiting;
            int n_list = pass == 0 ? e->n_running : e->n_waiting;
            if (i >= n_list)
                break;
            req *r = list[i];
            if (pass == 1 && e->n_running >= e->p.max_seqs)
                break; /* admitting more would exceed max_seqs next step */
            int remaining = r->n_tokens - r->n_computed;
            if (pass == 0 && (remaining <= 1 || planned(e, n_plans, r))) {
                i++;
                continue;
            }
            int k = remaining < budget ? remaining : budget;
            int room = e->run.pool.n_free * e->p.page_size +
                       (r->seq.n_pages * e->p.page_size - r->seq.n_tokens);
            if (k > room)
                k = room; /* a shorter chunk under memory pressure */
            if (k <= 0)
                break;
            int all_rows = r->prompt_logprobs && r->prompt_lp_sent < r->n_prompt;
            if (all_rows) {
                int free_rows = e->rows_cap - rows - (e->p.max_seqs - n_plans - 1);
                if (free_rows < 1)
                    break;
                if (k > free_rows)
                    k = free_rows;
            }
            comet_status st = comet_kv_seq_reserve(&e->run.pool, &r->seq, k);
            if (st == COMET_KV_FULL)
                break; /* FCFS: later requests wait for this one */
            if (st < 0) {
                finish(e, r, COMET_FINISH_ERROR, comet_last_error(), NULL, 0);
                continue;
            }
            if (pass == 1) { /* admitted */
                pthread_mutex_lock(&e->mu);
                list_remove(e->waiting, &e->n_waiting, r);
                list_insert_sorted(e->running, &e->n_running, r);
                pthread_mutex_unlock(&e->mu);
            } else {
                i++;
            }
            int last = r->n_computed + k == r->n_tokens;
            e->plans[n_plans++] = (plan){r, k, all_rows || last ? rows : -1, all_rows};
            rows += all_rows ? k : last;
            budget -= k;
        }
    }

    if (n_plans == 0) {
        /* every running sequence is mid-prefill and the pool is full: make room */
        req *victim = newest_running(e);
        if (victim) {
            if (e->n_running == 1) {
                finish_flush(e, victim, COMET_FINISH_LENGTH);
            } else {
                preempt(e, victim);
            }
            return t0;
        }
        return t0;
    }

    for (int i = 0; i < n_plans; i++) {
        plan *pl = &e->plans[i];
        int logits = pl->all_rows ? 2 : pl->row >= 0 ? 1 : 0;
        comet_status st = comet_batch_builder_add(&e->run.bb, &pl->r->seq,
                                                  pl->r->tokens + pl->r->n_computed, pl->k, logits);
        COMET_ASSERT(st == COMET_OK);
    }
    COMET_ASSERT(e->run.bb.batch.n_logits == rows);
    const int fed = e->run.bb.batch.n_tokens; /* tokens in the step */
    /* Sampled where the logits are when every row is a token to pick and nobody asked for
     * the numbers (logprobs, prompt logprobs): then only the ids cross to the host. */
    int sample_there = rows > 0;
    for (int i = 0; i < n_plans && sample_there; i++) {
        const plan *pl = &e->plans[i];
        if (pl->all_rows || (pl->row >= 0 && (pl->r->logprobs || pl->r->max_new == 0)))
            sample_there = 0;
        else if (pl->row >= 0)
            e->draws[pl->row] = (comet_runner_draw){pl->r->smp, pl->r->tokens + pl->r->n_prompt,
                                                    pl->r->n_generated};
    }
    double t1 = comet_now_s();
    comet_status st = sample_there ? comet_runner_step_sample(&e->run, e->draws, e->logits, e->ids)
                                   : comet_runner_step(&e->run, e->logits);
    double t2 = comet_now_s();
    if (st < 0) {
        const char *why = comet_last_error();
        for (int i = 0; i < n_plans; i++)
            finish(e, e->plans[i].r, COMET_FINISH_ERROR, why, NULL, 0);
        return count_step(e, n_plans, fed, t0, t1, t2);
    }
    for (int i = 0; i < n_plans; i++) {
        plan *pl = &e->plans[i];
        req *r = pl->r;
        int p0 = r->n_computed;
        r->n_computed += pl->k;
        if (pl->all_rows)
            req_report_prompt_logprobs(r, V, p0, pl->k, e->logits + (size_t)pl->row * V);
        if (r->n_computed == r->n_tokens) {
            int row = pl->all_rows ? pl->row + pl->k - 1 : pl->row;
            if (r->max_new == 0) { /* echo-only scoring: no token wanted */
                finish_flush(e, r, COMET_FINISH_LENGTH);
                continue;
            }
            if (!sample_there || e->ids[row] == COMET_SAMPLE_NONFINITE)
                advance(e, r, e->logits + (size_t)row * V, 0); /* the row is on the host */
            else
                advance(e, r, NULL, e->ids[row]);
        }
    }
    return count_step(e, n_plans, fed, t0, t1, t2);
}

static void *engine_main(void *arg) {
    comet_engine *e = arg;
    double t0 = comet_now_s(); /* the next step's host time starts at the end of the last
                                * counted one, or after an idle wait */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        e->busy = 0;
        for (;;) {
            const int idle = e->n_incoming == 0 && e->n_waiting == 0 && e->n_running == 0;
            if (e->stopping || (!idle && !e->paused))
                break;
            if (idle)
                pthread_cond_broadcast(&e->idle_cv);
            pthread_cond_wait(&e->cv, &e->mu);
            t0 = comet_now_s();
        }
        for (int i = 0; i < e->n_incoming; i++)
            list_insert_sorted(e->waiting, &e->n_waiting, e->incoming[i]);
        e->n_incoming = 0;
        e->busy = 1;
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping)
            break;
        t0 = step(e, t0);
        /* the last step before idling is always seen: wait_idle's callers read the peak (the
         * probe's time counts in the next step's host time before) */
        note_device_use(e, e->n_running == 0 && e->n_waiting == 0);
    }
    while (e->n_running)
        finish(e, e->running[e->n_running - 1], COMET_FINISH_CANCELLED, NULL, NULL, 0);
    while (e->n_waiting)
        finish(e, e->waiting[e->n_waiting - 1], COMET_FINISH_CANCELLED, NULL, NULL, 0);
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->idle_cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* The device's bytes in use now (every process's) into the peak; a host backend has none.
 * Asked at most every MEM_POLL_S seconds of steps, so that the driver call stays out of a
 * fast decode loop's time, and always when `force` (init, the step before idling). */
#define MEM_POLL_S 0.01
static void note_device_use(comet_engine *e, int force) {
    size_t f = 0, t = 0;
    if (!e->mem.device_total)
        return;
    double now = comet_now_s();
    if (!force && now - e->mem_polled_s < MEM_POLL_S)
        return;
    e->mem_polled_s = now;
    if (comet_backend_device_memory(e->be, &f, &t) < 0) {
        comet_clear_error(); /* a statistic only: the next step reports a broken device */
        return;
    }
    pthread_mutex_lock(&e->mu);
    if (t - f > e->mem.device_used_peak)
        e->mem.device_used_peak = t - f;
    pthread_mutex_unlock(&e->mu);
}

/* Before any weight goes to the backend: the pool size, or (n_pages <= 0 on a device) the
 * check that the pool planned from memory holds one sequence of the model's context. */
static comet_status plan_pool(comet_engine *e) {
    size_t f = 0, t = 0;
    COMET_TRY(comet_backend_device_memory(e->be, &f, &t));
    e->mem.device_total = t;
    e->mem.device_used_peak = t - f;
    if (e->p.n_pages > 0)
        return COMET_OK;
    if (t == 0 || e->p.tensor_parallel > 0) {
        /* host memory, or a pool per rank on devices this one does not query: fixed */
        e->p.n_pages = COMET_ENGINE_FIXED_PAGES;
        return COMET_OK;
    }
    comet_engine_memory_plan plan;
    return comet_engine_plan_memory(e->m, &e->p, t, f, 0, &plan);
}

/* comet_runner_params.size_pool: the pool's pages from the device's free memory once the
 * weights and workspace are there. */
static comet_status size_pool(void *user, const comet_forward_ctx *fc, int *n_pages) {
    comet_engine *e = user;
    (void)fc;
    size_t f = 0, t = 0;
    COMET_TRY(comet_backend_device_memory(e->be, &f, &t));
    comet_engine_memory_plan plan;
    COMET_TRY(comet_engine_plan_memory(e->m, &e->p, t, f, 1, &plan));
    *n_pages = plan.n_pages;
    return COMET_OK;
}

/* What the runner holds, into e->mem (with tensor parallelism: rank 0's weights and
 * workspace; the ranks' KV pools are their own, kv_pool 0). */
static void memory_after_init(comet_engine *e) {
    const comet_model_config *c = &e->m->cfg;
    const comet_kv_cache *kv = &e->run.kv;
    comet_forward_memory(e->run.fc, &e->mem.weights, &e->mem.workspace);
    e->mem.kv_pool = kv->storage ? kv->storage_bytes
                                 : (kv->k ? 2 * (size_t)kv->n_layer * kv->n_pages *
                                                kv->page_size * kv->n_head_kv * kv->head_dim *
                                                sizeof(float)
                                          : 0);
    e->mem.kv_pool_pages = e->p.n_pages;
    e->mem.kv_pool_tokens = e->p.n_pages * e->p.page_size;
    e->mem.page_size = e->p.page_size;
    int per_ctx = (c->n_ctx + e->p.page_size - 1) / e->p.page_size;
    int per_2048 = (2048 + e->p.page_size - 1) / e->p.page_size;
    e->mem.max_seqs_ctx = e->p.n_pages / per_ctx;
    e->mem.max_seqs_2048 = e->p.n_pages / per_2048;
    note_device_use(e, 1);
}

void comet_engine_get_memory(comet_engine *e, comet_engine_memory *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->mem;
    pthread_mutex_unlock(&e->mu);
}

comet_engine *comet_engine_init(const comet_model *m, const comet_engine_params *pp) {
    comet_engine_params p = pp ? *pp : comet_engine_default_params();
    const comet_model_config *c = &m->cfg;
    if (p.max_seqs <= 0 || p.max_batch_tokens <= 0 || p.page_size <= 0 || p.max_waiting <= 0) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "engine: max_seqs, max_batch_tokens, page_size and max_waiting must be "
                        "positive");
        return NULL;
    }
    if (!(p.gpu_memory_fraction > 0.0 && p.gpu_memory_fraction <= 1.0)) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "engine: gpu_memory_fraction %g is outside (0, 1]; it is the share of "
                        "the device's memory comet may use (e.g. 0.9)",
                        p.gpu_memory_fraction);
        return NULL;
    }
    if (p.tensor_parallel < 0 || p.tensor_parallel > COMET_MAX_TENSOR_PARALLEL) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "engine: tensor_parallel must be 0 (one device) or 1..%d ranks, got %d",
                        COMET_MAX_TENSOR_PARALLEL, p.tensor_parallel);
        return NULL;
    }
    if (!m->tok) {
        comet_set_error(COMET_ERR_INVALID_ARG, "engine: the model has no tokenizer");
        return NULL;
    }
    comet_engine *e = calloc(1, sizeof *e);
    if (!e) {
        comet_set_error(COMET_ERR_NOMEM, "engine: out of memory");
        return NULL;
    }
    e->m = m;
    e->p = p;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->idle_cv, NULL);
    e->list_cap = p.max_waiting + p.max_seqs + 1;
    e->rows_cap = p.max_seqs + PROMPT_LOGIT_ROWS;
    e->incoming = malloc((size_t)e->list_cap * sizeof(req *));
    e->waiting = malloc((size_t)e->list_cap * sizeof(req *));
    e->running = malloc((size_t)e->list_cap * sizeof(req *));
    e->plans = malloc((size_t)p.max_seqs * sizeof(plan));
    e->logits = malloc((size_t)e->rows_cap * c->n_vocab * sizeof(float));
    e->raw = malloc((size_t)c->n_vocab * sizeof(float));
    e->draws = malloc((size_t)e->rows_cap * sizeof *e->draws);
    e->ids = malloc((size_t)e->rows_cap * sizeof *e->ids);
    if (!e->incoming || !e->waiting || !e->running || !e->plans || !e->logits || !e->raw ||
        !e->draws || !e->ids) {
        comet_set_error(COMET_ERR_NOMEM, "engine: out of memory for %d logits rows", e->rows_cap);
        goto fail;
    }
    e->be =
        comet_backend_open(p.device, comet_backend_rank_threads(p.n_threads, p.tensor_parallel));
    if (!e->be)
        goto fail;
    comet_backend_set_batch_invariant(e->be, p.batch_invariant);
    if (plan_pool(e) < 0)
        goto fail;
    comet_runner_params rp = {.max_batch_tokens = p.max_batch_tokens,
                              .max_seqs = p.max_seqs,
                              .n_pages = e->p.n_pages,
                              .page_size = p.page_size,
                              .tensor_parallel = p.tensor_parallel,
                              .size_pool = size_pool,
                              .size_user = e};
    if (comet_runner_init(&e->run, m, e->be, &rp) < 0)
        goto fail;
    e->p.n_pages = e->run.pool.n_pages;
    memory_after_init(e);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        comet_set_error(COMET_ERR_INTERNAL, "engine: cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    return e;
fail:
    comet_engine_free(e);
    return NULL;
}

void comet_engine_free(comet_engine *e) {
    if (!e)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        /* submissions that raced with the stop never reached the engine thread */
        for (int i = 0; i < e->n_incoming; i++) {
            req *r = e->incoming[i];
            req_emit_finished(r, COMET_FINISH_CANCELLED, NULL, NULL, 0);
            req_free(r);
        }
    }
    comet_runner_free(&e->run);
    comet_backend_free(e->be);
    free(e->incoming);
    free(e->waiting);
    free(e->running);
    free(e->plans);
    free(e->logits);
    free(e->raw);
    free(e->draws);
    free(e->ids);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->idle_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static uint64_t clock_seed(uint64_t id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (id * 0x9E3779B97F4A7C15ull);
}

comet_status comet_engine_submit(comet_engine *e, const comet_request_params *rp,
                                 comet_engine_cb cb, void *user, uint64_t *id) {
    const comet_model_config *c = &e->m->cfg;
    if (rp->n_prompt <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "request: the prompt is empty");
    for (int i = 0; i < rp->n_prompt; i++)
        if (rp->prompt[i] < 0 || rp->prompt[i] >= c->n_vocab)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "request: prompt token %d is %d, outside the vocabulary [0, %d)",
                                   i, (int)rp->prompt[i], c->n_vocab);
    int pool_tokens = e->p.n_pages * e->p.page_size;
    if (rp->n_prompt >= c->n_ctx)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "request: the prompt has %d tokens; this model's maximum context "
                               "length is %d tokens (including at least one generated token)",
                               rp->n_prompt, c->n_ctx);
    if (rp->n_prompt >= pool_tokens)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "request: the prompt has %d tokens; the KV page pool holds %d "
                               "tokens in all",
                               rp->n_prompt, pool_tokens);
    if (rp->max_tokens > 0 && (long)rp->n_prompt + rp->max_tokens > pool_tokens)
        return comet_set_error(COMET_ERR_CONTEXT,
                               "request: %d prompt tokens + max_tokens %d exceed the KV page "
                               "pool, which holds %d tokens in all (start the server with more "
                               "--kv-pages, or ask for fewer tokens)",
                               rp->n_prompt, rp->max_tokens, pool_tokens);
    if (rp->n_stop < 0 || rp->n_stop > COMET_ENGINE_MAX_STOP || rp->top_logprobs < 0 ||
        rp->top_logprobs > COMET_ENGINE_MAX_TOP)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "request: at most %d stop strings and %d top logprobs",
                               COMET_ENGINE_MAX_STOP, COMET_ENGINE_MAX_TOP);
    if (comet_sampler_params_check(&rp->sampling, c->n_vocab, NULL) < 0) {
        char why[256]; /* the message, copied: comet_set_error writes over it */
        snprintf(why, sizeof why, "%s", comet_last_error());
        return comet_set_error(COMET_ERR_INVALID_ARG, "request: %s", why);
    }
    int room = c->n_ctx - rp->n_prompt;
    int max_new = rp->max_tokens > 0 && rp->max_tokens < room ? rp->max_tokens : room;
    if (rp->max_tokens == 0 && rp->prompt_logprobs)
        max_new = 0;

    req *r = calloc(1, sizeof *r);
    if (!r)
        return comet_set_error(COMET_ERR_NOMEM, "request: out of memory");
    r->cb = cb;
    r->user = user;
    r->n_prompt = r->n_tokens = rp->n_prompt;
    r->max_new = max_new;
    r->cap = rp->n_prompt + (max_new > 0 ? max_new : 1);
    r->logprobs = rp->logprobs || rp->top_logprobs > 0;
    r->top_logprobs = rp->top_logprobs;
    r->prompt_logprobs = rp->prompt_logprobs;
    r->ignore_eos = rp->ignore_eos;
    atomic_init(&r->cancel, 0);
    comet_status st = COMET_OK;
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    if (!r->tokens) {
        st = comet_set_error(COMET_ERR_NOMEM, "request: out of memory");
        goto fail;
    }
    memcpy(r->tokens, rp->prompt, (size_t)rp->n_prompt * sizeof(int32_t));
    if ((st = req_output_init(r, e->m->tok, rp)) < 0 ||
        (st = comet_kv_seq_init(&r->seq, r->cap, e->p.page_size)) < 0)
        goto fail;
    comet_sampler_params sp = rp->sampling;

    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->n_incoming + e->n_waiting >= e->p.max_waiting) {
        pthread_mutex_unlock(&e->mu);
        st = e->stopping ? comet_set_error(COMET_ERR_INTERNAL, "engine: shutting down")
                         : COMET_QUEUE_FULL;
        goto fail;
    }
    r->id = e->next_id++;
    pthread_mutex_unlock(&e->mu);
    sp.seed = rp->has_seed ? rp->sampling.seed : clock_seed(r->id);
    r->smp = comet_sampler_init(&sp, c->n_vocab);
    if (!r->smp) {
        st = comet_last_status(); /* named by the sampler: bad parameters, or no memory */
        goto fail;
    }
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        st = comet_set_error(COMET_ERR_INTERNAL, "engine: shutting down");
        goto fail;
    }
    e->incoming[e->n_incoming++] = r;
    e->stats.prompt_tokens += (uint64_t)rp->n_prompt;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (id)
        *id = r->id;
    return COMET_OK;
fail:
    req_free(r);
    return st;
}

static req *find_locked(comet_engine *e, uint64_t id, comet_request_state *state) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) {
            *state = COMET_REQUEST_RUNNING;
            return e->running[i];
        }
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == id) {
            *state = COMET_REQUEST_WAITING;
            return e->waiting[i];
        }
    for (int i = 0; i < e->n_incoming; i++)
        if (e->incoming[i]->id == id) {
            *state = COMET_REQUEST_WAITING;
            return e->incoming[i];
        }
    *state = COMET_REQUEST_UNKNOWN;
    return NULL;
}

void comet_engine_cancel(comet_engine *e, uint64_t id) {
    comet_request_state s;
    pthread_mutex_lock(&e->mu);
    req *r = find_locked(e, id, &s);
    if (r) {
        atomic_store(&r->cancel, 1);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

void comet_engine_cancel_all(comet_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_running; i++)
        atomic_store(&e->running[i]->cancel, 1);
    for (int i = 0; i < e->n_waiting; i++)
        atomic_store(&e->waiting[i]->cancel, 1);
    for (int i = 0; i < e->n_incoming; i++)
        atomic_store(&e->incoming[i]->cancel, 1);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

comet_request_state comet_engine_request_state(comet_engine *e, uint64_t id) {
    comet_request_state s;
    pthread_mutex_lock(&e->mu);
    find_locked(e, id, &s);
    pthread_mutex_unlock(&e->mu);
    return s;
}

void comet_engine_get_stats(comet_engine *e, comet_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    s->running = e->n_running;
    s->waiting = e->n_waiting + e->n_incoming;
    s->pages_free = e->run.pool.n_free;
    s->pages_used = e->run.pool.n_pages - e->run.pool.n_free;
    pthread_mutex_unlock(&e->mu);
}

void comet_engine_pause(comet_engine *e, int paused) {
    pthread_mutex_lock(&e->mu);
    e->paused = paused != 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int comet_engine_wait_idle(comet_engine *e, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s >= 0) {
        until.tv_sec += (time_t)timeout_s;
        until.tv_nsec += (long)((timeout_s - floor(timeout_s)) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    while (!e->stopping && (e->n_incoming || e->n_waiting || e->n_running || e->busy) && rc == 0)
        rc = timeout_s < 0 ? pthread_cond_wait(&e->idle_cv, &e->mu)
                           : pthread_cond_timedwait(&e->idle_cv, &e->mu, &until);
    int idle = !e->n_incoming && !e->n_waiting && !e->n_running && !e->busy;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

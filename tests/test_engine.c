/* test_engine.c — the serving engine on the default model: 64 concurrent greedy requests
 * of different lengths each produce exactly the tokens of the same request run alone (no
 * loss, no duplication, all pages free at the end); a tiny page pool forces preemption
 * and every request still completes with the same tokens; cancel frees pages; the queue
 * limit, the context limit and prompt logprobs; the sampling parameters (tiny
 * temperatures, logit_bias, penalties) through a request; an idle wait that returns only
 * after the last callback and with the step counters final. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cmocka.h>

#include "comet/engine.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "engine_test_util.h"

#define MAX_GEN 64

typedef struct collect {
    pthread_mutex_t mu;
    int32_t toks[MAX_GEN];
    int n_toks, n_events_after_finish, finished, n_prompt_events;
    comet_finish_reason why;
    int n_generated, n_preempt;
    float prompt_lp[128];
    char text[1024];
    size_t text_len;
    char error[256];
} collect;

static void on_event(void *user, const comet_engine_event *ev) {
    collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->finished)
        c->n_events_after_finish++;
    if (ev->kind == COMET_EVENT_TOKEN && c->n_toks < MAX_GEN)
        c->toks[c->n_toks++] = ev->token;
    if (ev->kind == COMET_EVENT_PROMPT_TOKEN && c->n_prompt_events < 128)
        c->prompt_lp[c->n_prompt_events++] = ev->has_logprob ? ev->logprob : NAN;
    if (ev->text_len && c->text_len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
    }
    if (ev->kind == COMET_EVENT_FINISHED) {
        c->finished = 1;
        c->why = ev->finish;
        c->n_generated = ev->n_generated;
        c->n_preempt = ev->n_preemptions;
        if (ev->error)
            snprintf(c->error, sizeof c->error, "%s", ev->error);
    }
    pthread_mutex_unlock(&c->mu);
}

static comet_model *model;

static int setup(void **state) {
    (void)state;
    const char *dir = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : ".");
    if (comet_model_load(path, &model) != COMET_OK) {
        fprintf(stderr, "test_engine: cannot load %s: %s\n", path, comet_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    comet_model_free(model);
    return 0;
}

/* Prompt i: a prefix of varied length of a fixed text, with a request-specific tail. */
static int make_prompt(int i, int32_t **ids) { return et_prompt(model->tok, i, 0, ids); }

static void run_and_compare(int n_req, int gen_base, comet_engine_params *batched,
                            const char *what) {
    int32_t *ids[64];
    int n_ids[64];
    collect *alone = calloc((size_t)n_req, sizeof *alone);
    collect *many = calloc((size_t)n_req, sizeof *many);
    for (int i = 0; i < n_req; i++) {
        n_ids[i] = make_prompt(i, &ids[i]);
        pthread_mutex_init(&alone[i].mu, NULL);
        pthread_mutex_init(&many[i].mu, NULL);
    }
    /* each request alone */
    comet_engine_params ap = *batched;
    ap.max_seqs = 1;
    ap.n_pages = 64;
    comet_engine *e = comet_engine_init(model, &ap);
    assert_non_null(e);
    for (int i = 0; i < n_req; i++) {
        comet_request_params rp = et_greedy(ids[i], n_ids[i], gen_base + i % 7);
        assert_int_equal(comet_engine_submit(e, &rp, on_event, &alone[i], NULL), COMET_OK);
        assert_true(comet_engine_wait_idle(e, 600));
    }
    comet_engine_free(e);

    /* all at once */
    e = comet_engine_init(model, batched);
    assert_non_null(e);
    uint64_t prev = 0;
    for (int i = 0; i < n_req; i++) {
        comet_request_params rp = et_greedy(ids[i], n_ids[i], gen_base + i % 7);
        uint64_t id;
        assert_int_equal(comet_engine_submit(e, &rp, on_event, &many[i], &id), COMET_OK);
        assert_true(id > prev);
        prev = id;
    }
    assert_true(comet_engine_wait_idle(e, 1200));
    comet_engine_stats st;
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.pages_used, 0);
    assert_int_equal(st.pages_free, batched->n_pages);
    fprintf(stderr, "%s: %d requests, %llu steps, %llu preemptions, %llu tokens\n", what, n_req,
            (unsigned long long)st.steps, (unsigned long long)st.preemptions,
            (unsigned long long)st.tokens_generated);
    int mismatches = 0;
    for (int i = 0; i < n_req; i++) {
        assert_true(alone[i].finished);
        assert_true(many[i].finished);
        assert_int_equal(many[i].n_events_after_finish, 0);
        assert_int_equal(many[i].why, COMET_FINISH_LENGTH);
        assert_int_equal(alone[i].n_toks, gen_base + i % 7);
        assert_int_equal(many[i].n_toks, alone[i].n_toks);
        assert_int_equal(many[i].n_generated, many[i].n_toks);
        if (memcmp(many[i].toks, alone[i].toks, (size_t)alone[i].n_toks * sizeof(int32_t))) {
            fprintf(stderr, "%s: request %d differs from its run alone\n", what, i);
            mismatches++;
        }
        assert_int_equal(many[i].text_len, alone[i].text_len);
        free(ids[i]);
    }
    assert_int_equal(mismatches, 0);
    if (!strcmp(what, "preemption"))
        assert_true(st.preemptions > 0);
    comet_engine_free(e);
    free(alone);
    free(many);
}

static void test_concurrent_equals_alone(void **state) {
    (void)state;
    comet_engine_params p = comet_engine_default_params();
    p.max_seqs = 64;
    p.max_batch_tokens = 256;
    p.n_pages = 256;
    run_and_compare(64, 2, &p, "concurrent");
}

static void test_tiny_pool_preemption(void **state) {
    (void)state;
    comet_engine_params p = comet_engine_default_params();
    p.max_seqs = 8;
    p.max_batch_tokens = 64;
    p.n_pages = 8; /* 128 tokens for 8 requests of 25..95 tokens each */
    run_and_compare(8, 24, &p, "preemption");
}

static void test_cancel_and_limits(void **state) {
    (void)state;
    comet_engine_params p = comet_engine_default_params();
    p.max_seqs = 1;
    p.max_waiting = 2;
    p.n_pages = 32;
    comet_engine *e = comet_engine_init(model, &p);
    assert_non_null(e);
    int32_t *ids;
    int n = make_prompt(3, &ids);
    collect c[6];
    memset(c, 0, sizeof c);
    int ok[6] = {0}, full = 0;
    uint64_t rid[6] = {0};
    for (int i = 0; i < 6; i++) {
        pthread_mutex_init(&c[i].mu, NULL);
        comet_request_params rp = et_greedy(ids, n, 60);
        comet_status st = comet_engine_submit(e, &rp, on_event, &c[i], &rid[i]);
        if (st == COMET_OK) {
            ok[i] = 1;
        } else {
            assert_int_equal(st, COMET_QUEUE_FULL);
            full++;
        }
    }
    assert_true(full >= 3); /* one running at most, two waiting */
    assert_true(ok[0]);
    uint64_t first = rid[0];
    /* cancel everything queued: the running one stops early, pages come back */
    for (int i = 0; i < 6; i++)
        if (ok[i])
            comet_engine_cancel(e, rid[i]);
    assert_true(comet_engine_wait_idle(e, 120));
    int cancelled = 0;
    for (int i = 0; i < 6; i++) {
        if (!ok[i]) {
            assert_false(c[i].finished); /* refused: no callback */
            continue;
        }
        assert_true(c[i].finished);
        cancelled += c[i].why == COMET_FINISH_CANCELLED;
        assert_true(c[i].n_toks < 60);
    }
    assert_true(cancelled >= 1);
    assert_int_equal(comet_engine_request_state(e, first), COMET_REQUEST_UNKNOWN);
    comet_engine_stats st;
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.pages_used, 0);

    /* a prompt that fills the context is refused with both numbers */
    int32_t *big = malloc((size_t)model->cfg.n_ctx * sizeof(int32_t));
    for (int i = 0; i < model->cfg.n_ctx; i++)
        big[i] = ids[i % n];
    comet_request_params rp = et_greedy(big, model->cfg.n_ctx, 1);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c[0], NULL), COMET_ERR_CONTEXT);
    char num[32];
    snprintf(num, sizeof num, "%d", model->cfg.n_ctx);
    assert_non_null(strstr(comet_last_error(), num));
    /* prompt + max_tokens past the pool (32 pages x 16 = 512 tokens): refused, not cut short */
    rp = et_greedy(big, 3, 600);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c[0], NULL), COMET_ERR_CONTEXT);
    assert_non_null(strstr(comet_last_error(), "512"));
    rp = et_greedy(big, 0, 1);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c[0], NULL), COMET_ERR_INVALID_ARG);
    big[0] = model->cfg.n_vocab;
    rp = et_greedy(big, 3, 1);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c[0], NULL), COMET_ERR_INVALID_ARG);
    free(big);
    free(ids);
    comet_engine_free(e);
}

static void test_prompt_logprobs(void **state) {
    (void)state;
    comet_engine *e = comet_engine_init(model, NULL);
    assert_non_null(e);
    int32_t *ids;
    int n = make_prompt(5, &ids);
    collect a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&a.mu, NULL);
    pthread_mutex_init(&b.mu, NULL);
    /* scoring only (max_tokens 0), and the same with one generated token */
    comet_request_params rp = et_greedy(ids, n, 0);
    rp.prompt_logprobs = 1;
    rp.top_logprobs = 3;
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &a, NULL), COMET_OK);
    rp.max_tokens = 1;
    rp.logprobs = 1;
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &b, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(e, 120));
    assert_int_equal(a.n_prompt_events, n);
    assert_int_equal(a.n_toks, 0);
    assert_int_equal(b.n_prompt_events, n);
    assert_int_equal(b.n_toks, 1);
    assert_true(isnan(a.prompt_lp[0]));
    for (int i = 1; i < n; i++) {
        assert_true(a.prompt_lp[i] <= 0 && a.prompt_lp[i] > -40);
        assert_float_equal(a.prompt_lp[i], b.prompt_lp[i], 1e-3);
    }
    free(ids);
    comet_engine_free(e);
}

/* A request whose forward pass goes non-finite (a NaN in the embedding row of one of its
 * tokens) fails with an error naming it; a request sharing its steps is untouched: the
 * same tokens as alone. The model's lm_head is untied for the test so that the NaN row
 * reaches only the request that feeds that token. */
static void test_nonfinite_fails_only_its_request(void **state) {
    (void)state;
    const int V = model->cfg.n_vocab, C = model->cfg.n_embd, bad_tok = V - 7;
    float *tied = model->lm_head;
    int tie = model->cfg.tie_embeddings;
    float *head = malloc((size_t)V * C * sizeof *head);
    assert_non_null(head);
    memcpy(head, model->lm_head, (size_t)V * C * sizeof *head);
    model->lm_head = head;
    model->cfg.tie_embeddings = 0;
    float saved = model->tok_embd[(size_t)bad_tok * C + 3];
    model->tok_embd[(size_t)bad_tok * C + 3] = NAN;

    int32_t *ids;
    int n = make_prompt(3, &ids);
    int32_t *bad_ids = malloc((size_t)n * sizeof *bad_ids);
    memcpy(bad_ids, ids, (size_t)n * sizeof *ids);
    bad_ids[n / 2] = bad_tok;
    collect ref, a, b;
    memset(&ref, 0, sizeof ref), memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    pthread_mutex_init(&ref.mu, NULL), pthread_mutex_init(&a.mu, NULL),
        pthread_mutex_init(&b.mu, NULL);
    comet_engine *e = comet_engine_init(model, NULL);
    assert_non_null(e);
    comet_request_params rp = et_greedy(ids, n, 8);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &ref, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(e, 120));
    comet_request_params bp = et_greedy(bad_ids, n, 8);
    assert_int_equal(comet_engine_submit(e, &bp, on_event, &a, NULL), COMET_OK);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &b, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(e, 120));
    comet_engine_free(e);

    model->tok_embd[(size_t)bad_tok * C + 3] = saved;
    model->lm_head = tied;
    model->cfg.tie_embeddings = tie;
    free(head);

    assert_int_equal(a.why, COMET_FINISH_ERROR);
    assert_non_null(strstr(a.error, "not finite"));
    assert_int_equal(a.n_toks, 0);
    assert_int_equal(b.why, COMET_FINISH_LENGTH);
    assert_int_equal(b.n_toks, 8);
    assert_memory_equal(b.toks, ref.toks, sizeof ref.toks[0] * 8);
    free(ids);
    free(bad_ids);
}

/* Run one request alone on engine e and collect it. */
static void run_one(comet_engine *e, const comet_request_params *rp, collect *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    assert_int_equal(comet_engine_submit(e, rp, on_event, c, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(e, 600));
    assert_true(c->finished);
    assert_int_equal(c->error[0], 0);
}

static int count_of(const collect *c, int32_t id) {
    int n = 0;
    for (int i = 0; i < c->n_toks; i++)
        n += c->toks[i] == id;
    return n;
}

/* The sampling parameters reach the sampler through the request (comet/sampling.h), on the
 * CPU backend: tiny temperatures are greedy; logit_bias -100 bans the greedy answer, +100
 * forces a token; each penalty changes a greedy continuation that repeats itself; bad
 * parameters are refused at submit, named. */
static void test_sampling_params(void **state) {
    (void)state;
    comet_engine_params ep = comet_engine_default_params();
    ep.max_seqs = 4;
    ep.n_pages = 64;
    comet_engine *e = comet_engine_init(model, &ep);
    assert_non_null(e);
    const char *text = "The capital of France is";
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(model->tok, text, strlen(text), 0, &ids, &n), COMET_OK);
    const int32_t paris = 7042; /* " Paris" in the default model's vocabulary */
    char piece[32];
    int len = comet_tokenizer_token_bytes(model->tok, paris, 0, piece, sizeof piece);
    assert_true(len == 6 && !memcmp(piece, " Paris", 6));

    collect ref, c;
    comet_request_params rp = et_greedy(ids, (int)n, 24);
    run_one(e, &rp, &ref);
    assert_int_equal(ref.toks[0], paris);

    const float tiny[] = {1e-38f, 1e-40f, 1e-45f};
    for (int t = 0; t < 3; t++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            rp = et_greedy(ids, (int)n, 24);
            rp.sampling.temperature = tiny[t];
            rp.sampling.top_k = 0; /* no filter hides the overflow */
            rp.sampling.seed = seed;
            rp.has_seed = 1;
            run_one(e, &rp, &c);
            assert_int_equal(c.n_toks, ref.n_toks);
            assert_memory_equal(c.toks, ref.toks, (size_t)ref.n_toks * sizeof(int32_t));
        }

    comet_logit_bias ban[] = {{paris, -100.0f}};
    rp = et_greedy(ids, (int)n, 24);
    rp.sampling.logit_bias = ban;
    rp.sampling.n_logit_bias = 1;
    run_one(e, &rp, &c);
    assert_true(c.toks[0] != paris);
    assert_int_equal(count_of(&c, paris), 0);
    rp.sampling.temperature = 1.0f; /* sampled: never either */
    rp.sampling.seed = 5;
    rp.has_seed = 1;
    run_one(e, &rp, &c);
    assert_int_equal(count_of(&c, paris), 0);

    comet_logit_bias force[] = {{42, 100.0f}};
    rp = et_greedy(ids, (int)n, 8);
    rp.sampling.temperature = 0.7f;
    rp.sampling.logit_bias = force;
    rp.sampling.n_logit_bias = 1;
    run_one(e, &rp, &c);
    assert_int_equal(count_of(&c, 42), 8);

    /* penalties: greedy over 24 tokens repeats " Paris" and the like; each penalty alone
     * changes the text */
    for (int k = 0; k < 3; k++) {
        rp = et_greedy(ids, (int)n, 24);
        if (k == 0)
            rp.sampling.repeat_penalty = 1.8f;
        else if (k == 1)
            rp.sampling.presence_penalty = 2.0f;
        else
            rp.sampling.frequency_penalty = 2.0f;
        run_one(e, &rp, &c);
        assert_int_equal(c.n_toks, 24);
        if (!memcmp(c.toks, ref.toks, 24 * sizeof(int32_t)))
            fail_msg("penalty %d left the greedy text unchanged", k);
        int most_ref = 0, most = 0; /* the most repeated token repeats less */
        for (int i = 0; i < 24; i++) {
            if (count_of(&ref, ref.toks[i]) > most_ref)
                most_ref = count_of(&ref, ref.toks[i]);
            if (count_of(&c, c.toks[i]) > most)
                most = count_of(&c, c.toks[i]);
        }
        if (!(most < most_ref))
            fail_msg("penalty %d: the most repeated token comes %d times (without: %d)", k, most,
                     most_ref);
    }

    rp = et_greedy(ids, (int)n, 4);
    comet_logit_bias oov[] = {{49152, 1.0f}};
    rp.sampling.logit_bias = oov;
    rp.sampling.n_logit_bias = 1;
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c, NULL), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "token id 49152 is outside the vocabulary"));
    rp = et_greedy(ids, (int)n, 4);
    rp.sampling.temperature = 3.0f;
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c, NULL), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "temperature must be in [0, 2]"));
    comet_engine_free(e);
    free(ids);
}

/* A FINISHED callback that takes a while: it marks its start and its end. */
typedef struct slow_finish {
    atomic_int started, done;
} slow_finish;

static void on_slow_finish(void *user, const comet_engine_event *ev) {
    slow_finish *s = user;
    if (ev->kind != COMET_EVENT_FINISHED)
        return;
    atomic_store(&s->started, 1);
    usleep(200 * 1000);
    atomic_store(&s->done, 1);
}

/* comet_engine_wait_idle returns only when the engine thread has left its step: a request
 * leaves the engine's lists before its FINISHED callback runs, and a wait that starts in
 * between still waits for the callback (and the step's counters). */
static void test_wait_idle_after_callbacks(void **state) {
    (void)state;
    int32_t *ids;
    int n = make_prompt(3, &ids);
    comet_engine_params ep = comet_engine_default_params();
    ep.n_pages = 64;
    comet_engine *e = comet_engine_init(model, &ep);
    assert_non_null(e);
    slow_finish s;
    atomic_init(&s.started, 0);
    atomic_init(&s.done, 0);
    comet_request_params rp = et_greedy(ids, n, 2);
    uint64_t id;
    assert_int_equal(comet_engine_submit(e, &rp, on_slow_finish, &s, &id), COMET_OK);
    while (!atomic_load(&s.started)) /* the request is out of the lists from here on */
        usleep(1000);
    assert_int_equal(comet_engine_request_state(e, id), COMET_REQUEST_UNKNOWN);
    assert_true(comet_engine_wait_idle(e, 60));
    assert_int_equal(atomic_load(&s.done), 1);
    comet_engine_stats st;
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.tokens_generated, 2);
    assert_int_equal(st.step_tokens, (uint64_t)n + 1); /* the prompt, then one decode */
    assert_int_equal(st.step_seqs, st.steps);
    assert_true(st.host_before_s > 0 && st.forward_s > 0 && st.host_after_s >= 0.2);
    comet_engine_free(e);
    free(ids);
}

static void on_event_ignored(void *user, const comet_engine_event *ev) {
    (void)user;
    (void)ev;
}

/* A paused engine starts no step: requests submitted meanwhile wait (and wait_idle does not
 * call it idle), then the first step after comet_engine_pause(e, 0) takes them all. */
static void test_pause_submits_at_once(void **state) {
    (void)state;
    int32_t *ids;
    int n = make_prompt(1, &ids);
    comet_engine_params ep = comet_engine_default_params();
    ep.n_pages = 64;
    ep.max_seqs = 4;
    ep.max_batch_tokens = 4 * n;
    comet_engine *e = comet_engine_init(model, &ep);
    assert_non_null(e);
    comet_engine_pause(e, 1);
    comet_request_params rp = et_greedy(ids, n, 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(comet_engine_submit(e, &rp, on_event_ignored, NULL, NULL), COMET_OK);
    assert_false(comet_engine_wait_idle(e, 0.2));
    comet_engine_stats st;
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.steps, 0);
    comet_engine_pause(e, 0);
    assert_true(comet_engine_wait_idle(e, 60));
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.steps, 1); /* four prompts of n tokens in one step, one token each */
    assert_int_equal(st.step_seqs, 4);
    assert_int_equal(st.tokens_generated, 4);
    comet_engine_free(e);
    free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_and_limits),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_sampling_params),
        cmocka_unit_test(test_nonfinite_fails_only_its_request),
        cmocka_unit_test(test_tiny_pool_preemption),
        cmocka_unit_test(test_concurrent_equals_alone),
        cmocka_unit_test(test_wait_idle_after_callbacks),
        cmocka_unit_test(test_pause_submits_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

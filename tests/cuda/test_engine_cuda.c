/* test_engine_cuda.c — the serving engine on the GPU (--device cuda) over the default
 * model's W4AxKV4 checkpoint (models/smollm2-w4axkv4), mirroring tests/test_engine.c:
 *   - a deliberately small KV pool (8 pages of 16 tokens for 8 concurrent requests of 25..95
 *     prompt tokens) forces preemptions (stats.preemptions > 0), and every greedy request
 *     (ignore_eos, fixed lengths) gives exactly the tokens it gives run alone;
 *   - 1024 concurrent requests with max_seqs and max_batch_tokens 1024: more than half of
 *     them run in the same steps, every one finishes with its length, and a sample of them
 *     equals their runs alone;
 *   - the pool sized from memory (n_pages 0): comet_engine_get_memory reports the device,
 *     weights, workspace and a pool whose pages fit under gpu_memory_fraction; a fraction
 *     too small for one sequence fails in the check before the weights are loaded.
 * The engines are batch-invariant (comet_engine_params.batch_invariant): a request's
 * arithmetic then does not depend on its batch or on how a preempted sequence's prefill is
 * cut, so "equal to alone" holds bit for bit on W4Ax weights.
 * Exits 77 (ctest: skipped) when no CUDA device is usable or the checkpoint is missing.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include <cmocka.h>

#include "../test_util.h"
#include "cuda_skip.h"
#include "comet/engine.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "engine_test_util.h"

#define SKIP 77
#define MAX_GEN 40
#define N_WIDE 1024 /* sequences of the wide test */

static comet_model *model;

typedef struct collect {
    pthread_mutex_t mu;
    int32_t toks[MAX_GEN];
    int n_toks, finished, n_preempt;
    comet_finish_reason why;
    char error[256];
} collect;

static void on_event(void *user, const comet_engine_event *ev) {
    collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == COMET_EVENT_TOKEN && c->n_toks < MAX_GEN)
        c->toks[c->n_toks++] = ev->token;
    if (ev->kind == COMET_EVENT_FINISHED) {
        c->finished = 1;
        c->why = ev->finish;
        c->n_preempt = ev->n_preemptions;
        if (ev->error)
            snprintf(c->error, sizeof c->error, "%s", ev->error);
    }
    pthread_mutex_unlock(&c->mu);
}

static int make_prompt(int i, int short_cut, int32_t **ids) {
    return et_prompt(model->tok, i, short_cut, ids);
}

static comet_engine_params gpu_params(void) {
    comet_engine_params p = comet_engine_default_params();
    p.device = "cuda";
    p.batch_invariant = 1;
    return p;
}

static int max_running; /* the most sequences running at once in run_and_compare's batch */

/* Run requests [0, n_req) all at once on `batched`, then those listed in `check` alone,
 * and compare. Returns the batched engine's stats (max_running: its peak, polled). */
static comet_engine_stats run_and_compare(int n_req, int short_prompts, int gen_base,
                                          const comet_engine_params *batched, const int *check,
                                          int n_check, const char *what) {
    int32_t **ids = calloc((size_t)n_req, sizeof *ids);
    int *n_ids = calloc((size_t)n_req, sizeof *n_ids);
    collect *many = calloc((size_t)n_req, sizeof *many);
    collect *alone = calloc((size_t)n_check, sizeof *alone);
    assert_true(ids && n_ids && many && alone);
    for (int i = 0; i < n_req; i++) {
        n_ids[i] = make_prompt(i, short_prompts, &ids[i]);
        pthread_mutex_init(&many[i].mu, NULL);
    }
    comet_engine *e = comet_engine_init(model, batched);
    if (!e)
        fail_msg("%s: %s", what, comet_last_error());
    for (int i = 0; i < n_req; i++) {
        comet_request_params rp = et_greedy(ids[i], n_ids[i], gen_base + i % 7);
        assert_int_equal(comet_engine_submit(e, &rp, on_event, &many[i], NULL), COMET_OK);
    }
    comet_engine_stats st;
    max_running = 0;
    for (int polls = 0; !comet_engine_wait_idle(e, 0.002); polls++) {
        assert_true(polls < 600000); /* 20 minutes */
        comet_engine_get_stats(e, &st);
        if (st.running > max_running)
            max_running = st.running;
    }
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.pages_used, 0);
    comet_engine_free(e);
    fprintf(stderr, "%s: %d requests, %llu steps, %llu preemptions, %llu tokens\n", what, n_req,
            (unsigned long long)st.steps, (unsigned long long)st.preemptions,
            (unsigned long long)st.tokens_generated);
    for (int i = 0; i < n_req; i++) {
        if (!many[i].finished || many[i].why != COMET_FINISH_LENGTH)
            fail_msg("%s: request %d finished %d (%s) %s", what, i, many[i].finished,
                     comet_finish_reason_name(many[i].why), many[i].error);
        assert_int_equal(many[i].n_toks, gen_base + i % 7);
    }

    comet_engine_params ap = *batched;
    ap.max_seqs = 1;
    ap.max_batch_tokens = 256;
    ap.n_pages = 64;
    e = comet_engine_init(model, &ap);
    if (!e)
        fail_msg("%s alone: %s", what, comet_last_error());
    int mismatches = 0;
    for (int k = 0; k < n_check; k++) {
        int i = check[k];
        pthread_mutex_init(&alone[k].mu, NULL);
        comet_request_params rp = et_greedy(ids[i], n_ids[i], gen_base + i % 7);
        assert_int_equal(comet_engine_submit(e, &rp, on_event, &alone[k], NULL), COMET_OK);
        assert_true(comet_engine_wait_idle(e, 600));
        assert_int_equal(alone[k].n_toks, many[i].n_toks);
        if (memcmp(alone[k].toks, many[i].toks, (size_t)alone[k].n_toks * sizeof(int32_t))) {
            fprintf(stderr, "%s: request %d (%d preemptions) differs from its run alone\n", what,
                    i, many[i].n_preempt);
            mismatches++;
        }
    }
    comet_engine_free(e);
    for (int i = 0; i < n_req; i++)
        free(ids[i]);
    free(ids);
    free(n_ids);
    free(many);
    free(alone);
    assert_int_equal(mismatches, 0);
    return st;
}

static void test_small_pool_preemption(void **state) {
    (void)state;
    comet_engine_params p = gpu_params();
    p.max_seqs = 8;
    p.max_batch_tokens = 64;
    p.n_pages = 8; /* 128 tokens for 8 requests of 25..95 prompt tokens each */
    const int check[] = {0, 1, 2, 3, 4, 5, 6, 7};
    comet_engine_stats st = run_and_compare(8, 0, 24, &p, check, 8, "preemption");
    assert_true(st.preemptions > 0);
}

static void test_wide_batch(void **state) {
    (void)state;
    comet_engine_params p = gpu_params();
    p.max_seqs = N_WIDE;
    p.max_batch_tokens = N_WIDE;
    p.max_waiting = 2 * N_WIDE; /* all submitted at once */
    p.n_pages = N_WIDE * 4; /* 64 tokens a sequence (up to 15 + 30 used): no preemption */
    const int check[] = {0, 1, 17, 255, 256, 511, 700, 1023};
    /* 24..30 tokens each: the first sequences still run when the last are admitted */
    comet_engine_stats st = run_and_compare(N_WIDE, 1, 24, &p, check, 8, "wide");
    /* the steps took the sequences together: far fewer steps than requests, and most of
     * the 1024 ran at once */
    fprintf(stderr, "wide: at most %d sequences running at once\n", max_running);
    assert_true(st.steps < (uint64_t)N_WIDE);
    assert_true(max_running > N_WIDE / 2);
}

static void test_pool_from_memory(void **state) {
    (void)state;
    comet_engine_params p = gpu_params();
    p.n_pages = 0;
    p.gpu_memory_fraction = 0.5;
    comet_engine *e = comet_engine_init(model, &p);
    if (!e)
        fail_msg("%s", comet_last_error());
    comet_engine_memory mem;
    comet_engine_get_memory(e, &mem);
    fprintf(stderr,
            "pool from memory: total %zu, weights %zu, workspace %zu, pool %zu (%d pages), "
            "peak %zu\n",
            mem.device_total, mem.weights, mem.workspace, mem.kv_pool, mem.kv_pool_pages,
            mem.device_used_peak);
    assert_true(mem.device_total > 0);
    assert_true(mem.weights > 0);
    assert_true(mem.workspace > 0);
    assert_true(mem.kv_pool_pages > 0);
    assert_int_equal(mem.kv_pool_tokens, mem.kv_pool_pages * 16);
    assert_true(mem.max_seqs_ctx >= 1);
    /* the pool and everything before it stay under the fraction */
    assert_true(mem.device_used_peak >= mem.weights + mem.kv_pool);
    assert_true(mem.device_used_peak <= (size_t)(0.5 * (double)mem.device_total));
    /* a request runs on it */
    int32_t *ids;
    int n = make_prompt(3, 0, &ids);
    collect c = {0};
    pthread_mutex_init(&c.mu, NULL);
    comet_request_params rp = et_greedy(ids, n, 8);
    assert_int_equal(comet_engine_submit(e, &rp, on_event, &c, NULL), COMET_OK);
    assert_true(comet_engine_wait_idle(e, 600));
    assert_int_equal(c.n_toks, 8);
    /* what the steps grew (GEMM and attention scratch, graphs) stayed in the headroom */
    comet_engine_memory after;
    comet_engine_get_memory(e, &after);
    assert_true(after.device_used_peak >= mem.weights + mem.workspace + mem.kv_pool);
    assert_true(after.device_used_peak <= (size_t)(0.5 * (double)after.device_total));
    free(ids);
    comet_engine_free(e);

    /* too small a fraction for one sequence of the context: refused by the check before the
     * weights load (its message gives the weights' estimate, "~") */
    p.gpu_memory_fraction = 1e-4;
    assert_null(comet_engine_init(model, &p));
    assert_non_null(strstr(comet_last_error(), "cannot hold one sequence"));
    assert_non_null(strstr(comet_last_error(), "the weights ~"));
    p.gpu_memory_fraction = 1.5;
    assert_null(comet_engine_init(model, &p));
    assert_non_null(strstr(comet_last_error(), "outside (0, 1]"));
}

int main(void) {
    cuda_test_skip_if_no_device();
    const char *path = src_path("models/smollm2-w4axkv4");
    if (comet_model_load(path, &model) < 0) {
        printf("SKIP: cannot load %s: %s\n", path, comet_last_error());
        return SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_pool_preemption),
        cmocka_unit_test(test_wide_batch),
        cmocka_unit_test(test_pool_from_memory),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_model_free(model);
    return rc;
}

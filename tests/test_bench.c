/* test_bench.c — the benchmarks of comet/bench.h on the CPU, on a tiny random LLaMA with
 * a token-id tokenizer (comet_tokenizer_ids, as synthetic models have: the engine
 * detokenizes what it generates): the offline throughput
 * run produces exactly N * O tokens with finite, positive figures and a mean batch within
 * max_seqs, fails loudly when requests do not produce their tokens (NaN weights), and
 * refuses bad input by name; the decode benchmark at batch B gives each sequence the
 * tokens of the batch-1 run of its prompt (greedy) and profiles the batched step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "comet/backend.h"
#include "comet/bench.h"
#include "comet/engine.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "cpu_test_util.h"

static comet_model *tiny; /* random weights; a tokenizer without vocabulary (token ids) */

static int setup(void **state) {
    (void)state;
    tiny = tu_shaped_model(
        7, (tu_shape){.n_layer = 2, .C = 32, .F = 64, .H = 4, .Hkv = 2, .D = 8, .V = 500});
    tiny->tok = comet_tokenizer_ids("test", "tiny", tiny->cfg.n_vocab, -1, -1);
    return tiny->tok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    comet_tokenizer_free(tiny->tok); /* tu_model_free leaves it */
    tu_model_free(tiny);
    return 0;
}

static comet_bench_throughput_params tiny_params(int I, int O, int N, int max_seqs) {
    comet_bench_throughput_params p = comet_bench_throughput_default_params();
    p.input_len = I;
    p.output_len = O;
    p.n_requests = N;
    p.engine.max_seqs = max_seqs;
    p.engine.max_batch_tokens = 64;
    p.engine.n_pages = 64;
    p.engine.n_threads = 1;
    return p;
}

static int finite_pos(double x) { return isfinite(x) && x > 0; }

/* N requests through max_seqs slots: every figure is there and consistent. */
static void test_throughput_counts(void **state) {
    (void)state;
    const int I = 21, O = 9, N = 11, C = 4;
    comet_bench_throughput_params p = tiny_params(I, O, N, C);
    comet_bench_throughput_result r;
    assert_int_equal(comet_bench_throughput(tiny, &p, &r), COMET_OK);
    assert_int_equal(r.output_tokens, (uint64_t)N * O);
    assert_true(finite_pos(r.wall_s) && finite_pos(r.output_tok_s) && finite_pos(r.total_tok_s));
    assert_true(fabs(r.output_tok_s * r.wall_s - N * O) < 1e-6 * N * O);
    assert_true(fabs(r.total_tok_s / r.output_tok_s - (double)(I + O) / O) < 1e-9);
    assert_true(finite_pos(r.ttft_p50_s) && r.ttft_p50_s <= r.ttft_p99_s);
    assert_true(r.ttft_p99_s <= r.wall_s);
    assert_true(finite_pos(r.tpot_p50_s) && r.tpot_p50_s <= r.tpot_p99_s);
    /* N / C rounds of at least O steps each; never more sequences than C in a step */
    assert_true(r.steps >= (uint64_t)((N + C - 1) / C) * O);
    assert_true(r.mean_batch_seqs >= 1.0 && r.mean_batch_seqs <= C);
    assert_true(r.mean_batch_tokens >= r.mean_batch_seqs && r.mean_batch_tokens <= 64);
    /* every token fed once: N * I prompt tokens, N * (O - 1) decodes */
    assert_true(fabs(r.mean_batch_tokens * (double)r.steps - (double)N * (I + O - 1)) < 1e-6);
    assert_true(finite_pos(r.step_s) && finite_pos(r.forward_s));
    assert_true(r.host_before_s > 0 && r.host_after_s > 0);
    assert_true(fabs(r.host_before_s + r.forward_s + r.host_after_s - r.step_s) < 1e-9);
    assert_true(r.host_share > 0 && r.host_share < 1);
    assert_true(r.step_s * (double)r.steps <= r.wall_s * 1.01);
    assert_int_equal(r.preemptions, 0);
    assert_int_equal(r.kv_pool_tokens, 64 * 16);
    assert_int_equal(r.kv_pool_seqs, 64 / 2); /* 30 tokens: 2 pages */
}

/* All submitted at once: the engine's first step takes every request (four prompts of 8
 * tokens, one output token each: one step of 4 sequences). */
static void test_throughput_one_first_step(void **state) {
    (void)state;
    comet_bench_throughput_params p = tiny_params(8, 1, 4, 4);
    comet_bench_throughput_result r;
    assert_int_equal(comet_bench_throughput(tiny, &p, &r), COMET_OK);
    assert_int_equal(r.output_tokens, 4);
    assert_int_equal(r.steps, 1);
    assert_true(r.mean_batch_seqs == 4.0);
}

/* The longest request the context allows, with one output token (no TPOT). */
static void test_throughput_whole_context(void **state) {
    (void)state;
    comet_bench_throughput_params p = tiny_params(255, 1, 3, 2);
    p.engine.max_batch_tokens = 256;
    comet_bench_throughput_result r;
    assert_int_equal(comet_bench_throughput(tiny, &p, &r), COMET_OK);
    assert_int_equal(r.output_tokens, 3);
    assert_true(r.tpot_p50_s == 0 && r.tpot_p99_s == 0);
    assert_true(finite_pos(r.ttft_p50_s));
}

/* A pool of 3 sequences under 4 slots preempts, and still every request gets O tokens. */
static void test_throughput_preemption(void **state) {
    (void)state;
    comet_bench_throughput_params p = tiny_params(30, 18, 6, 4);
    p.engine.n_pages = 9; /* 48 tokens = 3 pages each */
    comet_bench_throughput_result r;
    assert_int_equal(comet_bench_throughput(tiny, &p, &r), COMET_OK);
    assert_int_equal(r.output_tokens, 6 * 18);
    assert_int_equal(r.kv_pool_seqs, 3);
    assert_true(r.preemptions > 0);
    assert_true(r.mean_batch_seqs <= 4);
}

/* A request that ends early (NaN logits: every request finishes with an error) fails the
 * run by name instead of reporting a throughput over missing tokens. */
static void test_throughput_lost_tokens_fail(void **state) {
    (void)state;
    float saved = tiny->output_norm[0];
    tiny->output_norm[0] = NAN;
    comet_bench_throughput_params p = tiny_params(5, 4, 3, 2);
    comet_bench_throughput_result r;
    comet_status st = comet_bench_throughput(tiny, &p, &r);
    tiny->output_norm[0] = saved;
    assert_int_equal(st, COMET_ERR_INTERNAL);
    assert_non_null(strstr(comet_last_error(), "finished (error"));
    assert_non_null(strstr(comet_last_error(), "were asked for"));
}

static void expect_invalid(comet_bench_throughput_params p, const char *needle) {
    comet_bench_throughput_result r;
    assert_int_equal(comet_bench_throughput(tiny, &p, &r), COMET_ERR_INVALID_ARG);
    if (!strstr(comet_last_error(), needle))
        fail_msg("'%s' does not say '%s'", comet_last_error(), needle);
}

static void test_throughput_bad_input(void **state) {
    (void)state;
    expect_invalid(tiny_params(0, 4, 2, 2), "must be >= 1");
    expect_invalid(tiny_params(4, 0, 2, 2), "must be >= 1");
    expect_invalid(tiny_params(4, 4, 0, 2), "must be >= 1");
    expect_invalid(tiny_params(200, 57, 2, 2), "exceed the model's context of 256");
    comet_bench_throughput_params p = tiny_params(40, 20, 2, 2);
    p.engine.n_pages = 3;
    expect_invalid(p, "cannot hold one request of 40 + 20 tokens (4 pages)");
}

/* Decode at batch B of prompts of prompt_n: sequence b's tokens (of those listed in
 * check [n_check]) are those of the batch-1 run with seed + b. */
static void decode_batch_matches(comet_backend *be, int B, int prompt_n, const int *check,
                                 int n_check) {
    enum {
        DEC = 7
    };
    int32_t *batched = malloc((size_t)B * (DEC + 1) * sizeof *batched), alone[DEC + 1];
    comet_bench_params p = comet_bench_default_params();
    p.prompt_tokens = prompt_n;
    p.decode_tokens = DEC;
    p.reps = 1;
    p.seed = 40;
    p.decode_batch = B;
    p.tokens = batched;
    comet_bench_result r;
    assert_int_equal(comet_bench(tiny, be, &p, &r), COMET_OK);
    assert_true(finite_pos(r.decode_tok_s) && finite_pos(r.prefill_tok_s));
    assert_true(r.n_ops > 3 && !strcmp(r.ops[r.n_ops - 1].name, "sample"));
    int distinct = 0;
    for (int i = 0; i < n_check; i++) {
        int b = check[i];
        comet_bench_params q = p;
        q.decode_batch = 1;
        q.seed = p.seed + (uint64_t)b;
        q.tokens = alone;
        assert_int_equal(comet_bench(tiny, be, &q, &r), COMET_OK);
        assert_memory_equal(batched + b * (DEC + 1), alone, sizeof alone);
        distinct += b > 0 && memcmp(batched, alone, sizeof alone) != 0;
    }
    assert_true(distinct > 0); /* the sequences had prompts of their own */
    free(batched);
}

static void test_decode_batch_matches_batch1(void **state) {
    (void)state;
    comet_backend *be = comet_backend_open("cpu", 1);
    assert_non_null(be);
    const int all5[] = {0, 1, 2, 3, 4};
    decode_batch_matches(be, 5, 13, all5, 5); /* the 5 prompts prefilled in one step */
    /* 20 prompts of 120: prefilled 17 to a step (2048 tokens), then 3 */
    const int some[] = {0, 1, 16, 17, 19};
    decode_batch_matches(be, 20, 120, some, 5);
    comet_bench_params p = comet_bench_default_params();
    p.decode_batch = COMET_BENCH_MAX_BATCH + 1;
    comet_bench_result r;
    assert_int_equal(comet_bench(tiny, be, &p, &r), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "decode_batch"));
    comet_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_throughput_counts),
        cmocka_unit_test(test_throughput_one_first_step),
        cmocka_unit_test(test_throughput_whole_context),
        cmocka_unit_test(test_throughput_preemption),
        cmocka_unit_test(test_throughput_lost_tokens_fail),
        cmocka_unit_test(test_throughput_bad_input),
        cmocka_unit_test(test_decode_batch_matches_batch1),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

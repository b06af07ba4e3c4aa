/* test_sampler.c — greedy, top-k / top-p / min-p masks on hand-made distributions,
 * determinism per seed, temperature 0 == greedy, penalties, and empirical frequencies of
 * temperature-1 sampling against the softmax; tiny temperatures, logit_bias, and the
 * parameters' check and merge. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "engine/sampler.h"
#include "cpu_test_util.h"

static comet_sampler_params plain(float temp) {
    comet_sampler_params p = comet_sampler_default_params();
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    return p;
}

/* Draw n times from logits (copied each time) and count ids. */
static void draw_counts(comet_sampler *s, const float *logits, int V, int n, int *counts) {
    float *tmp = malloc((size_t)V * sizeof(float));
    memset(counts, 0, (size_t)V * sizeof(int));
    for (int i = 0; i < n; i++) {
        memcpy(tmp, logits, (size_t)V * sizeof(float));
        int32_t id = comet_sampler_sample(s, tmp, NULL, 0);
        assert_true(id >= 0 && id < V);
        counts[id]++;
    }
    free(tmp);
}

static void test_greedy(void **state) {
    int V = 1000;
    float *l = tu_rand_buf(V, 5.0f);
    l[613] = 9.0f;
    comet_sampler_params p = plain(0.0f);
    comet_sampler *s = comet_sampler_init(&p, V);
    assert_int_equal(comet_sampler_sample(s, l, NULL, 0), 613);
    /* top_k = 1 at any temperature is greedy too */
    comet_sampler_params p1 = plain(1.5f);
    p1.top_k = 1;
    comet_sampler *s1 = comet_sampler_init(&p1, V);
    assert_int_equal(comet_sampler_sample(s1, l, NULL, 0), 613);
    /* ties: lowest id */
    l[5] = 9.0f;
    assert_int_equal(comet_sampler_sample(s, l, NULL, 0), 5);
    comet_sampler_free(s);
    comet_sampler_free(s1);
    free(l);
}

/* probabilities 0.4 0.3 0.2 0.1 (ids 3 1 0 2) */
static void hand_logits(float *l) {
    l[0] = logf(0.2f);
    l[1] = logf(0.3f);
    l[2] = logf(0.1f);
    l[3] = logf(0.4f);
}

static void test_top_k(void **state) {
    float l[4];
    hand_logits(l);
    comet_sampler_params p = plain(1.0f);
    p.top_k = 2;
    comet_sampler *s = comet_sampler_init(&p, 4);
    int c[4];
    draw_counts(s, l, 4, 4000, c);
    assert_int_equal(c[0], 0);
    assert_int_equal(c[2], 0);
    /* renormalized 0.4/0.7 vs 0.3/0.7 */
    assert_true(fabs(c[3] / 4000.0 - 4.0 / 7) < 0.03);
    comet_sampler_free(s);
}

static void test_top_p(void **state) {
    float l[4];
    hand_logits(l);
    comet_sampler_params p = plain(1.0f);
    p.top_p = 0.65f; /* 0.4 + 0.3 = 0.7 >= 0.65: ids 3 and 1 */
    comet_sampler *s = comet_sampler_init(&p, 4);
    int c[4];
    draw_counts(s, l, 4, 4000, c);
    assert_int_equal(c[0] + c[2], 0);
    assert_true(c[3] > 0 && c[1] > 0);
    comet_sampler_free(s);
    p.top_p = 0.75f; /* needs id 0 as well */
    s = comet_sampler_init(&p, 4);
    draw_counts(s, l, 4, 4000, c);
    assert_int_equal(c[2], 0);
    assert_true(c[0] > 0);
    comet_sampler_free(s);
}

/* top-p over a large flat vocabulary: the first 256 candidates do not reach top_p, so
 * the sampler must widen to the full sort. */
static void test_top_p_wide(void **state) {
    int V = 2000;
    float *l = calloc(V, sizeof(float));
    for (int i = 0; i < V; i++)
        l[i] = (i % 2) ? 0.0f : -0.01f; /* odd ids slightly more likely */
    comet_sampler_params p = plain(1.0f);
    p.top_p = 0.5f; /* about the 1000 odd ids */
    comet_sampler *s = comet_sampler_init(&p, V);
    int *c = malloc(V * sizeof(int));
    draw_counts(s, l, V, 5000, c);
    int even = 0, odd_hit = 0;
    for (int i = 0; i < V; i++) {
        if (i % 2 == 0)
            even += c[i];
        else
            odd_hit += c[i] > 0;
    }
    assert_int_equal(even, 0);
    assert_true(odd_hit > 900); /* spread over (nearly) all of them, not just 256 */
    comet_sampler_free(s);
    free(c);
    free(l);
}

static void test_min_p(void **state) {
    float l[4];
    hand_logits(l);
    comet_sampler_params p = plain(1.0f);
    p.min_p = 0.6f; /* keep p >= 0.24: ids 3 (0.4) and 1 (0.3) */
    comet_sampler *s = comet_sampler_init(&p, 4);
    int c[4];
    draw_counts(s, l, 4, 4000, c);
    assert_int_equal(c[0] + c[2], 0);
    assert_true(c[1] > 0 && c[3] > 0);
    comet_sampler_free(s);
}

static void test_seed_and_temperature_zero(void **state) {
    int V = 500;
    float *l = tu_rand_buf(V, 3.0f), *t = malloc(V * sizeof(float));
    comet_sampler_params p = comet_sampler_default_params();
    p.seed = 99;
    comet_sampler *a = comet_sampler_init(&p, V), *b = comet_sampler_init(&p, V);
    p.seed = 100;
    comet_sampler *c = comet_sampler_init(&p, V);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        memcpy(t, l, V * 4);
        int32_t x = comet_sampler_sample(a, t, NULL, 0);
        memcpy(t, l, V * 4);
        int32_t y = comet_sampler_sample(b, t, NULL, 0);
        memcpy(t, l, V * 4);
        int32_t z = comet_sampler_sample(c, t, NULL, 0);
        assert_int_equal(x, y);
        differ += x != z;
    }
    assert_true(differ > 0);
    /* temperature 0 == greedy, whatever top-k/p say */
    comet_sampler_params g = comet_sampler_default_params();
    g.temperature = 0.0f;
    comet_sampler *gs = comet_sampler_init(&g, V);
    memcpy(t, l, V * 4);
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    assert_int_equal(comet_sampler_sample(gs, t, NULL, 0), best);
    comet_sampler_free(a);
    comet_sampler_free(b);
    comet_sampler_free(c);
    comet_sampler_free(gs);
    free(l);
    free(t);
}

static void test_empirical_softmax(void **state) {
    int V = 12, N = 200000;
    float l[12];
    double z = 0, pr[12];
    for (int i = 0; i < V; i++)
        l[i] = 0.3f * i - 0.02f * i * i;
    for (int i = 0; i < V; i++)
        z += exp(l[i]);
    comet_sampler_params p = plain(1.0f);
    p.seed = 2024;
    comet_sampler *s = comet_sampler_init(&p, V);
    int c[12];
    draw_counts(s, l, V, N, c);
    for (int i = 0; i < V; i++) {
        pr[i] = exp(l[i]) / z;
        double sd = sqrt(pr[i] * (1 - pr[i]) / N);
        assert_true(fabs((double)c[i] / N - pr[i]) < 5 * sd);
    }
    /* temperature 2 flattens: compare with softmax(l / 2) */
    comet_sampler_free(s);
    p.temperature = 2.0f;
    s = comet_sampler_init(&p, V);
    draw_counts(s, l, V, N, c);
    z = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i] / 2);
    for (int i = 0; i < V; i++) {
        double q = exp(l[i] / 2) / z, sd = sqrt(q * (1 - q) / N);
        assert_true(fabs((double)c[i] / N - q) < 5 * sd);
    }
    comet_sampler_free(s);
}

static void test_penalties(void **state) {
    float l[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
    int32_t hist[4] = {0, 1, 1, 3};
    comet_sampler_params p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3; /* sees 1, 1, 3 */
    comet_sampler *s = comet_sampler_init(&p, 5);
    int32_t id = comet_sampler_sample(s, l, hist, 4);
    assert_float_equal(l[0], 2.0f, 0);  /* outside the window */
    assert_float_equal(l[1], -2.0f, 0); /* negative: multiplied, once */
    assert_float_equal(l[3], 1.5f, 0);  /* positive: divided */
    assert_int_equal(id, 0);
    comet_sampler_free(s);

    float m[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
    p = plain(0.0f);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = -1;
    s = comet_sampler_init(&p, 5);
    comet_sampler_sample(s, m, hist, 4);
    assert_float_equal(m[0], 2.0f - 0.5f - 0.25f, 1e-6);
    assert_float_equal(m[1], -1.0f - 0.5f - 0.5f, 1e-6);
    assert_float_equal(m[4], 0.0f, 0);
    comet_sampler_free(s);
}

static void test_bad_params(void **state) {
    comet_sampler_params p = plain(1.0f);
    p.top_p = 0.0f;
    assert_null(comet_sampler_init(&p, 10));
    assert_non_null(strstr(comet_last_error(), "top_p"));
    p = plain(-1.0f);
    assert_null(comet_sampler_init(&p, 10));
}

/* Temperatures too small to matter are greedy (comet/sampling.h COMET_SAMPLER_GREEDY_BELOW):
 * 1 / 1e-38 times a logit of 9 is infinite in float, and the softmax of such a row is NaN
 * everywhere; the argmax is taken instead and no random number is drawn. */
static void test_tiny_temperature(void **state) {
    int V = 1000;
    float *l = tu_rand_buf(V, 5.0f);
    l[613] = 9.0f;
    const float tiny[] = {1e-38f, 1e-40f, 1e-45f, 9.9e-6f};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        comet_sampler_params p = plain(tiny[i]);
        comet_sampler *s = comet_sampler_init(&p, V), *ref = comet_sampler_init(&p, V);
        assert_non_null(s);
        assert_true(comet_sampler_greedy(s));
        for (int round = 0; round < 5; round++)
            assert_int_equal(comet_sampler_sample(s, l, NULL, 0), 613);
        /* no draw consumed: the stream is where a fresh one starts */
        assert_true(comet_sampler_uniform(s) == comet_sampler_uniform(ref));
        comet_sample_row row = comet_sampler_row(s, 0, 0, 0); /* what the device gets */
        assert_true(row.greedy);
        assert_float_equal(row.inv_temperature, 1.0f, 0);
        comet_sampler_free(s);
        comet_sampler_free(ref);
    }
    /* at the epsilon itself the sampler samples (and the tempered logits are finite) */
    comet_sampler_params p = plain(COMET_SAMPLER_GREEDY_BELOW);
    comet_sampler *s = comet_sampler_init(&p, V);
    assert_false(comet_sampler_greedy(s));
    assert_int_equal(comet_sampler_sample(s, l, NULL, 0), 613); /* 4 / 1e-5 apart: one-hot */
    comet_sampler_free(s);
    free(l);
}

/* logit_bias: added to the logits before the chain; -100 bans, +100 selects; merged with
 * the penalty window's ids in one list (what the device receives). */
static void test_logit_bias(void **state) {
    int V = 1000;
    float *l = tu_rand_buf(V, 5.0f);
    l[613] = 9.0f;
    l[7] = 8.5f;
    comet_logit_bias ban[] = {{613, -100.0f}};
    comet_sampler_params p = plain(0.0f);
    p.logit_bias = ban;
    p.n_logit_bias = 1;
    comet_sampler *s = comet_sampler_init(&p, V);
    assert_non_null(s);
    float *x = malloc((size_t)V * sizeof *x);
    memcpy(x, l, (size_t)V * sizeof *x);
    assert_int_equal(comet_sampler_sample(s, x, NULL, 0), 7); /* the runner-up */
    assert_true(isinf(x[613]) && x[613] < 0);
    comet_sampler_free(s);

    /* sampled at temperature 2 with no filters: the banned favourite never comes */
    p = plain(2.0f);
    p.logit_bias = ban;
    p.n_logit_bias = 1;
    s = comet_sampler_init(&p, V);
    int *counts = malloc((size_t)V * sizeof *counts);
    draw_counts(s, l, V, 3000, counts);
    assert_int_equal(counts[613], 0);
    assert_true(counts[7] > 0);
    comet_sampler_free(s);

    /* +100 on an unlikely token selects it; a small bias is added exactly */
    comet_logit_bias pick[] = {{3, 100.0f}, {10, 0.25f}};
    p = plain(0.8f);
    p.logit_bias = pick;
    p.n_logit_bias = 2;
    s = comet_sampler_init(&p, V);
    draw_counts(s, l, V, 200, counts);
    assert_int_equal(counts[3], 200);
    memcpy(x, l, (size_t)V * sizeof *x);
    comet_sampler_sample(s, x, NULL, 0);
    assert_true(x[10] == l[10] + 0.25f);
    assert_true(x[11] == l[11]);
    comet_sampler_free(s);

    /* the listed ids: the penalty window's first (with their bias), then the other biased
     * ids ascending, count 0; the caller's array is copied at init */
    comet_logit_bias mixed[] = {{9, -2.0f}, {5, 1.5f}};
    p = plain(0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = -1;
    p.logit_bias = mixed;
    p.n_logit_bias = 2;
    s = comet_sampler_init(&p, V);
    mixed[0].bias = 50.0f; /* after init: not seen */
    int32_t hist[3] = {3, 5, 3};
    assert_int_equal(comet_sampler_adjust_cap(s, 3), 5);
    comet_sample_adj adj[5];
    int k = comet_sampler_adjust_list(s, hist, 3, adj);
    assert_int_equal(k, 3);
    assert_int_equal(adj[0].id, 3);
    assert_int_equal(adj[0].count, 2);
    assert_float_equal(adj[0].bias, 0.0f, 0);
    assert_int_equal(adj[1].id, 5);
    assert_int_equal(adj[1].count, 1);
    assert_float_equal(adj[1].bias, 1.5f, 0);
    assert_int_equal(adj[2].id, 9);
    assert_int_equal(adj[2].count, 0);
    assert_float_equal(adj[2].bias, -2.0f, 0);
    /* bias first, then the penalty: (1 + 1.5) / 1.5; count 0: the bias alone */
    const comet_sampler_params *sp = comet_sampler_get_params(s);
    assert_float_equal(comet_sampler_adjust(sp, 1.0f, 1, 1.5f), 2.5f / 1.5f, 1e-6);
    assert_float_equal(comet_sampler_adjust(sp, 1.0f, 0, -2.0f), -1.0f, 0);
    assert_true(isinf(comet_sampler_adjust(sp, 1.0f, 3, -100.0f)));
    /* the list is the same on the next call (the window counts are reset) */
    assert_int_equal(comet_sampler_adjust_list(s, hist, 3, adj), 3);
    assert_int_equal(adj[0].count, 2);
    comet_sampler_free(s);
    free(counts);
    free(x);
    free(l);
}

/* One check for every front end: each bad field is named, with the range. */
static void test_params_check(void **state) {
    unsigned bad = 0;
    comet_sampler_params p = comet_sampler_default_params();
    assert_int_equal(comet_sampler_params_check(&p, 100, &bad), COMET_OK);
    assert_int_equal(bad, 0);
#define EXPECT_BAD(field_expr, want_bit, text)                                                     \
    do {                                                                                           \
        p = comet_sampler_default_params();                                                        \
        field_expr;                                                                                \
        assert_int_equal(comet_sampler_params_check(&p, 100, &bad), COMET_ERR_INVALID_ARG);        \
        assert_int_equal(bad, want_bit);                                                           \
        if (!strstr(comet_last_error(), text))                                                     \
            fail_msg("'%s' does not say '%s'", comet_last_error(), text);                          \
    } while (0)
    EXPECT_BAD(p.temperature = 2.5f, COMET_SAMPLER_TEMPERATURE, "temperature must be in [0, 2]");
    EXPECT_BAD(p.temperature = -0.1f, COMET_SAMPLER_TEMPERATURE, "got -0.1");
    EXPECT_BAD(p.temperature = NAN, COMET_SAMPLER_TEMPERATURE, "temperature");
    EXPECT_BAD(p.top_k = -1, COMET_SAMPLER_TOP_K, "top_k must be >= 0");
    EXPECT_BAD(p.top_p = 0.0f, COMET_SAMPLER_TOP_P, "top_p must be in (0, 1]");
    EXPECT_BAD(p.min_p = 1.5f, COMET_SAMPLER_MIN_P, "min_p must be in [0, 1]");
    EXPECT_BAD(p.repeat_penalty = 0.0f, COMET_SAMPLER_REPEAT_PENALTY, "repetition_penalty");
    EXPECT_BAD(p.repeat_last_n = -2, COMET_SAMPLER_REPEAT_LAST_N, "repeat_last_n");
    EXPECT_BAD(p.presence_penalty = 2.5f, COMET_SAMPLER_PRESENCE_PENALTY, "[-2, 2]");
    EXPECT_BAD(p.frequency_penalty = -3.0f, COMET_SAMPLER_FREQUENCY_PENALTY, "[-2, 2]");
    comet_logit_bias b[3] = {{5, 1.0f}, {100, 1.0f}, {5, 2.0f}};
    EXPECT_BAD((p.logit_bias = b + 1, p.n_logit_bias = 1), COMET_SAMPLER_LOGIT_BIAS,
               "token id 100 is outside the vocabulary [0, 100)");
    EXPECT_BAD((p.logit_bias = b, p.n_logit_bias = 3, b[1].id = 6), COMET_SAMPLER_LOGIT_BIAS,
               "token id 5 is given twice");
    b[0].bias = 100.5f;
    EXPECT_BAD((p.logit_bias = b, p.n_logit_bias = 1), COMET_SAMPLER_LOGIT_BIAS,
               "must be in [-100, 100], got 100.5");
    EXPECT_BAD((p.logit_bias = NULL, p.n_logit_bias = 1), COMET_SAMPLER_LOGIT_BIAS, "entries");
    comet_logit_bias all[2] = {{0, -100.0f}, {1, -100.0f}};
    p = comet_sampler_default_params();
    p.logit_bias = all;
    p.n_logit_bias = 2;
    assert_int_equal(comet_sampler_params_check(&p, 3, NULL), COMET_OK);
    assert_int_equal(comet_sampler_params_check(&p, 2, &bad), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "bans every token"));
    /* n_vocab 0 (not known yet): ids are not held against a vocabulary */
    b[0] = (comet_logit_bias){123456, 1.0f};
    p.logit_bias = b;
    p.n_logit_bias = 1;
    assert_int_equal(comet_sampler_params_check(&p, 0, NULL), COMET_OK);
    /* the sampler refuses what the check refuses, naming it */
    assert_null(comet_sampler_init(&p, 100));
    assert_non_null(strstr(comet_last_error(), "sampler: logit_bias: token id 123456"));
#undef EXPECT_BAD
}

/* merge copies exactly the fields whose bits are given. */
static void test_params_merge(void **state) {
    comet_sampler_params d = comet_sampler_default_params(), src = d;
    comet_logit_bias b[1] = {{4, 2.0f}};
    src.temperature = 0.1f;
    src.top_k = 7;
    src.top_p = 0.5f;
    src.presence_penalty = 1.0f;
    src.logit_bias = b;
    src.n_logit_bias = 1;
    comet_sampler_params m = d;
    comet_sampler_params_merge(&m, &src, COMET_SAMPLER_TEMPERATURE | COMET_SAMPLER_LOGIT_BIAS);
    assert_float_equal(m.temperature, 0.1f, 0);
    assert_int_equal(m.top_k, d.top_k);
    assert_float_equal(m.top_p, d.top_p, 0);
    assert_float_equal(m.presence_penalty, 0.0f, 0);
    assert_ptr_equal(m.logit_bias, b);
    assert_int_equal(m.n_logit_bias, 1);
    m = d;
    comet_sampler_params_merge(&m, &src, COMET_SAMPLER_ALL);
    assert_int_equal(m.top_k, 7);
    assert_float_equal(m.presence_penalty, 1.0f, 0);
    m = d;
    comet_sampler_params_merge(&m, &src, 0);
    assert_memory_equal(&m, &d, sizeof m);
    assert_string_equal(comet_sampler_field_name(COMET_SAMPLER_REPEAT_PENALTY),
                        "repetition_penalty");
    assert_string_equal(comet_sampler_field_name(COMET_SAMPLER_LOGIT_BIAS), "logit_bias");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_top_p_wide),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_seed_and_temperature_zero),
        cmocka_unit_test(test_empirical_softmax),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_tiny_temperature),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_params_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

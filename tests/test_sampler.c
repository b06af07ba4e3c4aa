/* test_sampler.c — greedy, top-k / top-p / min-p masks on hand-made distributions,
 * determinism per seed, temperature 0 == greedy, penalties, and empirical frequencies of
 * temperature-1 sampling against the softmax. */
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

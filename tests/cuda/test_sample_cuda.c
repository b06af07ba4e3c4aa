/* test_sample_cuda.c — sampling where the logits are (the CUDA backend's op `sample`, through
 * comet_sampling_run as the runner calls it) against the host's sampler
 * (comet_sampler_sample) on the same rows with the same seeds:
 *
 * - every token equal, over vocabularies of 1000, 49152 and 128256, peaked, flat and tied
 *   (values on a grid of 1/4) rows, three rounds per sampler (the random streams stay in
 *   step), for greedy, top_k 1, plain temperature (the draw in id order), the default chain
 *   (top-k 40, top-p 0.95, min-p 0.05), top-k alone (1, 40, 2048, 3000), top-p alone, min-p
 *   alone, and penalties (repetition, presence, frequency) over a history with repeats;
 * - the rows a device cannot sort (top-k 3000, top-p 0.99 over a flat row) come back as
 *   COMET_SAMPLE_ON_HOST from the op and are still equal through comet_sampling_run; the
 *   default chain never does;
 * - a row holding a NaN or an infinity gives COMET_SAMPLE_NONFINITE and its values in the
 *   host scratch, the other rows of the call their tokens; a ban's -infinity does not.
 *
 * Exit 77 (ctest: skipped) when no CUDA device is usable.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "engine/runner.h"
#include "engine/sampler.h"

#include "cuda_skip.h"

static comet_backend *g_cuda;

static uint64_t g_rng = 0x243F6A8885A308D3ull;

static double uniform(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static float gauss(void) {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

enum shape {
    PEAKED,
    FLAT,
    TIED
};

static void fill_row(float *x, int V, enum shape sh) {
    for (int i = 0; i < V; i++) {
        float g = gauss();
        x[i] = sh == PEAKED ? 3.0f * g : sh == FLAT ? 0.3f * g : roundf(8.0f * g) / 4.0f;
    }
    if (sh == PEAKED) /* a few clear favourites, as a language model's row has */
        for (int j = 0; j < 5; j++)
            x[(int)(uniform() * V)] += 12.0f - 2.0f * (float)j;
}

typedef struct cfg {
    const char *name;
    float temperature;
    int top_k;
    float top_p, min_p;
    float repeat_penalty, presence_penalty, frequency_penalty;
    int bias; /* 1: BIAS below as logit_bias */
} cfg;

/* Bans ids 0..11 (the history's ids, which the rows favour), and shifts 12..23 both ways:
 * the winner changes, and biased ids meet the penalty window's. */
static comet_logit_bias BIAS[24];
static void init_bias(void) {
    for (int i = 0; i < 24; i++)
        BIAS[i] = (comet_logit_bias){i, i < 12 ? -100.0f : i < 18 ? 3.5f : -2.25f};
}

static const cfg CFGS[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_k 1", 0.9f, 1, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"temperature only", 0.8f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"temperature 1.7", 1.7f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"default chain", 0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 0},
    {"top_k 40", 1.0f, 40, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_k 2048", 1.0f, 2048, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_k 3000 (host)", 1.0f, 3000, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_k 40 + top_p 0.5", 1.2f, 40, 0.5f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_p 0.9", 1.0f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"top_p 0.99", 1.5f, 0, 0.99f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"min_p 0.1", 1.0f, 0, 1.0f, 0.1f, 1.0f, 0.0f, 0.0f, 0},
    {"top_p 0.9 + min_p 0.02", 1.0f, 0, 0.9f, 0.02f, 1.0f, 0.0f, 0.0f, 0},
    {"penalties, greedy", 0.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.25f, 0},
    {"penalties, default chain", 0.8f, 40, 0.95f, 0.05f, 1.1f, 0.2f, 0.1f, 0},
    {"temperature 1e-40 (greedy)", 1e-40f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0},
    {"temperature 1e-45, default filters (greedy)", 1e-45f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 0},
    {"temperature 1e-38 + penalties (greedy)", 1e-38f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.25f, 0},
    {"logit_bias, greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1},
    {"logit_bias, temperature only", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1},
    {"logit_bias, default chain", 0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 1},
    {"logit_bias + penalties, top_p 0.9", 1.0f, 0, 0.9f, 0.0f, 1.2f, 0.3f, 0.2f, 1},
};
#define N_CFGS ((int)(sizeof CFGS / sizeof CFGS[0]))

static comet_sampler *make_sampler(const cfg *c, int V, uint64_t seed) {
    comet_sampler_params p = comet_sampler_default_params();
    p.temperature = c->temperature;
    p.top_k = c->top_k;
    p.top_p = c->top_p;
    p.min_p = c->min_p;
    p.repeat_penalty = c->repeat_penalty;
    p.presence_penalty = c->presence_penalty;
    p.frequency_penalty = c->frequency_penalty;
    p.repeat_last_n = 48;
    p.seed = seed;
    if (c->bias) {
        p.logit_bias = BIAS;
        p.n_logit_bias = 24;
    }
    comet_sampler *s = comet_sampler_init(&p, V);
    assert_non_null(s);
    return s;
}

/* One vocabulary size and row shape: every configuration as a row of one call, three
 * rounds, device tokens against the host's. */
static void run_case(int V, enum shape sh) {
    const int n = N_CFGS, rounds = 3, H = 96;
    float *host = malloc((size_t)n * V * sizeof *host);
    float *scratch = malloc((size_t)n * V * sizeof *scratch);
    int32_t *hist = malloc((size_t)n * H * sizeof *hist);
    float *dev = g_cuda->ops->alloc(g_cuda, (size_t)n * V * sizeof(float));
    assert_true(host && scratch && hist && dev);
    comet_sampler *cpu[N_CFGS], *gpu[N_CFGS];
    comet_runner_draw draws[N_CFGS];
    for (int i = 0; i < n; i++) {
        cpu[i] = make_sampler(&CFGS[i], V, 1000 + (uint64_t)i);
        gpu[i] = make_sampler(&CFGS[i], V, 1000 + (uint64_t)i);
        for (int t = 0; t < H; t++) /* repeats: ids from a small range */
            hist[i * H + t] = (int32_t)(uniform() * (t % 3 ? 24 : V));
    }
    comet_sampling smp;
    assert_int_equal(comet_sampling_init(&smp, n, 4), COMET_OK); /* listed ids grow */
    int32_t ids[N_CFGS];
    int mismatches = 0;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < n; i++) {
            fill_row(host + (size_t)i * V, V, sh);
            /* the favourites among the history: penalties change the winner */
            for (int t = 0; t < 4; t++)
                host[(size_t)i * V + hist[i * H + H - 1 - t]] += 10.0f;
            draws[i] = (comet_runner_draw){gpu[i], hist + i * H, H};
        }
        assert_int_equal(g_cuda->ops->upload(g_cuda, dev, host, (size_t)n * V * sizeof(float)),
                         COMET_OK);
        assert_int_equal(comet_sampling_run(&smp, g_cuda, dev, V, draws, n, scratch, ids),
                         COMET_OK);
        for (int i = 0; i < n; i++) {
            float *row = host + (size_t)i * V;
            int32_t want = comet_sampler_sample(cpu[i], row, hist + i * H, H);
            if (CFGS[i].bias && want >= 0 && want < 12) {
                mismatches++;
                printf("%s: the host picked banned id %d\n", CFGS[i].name, want);
            }
            if (ids[i] != want) {
                mismatches++;
                printf("V %d shape %d round %d %s: device %d, host %d\n", V, (int)sh, round,
                       CFGS[i].name, ids[i], want);
            }
        }
    }
    assert_int_equal(mismatches, 0);
    for (int i = 0; i < n; i++) {
        comet_sampler_free(cpu[i]);
        comet_sampler_free(gpu[i]);
    }
    comet_sampling_free(&smp);
    g_cuda->ops->free(g_cuda, dev);
    free(host);
    free(scratch);
    free(hist);
}

static void test_small_vocab(void **state) {
    (void)state;
    run_case(1000, PEAKED);
    run_case(1000, FLAT);
    run_case(1000, TIED);
}

static void test_smollm2_vocab(void **state) {
    (void)state;
    run_case(49152, PEAKED);
    run_case(49152, FLAT);
    run_case(49152, TIED);
}

static void test_llama3_vocab(void **state) {
    (void)state;
    run_case(128256, PEAKED);
    run_case(128256, FLAT);
    run_case(128256, TIED);
}

/* The op itself: which rows it leaves to the host, and non-finite rows. */
static void test_op_results(void **state) {
    (void)state;
    const int V = 128256, n = 4;
    float *host = malloc((size_t)n * V * sizeof *host);
    float *dev = g_cuda->ops->alloc(g_cuda, (size_t)n * V * sizeof(float));
    assert_true(host && dev);
    fill_row(host, V, PEAKED);
    fill_row(host + V, V, FLAT);
    fill_row(host + 2 * (size_t)V, V, PEAKED);
    fill_row(host + 3 * (size_t)V, V, PEAKED);
    host[2 * (size_t)V + 777] = NAN;
    host[3 * (size_t)V + 5] = INFINITY;
    assert_int_equal(g_cuda->ops->upload(g_cuda, dev, host, (size_t)n * V * sizeof(float)),
                     COMET_OK);
    comet_sample_row rows[4];
    for (int i = 0; i < n; i++) {
        rows[i] = (comet_sample_row){.p = comet_sampler_default_params(),
                                     .row = i,
                                     .inv_temperature = 1.0f / 0.8f,
                                     .log_min_p = logf(0.05f),
                                     .u = 0.5};
    }
    rows[1].p.top_k = 3000; /* more than the device sorts */
    rows[1].log_min_p = -INFINITY;
    int32_t ids[4];
    assert_int_equal(g_cuda->ops->sample(g_cuda, dev, V, rows, n, NULL, 0, ids), COMET_OK);
    assert_true(ids[0] >= 0 && ids[0] < V);
    assert_int_equal(ids[1], COMET_SAMPLE_ON_HOST);
    assert_int_equal(ids[2], COMET_SAMPLE_NONFINITE);
    assert_int_equal(ids[3], COMET_SAMPLE_NONFINITE);

    /* through comet_sampling_run: the bad row lands in the scratch, the others are picked */
    comet_sampler_params p = comet_sampler_default_params();
    comet_sampler *s[4];
    comet_runner_draw draws[4];
    for (int i = 0; i < n; i++) {
        s[i] = comet_sampler_init(&p, V);
        draws[i] = (comet_runner_draw){s[i], NULL, 0};
    }
    assert_int_equal(g_cuda->ops->upload(g_cuda, dev, host, (size_t)n * V * sizeof(float)),
                     COMET_OK);
    comet_sampling smp;
    assert_int_equal(comet_sampling_init(&smp, n, 0), COMET_OK);
    float *scratch = malloc((size_t)n * V * sizeof *scratch);
    assert_int_equal(comet_sampling_run(&smp, g_cuda, dev, V, draws, n, scratch, ids), COMET_OK);
    assert_true(ids[0] >= 0 && ids[1] >= 0);
    assert_int_equal(ids[2], COMET_SAMPLE_NONFINITE);
    assert_true(isnan(scratch[2 * (size_t)V + 777]));
    assert_int_equal(comet_logits_check(scratch + 3 * (size_t)V, V), COMET_ERR_NUMERIC);

    /* a ban's -infinity is not a fault: the greedy row 0 with its argmax banned gives the
     * runner-up, not COMET_SAMPLE_NONFINITE; a raw NaN under a listed id still is one */
    assert_int_equal(g_cuda->ops->upload(g_cuda, dev, host, (size_t)n * V * sizeof(float)),
                     COMET_OK);
    int32_t best = 0, second = -1;
    for (int i = 1; i < V; i++)
        if (host[i] > host[best])
            best = i;
    for (int i = 0; i < V; i++)
        if (i != best && (second < 0 || host[i] > host[second]))
            second = i;
    comet_sample_adj adj[2] = {{best, 0, -100.0f}, {777, 0, 1.0f}};
    rows[0].greedy = 1;
    rows[0].has_ban = 1;
    rows[0].adj_offset = 0;
    rows[0].n_adj = 1;
    rows[2].has_ban = 1;
    rows[2].adj_offset = 1;
    rows[2].n_adj = 1;
    assert_int_equal(g_cuda->ops->sample(g_cuda, dev, V, rows, 3, adj, 2, ids), COMET_OK);
    assert_int_equal(ids[0], second);
    assert_int_equal(ids[2], COMET_SAMPLE_NONFINITE);

    /* bad arguments are named, not run */
    rows[0].n_adj = 3;
    assert_int_equal(g_cuda->ops->sample(g_cuda, dev, V, rows, 1, NULL, 0, ids),
                     COMET_ERR_INVALID_ARG);
    for (int i = 0; i < n; i++)
        comet_sampler_free(s[i]);
    comet_sampling_free(&smp);
    free(scratch);
    g_cuda->ops->free(g_cuda, dev);
    free(host);
}

int main(void) {
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    init_bias();
    g_cuda = comet_backend_cuda_init(0);
    if (!g_cuda) {
        fprintf(stderr, "comet_backend_cuda_init(0) failed: %s\n", comet_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_results),
        cmocka_unit_test(test_small_vocab),
        cmocka_unit_test(test_smollm2_vocab),
        cmocka_unit_test(test_llama3_vocab),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cuda);
    return rc;
}

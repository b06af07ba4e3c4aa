/* test_cpu_w4ax_model.c — the CPU backend's integer path (backend/cpu/cpu_qstep.h) on the
 * W4AxKV4 checkpoint scripts/setup.sh makes (models/smollm2-w4axkv4), against the fp32
 * simulation of the same checkpoint (the reference, --simulate):
 *   - greedy decoding, 64 steps on 3 prompts: the first token equals the simulation's, and
 *     the first divergence after it is printed with the two candidates' logit gap in each run;
 *   - perplexity over one 512-token window of Austen: within PPL_TOL of the simulation's;
 *   - results independent of the thread count and the prefill chunk: the NLL sum bit for bit.
 * Why no tighter bound holds: the simulation sums the dequantized products in fp32 (in its
 * own order), the integer path sums exactly then scales; the last-bit differences move an
 * activation or KV value across a 4-bit rounding boundary now and then, after which the two
 * runs carry different quantization noise. Two simulations that differ only in their
 * summation order (the threaded backend's and cpu-ref's) differ as much (logits 0.2-0.7
 * apart in normalized error after a few tokens, docs/numerics.md "Reproducibility"), so the
 * test bounds what a bug would exceed, not what rounding can reach.
 * The integer path holds the model as codes only (keep_codes_only), the simulation as the
 * dequantized fp32 weights. Skipped (exit 77 is not used: cmocka's skip) when the checkpoint
 * has not been made. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "comet/model.h"
#include "comet/perplexity.h"
#include "comet/tokenizer.h"
#include "engine/kv_pages.h"
#include "model/forward.h"

#define MODEL_DIR "models/smollm2-w4axkv4"
#define TEXT "data/austen/persuasion.txt"
#define STEPS 64
#define PPL_TOL 0.03 /* relative: the spread of equally valid summation orders (see above) */

static void path_in_source(char *out, size_t cap, const char *rel) {
    const char *src = getenv("COMET_SOURCE_DIR");
    snprintf(out, cap, "%s/%s", src && src[0] ? src : ".", rel);
}

static comet_model *m_int, *m_sim; /* codes only; dequantized fp32 */

static int setup(void **state) {
    (void)state;
    char dir[4096];
    path_in_source(dir, sizeof dir, MODEL_DIR);
    comet_model_load_params p = comet_model_default_load_params();
    p.keep_codes_only = 1;
    if (comet_model_load_with(dir, &p, &m_int) < 0)
        return 0; /* the tests skip */
    if (comet_model_load(dir, &m_sim) < 0)
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    comet_model_free(m_int);
    comet_model_free(m_sim);
    return 0;
}

static void need_model(void) {
    if (!m_int) {
        fprintf(stderr, "%s not found (scripts/setup.sh makes it): skipped\n", MODEL_DIR);
        skip();
    }
}

static comet_backend *open_cpu(int threads, int simulate) {
    comet_backend *be = comet_backend_cpu_init(threads);
    assert_non_null(be);
    comet_backend_set_simulate(be, simulate);
    return be;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Greedy decoding of `steps` tokens after prompt [n]: ids [steps], and every step's logits
 * into logits [steps, V]. */
static void greedy(const comet_model *m, comet_backend *be, const int32_t *prompt, int n,
                   int steps, int32_t *ids, float *logits) {
    const int P = 16, V = m->cfg.n_vocab, total = n + steps;
    const int n_pages = (total + P - 1) / P;
    comet_kv_cache kv;
    comet_kv_pool pool;
    comet_kv_seq seq;
    comet_batch_builder bb;
    assert_int_equal(comet_kv_cache_init_on(be, &kv, m->cfg.n_layer, n_pages, P,
                                            m->cfg.n_head_kv, m->cfg.head_dim, m->kv),
                     COMET_OK);
    assert_int_equal(comet_kv_pool_init(&pool, n_pages, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&seq, total, P), COMET_OK);
    assert_int_equal(comet_batch_builder_init(&bb, n, 1, n_pages, P), COMET_OK);
    comet_forward_ctx *fc = comet_forward_init(m, be, n);
    assert_non_null(fc);
    assert_int_equal(comet_kv_seq_reserve(&pool, &seq, n), COMET_OK);
    assert_int_equal(comet_batch_builder_add(&bb, &seq, prompt, n, 1), COMET_OK);
    assert_int_equal(comet_forward(fc, &kv, &bb.batch, logits), COMET_OK);
    ids[0] = argmax(logits, V);
    for (int s = 1; s < steps; s++) {
        comet_batch_builder_reset(&bb);
        assert_int_equal(comet_kv_seq_reserve(&pool, &seq, 1), COMET_OK);
        assert_int_equal(comet_batch_builder_add(&bb, &seq, &ids[s - 1], 1, 1), COMET_OK);
        float *row = logits + (size_t)s * V;
        assert_int_equal(comet_forward(fc, &kv, &bb.batch, row), COMET_OK);
        ids[s] = argmax(row, V);
    }
    comet_forward_free(fc);
    comet_batch_builder_free(&bb);
    comet_kv_seq_free(&seq);
    comet_kv_pool_free(&pool);
    comet_kv_cache_free_on(be, &kv);
}

static int32_t *tokenize(const comet_model *m, const char *text, size_t len, size_t *n) {
    int32_t *ids = NULL;
    assert_int_equal(comet_tokenizer_encode(m->tok, text, len, 0, &ids, n), COMET_OK);
    return ids;
}

static void test_greedy_tokens_match_simulation(void **state) {
    (void)state;
    need_model();
    static const char *prompts[3] = {
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    };
    const int V = m_int->cfg.n_vocab;
    comet_backend *be_int = open_cpu(2, 0), *be_sim = open_cpu(2, 1);
    float *li = malloc((size_t)STEPS * V * sizeof *li), *ls = malloc((size_t)STEPS * V * sizeof *ls);
    int32_t ids_i[STEPS], ids_s[STEPS];
    int bad = 0;
    for (int p = 0; p < 3; p++) {
        size_t n;
        int32_t *prompt = tokenize(m_int, prompts[p], strlen(prompts[p]), &n);
        greedy(m_int, be_int, prompt, (int)n, STEPS, ids_i, li);
        greedy(m_sim, be_sim, prompt, (int)n, STEPS, ids_s, ls);
        int d = 0;
        while (d < STEPS && ids_i[d] == ids_s[d])
            d++;
        if (d == STEPS) {
            printf("  prompt %d: %d greedy tokens equal\n", p, STEPS);
        } else {
            const float *ri = li + (size_t)d * V, *rs = ls + (size_t)d * V;
            float gap_sim = rs[ids_s[d]] - rs[ids_i[d]], gap_int = ri[ids_i[d]] - ri[ids_s[d]];
            printf("  prompt %d: first divergence at step %d (integer %d, simulation %d): logit "
                   "gap %.4f in the simulation, %.4f on integers\n",
                   p, d, ids_i[d], ids_s[d], gap_sim, gap_int);
            bad += d == 0; /* the token right after the prompt must agree */
        }
        free(prompt);
    }
    free(li);
    free(ls);
    comet_backend_free(be_int);
    comet_backend_free(be_sim);
    assert_int_equal(bad, 0);
}

static int32_t *text_tokens(size_t *n) {
    char path[4096];
    path_in_source(path, sizeof path, TEXT);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(16384);
    size_t len = fread(buf, 1, 16384, f);
    fclose(f);
    int32_t *ids = tokenize(m_int, buf, len, n);
    free(buf);
    assert_true(*n >= 512);
    return ids;
}

static comet_ppl_result ppl(const comet_model *m, comet_backend *be, const int32_t *ids, size_t n,
                            int chunk) {
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = 512;
    p.max_windows = 1;
    p.chunk = chunk;
    comet_ppl_result r;
    assert_int_equal(comet_perplexity(m, be, ids, n, &p, &r), COMET_OK);
    return r;
}

static void test_perplexity_and_invariance(void **state) {
    (void)state;
    need_model();
    size_t n;
    int32_t *ids = text_tokens(&n);
    comet_backend *be_sim = open_cpu(2, 1);
    comet_ppl_result sim = ppl(m_sim, be_sim, ids, n, 512);
    comet_backend_free(be_sim);
    comet_backend *be1 = open_cpu(1, 0), *be2 = open_cpu(2, 0);
    comet_ppl_result a = ppl(m_int, be2, ids, n, 512);
    double rel = fabs(a.ppl - sim.ppl) / sim.ppl;
    printf("  perplexity (512 tokens): integer %.5f, simulation %.5f (%+.4f%%)\n", a.ppl, sim.ppl,
           100 * (a.ppl - sim.ppl) / sim.ppl);
    assert_true(rel < PPL_TOL);
    const int chunks[] = {512, 37, 1};
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 3; c++) {
            if (chunks[c] == 1 && t == 0)
                continue; /* one run of 512 single-token steps is enough */
            comet_ppl_result b = ppl(m_int, t ? be2 : be1, ids, n, chunks[c]);
            if (memcmp(&b.nll_sum, &a.nll_sum, sizeof a.nll_sum))
                fail_msg("%d thread(s), chunk %d: NLL sum %.17g, 2 threads whole window %.17g",
                         t + 1, chunks[c], b.nll_sum, a.nll_sum);
        }
    comet_backend_free(be1);
    comet_backend_free(be2);
    free(ids);
}

/* The simulation refuses a model loaded with its codes only, naming the problem. */
static void test_simulation_refuses_codes_only(void **state) {
    (void)state;
    need_model();
    comet_backend *be = open_cpu(1, 1);
    assert_null(comet_forward_init(m_int, be, 8));
    assert_non_null(strstr(comet_last_error(), "codes only"));
    comet_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simulation_refuses_codes_only),
        cmocka_unit_test(test_perplexity_and_invariance),
        cmocka_unit_test(test_greedy_tokens_match_simulation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

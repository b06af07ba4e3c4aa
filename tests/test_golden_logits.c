/* test_golden_logits.c — comet's forward pass on the default model against logits from
 * an independent implementation (HF transformers, fp32; scripts/golden_logits.py wrote
 * tests/fixtures/golden_logits.txt). The token ids come from the fixture, so only the
 * loader's dequantization and the forward pass are compared. At every position: the
 * same top-1 id, and max |ours - theirs| / max |theirs| < 1e-3 over the stored ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "model/forward.h"

#define MODEL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define FIXTURE "tests/fixtures/golden_logits.txt"

static void path_in_source(char *out, size_t cap, const char *rel) {
    const char *src = getenv("COMET_SOURCE_DIR");
    snprintf(out, cap, "%s/%s", src && src[0] ? src : ".", rel);
}

/* Run one prompt through `be` and compare every position with the fixture. Returns
 * the worst relative error seen. */
static double check_prompt(const comet_model *m, comet_backend *be, FILE *fx, int n) {
    int V = m->cfg.n_vocab, P = 16;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    char word[16];
    assert_int_equal(fscanf(fx, "%15s", word), 1);
    assert_string_equal(word, "ids");
    for (int i = 0; i < n; i++)
        assert_int_equal(fscanf(fx, "%d", &ids[i]), 1);

    comet_kv_cache kv;
    comet_kv_pool pool;
    comet_kv_seq seq;
    comet_batch_builder bb;
    int n_pages = (n + P - 1) / P;
    assert_int_equal(
        comet_kv_cache_init(&kv, m->cfg.n_layer, n_pages, P, m->cfg.n_head_kv, m->cfg.head_dim),
        COMET_OK);
    assert_int_equal(comet_kv_pool_init(&pool, n_pages, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&seq, n, P), COMET_OK);
    assert_int_equal(comet_batch_builder_init(&bb, n, 1, n_pages, P), COMET_OK);
    comet_forward_ctx *fc = comet_forward_init(m, be, n);
    assert_non_null(fc);
    float *logits = malloc((size_t)n * V * sizeof(float));
    assert_int_equal(comet_kv_seq_reserve(&pool, &seq, n), COMET_OK);
    assert_int_equal(comet_batch_builder_add(&bb, &seq, ids, n, 2), COMET_OK);
    assert_int_equal(comet_forward(fc, &kv, &bb.batch, logits), COMET_OK);

    double worst = 0;
    for (int p = 0; p < n; p++) {
        int pos, top1, k;
        double maxabs;
        assert_int_equal(fscanf(fx, " pos %d top1 %d maxabs %lf n %d", &pos, &top1, &maxabs, &k),
                         4);
        assert_int_equal(pos, p);
        const float *row = logits + (size_t)p * V;
        int ours = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[ours])
                ours = v;
        if (ours != top1)
            fprintf(stderr, "position %d: top-1 %d (logit %g), golden %d (ours %g)\n", p, ours,
                    row[ours], top1, row[top1]);
        assert_int_equal(ours, top1);
        double md = 0;
        for (int j = 0; j < k; j++) {
            int id;
            double ref;
            assert_int_equal(fscanf(fx, " %d:%lf", &id, &ref), 2);
            assert_true(id >= 0 && id < V);
            double d = row[id] > ref ? row[id] - ref : ref - row[id];
            if (d > md || d != d)
                md = d;
        }
        double rel = md / maxabs;
        if (rel > worst || rel != rel)
            worst = rel;
        if (!(rel < 1e-3))
            fprintf(stderr, "position %d: max relative logit error %g\n", p, rel);
        assert_true(rel < 1e-3);
    }
    free(logits);
    comet_forward_free(fc);
    comet_batch_builder_free(&bb);
    comet_kv_seq_free(&seq);
    comet_kv_pool_free(&pool);
    comet_kv_cache_free(&kv);
    free(ids);
    return worst;
}

static void run_golden(comet_backend *be, const char *label) {
    char model_path[4096], fixture[4096];
    path_in_source(model_path, sizeof model_path, MODEL_FILE);
    path_in_source(fixture, sizeof fixture, FIXTURE);
    comet_model *m = NULL;
    comet_status st = comet_model_load(model_path, &m);
    if (st != COMET_OK)
        fprintf(stderr, "cannot load %s: %s (the setup script fetches it)\n", model_path,
                comet_last_error());
    assert_int_equal(st, COMET_OK);
    FILE *fx = fopen(fixture, "r");
    assert_non_null(fx);
    char line[512];
    int n_prompts = 0;
    while (fgets(line, sizeof line, fx) && line[0] == '#')
        ;
    assert_int_equal(sscanf(line, "prompts %d", &n_prompts), 1);
    assert_true(n_prompts >= 3);
    for (int i = 0; i < n_prompts; i++) {
        int n;
        assert_int_equal(fscanf(fx, " prompt %d", &n), 1);
        double worst = check_prompt(m, be, fx, n);
        fprintf(stderr, "%s: prompt %d (%d tokens): max relative logit error %.3g\n", label, i, n,
                worst);
    }
    fclose(fx);
    comet_model_free(m);
}

static void test_golden_fast(void **state) {
    comet_backend *be = comet_backend_cpu_init(0);
    run_golden(be, "cpu");
    comet_backend_free(be);
}

static void test_golden_ref(void **state) {
    comet_backend *be = comet_backend_cpu_ref_init();
    run_golden(be, "cpu-ref");
    comet_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_fast),
        cmocka_unit_test(test_golden_ref),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

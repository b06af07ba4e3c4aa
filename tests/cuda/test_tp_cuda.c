/* test_tp_cuda.c — tensor parallelism on GPUs (engine/tp.h): the small float and W4A4KV4
 * models of tp_test_util.h, prefill then greedy decode (decode steps recorded and replayed
 * as CUDA graphs, with the heads' gather inside):
 * - one rank gives the one-device logits bit for bit;
 * - with two GPUs or more, 2 ranks (NCCL) give them up to fp32 rounding of the down_proj
 *   partial sums and the same greedy tokens; with one GPU that case says it did not run.
 * Exits 77 without a GPU (cuda_skip.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../tp_test_util.h"
#include "cuda_skip.h"

static void check(comet_model *m, const char *name, double tol) {
    const int V = m->cfg.n_vocab;
    tp_run one, tp1;
    tp_run_model(m, "cuda", 0, NULL, &one);
    tp_run_model(m, "cuda", 1, (const int32_t(*)[NSEQ])one.greedy, &tp1);
    assert_memory_equal(tp1.logits, one.logits, (size_t)one.rows * V * sizeof(float));
    print_message("%s: tensor parallel 1 == one device on the GPU, %d logits rows bit for bit\n",
                  name, one.rows);
    int n_gpu = 0;
    cudaGetDeviceCount(&n_gpu);
    if (n_gpu >= 2) {
        tp_run tp2;
        double worst;
        int diff;
        tp_run_model(m, "cuda", 2, (const int32_t(*)[NSEQ])one.greedy, &tp2);
        tp_compare(&tp2, &one, V, &worst, &diff);
        print_message("%s: tensor parallel 2 (NCCL) vs one GPU: worst row rel. error %.3g, %d "
                      "of %d rows with another argmax\n",
                      name, worst, diff, one.rows);
        assert_true(worst <= tol);
        assert_int_equal(diff, 0);
        free(tp2.logits);
    } else {
        print_message("%s: tensor parallel 2 NOT RUN: this machine has %d GPU\n", name, n_gpu);
    }
    free(one.logits);
    free(tp1.logits);
}

static void test_float_model(void **state) {
    (void)state;
    comet_model *m = tp_small_model();
    check(m, "fp32 (FP16 on the GPU)", 1e-3);
    tu_model_free(m);
}

static void test_w4a4kv4_model(void **state) {
    (void)state;
    comet_model *m = tp_small_model_w4a4();
    check(m, "W4A4KV4", 2e-2);
    comet_model_free(m);
}

int main(void) {
    cuda_test_skip_if_no_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_model),
        cmocka_unit_test(test_w4a4kv4_model),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}

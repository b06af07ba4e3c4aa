/* test_attention_prefill_cuda.c — the CUDA backend's paged_attention on prefill chunks (the
 * tensor-core kernel attn_mma_kernel: a sequence with at least 16 tokens in a step, head dims
 * 64 and 128) against the CPU backend's (comet_backend_cpu_init(1), its fp32 simulation),
 * with the shared run of attention_test_util.h:
 *
 * - fixed schedules of three steps over four sequences: chunks of 130, 77 and 200 tokens
 *   (not multiples of the 16-token tile nor of the 64-key tile) over a growing paged prefix
 *   whose end falls inside a page; a chunk of exactly 16 tokens (the smallest the tensor-core
 *   kernel takes) and one of 15 beside it (the fp32 kernel's, in the same step); decode tokens
 *   and chunks of 17, 33 and 64 sharing steps with them; GQA groups of 1 to 8 (1 and 2: a CTA
 *   over several 16-token tiles; 3 and 4: one tile; 5 to 8: parts of a tile), head dims 64
 *   and 128, KV groups of 16, 32, 64 and whole heads, kv_bits 4, 8 and 16, rotation none and
 *   hadamard. Attention outputs within 1e-3 relative norm error (kv 4 / 8; 2e-3 kv 16) of the
 *   CPU's over a cache holding the CUDA cache's values (so only the attention is measured,
 *   fp16 rounding of q, K, V and P included), and once more over the CPU's own cache (the
 *   ragged test's bounds); each sequence alone (fewer CTAs: other key splits) within 1e-5 of
 *   its outputs inside the batch.
 * - random ragged schedules (chunks of 1..128 tokens, several sequences a step) on the
 *   LLaMA-3-8B head shape.
 * COMET_CUDA_TEST_QUICK=1 (the sanitizer set): one rotation per KV format and the fixed
 * schedules only. Every output is poisoned before the op and framed by guard bytes. Exit 77
 * (ctest: skipped) when no CUDA device is usable. */
#include "cuda_skip.h"

#include "attention_test_util.h"

/* GQA groups 1 .. 8 at head dims 64 and 128 */
static const att_cfg PRE_CFGS[] = {
    {"D128 H32/Hkv8 G32 llama3-8b", 128, 32, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D64 H9/Hkv3 G16 smollm2", 64, 9, 3, 16, COMET_ROPE_SCALING_NONE, 100000.0f},
    {"D128 H3/Hkv3 G64", 128, 3, 3, 64, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H4/Hkv2", 64, 4, 2, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H5/Hkv1 G32", 64, 5, 1, 32, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H12/Hkv2 G16", 128, 12, 2, 16, COMET_ROPE_SCALING_NONE, 500000.0f},
    {"D64 H7/Hkv1 G16", 64, 7, 1, 16, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H16/Hkv2 G32", 128, 16, 2, 32, COMET_ROPE_SCALING_NONE, 500000.0f},
};
#define N_PRE_CFGS ((int)(sizeof PRE_CFGS / sizeof PRE_CFGS[0]))

/* Three steps over four sequences, every one attending:
 *   seq 0: 130 from 0, then 77 after 130 (page 8 part full), then 200 after 207
 *   seq 1: 16 from 0 (the smallest tensor-core chunk), a decode token, 33
 *   seq 2: 15 from 0 (fp32 kernel beside the tensor-core one), 64, 17
 *   seq 3: sits out, then 1, then 40 after 1 */
static const int PRE_LEN[] = {407, 50, 96, 41};
static const step_plan PRE_STEPS[] = {
    {.n = 3, .attend = 1, .c = {{2, 0, 15}, {0, 0, 130}, {1, 0, 16}}},
    {.n = 4, .attend = 1, .c = {{1, 16, 1}, {3, 0, 1}, {0, 130, 77}, {2, 15, 64}}},
    {.n = 4, .attend = 1, .c = {{0, 207, 200}, {2, 79, 17}, {3, 1, 40}, {1, 17, 33}}},
};

static void test_attention_prefill_chunks(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_PRE_CFGS; c++)
        for (int b = 0; b < 3; b++)
            for (int rot = 0; rot < 2; rot++) {
                if (!quick_rot(b, rot))
                    continue;
                const uint64_t seed =
                    0x9BEF0000ull + (uint64_t)c * 100 + (uint64_t)b * 10 + (uint64_t)rot;
                for (int mirror = 1; mirror >= 0; mirror--)
                    attention_steps_case(&PRE_CFGS[c], bits[b], rot, PRE_LEN, 4, 0, 0, PRE_STEPS, 3,
                                         mirror, seed);
            }
}

/* Random ragged schedules on the LLaMA-3-8B shape: prefill chunks of 1..128 tokens and
 * decode tokens of three sequences mixed in each step. */
static void test_attention_prefill_ragged(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    if (g_quick)
        skip();
    static const int len[] = {1, 40, 300};
    static const int bits[] = {4, 8, 16};
    for (int b = 0; b < 3; b++)
        attention_case(&PRE_CFGS[0], bits[b], b % 2, len, 3, 128, 0, 0x9BEF9000ull + (uint64_t)b);
}

int main(void) {
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    const char *full = getenv("COMET_CUDA_TEST_FULL");
    g_full = full && *full && strcmp(full, "0");
    const char *quick = getenv("COMET_CUDA_TEST_QUICK");
    g_quick = quick && *quick && strcmp(quick, "0");
    g_cuda = comet_backend_cuda_init(0);
    if (!g_cuda) {
        fprintf(stderr, "comet_backend_cuda_init(0) failed: %s\n", comet_last_error());
        return 1;
    }
    g_cpu = comet_backend_cpu_init(1);
    if (!g_cpu) {
        fprintf(stderr, "comet_backend_cpu_init failed: %s\n", comet_last_error());
        return 1;
    }
    /* the reference is the contract's fp32 simulation (an fp32 cache) */
    comet_backend_set_simulate(g_cpu, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_prefill_chunks),
        cmocka_unit_test(test_attention_prefill_ragged),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name (sanitizer runs) */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cpu);
    comet_backend_free(g_cuda);
    return rc;
}

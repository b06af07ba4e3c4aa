/* test_attention_prefill_cuda.c — the CUDA backend's paged_attention on prefill chunks (the
 * tensor-core kernels, a sequence with at least 16 tokens in a step, head dims 64 and 128:
 * attn_mma2_kernel by default at GQA groups up to 8, attn_mma_kernel beyond and with
 * COMET_CUDA_ATTN_MMA=1) against the CPU backend's (comet_backend_cpu_init(1), its fp32 simulation),
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
 * - the routing: the same steps on a backend with COMET_CUDA_ATTN_MMA=0 (fp32 kernels only):
 *   the chunks of at least 16 tokens differ from its outputs (the tensor-core kernel ran) by
 *   at most the bounds above, every other token is the same bits.
 * - the two tensor-core kernels: the plan's choice (comet_cuda_attention_prefill_kernel), the
 *   fixed schedules on COMET_CUDA_ATTN_MMA=1 and =2 backends with one key split (every
 *   token the same bits), and attn_mma_kernel alone against the CPU.
 * - the two-CTAs-an-SM kernel of INT4 caches (attn_mma3_kernel, forced by COMET_CUDA_ATTN_MMA=3):
 *   the plan's choice (3 on the INT4 layouts it takes, the other kernels' choice elsewhere), the
 *   fixed schedules on it and on COMET_CUDA_ATTN_MMA=1 with one key split at every INT4 layout
 *   it takes (D 64: G 8, 16; D 128: G 8, 16, 32) and GQA groups 1 to 8 (every token the same
 *   bits), and the kernel with its key splits against the CPU.
 * - random ragged schedules (chunks of 1..128 tokens, several sequences a step) on the
 *   LLaMA-3-8B head shape.
 * COMET_CUDA_TEST_QUICK=1 (the sanitizer set): one rotation per KV format and the fixed
 * schedules only. Every output is poisoned before the op and framed by guard bytes. Exit 77
 * (ctest: skipped) when no CUDA device is usable. */
#include "cuda_skip.h"

#include "attention_test_util.h"
#include "backend/cuda/attention.h"

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

/* attn_mma3_kernel's INT4 layouts beyond PRE_CFGS's: GQA groups of 1 and 2 (a CTA over eight
 * and four 16-token tiles), groups of 8 channels (64-byte scale rows at D 128) */
static const att_cfg MMA3_CFGS[] = {
    {"D128 H2/Hkv2 G16", 128, 2, 2, 16, COMET_ROPE_SCALING_NONE, 500000.0f},
    {"D64 H4/Hkv2 G8", 64, 4, 2, 8, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H8/Hkv4 G8", 128, 8, 4, 8, COMET_ROPE_SCALING_NONE, 10000.0f},
};
#define N_MMA3_CFGS ((int)(sizeof MMA3_CFGS / sizeof MMA3_CFGS[0]))

/* Whether attn_mma3_kernel takes an INT4 cache of cfg's head shape: groups of a multiple of 8
 * channels dividing D, at least 4 a key (scale rows of whole 16-byte pieces), at most 8 query
 * heads per KV head (the test's own statement of attention_plan.cuh's rule) */
static int mma3_takes(const att_cfg *cfg) {
    const int G = cfg->G ? cfg->G : cfg->D, g = cfg->H / cfg->Hkv;
    return G % 8 == 0 && cfg->D % G == 0 && cfg->D / G >= 4 && g <= 8;
}

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

/* The routing: PRE_STEPS on the default backend and on one with COMET_CUDA_ATTN_MMA=0 (the
 * fp32 kernels only), each on its own pool (rope_kv_append writes the same cache bits on
 * both). The tokens of a chunk of at least 16 tokens must differ from the fp32 kernel's
 * somewhere (fp16 rounding: the tensor-core kernel ran) and lie within 1e-3 (kv 4 / 8) or
 * 2e-3 (kv 16) of them; every other token (the chunk of 15, decode tokens) must be the same
 * bits (attn_kernel took it, with the same grid and key splits). */
static void routing_case(comet_backend *fp32, const att_cfg *cfg, int bits, int rot,
                         uint64_t seed) {
    enum {
        N_SEQ = 4,
        N_STEPS = 3
    };
    const int HD = cfg->H * cfg->D;
    const comet_rope_params rp = rope_of(cfg);
    const double tol = bits == 16 ? 2e-3 : 1e-3;
    char what[160];
    snprintf(what, sizeof what, "prefill routing %s kv%d %s", cfg->name, bits,
             rot ? "hadamard" : "none");
    int n_pages = 0;
    for (int s = 0; s < N_SEQ; s++)
        n_pages += (PRE_LEN[s] + PAGE - 1) / PAGE;
    int32_t *ids = st_malloc((size_t)n_pages * 4);
    for (int i = 0; i < n_pages; i++)
        ids[i] = n_pages - 1 - i;
    int32_t *pages[N_SEQ];
    for (int s = 0, o = 0; s < N_SEQ; s++) {
        pages[s] = ids + o;
        o += (PRE_LEN[s] + PAGE - 1) / PAGE;
    }
    comet_kv_cache kva, kvb;
    kv_make(g_cuda, &kva, cfg, n_pages, bits, rot);
    kv_make(fp32, &kvb, cfg, n_pages, bits, rot);
    int n_mma = 0, n_fp32 = 0;
    double worst = 0;
    for (int i = 0; i < N_STEPS; i++) {
        st_batch rb;
        memset(&rb, 0, sizeof rb);
        const int T = rbatch_build(&rb, &PRE_STEPS[i], pages, -1);
        const size_t nq = (size_t)T * HD, nk = (size_t)T * cfg->Hkv * cfg->D;
        float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
        gen_qkv(cfg, &rb, seed, q, k, v);
        step_out oa = run_step(g_cuda, &kva, cfg, &rp, &rb, q, k, v, what, 1, NULL, bits);
        step_out ob = run_step(fp32, &kvb, cfg, &rp, &rb, q, k, v, what, 1, NULL, bits);
        for (int s = 0; s < rb.b.n_seqs; s++) {
            const int t0 = rb.token_indptr[s], n = rb.token_indptr[s + 1] - t0;
            const float *a = oa.out + (size_t)t0 * HD, *b = ob.out + (size_t)t0 * HD;
            const size_t cnt = (size_t)n * HD;
            if (n >= 16) {
                const double e = st_nerr(a, b, cnt);
                if (!memcmp(a, b, cnt * 4))
                    fail_msg("%s, step %d: sequence %d's chunk of %d tokens has the fp32 "
                             "kernel's bits: the tensor-core kernel did not take it",
                             what, i, rb.tok_seq[t0], n);
                if (!(e <= tol))
                    fail_msg("%s, step %d: sequence %d's chunk of %d tokens: tensor-core vs "
                             "fp32 kernel relative norm error %.3g > %.3g",
                             what, i, rb.tok_seq[t0], n, e, tol);
                worst = fmax(worst, e);
                n_mma += n;
            } else {
                if (memcmp(a, b, cnt * 4))
                    fail_msg("%s, step %d: sequence %d's %d token(s) differ from the fp32 "
                             "kernel's: they should take it",
                             what, i, rb.tok_seq[t0], n);
                n_fp32 += n;
            }
        }
        step_out_free(&oa), step_out_free(&ob);
        free(q), free(k), free(v);
        st_batch_free(&rb);
    }
    print_message("  %s: %d tokens on tensor cores (worst %.3g from the fp32 kernel), %d tokens "
                  "the fp32 kernel's bits\n",
                  what, n_mma, worst, n_fp32);
    comet_kv_cache_free_on(g_cuda, &kva);
    comet_kv_cache_free_on(fp32, &kvb);
    free(ids);
}

static void test_attention_prefill_routing(void **state) {
    (void)state;
    need_all(g_cuda);
    setenv("COMET_CUDA_ATTN_MMA", "0", 1);
    comet_backend *fp32 = comet_backend_cuda_init(0);
    unsetenv("COMET_CUDA_ATTN_MMA");
    assert_non_null(fp32);
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_PRE_CFGS; c++)
        for (int b = 0; b < 3; b++)
            if (!g_quick || c % 3 == b)
                routing_case(fp32, &PRE_CFGS[c], bits[b], (c + b) % 2,
                             0x9BEFA000ull + (uint64_t)c * 10 + (uint64_t)b);
    comet_backend_free(fp32);
}

/* The two tensor-core kernels: which one the plan names (comet_cuda_attention_prefill_kernel:
 * the pipelined attn_mma2_kernel with the step view's attn_mma 2 at every GQA group of
 * PRE_CFGS, 1..8; the first, attn_mma_kernel, with the step view's attn_mma 1 and above 8
 * query heads per KV head; none in batch-invariant and decode steps), then PRE_STEPS on a
 * backend with COMET_CUDA_ATTN_MMA=1 against a COMET_CUDA_ATTN_MMA=2 one, both with COMET_CUDA_ATTN_SPLITS=0 (one key
 * split): every token the same bits (attn_mma2_kernel does attn_mma_kernel's arithmetic;
 * only its CTAs' rows and loads differ), and, once more, the first kernel alone against the
 * CPU (attention_steps_case on the COMET_CUDA_ATTN_MMA=1 backend, with its key splits).
 * kernels_case is the bit comparison of one configuration: mma1 runs attn_mma_kernel, mma2 the
 * kernel named name2 (attn_mma2_kernel here, attn_mma3_kernel in test_attention_prefill_mma3). */
static void kernels_case(comet_backend *mma1, comet_backend *mma2, const char *name2,
                         const att_cfg *cfg, int bits, int rot, uint64_t seed) {
    enum {
        N_SEQ = 4,
        N_STEPS = 3
    };
    const int HD = cfg->H * cfg->D;
    const comet_rope_params rp = rope_of(cfg);
    char what[160];
    snprintf(what, sizeof what, "prefill kernels %s kv%d %s", cfg->name, bits,
             rot ? "hadamard" : "none");
    int n_pages = 0;
    for (int s = 0; s < N_SEQ; s++)
        n_pages += (PRE_LEN[s] + PAGE - 1) / PAGE;
    int32_t *ids = st_malloc((size_t)n_pages * 4);
    for (int i = 0; i < n_pages; i++)
        ids[i] = (i * 7 + 3) % n_pages; /* n_pages is not a multiple of 7: a permutation */
    int32_t *pages[N_SEQ];
    for (int s = 0, o = 0; s < N_SEQ; s++) {
        pages[s] = ids + o;
        o += (PRE_LEN[s] + PAGE - 1) / PAGE;
    }
    comet_kv_cache kva, kvb;
    kv_make(mma1, &kva, cfg, n_pages, bits, rot);
    kv_make(mma2, &kvb, cfg, n_pages, bits, rot);
    int n_chunk = 0;
    for (int i = 0; i < N_STEPS; i++) {
        st_batch rb;
        memset(&rb, 0, sizeof rb);
        const int T = rbatch_build(&rb, &PRE_STEPS[i], pages, -1);
        const size_t nq = (size_t)T * HD, nk = (size_t)T * cfg->Hkv * cfg->D;
        float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
        gen_qkv(cfg, &rb, seed, q, k, v);
        step_out oa = run_step(mma1, &kva, cfg, &rp, &rb, q, k, v, what, 1, NULL, bits);
        step_out ob = run_step(mma2, &kvb, cfg, &rp, &rb, q, k, v, what, 1, NULL, bits);
        for (int t = 0; t < T; t++)
            if (memcmp(oa.out + (size_t)t * HD, ob.out + (size_t)t * HD, (size_t)HD * 4)) {
                const int s = rb.tok_seq[t];
                fail_msg("%s, step %d: token %d (sequence %d, position %d) differs between "
                         "attn_mma_kernel and %s (want the same bits with one key split)",
                         what, i, t, s, rb.positions[t], name2);
            }
        for (int s = 0; s < rb.b.n_seqs; s++) {
            const int n = rb.token_indptr[s + 1] - rb.token_indptr[s];
            n_chunk += n >= 16 ? n : 0;
        }
        step_out_free(&oa), step_out_free(&ob);
        free(q), free(k), free(v);
        st_batch_free(&rb);
    }
    print_message("  %s: %d chunk tokens, the same bits on attn_mma_kernel and %s\n", what, n_chunk,
                  name2);
    comet_kv_cache_free_on(mma1, &kva);
    comet_kv_cache_free_on(mma2, &kvb);
    free(ids);
}

static comet_backend *backend_with(const char *mma, const char *splits) {
    setenv("COMET_CUDA_ATTN_MMA", mma, 1);
    if (splits)
        setenv("COMET_CUDA_ATTN_SPLITS", splits, 1);
    comet_backend *be = comet_backend_cuda_init(0);
    unsetenv("COMET_CUDA_ATTN_MMA");
    unsetenv("COMET_CUDA_ATTN_SPLITS");
    if (!be)
        fail_msg("comet_backend_cuda_init with COMET_CUDA_ATTN_MMA=%s: %s", mma,
                 comet_last_error());
    return be;
}

static void test_attention_prefill_kernels(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    /* the plan's choice */
    for (int c = 0; c < N_PRE_CFGS; c++) {
        const att_cfg *cfg = &PRE_CFGS[c];
        const comet_cuda_kv_layout L =
            comet_cuda_kv_layout_make(1, 64, PAGE, cfg->Hkv, cfg->D, 4, cfg->G ? cfg->G : cfg->D);
        comet_cuda_step_view v;
        memset(&v, 0, sizeof v);
        v.n_tokens = 130, v.n_seqs = 1, v.n_tiles = 9, v.max_kv_len = 130, v.attn_mma = 2;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, cfg->H), 2);
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, 9 * cfg->Hkv), 1);
        v.attn_mma = 1;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, cfg->H), 1);
        v.attn_mma = 0;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, cfg->H), 0);
        v.attn_mma = 2, v.batch_invariant = 1;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, cfg->H), 0);
        v.batch_invariant = 0, v.n_tokens = 16, v.n_tiles = 16; /* 16 decode tokens */
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L, &v, cfg->H), 0);
    }
    comet_backend *mma1 = backend_with("1", "0"), *mma2 = backend_with("2", "0");
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_PRE_CFGS; c++)
        for (int b = 0; b < 3; b++)
            for (int rot = 0; rot < 2; rot++)
                if (quick_rot(b, rot) && (!g_quick || c % 3 == b))
                    kernels_case(mma1, mma2, "attn_mma2_kernel", &PRE_CFGS[c], bits[b], rot,
                                 0x9BEFB000ull + (uint64_t)c * 100 + (uint64_t)b * 10 +
                                     (uint64_t)rot);
    comet_backend_free(mma1);
    comet_backend_free(mma2);
    /* attn_mma_kernel against the CPU, with the default backend's key splits */
    comet_backend *dflt = g_cuda;
    g_cuda = backend_with("1", NULL);
    for (int c = 0; c < N_PRE_CFGS; c++) {
        const int b = c % 3;
        attention_steps_case(&PRE_CFGS[c], bits[b], (c / 3) % 2, PRE_LEN, 4, 0, 0, PRE_STEPS, 3, 1,
                             0x9BEFC000ull + (uint64_t)c);
    }
    comet_backend_free(g_cuda);
    g_cuda = dflt;
}

/* attn_mma3_kernel (COMET_CUDA_ATTN_MMA=3): which kernel the plan names with the step view's
 * attn_mma 3 (3 on an INT4 cache it takes, mma3_takes; where it does not, an INT8 or fp16
 * cache, a group of 9 query heads, the others' choice: 2, 1; none in batch-invariant and
 * decode steps; never 3 with attn_mma 2), that two of its CTAs share an sm_90 SM, then at every configuration of PRE_CFGS and
 * MMA3_CFGS it takes, both rotations, PRE_STEPS on a COMET_CUDA_ATTN_MMA=3 backend against a
 * COMET_CUDA_ATTN_MMA=1 one, both with one key split: every token the same bits (its rows
 * take attn_mma_kernel's arithmetic), and once more the kernel with the default backend's key
 * splits against the CPU (attention_steps_case), plus a random ragged schedule on the
 * LLaMA-3-8B shape. */
static void test_attention_prefill_mma3(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    const att_cfg *cfgs[N_PRE_CFGS + N_MMA3_CFGS];
    int n_cfgs = 0, n_taken = 0;
    for (int c = 0; c < N_PRE_CFGS; c++)
        cfgs[n_cfgs++] = &PRE_CFGS[c];
    for (int c = 0; c < N_MMA3_CFGS; c++)
        cfgs[n_cfgs++] = &MMA3_CFGS[c];
    /* the plan's choice */
    for (int c = 0; c < n_cfgs; c++) {
        const att_cfg *cfg = cfgs[c];
        const int G = cfg->G ? cfg->G : cfg->D;
        const comet_cuda_kv_layout L4 =
            comet_cuda_kv_layout_make(1, 64, PAGE, cfg->Hkv, cfg->D, 4, G);
        const comet_cuda_kv_layout L8 =
            comet_cuda_kv_layout_make(1, 64, PAGE, cfg->Hkv, cfg->D, 8, G);
        const comet_cuda_kv_layout L16 =
            comet_cuda_kv_layout_make(1, 64, PAGE, cfg->Hkv, cfg->D, 16, cfg->D);
        comet_cuda_step_view v;
        memset(&v, 0, sizeof v);
        v.n_tokens = 130, v.n_seqs = 1, v.n_tiles = 9, v.max_kv_len = 130, v.attn_mma = 3;
        const int want = mma3_takes(cfg) ? 3 : 2;
        n_taken += want == 3;
        if (comet_cuda_attention_prefill_kernel(&L4, &v, cfg->H) != want)
            fail_msg("%s kv4: attn_mma 3 names kernel %d, want %d", cfg->name,
                     comet_cuda_attention_prefill_kernel(&L4, &v, cfg->H), want);
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L4, &v, 9 * cfg->Hkv), 1);
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L8, &v, cfg->H), 2);
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L16, &v, cfg->H), 2);
        v.attn_mma = 2;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L4, &v, cfg->H), 2);
        v.attn_mma = 3, v.batch_invariant = 1;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L4, &v, cfg->H), 0);
        v.batch_invariant = 0, v.n_tokens = 16, v.n_tiles = 16; /* 16 decode tokens */
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L4, &v, cfg->H), 0);
    }
    assert_int_equal(n_taken, 8); /* PRE_CFGS 0, 1, 5, 6, 7 and MMA3_CFGS */
    /* what it is for: two CTAs an SM on sm_90 (its registers and shared memory), one at least
     * where a CTA may take its shared memory (sm_80), none elsewhere (sm_86, sm_89: 99 KB) */
    int major = 0, optin = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
                     cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
                     cudaSuccess);
    const int ctas = comet_cuda_attention_mma3_ctas_per_sm();
    /* + 1,536 bytes of static shared memory: rowpos, krow, zrow */
    const int fits = (size_t)optin >= comet_cuda_attention_mma3_cta_bytes() + 1536;
    if (major == 9 ? ctas != 2 : fits ? ctas < 1 : ctas != 0)
        fail_msg("attn_mma3_kernel at D 128: %d CTAs an SM on compute capability %d.x "
                 "(%zu bytes of dynamic shared memory, %d a CTA may take); want %s",
                 ctas, major, comet_cuda_attention_mma3_cta_bytes(), optin,
                 major == 9 ? "2"
                 : fits     ? ">= 1"
                            : "0");
    print_message("  attn_mma3_kernel at D 128: %d CTAs an SM, %zu bytes of dynamic shared memory "
                  "each\n",
                  ctas, comet_cuda_attention_mma3_cta_bytes());
    /* the same bits as attn_mma_kernel with one key split */
    comet_backend *mma1 = backend_with("1", "0"), *mma3 = backend_with("3", "0");
    for (int c = 0; c < n_cfgs; c++)
        for (int rot = 0; rot < 2; rot++)
            if (mma3_takes(cfgs[c]) && (!g_quick || rot == c % 2))
                kernels_case(mma1, mma3, "attn_mma3_kernel", cfgs[c], 4, rot,
                             0x9BEFD000ull + (uint64_t)c * 10 + (uint64_t)rot);
    comet_backend_free(mma1);
    comet_backend_free(mma3);
    /* against the CPU, with the default backend's key splits */
    comet_backend *dflt = g_cuda;
    g_cuda = backend_with("3", NULL);
    for (int c = 0; c < n_cfgs; c++)
        if (mma3_takes(cfgs[c]))
            attention_steps_case(cfgs[c], 4, c % 2, PRE_LEN, 4, 0, 0, PRE_STEPS, 3, 1,
                                 0x9BEFE000ull + (uint64_t)c);
    if (!g_quick) {
        static const int len[] = {1, 40, 300};
        attention_case(&PRE_CFGS[0], 4, 1, len, 3, 128, 0, 0x9BEFF000ull);
    }
    comet_backend_free(g_cuda);
    g_cuda = dflt;
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
    if (att_test_init(1))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_prefill_chunks),
        cmocka_unit_test(test_attention_prefill_routing),
        cmocka_unit_test(test_attention_prefill_kernels),
        cmocka_unit_test(test_attention_prefill_mma3),
        cmocka_unit_test(test_attention_prefill_ragged),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name (sanitizer runs) */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cpu);
    comet_backend_free(g_cuda);
    return rc;
}

/* test_attention_forms_cuda.c — the CUDA backend's fused attention ops against the ops they
 * replace, bit for bit (backend.h "step ops"):
 * - paged_attention_quant (the key splits' merge fused with o_proj's activation quantization,
 *   attention_quant.cuh) against paged_attention + act_quant and against itself with
 *   COMET_CUDA_ATTN_QUANT_FUSED=0: the attention output and the activation's codes and scales;
 * - rope_attention_quant (RoPE and the KV append inside the tensor-core decode kernel) against
 *   rope_kv_append + paged_attention_quant and against itself with
 *   COMET_CUDA_ROPE_ATTN_FUSED=0: the KV pool as well.
 * COMET_CUDA_TEST_QUICK=1 runs the sanitizer set. Exit 77 (ctest: skipped) when no CUDA device
 * is usable. The ops against the CPU: test_attention_cuda.c; what they share:
 * attention_test_util.h. */
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
#include "backend/batch.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_kv.h"
#include "backend/cuda/norm_quant.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "numerics/quant.h"

#include "cuda_skip.h"
#include "step_test_util.h"

#include "attention_test_util.h"

/* ---- paged_attention_quant: the split merge fused with o_proj's quantization ---------------- */

/* Head shapes of the fused split merge's cases: GQA 4, 8 and 8 at head dims 128 and 64 */
static const att_cfg AQ_CFGS[] = {
    {"D128 H32/Hkv8 G32 llama3-8b", 128, 32, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D64 H16/Hkv2 G32", 64, 16, 2, 32, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H8/Hkv1 G32", 128, 8, 1, 32, COMET_ROPE_SCALING_NONE, 500000.0f},
};

/* The pages of sequences of len[s] keys: ids 0 .. n_pages - 2 handed out in reverse, sequence
 * after sequence, into pages[s] (views of the returned array, the caller frees it), one page
 * more in n_pages; *max_len the longest sequence. */
static int32_t *decode_pages(const int *len, int n_seq, int32_t **pages, int *n_pages,
                             int *max_len) {
    int np = 1, ml = 0;
    for (int s = 0; s < n_seq; s++) {
        np += (len[s] + PAGE - 1) / PAGE;
        ml = len[s] > ml ? len[s] : ml;
    }
    int32_t *ids = st_malloc((size_t)np * 4);
    for (int i = 0; i < np; i++)
        ids[i] = np - 1 - i;
    for (int s = 0, o = 0; s < n_seq; s++) {
        pages[s] = ids + o;
        o += (len[s] + PAGE - 1) / PAGE;
    }
    *n_pages = np, *max_len = ml;
    return ids;
}

/* What both cases set up: a model of cfg's heads (ATT_LAYERS layers), quantized W4A{a_bits}
 * with blocks of B, and its CUDA weights; the pages of sequences of len[s] keys (decode_pages)
 * and a CUDA pool of `bits` over them (layout L); the step schedule (steps, MAX_STEPS). */
typedef struct forms_fixture {
    comet_model *m;
    comet_weights *w;
    int32_t *ids, *pages[MAX_SEQS];
    int n_pages, max_len;
    comet_cuda_kv_layout L;
    comet_kv_cache kv;
    comet_rope_params rp;
    step_plan *steps;
} forms_fixture;

static void fixture_make(forms_fixture *f, const att_cfg *cfg, int bits, int rot, const int *len,
                         int n_seq, int a_bits, int B, uint64_t seed) {
    f->m = st_model(seed, ATT_LAYERS, 128, 128, cfg->H, cfg->Hkv, cfg->D, 64);
    st_quantize(f->m, 4, a_bits, B);
    f->w = NULL;
    OP_OK(g_cuda, g_cuda->ops->weights_load(g_cuda, f->m, &f->w), "weights_load");
    f->ids = decode_pages(len, n_seq, f->pages, &f->n_pages, &f->max_len);
    f->L = comet_cuda_kv_layout_make(ATT_LAYERS, f->n_pages, PAGE, cfg->Hkv, cfg->D, bits,
                                     cfg->G > 0 ? cfg->G : cfg->D);
    kv_make(g_cuda, &f->kv, cfg, f->n_pages, bits, rot);
    f->rp = rope_of(cfg);
    f->steps = st_malloc(MAX_STEPS * sizeof *f->steps);
}

/* steps[0 .. n_steps) with rope_kv_append only: the prefill before the tested step */
static void fixture_prefill(forms_fixture *f, const att_cfg *cfg, int n_steps, int bits,
                            uint64_t seed, const char *what) {
    const int K = cfg->H * cfg->D;
    for (int i = 0; i < n_steps; i++) {
        st_batch rb;
        memset(&rb, 0, sizeof rb);
        const int T = rbatch_build(&rb, &f->steps[i], f->pages, -1);
        const size_t nq = (size_t)T * K, nk = (size_t)T * cfg->Hkv * cfg->D;
        float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
        gen_qkv(cfg, &rb, seed, q, k, v);
        step_out o = run_step(g_cuda, &f->kv, cfg, &f->rp, &rb, q, k, v, what, 0, NULL, bits);
        step_out_free(&o);
        free(q), free(k), free(v);
        st_batch_free(&rb);
    }
}

static void fixture_free(forms_fixture *f) {
    comet_kv_cache_free_on(g_cuda, &f->kv);
    free(f->steps);
    free(f->ids);
    g_cuda->ops->weights_free(g_cuda, f->w);
    comet_model_free(f->m);
}

/* Form `form`'s attention output out[form] [T, K] (K = H * D) and activation bytes act[form]
 * (the first `used`) the same bytes as form 0's; a failure names the first difference. */
static void same_out_act(const char *what, float *const *out, uint8_t *const *act, int form,
                         const char *const *form_name, size_t nq, size_t used, int T, int K,
                         int D) {
    for (size_t i = 0; i < nq; i++)
        if (memcmp(&out[form][i], &out[0][i], 4))
            fail_msg("%s: attention output [token %zu, head %zu, channel %zu] = %.9g by %s, %.9g "
                     "by %s",
                     what, i / K, i % K / D, i % D, out[form][i], form_name[form], out[0][i],
                     form_name[0]);
    for (size_t i = 0; i < used; i++)
        if (act[form][i] != act[0][i])
            fail_msg("%s: activation byte %zu of %zu (%s) is %02x by %s, %02x by %s", what, i,
                     used, i < (size_t)T * K ? "a code" : "a scale", act[form][i], form_name[form],
                     act[0][i], form_name[0]);
}

/* One decode step (every sequence one token, at position len[s] - 1 after a prefill that
 * only fills the cache) of a model with cfg's heads, quantized W4A{a_bits} with blocks of B
 * (FMPQ: a permuted o_proj input, INT8 outlier blocks with a_bits 4), three ways on one
 * CUDA pool: paged_attention then act_quant (O) as two ops, paged_attention_quant with
 * COMET_CUDA_ATTN_QUANT_FUSED=0 (the same two kernels) and paged_attention_quant (the fused
 * kernel where comet_cuda_attention_quant_fused says so). The attention output (fp32) and
 * the activation's codes and scales must be the same bytes all three ways. want_fused: the
 * step splits its keys on this GPU (comet_cuda_attention_splits), so the third way must run
 * the fused kernel. */
static void attention_quant_case(const att_cfg *cfg, int bits, int rot, const int *len, int n_seq,
                                 int a_bits, int B, int want_fused, uint64_t seed) {
    const int D = cfg->D, H = cfg->H, Hkv = cfg->Hkv, K = H * D;
    char what[192];
    snprintf(what, sizeof what, "paged_attention_quant %s kv%d %s, %d seqs, w4a%d B%d", cfg->name,
             bits, rot ? "hadamard" : "none", n_seq, a_bits, B);
    forms_fixture f;
    fixture_make(&f, cfg, bits, rot, len, n_seq, a_bits, B, seed);
    const comet_linear *wo = comet_model_linear(f.m, ATT_LAYER, COMET_ROLE_O);
    assert_int_equal(wo->fmt, COMET_WFMT_QSIM);
    assert_int_equal(wo->block, B);
    st_seed(seed);
    const int n_steps = make_decode_schedule(len, n_seq, 700, 1, f.steps);
    fixture_prefill(&f, cfg, n_steps - 1, bits, seed, what);
    assert_true(f.steps[n_steps - 1].attend);
    st_batch rb;
    memset(&rb, 0, sizeof rb);
    const int T = rbatch_build(&rb, &f.steps[n_steps - 1], f.pages, -1);
    assert_int_equal(T, n_seq);
    const size_t nq = (size_t)T * K, nk = (size_t)T * Hkv * D;
    float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
    gen_qkv(cfg, &rb, seed, q, k, v);
    sbuf qb = sb_from(g_cuda, q, nq * 4), kb = sb_from(g_cuda, k, nk * 4),
         vb = sb_from(g_cuda, v, nk * 4);
    comet_step st;
    OP_OK(g_cuda, g_cuda->ops->step_begin(g_cuda, &rb.b, &st), "step_begin");
    OP_OK(g_cuda,
          g_cuda->ops->rope_kv_append(g_cuda, &f.kv, ATT_LAYER, &st, &f.rp, sb_f(&qb), H,
                                      sb_f(&kb), sb_f(&vb)),
          what);
    const size_t act_bytes = comet_act_bytes(T, K);
    const size_t used = st_act_scales_offset(T, K) + (size_t)T * (K / B) * 4;
    sbuf ob[3], ab[3];
    for (int form = 0; form < 3; form++) {
        ob[form] = sb_alloc(g_cuda, nq * 4);
        ab[form] = sb_alloc(g_cuda, act_bytes);
    }
    /* whether the default form runs the fused kernel, as the backend decides it */
    int n_sm = 0;
    assert_int_equal(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const comet_cuda_step_view view = {
        .n_tokens = T, .n_seqs = T, .n_tiles = T, .max_kv_len = f.max_len, .batch_invariant = 0};
    const int splits = comet_cuda_attention_splits(&f.L, &view, H, n_sm);
    const comet_cuda_act_fmt fmt = {
        .kind = COMET_CUDA_ACT_W4AX, .K = K, .B = B, .n8 = wo->n8, .perm = (const int32_t *)f.ids};
    const int fused =
        comet_cuda_attention_quant_fused(&f.L, &view, H, splits, &fmt, sb_ptr(&ob[2]));
    const char *no_split = getenv("COMET_CUDA_ATTN_SPLITS");
    if (want_fused && !fused && !(no_split && !strcmp(no_split, "0")))
        fail_msg("%s: %d key splits on %d SMs: the fused kernel does not take the step", what,
                 splits, n_sm);
    OP_OK(g_cuda,
          g_cuda->ops->paged_attention(g_cuda, &f.kv, ATT_LAYER, &st, sb_f(&qb), H, sb_f(&ob[0])),
          what);
    OP_OK(g_cuda,
          g_cuda->ops->act_quant(g_cuda, f.w, ATT_LAYER, COMET_GROUP_O, sb_f(&ob[0]), T,
                                 sb_ptr(&ab[0])),
          what);
    for (int form = 1; form < 3; form++) {
        if (form == 1)
            setenv("COMET_CUDA_ATTN_QUANT_FUSED", "0", 1);
        OP_OK(g_cuda,
              g_cuda->ops->paged_attention_quant(g_cuda, &f.kv, ATT_LAYER, &st, sb_f(&qb), H,
                                                 sb_f(&ob[form]), f.w, sb_ptr(&ab[form])),
              what);
        unsetenv("COMET_CUDA_ATTN_QUANT_FUSED");
    }
    st_sync_ok(g_cuda);
    float *out[3];
    uint8_t *act[3];
    for (int form = 0; form < 3; form++) {
        out[form] = sb_fetch(&ob[form], nq * 4);
        act[form] = sb_fetch(&ab[form], used);
        SB_CHECK_GUARDS(&ob[form], what);
        SB_CHECK_GUARDS(&ab[form], what);
    }
    const long nan_at = st_first_nan(out[0], nq);
    if (nan_at >= 0)
        fail_msg("%s: attention output element %ld of %zu is NaN (unwritten?)", what, nan_at, nq);
    int n_int8 = 0; /* INT8 codes outside [-8, 7]: the outlier blocks took part */
    for (size_t i = 0; i < (size_t)T * K; i++)
        n_int8 += (int8_t)act[0][i] < -8 || (int8_t)act[0][i] > 7;
    static const char *const form_name[3] = {"paged_attention + act_quant",
                                             "paged_attention_quant, COMET_CUDA_ATTN_QUANT_FUSED=0",
                                             "paged_attention_quant"};
    for (int form = 1; form < 3; form++)
        same_out_act(what, out, act, form, form_name, nq, used, T, K, D);
    if (wo->a_bits == 4 && wo->n8 > 0 && !n_int8)
        fail_msg("%s: %d INT8 blocks but no code outside the INT4 range", what, wo->n8);
    print_message("  %s: %d tokens, %d splits on %d SMs, %s, n8 %d (%d INT8-range codes): "
                  "output, codes and scales the same bytes\n",
                  what, T, splits, n_sm, fused ? "fused" : "two kernels", wo->n8, n_int8);
    for (int form = 0; form < 3; form++) {
        sb_free(&ob[form]), sb_free(&ab[form]);
        free(out[form]), free(act[form]);
    }
    SB_CHECK_GUARDS(&qb, what);
    sb_free(&qb), sb_free(&kb), sb_free(&vb);
    free(q), free(k), free(v);
    st_batch_free(&rb);
    fixture_free(&f);
}

/* The fused split merge + quantization (attention_quant.cuh) against the two kernels it
 * replaces, bit for bit: one sequence of 603 keys at LLaMA-3-8B's heads (9 key splits on
 * 132 SMs), 1, 17, 300 and 5000 keys in one step (the 1-key sequence's splits mostly empty),
 * eight sequences of 40 to 2048 keys, 64 of 130 to 400 at D 64 (2 splits: T = 64), at head
 * dims 64 and 128, GQA 4, 8 and 8, INT4 caches (the tensor-core decode kernel) and INT8 /
 * fp16 ones (the fp32 decode kernel), both rotations, o_proj inputs W4A4 with blocks of 64
 * (INT8 outlier blocks) and W4A8 with blocks of 128; and a step without splits (the two
 * kernels either way). */
static void test_attention_quant_forms(void **state) {
    (void)state;
    need_all(g_cuda);
    if (!g_cuda->ops->paged_attention_quant)
        fail_msg("the CUDA backend has no paged_attention_quant op");
    static const int one[] = {603};
    static const int four[] = {1, 17, 300, 5000};
    static const int eight[] = {40, 129, 603, 1000, 2048, 77, 300, 999};
    static const int short8[] = {1, 2, 16, 17, 33, 64, 65, 100};
    static int wide[64];
    for (int s = 0; s < 64; s++)
        wide[s] = 130 + (s * 37) % 271;
    static const struct {
        int cfg, bits, rot;
        const int *len;
        int n_seq, want_fused;
    } cases[] = {
        {0, 4, 1, one, 1, 1},   {0, 4, 0, one, 1, 1},   {0, 4, 1, four, 4, 1},
        {0, 4, 0, eight, 8, 1}, {0, 8, 1, four, 4, 1},  {0, 16, 0, eight, 8, 1},
        {1, 4, 0, four, 4, 1},  {1, 4, 1, eight, 8, 1}, {1, 8, 0, one, 1, 1},
        {1, 4, 1, wide, 64, 1}, {2, 16, 1, four, 4, 1}, {0, 4, 1, short8, 8, 0},
    };
    static const struct { int a_bits, B; } acts[] = {{4, 64}, {8, 128}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int a = 0; a < 2; a++) {
            if (g_quick && !(c == 0 && a == 0) && !(c == 6 && a == 1))
                continue;
            attention_quant_case(&AQ_CFGS[cases[c].cfg], cases[c].bits, cases[c].rot, cases[c].len,
                                 cases[c].n_seq, acts[a].a_bits, acts[a].B, cases[c].want_fused,
                                 0xA0A00000ull + (uint64_t)c * 10 + a);
        }
}

/* ---- rope_attention_quant: RoPE and the KV append fused into the decode kernel ------------- */

/* Head shapes of the fused op's cases: GQA 2, 3, 4 and 8 at head dims 128 and 64, KV groups
 * of 16, 32, 64 and 128 channels (G 0: the whole head): every instance of the fused kernel */
static const att_cfg RA_CFGS[] = {
    {"D128 H32/Hkv8 G32 llama3-8b", 128, 32, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D128 H8/Hkv1 G16", 128, 8, 1, 16, COMET_ROPE_SCALING_NONE, 500000.0f},
    {"D128 H32/Hkv8 G128", 128, 32, 8, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H8/Hkv2 G16", 64, 8, 2, 16, COMET_ROPE_SCALING_NONE, 100000.0f},
    {"D64 H16/Hkv2 G64", 64, 16, 2, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H16/Hkv8 G64", 128, 16, 8, 64, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H6/Hkv2 G32", 64, 6, 2, 32, COMET_ROPE_SCALING_NONE, 100000.0f},
};

enum {
    RA_DECODE,
    RA_PREFILL,
    RA_INVARIANT
};

/* One step of a model with cfg's heads (o_proj W4A{a_bits}, blocks of B) over a pool filled
 * with 0x5A bytes and then by a prefill that only appends (so that a slot the step did not
 * write holds neither zeros nor a real key): each sequence s ends the step at len[s] keys,
 * as one decode token (RA_DECODE; RA_INVARIANT: with batch_invariant on) or a chunk of up to
 * 3 tokens (RA_PREFILL). Three ways from the same pool bytes and inputs: rope_kv_append then
 * paged_attention_quant (two ops), rope_attention_quant with COMET_CUDA_ROPE_ATTN_FUSED=0 and
 * rope_attention_quant. The pool (every byte: the step's codes, scales and zeros, and nothing
 * else written), the attention output and the activation's codes and scales must be the same
 * bytes all three ways, and the step must have written the pool. want_fused: the third way
 * runs attn_decode_mma_kernel's fused form (comet_cuda_rope_attention_fused), checked unless
 * the environment turns it or the tensor-core decode kernel off. */
static void rope_attention_case(const att_cfg *cfg, int bits, int rot, const int *len, int n_seq,
                                int mode, int a_bits, int B, int want_fused, uint64_t seed) {
    const int D = cfg->D, H = cfg->H, Hkv = cfg->Hkv, K = H * D;
    const int m = mode == RA_PREFILL ? 3 : 1; /* tokens a sequence in the step, at most */
    static const char *const mode_name[3] = {"decode", "prefill", "batch-invariant decode"};
    char what[224];
    snprintf(what, sizeof what, "rope_attention_quant %s kv%d %s, %d seqs, %s, w4a%d B%d",
             cfg->name, bits, rot ? "hadamard" : "none", n_seq, mode_name[mode], a_bits, B);
    forms_fixture f;
    fixture_make(&f, cfg, bits, rot, len, n_seq, a_bits, B, seed);
    const comet_cuda_kv_layout L = f.L;
    uint8_t *pool = st_malloc(L.total_bytes);
    memset(pool, 0x5A, L.total_bytes);
    OP_OK(g_cuda, g_cuda->ops->upload(g_cuda, f.kv.storage, pool, L.total_bytes), "upload (KV)");

    /* the prefill to len[s] - m keys (rope_kv_append only), then the tested step */
    st_seed(seed);
    int n_steps = make_decode_schedule(len, n_seq, 700, m, f.steps);
    while (n_steps > 0 && f.steps[n_steps - 1].attend)
        n_steps--;
    fixture_prefill(&f, cfg, n_steps, bits, seed, what);
    step_plan *last = &f.steps[0];
    last->n = 0;
    last->attend = 1;
    for (int s = 0; s < n_seq; s++) {
        const int start = len[s] > m ? len[s] - m : 0;
        last->c[last->n++] = (chunk){s, start, len[s] - start};
    }
    st_batch rb;
    memset(&rb, 0, sizeof rb);
    const int T = rbatch_build(&rb, last, f.pages, -1);
    const size_t nq = (size_t)T * K, nk = (size_t)T * Hkv * D;
    float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
    gen_qkv(cfg, &rb, seed, q, k, v);
    OP_OK(g_cuda, g_cuda->ops->download(g_cuda, pool, f.kv.storage, L.total_bytes), "download");
    if (mode == RA_INVARIANT)
        comet_backend_set_batch_invariant(g_cuda, 1);

    /* whether the default form runs the fused kernel, as the backend decides it */
    int n_sm = 0;
    assert_int_equal(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const comet_cuda_step_view view = {
        .n_tokens = T,
        .n_seqs = n_seq,
        .n_tiles = comet_cuda_attention_tiles(rb.b.token_indptr, n_seq, NULL),
        .max_kv_len = f.max_len,
        .batch_invariant = mode == RA_INVARIANT};
    const int splits = comet_cuda_attention_splits(&L, &view, H, n_sm);
    const int fused = comet_cuda_rope_attention_fused(&L, &view, ATT_LAYER, H);
    const char *off_f = getenv("COMET_CUDA_ROPE_ATTN_FUSED"),
               *off_m = getenv("COMET_CUDA_ATTN_DECODE_MMA");
    const int env_off = (off_f && !strcmp(off_f, "0")) || (off_m && !strcmp(off_m, "0"));
    if (fused != (want_fused && !env_off))
        fail_msg("%s: %d key splits on %d SMs: the fused kernel %s the step", what, splits, n_sm,
                 fused ? "takes" : "does not take");

    const size_t act_bytes = comet_act_bytes(T, K);
    const size_t used = st_act_scales_offset(T, K) + (size_t)T * (K / B) * 4;
    float *out[3];
    uint8_t *act[3], *store[3];
    for (int form = 0; form < 3; form++) {
        OP_OK(g_cuda, g_cuda->ops->upload(g_cuda, f.kv.storage, pool, L.total_bytes),
              "upload (KV)");
        sbuf qb = sb_from(g_cuda, q, nq * 4), kb = sb_from(g_cuda, k, nk * 4),
             vb = sb_from(g_cuda, v, nk * 4), ob = sb_alloc(g_cuda, nq * 4),
             ab = sb_alloc(g_cuda, act_bytes);
        comet_step st;
        OP_OK(g_cuda, g_cuda->ops->step_begin(g_cuda, &rb.b, &st), "step_begin");
        if (form == 0) {
            OP_OK(g_cuda,
                  g_cuda->ops->rope_kv_append(g_cuda, &f.kv, ATT_LAYER, &st, &f.rp, sb_f(&qb),
                                              H, sb_f(&kb), sb_f(&vb)),
                  what);
            OP_OK(g_cuda,
                  g_cuda->ops->paged_attention_quant(g_cuda, &f.kv, ATT_LAYER, &st, sb_f(&qb),
                                                     H, sb_f(&ob), f.w, sb_ptr(&ab)),
                  what);
        } else {
            if (form == 1)
                setenv("COMET_CUDA_ROPE_ATTN_FUSED", "0", 1);
            OP_OK(g_cuda,
                  g_cuda->ops->rope_attention_quant(g_cuda, &f.kv, ATT_LAYER, &st, &f.rp,
                                                    sb_f(&qb), H, sb_f(&kb), sb_f(&vb), sb_f(&ob),
                                                    f.w, sb_ptr(&ab)),
                  what);
            if (form == 1) { /* back to what the run set */
                if (off_f)
                    setenv("COMET_CUDA_ROPE_ATTN_FUSED", off_f, 1);
                else
                    unsetenv("COMET_CUDA_ROPE_ATTN_FUSED");
            }
        }
        st_sync_ok(g_cuda);
        out[form] = sb_fetch(&ob, nq * 4);
        act[form] = sb_fetch(&ab, used);
        store[form] = st_malloc(L.total_bytes);
        OP_OK(g_cuda, g_cuda->ops->download(g_cuda, store[form], f.kv.storage, L.total_bytes),
              "download (KV)");
        SB_CHECK_GUARDS(&qb, what);
        SB_CHECK_GUARDS(&kb, what);
        SB_CHECK_GUARDS(&vb, what);
        SB_CHECK_GUARDS(&ob, what);
        SB_CHECK_GUARDS(&ab, what);
        sb_free(&qb), sb_free(&kb), sb_free(&vb), sb_free(&ob), sb_free(&ab);
    }
    if (mode == RA_INVARIANT)
        comet_backend_set_batch_invariant(g_cuda, 0);

    if (!memcmp(store[0], pool, L.total_bytes))
        fail_msg("%s: the step wrote nothing into the pool", what);
    const long nan_at = st_first_nan(out[0], nq);
    if (nan_at >= 0)
        fail_msg("%s: attention output element %ld of %zu is NaN (unwritten?)", what, nan_at, nq);
    static const char *const form_name[3] = {"rope_kv_append + paged_attention_quant",
                                             "rope_attention_quant, COMET_CUDA_ROPE_ATTN_FUSED=0",
                                             "rope_attention_quant"};
    for (int form = 1; form < 3; form++) {
        for (size_t i = 0; i < L.total_bytes; i++)
            if (store[form][i] != store[0][i]) {
                const size_t tile = i / L.head_tile_bytes, in = i % L.head_tile_bytes;
                fail_msg("%s: KV pool byte %zu (layer %zu page %zu %s head %zu, %s of slot "
                         "%zu) is %02x by %s, %02x by %s",
                         what, i, tile / ((size_t)f.n_pages * 2 * Hkv),
                         tile / (2 * (size_t)Hkv) % (size_t)f.n_pages, tile / Hkv % 2 ? "V" : "K",
                         tile % (size_t)Hkv, in < L.sz_offset ? "a code" : "a scale or zero",
                         in < L.sz_offset ? in / (size_t)L.code_row_bytes
                                          : (in - L.sz_offset) / (size_t)L.sz_row_bytes,
                         store[form][i], form_name[form], store[0][i], form_name[0]);
            }
        same_out_act(what, out, act, form, form_name, nq, used, T, K, D);
    }
    print_message("  %s: %d tokens, %d splits on %d SMs, %s: pool, output, codes and scales the "
                  "same bytes\n",
                  what, T, splits, n_sm, fused ? "fused" : "two ops");
    for (int form = 0; form < 3; form++)
        free(out[form]), free(act[form]), free(store[form]);
    free(pool);
    free(q), free(k), free(v);
    st_batch_free(&rb);
    fixture_free(&f);
}

/* rope_attention_quant against rope_kv_append + paged_attention_quant, bit for bit: one
 * sequence of 603 keys and one of 641 (LLaMA-3-8B's heads: 9 or 10 key splits on 132 SMs, the
 * token's key in the middle of the last split, or alone in it with an empty split after), the
 * keys 1, 16, 17, 603, 2048 and 4097 in one step (positions 0, slot P - 1, slot 0 of a page;
 * several splits, most of them empty for the short ones), eight of 1 .. 100 (one split:
 * positions 0, 1, 15, 16, 32, 63, 64, 99), 64 of 130 to 400 at D 64; GQA 2, 3, 4 and 8 at head
 * dims 64 and 128, KV groups of 16, 32, 64 and 128 at each (every instance of the fused kernel),
 * both rotations, o_proj W4A4 B64 and W4A8 B128;
 * and the steps the fused kernel does not take, where the op runs the two ops' paths: an INT8
 * cache, a prefill step (chunks of 3 tokens), a batch-invariant decode step. */
static void test_rope_attention_forms(void **state) {
    (void)state;
    need_all(g_cuda);
    if (!g_cuda->ops->rope_attention_quant)
        fail_msg("the CUDA backend has no rope_attention_quant op");
    static const int one[] = {603};
    static const int one_b[] = {641};
    static const int six[] = {1, 16, 17, 603, 2048, 4097};
    static const int short8[] = {1, 2, 16, 17, 33, 64, 65, 100};
    static int wide[64];
    for (int s = 0; s < 64; s++)
        wide[s] = 130 + (s * 37) % 271;
    static const struct {
        int cfg, bits, rot;
        const int *len;
        int n_seq, mode, a_bits, B, want_fused;
    } cases[] = {
        {0, 4, 1, one, 1, RA_DECODE, 4, 64, 1}, /* quick */
        {0, 4, 0, one_b, 1, RA_DECODE, 8, 128, 1},
        {0, 4, 1, six, 6, RA_DECODE, 4, 64, 1},
        {1, 4, 0, six, 6, RA_DECODE, 8, 128, 1},
        {1, 4, 1, short8, 8, RA_DECODE, 4, 64, 1}, /* quick */
        {2, 4, 0, short8, 8, RA_DECODE, 4, 64, 1},
        {2, 4, 1, six, 6, RA_DECODE, 4, 64, 1},
        {3, 4, 1, six, 6, RA_DECODE, 4, 64, 1}, /* quick */
        {3, 4, 0, short8, 8, RA_DECODE, 8, 128, 1},
        {4, 4, 0, six, 6, RA_DECODE, 4, 64, 1},
        {4, 4, 1, wide, 64, RA_DECODE, 4, 64, 1},
        {0, 8, 1, six, 6, RA_DECODE, 4, 64, 0},
        {0, 4, 1, six, 6, RA_PREFILL, 4, 64, 0}, /* quick */
        {3, 4, 0, short8, 8, RA_PREFILL, 8, 128, 0},
        {0, 4, 0, six, 6, RA_INVARIANT, 4, 64, 0}, /* quick */
        {5, 4, 0, short8, 8, RA_DECODE, 4, 64, 1}, /* quick: the append without rotation */
        {6, 4, 1, six, 6, RA_DECODE, 8, 128, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (g_quick && c != 0 && c != 4 && c != 7 && c != 12 && c != 14 && c != 15)
            continue;
        rope_attention_case(&RA_CFGS[cases[c].cfg], cases[c].bits, cases[c].rot, cases[c].len,
                            cases[c].n_seq, cases[c].mode, cases[c].a_bits, cases[c].B,
                            cases[c].want_fused, 0x50A70000ull + (uint64_t)c);
    }
}

/* ---- main ------------------------------------------------------------------------------- */

int main(void) {
    if (att_test_init(-1)) /* every comparison here is CUDA against CUDA */
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_quant_forms),
        cmocka_unit_test(test_rope_attention_forms),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name (sanitizer runs) */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cuda);
    return rc;
}

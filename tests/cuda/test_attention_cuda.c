/* test_attention_cuda.c — the CUDA backend's rope_kv_append and paged_attention against
 * the CPU backend (comet_backend_cpu_init(1)) with the same inputs (backend.h "step ops"),
 * past what a row of the op-test table (tests/test_backend_ops.c: two steps per row) says:
 * multi-step schedules of chunked prefill, long sequences, each sequence alone against its
 * outputs inside the batch, and the flash-decoding kernels over a mirrored cache:
 *
 * - rope_kv_append + paged_attention over ragged batches (sequences of 1, 17 and 300
 *   tokens; 5000 more with COMET_CUDA_TEST_FULL=1), several sequences a step, prefill
 *   chunks mixed with decode tokens, page size 16, shuffled page ids, kv_bits 4, 8 and 16,
 *   rotation none and hadamard, four head shapes (D 32 .. 256, GQA 1 .. 4, groups of 32 /
 *   64 channels, LLaMA-3 RoPE scaling): q and k after RoPE within 1e-6, attention outputs
 *   within 1e-3 relative norm error (kv 4 / 8) of the CPU's paged_attention over its own
 *   fp32 cache filled by its own rope_kv_append (2e-3 for kv 16: fp16 storage on CUDA
 *   against fp32 on the CPU); and the same sequence's outputs alone and inside the ragged
 *   batch within 1e-5.
 * - paged_attention of decode-only steps (every sequence one token: the flash-decoding
 *   kernels, attn_decode_mma_kernel for INT4 caches, attn_decode_kernel for the others and
 *   for INT4 with COMET_CUDA_ATTN_DECODE_MMA=0) after a prefill that only fills the cache:
 *   contexts of 1, 17, 300 and 5000 keys in one batch and eight of at most 100 (several key
 *   splits and one), 256 and 64 sequences of 2 to 212 keys, GQA 1 .. 8 at D 64 and 128, KV
 *   groups of 16 .. 128 channels, kv_bits 4, 8 and 16, both rotations, within 2e-5 relative
 *   norm error
 *   of the CPU's paged_attention over a cache holding the CUDA cache's values (so a code
 *   that RoPE's last ulp moved does not count, and one key too many or too few does).
 * - with batch_invariant: each sequence's outputs inside a ragged batch equal, bit for bit,
 *   its outputs alone, token by token and in chunks of 37.
 * COMET_CUDA_TEST_QUICK=1 runs the sanitizer set: each kernel instance once (g_quick).
 * - rope_kv_append's register kernel against its shared-memory kernel
 *   (COMET_CUDA_ROPE_KV_REG=0): q, k and every byte of the pool the same, over signed zeros,
 *   constant groups, values beyond fp16, NaN, tiny values, and positions up to 100000.
 * - KV codes, scales and zeros (fp16 values for kv 16) bit-exact with comet_quant_kv_group
 *   (after comet_wht with the hadamard rotation) when every position is 0 (RoPE is then the
 *   identity), read from the device storage in the layout of cuda_kv.h.
 *
 * The KV storage is read in the layout of cuda_kv.h. Every output is poisoned (0xFF bytes:
 * NaN) before the op and framed by guard bytes. Exit 77 (ctest: skipped) when no CUDA device
 * is usable. The rest of the step ops: test_step_ops_cuda.c; prefill chunks on the tensor-core
 * kernel: test_attention_prefill_cuda.c; the fused ops against the ops they replace:
 * test_attention_forms_cuda.c; the run they share: attention_test_util.h. */
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
#include "backend/cuda/cuda_kv.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "numerics/quant.h"

#include "cuda_skip.h"
#include "step_test_util.h"

#include "attention_test_util.h"

/* ---- attention ------------------------------------------------------------------------- */

static const att_cfg ATT_CFGS[] = {
    {"D64 H6/Hkv2", 64, 6, 2, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H8/Hkv8 G32 llama3", 128, 8, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D32 H4/Hkv1", 32, 4, 1, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D256 H2/Hkv1 G64", 256, 2, 1, 64, COMET_ROPE_SCALING_NONE, 1000000.0f},
};
#define N_ATT_CFGS ((int)(sizeof ATT_CFGS / sizeof ATT_CFGS[0]))

static void test_attention_ragged(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    static const int lens[] = {1, 17, 300};
    static const int lens_full[] = {1, 17, 300, 5000};
    const int *len = g_full ? lens_full : lens;
    const int n_seq = g_full ? 4 : 3, max_chunk = g_full ? 700 : 128;
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_ATT_CFGS; c++)
        for (int b = 0; b < 3; b++)
            for (int rot = 0; rot < 2; rot++)
                if (quick_rot(b, rot))
                    attention_case(&ATT_CFGS[c], bits[b], rot, len, n_seq, max_chunk, 0,
                                   0xA77E0000ull + (uint64_t)c * 100 + (uint64_t)b * 10 +
                                       (uint64_t)rot);
    /* many short sequences in one step, all decode-like after a one-token prefill */
    static const int many[] = {3, 2, 5, 1, 4, 2, 3, 6};
    attention_case(&ATT_CFGS[0], 4, 1, many, 8, 4, 0, 0xA77E9999ull);
}

/* Decode shapes: GQA groups of 1 .. 8 (attn_decode_kernel's register tiles of 1, 2, 4 and 8
 * query heads; attn_decode_mma_kernel's rows) at head dims 64 and 128, KV groups of 16, 32, 64
 * and whole heads (INT4 caches take the tensor-core kernel at every one of them). */
static const att_cfg DEC_CFGS[] = {
    {"D64 H9/Hkv3 smollm2", 64, 9, 3, 0, COMET_ROPE_SCALING_NONE, 100000.0f},
    {"D64 H9/Hkv3 G16 smollm2 --kv-group 16", 64, 9, 3, 16, COMET_ROPE_SCALING_NONE, 100000.0f},
    {"D128 H32/Hkv8 G32 llama3-8b", 128, 32, 8, 32, COMET_ROPE_SCALING_LLAMA3, 500000.0f},
    {"D128 H4/Hkv4 G64", 128, 4, 4, 64, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H16/Hkv2 G32", 64, 16, 2, 32, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H8/Hkv1 G32", 128, 8, 1, 32, COMET_ROPE_SCALING_NONE, 500000.0f},
    {"D128 H32/Hkv8 G16 llama3-8b --kv-group 16", 128, 32, 8, 16, COMET_ROPE_SCALING_LLAMA3,
     500000.0f},
    {"D128 H16/Hkv8", 128, 16, 8, 0, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H14/Hkv2 G16", 64, 14, 2, 16, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D128 H5/Hkv1 G32", 128, 5, 1, 32, COMET_ROPE_SCALING_NONE, 10000.0f},
    {"D64 H12/Hkv2 G64", 64, 12, 2, 64, COMET_ROPE_SCALING_NONE, 10000.0f},
};
#define N_DEC_CFGS ((int)(sizeof DEC_CFGS / sizeof DEC_CFGS[0]))
#define N_DEC_OLD_CFGS 6 /* DEC_CFGS from N_DEC_OLD_CFGS on: the tensor-core kernel's shapes */

/* DEC_CFGS 0, 3, 5 and 6: GQA tiles of 4 (group 3), 1, 8 and 4, head dims 64 and 128, KV
 * groups of 64, 32 and 16 channels */
static int quick_dec_cfg(int cfg) {
    return !g_quick || cfg == 0 || cfg == 3 || cfg == 5 || cfg == 6;
}

/* Decode-only steps (every sequence one token) after a prefill that only fills the cache:
 * contexts of 1, 17, 300 and 5000 keys in one batch (on a 132-SM GPU 9 to 64 key splits, all
 * but one of them empty for the 1-key sequence; alone, 1 to 64), and eight sequences of at
 * most 100 keys (one split: the decode kernel normalizes and writes the output itself). */
static void test_attention_decode(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    static const int lens[] = {1, 17, 300, 5000};
    static const int short_lens[] = {1, 2, 16, 17, 33, 64, 65, 100};
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_DEC_CFGS; c++)
        for (int b = 0; b < 3; b++)
            for (int rot = 0; rot < 2; rot++) {
                if (!quick_dec_cfg(c) || !quick_rot(b, rot))
                    continue;
                if (c >= N_DEC_OLD_CFGS && rot != (b + c) % 2)
                    continue; /* the shapes the tensor-core kernel added: one rotation each */
                const uint64_t seed =
                    0xDEC00000ull + (uint64_t)c * 100 + (uint64_t)b * 10 + (uint64_t)rot;
                attention_case(&DEC_CFGS[c], bits[b], rot, lens, 4, 700, 2, seed);
                attention_case(&DEC_CFGS[c], bits[b], rot, short_lens, 8, 48, 2, seed + 5);
            }
    /* INT4 on attn_decode_kernel too (COMET_CUDA_ATTN_DECODE_MMA=0, the A/B switch): GQA 3,
     * 4, 8 and 4, KV groups of 64, 32, 32 and 16 */
    setenv("COMET_CUDA_ATTN_DECODE_MMA", "0", 1);
    static const int old_int4[] = {0, 2, 5, N_DEC_OLD_CFGS};
    for (int i = 0; i < 4; i++)
        if (!g_quick || i == 3)
            attention_case(&DEC_CFGS[old_int4[i]], 4, i % 2, lens, 4, 700, 2,
                           0xDEC0A000ull + (uint64_t)i);
    unsetenv("COMET_CUDA_ATTN_DECODE_MMA");
}

/* Wide decode steps: 256 sequences (contexts of 2 to 212 keys, mostly not multiples of the
 * 16-key page or tile; on a 132-SM GPU one key split; kv_bits 4), then 64 (one split; two or
 * three at D 64; kv_bits 4, 8 and 16), at LLaMA-3-8B's heads with KV groups of 16 and at D 64
 * with GQA 7. */
static void test_attention_decode_wide(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    static int lens[MAX_SEQS];
    for (int s = 0; s < MAX_SEQS; s++)
        lens[s] = 2 + (s * 53) % 211;
    static const int cfgs[] = {N_DEC_OLD_CFGS, N_DEC_OLD_CFGS + 2};
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < 3; b++) {
            if (g_quick && (c || b))
                continue;
            const att_cfg *cfg = &DEC_CFGS[cfgs[c]];
            const uint64_t seed = 0xDEC0B000ull + (uint64_t)c * 100 + (uint64_t)b * 10;
            /* 256 sequences (each also alone) on the tensor-core kernel only: the fp32
             * kernels take them as they take 64, and the sanitizer runs stay short */
            if (!g_quick && bits[b] == 4)
                attention_case(cfg, bits[b], 1, lens, MAX_SEQS, 256, 2, seed);
            attention_case(cfg, bits[b], (b + 1) % 2, lens + 100, 64, 256, 2, seed + 5);
        }
}

/* ---- batch invariance ------------------------------------------------------------------ */

/* Runs steps[0..n_steps) on a fresh pool of CUDA backend be and leaves each sequence's attention outputs by
 * position in outs[s] ([len[s], H * D], zeros where not attended). */
static void run_schedule(comet_backend *be, const att_cfg *cfg, int bits, int rot,
                         const step_plan *steps, int n_steps, int32_t *const *pages, int n_pages,
                         uint64_t seed, float *const *outs, const char *what) {
    const int HD = cfg->H * cfg->D;
    const comet_rope_params rp = rope_of(cfg);
    comet_kv_cache kv;
    kv_make(be, &kv, cfg, n_pages, bits, rot);
    for (int i = 0; i < n_steps; i++) {
        st_batch rb;
        memset(&rb, 0, sizeof rb);
        const int T = rbatch_build(&rb, &steps[i], pages, -1);
        const size_t nq = (size_t)T * HD, nk = (size_t)T * cfg->Hkv * cfg->D;
        float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
        gen_qkv(cfg, &rb, seed, q, k, v);
        step_out og = run_step(be, &kv, cfg, &rp, &rb, q, k, v, what, 1, NULL, bits);
        for (int t = 0; t < T; t++)
            memcpy(outs[rb.tok_seq[t]] + (size_t)rb.positions[t] * HD, og.out + (size_t)t * HD,
                   (size_t)HD * 4);
        step_out_free(&og);
        free(q), free(k), free(v);
        st_batch_free(&rb);
    }
    comet_kv_cache_free_on(be, &kv);
}

/* With batch_invariant on, each sequence's attention outputs are the same bits whether it
 * runs inside a ragged batch (prefill chunks of 1..128 tokens, decode tokens, other sequences
 * in the step, a shuffled order) or alone, token by token (decode-only steps) or in chunks
 * of 37; the ragged batch and the chunks of 37 also on `nosplit` (COMET_CUDA_ATTN_SPLITS=0:
 * each CTA merges its spans itself instead of the combine kernel). */
static void invariance_case(comet_backend *nosplit, const att_cfg *cfg, int bits, int rot,
                            uint64_t seed) {
    static const int len[] = {1, 17, 300};
    enum {
        N_SEQ = 3
    };
    const int HD = cfg->H * cfg->D;
    char what[160];
    snprintf(what, sizeof what, "batch-invariant attention %s kv%d %s", cfg->name, bits,
             rot ? "hadamard" : "none");
    int n_pages = 0;
    for (int s = 0; s < N_SEQ; s++)
        n_pages += (len[s] + PAGE - 1) / PAGE;
    int32_t *ids = st_malloc((size_t)n_pages * 4);
    for (int i = 0; i < n_pages; i++)
        ids[i] = n_pages - 1 - i;
    int32_t *pages[N_SEQ];
    for (int s = 0, o = 0; s < N_SEQ; s++) {
        pages[s] = ids + o;
        o += (len[s] + PAGE - 1) / PAGE;
    }
    step_plan *steps = st_malloc(MAX_STEPS * sizeof *steps);
    float *mixed[N_SEQ], *alone[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        mixed[s] = st_malloc((size_t)len[s] * HD * 4);
        alone[s] = st_malloc((size_t)len[s] * HD * 4);
        memset(mixed[s], 0, (size_t)len[s] * HD * 4);
    }
    st_seed(seed);
    int n_steps = make_schedule(len, N_SEQ, 128, steps);
    run_schedule(g_cuda, cfg, bits, rot, steps, n_steps, pages, n_pages, seed, mixed, what);
    /* chunk 0: the ragged batch again on nosplit */
    static const int chunks[] = {1, 37, 37, 0};
    comet_backend *const bes[] = {g_cuda, g_cuda, nosplit, nosplit};
    for (int ci = 0; ci < 4; ci++)
        for (int only = 0; only < N_SEQ; only++) {
            if (chunks[ci] == 0) {
                if (only > 0)
                    break;
                st_seed(seed);
                n_steps = make_schedule(len, N_SEQ, 128, steps);
            } else {
                n_steps = 0;
                for (int p = 0; p < len[only]; p += chunks[ci]) {
                    const int n = len[only] - p < chunks[ci] ? len[only] - p : chunks[ci];
                    steps[n_steps++] = (step_plan){.n = 1, .attend = 1, .c = {{only, p, n}}};
                }
            }
            for (int s = 0; s < N_SEQ; s++)
                memset(alone[s], 0, (size_t)len[s] * HD * 4);
            run_schedule(bes[ci], cfg, bits, rot, steps, n_steps, pages, n_pages, seed, alone,
                         what);
            for (int s2 = 0; s2 < N_SEQ; s2++) {
                if (chunks[ci] != 0 && s2 != only)
                    continue;
                size_t first = 0;
                while (first < (size_t)len[s2] * HD &&
                       !memcmp(&alone[s2][first], &mixed[s2][first], 4))
                    first++;
                if (first < (size_t)len[s2] * HD)
                    fail_msg("%s: sequence %d (%d tokens) %s%s differs from its run in the ragged "
                             "batch at position %zu: %.9g vs %.9g",
                             what, s2, len[s2],
                             chunks[ci] ? "alone in chunks of " : "in the ragged batch",
                             chunks[ci] == 1    ? "1"
                             : chunks[ci] == 37 ? "37"
                                                : "",
                             first / HD, alone[s2][first], mixed[s2][first]);
            }
        }
    print_message("  %s: alone (chunks 1, 37), and without key splits (chunks 37, the batch), "
                  "== inside the ragged batch, bit for bit\n",
                  what);
    for (int s = 0; s < N_SEQ; s++)
        free(mixed[s]), free(alone[s]);
    free(steps);
    free(ids);
}

static void test_attention_batch_invariant(void **state) {
    (void)state;
    need_all(g_cuda);
    setenv("COMET_CUDA_ATTN_SPLITS", "0", 1);
    comet_backend *nosplit = comet_backend_cuda_init(0);
    unsetenv("COMET_CUDA_ATTN_SPLITS");
    assert_non_null(nosplit);
    comet_backend_set_batch_invariant(g_cuda, 1);
    comet_backend_set_batch_invariant(nosplit, 1);
    static const int bits[] = {4, 16};
    for (int c = 0; c < N_DEC_OLD_CFGS; c++) /* batch-invariant steps never take decode_mma */
        for (int b = 0; b < 2; b++)
            /* quick: D64 kv4, D128 GQA-1 kv16, D128 GQA-8 kv4 (and kv8 below) */
            if (!g_quick || (c == 0 && b == 0) || (c == 3 && b == 1) ||
                (c == N_DEC_OLD_CFGS - 1 && b == 0))
                invariance_case(nosplit, &DEC_CFGS[c], bits[b], (c + b) % 2,
                                0xB1A50000ull + (uint64_t)c * 10 + (uint64_t)b);
    invariance_case(nosplit, &ATT_CFGS[0], 8, 0, 0xB1A5FFFFull);
    comet_backend_set_batch_invariant(g_cuda, 0);
    comet_backend_free(nosplit);
}

/* ---- KV storage at position 0 ------------------------------------------------------------ */

static void kv_codes_case(const att_cfg *cfg, int bits, int rot) {
    const int D = cfg->D, Hkv = cfg->Hkv, H = cfg->H, G = cfg->G > 0 ? cfg->G : D;
    const int S = 40, n_pages = 48; /* 40 one-token sequences, each on its own page */
    const comet_rope_params rp = rope_of(cfg);
    char what[160];
    snprintf(what, sizeof what, "kv storage %s kv%d %s", cfg->name, bits,
             rot ? "hadamard" : "none");
    st_seed(0xC0DE0000ull + (uint64_t)D * 7 + (uint64_t)bits * 3 + (uint64_t)rot);

    int32_t tokens[40], positions[40], tip[41], pip[41], pidx[40], last[40];
    int32_t ids[48];
    for (int i = 0; i < n_pages; i++)
        ids[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(st_next() % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    for (int s = 0; s < S; s++) {
        tokens[s] = 0, positions[s] = 0, last[s] = 1;
        tip[s] = pip[s] = s;
        pidx[s] = ids[s];
    }
    tip[S] = pip[S] = S;
    comet_batch b = {.n_tokens = S,
                     .n_seqs = S,
                     .tokens = tokens,
                     .positions = positions,
                     .token_indptr = tip,
                     .page_indptr = pip,
                     .page_indices = pidx,
                     .last_page_len = last,
                     .n_logits = 0,
                     .logit_rows = NULL};
    const size_t nq = (size_t)S * H * D, nk = (size_t)S * Hkv * D;
    float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = st_u();
    for (size_t i = 0; i < nk; i++) {
        k[i] = st_u() + 0.5f * (float)((i % D) % 5);
        v[i] = st_u();
    }
    /* edge rows: token 0 constant (scale 0), token 1 wide, token 2 tiny */
    for (int i = 0; i < Hkv * D; i++) {
        k[i] = v[i] = 0.375f;
        k[(size_t)Hkv * D + i] *= 100.0f;
        v[(size_t)Hkv * D + i] *= 100.0f;
        k[(size_t)2 * Hkv * D + i] *= 1e-3f;
        v[(size_t)2 * Hkv * D + i] *= 1e-3f;
    }

    comet_kv_cache kvc, kvg;
    kv_make(g_cpu, &kvc, cfg, n_pages, bits, rot);
    kv_make(g_cuda, &kvg, cfg, n_pages, bits, rot);
    sbuf qg = sb_from(g_cuda, q, nq * 4), kg = sb_from(g_cuda, k, nk * 4),
         vg = sb_from(g_cuda, v, nk * 4);
    float *qc = st_malloc(nq * 4), *kc = st_malloc(nk * 4), *vc = st_malloc(nk * 4);
    memcpy(qc, q, nq * 4), memcpy(kc, k, nk * 4), memcpy(vc, v, nk * 4);
    comet_step sc, sgs;
    OP_OK(g_cpu, g_cpu->ops->step_begin(g_cpu, &b, &sc), "step_begin");
    OP_OK(g_cpu, g_cpu->ops->rope_kv_append(g_cpu, &kvc, ATT_LAYER, &sc, &rp, qc, H, kc, vc), what);
    OP_OK(g_cuda, g_cuda->ops->step_begin(g_cuda, &b, &sgs), "step_begin");
    OP_OK(g_cuda,
          g_cuda->ops->rope_kv_append(g_cuda, &kvg, ATT_LAYER, &sgs, &rp, sb_f(&qg), H, sb_f(&kg),
                                      sb_f(&vg)),
          what);
    st_sync_ok(g_cuda);
    float *q_after = sb_fetch(&qg, nq * 4), *k_after = sb_fetch(&kg, nk * 4);
    if (memcmp(q_after, q, nq * 4) || memcmp(k_after, k, nk * 4))
        fail_msg("%s: RoPE at position 0 changed q or k (it is the identity there)", what);

    const comet_cuda_kv_layout L =
        comet_cuda_kv_layout_make(ATT_LAYERS, n_pages, PAGE, Hkv, D, bits, G);
    if (!kvg.storage || kvg.storage_bytes < L.total_bytes)
        fail_msg("%s: CUDA KV storage %zu bytes, the cuda_kv.h layout needs %zu", what,
                 kvg.storage_bytes, L.total_bytes);
    uint8_t *store = st_malloc(L.total_bytes);
    OP_OK(g_cuda, g_cuda->ops->download(g_cuda, store, kvg.storage, L.total_bytes),
          "download (KV)");

    float x[COMET_CUDA_KV_MAX_HEAD_DIM];
    uint8_t qr[COMET_CUDA_KV_MAX_HEAD_DIM];
    long n_codes = 0;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < Hkv; h++)
            for (int kvsel = 0; kvsel < 2; kvsel++) {
                const float *src = (kvsel ? v : k) + ((size_t)s * Hkv + h) * D;
                memcpy(x, src, (size_t)D * 4);
                if (rot)
                    comet_wht(x, D);
                const uint8_t *tile =
                    store + ((((size_t)ATT_LAYER * n_pages + pidx[s]) * 2 + kvsel) * Hkv + h) *
                                L.head_tile_bytes;
                const uint8_t *codes = tile; /* slot 0 */
                const float *cpu =
                    (kvsel ? kvc.v : kvc.k) + comet_kv_offset(&kvc, ATT_LAYER, &b, s, 0, h);
                if (bits == 16) {
                    for (int c = 0; c < D; c++) {
                        uint16_t got;
                        memcpy(&got, codes + 2 * c, 2);
                        if (got != comet_quant_f16_bits(x[c]))
                            fail_msg("%s: seq %d head %d %s channel %d: fp16 0x%04x, want 0x%04x",
                                     what, s, h, kvsel ? "V" : "K", c, got,
                                     comet_quant_f16_bits(x[c]));
                        if (fabsf(cpu[c] - x[c]) > 1e-6f * (fabsf(x[c]) + 1e-30f) * 8)
                            fail_msg("%s: the CPU cache holds %.9g, want %.9g", what, cpu[c], x[c]);
                    }
                    n_codes += D;
                    continue;
                }
                for (int i = 0; i < D / G; i++) {
                    uint16_t sr, zr, sg, zg;
                    comet_quant_kv_group(x + i * G, G, bits, qr + i * G, &sr, &zr);
                    const uint8_t *sz = tile + L.sz_offset + 4 * (size_t)i; /* slot 0 */
                    memcpy(&sg, sz, 2);
                    memcpy(&zg, sz + 2, 2);
                    if (sg != sr || zg != zr)
                        fail_msg("%s: seq %d head %d %s group %d: scale/zero 0x%04x/0x%04x, want "
                                 "0x%04x/0x%04x",
                                 what, s, h, kvsel ? "V" : "K", i, sg, zg, sr, zr);
                    const double scale = comet_quant_f16_value(sr),
                                 zero = comet_quant_f16_value(zr);
                    for (int c = i * G; c < (i + 1) * G; c++) {
                        int code = bits == 8 ? codes[c] : (codes[c / 2] >> (c % 2 ? 4 : 0)) & 15;
                        if (code != qr[c])
                            fail_msg("%s: seq %d head %d %s channel %d: code %d, want %d", what, s,
                                     h, kvsel ? "V" : "K", c, code, qr[c]);
                        double want = qr[c] * scale + zero;
                        double span = fabs(scale) * ((1 << bits) - 1) + fabs(zero) + 1e-30;
                        if (fabs(cpu[c] - want) > 1e-6 * span)
                            fail_msg(
                                "%s: the CPU cache holds %.9g at seq %d head %d channel %d, the "
                                "reference dequantizes to %.9g",
                                what, cpu[c], s, h, c, want);
                    }
                    n_codes += G;
                }
            }
    print_message("  %s: %ld values bit-exact\n", what, n_codes);
    free(store), free(q_after), free(k_after);
    free(q), free(k), free(v), free(qc), free(kc), free(vc);
    sb_free(&qg), sb_free(&kg), sb_free(&vg);
    comet_kv_cache_free_on(g_cpu, &kvc);
    comet_kv_cache_free_on(g_cuda, &kvg);
}

static void test_kv_codes_position0(void **state) {
    (void)state;
    need_all(g_cuda);
    need_all(g_cpu);
    static const int bits[] = {4, 8, 16};
    for (int c = 0; c < N_ATT_CFGS; c++)
        for (int b = 0; b < 3; b++)
            for (int rot = 0; rot < 2; rot++)
                kv_codes_case(&ATT_CFGS[c], bits[b], rot);
}

/* ---- rope_kv_append's two forms ----------------------------------------------------------- */

/* k or v of one (token, KV head): pattern p of six, so that every group kind meets both
 * forms: random with a channel bias, zeros of random sign (which zero the CPU's scan keeps
 * decides the stored scale's and zero's sign bits), a constant (scale 0), one value beyond
 * fp16 or one NaN (NaN scale, codes 0), tiny values among signed zeros. */
static void kv_pattern(float *x, int D, int p) {
    for (int c = 0; c < D; c++) {
        const float u = st_u();
        switch (p) {
        case 0: x[c] = u + 0.5f * (float)(c % 5); break;
        case 1: x[c] = st_next() & 1 ? -0.0f : 0.0f; break;
        case 2: x[c] = 0.375f; break;
        case 3: x[c] = c == D / 3 ? 1e5f : u; break;
        case 4: x[c] = c == D - 1 ? NAN : u; break;
        default: x[c] = st_next() % 3 ? 1e-30f * u : st_next() & 1 ? -0.0f : 0.0f; break;
        }
    }
}

/* rope_kv_append on one step of five sequences (prefill chunks of 37 and 20 tokens, decode
 * tokens at positions 5, 77 and 100000: angles past the fast reduction of double sin / cos)
 * with COMET_CUDA_ROPE_KV_REG=0 (the shared-memory kernel) and with the default (the register
 * kernel), each on a fresh pool: q and k after RoPE and every byte of the pool the same. Pages
 * written by no token all map to page 0, which the step never writes. */
static void rope_forms_case(const att_cfg *cfg, int bits, int rot, uint64_t seed) {
    enum { S = 5 };
    static const int start[S] = {0, 4093, 5, 100000, 77}, n[S] = {37, 20, 1, 1, 1};
    const int D = cfg->D, H = cfg->H, Hkv = cfg->Hkv;
    char what[160];
    snprintf(what, sizeof what, "rope_kv_append forms %s kv%d %s", cfg->name, bits,
             rot ? "hadamard" : "none");
    int32_t *pages[S];
    int n_pages = 1;
    for (int s = 0; s < S; s++) {
        const int np = (start[s] + n[s] + PAGE - 1) / PAGE;
        pages[s] = st_malloc((size_t)np * 4);
        for (int j = 0; j < np; j++)
            pages[s][j] = (j + 1) * PAGE > start[s] ? n_pages++ : 0;
    }
    st_seed(seed);
    st_batch rb = st_batch_make(PAGE, S, start, n, pages, NULL, 0, NULL, 0);
    rb.b.logit_rows = NULL;
    const int T = rb.b.n_tokens;
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * Hkv * D;
    float *q = st_malloc(nq * 4), *k = st_malloc(nk * 4), *v = st_malloc(nk * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = 2.0f * st_u();
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hkv; h++) {
            kv_pattern(k + ((size_t)t * Hkv + h) * D, D, (t * 7 + h) % 6);
            kv_pattern(v + ((size_t)t * Hkv + h) * D, D, (t * 5 + h + 3) % 6);
        }
    const comet_rope_params rp = rope_of(cfg);
    const comet_cuda_kv_layout L =
        comet_cuda_kv_layout_make(ATT_LAYERS, n_pages, PAGE, Hkv, D, bits, cfg->G > 0 ? cfg->G : D);
    uint8_t *store[2];
    float *qo[2], *ko[2];
    for (int form = 0; form < 2; form++) {
        comet_kv_cache kv;
        kv_make(g_cuda, &kv, cfg, n_pages, bits, rot);
        /* a pool starts zeroed or not: fill it so both forms start from the same bytes */
        uint8_t *fill = st_malloc(L.total_bytes);
        memset(fill, 0x5A, L.total_bytes);
        OP_OK(g_cuda, g_cuda->ops->upload(g_cuda, kv.storage, fill, L.total_bytes), "upload");
        free(fill);
        sbuf qb = sb_from(g_cuda, q, nq * 4), kb = sb_from(g_cuda, k, nk * 4),
             vb = sb_from(g_cuda, v, nk * 4);
        comet_step st;
        OP_OK(g_cuda, g_cuda->ops->step_begin(g_cuda, &rb.b, &st), "step_begin");
        if (form == 0)
            setenv("COMET_CUDA_ROPE_KV_REG", "0", 1);
        OP_OK(g_cuda,
              g_cuda->ops->rope_kv_append(g_cuda, &kv, ATT_LAYER, &st, &rp, sb_f(&qb), H,
                                          sb_f(&kb), sb_f(&vb)),
              what);
        unsetenv("COMET_CUDA_ROPE_KV_REG");
        st_sync_ok(g_cuda);
        qo[form] = sb_fetch(&qb, nq * 4);
        ko[form] = sb_fetch(&kb, nk * 4);
        store[form] = st_malloc(L.total_bytes);
        OP_OK(g_cuda, g_cuda->ops->download(g_cuda, store[form], kv.storage, L.total_bytes),
              "download (KV)");
        SB_CHECK_GUARDS(&qb, what);
        SB_CHECK_GUARDS(&kb, what);
        SB_CHECK_GUARDS(&vb, what);
        sb_free(&qb), sb_free(&kb), sb_free(&vb);
        comet_kv_cache_free_on(g_cuda, &kv);
    }
    if (memcmp(qo[0], qo[1], nq * 4) || memcmp(ko[0], ko[1], nk * 4))
        fail_msg("%s: q or k after RoPE differs between the forms", what);
    size_t first = 0;
    while (first < L.total_bytes && store[0][first] == store[1][first])
        first++;
    if (first < L.total_bytes)
        fail_msg("%s: KV pool byte %zu of %zu differs between the forms: %02x vs %02x "
                 "(head tile %zu)",
                 what, first, L.total_bytes, store[0][first], store[1][first],
                 first / L.head_tile_bytes);
    print_message("  %s: %d tokens, q, k and the pool the same bits\n", what, T);
    for (int form = 0; form < 2; form++)
        free(store[form]), free(qo[form]), free(ko[form]);
    for (int s = 0; s < S; s++)
        free(pages[s]);
    free(q), free(k), free(v);
    st_batch_free(&rb);
}

/* Both rope_kv_append kernels on every head shape of this file (D 32 .. 256, GQA 1 .. 16, KV
 * groups of 16 .. 256 channels) and two whose head dim is not a power of two (groups of 24 and
 * 48 channels: the fold of 8-channel runs in three and six steps), KV 4 / 8 / 16, both
 * rotations where D allows. */
static void test_rope_kv_forms(void **state) {
    (void)state;
    need_all(g_cuda);
    static const att_cfg odd[] = {
        {"D96 H6/Hkv2 G24", 96, 6, 2, 24, COMET_ROPE_SCALING_NONE, 10000.0f},
        {"D96 H3/Hkv3 G48", 96, 3, 3, 48, COMET_ROPE_SCALING_NONE, 10000.0f},
    };
    static const int bits[] = {4, 8, 16};
    for (int b = 0; b < 3; b++) {
        for (int rot = 0; rot < 2; rot++) {
            for (int c = 0; c < N_ATT_CFGS; c++)
                rope_forms_case(&ATT_CFGS[c], bits[b], rot, 0x50F00000ull + (uint64_t)c);
            for (int c = 0; c < N_DEC_CFGS; c++)
                if (!g_quick || c == 2)
                    rope_forms_case(&DEC_CFGS[c], bits[b], rot, 0x50F10000ull + (uint64_t)c);
        }
        for (int c = 0; c < 2; c++)
            rope_forms_case(&odd[c], bits[b], 0, 0x50F20000ull + (uint64_t)c);
    }
}

/* ---- main ------------------------------------------------------------------------------- */

int main(void) {
    if (att_test_init(0)) /* the full set's 5000-token prefill on every core */
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_codes_position0),
        cmocka_unit_test(test_rope_kv_forms),
        cmocka_unit_test(test_attention_ragged),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_attention_decode_wide),
        cmocka_unit_test(test_attention_batch_invariant),
    };
    if (getenv("COMET_TEST_FILTER")) /* one test by name (sanitizer runs) */
        cmocka_set_test_filter(getenv("COMET_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comet_backend_free(g_cpu);
    comet_backend_free(g_cuda);
    return rc;
}

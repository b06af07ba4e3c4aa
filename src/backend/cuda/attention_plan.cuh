/* attention_plan.cuh — paged attention's plan: the tile list a step is cut into (a run of
 * up to COMET_CUDA_ATTN_TILE tokens of one sequence a tile), the tiling of a tile's query
 * rows over CTAs, the choice between the decode kernels (fp32 or tensor cores), the general
 * one and the tensor-core ones for prefill chunks (which of those: att_mma2, att_mma3), the
 * number of key splits and the workspace they need, whether a decode step's split merge
 * fuses with the quantization of its output (att_quant_fused) and whether its RoPE and KV
 * append fuse into the decode kernel (att_rope_fused). The host side of attention.h's plan
 * functions.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once


#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_decode_mma.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_mma2.cuh"
#include "backend/cuda/attention_mma3.cuh"
#include "backend/cuda/attention_quant.cuh"
#include "backend/cuda/env_switch.h"

namespace {

int att_dmax(int D) { return D <= 64 ? 64 : D <= 128 ? 128 : 256; }

/* CTAs of attn_decode_mma_kernel at head dim D that one SM of the current device holds at
 * once (its registers and shared memory; attention.cu). */
int dmma_ctas_per_sm(int D);

size_t att_smem_bytes(int dmax) {
    const int R = att_rows(dmax);
    return sizeof(float) * ((size_t)R * dmax + (size_t)ATT_KC * (dmax + 1) + (size_t)ATT_KC * dmax +
                            (size_t)R * ATT_KC + 3 * (size_t)R) +
           sizeof(int) * (size_t)R;
}

/* Tokens per sub-tile and sub-tiles per tile for GQA group g at head dim D. */
void att_tiling(int D, int g, int *tt, int *n_sub) {
    int t = att_rows(att_dmax(D)) / g;
    if (t > COMET_CUDA_ATTN_TILE)
        t = COMET_CUDA_ATTN_TILE;
    if (t < 1)
        t = 1;
    *tt = t;
    *n_sub = (COMET_CUDA_ATTN_TILE + t - 1) / t;
}

/* Whether the step's attention takes attn_decode_kernel: every tile is one token (tiles
 * cover the T tokens, each at least one, so n_tiles == T says so; a decode step, one token
 * a sequence, always is one), the GQA group fits its registers, and the step is not
 * batch-invariant (its rows take attn_kernel's fixed spans whatever the step). */
bool att_decode_step(const comet_cuda_step_view *st, int g) {
    return !st->batch_invariant && st->n_tiles == st->n_tokens && g >= 1 && g <= DEC_MAX_G;
}

/* Whether a decode step (att_decode_step) takes attn_decode_mma_kernel: an INT4 cache at head
 * dim 64 or 128, groups of 16, 32, 64 or 128 channels (at most D), at most DMMA_MAX_G query
 * heads per KV head, unless COMET_CUDA_ATTN_DECODE_MMA=0 (read at every call, so that one
 * process can compare both kernels). */
bool att_decode_mma(const comet_cuda_kv_layout *L, int g) {
    if (comet_cuda_env_off("COMET_CUDA_ATTN_DECODE_MMA"))
        return false;
    if (L->bits != 4 || (L->D != 64 && L->D != 128) || g < 1 || g > DMMA_MAX_G)
        return false;
    const int ngr = L->D / L->G; /* a power of two up to D / 16: G in 16, 32, .., D */
    return L->G % 16 == 0 && L->D % L->G == 0 && ngr >= 1 && ngr <= L->D / 16 &&
           (ngr & (ngr - 1)) == 0;
}

/* Whether the step's prefill chunks (sequences with at least ATT_MMA_MIN_TOKENS tokens in
 * it) take a tensor-core kernel (attn_mma_kernel, or attn_mma2_kernel: att_mma2): the backend
 * lets them (st->attn_mma nonzero), head dim 64 or 128, q and
 * out 16-byte aligned (its float4 loads and stores), a step that may hold such a chunk
 * (T >= ATT_MMA_MIN_TOKENS; which tiles are chunks the kernels read from the step's
 * token_indptr) and not batch-invariant (there every row takes attn_kernel's fixed spans,
 * whatever its chunk). */
bool att_mma_step(const comet_cuda_step_view *st, int D, const void *q, const void *out) {
    return st->attn_mma && !st->batch_invariant && (D == 64 || D == 128) &&
           st->n_tokens >= ATT_MMA_MIN_TOKENS && ((uintptr_t)q | (uintptr_t)out) % 16 == 0;
}

/* Whether a step's prefill chunks (att_mma_step) take attn_mma2_kernel rather than
 * attn_mma_kernel: the backend asks for it (st->attn_mma 2, its default) or for
 * attn_mma3_kernel (3) where that one does not take the chunks (att_mma3), and the GQA group
 * fits a tile in its 128 rows (g <= MMA2_MAX_G). */
bool att_mma2(const comet_cuda_step_view *st, int g) {
    return (st->attn_mma == 2 || st->attn_mma == 3) && g >= 1 && g <= MMA2_MAX_G;
}

/* Whether attn_mma3_kernel reads a cache of layout L: INT4 codes at head dim 64 or 128, groups
 * of a multiple of 8 channels dividing D with at least 4 groups a key, so that a slot's code row
 * (D / 2 bytes) and (scale, zero) row (4 D / G bytes: 16, 32 or 64) are whole 16-byte pieces for
 * its cp.async copies (their starts are 16-byte aligned: cuda_kv.h), at most the D / 2 bytes
 * its raw buffer holds a row. */
bool mma3_layout_ok(const comet_cuda_kv_layout *L) {
    return L->bits == 4 && (L->D == 64 || L->D == 128) && L->G >= 8 && L->G % 8 == 0 &&
           L->D % L->G == 0 && L->D / L->G >= 4 && L->code_row_bytes % 16 == 0 &&
           L->sz_row_bytes % 16 == 0 && L->sz_row_bytes <= L->D / 2;
}

/* Whether the plan counts the tensor-core prefill kernels' own CTAs (mma_work_ctas) for their
 * key splits and for attn_mma3_kernel's threshold, and a step whose every sequence is such a
 * chunk launches no attn_kernel, unless COMET_CUDA_ATTN_PLAN_WAVES=0 (the fp32 kernel's grid,
 * attn_mma3_kernel wherever it takes the chunks, attn_kernel always: the A/B; read at every
 * call, so that one process can compare both). */
bool att_plan_waves() { return !comet_cuda_env_off("COMET_CUDA_ATTN_PLAN_WAVES"); }

/* The CTAs of attn_mma2_kernel or attn_mma3_kernel that do a step's work: a CTA takes 128
 * query rows, mma_tiles_per_cta(g) consecutive 16-token tiles of one sequence (g >= 1), for
 * each KV head; counted over the step's tiles as if they were one sequence's (a lower bound: a
 * sequence's last group may hold fewer tiles). */
long mma_work_ctas(const comet_cuda_step_view *st, int g, int Hkv) {
    const int tpc = mma_tiles_per_cta(g);
    return (long)(st->n_tiles + tpc - 1) / tpc * Hkv;
}

/* Whether a step's prefill chunks (att_mma_step) take attn_mma3_kernel: the backend asks for it
 * (st->attn_mma 3), the cache's layout suits it (mma3_layout_ok), the GQA group fits a tile in
 * its 128 rows (g <= MMA3_MAX_G) and the step has more of its CTAs than st->mma3_min_ctas (the
 * backend's default: the SMs; with fewer, attn_mma2_kernel runs them in one wave, eight warps a
 * CTA, faster: 77 against 128 us at 512 tokens of the LLaMA-3-8B layer on an H100). Otherwise
 * they take what att_mma2 says. */
bool att_mma3(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st, int g) {
    return st->attn_mma == 3 && g >= 1 && g <= MMA3_MAX_G && mma3_layout_ok(L) &&
           (mma_work_ctas(st, g, L->Hkv) > st->mma3_min_ctas || !att_plan_waves());
}

/* Whether comet_cuda_paged_attention_quant runs attn_quant_kernel (the split merge and the
 * quantization of the output in one kernel) rather than attn_combine_kernel and then
 * act_quant: a decode step (att_decode_step) whose keys were split (n_splits > 1), head dim
 * 64 or 128, a W4Ax activation format over the whole output (K = H * D, blocks of 64 or 128),
 * out 16-byte aligned (its float4 stores), the merged row and the splits' (max, sum) within
 * AQ_SMEM_MAX of shared memory, unless COMET_CUDA_ATTN_QUANT_FUSED=0 (read at every call, so
 * that one process can compare both paths). */
bool att_quant_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st, int H,
                     int n_splits, const comet_cuda_act_fmt *f, const void *out) {
    if (comet_cuda_env_off("COMET_CUDA_ATTN_QUANT_FUSED"))
        return false;
    if (n_splits < 2 || L->Hkv < 1 || H < 1 || H % L->Hkv || !att_decode_step(st, H / L->Hkv))
        return false;
    if ((L->D != 64 && L->D != 128) || !f || f->kind != COMET_CUDA_ACT_W4AX || f->K != H * L->D ||
        (f->B != 64 && f->B != 128) || f->K % f->B || f->n8 < 0 || f->n8 > f->K / f->B ||
        (uintptr_t)out % 16)
        return false;
    return aq_smem_bytes(H, L->D, n_splits) <= AQ_SMEM_MAX;
}

static_assert(COMET_CUDA_ATTN_TILE >= 2, "att_rope_fused: one token a tile is one a sequence");

/* Whether comet_cuda_rope_attention_quant runs attn_decode_mma_kernel<D, NGR, true> (the
 * step's RoPE and KV append inside the decode kernel) rather than rope_kv_append's kernel and
 * then paged_attention_quant's path: a decode step (att_decode_step: one token a tile, which with
 * tiles of up to COMET_CUDA_ATTN_TILE >= 2 tokens is one token a sequence, and not
 * batch-invariant) that attn_decode_mma_kernel takes (att_decode_mma), with arguments that
 * both ops take (so that the others meet the same errors on the two ops' path), unless
 * COMET_CUDA_ROPE_ATTN_FUSED=0 (read at every call, so that one process can compare both). */
bool att_rope_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st, int layer,
                    int H) {
    if (comet_cuda_env_off("COMET_CUDA_ROPE_ATTN_FUSED"))
        return false;
    if (H < 1 || L->Hkv < 1 || H % L->Hkv || layer < 0 || layer >= L->n_layer || st->n_tokens < 1 ||
        L->P < 1 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE)
        return false;
    const int g = H / L->Hkv;
    return att_decode_step(st, g) && att_decode_mma(L, g);
}

} /* namespace */

extern "C" {

int comet_cuda_attention_tiles(const int32_t *token_indptr, int n_seqs, int32_t *tiles) {
    int n_tiles = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int t = token_indptr[s]; t < token_indptr[s + 1]; t += COMET_CUDA_ATTN_TILE) {
            if (tiles)
                tiles[2 * n_tiles] = t, tiles[2 * n_tiles + 1] = s;
            n_tiles++;
        }
    return n_tiles;
}

int comet_cuda_attention_splits(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                int H, int n_sm) {
    if (L->Hkv < 1 || H % L->Hkv || n_sm <= 0)
        return 1;
    const int g = H / L->Hkv;
    if (st->batch_invariant) {
        /* one CTA per span (ATT_SPAN) where the tiles leave SMs idle and the spans' partial
         * rows fit ATT_SPAN_WS_MAX; else each CTA merges its tile's spans itself */
        int tt, n_sub;
        att_tiling(L->D, g, &tt, &n_sub);
        const long blocks = (long)st->n_tiles * n_sub * L->Hkv;
        const long spans = (st->max_kv_len + ATT_SPAN - 1) / ATT_SPAN;
        const size_t ws = (size_t)st->n_tokens * H * spans * ((size_t)L->D + 2) * sizeof(float);
        return spans > 1 && blocks < 2L * (n_sm > 0 ? n_sm : 1) && ws <= ATT_SPAN_WS_MAX
                   ? (int)spans
                   : 1;
    }
    long blocks, min_keys;
    bool whole_waves = false;
    int per_sm = 2; /* CTAs a split plan fills each SM with */
    if (att_decode_step(st, g)) {
        blocks = (long)st->n_tokens * L->Hkv;
        min_keys = DEC_MIN_KEYS;
        /* attn_decode_mma_kernel: as many CTAs as an SM holds (3 at D = 128 on sm_90, its 168
         * registers), unless COMET_CUDA_ATTN_DMMA_OCC=0 (2); part of a second wave would cost
         * as much as a whole one, so its splits round down */
        whole_waves = att_decode_mma(L, g);
        if (whole_waves && !comet_cuda_env_off("COMET_CUDA_ATTN_DMMA_OCC"))
            per_sm = dmma_ctas_per_sm(L->D);
    } else if (st->min_q_len >= ATT_MMA_MIN_TOKENS && att_plan_waves() &&
               att_mma_step(st, L->D, NULL, NULL) && (att_mma3(L, st, g) || att_mma2(st, g))) {
        /* every chunk on attn_mma2_kernel (one CTA an SM) or attn_mma3_kernel (two on sm_90):
         * their working CTAs, in whole waves, since a split's merge costs about what a second
         * wave does (at 512 tokens of the LLaMA-3-8B layer on an H100: 77 us with one split,
         * 133 with two) */
        blocks = mma_work_ctas(st, g, L->Hkv);
        min_keys = MMA_KT;
        whole_waves = true;
        per_sm = att_mma3(L, st, g) ? 2 : 1;
    } else {
        int tt, n_sub;
        att_tiling(L->D, g, &tt, &n_sub);
        blocks = (long)st->n_tiles * n_sub * L->Hkv;
        min_keys = 2 * ATT_KC; /* at least two key chunks a split */
    }
    const long target = (long)per_sm * (n_sm > 0 ? n_sm : 1);
    if (blocks < 1 || blocks >= target) /* blocks < 1: a view without tiles */
        return 1;
    long splits = whole_waves ? target / blocks : (target + blocks - 1) / blocks;
    const long by_len = st->max_kv_len / min_keys;
    if (splits > by_len)
        splits = by_len;
    if (splits > 64)
        splits = 64;
    return splits > 1 ? (int)splits : 1;
}

int comet_cuda_attention_prefill_kernel(const comet_cuda_kv_layout *L,
                                        const comet_cuda_step_view *st, int H) {
    if (L->Hkv < 1 || H < 1 || H % L->Hkv)
        return 0;
    const int g = H / L->Hkv;
    if (att_decode_step(st, g) || !att_mma_step(st, L->D, NULL, NULL))
        return 0;
    return att_mma3(L, st, g) ? 3 : att_mma2(st, g) ? 2 : 1;
}

size_t comet_cuda_attention_workspace_bytes(const comet_cuda_kv_layout *L,
                                            const comet_cuda_step_view *st, int H, int n_splits) {
    if (n_splits <= 1)
        return 0;
    return (size_t)st->n_tokens * H * n_splits * ((size_t)L->D + 2) * sizeof(float);
}

} /* extern "C" */

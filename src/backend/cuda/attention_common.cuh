/* attention_common.cuh — what paged attention's kernels share: their launch constants, the
 * arguments every kernel takes (att_args), the reads of K/V codes from a head tile and
 * their dequantization in registers (kv_fetch8, kv_dequant8, kv_load8), and the merge of
 * batch-invariant attention's key spans (att_merge).
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/paged_kv.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/attention.h"

namespace {

constexpr int ATT_THREADS = 256, ATT_KC = 32;
/* Decode attention: four warps a CTA, enough key groups to keep a split's keys in flight
 * while a CTA stays small enough for several to share an SM */
constexpr int DEC_THREADS = 128;
/* Fewest keys a decode split takes: below it a split's fixed cost (the q load and rotation,
 * the merge of its key groups, its share of the combine) outweighs its keys; 128 and 256
 * measured within one call's spread of it (8B batch-1 decode, H100) */
constexpr int DEC_MIN_KEYS = 64;
/* Most query heads per KV head the decode kernel holds in registers (GQA groups of LLaMA,
 * Mistral, SmolLM); larger groups take the general kernel */
constexpr int DEC_MAX_G = 8;
/* Batch-invariant attention (st->batch_invariant): every row's keys are cut into spans of
 * ATT_SPAN keys at fixed positions; each span's (max, sum, unnormalized row) starts from
 * nothing and the spans merge in order (att_merge), in the CTA or, when the keys are split
 * across CTAs one span each, in the combine kernel: the same bits either way. Two key chunks,
 * as fine as the decode kernel's smallest split (DEC_MIN_KEYS). */
constexpr int ATT_SPAN = 64;
/* Most workspace bytes batch-invariant attention splits its spans into (beyond, one CTA
 * merges a tile's spans itself): a decode step of 64 sequences at 8K keys on LLaMA-3-8B */
constexpr size_t ATT_SPAN_WS_MAX = 256u << 20;

/* Query rows (token, head of the GQA group) of one attention CTA for head dims up to DMAX:
 * Q [R, DMAX] stays at 32 KB of shared memory (16 KB for DMAX = 64). */
__host__ __device__ constexpr int att_rows(int dmax) { return dmax >= 256 ? 32 : 64; }

struct att_args {
    kv_args L;
    const int32_t *positions, *token_indptr, *page_indptr, *page_indices, *tiles;
    int H, g, tt, n_sub, n_splits, rotate;
    int span;    /* batch-invariant with n_splits > 1: keys per split, ATT_SPAN; else 0 */
    int tc_min;  /* > 0: the tiles of sequences with at least tc_min tokens in the step take
                  * attn_mma_kernel and attn_kernel skips them; 0: attn_kernel takes all */
    int lk_log2; /* decode: log2 of the lanes that share one key */
    int p_shift; /* log2(P) when P is a power of two, else -1 (the decode kernels and
                  * attn_mma2_kernel) */
    float scale;
    const float *q;
    float *out;
    float *ws_acc; /* [T, H, n_splits, D] */
    float *ws_ml;  /* [T, H, n_splits, 2] (max, sum) */
};

/* The raw bytes of eight channels of one slot: their codes (one, two or four words at 4, 8
 * or 16 bits) and, for codes, the group's fp16 scale and zero as one word. */
template <int BITS>
struct kv_raw8 {
    uint32_t w[BITS / 4];
    uint32_t sz;
};

/* Loads channels c .. c+7 of slot `slot` of a head tile; szo = 4 * (c / G), the byte offset
 * of their group's (scale, zero) in the slot's scale row (unused at 16 bits). */
template <int BITS>
__device__ __forceinline__ kv_raw8<BITS> kv_fetch8(const kv_args &L, const uint8_t *tile, int slot,
                                                   int c, int szo) {
    kv_raw8<BITS> r;
    const uint8_t *codes = tile + (size_t)slot * L.code_row;
    if constexpr (BITS == 16) {
        const uint4 x = *reinterpret_cast<const uint4 *>(codes + 2 * c);
        r.w[0] = x.x, r.w[1] = x.y, r.w[2] = x.z, r.w[3] = x.w;
        r.sz = 0;
    } else {
        if constexpr (BITS == 4) {
            r.w[0] = *reinterpret_cast<const uint32_t *>(codes + c / 2);
        } else {
            const uint2 x = *reinterpret_cast<const uint2 *>(codes + c);
            r.w[0] = x.x, r.w[1] = x.y;
        }
        r.sz =
            *reinterpret_cast<const uint32_t *>(tile + L.sz_offset + (size_t)slot * L.sz_row + szo);
    }
    return r;
}

/* The float of an integer code below 2^23: the code under the exponent of 2^23, less 2^23
 * (exact: the value an int-to-float conversion gives, in one logic op and one add instead
 * of the slower conversion unit). */
__device__ __forceinline__ float code_float(uint32_t code) {
    return __fsub_rn(__uint_as_float(0x4B000000u | code), 8388608.0f);
}

/* The eight values of r: fp16 widened, or code * scale + zero with the product and the sum
 * each rounded (comet_quant_kv_sim's dequantization, never an FMA). An all-zero r gives
 * zeros. */
template <int BITS>
__device__ __forceinline__ void kv_dequant8(const kv_raw8<BITS> &r, float *o) {
    if constexpr (BITS == 16) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&r.w[e]));
            o[2 * e] = f.x;
            o[2 * e + 1] = f.y;
        }
    } else {
        const __half2 szh = *reinterpret_cast<const __half2 *>(&r.sz);
        const float s = __low2float(szh), z = __high2float(szh);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint32_t code =
                BITS == 4 ? (r.w[0] >> (4 * e)) & 15u : (r.w[e / 4] >> (8 * (e & 3))) & 255u;
            o[e] = __fadd_rn(__fmul_rn(code_float(code), s), z);
        }
    }
}

/* Eight dequantized channels c .. c+7 of slot `slot` of a head tile, at the layout's code
 * width (with_kv_bits). */
__device__ __forceinline__ void kv_load8(const kv_args &L, const uint8_t *tile, int slot, int c,
                                         float *o) {
    with_kv_bits(L.bits, [&](auto bits) {
        constexpr int BITS = decltype(bits)::value;
        kv_dequant8<BITS>(kv_fetch8<BITS>(L, tile, slot, c, BITS == 16 ? 0 : 4 * (c / L.G)), o);
    });
}

/* The merge of batch-invariant attention's spans: the running (M, L) of a row takes a span's
 * (m, l); *a and *b scale the running and the span's unnormalized rows (A = A a + o b,
 * att_merge_row). A span that saw no key (m = -inf) leaves the row as it is. Rounded
 * products and sums (no contraction), so the CTA and the combine kernel agree bit for bit. */
__device__ __forceinline__ void att_merge(float &M, float &L, float m, float l, float *a,
                                          float *b) {
    if (m == -INFINITY) {
        *a = 1.0f, *b = 0.0f;
        return;
    }
    const float Mn = fmaxf(M, m);
    *a = expf(M - Mn), *b = expf(m - Mn);
    L = __fadd_rn(__fmul_rn(L, *a), __fmul_rn(l, *b));
    M = Mn;
}
__device__ __forceinline__ float att_merge_row(float A, float o, float a, float b) {
    return __fadd_rn(__fmul_rn(A, a), __fmul_rn(o, b));
}

} /* namespace */

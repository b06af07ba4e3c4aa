/* attention_quant.cuh — the split merge of decode attention fused with the quantization of
 * its output for o_proj's W4Ax GEMM (attn_quant_kernel): what attn_combine_kernel and then
 * norm_quant.cu's row_quant_kernel (ROW_PLAIN, the op act_quant) compute, in one kernel and
 * without the round trip of the merged rows through global memory in between. The same
 * operations in the same order as those two kernels, so the same bits (attention.h
 * comet_cuda_paged_attention_quant).
 * It does not take prefill steps, batch-invariant steps (their spans merge in order:
 * att_merge), steps without key splits, or fp16 activations: they keep the two kernels.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_quant.h"
#include "backend/cuda/ptx.cuh"

namespace {

/* Most threads of an attn_quant_kernel CTA (one CTA a token row) */
constexpr int AQ_THREADS = 1024;
/* Splits whose partial rows a thread has in flight at once (8 float4 loads) */
constexpr int AQ_CHUNK = 8;
/* Most shared memory attn_quant_kernel takes (the merged row, the splits' (max, sum)):
 * within sm_80's opt-in limit of 163 KB; LLaMA-3-70B at 64 splits takes 64 KB */
constexpr size_t AQ_SMEM_MAX = 128u << 10;
/* A split's weight slot when the split saw no key (max -inf): attn_combine_kernel skips it
 * (no product with its row, which may hold anything); every real weight expf(m - M) is >= 0
 * or NaN */
constexpr float AQ_SKIP = -1.0f;

struct aq_args {
    const float *ws_acc; /* [T, H, n_splits, D] the splits' unnormalized rows */
    const float *ws_ml;  /* [T, H, n_splits, 2] their (max, sum) */
    int H, n_splits, rotate;
    float *out;          /* [T, H, D] the attention output, as attn_combine_kernel writes it */
    const int32_t *perm; /* [K] o_proj's input permutation, NULL = identity */
    int K, B, n8;        /* K = H * D; block B (64 or 128) and the leading INT8 blocks */
    int8_t *qa;          /* [T, K] codes */
    float *sa;           /* [T, K / B] block scales */
    int pdl_trigger;     /* 1: o_proj's GEMM may launch from this kernel's start (step_trigger) */
};

/* Shared memory of attn_quant_kernel: the merged row [K] and the splits' (max, sum) pairs
 * [H, n_splits, 2] (each max replaced by its weight), then the heads' sums [H]. */
size_t aq_smem_bytes(int H, int D, int n_splits) {
    return sizeof(float) * ((size_t)H * D + 2 * (size_t)H * n_splits + (size_t)H);
}

/* Grid T, one CTA a token row, min(1024, H * D / 4 rounded up to a warp) threads; head dim D
 * 64 or 128. Three phases:
 * 1. Each warp loads the source channels (perm) of its first activation block, each thread
 *    the partial rows of its first AQ_CHUNK splits (a float4 of 4 channels of one head a
 *    split: D / 4 lanes a head, so a warp holds 32 / (D / 4) whole heads), and the CTA the
 *    row's (max, sum) pairs into shared memory; after a barrier one thread a head derives
 *    the merge weights expf(m - M) (M the max over the splits; AQ_SKIP for a split with no
 *    key) and the sum of l * w, split by split in order, as attn_combine_kernel does.
 * 2. Each thread merges its 4 channels over the splits in order (acc = fma(x, w, acc),
 *    attn_combine_kernel's contraction), divides by the sum, and with `rotate` rotates the
 *    head back by H_D in registers: butterflies of stages 1 and 2 inside the float4, stages
 *    4 .. D / 2 with the lane D / 16 .. 1 apart by shuffles (wht_smem's a + b, a - b and
 *    scaling, so the same bits). The row goes to shared memory and to out.
 * 3. After a barrier each warp quantizes whole activation blocks of the row in o_proj's
 *    permuted order from shared memory, with row_quant_kernel's warp_quant_block. */
template <int D>
static __global__ void __launch_bounds__(AQ_THREADS) attn_quant_kernel(aq_args a) {
    static_assert(D == 64 || D == 128, "attn_quant_kernel: head dim 64 or 128");
    if (a.pdl_trigger)
        comet_ptx::pdl_trigger(); /* o_proj's GEMM may start on its weights (ptx.cuh) */
    constexpr int LPH = D / 4; /* lanes a head */
    extern __shared__ float aq_smem[];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nthreads = blockDim.x, nwarps = nthreads >> 5;
    const int H = a.H, n = a.n_splits, K = a.K, Q = K / 4;
    float *row = aq_smem;         /* [K] */
    float *ml = row + K;          /* [H, n, 2]: (max, sum), then (weight, sum) */
    float *sums = ml + 2 * H * n; /* [H] */
    const int nb = K / a.B, per = a.B / 32;
    const int b0 = warp;
    int p0[4] = {0, 0, 0, 0};
    if (b0 < nb) {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (e < per) {
                const int k = b0 * a.B + lane * per + e;
                p0[e] = a.perm ? a.perm[k] : k;
            }
    }
    const size_t tb = (size_t)t * H * n; /* the row's first (head, split) slot */
    /* this thread's partial rows of splits s0 .. s0 + AQ_CHUNK - 1 for quad q */
    float4 x[AQ_CHUNK];
    auto load = [&](int q, int s0) {
        const int h = q / LPH, d0 = (q - h * LPH) * 4;
#pragma unroll
        for (int j = 0; j < AQ_CHUNK; j++)
            if (q < Q && s0 + j < n)
                x[j] = *reinterpret_cast<const float4 *>(a.ws_acc +
                                                         (tb + (size_t)h * n + s0 + j) * D + d0);
    };
    load(tid, 0);
    for (int i = tid; i < 2 * H * n; i += nthreads)
        ml[i] = a.ws_ml[2 * tb + i];
    __syncthreads();
    for (int h = tid; h < H; h += nthreads) {
        float *mh = ml + 2 * (size_t)h * n;
        float M = -INFINITY;
        for (int s = 0; s < n; s++)
            M = fmaxf(M, mh[2 * s]);
        float sum = 0.0f;
        for (int s = 0; s < n; s++) {
            const float m = mh[2 * s];
            if (m == -INFINITY) {
                mh[2 * s] = AQ_SKIP;
                continue;
            }
            const float w = expf(m - M);
            sum = __fmaf_rn(mh[2 * s + 1], w, sum);
            mh[2 * s] = w;
        }
        sums[h] = sum;
    }
    __syncthreads();
    /* whole warps a pass, so that a head's lanes shuffle together (Q is a multiple of LPH) */
    for (int q = tid; q - lane < Q; q += nthreads) {
        const bool valid = q < Q;
        const int h = valid ? q / LPH : 0;
        const float *wh = ml + 2 * (size_t)h * n;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s0 = 0; s0 < n; s0 += AQ_CHUNK) {
            if (q != tid || s0 != 0)
                load(q, s0);
#pragma unroll
            for (int j = 0; j < AQ_CHUNK; j++) {
                if (s0 + j >= n)
                    break;
                const float w = wh[2 * (s0 + j)];
                if (w == AQ_SKIP)
                    continue;
                acc[0] = __fmaf_rn(x[j].x, w, acc[0]);
                acc[1] = __fmaf_rn(x[j].y, w, acc[1]);
                acc[2] = __fmaf_rn(x[j].z, w, acc[2]);
                acc[3] = __fmaf_rn(x[j].w, w, acc[3]);
            }
        }
        const float sum = sums[h];
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = sum > 0.0f ? acc[e] / sum : 0.0f;
        if (a.rotate) {
            float y[4];
            y[0] = __fadd_rn(v[0], v[1]), y[1] = __fsub_rn(v[0], v[1]);
            y[2] = __fadd_rn(v[2], v[3]), y[3] = __fsub_rn(v[2], v[3]);
            v[0] = __fadd_rn(y[0], y[2]), v[2] = __fsub_rn(y[0], y[2]);
            v[1] = __fadd_rn(y[1], y[3]), v[3] = __fsub_rn(y[1], y[3]);
#pragma unroll
            for (int m = 1; m < LPH; m <<= 1) {
                const bool upper = lane & m;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float o = __shfl_xor_sync(0xffffffffu, v[e], m);
                    v[e] = upper ? __fsub_rn(o, v[e]) : __fadd_rn(v[e], o);
                }
            }
            const float norm = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = __fmul_rn(v[e], norm);
        }
        if (valid) {
            const float4 r = make_float4(v[0], v[1], v[2], v[3]);
            *reinterpret_cast<float4 *>(row + 4 * q) = r;
            *reinterpret_cast<float4 *>(a.out + (size_t)t * K + 4 * q) = r;
        }
    }
    __syncthreads();
    for (int b = b0; b < nb; b += nwarps) {
        const int k0 = b * a.B + lane * per;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[e] = 0.0f;
            if (e < per)
                v[e] = row[b == b0 ? p0[e] : a.perm ? a.perm[k0 + e] : k0 + e];
        }
        warp_quant_block(v, per, b < a.n8 ? 127 : 7, lane, a.qa + (size_t)t * K + b * a.B,
                         a.sa + (size_t)t * nb + b);
    }
}

} /* namespace */

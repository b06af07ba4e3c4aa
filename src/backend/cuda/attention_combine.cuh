/* attention_combine.cuh — the combine kernel of split keys (attn_combine_kernel): merges the
 * partial rows the prefill or decode kernel wrote to the workspace when a step's keys were
 * split across CTAs.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"

namespace {

/* Grid (T, H), one thread per channel (blockDim D rounded up to a warp): merges the
 * n_splits partial rows of (token, head) with their maxima and sums (splits that saw no
 * key have max -inf and weigh 0), normalizes, rotates back by H_D in shared memory when
 * the cache is rotated, and writes out [T, H, D]. */
static __global__ void attn_combine_kernel(const float *__restrict__ ws_acc,
                                           const float *__restrict__ ws_ml, int H, int D,
                                           int n_splits, int rotate, int spans,
                                           float *__restrict__ out) {
    __shared__ float buf[COMET_CUDA_KV_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const size_t base = ((size_t)t * H + h) * n_splits;
    float sum = 0.0f, acc = 0.0f;
    if (spans) { /* batch-invariant: the splits are spans, merged in order as attn_kernel does */
        float M = -INFINITY, a, b;
        for (int s = 0; s < n_splits; s++) {
            att_merge(M, sum, ws_ml[2 * (base + s)], ws_ml[2 * (base + s) + 1], &a, &b);
            if (d < D)
                acc = att_merge_row(acc, ws_acc[(base + s) * D + d], a, b);
        }
    } else {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++)
            M = fmaxf(M, ws_ml[2 * (base + s)]);
        for (int s = 0; s < n_splits; s++) {
            const float m = ws_ml[2 * (base + s)];
            if (m == -INFINITY)
                continue;
            const float w = expf(m - M);
            sum += ws_ml[2 * (base + s) + 1] * w;
            if (d < D)
                acc += ws_acc[(base + s) * D + d] * w;
        }
    }
    const float val = sum > 0.0f ? acc / sum : 0.0f;
    if (!rotate) {
        if (d < D)
            out[((size_t)t * H + h) * D + d] = val;
        return;
    }
    if (d < D)
        buf[d] = val;
    __syncthreads();
    wht_smem(buf, 1, D, 0);
    if (d < D)
        out[((size_t)t * H + h) * D + d] = buf[d];
}

} /* namespace */

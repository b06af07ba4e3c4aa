/* paged_kv.cuh — what the kernels of the paged KV cache share (rope_kv.cu: RoPE + KV
 * append; attention.cu: paged attention): the pool's layout as kernel arguments (cuda_kv.h),
 * the dispatch of the KV code width to template instances (with_kv_bits) and the
 * in-shared-memory Walsh-Hadamard transform. Internal to those files: everything is in an
 * anonymous namespace.
 */
#ifndef COMET_BACKEND_CUDA_PAGED_KV_CUH
#define COMET_BACKEND_CUDA_PAGED_KV_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/cuda_kv.h"
#include "backend/cuda/kernel_util.cuh"

namespace {

/* ---- paged KV ---- */

struct kv_args {
    uint8_t *base; /* the layer's first byte */
    size_t tile_bytes, sz_offset;
    int code_row, sz_row, P, Hkv, D, G, bits;
};

inline kv_args kv_args_make(const comet_cuda_kv_layout *L, const void *storage, int layer) {
    kv_args k;
    k.base = (uint8_t *)storage + (size_t)layer * L->layer_bytes;
    k.tile_bytes = L->head_tile_bytes;
    k.sz_offset = L->sz_offset;
    k.code_row = L->code_row_bytes, k.sz_row = L->sz_row_bytes;
    k.P = L->P, k.Hkv = L->Hkv, k.D = L->D, k.G = L->G, k.bits = L->bits;
    return k;
}

/* f(BITS) with the KV code width of a layout (cuda_kv.h `bits`: 16, 4 or 8, the values
 * comet_cuda_kv_layout_make gives) as a std::integral_constant value: the one place where
 * the run-time KV format selects the template instances of the KV kernels (the counterpart
 * of gemm_w4ax.cu's with_ws_config). Host code dispatches a launch with it, device code a
 * load (tested in that order there: fp16, then INT4). A new KV type adds its case here and
 * in the kernels' `if constexpr` on BITS. */
#pragma nv_exec_check_disable
template <typename F>
__host__ __device__ __forceinline__ auto with_kv_bits(int bits, F &&f) {
    if (bits == 16)
        return f(std::integral_constant<int, 16>{});
    if (bits == 4)
        return f(std::integral_constant<int, 4>{});
    return f(std::integral_constant<int, 8>{});
}

/* The head tile of (page, kv, h) in the layer. */
__device__ __forceinline__ uint8_t *kv_tile(const kv_args &L, int page, int kv, int h) {
    return L.base + (((size_t)page * 2 + kv) * L.Hkv + h) * L.tile_bytes;
}

/* In-place normalized Walsh-Hadamard transform of n_vec vectors of n floats in shared
 * memory (stride `stride` floats), comet_wht's butterflies and scaling; the whole CTA
 * takes part and every stage ends at a barrier. */
__device__ void wht_smem(float *x, int n_vec, int n, int stride) {
    const int half = n / 2, pairs = n_vec * half;
    for (int h = 1; h < n; h *= 2) {
        for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
            const int r = p / half, i = p % half;
            const int j = (i / h) * 2 * h + i % h;
            float *v = x + (size_t)r * stride;
            const float a = v[j], b = v[j + h];
            v[j] = __fadd_rn(a, b);
            v[j + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float norm = __fdiv_rn(1.0f, __fsqrt_rn((float)n));
    for (int p = threadIdx.x; p < n_vec * n; p += blockDim.x) {
        float *v = x + (size_t)(p / n) * stride + p % n;
        *v = __fmul_rn(*v, norm);
    }
    __syncthreads();
}

} /* namespace */

#endif

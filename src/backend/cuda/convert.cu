/* convert.cu — the CUDA backend's copies and conversions (convert.h): the embedding row
 * gather, the lm_head row gather, the fp32 -> fp16 weight conversion, synthetic weights and
 * the split of a stacked GEMM output. No arithmetic beyond fp16 rounding (round to nearest
 * even, as comet_quant_f16_round).
 *
 * What it does not do: any allocation (the caller owns every buffer).
 */
#include "backend/cuda/convert.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernel_util.cuh"

namespace {

/* ---- embedding ---- */

/* One CTA per token copies its row of the table (rows row0 .. row0 + V - 1 of the vocabulary;
 * zeros for a token outside them); float4 when C % 4 == 0. */
static __global__ void embed_kernel(const float *__restrict__ embd, int C, int row0, int V,
                                    const int32_t *__restrict__ tokens, float *__restrict__ x) {
    const int t = blockIdx.x;
    const int row = tokens[t] - row0;
    float *dst = x + (size_t)t * C;
    if (row < 0 || row >= V) {
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            dst[i] = 0.0f;
        return;
    }
    const float *src = embd + (size_t)row * C;
    if ((C & 3) == 0) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        for (int i = threadIdx.x; i < C / 4; i += blockDim.x)
            d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            dst[i] = src[i];
    }
}

/* ---- small copies ---- */

/* One CTA per gathered row; threads stride over the row's fp16 values. */
static __global__ void gather_rows_f16_kernel(const __half *__restrict__ src, int C,
                                              const int32_t *__restrict__ rows,
                                              __half *__restrict__ dst) {
    const int r = blockIdx.x;
    const __half *s = src + (size_t)rows[r] * C;
    __half *d = dst + (size_t)r * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        d[i] = s[i];
}

/* Grid-stride conversion, one element per thread per step. */
static __global__ void f32_to_f16_kernel(const float *__restrict__ src, __half *__restrict__ dst,
                                         size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

/* Synthetic weights: element i gets a value from a counter-based hash of (seed, i), so any
 * grid fills the same values. kind 0: raw bytes (dst uint8, uniform: random INT4 codes in
 * any packed layout); 1: fp16 uniform in [lo, hi); 2: fp32 uniform in [lo, hi). */
static __device__ __forceinline__ uint32_t hash_u32(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static __global__ void fill_random_kernel(void *dst, size_t n, int kind, float lo, float hi,
                                          uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash_u32(seed, i);
        float u = (float)(h & 0xFFFFFF) * (1.0f / 16777216.0f);
        if (kind == 0)
            static_cast<uint8_t *>(dst)[i] = (uint8_t)h;
        else if (kind == 1)
            static_cast<__half *>(dst)[i] = __float2half_rn(lo + (hi - lo) * u);
        else
            static_cast<float *>(dst)[i] = lo + (hi - lo) * u;
    }
}

/* ---- stacked GEMM output ---- */

struct unstack_args {
    const float *y;
    int N, n_parts;
    int col0[4];
    float *out[3];
};

/* Grid (column blocks, T): ys[i][t, c - col0[i]] = y[t, c] for the columns c of part i. */
static __global__ void unstack_kernel(unstack_args a) {
    const int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < a.N; c += gridDim.x * blockDim.x) {
        int i = 0;
        while (i + 1 < a.n_parts && c >= a.col0[i + 1])
            i++;
        float *o = a.out[i];
        if (o)
            o[(size_t)t * (a.col0[i + 1] - a.col0[i]) + (c - a.col0[i])] = a.y[(size_t)t * a.N + c];
    }
}

} /* namespace */

extern "C" {

comet_status comet_cuda_embed(const float *embd, int C, int row0, int V, const int32_t *tokens,
                              int T, float *x, void *stream) {
    if (T < 1 || C < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: embed_tokens: T = %d, C = %d",
                               T, C);
    embed_kernel<<<T, 256, 0, static_cast<cudaStream_t>(stream)>>>(embd, C, row0, V, tokens, x);
    return launch_check("embed_tokens");
}

comet_status comet_cuda_gather_rows_f16(const uint16_t *src, int C, const int32_t *rows, int n_rows,
                                        uint16_t *dst, void *stream) {
    if (n_rows < 1)
        return COMET_OK;
    gather_rows_f16_kernel<<<n_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const __half *>(src), C, rows, reinterpret_cast<__half *>(dst));
    return launch_check("lm_head (row gather)");
}

comet_status comet_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    f32_to_f16_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        src, reinterpret_cast<__half *>(dst), n);
    return launch_check("weights_load (fp16 conversion)");
}

comet_status comet_cuda_fill_random(void *dst, size_t n, int kind, float lo, float hi,
                                    uint64_t seed, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    fill_random_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        dst, n, kind, lo, hi, seed);
    return launch_check("weights_load (synthetic weights)");
}

comet_status comet_cuda_unstack(const float *y, int T, int N, int n_parts, const int *widths,
                                float *const *outs, void *stream) {
    unstack_args a = {};
    if (T < 1 || n_parts < 1 || n_parts > 3)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: unstack: T = %d, %d parts", T,
                               n_parts);
    a.y = y, a.N = N, a.n_parts = n_parts;
    for (int i = 0; i < n_parts; i++) {
        a.col0[i + 1] = a.col0[i] + widths[i];
        a.out[i] = outs[i];
    }
    if (a.col0[n_parts] != N)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: unstack: parts of %d "
                               "columns in all, the stack has %d",
                               a.col0[n_parts], N);
    const unsigned blocks = (unsigned)((N + 1023) / 1024 < 64 ? (N + 1023) / 1024 : 64);
    unstack_kernel<<<dim3(blocks, T), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_check("matmul (stack split)");
}

} /* extern "C" */

/* gemm_w4ax_common.cuh — the W4Ax GEMM kernels' shared device code: the launch parameters
 * (params), the programmatic-dependent-launch prefetch size, accumulator and weight-scale
 * helpers, token copies, output stores and the split-K hand-off. Part of gemm_w4ax.cu's one
 * translation unit (it includes every gemm_w4ax_*.cuh in order), so the kernels compile exactly
 * as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax.h"
#include "backend/cuda/ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

namespace {
using namespace comet_ptx;

struct params {
    int M, N, Np, K, nb, S;
    const uint8_t *qw;
    const uint16_t *sw;
    const int8_t *qa;
    const float *sa;
    float *y;
    uint16_t *y16;
    int y_parts;       /* 0: outputs in y; 2-3: column parts y_part[i] (comet_cuda_w4ax_gemm) */
    int y_col0[4];
    float *y_part[3];
    int32_t *bsum;
    float *part;           /* [S, M, N] split-K partials */
    unsigned *counter;     /* one per (blockIdx.x, blockIdx.y) tile; per tile id with stream-K */
    int tiles_n, tiles_m;  /* warp-specialized kernel: output tiles along N and M */
    int pp_depth, pp_rows; /* pipe kernel: ring slots per warp, token rows per slot */
    int pp_early; /* pipe kernel, launched with pdl: ring positions whose weights (codes and
                            * scales) are copied before the wait; the kernel takes at most depth - 1 */
    int pdl;      /* launched with programmatic dependent launch: weights before the wait */
    int persist;  /* wgmma kernel, stream-K instance: whole tiles blockIdx.x, + gridDim.x, ... */
};

/* Bytes of packed weight codes that a CTA's pdl prologue prefetches into L2: the previous
 * kernel's tail is a microsecond or two, and an SM's share of DRAM bandwidth moves ~32 KB per
 * microsecond; prefetching a CTA's whole K range (up to 128 KB per wgmma CTA, the whole weight
 * matrix over the grid) made the wgmma kernel up to 1.16x slower. Between GEMMs,
 * which are all bandwidth-bound, 16 KB and none measured the same; it is meant for
 * the short kernels between them in a decode step (norms, quantization), not measured there. */
constexpr unsigned PDL_PREFETCH_BYTES = 16384;
static_assert(PDL_PREFETCH_BYTES % 16 == 0,
              "cp.async.bulk.prefetch sizes are multiples of 16 bytes");
/* Each 16-row weight slice's share of PDL_PREFETCH_BYTES in a CTA that prefetches `slices` of
 * them (a 16-byte multiple, as cp.async.bulk.prefetch needs) */
__host__ __device__ constexpr unsigned pdl_prefetch_per_slice(int slices) {
    return PDL_PREFETCH_BYTES / slices / 16 * 16;
}

__device__ __forceinline__ uint32_t lo16x(uint32_t w) { return (w << 4) & 0xF0F0F0F0u; }
__device__ __forceinline__ uint32_t hi16x(uint32_t w) { return w & 0xF0F0F0F0u; }

template <int MI>
__device__ __forceinline__ void zero_acc(float (&acc)[MI][4]) {
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            acc[f][r] = 0.0f;
}

/* Weight scales are loaded as raw fp16 bits and converted where they are used: converting
 * right after the load makes the thread wait for the load there (ncu: the HADD2.F32 of the
 * conversion was the top stall of the wgmma kernel, 28 % of samples). */
__device__ __forceinline__ unsigned short ld_sw(const uint16_t *p) {
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}
__device__ __forceinline__ float f16f(unsigned short h) {
    return __half2float(__ushort_as_half(h));
}

/* Token-code copies of the pipe and stream kernels. Every CTA of a GEMM reads the same
 * token rows, so they are cached in L1 (.ca) for the other CTAs on the SM: with .cg (L2 only)
 * each CTA's copy crossed from L2 to the SM again, and at M = 2-8 those bytes rivalled the
 * weights' (.ca took the automatic plan to 0.65-0.98x the time per LLaMA-3 shape
 * at M = 2-8, in CUDA graphs with pdl). The tiled kernel's copies stay .cg. */
__device__ __forceinline__ void cp_async16_tok_s(uint32_t s, const void *gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async16_tok(void *smem, const void *gmem) {
    cp_async16_tok_s((uint32_t)__cvta_generic_to_shared(smem), gmem);
}

/* Where the fp32 output of token t, column n goes: y [M, N], or the column part holding n
 * (NULL: not stored). The parts start at multiples of 4, so columns n .. n + 3 (n % 4 == 0)
 * share one. */
__device__ __forceinline__ float *out_at(const params &p, int t, int n) {
    if (!p.y_parts)
        return p.y ? p.y + (size_t)t * p.N + n : nullptr;
    const int i = n < p.y_col0[1] ? 0 : (p.y_parts > 2 && n >= p.y_col0[2] ? 2 : 1);
    float *b = p.y_part[i];
    return b ? b + (size_t)t * (p.y_col0[i + 1] - p.y_col0[i]) + (n - p.y_col0[i]) : nullptr;
}

/* Final value of one output element (split-K already reduced). */
__device__ __forceinline__ void store_out(const params &p, int t, int n, float v) {
    size_t i = (size_t)t * p.N + n;
    if (float *d = out_at(p, t, n))
        *d = v;
    if (p.y16)
        p.y16[i] = __half_as_ushort(__float2half_rn(v));
}

/* Whether outputs n .. n + 3 of a token (n % 4 == 0) may be stored as one vector: N % 4 == 0,
 * y 16-byte and y16 8-byte aligned (the caller's pointers need not be; column parts are, and
 * their widths are multiples of 4) */
__device__ __forceinline__ bool out4_ok(const params &p) {
    return (p.N & 3) == 0 && ((uintptr_t)p.y & 15) == 0 && ((uintptr_t)p.y16 & 7) == 0;
}

/* Final values of outputs n .. n + 3 of token t (n % 4 == 0; those past N are dropped): one
 * 16-byte / 8-byte store each where ok (out4_ok), else four; the same bits either way (fp16 by
 * round to nearest even, as store_out) */
__device__ __forceinline__ void store_out4(const params &p, int t, int n, float4 v, bool ok) {
    if (ok && n < p.N) { /* N % 4 == 0: all four exist */
        const size_t i = (size_t)t * p.N + n;
        if (float *d = out_at(p, t, n))
            *reinterpret_cast<float4 *>(d) = v;
        if (p.y16) {
            const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
            *reinterpret_cast<uint2 *>(p.y16 + i) = make_uint2(
                *reinterpret_cast<const uint32_t *>(&a), *reinterpret_cast<const uint32_t *>(&b));
        }
        return;
    }
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (n + k < p.N)
            store_out(p, t, n + k, e[k]);
}

/* A warp's m16n8k32 accumulators acc[MI][4] (weight rows row0 + g, + 8; tokens f*8 + 2*tq,
 * + 1) into a row-major float tile with `ld` tokens per row (shared memory). */
template <int MI>
__device__ __forceinline__ void store_acc_tile(float *tile, int row0, int ld,
                                               const float (&acc)[MI][4], int g, int tq) {
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            tile[(row0 + g + (r >> 1) * 8) * ld + f * 8 + tq * 2 + (r & 1)] = acc[f][r];
}

/* The same accumulators into a token-major float tile: one row of `ld` floats per token (tokens
 * from tok0), the weight rows as columns (for epilogues that sum and store four weight rows at a
 * time); weight row `row` of token tok0 + t at column col(row, t) (a layout against bank
 * conflicts, pp_red_col), by default at column row */
struct tile_col_id { /* a template: no unused-function warning where no kernel calls it (sm_80) */
    template <typename T>
    __device__ int operator()(int row, T) const {
        return row;
    }
};
template <int MI, typename Col = tile_col_id>
__device__ __forceinline__ void store_acc_tile_t(float *tile, int tok0, int row0, int ld,
                                                 const float (&acc)[MI][4], int g, int tq,
                                                 Col col = Col()) {
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            tile[(tok0 + f * 8 + tq * 2 + (r & 1)) * ld +
                 col(row0 + g + (r >> 1) * 8, f * 8 + tq * 2 + (r & 1))] = acc[f][r];
}

/* Split-K hand-off: every thread has written its partials; returns true in the one CTA
 * that arrives last for this tile, after which it may read all partials. */
__device__ __forceinline__ bool splitk_last(const params &p) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
        unsigned old = atomicAdd(&p.counter[tile], 1u);
        last = old == (unsigned)p.S - 1;
        if (last)
            p.counter[tile] = 0;
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

} // namespace

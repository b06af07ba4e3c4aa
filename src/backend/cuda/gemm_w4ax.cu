/* gemm_w4ax.cu — CUDA W4Ax GEMM for sm_80+ (tuned on the H200, sm_90a).
 *
 * INT4 weights are a storage format here: nibbles expand to INT8 in registers with the x16
 * trick (low nibble << 4, high nibble in place, masked by 0xF0F0F0F0: 16*w per byte, sign
 * for free) and meet the int8 activation codes on the INT8 tensor cores
 * (mma.sync.m16n8k32.s8). Products are 16x the true ones; every int32 block sum is a
 * multiple of 16, so S = acc >> 4 and float(acc) * 0.0625f == float(S), both exact; the
 * kernels fold the 1/16 into the weight scale (sw / 16 is exact, and sa * (sw / 16) is
 * sa * sw rounded, then / 16: the same product wherever |sa * sw| >= 2^-122, i.e. for any
 * real scales -- below, the /16 lands in fp32 subnormals and may round differently; one
 * instruction per block instead of per output). The
 * weights are the 16-row side of the MMA and tokens the 8-column side, which suits small M.
 *
 * Five kernels, chosen by M, N, K and the device at run time (make_plan()):
 *  - decode (forced only since session 13; M = 1 on sm_90 before): CTAs own 16-row weight
 *    tiles over all of K; their 8 warps split K and issue the 16-byte loads of their share,
 *    8 k64 chunks at a time, before anything waits; partial tiles summed in shared memory.
 *  - stream (M <= 8 on sm_90 where the pipe plan does not apply: below one tile per SM,
 *    caller-forced splits; M <= 32 on sm_80): each warp owns 16 weight rows and
 *    streams their packed codes from global memory straight into registers (16-byte loads, 4
 *    k64 chunks ahead of use); the CTA's tokens for its K range sit in shared memory. K is
 *    split across CTAs so all SMs stream.
 *  - pipe (M <= 16 on sm_90 with N/16 at least the SM count, M <= 32 up to 2x): persistent
 *    CTAs own items of 1-4 whole 16-row weight tiles over all of K (no split-K), which
 *    share one copy of the token rows; each warp streams its share of K through its own
 *    cp.async ring in shared memory. Token rows are copied through L1 (.ca), shared by the
 *    SM's CTAs.
 *  - wgmma (M > 8 on sm_90a where the pipe plan does not apply): warp-specialized; a
 *    producer warp fills a ring of stages with TMA (tokens, swizzled) and bulk copies
 *    (weights) on mbarriers, two consumer warpgroups own 64 weight rows each of a 128 x TOK
 *    tile (TOK = 16 / 32 / 64 / 128 tokens for M <= 16 with K >= 8192 / M <= 32 / M <= 64 /
 *    larger; three CTAs per SM at 16, two at 32 and 64; stream-K at 128 where the split plans
 *    leave SMs idle), weights as the register A operand of wgmma.m64nTOKk32.s8, tokens as B
 *    from shared memory.
 *  - tiled (M > 32 elsewhere, sm_80): 128x128 CTA tile, 8 warps of 64x32, a 4-stage cp.async
 *    pipeline of 64-deep K slices, activations read with ldmatrix.
 * Measured speeds and what limits each kernel: docs/gemm.md, bench/results/.
 * All accumulate one activation block (B = 64 or 128 channels) in int32, then promote:
 * acc_f += float(S) * (sa[t, b] * sw[n, b]). Split-K partials are summed in split order, so
 * results are deterministic: on sm_90 the splits of a tile form a thread-block cluster and
 * reduce through distributed shared memory (wgmma up to 8 splits unless the plan takes global
 * partials or stream-K, stream for M > 8); otherwise they go to a workspace and the last CTA
 * of each tile (atomic counter, reset by that CTA) sums them.
 */
#include "backend/cuda/gemm_w4ax.h"
#include "backend/cuda/ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <type_traits>
#include <utility>
#include <stdio.h>
#include <string.h>

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
    int32_t *bsum;
    float *part;       /* [S, M, N] split-K partials */
    unsigned *counter; /* one per (blockIdx.x, blockIdx.y) tile; per tile id with stream-K */
    int tiles_n, tiles_m; /* warp-specialized kernel: output tiles along N and M */
    int ablate;           /* profiling: stages left out (comet_cuda_w4ax_gemm.ablate) */
    int pp_depth, pp_rows; /* pipe kernel: ring slots per warp, token rows per slot */
    int pp_early;          /* pipe kernel, launched with pdl: ring positions whose weights (codes and
                            * scales) are copied before the wait; the kernel takes at most depth - 1 */
    int pdl;               /* launched with programmatic dependent launch: weights before the wait */
    int persist;           /* wgmma kernel, stream-K instance: whole tiles blockIdx.x, + gridDim.x, ... */
};

/* Bytes of packed weight codes that a CTA's pdl prologue prefetches into L2: the previous
 * kernel's tail is a microsecond or two, and an SM's share of DRAM bandwidth moves ~32 KB per
 * microsecond; prefetching a CTA's whole K range (up to 128 KB per wgmma CTA, the whole weight
 * matrix over the grid) made the wgmma kernel up to 1.16x slower (session 10). Between GEMMs,
 * which are all bandwidth-bound, 16 KB and none measured the same (session 10); it is meant for
 * the short kernels between them in a decode step (norms, quantization), not measured there. */
#ifndef COMET_PDL_PREFETCH /* experiments: build_variant.sh -DCOMET_PDL_PREFETCH=0 */
#define COMET_PDL_PREFETCH 16384
#endif
constexpr unsigned PDL_PREFETCH_BYTES = COMET_PDL_PREFETCH;
static_assert(PDL_PREFETCH_BYTES % 16 == 0, "cp.async.bulk.prefetch sizes are multiples of 16 bytes");
/* Each 16-row weight slice's share of PDL_PREFETCH_BYTES in a CTA that prefetches `slices` of
 * them (a 16-byte multiple, as cp.async.bulk.prefetch needs) */
__host__ __device__ constexpr unsigned pdl_prefetch_per_slice(int slices) { return PDL_PREFETCH_BYTES / slices / 16 * 16; }


__device__ __forceinline__ uint32_t lo16x(uint32_t w) { return (w << 4) & 0xF0F0F0F0u; }
__device__ __forceinline__ uint32_t hi16x(uint32_t w) { return w & 0xF0F0F0F0u; }

template <int MI> __device__ __forceinline__ void zero_acc(float (&acc)[MI][4])
{
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            acc[f][r] = 0.0f;
}

/* Weight scales are loaded as raw fp16 bits and converted where they are used: converting
 * right after the load makes the thread wait for the load there (ncu: the HADD2.F32 of the
 * conversion was the top stall of the wgmma kernel, 28 % of samples). */
__device__ __forceinline__ unsigned short ld_sw(const uint16_t *p)
{
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}
__device__ __forceinline__ float f16f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

/* Token-code copies of the decode, pipe and stream kernels. Every CTA of a GEMM reads the same
 * token rows, so they are cached in L1 (.ca) for the other CTAs on the SM: with .cg (L2 only)
 * each CTA's copy crossed from L2 to the SM again, and at M = 2-8 those bytes rivalled the
 * weights' (session 12: .ca took the automatic plan to 0.65-0.98x the time per LLaMA-3 shape
 * at M = 2-8, in CUDA graphs with pdl). The tiled kernel's copies stay .cg. */
#ifndef COMET_TOK_CA /* experiments: build_variant.sh -DCOMET_TOK_CA=0 copies through L2 only */
#define COMET_TOK_CA 1
#endif
__device__ __forceinline__ void cp_async16_tok_s(uint32_t s, const void *gmem)
{
#if COMET_TOK_CA
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#endif
}
__device__ __forceinline__ void cp_async16_tok(void *smem, const void *gmem)
{
    cp_async16_tok_s((uint32_t)__cvta_generic_to_shared(smem), gmem);
}

/* Final value of one output element (split-K already reduced). */
__device__ __forceinline__ void store_out(const params &p, int t, int n, float v)
{
    size_t i = (size_t)t * p.N + n;
    if (p.y)
        p.y[i] = v;
    if (p.y16)
        p.y16[i] = __half_as_ushort(__float2half_rn(v));
}

/* Whether outputs n .. n + 3 of a token (n % 4 == 0) may be stored as one vector: N % 4 == 0,
 * y 16-byte and y16 8-byte aligned (the caller's pointers need not be) */
__device__ __forceinline__ bool out4_ok(const params &p)
{
    return (p.N & 3) == 0 && ((uintptr_t)p.y & 15) == 0 && ((uintptr_t)p.y16 & 7) == 0;
}

/* Final values of outputs n .. n + 3 of token t (n % 4 == 0; those past N are dropped): one
 * 16-byte / 8-byte store each where ok (out4_ok), else four; the same bits either way (fp16 by
 * round to nearest even, as store_out) */
__device__ __forceinline__ void store_out4(const params &p, int t, int n, float4 v, bool ok)
{
    if (ok && n < p.N) { /* N % 4 == 0: all four exist */
        const size_t i = (size_t)t * p.N + n;
        if (p.y)
            *reinterpret_cast<float4 *>(p.y + i) = v;
        if (p.y16) {
            const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
            *reinterpret_cast<uint2 *>(p.y16 + i) =
                make_uint2(*reinterpret_cast<const uint32_t *>(&a), *reinterpret_cast<const uint32_t *>(&b));
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
__device__ __forceinline__ void store_acc_tile(float *tile, int row0, int ld, const float (&acc)[MI][4], int g, int tq)
{
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
    template <typename T> __device__ int operator()(int row, T) const { return row; }
};
template <int MI, typename Col = tile_col_id>
__device__ __forceinline__ void store_acc_tile_t(float *tile, int tok0, int row0, int ld, const float (&acc)[MI][4],
                                                 int g, int tq, Col col = Col())
{
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            tile[(tok0 + f * 8 + tq * 2 + (r & 1)) * ld + col(row0 + g + (r >> 1) * 8, f * 8 + tq * 2 + (r & 1))] =
                acc[f][r];
}

/* Split-K hand-off: every thread has written its partials; returns true in the one CTA
 * that arrives last for this tile, after which it may read all partials. */
__device__ __forceinline__ bool splitk_last(const params &p)
{
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


/* Stream kernel. Grid (ceil(Np/16 / WARPS), ceil(M / (8*MI)), S); WARPS warps per CTA, warp
 * w owning weight rows [16*(blockIdx.x*WARPS + w), +16) and tokens
 * [8*MI*blockIdx.y, +8*MI). Split s covers activation blocks [s*nb/S, (s+1)*nb/S). The CTA
 * first copies its tokens' codes for that K range into shared memory (rows padded by 16
 * bytes: conflict-free 4-byte B-fragment reads), then each warp runs a register-double-
 * buffered loop over groups of G = 4 k64 chunks: issue the 16-byte loads of the next group
 * (and its weight scales), then 2*MI mma per chunk of the current group, promoting at each
 * block end. KPB = B/64 chunks per block. */
template <int MI, int KPB, int WARPS, bool BSUM, bool CL, int G>
__global__ void __launch_bounds__(WARPS * 32) w4ax_stream_kernel(params p)
{
    constexpr int NBG = G / KPB, B = KPB * 64;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int s = blockIdx.z, b0 = s * p.nb / p.S, b1 = (s + 1) * p.nb / p.S;
    const int R = (b1 - b0) * B, RS = R + 16, t0 = blockIdx.y * 8 * MI;
    const int nt = blockIdx.x * WARPS + warp, np16 = p.Np / 16;
    pdl_trigger();

    float acc[MI][4];
    int ci[MI][4];
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            acc[f][r] = 0.0f, ci[f][r] = 0;

    /* First weight loads go out before the activation copy, so the two latencies overlap. */
    const bool active = nt < np16;
    const int nch = (b1 - b0) * KPB;
    const uint8_t *wp = p.qw + ((size_t)(active ? nt : 0) * (p.K / 64) + (size_t)b0 * KPB) * 512 + lane * 16;
    const uint16_t *swp = p.sw + (size_t)b0 * p.Np + (active ? nt : 0) * 16 + g;
    uint4 cur[G], nxt[G];
    unsigned short swc[NBG][2], swn[NBG][2];
    if (active) {
#pragma unroll
        for (int j = 0; j < G; j++)
            if (j < nch)
                cur[j] = ld_stream(wp + (size_t)j * 512);
#pragma unroll
        for (int j = 0; j < NBG; j++)
            if (j * KPB < nch)
                swc[j][0] = ld_sw(swp + (size_t)j * p.Np), swc[j][1] = ld_sw(swp + (size_t)j * p.Np + 8);
    }
    pdl_wait(); /* the weights above may be read while the previous kernel runs, nothing else */
    const int rows = min(8 * MI, p.M - t0); /* token rows past M are never read */
    for (int i = threadIdx.x; i < rows * (R / 16); i += WARPS * 32) {
        int row = i / (R / 16), col = (i % (R / 16)) * 16;
        cp_async16_tok(smem + row * RS + col, p.qa + (size_t)(t0 + row) * p.K + (size_t)b0 * B + col);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    if (active) {
        for (int c0 = 0; c0 < nch; c0 += G) {
#pragma unroll
            for (int j = 0; j < G; j++)
                if (c0 + G + j < nch)
                    nxt[j] = ld_stream(wp + (size_t)(c0 + G + j) * 512);
#pragma unroll
            for (int j = 0; j < NBG; j++)
                if (c0 + G + j * KPB < nch) {
                    const uint16_t *q = swp + (size_t)((c0 + G) / KPB + j) * p.Np;
                    swn[j][0] = ld_sw(q), swn[j][1] = ld_sw(q + 8);
                }
            float sac[NBG][MI][2];
#pragma unroll
            for (int j = 0; j < NBG; j++)
#pragma unroll
                for (int f = 0; f < MI; f++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int t = t0 + f * 8 + tq * 2 + e, b = b0 + c0 / KPB + j;
                        sac[j][f][e] = (t < p.M && b < b1) ? __ldg(&p.sa[(size_t)t * p.nb + b]) : 0.0f;
                    }
#pragma unroll
            for (int j = 0; j < G; j++) {
                if (c0 + j < nch && (p.ablate & 16)) { /* profiling: weights loaded, not used */
                    ci[0][0] ^= (int)(cur[j].x ^ cur[j].y ^ cur[j].z ^ cur[j].w);
                } else if (c0 + j < nch) {
                    const uint8_t *ap = smem + (c0 + j) * 64 + tq * 4;
#pragma unroll
                    for (int st = 0; st < 2; st++) {
                        uint32_t w0 = st ? cur[j].z : cur[j].x, w1 = st ? cur[j].w : cur[j].y;
                        uint32_t a0 = lo16x(w0), a1 = hi16x(w0), a2 = lo16x(w1), a3 = hi16x(w1);
#pragma unroll
                        for (int f = 0; f < MI; f++) {
                            const uint8_t *q = ap + (f * 8 + g) * RS + st * 32;
                            const bool live = f * 8 + g < rows;
                            uint32_t bb0 = live ? *reinterpret_cast<const uint32_t *>(q) : 0u;
                            uint32_t bb1 = live ? *reinterpret_cast<const uint32_t *>(q + 16) : 0u;
                            mma_s8(ci[f], a0, a1, a2, a3, bb0, bb1);
                        }
                    }
                    if ((j + 1) % KPB == 0) {
                        const int jb = j / KPB, b = b0 + (c0 + j) / KPB;
                        const float swf[2] = {f16f(swc[jb][0]) * 0.0625f, f16f(swc[jb][1]) * 0.0625f};
#pragma unroll
                        for (int f = 0; f < MI; f++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                float sc = sac[jb][f][r & 1] * swf[r >> 1];
                                acc[f][r] = fmaf((float)ci[f][r], sc, acc[f][r]);
                                if (BSUM) {
                                    int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;
                                    if (t < p.M && n < p.N)
                                        p.bsum[((size_t)t * p.N + n) * p.nb + b] = ci[f][r] >> 4;
                                }
                                ci[f][r] = 0;
                            }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < G; j++)
                cur[j] = nxt[j];
#pragma unroll
            for (int j = 0; j < NBG; j++)
                swc[j][0] = swn[j][0], swc[j][1] = swn[j][1];
        }
    }

#define W4AX_STREAM_FOR_EACH(BODY)                                                   \
    _Pragma("unroll") for (int f = 0; f < MI; f++)                                   \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                  \
        int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;       \
        if (t < p.M && n < p.N) { BODY; }                                            \
    }
    if (p.S == 1) {
        if (!active)
            return;
        W4AX_STREAM_FOR_EACH(store_out(p, t, n, acc[f][r]))
        return;
    }
    if (CL) {
        /* The S splits of this tile are one thread-block cluster (dims 1 x 1 x S): each CTA
         * leaves its partial tile in its own shared memory; CTA rank q sums rows
         * [q*RT/S, (q+1)*RT/S) of the S partials through distributed shared memory, in split
         * order (the same fp32 additions as the global-memory path, so the same bits). */
#if __CUDA_ARCH__ >= 900
        constexpr int TT = 8 * MI, RT = WARPS * 16;
        const int rs_max = ((p.nb + p.S - 1) / p.S) * B + 16;
        float *red = reinterpret_cast<float *>(smem + (8 * MI * rs_max + 15) / 16 * 16);
        store_acc_tile<MI>(red, warp * 16, TT, acc, g, tq);
        cluster_sync();
        const int q = (int)cluster_rank(), r0 = q * RT / p.S, r1 = (q + 1) * RT / p.S;
        for (int i = threadIdx.x; i < (r1 - r0) * TT; i += WARPS * 32) {
            const int row = r0 + i / TT, tt = i % TT, n = blockIdx.x * RT + row, t = t0 + tt;
            float v = 0.0f;
            for (int j = 0; j < p.S; j++)
                v += ld_dsmem(red + row * TT + tt, j);
            if (t < p.M && n < p.N)
                store_out(p, t, n, v);
        }
        cluster_sync(); /* no CTA leaves while another still reads its shared memory */
#endif
        return;
    }
    if (active)
        W4AX_STREAM_FOR_EACH(p.part[((size_t)s * p.M + t) * p.N + n] = acc[f][r])
    if ((p.ablate & 8) || !splitk_last(p) || !active)
        return;
    /* split-outer: all of one split's loads are in flight together; each element still sums
     * its partials in split order from 0.0f */
    zero_acc<MI>(acc);
    for (int j = 0; j < p.S; j++)
        W4AX_STREAM_FOR_EACH(acc[f][r] += __ldcg(&p.part[((size_t)j * p.M + t) * p.N + n]))
    W4AX_STREAM_FOR_EACH(store_out(p, t, n, acc[f][r]))
#undef W4AX_STREAM_FOR_EACH
}

/* Pipe kernel (M <= 16 on sm_90 when N/16 >= the SM count, M = 17-32 up to 2x it: pipe_auto). A
 * work item is PT 16-row weight tiles (plan_pipe) x one group of 8*MI tokens over all of K: no
 * split-K, nothing handed between CTAs; the PT tiles share one copy of the token rows and one
 * load of each block's B fragments (session 13: PT = 2 took 0.86-0.90x the time of PT = 1 at
 * M = 1-8 and 0.69-0.76x at M = 12-16, geomean). The grid is persistent, c CTAs per SM (make_plan
 * picks c so that the items spread evenly) walking the items blockIdx.x, + gridDim.x, ... Each
 * of the PP_WARPS warps owns every PP_WARPS-th 128-channel stage of an item and streams it
 * through its own ring of p.pp_depth shared-memory slots with cp.async (codes, weight scales
 * and token codes in 16-byte pieces, activation scales in 4-byte ones): the warp issues
 * position q + depth - 1 of its (item, stage) sequence before it computes position q, runs
 * ahead across item boundaries, and meets the other warps only once per item, when their
 * partial tiles are summed through shared memory in warp order (deterministic) and stored. So
 * the bytes in flight per SM are set by the rings, not by registers (the stream kernel's loads
 * are latency bound: three dependent rounds per warp, 24 % occupancy), and there is no split-K
 * hand-off. Its own limit is issue: 8 warps per CTA and 1-3 CTAs per SM (12.5-37.5 %
 * occupancy), which more tiles per item relieve (fewer instructions per weight byte); with one
 * tile per item it won at M = 9-16 only up to 3 tiles per SM (session 12), with 2-4 on every
 * LLaMA-3 shape.
 * Measured and dropped (bench/results/2026-12-01-h200-gemm-s4.md): a producer warp issuing
 * 1-D bulk copies (TMA) into a CTA-wide ring on mbarriers (slower than the stream kernel on
 * every LLaMA-3 shape at M = 1 but one), 4 warps per CTA (8 are 3-5 % faster at M = 1-8); in
 * session 14 (bench/results/2026-12-02-h200-gemm-s14.md) a CTA keeping its token group's rows
 * resident in shared memory for all its items, the rings carrying weights only (1.03-1.26x
 * the time at M = 1-16: the one-time copy and barrier sit on the critical path). */
#ifndef COMET_PP_WARPS /* experiments: bench/gemm/build_variant.sh -DCOMET_PP_WARPS=4 */
#define COMET_PP_WARPS 8
#endif
constexpr int PP_WARPS = COMET_PP_WARPS, PP_RS = 128 + 16, PP_MAX_DEPTH = 8, PP_MAX_TILES = 4;
constexpr int PP_MAX_CTAS = PP_WARPS == 4 ? 5 : 3; /* CTAs per SM (__launch_bounds__: 102 / 85 registers) */
static_assert(PP_WARPS == 4 || PP_WARPS == 8, "the pipe kernel is tuned for 4 or 8 warps");
/* CTAs per SM that an instance with PT weight tiles per item is built for (__launch_bounds__):
 * its PT x MI x 4 accumulators, and the B fragments kept for the PT tiles, spill at the 85
 * registers of three CTAs from 12 accumulators up, and at the 128 of two with 32 (ptxas -v) */
__host__ __device__ constexpr int pp_max_ctas(int pt, int mi)
{
    return pt * mi <= 2 ? PP_MAX_CTAS : pt * mi <= 6 ? 2 : 1;
}
/* slot of PT weight tiles: codes [PT tiles][2 chunks x 512], weight scales [PT][2 blocks x 16
 * rows] fp16, activation scales [2 blocks x 16 tokens] fp32, token codes [rows x PP_RS] (2
 * blocks: B = 64); PT = 1 is the session-12 layout */
__host__ __device__ constexpr int pp_sw_off(int pt) { return pt * 1024; }
__host__ __device__ constexpr int pp_sa_off(int pt) { return pp_sw_off(pt) + pt * 2 * 32; }
__host__ __device__ constexpr int pp_a_off(int pt) { return pp_sa_off(pt) + 2 * 16 * 4; }
/* Slots start on 128-byte boundaries: with 16- or 32-byte ones (token rows 2, 3, 5, 7) the kernel
 * ran 5-19 % slower (same-run A/B, 11 LLaMA shapes x M = 2-16: 0.81-1.00x the time, 0.955x
 * geomean, no case slower; bench/results/2026-12-01-h200-gemm-s6.md). */
constexpr int PP_SLOT_ALIGN = 128;
/* With pdl, the weights of the ring's first positions are copied before the kernel waits for
 * the previous one (1), or a 16 KB L2 prefetch of the first item's weights is (0, session 10) */
#ifndef COMET_PP_PDL_EARLY /* experiments: build_variant.sh -DCOMET_PP_PDL_EARLY=0 */
#define COMET_PP_PDL_EARLY 1
#endif
constexpr bool PP_PDL_EARLY = COMET_PP_PDL_EARLY;
#ifndef COMET_PP_CARVEOUT
#define COMET_PP_CARVEOUT 1 /* the pipe plan's shared-memory carveout hint (make_pipe_plan) */
#endif
__host__ __device__ constexpr int pp_slot_bytes(int rows, int pt)
{
    return (pp_a_off(pt) + rows * PP_RS + PP_SLOT_ALIGN - 1) / PP_SLOT_ALIGN * PP_SLOT_ALIGN;
}
/* Profiling builds (timing only: the sums are wrong), bench/gemm/build_variant.sh OUT
 * -DCOMET_PP_ABL=x, bits: 1 half the token rows copied, 2 none, 4 no weight copies (the compute
 * reads stale slots), 8 the weights' low nibbles unshifted (one instruction fewer per 8),
 * 16 no compute, 32 no reduction (warp 0's partial tiles are the outputs). Session 15's
 * measurements are in docs/gemm.md, "Where M = 16's time goes". */
#ifndef COMET_PP_ABL
#define COMET_PP_ABL 0
#endif
/* The partial tiles of an item's warps, double-buffered by item up to 16 x 16 outputs per warp
 * (one barrier per item), else single (two barriers). A warp's tile is token-major, rows of
 * pp_red_ld floats, so that the sum runs along the weight rows, four per thread, and its stores
 * are contiguous in y (session 16: weight-row-major before, one token row per lane, so that a
 * warp's store touched 16 token rows: 0.95x the time at M = 12-16 in geomean, 0.85x on 8B o at
 * M = 16, CUDA graphs with pdl). The fragment stores (4 tokens x 8 rows per warp store) would
 * hit the same banks for the 4 tokens; at 8-token groups the rows are padded to 16 PT + 4, at
 * 16 the weight row `row` of token tt sits at column pp_red_col instead: bits 3-4 (PT even; bit
 * 3 at PT odd, which keeps it among the tile's rows) XORed with bits 1-2 of the token, 32
 * banks at PT even and 2 ways at PT odd, with no padding, so that the 16-token plans' rings
 * get the room (session 17: padded rows left 8B gate_up and 70B qkv at M = 16 a ring slot
 * short, 0.92x / 0.97x the time with it; at 8-token groups the swizzle cost 1.01x in geomean,
 * 1.02x on 8B qkv at M = 1-4). Groups of
 * 4 rows stay 16-byte aligned. */
__host__ __device__ constexpr bool pp_red2(int mi, int pt) { return pt * mi <= 2; }
__host__ __device__ constexpr int pp_red_ld(int mi, int pt) { return 16 * pt + (mi == 1 ? 4 : 0); }
__host__ __device__ constexpr int pp_red_bytes(int mi, int pt)
{
    return (pp_red2(mi, pt) ? 2 : 1) * PP_WARPS * pp_red_ld(mi, pt) * 8 * mi * 4;
}
template <int MI, int PT>
__device__ __forceinline__ int pp_red_col(int row, int tt)
{
    return MI == 1 ? row : row ^ (((tt >> 1) & (PT % 2 ? 1 : 3)) << 3);
}

template <int MI, int KPB, int PT, bool BSUM>
__global__ void __launch_bounds__(PP_WARPS * 32, pp_max_ctas(PT, MI)) w4ax_pipe_kernel(const __grid_constant__ params p)
{
    constexpr int TT = 8 * MI, BPS = 2 / KPB; /* blocks per stage */
    constexpr int SW_OFF = pp_sw_off(PT), SA_OFF = pp_sa_off(PT), A_OFF = pp_a_off(PT);
    extern __shared__ __align__(16) uint8_t smem[];
    const int depth = p.pp_depth, slot_bytes = pp_slot_bytes(p.pp_rows, PT);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    uint8_t *ring = smem + (size_t)warp * depth * slot_bytes;
    float *red = reinterpret_cast<float *>(smem + (size_t)PP_WARPS * depth * slot_bytes);
    const int np16 = p.Np / 16, k64 = p.K / 64, nstage = (k64 + 1) / 2;
    const int ni = (np16 + PT - 1) / PT, n_items = ni * p.tiles_m; /* items along N, in all */
    const size_t tile_stride = (size_t)k64 * 512; /* bytes between two 16-row tiles' codes */
    const bool out4 = out4_ok(p);
    pdl_trigger();
    if (!PP_PDL_EARLY && p.pdl && threadIdx.x == 0 && (int)blockIdx.x < n_items) /* first weights, into L2 */
        l2_prefetch(p.qw + (size_t)(blockIdx.x % ni) * PT * tile_stride,
                    min((unsigned)(k64 * 512 * min(PT, np16 - (int)(blockIdx.x % ni) * PT)), PDL_PREFETCH_BYTES));

    /* Copy position (l_item, l_s) of this warp's sequence into ring slot l_slot (one commit
     * group, empty past the last item) and step on. Everything that depends only on the lane
     * or the item is computed outside the per-stage path, which is 5-8 cp.async (PT = 1) and
     * pointer increments: the issue cost per byte decides this kernel's speed (ncu, 70B down at
     * M = 1: 78 % of issue slots busy, 255 instructions per KB of weights before this). */
    int l_item = warp < nstage ? (int)blockIdx.x : n_items, l_s = warp, l_npt = 0;
    const uint32_t ring_s = smem_u32(ring), ring_end = ring_s + depth * slot_bytes;
    uint32_t l_slot = ring_s;
    const uint8_t *l_w = nullptr, *l_a = nullptr;
    const uint16_t *l_sw = nullptr;
    const float *l_sa = nullptr;
    bool l_sa_ok = false;
    /* A slot's token rows as 16-byte pieces lane + 32 k: this lane copies bytes 16 (lane & 7)
     * of rows a_r0 + 4 k, from l_a + k a_step (global) to l_slot + d_a0 + k 4 PP_RS; l_a_rows
     * is the item's token rows past a_r0 (pieces 4 k < l_a_rows exist). One base and constant
     * strides: with an offset pair per piece (a 32-bit shared and a 64-bit global offset, four
     * pieces at 16 tokens) the registers ran out at 128 per thread and ptxas recomputed each
     * address in every position (~40 instructions for 4 copies, SASS of the 16-token
     * instances). */
    const int a_r0 = lane >> 3;
    const uint32_t d_a0 = A_OFF + a_r0 * PP_RS + (lane & 7) * 16;
    const size_t a_step = (size_t)4 * p.K;
    int l_a_rows = 0;
    /* this lane's weight codes (of the item's first tile) and scales at stage st of the item
     * whose first tile is nt0: lanes 4 pt + x copy 16 bytes of tile pt's scales (block x / 2,
     * rows 8 (x & 1) ...) */
    auto w_at = [&](int nt0, int st) { return p.qw + ((size_t)nt0 * k64 + 2 * (size_t)st) * 512 + lane * 16; };
    auto sw_at = [&](int nt0, int st) {
        return p.sw + (size_t)(st * BPS + ((lane & 3) >> 1)) * p.Np + (nt0 + (lane >> 2)) * 16 + (lane & 1) * 8;
    };
    auto start_item = [&]() { /* pointers at stage l_s of item l_item */
        if (l_item >= n_items)
            return;
        const int nt0 = l_item % ni * PT, t0 = l_item / ni * TT, ta = t0 + (lane & (TT - 1));
        const int rows = min(TT, p.M - t0);
        l_npt = PT == 1 ? 1 : min(PT, np16 - nt0);
        l_w = w_at(nt0, l_s);
        l_sw = sw_at(nt0, l_s);
        l_sa = p.sa + (size_t)(ta < p.M ? ta : 0) * p.nb + l_s * BPS + lane / TT;
        l_sa_ok = ta < p.M; /* tokens past M read as 0 */
        l_a = reinterpret_cast<const uint8_t *>(p.qa) + (size_t)(t0 + a_r0) * p.K + (lane & 7) * 16 +
              (size_t)l_s * 128;
        l_a_rows = rows - a_r0;
    };
    start_item();
    /* a position's weights: codes (one or two k64 chunks) and weight scales of the item's
     * tiles; the slots of tiles past np16 (the last item along N of PT > 1) are zero-filled,
     * so that the compute needs no case for them */
    auto copy_w = [&](uint32_t slot, const uint8_t *w, const uint16_t *sw, bool two, int npt) {
        if (COMET_PP_ABL & 4)
            return;
        if (PT == 1) {
            cp_async16_s(slot + lane * 16, w);
            if (two)
                cp_async16_s(slot + 512 + lane * 16, w + 512);
            if (lane < (two ? 2 * BPS : 2))
                cp_async16_s(slot + SW_OFF + lane * 16, sw);
        } else {
#pragma unroll
            for (int pt = 0; pt < PT; pt++) {
                const uint8_t *wp = pt < npt ? w + pt * tile_stride : w;
                cp_async16_sz(slot + pt * 1024 + lane * 16, wp, pt < npt);
                if (two)
                    cp_async16_sz(slot + pt * 1024 + 512 + lane * 16, wp + 512, pt < npt);
            }
            if ((lane >> 2) < PT && (lane & 3) < (two ? 2 * BPS : 2))
                cp_async16_sz(slot + SW_OFF + lane * 16, (lane >> 2) < npt ? sw : p.sw, (lane >> 2) < npt);
        }
    };
    /* parts: 1 = the weights, 2 = the activations (scales, codes) and the commit, 3 = both */
    auto issue_next = [&](int parts) {
        if (l_item < n_items) {
            /* a half stage (one k64 chunk) only at the end of K with B = 64 */
            const bool two = KPB == 2 || 2 * l_s + 2 <= k64;
            if (parts & 1)
                copy_w(l_slot, l_w, l_sw, two, l_npt);
            if (parts & 2) {
                if (lane < (two ? BPS * TT : TT))
                    cp_async4_s(l_slot + SA_OFF + lane * 4, l_sa, l_sa_ok);
                constexpr int PIECES = (COMET_PP_ABL & 2) ? 0 : (COMET_PP_ABL & 1) ? TT / 8 : TT / 4;
#pragma unroll
                for (int k = 0; k < PIECES; k++)
                    if (4 * k < l_a_rows && (two || (lane & 7) < 4))
                        cp_async16_tok_s(l_slot + d_a0 + k * 4 * PP_RS, l_a + k * a_step);
            }
            l_s += PP_WARPS;
            if (l_s < nstage) {
                l_w += PP_WARPS * 1024, l_a += PP_WARPS * 128, l_sa += PP_WARPS * BPS;
                l_sw += (size_t)PP_WARPS * BPS * p.Np;
            } else {
                l_item += gridDim.x, l_s = warp;
                start_item();
            }
            l_slot += slot_bytes;
            if (l_slot == ring_end)
                l_slot = ring_s;
        }
        if (parts & 2)
            cp_async_commit();
    };
    /* launched early: the weights of the first n_early positions go out before the wait, the
     * same walk as issue_next. They join the first position's commit group (cp.async groups
     * complete in order, and that position's token rows can only be copied after the wait), so
     * the first position waits for all of them: p.pp_early, at most depth - 1, is the plan's
     * (plan_pipe) */
    const int n_early = PP_PDL_EARLY && p.pdl ? min(depth - 1, p.pp_early) : 0;
    if (n_early > 0) {
        int it = l_item, st = l_s;
        for (int d = 0; d < n_early && it < n_items; d++) {
            const int nt0 = it % ni * PT;
            copy_w(ring_s + d * slot_bytes, w_at(nt0, st), sw_at(nt0, st), KPB == 2 || 2 * st + 2 <= k64,
                   min(PT, np16 - nt0));
            st += PP_WARPS;
            if (st >= nstage)
                it += gridDim.x, st = warp;
        }
    }
    pdl_wait(); /* everything below reads the activations */
    for (int d = 0; d < depth - 1; d++)
        issue_next(d < n_early ? 2 : 3);

    /* this lane's token row and byte offset in the ldmatrix.x4 of B fragments (load_b): matrix
     * lane / 8, row lane % 8; at 16 tokens matrices (tokens 0-7 | 8-15) x (k 0-15 | 16-31) of one
     * k32 step, at 8 tokens k 0-15 | 16-31 | 32-47 | 48-63 of two */
    const int ldsm_row = MI == 2 ? (lane >> 4) * 8 + (lane & 7) : lane & 7;
    const int ldsm_col = MI == 2 ? ((lane >> 3) & 1) * 16 : (lane >> 3) * 16;
    /* The items, with the ring depth D as a compile-time constant (DC: std::integral_constant):
     * the wait for a position (cp.async.wait_group takes an immediate) and the slot index then
     * cost no run-time dispatch. Dispatched once per kernel below; before (session 13), a
     * switch on the depth in every position, ~12 instructions and an indirect branch. */
    auto run_items = [&](auto DC) {
    constexpr int D = decltype(DC)::value;
    int slot = 0, par = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int nt0 = item % ni * PT, t0 = item / ni * TT, rows = min(TT, p.M - t0);
        const int ldsm_off = min(ldsm_row, rows - 1) * PP_RS + ldsm_col; /* rows past the tokens: the last */
        float acc[PT][MI][4];
#pragma unroll
        for (int pt = 0; pt < PT; pt++)
            zero_acc<MI>(acc[pt]);
        for (int s = warp; s < nstage; s += PP_WARPS) {
            issue_next(3);
            cp_async_wait<D - 1>(); /* this position has landed (this lane's copies) */
            __syncwarp();                  /* ... and every lane's */
            const uint8_t *st = ring + slot * slot_bytes;
            const int nblk = KPB == 2 ? 1 : min(2, k64 - 2 * s);
#pragma unroll
            for (int j = 0; j < BPS; j++) {
                if (j >= nblk || (COMET_PP_ABL & 16))
                    break;
                /* the block's B fragments (token codes) and activation scales, shared by the PT
                 * tiles: with PT = 1 loaded where the first tile uses them, the order of session 12
                 * (loaded first, it ran 1.07-1.14x the time at M = 2-8); with PT > 1 all loaded
                 * first (where the first tile uses them, ptxas spilled 8-20 bytes). Both measured
                 * in session 13, with one 4-byte load per fragment register, not since. */
                constexpr bool LAZY = PT == 1;
                uint32_t bf[2 * KPB][MI][2];
                float2 sa2[MI];
                const float *sas = reinterpret_cast<const float *>(st + SA_OFF) + j * TT + tq * 2;
                const int b = s * BPS + j;
                /* The B fragments by ldmatrix.x4 (8 x 8 b16 matrices: lane l's 4 bytes of row
                 * l / 4 are the fragment's k 4 tq .. 4 tq + 3 of token g): at 16 tokens one
                 * k32 step's b0, b1 of both token groups, at 8 two steps' (x, x + 1). Four
                 * 4-byte loads per instruction (session 14; before, one per fragment register,
                 * zero for rows past the item's tokens). Those rows now read the item's last
                 * token row again (ldsm_off): their sums land in outputs that are never stored,
                 * scaled by activation scales the copies zero-filled. (Read unclamped, they lay
                 * past a slot of fewer rows -- in the next slot's weights, or past a warp's last
                 * slot in the next warp's ring or the reduction buffer -- and racecheck reported
                 * them against those copies.) */
                auto load_b = [&](int x) { /* at x odd with 8 tokens: loaded with x - 1 */
                    if (MI == 1 && (x & 1))
                        return;
                    uint32_t r[4];
                    ldsm_x4(r, st + A_OFF + j * KPB * 64 + x * 32 + ldsm_off);
                    bf[x][0][0] = r[0], bf[x][0][1] = r[1];
                    bf[MI == 1 ? x + 1 : x][MI - 1][0] = r[2], bf[MI == 1 ? x + 1 : x][MI - 1][1] = r[3];
                };
                if (!LAZY) {
#pragma unroll
                    for (int x = 0; x < 2 * KPB; x++)
                        load_b(x);
#pragma unroll
                    for (int f = 0; f < MI; f++)
                        sa2[f] = *reinterpret_cast<const float2 *>(sas + f * 8);
                }
#pragma unroll
                for (int pt = 0; pt < PT; pt++) {
                    /* PT = 1: one accumulator per k32 step, 2*KPB independent mma chains instead
                     * of one chain of 2*KPB (M = 1 was bound by the mma latency), summed exactly.
                     * PT > 1: one chain per tile and token group, PT*MI independent ones, which
                     * saves the integer add per output and block that two chains per tile
                     * (session 13) cost: 0.979-0.987x the time at M = 12-32, 0.992-0.995x at
                     * M = 1-8 (session 14, same-run A/B in CUDA graphs with pdl, 8 LLaMA-3
                     * shapes); no production instance spills either way */
                    constexpr int NCH = PT == 1 ? 2 * KPB : 1;
                    /* the low nibbles' A registers (profiling: unshifted, COMET_PP_ABL & 8) */
                    auto lo = [](uint32_t w) { return (COMET_PP_ABL & 8) ? w & 0x0F0F0F0Fu : lo16x(w); };
                    int cs[NCH][MI][4];
#pragma unroll
                    for (int c = 0; c < KPB; c++) {
                        const uint8_t *wp = st + pt * 1024 + (j * KPB + c) * 512 + lane * 16;
                        const uint4 w = *reinterpret_cast<const uint4 *>(wp);
#pragma unroll
                        for (int k2 = 0; k2 < 2; k2++) {
                            const uint32_t w0 = k2 ? w.z : w.x, w1 = k2 ? w.w : w.y;
                            const int x = c * 2 + k2;
#pragma unroll
                            for (int f = 0; f < MI; f++) {
                                if (LAZY && pt == 0 && f == 0)
                                    load_b(x);
                                if (x < NCH)
#pragma unroll
                                    for (int r = 0; r < 4; r++)
                                        cs[x][f][r] = 0;
                                mma_s8(cs[x % NCH][f], lo(w0), hi16x(w0), lo(w1), hi16x(w1), bf[x][f][0],
                                       bf[x][f][1]);
                            }
                        }
                    }
                    int ci[MI][4];
#pragma unroll
                    for (int f = 0; f < MI; f++)
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                            ci[f][r] = cs[0][f][r];
#pragma unroll
                            for (int x = 1; x < NCH; x++)
                                ci[f][r] += cs[x][f][r];
                        }
                    const unsigned short *swp =
                        reinterpret_cast<const unsigned short *>(st + SW_OFF + pt * 64 + j * 32);
                    const float swf[2] = {f16f(swp[g]) * 0.0625f, f16f(swp[g + 8]) * 0.0625f};
#pragma unroll
                    for (int f = 0; f < MI; f++) {
                        if (LAZY && pt == 0)
                            sa2[f] = *reinterpret_cast<const float2 *>(sas + f * 8);
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                            const float sa = (r & 1) ? sa2[f].y : sa2[f].x;
                            acc[pt][f][r] = fmaf((float)ci[f][r], sa * swf[r >> 1], acc[pt][f][r]);
                            if (BSUM) {
                                const int t = t0 + f * 8 + tq * 2 + (r & 1), n = (nt0 + pt) * 16 + g + (r >> 1) * 8;
                                if (t < p.M && n < p.N)
                                    p.bsum[((size_t)t * p.N + n) * p.nb + b] = ci[f][r] >> 4;
                            }
                        }
                    }
                }
            }
            __syncwarp(); /* the slot is refilled by the next issue */
            slot = slot + 1 == D ? 0 : slot + 1;
        }
        /* sum the warps' partial tiles in warp order; double-buffered by item, one barrier per
         * item suffices (a warp reaches the next item's barrier only after every warp has read
         * this item's buffer); single-buffered, the first barrier waits for the previous item's
         * reads. Tiles past np16 hold zeros and are not stored. */
        if (COMET_PP_ABL & 32) { /* profiling: warp 0's partial tiles as the outputs */
            if (warp == 0)
#pragma unroll
                for (int pt = 0; pt < PT; pt++)
#pragma unroll
                    for (int f = 0; f < MI; f++)
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                            const int t = t0 + f * 8 + tq * 2 + (r & 1), n = (nt0 + pt) * 16 + g + (r >> 1) * 8;
                            if (t < p.M && n < p.N)
                                store_out(p, t, n, acc[pt][f][r]);
                        }
            continue;
        }
        constexpr int ROWS = 16 * PT, LD = pp_red_ld(MI, PT);
        float *rb = red + (pp_red2(MI, PT) ? par : 0) * (PP_WARPS * TT * LD);
        if (!pp_red2(MI, PT))
            __syncthreads();
#pragma unroll
        for (int pt = 0; pt < PT; pt++)
            store_acc_tile_t<MI>(rb, warp * TT, pt * 16, LD, acc[pt], g, tq,
                                 [](int row, int tt) { return pp_red_col<MI, PT>(row, tt); });
        __syncthreads();
        for (int i = threadIdx.x; i < ROWS / 4 * TT; i += PP_WARPS * 32) {
            const int row = i % (ROWS / 4) * 4, tt = i / (ROWS / 4), t = t0 + tt;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < PP_WARPS; w++) {
                const float4 x = *reinterpret_cast<const float4 *>(rb + (w * TT + tt) * LD + pp_red_col<MI, PT>(row, tt));
                v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
            }
            if (t < p.M)
                store_out4(p, t, nt0 * 16 + row, v, out4);
        }
        par ^= 1;
    }
    };
    static_assert(PP_MAX_DEPTH == 8, "one case per ring depth");
    switch (depth) {
    case 2: run_items(std::integral_constant<int, 2>{}); break;
    case 3: run_items(std::integral_constant<int, 3>{}); break;
    case 4: run_items(std::integral_constant<int, 4>{}); break;
    case 5: run_items(std::integral_constant<int, 5>{}); break;
    case 6: run_items(std::integral_constant<int, 6>{}); break;
    case 7: run_items(std::integral_constant<int, 7>{}); break;
    case 8: run_items(std::integral_constant<int, 8>{}); break;
    default: __trap(); /* plan_pipe clamps the depth to 2..PP_MAX_DEPTH */
    }
    cp_async_wait<0>();
}

/* Decode kernel (forced only since session 13; M = 1 on sm_90 before), built to what a
 * kernel that only reads the weights costs (bench/gemm/floor.cu). A CTA of DK_WARPS warps owns dk_wt(MI) 16-row weight
 * tiles x all of K x 8*MI tokens (blockIdx.y); the DK_WARPS / wt warps of a tile split its
 * blocks evenly. Each warp issues the 16-byte loads of DK_U k64 chunks of its share at once,
 * straight into registers, before anything waits (then the CTA copies its tokens' codes and
 * scales and its tiles' weight scales into shared memory); a longer share goes in rounds of
 * DK_U. The warps' partial tiles are summed in shared memory in K order (deterministic).
 * Measured and dropped (bench/results/2026-12-01-h200-gemm-s6.md): split-K through a cluster
 * (DSMEM reduction; 10-50 % slower at M = 1), two buffers of 4 chunks refilled in turn (up
 * to 9 % slower than one of 8), a CTA of 1 tile at M = 9-16 (copying the token rows cost more
 * than loading the weights); in session 11, at M = 4-16 with pdl in CUDA graphs, split-K through
 * a cluster with 4 tiles per CTA (each CTA's token slice then serves 64 weight rows): 0.85-0.98x
 * the automatic plan's time on 5 of 24 points (2 splits: 70B o, down and qkv at M = 4-8),
 * 1.01-1.74x elsewhere with 2 splits, up to 2.59x with 4 and 4.65x with 8. */
#ifndef COMET_DK_WARPS /* experiments: bench/gemm/build_variant.sh -DCOMET_DK_WARPS=16 -DCOMET_DK_U=4 */
#define COMET_DK_WARPS 8
#define COMET_DK_U 8
#endif
#ifndef COMET_DK_MINB1 /* CTAs per SM the MI = 1 instances are built for (registers) */
#define COMET_DK_MINB1 3
#endif
constexpr int DK_WARPS = COMET_DK_WARPS, DK_U = COMET_DK_U;

/* Shared memory of the decode kernel, in bytes from the start: token codes [rows x (K + 16)],
 * activation scales [rows x nb] fp32, weight scales [nb x wt*16] fp16, then the warps'
 * partial tiles [DK_WARPS x 16 x tt] fp32; rows = min(M, tt). */
struct dk_layout {
    int sa, sw, red, bytes;
    __host__ __device__ dk_layout(int rows, int tt, int K, int nb, int wt)
    {
        sa = (rows * (K + 16) + 15) / 16 * 16;
        sw = sa + (rows * nb * 4 + 15) / 16 * 16;
        red = sw + (nb * wt * 32 + 15) / 16 * 16;
        bytes = red + DK_WARPS * 16 * tt * 4;
    }
};

/* 16-row tiles per CTA: 1 for one token group of 8 (the CTA's warps all split K), 4 for 16
 * (the token slice in shared memory then serves 4 tiles: with 1, copying it cost more than
 * the weights' load, measured) */
__host__ __device__ constexpr int dk_wt(int mi) { return mi == 1 ? 1 : 4; }

template <int MI, int KPB, bool BSUM>
__global__ void __launch_bounds__(DK_WARPS * 32, MI == 1 ? COMET_DK_MINB1 : 16 / DK_WARPS) w4ax_decode_kernel(const __grid_constant__ params p)
{
    constexpr int TT = 8 * MI, B = KPB * 64, NBU = DK_U / KPB, WT = dk_wt(MI), WK = DK_WARPS / WT;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int nt = blockIdx.x * WT + warp % WT, kw = warp / WT, np16 = p.Np / 16;
    const int b0 = kw * p.nb / WK, nbw = (kw + 1) * p.nb / WK - b0; /* this warp's blocks */
    const bool active = nt < np16;
    const int nch = active ? nbw * KPB : 0;
    pdl_trigger();

    /* first, the weight loads: the first DK_U chunks of the share in flight from here on */
    const uint8_t *wp = p.qw + ((size_t)(active ? nt : 0) * (p.K / 64) + (size_t)b0 * KPB) * 512 + lane * 16;
    uint4 w[DK_U];
    auto issue = [&](int c0) { /* chunks [c0, c0 + DK_U) of this warp's share */
#pragma unroll
        for (int j = 0; j < DK_U; j++)
            if (c0 + j < nch)
                w[j] = ld_stream(wp + (size_t)(c0 + j) * 512);
    };
    issue(0);

    /* then the CTA's token codes, activation scales and its tiles' weight scales */
    const int t0 = blockIdx.y * TT, rows = min(TT, p.M - t0), RS = p.K + 16;
    const dk_layout L(min(TT, p.M), TT, p.K, p.nb, WT);
    if (!(p.ablate & 32)) { /* profiling: 32 = no copies */
        const int live = min(WT, np16 - (int)blockIdx.x * WT) * 2; /* 16-byte pieces per block row */
        const uint16_t *sw = p.sw + blockIdx.x * WT * 16;
        for (int i = threadIdx.x; i < p.nb * WT * 2; i += DK_WARPS * 32) {
            const int b = i / (WT * 2), piece = i % (WT * 2);
            if (piece < live)
                cp_async16(smem + L.sw + i * 16, sw + (size_t)b * p.Np + piece * 8, true);
        }
        pdl_wait(); /* the weights above may be read while the previous kernel runs, nothing else */
        const int8_t *qa = p.qa + (size_t)t0 * p.K;
        for (int row = 0; row < rows; row++)
            for (int col = threadIdx.x * 16; col < p.K; col += DK_WARPS * 32 * 16)
                cp_async16_tok(smem + row * RS + col, qa + (size_t)row * p.K + col);
        const float *sa = p.sa + (size_t)t0 * p.nb;
        for (int row = 0; row < rows; row++)
            for (int b = threadIdx.x; b < p.nb; b += DK_WARPS * 32)
                cp_async4(smem + L.sa + (row * p.nb + b) * 4, sa + (size_t)row * p.nb + b, true);
    } else {
        pdl_wait();
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc[MI][4];
    zero_acc<MI>(acc);
    const uint8_t *act = smem + (size_t)b0 * B + tq * 4;
    /* this lane's activation-scale rows (tokens f*8 + tq*2 + e; rows past M read as 0) */
    const float *sap[MI][2];
    bool sa_ok[MI][2];
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tt = f * 8 + tq * 2 + e;
            sa_ok[f][e] = tt < rows;
            sap[f][e] = reinterpret_cast<const float *>(smem + L.sa) + (sa_ok[f][e] ? tt : 0) * p.nb + b0;
        }
    const unsigned short *sws =
        reinterpret_cast<const unsigned short *>(smem + L.sw) + b0 * WT * 16 + (warp % WT) * 16 + g;
    /* chunks [c0, c0 + DK_U): MMA per k32 step, promotion per block */
    auto compute = [&](int c0) {
        if (p.ablate & 16) { /* profiling: the weights are loaded and folded, no MMA */
#pragma unroll
            for (int j = 0; j < DK_U; j++)
                if (c0 + j < nch)
                    acc[0][0] = __int_as_float(__float_as_int(acc[0][0]) ^ (int)(w[j].x ^ w[j].y ^ w[j].z ^ w[j].w));
            return;
        }
#pragma unroll
        for (int jb = 0; jb < NBU; jb++) {
            if (c0 + jb * KPB >= nch)
                break;
            /* two independent mma chains per block (k32 steps alternate), summed exactly */
            int cs[2][MI][4];
#pragma unroll
            for (int f = 0; f < MI; f++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    cs[0][f][r] = 0, cs[1][f][r] = 0;
#pragma unroll
            for (int c = 0; c < KPB; c++) {
                const int j = jb * KPB + c;
#pragma unroll
                for (int st = 0; st < 2; st++) {
                    const uint32_t w0 = st ? w[j].z : w[j].x, w1 = st ? w[j].w : w[j].y;
                    const uint32_t a0 = lo16x(w0), a1 = hi16x(w0), a2 = lo16x(w1), a3 = hi16x(w1);
#pragma unroll
                    for (int f = 0; f < MI; f++) {
                        const uint8_t *q = act + (f * 8 + g) * RS + (size_t)(c0 + j) * 64 + st * 32;
                        const bool live = f * 8 + g < rows;
                        const uint32_t bb0 = live ? *reinterpret_cast<const uint32_t *>(q) : 0u;
                        const uint32_t bb1 = live ? *reinterpret_cast<const uint32_t *>(q + 16) : 0u;
                        mma_s8(cs[st][f], a0, a1, a2, a3, bb0, bb1);
                    }
                }
            }
            const int bl = c0 / KPB + jb; /* block index within the warp's share */
            /* x 1/16 (exact) for the x16 weight codes */
            const float swf[2] = {f16f(sws[bl * WT * 16]) * 0.0625f, f16f(sws[bl * WT * 16 + 8]) * 0.0625f};
#pragma unroll
            for (int f = 0; f < MI; f++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int ci = cs[0][f][r] + cs[1][f][r], tt = f * 8 + tq * 2 + (r & 1);
                    const float sa = sa_ok[f][r & 1] ? sap[f][r & 1][bl] : 0.0f;
                    acc[f][r] = fmaf((float)ci, sa * swf[r >> 1], acc[f][r]);
                    if (BSUM) {
                        const int t = t0 + tt, n = nt * 16 + g + (r >> 1) * 8;
                        if (t < p.M && n < p.N)
                            p.bsum[((size_t)t * p.N + n) * p.nb + b0 + bl] = ci >> 4;
                    }
                }
        }
    };
    for (int c0 = 0; c0 < nch; c0 += DK_U) {
        if (c0 > 0)
            issue(c0);
        compute(c0);
    }
    if (p.ablate & 8) { /* profiling: no reduction; the sums stay live through this store */
        if (acc[0][0] == 1.2345e-30f)
            store_out(p, 0, 0, acc[0][1]);
        return;
    }

    /* the warps' partial tiles, summed over the WK warps of each tile in K order */
    float *red = reinterpret_cast<float *>(smem + L.red);
    store_acc_tile<MI>(red, warp * 16, TT, acc, g, tq);
    __syncthreads();
    for (int i = threadIdx.x; i < WT * 16 * TT; i += DK_WARPS * 32) {
        const int ti = i / (16 * TT), row = i / TT % 16, tt = i % TT;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < WK; k++)
            v += red[((k * WT + ti) * 16 + row) * TT + tt];
        const int n = (blockIdx.x * WT + ti) * 16 + row, t = t0 + tt;
        if (t < p.M && n < p.N)
            store_out(p, t, n, v);
    }
}

/* Tiled kernel. CTA tile 128 weight rows x 128 tokens, 8 warps as 2 (rows) x 4 (tokens),
 * warp tile 64 x 32 = 4 m16 fragments x 4 n8 fragments. Each pipeline stage holds one k64
 * slice: 8 packed 512-byte weight tiles (4 KB, read back as one 16-byte LDS per lane per
 * m16 fragment) and 128 token rows of 64 bytes padded to 80 (10 KB; ldmatrix.x4 gives the
 * B fragments of both k32 steps of one n8 fragment, conflict-free thanks to the padding).
 * STAGES-deep cp.async ring, one __syncthreads per slice. Rows past Np and tokens past M
 * are zero-filled by cp.async. Scales of a block are loaded at its first slice and applied
 * after its last. */
constexpr int TBN = 128, TBM = 128, TSTAGES = 4, TA_STRIDE = 80;
constexpr int TW_BYTES = TBN / 16 * 512, TA_BYTES = TBM * TA_STRIDE;
constexpr int TSTAGE_BYTES = TW_BYTES + TA_BYTES;
constexpr int TSMEM_BYTES = TSTAGES * TSTAGE_BYTES;

template <int KPB, bool BSUM>
__global__ void __launch_bounds__(256, 1) w4ax_tiled_kernel(params p)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wn = warp & 1, wm = warp >> 1;
    const int s = blockIdx.z, b0 = s * p.nb / p.S, b1 = (s + 1) * p.nb / p.S;
    const int nt0 = blockIdx.x * (TBN / 16), t0 = blockIdx.y * TBM, np16 = p.Np / 16;
    const int k64 = p.K / 64, c0 = b0 * KPB, nch = (b1 - b0) * KPB;
    pdl_trigger();
    if (p.pdl && tid < TBN / 16 && nt0 + tid < np16) /* the first weights of the CTA's 8 tiles, into L2 */
        l2_prefetch(p.qw + ((size_t)(nt0 + tid) * k64 + c0) * 512,
                    min((unsigned)nch * 512u, pdl_prefetch_per_slice(TBN / 16)));
    pdl_wait(); /* everything below reads the activations */

    auto load_stage = [&](int slot, int c) {
        uint8_t *ws = smem + slot * TSTAGE_BYTES, *as = ws + TW_BYTES;
        int j = tid >> 5, nt = nt0 + j;
        bool ok = nt < np16;
        const uint8_t *src = ok ? p.qw + ((size_t)nt * k64 + c) * 512 + lane * 16 : p.qw;
        cp_async16(ws + j * 512 + lane * 16, src, ok);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int idx = tid + h * 256, row = idx >> 2, col = (idx & 3) * 16, t = t0 + row;
            bool okA = t < p.M;
            const int8_t *srcA = okA ? p.qa + (size_t)t * p.K + (size_t)c * 64 + col : p.qa;
            cp_async16(as + row * TA_STRIDE + col, srcA, okA);
        }
    };

    int ci[4][4][4];
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int f = 0; f < 4; f++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                ci[i][f][r] = 0, acc[i][f][r] = 0.0f;
    unsigned short swr[4][2];
    float sar[4][2];

#pragma unroll
    for (int i = 0; i < TSTAGES - 1; i++) {
        if (i < nch)
            load_stage(i, c0 + i);
        cp_async_commit();
    }
    for (int it = 0; it < nch; it++) {
        cp_async_wait<TSTAGES - 2>();
        __syncthreads();
        {
            int nx = it + TSTAGES - 1;
            if (nx < nch)
                load_stage(nx % TSTAGES, c0 + nx);
            cp_async_commit();
        }
        if (it % KPB == 0) {
            const int b = b0 + it / KPB;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int n = (nt0 + wn * 4 + i) * 16 + g;
                swr[i][0] = n < p.Np ? ld_sw(p.sw + (size_t)b * p.Np + n) : 0;
                swr[i][1] = n < p.Np ? ld_sw(p.sw + (size_t)b * p.Np + n + 8) : 0;
            }
#pragma unroll
            for (int f = 0; f < 4; f++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int t = t0 + wm * 32 + f * 8 + tq * 2 + e;
                    sar[f][e] = t < p.M ? __ldg(&p.sa[(size_t)t * p.nb + b]) : 0.0f;
                }
        }
        const uint8_t *ws = smem + (it % TSTAGES) * TSTAGE_BYTES, *as = ws + TW_BYTES;
        uint4 wf[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            wf[i] = *reinterpret_cast<const uint4 *>(ws + (wn * 4 + i) * 512 + lane * 16);
        uint32_t bq[4][4];
#pragma unroll
        for (int f = 0; f < 4; f++)
            ldsm_x4(bq[f], as + (wm * 32 + f * 8 + (lane & 7)) * TA_STRIDE + (lane >> 3) * 16);
#pragma unroll
        for (int st = 0; st < 2; st++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t w0 = st ? wf[i].z : wf[i].x, w1 = st ? wf[i].w : wf[i].y;
                uint32_t a0 = lo16x(w0), a1 = hi16x(w0), a2 = lo16x(w1), a3 = hi16x(w1);
#pragma unroll
                for (int f = 0; f < 4; f++)
                    mma_s8(ci[i][f], a0, a1, a2, a3, bq[f][2 * st], bq[f][2 * st + 1]);
            }
        if ((it + 1) % KPB == 0) {
            const int b = b0 + it / KPB;
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int f = 0; f < 4; f++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        float sc = sar[f][r & 1] * (f16f(swr[i][r >> 1]) * 0.0625f);
                        acc[i][f][r] = fmaf((float)ci[i][f][r], sc, acc[i][f][r]);
                        if (BSUM) {
                            int t = t0 + wm * 32 + f * 8 + tq * 2 + (r & 1);
                            int n = (nt0 + wn * 4 + i) * 16 + g + (r >> 1) * 8;
                            if (t < p.M && n < p.N)
                                p.bsum[((size_t)t * p.N + n) * p.nb + b] = ci[i][f][r] >> 4;
                        }
                        ci[i][f][r] = 0;
                    }
        }
    }
    cp_async_wait<0>();

/* BODY for each live element (t, n) of m16 fragment i, then of all four fragments */
#define W4AX_TILED_FRAG(BODY)                                                        \
    _Pragma("unroll") for (int f = 0; f < 4; f++)                                    \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                  \
        int t = t0 + wm * 32 + f * 8 + tq * 2 + (r & 1);                             \
        int n = (nt0 + wn * 4 + i) * 16 + g + (r >> 1) * 8;                          \
        if (t < p.M && n < p.N) { BODY; }                                            \
    }
#define W4AX_TILED_FOR_EACH(BODY)                                                    \
    _Pragma("unroll") for (int i = 0; i < 4; i++) { W4AX_TILED_FRAG(BODY) }
    if (p.S == 1) {
        W4AX_TILED_FOR_EACH(store_out(p, t, n, acc[i][f][r]))
        return;
    }
    W4AX_TILED_FOR_EACH(p.part[((size_t)s * p.M + t) * p.N + n] = acc[i][f][r])
    if (!splitk_last(p))
        return;
    /* one m16 fragment (16 elements) at a time, split-outer: 16 loads in flight, each
     * element still summed in split order from 0.0f */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v[4][4];
#pragma unroll
        for (int f = 0; f < 4; f++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                v[f][r] = 0.0f;
        for (int j = 0; j < p.S; j++)
            W4AX_TILED_FRAG(v[f][r] += __ldcg(&p.part[((size_t)j * p.M + t) * p.N + n]))
        W4AX_TILED_FRAG(store_out(p, t, n, v[f][r]))
    }
#undef W4AX_TILED_FOR_EACH
#undef W4AX_TILED_FRAG
}



/* Shared-memory matrix descriptor: K-major, swizzle 128 B (KPB 2) or 64 B (KPB 1); the
 * leading byte offset is unused in swizzled K-major layouts, the stride byte offset is the
 * distance between 8-row groups. */
template <int KPB> __device__ __forceinline__ uint64_t smem_desc(uint32_t saddr)
{
    const uint64_t layout = KPB == 2 ? 1 : 2, sbo = 8 * 64 * KPB;
    return ((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((sbo >> 4) << 32) | (layout << 62);
}

/* Warp-specialized wgmma kernel (sm_90a), M > 8. CTA = 3 warpgroups: warpgroup 0 is the
 * producer (one warp issues all copies, the others leave), warpgroups 1 and 2 are consumers
 * of 64 weight rows each, sharing one tile of TOK = 128, 64, 32 or 16 tokens (ws_auto_tok: no
 * half-empty tiles, less promotion, more stages and CTAs per SM); the CTA's
 * output tile is 128 weight rows x TOK tokens. One pipeline stage is one activation block:
 *  - the token tile (TOK rows x B bytes of codes), one TMA 2-D copy with the 128-byte (B=128)
 *    or 64-byte (B=64) swizzle that the wgmma descriptor reads; rows past M are zero-filled;
 *  - the 8 packed 16-row weight slices (KPB x 512 contiguous bytes each), 1-D bulk copies;
 *  - the block's TOK activation scales, 4-byte cp.async (strided in sa).
 * All three complete on the stage's `full` mbarrier (transaction bytes + 32 cp.async
 * arrivals + the producer's own arrival); consumers release a stage on its `empty` mbarrier
 * (every consumer thread arrives) after promoting it. Consumers unpack A (x16 trick), issue
 * 2*KPB wgmma.m64nTOKk32 into int32, wait, and promote into fp32; setmaxnreg moves
 * registers from the producer to the consumers. Each consumer warpgroup's chain per block
 * (wait for the stage, unpack, wgmma, wait for them, promote, release) is latency-bound: a
 * CTA takes ~1200 cycles per block at 32 tokens, ~1700 at 128, whatever the tile. So 32- and
 * 64-token tiles run two CTAs per SM (ws_ctas_per_sm: 80 registers at launch, consumers 104,
 * a shallower ring), four chains per SM instead of two: 0.68-0.96x the time of one CTA per SM
 * at M = 17-32 on every LLaMA-3 shape, 0.76-1.06x at M = 48-64 (session 8); 16-token tiles
 * (M <= 16) three (56 registers at launch, consumers 72; ws_auto_tok says where). 128-token tiles
 * need ~170 registers per consumer thread, so one CTA per SM there (64-token tiles at two
 * per SM were 1.04-1.23x slower at M = 96-512).
 * Tiles are visited in groups of WS_GROUP token tiles so that a wave of CTAs reuses weights
 * and tokens from L2. A CTA's work is a list of segments (tile, blocks): one with split-K
 * (its tile and split), several with stream-K (SK: its share of all tiles x blocks, the ring
 * running on across them; partial tiles are summed by the last CTA to finish each). */
constexpr int WS_ROWS = 128, WS_THREADS = 384;
/* Consumers of 32-token tiles, and of 16-token tiles at B = 128: block x + 1's stage wait,
 * fragments and wgmma (committed and waited for one by one) before block x is promoted and
 * released. Same-run A/B in CUDA graphs with pdl, 8 LLaMA-3 shapes, M = 9-32 (session 11,
 * bench/results/2026-12-02-h200-gemm-s11.md): 0.974x the time of one block at a time, in the
 * exact form of the loop below. Why is not understood. These measured no gain:
 *  - the order alone, with one wait per block: 1.004x;
 *  - the one-by-one waits alone: 1.00x at M = 16-64, 1.04-1.06x at M >= 256;
 *  - a tidier loop with both: 1.004x;
 *  - the next block's fragments loaded during this block's wgmma: 1.013x.
 * Two blocks' wgmma really in flight together do not fit the registers at B = 128 (104 / 72 per
 * consumer thread): ptxas serializes them (C7512), and build.sh refuses that. Other tiles: one
 * block at a time (-DCOMET_WS_NEXT_FIRST=0 everywhere, for A/B). */
#ifndef COMET_WS_NEXT_FIRST
#define COMET_WS_NEXT_FIRST 1
#endif
[[maybe_unused]] constexpr bool WS_NEXT_FIRST = COMET_WS_NEXT_FIRST; /* used by the sm_90a kernel body only */
/* Every consumer thread arrives on a stage's `empty` barrier after its last read of the stage
 * (256 arrivals), so each read is ordered before the producer's next copy into the slot by
 * the barrier itself. With one lane per warp after __syncwarp (CUTLASS's pattern, sessions
 * 1-4) compute-sanitizer's racecheck reported hazards on stage reuse; 256 arrivals cost
 * nothing measurable (same-run A/B, 32 prefill shapes: +0.5 %, within noise). */
[[maybe_unused]] constexpr int WS_RELEASE_ARRIVALS = 256; /* used by the sm_90a kernel body only */
[[maybe_unused]] constexpr int WS_GROUP = 8; /* used by the sm_90a kernel body only */
constexpr int WS_RED_LD = WS_ROWS + 4; /* row stride (floats) of the cluster reduction tile */
#ifndef COMET_WS_SMALL_CTAS
#define COMET_WS_SMALL_CTAS 2
#endif
#ifndef COMET_WS_TOK16_CTAS
#define COMET_WS_TOK16_CTAS 3
#endif
/* CTAs per SM of the wgmma kernel by token tile: 32- and 64-token tiles run two per SM
 * (consumers within 104 registers, shallower rings: ws_stages), 16-token tiles three (72 registers,
 * a third of the ring). */
__host__ __device__ constexpr int ws_ctas_per_sm(int tok)
{
    return tok == 16 ? COMET_WS_TOK16_CTAS : tok <= 64 ? COMET_WS_SMALL_CTAS : 1;
}
/* Pipeline depth by block size (kpb = B/64) and token-tile height (deeper rings measured no
 * faster at 128 tokens; the 32-token depths are untuned); at two CTAs per SM, what fits in
 * half an SM's 228 KB (each CTA also reserves 1 KB). */
__host__ __device__ constexpr int ws_stages(int kpb, int tok)
{
    return tok == 16 ? (ws_ctas_per_sm(16) == 3 ? (kpb == 1 ? 12 : 6) : (kpb == 1 ? 16 : 10))
           : ws_ctas_per_sm(tok) == 2 ? (tok == 64 ? (kpb == 1 ? 12 : 6) : (kpb == 1 ? 15 : 8))
           : tok == 128             ? (kpb == 1 ? 8 : 5)
           : tok == 64              ? (kpb == 1 ? 12 : 8)
                                    : (kpb == 1 ? 16 : 10);
}
__host__ __device__ constexpr int ws_stage_bytes(int kpb, int tok)
{
    return (tok * 64 * kpb + (WS_ROWS / 16) * kpb * 512 + tok * 4 + 1023) / 1024 * 1024;
}
__host__ __device__ constexpr int ws_smem_bytes(int kpb, int tok)
{
    return ws_stages(kpb, tok) * ws_stage_bytes(kpb, tok) + 1024 + 2 * 8 * ws_stages(kpb, tok);
}
/* Persistent plans (128-token tiles past one wave, at most WS_PERSIST_MAX_NB blocks per tile and
 * at least WS_PERSIST_MIN_TILES_M token tiles):
 * one CTA per SM runs tiles blockIdx.x, + gridDim.x, ... (the stream-K instance, whole tiles),
 * the ring running on across them, so the next tile's first stages load while this one's
 * epilogue runs, and no CTA starts, initializes or fills its ring per tile. Why: at M = 8192
 * the plain grid ran 593-626 TOPS at K = 4096 and 677 at K = 28672 (session 18), as if a tile
 * cost ~4.5 blocks more than its blocks. Same-run A/B, graphs + pdl, 8 LLaMA-3 shapes, M =
 * 1024-8192 (session 19, bench/results/2026-12-03-h200-gemm-s19.md, two runs): 0.96x the time
 * in geomean on the 8B K = 4096 shapes (8B gate_up 0.946-0.961 at every M), 0.98-0.99x on the
 * 70B K = 8192 ones (0.95-1.01 per case), 1.015x on 70B down (K = 28672, 224 blocks), so long K
 * keeps the grid. At M = 512 (4 token tiles) it measured 1.002x on the LLaMA-3 shapes, and
 * LLaMA-2-7B qkv and gate_up took 1.09x / 1.17x session 18's time there (another session's run,
 * not a same-run A/B), so it starts at 8 token tiles (M > 896), where every gain above was
 * measured. Most of the tile's cost stays: the consumers' epilogue still stops their MMA. With
 * COMET_WS_PERSIST_STAGED (default) the epilogue goes through a staging tile of its own past
 * the ring and its barriers (66 KiB more shared memory, 171 / 192 KiB per CTA at B = 64 / 128,
 * so a device whose opt-in limit is lower keeps the grid); direct stores measured 0.998x in
 * geomean where the staged tile measured 0.988x (run 2, M = 256-8192). */
#ifndef COMET_WS_PERSIST
#define COMET_WS_PERSIST 1
#endif
constexpr int WS_PERSIST_MAX_NB = 64, WS_PERSIST_MIN_TILES_M = 8;
#ifndef COMET_WS_PERSIST_STAGED
#define COMET_WS_PERSIST_STAGED 1
#endif
__host__ __device__ constexpr int ws_persist_staging_offset(int kpb, int tok)
{
    return ws_stages(kpb, tok) * ws_stage_bytes(kpb, tok) + 256; /* past the ring's 2 x ST barriers */
}
__host__ __device__ constexpr int ws_persist_smem_bytes(int kpb, int tok)
{
    return ws_persist_staging_offset(kpb, tok) + (COMET_WS_PERSIST_STAGED ? tok * (128 + 4) * 4 : 0) + 1024;
}

/* Split-K hand-off among the 256 consumer threads only (named barrier 1): like
 * splitk_last, for kernels whose producer warps have already left; true in the last of the
 * `pieces` CTAs that arrive on counter `idx` (which it resets). */
[[maybe_unused]] __device__ __forceinline__ bool splitk_last_consumers(const params &p, int ctid, int idx, int pieces)
{
    __shared__ int last;
    __threadfence();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (ctid == 0) {
        unsigned old = atomicAdd(&p.counter[idx], 1u);
        last = old == (unsigned)pieces - 1;
        if (last)
            p.counter[idx] = 0;
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (last)
        __threadfence();
    return last;
}

template <int KPB, int TOK, bool BSUM, int ABL = 0, bool CL = false, bool SK = false>
__global__ void __launch_bounds__(WS_THREADS, ws_ctas_per_sm(TOK)) w4ax_ws_kernel(const __grid_constant__ params p,
                                                                const __grid_constant__ CUtensorMap tmap_a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int KS = 64 * KPB, A_BYTES = TOK * KS, W_BYTES = (WS_ROWS / 16) * KPB * 512;
    constexpr int ST = ws_stages(KPB, TOK), STAGE = ws_stage_bytes(KPB, TOK), NACC = TOK / 2;
    /* registers per thread after setmaxnreg: at one CTA per SM 168 at launch, 128 x 40 + 256 x
     * 232 <= 65536; at two, 80 at launch (384 x 80 per CTA), 128 x 24 + 256 x 104 <= 30720; at
     * three, 56 at launch, 128 x 24 + 256 x 72 = 384 x 56 */
    constexpr int CPS = ws_ctas_per_sm(TOK);
    constexpr int PRODUCER_REGS = CPS == 1 ? 40 : 24;
    constexpr int CONSUMER_REGS = CPS == 1 ? 232 : CPS == 2 ? 104 : 72;
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= WS_THREADS * (65536 / (WS_THREADS * CPS) / 8 * 8),
                  "setmaxnreg asks for more registers than the launch gives the CTA");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + ST * STAGE), *empty = full + ST;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* tile id -> first token t0 and first 16-row weight slice nt0; grouped raster: WS_GROUP
     * token tiles x all weight tiles, token tile fastest */
    auto tile_origin = [&](int id, int &t0, int &nt0) {
        const int group = id / (WS_GROUP * p.tiles_n), first_m = group * WS_GROUP;
        const int gm = min(p.tiles_m - first_m, WS_GROUP), in = id % (WS_GROUP * p.tiles_n);
        t0 = (first_m + in % gm) * TOK, nt0 = (in / gm) * (WS_ROWS / 16);
    };
    const int np16 = p.Np / 16, k64 = p.K / 64;
    /* The CTA's work as segments f(tile, b0, b1), blocks [b0, b1) of one tile. Split-K: one
     * segment, tile blockIdx.x, split blockIdx.z. Stream-K (SK): the CTA's share
     * [W c / G, W (c + 1) / G) of all W = tiles x nb blocks, tile after tile. */
    auto for_each_segment = [&](auto &&f) {
        if constexpr (!SK) {
            const int s = blockIdx.z;
            f((int)blockIdx.x, s * p.nb / p.S, (s + 1) * p.nb / p.S);
        } else if (p.persist) { /* persistent: whole tiles, a wave's worth of consecutive ids at a time */
            for (int tile = blockIdx.x; tile < p.tiles_n * p.tiles_m; tile += gridDim.x)
                f(tile, 0, p.nb);
        } else {
            const long long W = (long long)p.tiles_n * p.tiles_m * p.nb;
            const long long r1 = W * (blockIdx.x + 1) / gridDim.x;
            for (long long w = W * blockIdx.x / gridDim.x; w < r1;) {
                const int tile = (int)(w / p.nb), b0 = (int)(w % p.nb);
                const int b1 = (int)min((long long)p.nb, b0 + (r1 - w));
                f(tile, b0, b1);
                w += b1 - b0;
            }
        }
    };

    pdl_trigger(); /* triggering after the consumers' K loop instead measured the same (session 10) */
    if (tid == 0) {
        for (int i = 0; i < ST; i++)
            mbar_init(&full[i], 33), mbar_init(&empty[i], WS_RELEASE_ARRIVALS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) { /* producer warpgroup */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (warp != 0) {
            if (CL && p.S > 1) {
                cluster_sync();
                cluster_sync();
            }
            return;
        }
        /* ablate & 8: the first TOK / 2 token rows only (the tensor map's box is halved);
         * ablate & 16: no token or weight copies (the consumers compute on stale stages) */
        constexpr bool HALF_A = ABL & 8, NO_COPY = ABL & 16;
        { /* the first segment's first weights into L2, then wait for the previous kernel */
            bool first = p.pdl;
            for_each_segment([&](int tile, int b0, int b1) {
                if (!first)
                    return;
                first = false;
                int t0, nt0;
                tile_origin(tile, t0, nt0);
                if (lane < min(WS_ROWS / 16, np16 - nt0))
                    l2_prefetch(p.qw + ((size_t)(nt0 + lane) * k64 + (size_t)b0 * KPB) * 512,
                                min((unsigned)(b1 - b0) * KPB * 512u, pdl_prefetch_per_slice(WS_ROWS / 16)));
            });
            pdl_wait();
        }
        int q = 0; /* stage sequence number, over all segments */
        for_each_segment([&](int tile, int b0, int b1) {
            int t0, nt0;
            tile_origin(tile, t0, nt0);
            const int nvalid = min(WS_ROWS / 16, np16 - nt0);
            const unsigned tx = NO_COPY ? 0u : (HALF_A ? A_BYTES / 2 : A_BYTES) + nvalid * KPB * 512;
            const uint8_t *wsrc = p.qw + ((size_t)(nt0 + (lane < nvalid ? lane : 0)) * k64 + (size_t)b0 * KPB) * 512;
            for (int b = b0; b < b1; b++, q++) {
                const int slot = q % ST;
                if (q >= ST)
                    mbar_wait(&empty[slot], ((q / ST) - 1) & 1);
                uint8_t *st = smem + slot * STAGE;
                if (lane == 0) {
                    mbar_arrive_expect_tx(&full[slot], tx);
                    if (!NO_COPY)
                        tma_load_2d(st, &tmap_a, b * KS, t0, &full[slot]);
                }
                __syncwarp();
                if (!NO_COPY && lane < nvalid)
                    bulk_load(st + A_BYTES + lane * KPB * 512, wsrc + (size_t)(b - b0) * KPB * 512, KPB * 512,
                              &full[slot]);
                constexpr int SA_PER_LANE = (TOK + 31) / 32; /* 16-token tiles: lanes 0-15 */
#pragma unroll
                for (int j = 0; j < SA_PER_LANE; j++) {
                    const int tt = lane * SA_PER_LANE + j, t = t0 + tt;
                    if (!(ABL & 4) && tt < TOK)
                        cp_async4(st + A_BYTES + W_BYTES + tt * 4, p.sa + (size_t)(t < p.M ? t : 0) * p.nb + b,
                                  t < p.M);
                }
                cp_async_mbar_arrive(&full[slot]);
            }
        });
        cp_async_wait<0>();
        __syncwarp();
        if (CL && p.S > 1) { /* every thread of the cluster takes part in its two barriers */
            cluster_sync();
            cluster_sync();
        }
        return;
    }

    /* consumers: warp cw (0..7) owns weight rows [16*(nt0 + cw), +16) */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    pdl_wait(); /* the consumers write the outputs and the workspace */
    const int ctid = tid - 128, cw = ctid >> 5, g = lane >> 2, tq = lane & 3;
    /* the current segment: tile origin, this thread's first weight row, blocks [b0, b0 + nblk) */
    int t0 = 0, nt0 = 0, nrow = 0, b0 = 0, nblk = 0;
    bool row_ok = false;
    const uint16_t *sw_src = p.sw;
    float acc[NACC];
    int sink = 0; /* ablate & 1 only */
    /* Fold the int32 sums dd of block b0 + x (stage q) into acc. */
    auto promote = [&](const int (&dd)[NACC], int q, int x, float sw0, float sw1) {
        const uint8_t *st = smem + (q % ST) * STAGE;
        const float *ss = reinterpret_cast<const float *>(st + A_BYTES + W_BYTES);
        if (!(ABL & 1)) {
#pragma unroll
            for (int j = 0; j < TOK / 8; j++) {
                float2 sa2 = *reinterpret_cast<const float2 *>(ss + 8 * j + 2 * tq);
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    /* ablate & 64: no scale product; & 32: no int32 -> fp32 conversion (a bit cast) */
                    const float sa = (r & 1) ? sa2.y : sa2.x, sc = (ABL & 64) ? sa : sa * ((r >> 1) ? sw1 : sw0);
                    const float df = (ABL & 32) ? __int_as_float(dd[j * 4 + r]) : (float)dd[j * 4 + r];
                    acc[j * 4 + r] = fmaf(df, sc, acc[j * 4 + r]);
                    if (BSUM) {
                        int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;
                        if (t < p.M && n < p.N)
                            p.bsum[((size_t)t * p.N + n) * p.nb + b0 + x] = dd[j * 4 + r] >> 4;
                    }
                }
            }
        } else {
            /* no promotion: an XOR fold keeps the sums live (NACC LOP3), else ptxas drops the
             * wgmma that produce them as well (it did until session 5). Eight chains: the
             * single NACC-long chain of sessions 5-6 cost ~300 cycles of latency per block and
             * made the data-only instance look like the floor of the kernel (session 7). */
            int fold[8] = {};
#pragma unroll
            for (int i = 0; i < NACC; i++)
                fold[i & 7] ^= dd[i];
#pragma unroll
            for (int i = 0; i < 8; i++)
                sink ^= fold[i];
        }
    };
    /* every consumer thread is done with stage q */
    auto release = [&](int q) { mbar_arrive(&empty[q % ST]); };
    /* The segment's tile (acc) through shared memory at red, token-major in rows of WS_RED_LD
     * floats, stored four columns at a time, contiguous in y. The first barrier holds the writes
     * until both consumer warpgroups are done with what red held (stages, or the last tile). */
    auto store_tile_staged = [&](float *red) {
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        store_acc_tile_t<TOK / 8>(red, 0, cw * 16, WS_RED_LD, *reinterpret_cast<float(*)[TOK / 8][4]>(acc), g, tq);
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        const int rv = min(TOK, p.M - t0), n0 = nt0 * 16;
        const bool out4 = out4_ok(p);
        for (int i = ctid; i < rv * (WS_ROWS / 4); i += 256) {
            const int row = i / (WS_ROWS / 4), c = (i % (WS_ROWS / 4)) * 4;
            store_out4(p, t0 + row, n0 + c, *reinterpret_cast<const float4 *>(red + row * WS_RED_LD + c), out4);
        }
    };
    /* Weight scales (/16 for the x16 trick) of blocks x .. x+SWD-1 in registers: each is
     * loaded SWD blocks ahead of its use. Loaded in the step itself, the scale's DRAM latency
     * was exposed once per block (the sw rows of successive blocks are Np apart). */
    constexpr int SWD = 4;
    unsigned short swq[SWD][2] = {};
    auto load_sw = [&](int x, unsigned short (&w)[2]) {
        const bool ok = row_ok && x < nblk;
        const uint16_t *q = sw_src + (size_t)(b0 + (ok ? x : 0)) * p.Np;
        w[0] = ok ? ld_sw(q) : 0;
        w[1] = ok ? ld_sw(q + 8) : 0;
    };
    /* the weight scales of block x (/16), advancing the look-ahead queue */
    auto next_sw = [&](int x, float &sw0, float &sw1) {
        sw0 = f16f(swq[0][0]) * 0.0625f, sw1 = f16f(swq[0][1]) * 0.0625f;
#pragma unroll
        for (int i = 0; i + 1 < SWD; i++)
            swq[i][0] = swq[i + 1][0], swq[i][1] = swq[i + 1][1];
        load_sw(x + SWD, swq[SWD - 1]);
    };
    /* wait for stage q and unpack its weight fragments (A, x16 trick) */
    auto load_a = [&](int q, uint32_t (&af)[KPB][2][4]) {
        const int slot = q % ST;
        const uint8_t *st = smem + slot * STAGE;
        mbar_wait(&full[slot], (q / ST) & 1);
#pragma unroll
        for (int c = 0; c < KPB; c++) {
            uint4 wf = *reinterpret_cast<const uint4 *>(st + A_BYTES + (cw * KPB + c) * 512 + lane * 16);
            af[c][0][0] = lo16x(wf.x), af[c][0][1] = hi16x(wf.x), af[c][0][2] = lo16x(wf.y), af[c][0][3] = hi16x(wf.y);
            af[c][1][0] = lo16x(wf.z), af[c][1][1] = hi16x(wf.z), af[c][1][2] = lo16x(wf.w), af[c][1][3] = hi16x(wf.w);
        }
    };
    /* stage q's 2*KPB wgmma into dd, one commit group; serial: each committed and waited for in
     * turn, all complete on return */
    auto issue = [&](int q, const uint32_t (&af)[KPB][2][4], int (&dd)[NACC], bool serial = false) {
        const uint32_t b_base = smem_u32(smem + (q % ST) * STAGE);
        if (!(ABL & 2)) {
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int c = 0; c < KPB; c++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if constexpr (TOK == 128)
                        wgmma_128(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                                  smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                    else if constexpr (TOK == 64)
                        wgmma_64(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                                 smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                    else if constexpr (TOK == 16)
                        wgmma_16(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                                 smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                    else
                        wgmma_32(dd, af[c][h][0], af[c][h][1], af[c][h][2], af[c][h][3],
                                 smem_desc<KPB>(b_base + (c * 2 + h) * 32), c | h);
                    if (serial) { /* this one done before the next (and on return) */
                        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                    }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); /* (empty when serial) */
        } else {
#pragma unroll
            for (int i = 0; i < NACC; i++) /* stand-in sums that depend on the unpacked A */
                dd[i] = (int)(af[0][0][i & 3] >> (i >> 2));
        }
    };
    int q = 0; /* stage sequence number, over all segments */
    for_each_segment([&](int tile, int sb0, int sb1) {
    tile_origin(tile, t0, nt0);
    nrow = (nt0 + cw) * 16 + g, row_ok = nrow < p.Np, sw_src = p.sw + (row_ok ? nrow : 0);
    b0 = sb0, nblk = sb1 - sb0;
#pragma unroll
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < SWD; i++)
        load_sw(i, swq[i]);
    if constexpr (WS_NEXT_FIRST && (TOK == 32 || (TOK == 16 && KPB == 2))) {
        /* Block x + 1's stage wait, fragments and wgmma (each committed and waited for in
         * turn) before block x's promotion and release: two sets of sums and of fragments,
         * unrolled by two blocks. This is the form measured (WS_NEXT_FIRST above), wait_group
         * barriers included (no wgmma is pending at them); a loop of two-block steps with one
         * set of fragments and without them measured 1.004x the one-block loop. */
        int da[NACC], db[NACC];
        uint32_t afa[KPB][2][4], afb[KPB][2][4];
        auto finish = [&](const int (&dd)[NACC], int x) { /* block x, stage q: promote, release */
            float sw0, sw1;
            next_sw(x, sw0, sw1);
            promote(dd, q, x, sw0, sw1);
            release(q);
            q++;
        };
        if (nblk > 0) {
            int x = 0;
            load_a(q, afa);
            issue(q, afa, da, true);
            for (; x + 2 < nblk; x += 2) {
                load_a(q + 1, afb);
                issue(q + 1, afb, db, true);
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                finish(da, x);
                load_a(q + 1, afa);
                issue(q + 1, afa, da, true);
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                finish(db, x + 1);
            }
            if (x + 1 < nblk) {
                load_a(q + 1, afb);
                issue(q + 1, afb, db, true);
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                finish(da, x);
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                finish(db, x + 1);
            } else {
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                finish(da, x);
            }
        }
    } else {
        /* one block at a time: A from registers, issue, wait, promote, release */
        int d[NACC];
        for (int x = 0; x < nblk; x++, q++) {
            float sw0, sw1;
            next_sw(x, sw0, sw1);
            uint32_t af[KPB][2][4];
            load_a(q, af);
            issue(q, af, d);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            promote(d, q, x, sw0, sw1);
            release(q);
        }
    }

    if (ABL & 1)
        acc[0] += (float)sink;

#define W4AX_WS_FOR_EACH(BODY)                                                       \
    _Pragma("unroll") for (int j = 0; j < TOK / 8; j++)                              \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                  \
        int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;              \
        if (t < p.M && n < p.N) { BODY; }                                            \
    }
    if constexpr (SK) {
        if (nblk < p.nb) {
            /* A part of the tile. A CTA has at most two such pieces, its first and its last
             * segment: it leaves each in its own workspace slot (0 / 1), and the last of the
             * tile's CTAs to finish sums them in K order (CTA order) from 0.0f. */
            const long long W = (long long)p.tiles_n * p.tiles_m * p.nb, G = gridDim.x, w0 = (long long)tile * p.nb;
            auto cta_of = [&](long long w) { /* the CTA whose share holds block w */
                long long c = w * G / W;
                while (c + 1 < G && W * (c + 1) / G <= w)
                    c++;
                while (c > 0 && W * c / G > w)
                    c--;
                return (int)c;
            };
            auto piece = [&](int c) { /* CTA c's slot for this tile */
                const int first_tile = (int)(W * c / G / p.nb);
                return p.part + ((size_t)c * 2 + (first_tile == tile ? 0 : 1)) * (256 * NACC);
            };
            float *mine = piece(blockIdx.x);
#pragma unroll
            for (int i = 0; i < NACC; i++)
                mine[i * 256 + ctid] = acc[i];
            const int c0 = cta_of(w0), c1 = cta_of(w0 + p.nb - 1);
            if (!splitk_last_consumers(p, ctid, tile, c1 - c0 + 1))
                return;
#pragma unroll
            for (int i = 0; i < NACC; i++)
                acc[i] = 0.0f;
            for (int c = c0; c <= c1; c++) {
                const float *pc = piece(c);
#pragma unroll
                for (int i = 0; i < NACC; i++)
                    acc[i] += __ldcg(pc + i * 256 + ctid);
            }
        } else if (COMET_WS_PERSIST_STAGED && p.persist) {
            /* A persistent CTA's whole tile, stored as the S = 1 path below does but through its
             * own staging area past the ring (the producer is already filling the ring with the
             * next tile's blocks): the first barrier keeps this tile's writes behind the other
             * warpgroup's reads of the previous one. */
            store_tile_staged(reinterpret_cast<float *>(smem + ws_persist_staging_offset(KPB, TOK)));
            return;
        }
        W4AX_WS_FOR_EACH(store_out(p, t, n, acc[j * 4 + r]))
        return;
    }
    if (p.S == 1) {
        if constexpr (TOK == 128) {
            /* The tile through the (now idle) stage memory, token-major as the cluster
             * reduction's below, stored four columns at a time, contiguous in y (session 16:
             * 0.985x the time at M = 512-8192; at 32-token tiles 1.07x on 70B gate_up, M = 24) */
            store_tile_staged(reinterpret_cast<float *>(smem)); /* the stages are idle: the last segment */
        } else {
            W4AX_WS_FOR_EACH(store_out(p, t, n, acc[j * 4 + r]))
        }
        return;
    }
    if constexpr (CL) {
        /* The S splits of this tile are one cluster (dims 1 x 1 x S). Each CTA leaves its
         * fp32 tile in its own (now idle) stage memory, token-major with rows of WS_RED_LD
         * floats (conflict-free stores); CTA rank q then sums token rows [q*rv/S, (q+1)*rv/S)
         * of the S tiles through distributed shared memory, four columns per load, in split
         * order from 0.0f (the additions of the global path, so the same bits). */
        float *red = reinterpret_cast<float *>(smem);
        asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* both warpgroups are done with the stages */
        store_acc_tile_t<TOK / 8>(red, 0, cw * 16, WS_RED_LD, *reinterpret_cast<float(*)[TOK / 8][4]>(acc), g, tq);
        cluster_sync();
        const int q = (int)cluster_rank(), rv = min(TOK, p.M - t0);
        const bool out4 = out4_ok(p);
        const int r0 = q * rv / p.S, r1 = (q + 1) * rv / p.S, n0 = nt0 * 16;
        for (int i = ctid; i < (r1 - r0) * (WS_ROWS / 4); i += 256) {
            const int row = r0 + i / (WS_ROWS / 4), c = (i % (WS_ROWS / 4)) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int j = 0; j < p.S; j++) {
                float4 x = ld_dsmem4(red + row * WS_RED_LD + c, j);
                v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
            }
            store_out4(p, t0 + row, n0 + c, v, out4);
        }
        cluster_sync(); /* no CTA leaves while another still reads its shared memory */
    } else {
        W4AX_WS_FOR_EACH(p.part[((size_t)blockIdx.z * p.M + t) * p.N + n] = acc[j * 4 + r])
        if (!splitk_last_consumers(p, ctid, blockIdx.x, p.S))
            return;
        /* EB elements at a time, split-outer: EB loads in flight, each element still summed in
         * split order from 0.0f (fewer at two or three CTAs per SM: 16 spilled at 104 registers) */
        constexpr int EB = CPS == 1 ? 16 : 4;
#pragma unroll
        for (int jc = 0; jc < TOK / 8; jc += EB / 4) {
            float v[EB];
#pragma unroll
            for (int e = 0; e < EB; e++)
                v[e] = 0.0f;
            for (int j2 = 0; j2 < p.S; j2++)
#pragma unroll
                for (int e = 0; e < EB; e++) {
                    int t = t0 + 8 * (jc + e / 4) + 2 * tq + (e & 1), n = nrow + ((e >> 1) & 1) * 8;
                    if (t < p.M && n < p.N)
                        v[e] += __ldcg(&p.part[((size_t)j2 * p.M + t) * p.N + n]);
                }
#pragma unroll
            for (int e = 0; e < EB; e++) {
                int t = t0 + 8 * (jc + e / 4) + 2 * tq + (e & 1), n = nrow + ((e >> 1) & 1) * 8;
                if (t < p.M && n < p.N)
                    store_out(p, t, n, v[e]);
            }
        }
    }
    });
#undef W4AX_WS_FOR_EACH
#elif defined(__CUDA_ARCH__)
    /* Code for any other target has no body: has_wgmma() (which tells the two apart by this
     * body's registers) keeps plans off this kernel there, so reaching it is a bug that must
     * not pass for a result (y would be left unwritten). */
    __trap();
#endif
}

/* ---- host side: plans and launch ---- */

constexpr int STREAM_WARPS = 4;
constexpr int STREAM_MAX_RANGE = 2048; /* bytes of K per CTA (bounds shared memory) */
constexpr int STREAM_MAX_CLUSTER = 8;  /* portable cluster size */
constexpr int WS_MAX_CLUSTER = 8;
/* Wave-filling global split-K (make_plan): the per-CTA fixed cost (start-up, pipeline fill,
 * epilogue) in units of one block's time, and the most splits considered. */
constexpr int WS_CTA_COST = 2, WS_MAX_GLOBAL_SPLITS = 16;
/* Stream-K (make_plan): a CTA's cost of its partial tiles in blocks, the percent of the other
 * plan's modelled time it must reach, and the most waves of 128-token tiles it is tried for. */
constexpr int WS_SK_COST = 12, WS_SK_GAIN = 90, WS_SK_MAX_WAVES = 4;
#ifndef COMET_WS_GLOBAL_GAIN /* percent of the cluster plan's modelled time (make_plan) */
#define COMET_WS_GLOBAL_GAIN 90
#endif

struct plan_t {
    comet_w4ax_kernel kernel;
    int MI, S;
    int tok; /* wgmma: tokens per CTA tile (16, 32, 64 or 128) */
    int tiles_n, tiles_m;
    int pp_depth, pp_rows, pp_ctas; /* pipe: ring slots per warp, token rows per slot, CTAs per SM */
    int pp_tiles;                   /* pipe: 16-row weight tiles per item (1..PP_MAX_TILES) */
    int pp_early;                   /* pipe, with pdl only: positions whose weights go before the wait */
    bool cluster; /* stream: the S splits of a tile form a cluster and reduce on chip */
    bool streamk; /* wgmma: one CTA per SM, each with an equal share of tiles x blocks */
    bool persist; /* wgmma, 128-token tiles past one wave: one CTA per SM, whole tiles in turn */
    bool pdl;     /* launch with programmatic stream serialization (g->pdl where pdl_supported) */
    int carveout; /* shared memory asked of each SM, % of its maximum (a launch hint); 0: none */
    dim3 grid, block;
    size_t smem, ws_bytes;
};


/* Devices whose properties the host code caches (per-device tables; a device past this is
 * asked again on every call). */
constexpr int MAX_DEV = 16;

/* The current device's ordinal, or -1 (error cleared) when there is none. */
int current_device()
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); /* clear */
        return -1;
    }
    return dev;
}

/* An attribute of the current device (SM count, compute capability major, shared memory per
 * SM and per block with opt-in), cached per device (the plans ask for them on every call);
 * `fallback` when the query fails. */
int device_attr(cudaDeviceAttr attr, int fallback)
{
    static const cudaDeviceAttr kinds[] = {cudaDevAttrMultiProcessorCount, cudaDevAttrComputeCapabilityMajor,
                                           cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                           cudaDevAttrMaxSharedMemoryPerBlockOptin};
    constexpr int NK = sizeof kinds / sizeof kinds[0];
    static std::mutex mu;
    static int cache[MAX_DEV][NK];
    int v = 0, k = 0;
    while (k < NK - 1 && kinds[k] != attr)
        k++;
    const int dev = current_device();
    if (dev < 0)
        return fallback;
    if (dev < MAX_DEV && kinds[k] == attr) {
        std::lock_guard<std::mutex> lock(mu);
        if (cache[dev][k] == 0 && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess && v > 0)
            cache[dev][k] = v;
        v = cache[dev][k];
    } else if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
        v = 0;
    }
    if (v < 1)
        cudaGetLastError();
    return v > 0 ? v : fallback;
}

int sm_count() { return device_attr(cudaDevAttrMultiProcessorCount, 132); }

/* Tile counters at the start of the workspace; partials follow. The counter region has the
 * same size, WS_COUNTERS, in every plan: a workspace is shared by the calls of a stream (the
 * CUDA backend keeps one), and with a region sized per plan one call's partials landed on
 * the next call's counters (LLaMA-3-8B down and qkv at M = 384, both stream-K: qkv's tiles
 * 128-143 were never stored, found in review, session 8). A plan with more tiles than that
 * gets a larger region, which comet_cuda_gemm_w4ax zeroes before the launch. */
constexpr size_t WS_COUNTERS = 1 << 16;
size_t counters_needed(const plan_t &pl)
{
    return pl.streamk ? (size_t)pl.tiles_n * pl.tiles_m : (size_t)pl.grid.x * pl.grid.y;
}
size_t counter_bytes(const plan_t &pl)
{
    const size_t n = counters_needed(pl);
    return ((n > WS_COUNTERS ? n : WS_COUNTERS) * sizeof(unsigned) + 255) / 256 * 256;
}

/* test(attributes of `kernel` on the current device), cached per device in `known` (0 not
 * read yet, 1 true, 2 false); cudaFuncGetAttributes makes no copy and does not synchronize,
 * so this is safe while a CUDA graph is being captured. A failed query is not cached and
 * reads as false. */
template <typename T>
bool device_code_has(std::mutex &mu, int (&known)[MAX_DEV], const void *kernel, T &&test)
{
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    if (dev >= 0 && dev < MAX_DEV && known[dev])
        return known[dev] == 1;
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
        cudaGetLastError(); /* clear */
        return false;
    }
    const bool yes = test(a);
    if (dev >= 0 && dev < MAX_DEV)
        known[dev] = yes ? 1 : 2;
    return yes;
}

/* The wgmma kernel runs here: an sm_90 device that loaded this file's sm_90a code. A build
 * for plain sm_90 (CMAKE_CUDA_ARCHITECTURES=90 or native) or sm_80 alone gives that kernel
 * no body (a trap); the plans then use the stream and tiled kernels (sm_80 rules), and
 * forcing the wgmma kernel is refused. Which code the device loaded shows in the kernel's
 * registers, read with cudaFuncGetAttributes (no copy, no synchronization: safe while a CUDA
 * graph is being captured): the instance asked, 128-token tiles at B = 128, holds 168 per
 * thread in sm_90a code (launch bounds: one CTA of 384 threads, the whole register file),
 * the trap 4 (24 in a -G debug build). Cached per device (device_code_has); a failed query
 * plans as without sm_90a code. */
constexpr int WS_MIN_REGS = 96;
bool has_wgmma()
{
    if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) != 9)
        return false;
    static std::mutex mu;
    static int known[MAX_DEV];
    return device_code_has(mu, known, (const void *)w4ax_ws_kernel<2, 128, false>,
                           [](const cudaFuncAttributes &a) { return a.numRegs >= WS_MIN_REGS; });
}

/* Whether this device runs kernels of this file that hold the programmatic-dependent-launch
 * instructions (pdl_trigger / pdl_wait exist from sm_90 code on): the device must be sm_90 or
 * newer AND the loaded code compiled for it. A "90a;80" build on a newer GPU runs the
 * compute_80 PTX, JIT-compiled, which has no wait: launched early it would race. Read from a
 * kernel's PTX version, cached per device (device_code_has). */
bool pdl_supported()
{
    if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) < 9)
        return false;
    static std::mutex mu;
    static int known[MAX_DEV];
    return device_code_has(mu, known, (const void *)w4ax_decode_kernel<1, 1, false>,
                           [](const cudaFuncAttributes &a) { return a.ptxVersion >= 90; });
}

int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The most dynamic shared memory any plan asks of one CTA (the wgmma kernel's rings, the
 * decode kernel's token rows, the pipe kernel's ring budget at one CTA per SM): static_asserts,
 * plan_decode and plan_pipe hold the plans to it. The persistent wgmma plans alone go past it,
 * to at most MAX_SMEM_SM90 (they exist on sm_90 only, whose opt-in limit is 227 KB). Raising
 * MAX_SMEM itself deepens the pipe kernel's rings at one CTA per SM, which measured slower
 * (session 13; session 19 did so by mistake for one run: the 8B chain at M = 12-16 ran 2.98x FP16
 * against 3.09x, bench/results/2026-12-03-h200-gemm-s19.md). */
constexpr int MAX_SMEM = 160 * 1024, MAX_SMEM_SM90 = 227 * 1024;

/* Allow `kernel` `bytes` of dynamic shared memory on the current device. Above 48 KB this
 * must be set per kernel and per device (the attribute lives in the device's context), and
 * it may not exceed the device's opt-in limit (227 KB on sm_90, 163 KB on sm_80, 99 KB on
 * sm_86 / 89 / 120). The largest value set is remembered per (device, kernel). */
cudaError_t allow_smem(const void *kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    struct entry {
        int dev;
        const void *kernel;
        size_t bytes;
    };
    static std::mutex mu;
    static entry done[1024]; /* 137 kernel instances per device today */
    static int n_done = 0;
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    int i = 0;
    while (i < n_done && !(done[i].dev == dev && done[i].kernel == kernel))
        i++;
    if (i < n_done && done[i].bytes >= bytes)
        return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return e;
    if (i < n_done)
        done[i].bytes = bytes;
    else if (n_done < 1024)
        done[n_done++] = entry{dev, kernel, bytes};
    return cudaSuccess;
}

/* Shared memory of one SM (bytes), for sizing the pipe kernel's rings. */
int sm_smem_bytes() { return device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 228 * 1024); }


/* Where the automatic plan runs the pipe kernel (sm_90), measured on the H200 in same-run A/Bs
 * (CUDA graphs with pdl, 8 LLaMA-3 shapes; bench/results/2026-12-02-h200-gemm-s13). Below one
 * 16-row tile per SM the stream kernel's split-K is needed. Since items hold several weight
 * tiles that share one copy of the token rows (session 13; before, the pipe kernel won at
 * M = 9-16 only up to 3 tiles per SM and lost to the wgmma kernel's 16- and 32-token tiles
 * above), it takes 0.71-0.98x the time of session 12's plan at M = 12-16 on all 8 shapes (the
 * wgmma kernel on the 70B shapes and the gate_ups, one-tile pipe items on 8B qkv, o and down),
 * and at M = 17-32 0.72-0.84x the wgmma kernel's on the two with N/16 <= 2x the SMs (8B o and
 * down; 8B qkv, at 2.9x, 1.12x with its best tile count). At M = 17-32 the items are two
 * 16-token groups, so each weight tile is read twice (32-token items were slower: 1.13-1.30x).
 * Not measured: more than 27 tiles per SM (70B gate_up), e.g. an lm_head, where the rule
 * extrapolates. */
constexpr int PP_AUTO_M32_MAX_TILES_PER_SM = 2;
bool pipe_auto(int M, int np16, int sms)
{
    return np16 >= sms && (M <= 16 || (M <= 32 && np16 <= PP_AUTO_M32_MAX_TILES_PER_SM * sms));
}

/* The pipe kernel's CTAs per SM for `items` work items: ceil(items / SMs) (one item per CTA)
 * when that many CTAs fit on an SM (cmax), else the value from 2 up to cmax that minimizes the
 * largest share (ties: more CTAs, more warps streaming); with its items per SM (the share). */
struct pp_spread {
    int ctas;
    long share;
};
pp_spread pp_spread_items(long items, int cmax, int sms)
{
    const long need = (items + sms - 1) / sms;
    if (need <= cmax)
        return {(int)need, need};
    pp_spread best = {cmax, -1};
    for (int k = cmax < 2 ? cmax : 2; k <= cmax; k++) {
        const long share = (items + (long)sms * k - 1) / ((long)sms * k) * k;
        if (best.share < 0 || share <= best.share)
            best = {k, share};
    }
    return best;
}

/* The pipe kernel's plan: weight tiles per item (PT), CTAs per SM and ring depth. Items (PT
 * 16-row tiles x a token group of 8 MI) are dealt to CTAs round robin (pp_spread_items); each
 * warp's ring then gets its part of the SM's shared memory split c ways (at most PP_MAX_DEPTH
 * slots). The automatic PT (session 13, same-run A/B of PT = 1-4 forced, CUDA graphs with pdl,
 * 8 LLaMA-3 shapes): at M <= 8, 2 -- 0.86-0.90x the time of PT = 1 at M = 1-8 (geomean),
 * per shape within 6 % of the best PT (geomean over M; up to 10 % at single points, where 3 or
 * 4 won); from M = 9 (16-token groups), of PT = 2-4 the one whose busiest SM gets the fewest
 * weight tiles, ties to more tiles per item: the fastest of PT = 1-4 on all 8 shapes at M = 12
 * (e.g. 70B qkv: 3, 6 tiles on the busiest SM against 8 with PT = 2, 0.80 against 0.92x the
 * time of session 12's plan), on 6 of 8 at M = 16 (PT = 3 cost 1.03x on 70B qkv and 1.04x on
 * 8B gate_up). PT = 1 is left out there: its 16 token rows fill most of each ring slot, and it
 * took 1.3-1.8x the time of PT = 2 at M = 12-16 (8B gate_up, which the tile count alone would
 * give PT = 1: 1.21 / 1.33x the wgmma kernel's time at M = 12 / 16) -- unless it halves the
 * busiest SM's tiles (fewer items than SMs otherwise: N/16 below ~1.5x the SMs, no LLaMA-3
 * shape; not measured). */
constexpr int PP_AUTO_TILES_M8 = 2;
/* Token groups of 8 (MI = 1) up to this M. -DCOMET_PP_MI1_MAX_M=16 runs M = 9-16 as two
 * 8-token groups (twice the items, each weight tile read twice): 1.33-1.42x the time of
 * 16-token items with PT = 2, 1.25-1.46x over PT = 2-4, CUDA graphs with pdl, 8 LLaMA-3
 * shapes (session 14). */
#ifndef COMET_PP_MI1_MAX_M
#define COMET_PP_MI1_MAX_M 8
#endif
void plan_pipe(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16, int sms)
{
    pl.MI = g->M <= COMET_PP_MI1_MAX_M ? 1 : 2;
    const int tt = 8 * pl.MI, reserve = 1024, smem_sm = sm_smem_bytes();
    pl.tiles_m = (g->M + tt - 1) / tt;
    pl.pp_rows = g->M < tt ? g->M : tt;
    /* items, slot bytes per CTA, CTAs per SM and their spread for PT tiles per item */
    auto items_of = [&](int pt) { return (long)((np16 + pt - 1) / pt) * pl.tiles_m; };
    auto slot_of = [&](int pt) { return PP_WARPS * pp_slot_bytes(pl.pp_rows, pt); };
    auto spread_of = [&](int pt) {
        int cmax = pp_max_ctas(pt, pl.MI);
        while (cmax > 1 && smem_sm / cmax - reserve < pp_red_bytes(pl.MI, pt) + 2 * slot_of(pt))
            cmax--;
        return pp_spread_items(items_of(pt), cmax, sms);
    };
    int pt = g->pipe_tiles;
    if (pt == 0) {
        auto busiest = [&](int t) { return spread_of(t).share * t; }; /* tiles on the busiest SM */
        long best = -1;
        pt = 1;
        if (pl.MI == 1 && np16 >= PP_AUTO_TILES_M8) {
            pt = PP_AUTO_TILES_M8, best = busiest(pt);
        } else if (pl.MI > 1) {
            for (int t = 2; t <= PP_MAX_TILES && t <= np16; t++) {
                const long tiles = busiest(t);
                if (best < 0 || tiles <= best)
                    best = tiles, pt = t;
            }
        }
        /* one tile per item where that halves the busiest SM's tiles: fewer items than SMs
         * otherwise (N/16 below ~1.5x the SMs; no LLaMA-3 shape, not measured) */
        if (best > 0 && 2 * busiest(1) <= best)
            pt = 1;
    }
    const long items = items_of(pt);
    const int slot = slot_of(pt), fixed = pp_red_bytes(pl.MI, pt), c = spread_of(pt).ctas;
    int budget = smem_sm / c - reserve;
/* -DCOMET_PP_BUDGET_OPTIN=1 lets a CTA alone on its SM take the device's opt-in limit (227 KB
 * on the H200, past MAX_SMEM) for deeper rings: measured 1.02x slower, up to 1.18x on 8B qkv at
 * M = 12-16 (session 13, bench/results/2026-12-02-h200-gemm-s13.md section 3) */
#if COMET_PP_BUDGET_OPTIN
    const int cap = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM);
#else
    const int cap = MAX_SMEM;
#endif
    budget = budget < cap ? budget : cap;
    pl.pp_tiles = pt;
    pl.pp_depth = clampi((budget - fixed) / slot, 2, PP_MAX_DEPTH);
    pl.pp_ctas = c;
    pl.grid = dim3((unsigned)(items < (long)sms * c ? items : (long)sms * c), 1, 1);
    /* A ring deeper than a warp's work has nothing to overlap: all of it is in flight at once
     * and the compute runs after the last bytes land. Where one CTA runs per SM and its warps
     * have P ring positions each (items x positions per item), the ring is held to P - 1 slots
     * at 8-token groups (at least 3) and P / 2 at 16 (at least 2). With pdl, the weights of the
     * first pp_early positions go out before the wait; they share the first position's cp.async
     * group (kernel above), so at 16-token groups only one does. Same-run A/Bs (session 17, CUDA
     * graphs with pdl, 8 LLaMA-3 shapes, bench/results/2026-12-02-h200-gemm-s17.md; the capped
     * ones are 8B qkv and o, P = 4): the caps take 8B o to 0.85-0.90x the time at M = 1-12 and
     * 8B qkv to 0.97x at M = 12; one early position instead of depth - 1 0.98-0.99x at
     * M = 10-16 (8B down 0.98x), none at all 1.02-1.07x at M = 1-8 and 1.02x at M = 10-16; at
     * 8-token groups one or two cost 1.02x on 8B gate_up (M = 1). Measured only where one CTA
     * runs per SM: with two (8B qkv at M <= 8, ring 4) a cap to 3 measured 0.98-1.01x against
     * none, not separated from other changes, so it is left out there. */
    {
        const long per_cta = (items + pl.grid.x - 1) / pl.grid.x;
        const long P = per_cta * (((g->K / 64 + 1) / 2 + PP_WARPS - 1) / PP_WARPS);
        const long cap_d = pl.MI == 1 ? (P - 1 > 3 ? P - 1 : 3) : (P / 2 > 2 ? P / 2 : 2);
        if (c == 1 && pl.pp_depth > cap_d)
            pl.pp_depth = (int)cap_d;
        pl.pp_early = pl.MI == 1 ? pl.pp_depth - 1 : 1;
    }
    pl.block = dim3(PP_WARPS * 32);
    pl.smem = (size_t)pl.pp_depth * slot + fixed;
    pl.S = 1;
    /* The shared memory of the plan's c CTAs and no more, the rest of the SM's 256 KB left to
     * L1. Without it the driver sizes the split for as many CTAs as the shared memory allows, so
     * a ring of 106 KB got a 228 KB carveout and 28 KB of L1: 8B qkv at M = 12 with a 2-slot ring
     * took 6.30 us (session 16's depth runs), 5.04 with this hint (session 17's), and the whole
     * carveout for shared memory cost 1.03-1.12x the time on 8B o and down at M = 8-16. Session
     * 18 (CUDA graphs with pdl): without the hint at 8-token groups, one shape repeated, 8B o at
     * M = 1-8 (its ring capped) took 1.08-1.14x the time, the others 0.991-1.002x; in a chain of
     * a model's four layers (bench_gemm --chain, each kernel after one with another carveout)
     * 0.99x at M = 1-4 on 8B, and without the hint on any plan 0.99x there but 1.11x at M = 12
     * (70B: 1.00x). The hint on 16-token groups and capped rings only measured the same as on
     * every plan (0.999x, chain 1.00x), so every plan sends it. -DCOMET_PP_CARVEOUT=0 leaves it
     * out (A/B). */
    pl.carveout = COMET_PP_CARVEOUT ? (int)((100L * c * ((long)pl.smem + reserve) + smem_sm - 1) / smem_sm) : 0;
}

/* The decode kernel's plan (no split-K). False when its token rows do not fit in shared
 * memory (K past ~100-125 K at M = 1, ~18 K at M = 8, ~9 K from M = 9 on): the caller then runs
 * the stream kernel. */
bool plan_decode(plan_t &pl, const comet_cuda_w4ax_gemm *g, int np16)
{
    pl.MI = g->M <= 8 ? 1 : 2;
    const int tt = 8 * pl.MI, wt = dk_wt(pl.MI);
    pl.tiles_m = (g->M + tt - 1) / tt;
    pl.S = 1;
    pl.grid = dim3((np16 + wt - 1) / wt, pl.tiles_m, 1);
    pl.block = dim3(DK_WARPS * 32);
    if (g->K > MAX_SMEM) /* dk_layout counts in int */
        return false;
    const dk_layout L(g->M < tt ? g->M : tt, tt, g->K, g->K / g->B, wt);
    pl.smem = (g->ablate & 56) == 56 ? 0 : (size_t)L.bytes; /* profiling: loads only */
    return (size_t)L.bytes <= (size_t)MAX_SMEM;
}

/* The wgmma kernel's token tile by M (and K at M <= 16). 16-token tiles (three CTAs per SM)
 * against 32-token ones (two) at M = 9-16, same-run A/B on the 8 LLaMA-3 shapes (session 8):
 * 0.81-0.91x the time on the 70B shapes (K >= 8192), 1.01-1.10x on the 8B ones with
 * K = 4096, 1.01x on 8B down (K = 14336). */
constexpr int WS_TOK16_MIN_K = 8192;
int ws_auto_tok(int M, int K)
{
    return M <= 16 ? (K >= WS_TOK16_MIN_K ? 16 : 32) : M <= 32 ? 32 : M <= 64 ? 64 : 128;
}

int ws_cluster_capacity(int kpb, int tok, int S);

/* The kernel of the automatic plan. sm_90: where the 16-row tiles at least fill the SMs, the
 * pipe kernel at M <= 16 (and to 32 on narrow shapes: pipe_auto); below one tile per SM the
 * stream kernel's split-K keeps every SM streaming up to M = 8; from M = 9 otherwise the wgmma
 * kernel (profiling ablations at M <= 16 run the stream kernel's instances). sm_80: the stream
 * kernel up to M = 32, then the tiled one.
 * The decode kernel is no longer chosen (tests and benchmarks force it): at M = 1 it was faster
 * than the pipe and stream kernels on every LLaMA shape (0.78-0.96x their time, session 6), and
 * with pdl at M = 2 (session 10); with two weight tiles per pipe item (session 13) the pipe
 * kernel takes 0.93x its time at M = 1 per call (0.87-0.97x on 7 shapes, 70B gate_up 1.03x)
 * and 0.945x in CUDA graphs with pdl (0.84-0.99x on 6 shapes, 1.03 / 1.06x on 70B gate_up / 8B
 * o); at M = 2 the new plan is 0.93x the old one's time both ways. */
comet_w4ax_kernel auto_kernel(const comet_cuda_w4ax_gemm *g, int np16, int sms)
{
    if (!has_wgmma())
        return g->M <= 32 ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_TILED;
    const bool plain = g->splits == 0 && g->ablate == 0;
    if (plain && pipe_auto(g->M, np16, sms))
        return COMET_W4AX_KERNEL_PIPE;
    return g->M <= 8 || (g->M <= 16 && g->ablate) ? COMET_W4AX_KERNEL_STREAM : COMET_W4AX_KERNEL_WGMMA;
}

plan_t make_plan(const comet_cuda_w4ax_gemm *g)
{
    plan_t pl = {};
    const int nb = g->K / g->B, np16 = (g->N + 15) / 16, sms = sm_count();
    /* programmatic dependent launch where the device and the loaded code have it; asked for
     * elsewhere, the call runs as a plain launch */
    const bool pdl = g->pdl && pdl_supported();
    pl.kernel = g->kernel != COMET_W4AX_KERNEL_AUTO ? g->kernel : auto_kernel(g, np16, sms);
    if (pl.kernel == COMET_W4AX_KERNEL_DECODE && !plan_decode(pl, g, np16))
        pl = plan_t{}, pl.kernel = COMET_W4AX_KERNEL_STREAM;
    if (pl.kernel == COMET_W4AX_KERNEL_STREAM) {
        pl.MI = g->M <= 8 ? 1 : g->M <= 16 ? 2 : 4;
        pl.grid = dim3((np16 + STREAM_WARPS - 1) / STREAM_WARPS, (g->M + 8 * pl.MI - 1) / (8 * pl.MI), 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = (4 * sms + ctas - 1) / ctas;
        int min_s = (nb + STREAM_MAX_RANGE / g->B - 1) / (STREAM_MAX_RANGE / g->B);
        S = g->splits > 0 ? g->splits : S;
        S = clampi(S < min_s ? min_s : S, 1, nb);
        if (g->splits == 0 && has_wgmma() && g->M > 8 && S > 1 && min_s <= STREAM_MAX_CLUSTER) {
            /* sm_90, M > 8: reduce the splits on chip, a power-of-two cluster of at most 8
             * CTAs (measured: M = 16 1.15x -> 1.31x cuBLAS FP16, M = 32 0.75x -> 0.85x; at
             * M <= 8 the global-memory reduction with unrounded S was faster, 2.17x vs 2.04x) */
            int c = 2;
            while (c < S && c < STREAM_MAX_CLUSTER)
                c *= 2;
            while (c > nb)
                c /= 2;
            S = c < min_s ? min_s : c;
        }
        pl.S = S;
        pl.cluster = S > 1 && has_wgmma() && S <= STREAM_MAX_CLUSTER && (S & (S - 1)) == 0;
        int range = (nb + S - 1) / S * g->B;
        pl.block = dim3(STREAM_WARPS * 32);
        pl.smem = ((size_t)8 * pl.MI * (range + 16) + 15) / 16 * 16;
        if (pl.cluster)
            pl.smem += (size_t)STREAM_WARPS * 16 * 8 * pl.MI * sizeof(float);
    } else if (pl.kernel == COMET_W4AX_KERNEL_DECODE) {
        /* planned above */
    } else if (pl.kernel == COMET_W4AX_KERNEL_PIPE) {
        plan_pipe(pl, g, np16, sms);
    } else if (pl.kernel == COMET_W4AX_KERNEL_WGMMA) {
        pl.tok = g->tile_tokens ? g->tile_tokens : ws_auto_tok(g->M, g->K);
        pl.MI = pl.tok / 8;
        pl.tiles_n = (np16 + WS_ROWS / 16 - 1) / (WS_ROWS / 16);
        pl.tiles_m = (g->M + pl.tok - 1) / pl.tok;
        int ctas = pl.tiles_n * pl.tiles_m;
        /* CTAs resident at once: every one counts as a slot (counting 80 % or 67 % of them
         * made M = 9-64 1.07x / 1.11x slower, session 8) */
        const int slots = sms * ws_ctas_per_sm(pl.tok);
        /* the modelled time of s splits, in blocks: rounds of resident CTAs x (blocks per split
         * + a CTA's fixed cost) */
        auto makespan = [&](int s) {
            return (long long)((ctas * s + slots - 1) / slots) * ((nb + s - 1) / s + WS_CTA_COST);
        };
        /* as many splits as fit in one wave (ws_ctas_per_sm CTAs per SM): 8B o at M = 128, 32
         * tiles: S = 4, 128 CTAs, rather than 5 in two waves; at two CTAs per SM the wave
         * counts both (8B down at M = 64: S = 7, 224 CTAs, 0.78x the time of S = 3 at one
         * CTA per SM; 70B o: S = 3, 1.06x that of S = 2 -- measured, not modelled) */
        int S = ctas >= slots ? 1 : slots / ctas;
        S = clampi(S, 1, WS_MAX_CLUSTER);
        /* ... and whose clusters of S CTAs can all be resident at once (a GPC holds whole
         * clusters only; measured: 8B o at M = 64 ran S = 4 at 3 us per block) */
        while (g->splits == 0 && S > 1 && ws_cluster_capacity(g->B / 64, pl.tok, S) < ctas)
            S--;
        /* Past one wave, 2 splits when the last wave is nearly empty: S = 2 takes
         * ceil(tiles / resident pairs) rounds of half the work; used when that saves >= 20 %
         * of the rounds (measured: 70B qkv at M = 256, 160 tiles, 2 rounds -> 3 half rounds:
         * 113 -> 99 us; at a 12-17 % saving, 8B gate_up M = 256 and 70B qkv M = 512, it lost
         * or tied; 8 splits at 15 resident clusters ran 8B qkv M = 256 at half speed) */
        if (g->splits == 0 && ctas >= slots && nb >= 2) {
            const int cap = clampi(ws_cluster_capacity(g->B / 64, pl.tok, 2), 1, slots / 2);
            if (10 * ((ctas + cap - 1) / cap) <= 16 * ((ctas + slots - 1) / slots))
                S = 2;
        }
        /* Below one wave, the cluster splits are capped by the clusters that fit (LLaMA-3-70B
         * qkv at M = 64: 80 tiles, S = 1, 52 SMs idle). Splits reduced through global
         * partials have no such cap, but one CTA per tile then reads back S partial tiles:
         * take them when a model of the makespan -- rounds x (blocks per split + WS_CTA_COST)
         * + S x TOK / 32 blocks for the reduction -- saves >= 10 %. Measured (same-run A/B):
         * 70B qkv M = 24 / 48 / 64 -15 / -11 / -9 %, 8B down M = 24 -12 %; without the
         * reduction term it also split 8B o (+7..+52 %) and every such shape at 128 tokens.
         * With two CTAs per SM (session 8) a 10 % threshold instead of 15 % moved 70B qkv and
         * down at M = 40-64 to global splits (0.81-0.87x the time) and changed nothing else
         * by more than 1 % at M = 17-64. */
        bool global_splits = false;
        if (g->splits == 0 && ctas < slots && nb >= 2) {
            const long long cur = makespan(S); /* one round: the cluster splits fit */
            long long best = cur;
            int best_s = 0;
            for (int sg = 2; sg <= nb && sg <= WS_MAX_GLOBAL_SPLITS; sg++) {
                const long long t = makespan(sg) + sg * pl.tok / 32;
                if (t < best)
                    best = t, best_s = sg;
            }
            if (best_s && 100 * best <= COMET_WS_GLOBAL_GAIN * cur)
                S = best_s, global_splits = true;
        }
        S = g->splits > 0 ? g->splits : S;
        pl.S = clampi(S, 1, nb);
        /* sm_90: the splits of a tile reduce on chip in a cluster (no workspace) */
        pl.cluster = pl.S > 1 && pl.S <= WS_MAX_CLUSTER && !global_splits;
        pl.grid = dim3(ctas, 1, 1);
        /* Stream-K (128-token tiles, up to WS_SK_MAX_WAVES waves): one CTA per SM, each with
         * an equal share of the tiles x blocks, when a model of the makespan says it beats the
         * plan above by >= 10 %: rounds x (blocks per split + WS_CTA_COST) against the share +
         * WS_SK_COST, the cost of a CTA's partial tiles (written to the workspace and summed by
         * the last CTA of each tile), fitted to a same-run A/B of stream-K at every plan with
         * M = 96-512 on the 8 LLaMA-3 shapes (session 8): about 12 blocks. Where the model
         * takes it, it measured 0.75-0.95x the time (70B qkv at M = 96-512, 70B gate_up at
         * M = 96-128, 8B qkv at M = 384-512, 8B gate_up at M = 192-256, 8B down at M = 384);
         * where it does not, stream-K was 1.0-1.36x (cluster splits already fill the SMs). */
        if (g->splits == 0 && g->ablate == 0 && pl.tok == 128 && ctas <= WS_SK_MAX_WAVES * sms &&
            (long long)ctas * nb >= sms) {
            const long long sk = ((long long)ctas * nb + sms - 1) / sms + WS_SK_COST;
            if (100 * sk <= WS_SK_GAIN * makespan(pl.S))
                pl.streamk = true, pl.S = 1, pl.cluster = false, pl.grid = dim3((unsigned)sms, 1, 1);
        }
        pl.block = dim3(WS_THREADS);
        pl.smem = (size_t)ws_smem_bytes(g->B / 64, pl.tok);
        const int persist_smem = ws_persist_smem_bytes(g->B / 64, pl.tok);
        if (COMET_WS_PERSIST && !pl.streamk && pl.S == 1 && g->splits == 0 && g->ablate == 0 && pl.tok == 128 &&
            ctas > slots && nb <= WS_PERSIST_MAX_NB && pl.tiles_m >= WS_PERSIST_MIN_TILES_M &&
            device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM) >= persist_smem)
            pl.persist = true, pl.grid = dim3((unsigned)slots, 1, 1), pl.smem = (size_t)persist_smem;
    } else {
        pl.MI = 4;
        pl.grid = dim3((np16 + TBN / 16 - 1) / (TBN / 16), (g->M + TBM - 1) / TBM, 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = ctas >= sms ? 1 : sms / ctas;
        S = g->splits > 0 ? g->splits : S;
        pl.S = clampi(S, 1, nb);
        pl.block = dim3(256);
        pl.smem = TSMEM_BYTES;
    }
    pl.grid.z = pl.S;
    pl.pdl = pdl;
    if (pl.S > 1 && !pl.cluster)
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.S * g->M * g->N * sizeof(float);
    if (pl.streamk) /* two partial tiles per CTA */
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.grid.x * 2 * WS_ROWS * pl.tok * sizeof(float);
    return pl;
}

static_assert(TSMEM_BYTES <= MAX_SMEM &&
                  8 * 4 * (STREAM_MAX_RANGE + 16) + STREAM_WARPS * 16 * 32 * 4 + 16 <= MAX_SMEM &&
                  ws_smem_bytes(2, 128) <= MAX_SMEM && ws_smem_bytes(1, 128) <= MAX_SMEM &&
                  ws_smem_bytes(2, 64) <= MAX_SMEM && ws_smem_bytes(1, 64) <= MAX_SMEM &&
                  ws_smem_bytes(2, 32) <= MAX_SMEM && ws_smem_bytes(1, 32) <= MAX_SMEM &&
                  ws_smem_bytes(2, 16) <= MAX_SMEM && ws_smem_bytes(1, 16) <= MAX_SMEM,
              "shared memory plans exceed MAX_SMEM");
static_assert(ws_persist_smem_bytes(1, 128) <= MAX_SMEM_SM90 && ws_persist_smem_bytes(2, 128) <= MAX_SMEM_SM90 &&
                  2 * 8 * ws_stages(1, 128) <= 256 && 2 * 8 * ws_stages(2, 128) <= 256,
              "the persistent wgmma plans' staging tile does not fit");
/* the CTAs that ws_ctas_per_sm puts on one SM fit its 228 KB (each also reserves 1 KB) */
constexpr bool ws_fits_sm(int kpb, int tok) { return ws_ctas_per_sm(tok) * (ws_smem_bytes(kpb, tok) + 1024) <= 228 * 1024; }
static_assert(ws_fits_sm(1, 16) && ws_fits_sm(2, 16) && ws_fits_sm(1, 32) && ws_fits_sm(2, 32) && ws_fits_sm(1, 64) &&
                  ws_fits_sm(2, 64) && ws_fits_sm(1, 128) && ws_fits_sm(2, 128),
              "the wgmma kernel's CTAs per SM do not fit in shared memory");
static_assert(128 * WS_RED_LD * 4 <= ws_stages(1, 128) * ws_stage_bytes(1, 128) &&
                  128 * WS_RED_LD * 4 <= ws_stages(2, 128) * ws_stage_bytes(2, 128) &&
                  64 * WS_RED_LD * 4 <= ws_stages(1, 64) * ws_stage_bytes(1, 64) &&
                  64 * WS_RED_LD * 4 <= ws_stages(2, 64) * ws_stage_bytes(2, 64) &&
                  32 * WS_RED_LD * 4 <= ws_stages(1, 32) * ws_stage_bytes(1, 32) &&
                  32 * WS_RED_LD * 4 <= ws_stages(2, 32) * ws_stage_bytes(2, 32) &&
                  16 * WS_RED_LD * 4 <= ws_stages(1, 16) * ws_stage_bytes(1, 16) &&
                  16 * WS_RED_LD * 4 <= ws_stages(2, 16) * ws_stage_bytes(2, 16),
              "the cluster reduction tile must fit in the stage memory");

/* f(KPB, TOK) with the wgmma kernel's compile-time parameters -- kpb = B / 64 in {1, 2}, the
 * token tile in {16, 32, 64, 128} -- as std::integral_constant values: the one place where the
 * run-time values select template instances. */
template <typename F> auto with_ws_config(int kpb, int tok, F &&f)
{
    using k1 = std::integral_constant<int, 1>;
    using k2 = std::integral_constant<int, 2>;
    using t16 = std::integral_constant<int, 16>;
    using t32 = std::integral_constant<int, 32>;
    using t64 = std::integral_constant<int, 64>;
    using t128 = std::integral_constant<int, 128>;
    if (kpb == 1)
        return tok == 16 ? f(k1{}, t16{}) : tok == 32 ? f(k1{}, t32{}) : tok == 64 ? f(k1{}, t64{}) : f(k1{}, t128{});
    return tok == 16 ? f(k2{}, t16{}) : tok == 32 ? f(k2{}, t32{}) : tok == 64 ? f(k2{}, t64{}) : f(k2{}, t128{});
}

/* f(MI, KPB) for the pipe and decode kernels' instances: MI (token groups of 8) and kpb =
 * B / 64, each 1 or 2, as std::integral_constant values. */
template <typename F> auto with_mi_kpb(int mi, int kpb, F &&f)
{
    using one = std::integral_constant<int, 1>;
    using two = std::integral_constant<int, 2>;
    if (mi == 1)
        return kpb == 1 ? f(one{}, one{}) : f(one{}, two{});
    return kpb == 1 ? f(two{}, one{}) : f(two{}, two{});
}

/* Clusters of S CTAs of the wgmma kernel (cluster reduction instance) that can be resident
 * at once on this device; cached. A failed query counts as "enough". */
int ws_cluster_capacity(int kpb, int tok, int S)
{
    static std::mutex mu;
    static int cap[MAX_DEV][3][4][WS_MAX_CLUSTER + 1]; /* per device: GPUs differ in SMs and GPCs */
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu);
    int uncached = 0;
    int &c = dev >= 0 && dev < MAX_DEV ? cap[dev][kpb][tok == 16 ? 0 : tok == 32 ? 1 : tok == 64 ? 2 : 3][S] : uncached;
    if (c == 0) {
        void (*kern)(params, CUtensorMap) = with_ws_config(kpb, tok, [](auto k, auto t) {
            return &w4ax_ws_kernel<decltype(k)::value, decltype(t)::value, false, 0, true>;
        });
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = (unsigned)S;
        cfg.gridDim = dim3(1, 1, S), cfg.blockDim = dim3(WS_THREADS), cfg.dynamicSmemBytes = ws_smem_bytes(kpb, tok);
        cfg.attrs = attr, cfg.numAttrs = 1;
        int n = 0;
        if (allow_smem((const void *)kern, cfg.dynamicSmemBytes) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess || n < 1) {
            cudaGetLastError(); /* clear */
            n = 1 << 30;
        }
        c = n;
    }
    return c;
}

/* Launch `kernel(args...)` with the plan's grid, allowing the shared memory it needs. */
template <typename... KA, typename... A>
cudaError_t launch(void (*kernel)(KA...), const plan_t &pl, cudaStream_t st, A... args)
{
    cudaError_t e = allow_smem((const void *)kernel, pl.smem);
    if (e != cudaSuccess)
        return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = pl.grid, cfg.blockDim = pl.block, cfg.dynamicSmemBytes = pl.smem, cfg.stream = st;
    cudaLaunchAttribute attr[3];
    unsigned n = 0;
    if (pl.carveout > 0) { /* a hint: the driver rounds up to a carveout the SM has */
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n].val.sharedMemCarveout = (unsigned)(pl.carveout < 100 ? pl.carveout : 100);
        n++;
    }
    if (pl.cluster) { /* the S splits of a tile form one cluster (dims 1 x 1 x S) */
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = (unsigned)pl.S;
        n++;
    }
    if (pl.pdl) { /* may start once every CTA of the previous kernel has begun (pdl_trigger) */
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = n ? attr : nullptr, cfg.numAttrs = n;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess && pl.carveout > 0) { /* a driver without the hint: launch without it */
        cudaGetLastError();                    /* clear */
        cfg.attrs = n > 1 ? attr + 1 : nullptr, cfg.numAttrs = n - 1;
        e = cudaLaunchKernelEx(&cfg, kernel, args...);
    }
    return e;
}

/* TMA descriptor of the activation codes qa [M, K] (bytes): boxes of B bytes x tok rows,
 * swizzled as the wgmma descriptor expects, rows past M read as zeros. cuTensorMapEncodeTiled
 * is a host function of the driver, reached through the runtime (no -lcuda). */
comet_status make_tmap_a(const comet_cuda_w4ax_gemm *g, int tok, CUtensorMap *map)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        cudaDriverEntryPointQueryResult q;
        void *fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    });
    if (!encode)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: the driver has no cuTensorMapEncodeTiled");
    cuuint64_t dims[2] = {(cuuint64_t)g->K, (cuuint64_t)g->M}, strides[1] = {(cuuint64_t)g->K};
    cuuint32_t box[2] = {(cuuint32_t)g->B, (cuuint32_t)tok}, estr[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)g->qa, dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE,
                        g->B == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: cuTensorMapEncodeTiled failed (%d) for M=%d K=%d",
                               (int)r, g->M, g->K);
    return COMET_OK;
}

template <int MI, int KPB, bool BSUM> cudaError_t launch_pipe(const plan_t &pl, const params &p, cudaStream_t st)
{
    static_assert(PP_MAX_TILES == 4, "one instance per tile count");
    return pl.pp_tiles == 4   ? launch(w4ax_pipe_kernel<MI, KPB, 4, BSUM>, pl, st, p)
           : pl.pp_tiles == 3 ? launch(w4ax_pipe_kernel<MI, KPB, 3, BSUM>, pl, st, p)
           : pl.pp_tiles == 2 ? launch(w4ax_pipe_kernel<MI, KPB, 2, BSUM>, pl, st, p)
                              : launch(w4ax_pipe_kernel<MI, KPB, 1, BSUM>, pl, st, p);
}

template <int MI, int KPB, bool BSUM> cudaError_t launch_stream(const plan_t &pl, const params &p, cudaStream_t st)
{
    constexpr int G = 4; /* k64 chunks per round of loads (registers: 2 x G x 16 B); G = 8 measured
                          * slower at M = 1 (168 registers: the grid no longer fits one wave) */
    return pl.cluster ? launch(w4ax_stream_kernel<MI, KPB, STREAM_WARPS, BSUM, true, G>, pl, st, p)
                      : launch(w4ax_stream_kernel<MI, KPB, STREAM_WARPS, BSUM, false, G>, pl, st, p);
}

/* The ablate values that the wgmma kernel has a profiling instance for (gemm_w4ax.h says what
 * each leaves out; bench/gemm/ablate.sh runs them), B = 128 only. */
constexpr int WS_ABLATIONS[] = {1, 2, 3, 4, 8, 11, 16, 17, 32, 64, 96};

bool ws_ablation_instance(int a)
{
    for (int v : WS_ABLATIONS)
        if (v == a)
            return true;
    return false;
}

/* the instance for p.ablate (checked by the caller: ws_ablation_instance) */
template <int TOK, size_t... I>
cudaError_t launch_ws_ablation(const plan_t &pl, const params &p, const CUtensorMap &tmap, cudaStream_t st,
                               std::index_sequence<I...>)
{
    cudaError_t e = cudaErrorInvalidValue;
    (void)((p.ablate == WS_ABLATIONS[I] &&
            (e = launch(w4ax_ws_kernel<2, TOK, false, WS_ABLATIONS[I]>, pl, st, p, tmap), true)) ||
           ...);
    return e;
}

template <int KPB, int TOK, bool BSUM>
cudaError_t launch_ws(const plan_t &pl, const params &p, const CUtensorMap &tmap, cudaStream_t st)
{
    if constexpr (KPB == 2 && !BSUM && TOK >= 32)
        if (p.ablate && !pl.cluster)
            return launch_ws_ablation<TOK>(pl, p, tmap, st,
                                           std::make_index_sequence<sizeof WS_ABLATIONS / sizeof WS_ABLATIONS[0]>{});
    if constexpr (TOK == 128)
        if (pl.streamk || pl.persist)
            return launch(w4ax_ws_kernel<KPB, TOK, BSUM, 0, false, true>, pl, st, p, tmap);
    return pl.cluster ? launch(w4ax_ws_kernel<KPB, TOK, BSUM, 0, true>, pl, st, p, tmap)
                      : launch(w4ax_ws_kernel<KPB, TOK, BSUM>, pl, st, p, tmap);
}

template <bool BSUM>
cudaError_t launch_variant(const plan_t &pl, int kpb, const params &p, const CUtensorMap &tmap, cudaStream_t st)
{
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        return with_ws_config(kpb, pl.tok, [&](auto k, auto t) {
            return launch_ws<decltype(k)::value, decltype(t)::value, BSUM>(pl, p, tmap, st);
        });
    if (pl.kernel == COMET_W4AX_KERNEL_PIPE || pl.kernel == COMET_W4AX_KERNEL_DECODE)
        return with_mi_kpb(pl.MI, kpb, [&](auto m, auto k) {
            constexpr int MI = decltype(m)::value, KPB = decltype(k)::value;
            return pl.kernel == COMET_W4AX_KERNEL_PIPE ? launch_pipe<MI, KPB, BSUM>(pl, p, st)
                                                       : launch(w4ax_decode_kernel<MI, KPB, BSUM>, pl, st, p);
        });
    if (pl.kernel == COMET_W4AX_KERNEL_TILED)
        return kpb == 1 ? launch(w4ax_tiled_kernel<1, BSUM>, pl, st, p)
                        : launch(w4ax_tiled_kernel<2, BSUM>, pl, st, p);
    if (pl.MI == 1)
        return kpb == 1 ? launch_stream<1, 1, BSUM>(pl, p, st)
                        : launch_stream<1, 2, BSUM>(pl, p, st);
    if (pl.MI == 2)
        return kpb == 1 ? launch_stream<2, 1, BSUM>(pl, p, st)
                        : launch_stream<2, 2, BSUM>(pl, p, st);
    return kpb == 1 ? launch_stream<4, 1, BSUM>(pl, p, st)
                    : launch_stream<4, 2, BSUM>(pl, p, st);
}

comet_status check_args(const comet_cuda_w4ax_gemm *g)
{
    if (!g || g->M < 1 || g->N < 1 || g->K < 64 || g->K % 64 || (g->B != 64 && g->B != 128) ||
        g->K % g->B || g->n8 < 0 || g->n8 > g->K / g->B || g->M > COMET_CUDA_W4AX_MAX_DIM ||
        g->N > COMET_CUDA_W4AX_MAX_DIM || g->K > COMET_CUDA_W4AX_MAX_K ||
        (int64_t)g->M * g->N > COMET_CUDA_W4AX_MAX_OUTPUT)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: bad shape M=%d N=%d K=%d B=%d n8=%d; need M, N >= 1, "
                               "K a multiple of 64 and of B in {64, 128}, 0 <= n8 <= K/B, "
                               "M, N <= 2^30, K <= 2^20, M * N <= 2^36",
                               g ? g->M : 0, g ? g->N : 0, g ? g->K : 0, g ? g->B : 0, g ? g->n8 : 0);
    if (g->pdl != 0 && g->pdl != 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: pdl %d is neither 0 nor 1", g->pdl);
    if ((int)g->kernel < 0 || g->kernel >= COMET_W4AX_KERNEL_COUNT || g->splits < 0 ||
        (g->tile_tokens != 0 && g->tile_tokens != 16 && g->tile_tokens != 32 && g->tile_tokens != 64 &&
         g->tile_tokens != 128) ||
        g->pipe_tiles < 0 || g->pipe_tiles > PP_MAX_TILES)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: kernel %d / splits %d / tile_tokens %d / pipe_tiles %d out of range",
                               (int)g->kernel, g->splits, g->tile_tokens, g->pipe_tiles);
    if (g->kernel == COMET_W4AX_KERNEL_DECODE && g->splits > 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: the decode kernel has no split-K (splits %d)",
                               g->splits);
    return COMET_OK;
}

comet_status check_pointers(const comet_cuda_w4ax_gemm *g)
{
    if (!g->qw || !g->sw || !g->qa || !g->sa || (!g->y && !g->y_f16))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: qw, sw, qa, sa and one of y, y_f16 must be non-NULL");
    if ((uintptr_t)g->qw % 16 || (uintptr_t)g->qa % 16 || (uintptr_t)g->sw % 16)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: qw, sw and qa must be 16-byte aligned");
    return COMET_OK;
}

} // namespace

extern "C" size_t comet_cuda_gemm_w4ax_workspace_bytes(const comet_cuda_w4ax_gemm *g)
{
    if (check_args(g) < 0) {
        comet_clear_error();
        return 0;
    }
    return make_plan(g).ws_bytes;
}

extern "C" const char *comet_cuda_gemm_w4ax_plan_name(const comet_cuda_w4ax_gemm *g)
{
    static thread_local char buf[112]; /* per thread: the launch's error messages use it too */
    if (check_args(g) < 0) {
        comet_clear_error();
        return "invalid";
    }
    plan_t pl = make_plan(g);
    char cl[64] = "";
    if (pl.cluster && pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        snprintf(cl, sizeof cl, " cluster(fit %d)", ws_cluster_capacity(g->B / 64, pl.tok, pl.S));
    else if (pl.streamk)
        snprintf(cl, sizeof cl, " stream-K");
    else if (pl.persist)
        snprintf(cl, sizeof cl, " persistent");
    else if (pl.cluster)
        snprintf(cl, sizeof cl, " cluster");
    else if (pl.kernel == COMET_W4AX_KERNEL_PIPE) {
        snprintf(cl, sizeof cl, " %d/SM ring=%d tiles=%d", pl.pp_ctas, pl.pp_depth, pl.pp_tiles);
        if (pl.pdl && pl.pp_early < pl.pp_depth - 1) /* fewer early positions than the kernel could take */
            snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " early=%d", pl.pp_early);
        if (pl.carveout > 0) /* the shared-memory carveout hint, % */
            snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " carve=%d", pl.carveout);
    }
    if (pl.kernel == COMET_W4AX_KERNEL_DECODE)
        snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " wt=%d", dk_wt(pl.MI));
    if (pl.pdl)
        snprintf(cl + strlen(cl), sizeof cl - strlen(cl), " pdl");
    snprintf(buf, sizeof buf, "%s MI=%d S=%d%s grid=%ux%ux%u",
             pl.kernel == COMET_W4AX_KERNEL_STREAM     ? "stream"
             : pl.kernel == COMET_W4AX_KERNEL_PIPE     ? "pipe"
             : pl.kernel == COMET_W4AX_KERNEL_WGMMA    ? "wgmma"
             : pl.kernel == COMET_W4AX_KERNEL_DECODE   ? "decode"
                                                       : "tiled",
             pl.MI, pl.S, cl, pl.grid.x, pl.grid.y, pl.grid.z);
    return buf;
}

extern "C" comet_status comet_cuda_gemm_w4ax(const comet_cuda_w4ax_gemm *g, void *stream)
{
    COMET_TRY(check_args(g));
    COMET_TRY(check_pointers(g));
    plan_t pl = make_plan(g);
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA && !has_wgmma())
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "gemm_w4ax: the wgmma kernel needs an sm_90 GPU and a build with sm_90a code "
                               "(CMAKE_CUDA_ARCHITECTURES with 90a, e.g. \"90a;80\"; plain 90 or native "
                               "has no wgmma)");
    /* tiles along grid y (token tiles of the stream and tiled kernels) and splits along z */
    if (pl.grid.y > 65535 || pl.grid.z > 65535)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: M=%d N=%d K=%d is past the grid limits of the %s plan (grid %ux%ux%u, "
                               "at most 65535 in y and z); split the call along M",
                               g->M, g->N, g->K, comet_cuda_gemm_w4ax_plan_name(g), pl.grid.x, pl.grid.y,
                               pl.grid.z);
    const int smem_optin = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, MAX_SMEM);
    if (pl.smem > (size_t)smem_optin)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "gemm_w4ax: the %s plan needs %zu bytes of shared memory per CTA, this GPU "
                               "allows %d",
                               comet_cuda_gemm_w4ax_plan_name(g), pl.smem, smem_optin);
    if (g->ablate && pl.kernel == COMET_W4AX_KERNEL_WGMMA &&
        (pl.cluster || g->B != 128 || pl.tok < 32 || g->bsum || !ws_ablation_instance(g->ablate))) {
        char vals[64] = "";
        for (int v : WS_ABLATIONS)
            snprintf(vals + strlen(vals), sizeof vals - strlen(vals), "%s%d", vals[0] ? ", " : "", v);
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: ablate on the wgmma kernel needs B = 128, a token tile of "
                               "32 or more, a plan without a split-K cluster, no bsum and one of %s "
                               "(ablate %d, %s)",
                               vals, g->ablate, comet_cuda_gemm_w4ax_plan_name(g));
    }
    if (pl.ws_bytes > 0 && (!g->workspace || g->workspace_bytes < pl.ws_bytes))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: the plan needs %zu workspace bytes, got %zu; size it "
                               "with comet_cuda_gemm_w4ax_workspace_bytes",
                               pl.ws_bytes, g->workspace ? g->workspace_bytes : (size_t)0);
    params p;
    p.M = g->M, p.N = g->N, p.Np = (g->N + 15) / 16 * 16, p.K = g->K, p.nb = g->K / g->B, p.S = pl.S;
    p.qw = g->qw, p.sw = g->sw, p.qa = g->qa, p.sa = g->sa, p.y = g->y, p.y16 = g->y_f16;
    p.bsum = g->bsum;
    p.counter = (unsigned *)g->workspace;
    p.part = pl.ws_bytes ? (float *)((char *)g->workspace + counter_bytes(pl)) : nullptr;
    p.tiles_n = pl.tiles_n, p.tiles_m = pl.tiles_m, p.ablate = g->ablate;
    p.pp_depth = pl.pp_depth, p.pp_rows = pl.pp_rows, p.pp_early = pl.pp_early, p.pdl = pl.pdl;
    p.persist = pl.persist;
    CUtensorMap tmap;
    memset(&tmap, 0, sizeof tmap);
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        COMET_TRY(make_tmap_a(g, (g->ablate & 8) ? pl.tok / 2 : pl.tok, &tmap));
    cudaStream_t st = (cudaStream_t)stream;
    const int kpb = g->B / 64;
    cudaError_t e;
    if (pl.ws_bytes > 0 && counters_needed(pl) > WS_COUNTERS &&
        (e = cudaMemsetAsync(g->workspace, 0, counter_bytes(pl), st)) != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: zeroing %zu workspace counters failed: %s",
                               counters_needed(pl), cudaGetErrorString(e));
    e = g->bsum ? launch_variant<true>(pl, kpb, p, tmap, st) : launch_variant<false>(pl, kpb, p, tmap, st);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: launch of %s failed: %s",
                               comet_cuda_gemm_w4ax_plan_name(g), cudaGetErrorString(e));
    return COMET_OK;
}

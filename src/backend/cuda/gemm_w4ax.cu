/* gemm_w4ax.cu — CUDA W4Ax GEMM for sm_80+ (tuned on the H200, sm_90a).
 *
 * INT4 weights are a storage format here: nibbles expand to INT8 in registers with the x16
 * trick (low nibble << 4, high nibble in place, masked by 0xF0F0F0F0: 16*w per byte, sign
 * for free) and meet the int8 activation codes on the INT8 tensor cores
 * (mma.sync.m16n8k32.s8). Products are 16x the true ones; every int32 block sum is a
 * multiple of 16, so S = acc >> 4 and float(acc) * 0.0625f == float(S), both exact. The
 * weights are the 16-row side of the MMA and tokens the 8-column side, which suits small M.
 *
 * Three kernels, chosen by M and the device at run time (make_plan()):
 *  - stream (M <= 32): each warp owns 16 weight rows and streams their packed codes from
 *    global memory straight into registers (16-byte loads, 4 k64 chunks ahead of use); the
 *    CTA's tokens for its K range sit in shared memory. K is split across CTAs so all SMs
 *    stream.
 *  - wgmma (M > 32, sm_90a): one warpgroup per 64 weight rows x 128 tokens, weights as the
 *    register A operand of wgmma.m64n128k32.s8, swizzled token tiles as B, cp.async ring.
 *  - tiled (M > 32 elsewhere, sm_80): 128x128 CTA tile, 8 warps of 64x32, a 4-stage cp.async
 *    pipeline of 64-deep K slices, activations read with ldmatrix.
 * Measured speeds and what limits each kernel: docs/gemm.md, bench/results/.
 * All accumulate one activation block (B = 64 or 128 channels) in int32, then promote:
 * acc_f += float(S) * (sa[t, b] * sw[n, b]). Split-K partials go to a workspace; the last
 * CTA of each tile (atomic counter) sums them in split order, so results are deterministic,
 * and resets the counter.
 */
#include "backend/cuda/gemm_w4ax.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdio.h>

namespace {

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
    unsigned *counter; /* one per (blockIdx.x, blockIdx.y) tile */
};

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lo16x(uint32_t w) { return (w << 4) & 0xF0F0F0F0u; }
__device__ __forceinline__ uint32_t hi16x(uint32_t w) { return w & 0xF0F0F0F0u; }

__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float ld_sw(const uint16_t *p)
{
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(p))));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *smem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
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

/* Sum of the S partials of element (t, n), in split order. */
__device__ __forceinline__ float splitk_sum(const params &p, int t, int n)
{
    float v = 0.0f;
    for (int s = 0; s < p.S; s++)
        v += __ldcg(&p.part[((size_t)s * p.M + t) * p.N + n]);
    return v;
}

/* Stream kernel. Grid (ceil(Np/16 / WARPS), ceil(M / (8*MI)), S); WARPS warps per CTA, warp
 * w owning weight rows [16*(blockIdx.x*WARPS + w), +16) and tokens
 * [8*MI*blockIdx.y, +8*MI). Split s covers activation blocks [s*nb/S, (s+1)*nb/S). The CTA
 * first copies its tokens' codes for that K range into shared memory (rows padded by 16
 * bytes: conflict-free 4-byte B-fragment reads), then each warp runs a register-double-
 * buffered loop over groups of G = 4 k64 chunks: issue the 16-byte loads of the next group
 * (and its weight scales), then 2*MI mma per chunk of the current group, promoting at each
 * block end. KPB = B/64 chunks per block. */
template <int MI, int KPB, int WARPS, bool BSUM>
__global__ void __launch_bounds__(WARPS * 32) w4ax_stream_kernel(params p)
{
    constexpr int G = 4, NBG = G / KPB, B = KPB * 64;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int s = blockIdx.z, b0 = s * p.nb / p.S, b1 = (s + 1) * p.nb / p.S;
    const int R = (b1 - b0) * B, RS = R + 16, t0 = blockIdx.y * 8 * MI;
    const int nt = blockIdx.x * WARPS + warp, np16 = p.Np / 16;

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
    float swc[NBG][2], swn[NBG][2];
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
    const int rows = min(8 * MI, p.M - t0); /* token rows past M are never read */
    for (int i = threadIdx.x; i < rows * (R / 16); i += WARPS * 32) {
        int row = i / (R / 16), col = (i % (R / 16)) * 16;
        cp_async16(smem + row * RS + col, p.qa + (size_t)(t0 + row) * p.K + (size_t)b0 * B + col, true);
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
                if (c0 + j < nch) {
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
#pragma unroll
                        for (int f = 0; f < MI; f++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                float sc = sac[jb][f][r & 1] * swc[jb][r >> 1];
                                acc[f][r] = fmaf((float)ci[f][r] * 0.0625f, sc, acc[f][r]);
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

    if (p.S == 1) {
        if (!active)
            return;
#pragma unroll
        for (int f = 0; f < MI; f++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;
                if (t < p.M && n < p.N)
                    store_out(p, t, n, acc[f][r]);
            }
        return;
    }
    if (active)
#pragma unroll
        for (int f = 0; f < MI; f++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;
                if (t < p.M && n < p.N)
                    p.part[((size_t)s * p.M + t) * p.N + n] = acc[f][r];
            }
    if (!splitk_last(p) || !active)
        return;
#pragma unroll
    for (int f = 0; f < MI; f++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;
            if (t < p.M && n < p.N)
                store_out(p, t, n, splitk_sum(p, t, n));
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
    float swr[4][2], sar[4][2];

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
                swr[i][0] = n < p.Np ? ld_sw(p.sw + (size_t)b * p.Np + n) : 0.0f;
                swr[i][1] = n < p.Np ? ld_sw(p.sw + (size_t)b * p.Np + n + 8) : 0.0f;
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
                        float sc = sar[f][r & 1] * swr[i][r >> 1];
                        acc[i][f][r] = fmaf((float)ci[i][f][r] * 0.0625f, sc, acc[i][f][r]);
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

#define W4AX_TILED_FOR_EACH(BODY)                                                    \
    _Pragma("unroll") for (int i = 0; i < 4; i++)                                    \
    _Pragma("unroll") for (int f = 0; f < 4; f++)                                    \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                  \
        int t = t0 + wm * 32 + f * 8 + tq * 2 + (r & 1);                             \
        int n = (nt0 + wn * 4 + i) * 16 + g + (r >> 1) * 8;                          \
        if (t < p.M && n < p.N) { BODY; }                                            \
    }
    if (p.S == 1) {
        W4AX_TILED_FOR_EACH(store_out(p, t, n, acc[i][f][r]))
        return;
    }
    W4AX_TILED_FOR_EACH(p.part[((size_t)s * p.M + t) * p.N + n] = acc[i][f][r])
    if (!splitk_last(p))
        return;
    W4AX_TILED_FOR_EACH(store_out(p, t, n, splitk_sum(p, t, n)))
#undef W4AX_TILED_FOR_EACH
}


/* wgmma kernel (sm_90a). WNWG warpgroups per CTA share one 128-token tile; each warpgroup
 * computes 64 weight rows x 128 tokens with wgmma.mma_async.m64n128k32.s32.s8.s8: operand
 * A (the weights)
 * comes from registers, each warp unpacking its own 16 rows from a packed 512-byte tile in
 * shared memory with the x16 trick (the register fragment of A is the m16n8k32 one); operand
 * B (the tokens) is read by the tensor cores from shared memory, K-major, swizzled (128-byte
 * swizzle when a stage holds 128 bytes of K per token, 64-byte when it holds 64): token row r
 * of a stage lives at r*KS, its 16-byte chunk kc at ((kc ^ f(r)) * 16), so that cp.async
 * writes and tensor-core reads are free of bank conflicts. One pipeline stage is one
 * activation block (KS = B bytes of K): the token tile, 4*KPB weight tiles and the block's
 * 128 activation scales, loaded with cp.async WSTAGES deep; global addresses are computed
 * once, a stage only adds its offset. Per stage: unpack A, 2*KPB wgmma into int32 (the first
 * with scale-d = 0 clears them), wait, promote into fp32 with the weight scale pre-divided by
 * 16. Several CTAs per SM overlap one CTA's promotion with another's tensor work. */
constexpr int WBM = 128;
/* Warpgroups per CTA sharing one token tile. 2 (128 weight rows) was measured no faster than
 * 1 on the H200 (fewer CTAs per SM offset the halved token traffic), so 1 is used. */
constexpr int WG_NWG = 1;
__host__ __device__ constexpr int wg_stages(int kpb) { return kpb == 1 ? 4 : 3; }
__host__ __device__ constexpr int wg_stage_bytes(int kpb, int nwg)
{
    return (WBM * 64 * kpb + 4 * nwg * kpb * 512 + WBM * 4 + 1023) / 1024 * 1024;
}
__host__ __device__ constexpr int wg_smem_bytes(int kpb, int nwg)
{
    return wg_stages(kpb) * wg_stage_bytes(kpb, nwg) + 1024;
}

[[maybe_unused]] __device__ __forceinline__ void wgmma_128(int (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint64_t desc, int scale_d)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
#endif
}

/* Shared-memory matrix descriptor: K-major, swizzle 128 B (KPB 2) or 64 B (KPB 1); the
 * leading byte offset is unused in swizzled K-major layouts, the stride byte offset is the
 * distance between 8-row groups. */
template <int KPB> __device__ __forceinline__ uint64_t smem_desc(uint32_t saddr)
{
    const uint64_t layout = KPB == 2 ? 1 : 2, sbo = 8 * 64 * KPB;
    return ((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((sbo >> 4) << 32) | (layout << 62);
}

[[maybe_unused]] __device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

template <int KPB, int WNWG, bool BSUM>
__global__ void __launch_bounds__(128 * WNWG) w4ax_wgmma_kernel(params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int KS = 64 * KPB, KC = KS / 16, A_BYTES = WBM * KS, W_BYTES = 4 * WNWG * KPB * 512;
    constexpr int NTH = 128 * WNWG, STAGE = wg_stage_bytes(KPB, WNWG), WSTAGES = wg_stages(KPB);
    constexpr int AH = WBM * KC / NTH, AROWS = NTH / KC; /* token chunks per thread, rows per pass */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - ((uint32_t)__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int s = blockIdx.z, b0 = s * p.nb / p.S, b1 = (s + 1) * p.nb / p.S, nblk = b1 - b0;
    const int nt0 = blockIdx.x * 4 * WNWG, t0 = blockIdx.y * WBM, np16 = p.Np / 16, k64 = p.K / 64;

    /* per-thread copy plan, fixed for the whole K loop */
    const uint8_t *w_src[KPB];
    int w_dst[KPB];
    bool w_ok[KPB];
#pragma unroll
    for (int h = 0; h < KPB; h++) {
        int j = warp + 4 * WNWG * h, w = j / KPB, c = j % KPB, nt = nt0 + w;
        w_ok[h] = nt < np16;
        w_src[h] = p.qw + ((size_t)(w_ok[h] ? nt : 0) * k64 + c) * 512 + lane * 16;
        w_dst[h] = A_BYTES + (w * KPB + c) * 512 + lane * 16;
    }
    const int a_row = tid / KC, a_kc = tid % KC;
    const int a_f = KPB == 2 ? (a_row & 7) : ((a_row >> 1) & 3);
    const int a_dst = a_row * KS + ((a_kc ^ a_f) * 16);
    const int8_t *a_src = p.qa + (size_t)(t0 + a_row) * p.K + a_kc * 16;
    const float *s_src = p.sa + (size_t)(t0 + tid) * p.nb;

    auto load_stage = [&](int slot, int b) {
        uint8_t *st = smem + slot * STAGE;
#pragma unroll
        for (int h = 0; h < KPB; h++)
            cp_async16(st + w_dst[h], w_src[h] + (size_t)b * KPB * 512, w_ok[h]);
#pragma unroll
        for (int h = 0; h < AH; h++) {
            bool ok = t0 + a_row + h * AROWS < p.M;
            const int8_t *src = a_src + (size_t)h * AROWS * p.K + (size_t)b * KS;
            cp_async16(st + a_dst + h * AROWS * KS, src, ok); /* src-size 0: nothing read */
        }
        if (tid < WBM) {
            bool ok = t0 + tid < p.M;
            cp_async4(st + A_BYTES + W_BYTES + tid * 4, s_src + b, ok);
        }
    };

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
    const int nrow = (nt0 + warp) * 16 + g;
    const bool row_ok = nrow < p.Np;
    const uint16_t *sw_src = p.sw + (row_ok ? nrow : 0);

    /* Stage x of the ring holds block b0 + x. Unpack A, issue the block's wgmma into dd and
     * commit; the caller waits. */
    auto issue = [&](int x, int (&dd)[64]) {
        const uint8_t *st = smem + (x % WSTAGES) * STAGE;
        uint32_t af[KPB][2][4];
#pragma unroll
        for (int c = 0; c < KPB; c++) {
            uint4 wf = *reinterpret_cast<const uint4 *>(st + A_BYTES + (warp * KPB + c) * 512 + lane * 16);
            af[c][0][0] = lo16x(wf.x), af[c][0][1] = hi16x(wf.x), af[c][0][2] = lo16x(wf.y), af[c][0][3] = hi16x(wf.y);
            af[c][1][0] = lo16x(wf.z), af[c][1][1] = hi16x(wf.z), af[c][1][2] = lo16x(wf.w), af[c][1][3] = hi16x(wf.w);
        }
        const uint32_t a_base = (uint32_t)__cvta_generic_to_shared(st);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int c = 0; c < KPB; c++)
#pragma unroll
            for (int q = 0; q < 2; q++)
                wgmma_128(dd, af[c][q][0], af[c][q][1], af[c][q][2], af[c][q][3],
                          smem_desc<KPB>(a_base + (c * 2 + q) * 32), c | q);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    /* Fold the int32 sums dd of block b0 + x into acc (sw0, sw1: weight scales / 16). */
    auto promote = [&](int x, const int (&dd)[64], float sw0, float sw1) {
        const float *ss = (const float *)(smem + (x % WSTAGES) * STAGE + A_BYTES + W_BYTES);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float2 sa2 = *reinterpret_cast<const float2 *>(ss + 8 * j + 2 * tq);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float sc = ((r & 1) ? sa2.y : sa2.x) * ((r >> 1) ? sw1 : sw0);
                acc[j * 4 + r] = fmaf((float)dd[j * 4 + r], sc, acc[j * 4 + r]);
                if (BSUM) {
                    int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;
                    if (t < p.M && n < p.N)
                        p.bsum[((size_t)t * p.N + n) * p.nb + b0 + x] = dd[j * 4 + r] >> 4;
                }
            }
        }
    };
    auto ld_sw2 = [&](int x, float &s0, float &s1) {
        s0 = row_ok ? ld_sw(sw_src + (size_t)(b0 + x) * p.Np) * 0.0625f : 0.0f;
        s1 = row_ok ? ld_sw(sw_src + (size_t)(b0 + x) * p.Np + 8) * 0.0625f : 0.0f;
    };

    /* one block at a time: load ring WSTAGES - 1 ahead, issue, wait, promote. (Two int32
     * accumulator sets, so that block x+1's wgmma runs while block x is promoted, made ptxas
     * serialize the wgmma anyway (C7514); overlap has to come from several CTAs per SM.) */
    int d[64];
#pragma unroll
    for (int i = 0; i < WSTAGES - 1; i++) {
        if (i < nblk)
            load_stage(i, b0 + i);
        cp_async_commit();
    }
    for (int it = 0; it < nblk; it++) {
        cp_async_wait<WSTAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (it + WSTAGES - 1 < nblk)
            load_stage((it + WSTAGES - 1) % WSTAGES, b0 + it + WSTAGES - 1);
        cp_async_commit();
        float s0, s1;
        ld_sw2(it, s0, s1);
        issue(it, d);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        promote(it, d, s0, s1);
    }
    cp_async_wait<0>();

#define W4AX_WG_FOR_EACH(BODY)                                                       \
    _Pragma("unroll") for (int j = 0; j < 16; j++)                                   \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                  \
        int t = t0 + 8 * j + 2 * tq + (r & 1), n = nrow + (r >> 1) * 8;              \
        if (t < p.M && n < p.N) { BODY; }                                            \
    }
    if (p.S == 1) {
        W4AX_WG_FOR_EACH(store_out(p, t, n, acc[j * 4 + r]))
        return;
    }
    W4AX_WG_FOR_EACH(p.part[((size_t)s * p.M + t) * p.N + n] = acc[j * 4 + r])
    if (!splitk_last(p))
        return;
    W4AX_WG_FOR_EACH(store_out(p, t, n, splitk_sum(p, t, n)))
#undef W4AX_WG_FOR_EACH
#endif
}

/* ---- host side: plans and launch ---- */

constexpr int STREAM_WARPS = 4;
constexpr int STREAM_MAX_RANGE = 2048; /* bytes of K per CTA (bounds shared memory) */

struct plan_t {
    comet_w4ax_kernel kernel;
    int MI, S;
    dim3 grid, block;
    size_t smem, ws_bytes;
};


int sm_count()
{
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1)
            n = 132;
    }
    return n;
}

/* Tile counters at the start of the workspace, rounded up to 256 bytes; partials follow. */
size_t counter_bytes(const plan_t &pl)
{
    return ((size_t)pl.grid.x * pl.grid.y * sizeof(unsigned) + 255) / 256 * 256;
}

/* wgmma needs sm_90 (this file is built for sm_90a there). */
bool has_wgmma()
{
    static int major = -1;
    if (major < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
            major = 0;
    }
    return major == 9;
}

int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

plan_t make_plan(const comet_cuda_w4ax_gemm *g)
{
    plan_t pl = {};
    const int nb = g->K / g->B, np16 = (g->N + 15) / 16, sms = sm_count();
    pl.kernel = g->kernel != COMET_W4AX_KERNEL_AUTO ? g->kernel
                : g->M <= 32                        ? COMET_W4AX_KERNEL_STREAM
                : has_wgmma()                       ? COMET_W4AX_KERNEL_WGMMA
                                                    : COMET_W4AX_KERNEL_TILED;
    if (pl.kernel == COMET_W4AX_KERNEL_STREAM) {
        pl.MI = g->M <= 8 ? 1 : g->M <= 16 ? 2 : 4;
        pl.grid = dim3((np16 + STREAM_WARPS - 1) / STREAM_WARPS, (g->M + 8 * pl.MI - 1) / (8 * pl.MI), 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = (4 * sms + ctas - 1) / ctas;
        int min_s = (nb + STREAM_MAX_RANGE / g->B - 1) / (STREAM_MAX_RANGE / g->B);
        S = g->splits > 0 ? g->splits : S;
        S = clampi(S < min_s ? min_s : S, 1, nb);
        pl.S = S;
        int range = (nb + S - 1) / S * g->B;
        pl.block = dim3(STREAM_WARPS * 32);
        pl.smem = (size_t)8 * pl.MI * (range + 16);
    } else if (pl.kernel == COMET_W4AX_KERNEL_WGMMA) {
        const int nwg = WG_NWG;
        pl.MI = 16 * nwg;
        pl.grid = dim3((np16 + 4 * nwg - 1) / (4 * nwg), (g->M + WBM - 1) / WBM, 1);
        int ctas = (int)(pl.grid.x * pl.grid.y);
        int S = ctas >= sms ? 1 : (sms + ctas - 1) / ctas;
        S = g->splits > 0 ? g->splits : S;
        pl.S = clampi(S, 1, nb);
        pl.block = dim3(128 * nwg);
        pl.smem = (size_t)wg_smem_bytes(g->B / 64, WG_NWG);
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
    if (pl.S > 1)
        pl.ws_bytes = counter_bytes(pl) + (size_t)pl.S * g->M * g->N * sizeof(float);
    return pl;
}

/* Dynamic shared memory above 48 KB must be allowed per kernel; done once per kernel. */
constexpr int MAX_SMEM = 96 * 1024;
static_assert(TSMEM_BYTES <= MAX_SMEM && 8 * 4 * (STREAM_MAX_RANGE + 16) <= MAX_SMEM &&
                  wg_smem_bytes(2, WG_NWG) <= MAX_SMEM && wg_smem_bytes(1, WG_NWG) <= MAX_SMEM,
              "shared memory plans exceed MAX_SMEM");

template <typename K> cudaError_t launch(K kernel, const plan_t &pl, const params &p, cudaStream_t st)
{
    static std::mutex mu;
    static const void *done[32];
    static int n_done = 0;
    std::lock_guard<std::mutex> lock(mu);
    bool seen = false;
    for (int i = 0; i < n_done; i++)
        seen |= done[i] == (const void *)kernel;
    if (!seen) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_SMEM);
        if (e != cudaSuccess)
            return e;
        if (n_done < 32)
            done[n_done++] = (const void *)kernel;
    }
    kernel<<<pl.grid, pl.block, pl.smem, st>>>(p);
    return cudaGetLastError();
}

template <bool BSUM> cudaError_t launch_variant(const plan_t &pl, int kpb, const params &p, cudaStream_t st)
{
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA)
        return kpb == 1 ? launch(w4ax_wgmma_kernel<1, WG_NWG, BSUM>, pl, p, st)
                        : launch(w4ax_wgmma_kernel<2, WG_NWG, BSUM>, pl, p, st);
    if (pl.kernel == COMET_W4AX_KERNEL_TILED)
        return kpb == 1 ? launch(w4ax_tiled_kernel<1, BSUM>, pl, p, st)
                        : launch(w4ax_tiled_kernel<2, BSUM>, pl, p, st);
    if (pl.MI == 1)
        return kpb == 1 ? launch(w4ax_stream_kernel<1, 1, STREAM_WARPS, BSUM>, pl, p, st)
                        : launch(w4ax_stream_kernel<1, 2, STREAM_WARPS, BSUM>, pl, p, st);
    if (pl.MI == 2)
        return kpb == 1 ? launch(w4ax_stream_kernel<2, 1, STREAM_WARPS, BSUM>, pl, p, st)
                        : launch(w4ax_stream_kernel<2, 2, STREAM_WARPS, BSUM>, pl, p, st);
    return kpb == 1 ? launch(w4ax_stream_kernel<4, 1, STREAM_WARPS, BSUM>, pl, p, st)
                    : launch(w4ax_stream_kernel<4, 2, STREAM_WARPS, BSUM>, pl, p, st);
}

comet_status check_args(const comet_cuda_w4ax_gemm *g)
{
    if (!g || g->M < 1 || g->N < 1 || g->K < 64 || g->K % 64 || (g->B != 64 && g->B != 128) ||
        g->K % g->B || g->n8 < 0 || g->n8 > g->K / g->B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: bad shape M=%d N=%d K=%d B=%d n8=%d; need M, N >= 1, "
                               "K a multiple of 64 and of B in {64, 128}, 0 <= n8 <= K/B",
                               g ? g->M : 0, g ? g->N : 0, g ? g->K : 0, g ? g->B : 0, g ? g->n8 : 0);
    if ((int)g->kernel < 0 || g->kernel >= COMET_W4AX_KERNEL_COUNT || g->splits < 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: kernel %d / splits %d out of range",
                               (int)g->kernel, g->splits);
    return COMET_OK;
}

comet_status check_pointers(const comet_cuda_w4ax_gemm *g)
{
    if (!g->qw || !g->sw || !g->qa || !g->sa || (!g->y && !g->y_f16))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax: qw, sw, qa, sa and one of y, y_f16 must be non-NULL");
    if ((uintptr_t)g->qw % 16 || (uintptr_t)g->qa % 16)
        return comet_set_error(COMET_ERR_INVALID_ARG, "gemm_w4ax: qw and qa must be 16-byte aligned");
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
    static char buf[96];
    if (check_args(g) < 0) {
        comet_clear_error();
        return "invalid";
    }
    plan_t pl = make_plan(g);
    snprintf(buf, sizeof buf, "%s MI=%d S=%d grid=%ux%ux%u",
             pl.kernel == COMET_W4AX_KERNEL_STREAM  ? "stream"
             : pl.kernel == COMET_W4AX_KERNEL_WGMMA ? "wgmma"
                                                    : "tiled",
             pl.MI, pl.S, pl.grid.x,
             pl.grid.y, pl.grid.z);
    return buf;
}

extern "C" comet_status comet_cuda_gemm_w4ax(const comet_cuda_w4ax_gemm *g, void *stream)
{
    COMET_TRY(check_args(g));
    COMET_TRY(check_pointers(g));
    plan_t pl = make_plan(g);
    if (pl.kernel == COMET_W4AX_KERNEL_WGMMA && !has_wgmma())
        return comet_set_error(COMET_ERR_UNSUPPORTED, "gemm_w4ax: the wgmma kernel needs an sm_90 GPU");
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
    cudaStream_t st = (cudaStream_t)stream;
    const int kpb = g->B / 64;
    cudaError_t e;
    e = g->bsum ? launch_variant<true>(pl, kpb, p, st) : launch_variant<false>(pl, kpb, p, st);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "gemm_w4ax: launch of %s failed: %s",
                               comet_cuda_gemm_w4ax_plan_name(g), cudaGetErrorString(e));
    return COMET_OK;
}

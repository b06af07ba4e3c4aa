/* gemm_w4ax_tiled.cuh — the tiled kernel (M > 32 on sm_80): 128 x 128 CTA tiles, a 4-stage
 * cp.async pipeline, activations through ldmatrix. Part of gemm_w4ax.cu's one translation unit
 * (it includes every gemm_w4ax_*.cuh in order), so the kernels compile exactly as one file
 * would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_pipe.cuh"

namespace {

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
__global__ void __launch_bounds__(256, 1) w4ax_tiled_kernel(params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wn = warp & 1, wm = warp >> 1;
    const int s = blockIdx.z, b0 = s * p.nb / p.S, b1 = (s + 1) * p.nb / p.S;
    const int nt0 = blockIdx.x * (TBN / 16), t0 = blockIdx.y * TBM, np16 = p.Np / 16;
    const int k64 = p.K / 64, c0 = b0 * KPB, nch = (b1 - b0) * KPB;
    pdl_trigger();
    if (p.pdl && tid < TBN / 16 &&
        nt0 + tid < np16) /* the first weights of the CTA's 8 tiles, into L2 */
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
#define W4AX_TILED_FRAG(BODY)                                                                      \
    _Pragma("unroll")                                                                              \
    for (int f = 0; f < 4; f++)                                                                    \
        _Pragma("unroll")                                                                          \
    for (int r = 0; r < 4; r++) {                                                                  \
        int t = t0 + wm * 32 + f * 8 + tq * 2 + (r & 1);                                           \
        int n = (nt0 + wn * 4 + i) * 16 + g + (r >> 1) * 8;                                        \
        if (t < p.M && n < p.N) {                                                                  \
            BODY;                                                                                  \
        }                                                                                          \
    }
#define W4AX_TILED_FOR_EACH(BODY)                                                                  \
    _Pragma("unroll")                                                                              \
    for (int i = 0; i < 4; i++) {                                                                  \
        W4AX_TILED_FRAG(BODY)                                                                      \
    }
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

} // namespace

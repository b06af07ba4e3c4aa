/* gemm_w4ax_stream.cuh — the stream kernel (M <= 8 on sm_90 where the pipe plan does not apply;
 * M <= 32 on sm_80): warps stream 16-row weight slices from global memory into registers, K
 * split across CTAs. Part of gemm_w4ax.cu's one translation unit (it includes every
 * gemm_w4ax_*.cuh in order), so the kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/gemm_w4ax_common.cuh"

namespace {

/* Stream kernel. Grid (ceil(Np/16 / WARPS), ceil(M / (8*MI)), S); WARPS warps per CTA, warp
 * w owning weight rows [16*(blockIdx.x*WARPS + w), +16) and tokens
 * [8*MI*blockIdx.y, +8*MI). Split s covers activation blocks [s*nb/S, (s+1)*nb/S). The CTA
 * first copies its tokens' codes for that K range into shared memory (rows padded by 16
 * bytes: conflict-free 4-byte B-fragment reads), then each warp runs a register-double-
 * buffered loop over groups of G = 4 k64 chunks: issue the 16-byte loads of the next group
 * (and its weight scales), then 2*MI mma per chunk of the current group, promoting at each
 * block end. KPB = B/64 chunks per block. */
template <int MI, int KPB, int WARPS, bool BSUM, bool CL, int G>
__global__ void __launch_bounds__(WARPS * 32) w4ax_stream_kernel(params p) {
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
    const uint8_t *wp =
        p.qw + ((size_t)(active ? nt : 0) * (p.K / 64) + (size_t)b0 * KPB) * 512 + lane * 16;
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
                swc[j][0] = ld_sw(swp + (size_t)j * p.Np),
                swc[j][1] = ld_sw(swp + (size_t)j * p.Np + 8);
    }
    pdl_wait(); /* the weights above may be read while the previous kernel runs, nothing else */
    const int rows = min(8 * MI, p.M - t0); /* token rows past M are never read */
    for (int i = threadIdx.x; i < rows * (R / 16); i += WARPS * 32) {
        int row = i / (R / 16), col = (i % (R / 16)) * 16;
        cp_async16_tok(smem + row * RS + col,
                       p.qa + (size_t)(t0 + row) * p.K + (size_t)b0 * B + col);
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
                        sac[j][f][e] =
                            (t < p.M && b < b1) ? __ldg(&p.sa[(size_t)t * p.nb + b]) : 0.0f;
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
                        const float swf[2] = {f16f(swc[jb][0]) * 0.0625f,
                                              f16f(swc[jb][1]) * 0.0625f};
#pragma unroll
                        for (int f = 0; f < MI; f++)
#pragma unroll
                            for (int r = 0; r < 4; r++) {
                                float sc = sac[jb][f][r & 1] * swf[r >> 1];
                                acc[f][r] = fmaf((float)ci[f][r], sc, acc[f][r]);
                                if (BSUM) {
                                    int t = t0 + f * 8 + tq * 2 + (r & 1),
                                        n = nt * 16 + g + (r >> 1) * 8;
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

#define W4AX_STREAM_FOR_EACH(BODY)                                                                 \
    _Pragma("unroll")                                                                              \
    for (int f = 0; f < MI; f++)                                                                   \
        _Pragma("unroll")                                                                          \
    for (int r = 0; r < 4; r++) {                                                                  \
        int t = t0 + f * 8 + tq * 2 + (r & 1), n = nt * 16 + g + (r >> 1) * 8;                     \
        if (t < p.M && n < p.N) {                                                                  \
            BODY;                                                                                  \
        }                                                                                          \
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
    if (!splitk_last(p) || !active)
        return;
    /* split-outer: all of one split's loads are in flight together; each element still sums
     * its partials in split order from 0.0f */
    zero_acc<MI>(acc);
    for (int j = 0; j < p.S; j++)
        W4AX_STREAM_FOR_EACH(acc[f][r] += __ldcg(&p.part[((size_t)j * p.M + t) * p.N + n]))
    W4AX_STREAM_FOR_EACH(store_out(p, t, n, acc[f][r]))
#undef W4AX_STREAM_FOR_EACH
}

} // namespace

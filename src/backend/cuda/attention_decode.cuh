/* attention_decode.cuh — the flash-decoding kernel (attn_decode_kernel): the steps whose every
 * tile is one token (decode steps), K/V codes fetched ahead and dequantized in registers.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"

namespace {

/* Flash-decoding over the paged cache: attention of steps whose every tile is one token.
 *
 * CTA (blockIdx.x = tile = one token, blockIdx.y = KV head, blockIdx.z = key split),
 * DEC_THREADS threads, GM >= g query heads. The threads form key groups of LK = 2^lk_log2
 * lanes (the power of two at or above D / 8, at least 4): lane i of a group owns channels
 * 8i .. 8i+7 (lanes past D idle on zeros), so one group covers one key and NG = 128 / LK
 * groups take NG keys side by side; each group takes KU keys an iteration (keys k0 + u NG +
 * grp), fetching the raw codes and scales of all of them before using any, and the page ids
 * of its next iteration's keys while it computes. Per key a lane dequantizes its 8 K and 8 V
 * channels in registers (kv_dequant8), forms its partial dot products with the g query rows
 * it holds in registers (rotated by H_D in shared memory first when the cache is), and the
 * group sums them with xor shuffles; each lane keeps, per query head, the group's running
 * max and sum (the same in every lane) and its 8 output channels, rescaled once per
 * iteration. Split z takes keys [z * chunk, (z + 1) * chunk) of 0..positions[t], chunk =
 * ceil(n_keys / n_splits); a split with no keys still writes its (-inf, 0) partial. At the
 * end the groups meet in shared memory and are merged in group order (deterministic); one
 * split writes the normalized rows (rotated back by H_D in shared memory when the cache is
 * rotated), several write the unnormalized rows and (max, sum) to the workspace in
 * attn_kernel's layout for attn_combine_kernel. */
template <int BITS, int GM>
static __global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel(att_args a) {
    /* keys in flight per group: all the registers the raw bytes and scores may take beside
     * GM x 8 query and GM x 8 output values */
    constexpr int KU = GM >= 8 ? 4 : 8;
    constexpr int MAX_NG = DEC_THREADS / 4;
    __shared__ __align__(16) float qs[GM * COMET_CUDA_KV_MAX_HEAD_DIM]; /* [g, D] q, then out */
    __shared__ __align__(16) float red[GM * DEC_THREADS * 8]; /* [NG, GM, LK * 8] outputs */
    __shared__ float ml[MAX_NG * GM * 2];                     /* [NG, GM] (max, sum) */

    const kv_args &L = a.L;
    const int tid = threadIdx.x, LK = 1 << a.lk_log2, NG = DEC_THREADS >> a.lk_log2;
    const int grp = tid >> a.lk_log2, c = (tid & (LK - 1)) * 8;
    const int kvh = blockIdx.y, split = blockIdx.z, g = a.g, D = L.D, H = a.H;
    const int t = a.tiles[2 * blockIdx.x], seq = a.tiles[2 * blockIdx.x + 1];
    const int n_keys = a.positions[t] + 1;
    const int chunk = (n_keys + a.n_splits - 1) / a.n_splits;
    const int kbeg = min(n_keys, split * chunk), kend = min(n_keys, kbeg + chunk);
    const int pbase = a.page_indptr[seq];
    const bool active = c < D;
    const int szo = BITS == 16 || !active ? 0 : 4 * (c / L.G);
    const size_t v_off = (size_t)L.Hkv * L.tile_bytes; /* a page's K head tile to its V one */
    const int step = NG * KU;

    /* the first iteration's page ids load while q is staged and rotated */
    int pg[KU];
#pragma unroll
    for (int u = 0; u < KU; u++) {
        const int kpos = kbeg + u * NG + grp;
        pg[u] = kpos < kend
                    ? a.page_indices[pbase + (a.p_shift >= 0 ? kpos >> a.p_shift : kpos / L.P)]
                    : 0;
    }
    const float *qg = a.q + ((size_t)t * H + (size_t)kvh * g) * D; /* [g, D] */
    for (int i = tid; i < g * D; i += DEC_THREADS)
        qs[i] = qg[i];
    __syncthreads();
    if (a.rotate)
        wht_smem(qs, g, D, D);
    float qr[GM][8];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        float4 lo = make_float4(0.0f, 0.0f, 0.0f, 0.0f), hi = lo;
        if (h < g && active) {
            lo = *reinterpret_cast<const float4 *>(qs + h * D + c);
            hi = *reinterpret_cast<const float4 *>(qs + h * D + c + 4);
        }
        qr[h][0] = lo.x, qr[h][1] = lo.y, qr[h][2] = lo.z, qr[h][3] = lo.w;
        qr[h][4] = hi.x, qr[h][5] = hi.y, qr[h][6] = hi.z, qr[h][7] = hi.w;
    }

    float m[GM], l[GM], o[GM][8];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[h][e] = 0.0f;
    }

    for (int k0 = kbeg; k0 < kend; k0 += step) {
        kv_raw8<BITS> kr[KU], vr[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int kpos = k0 + u * NG + grp;
            kr[u] = kv_raw8<BITS>{};
            vr[u] = kv_raw8<BITS>{};
            if (active && kpos < kend) {
                const int slot = a.p_shift >= 0 ? kpos & (L.P - 1) : kpos % L.P;
                const uint8_t *kt = L.base + ((size_t)pg[u] * 2 * L.Hkv + kvh) * L.tile_bytes;
                kr[u] = kv_fetch8<BITS>(L, kt, slot, c, szo);
                vr[u] = kv_fetch8<BITS>(L, kt + v_off, slot, c, szo);
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int kpos = k0 + step + u * NG + grp;
            if (kpos < kend)
                pg[u] = a.page_indices[pbase + (a.p_shift >= 0 ? kpos >> a.p_shift : kpos / L.P)];
        }

        /* scores: this lane's 8 channels, then the group's sum (every lane gets it) */
        float sc[KU][GM];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            float kf[8];
            kv_dequant8<BITS>(kr[u], kf);
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    d += qr[h][e] * kf[e];
                sc[u][h] = d;
            }
        }
        for (int off = LK >> 1; off > 0; off >>= 1) {
#pragma unroll
            for (int u = 0; u < KU; u++)
#pragma unroll
                for (int h = 0; h < GM; h++)
                    sc[u][h] += __shfl_xor_sync(0xffffffffu, sc[u][h], off);
        }

        /* online softmax: one rescale an iteration; while a head has seen no key its max is
         * -inf, the reference 0 keeps every exponent finite or -inf (weights 0) */
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float mx = m[h];
#pragma unroll
            for (int u = 0; u < KU; u++) {
                sc[u][h] = k0 + u * NG + grp < kend ? sc[u][h] * a.scale : -INFINITY;
                mx = fmaxf(mx, sc[u][h]);
            }
            const float mref = mx == -INFINITY ? 0.0f : mx;
            const float corr = expf(m[h] - mref);
            m[h] = mx;
            l[h] *= corr;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[h][e] *= corr;
#pragma unroll
            for (int u = 0; u < KU; u++) {
                sc[u][h] = expf(sc[u][h] - mref);
                l[h] += sc[u][h];
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            float vf[8];
            kv_dequant8<BITS>(vr[u], vf);
#pragma unroll
            for (int h = 0; h < GM; h++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    o[h][e] += sc[u][h] * vf[e];
        }
    }

    /* merge the key groups: each group's rows and (max, sum) to shared memory */
    const int RS = LK * 8; /* a group's row stride in red */
#pragma unroll
    for (int h = 0; h < GM; h++) {
        float *dst = red + (grp * GM + h) * RS + c;
        *reinterpret_cast<float4 *>(dst) = make_float4(o[h][0], o[h][1], o[h][2], o[h][3]);
        *reinterpret_cast<float4 *>(dst + 4) = make_float4(o[h][4], o[h][5], o[h][6], o[h][7]);
    }
    if (c == 0) {
#pragma unroll
        for (int h = 0; h < GM; h++) {
            ml[2 * (grp * GM + h)] = m[h];
            ml[2 * (grp * GM + h) + 1] = l[h];
        }
    }
    __syncthreads();
    const bool partial = a.n_splits > 1;
    for (int i = tid; i < g * D; i += DEC_THREADS) {
        const int h = i / D, d = i - h * D;
        float M = -INFINITY;
        for (int j = 0; j < NG; j++)
            M = fmaxf(M, ml[2 * (j * GM + h)]);
        float sum = 0.0f, acc = 0.0f;
        for (int j = 0; j < NG; j++) {
            const float mj = ml[2 * (j * GM + h)];
            if (mj == -INFINITY)
                continue;
            const float w = expf(mj - M);
            sum += ml[2 * (j * GM + h) + 1] * w;
            acc += red[(j * GM + h) * RS + d] * w;
        }
        if (partial) {
            const size_t slot = ((size_t)t * H + (size_t)kvh * g + h) * a.n_splits + split;
            a.ws_acc[slot * D + d] = acc;
            if (d == 0) {
                a.ws_ml[2 * slot] = M;
                a.ws_ml[2 * slot + 1] = sum;
            }
        } else {
            qs[i] = sum > 0.0f ? acc / sum : 0.0f; /* q is in registers since the loop */
        }
    }
    if (partial)
        return;
    __syncthreads();
    if (a.rotate)
        wht_smem(qs, g, D, D);
    float *og = a.out + ((size_t)t * H + (size_t)kvh * g) * D; /* [g, D] */
    for (int i = tid; i < g * D; i += DEC_THREADS)
        og[i] = qs[i];
}

} /* namespace */

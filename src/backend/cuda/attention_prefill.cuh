/* attention_prefill.cuh — the general paged flash-attention kernel on the CUDA cores
 * (attn_kernel): the steps that hold tiles of several tokens, less the prefill chunks that
 * attn_mma_kernel (attention_mma.cuh) takes, and every batch-invariant step.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"

namespace {

/* Flash-attention over the paged cache on the CUDA cores, fp32 throughout.
 *
 * CTA (blockIdx.x = tile * n_sub + sub, blockIdx.y = KV head, blockIdx.z = key split),
 * 256 threads. A tile is up to COMET_CUDA_ATTN_TILE consecutive tokens of one sequence;
 * sub-tile `sub` takes tt = R / g of them, so the CTA's R rows are (token, query head of
 * the GQA group) pairs that all share each K/V read. Q sits in shared memory ([R, DMAX],
 * rotated there by H_D when the cache is), the keys of split z ([z * chunk, ...) up to the
 * last token's position) stream through shared memory 32 at a time: the threads load
 * 8-channel units (4, 8 or 16 bytes of codes plus the group's scale and zero), dequantize
 * them to fp32 K [32, DMAX + 1] (padded: conflict-free column reads) and V [32, DMAX].
 * Scores: warp w owns rows w, w + 8, ..., lane j key j, dot products over D with K read
 * once per channel for all the warp's rows; the online softmax (running max and sum per
 * row, kept by every lane of the owning warp) masks keys past each row's position and
 * leaves P [R, 32] and each row's rescale factor in shared memory. Output: thread i owns
 * channel i % DMAX of rows i / DMAX + k * (256 / DMAX), R * DMAX / 256 fp32 accumulators
 * in registers, rescaled then advanced by P · V. One split: the normalized rows go out
 * (through shared memory and H_D again when rotated); several: the unnormalized rows and
 * (max, sum) go to the workspace for attn_combine_kernel. SPANS (batch-invariant, one split):
 * every ATT_SPAN keys the row's span state merges into its running state (att_merge) and
 * starts again. */
template <int DMAX, bool SPANS>
static __global__ void __launch_bounds__(ATT_THREADS) attn_kernel(att_args a) {
    constexpr int R = att_rows(DMAX), RW = R / 8, ACC = R * DMAX / ATT_THREADS,
                  RSTEP = ATT_THREADS / DMAX, KS = DMAX + 1;
    extern __shared__ float smem[];
    float *Qs = smem;                               /* [R, DMAX] */
    float *Ks = Qs + R * DMAX;                      /* [KC, DMAX + 1] */
    float *Vs = Ks + ATT_KC * KS;                   /* [KC, DMAX] */
    float *Ps = Vs + ATT_KC * DMAX;                 /* [R, KC] */
    float *corr_s = Ps + R * ATT_KC;                /* [R] */
    float *l_s = corr_s + R;                        /* [R] */
    float *m_s = l_s + R;                           /* [R] */
    int *rowpos = reinterpret_cast<int *>(m_s + R); /* [R] */

    const kv_args &L = a.L;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tile = blockIdx.x / a.n_sub, sub = blockIdx.x % a.n_sub;
    const int kvh = blockIdx.y, split = blockIdx.z, g = a.g, D = L.D, H = a.H;
    const int t_first = a.tiles[2 * tile], seq = a.tiles[2 * tile + 1];
    if (a.tc_min > 0 && a.token_indptr[seq + 1] - a.token_indptr[seq] >= a.tc_min)
        return; /* a prefill chunk: attn_mma_kernel's */
    const int tile_end = min(t_first + COMET_CUDA_ATTN_TILE, a.token_indptr[seq + 1]);
    const int t0 = t_first + sub * a.tt;
    const int nt = min(a.tt, tile_end - t0);
    if (nt <= 0)
        return;
    const int rows = nt * g;
    const int n_keys = a.positions[t0 + nt - 1] + 1; /* positions rise within a sequence */
    const int chunk = a.span > 0
                          ? a.span
                          : ((n_keys + a.n_splits - 1) / a.n_splits + ATT_KC - 1) / ATT_KC * ATT_KC;
    const int kbeg = split * chunk, kend = min(n_keys, kbeg + chunk);
    const int pbase = a.page_indptr[seq];

    for (int i = tid; i < R * DMAX; i += ATT_THREADS) {
        const int r = i / DMAX, d = i % DMAX;
        float val = 0.0f;
        if (r < rows && d < D)
            val = a.q[((size_t)(t0 + r / g) * H + kvh * g + r % g) * D + d];
        Qs[i] = val;
    }
    for (int i = tid; i < ATT_KC * KS; i += ATT_THREADS)
        Ks[i] = 0.0f;
    for (int i = tid; i < ATT_KC * DMAX; i += ATT_THREADS)
        Vs[i] = 0.0f;
    for (int r = tid; r < R; r += ATT_THREADS)
        rowpos[r] = r < rows ? a.positions[t0 + r / g] : -1;
    __syncthreads();
    if (a.rotate)
        wht_smem(Qs, rows, D, DMAX);

    float m_r[RW], l_r[RW], o[ACC];
    float Mr[SPANS ? RW : 1], Lr[SPANS ? RW : 1], A[SPANS ? ACC : 1]; /* SPANS: running state */
#pragma unroll
    for (int i = 0; i < RW; i++)
        m_r[i] = -INFINITY, l_r[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < ACC; i++)
        o[i] = 0.0f;
    if constexpr (SPANS) {
#pragma unroll
        for (int i = 0; i < RW; i++)
            Mr[i] = -INFINITY, Lr[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < ACC; i++)
            A[i] = 0.0f;
    }
    const int d_me = tid % DMAX, r_me = tid / DMAX;
    const int units = D / 8;

    for (int k0 = kbeg; k0 < kend; k0 += ATT_KC) {
        const int kcnt = min(ATT_KC, kend - k0);
        for (int u = tid; u < ATT_KC * units; u += ATT_THREADS) {
            const int j = u / units, c = (u % units) * 8;
            float kf[8], vf[8];
            if (j < kcnt) {
                const int kpos = k0 + j;
                const int page = a.page_indices[pbase + kpos / L.P], slot = kpos % L.P;
                kv_load8(L, kv_tile(L, page, 0, kvh), slot, c, kf);
                kv_load8(L, kv_tile(L, page, 1, kvh), slot, c, vf);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    kf[e] = 0.0f, vf[e] = 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                Ks[j * KS + c + e] = kf[e];
                Vs[j * DMAX + c + e] = vf[e];
            }
        }
        __syncthreads();

        float sacc[RW];
#pragma unroll
        for (int i = 0; i < RW; i++)
            sacc[i] = 0.0f;
        const int my_rows = rows > warp ? (rows - warp + 7) / 8 : 0;
        if (my_rows > 0) {
            const float *krow = Ks + lane * KS;
            for (int d = 0; d < D; d++) {
                const float kd = krow[d];
#pragma unroll
                for (int i = 0; i < RW; i++)
                    if (i < my_rows)
                        sacc[i] += Qs[(warp + 8 * i) * DMAX + d] * kd;
            }
        }
        const int kpos = k0 + lane;
#pragma unroll
        for (int i = 0; i < RW; i++) {
            const int r = warp + 8 * i;
            if (r >= rows)
                continue;
            const bool valid = lane < kcnt && kpos <= rowpos[r];
            const float sc = valid ? sacc[i] * a.scale : -INFINITY;
            const float mnew = fmaxf(m_r[i], warp_max(sc));
            float p = 0.0f, c = 1.0f;
            if (mnew != -INFINITY) {
                p = valid ? expf(sc - mnew) : 0.0f;
                c = expf(m_r[i] - mnew);
            }
            l_r[i] = l_r[i] * c + warp_sum(p);
            m_r[i] = mnew;
            Ps[r * ATT_KC + lane] = p;
            if (lane == 0)
                corr_s[r] = c;
        }
        __syncthreads();

#pragma unroll
        for (int i = 0; i < ACC; i++) {
            const int r = r_me + RSTEP * i;
            if (r < rows)
                o[i] *= corr_s[r];
        }
        for (int j = 0; j < kcnt; j++) {
            const float vj = Vs[j * DMAX + d_me];
#pragma unroll
            for (int i = 0; i < ACC; i++) {
                const int r = r_me + RSTEP * i;
                if (r < rows)
                    o[i] += Ps[r * ATT_KC + j] * vj;
            }
        }
        __syncthreads();
        if constexpr (SPANS) {
            if ((k0 + ATT_KC) % ATT_SPAN == 0 || k0 + ATT_KC >= kend) { /* the span ends */
#pragma unroll
                for (int i = 0; i < RW; i++) {
                    const int r = warp + 8 * i;
                    if (r >= rows)
                        continue;
                    float sa, sb;
                    att_merge(Mr[i], Lr[i], m_r[i], l_r[i], &sa, &sb);
                    m_r[i] = -INFINITY, l_r[i] = 0.0f;
                    if (lane == 0)
                        corr_s[r] = sa, l_s[r] = sb;
                }
                __syncthreads();
#pragma unroll
                for (int i = 0; i < ACC; i++) {
                    const int r = r_me + RSTEP * i;
                    if (r < rows)
                        A[i] = att_merge_row(A[i], o[i], corr_s[r], l_s[r]);
                    o[i] = 0.0f;
                }
                __syncthreads();
            }
        }
    }
    if constexpr (SPANS) { /* the running state is the result */
#pragma unroll
        for (int i = 0; i < RW; i++)
            m_r[i] = Mr[i], l_r[i] = Lr[i];
#pragma unroll
        for (int i = 0; i < ACC; i++)
            o[i] = A[i];
    }

    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < RW; i++) {
            const int r = warp + 8 * i;
            if (r < rows)
                l_s[r] = l_r[i], m_s[r] = m_r[i];
        }
    }
    __syncthreads();
    if (a.n_splits > 1) {
#pragma unroll
        for (int i = 0; i < ACC; i++) {
            const int r = r_me + RSTEP * i;
            if (r >= rows)
                continue;
            const size_t slot = ((size_t)(t0 + r / g) * H + kvh * g + r % g) * a.n_splits + split;
            if (d_me < D)
                a.ws_acc[slot * D + d_me] = o[i];
            if (d_me == 0) {
                a.ws_ml[2 * slot] = m_s[r];
                a.ws_ml[2 * slot + 1] = l_s[r];
            }
        }
        return;
    }
    /* Q is no longer read: its shared memory holds the normalized rows */
#pragma unroll
    for (int i = 0; i < ACC; i++) {
        const int r = r_me + RSTEP * i;
        if (r < rows)
            Qs[r * DMAX + d_me] = l_s[r] > 0.0f ? o[i] / l_s[r] : 0.0f;
    }
    __syncthreads();
    if (a.rotate)
        wht_smem(Qs, rows, D, DMAX);
    for (int i = tid; i < rows * D; i += ATT_THREADS) {
        const int r = i / D, d = i % D;
        a.out[((size_t)(t0 + r / g) * H + kvh * g + r % g) * D + d] = Qs[r * DMAX + d];
    }
}

} /* namespace */

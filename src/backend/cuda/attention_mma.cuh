/* attention_mma.cuh — the tensor-core prefill kernel (attn_mma_kernel): the prefill chunks of
 * at least ATT_MMA_MIN_TOKENS tokens at head dims 64 and 128, outside batch-invariant steps,
 * where its pipelined form attn_mma2_kernel (attention_mma2.cuh, the same arithmetic) does not
 * take them: GQA groups above 8, or every chunk with COMET_CUDA_ATTN_MMA=1 (the A/B);
 * fp16 operands on mma.sync m16n8k16 with fp32 accumulators and an fp32 online softmax (K
 * from INT4 / INT8 codes as an fp16 hi + lo pair).
 * The other tiles of such a step take attn_kernel (attention_prefill.cuh) in a launch of
 * their own; which kernel a tile takes depends on its sequence's chunk alone (att_args.tc_min).
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/ptx.cuh"

namespace {

/* Query rows of a CTA (four warps of 16 rows: one m16 tile each) and keys of a key tile.
 * The rows are (token, query head of the GQA group) pairs, token-major, exactly as
 * attn_kernel's (att_rows(128) of them), so every query head of a KV head shares each K/V
 * tile a CTA dequantizes: at LLaMA-3's g = 4 a CTA is 16 tokens x 4 heads; with g <= 2 a CTA
 * takes 64 / g tokens (several attention tiles) so that all four warps have rows. */
constexpr int MMA_THREADS = 128, MMA_ROWS = 64, MMA_KT = 64;
/* Fewest tokens of one sequence in a step that take the tensor-core kernel (cuda_kv.h) */
constexpr int ATT_MMA_MIN_TOKENS = COMET_CUDA_ATTN_MMA_MIN_TOKENS;
/* 8-channel K/V units a thread has in flight at once while it loads a key tile */
constexpr int MMA_LOAD_GROUP = 4;
static_assert(MMA_ROWS == att_rows(128), "attn_mma_kernel takes attn_kernel's tiling");

/* Shared memory of attn_mma_kernel at head dim D over a cache of BITS: fp32 Q [64, D] before
 * the key loop (and the normalized output after it) in the bytes of the loop's fp16 tiles
 * [64, D + 8] (rows padded by 16 bytes: ldmatrix's eight row addresses fall in distinct
 * banks): K, V and, for INT4 / INT8 codes, K's low part. */
__host__ __device__ constexpr int mma_smem_bytes(int D, int BITS) {
    return MMA_ROWS * D * 4 > (BITS == 16 ? 2 : 3) * MMA_KT * (D + 8) * 2
               ? MMA_ROWS * D * 4
               : (BITS == 16 ? 2 : 3) * MMA_KT * (D + 8) * 2;
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Eight fp32 values as fp16 (hi) and, with LO, what rounding left of each as fp16 (lo: hi +
 * lo is the fp32 value to about 2^-22 of it). */
template <bool LO>
__device__ __forceinline__ void half8_hi_lo(const float (&f)[8], uint4 &hi, uint4 &lo) {
    uint32_t h[4], l[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const __half2 x = __floats2half2_rn(f[2 * e], f[2 * e + 1]);
        h[e] = *reinterpret_cast<const uint32_t *>(&x);
        if constexpr (LO) {
            const float2 xf = __half22float2(x);
            l[e] = half2_bits(__fsub_rn(f[2 * e], xf.x), __fsub_rn(f[2 * e + 1], xf.y));
        }
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    if constexpr (LO)
        lo = make_uint4(l[0], l[1], l[2], l[3]);
}

/* The eight channels of r (kv_fetch8) as fp16 (16 bytes each): fp16 codes as stored, INT4 /
 * INT8 codes dequantized in fp32 as kv_dequant8 does and rounded to fp16 (hi), with LO the
 * rest rounded to fp16 as well (lo: hi + lo is the fp32 value to about 2^-22 of it). An
 * all-zero r gives zeros. */
template <int BITS, bool LO>
__device__ __forceinline__ void kv_half8(const kv_raw8<BITS> &r, uint4 &hi, uint4 &lo) {
    if constexpr (BITS == 16) {
        hi = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
    } else {
        float f[8];
        kv_dequant8<BITS>(r, f);
        half8_hi_lo<LO>(f, hi, lo);
    }
}

/* The pieces of a tensor-core prefill kernel's CTA that attn_mma_kernel and attn_mma2_kernel
 * (attention_mma2.cuh) share. Rows are (token, query head of the GQA group) pairs, token-major;
 * a warp owns 16 of them, a thread rows r0 and r0 + 8 of its warp (r0 = 16 warp + lane / 4). */

/* The CTA's ROWS query rows (rows of them real, zeros after) into Qf [ROWS, D] fp32, their
 * positions into rowpos (-1 after), rotated by H_D when the cache is. */
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void mma_load_q(const att_args &a, float *Qf, int *rowpos, int t0,
                                           int rows, int kvh, int tid) {
    const int g = a.g, H = a.H;
    for (int i = tid; i < ROWS * D / 4; i += THREADS) {
        const int r = i / (D / 4), d = (i % (D / 4)) * 4;
        float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows)
            val = *reinterpret_cast<const float4 *>(
                a.q + ((size_t)(t0 + r / g) * H + kvh * g + r % g) * D + d);
        *reinterpret_cast<float4 *>(Qf + r * D + d) = val;
    }
    if (tid < ROWS)
        rowpos[tid] = tid < rows ? a.positions[t0 + tid / g] : -1;
    __syncthreads();
    if (a.rotate)
        wht_smem(Qf, rows, D, D);
}

/* This thread's state before the key loop: its m16n8k16 A fragments of Q (rows r0, r0 + 8)
 * in fp16, its rows' positions, its warp's last position (-1 when the warp has no row), O = 0,
 * running maxima -inf and sums 0. */
template <int D>
__device__ __forceinline__ void mma_rows_init(uint32_t (&qa)[D / 16][4], int &pos0, int &pos1,
                                              int &wmax, float (&o)[D / 8][4], float (&m_r)[2],
                                              float (&l_r)[2], const float *Qf,
                                              const int *rowpos, int r0, int ti) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const float *q0 = Qf + r0 * D + kk * 16 + 2 * ti, *q1 = q0 + 8 * D;
        qa[kk][0] = half2_bits(q0[0], q0[1]);
        qa[kk][1] = half2_bits(q1[0], q1[1]);
        qa[kk][2] = half2_bits(q0[8], q0[9]);
        qa[kk][3] = half2_bits(q1[8], q1[9]);
    }
    pos0 = rowpos[r0], pos1 = rowpos[r0 + 8];
    wmax = max(pos0, pos1);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m_r[0] = m_r[1] = -INFINITY;
    l_r[0] = l_r[1] = 0.0f;
}

/* s = Q K^T (+ Q K_lo^T with LO) of a key tile: Ks, Kl [MMA_KT, D + 8] fp16 in shared memory. */
template <int D, bool LO>
__device__ __forceinline__ void mma_scores(float (&s)[MMA_KT / 8][4],
                                           const uint32_t (&qa)[D / 16][4], const __half *Ks,
                                           const __half *Kl, int lane) {
    constexpr int KS = D + 8, NS = MMA_KT / 8;
#pragma unroll
    for (int n = 0; n < NS; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2)
#pragma unroll
        for (int n = 0; n < NS; n++) {
            uint32_t b[4]; /* k-steps kk and kk + 1 of keys 8n .. 8n + 7 */
            const int off = (n * 8 + (lane & 7)) * KS + kk * 16 + (lane >> 3) * 8;
            comet_ptx::ldsm_x4(b, Ks + off);
            comet_ptx::mma_f16(s[n], qa[kk], b[0], b[1]);
            comet_ptx::mma_f16(s[n], qa[kk + 1], b[2], b[3]);
            if constexpr (LO) {
                comet_ptx::ldsm_x4(b, Kl + off);
                comet_ptx::mma_f16(s[n], qa[kk], b[0], b[1]);
                comet_ptx::mma_f16(s[n], qa[kk + 1], b[2], b[3]);
            }
        }
}

/* The online softmax of rows r0 (e = 0, 1) and r0 + 8 (e = 2, 3) over the tile at k0: scores
 * scaled by sl2 (log2 units), keys past kend or past the row's position masked; a row's four
 * threads (one quad) hold its 64 scores. The running max moves in whole steps (m_r), O and
 * l are rescaled to it, and mref is the reference the tile's exponents take. */
template <int D>
__device__ __forceinline__ void mma_softmax(float (&s)[MMA_KT / 8][4], float (&mref)[2],
                                            float (&m_r)[2], float (&l_r)[2],
                                            float (&o)[D / 8][4], int k0, int kend, int pos0,
                                            int pos1, int ti, float sl2) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < MMA_KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + n * 8 + 2 * ti + (e & 1);
            const bool valid = key < kend && key <= (e < 2 ? pos0 : pos1);
            s[n][e] = valid ? s[n][e] * sl2 : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mnew = fmaxf(m_r[h], ceilf(mx[h]));
        /* a row that has seen no key keeps max -inf; its reference 0 keeps every
         * exponent -inf (weight 0) */
        const float corr = mnew == -INFINITY ? 1.0f : exp2f(m_r[h] - mnew);
        mref[h] = mnew == -INFINITY ? 0.0f : mnew;
        m_r[h] = mnew;
        l_r[h] *= corr;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            o[n][2 * h] *= corr, o[n][2 * h + 1] *= corr;
    }
}

/* O += P V over keys 16kk .. 16kk + 15 of the tile: P = 2^(s - mref) rounded to fp16 (l sums
 * the rounded values), V [MMA_KT, D + 8] fp16 in shared memory. */
template <int D>
__device__ __forceinline__ void mma_pv_step(int kk, const float (&s)[MMA_KT / 8][4],
                                            const float (&mref)[2], float (&l_r)[2],
                                            float (&o)[D / 8][4], const __half *Vs, int lane) {
    constexpr int KS = D + 8;
    uint32_t pa[4];
#pragma unroll
    for (int f = 0; f < 4; f++) { /* a0: row r0 keys 2ti.., a1: row r0 + 8, a2/a3: +8 keys */
        const float *sv = s[2 * kk + (f >> 1)] + 2 * (f & 1);
        const float ref = mref[f & 1];
        const __half2 ph = __floats2half2_rn(exp2f(sv[0] - ref), exp2f(sv[1] - ref));
        const float2 pf = __half22float2(ph);
        l_r[f & 1] += pf.x + pf.y;
        pa[f] = *reinterpret_cast<const uint32_t *>(&ph);
    }
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
        uint32_t b[4]; /* keys 16kk .. 16kk + 15 of channels 8n .. 8n + 15 */
        comet_ptx::ldsm_x4_trans(
            b, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (n + (lane >> 4)) * 8);
        comet_ptx::mma_f16(o[n], pa, b[0], b[1]);
        comet_ptx::mma_f16(o[n + 1], pa, b[2], b[3]);
    }
}

/* After the key loop: each row's sum over its quad (fixed order), then with several splits
 * the unnormalized rows and (max in natural-log units, sum) to the workspace for
 * attn_combine_kernel; with one, O / l through Qf [rows, D] (whose bytes the K/V tiles used:
 * SYNC first waits until every warp has read them), rotated back by H_D when the cache is
 * rotated, written out coalesced. */
template <int D, int THREADS, bool SYNC>
__device__ __forceinline__ void mma_finish(const att_args &a, float (&o)[D / 8][4],
                                           const float (&m_r)[2], float (&l_r)[2], float *Qf,
                                           int r0, int rows, int t0, int kvh, int split, int ti,
                                           int tid) {
    const int g = a.g, H = a.H;
#pragma unroll
    for (int h = 0; h < 2; h++) { /* the row sum over the quad, in a fixed order */
        l_r[h] += __shfl_xor_sync(0xffffffffu, l_r[h], 1);
        l_r[h] += __shfl_xor_sync(0xffffffffu, l_r[h], 2);
    }
    if (a.n_splits > 1) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + 8 * h;
            if (r >= rows)
                continue;
            const size_t slot = ((size_t)(t0 + r / g) * H + kvh * g + r % g) * a.n_splits + split;
            float *dst = a.ws_acc + slot * D + 2 * ti;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(dst + 8 * n) =
                    make_float2(o[n][2 * h], o[n][2 * h + 1]);
            if (ti == 0) {
                a.ws_ml[2 * slot] = m_r[h] == -INFINITY ? -INFINITY : m_r[h] * 0.693147180559945f;
                a.ws_ml[2 * slot + 1] = l_r[h];
            }
        }
        return;
    }
    if (SYNC)
        __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h;
        const float l = l_r[h];
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(Qf + r * D + 8 * n + 2 * ti) =
                l > 0.0f ? make_float2(o[n][2 * h] / l, o[n][2 * h + 1] / l)
                         : make_float2(0.0f, 0.0f);
    }
    __syncthreads();
    if (a.rotate)
        wht_smem(Qf, rows, D, D);
    for (int i = tid; i < rows * D / 4; i += THREADS) {
        const int r = i / (D / 4), d = (i % (D / 4)) * 4;
        *reinterpret_cast<float4 *>(a.out + ((size_t)(t0 + r / g) * H + kvh * g + r % g) * D + d) =
            *reinterpret_cast<const float4 *>(Qf + r * D + d);
    }
}

/* Flash-attention of prefill chunks on tensor cores (FlashAttention-2's warp layout).
 *
 * Grid: attn_kernel's (blockIdx.x = tile * n_sub + sub, blockIdx.y = KV head, blockIdx.z =
 * key split), 128 threads. A CTA whose sequence has fewer than a.tc_min tokens in the step
 * returns at once (attn_kernel takes it); with g <= 2 a CTA takes 64 / (16 g) consecutive
 * tiles of its sequence and the CTAs of the other tiles of that group return. The CTA's
 * rows (token, head) are token-major; warp w owns rows 16w .. 16w + 15.
 * Q: loaded as fp32 into shared memory, rotated there by H_D when the cache is, then held
 * by each warp as fp16 A fragments (D / 16 k-steps, 4 registers each) for the whole loop.
 * Keys of the CTA's split (the keys up to its last token's position, cut into n_splits
 * chunks of whole 64-key tiles) come 64 at a time: each thread reads D / 16 8-channel units
 * of K and V codes with their group's scale and zero, MMA_LOAD_GROUP units' loads in flight
 * at once, dequantizes them in fp32 (kv_dequant8, the reference's rounding) and stores
 * fp16 K [64, D + 8] and V [64, D + 8], and for K also the rest of each value rounded to
 * fp16 (K_lo); fp16 caches are copied as stored; keys past
 * the split's end are zeros. Per warp and key tile: S [16, 64] = Q K^T (+ Q K_lo^T: without
 * it K's fp16 rounding, times q's outlier channels, dominated the error; ldmatrix of K,
 * 8 n-tiles x D / 16 mma, twice with K_lo), scaled by log2(e) / sqrt(D),
 * masked per row (key <= the row's position, key < the split's end), then the online
 * softmax in fp32 in the accumulator registers: the running row max is kept at an integer
 * (the ceiling of the scores' max) so P = exp2(s - max) <= 1 and every rescaling is an
 * exact power of two: a key's fp16 P is then the same bits up to a power of two however
 * the keys are split into tiles and across CTAs, and a sequence's result moves only by
 * fp32 rounding between one step composition and another. P goes to fp16 A fragments in
 * registers (the accumulator layout of two n-tiles is the A layout of one k-step), the row
 * sum takes the rounded P, and O [16, D] += P V (ldmatrix.trans of V, D / 8 n-tiles of 4
 * fp32 accumulators). A warp skips the math of a key tile past its rows' last position.
 * One split: O / l per row to shared memory (fp32, over the K/V tiles), rotated back by
 * H_D when the cache is rotated, written out coalesced. Several: the unnormalized rows and
 * (max in natural-log units, sum) go to the workspace for attn_combine_kernel, as
 * attn_kernel's do. */
template <int D, int BITS>
static __global__ void __launch_bounds__(MMA_THREADS) attn_mma_kernel(att_args a) {
    constexpr int KS = D + 8;      /* halves per K / V row in shared memory */
    constexpr int NK = D / 16;     /* k-steps of Q K^T */
    constexpr int NO = D / 8;      /* n-tiles of O */
    constexpr int NS = MMA_KT / 8; /* n-tiles of S */
    constexpr int UNITS = D / 8;   /* 8-channel units of a key */
    /* units a thread loads a key tile, and how many of them have their loads in flight */
    constexpr int UPT = MMA_KT * UNITS / MMA_THREADS;
    constexpr int LG = UPT < MMA_LOAD_GROUP ? UPT : MMA_LOAD_GROUP;
    static_assert(UPT % LG == 0, "whole load groups");
    static_assert(D % 32 == 0 && D <= 128, "head dims 64 and 128");
    constexpr bool LO = BITS != 16; /* K_lo: fp16 K is exact for an fp16 cache */
    extern __shared__ __align__(16) unsigned char mma_smem[]; /* mma_smem_bytes(D, BITS) */
    __shared__ int rowpos[MMA_ROWS];
    float *Qf = reinterpret_cast<float *>(mma_smem);   /* [64, D] q, later the output */
    __half *Ks = reinterpret_cast<__half *>(mma_smem); /* [64, KS] */
    __half *Vs = Ks + MMA_KT * KS;                     /* [64, KS] */
    __half *Kl = Vs + MMA_KT * KS;                     /* [64, KS], LO only */

    const kv_args &L = a.L;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gi = lane >> 2, ti = lane & 3; /* the mma fragments' row group, column pair */
    const int tile = blockIdx.x / a.n_sub, sub = blockIdx.x % a.n_sub;
    const int kvh = blockIdx.y, split = blockIdx.z, g = a.g;
    const int t_first = a.tiles[2 * tile], seq = a.tiles[2 * tile + 1];
    const int seq_beg = a.token_indptr[seq], seq_end = a.token_indptr[seq + 1];
    if (seq_end - seq_beg < a.tc_min)
        return;
    int t0, nt;
    if (a.n_sub == 1) { /* g <= 4: whole tiles, 64 / (16 g) of them a CTA */
        const int tpc = max(1, MMA_ROWS / (g * COMET_CUDA_ATTN_TILE));
        if ((t_first - seq_beg) / COMET_CUDA_ATTN_TILE % tpc)
            return;
        t0 = t_first;
        nt = min(tpc * COMET_CUDA_ATTN_TILE, seq_end - t0);
    } else { /* g > 4: sub-tiles of tt = 64 / g tokens */
        t0 = t_first + sub * a.tt;
        nt = min(a.tt, min(t_first + COMET_CUDA_ATTN_TILE, seq_end) - t0);
        if (nt <= 0)
            return;
    }
    const int rows = nt * g;
    const int n_keys = a.positions[t0 + nt - 1] + 1; /* positions rise within a sequence */
    const int chunk = ((n_keys + a.n_splits - 1) / a.n_splits + MMA_KT - 1) / MMA_KT * MMA_KT;
    const int kbeg = split * chunk, kend = min(n_keys, kbeg + chunk);
    const int pbase = a.page_indptr[seq];

    mma_load_q<D, MMA_ROWS, MMA_THREADS>(a, Qf, rowpos, t0, rows, kvh, tid);
    const int r0 = warp * 16 + gi; /* this thread's rows r0 and r0 + 8 */
    uint32_t qa[NK][4];
    int pos0, pos1, wmax;
    float o[NO][4], m_r[2], l_r[2];
    mma_rows_init<D>(qa, pos0, pos1, wmax, o, m_r, l_r, Qf, rowpos, r0, ti);
    const float sl2 = a.scale * 1.44269504088896341f; /* 1/sqrt(D) and log2(e) */

    for (int k0 = kbeg; k0 < kend; k0 += MMA_KT) {
        const int kcnt = min(MMA_KT, kend - k0);
        __syncthreads(); /* Q (first tile) or the previous K/V tiles are read */
        /* LG units at a time: their page ids, then their codes and scales, in flight
         * together; then dequantized and stored */
#pragma unroll 1
        for (int i0 = 0; i0 < UPT; i0 += LG) {
            kv_raw8<BITS> kr[LG], vr[LG];
#pragma unroll
            for (int i = 0; i < LG; i++) {
                const int u = tid + (i0 + i) * MMA_THREADS, j = u / UNITS, c = (u % UNITS) * 8;
                kr[i] = kv_raw8<BITS>{};
                vr[i] = kv_raw8<BITS>{};
                if (j < kcnt) {
                    const int kpos = k0 + j;
                    const int page = a.page_indices[pbase + kpos / L.P], slot = kpos % L.P;
                    const int szo = BITS == 16 ? 0 : 4 * (c / L.G);
                    kr[i] = kv_fetch8<BITS>(L, kv_tile(L, page, 0, kvh), slot, c, szo);
                    vr[i] = kv_fetch8<BITS>(L, kv_tile(L, page, 1, kvh), slot, c, szo);
                }
            }
#pragma unroll
            for (int i = 0; i < LG; i++) {
                const int u = tid + (i0 + i) * MMA_THREADS, j = u / UNITS, c = (u % UNITS) * 8;
                uint4 kh, kl, vh, vl;
                kv_half8<BITS, LO>(kr[i], kh, kl);
                kv_half8<BITS, false>(vr[i], vh, vl);
                *reinterpret_cast<uint4 *>(Ks + j * KS + c) = kh;
                *reinterpret_cast<uint4 *>(Vs + j * KS + c) = vh;
                if constexpr (LO)
                    *reinterpret_cast<uint4 *>(Kl + j * KS + c) = kl;
            }
        }
        __syncthreads();
        if (k0 > wmax) /* every key of the tile is past this warp's rows */
            continue;

        float s[NS][4], mref[2];
        mma_scores<D, LO>(s, qa, Ks, Kl, lane);
        mma_softmax<D>(s, mref, m_r, l_r, o, k0, kend, pos0, pos1, ti, sl2);
#pragma unroll
        for (int kk = 0; kk < MMA_KT / 16; kk++)
            mma_pv_step<D>(kk, s, mref, l_r, o, Vs, lane);
    }
    mma_finish<D, MMA_THREADS, true>(a, o, m_r, l_r, Qf, r0, rows, t0, kvh, split, ti, tid);
}

} /* namespace */

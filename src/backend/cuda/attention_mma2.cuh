/* attention_mma2.cuh — the pipelined tensor-core prefill kernel (attn_mma2_kernel): the prefill
 * chunks of at least ATT_MMA_MIN_TOKENS tokens at head dims 64 and 128 with GQA groups of at
 * most MMA2_MAX_G query heads, outside batch-invariant steps (the step view's attn_mma 2, the
 * backend's default; with attn_mma 3 the chunks attn_mma3_kernel, attention_mma3.cuh, does not
 * take). attn_mma_kernel (attention_mma.cuh) takes larger groups and, with
 * COMET_CUDA_ATTN_MMA=1, every chunk (the A/B of this one).
 * Its arithmetic is attn_mma_kernel's, operation for operation: the same fp16 K (hi + lo), V,
 * Q and P, the same mma order and the same softmax, so a row's output is the same bits as that
 * kernel's whenever both cut the row's keys into the same splits (always with one split).
 * What differs is the work around it: 128 query rows a CTA (eight warps) instead of 64, so each
 * dequantized K/V tile serves twice the queries; the next tile's codes loaded into registers
 * while the tensor cores work on the current one (two tiles in shared memory, one barrier a
 * tile); and the dequantization with fewer instructions a channel.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/ptx.cuh"

namespace {

/* Query rows of a CTA (eight warps of 16 rows) and the most query heads per KV head it takes:
 * at g <= 8 a CTA holds whole 16-token attention tiles (128 / (16 g) of them, at least one). */
constexpr int MMA2_THREADS = 256, MMA2_ROWS = 128, MMA2_MAX_G = 8;
static_assert(MMA2_MAX_G * COMET_CUDA_ATTN_TILE <= MMA2_ROWS, "a whole tile a CTA");

/* What a CTA of 128 query rows (attn_mma2_kernel, attn_mma3_kernel) works on. Grid:
 * attn_kernel's, counted from the end (blockIdx.x = gridDim.x - 1 - (tile * n_sub + sub)): the
 * CTAs of a chunk's last tiles, with the most keys (a causal chunk's tail), start first, so the
 * short ones fill the last wave; blockIdx.y = KV head, blockIdx.z = key split. A CTA takes
 * tpc = max(1, 128 / (16 g)) consecutive tiles of its sequence from the first of each group:
 * its KV head and key split, its first token t0, its rows (tokens x g), the keys of its split [kbeg, kend) (the keys up
 * to its last token's position cut into n_splits chunks of whole 64-key tiles,
 * attn_mma_kernel's formula) and its sequence's first page (pbase). False: the CTA has no work
 * (a sequence with fewer than a.tc_min tokens in the step, sub > 0, a tile that is not the
 * first of its group). */
/* Consecutive 16-token tiles of one sequence a 128-row CTA takes at GQA group g >= 1: whole
 * tiles, at least one. */
__host__ __device__ constexpr int mma_tiles_per_cta(int g) {
    return MMA2_ROWS / (g * COMET_CUDA_ATTN_TILE) > 1 ? MMA2_ROWS / (g * COMET_CUDA_ATTN_TILE) : 1;
}

struct mma_cta {
    int kvh, split, t0, rows, kbeg, kend, pbase;
};
__device__ __forceinline__ bool mma_cta_of(const att_args &a, mma_cta &c) {
    const int bx = gridDim.x - 1 - blockIdx.x;
    const int tile = bx / a.n_sub, sub = bx % a.n_sub;
    const int kvh = blockIdx.y, split = blockIdx.z, g = a.g;
    const int t_first = a.tiles[2 * tile], seq = a.tiles[2 * tile + 1];
    const int seq_beg = a.token_indptr[seq], seq_end = a.token_indptr[seq + 1];
    if (seq_end - seq_beg < a.tc_min || sub != 0)
        return false;
    const int tpc = mma_tiles_per_cta(g);
    if ((t_first - seq_beg) / COMET_CUDA_ATTN_TILE % tpc)
        return false;
    const int t0 = t_first, nt = min(tpc * COMET_CUDA_ATTN_TILE, seq_end - t0);
    const int rows = nt * g;
    const int n_keys = a.positions[t0 + nt - 1] + 1; /* positions rise within a sequence */
    const int chunk = ((n_keys + a.n_splits - 1) / a.n_splits + MMA_KT - 1) / MMA_KT * MMA_KT;
    const int kbeg = split * chunk, kend = min(n_keys, kbeg + chunk);
    const int pbase = a.page_indptr[seq];
    c = mma_cta{kvh, split, t0, rows, kbeg, kend, pbase};
    return true;
}

/* Shared memory of attn_mma2_kernel at head dim D over a cache of BITS: fp32 Q [128, D] before
 * the key loop (the normalized output after it) in the bytes of two stages of the loop's fp16
 * tiles [64, D + 8] each (K, V and, for INT4 / INT8 codes, K's low part). */
__host__ __device__ constexpr int mma2_stage_bytes(int D, int BITS) {
    return (BITS == 16 ? 2 : 3) * MMA_KT * (D + 8) * 2;
}
__host__ __device__ constexpr int mma2_smem_bytes(int D, int BITS) {
    return MMA2_ROWS * D * 4 > 2 * mma2_stage_bytes(D, BITS) ? MMA2_ROWS * D * 4
                                                             : 2 * mma2_stage_bytes(D, BITS);
}

/* kv_half8's values with fewer instructions: a code c becomes the float 2^23 + c by one
 * logic op or byte permute (the code under the exponent of 2^23), and c * s comes from one
 * FMA, 2^23 s + c s - 2^23 s rounded once: exactly kv_dequant8's rounded product c * s
 * (2^23 s is exact in fp32 for every fp16 s), then + z rounded as there. So the fp16 hi (and
 * lo) are kv_half8's bits for every finite scale and zero. */
template <int BITS, bool LO>
__device__ __forceinline__ void kv_half8_fast(const kv_raw8<BITS> &r, uint4 &hi, uint4 &lo) {
    if constexpr (BITS == 16) {
        hi = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
    } else {
        const __half2 szh = *reinterpret_cast<const __half2 *>(&r.sz);
        const float s = __low2float(szh), z = __high2float(szh);
        const float ns = -8388608.0f * s; /* exact */
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            uint32_t m;
            if constexpr (BITS == 4)
                m = 0x4B000000u | ((r.w[0] >> (4 * e)) & 15u);
            else /* byte e & 3 of word e / 4 under the exponent byte 0x4B */
                m = __byte_perm(r.w[e / 4], 0x4B000000u, 0x7540 + (e & 3));
            f[e] = __fadd_rn(__fmaf_rn(__uint_as_float(m), s, ns), z);
        }
        half8_hi_lo<LO>(f, hi, lo);
    }
}

/* Flash-attention of prefill chunks on tensor cores, pipelined (attn_mma_kernel's math).
 *
 * Grid: attn_kernel's (tile * n_sub + sub, here counted from the grid's end: blockIdx.x =
 * gridDim.x - 1 - that, so the CTAs of a chunk's last tiles, with the most keys, start first;
 * blockIdx.y = KV head, blockIdx.z = key split), MMA2_THREADS threads. A CTA whose sequence has fewer than a.tc_min tokens in the
 * step returns at once (attn_kernel takes it), as does every CTA with sub > 0 (g > 4: the
 * host's tiling cuts a tile into sub-tiles of 64 rows; here a tile is one CTA) and every CTA
 * whose tile is not the first of its group of tpc = max(1, 128 / (16 g)) consecutive tiles of
 * its sequence (that group's CTA takes them). Rows (token, head) are token-major, at most
 * 128 (g <= MMA2_MAX_G); warp w owns rows 16w .. 16w + 15 (a warp past the rows idles in the
 * math and still loads).
 * Q as in attn_mma_kernel: fp32 into shared memory, rotated by H_D when the cache is, then
 * fp16 A fragments in registers. Keys of the CTA's split (the keys up to its last token's
 * position, cut into n_splits chunks of whole 64-key tiles, attn_mma_kernel's formula) come 64
 * at a time through two stages of shared memory: while the warps run the MMAs and softmax of
 * tile i from one stage, each thread holds in registers the K and V codes (and their groups'
 * scale and zero) of its D / 32 (D = 128: 4) 8-channel units of tile i + 1, loaded before
 * the math began, and dequantizes them (kv_half8_fast: fp16 K hi, K lo and V, kv_half8's
 * bits) into the other stage in the course of the math (a K and a V unit after each 16-key
 * step of O: by then S and the softmax have given the loads time to land, and their logic and
 * FMAs issue while the tensor cores work); one barrier ends the tile. A page id is a shift and a load (P a power of
 * two). Keys past the split's
 * end are zeros. The math of a tile is attn_mma_kernel's per warp (S = Q K^T + Q K_lo^T,
 * scaled, masked, online softmax with the running max at an integer, P in fp16, O += P V),
 * skipped by a warp whose rows all lie before the tile. The end (one split: O / l, rotated
 * back, written coalesced; several: the workspace for attn_combine_kernel) is attn_mma_kernel's
 * too. */
template <int D, int BITS>
static __global__ void __launch_bounds__(MMA2_THREADS, 1) attn_mma2_kernel(att_args a) {
    constexpr int KS = D + 8;      /* halves per K / V row in shared memory */
    constexpr int NK = D / 16;     /* k-steps of Q K^T */
    constexpr int NO = D / 8;      /* n-tiles of O */
    constexpr int NS = MMA_KT / 8; /* n-tiles of S */
    constexpr int UNITS = D / 8;   /* 8-channel units of a key */
    constexpr int UPT = MMA_KT * UNITS / MMA2_THREADS; /* units a thread loads a key tile */
    static_assert(MMA_KT * UNITS % MMA2_THREADS == 0, "whole units a thread");
    /* the math stores unit i of K and V after 16-key step i of O (D / 32 units a thread: 4 at
     * D = 128, 2 at D = 64) */
    static_assert(UPT <= MMA_KT / 16, "a unit a key step");
    static_assert(D % 32 == 0 && D <= 128, "head dims 64 and 128");
    constexpr bool LO = BITS != 16; /* K_lo: fp16 K is exact for an fp16 cache */
    constexpr int STAGE = mma2_stage_bytes(D, BITS) / 2; /* halves of a stage */
    extern __shared__ __align__(16) unsigned char mma_smem[]; /* mma2_smem_bytes(D, BITS) */
    __shared__ int rowpos[MMA2_ROWS];
    float *Qf = reinterpret_cast<float *>(mma_smem); /* [128, D] q, later the output */
    __half *stage0 = reinterpret_cast<__half *>(mma_smem);

    const kv_args &L = a.L;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gi = lane >> 2, ti = lane & 3; /* the mma fragments' row group, column pair */
    mma_cta c;
    if (!mma_cta_of(a, c))
        return;
    const int kvh = c.kvh, split = c.split, t0 = c.t0, rows = c.rows;
    const int kbeg = c.kbeg, kend = c.kend, pbase = c.pbase;

    /* the codes of this thread's units of the tile at k0 (zeros past kend), in registers */
    kv_raw8<BITS> kr[UPT], vr[UPT];
    auto fetch = [&](int k0) {
        const int kcnt = min(MMA_KT, kend - k0);
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            const int u = tid + i * MMA2_THREADS, j = u / UNITS, c = (u % UNITS) * 8;
            kr[i] = kv_raw8<BITS>{};
            vr[i] = kv_raw8<BITS>{};
            if (j < kcnt) {
                const int kpos = k0 + j;
                const int page =
                    a.page_indices[pbase + (a.p_shift >= 0 ? kpos >> a.p_shift : kpos / L.P)];
                const int slot = a.p_shift >= 0 ? kpos & (L.P - 1) : kpos % L.P;
                const int szo = BITS == 16 ? 0 : 4 * (c / L.G);
                kr[i] = kv_fetch8<BITS>(L, kv_tile(L, page, 0, kvh), slot, c, szo);
                vr[i] = kv_fetch8<BITS>(L, kv_tile(L, page, 1, kvh), slot, c, szo);
            }
        }
    };
    /* ... unit i of K (store_k) or V (store_v) dequantized into stage st: K [64, KS], V [64,
     * KS], K_lo [64, KS] */
    auto store_k = [&](int st, int i) {
        __half *Ks = stage0 + st * STAGE, *Kl = Ks + 2 * MMA_KT * KS;
        const int u = tid + i * MMA2_THREADS, j = u / UNITS, c = (u % UNITS) * 8;
        uint4 kh, kl;
        kv_half8_fast<BITS, LO>(kr[i], kh, kl);
        *reinterpret_cast<uint4 *>(Ks + j * KS + c) = kh;
        if constexpr (LO)
            *reinterpret_cast<uint4 *>(Kl + j * KS + c) = kl;
    };
    auto store_v = [&](int st, int i) {
        __half *Vs = stage0 + st * STAGE + MMA_KT * KS;
        const int u = tid + i * MMA2_THREADS, j = u / UNITS, c = (u % UNITS) * 8;
        uint4 vh, vl;
        kv_half8_fast<BITS, false>(vr[i], vh, vl);
        *reinterpret_cast<uint4 *>(Vs + j * KS + c) = vh;
    };
    auto store = [&](int st) {
#pragma unroll
        for (int i = 0; i < UPT; i++)
            store_k(st, i), store_v(st, i);
    };
#pragma unroll
    for (int i = 0; i < UPT; i++) {
        kr[i] = kv_raw8<BITS>{};
        vr[i] = kv_raw8<BITS>{};
    }
    if (kbeg < kend)
        fetch(kbeg); /* in flight while Q loads */

    mma_load_q<D, MMA2_ROWS, MMA2_THREADS>(a, Qf, rowpos, t0, rows, kvh, tid);
    const int r0 = warp * 16 + gi; /* this thread's rows r0 and r0 + 8 */
    uint32_t qa[NK][4];
    int pos0, pos1, wmax;
    float o[NO][4], m_r[2], l_r[2];
    mma_rows_init<D>(qa, pos0, pos1, wmax, o, m_r, l_r, Qf, rowpos, r0, ti);
    const float sl2 = a.scale * 1.44269504088896341f; /* 1/sqrt(D) and log2(e) */

    __syncthreads(); /* Q is read: stage 0 takes the first tile */
    store(0);
    __syncthreads();
    for (int k0 = kbeg, st = 0; k0 < kend; k0 += MMA_KT, st ^= 1) {
        const bool next = k0 + MMA_KT < kend;
        if (next)
            fetch(k0 + MMA_KT); /* in flight during this tile's math */
        const __half *Ks = stage0 + st * STAGE, *Vs = Ks + MMA_KT * KS, *Kl = Vs + MMA_KT * KS;
        /* The next tile's units go to the other stage, which no warp reads in this tile,
         * interleaved with the math (the logic and FMA of their dequantization issue while
         * the tensor cores work). After the last tile they store its units once more: that
         * stage is not read again. */
        if (k0 > wmax) { /* every key of the tile is past this warp's rows: the stores alone */
            store(st ^ 1);
        } else {
            float s[NS][4], mref[2];
            mma_scores<D, LO>(s, qa, Ks, Kl, lane);
            mma_softmax<D>(s, mref, m_r, l_r, o, k0, kend, pos0, pos1, ti, sl2);
#pragma unroll
            for (int kk = 0; kk < MMA_KT / 16; kk++) {
                mma_pv_step<D>(kk, s, mref, l_r, o, Vs, lane);
                if (kk < UPT)
                    store_k(st ^ 1, kk), store_v(st ^ 1, kk);
            }
        }
        __syncthreads();
    }
    /* the loop's last barrier: the stages are read, their bytes take the normalized rows */
    mma_finish<D, MMA2_THREADS, false>(a, o, m_r, l_r, Qf, r0, rows, t0, kvh, split, ti, tid);
}

} /* namespace */

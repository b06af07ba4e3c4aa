/* attention_mma3.cuh — the two-CTAs-an-SM tensor-core prefill kernel (attn_mma3_kernel): the
 * prefill chunks of at least ATT_MMA_MIN_TOKENS tokens over an INT4 cache at head dims 64 and 128
 * whose (scale, zero) rows are whole 16-byte pieces (mma3_layout_ok: groups of at most D / 4
 * channels), with GQA groups of at most MMA3_MAX_G query heads, outside batch-invariant steps,
 * when the backend asks for it (COMET_CUDA_ATTN_MMA=3, the step view's attn_mma 3; opt-in, not
 * yet measured against attn_mma2_kernel). Every other chunk of such a step takes what it takes
 * without it (attention_plan.cuh att_mma3).
 * Its arithmetic is attn_mma_kernel's, operation for operation on every row: the same fp16 K
 * (hi + lo), V, Q and P, the same mma order into each accumulator and the same online softmax
 * (mma_softmax itself), so a row's output is the same bits as attn_mma_kernel's and
 * attn_mma2_kernel's whenever they cut the row's keys into the same splits (always with one).
 * What differs is the resources: attn_mma2_kernel's 128 query rows a CTA on four warps instead
 * of eight (each warp two m16 tiles that share every K, K_lo and V fragment it loads, so half
 * the fragment loads an MMA), Q in shared memory as fp16 (its A fragments loaded per key tile,
 * not held in registers), the key tile's raw codes and scales copied by cp.async (not through
 * registers) while the previous tile's MMAs run, and one fp16 K/V stage: at head dim 128 about
 * 101 KB of shared memory and at most 255 registers a thread, so two CTAs share an SM on sm_90
 * (228 KB, 64K registers) and each covers the other's barriers, loads and dequantization.
 * Part of attention.cu's one translation unit (it includes every attention_*.cuh), so the
 * kernels compile exactly as one file would.
 */
#pragma once

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_mma2.cuh"
#include "backend/cuda/ptx.cuh"

namespace {

/* Query rows of a CTA (four warps of 32 rows, two m16 tiles each) and the most query heads per
 * KV head it takes: attn_mma2_kernel's 128 rows of whole 16-token attention tiles. */
constexpr int MMA3_THREADS = 128, MMA3_ROWS = 128, MMA3_MAX_G = 8;
static_assert(MMA3_MAX_G * COMET_CUDA_ATTN_TILE <= MMA3_ROWS, "a whole tile a CTA");
static_assert(MMA_KT == 64, "the raw buffer's indexing takes 64-key tiles");
static_assert(MMA3_ROWS == MMA2_ROWS, "mma_cta_of's 128-row CTAs");

/* Shared memory of attn_mma3_kernel at head dim D: fp16 Q [128, D + 8] for the whole kernel
 * (rows padded by 16 bytes, as the K/V tiles: ldmatrix's eight row addresses in distinct
 * banks), then the loop's region: one fp16 stage (K, V, K_lo [64, D + 8] each) and the raw
 * buffer of one key tile (K codes, V codes [64, D / 2 bytes] each, then K's and V's (scale,
 * zero) rows [64, 4 D / G bytes] each, sized for the widest rows it takes, G = 8: D / 2
 * bytes). Before the loop the region holds fp32 Q [128, D] (loaded and rotated there, then
 * rounded into fp16 Q), after it the normalized output. At D = 128: 34,816 + 68,608 bytes. */
__host__ __device__ constexpr int mma3_q_bytes(int D) { return MMA3_ROWS * (D + 8) * 2; }
__host__ __device__ constexpr int mma3_stage_bytes(int D) { return 3 * MMA_KT * (D + 8) * 2; }
__host__ __device__ constexpr int mma3_raw_bytes(int D) { return 2 * MMA_KT * (D / 2 + D / 2); }
__host__ __device__ constexpr int mma3_smem_bytes(int D) {
    return mma3_q_bytes(D) + (MMA3_ROWS * D * 4 > mma3_stage_bytes(D) + mma3_raw_bytes(D)
                                  ? MMA3_ROWS * D * 4
                                  : mma3_stage_bytes(D) + mma3_raw_bytes(D));
}

/* The pieces of attn_mma3_kernel's warps. A warp owns 32 rows as two m16 tiles (m = 0, 1:
 * rows 32 warp + 16 m ..); a thread rows rw + 16 m and rw + 16 m + 8 of them (rw = 32 warp +
 * lane / 4), each in attn_mma_kernel's register layout of one m16 tile. */

/* s[m] = Q K^T + Q K_lo^T of a key tile for both m16 tiles of the warp's rows Qw [32, D + 8]
 * (fp16 Q in shared memory): Ks, Kl [MMA_KT, D + 8] fp16 in shared memory. Each K and K_lo
 * fragment feeds both tiles; each accumulator takes mma_scores's MMAs in its order (k-steps
 * kk, kk + 1 of K, then of K_lo, for kk = 0, 2, ..). */
template <int D>
__device__ __forceinline__ void mma3_scores(float (&s)[2][MMA_KT / 8][4], const __half *Qw,
                                            const __half *Ks, const __half *Kl, int lane) {
    constexpr int KS = D + 8, NS = MMA_KT / 8;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NS; n++)
            s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    /* ldmatrix x4 of an A fragment: matrices rows 0-7 / 8-15 by lane bit 3, columns + 8 by bit 4 */
    const int qoff = ((lane & 7) + ((lane >> 3) & 1) * 8) * KS + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
        uint32_t qa[2][2][4]; /* [m16 tile][k-step kk, kk + 1] */
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                comet_ptx::ldsm_x4(qa[m][h], Qw + m * 16 * KS + qoff + (kk + h) * 16);
#pragma unroll
        for (int n = 0; n < NS; n++) {
            uint32_t b[4]; /* k-steps kk and kk + 1 of keys 8n .. 8n + 7 */
            const int off = (n * 8 + (lane & 7)) * KS + kk * 16 + (lane >> 3) * 8;
            comet_ptx::ldsm_x4(b, Ks + off);
#pragma unroll
            for (int m = 0; m < 2; m++) {
                comet_ptx::mma_f16(s[m][n], qa[m][0], b[0], b[1]);
                comet_ptx::mma_f16(s[m][n], qa[m][1], b[2], b[3]);
            }
            comet_ptx::ldsm_x4(b, Kl + off);
#pragma unroll
            for (int m = 0; m < 2; m++) {
                comet_ptx::mma_f16(s[m][n], qa[m][0], b[0], b[1]);
                comet_ptx::mma_f16(s[m][n], qa[m][1], b[2], b[3]);
            }
        }
    }
}

/* O[m] += P[m] V over keys 16kk .. 16kk + 15 of the tile for both m16 tiles: each tile's P as
 * mma_pv_step makes it (2^(s - mref) rounded to fp16, l summing the rounded values in its
 * order), each V fragment (ldmatrix.trans of V [MMA_KT, D + 8]) feeding both tiles. */
template <int D>
__device__ __forceinline__ void mma3_pv_step(int kk, const float (&s)[2][MMA_KT / 8][4],
                                             const float (&mref)[2][2], float (&l_r)[2][2],
                                             float (&o)[2][D / 8][4], const __half *Vs, int lane) {
    constexpr int KS = D + 8;
    uint32_t pa[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int f = 0; f < 4; f++) { /* a0: row r0 keys 2ti.., a1: row r0 + 8, a2/a3: +8 keys */
            const float *sv = s[m][2 * kk + (f >> 1)] + 2 * (f & 1);
            const float ref = mref[m][f & 1];
            const __half2 ph = __floats2half2_rn(exp2f(sv[0] - ref), exp2f(sv[1] - ref));
            const float2 pf = __half22float2(ph);
            l_r[m][f & 1] += pf.x + pf.y;
            pa[m][f] = *reinterpret_cast<const uint32_t *>(&ph);
        }
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
        uint32_t b[4]; /* keys 16kk .. 16kk + 15 of channels 8n .. 8n + 15 */
        comet_ptx::ldsm_x4_trans(b, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS +
                                        (n + (lane >> 4)) * 8);
#pragma unroll
        for (int m = 0; m < 2; m++) {
            comet_ptx::mma_f16(o[m][n], pa[m], b[0], b[1]);
            comet_ptx::mma_f16(o[m][n + 1], pa[m], b[2], b[3]);
        }
    }
}

/* After the key loop, mma_finish's work on the thread's four rows (rw + 16 m + 8 h): each row's
 * sum over its quad (fixed order), then with several splits the unnormalized rows and (max in
 * natural-log units, sum) to the workspace for attn_combine_kernel; with one, after a barrier
 * (every warp has read the K/V stage whose bytes Qf [128, D] takes), O / l per row into Qf,
 * rotated back by H_D when the cache is rotated, written out coalesced. */
template <int D>
__device__ __forceinline__ void mma3_finish(const att_args &a, float (&o)[2][D / 8][4],
                                            const float (&m_r)[2][2], float (&l_r)[2][2], float *Qf,
                                            int rw, int rows, int t0, int kvh, int split, int ti,
                                            int tid) {
    const int g = a.g, H = a.H;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) { /* the row sum over the quad, in a fixed order */
            l_r[m][h] += __shfl_xor_sync(0xffffffffu, l_r[m][h], 1);
            l_r[m][h] += __shfl_xor_sync(0xffffffffu, l_r[m][h], 2);
        }
    if (a.n_splits > 1) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = rw + 16 * m + 8 * h;
                if (r >= rows)
                    continue;
                const size_t slot =
                    ((size_t)(t0 + r / g) * H + kvh * g + r % g) * a.n_splits + split;
                float *dst = a.ws_acc + slot * D + 2 * ti;
#pragma unroll
                for (int n = 0; n < D / 8; n++)
                    *reinterpret_cast<float2 *>(dst + 8 * n) =
                        make_float2(o[m][n][2 * h], o[m][n][2 * h + 1]);
                if (ti == 0) {
                    a.ws_ml[2 * slot] =
                        m_r[m][h] == -INFINITY ? -INFINITY : m_r[m][h] * 0.693147180559945f;
                    a.ws_ml[2 * slot + 1] = l_r[m][h];
                }
            }
        return;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = rw + 16 * m + 8 * h;
            const float l = l_r[m][h];
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(Qf + r * D + 8 * n + 2 * ti) =
                    l > 0.0f ? make_float2(o[m][n][2 * h] / l, o[m][n][2 * h + 1] / l)
                             : make_float2(0.0f, 0.0f);
        }
    __syncthreads();
    if (a.rotate)
        wht_smem(Qf, rows, D, D);
    for (int i = tid; i < rows * D / 4; i += MMA3_THREADS) {
        const int r = i / (D / 4), d = (i % (D / 4)) * 4;
        *reinterpret_cast<float4 *>(a.out + ((size_t)(t0 + r / g) * H + kvh * g + r % g) * D + d) =
            *reinterpret_cast<const float4 *>(Qf + r * D + d);
    }
}

/* Flash-attention of prefill chunks over an INT4 cache on tensor cores, two CTAs an SM
 * (attn_mma_kernel's math).
 *
 * Grid: attn_mma2_kernel's, and the same work a CTA (mma_cta_of), MMA3_THREADS threads.
 * Rows (token, head) are token-major, at most 128 (g <= MMA3_MAX_G); warp w owns rows 32w ..
 * 32w + 31 as two m16 tiles (a warp past the rows idles in the math and still loads).
 * Q: fp32 into shared memory and rotated by H_D when the cache is (mma_load_q), then rounded
 * once to fp16 Q [128, D + 8] in shared memory (the bits of attn_mma_kernel's A fragments),
 * whose A fragments each warp loads by ldmatrix at every key tile instead of holding them.
 * Keys of the CTA's split (the keys up to its last token's position, cut into n_splits chunks
 * of whole 64-key tiles, attn_mma_kernel's formula) come 64 at a time. A tile's raw bytes, the
 * INT4 code rows of K and V and their (scale, zero) rows (16-byte pieces: 768 at D = 128 with
 * G = 16, six a thread, consecutive threads on consecutive pieces of a page's slots), go by
 * cp.async into the raw buffer, zero-filled past the split's end; where each key's rows lie
 * (krow, zrow: its page id, one lookup a key) threads 0 .. 63 find during the previous tile.
 * A tile then takes two barriers: after the wait for its raw bytes, one (the bytes visible to
 * every warp, and every warp done with the previous tile's stage and with krow, zrow), the
 * warps dequantize the raw buffer into the stage (kv_half8_fast: fp16 K hi, K lo and V,
 * kv_half8's bits; D / 16 8-channel units of K and of V a thread) and locate the next tile's
 * keys, another (the stage and krow, zrow visible, the raw buffer read), then the next tile's
 * cp.async copies go out into the raw buffer and land while the warps run this tile's math
 * from the stage: per warp S = Q K^T + Q K_lo^T (mma3_scores), scaled, masked
 * and the online softmax per m16 tile (mma_softmax), O += P V (mma3_pv_step), all skipped by
 * a warp whose 32 rows lie before the tile (a tile past one m16 tile's rows alone leaves that
 * tile's rows as they are: every key masked, P = 0, the max and sum unchanged). The other CTA
 * on the SM fills the barriers and the dequantization. The end (one split: O / l, rotated back,
 * written coalesced; several: the workspace for attn_combine_kernel) is attn_mma_kernel's. */
template <int D>
static __global__ void __launch_bounds__(MMA3_THREADS, 2) attn_mma3_kernel(att_args a) {
    constexpr int KS = D + 8;      /* halves per Q / K / V row in shared memory */
    constexpr int NO = D / 8;      /* n-tiles of O */
    constexpr int NS = MMA_KT / 8; /* n-tiles of S */
    constexpr int UNITS = D / 8;   /* 8-channel units of a key */
    constexpr int UPT = MMA_KT * UNITS / MMA3_THREADS; /* units of K (and of V) a thread */
    constexpr int CB = D / 2;                          /* bytes of a key's INT4 codes */
    constexpr int CP = CB / 16; /* 16-byte pieces of a key's codes; 2 * 64 CP a tile: CP a thread */
    static_assert(MMA3_THREADS % UNITS == 0 && MMA_KT * UNITS % MMA3_THREADS == 0,
                  "whole units a thread, at fixed channels");
    static_assert(2 * MMA_KT * CP == CP * MMA3_THREADS, "CP code pieces a thread");
    static_assert(D % 32 == 0 && D <= 128, "head dims 64 and 128");
    extern __shared__ __align__(16) unsigned char mma_smem[]; /* mma3_smem_bytes(D) */
    __shared__ int rowpos[MMA3_ROWS];
    /* byte offsets of the next key tile's K code rows and scale rows from the layer's base */
    __shared__ size_t krow[MMA_KT], zrow[MMA_KT];
    __half *Qh = reinterpret_cast<__half *>(mma_smem);  /* [128, KS] */
    unsigned char *region = mma_smem + mma3_q_bytes(D); /* the loop's bytes */
    float *Qf = reinterpret_cast<float *>(region);      /* [128, D] q, later the output */
    __half *Ks = reinterpret_cast<__half *>(region);    /* [64, KS] */
    __half *Vs = Ks + MMA_KT * KS;                      /* [64, KS] */
    __half *Kl = Vs + MMA_KT * KS;                      /* [64, KS] */
    unsigned char *raw = region + mma3_stage_bytes(D);  /* mma3_raw_bytes(D) */

    const kv_args &L = a.L;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gi = lane >> 2, ti = lane & 3; /* the mma fragments' row group, column pair */
    mma_cta c;
    if (!mma_cta_of(a, c))
        return;
    const int kvh = c.kvh, split = c.split, t0 = c.t0, rows = c.rows;
    const int kbeg = c.kbeg, kend = c.kend, pbase = c.pbase;

    /* the raw buffer: K codes, V codes [64, CB], then K's, V's (scale, zero) rows [64, szr]
     * (szr = 4 D / G: 16, 32 or 64 bytes, 2^sz_log2 pieces) */
    const int szr = L.sz_row, sz_log2 = __ffs(szr >> 4) - 1;
    const size_t vstep = (size_t)L.Hkv * L.tile_bytes; /* from a K head tile to its V tile */
    const uint32_t raw_s = comet_ptx::smem_u32(raw);
    /* threads 0 .. 63: where key k0 + tid's K code row and scale row start (bytes from the
     * layer's base) into krow, zrow, for the fetch of the tile at k0; a page id a key (a shift
     * and a mask when P is a power of two) */
    auto locate = [&](int k0) {
        if (tid < MMA_KT && k0 + tid < kend) {
            const int kpos = k0 + tid;
            const int page =
                a.page_indices[pbase + (a.p_shift >= 0 ? kpos >> a.p_shift : kpos / L.P)];
            const int slot = a.p_shift >= 0 ? kpos & (L.P - 1) : kpos % L.P;
            const size_t tile = (size_t)(kv_tile(L, page, 0, kvh) - L.base);
            krow[tid] = tile + (size_t)slot * CB;
            zrow[tid] = tile + L.sz_offset + (size_t)slot * szr;
        }
    };
    /* cp.async of the raw bytes of the tile at k0 (located; zeros past kend): piece u of the
     * codes is key (u / CP) % 64, piece u % CP, of K (u < 64 CP) or V; piece u of the scale
     * rows likewise with 2^sz_log2 pieces a key. Consecutive threads copy consecutive pieces
     * (of a page's consecutive slots). */
    auto fetch = [&](int k0) {
        const int kcnt = min(MMA_KT, kend - k0);
#pragma unroll
        for (int i = 0; i < CP; i++) {
            const int u = tid + i * MMA3_THREADS;
            const int kv = u / (MMA_KT * CP), j = u / CP % MMA_KT, p = u % CP;
            /* L.base: not read when the piece is zero-filled */
            const uint8_t *src = j < kcnt ? L.base + krow[j] + kv * vstep + 16 * p : L.base;
            comet_ptx::cp_async16_sz(raw_s + 16 * u, src, j < kcnt);
        }
        for (int u = tid; u < (2 * MMA_KT) << sz_log2; u += MMA3_THREADS) {
            const int kv = u >> (6 + sz_log2), j = (u >> sz_log2) & (MMA_KT - 1);
            const int p = u & ((1 << sz_log2) - 1);
            const uint8_t *src = j < kcnt ? L.base + zrow[j] + kv * vstep + 16 * p : L.base;
            comet_ptx::cp_async16_sz(raw_s + 2 * MMA_KT * CB + 16 * u, src, j < kcnt);
        }
    };
    /* the raw buffer into the stage: this thread's units are channels uc .. uc + 7 of keys
     * uj + (128 / UNITS) i, their group's (scale, zero) at byte szo of a scale row */
    const int uc = (tid % UNITS) * 8, uj = tid / UNITS, szo = 4 * (uc / L.G);
    auto dequant = [&]() {
        const unsigned char *kc = raw, *vc = raw + MMA_KT * CB;
        const unsigned char *ksz = raw + 2 * MMA_KT * CB, *vsz = ksz + MMA_KT * szr;
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            const int j = uj + i * (MMA3_THREADS / UNITS);
            kv_raw8<4> kr, vr;
            kr.w[0] = *reinterpret_cast<const uint32_t *>(kc + j * CB + uc / 2);
            kr.sz = *reinterpret_cast<const uint32_t *>(ksz + j * szr + szo);
            vr.w[0] = *reinterpret_cast<const uint32_t *>(vc + j * CB + uc / 2);
            vr.sz = *reinterpret_cast<const uint32_t *>(vsz + j * szr + szo);
            uint4 kh, kl, vh, vl;
            kv_half8_fast<4, true>(kr, kh, kl);
            kv_half8_fast<4, false>(vr, vh, vl);
            *reinterpret_cast<uint4 *>(Ks + j * KS + uc) = kh;
            *reinterpret_cast<uint4 *>(Kl + j * KS + uc) = kl;
            *reinterpret_cast<uint4 *>(Vs + j * KS + uc) = vh;
        }
    };

    mma_load_q<D, MMA3_ROWS, MMA3_THREADS>(a, Qf, rowpos, t0, rows, kvh, tid);
    /* fp16 Q: attn_mma_kernel's rounding of each value (half2_bits), rows past `rows` zeros */
    for (int i = tid; i < MMA3_ROWS * D / 8; i += MMA3_THREADS) {
        const int r = i / (D / 8), d = (i % (D / 8)) * 8;
        const float4 x0 = *reinterpret_cast<const float4 *>(Qf + r * D + d);
        const float4 x1 = *reinterpret_cast<const float4 *>(Qf + r * D + d + 4);
        *reinterpret_cast<uint4 *>(Qh + r * KS + d) =
            make_uint4(half2_bits(x0.x, x0.y), half2_bits(x0.z, x0.w), half2_bits(x1.x, x1.y),
                       half2_bits(x1.z, x1.w));
    }
    const int rw = warp * 32 + gi; /* this thread's rows rw + 16 m + 8 h */
    const __half *Qw = Qh + warp * 32 * KS;
    int pos[2][2], wmax = -1;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            pos[m][h] = rowpos[rw + 16 * m + 8 * h];
            wmax = max(wmax, pos[m][h]);
        }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
    float o[2][NO][4], m_r[2][2], l_r[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++) {
#pragma unroll
        for (int n = 0; n < NO; n++)
            o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
        m_r[m][0] = m_r[m][1] = -INFINITY;
        l_r[m][0] = l_r[m][1] = 0.0f;
    }
    const float sl2 = a.scale * 1.44269504088896341f; /* 1/sqrt(D) and log2(e) */

    locate(kbeg);
    __syncthreads(); /* fp16 Q written, fp32 Q read: the loop's region is free; krow, zrow */
    if (kbeg < kend)
        fetch(kbeg);
    comet_ptx::cp_async_commit();
    for (int k0 = kbeg; k0 < kend; k0 += MMA_KT) {
        comet_ptx::cp_async_wait<0>();
        /* the tile's raw bytes visible; every warp done with the stage and with krow, zrow */
        __syncthreads();
        locate(k0 + MMA_KT);
        dequant();
        __syncthreads(); /* the stage, krow and zrow visible; the raw buffer read */
        if (k0 + MMA_KT < kend)
            fetch(k0 + MMA_KT); /* lands during this tile's math */
        comet_ptx::cp_async_commit();
        if (k0 > wmax) /* every key of the tile is past this warp's rows */
            continue;
        float s[2][NS][4], mref[2][2];
        mma3_scores<D>(s, Qw, Ks, Kl, lane);
#pragma unroll
        for (int m = 0; m < 2; m++)
            mma_softmax<D>(s[m], mref[m], m_r[m], l_r[m], o[m], k0, kend, pos[m][0], pos[m][1], ti,
                           sl2);
#pragma unroll
        for (int kk = 0; kk < MMA_KT / 16; kk++)
            mma3_pv_step<D>(kk, s, mref, l_r, o, Vs, lane);
    }
    mma3_finish<D>(a, o, m_r, l_r, Qf, rw, rows, t0, kvh, split, ti, tid);
}

} /* namespace */

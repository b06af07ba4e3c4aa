/* attention.cu — paged attention over the KV pool (model_ops.h comet_cuda_paged_attention):
 * a general flash-attention kernel for steps with prefill chunks, a flash-decoding kernel
 * for decode-only steps, and the combine kernel of split keys. K/V are read as codes and
 * dequantized in registers (cuda_kv.h layout, paged_kv.cuh helpers); fp32 throughout.
 */
#include "backend/cuda/model_ops.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/paged_kv.cuh"

namespace {

/* ---- paged attention ---- */

constexpr int ATT_THREADS = 256, ATT_KC = 32;
/* Decode attention: four warps a CTA, enough key groups to keep a split's keys in flight
 * while a CTA stays small enough for several to share an SM */
constexpr int DEC_THREADS = 128;
/* Fewest keys a decode split takes: below it a split's fixed cost (the q load and rotation,
 * the merge of its key groups, its share of the combine) outweighs its keys */
constexpr int DEC_MIN_KEYS = 64;
/* Most query heads per KV head the decode kernel holds in registers (GQA groups of LLaMA,
 * Mistral, SmolLM); larger groups take the general kernel */
constexpr int DEC_MAX_G = 8;
/* Batch-invariant attention (st->batch_invariant): every row's keys are cut into spans of
 * ATT_SPAN keys at fixed positions; each span's (max, sum, unnormalized row) starts from
 * nothing and the spans merge in order (att_merge), in the CTA or, when the keys are split
 * across CTAs one span each, in the combine kernel: the same bits either way. Two key chunks,
 * as fine as the decode kernel's smallest split (DEC_MIN_KEYS). */
constexpr int ATT_SPAN = 64;
/* Most workspace bytes batch-invariant attention splits its spans into (beyond, one CTA
 * merges a tile's spans itself): a decode step of 64 sequences at 8K keys on LLaMA-3-8B */
constexpr size_t ATT_SPAN_WS_MAX = 256u << 20;

/* Query rows (token, head of the GQA group) of one attention CTA for head dims up to DMAX:
 * Q [R, DMAX] stays at 32 KB of shared memory (16 KB for DMAX = 64). */
__host__ __device__ constexpr int att_rows(int dmax) { return dmax >= 256 ? 32 : 64; }

struct att_args {
    kv_args L;
    const int32_t *positions, *token_indptr, *page_indptr, *page_indices, *tiles;
    int H, g, tt, n_sub, n_splits, rotate;
    int span;    /* batch-invariant with n_splits > 1: keys per split, ATT_SPAN; else 0 */
    int lk_log2; /* decode: log2 of the lanes that share one key */
    int p_shift; /* decode: log2(P) when P is a power of two, else -1 */
    float scale;
    const float *q;
    float *out;
    float *ws_acc; /* [T, H, n_splits, D] */
    float *ws_ml;  /* [T, H, n_splits, 2] (max, sum) */
};

/* The raw bytes of eight channels of one slot: their codes (one, two or four words at 4, 8
 * or 16 bits) and, for codes, the group's fp16 scale and zero as one word. */
template <int BITS>
struct kv_raw8 {
    uint32_t w[BITS / 4];
    uint32_t sz;
};

/* Loads channels c .. c+7 of slot `slot` of a head tile; szo = 4 * (c / G), the byte offset
 * of their group's (scale, zero) in the slot's scale row (unused at 16 bits). */
template <int BITS>
__device__ __forceinline__ kv_raw8<BITS> kv_fetch8(const kv_args &L, const uint8_t *tile, int slot,
                                                   int c, int szo) {
    kv_raw8<BITS> r;
    const uint8_t *codes = tile + (size_t)slot * L.code_row;
    if constexpr (BITS == 16) {
        const uint4 x = *reinterpret_cast<const uint4 *>(codes + 2 * c);
        r.w[0] = x.x, r.w[1] = x.y, r.w[2] = x.z, r.w[3] = x.w;
        r.sz = 0;
    } else {
        if constexpr (BITS == 4) {
            r.w[0] = *reinterpret_cast<const uint32_t *>(codes + c / 2);
        } else {
            const uint2 x = *reinterpret_cast<const uint2 *>(codes + c);
            r.w[0] = x.x, r.w[1] = x.y;
        }
        r.sz =
            *reinterpret_cast<const uint32_t *>(tile + L.sz_offset + (size_t)slot * L.sz_row + szo);
    }
    return r;
}

/* The float of an integer code below 2^23: the code under the exponent of 2^23, less 2^23
 * (exact: the value an int-to-float conversion gives, in one logic op and one add instead
 * of the slower conversion unit). */
__device__ __forceinline__ float code_float(uint32_t code) {
    return __fsub_rn(__uint_as_float(0x4B000000u | code), 8388608.0f);
}

/* The eight values of r: fp16 widened, or code * scale + zero with the product and the sum
 * each rounded (comet_quant_kv_sim's dequantization, never an FMA). An all-zero r gives
 * zeros. */
template <int BITS>
__device__ __forceinline__ void kv_dequant8(const kv_raw8<BITS> &r, float *o) {
    if constexpr (BITS == 16) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&r.w[e]));
            o[2 * e] = f.x;
            o[2 * e + 1] = f.y;
        }
    } else {
        const __half2 szh = *reinterpret_cast<const __half2 *>(&r.sz);
        const float s = __low2float(szh), z = __high2float(szh);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint32_t code =
                BITS == 4 ? (r.w[0] >> (4 * e)) & 15u : (r.w[e / 4] >> (8 * (e & 3))) & 255u;
            o[e] = __fadd_rn(__fmul_rn(code_float(code), s), z);
        }
    }
}

/* Eight dequantized channels c .. c+7 of slot `slot` of a head tile. */
__device__ __forceinline__ void kv_load8(const kv_args &L, const uint8_t *tile, int slot, int c,
                                         float *o) {
    if (L.bits == 16)
        kv_dequant8<16>(kv_fetch8<16>(L, tile, slot, c, 0), o);
    else if (L.bits == 4)
        kv_dequant8<4>(kv_fetch8<4>(L, tile, slot, c, 4 * (c / L.G)), o);
    else
        kv_dequant8<8>(kv_fetch8<8>(L, tile, slot, c, 4 * (c / L.G)), o);
}

/* The merge of batch-invariant attention's spans: the running (M, L) of a row takes a span's
 * (m, l); *a and *b scale the running and the span's unnormalized rows (A = A a + o b,
 * att_merge_row). A span that saw no key (m = -inf) leaves the row as it is. Rounded
 * products and sums (no contraction), so the CTA and the combine kernel agree bit for bit. */
__device__ __forceinline__ void att_merge(float &M, float &L, float m, float l, float *a,
                                          float *b) {
    if (m == -INFINITY) {
        *a = 1.0f, *b = 0.0f;
        return;
    }
    const float Mn = fmaxf(M, m);
    *a = expf(M - Mn), *b = expf(m - Mn);
    L = __fadd_rn(__fmul_rn(L, *a), __fmul_rn(l, *b));
    M = Mn;
}
__device__ __forceinline__ float att_merge_row(float A, float o, float a, float b) {
    return __fadd_rn(__fmul_rn(A, a), __fmul_rn(o, b));
}

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

/* Grid (T, H), one thread per channel (blockDim D rounded up to a warp): merges the
 * n_splits partial rows of (token, head) with their maxima and sums (splits that saw no
 * key have max -inf and weigh 0), normalizes, rotates back by H_D in shared memory when
 * the cache is rotated, and writes out [T, H, D]. */
static __global__ void attn_combine_kernel(const float *__restrict__ ws_acc,
                                           const float *__restrict__ ws_ml, int H, int D,
                                           int n_splits, int rotate, int spans,
                                           float *__restrict__ out) {
    __shared__ float buf[COMET_CUDA_KV_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const size_t base = ((size_t)t * H + h) * n_splits;
    float sum = 0.0f, acc = 0.0f;
    if (spans) { /* batch-invariant: the splits are spans, merged in order as attn_kernel does */
        float M = -INFINITY, a, b;
        for (int s = 0; s < n_splits; s++) {
            att_merge(M, sum, ws_ml[2 * (base + s)], ws_ml[2 * (base + s) + 1], &a, &b);
            if (d < D)
                acc = att_merge_row(acc, ws_acc[(base + s) * D + d], a, b);
        }
    } else {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++)
            M = fmaxf(M, ws_ml[2 * (base + s)]);
        for (int s = 0; s < n_splits; s++) {
            const float m = ws_ml[2 * (base + s)];
            if (m == -INFINITY)
                continue;
            const float w = expf(m - M);
            sum += ws_ml[2 * (base + s) + 1] * w;
            if (d < D)
                acc += ws_acc[(base + s) * D + d] * w;
        }
    }
    const float val = sum > 0.0f ? acc / sum : 0.0f;
    if (!rotate) {
        if (d < D)
            out[((size_t)t * H + h) * D + d] = val;
        return;
    }
    if (d < D)
        buf[d] = val;
    __syncthreads();
    wht_smem(buf, 1, D, 0);
    if (d < D)
        out[((size_t)t * H + h) * D + d] = buf[d];
}

int att_dmax(int D) { return D <= 64 ? 64 : D <= 128 ? 128 : 256; }

size_t att_smem_bytes(int dmax) {
    const int R = att_rows(dmax);
    return sizeof(float) * ((size_t)R * dmax + (size_t)ATT_KC * (dmax + 1) + (size_t)ATT_KC * dmax +
                            (size_t)R * ATT_KC + 3 * (size_t)R) +
           sizeof(int) * (size_t)R;
}

/* Tokens per sub-tile and sub-tiles per tile for GQA group g at head dim D. */
void att_tiling(int D, int g, int *tt, int *n_sub) {
    int t = att_rows(att_dmax(D)) / g;
    if (t > COMET_CUDA_ATTN_TILE)
        t = COMET_CUDA_ATTN_TILE;
    if (t < 1)
        t = 1;
    *tt = t;
    *n_sub = (COMET_CUDA_ATTN_TILE + t - 1) / t;
}

/* Whether the step's attention takes attn_decode_kernel: every tile is one token (tiles
 * cover the T tokens, each at least one, so n_tiles == T says so; a decode step, one token
 * a sequence, always is one), the GQA group fits its registers, and the step is not
 * batch-invariant (its rows take attn_kernel's fixed spans whatever the step). */
bool att_decode_step(const comet_cuda_step_view *st, int g) {
    return !st->batch_invariant && st->n_tiles == st->n_tokens && g >= 1 && g <= DEC_MAX_G;
}

template <int BITS>
void attn_decode_launch(const att_args &a, dim3 grid, cudaStream_t s) {
    if (a.g <= 1)
        attn_decode_kernel<BITS, 1><<<grid, DEC_THREADS, 0, s>>>(a);
    else if (a.g <= 2)
        attn_decode_kernel<BITS, 2><<<grid, DEC_THREADS, 0, s>>>(a);
    else if (a.g <= 4)
        attn_decode_kernel<BITS, 4><<<grid, DEC_THREADS, 0, s>>>(a);
    else
        attn_decode_kernel<BITS, 8><<<grid, DEC_THREADS, 0, s>>>(a);
}

template <int DMAX, bool SPANS>
comet_status attn_launch(const att_args &a, dim3 grid, cudaStream_t s) {
    const size_t smem = att_smem_bytes(DMAX);
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<DMAX, SPANS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: paged_attention: %zu bytes of "
                               "shared memory refused: %s",
                               smem, cudaGetErrorString(e));
    attn_kernel<DMAX, SPANS><<<grid, ATT_THREADS, smem, s>>>(a);
    return COMET_OK;
}

template <bool SPANS>
comet_status attn_launch_dmax(int dmax, const att_args &a, dim3 grid, cudaStream_t s) {
    return dmax == 64    ? attn_launch<64, SPANS>(a, grid, s)
           : dmax == 128 ? attn_launch<128, SPANS>(a, grid, s)
                         : attn_launch<256, SPANS>(a, grid, s);
}

} /* namespace */

extern "C" {

int comet_cuda_attention_splits(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                int H, int n_sm) {
    if (L->Hkv < 1 || H % L->Hkv || n_sm <= 0)
        return 1;
    const int g = H / L->Hkv;
    if (st->batch_invariant) {
        /* one CTA per span (ATT_SPAN) where the tiles leave SMs idle and the spans' partial
         * rows fit ATT_SPAN_WS_MAX; else each CTA merges its tile's spans itself */
        int tt, n_sub;
        att_tiling(L->D, g, &tt, &n_sub);
        const long blocks = (long)st->n_tiles * n_sub * L->Hkv;
        const long spans = (st->max_kv_len + ATT_SPAN - 1) / ATT_SPAN;
        const size_t ws = (size_t)st->n_tokens * H * spans * ((size_t)L->D + 2) * sizeof(float);
        return spans > 1 && blocks < 2L * (n_sm > 0 ? n_sm : 1) && ws <= ATT_SPAN_WS_MAX
                   ? (int)spans
                   : 1;
    }
    long blocks, min_keys;
    if (att_decode_step(st, g)) {
        blocks = (long)st->n_tokens * L->Hkv;
        min_keys = DEC_MIN_KEYS;
    } else {
        int tt, n_sub;
        att_tiling(L->D, g, &tt, &n_sub);
        blocks = (long)st->n_tiles * n_sub * L->Hkv;
        min_keys = 2 * ATT_KC; /* at least two key chunks a split */
    }
    const long target = 2L * (n_sm > 0 ? n_sm : 1);
    if (blocks >= target)
        return 1;
    long splits = (target + blocks - 1) / blocks;
    const long by_len = st->max_kv_len / min_keys;
    if (splits > by_len)
        splits = by_len;
    if (splits > 64)
        splits = 64;
    return splits > 1 ? (int)splits : 1;
}

size_t comet_cuda_attention_workspace_bytes(const comet_cuda_kv_layout *L,
                                            const comet_cuda_step_view *st, int H, int n_splits) {
    if (n_splits <= 1)
        return 0;
    return (size_t)st->n_tokens * H * n_splits * ((size_t)L->D + 2) * sizeof(float);
}

comet_status comet_cuda_paged_attention(const comet_cuda_kv_layout *L, const void *storage,
                                        int layer, const comet_cuda_step_view *st, const float *q,
                                        int H, float *out, int rotate, int n_splits,
                                        void *workspace, void *stream) {
    const int D = L->D;
    if (D > COMET_CUDA_KV_MAX_HEAD_DIM || D % 8 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE ||
        (rotate && (D & (D - 1))) || (L->bits != 16 && L->G % 8))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: head dim %d, page size %d, group "
                               "%d%s; the kernel takes D <= %d with D %% 8 == 0 (a power of two "
                               "with the hadamard rotation), P <= %d, groups of a multiple of 8 "
                               "channels",
                               D, L->P, L->G, rotate ? ", hadamard" : "",
                               COMET_CUDA_KV_MAX_HEAD_DIM, COMET_CUDA_KV_MAX_PAGE_SIZE);
    if (H < 1 || L->Hkv < 1 || H % L->Hkv || st->n_tokens < 1 || layer < 0 || layer >= L->n_layer ||
        n_splits < 1 || (n_splits > 1 && !workspace))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: paged_attention: H = %d, Hkv = %d, T = %d, layer %d "
                               "of %d, %d splits",
                               H, L->Hkv, st->n_tokens, layer, L->n_layer, n_splits);
    const int g = H / L->Hkv, dmax = att_dmax(D);
    if (g > att_rows(dmax))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: %d query heads per KV head; the "
                               "kernel takes at most %d at head dim %d",
                               g, att_rows(dmax), D);
    if (st->n_tiles < 1)
        return COMET_OK;
    att_args a;
    a.L = kv_args_make(L, storage, layer);
    a.positions = st->positions, a.token_indptr = st->token_indptr;
    a.page_indptr = st->page_indptr, a.page_indices = st->page_indices, a.tiles = st->tiles;
    a.H = H, a.g = g, a.n_splits = n_splits, a.rotate = rotate;
    a.span = st->batch_invariant && n_splits > 1 ? ATT_SPAN : 0;
    att_tiling(D, g, &a.tt, &a.n_sub);
    a.lk_log2 = 2; /* lanes a key: D / 8 rounded up to a power of two, at least 4 */
    while ((8 << a.lk_log2) < D)
        a.lk_log2++;
    a.p_shift = -1;
    for (int p = 0; (1 << p) <= L->P && a.p_shift < 0; p++)
        if (L->P == 1 << p)
            a.p_shift = p;
    a.scale = 1.0f / sqrtf((float)D);
    a.q = q, a.out = out;
    a.ws_acc = static_cast<float *>(workspace);
    a.ws_ml = a.ws_acc ? a.ws_acc + (size_t)st->n_tokens * H * n_splits * D : NULL;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (att_decode_step(st, g)) {
        dim3 grid((unsigned)st->n_tiles, L->Hkv, n_splits);
        if (L->bits == 4)
            attn_decode_launch<4>(a, grid, s);
        else if (L->bits == 8)
            attn_decode_launch<8>(a, grid, s);
        else
            attn_decode_launch<16>(a, grid, s);
        COMET_TRY(launch_check("paged_attention (decode)"));
    } else {
        dim3 grid((unsigned)st->n_tiles * a.n_sub, L->Hkv, n_splits);
        comet_status r = st->batch_invariant && n_splits == 1
                             ? attn_launch_dmax<true>(dmax, a, grid, s)
                             : attn_launch_dmax<false>(dmax, a, grid, s);
        if (r < 0)
            return r;
        COMET_TRY(launch_check("paged_attention"));
    }
    if (n_splits > 1) {
        const int threads = (D + 31) / 32 * 32;
        attn_combine_kernel<<<dim3(st->n_tokens, H), threads, 0, s>>>(
            a.ws_acc, a.ws_ml, H, D, n_splits, rotate, a.span > 0, out);
        COMET_TRY(launch_check("paged_attention (split combine)"));
    }
    return COMET_OK;
}

} /* extern "C" */

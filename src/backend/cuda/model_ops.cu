/* model_ops.cu — the CUDA backend's model kernels (model_ops.h): everything of a layer but
 * the GEMMs. Elementwise work is fused into the quantization that follows it (RMSNorm or
 * SwiGLU + the group's permutation gather + per-block activation quantization, one kernel
 * per op), RoPE is fused with the KV append, and attention reads the quantized pages and
 * dequantizes them on the fly.
 *
 * Numerics follow the CPU reference (src/backend/cpu, src/quant/act.c): wherever the CPU
 * rounds a value that becomes a code (activation block scales and codes, KV scales, zeros
 * and codes, the Hadamard butterflies) the kernels use the _rn intrinsics, so nvcc does not
 * contract them into FMAs and the same fp32 inputs give the same codes. RoPE's products are
 * unfused too; the CPU build may fuse them (gcc contracts with -march=native), so K after
 * RoPE agrees up to an ulp. Reductions (the RMSNorm sum of squares, attention) run in a
 * different order than the CPU's and agree up to fp32 rounding.
 *
 * What it does not do: tensor-core attention (the attention kernels multiply in fp32 on
 * the CUDA cores), CUDA graphs, or any allocation (the caller owns every buffer).
 */
#include "backend/cuda/model_ops.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

/* RMSNorm rows: one CTA per token row, as many threads as a CTA takes, so that a decode
 * row of 4096 channels is one pass of 4 values per thread (about 3 us, not 20 at 256) */
constexpr int NORM_THREADS = 1024;
/* SwiGLU and plain rows need no row-wide reduction: a CTA of 8 warps takes 8 activation
 * blocks (or 2048 fp16 values), so a 14336-wide decode row spreads over 14 CTAs */
constexpr int ROW_THREADS = 256;
constexpr int ROW_F16_PER_CTA = 2048;

comet_status launch_check(const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "cuda backend: %s: kernel launch failed: %s (%s)",
                               op, cudaGetErrorString(e), cudaGetErrorName(e));
    return COMET_OK;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- embedding ---- */

/* One CTA per token copies its row of the table; float4 when C % 4 == 0. */
static __global__ void embed_kernel(const float *__restrict__ embd, int C,
                                    const int32_t *__restrict__ tokens, float *__restrict__ x) {
    const int t = blockIdx.x;
    const float *src = embd + (size_t)tokens[t] * C;
    float *dst = x + (size_t)t * C;
    if ((C & 3) == 0) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        for (int i = threadIdx.x; i < C / 4; i += blockDim.x)
            d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            dst[i] = src[i];
    }
}

/* ---- RMSNorm / SwiGLU / plain input + gather + activation quantization ---- */

enum row_mode { ROW_NORM = 0, ROW_PLAIN = 1, ROW_SILU = 2 };

struct row_args {
    float *x;              /* NORM: [T, K], gets the residual sum; PLAIN: [T, K] input */
    const float *residual; /* NORM: [T, K] or NULL */
    const float *norm;     /* NORM: [K] */
    float eps;
    const float *gate, *up; /* SILU: [T, K] */
    int K, B, n8;
    int kind;               /* comet_cuda_act_kind */
    const int32_t *perm;    /* [K] or NULL */
    int8_t *qa;             /* W4AX: [T, K] codes */
    float *sa;              /* W4AX: [T, K/B] scales */
    __half *h16;            /* F16: [T, K] */
};

/* Token row blockIdx.x. NORM runs one CTA of NORM_THREADS per row: it first adds the
 * residual (each thread a strided share of the row, written back to x) and reduces the sum
 * of squares through warp shuffles and shared memory to the row's inverse RMS. SILU and
 * PLAIN split a row along blockIdx.y (ROW_THREADS / 32 activation blocks, or
 * ROW_F16_PER_CTA fp16 values, a CTA). The row is produced in the group's permuted order,
 * each value recomputed from global memory at its source channel perm[k] (h = x * inv *
 * norm, or silu(gate) * up, or x): for W4AX each warp takes whole activation blocks (B / 32
 * consecutive channels per lane), reduces the block's amax with shuffles and writes the
 * lane's codes as one 2- or 4-byte store, lane 0 the scale; for F16 the threads stride over
 * their share of the row. */
template <int MODE>
static __global__ void __launch_bounds__(NORM_THREADS) row_quant_kernel(row_args a) {
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nthreads = blockDim.x, nwarps = nthreads >> 5;
    const int K = a.K;
    const size_t row = (size_t)t * K;
    float inv = 0.0f;
    if (MODE == ROW_NORM) {
        __shared__ float red[32];
        float *xr = a.x + row;
        float ss = 0.0f;
        for (int c = tid; c < K; c += nthreads) {
            float v = xr[c];
            if (a.residual) {
                v = __fadd_rn(v, a.residual[row + c]);
                xr[c] = v;
            }
            ss += v * v;
        }
        ss = warp_sum(ss);
        if (lane == 0)
            red[warp] = ss;
        __syncthreads(); /* also publishes the residual sums written above */
        if (warp == 0) {
            float v = lane < nwarps ? red[lane] : 0.0f;
            v = warp_sum(v);
            if (lane == 0)
                red[0] = v;
        }
        __syncthreads();
        inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(red[0], (float)K), a.eps)));
    }
    auto value = [&](int k) -> float {
        const int p = a.perm ? a.perm[k] : k;
        if (MODE == ROW_NORM)
            return __fmul_rn(__fmul_rn(a.x[row + p], inv), a.norm[p]);
        if (MODE == ROW_SILU) {
            const float g = a.gate[row + p];
            return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), a.up[row + p]);
        }
        return a.x[row + p];
    };
    if (a.kind == COMET_CUDA_ACT_F16) {
        __half *dst = a.h16 + row;
        for (int k = blockIdx.y * nthreads + tid; k < K; k += gridDim.y * nthreads)
            dst[k] = __float2half_rn(value(k));
        return;
    }
    const int nb = K / a.B, per = a.B / 32; /* per: 2 or 4 channels per lane */
    for (int b = blockIdx.y * nwarps + warp; b < nb; b += gridDim.y * nwarps) {
        const int k0 = b * a.B + lane * per;
        float v[4];
        float amax = 0.0f;
        bool finite = true;
        for (int e = 0; e < per; e++) {
            v[e] = value(k0 + e);
            finite &= isfinite(v[e]);
            amax = fmaxf(amax, fabsf(v[e]));
        }
        amax = warp_max(amax);
        finite = __all_sync(0xffffffffu, finite);
        const int qmax = b < a.n8 ? 127 : 7;
        int8_t q[4] = {0, 0, 0, 0};
        float s = finite ? 0.0f : __int_as_float(0x7fc00000); /* comet_quant_sym_block's NaN */
        if (finite && amax != 0.0f) {
            s = __fdiv_rn(amax, (float)qmax);
            const float sinv = __fdiv_rn(1.0f, s);
            const float lo = (float)(-qmax - 1), hi = (float)qmax;
            for (int e = 0; e < per; e++) {
                float r = rintf(__fmul_rn(v[e], sinv));
                r = r < lo ? lo : r > hi ? hi : r;
                q[e] = (int8_t)r;
            }
        }
        int8_t *dst = a.qa + row + k0;
        if (per == 4)
            *reinterpret_cast<char4 *>(dst) = make_char4(q[0], q[1], q[2], q[3]);
        else
            *reinterpret_cast<char2 *>(dst) = make_char2(q[0], q[1]);
        if (lane == 0)
            a.sa[(size_t)t * nb + b] = s;
    }
}

comet_status row_quant_launch(int mode, row_args a, int T, const comet_cuda_act_fmt *f,
                              void *act, void *stream, const char *op) {
    if (T < 1 || !f || !act || f->K < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: %s: T = %d, K = %d, act %p",
                               op, T, f ? f->K : 0, act);
    a.K = f->K, a.B = f->B, a.n8 = f->n8, a.kind = f->kind, a.perm = f->perm;
    if (f->kind == COMET_CUDA_ACT_W4AX) {
        if ((f->B != 64 && f->B != 128) || f->K % f->B || f->n8 < 0 || f->n8 > f->K / f->B)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: %s: K = %d, B = %d, n8 = %d is not a W4Ax "
                                   "activation layout", op, f->K, f->B, f->n8);
        a.qa = static_cast<int8_t *>(act);
        a.sa = reinterpret_cast<float *>(static_cast<char *>(act) +
                                         comet_cuda_act_scales_offset(T, f->K));
    } else if (f->kind == COMET_CUDA_ACT_F16) {
        a.h16 = static_cast<__half *>(act);
    } else {
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: %s: activation kind %d",
                               op, (int)f->kind);
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int parts = f->kind == COMET_CUDA_ACT_F16
                          ? (f->K + ROW_F16_PER_CTA - 1) / ROW_F16_PER_CTA
                          : (f->K / f->B + ROW_THREADS / 32 - 1) / (ROW_THREADS / 32);
    if (mode == ROW_NORM)
        row_quant_kernel<ROW_NORM><<<T, NORM_THREADS, 0, s>>>(a);
    else if (mode == ROW_SILU)
        row_quant_kernel<ROW_SILU><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    else
        row_quant_kernel<ROW_PLAIN><<<dim3(T, parts), ROW_THREADS, 0, s>>>(a);
    return launch_check(op);
}

/* ---- small copies ---- */

/* One CTA per gathered row; threads stride over the row's fp16 values. */
static __global__ void gather_rows_f16_kernel(const __half *__restrict__ src, int C,
                                              const int32_t *__restrict__ rows,
                                              __half *__restrict__ dst) {
    const int r = blockIdx.x;
    const __half *s = src + (size_t)rows[r] * C;
    __half *d = dst + (size_t)r * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        d[i] = s[i];
}

/* Grid-stride conversion, one element per thread per step. */
static __global__ void f32_to_f16_kernel(const float *__restrict__ src, __half *__restrict__ dst,
                                         size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

/* Synthetic weights: element i gets a value from a counter-based hash of (seed, i), so any
 * grid fills the same values. kind 0: raw bytes (dst uint8, uniform: random INT4 codes in
 * any packed layout); 1: fp16 uniform in [lo, hi); 2: fp32 uniform in [lo, hi). */
static __device__ __forceinline__ uint32_t hash_u32(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static __global__ void fill_random_kernel(void *dst, size_t n, int kind, float lo, float hi,
                                          uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash_u32(seed, i);
        float u = (float)(h & 0xFFFFFF) * (1.0f / 16777216.0f);
        if (kind == 0)
            static_cast<uint8_t *>(dst)[i] = (uint8_t)h;
        else if (kind == 1)
            static_cast<__half *>(dst)[i] = __float2half_rn(lo + (hi - lo) * u);
        else
            static_cast<float *>(dst)[i] = lo + (hi - lo) * u;
    }
}

/* ---- paged KV ---- */

struct kv_args {
    uint8_t *base; /* the layer's first byte */
    size_t tile_bytes, sz_offset;
    int code_row, sz_row, P, Hkv, D, G, bits;
};

kv_args kv_args_make(const comet_cuda_kv_layout *L, const void *storage, int layer) {
    kv_args k;
    k.base = (uint8_t *)storage + (size_t)layer * L->layer_bytes;
    k.tile_bytes = L->head_tile_bytes;
    k.sz_offset = L->sz_offset;
    k.code_row = L->code_row_bytes, k.sz_row = L->sz_row_bytes;
    k.P = L->P, k.Hkv = L->Hkv, k.D = L->D, k.G = L->G, k.bits = L->bits;
    return k;
}

/* The head tile of (page, kv, h) in the layer. */
__device__ __forceinline__ uint8_t *kv_tile(const kv_args &L, int page, int kv, int h) {
    return L.base + (((size_t)page * 2 + kv) * L.Hkv + h) * L.tile_bytes;
}

/* The last sequence s with token_indptr[s] <= t. */
__device__ __forceinline__ int seq_of_token(const int32_t *token_indptr, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (token_indptr[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* In-place normalized Walsh-Hadamard transform of n_vec vectors of n floats in shared
 * memory (stride `stride` floats), comet_wht's butterflies and scaling; the whole CTA
 * takes part and every stage ends at a barrier. */
__device__ void wht_smem(float *x, int n_vec, int n, int stride) {
    const int half = n / 2, pairs = n_vec * half;
    for (int h = 1; h < n; h *= 2) {
        for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
            const int r = p / half, i = p % half;
            const int j = (i / h) * 2 * h + i % h;
            float *v = x + (size_t)r * stride;
            const float a = v[j], b = v[j + h];
            v[j] = __fadd_rn(a, b);
            v[j + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float norm = __fdiv_rn(1.0f, __fsqrt_rn((float)n));
    for (int p = threadIdx.x; p < n_vec * n; p += blockDim.x) {
        float *v = x + (size_t)(p / n) * stride + p % n;
        *v = __fmul_rn(*v, norm);
    }
    __syncthreads();
}

/* Grid (T, H + Hkv), 128 threads, thread f owning the RoPE pairs f, f + 128, ... of a head.
 * Blocks y < H rotate a query head in place and finish. Blocks y >= H rotate KV head
 * y - H of k in place and keep it, with v, in shared memory; with `rotate` both go through
 * the Walsh-Hadamard butterflies there; then one thread per (K or V, group) finds the
 * group's min and max and writes its fp16 scale and zero, and the threads write the codes
 * (two channels per byte at 4 bits) or the fp16 values into the token's page slot. */
static __global__ void rope_kv_append_kernel(kv_args L, const int32_t *__restrict__ positions,
                                             const int32_t *__restrict__ token_indptr,
                                             int n_seqs, const int32_t *__restrict__ page_indptr,
                                             const int32_t *__restrict__ page_indices,
                                             const double *__restrict__ inv_freq, float *q, int H,
                                             float *k, const float *__restrict__ v, int rotate) {
    __shared__ float ks[COMET_CUDA_KV_MAX_HEAD_DIM], vs[COMET_CUDA_KV_MAX_HEAD_DIM];
    __shared__ float sz[2][COMET_CUDA_KV_MAX_HEAD_DIM / 8][2];
    const int t = blockIdx.x, y = blockIdx.y, D = L.D, half = D / 2, tid = threadIdx.x;
    const int pos = positions[t];
    const bool is_q = y < H;
    float *row = is_q ? q + ((size_t)t * H + y) * D : k + ((size_t)t * L.Hkv + (y - H)) * D;
    for (int f = tid; f < half; f += blockDim.x) {
        const double ang = (double)pos * inv_freq[f];
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float x0 = row[f], x1 = row[f + half];
        const float r0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        const float r1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
        row[f] = r0;
        row[f + half] = r1;
        if (!is_q) {
            ks[f] = r0;
            ks[f + half] = r1;
        }
    }
    if (is_q)
        return;
    const int kvh = y - H;
    const float *vr = v + ((size_t)t * L.Hkv + kvh) * D;
    for (int c = tid; c < D; c += blockDim.x)
        vs[c] = vr[c];
    __syncthreads();
    if (rotate) {
        wht_smem(ks, 1, D, 0);
        wht_smem(vs, 1, D, 0);
    }
    const int s = seq_of_token(token_indptr, n_seqs, t);
    const int page = page_indices[page_indptr[s] + pos / L.P], slot = pos % L.P;
    uint8_t *tile[2] = {kv_tile(L, page, 0, kvh), kv_tile(L, page, 1, kvh)};
    if (L.bits == 16) {
        for (int i = tid; i < 2 * D; i += blockDim.x) {
            const int which = i / D, c = i % D;
            __half *dst = reinterpret_cast<__half *>(tile[which] + (size_t)slot * L.code_row);
            dst[c] = __float2half_rn(which ? vs[c] : ks[c]);
        }
        return;
    }
    const int n_grp = D / L.G, levels = (1 << L.bits) - 1;
    for (int i = tid; i < 2 * n_grp; i += blockDim.x) {
        const int which = i / n_grp, g = i % n_grp;
        const float *x = (which ? vs : ks) + g * L.G;
        float mn = x[0], mx = x[0];
        bool ok = true;
        for (int c = 0; c < L.G; c++) {
            ok &= fabsf(x[c]) <= 65504.0f; /* false for NaN and infinities too */
            mn = x[c] < mn ? x[c] : mn;
            mx = x[c] > mx ? x[c] : mx;
        }
        /* comet_quant_kv_group: zero rounded down, scale up; a NaN scale for a group fp16
         * cannot hold */
        __half hs = __ushort_as_half((unsigned short)0x7e00u), hz = __ushort_as_half(0);
        if (ok) {
            hz = __float2half_rd(mn);
            hs = __float2half_ru(__fdiv_rn(__fsub_rn(mx, __half2float(hz)), (float)levels));
        }
        __half *dst = reinterpret_cast<__half *>(tile[which] + L.sz_offset +
                                                 (size_t)slot * L.sz_row + 4 * g);
        dst[0] = hs;
        dst[1] = hz;
        sz[which][g][0] = __half2float(hs);
        sz[which][g][1] = __half2float(hz);
    }
    __syncthreads();
    auto code = [&](int which, int c) -> unsigned {
        const float sc = sz[which][c / L.G][0], z = sz[which][c / L.G][1];
        if (sc == 0.0f || sc != sc)
            return 0u;
        const float x = which ? vs[c] : ks[c];
        float r = rintf(__fmul_rn(__fsub_rn(x, z), __fdiv_rn(1.0f, sc)));
        r = r < 0.0f ? 0.0f : r > (float)levels ? (float)levels : r;
        return (unsigned)r;
    };
    if (L.bits == 4) {
        for (int i = tid; i < D; i += blockDim.x) { /* i: (which, byte) over 2 * D/2 bytes */
            const int which = i / half, b = i % half;
            tile[which][(size_t)slot * L.code_row + b] =
                (uint8_t)(code(which, 2 * b) | (code(which, 2 * b + 1) << 4));
        }
    } else {
        for (int i = tid; i < 2 * D; i += blockDim.x) {
            const int which = i / D, c = i % D;
            tile[which][(size_t)slot * L.code_row + c] = (uint8_t)code(which, c);
        }
    }
}

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

/* Query rows (token, head of the GQA group) of one attention CTA for head dims up to DMAX:
 * Q [R, DMAX] stays at 32 KB of shared memory (16 KB for DMAX = 64). */
__host__ __device__ constexpr int att_rows(int dmax) { return dmax >= 256 ? 32 : 64; }

struct att_args {
    kv_args L;
    const int32_t *positions, *token_indptr, *page_indptr, *page_indices, *tiles;
    int H, g, tt, n_sub, n_splits, rotate;
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
__device__ __forceinline__ kv_raw8<BITS> kv_fetch8(const kv_args &L, const uint8_t *tile,
                                                   int slot, int c, int szo) {
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
        r.sz = *reinterpret_cast<const uint32_t *>(tile + L.sz_offset + (size_t)slot * L.sz_row +
                                                   szo);
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
 * (max, sum) go to the workspace for attn_combine_kernel. */
template <int DMAX>
static __global__ void __launch_bounds__(ATT_THREADS) attn_kernel(att_args a) {
    constexpr int R = att_rows(DMAX), RW = R / 8, ACC = R * DMAX / ATT_THREADS,
                  RSTEP = ATT_THREADS / DMAX, KS = DMAX + 1;
    extern __shared__ float smem[];
    float *Qs = smem;                 /* [R, DMAX] */
    float *Ks = Qs + R * DMAX;        /* [KC, DMAX + 1] */
    float *Vs = Ks + ATT_KC * KS;     /* [KC, DMAX] */
    float *Ps = Vs + ATT_KC * DMAX;   /* [R, KC] */
    float *corr_s = Ps + R * ATT_KC;  /* [R] */
    float *l_s = corr_s + R;          /* [R] */
    float *m_s = l_s + R;             /* [R] */
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
    const int chunk = ((n_keys + a.n_splits - 1) / a.n_splits + ATT_KC - 1) / ATT_KC * ATT_KC;
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
#pragma unroll
    for (int i = 0; i < RW; i++)
        m_r[i] = -INFINITY, l_r[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < ACC; i++)
        o[i] = 0.0f;
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
            const size_t slot =
                ((size_t)(t0 + r / g) * H + kvh * g + r % g) * a.n_splits + split;
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
    __shared__ float ml[MAX_NG * GM * 2];                      /* [NG, GM] (max, sum) */

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
                                           int n_splits, int rotate, float *__restrict__ out) {
    __shared__ float buf[COMET_CUDA_KV_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const size_t base = ((size_t)t * H + h) * n_splits;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++)
        M = fmaxf(M, ws_ml[2 * (base + s)]);
    float sum = 0.0f, acc = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float m = ws_ml[2 * (base + s)];
        if (m == -INFINITY)
            continue;
        const float w = expf(m - M);
        sum += ws_ml[2 * (base + s) + 1] * w;
        if (d < D)
            acc += ws_acc[(base + s) * D + d] * w;
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
    return sizeof(float) * ((size_t)R * dmax + (size_t)ATT_KC * (dmax + 1) +
                            (size_t)ATT_KC * dmax + (size_t)R * ATT_KC + 3 * (size_t)R) +
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
 * a sequence, always is one) and the GQA group fits its registers. */
bool att_decode_step(const comet_cuda_step_view *st, int g) {
    return st->n_tiles == st->n_tokens && g >= 1 && g <= DEC_MAX_G;
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

template <int DMAX>
comet_status attn_launch(const att_args &a, dim3 grid, cudaStream_t s) {
    const size_t smem = att_smem_bytes(DMAX);
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<DMAX>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "cuda backend: paged_attention: %zu bytes of "
                               "shared memory refused: %s", smem, cudaGetErrorString(e));
    attn_kernel<DMAX><<<grid, ATT_THREADS, smem, s>>>(a);
    return COMET_OK;
}


/* ---- stacked GEMM output ---- */

struct unstack_args {
    const float *y;
    int N, n_parts;
    int col0[4];
    float *out[3];
};

/* Grid (column blocks, T): ys[i][t, c - col0[i]] = y[t, c] for the columns c of part i. */
static __global__ void unstack_kernel(unstack_args a) {
    const int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < a.N; c += gridDim.x * blockDim.x) {
        int i = 0;
        while (i + 1 < a.n_parts && c >= a.col0[i + 1])
            i++;
        float *o = a.out[i];
        if (o)
            o[(size_t)t * (a.col0[i + 1] - a.col0[i]) + (c - a.col0[i])] = a.y[(size_t)t * a.N + c];
    }
}

} /* namespace */

extern "C" {

comet_status comet_cuda_embed(const float *embd, int C, const int32_t *tokens, int T, float *x,
                              void *stream) {
    if (T < 1 || C < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: embed_tokens: T = %d, C = %d",
                               T, C);
    embed_kernel<<<T, 256, 0, static_cast<cudaStream_t>(stream)>>>(embd, C, tokens, x);
    return launch_check("embed_tokens");
}

comet_status comet_cuda_rmsnorm_quant(float *x, const float *residual, const float *norm,
                                      float eps, int T, const comet_cuda_act_fmt *f, void *act,
                                      void *stream) {
    row_args a = {};
    a.x = x, a.residual = residual, a.norm = norm, a.eps = eps;
    return row_quant_launch(ROW_NORM, a, T, f, act, stream, "rmsnorm_quant");
}

comet_status comet_cuda_act_quant(const float *x, int T, const comet_cuda_act_fmt *f, void *act,
                                  void *stream) {
    row_args a = {};
    a.x = const_cast<float *>(x); /* read only in ROW_PLAIN */
    return row_quant_launch(ROW_PLAIN, a, T, f, act, stream, "act_quant");
}

comet_status comet_cuda_silu_mul_quant(const float *gate, const float *up, int T,
                                       const comet_cuda_act_fmt *f, void *act, void *stream) {
    row_args a = {};
    a.gate = gate, a.up = up;
    return row_quant_launch(ROW_SILU, a, T, f, act, stream, "silu_mul_quant");
}

comet_status comet_cuda_gather_rows_f16(const uint16_t *src, int C, const int32_t *rows,
                                        int n_rows, uint16_t *dst, void *stream) {
    if (n_rows < 1)
        return COMET_OK;
    gather_rows_f16_kernel<<<n_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const __half *>(src), C, rows, reinterpret_cast<__half *>(dst));
    return launch_check("lm_head (row gather)");
}

comet_status comet_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    f32_to_f16_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        src, reinterpret_cast<__half *>(dst), n);
    return launch_check("weights_load (fp16 conversion)");
}

comet_status comet_cuda_fill_random(void *dst, size_t n, int kind, float lo, float hi,
                                     uint64_t seed, void *stream) {
    if (n == 0)
        return COMET_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    fill_random_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        dst, n, kind, lo, hi, seed);
    return launch_check("weights_load (synthetic weights)");
}

comet_status comet_cuda_rope_kv_append(const comet_cuda_kv_layout *L, void *storage, int layer,
                                       const comet_cuda_step_view *st, const double *inv_freq,
                                       float *q, int H, float *k, const float *v, int rotate,
                                       void *stream) {
    if (L->D > COMET_CUDA_KV_MAX_HEAD_DIM || L->D % 8 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE ||
        (rotate && (L->D & (L->D - 1))) || (L->bits != 16 && (L->G % 8 || L->D % L->G)))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: rope_kv_append: head dim %d, page size %d, group "
                               "%d%s; the kernel takes D <= %d with D %% 8 == 0 (a power of two "
                               "with the hadamard rotation), P <= %d, groups of a multiple of 8 "
                               "channels dividing D", L->D, L->P, L->G,
                               rotate ? ", hadamard" : "", COMET_CUDA_KV_MAX_HEAD_DIM,
                               COMET_CUDA_KV_MAX_PAGE_SIZE);
    if (st->n_tokens < 1 || H < 1 || layer < 0 || layer >= L->n_layer)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: rope_kv_append: T = %d, H = %d, layer %d of %d",
                               st->n_tokens, H, layer, L->n_layer);
    kv_args ka = kv_args_make(L, storage, layer);
    dim3 grid(st->n_tokens, H + L->Hkv);
    rope_kv_append_kernel<<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(
        ka, st->positions, st->token_indptr, st->n_seqs, st->page_indptr, st->page_indices,
        inv_freq, q, H, k, v, rotate);
    return launch_check("rope_kv_append");
}

int comet_cuda_attention_splits(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                int H, int n_sm) {
    if (L->Hkv < 1 || H % L->Hkv)
        return 1;
    const int g = H / L->Hkv;
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
                                        int layer, const comet_cuda_step_view *st,
                                        const float *q, int H, float *out, int rotate,
                                        int n_splits, void *workspace, void *stream) {
    const int D = L->D;
    if (D > COMET_CUDA_KV_MAX_HEAD_DIM || D % 8 || L->P > COMET_CUDA_KV_MAX_PAGE_SIZE ||
        (rotate && (D & (D - 1))) || (L->bits != 16 && L->G % 8))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: head dim %d, page size %d, group "
                               "%d%s; the kernel takes D <= %d with D %% 8 == 0 (a power of two "
                               "with the hadamard rotation), P <= %d, groups of a multiple of 8 "
                               "channels", D, L->P, L->G, rotate ? ", hadamard" : "",
                               COMET_CUDA_KV_MAX_HEAD_DIM, COMET_CUDA_KV_MAX_PAGE_SIZE);
    if (H < 1 || L->Hkv < 1 || H % L->Hkv || st->n_tokens < 1 || layer < 0 ||
        layer >= L->n_layer || n_splits < 1 || (n_splits > 1 && !workspace))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: paged_attention: H = %d, Hkv = %d, T = %d, layer %d "
                               "of %d, %d splits", H, L->Hkv, st->n_tokens, layer, L->n_layer,
                               n_splits);
    const int g = H / L->Hkv, dmax = att_dmax(D);
    if (g > att_rows(dmax))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: paged_attention: %d query heads per KV head; the "
                               "kernel takes at most %d at head dim %d", g, att_rows(dmax), D);
    if (st->n_tiles < 1)
        return COMET_OK;
    att_args a;
    a.L = kv_args_make(L, storage, layer);
    a.positions = st->positions, a.token_indptr = st->token_indptr;
    a.page_indptr = st->page_indptr, a.page_indices = st->page_indices, a.tiles = st->tiles;
    a.H = H, a.g = g, a.n_splits = n_splits, a.rotate = rotate;
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
        comet_status r = dmax == 64 ? attn_launch<64>(a, grid, s)
                         : dmax == 128 ? attn_launch<128>(a, grid, s)
                                       : attn_launch<256>(a, grid, s);
        if (r < 0)
            return r;
        COMET_TRY(launch_check("paged_attention"));
    }
    if (n_splits > 1) {
        const int threads = (D + 31) / 32 * 32;
        attn_combine_kernel<<<dim3(st->n_tokens, H), threads, 0, s>>>(a.ws_acc, a.ws_ml, H, D,
                                                                      n_splits, rotate, out);
        COMET_TRY(launch_check("paged_attention (split combine)"));
    }
    return COMET_OK;
}

comet_status comet_cuda_unstack(const float *y, int T, int N, int n_parts, const int *widths,
                                float *const *outs, void *stream) {
    unstack_args a = {};
    if (T < 1 || n_parts < 1 || n_parts > 3)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: unstack: T = %d, %d parts",
                               T, n_parts);
    a.y = y, a.N = N, a.n_parts = n_parts;
    for (int i = 0; i < n_parts; i++) {
        a.col0[i + 1] = a.col0[i] + widths[i];
        a.out[i] = outs[i];
    }
    if (a.col0[n_parts] != N)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: unstack: parts of %d "
                               "columns in all, the stack has %d", a.col0[n_parts], N);
    const unsigned blocks = (unsigned)((N + 1023) / 1024 < 64 ? (N + 1023) / 1024 : 64);
    unstack_kernel<<<dim3(blocks, T), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
    return launch_check("matmul (stack split)");
}

} /* extern "C" */

/* rope_kv.cuh — what the kernels that append a token's K and V to the paged cache share
 * (rope_kv.cu: rope_kv_append's kernels; attention_decode_mma.cuh: the tensor-core decode
 * kernel's fused form, which appends the step's token itself): RoPE's angles and rotation,
 * the fp16 scale, zero and codes of a KV group (comet_quant_kv_group's operations), and the
 * register form's end for one KV head (kv_append_regs: the Hadamard rotation, the group
 * ranges, the codes and the stores into the page slot). Every kernel that includes it gets
 * the same operations, so the same bits. Internal: everything is in an anonymous namespace.
 */
#ifndef COMET_BACKEND_CUDA_ROPE_KV_CUH
#define COMET_BACKEND_CUDA_ROPE_KV_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/paged_kv.cuh"

namespace {

/* The RoPE angle of pair f at position pos: pos * inv_freq[f] in double (the CPU's table), its
 * cos and sin rounded to float. */
__device__ __forceinline__ void rope_cs(int pos, const double *inv_freq, int f, float &cs,
                                        float &sn) {
    const double ang = (double)pos * inv_freq[f];
    cs = (float)cos(ang), sn = (float)sin(ang);
}

/* The rotation of the pair (x0, x1) by (cs, sn) in round-to-nearest float ops, as the CPU
 * does them. */
__device__ __forceinline__ void rope_pair(float x0, float x1, float cs, float sn, float &r0,
                                          float &r1) {
    r0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    r1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

/* RoPE on one head's row in place, pairs (f, f + D / 2) for f = tid, tid + stride, ...:
 * rope_cs's angle, rope_pair's rotation. A k head (keep) also keeps the rotated row in ks. */
__device__ __forceinline__ void rope_row(float *row, float *ks, bool keep, int pos,
                                         const double *inv_freq, int half, int tid, int stride) {
    for (int f = tid; f < half; f += stride) {
        float cs, sn, r0, r1;
        rope_cs(pos, inv_freq, f, cs, sn);
        rope_pair(row[f], row[f + half], cs, sn, r0, r1);
        row[f] = r0;
        row[f + half] = r1;
        if (keep) {
            ks[f] = r0;
            ks[f + half] = r1;
        }
    }
}

/* comet_quant_kv_group's fp16 scale and zero of a group with range [mn, mx]: the zero
 * rounded down, the scale up; a NaN scale (zero 0) for a group fp16 cannot hold (!ok) */
__device__ __forceinline__ void kv_scale_zero(float mn, float mx, bool ok, int levels, __half &hs,
                                              __half &hz) {
    hs = __ushort_as_half((unsigned short)0x7e00u), hz = __ushort_as_half(0);
    if (ok) {
        hz = __float2half_rd(mn);
        hs = __float2half_ru(__fdiv_rn(__fsub_rn(mx, __half2float(hz)), (float)levels));
    }
}

/* comet_quant_kv_group's code of x at scale sc and zero z: 0 where the scale is 0 or NaN,
 * and for a channel that is not there (!live) */
__device__ __forceinline__ unsigned kv_code(bool live, float x, float z, float sc, int levels) {
    unsigned code = 0u;
    if (live && sc != 0.0f && sc == sc) {
        float c = rintf(__fmul_rn(__fsub_rn(x, z), __fdiv_rn(1.0f, sc)));
        c = c < 0.0f ? 0.0f : c > (float)levels ? (float)levels : c;
        code = (unsigned)c;
    }
    return code;
}

/* ---- the register form's KV end ---- */

constexpr int ROPE_THREADS = 128;
constexpr unsigned FULL = 0xffffffffu;

/* Channels of a head a thread of kv_append_regs holds: e = tid + ROPE_THREADS r, r < R */
constexpr int KV_APPEND_R = COMET_CUDA_KV_MAX_HEAD_DIM / ROPE_THREADS;

/* One Walsh-Hadamard butterfly of stage h on the value x at index i whose partner (index
 * i ^ h) holds o: wht_smem's v[j] = a + b, v[j + h] = a - b with a at the lower index. */
__device__ __forceinline__ float wht_bf(float x, float o, bool upper) {
    return upper ? __fsub_rn(o, x) : __fadd_rn(x, o);
}

/* The scan of comet_quant_kv_group (mn = x < mn ? x : mn and mx = x > mx ? x : mx from
 * x[0], in channel order) over the concatenation of a lower and an upper run: the upper
 * run's extreme only where strictly beyond the lower's, so that of equal values (+0 and -0)
 * the first one wins, as in the scan. */
struct kv_range {
    float mn, mx;
    bool ok;
};
__device__ __forceinline__ kv_range kv_range_cat(const kv_range &lo, const kv_range &hi) {
    return {hi.mn < lo.mn ? hi.mn : lo.mn, hi.mx > lo.mx ? hi.mx : lo.mx, lo.ok && hi.ok};
}
/* The range of the 8 lanes (an aligned run of 8 channels) holding r, in every one of them */
__device__ __forceinline__ kv_range kv_range_lanes8(kv_range r, int lane) {
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
        const kv_range o = {__shfl_xor_sync(FULL, r.mn, off), __shfl_xor_sync(FULL, r.mx, off),
                            __shfl_xor_sync(FULL, (int)r.ok, off) != 0};
        r = lane & off ? kv_range_cat(o, r) : kv_range_cat(r, o);
    }
    return r;
}

/* v's channels e = tid + ROPE_THREADS r of a row of D (0 past D), as kv_append_regs takes them */
__device__ __forceinline__ void kv_append_load_v(const float *vrow, int D, int tid,
                                                 float (&vr)[KV_APPEND_R]) {
#pragma unroll
    for (int r = 0; r < KV_APPEND_R; r++) {
        const int e = tid + ROPE_THREADS * r;
        vr[r] = e < D ? vrow[e] : 0.0f;
    }
}

/* The end of the register form's append for one KV head, by a CTA of ROPE_THREADS threads
 * (rope_kv_append_reg_kernel's description): k after RoPE in ks (every channel < L.D written
 * before a barrier that every thread has passed), v's channels e = tid + ROPE_THREADS r in
 * vr (0 past L.D); ks, vs [COMET_CUDA_KV_MAX_HEAD_DIM] and runs are shared memory it takes
 * over (it rewrites ks). With `rotate` k and v go through the Hadamard butterflies; then the
 * groups' ranges, fp16 scales and zeros and the codes, stored into slot `slot` of the head
 * tiles tile[0] (K) and tile[1] (V). Every thread of the CTA calls it (it holds barriers). */
template <int BITS>
__device__ __forceinline__ void kv_append_regs(const kv_args &L, float *ks, float *vs,
                                               kv_range (*runs)[COMET_CUDA_KV_MAX_HEAD_DIM / 8],
                                               float (&vr)[KV_APPEND_R], uint8_t *const (&tile)[2],
                                               int slot, int rotate, int tid, int lane) {
    constexpr int R = KV_APPEND_R;
    const int D = L.D;
    float kr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int e = tid + ROPE_THREADS * r;
        kr[r] = e < D ? ks[e] : 0.0f;
    }
    if (rotate) { /* D is a power of two */
        for (int h = 1; h < D && h < 32; h <<= 1) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const bool up = lane & h;
                kr[r] = wht_bf(kr[r], __shfl_xor_sync(FULL, kr[r], h), up);
                vr[r] = wht_bf(vr[r], __shfl_xor_sync(FULL, vr[r], h), up);
            }
        }
        if (D > 32) { /* stages 32 and 64 (those below D) across warps; a thread rewrites
                       * only the ks entries it read itself */
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = tid + ROPE_THREADS * r;
                if (e < D)
                    ks[e] = kr[r], vs[e] = vr[r];
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = tid + ROPE_THREADS * r;
                if (e >= D)
                    continue;
#pragma unroll
                for (int w = 0; w < 2; w++) {
                    const float *x = w ? vs : ks;
                    float z;
                    if (D == 64) {
                        z = wht_bf(x[e], x[e ^ 32], e & 32);
                    } else { /* stage 32 at e and at e ^ 64, then stage 64 */
                        const float y0 = wht_bf(x[e], x[e ^ 32], e & 32);
                        const float y1 = wht_bf(x[e ^ 64], x[e ^ 96], e & 32);
                        z = wht_bf(y0, y1, e & 64);
                    }
                    if (w)
                        vr[r] = z;
                    else
                        kr[r] = z;
                }
            }
            if (D > 128) { /* stage 128: channels tid and tid + 128 of this thread */
                const float k0 = kr[0], v0 = vr[0];
                kr[0] = wht_bf(k0, kr[R - 1], false), kr[R - 1] = wht_bf(kr[R - 1], k0, true);
                vr[0] = wht_bf(v0, vr[R - 1], false), vr[R - 1] = wht_bf(vr[R - 1], v0, true);
            }
        }
        const float norm = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
#pragma unroll
        for (int r = 0; r < R; r++)
            kr[r] = __fmul_rn(kr[r], norm), vr[r] = __fmul_rn(vr[r], norm);
    }
    if constexpr (BITS == 16) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int e = tid + ROPE_THREADS * r;
            if (e >= D)
                continue;
            reinterpret_cast<__half *>(tile[0] + (size_t)slot * L.code_row)[e] =
                __float2half_rn(kr[r]);
            reinterpret_cast<__half *>(tile[1] + (size_t)slot * L.code_row)[e] =
                __float2half_rn(vr[r]);
        }
        return;
    }
    const int G = L.G, levels = (1 << BITS) - 1;
    kv_range rg[2][R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int e = tid + ROPE_THREADS * r;
#pragma unroll
        for (int w = 0; w < 2; w++) {
            const float x = w ? vr[r] : kr[r];
            /* lanes past D (whole runs of 8: D % 8 == 0) reduce among themselves */
            rg[w][r] = kv_range_lanes8({x, x, fabsf(x) <= 65504.0f}, lane);
            if (G > 8 && e < D && (e & 7) == 0)
                runs[w][e >> 3] = rg[w][r];
        }
    }
    if (G > 8) {
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int e = tid + ROPE_THREADS * r;
            if (e >= D)
                continue;
            const int r0 = (e / G) * (G >> 3), n = G >> 3;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                kv_range acc = runs[w][r0];
                for (int j = 1; j < n; j++)
                    acc = kv_range_cat(acc, runs[w][r0 + j]);
                rg[w][r] = acc;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int e = tid + ROPE_THREADS * r;
        unsigned code[2];
#pragma unroll
        for (int w = 0; w < 2; w++) {
            __half hs, hz;
            kv_scale_zero(rg[w][r].mn, rg[w][r].mx, rg[w][r].ok, levels, hs, hz);
            code[w] = kv_code(e < D, w ? vr[r] : kr[r], __half2float(hz), __half2float(hs), levels);
            if (e < D && e % G == 0) {
                __half *dst = reinterpret_cast<__half *>(tile[w] + L.sz_offset +
                                                         (size_t)slot * L.sz_row + 4 * (e / G));
                dst[0] = hs;
                dst[1] = hz;
            }
        }
#pragma unroll
        for (int w = 0; w < 2; w++) {
            uint8_t *codes = tile[w] + (size_t)slot * L.code_row;
            if constexpr (BITS == 4) {
                const unsigned odd = __shfl_xor_sync(FULL, code[w], 1);
                if (e < D && !(e & 1))
                    codes[e >> 1] = (uint8_t)(code[w] | odd << 4);
            } else if (e < D) {
                codes[e] = (uint8_t)code[w];
            }
        }
    }
}

} /* namespace */

#endif

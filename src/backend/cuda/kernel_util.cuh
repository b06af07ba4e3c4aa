/* kernel_util.cuh — what every kernel file of the CUDA backend's step ops shares: the launch
 * check, the warp reductions and the warp's quantization of one activation block. Internal to
 * the .cu files: everything is in an anonymous namespace.
 */
#ifndef COMET_BACKEND_CUDA_KERNEL_UTIL_CUH
#define COMET_BACKEND_CUDA_KERNEL_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "comet/status.h"

namespace {

inline comet_status launch_check(const char *op) {
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

/* One W4Ax activation block quantized by one warp, comet_quant_sym_block's operations one for
 * one (docs/numerics.md): lane `lane` holds the block's values at offsets lane * per + e in
 * v[e] (per = B / 32, 2 or 4; v[e] = 0 for e >= per). Scale amax / qmax (qmax 127 for an INT8
 * block, 7 for INT4), codes rint(v / scale) clamped to [-qmax - 1, qmax]; the lane's per codes
 * go to codes + lane * per as one 2- or 4-byte store and lane 0 writes the scale to *scale. An
 * all-zero block gets scale 0, a block holding a non-finite value a NaN scale; both zero
 * codes. */
__device__ __forceinline__ void warp_quant_block(const float (&v)[4], int per, int qmax, int lane,
                                                 int8_t *codes, float *scale) {
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        finite &= isfinite(v[e]);
        amax = fmaxf(amax, fabsf(v[e]));
    }
    amax = warp_max(amax);
    finite = __all_sync(0xffffffffu, finite);
    int8_t q[4] = {0, 0, 0, 0};
    float s = finite ? 0.0f : __int_as_float(0x7fc00000); /* comet_quant_sym_block's NaN */
    if (finite && amax != 0.0f) {
        s = __fdiv_rn(amax, (float)qmax);
        const float sinv = __fdiv_rn(1.0f, s);
        const float lo = (float)(-qmax - 1), hi = (float)qmax;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float r = rintf(__fmul_rn(v[e], sinv));
            r = r < lo ? lo : r > hi ? hi : r;
            q[e] = (int8_t)r;
        }
    }
    int8_t *dst = codes + lane * per;
    if (per == 4)
        *reinterpret_cast<char4 *>(dst) = make_char4(q[0], q[1], q[2], q[3]);
    else
        *reinterpret_cast<char2 *>(dst) = make_char2(q[0], q[1]);
    if (lane == 0)
        *scale = s;
}

} /* namespace */

#endif

/* kernel_util.cuh — what every kernel file of the CUDA backend's step ops shares: the launch
 * check and the warp reductions. Internal to the .cu files: everything is in an anonymous
 * namespace.
 */
#ifndef COMET_BACKEND_CUDA_KERNEL_UTIL_CUH
#define COMET_BACKEND_CUDA_KERNEL_UTIL_CUH

#include <cuda_runtime.h>

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

} /* namespace */

#endif

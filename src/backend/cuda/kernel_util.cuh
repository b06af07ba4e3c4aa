/* kernel_util.cuh — what every kernel file of the CUDA backend's step ops shares: the launch
 * (with programmatic dependent launch) and its check, and the warp reductions. Internal to the
 * .cu files: everything is in an anonymous namespace.
 */
#ifndef COMET_BACKEND_CUDA_KERNEL_UTIL_CUH
#define COMET_BACKEND_CUDA_KERNEL_UTIL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/ptx.cuh"
#include "comet/status.h"

namespace {

/* Whether step kernels launch with programmatic dependent launch: on an sm_90+ device unless
 * COMET_CUDA_PDL=0 (the switch the W4Ax GEMMs read too). Read once per process and device. */
inline int step_pdl_on() {
    static int env = -1;
    static signed char on_dev[64];
    if (env < 0) {
        const char *v = getenv("COMET_CUDA_PDL");
        env = !(v && !strcmp(v, "0"));
    }
    int dev = 0;
    if (!env || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 0;
    if (on_dev[dev] == 0) {
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        on_dev[dev] = major >= 9 ? 1 : -1;
    }
    return on_dev[dev] > 0;
}

/* Launches kernel<<<grid, block, smem, s>>>(args...), with programmatic dependent launch where
 * step_pdl_on(): the kernel's CTAs may then be resident while the previous kernel of the stream
 * finishes, and must call step_pdl_begin() before their first global memory access. Returns
 * the launch's cudaError_t (launch_check reads it too). */
template <typename... KArgs, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr, cfg.numAttrs = step_pdl_on() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

/* The first statement of every step kernel launched by launch_kernel: wait for the previous
 * kernel of the stream to complete (its writes visible; every kernel waits, so completion is
 * transitive along the stream), then let the next kernel launch. A no-op without the
 * attribute. */
__device__ __forceinline__ void step_pdl_begin() {
    comet_ptx::pdl_wait();
    comet_ptx::pdl_trigger();
}

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

/* ptx_load.cuh — the streaming 16-byte global load of the W4Ax kernels (read-only path, no
 * L1 allocation: each weight byte is read once), shared with bench/gemm/floor.cu so that
 * the decode floor is measured with the kernels' own load instruction. */
#pragma once

#include <stdint.h>

__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

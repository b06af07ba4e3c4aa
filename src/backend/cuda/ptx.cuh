/* ptx.cuh — the PTX the CUDA kernels share, one inline wrapper per instruction family, in
 * namespace comet_ptx (sm_80+; the sm_90 ones compile to nothing, or to a no-op, below
 * sm_90 as each says):
 *  - streaming 16-byte global load (ld_stream), also used by bench/gemm/floor.cu so that
 *    the decode floor is measured with the kernels' own instruction;
 *  - programmatic dependent launch (pdl_trigger, pdl_wait) and L2 prefetch;
 *  - mma.sync m16n8k32 s8, mma.sync m16n8k16 f16 (fp32 accumulators) and wgmma m64nNk32 s8
 *    (N = 128, 64, 32, 16);
 *  - cp.async (16 / 4 bytes, zero-fill), ldmatrix x4 (plain and transposed);
 *  - mbarriers, TMA 2-D tile and 1-D bulk copies that complete on them;
 *  - thread-block cluster barrier (whole, or split into arrive and wait), rank and
 *    distributed-shared-memory addresses, loads and stores.
 * Kernel-specific helpers (promotion, weight-scale loads, output stores) stay with their
 * kernels. */
#pragma once

#include <cuda.h> /* CUtensorMap */
#include <stdint.h>

#include "backend/cuda/env_switch.h"

namespace comet_ptx {

__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Programmatic dependent launch (sm_90; comet_cuda_w4ax_gemm.pdl). Every GEMM kernel, and
 * the step kernels that quantize a GEMM's input (RMSNorm + quantize, activation quantize,
 * SwiGLU + quantize, the split merge + quantize), let the next kernel of the stream launch
 * from their start (pdl_trigger; that kernel, if launched with the attribute, waits for this
 * whole grid in its own pdl_wait before it touches anything this one writes). Only the GEMMs
 * launch with the attribute: they call pdl_wait before their first access to anything but the
 * weights qw and sw (activation codes and scales, outputs, workspace), so their weights stream
 * while the kernel before them runs; the step kernels trigger only at up to
 * PDL_TRIGGER_MAX_ROWS rows (step_trigger). pdl_wait in a kernel launched without the
 * attribute is a no-op (the launch itself waited for the previous kernel); pdl_trigger acts on
 * the next kernel however this one was launched. COMET_PDL_NO_WAIT drops the wait, a test of
 * the test only: test_gemm_w4ax_cuda's chained calls must then fail. */
/* Rows (tokens) up to which a step kernel triggers: 8B decode 1.083x at batch 1, 0.94x at 64 */
constexpr int PDL_TRIGGER_MAX_ROWS = 16;
/* Host: whether a step kernel of `rows` rows triggers (its args' pdl_trigger): up to
 * PDL_TRIGGER_MAX_ROWS, unless COMET_CUDA_STEP_TRIGGER=0 (read at every launch; a decode
 * step's CUDA graph keeps the value it was recorded with, so compare in separate processes
 * or with COMET_CUDA_GRAPHS=0). */
inline int step_trigger(int rows) {
    return rows <= PDL_TRIGGER_MAX_ROWS && !comet_cuda_env_off("COMET_CUDA_STEP_TRIGGER");
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(COMET_PDL_NO_WAIT)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/* Ask L2 for global bytes [p, p + bytes) (a 16-byte multiple; sm_90, else nothing): the
 * weights a kernel launched early by pdl reads first, fetched while the previous kernel runs. */
__device__ __forceinline__ void l2_prefetch(const void *ptr, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes)
                     : "memory");
#endif
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Copies addressed by a shared-memory (.shared window) address (the _sz one and the 4-byte one
 * zero-filled, nothing read, when !valid). */
__device__ __forceinline__ void cp_async16_s(uint32_t s, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async16_sz(uint32_t s, const void *gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    cp_async16_sz((uint32_t)__cvta_generic_to_shared(smem), gmem, valid);
}

__device__ __forceinline__ void cp_async4_s(uint32_t s, const void *gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(valid ? 4 : 0));
}
[[maybe_unused]] __device__ __forceinline__ void cp_async4(void *smem, const void *gmem,
                                                           bool valid) {
    cp_async4_s((uint32_t)__cvta_generic_to_shared(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The same with .trans: thread i gets, of each 8x8 matrix, column i / 4 at rows 2 (i % 4) and
 * 2 (i % 4) + 1 (the B operand of an mma from a row-major [k][n] tile). */
[[maybe_unused]] __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* mma.sync m16n8k16 with fp16 A (row) and B (col) fragments and fp32 accumulators c (not
 * volatile: registers only, so the compiler may schedule it among the loads). */
[[maybe_unused]] __device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

[[maybe_unused]] __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
[[maybe_unused]] __device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar,
                                                                       unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* This thread's earlier cp.async copies arrive on `bar` when they land (no pending-count
 * increment: the barrier's expected count includes these arrivals). */
[[maybe_unused]] __device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
                 : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map,
                                                             int x, int y, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_u32(bar))
                 : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void bulk_load(void *dst, const void *src,
                                                           unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* Thread-block cluster primitives (sm_90): barrier over all threads of the cluster, this
 * CTA's rank in it, and a 4-byte load from the same shared-memory offset in CTA `rank`. */
[[maybe_unused]] __device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
            : "memory");
}
[[maybe_unused]] __device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* The two halves of that barrier: arrive.relaxed orders nothing (a start-up handshake: every
 * CTA of the cluster is running once the wait returns), arrive.release publishes this thread's
 * earlier shared-memory writes (local and remote) to the threads that return from the wait,
 * whose reads after it see them (acquire). */
[[maybe_unused]] __device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
[[maybe_unused]] __device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
[[maybe_unused]] __device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* The shared::cluster address of shared-memory location p in CTA `rank` of the cluster, and a
 * 4-byte store there (a posted write: it completes by the writer's next cluster_arrive). */
[[maybe_unused]] __device__ __forceinline__ uint32_t dsmem_addr(const void *p, unsigned rank) {
    uint32_t remote;
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n"
        : "=r"(remote)
        : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
    return remote;
}
[[maybe_unused]] __device__ __forceinline__ void st_dsmem(uint32_t addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
[[maybe_unused]] __device__ __forceinline__ float ld_dsmem(const float *p, int rank) {
    uint32_t local = (uint32_t)__cvta_generic_to_shared(p), remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
    return v;
}
[[maybe_unused]] __device__ __forceinline__ float4 ld_dsmem4(const float *p, int rank) {
    uint32_t local = (uint32_t)__cvta_generic_to_shared(p), remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}

/* wgmma.mma_async.m64n128k32.s32.s8.s8 with A (the weights, m16n8k32 fragment per warp)
 * from registers and B (128 tokens) from shared memory through a descriptor. */
[[maybe_unused]] __device__ __forceinline__ void wgmma_128(int (&d)[64], uint32_t a0, uint32_t a1,
                                                           uint32_t a2, uint32_t a3, uint64_t desc,
                                                           int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, "
                 "%7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
                 "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
                 "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
                 "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),
                   "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),
                   "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),
                   "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
                   "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                   "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]),
                   "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]),
                   "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
#endif
}

/* The same with 64 tokens (wgmma.mma_async.m64n64k32): 32 accumulators per thread. */
[[maybe_unused]] __device__ __forceinline__ void wgmma_64(int (&d)[32], uint32_t a0, uint32_t a1,
                                                          uint32_t a2, uint32_t a3, uint64_t desc,
                                                          int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, "
                 "%7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
                 "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),
                   "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),
                   "+r"(d[30]), "+r"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
#endif
}

/* The same with 32 tokens (wgmma.mma_async.m64n32k32): 16 accumulators per thread. */
[[maybe_unused]] __device__ __forceinline__ void wgmma_32(int (&d)[16], uint32_t a0, uint32_t a1,
                                                          uint32_t a2, uint32_t a3, uint64_t desc,
                                                          int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, "
                 "%7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
#endif
}

/* The same with 16 tokens (wgmma.mma_async.m64n16k32): 8 accumulators per thread. */
[[maybe_unused]] __device__ __forceinline__ void wgmma_16(int (&d)[8], uint32_t a0, uint32_t a1,
                                                          uint32_t a2, uint32_t a3, uint64_t desc,
                                                          int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, "
                 "%7}, {%8, %9, %10, %11}, %12, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
#endif
}

} /* namespace comet_ptx */

/* bench_lm_head.cu — the INT8-per-row lm_head (comet_cuda_lm_head_w8) against cuBLAS FP16 on
 * the same logits, in one process: V = 128256 vocabulary rows (LLaMA-3), C = 4096 (--c 8192
 * for the 70B width), n tokens from 1 to 512.
 *
 *   W8:     logits[n, V] fp32 = s[v] * (x[n, C] fp16 . q[V, C] int8 codes), fp16 scales s[V]
 *   cuBLAS: logits[n, V] fp32 = x[n, C] fp16 . W[V, C] fp16 (cublasGemmEx, fp32 compute and
 *           output), W row-major as the engine's FP16 lm_head
 *
 * Timing: CUDA events around each call, 5 warm-up calls, median of 50 (queued behind a spin
 * kernel so that host launch gaps stay out of the events, harness.cuh). Every call streams the
 * whole weight matrix (0.5 GB of codes, 1 GB of fp16 at C = 4096), far past the 50-60 MB L2,
 * so inputs are not rotated. W8 GB/s counts the bytes the op must read: codes, scales and x.
 *
 * Check: cuBLAS also runs on the codes as fp16 (exact: |q| <= 128), and those sums times s
 * are the reference for the W8 logits (both fp32 sums of exact products, in different orders);
 * the table gives the largest error relative to max |logit| of the call and the largest
 * relative error of a logit of at least 1e-3 of that maximum.
 *
 * Usage: bench_lm_head [--c 4096|8192] [--v 128256] [--ns 1,2,4,...] [--peak-gbs 3350]
 * Prints the markdown table (GPU, date and arguments first) on stdout. Benchmark tooling,
 * not engine. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "backend/cuda/lm_head_w8.h"

#include "harness.cuh"

/* fp16 in [-1, 1): activations */
static __global__ void fill_x(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half((float)(hash32(i, seed) % 2001) * 1e-3f - 1.0f);
}
/* int8 codes in [-127, 127] */
static __global__ void fill_codes(int8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int8_t)((int)(hash32(i, seed) % 255) - 127);
}
/* positive fp16 scales in [1e-4, 1e-2], a per-row INT8 lm_head's range */
static __global__ void fill_scales(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half((float)(hash32(i, seed) % 1000 + 10) * 1e-5f);
}
/* the codes as fp16 (exact), the cuBLAS operand */
static __global__ void codes_to_f16(const int8_t *q, __half *w, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = __int2half_rn(q[i]);
}

static void *dmalloc(size_t b) {
    void *p;
    CK(cudaMalloc(&p, b));
    return p;
}

static std::vector<int> parse_list(const char *s) {
    std::vector<int> v;
    for (const char *p = s; *p;) {
        v.push_back(atoi(p));
        while (*p && *p != ',')
            p++;
        if (*p == ',')
            p++;
    }
    return v;
}

int main(int argc, char **argv) {
    int C = 4096, V = 128256;
    double peak_gbs = 3350; /* H100 SXM HBM3 (H200: 4800) */
    std::vector<int> ns = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--c") && i + 1 < argc)
            C = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--v") && i + 1 < argc)
            V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ns") && i + 1 < argc)
            ns = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--peak-gbs") && i + 1 < argc)
            peak_gbs = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_lm_head [--c C] [--v V] [--ns 1,2,4] [--peak-gbs GB/s]\n");
            return 2;
        }
    }
    if (C < 1 || V < 1 || ns.empty() || *std::min_element(ns.begin(), ns.end()) < 1) {
        fprintf(stderr, "bench_lm_head: C, V and every n must be at least 1\n");
        return 2;
    }
    const int nmax = *std::max_element(ns.begin(), ns.end());
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));

    const size_t VC = (size_t)V * C;
    int8_t *q = (int8_t *)dmalloc(VC);
    __half *s = (__half *)dmalloc((size_t)V * 2);
    __half *w16 = (__half *)dmalloc(VC * 2);
    __half *x = (__half *)dmalloc((size_t)nmax * C * 2);
    float *y8 = (float *)dmalloc((size_t)nmax * V * 4);
    float *y16 = (float *)dmalloc((size_t)nmax * V * 4);
    fill_codes<<<1024, 256>>>(q, VC, 1);
    fill_scales<<<1024, 256>>>(s, (size_t)V, 2);
    fill_x<<<1024, 256>>>(x, (size_t)nmax * C, 3);
    codes_to_f16<<<1024, 256>>>(q, w16, VC);
    CK(cudaDeviceSynchronize());
    cublasHandle_t blas;
    CKB(cublasCreate(&blas));

    std::vector<uint16_t> hs(V);
    CK(cudaMemcpy(hs.data(), s, (size_t)V * 2, cudaMemcpyDeviceToHost));
    std::vector<float> h8, h16;

    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("GPU: %s (%d SMs, L2 %d MB), %s; V = %d, C = %d, peak %.0f GB/s; CUDA events around "
           "each call, median of 50\n\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, date, V, C, peak_gbs);
    printf("| n | W8 µs | W8 GB/s | of peak | cuBLAS FP16 µs | cuBLAS / W8 | max err / max | "
           "max rel err | W8 form |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int n : ns) {
        auto w8 = [&](int) {
            if (comet_cuda_lm_head_w8(q, reinterpret_cast<const uint16_t *>(s), V, C,
                                      reinterpret_cast<const uint16_t *>(x), n, y8,
                                      NULL) != COMET_OK) {
                fprintf(stderr, "lm_head_w8: %s\n", comet_last_error());
                exit(2);
            }
        };
        auto fp16 = [&](int) {
            const float one = 1.0f, zero = 0.0f;
            /* column-major: y^T [V, n] = W [C, V]^T . x^T [C, n] */
            CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, V, n, C, &one, w16, CUDA_R_16F, C, x,
                             CUDA_R_16F, C, &zero, y16, CUDA_R_32F, V, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
        };
        const double t8 = time_us(w8, 1, 5, 50), t16 = time_us(fp16, 1, 5, 50);
        const double bytes = (double)VC + 2.0 * V + 2.0 * n * C;

        /* the check: cuBLAS on the fp16 codes times s against W8 */
        const size_t ny = (size_t)n * V;
        h8.resize(ny), h16.resize(ny);
        CK(cudaMemcpy(h8.data(), y8, ny * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h16.data(), y16, ny * 4, cudaMemcpyDeviceToHost));
        double ymax = 0.0;
        for (size_t i = 0; i < ny; i++) {
            float sv = __half2float(__ushort_as_half(hs[i % V]));
            h16[i] *= sv;
            ymax = std::max(ymax, (double)std::fabs(h16[i]));
        }
        double err_max = 0.0, rel_max = 0.0;
        for (size_t i = 0; i < ny; i++) {
            const double d = std::fabs((double)h8[i] - (double)h16[i]);
            if (!(d <= err_max)) /* NaN counts as the largest error */
                err_max = std::isnan(d) ? INFINITY : d;
            if (std::fabs(h16[i]) >= 1e-3 * ymax)
                rel_max = std::max(rel_max, d / std::fabs(h16[i]));
        }
        printf("| %d | %.2f | %.0f | %.2f | %.2f | %.2f | %.2e | %.2e | %s |\n", n, t8,
               bytes / t8 * 1e-3, bytes / t8 * 1e-3 / peak_gbs, t16, t16 / t8,
               ymax > 0 ? err_max / ymax : err_max, rel_max,
               comet_cuda_lm_head_w8_form(q, C, reinterpret_cast<const uint16_t *>(x), n));
        fflush(stdout);
    }
    cublasDestroy(blas);
    cudaFree(q), cudaFree(s), cudaFree(w16), cudaFree(x), cudaFree(y8), cudaFree(y16);
    return 0;
}

/* w4ax_cpu.c — the CPU's integer W4Ax GEMM (see w4ax_cpu.h): the weight wrapper (regrouped
 * scales, a padded last group), one kernel per instruction set (w4ax_cpu_kernel.inc, compiled with that set's
 * target attributes so a generic build still carries them), the cpuid choice, and the
 * threaded driver. Decode reads each weight byte once per step, so its cost is the weight
 * bytes (K/2 per row plus 2 bytes of scale per block); prefill keeps a row group's codes in
 * L1 across a tile of tokens. */
#include "backend/cpu/w4ax_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/w4ax_check.h"
#include "numerics/quant.h"
#include "numerics/w4_plain.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define W4AX_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define W4AX_TT 64     /* tokens per work item */
#define W4AX_GROUPS 4  /* row groups (of 8 output channels) per work item, at least */
#define W4AX_PF_BYTES 6144 /* how far ahead the vector kernels prefetch codes, in whole row
                            * groups (at least one) nearest to this many bytes */

const char *comet_w4ax_cpu_isa_name(comet_w4ax_isa isa) {
    static const char *names[COMET_W4AX_ISA_COUNT] = {"auto", "scalar", "avx2", "avx-vnni",
                                                      "avx512-vnni"};
    return (unsigned)isa < COMET_W4AX_ISA_COUNT ? names[isa] : NULL;
}

#ifdef W4AX_X86
/* cpuid leaves 1 and 7 and the OS's saved register state (XCR0): the instruction sets
 * above, read once (gcc's and clang's __builtin_cpu_supports name them differently). */
static int cpu_has(comet_w4ax_isa isa) {
    unsigned a, b, c, d, ecx1, ebx7, ecx7, eax71 = 0;
    if (!__get_cpuid(1, &a, &b, &ecx1, &d) || !__get_cpuid_count(7, 0, &a, &ebx7, &ecx7, &d))
        return 0;
    if (a >= 1)
        __get_cpuid_count(7, 1, &eax71, &b, &c, &d);
    unsigned xcr0 = 0;
    if (ecx1 & (1u << 27)) { /* OSXSAVE: xgetbv may be used */
        unsigned hi;
        __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(hi) : "c"(0));
    }
    const int avx_state = (xcr0 & 0x6) == 0x6, avx512_state = (xcr0 & 0xE6) == 0xE6;
    const int avx2 = avx_state && (ebx7 & (1u << 5)) && (ecx1 & (1u << 12)) && /* FMA */
                     (ecx1 & (1u << 29));                                      /* F16C */
    switch (isa) {
    case COMET_W4AX_ISA_AVX2:
        return avx2;
    case COMET_W4AX_ISA_AVXVNNI:
        return avx2 && (eax71 & (1u << 4));
    case COMET_W4AX_ISA_AVX512VNNI:
        return avx2 && avx512_state && (ebx7 & (1u << 16)) && (ebx7 & (1u << 31)) &&
               (ecx7 & (1u << 11)); /* AVX512F, AVX512VL, AVX512_VNNI */
    default:
        return 0;
    }
}
#endif

int comet_w4ax_cpu_isa_supported(comet_w4ax_isa isa) {
    switch (isa) {
    case COMET_W4AX_ISA_AUTO:
    case COMET_W4AX_ISA_SCALAR:
        return 1;
#ifdef W4AX_X86
    case COMET_W4AX_ISA_AVX2:
    case COMET_W4AX_ISA_AVXVNNI:
    case COMET_W4AX_ISA_AVX512VNNI: {
        static int known[COMET_W4AX_ISA_COUNT], has[COMET_W4AX_ISA_COUNT];
        if (!known[isa]) { /* idempotent: a race only computes the same answer twice */
            has[isa] = cpu_has(isa);
            known[isa] = 1;
        }
        return has[isa];
    }
#endif
    default:
        return 0;
    }
}

comet_w4ax_isa comet_w4ax_cpu_isa_best(void) {
    static const comet_w4ax_isa order[] = {COMET_W4AX_ISA_AVX512VNNI, COMET_W4AX_ISA_AVXVNNI,
                                           COMET_W4AX_ISA_AVX2};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (comet_w4ax_cpu_isa_supported(order[i]))
            return order[i];
    return COMET_W4AX_ISA_SCALAR;
}

comet_status comet_w4ax_cpu_pack(int N, int K, int B, const uint8_t *qw_plain,
                                 const uint16_t *sw_plain, comet_w4ax_cpu *w) {
    if (w)
        memset(w, 0, sizeof *w);
    COMET_TRY(comet_w4ax_check_load("comet_w4ax_cpu_pack", N, K, B, qw_plain, sw_plain, w));
    const int R = COMET_W4AX_CPU_ROWS, nb = K / B, full = N / R;
    w->N = N, w->K = K, w->B = B;
    w->n_pad = (N + R - 1) / R * R;
    w->qw = qw_plain;
    w->sw = malloc((size_t)w->n_pad * nb * sizeof *w->sw);
    if (N % R)
        w->tail = calloc((size_t)R, (size_t)(K / 2)); /* nibble 0: code 0 */
    if (!w->sw || (N % R && !w->tail)) {
        comet_w4ax_cpu_free(w);
        return comet_set_error(COMET_ERR_NOMEM,
                               "comet_w4ax_cpu_pack: out of memory for an N=%d K=%d weight", N, K);
    }
    if (w->tail)
        memcpy(w->tail, qw_plain + (size_t)full * R * (K / 2), (size_t)(N % R) * (K / 2));
    for (int g = 0; g < w->n_pad / R; g++)
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < R; r++) {
                int n = g * R + r;
                w->sw[((size_t)g * nb + b) * R + r] = n < N ? sw_plain[(size_t)n * nb + b] : 0;
            }
    return COMET_OK;
}

/* The codes of row group g: 8 rows of K/2 bytes, one after the other. */
static inline const uint8_t *group_codes(const comet_w4ax_cpu *w, int g) {
    return g < w->N / COMET_W4AX_CPU_ROWS
               ? w->qw + (size_t)g * COMET_W4AX_CPU_ROWS * (w->K / 2)
               : w->tail;
}

void comet_w4ax_cpu_free(comet_w4ax_cpu *w) {
    if (!w)
        return;
    free(w->tail);
    free(w->sw);
    w->qw = NULL;
    w->tail = NULL;
    w->sw = NULL;
}

size_t comet_w4ax_cpu_bytes(const comet_w4ax_cpu *w) {
    return (size_t)w->N * (w->K / 2) + (size_t)w->n_pad * (w->K / w->B) * sizeof *w->sw;
}

/* The scalar kernel: the vector kernels' arithmetic, one row and one code at a time. qa here
 * is the split copy (w4ax_split): per 64 channels, the 32 even ones, then the 32 odd ones. */
static void w4ax_rows_scalar(const comet_w4ax_cpu *w, int g, int t0, int t1, const int8_t *qa,
                             const float *sa, const int32_t *asum8, float *y, int32_t *bsum) {
    const int R = COMET_W4AX_CPU_ROWS, K = w->K, B = w->B, nb = K / B, half = B / 2;
    const int n0 = g * R, n_rows = w->N - n0 < R ? w->N - n0 : R;
    const uint8_t *wg = group_codes(w, g);
    for (int t = t0; t < t1; t++) {
        const int8_t *a = qa + (size_t)t * K;
        for (int r = 0; r < n_rows; r++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                size_t blk = ((size_t)g * nb + b) * R + r;
                const uint8_t *wb = wg + (size_t)r * (K / 2) + (size_t)b * half;
                int32_t s = 0;
                for (int c = 0; c < B / 64; c++)
                    for (int j = 0; j < 32; j++) {
                        const int8_t *ac = a + b * B + 64 * c;
                        const int u = wb[32 * c + j] ^ 0x88; /* code + 8 in each nibble */
                        s += (u & 15) * ac[j] + (u >> 4) * ac[j + 32];
                    }
                s -= asum8[(size_t)t * nb + b];
                if (bsum)
                    bsum[((size_t)t * w->N + n0 + r) * nb + b] = s;
                float scale = sa[(size_t)t * nb + b] * comet_quant_f16_value(w->sw[blk]);
                acc = fmaf((float)s, scale, acc);
            }
            y[(size_t)t * w->N + n0 + r] = acc;
        }
    }
}

#ifdef W4AX_X86
#define W4AX_TARGET __attribute__((target("avx2,fma,f16c")))
#define W4AX_FN w4ax_rows_avx2
/* u8 x s8 pairs into int16 (|.| <= 2 * 15 * 128, no saturation; B/64 <= 2 chunks of two
 * such terms stay below 2^15), widened to int32 pairs by vpmaddwd at the block's end. */
#define W4AX_DOT(acc, lo, hi, a0, a1)                                                          \
    acc = _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(lo, a0),                 \
                                                 _mm256_maddubs_epi16(hi, a1)))
#define W4AX_FINISH(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
#include "backend/cpu/w4ax_cpu_kernel.inc"
#undef W4AX_FN
#undef W4AX_DOT
#undef W4AX_FINISH
#undef W4AX_TARGET

#define W4AX_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define W4AX_FN w4ax_rows_avxvnni
#define W4AX_DOT(acc, lo, hi, a0, a1)                                                          \
    acc = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, a0), hi, a1)
#define W4AX_FINISH(acc) (acc)
#include "backend/cpu/w4ax_cpu_kernel.inc"
#undef W4AX_FN
#undef W4AX_DOT
#undef W4AX_FINISH
#undef W4AX_TARGET

#define W4AX_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define W4AX_FN w4ax_rows_avx512vnni
#define W4AX_DOT(acc, lo, hi, a0, a1)                                                          \
    acc = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, lo, a0), hi, a1)
#define W4AX_FINISH(acc) (acc)
#include "backend/cpu/w4ax_cpu_kernel.inc"
#undef W4AX_FN
#undef W4AX_DOT
#undef W4AX_FINISH
#undef W4AX_TARGET
#endif

typedef void (*w4ax_rows_fn)(const comet_w4ax_cpu *w, int g, int t0, int t1, const int8_t *qa,
                             const float *sa, const int32_t *asum8, float *y, int32_t *bsum);

typedef struct {
    w4ax_rows_fn rows;
    const comet_w4ax_cpu *const *ws;
    float *const *ys;
    int32_t *bsum;
    const int8_t *qa;
    const float *sa;
    const int32_t *asum8;
    int M, n_tiles;
    int item_groups; /* row groups per work item */
    int item0[8]; /* first item of each weight; item0[n_w] = total */
    int n_w;
} w4ax_job;

static void w4ax_task(void *ctx, int item, int tid) {
    (void)tid;
    const w4ax_job *j = ctx;
    int i = 0;
    while (item >= j->item0[i + 1])
        i++;
    const comet_w4ax_cpu *w = j->ws[i];
    int local = item - j->item0[i];
    int tile = local % j->n_tiles, chunk = local / j->n_tiles;
    int t0 = tile * W4AX_TT, t1 = j->M - t0 < W4AX_TT ? j->M : t0 + W4AX_TT;
    int n_groups = w->n_pad / COMET_W4AX_CPU_ROWS;
    int g0 = chunk * j->item_groups;
    int g1 = g0 + j->item_groups < n_groups ? g0 + j->item_groups : n_groups;
    for (int g = g0; g < g1; g++)
        j->rows(w, g, t0, t1, j->qa, j->sa, j->asum8, j->ys[i], j->bsum);
}

/* The checks of comet_w4ax_cpu_gemm, once per call before any work: the call's shape
 * (n_w, ws, ys, bsum), then per weight comet_w4ax_check_gemm (the words the CUDA backend
 * uses) and the same K and B as weight 0, then every code of the INT4 blocks n8..K/B-1 of
 * qa in [-8, 7], as the oracle requires. */
static comet_status check_gemm(int n_w, const comet_w4ax_cpu *const *ws, int M, int n8,
                               const int8_t *qa, const float *sa, float *const *ys,
                               const int32_t *bsum) {
    static const char who[] = "comet_w4ax_cpu_gemm";
    if (n_w < 1 || n_w > 7 || !ws || !ys || (bsum && n_w != 1))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: n_w = %d weights (ws=%p ys=%p bsum=%p); need 1 to 7 weights, "
                               "non-NULL ws and ys, and a single weight when bsum is given",
                               who, n_w, (const void *)ws, (const void *)ys, (const void *)bsum);
    for (int i = 0; i < n_w; i++) {
        const comet_w4ax_cpu *w = ws[i];
        if (w && !w->qw)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "%s: weight %d is empty (not packed, or freed)", who, i);
        COMET_TRY(comet_w4ax_check_gemm(who, w, w ? w->K : 0, w ? w->B : 0, M, n8, qa, sa, ys[i]));
        if (w->K != ws[0]->K || w->B != ws[0]->B)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "%s: weight %d has K = %d, B = %d but weight 0 has K = %d, "
                                   "B = %d; the weights of one call share the activation",
                                   who, i, w->K, w->B, ws[0]->K, ws[0]->B);
    }
    const int K = ws[0]->K, B = ws[0]->B;
    for (int t = 0; t < M; t++) {
        const int8_t *row = qa + (size_t)t * K;
        int bad = 0;
        for (int k = n8 * B; k < K; k++) /* no early exit: the loop vectorizes */
            bad |= row[k] < -8 || row[k] > 7;
        if (bad)
            for (int k = n8 * B; k < K; k++)
                if (row[k] < -8 || row[k] > 7)
                    return comet_set_error(COMET_ERR_INVALID_ARG,
                                           "%s: qa[%d, %d] = %d lies in INT4 block %d (n8 = %d) "
                                           "but is outside [-8, 7]",
                                           who, t, k, row[k], k / B, n8);
    }
    return COMET_OK;
}

comet_status comet_w4ax_cpu_gemm(comet_threadpool *tp, comet_w4ax_isa isa, int n_w,
                                 const comet_w4ax_cpu *const *ws, int M, int n8, const int8_t *qa,
                                 const float *sa, float *const *ys, int32_t *bsum) {
    COMET_TRY(check_gemm(n_w, ws, M, n8, qa, sa, ys, bsum));
    const int K = ws[0]->K, B = ws[0]->B, nb = K / B;
    if (isa == COMET_W4AX_ISA_AUTO)
        isa = comet_w4ax_cpu_isa_best();
    if (!comet_w4ax_cpu_isa_supported(isa))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "comet_w4ax_cpu_gemm: instruction set '%s' is not available on this "
                               "CPU or build",
                               comet_w4ax_cpu_isa_name(isa) ? comet_w4ax_cpu_isa_name(isa) : "?");
    w4ax_job j = {.ws = ws, .ys = ys, .bsum = bsum, .qa = qa, .sa = sa, .M = M, .n_w = n_w};
    switch (isa) {
#ifdef W4AX_X86
    case COMET_W4AX_ISA_AVX2: j.rows = w4ax_rows_avx2; break;
    case COMET_W4AX_ISA_AVXVNNI: j.rows = w4ax_rows_avxvnni; break;
    case COMET_W4AX_ISA_AVX512VNNI: j.rows = w4ax_rows_avx512vnni; break;
#endif
    default: j.rows = w4ax_rows_scalar; break;
    }
    int32_t *asum8 = malloc((size_t)M * nb * sizeof *asum8);
    int8_t *split = malloc((size_t)M * K);
    if (!asum8 || !split) {
        free(asum8);
        free(split);
        return comet_set_error(COMET_ERR_NOMEM, "comet_w4ax_cpu_gemm: out of memory for %d tokens",
                               M);
    }
    for (int t = 0; t < M; t++)
        for (int b = 0; b < nb; b++) {
            const int8_t *a = qa + (size_t)t * K + (size_t)b * B;
            int8_t *d = split + (size_t)t * K + (size_t)b * B;
            int32_t s = 0;
            for (int k = 0; k < B; k++)
                s += a[k];
            asum8[(size_t)t * nb + b] = 8 * s;
            for (int c = 0; c < B; c += 64)
                for (int i = 0; i < 32; i++) {
                    d[c + i] = a[c + 2 * i];
                    d[c + 32 + i] = a[c + 2 * i + 1];
                }
        }
    j.asum8 = asum8;
    j.qa = split;
    j.n_tiles = (M + W4AX_TT - 1) / W4AX_TT;
    /* One tile of tokens (decode): items of n_groups / (2 n_threads) groups, at least
     * W4AX_GROUPS, so that each thread streams long runs of consecutive rows. */
    j.item_groups = W4AX_GROUPS;
    if (j.n_tiles == 1 && tp) {
        int most = 0;
        for (int i = 0; i < n_w; i++)
            most = ws[i]->n_pad > most ? ws[i]->n_pad : most;
        const int want = most / COMET_W4AX_CPU_ROWS / (2 * comet_threadpool_size(tp));
        j.item_groups = want > W4AX_GROUPS ? want : W4AX_GROUPS;
    }
    int per_group = COMET_W4AX_CPU_ROWS * j.item_groups;
    j.item0[0] = 0;
    for (int i = 0; i < n_w; i++)
        j.item0[i + 1] = j.item0[i] + (ws[i]->n_pad + per_group - 1) / per_group * j.n_tiles;
    comet_parallel_for(tp, j.item0[n_w], w4ax_task, &j);
    free(asum8);
    free(split);
    return COMET_OK;
}

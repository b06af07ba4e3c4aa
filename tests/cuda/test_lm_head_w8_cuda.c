/* test_lm_head_w8_cuda.c — GPU test of the INT8-per-row lm_head (comet_cuda_lm_head_w8)
 * against a scalar CPU oracle (double sums of x * q, times s), on random inputs:
 *   - shapes: V in {1, 15, 16, 129, 1000, 49152}, C in {16, 48, 64, 576, 4096}, n in {1, 2, 7,
 *     8, 9, 16, 17, 63, 64, 65, 130, 300}, every value covered, the large combinations
 *     trimmed to keep the oracle within a few seconds (every kernel form and both C paths,
 *     C % 64 == 0 and not, are covered); in each, a row of zero codes, a row of extreme codes
 *     (+-127 and -128) and a zero scale;
 *   - the plain kernel: C not a multiple of 16, codes or activations not 16-byte aligned;
 *   - NaN: a NaN scale gives a NaN column of logits, a NaN in x a NaN row, everything else
 *     stays finite and right, on each kernel form;
 *   - guard words around the logits stay intact, and every logit is written (the output is
 *     poisoned with NaN first);
 *   - bad arguments give COMET_ERR_INVALID_ARG with a message naming them.
 * The parts run as cmocka tests (cm_bad_args, cm_shapes, cm_plain, cm_nan; COMET_TEST_FILTER
 * selects one), each a line per case, then "N of M checks failed".
 * Exit 77 (ctest: skipped) when no CUDA device is usable.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/lm_head_w8.h"
#include "numerics/quant.h"

#include "cuda_skip.h"
#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#include "cuda_test_util.h"

static int n_fail = 0, n_check = 0;

static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(rnd() & 0xFFFFFF) / 16777216.0f;
}

static const uint16_t F16_NAN = 0x7E00;

/* The largest |error| allowed for one logit, relative to |s[v]| * sum_k |x[r, k] q[v, k]|:
 * every product is exact in fp32, and a kernel accumulator takes at most C / 16 + 64 fp32
 * additions (C / 16 MMA k-steps, the MMA's internal sum of 16 products, the combination of
 * partial sums, the warp reduction of the plain kernel) plus the scale multiply, each
 * rounding by at most 2^-23 of a partial sum no larger than that bound (2^-23 rather than
 * 2^-24: tensor cores may truncate inside an MMA). 3.8e-5 at C = 4096, 8.6e-6 at C = 16; a
 * fragment-layout or indexing error is off by O(1) of the bound. */
static double tol_rel(int C) { return (C / 16 + 64) * ldexp(1.0, -23); }

/* One test case's inputs (host) and the oracle's comparison with the kernel's logits. */
typedef struct {
    int V, C, n;
    int8_t *q;   /* [V, C] */
    uint16_t *s; /* [V] */
    uint16_t *x; /* [n, C] */
    double *xd;  /* [n, C] x as double */
    float *got;  /* [n, V] the kernel's logits */
} lcase;

typedef struct {
    const lcase *c;
    int v0, v1;
    long bad, nan_bad;
    double worst; /* largest |error| / bound */
    char first[256];
} lm_ref_job;

/* Logits of rows [v0, v1) against the oracle: expected NaN and infinities exactly, finite
 * values within tol_rel(C) * |s| * sum |x q| (0 when that is 0: a zero row or scale). */
static void *lm_ref_worker(void *arg) {
    lm_ref_job *j = arg;
    const lcase *c = j->c;
    const double tol = tol_rel(c->C);
    for (int v = j->v0; v < j->v1; v++) {
        const int8_t *qv = c->q + (size_t)v * c->C;
        const double sv = comet_quant_f16_value(c->s[v]);
        for (int r = 0; r < c->n; r++) {
            const double *xr = c->xd + (size_t)r * c->C;
            double sum = 0.0, abs_sum = 0.0;
            for (int k = 0; k < c->C; k++) {
                const double p = xr[k] * (double)qv[k];
                sum += p;
                abs_sum += fabs(p);
            }
            const double want = sv * sum, bound = tol * fabs(sv) * abs_sum;
            const float got = c->got[(size_t)r * c->V + v];
            int ok;
            if (isnan(want))
                ok = isnan(got);
            else if (isinf(want))
                ok = (double)got == want;
            else
                ok = isfinite(got) && fabs((double)got - want) <= bound;
            if (isfinite(want) && isfinite(got) && bound > 0 &&
                fabs((double)got - want) / bound > j->worst)
                j->worst = fabs((double)got - want) / bound;
            if (!ok) {
                if (!j->bad)
                    snprintf(j->first, sizeof j->first,
                             "r %d v %d: got %.9g want %.9g (bound %.3g)", r, v, (double)got, want,
                             bound);
                j->bad++;
            }
        }
    }
    return NULL;
}

/* The oracle on 8 threads over vocabulary rows; returns the wrong logits, prints the first. */
static long compare(const lcase *c, double *worst) {
    enum {
        NT = 8
    };
    pthread_t th[NT];
    lm_ref_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (lm_ref_job){
            .c = c, .v0 = (int)((long)c->V * i / NT), .v1 = (int)((long)c->V * (i + 1) / NT)};
        if (pthread_create(&th[i], NULL, lm_ref_worker, &jobs[i])) {
            fprintf(stderr, "pthread_create failed\n");
            exit(2);
        }
    }
    long bad = 0;
    *worst = 0.0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].bad && !bad)
            fprintf(stderr, "    first wrong logit: %s\n", jobs[i].first);
        bad += jobs[i].bad;
        if (jobs[i].worst > *worst)
            *worst = jobs[i].worst;
    }
    return bad;
}

enum {
    NAN_NONE = 0,
    NAN_SCALE_AND_X = 1 /* s[V - 1] NaN, x[n / 2, C - 1] NaN */
};

/* One case: random codes, scales and activations of the shape (with a zero row, an extreme
 * row and a zero scale when V allows), uploaded at q_off bytes and x_off fp16 past 256-byte
 * aligned addresses, the kernel, the guards, the oracle. */
static void run_case(int V, int C, int n, int q_off, int x_off, int nan_mode) {
    lcase c = {.V = V, .C = C, .n = n};
    c.q = malloc((size_t)V * C);
    c.s = malloc((size_t)V * sizeof *c.s);
    c.x = malloc((size_t)n * C * sizeof *c.x);
    c.xd = malloc((size_t)n * C * sizeof *c.xd);
    c.got = malloc((size_t)n * V * sizeof *c.got);
    if (!c.q || !c.s || !c.x || !c.xd || !c.got) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < (size_t)V * C; i++)
        c.q[i] = (int8_t)((int)(rnd() % 255) - 127);
    for (int v = 0; v < V; v++) /* |s| in [2^-10, 2^-5), either sign */
        c.s[v] =
            comet_quant_f16_bits(((rnd() & 1) ? -1.0f : 1.0f) * uniform(1.0f / 1024, 1.0f / 32));
    for (size_t i = 0; i < (size_t)n * C; i++)
        c.x[i] = comet_quant_f16_bits(uniform(-2.0f, 2.0f));
    if (V >= 3) {
        memset(c.q, 0, (size_t)C);  /* row 0: all codes zero */
        for (int k = 0; k < C; k++) /* row 1: extreme codes */
            c.q[(size_t)C + k] = (int8_t)(k % 7 == 6 ? -128 : (rnd() & 1) ? 127 : -127);
        c.s[V / 2] = 0; /* a zero scale */
    }
    if (nan_mode == NAN_SCALE_AND_X) {
        c.s[V - 1] = F16_NAN;
        c.x[(size_t)(n / 2) * C + (C - 1)] = F16_NAN;
    }
    for (size_t i = 0; i < (size_t)n * C; i++)
        c.xd[i] = comet_quant_f16_value(c.x[i]);

    int8_t *dq;
    uint16_t *ds, *dx;
    const size_t ybytes = (size_t)n * V * sizeof(float);
    CUDA_OK(cudaMalloc((void **)&dq, (size_t)V * C + (size_t)q_off));
    CUDA_OK(cudaMalloc((void **)&ds, (size_t)V * sizeof *ds));
    CUDA_OK(cudaMalloc((void **)&dx, ((size_t)n * C + (size_t)x_off) * sizeof *dx));
    uint32_t *draw = guarded_raw_alloc((size_t)n * V); /* guard words around the logits */
    CUDA_OK(cudaMemcpy(dq + q_off, c.q, (size_t)V * C, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ds, c.s, (size_t)V * sizeof *ds, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dx + x_off, c.x, (size_t)n * C * sizeof *dx, cudaMemcpyHostToDevice));
    float *dy = (float *)(draw + GUARD);
    CUDA_OK(cudaMemset(dy, 0xFF, ybytes)); /* NaN: an unwritten logit fails the comparison */

    const char *form = comet_cuda_lm_head_w8_form(dq + q_off, C, dx + x_off, n);
    comet_status st = comet_cuda_lm_head_w8(dq + q_off, ds, V, C, dx + x_off, n, dy, NULL);
    int fail = 0;
    n_check++;
    if (st != COMET_OK) {
        fprintf(stderr, "    status %s: %s\n", comet_status_name(st), comet_last_error());
        fail = 1;
    } else {
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(c.got, dy, ybytes, cudaMemcpyDeviceToHost));
        if (!guards_intact(draw, (size_t)n * V)) {
            fprintf(stderr, "    guard words around the logits overwritten\n");
            fail = 1;
        }
        double worst;
        const long bad = compare(&c, &worst);
        if (bad) {
            fprintf(stderr, "    %ld of %ld logits wrong\n", bad, (long)n * V);
            fail = 1;
        }
        /* the NaN case: the oracle wants NaN in column V - 1 and row n / 2 and the right
         * values elsewhere, so a NaN that leaks or vanishes fails */
        printf("%s V %6d C %5d n %4d q+%d x+%d%s  [%s]  worst error %.3f of the bound\n",
               fail ? "FAIL" : "ok  ", V, C, n, q_off, x_off, nan_mode ? " NaN" : "", form, worst);
    }
    if (st != COMET_OK)
        printf("FAIL V %6d C %5d n %4d q+%d x+%d [%s]\n", V, C, n, q_off, x_off, form);
    n_fail += fail;
    fflush(stdout);
    cudaFree(dq), cudaFree(ds), cudaFree(dx), cudaFree(draw);
    free(c.q), free(c.s), free(c.x), free(c.xd), free(c.got);
}

static void test_bad_args(void) {
    static int8_t q[16];
    static uint16_t s[1], x[16];
    static float y[1];
    const struct {
        int V, C, n;
        const char *needle;
    } shapes[] = {
        {0, 16, 1, "V = 0"}, {1, 0, 1, "C = 0"}, {1, 16, 0, "n = 0"}, {-3, 16, 1, "V = -3"}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        n_check++;
        comet_clear_error();
        comet_status st =
            comet_cuda_lm_head_w8(q, s, shapes[i].V, shapes[i].C, x, shapes[i].n, y, NULL);
        const int ok = st == COMET_ERR_INVALID_ARG && strstr(comet_last_error(), shapes[i].needle);
        printf("%s bad shape V %d C %d n %d: %s\n", ok ? "ok  " : "FAIL", shapes[i].V, shapes[i].C,
               shapes[i].n, comet_last_error());
        n_fail += !ok;
    }
    const char *names[4] = {"codes q", "scales s", "activations x", "logits"};
    for (int i = 0; i < 4; i++) {
        n_check++;
        comet_clear_error();
        comet_status st = comet_cuda_lm_head_w8(i == 0 ? NULL : q, i == 1 ? NULL : s, 1, 16,
                                                i == 2 ? NULL : x, 1, i == 3 ? NULL : y, NULL);
        const int ok = st == COMET_ERR_INVALID_ARG && strstr(comet_last_error(), names[i]);
        printf("%s NULL %s: %s\n", ok ? "ok  " : "FAIL", names[i], comet_last_error());
        n_fail += !ok;
    }
}

/* The shape grid: every listed V, C and n; the oracle's cost (V C n multiply-adds) kept to
 * about 2 G in all by covering the large values in fewer combinations. */
static void test_shapes(void) {
    static const int Vs[] = {1, 15, 16, 129, 1000};
    static const int Cs[] = {16, 48, 64, 576};
    static const int ns[] = {1, 2, 7, 8, 9, 16, 17, 63, 64, 65, 130, 300};
    for (size_t a = 0; a < sizeof Vs / sizeof Vs[0]; a++)
        for (size_t b = 0; b < sizeof Cs / sizeof Cs[0]; b++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
                run_case(Vs[a], Cs[b], ns[i], 0, 0, NAN_NONE);
    /* C = 4096: each form, partial n-tiles and token groups */
    static const int n4096[][2] = {{1000, 1},  {1000, 9},  {129, 2},   {129, 17},
                                   {1000, 65}, {129, 130}, {129, 300}, {16, 63}};
    for (size_t i = 0; i < sizeof n4096 / sizeof n4096[0]; i++)
        run_case(n4096[i][0], 4096, n4096[i][1], 0, 0, NAN_NONE);
    /* V = 49152 (many CTAs, the last row block full) */
    run_case(49152, 64, 1, 0, 0, NAN_NONE);
    run_case(49152, 64, 64, 0, 0, NAN_NONE);
    run_case(49152, 48, 65, 0, 0, NAN_NONE);
    run_case(49152, 576, 8, 0, 0, NAN_NONE);
    run_case(49152, 4096, 1, 0, 0, NAN_NONE);
}

/* The plain kernel: C not a multiple of 16, or codes or activations off 16-byte alignment. */
static void test_plain(void) {
    run_case(129, 100, 9, 0, 0, NAN_NONE);
    run_case(1000, 1, 3, 0, 0, NAN_NONE);
    run_case(15, 37, 17, 0, 0, NAN_NONE);
    run_case(1000, 64, 17, 1, 0, NAN_NONE);
    run_case(129, 576, 3, 0, 1, NAN_NONE);
    run_case(1000, 4096, 65, 8, 4, NAN_NONE);
}

/* NaN in a scale and in x on every form (t8, t16, t32, t64, both C paths) and the plain one. */
static void test_nan(void) {
    static const int cases[][3] = {{129, 576, 1},    {129, 576, 16}, {1000, 64, 30},
                                   {1000, 4096, 65}, {129, 48, 130}, {16, 16, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(cases[i][0], cases[i][1], cases[i][2], 0, 0, NAN_SCALE_AND_X);
    run_case(129, 100, 9, 0, 0, NAN_SCALE_AND_X);
}

COUNTED_TEST(cm_bad_args, test_bad_args())
COUNTED_TEST(cm_shapes, test_shapes())
COUNTED_TEST(cm_plain, test_plain())
COUNTED_TEST(cm_nan, test_nan())

int main(void) {
    cuda_test_skip_if_no_device(); /* exit 77 (ctest: skipped) without a usable GPU */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cm_bad_args),
        cmocka_unit_test(cm_shapes),
        cmocka_unit_test(cm_plain),
        cmocka_unit_test(cm_nan),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d of %d checks failed\n", n_fail, n_check);
    return rc ? 1 : 0;
}

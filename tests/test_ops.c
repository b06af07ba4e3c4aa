/* test_ops.c — every fp32 primitive of the fast CPU backend (cpu_prims.h) against the
 * scalar reference's on random inputs with awkward shapes (T in 1, 3, 17, 100; C not a
 * multiple of 8; GQA 1 and 3; ragged batches; partly filled, shuffled pages), compared by
 * normalized error, with canaries around every output. The CPU W4Ax GEMM is tested in
 * test_w4ax_cpu.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_prims.h"
#include "numerics/quant.h"
#include "engine/kv_pages.h"
#include "cpu_test_util.h"

static const int Ts[] = {1, 3, 17, 100};
#define N_TS (int)(sizeof Ts / sizeof Ts[0])
#define TOL 1e-5

typedef struct {
    comet_backend *ref, *fast;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->ref = comet_backend_cpu_ref_init();
    f->fast = comet_backend_cpu_init(3); /* 3 threads: more than the 2 cores, on purpose */
    assert_non_null(f->ref);
    assert_non_null(f->fast);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    comet_backend_free(f->ref);
    comet_backend_free(f->fast);
    free(f);
    return 0;
}

static void test_embed(void **state) {
    fixture *f = *state;
    int C = 37, V = 50;
    float *embd = tu_rand_buf((size_t)V * C, 1.0f);
    for (int ti = 0; ti < N_TS; ti++) {
        int T = Ts[ti];
        int32_t tok[100];
        for (int t = 0; t < T; t++)
            tok[t] = tu_int(V);
        float *a = tu_guarded_alloc((size_t)T * C), *b = tu_guarded_alloc((size_t)T * C);
        assert_int_equal(comet_cpu_prims_of(f->ref)->embed(f->ref, embd, C, tok, T, a), COMET_OK);
        assert_int_equal(comet_cpu_prims_of(f->fast)->embed(f->fast, embd, C, tok, T, b), COMET_OK);
        assert_memory_equal(a, b, (size_t)T * C * sizeof(float));
        assert_memory_equal(a + (size_t)(T - 1) * C, embd + (size_t)tok[T - 1] * C,
                            C * sizeof(float));
        assert_true(tu_guard_ok(a, (size_t)T * C) && tu_guard_ok(b, (size_t)T * C));
        tu_guarded_free(a);
        tu_guarded_free(b);
    }
    free(embd);
}

static void test_rmsnorm(void **state) {
    fixture *f = *state;
    const int Cs[] = {44, 577, 2051};
    for (int ci = 0; ci < 3; ci++)
        for (int ti = 0; ti < N_TS; ti++) {
            int T = Ts[ti], C = Cs[ci];
            size_t n = (size_t)T * C;
            float *x = tu_rand_buf(n, 3.0f), *w = tu_rand_buf(C, 1.0f);
            float *a = tu_guarded_alloc(n), *b = tu_guarded_alloc(n);
            comet_cpu_prims_of(f->ref)->rmsnorm(f->ref, x, w, T, C, 1e-5f, a);
            comet_cpu_prims_of(f->fast)->rmsnorm(f->fast, x, w, T, C, 1e-5f, b);
            assert_true(tu_nerr(b, a, n) < TOL);
            assert_true(tu_guard_ok(a, n) && tu_guard_ok(b, n));
            /* in place (x and out alias) */
            comet_cpu_prims_of(f->fast)->rmsnorm(f->fast, x, w, T, C, 1e-5f, x);
            assert_true(tu_nerr(x, a, n) < TOL);
            free(x);
            free(w);
            tu_guarded_free(a);
            tu_guarded_free(b);
        }
}

static void test_rmsnorm_known(void **state) {
    fixture *f = *state;
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, y[4];
    float inv = 1.0f / sqrtf((1 + 4 + 9 + 16) / 4.0f + 1e-6f);
    comet_backend *bes[2] = {f->ref, f->fast};
    for (int i = 0; i < 2; i++) {
        comet_cpu_prims_of(bes[i])->rmsnorm(bes[i], x, w, 1, 4, 1e-6f, y);
        assert_float_equal(y[0], 1 * inv, 1e-6);
        assert_float_equal(y[2], 3 * inv * 2, 1e-6);
        assert_float_equal(y[3], 4 * inv * 0.5f, 1e-6);
    }
}

static void test_linear(void **state) {
    fixture *f = *state;
    const int Ns[] = {1, 37, 200, 1000}, Ks[] = {44, 577};
    for (int ni = 0; ni < 4; ni++)
        for (int ki = 0; ki < 2; ki++)
            for (int ti = 0; ti < N_TS; ti++) {
                int T = Ts[ti], N = Ns[ni], K = Ks[ki];
                comet_linear lin = tu_linear(N, K);
                float *x = tu_rand_buf((size_t)T * K, 1.0f);
                float *a = tu_guarded_alloc((size_t)T * N), *b = tu_guarded_alloc((size_t)T * N);
                comet_cpu_prims_of(f->ref)->linear(f->ref, &lin, x, T, a);
                comet_cpu_prims_of(f->fast)->linear(f->fast, &lin, x, T, b);
                assert_true(tu_nerr(b, a, (size_t)T * N) < TOL);
                assert_true(tu_guard_ok(a, (size_t)T * N) && tu_guard_ok(b, (size_t)T * N));
                /* one element by hand */
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += (double)x[(size_t)(T - 1) * K + k] * lin.w[(size_t)(N - 1) * K + k];
                assert_float_equal(a[(size_t)T * N - 1], acc, 1e-5 * (1 + fabs(acc)));
                free(lin.w);
                free(x);
                tu_guarded_free(a);
                tu_guarded_free(b);
            }
}

static void test_rope(void **state) {
    fixture *f = *state;
    const int Ds[] = {8, 64, 128};
    const int Hs[][2] = {{4, 4}, {6, 2}};
    for (int sc = 0; sc < COMET_ROPE_SCALING_COUNT; sc++)
        for (int di = 0; di < 3; di++)
            for (int hi = 0; hi < 2; hi++)
                for (int ti = 0; ti < N_TS; ti++) {
                    int T = Ts[ti], D = Ds[di], H = Hs[hi][0], Hkv = Hs[hi][1];
                    comet_rope_params rp = {D,    500000.0f, (comet_rope_scaling)sc, 8.0f, 1.0f,
                                            4.0f, 8192};
                    if (sc == COMET_ROPE_SCALING_LINEAR)
                        rp.factor = 2.0f;
                    int32_t pos[100];
                    for (int t = 0; t < T; t++)
                        pos[t] = tu_int(20000);
                    size_t nq = (size_t)T * H * D, nk = (size_t)T * Hkv * D;
                    float *q0 = tu_rand_buf(nq, 1.0f), *k0 = tu_rand_buf(nk, 1.0f);
                    float *qa = tu_guarded_alloc(nq), *qb = tu_guarded_alloc(nq);
                    float *ka = tu_guarded_alloc(nk), *kb = tu_guarded_alloc(nk);
                    memcpy(qa, q0, nq * 4);
                    memcpy(qb, q0, nq * 4);
                    memcpy(ka, k0, nk * 4);
                    memcpy(kb, k0, nk * 4);
                    comet_cpu_prims_of(f->ref)->rope(f->ref, &rp, pos, T, qa, H, ka, Hkv);
                    comet_cpu_prims_of(f->fast)->rope(f->fast, &rp, pos, T, qb, H, kb, Hkv);
                    assert_true(tu_nerr(qb, qa, nq) < TOL && tu_nerr(kb, ka, nk) < TOL);
                    assert_true(tu_guard_ok(qa, nq) && tu_guard_ok(qb, nq));
                    assert_true(tu_guard_ok(ka, nk) && tu_guard_ok(kb, nk));
                    /* rotation keeps each pair's norm; channel 0 pairs with D/2 */
                    double n0 = (double)q0[0] * q0[0] + (double)q0[D / 2] * q0[D / 2];
                    double n1 = (double)qa[0] * qa[0] + (double)qa[D / 2] * qa[D / 2];
                    assert_float_equal(n0, n1, 1e-5);
                    free(q0);
                    free(k0);
                    tu_guarded_free(qa);
                    tu_guarded_free(qb);
                    tu_guarded_free(ka);
                    tu_guarded_free(kb);
                }
}

/* Position 0 is the identity; position p with theta=1e4 rotates pair 0 by p radians. */
static void test_rope_known(void **state) {
    fixture *f = *state;
    comet_rope_params rp = {4, 10000.0f, COMET_ROPE_SCALING_NONE, 1, 1, 1, 0};
    comet_backend *bes[2] = {f->ref, f->fast};
    for (int i = 0; i < 2; i++) {
        float q[8] = {1, 0, 0, 0, 1, 0, 0, 0}, k[4] = {0, 1, 0, 0};
        int32_t pos[2] = {0, 3};
        comet_cpu_prims_of(bes[i])->rope(bes[i], &rp, pos + 1, 1, q, 1, k, 1); /* position 3 */
        assert_float_equal(q[0], cos(3.0), 1e-6);
        assert_float_equal(q[2], sin(3.0), 1e-6);
        /* pair 1: freq 10000^(-2/4) = 0.01 */
        assert_float_equal(k[1], cos(0.03), 1e-6);
        assert_float_equal(k[3], sin(0.03), 1e-6);
        comet_cpu_prims_of(bes[i])->rope(bes[i], &rp, pos, 1, q + 4, 1, k, 1); /* position 0 */
        assert_float_equal(q[4], 1.0, 0);
        assert_float_equal(q[6], 0.0, 0);
    }
}

/* RoPE scaling against HF transformers' inverse frequencies (ROPE_INIT_FUNCTIONS
 * "llama3" for Llama-3.1's D=128, theta 5e5, factor 8, low 1, high 4, original 8192;
 * "linear" with factor 4 for D=64, theta 1e4): at position 1 pair i turns by inv_freq[i]. */
static void test_rope_scaling_known(void **state) {
    fixture *f = *state;
    static const int idx3[] = {0, 10, 20, 30, 40, 45, 50, 63};
    static const double hf3[] = {1.0,
                                 0.12868738174438477,
                                 0.016560440883040428,
                                 0.0013718936825171113,
                                 3.428102354519069e-05,
                                 1.2297638932068367e-05,
                                 4.411534519022098e-06,
                                 3.068925877869333e-07};
    static const int idx_lin[] = {0, 5, 31};
    static const double hf_lin[] = {0.25, 0.05928434059023857, 3.333803761051968e-05};
    comet_rope_params l3 = {128, 500000.0f, COMET_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    comet_rope_params lin = {64, 10000.0f, COMET_ROPE_SCALING_LINEAR, 4.0f, 1.0f, 1.0f, 0};
    comet_backend *bes[2] = {f->ref, f->fast};
    for (int bi = 0; bi < 2; bi++)
        for (int c = 0; c < 2; c++) {
            const comet_rope_params *rp = c ? &lin : &l3;
            int D = rp->head_dim, n = c ? 3 : 8;
            const int *idx = c ? idx_lin : idx3;
            const double *want = c ? hf_lin : hf3;
            float q[128] = {0}, k[128] = {0};
            for (int i = 0; i < D / 2; i++)
                q[i] = k[i] = 1.0f;
            int32_t pos = 1;
            comet_cpu_prims_of(bes[bi])->rope(bes[bi], rp, &pos, 1, q, 1, k, 1);
            for (int j = 0; j < n; j++) {
                int i = idx[j];
                double angle = atan2(q[i + D / 2], q[i]);
                assert_float_equal(angle, want[j], 1e-6 * want[j]);
            }
        }
}

static void test_silu_residual(void **state) {
    fixture *f = *state;
    for (int ti = 0; ti < N_TS; ti++) {
        int T = Ts[ti], F = 1543;
        size_t n = (size_t)T * F;
        float *g = tu_rand_buf(n, 6.0f), *u = tu_rand_buf(n, 2.0f);
        float *a = tu_guarded_alloc(n), *b = tu_guarded_alloc(n);
        comet_cpu_prims_of(f->ref)->silu_mul(f->ref, g, u, T, F, a);
        comet_cpu_prims_of(f->fast)->silu_mul(f->fast, g, u, T, F, b);
        assert_true(tu_nerr(b, a, n) < TOL);
        assert_float_equal(a[0], g[0] / (1 + exp(-g[0])) * u[0], 1e-5);
        assert_true(tu_guard_ok(a, n) && tu_guard_ok(b, n));
        comet_cpu_prims_of(f->fast)->silu_mul(f->fast, g, u, T, F, g); /* out aliases gate */
        assert_true(tu_nerr(g, a, n) < TOL);

        memcpy(b, a, n * 4);
        comet_cpu_prims_of(f->ref)->residual_add(f->ref, a, u, T, F);
        comet_cpu_prims_of(f->fast)->residual_add(f->fast, b, u, T, F);
        assert_memory_equal(a, b, n * 4);
        assert_true(tu_guard_ok(a, n) && tu_guard_ok(b, n));
        free(g);
        free(u);
        tu_guarded_free(a);
        tu_guarded_free(b);
    }
}

/* The INT8 lm_head: the threaded backend against the scalar reference, over rows in and out
 * of order, and one logit the same whether computed for one row or with others (the fast
 * path converts a code row once for many logit rows). */
static void test_logits_q8(void **state) {
    fixture *f = *state;
    int C = 577, V = 1031, T = 17;
    float *x = tu_rand_buf((size_t)T * C, 1.0f), *lm = tu_rand_buf((size_t)V * C, 0.1f);
    int8_t *q = malloc((size_t)V * C);
    uint16_t *s = malloc((size_t)V * sizeof *s);
    for (int v = 0; v < V; v++)
        s[v] = comet_quant_lm_head_row(lm + (size_t)v * C, C, q + (size_t)v * C);
    const int32_t rows_sets[][6] = {{16, -1}, {0, 1, 2, 3, -1}, {3, 9, 10, 16, 2, -1}};
    float *one = malloc((size_t)V * sizeof *one);
    for (int rs = 0; rs < 3; rs++) {
        int n = 0;
        while (rows_sets[rs][n] >= 0)
            n++;
        size_t nl = (size_t)n * V;
        float *a = tu_guarded_alloc(nl), *b = tu_guarded_alloc(nl);
        comet_cpu_prims_of(f->ref)->logits_q8(f->ref, x, rows_sets[rs], n, q, s, C, V, a);
        comet_cpu_prims_of(f->fast)->logits_q8(f->fast, x, rows_sets[rs], n, q, s, C, V, b);
        assert_true(tu_nerr(b, a, nl) < TOL);
        assert_true(tu_guard_ok(a, nl) && tu_guard_ok(b, nl));
        for (int r = 0; r < n; r++) {
            comet_cpu_prims_of(f->fast)->logits_q8(f->fast, x, &rows_sets[rs][r], 1, q, s, C, V,
                                                   one);
            assert_memory_equal(one, b + (size_t)r * V, (size_t)V * sizeof *one);
        }
        tu_guarded_free(a);
        tu_guarded_free(b);
    }
    free(one);
    free(q);
    free(s);
    free(x);
    free(lm);
}

static void test_logits(void **state) {
    fixture *f = *state;
    int C = 577, V = 1031, T = 17;
    float *x = tu_rand_buf((size_t)T * C, 1.0f), *lm = tu_rand_buf((size_t)V * C, 0.1f);
    const int32_t rows_sets[][6] = {{16, -1}, {0, 1, 2, 3, -1}, {3, 9, 10, 11, 2, -1}};
    for (int rs = 0; rs < 3; rs++) {
        int n = 0;
        while (rows_sets[rs][n] >= 0)
            n++;
        size_t nl = (size_t)n * V;
        float *a = tu_guarded_alloc(nl), *b = tu_guarded_alloc(nl);
        comet_cpu_prims_of(f->ref)->logits(f->ref, x, rows_sets[rs], n, lm, C, V, a);
        comet_cpu_prims_of(f->fast)->logits(f->fast, x, rows_sets[rs], n, lm, C, V, b);
        assert_true(tu_nerr(b, a, nl) < TOL);
        assert_true(tu_guard_ok(a, nl) && tu_guard_ok(b, nl));
        tu_guarded_free(a);
        tu_guarded_free(b);
    }
    free(x);
    free(lm);
}

/* A ragged batch over shuffled pages: each sequence has `old` cached tokens and `n_new`
 * tokens in this step. K/V of the old tokens are written through kv_append of the
 * reference, then both backends append the new ones and attend. */
static void run_attention_case(fixture *f, int H, int Hkv, int D, int P, int n_seqs, const int *old,
                               const int *n_new) {
    int n_layer = 2, layer = 1, n_pages = 64;
    comet_kv_cache kva, kvb;
    assert_int_equal(comet_kv_cache_init(&kva, n_layer, n_pages, P, Hkv, D), COMET_OK);
    assert_int_equal(comet_kv_cache_init(&kvb, n_layer, n_pages, P, Hkv, D), COMET_OK);
    size_t kv_n = (size_t)n_layer * n_pages * P * Hkv * D;
    tu_fill(kva.k, kv_n, 1.0f); /* garbage everywhere not written */
    tu_fill(kva.v, kv_n, 1.0f);
    memcpy(kvb.k, kva.k, kv_n * 4);
    memcpy(kvb.v, kva.v, kv_n * 4);

    /* shuffled page ids handed to sequences */
    int32_t perm[64];
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = tu_int(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t token_indptr[9] = {0}, page_indptr[9] = {0}, last[8], positions[512], page_idx[64];
    int32_t pos_all[512], ptr_all[9] = {0};
    int T = 0, np = 0, T_all = 0;
    for (int s = 0; s < n_seqs; s++) {
        int len = old[s] + n_new[s], pages = (len + P - 1) / P;
        for (int i = 0; i < pages; i++)
            page_idx[np + i] = perm[np + i];
        np += pages;
        page_indptr[s + 1] = np;
        last[s] = len - (pages - 1) * P;
        for (int i = 0; i < n_new[s]; i++)
            positions[T++] = old[s] + i;
        token_indptr[s + 1] = T;
        for (int i = 0; i < len; i++)
            pos_all[T_all++] = i;
        ptr_all[s + 1] = T_all;
    }
    assert_true(np <= n_pages);
    comet_batch b = {T,           n_seqs,   NULL, positions, token_indptr,
                     page_indptr, page_idx, last, 0,         NULL};
    comet_batch b_all = {T_all,       n_seqs,   NULL, pos_all, ptr_all,
                         page_indptr, page_idx, last, 0,       NULL};

    /* history: every position of every sequence through the reference append */
    size_t row = (size_t)Hkv * D;
    float *k_all = tu_rand_buf((size_t)T_all * row, 1.0f),
          *v_all = tu_rand_buf((size_t)T_all * row, 1.0f);
    comet_cpu_prims_of(f->ref)->kv_append(f->ref, &kva, layer, &b_all, k_all, v_all);
    comet_cpu_prims_of(f->ref)->kv_append(f->ref, &kvb, layer, &b_all, k_all, v_all);
    /* this step's new K/V over the tail positions, one append per backend */
    float *k = tu_rand_buf((size_t)T * row, 1.0f), *v = tu_rand_buf((size_t)T * row, 1.0f);
    comet_cpu_prims_of(f->ref)->kv_append(f->ref, &kva, layer, &b, k, v);
    comet_cpu_prims_of(f->fast)->kv_append(f->fast, &kvb, layer, &b, k, v);
    assert_memory_equal(kva.k, kvb.k, kv_n * 4);
    assert_memory_equal(kva.v, kvb.v, kv_n * 4);
    /* the appended row of the last token sits where the page table says */
    {
        int s = n_seqs - 1, p = positions[T - 1];
        size_t off = comet_kv_offset(&kva, layer, &b, s, p, 0);
        assert_memory_equal(kva.k + off, k + (size_t)(T - 1) * row, row * 4);
    }

    size_t nq = (size_t)T * H * D;
    float *q = tu_rand_buf(nq, 2.0f);
    float *oa = tu_guarded_alloc(nq), *ob = tu_guarded_alloc(nq);
    assert_int_equal(comet_cpu_prims_of(f->ref)->attention(f->ref, &kva, layer, &b, q, H, oa), COMET_OK);
    assert_int_equal(comet_cpu_prims_of(f->fast)->attention(f->fast, &kvb, layer, &b, q, H, ob), COMET_OK);
    double e = tu_nerr(ob, oa, nq);
    if (e >= TOL)
        fprintf(stderr, "attention H=%d Hkv=%d D=%d P=%d err %g\n", H, Hkv, D, P, e);
    assert_true(e < TOL);
    assert_true(tu_guard_ok(oa, nq) && tu_guard_ok(ob, nq));

    /* the first position of a sequence attends only to itself: output = its V row */
    for (int s = 0; s < n_seqs; s++)
        if (old[s] == 0) {
            int t = token_indptr[s];
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++)
                    assert_float_equal(oa[((size_t)t * H + h) * D + d],
                                       v[(size_t)t * row + (size_t)(h / (H / Hkv)) * D + d], 1e-6);
        }
    free(k_all);
    free(v_all);
    free(k);
    free(v);
    free(q);
    tu_guarded_free(oa);
    tu_guarded_free(ob);
    comet_kv_cache_free(&kva);
    comet_kv_cache_free(&kvb);
}

static void test_attention(void **state) {
    fixture *f = *state;
    const int heads[][2] = {{4, 4}, {6, 2}, {9, 3}};
    const int Ds[] = {8, 64};
    const int Ps[] = {16, 5};
    /* decode-only, prefill-only, mixed ragged */
    const int old1[] = {40}, new1[] = {1};
    const int old2[] = {0}, new2[] = {100};
    const int old3[] = {0, 33, 7, 0}, new3[] = {17, 1, 3, 1};
    /* prefill chunks continuing a cached prefix: several 32-token tiles, a partial one */
    const int old4[] = {20, 5}, new4[] = {45, 8};
    for (int hi = 0; hi < 3; hi++)
        for (int di = 0; di < 2; di++)
            for (int pi = 0; pi < 2; pi++) {
                int H = heads[hi][0], Hkv = heads[hi][1], D = Ds[di], P = Ps[pi];
                run_attention_case(f, H, Hkv, D, P, 1, old1, new1);
                if (P == 16)
                    run_attention_case(f, H, Hkv, D, P, 1, old2, new2);
                run_attention_case(f, H, Hkv, D, P, 4, old3, new3);
                run_attention_case(f, H, Hkv, D, P, 2, old4, new4);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rmsnorm_known),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_known),
        cmocka_unit_test(test_rope_scaling_known),
        cmocka_unit_test(test_silu_residual),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_logits_q8),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

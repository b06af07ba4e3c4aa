/* test_backend_ops.c — one op-test table for every backend, in the manner of ggml's
 * test-backend-ops: each row names a step op of the table (backend.h), a model variant
 * (fp32, FMPQ W4A4 B64, W4A8 B128, W16A16 permuted), a token count, a KV format (for the
 * attention rows) and a tolerance (a relative norm error ||y - ref|| / ||ref||, or 0:
 * bit-exact). Every row runs on every backend that opens and is selected, with the same
 * inputs, against the scalar reference (the cpu-ref backend, whose step ops are made of the
 * oracle primitives of ref_ops.c). On cpu-ref itself a row checks what needs no second
 * implementation: a second run gives the same bits.
 *
 * Rows (backend_ops_rows, support/backend_ops_table.c): embed_tokens; rmsnorm_quant (QKV,
 * GATE_UP, LM_HEAD, with and without a residual: x's sum bit-exact, the act within the row's
 * tolerance); act_quant (O); silu_mul_quant (DOWN); matmul of every role from each backend's
 * own act of the same input; matmul_group (where a backend has it: each output against the
 * reference's matmul, and within 1e-6 of the backend's own matmul of its role); rope_kv_append
 * + paged_attention over a ragged batch with cached prefixes in partly filled, shuffled pages
 * (four head shapes, LLaMA-3 RoPE scaling among them, kv_bits 4, 8, 16, rotation none and
 * hadamard; q after RoPE within 1e-5, the output within the row's tolerance); rope_kv_append +
 * paged_attention_quant (where a backend has it) at the models' heads, its attention output as
 * attention's and its act of O as rmsnorm_quant's; rope_attention_quant (where a backend has
 * it) the same, without q (unspecified after it); lm_head over logit rows out of order.
 * Acts are compared as fp32: a host backend's act is fp32 [T, K]; a device backend's is read
 * in the CUDA layout of model_ops.h (INT8 codes [T, K] at byte 0 and fp32 block scales at
 * roundup(T*K, 256) for a W4Ax group, else fp16 [T, K]). Every output is poisoned (NaN)
 * before the op and framed by guard bytes.
 *
 * Usage: test_backend_ops [--cuda] [--perf]
 *   default: the CPU backends (cpu-ref, cpu); --cuda: the CUDA backend, exit 77 (ctest:
 *   skipped) when it does not open, plus for the attention rows two more CUDA backends opened
 *   with COMET_CUDA_ATTN_MMA=3 (cuda-mma3: attn_mma3_kernel on every prefill chunk whose cache
 *   it reads, where the default plan keeps it for steps of more CTAs than SMs, larger than
 *   these rows) and =1 (cuda-mma1: attn_mma_kernel, which the default takes only for GQA
 *   groups over 8). ctest registers both runs (the second under the label cuda).
 *   COMET_TEST_BACKEND=name[,name]  only these backends
 *   COMET_TEST_FILTER=pattern       only rows whose name matches (cmocka's * and ?
 *                                   wildcards; names read "op/variant/detail/T<n>")
 *   --perf or COMET_TEST_PERF=1     also time each row's op per backend (microseconds per
 *                                   call, the median of 5 runs, queued work synced)
 * A new or changed step op needs a row here (docs/architecture.md). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_qstep.h"
#include "backend/kv_cache.h"
#include "comet/model.h"
#include "numerics/group.h"
#include "numerics/quant.h"

#include "step_test_util.h"
#include "support/backend_ops_table.h"

enum {
    PAGE = 16,
    N_LAYER = 2,
    MAX_BACKENDS = 3,
    MAX_OUT = 4 /* outputs of one op compared */
};

/* ---- backends and models ------------------------------------------------------------------ */

typedef struct bk {
    const char *name;
    comet_backend *be;
    int attn_only; /* runs the attention rows only (a CUDA backend with a forced prefill kernel) */
} bk;

static bk g_ref;               /* the scalar reference (cpu-ref) */
static bk g_bks[MAX_BACKENDS]; /* the backends under test */
static int g_n_bks;
static int g_perf;
static comet_model *g_models[N_VARIANTS];
static comet_weights *g_w[N_VARIANTS][MAX_BACKENDS + 1]; /* [v][bk index; MAX_BACKENDS: ref] */

static comet_model *model_of(int v) {
    if (!g_models[v]) {
        const variant *vr = &VARIANTS[v];
        comet_model *m = st_model(0x5EEDull + (uint64_t)vr->w_bits * 131 +
                                      (uint64_t)vr->a_bits * 7 + (uint64_t)vr->block,
                                  N_LAYER, 256, 512, 6, 2, 64, 320);
        if (vr->w_bits)
            st_quantize(m, vr->w_bits, vr->a_bits, vr->block);
        g_models[v] = m;
    }
    return g_models[v];
}

/* The weights of variant v on backend slot i (MAX_BACKENDS: the reference), loaded once. */
static comet_weights *weights_of(int v, int i) {
    comet_backend *be = i == MAX_BACKENDS ? g_ref.be : g_bks[i].be;
    if (!g_w[v][i])
        OP_OK(be, be->ops->weights_load(be, model_of(v), &g_w[v][i]), "weights_load");
    return g_w[v][i];
}


/* ---- one run of a row on one backend -------------------------------------------------------- */

/* The host copies of an op's outputs (fp32), each with its own bound (tol: the row's; or a
 * fixed one stated where the output is added). */
typedef struct outs {
    int n;
    float *y[MAX_OUT];
    size_t len[MAX_OUT];
    double tol[MAX_OUT];
    const char *what[MAX_OUT];
} outs;

static void outs_add(outs *o, float *y, size_t len, double tol, const char *what) {
    assert_true(o->n < MAX_OUT);
    o->y[o->n] = y, o->len[o->n] = len, o->tol[o->n] = tol, o->what[o->n] = what;
    o->n++;
}

static void outs_free(outs *o) {
    for (int i = 0; i < o->n; i++)
        free(o->y[i]);
    memset(o, 0, sizeof *o);
}

/* Download an act of group g (layer l) [T, K] as fp32 (see the file comment for the
 * layouts); fails on a NaN (an element the op left unwritten). */
/* Whether a backend's activation for group g holds codes and scales (the W4Ax layout) rather
 * than values: CUDA's W4Ax groups, and the fast CPU backend's when it runs a W4Ax model on
 * its integer path (cpu_qstep.h: not with simulate set, never cpu-ref). */
static int act_holds_codes(comet_backend *be, const comet_model *m, int l, comet_group g) {
    if (!st_group_w4ax(m, l, g))
        return 0;
    return !be->ops->host_memory ||
           (comet_cpu_backend_pool(be) && !be->simulate && comet_cpu_qmodel_eligible(m));
}

/* Download an act [T, K] as fp32 values (codes times scales where it holds codes), failing
 * on a NaN. */
static float *fetch_act(comet_backend *be, const comet_model *m, int l, comet_group g,
                        const sbuf *act, int T, int K, const char *what) {
    const size_t n = (size_t)T * K;
    float *out = st_malloc(n * 4);
    if (act_holds_codes(be, m, l, g)) {
        const int B = st_group_linear(m, l, g)->block, nb = K / B;
        const size_t off = be->ops->host_memory ? comet_cpu_qact_scale_offset(T, K)
                                                : st_act_scales_offset(T, K);
        int8_t *q = st_malloc(n);
        float *s = st_malloc((size_t)T * nb * 4);
        st_fetch_w4ax_act_at(act, T, K, B, off, q, s);
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                out[(size_t)t * K + k] = (float)q[(size_t)t * K + k] * s[(size_t)t * nb + k / B];
        free(q), free(s);
    } else if (be->ops->host_memory) {
        sb_download(act, out, n * 4);
    } else {
        st_fetch_f16_act(act, T, K, out);
    }
    long nan_at = st_first_nan(out, n);
    if (nan_at >= 0)
        fail_msg("%s backend: %s: act element %ld of %zu is NaN (unwritten?)", be->ops->name, what,
                 nan_at, n);
    return out;
}

/* Download y [n] fp32, failing on a NaN. */
static float *fetch_f32(const sbuf *y, size_t n, const char *what) {
    float *h = sb_fetch(y, n * 4);
    long nan_at = st_first_nan(h, n);
    if (nan_at >= 0)
        fail_msg("%s backend: %s: element %ld of %zu is NaN (unwritten?)", y->be->ops->name, what,
                 nan_at, n);
    SB_CHECK_GUARDS(y, what);
    return h;
}

/* st_batch_make at this table's page size, tok_seq the sequence's index. */
static st_batch hb_make(int n_seq, const int *start, const int *n, int32_t *const *pages, int V,
                      const int32_t *rows, int n_rows) {
    return st_batch_make(PAGE, n_seq, start, n, pages, NULL, V, rows, n_rows);
}

/* One sequence of T tokens from position 0 in pages 0, 1, ...; logits for rows. */
static st_batch hb_single(int T, int V, const int32_t *rows, int n_rows) {
    int32_t *pages = st_malloc((size_t)((T + PAGE - 1) / PAGE) * 4);
    for (int i = 0; i < (T + PAGE - 1) / PAGE; i++)
        pages[i] = i;
    const int start = 0;
    st_batch h = hb_make(1, &start, &T, &pages, V, rows, n_rows);
    free(pages);
    return h;
}

/* Produce group g's act of layer l on be from host x [T, K] (gate and up for DOWN: x holds
 * gate [T, F] then up [T, F]) by the group's own op; act has comet_act_bytes(T, K). */
static void make_act(comet_backend *be, const comet_weights *w, int l, comet_group g,
                     const float *x, int T, int K, sbuf *act) {
    *act = sb_alloc(be, comet_act_bytes(T, K));
    const size_t n = (size_t)T * K;
    if (g == COMET_GROUP_DOWN) {
        sbuf gb = sb_from(be, x, n * 4), ub = sb_from(be, x + n, n * 4);
        OP_OK(be, be->ops->silu_mul_quant(be, w, l, sb_f(&gb), sb_f(&ub), T, sb_ptr(act)),
              "silu_mul_quant");
        OP_OK(be, be->ops->sync(be), "sync");
        sb_free(&gb), sb_free(&ub);
        return;
    }
    sbuf xb = sb_from(be, x, n * 4);
    if (g == COMET_GROUP_O)
        OP_OK(be, be->ops->act_quant(be, w, l, g, sb_f(&xb), T, sb_ptr(act)), "act_quant");
    else
        OP_OK(be, be->ops->rmsnorm_quant(be, w, l, g, sb_f(&xb), NULL, T, sb_ptr(act)),
              "rmsnorm_quant");
    OP_OK(be, be->ops->sync(be), "sync");
    sb_free(&xb);
}

/* The inputs of a row: random numbers drawn once per row, the same for every backend. */
typedef struct inputs {
    float *x;   /* [T, K] (DOWN: gate then up, [2, T, F]) */
    float *res; /* [T, C] residual */
    st_batch hb;  /* embed_tokens, lm_head: one sequence */
    /* attention: q [T, H, D], k, v [T, Hkv, D] of the prefix step and of the tested one */
    float *q0, *k0, *v0, *q, *k, *v;
    st_batch hb0, hb1;
    int n_pages;
} inputs;

static int op_width(const row *r, const comet_model *m) {
    switch (r->op) {
    case OP_EMBED_TOKENS:
    case OP_LM_HEAD: return m->cfg.n_embd;
    case OP_RMSNORM_QUANT: return comet_group_width(m, (comet_group)r->group);
    case OP_ACT_QUANT: return comet_group_width(m, COMET_GROUP_O);
    case OP_SILU_MUL_QUANT: return m->cfg.n_ff;
    case OP_MATMUL: return comet_group_width(m, comet_role_group((comet_role)r->role));
    case OP_MATMUL_GROUP: return comet_group_width(m, (comet_group)r->group);
    default: return 0;
    }
}

static void fill_qkv(float *q, float *k, float *v, int T, const att_shape *a) {
    st_fill_act(q, T * a->H, a->D, 2.0f);
    st_fill_act(v, T * a->Hkv, a->D, 1.0f);
    for (int t = 0; t < T * a->Hkv; t++) /* k with a per-channel bias: outlier channels */
        for (int d = 0; d < a->D; d++)
            k[(size_t)t * a->D + d] = st_u() + 1.5f * st_ukey((uint64_t)(t % a->Hkv) * 977 + d);
}

static inputs inputs_make(const row *r) {
    inputs in;
    memset(&in, 0, sizeof in);
    /* the model first (its maker seeds the stream too): a row's inputs do not depend on
     * which rows ran before it */
    const comet_model *m = r->op == OP_ATTENTION ? NULL : model_of(r->variant);
    st_seed(0xB0B5ull * 1000003u + (uint64_t)r->op * 7919u + (uint64_t)r->T * 31u +
            (uint64_t)r->variant);
    if (op_is_attention(r->op)) {
        const att_shape *a = &ATT_SHAPES[r->att_shape];
        const att_batch *ab = &ATT_BATCHES[r->att_batch];
        int32_t *pages[MAX_SEQS] = {NULL};
        int total = 0, perm[1024];
        for (int s = 0; s < ab->n_seq; s++)
            total += (ab->old[s] + ab->add[s] + PAGE - 1) / PAGE;
        in.n_pages = total + 3; /* some pages stay unused */
        assert_true(in.n_pages <= 1024);
        for (int i = 0; i < in.n_pages; i++)
            perm[i] = i;
        for (int i = in.n_pages - 1; i > 0; i--) { /* shuffled page ids */
            int j = (int)(st_next() % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int s = 0, p = 0; s < ab->n_seq; s++) {
            int np = (ab->old[s] + ab->add[s] + PAGE - 1) / PAGE;
            pages[s] = st_malloc((size_t)np * 4);
            for (int j = 0; j < np; j++)
                pages[s][j] = perm[p++];
        }
        /* the prefix step: the sequences with cached tokens, from position 0 */
        int n_pre = 0, zero[MAX_SEQS] = {0}, pre_len[MAX_SEQS];
        int32_t *pre_pages[MAX_SEQS];
        for (int s = 0; s < ab->n_seq; s++)
            if (ab->old[s] > 0)
                pre_len[n_pre] = ab->old[s], pre_pages[n_pre++] = pages[s];
        if (n_pre)
            in.hb0 = hb_make(n_pre, zero, pre_len, pre_pages, 2, NULL, 0);
        in.hb1 = hb_make(ab->n_seq, ab->old, ab->add, pages, 2, NULL, 0);
        for (int s = 0; s < ab->n_seq; s++)
            free(pages[s]);
        const int T0 = in.hb0.b.n_tokens, T1 = in.hb1.b.n_tokens;
        in.q0 = st_malloc((size_t)(T0 ? T0 : 1) * a->H * a->D * 4);
        in.k0 = st_malloc((size_t)(T0 ? T0 : 1) * a->Hkv * a->D * 4);
        in.v0 = st_malloc((size_t)(T0 ? T0 : 1) * a->Hkv * a->D * 4);
        in.q = st_malloc((size_t)T1 * a->H * a->D * 4);
        in.k = st_malloc((size_t)T1 * a->Hkv * a->D * 4);
        in.v = st_malloc((size_t)T1 * a->Hkv * a->D * 4);
        fill_qkv(in.q0, in.k0, in.v0, T0, a);
        fill_qkv(in.q, in.k, in.v, T1, a);
        return in;
    }
    const int T = r->T, K = op_width(r, m), C = m->cfg.n_embd;
    /* silu_mul_quant's input, also where matmul of down makes its act: gate then up */
    const int two =
        r->op == OP_SILU_MUL_QUANT ||
        (r->op == OP_MATMUL && comet_role_group((comet_role)r->role) == COMET_GROUP_DOWN);
    in.x = st_malloc((size_t)(two ? 2 : 1) * T * K * 4);
    st_fill_act(in.x, T, K, two ? 4.0f : 1.0f);
    if (two)
        st_fill_act(in.x + (size_t)T * K, T, K, 1.0f);
    in.res = st_malloc((size_t)T * C * 4);
    st_fill_act(in.res, T, C, 0.5f);
    if (r->op == OP_EMBED_TOKENS || r->op == OP_LM_HEAD) {
        int32_t rows[3] = {T - 1, 0, T / 2}; /* out of order */
        in.hb = hb_single(T, m->cfg.n_vocab, rows, T >= 3 ? 3 : 1);
    }
    return in;
}

static void inputs_free(inputs *in) {
    free(in->x), free(in->res);
    free(in->q0), free(in->k0), free(in->v0), free(in->q), free(in->k), free(in->v);
    st_batch_free(&in->hb), st_batch_free(&in->hb0), st_batch_free(&in->hb1);
}

/* Perf mode: time `call` (an op of row r on backend slot i) on top of the checked run, 5
 * times with the queued work synced, and print the median in microseconds. The reference's
 * runs are not timed. In-place ops (a residual added to x, RoPE on q and k, a KV append)
 * change their buffers each time; the work stays the same. */
#define PERF(be, i, r, opname, call)                                                               \
    do {                                                                                           \
        if (g_perf && (i) != MAX_BACKENDS) {                                                       \
            double us_[5];                                                                         \
            for (int rep_ = 0; rep_ < 5; rep_++) {                                                 \
                struct timespec t0_, t1_;                                                          \
                clock_gettime(CLOCK_MONOTONIC, &t0_);                                              \
                OP_OK(be, call, opname);                                                           \
                OP_OK(be, (be)->ops->sync(be), "sync");                                            \
                clock_gettime(CLOCK_MONOTONIC, &t1_);                                              \
                us_[rep_] = (double)(t1_.tv_sec - t0_.tv_sec) * 1e6 +                              \
                            (double)(t1_.tv_nsec - t0_.tv_nsec) / 1e3;                             \
            }                                                                                      \
            print_perf(r, g_bks[i].name, opname, us_);                                             \
        }                                                                                          \
    } while (0)

static void print_perf(const row *r, const char *backend, const char *opname, double us[5]) {
    for (int x = 1; x < 5; x++) /* insertion sort: the median is us[2] */
        for (int y = x; y > 0 && us[y] < us[y - 1]; y--) {
            double t = us[y];
            us[y] = us[y - 1], us[y - 1] = t;
        }
    print_message("perf %-44s %-8s %-15s %10.1f us\n", r->name, backend, opname, us[2]);
}

/* Run row r on backend slot i (MAX_BACKENDS: the reference) with inputs in; the outputs go
 * to *o. Returns 0 when the backend lacks the op (the row is skipped on it). */
static int run_row(const row *r, int i, const inputs *in, outs *o) {
    comet_backend *be = i == MAX_BACKENDS ? g_ref.be : g_bks[i].be;
    const comet_backend_ops *op = be->ops;
    memset(o, 0, sizeof *o);
    if (r->op == OP_MATMUL_GROUP && !op->matmul_group && i != MAX_BACKENDS)
        return 0;
    if (r->op == OP_ATTENTION_QUANT && !op->paged_attention_quant && i != MAX_BACKENDS)
        return 0;
    if (r->op == OP_ROPE_ATTENTION_QUANT && !op->rope_attention_quant && i != MAX_BACKENDS)
        return 0;
    if (op_is_attention(r->op)) {
        const att_shape *a = &ATT_SHAPES[r->att_shape];
        const comet_kv_format fmt = {
            .type = comet_kv_type_from_bits(r->kv_bits), .group = a->G, .rotation = r->kv_rot};
        comet_kv_cache kv;
        OP_OK(be, comet_kv_cache_init_on(be, &kv, N_LAYER, in->n_pages, PAGE, a->Hkv, a->D, fmt),
              "KV pool");
        comet_rope_params rp = {.head_dim = a->D,
                                .theta = a->theta,
                                .scaling = a->scaling,
                                .factor = a->scaling == COMET_ROPE_SCALING_LLAMA3 ? 8.0f : 1.0f,
                                .low_freq_factor = 1.0f,
                                .high_freq_factor = 4.0f,
                                .orig_ctx = 8192};
        const int layer = 1;
        /* OP_ATTENTION_QUANT, OP_ROPE_ATTENTION_QUANT: the model's weights (its heads are the
         * shape's) and act */
        const comet_model *m = r->op != OP_ATTENTION ? model_of(r->variant) : NULL;
        const comet_weights *w = m ? weights_of(r->variant, i) : NULL;
        for (int step = 0; step < 2; step++) {
            const st_batch *hb = step ? &in->hb1 : &in->hb0;
            const int T = hb->b.n_tokens;
            if (!T)
                continue;
            const size_t nq = (size_t)T * a->H * a->D, nk = (size_t)T * a->Hkv * a->D;
            sbuf qb = sb_from(be, step ? in->q : in->q0, nq * 4),
                 kb = sb_from(be, step ? in->k : in->k0, nk * 4),
                 vb = sb_from(be, step ? in->v : in->v0, nk * 4), ob = sb_alloc(be, nq * 4);
            comet_step st;
            OP_OK(be, op->step_begin(be, &hb->b, &st), "step_begin");
            /* the tested step of a rope_attention_quant row: one call (q after it unspecified) */
            const int rope_fused = step && r->op == OP_ROPE_ATTENTION_QUANT && i != MAX_BACKENDS &&
                                   op->rope_attention_quant;
            if (!rope_fused)
                OP_OK(be,
                      op->rope_kv_append(be, &kv, layer, &st, &rp, sb_f(&qb), a->H, sb_f(&kb),
                                         sb_f(&vb)),
                      "rope_kv_append");
            if (step) {
                /* with m: rope_attention_quant or paged_attention_quant where the backend has
                 * it (fused), else paged_attention, then act_quant of O */
                const int K = a->H * a->D, fused = m && op->paged_attention_quant;
                sbuf ab = {0};
                if (m) {
                    assert_int_equal(comet_group_width(m, COMET_GROUP_O), K);
                    ab = sb_alloc(be, comet_act_bytes(T, K));
                }
                if (rope_fused)
                    OP_OK(be,
                          op->rope_attention_quant(be, &kv, layer, &st, &rp, sb_f(&qb), a->H,
                                                   sb_f(&kb), sb_f(&vb), sb_f(&ob), w, sb_ptr(&ab)),
                          "rope_attention_quant");
                else if (fused)
                    OP_OK(be,
                          op->paged_attention_quant(be, &kv, layer, &st, sb_f(&qb), a->H, sb_f(&ob),
                                                    w, sb_ptr(&ab)),
                          "paged_attention_quant");
                else
                    OP_OK(be, op->paged_attention(be, &kv, layer, &st, sb_f(&qb), a->H, sb_f(&ob)),
                          "paged_attention");
                if (m && !fused && !rope_fused)
                    OP_OK(be, op->act_quant(be, w, layer, COMET_GROUP_O, sb_f(&ob), T, sb_ptr(&ab)),
                          "act_quant");
                OP_OK(be, op->sync(be), "sync");
                if (r->op != OP_ROPE_ATTENTION_QUANT)
                    outs_add(o, fetch_f32(&qb, nq, "rope_kv_append (q)"), nq, 1e-5, "q after RoPE");
                outs_add(o,
                         fetch_f32(&ob, nq, m ? "paged_attention_quant (out)" : "paged_attention"),
                         nq, r->tol, "attention output");
                if (m) {
                    outs_add(o, fetch_act(be, m, layer, COMET_GROUP_O, &ab, T, K, "act of O"), nq,
                             act_tol(r->variant), "act of O");
                    SB_CHECK_GUARDS(&ab, "paged_attention_quant (act)");
                }
                if (rope_fused)
                    PERF(be, i, r, "rope_attention_quant",
                         op->rope_attention_quant(be, &kv, layer, &st, &rp, sb_f(&qb), a->H,
                                                  sb_f(&kb), sb_f(&vb), sb_f(&ob), w, sb_ptr(&ab)));
                else if (fused)
                    PERF(be, i, r, "paged_attention_quant",
                         op->paged_attention_quant(be, &kv, layer, &st, sb_f(&qb), a->H, sb_f(&ob),
                                                   w, sb_ptr(&ab)));
                else if (!m)
                    PERF(be, i, r, "paged_attention",
                         op->paged_attention(be, &kv, layer, &st, sb_f(&qb), a->H, sb_f(&ob)));
                sb_free(&ab);
            }
            OP_OK(be, op->sync(be), "sync");
            SB_CHECK_GUARDS(&kb, "rope_kv_append (k)");
            SB_CHECK_GUARDS(&vb, "rope_kv_append (v)");
            SB_CHECK_GUARDS(&ob, "paged_attention");
            sb_free(&qb), sb_free(&kb), sb_free(&vb), sb_free(&ob);
        }
        comet_kv_cache_free_on(be, &kv);
        return 1;
    }

    const comet_model *m = model_of(r->variant);
    const comet_weights *w = weights_of(r->variant, i);
    const int T = r->T, K = op_width(r, m), C = m->cfg.n_embd, l = r->layer;
    const size_t n = (size_t)T * K;
    switch (r->op) {
    case OP_EMBED_TOKENS: {
        comet_step st;
        OP_OK(be, op->step_begin(be, &in->hb.b, &st), "step_begin");
        sbuf xb = sb_alloc(be, n * 4);
        OP_OK(be, op->embed_tokens(be, w, &st, sb_f(&xb)), "embed_tokens");
        OP_OK(be, op->sync(be), "sync");
        outs_add(o, fetch_f32(&xb, n, "embed_tokens"), n, r->tol, "x");
        PERF(be, i, r, "embed_tokens", op->embed_tokens(be, w, &st, sb_f(&xb)));
        sb_free(&xb);
        break;
    }
    case OP_RMSNORM_QUANT: {
        const comet_group g = (comet_group)r->group;
        sbuf xb = sb_from(be, in->x, n * 4), rb = sb_from(be, in->res, n * 4);
        sbuf ab = sb_alloc(be, comet_act_bytes(T, K));
        OP_OK(be,
              op->rmsnorm_quant(be, w, l, g, sb_f(&xb), r->residual ? sb_f(&rb) : NULL, T,
                                sb_ptr(&ab)),
              "rmsnorm_quant");
        OP_OK(be, op->sync(be), "sync");
        outs_add(o, fetch_f32(&xb, n, "rmsnorm_quant (x)"), n, 0, "x (+ residual)");
        outs_add(o, fetch_act(be, m, l, g, &ab, T, K, "rmsnorm_quant"), n, r->tol, "act");
        SB_CHECK_GUARDS(&ab, "rmsnorm_quant");
        PERF(be, i, r, "rmsnorm_quant",
             op->rmsnorm_quant(be, w, l, g, sb_f(&xb), r->residual ? sb_f(&rb) : NULL, T,
                               sb_ptr(&ab)));
        sb_free(&xb), sb_free(&rb), sb_free(&ab);
        break;
    }
    case OP_ACT_QUANT:
    case OP_SILU_MUL_QUANT: {
        const comet_group g = r->op == OP_ACT_QUANT ? COMET_GROUP_O : COMET_GROUP_DOWN;
        sbuf ab;
        make_act(be, w, l, g, in->x, T, K, &ab);
        outs_add(o, fetch_act(be, m, l, g, &ab, T, K, OP_NAME[r->op]), n, r->tol, "act");
        SB_CHECK_GUARDS(&ab, OP_NAME[r->op]);
        if (g_perf) {
            sbuf x0 = sb_from(be, in->x, n * 4),
                 x1 = sb_from(be, in->x + (g == COMET_GROUP_DOWN ? n : 0), n * 4);
            if (g == COMET_GROUP_O)
                PERF(be, i, r, "act_quant", op->act_quant(be, w, l, g, sb_f(&x0), T, sb_ptr(&ab)));
            else
                PERF(be, i, r, "silu_mul_quant",
                     op->silu_mul_quant(be, w, l, sb_f(&x0), sb_f(&x1), T, sb_ptr(&ab)));
            sb_free(&x0), sb_free(&x1);
        }
        sb_free(&ab);
        break;
    }
    case OP_MATMUL: {
        const comet_role role = (comet_role)r->role;
        const comet_group g = comet_role_group(role);
        const int N = comet_model_linear(m, l, role)->n_out;
        sbuf ab, yb = sb_alloc(be, (size_t)T * N * 4);
        make_act(be, w, l, g, in->x, T, K, &ab);
        OP_OK(be, op->matmul(be, w, l, role, sb_ptr(&ab), T, sb_f(&yb)), "matmul");
        OP_OK(be, op->sync(be), "sync");
        outs_add(o, fetch_f32(&yb, (size_t)T * N, "matmul"), (size_t)T * N, r->tol, "y");
        PERF(be, i, r, "matmul", op->matmul(be, w, l, role, sb_ptr(&ab), T, sb_f(&yb)));
        sb_free(&ab), sb_free(&yb);
        break;
    }
    case OP_MATMUL_GROUP: {
        const comet_group g = (comet_group)r->group;
        comet_role roles[3];
        const int n_roles = comet_group_roles(g, roles);
        sbuf ab, ys[3], y1[3];
        float *ptrs[3];
        make_act(be, w, l, g, in->x, T, K, &ab);
        for (int k = 0; k < n_roles; k++) {
            const size_t ny = (size_t)T * comet_model_linear(m, l, roles[k])->n_out;
            ys[k] = sb_alloc(be, ny * 4);
            y1[k] = sb_alloc(be, ny * 4);
            ptrs[k] = sb_f(&ys[k]);
            OP_OK(be, op->matmul(be, w, l, roles[k], sb_ptr(&ab), T, sb_f(&y1[k])), "matmul");
        }
        if (!op->matmul_group) { /* the reference: matmul of each role */
            OP_OK(be, op->sync(be), "sync");
            for (int k = 0; k < n_roles; k++) {
                const size_t ny = (size_t)T * comet_model_linear(m, l, roles[k])->n_out;
                outs_add(o, fetch_f32(&y1[k], ny, "matmul"), ny, r->tol, ROLE_NAME[roles[k]]);
                sb_free(&ys[k]), sb_free(&y1[k]);
            }
            sb_free(&ab);
            break;
        }
        OP_OK(be, op->matmul_group(be, w, l, g, sb_ptr(&ab), T, ptrs), "matmul_group");
        OP_OK(be, op->sync(be), "sync");
        for (int k = 0; k < n_roles; k++) {
            const size_t ny = (size_t)T * comet_model_linear(m, l, roles[k])->n_out;
            float *a = fetch_f32(&ys[k], ny, "matmul_group"), *b = fetch_f32(&y1[k], ny, "matmul");
            double e = st_nerr(a, b, ny);
            if (!(e <= 1e-6))
                fail_msg("%s backend: %s: output %s differs from matmul of its role: relative "
                         "norm error %.3g > 1e-6",
                         op->name, r->name, ROLE_NAME[roles[k]], e);
            free(b);
            outs_add(o, a, ny, r->tol, ROLE_NAME[roles[k]]);
        }
        PERF(be, i, r, "matmul_group", op->matmul_group(be, w, l, g, sb_ptr(&ab), T, ptrs));
        for (int k = 0; k < n_roles; k++)
            sb_free(&ys[k]), sb_free(&y1[k]);
        sb_free(&ab);
        break;
    }
    case OP_LM_HEAD: {
        const int V = m->cfg.n_vocab, n_rows = in->hb.b.n_logits;
        comet_step st;
        OP_OK(be, op->step_begin(be, &in->hb.b, &st), "step_begin");
        sbuf ab, lb = sb_alloc(be, (size_t)n_rows * V * 4);
        make_act(be, w, 0, COMET_GROUP_LM_HEAD, in->x, T, C, &ab);
        OP_OK(be, op->lm_head(be, w, sb_ptr(&ab), &st, sb_f(&lb)), "lm_head");
        OP_OK(be, op->sync(be), "sync");
        outs_add(o, fetch_f32(&lb, (size_t)n_rows * V, "lm_head"), (size_t)n_rows * V, r->tol,
                 "logits");
        PERF(be, i, r, "lm_head", op->lm_head(be, w, sb_ptr(&ab), &st, sb_f(&lb)));
        sb_free(&ab), sb_free(&lb);
        break;
    }
    default: fail_msg("op %d has no runner", (int)r->op);
    }
    return 1;
}

/* One row: the reference once, then every backend against it. */
static void test_row(void **state) {
    const row *r = *state;
    if (r->op == OP_MATMUL_GROUP || r->op == OP_ATTENTION_QUANT ||
        r->op == OP_ROPE_ATTENTION_QUANT) {
        /* optional: skipped where no backend has it */
        int any = 0;
        for (int i = 0; i < g_n_bks; i++) {
            const comet_backend_ops *op = g_bks[i].be->ops;
            any |= r->op == OP_MATMUL_GROUP      ? op->matmul_group != NULL
                   : r->op == OP_ATTENTION_QUANT ? op->paged_attention_quant != NULL
                                                 : op->rope_attention_quant != NULL;
        }
        if (!any)
            skip();
    }
    inputs in = inputs_make(r);
    outs ref;
    assert_int_equal(run_row(r, MAX_BACKENDS, &in, &ref), 1);
    int ran = 0;
    for (int i = 0; i < g_n_bks; i++) {
        outs o;
        if (g_bks[i].attn_only && !op_is_attention(r->op))
            continue;
        if (!run_row(r, i, &in, &o)) {
            print_message("  %-48s %-8s skipped: no %s op\n", r->name, g_bks[i].name,
                          OP_NAME[r->op]);
            continue;
        }
        ran++;
        const int is_ref = g_bks[i].be->ops == g_ref.be->ops;
        assert_int_equal(o.n, ref.n);
        double worst = 0;
        for (int k = 0; k < o.n; k++) {
            assert_true(o.len[k] == ref.len[k]);
            if (is_ref || o.tol[k] == 0) {
                if (memcmp(o.y[k], ref.y[k], o.len[k] * 4)) {
                    size_t e = 0;
                    while (!memcmp(&o.y[k][e], &ref.y[k][e], 4))
                        e++;
                    fail_msg("%s backend: %s: %s not bit-exact%s: element %zu = %.9g, want %.9g",
                             g_bks[i].name, r->name, o.what[k],
                             is_ref ? " (a second run of the reference)" : "", e, (double)o.y[k][e],
                             (double)ref.y[k][e]);
                }
            } else {
                double e = st_nerr(o.y[k], ref.y[k], o.len[k]);
                if (!(e <= o.tol[k]))
                    fail_msg("%s backend: %s: %s relative norm error %.3g > %.3g", g_bks[i].name,
                             r->name, o.what[k], e, o.tol[k]);
                worst = fmax(worst, e / o.tol[k]);
            }
        }
        if (worst > 0.1)
            print_message("  %-48s %-8s worst error %.2f of its bound\n", r->name, g_bks[i].name,
                          worst);
        outs_free(&o);
    }
    outs_free(&ref);
    inputs_free(&in);
    if (!ran)
        skip();
}

/* ---- main -------------------------------------------------------------------------------- */

static int backend_selected(const char *name) {
    const char *sel = getenv("COMET_TEST_BACKEND");
    if (!sel || !*sel)
        return 1;
    size_t n = strlen(name);
    for (const char *p = sel; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    int cuda = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cuda"))
            cuda = 1;
        else if (!strcmp(argv[i], "--perf"))
            g_perf = 1;
        else {
            fprintf(stderr, "usage: test_backend_ops [--cuda] [--perf]\n");
            return 2;
        }
    }
    if (getenv("COMET_TEST_PERF") && !strcmp(getenv("COMET_TEST_PERF"), "1"))
        g_perf = 1;
    g_ref = (bk){"cpu-ref", comet_backend_cpu_ref_init(), 0};
    if (!g_ref.be) {
        fprintf(stderr, "the reference backend does not open: %s\n", comet_last_error());
        return 1;
    }
    if (cuda) {
        comet_backend *be = comet_backend_cuda_init(0);
        if (!be) {
            /* as tests/cuda/cuda_skip.h: skipped, or a failure on the GPU machine */
            const char *req = getenv("COMET_CUDA_TEST_REQUIRE");
            int required = req && *req && strcmp(req, "0");
            printf("%s: no CUDA backend: %s%s\n", required ? "FAIL" : "SKIP", comet_last_error(),
                   required ? " (COMET_CUDA_TEST_REQUIRE is set)" : "");
            comet_backend_free(g_ref.be);
            return required ? 1 : 77;
        }
        if (backend_selected("cuda"))
            g_bks[g_n_bks++] = (bk){"cuda", be, 0};
        else
            comet_backend_free(be);
        /* the prefill kernels the default plan leaves out of these rows' small steps (a
         * backend reads COMET_CUDA_ATTN_MMA once, when it opens) */
        static const struct {
            const char *name, *mma;
        } forced[] = {{"cuda-mma3", "3"}, {"cuda-mma1", "1"}};
        for (size_t f = 0; f < sizeof forced / sizeof forced[0]; f++) {
            if (!backend_selected(forced[f].name))
                continue;
            setenv("COMET_CUDA_ATTN_MMA", forced[f].mma, 1);
            comet_backend *fb = comet_backend_cuda_init(0);
            if (!fb) {
                fprintf(stderr, "backend %s does not open: %s\n", forced[f].name,
                        comet_last_error());
                return 1;
            }
            g_bks[g_n_bks++] = (bk){forced[f].name, fb, 1};
        }
        unsetenv("COMET_CUDA_ATTN_MMA");
    } else {
        if (backend_selected("cpu-ref"))
            g_bks[g_n_bks++] = (bk){"cpu-ref", comet_backend_cpu_ref_init(), 0};
        if (backend_selected("cpu"))
            g_bks[g_n_bks++] = (bk){"cpu", comet_backend_cpu_init(2), 0};
        for (int i = 0; i < g_n_bks; i++)
            if (!g_bks[i].be) {
                fprintf(stderr, "backend %s does not open: %s\n", g_bks[i].name,
                        comet_last_error());
                return 1;
            }
    }
    if (!g_n_bks) {
        printf("test_backend_ops: COMET_TEST_BACKEND=%s selects none of this run's backends\n",
               getenv("COMET_TEST_BACKEND"));
        return 77;
    }
    int n_rows;
    row *rows = backend_ops_rows(&n_rows);
    struct CMUnitTest *tests = calloc((size_t)n_rows, sizeof *tests);
    assert_non_null(tests);
    for (int i = 0; i < n_rows; i++)
        tests[i] = (struct CMUnitTest){
            .name = rows[i].name, .test_func = test_row, .initial_state = &rows[i]};
    int rc = _cmocka_run_group_tests(cuda ? "backend ops (cuda)" : "backend ops (cpu)", tests,
                                     (size_t)n_rows, NULL, NULL);
    for (int v = 0; v < N_VARIANTS; v++) {
        for (int i = 0; i < g_n_bks; i++)
            if (g_w[v][i])
                g_bks[i].be->ops->weights_free(g_bks[i].be, g_w[v][i]);
        if (g_w[v][MAX_BACKENDS])
            g_ref.be->ops->weights_free(g_ref.be, g_w[v][MAX_BACKENDS]);
        comet_model_free(g_models[v]);
    }
    for (int i = 0; i < g_n_bks; i++)
        comet_backend_free(g_bks[i].be);
    comet_backend_free(g_ref.be);
    free(tests);
    free(rows);
    return rc ? 1 : 0;
}

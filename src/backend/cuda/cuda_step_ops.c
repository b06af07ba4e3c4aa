/* cuda_step_ops.c — the CUDA backend's step ops (backend.h "step ops") and its op
 * `sample`: step_begin packs the batch (and the attention tiles) into one pinned buffer
 * and one copy; the embedding, elementwise + quantize, RoPE + KV append and attention ops
 * (rope_attention_quant: the last two in one call) launch the kernels of convert.cu,
 * norm_quant.cu, rope_kv.cu and attention.cu; matmul runs the W4Ax GEMM or cuBLAS, one
 * GEMM per stacked group for matmul_group; lm_head gathers the wanted rows and runs cuBLAS;
 * sample launches sample.cu's kernel.
 * cuda_backend.c puts them in the op table.
 *
 * Plain C against the CUDA runtime and cuBLAS; without COMET_HAVE_CUDA this file is empty.
 */
#include "backend/backend.h"

#ifdef COMET_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemm_w4ax.h"
#include "backend/cuda/lm_head_w8.h"

static size_t round4(size_t n) { return (n + 3) & ~(size_t)3; }

/* The batch arrays and the attention tiles, each padded to 16 bytes, in one int32 buffer;
 * step_begin lays them out in this order, the page table last: every offset then follows
 * from T, S, the logit rows and the tiles, which a recorded decode step keeps fixed while
 * its sequences' page tables grow (cuda_graph.view). */
comet_status comet_cuda_be_step_begin(comet_backend *be, const comet_batch *b, comet_step *st) {
    cuda_impl *im = impl_of(be);
    const int T = b->n_tokens, S = b->n_seqs;
    if (T < 1 || S < 1 || !b->tokens || !b->positions || !b->token_indptr || !b->page_indptr ||
        !b->page_indices || !b->last_page_len || b->n_logits < 0 || b->n_logits > T ||
        (b->n_logits > 0 && !b->logit_rows) || b->token_indptr[0] != 0 || b->token_indptr[S] != T)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: step_begin: a batch of %d tokens, %d sequences, %d "
                               "logit rows with a missing array or token_indptr not 0..T",
                               T, S, b->n_logits);
    const int NP = b->page_indptr[S], NL = b->n_logits;
    if (b->page_indptr[0] != 0 || NP < S)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: step_begin: page_indptr runs %d..%d for %d "
                               "sequences",
                               b->page_indptr[0], NP, S);
    int max_q = 0, min_q = T, max_kv = 0;
    for (int s = 0; s < S; s++) {
        int n = b->token_indptr[s + 1] - b->token_indptr[s];
        if (n < 0)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: step_begin: token_indptr falls at sequence %d",
                                   s);
        max_q = n > max_q ? n : max_q;
        min_q = n < min_q ? n : min_q;
        /* the sequence's KV length after the append: its last token's position + 1 (the
         * page table's comet_batch_kv_len needs the pool's page size, which the step does
         * not know) */
        if (n > 0 && b->positions[b->token_indptr[s + 1] - 1] + 1 > max_kv)
            max_kv = b->positions[b->token_indptr[s + 1] - 1] + 1;
    }
    const int n_tiles = comet_cuda_attention_tiles(b->token_indptr, S, NULL);
    size_t o_tok = 0, o_pos = o_tok + round4(T), o_tind = o_pos + round4(T);
    size_t o_pind = o_tind + round4(S + 1), o_last = o_pind + round4(S + 1);
    size_t o_rows = o_last + round4(S), o_tiles = o_rows + round4(NL);
    size_t o_pidx = o_tiles + round4(2 * (size_t)n_tiles), need = o_pidx + round4(NP);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "step_begin: cudaSetDevice");
    cudaError_t e = cudaSuccess;
    const char *what = "";
    if (need > im->step_cap) {
        size_t cap = im->step_cap * 2 > need ? im->step_cap * 2 : need;
        if (cap < 4096)
            cap = 4096;
        /* the previous step's kernels may still read the device copy */
        if ((e = cudaStreamSynchronize(im->stream)) != cudaSuccess) {
            what = "step_begin: waiting for the stream";
        } else {
            im->generation++;
            cudaFreeHost(im->step_host);
            cudaFree(im->step_dev);
            im->step_host = NULL, im->step_dev = NULL, im->step_cap = 0;
            /* the previous step's view points into the freed buffer: refuse it from here on */
            memset(&im->view, 0, sizeof im->view);
            if ((e = cudaMallocHost((void **)&im->step_host, cap * sizeof(int32_t))) != cudaSuccess)
                what = "step_begin: pinned staging buffer";
            else if ((e = cudaMalloc((void **)&im->step_dev, cap * sizeof(int32_t))) != cudaSuccess)
                what = "step_begin: device step buffer";
            else
                im->step_cap = cap;
        }
    } else if ((e = cudaEventSynchronize(im->step_copied)) != cudaSuccess) {
        what = "step_begin: waiting for the previous step's copy"; /* it reads step_host */
    }
    if (e == cudaSuccess) {
        int32_t *h = im->step_host;
        memcpy(h + o_tok, b->tokens, (size_t)T * sizeof *h);
        memcpy(h + o_pos, b->positions, (size_t)T * sizeof *h);
        memcpy(h + o_tind, b->token_indptr, (size_t)(S + 1) * sizeof *h);
        memcpy(h + o_pind, b->page_indptr, (size_t)(S + 1) * sizeof *h);
        memcpy(h + o_pidx, b->page_indices, (size_t)NP * sizeof *h);
        memcpy(h + o_last, b->last_page_len, (size_t)S * sizeof *h);
        if (NL)
            memcpy(h + o_rows, b->logit_rows, (size_t)NL * sizeof *h);
        comet_cuda_attention_tiles(b->token_indptr, S, h + o_tiles);
        if ((e = cudaMemcpyAsync(im->step_dev, h, need * sizeof *h, cudaMemcpyHostToDevice,
                                 im->stream)) != cudaSuccess ||
            (e = cudaEventRecord(im->step_copied, im->stream)) != cudaSuccess)
            what = "step_begin: copying the batch";
    }
    comet_cuda_be_leave(prev);
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, what);
    const int32_t *d = im->step_dev;
    st->host = *b;
    st->dev = *b;
    st->dev.tokens = d + o_tok;
    st->dev.positions = d + o_pos;
    st->dev.token_indptr = d + o_tind;
    st->dev.page_indptr = d + o_pind;
    st->dev.page_indices = d + o_pidx;
    st->dev.last_page_len = d + o_last;
    st->dev.logit_rows = d + o_rows;
    st->max_kv_len = max_kv;
    st->max_q_len = max_q;
    im->view = (comet_cuda_step_view){.n_tokens = T,
                                      .n_seqs = S,
                                      .positions = d + o_pos,
                                      .token_indptr = d + o_tind,
                                      .page_indptr = d + o_pind,
                                      .page_indices = d + o_pidx,
                                      .tiles = d + o_tiles,
                                      .n_tiles = n_tiles,
                                      .max_kv_len = max_kv,
                                      .min_q_len = min_q,
                                      .mma3_min_ctas = im->attn_mma3_auto ? im->n_sm : 0,
                                      .batch_invariant = be->batch_invariant,
                                      .attn_mma = im->attn_mma_on};
    return COMET_OK;
}

/* The device view of st: the latest step_begin's (its attention tiles live in the backend). */
comet_status comet_cuda_be_step_view(const cuda_impl *im, const comet_step *st, const char *op,
                                     comet_cuda_step_view *v) {
    if (!st || st->dev.positions != im->view.positions || st->host.n_tokens != im->view.n_tokens ||
        st->host.n_seqs != im->view.n_seqs)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: %s: the step is not the one "
                               "of this backend's latest step_begin",
                               op);
    *v = im->view;
    return COMET_OK;
}

comet_status comet_cuda_be_embed_tokens(comet_backend *be, const comet_weights *w,
                                        const comet_step *st, float *x) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "embed_tokens"));
    const comet_model *m = w->m; /* a shard holds rows vocab0 .. vocab0 + V - 1 of them */
    const int V_all = m->vocab_total ? m->vocab_total : w->V;
    for (int t = 0; t < st->host.n_tokens; t++)
        if (st->host.tokens[t] < 0 || st->host.tokens[t] >= V_all)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: embed_tokens: token %d "
                                   "is id %d, outside the vocabulary 0..%d",
                                   t, st->host.tokens[t], V_all - 1);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "embed_tokens: cudaSetDevice");
    comet_status r = comet_cuda_embed(w->embd, w->C, m->vocab0, w->V, st->dev.tokens,
                                      st->host.n_tokens, x, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

comet_status comet_cuda_be_rmsnorm_quant(comet_backend *be, const comet_weights *w, int layer,
                                         comet_group g, float *x, const float *residual, int T,
                                         void *act) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "rmsnorm_quant"));
    COMET_ASSERT((unsigned)g < COMET_GROUP_COUNT &&
                 (g == COMET_GROUP_LM_HEAD || (layer >= 0 && layer < w->n_layer)));
    const cuda_grp *gr = group_of(w, layer, g);
    if (!gr->norm)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: rmsnorm_quant: group %s "
                               "has no norm",
                               comet_cuda_group_names[g]);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "rmsnorm_quant: cudaSetDevice");
    comet_status r = comet_cuda_rmsnorm_quant(x, residual, gr->norm, w->m->cfg.rms_eps, T, &gr->fmt,
                                              act, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

comet_status comet_cuda_be_act_quant(comet_backend *be, const comet_weights *w, int layer,
                                     comet_group g, const float *x, int T, void *act) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "act_quant"));
    COMET_ASSERT((unsigned)g < COMET_GROUP_COUNT &&
                 (g == COMET_GROUP_LM_HEAD || (layer >= 0 && layer < w->n_layer)));
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "act_quant: cudaSetDevice");
    comet_status r = comet_cuda_act_quant(x, T, &group_of(w, layer, g)->fmt, act, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

comet_status comet_cuda_be_silu_mul_quant(comet_backend *be, const comet_weights *w, int layer,
                                          const float *gate, const float *up, int T, void *act) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "silu_mul_quant"));
    COMET_ASSERT(layer >= 0 && layer < w->n_layer);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "silu_mul_quant: cudaSetDevice");
    comet_status r = comet_cuda_silu_mul_quant(
        gate, up, T, &group_of(w, layer, COMET_GROUP_DOWN)->fmt, act, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

/* y [T, N] fp32 = act [T, K] fp16 · W [N, K]ᵀ fp16 (row-major), fp32 accumulation: in
 * cuBLAS's column-major terms yᵀ [N, T] = W · actᵀ. On the current device. */
static comet_status gemm_f16(cuda_impl *im, const uint16_t *W, int N, int K, const void *act, int T,
                             float *y, const char *op) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t cs = cublasGemmEx(im->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W,
                                     CUDA_R_16F, K, act, CUDA_R_16F, K, &zero, y, CUDA_R_32F, N,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: %s: cublasGemmEx (N=%d T=%d K=%d) "
                               "failed: %s",
                               op, N, T, K, cublasGetStatusString(cs));
    return COMET_OK;
}

/* *buf holds at least `need` bytes of device memory: a larger buffer replaces it after the
 * stream has drained (im->generation moves: graphs recorded on the old one are stale).
 * Called with the device entered; never inside a graph recording (a shape runs op by op
 * once before it is recorded, so its buffers have grown by then). */
static cudaError_t grow_buffer(cuda_impl *im, void **buf, size_t *bytes, size_t need) {
    if (need <= *bytes)
        return cudaSuccess;
    size_t cap = *bytes * 2 > need ? *bytes * 2 : need;
    cudaError_t e = cudaStreamSynchronize(im->stream);
    if (e != cudaSuccess)
        return e;
    im->generation++;
    cudaFree(*buf);
    *buf = NULL;
    *bytes = 0;
    if ((e = cudaMalloc(buf, cap)) == cudaSuccess)
        *bytes = cap;
    return e;
}

/* y [T, N] = the linear cl (N x K) of group gr applied to act; with n_parts > 0 (W4Ax only)
 * the output goes by columns to ys[i] [T, widths[i]] instead
 * (comet_cuda_be_gemm_w4ax_launch). */
static comet_status lin_gemm(cuda_impl *im, const cuda_lin *cl, const cuda_grp *gr, const void *act,
                             int T, float *y, int n_parts, const int *widths, float *const *ys,
                             int batch_invariant) {
    if (cl->kind == LIN_W4AX) {
        const int8_t *qa = act;
        const float *sa =
            (const float *)((const char *)act + comet_cuda_act_scales_offset(T, cl->K));
        return comet_cuda_be_gemm_w4ax_launch(im, cl->w4, T, gr->fmt.n8, qa, sa, y, n_parts,
                                              widths, ys, batch_invariant);
    }
    COMET_ASSERT(n_parts == 0);
    return gemm_f16(im, cl->w16, cl->N, cl->K, act, T, y, "matmul");
}

/* The stack of group g (QKV or GATE_UP) applied to act, its columns split into ys[i] [T, N_i]
 * per role (a NULL ys[i] is skipped): by the W4Ax GEMM's own stores where it can (no copy
 * kernel: two launches fewer a layer), else through the stack buffer and an unstack copy. */
static comet_status stack_gemm(cuda_impl *im, const comet_weights *w, int layer, comet_group g,
                               const void *act, int T, float *const *ys, int batch_invariant) {
    const cuda_grp *gr = group_of(w, layer, g);
    comet_role roles[3];
    const int n_roles = comet_group_roles(g, roles);
    int widths[3];
    int direct = gr->stack.kind == LIN_W4AX && im->stack_split_on;
    for (int i = 0; i < n_roles; i++) {
        widths[i] = w->lin[(size_t)layer * COMET_ROLE_COUNT + roles[i]].N;
        direct &= widths[i] % 4 == 0 && (uintptr_t)ys[i] % 16 == 0;
    }
    if (direct)
        return lin_gemm(im, &gr->stack, gr, act, T, NULL, n_roles, widths, ys, batch_invariant);
    cudaError_t e = grow_buffer(im, &im->stack_ws, &im->stack_ws_bytes,
                                (size_t)T * gr->stack.N * sizeof(float));
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, "matmul: growing the stacked output");
    COMET_TRY(lin_gemm(im, &gr->stack, gr, act, T, im->stack_ws, 0, NULL, NULL, batch_invariant));
    return comet_cuda_unstack(im->stack_ws, T, gr->stack.N, n_roles, widths, ys, im->stream);
}

comet_status comet_cuda_be_matmul(comet_backend *be, const comet_weights *w, int layer,
                                  comet_role r, const void *act, int T, float *y) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "matmul"));
    COMET_ASSERT(layer >= 0 && layer < w->n_layer && (unsigned)r < COMET_ROLE_COUNT && T >= 1);
    const cuda_lin *cl = &w->lin[(size_t)layer * COMET_ROLE_COUNT + r];
    const comet_group g = comet_role_group(r);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "matmul: cudaSetDevice");
    comet_status st;
    if (cl->kind == LIN_W4AX && !cl->w4) { /* its rows live in the group's stack */
        comet_role roles[3];
        float *ys[3] = {NULL, NULL, NULL};
        for (int i = 0, n = comet_group_roles(g, roles); i < n; i++)
            if (roles[i] == r)
                ys[i] = y;
        st = stack_gemm(im, w, layer, g, act, T, ys, be->batch_invariant);
    } else {
        st = lin_gemm(im, cl, group_of(w, layer, g), act, T, y, 0, NULL, NULL,
                      be->batch_invariant);
    }
    comet_cuda_be_leave(prev);
    if (st < 0)
        return comet_cuda_be_prefix_error(st, "matmul, layer %d %s", layer,
                                          comet_cuda_role_names[r]);
    return COMET_OK;
}

comet_status comet_cuda_be_matmul_group(comet_backend *be, const comet_weights *w, int layer,
                                        comet_group g, const void *act, int T, float *const *ys) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "matmul_group"));
    COMET_ASSERT(layer >= 0 && layer < w->n_layer && T >= 1);
    if (g != COMET_GROUP_QKV && g != COMET_GROUP_GATE_UP)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: matmul_group: group %s "
                               "has one linear",
                               comet_cuda_group_names[g]);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "matmul_group: cudaSetDevice");
    comet_status st = stack_gemm(im, w, layer, g, act, T, ys, be->batch_invariant);
    comet_cuda_be_leave(prev);
    if (st < 0)
        return comet_cuda_be_prefix_error(st, "matmul, layer %d %s", layer,
                                          comet_cuda_group_names[g]);
    return COMET_OK;
}

static int rope_same(const comet_rope_params *a, const comet_rope_params *b) {
    return a->head_dim == b->head_dim && a->theta == b->theta && a->scaling == b->scaling &&
           a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->orig_ctx == b->orig_ctx;
}

/* The device inv_freq table of rp (comet_rope_inv_freq), computed and uploaded the
 * first time rp is seen; ROPE_SLOTS tables are kept, the oldest replaced (in stream order,
 * after the kernels that read it). On the current device. */
static comet_status rope_table(cuda_impl *im, const comet_rope_params *rp, const double **out) {
    for (int i = 0; i < im->rope_used; i++)
        if (rope_same(&im->rope_key[i], rp)) {
            *out = im->rope_dev + (size_t)i * ROPE_SLOT_FREQS;
            return COMET_OK;
        }
    if (!im->rope_dev)
        CUDA_TRY(cudaMalloc((void **)&im->rope_dev, sizeof(double) * ROPE_SLOTS * ROPE_SLOT_FREQS),
                 "rope_kv_append: the RoPE tables");
    int slot = im->rope_used < ROPE_SLOTS ? im->rope_used++ : im->rope_next++ % ROPE_SLOTS;
    im->generation++; /* a recorded graph may read this slot's old table */
    im->rope_key[slot] = *rp;
    comet_rope_inv_freq(rp, im->rope_host[slot]);
    cudaError_t e =
        cudaMemcpyAsync(im->rope_dev + (size_t)slot * ROPE_SLOT_FREQS, im->rope_host[slot],
                        sizeof(double) * (rp->head_dim / 2), cudaMemcpyHostToDevice, im->stream);
    if (e != cudaSuccess) {
        im->rope_key[slot].head_dim = 0; /* matches no rp */
        return comet_cuda_be_fail(e, "rope_kv_append: uploading the RoPE table");
    }
    *out = im->rope_dev + (size_t)slot * ROPE_SLOT_FREQS;
    return COMET_OK;
}

/* rp's head dim against kv's, as rope_kv_append checks them (op names the op) */
static comet_status rope_check(const comet_kv_cache *kv, const comet_rope_params *rp,
                               const char *op) {
    if (rp->head_dim != kv->head_dim || rp->head_dim % 2 || rp->head_dim > 2 * ROPE_SLOT_FREQS)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: %s: RoPE head dim %d, KV head dim %d", op,
                               rp->head_dim, kv->head_dim);
    return COMET_OK;
}

comet_status comet_cuda_be_rope_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                          const comet_step *st, const comet_rope_params *rp,
                                          float *q, int H, float *k, const float *v) {
    cuda_impl *im = impl_of(be);
    comet_cuda_step_view view;
    COMET_TRY(comet_cuda_be_step_view(im, st, "rope_kv_append", &view));
    if (!kv->storage)
        return comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: rope_kv_append: the KV "
                                                      "pool has no storage (kv_init)");
    COMET_TRY(rope_check(kv, rp, "rope_kv_append"));
    comet_cuda_kv_layout L = comet_cuda_be_kv_layout(kv);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "rope_kv_append: cudaSetDevice");
    const double *inv_freq = NULL;
    comet_status r = rope_table(im, rp, &inv_freq);
    if (r >= 0)
        r = comet_cuda_rope_kv_append(&L, kv->storage, layer, &view, inv_freq, q, H, k, v,
                                      kv->kv.rotation == COMET_KV_ROTATION_HADAMARD, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

/* rope_attention_quant's RoPE and KV append inputs (q the attention's q, writable) */
typedef struct rope_in {
    const comet_rope_params *rp;
    float *q, *k;
    const float *v;
} rope_in;

/* paged_attention over kv's layer for step st, followed by the quantization of its output
 * for o_proj (group O of w's layer, into act) when fmt is not NULL, and preceded by
 * rope_kv_append when ri is not NULL (with fmt): the split workspace is grown to what the step
 * needs, then comet_cuda_paged_attention, comet_cuda_paged_attention_quant or
 * comet_cuda_rope_attention_quant. */
static comet_status attention_op(comet_backend *be, const comet_kv_cache *kv, int layer,
                                 const comet_step *st, const float *q, int H, float *out,
                                 const comet_cuda_act_fmt *fmt, void *act, const rope_in *ri,
                                 const char *op) {
    cuda_impl *im = impl_of(be);
    comet_cuda_step_view view;
    COMET_TRY(comet_cuda_be_step_view(im, st, op, &view));
    if (!kv->storage)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: %s: the KV pool has no storage (kv_init)", op);
    if (ri)
        COMET_TRY(rope_check(kv, ri->rp, op));
    comet_cuda_kv_layout L = comet_cuda_be_kv_layout(kv);
    int splits = comet_cuda_attention_splits(&L, &view, H, im->attn_sm);
    size_t need = comet_cuda_attention_workspace_bytes(&L, &view, H, splits);
    const int rotate = kv->kv.rotation == COMET_KV_ROTATION_HADAMARD;
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "paged_attention: cudaSetDevice");
    cudaError_t e = grow_buffer(im, &im->attn_ws, &im->attn_ws_bytes, need);
    comet_status r = COMET_OK;
    if (e != cudaSuccess)
        r = comet_cuda_be_fail(e, "paged_attention: growing the split workspace");
    const double *inv_freq = NULL;
    if (r >= 0 && ri)
        r = rope_table(im, ri->rp, &inv_freq);
    if (r >= 0 && ri)
        r = comet_cuda_rope_attention_quant(&L, kv->storage, layer, &view, inv_freq, ri->q, H,
                                            ri->k, ri->v, out, rotate, splits, im->attn_ws, fmt,
                                            act, im->stream);
    else if (r >= 0 && fmt)
        r = comet_cuda_paged_attention_quant(&L, kv->storage, layer, &view, q, H, out, rotate,
                                             splits, im->attn_ws, fmt, act, im->stream);
    else if (r >= 0)
        r = comet_cuda_paged_attention(&L, kv->storage, layer, &view, q, H, out, rotate, splits,
                                       im->attn_ws, im->stream);
    comet_cuda_be_leave(prev);
    return r;
}

comet_status comet_cuda_be_paged_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                           const comet_step *st, const float *q, int H,
                                           float *out) {
    return attention_op(be, kv, layer, st, q, H, out, NULL, NULL, NULL, "paged_attention");
}

comet_status comet_cuda_be_paged_attention_quant(comet_backend *be, const comet_kv_cache *kv,
                                                 int layer, const comet_step *st, const float *q,
                                                 int H, float *out, const comet_weights *w,
                                                 void *act) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "paged_attention_quant"));
    COMET_ASSERT(layer >= 0 && layer < w->n_layer);
    return attention_op(be, kv, layer, st, q, H, out, &group_of(w, layer, COMET_GROUP_O)->fmt, act,
                        NULL, "paged_attention_quant");
}

comet_status comet_cuda_be_rope_attention_quant(comet_backend *be, comet_kv_cache *kv, int layer,
                                                const comet_step *st, const comet_rope_params *rp,
                                                float *q, int H, float *k, const float *v,
                                                float *out, const comet_weights *w, void *act) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "rope_attention_quant"));
    COMET_ASSERT(layer >= 0 && layer < w->n_layer && rp);
    const rope_in ri = {rp, q, k, v};
    return attention_op(be, kv, layer, st, q, H, out, &group_of(w, layer, COMET_GROUP_O)->fmt, act,
                        &ri, "rope_attention_quant");
}

comet_status comet_cuda_be_lm_head(comet_backend *be, const comet_weights *w, const void *act,
                                   const comet_step *st, float *logits) {
    cuda_impl *im = impl_of(be);
    COMET_TRY(comet_cuda_be_check_weights(im, w, "lm_head"));
    const int n = st->host.n_logits, T = st->host.n_tokens, C = w->C;
    if (n == 0)
        return COMET_OK;
    const int32_t *rows = st->host.logit_rows;
    int contiguous = 1;
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= T)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: lm_head: logit row %d "
                                   "is token %d of a %d-token step",
                                   i, rows[i], T);
        contiguous &= rows[i] == rows[0] + i;
    }
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "lm_head: cudaSetDevice");
    const uint16_t *src = (const uint16_t *)act + (size_t)rows[0] * C;
    comet_status r = COMET_OK;
    if (!contiguous) {
        /* the second half of act (comet_act_bytes(T, C)) holds the gathered rows */
        uint16_t *dst = (uint16_t *)((char *)act + (((size_t)2 * T * C + 255) & ~(size_t)255));
        r = comet_cuda_gather_rows_f16(act, C, st->dev.logit_rows, n, dst, im->stream);
        src = dst;
    }
    if (r >= 0 && w->lm_head_q8 && n <= COMET_CUDA_LM_HEAD_W8_MAX_ROWS) {
        r = comet_cuda_lm_head_w8(w->lm_head_q8, w->lm_head_s8, w->V, C, src, n, logits,
                                  im->stream);
    } else if (r >= 0 && w->lm_head_q8) { /* fp32 sums of the exact fp16 codes, then s */
        r = gemm_f16(im, w->lm_head_c16, w->V, C, src, n, logits, "lm_head");
        if (r >= 0)
            r = comet_cuda_lm_head_scale(logits, w->lm_head_s8, w->V, n, im->stream);
    } else if (r >= 0)
        r = gemm_f16(im, w->lm_head, w->V, C, src, n, logits, "lm_head");
    comet_cuda_be_leave(prev);
    return r;
}

/* ---- sampling ----
 * One upload (rows, listed ids), the kernel of sample.cu, one download of the ids: a
 * step's sampling costs one round trip of a few hundred bytes, not the logits rows (V fp32
 * each). */

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

comet_status comet_cuda_be_sample(comet_backend *be, const float *logits, int V,
                                  const comet_sample_row *rows, int n_rows,
                                  const comet_sample_adj *adj, int n_adj, int32_t *ids) {
    cuda_impl *im = impl_of(be);
    if (n_rows < 1 || V < 1 || n_adj < 0 || (n_adj > 0 && !adj))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: sample: %d rows, V = %d, %d listed ids", n_rows, V,
                               n_adj);
    for (int r = 0; r < n_rows; r++)
        if (rows[r].row < 0 || rows[r].n_adj < 0 || rows[r].adj_offset < 0 ||
            rows[r].adj_offset + rows[r].n_adj > n_adj)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: sample: row %d names "
                                   "logits row %d and listed ids %d..%d of %d",
                                   r, rows[r].row, rows[r].adj_offset,
                                   rows[r].adj_offset + rows[r].n_adj, n_adj);
    for (int i = 0; i < n_adj; i++)
        if (adj[i].id < 0 || adj[i].id >= V)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "cuda backend: sample: listed id %d "
                                   "outside the vocabulary of %d",
                                   adj[i].id, V);
    const size_t o_adj = align8((size_t)n_rows * sizeof *rows);
    const size_t o_ids = o_adj + align8((size_t)n_adj * sizeof *adj);
    const size_t need = o_ids + align8((size_t)n_rows * sizeof(int32_t));
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "sample: cudaSetDevice");
    cudaError_t e = cudaSuccess;
    const char *what = "sample";
    if (need > im->smp_cap) {
        size_t cap = need > 2 * im->smp_cap ? need : 2 * im->smp_cap;
        if ((e = cudaStreamSynchronize(im->stream)) == cudaSuccess) {
            cudaFreeHost(im->smp_host);
            cudaFree(im->smp_dev);
            im->smp_host = im->smp_dev = NULL;
            im->smp_cap = 0;
            if ((e = cudaMallocHost(&im->smp_host, cap)) != cudaSuccess)
                what = "sample: pinned staging buffer";
            else if ((e = cudaMalloc(&im->smp_dev, cap)) != cudaSuccess)
                what = "sample: device buffer";
            else
                im->smp_cap = cap;
        }
    }
    comet_status r = COMET_OK;
    if (e == cudaSuccess) {
        char *h = im->smp_host, *d = im->smp_dev;
        memcpy(h, rows, (size_t)n_rows * sizeof *rows);
        if (n_adj)
            memcpy(h + o_adj, adj, (size_t)n_adj * sizeof *adj);
        e = cudaMemcpyAsync(d, h, o_ids, cudaMemcpyHostToDevice, im->stream);
        if (e == cudaSuccess) {
            r = comet_cuda_sample((const comet_sample_row *)d, n_rows, (float *)logits, V,
                                  (const comet_sample_adj *)(d + o_adj), (int32_t *)(d + o_ids),
                                  im->stream);
            if (r >= 0 &&
                (e = cudaMemcpyAsync(h + o_ids, d + o_ids, (size_t)n_rows * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, im->stream)) == cudaSuccess &&
                (e = cudaStreamSynchronize(im->stream)) == cudaSuccess)
                memcpy(ids, h + o_ids, (size_t)n_rows * sizeof(int32_t));
        }
    }
    comet_cuda_be_leave(prev);
    if (r < 0)
        return r;
    return e == cudaSuccess ? COMET_OK : comet_cuda_be_fail(e, what);
}

#endif

/* forward.c — the LLaMA decoder forward pass as a list of step-op calls (backend.h).
 *
 *   x = embed(tokens)
 *   for each layer:
 *       a = rmsnorm_quant(x [+= down output of the layer before], attn_norm)   group qkv
 *       q, k, v = a·Wq, a·Wk, a·Wv (one matmul_group where the backend has it)
 *       rope_kv_append(q, k, v)
 *       a = act_quant(attention(q, KV cache))                                  group o
 *           (one call, paged_attention_quant, where the backend has it; with RoPE and
 *           the KV append, rope_attention_quant)
 *       a = rmsnorm_quant(x += a·Wo, ffn_norm)                                 group gate_up
 *       a = silu_mul_quant(a·Wgate, a·Wup)                                     group down
 *       down output = a·Wdown
 *   logits = rmsnorm_quant(x += down output, output_norm)[rows] · lm_headᵀ
 *
 * Written once for every backend: all buffers live in the backend's memory, allocated here
 * once for max_batch_tokens; a step allocates nothing. The residual add is fused into the
 * next RMSNorm. Batch-first: every op sees all T tokens of the step at once, whatever
 * sequences they belong to; only rope_kv_append and paged_attention look at the batch's
 * sequence structure. The host sends the batch in one upload (step_begin) and receives
 * the logits rows it asked for.
 *
 * Model variants (comet_model_config: arch, the bias flags, rope_scaling, tie_embeddings):
 * the architecture is LLaMA's (the only comet_arch); RoPE scaling goes to rope_kv_append in
 * the rope parameters and a tied lm_head is the backend's weights' business. A linear's
 * bias would be an op after its matmul here: no backend has one, so comet_forward_init
 * refuses a model with a bias flag (as the loaders do) and the layer loop asserts it.
 */
#include "model/forward.h"

#include "backend/comm.h"

#include <stdlib.h>
#include <string.h>

struct comet_forward_ctx {
    const comet_model *m;
    comet_backend *be;
    comet_weights *w; /* the backend's copy of m's weights */
    int max_tokens;
    comet_rope_params rope;
    /* workspace in the backend's memory, for max_tokens rows */
    float *x;      /* [T, C] residual stream */
    float *q;      /* [T, H*D] */
    float *k;      /* [T, Hkv*D] */
    float *v;      /* [T, Hkv*D] */
    float *att;    /* [T, H*D] attention output */
    float *tmp;    /* [T, C] o / down output, added to x by the next rmsnorm_quant */
    float *gate;   /* [T, F] */
    float *up;     /* [T, F] */
    void *act;     /* comet_act_bytes(T, max(C, H*D, F)): a group's GEMM input */
    float *logits; /* [T, V] (backends without host memory) */
    size_t weights_bytes;   /* device memory weights_load took (free-memory delta); 0 on host */
    size_t workspace_bytes; /* the buffers above, as allocated */
    /* tensor parallelism (comet_forward_set_comm): */
    comet_comm *comm;          /* NULL: the model runs whole */
    const int *att_cols;       /* [ranks + 1] each rank's columns of the attention output
                                * (borrowed); NULL: o_proj is split by its input rows */
    float *att_full;           /* [T, H*D] every rank's heads, o_proj's input */
    const int *vocab_cols;     /* [ranks + 1] each rank's vocabulary rows (borrowed) */
    float *lm_part;            /* [T, the rank's rows] its lm_head output */
    comet_forward_op_fn on_op; /* profiler, or NULL */
    void *on_op_user;
    comet_forward_input_fn on_input; /* linear-input observer, or NULL */
    void *on_input_user;
};

void comet_forward_free(comet_forward_ctx *fc) {
    if (!fc)
        return;
    comet_backend *be = fc->be;
    void *bufs[] = {fc->x,    fc->q,  fc->k,   fc->v,      fc->att,      fc->tmp,
                    fc->gate, fc->up, fc->act, fc->logits, fc->att_full, fc->lm_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->free(be, bufs[i]);
    if (fc->w)
        be->ops->weights_free(be, fc->w);
    free(fc);
}

/* Every op the layer loop calls must be there: a backend may leave ops it lacks NULL. */
static comet_status check_ops(const comet_backend *be) {
    const comet_backend_ops *op = be->ops;
    const struct {
        const char *name;
        int present;
    } need[] = {
        {"alloc", op->alloc != NULL},
        {"free", op->free != NULL},
        {"upload", op->upload != NULL},
        {"download", op->download != NULL},
        {"sync", op->sync != NULL},
        {"weights_load", op->weights_load != NULL},
        {"weights_free", op->weights_free != NULL},
        {"step_begin", op->step_begin != NULL},
        {"embed_tokens", op->embed_tokens != NULL},
        {"rmsnorm_quant", op->rmsnorm_quant != NULL},
        {"act_quant", op->act_quant != NULL},
        {"silu_mul_quant", op->silu_mul_quant != NULL},
        {"matmul", op->matmul != NULL},
        {"rope_kv_append", op->rope_kv_append != NULL},
        {"paged_attention", op->paged_attention != NULL},
        {"lm_head", op->lm_head != NULL},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].present)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "forward: backend '%s' has no '%s' op yet; the forward pass "
                                   "needs it",
                                   op->name, need[i].name);
    return COMET_OK;
}

static void *ws_alloc(comet_forward_ctx *fc, size_t bytes, comet_status *st) {
    if (*st < 0)
        return NULL;
    void *p = fc->be->ops->alloc(fc->be, bytes);
    if (!p)
        *st = COMET_ERR_NOMEM;
    else
        fc->workspace_bytes += bytes;
    return p;
}

/* The widest input a layer quantizes activations for (sizes the activation-code buffer):
 * the model's width, the o projection's group width or the MLP's hidden width. */
static int act_k_max(const comet_model *m) {
    int k_max = m->cfg.n_embd;
    if (comet_group_width(m, COMET_GROUP_O) > k_max)
        k_max = comet_group_width(m, COMET_GROUP_O);
    if (m->cfg.n_ff > k_max)
        k_max = m->cfg.n_ff;
    return k_max;
}

comet_forward_ctx *comet_forward_init(const comet_model *m, comet_backend *be,
                                      int max_batch_tokens) {
    const comet_model_config *c = &m->cfg;
    if (check_ops(be) < 0 || comet_model_variant_check(c, "forward") < 0)
        return NULL;
    if (max_batch_tokens <= 0) {
        comet_set_error(COMET_ERR_INVALID_ARG, "forward: max_batch_tokens must be positive");
        return NULL;
    }
    comet_forward_ctx *fc = calloc(1, sizeof *fc);
    if (!fc) {
        comet_set_error(COMET_ERR_NOMEM, "forward: out of memory");
        return NULL;
    }
    size_t T = (size_t)max_batch_tokens, f = sizeof(float);
    size_t HD = (size_t)c->n_head * c->head_dim, KVD = (size_t)c->n_head_kv * c->head_dim;
    const int k_max = act_k_max(m);
    fc->m = m;
    fc->be = be;
    fc->max_tokens = max_batch_tokens;
    /* the weights' device bytes as the device counts them: what weights_load left taken
     * (packing and conversion scratch it frees again is not counted) */
    size_t free0 = 0, free1 = 0, total = 0;
    comet_status st = comet_backend_device_memory(be, &free0, &total);
    if (st >= 0 && (st = be->ops->weights_load(be, m, &fc->w)) < 0)
        fc->w = NULL; /* weights_load left nothing behind */
    if (st >= 0 && (st = be->ops->sync(be)) >= 0)
        st = comet_backend_device_memory(be, &free1, &total);
    if (st < 0) {
        comet_forward_free(fc); /* and fc->w when it was loaded */
        return NULL;
    }
    fc->weights_bytes = free0 > free1 ? free0 - free1 : 0;
    fc->x = ws_alloc(fc, T * c->n_embd * f, &st);
    fc->q = ws_alloc(fc, T * HD * f, &st);
    fc->k = ws_alloc(fc, T * KVD * f, &st);
    fc->v = ws_alloc(fc, T * KVD * f, &st);
    fc->att = ws_alloc(fc, T * HD * f, &st);
    fc->tmp = ws_alloc(fc, T * c->n_embd * f, &st);
    fc->gate = ws_alloc(fc, T * c->n_ff * f, &st);
    fc->up = ws_alloc(fc, T * c->n_ff * f, &st);
    fc->act = ws_alloc(fc, comet_act_bytes(max_batch_tokens, k_max), &st);
    if (!be->ops->host_memory)
        fc->logits = ws_alloc(fc, T * c->n_vocab * f, &st);
    if (st < 0) {
        comet_forward_free(fc);
        comet_set_error(COMET_ERR_NOMEM,
                        "forward: cannot allocate the workspace for %d tokens "
                        "on backend '%s'",
                        max_batch_tokens, be->ops->name);
        return NULL;
    }
    fc->rope = (comet_rope_params){
        .head_dim = c->head_dim,
        .theta = c->rope_theta,
        .scaling = c->rope_scaling,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .orig_ctx = c->rope_orig_ctx,
    };
    return fc;
}

int comet_forward_max_tokens(const comet_forward_ctx *fc) { return fc->max_tokens; }

void comet_forward_memory(const comet_forward_ctx *fc, size_t *weights_bytes,
                          size_t *workspace_bytes) {
    *weights_bytes = fc->weights_bytes;
    *workspace_bytes = fc->workspace_bytes;
}

size_t comet_forward_workspace_bytes(const comet_model *m, int max_batch_tokens,
                                     int host_memory) {
    const comet_model_config *c = &m->cfg;
    size_t T = (size_t)max_batch_tokens, f = sizeof(float);
    size_t HD = (size_t)c->n_head * c->head_dim, KVD = (size_t)c->n_head_kv * c->head_dim;
    const int k_max = act_k_max(m);
    /* x, tmp; q, att; k, v; gate, up; act; logits: as comet_forward_init allocates them */
    size_t n = T * f * (2 * (size_t)c->n_embd + 2 * HD + 2 * KVD + 2 * (size_t)c->n_ff);
    n += comet_act_bytes(max_batch_tokens, k_max);
    if (!host_memory)
        n += T * (size_t)c->n_vocab * f;
    return n;
}

const float *comet_forward_logits(const comet_forward_ctx *fc) { return fc->logits; }

comet_backend *comet_forward_backend(const comet_forward_ctx *fc) { return fc->be; }

/* The whole model's vocabulary size (a shard holds some of its rows). */
static int vocab_total(const comet_model *m) {
    return m->vocab_total ? m->vocab_total : m->cfg.n_vocab;
}

comet_status comet_forward_set_comm(comet_forward_ctx *fc, comet_comm *comm, const int *att_cols,
                                    const int *vocab_cols) {
    const int n = comet_comm_size(comm), rank = comet_comm_rank(comm);
    const comet_model *m = fc->m;
    const comet_model_config *c = &m->cfg;
    const int V = vocab_total(m);
    comet_backend *be = fc->be;
    if (fc->on_input)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: an input observer is set; ranks have no whole inputs");
    if (vocab_cols[n] != V || vocab_cols[rank] != m->vocab0 ||
        vocab_cols[rank + 1] - vocab_cols[rank] != c->n_vocab)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: rank %d of %d: vocabulary rows %d..%d of %d do not "
                               "match its %d rows from %d",
                               rank, n, vocab_cols[rank], vocab_cols[rank + 1], vocab_cols[n],
                               c->n_vocab, m->vocab0);
    const int W = att_cols ? att_cols[n] : 0;
    if (att_cols ? W != comet_group_width(m, COMET_GROUP_O) ||
                       att_cols[rank + 1] - att_cols[rank] != c->n_head * c->head_dim
                 : comet_group_width(m, COMET_GROUP_O) != c->n_head * c->head_dim)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: rank %d of %d: o_proj reads %d channels, which do not "
                               "match its %d heads",
                               rank, n, comet_group_width(m, COMET_GROUP_O), c->n_head);
    /* what is allocated here goes with fc (comet_forward_free), also on failure */
    const size_t T = (size_t)fc->max_tokens;
    fc->att_full = att_cols ? be->ops->alloc(be, T * W * sizeof(float)) : NULL;
    fc->lm_part = be->ops->alloc(be, T * c->n_vocab * sizeof(float));
    if (fc->logits) { /* rank 0 gathers every rank's logits; the others keep none */
        be->ops->free(be, fc->logits);
        fc->logits = rank == 0 ? be->ops->alloc(be, T * V * sizeof(float)) : NULL;
    }
    if ((att_cols && !fc->att_full) || !fc->lm_part ||
        (rank == 0 && !be->ops->host_memory && !fc->logits))
        return comet_set_error(COMET_ERR_NOMEM,
                               "forward: no room for rank %d's gathered attention output or "
                               "logits (%d tokens) on backend '%s'",
                               rank, fc->max_tokens, be->ops->name);
    fc->att_cols = att_cols;
    fc->vocab_cols = vocab_cols;
    fc->comm = comm;
    return COMET_OK;
}

void comet_forward_set_profiler(comet_forward_ctx *fc, comet_forward_op_fn fn, void *user) {
    fc->on_op = fn;
    fc->on_op_user = user;
}

comet_status comet_forward_set_input_observer(comet_forward_ctx *fc, comet_forward_input_fn fn,
                                              void *user) {
    if (fn && fc->comm)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "observing the linears' inputs: the model is split over ranks");
    if (fn && !fc->be->ops->host_memory)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "observing the linears' inputs: backend "
                               "'%s' keeps them in its own memory",
                               fc->be->ops->name);
    for (int l = 0; fn && l < fc->m->cfg.n_layer; l++)
        for (int r = 0; r < COMET_ROLE_COUNT; r++)
            if (comet_model_linear(fc->m, l, (comet_role)r)->fmt == COMET_WFMT_QSIM)
                return comet_set_error(COMET_ERR_UNSUPPORTED,
                                       "observing the linears' inputs: "
                                       "layer %d holds a quantized linear, whose input is "
                                       "quantized before the matmul",
                                       l);
    fc->on_input = fn;
    fc->on_input_user = user;
    return COMET_OK;
}

comet_status comet_forward_check_batch(const comet_forward_ctx *fc, const comet_kv_cache *kv,
                                       const comet_batch *b) {
    const comet_model_config *c = &fc->m->cfg;
    if (b->n_tokens <= 0 || b->n_tokens > fc->max_tokens)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: step of %d tokens; the workspace holds 1..%d", b->n_tokens,
                               fc->max_tokens);
    COMET_ASSERT(kv->n_layer == c->n_layer && kv->n_head_kv == c->n_head_kv &&
                 kv->head_dim == c->head_dim);
    if (fc->be->ops->host_memory ? !kv->k && !kv->storage : !kv->storage)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: the KV cache has no storage of backend '%s' (make it "
                               "with comet_kv_cache_init_on for that backend)",
                               fc->be->ops->name);
    COMET_ASSERT(b->token_indptr[0] == 0 && b->token_indptr[b->n_seqs] == b->n_tokens);
    for (int i = 0; i < b->page_indptr[b->n_seqs]; i++)
        if (b->page_indices[i] < 0 || b->page_indices[i] >= kv->n_pages)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "forward: page id %d outside the KV pool of %d pages",
                                   b->page_indices[i], kv->n_pages);
    for (int s = 0; s < b->n_seqs; s++) {
        int kv_len = comet_batch_kv_len(b, kv->page_size, s);
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= vocab_total(fc->m))
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "forward: token id %d out of the vocabulary [0, %d)",
                                       b->tokens[t], vocab_total(fc->m));
            if (b->positions[t] < 0 || b->positions[t] >= kv_len)
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "forward: position %d outside the %d KV slots of "
                                       "sequence %d",
                                       b->positions[t], kv_len, s);
        }
    }
    for (int r = 0; r < b->n_logits; r++)
        COMET_ASSERT(b->logit_rows[r] >= 0 && b->logit_rows[r] < b->n_tokens);
    return COMET_OK;
}

/* The linears of group g of layer l (QKV: q, k, v; GATE_UP: gate, up) on fc->act into
 * ys[i]: one matmul_group where the backend has it, else one matmul per role. */
static comet_status group_matmul(comet_forward_ctx *fc, int l, comet_group g, int T,
                                 float *const *ys) {
    static const char *const names[COMET_ROLE_COUNT] = {
        "matmul q", "matmul k", "matmul v", "matmul o", "matmul gate", "matmul up", "matmul down"};
    const comet_backend_ops *op = fc->be->ops;
    if (op->matmul_group) {
        if (fc->on_op)
            fc->on_op(fc->on_op_user, g == COMET_GROUP_QKV ? "matmul qkv" : "matmul gate_up");
        return op->matmul_group(fc->be, fc->w, l, g, fc->act, T, ys);
    }
    comet_role roles[3];
    for (int i = 0, n = comet_group_roles(g, roles); i < n; i++) {
        if (fc->on_op)
            fc->on_op(fc->on_op_user, names[roles[i]]);
        COMET_TRY(op->matmul(fc->be, fc->w, l, roles[i], fc->act, T, ys[i]));
    }
    return COMET_OK;
}

/* buf [T, C] becomes the sum over the ranks of theirs (partial sums, or each rank's share
 * of the embeddings) when the model is split; nothing on one device. */
static comet_status sum_over_ranks(comet_forward_ctx *fc, float *buf, int T) {
    if (!fc->comm)
        return COMET_OK;
    if (fc->on_op)
        fc->on_op(fc->on_op_user, "all_reduce");
    return comet_comm_all_reduce(fc->comm, buf, (size_t)T * fc->m->cfg.n_embd);
}

/* The ops of one step, from the embedding to the lm_head (logits rows into lm_out). */
static comet_status run_ops(comet_forward_ctx *fc, comet_kv_cache *kv, const comet_batch *b,
                            const comet_step *st, float *lm_out) {
    const comet_model_config *c = &fc->m->cfg;
    const comet_backend_ops *op = fc->be->ops;
    comet_backend *be = fc->be;
    const comet_weights *w = fc->w;
    int T = b->n_tokens, H = c->n_head;
#define PROF(name)                                                                                 \
    do {                                                                                           \
        if (fc->on_op)                                                                             \
            fc->on_op(fc->on_op_user, (name));                                                     \
    } while (0)
#define OBSERVE(l, g)                                                                              \
    do {                                                                                           \
        if (fc->on_input)                                                                          \
            fc->on_input(fc->on_input_user, (l), (g), (const float *)fc->act, T);                  \
    } while (0)

    PROF("embed_tokens");
    COMET_TRY(op->embed_tokens(be, w, st, fc->x));
    COMET_TRY(sum_over_ranks(fc, fc->x, T)); /* a rank embeds its vocabulary rows' tokens */
    for (int l = 0; l < c->n_layer; l++) {
        PROF("rmsnorm_quant");
        COMET_TRY(
            op->rmsnorm_quant(be, w, l, COMET_GROUP_QKV, fc->x, l ? fc->tmp : NULL, T, fc->act));
        OBSERVE(l, COMET_GROUP_QKV);
        float *const qkv[3] = {fc->q, fc->k, fc->v};
        COMET_TRY(group_matmul(fc, l, COMET_GROUP_QKV, T, qkv));
        COMET_ASSERT(!c->qkv_bias); /* a q/k/v bias (Qwen2) is added here, before RoPE */
        if (op->rope_attention_quant && op->paged_attention_quant && !fc->att_cols) {
            /* RoPE, the KV append, attention and its quantization in one call (CUDA: a
             * decode step's RoPE and append inside its attention kernel) */
            PROF("rope_kv_append + paged_attention + act_quant");
            COMET_TRY(op->rope_attention_quant(be, kv, l, st, &fc->rope, fc->q, H, fc->k, fc->v,
                                               fc->att, w, fc->act));
        } else if (op->paged_attention_quant && !fc->att_cols) { /* one call, maybe one kernel */
            PROF("rope_kv_append");
            COMET_TRY(op->rope_kv_append(be, kv, l, st, &fc->rope, fc->q, H, fc->k, fc->v));
            PROF("paged_attention + act_quant");
            COMET_TRY(op->paged_attention_quant(be, kv, l, st, fc->q, H, fc->att, w, fc->act));
        } else {
            PROF("rope_kv_append");
            COMET_TRY(op->rope_kv_append(be, kv, l, st, &fc->rope, fc->q, H, fc->k, fc->v));
            PROF("paged_attention");
            COMET_TRY(op->paged_attention(be, kv, l, st, fc->q, H, fc->att));
            const float *att = fc->att;
            if (fc->att_cols) { /* a whole o_proj reads every rank's heads */
                PROF("gather heads");
                COMET_TRY(
                    comet_comm_gather_cols(fc->comm, fc->att, T, fc->att_cols, fc->att_full, -1));
                att = fc->att_full;
            }
            PROF("act_quant");
            COMET_TRY(op->act_quant(be, w, l, COMET_GROUP_O, att, T, fc->act));
        }
        OBSERVE(l, COMET_GROUP_O);
        PROF("matmul o");
        COMET_TRY(op->matmul(be, w, l, COMET_ROLE_O, fc->act, T, fc->tmp));
        if (!fc->att_cols) /* a split o_proj's partial sums over the ranks' heads */
            COMET_TRY(sum_over_ranks(fc, fc->tmp, T));
        COMET_ASSERT(!c->o_bias); /* an o bias is added here, once, after the ranks' sum */

        PROF("rmsnorm_quant");
        COMET_TRY(op->rmsnorm_quant(be, w, l, COMET_GROUP_GATE_UP, fc->x, fc->tmp, T, fc->act));
        OBSERVE(l, COMET_GROUP_GATE_UP);
        float *const gate_up[2] = {fc->gate, fc->up};
        COMET_TRY(group_matmul(fc, l, COMET_GROUP_GATE_UP, T, gate_up));
        COMET_ASSERT(!c->mlp_bias); /* gate/up biases here, down's after its ranks' sum */
        PROF("silu_mul_quant");
        COMET_TRY(op->silu_mul_quant(be, w, l, fc->gate, fc->up, T, fc->act));
        OBSERVE(l, COMET_GROUP_DOWN);
        PROF("matmul down");
        COMET_TRY(op->matmul(be, w, l, COMET_ROLE_DOWN, fc->act, T, fc->tmp));
        COMET_TRY(sum_over_ranks(fc, fc->tmp, T)); /* down's partial sums over FFN channels */
    }
    if (b->n_logits == 0)
        return COMET_OK;
    PROF("rmsnorm_quant");
    COMET_TRY(op->rmsnorm_quant(be, w, 0, COMET_GROUP_LM_HEAD, fc->x, fc->tmp, T, fc->act));
    PROF("lm_head");
    if (!fc->comm)
        return op->lm_head(be, w, fc->act, st, lm_out);
    COMET_TRY(op->lm_head(be, w, fc->act, st, fc->lm_part)); /* the rank's vocabulary rows */
    PROF("gather logits");
    return comet_comm_gather_cols(fc->comm, fc->lm_part, b->n_logits, fc->vocab_cols, lm_out, 0);
#undef OBSERVE
}

/* A decode step a backend may record as a graph: one token per sequence, logits for every
 * row in order. */
static int graph_step(const comet_batch *b) {
    if (b->n_tokens != b->n_seqs || b->n_logits != b->n_tokens)
        return 0;
    for (int r = 0; r < b->n_logits; r++)
        if (b->logit_rows[r] != r)
            return 0;
    return 1;
}

comet_status comet_forward(comet_forward_ctx *fc, comet_kv_cache *kv, const comet_batch *b,
                           float *logits) {
    const comet_model_config *c = &fc->m->cfg;
    const comet_backend_ops *op = fc->be->ops;
    comet_backend *be = fc->be;
    COMET_TRY(comet_forward_check_batch(fc, kv, b));
    comet_step st;
    PROF("step_begin");
    COMET_TRY(op->step_begin(be, b, &st));
    float *lm_out = op->host_memory ? logits : fc->logits;
    int mode = COMET_GRAPH_NONE;
    if (op->graph_begin && !fc->on_op && graph_step(b))
        COMET_TRY(op->graph_begin(be, fc, kv, &st, c->n_head, &mode));
    if (mode != COMET_GRAPH_REPLAYED) {
        comet_status ops = run_ops(fc, kv, b, &st, lm_out);
        int rerun = 0;
        if (mode == COMET_GRAPH_CAPTURING)
            ops = op->graph_end(be, ops, &rerun);
        if (rerun)
            ops = run_ops(fc, kv, b, &st, lm_out);
        COMET_TRY(ops);
    }
    if (b->n_logits == 0 || op->host_memory) {
        PROF(NULL);
        return op->sync(be);
    }
    if (!logits) { /* they stay in the backend's memory (comet_forward_logits) */
        PROF(NULL);
        return COMET_OK;
    }
    PROF("logits download");
    COMET_TRY(op->download(be, logits, fc->logits,
                           (size_t)b->n_logits * vocab_total(fc->m) * sizeof(float)));
    PROF(NULL);
    return COMET_OK;
#undef PROF
}
#undef PROF

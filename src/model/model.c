/* model.c — comet_model lifetime (free, owned-buffer registry), config and variant
 * validation, the architecture and KV rotation names.
 *
 * Loaders (src/format/) fill a comet_model; this file only knows the struct. Weight
 * buffers are registered with comet_model_own and released together; the layer array,
 * tokenizer, chat template, name and path are released directly.
 */
#include "comet/model.h"

#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"
#include "numerics/quant.h"

void comet_model_free(comet_model *m) {
    if (!m)
        return;
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    comet_tokenizer_free(m->tok);
    free(m->chat_template);
    free(m->name);
    free(m->path);
    free(m);
}

void *comet_model_own(comet_model *m, void *p) {
    if (!p)
        return NULL;
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) {
            free(p);
            return NULL;
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

/* Free p, a buffer of m's registry, before the model: its slot becomes NULL. */
static void release_owned(comet_model *m, void *p) {
    for (size_t i = 0; i < m->n_owned; i++)
        if (m->owned[i] == p) {
            free(p);
            m->owned[i] = NULL;
            return;
        }
}

comet_status comet_model_lm_head_quantize(comet_model *m) {
    const int C = m->cfg.n_embd, V = m->cfg.n_vocab;
    const float *w32 = m->lm_head ? m->lm_head : m->tok_embd;
    const uint16_t *w16 = m->lm_head_f16 ? m->lm_head_f16 : m->tok_embd_f16;
    if (!w32 && !w16)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "lm_head quantize: the model has no lm_head in host memory");
    int8_t *q = comet_model_own(m, malloc((size_t)V * C));
    uint16_t *s = comet_model_own(m, malloc((size_t)V * sizeof *s));
    float *row = w32 ? NULL : malloc((size_t)C * sizeof *row);
    if (!q || !s || (!w32 && !row)) {
        free(row);
        return comet_set_error(COMET_ERR_NOMEM, "lm_head quantize: out of memory");
    }
    for (int v = 0; v < V; v++) {
        const float *w = w32 ? w32 + (size_t)v * C : row;
        for (int c = 0; !w32 && c < C; c++)
            row[c] = comet_quant_f16_value(w16[(size_t)v * C + c]);
        s[v] = comet_quant_lm_head_row(w, C, q + (size_t)v * C);
    }
    free(row);
    m->lm_head_q8 = q;
    m->lm_head_s8 = s;
    m->lm_head_bits = 8;
    if (!w32 && m->lm_head_f16 != m->tok_embd_f16) { /* an untied fp16 copy nothing reads now */
        release_owned(m, m->lm_head_f16);
        m->lm_head_f16 = NULL;
    }
    return COMET_OK;
}

const char *comet_arch_name(int arch) {
    switch (arch) {
    case COMET_ARCH_LLAMA: return "llama";
    }
    return NULL;
}

comet_status comet_model_variant_check(const comet_model_config *c, const char *src) {
    if (!comet_arch_name((int)c->arch))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: arch %d is not a comet_arch; supported: llama", src,
                               (int)c->arch);
    /* A bias would be one more op after its linear in forward.c on every backend; until one
     * exists, a model that has biases is refused rather than run without them. */
    const struct {
        int set;
        const char *flag, *what;
    } bias[] = {
        {c->qkv_bias, "qkv_bias", "q/k/v projections with a bias (Qwen2, attention_bias)"},
        {c->o_bias, "o_bias", "an o_proj bias (attention_bias)"},
        {c->mlp_bias, "mlp_bias", "gate/up/down projections with a bias (mlp_bias)"},
    };
    for (size_t i = 0; i < sizeof bias / sizeof bias[0]; i++)
        if (bias[i].set)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: %s: %s %s is not supported; no backend adds a "
                                   "linear's bias (supported: LLaMA linears without bias)",
                                   src, bias[i].flag, comet_arch_name((int)c->arch), bias[i].what);
    return COMET_OK;
}

comet_status comet_model_config_check(const comet_model_config *c, const char *src) {
#define CHECK(cond, field, fmt, ...)                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return comet_set_error(COMET_ERR_FORMAT, "%s: %s " fmt, src, field, __VA_ARGS__);      \
    } while (0)
    CHECK(c->n_layer > 0, "n_layer", "must be positive, got %d", c->n_layer);
    /* the deepest LLaMA-family model (3.1-405B) has 126 layers; a file claiming millions
     * would have the loader allocate its layer table before any tensor is checked */
    CHECK(c->n_layer <= 1024, "n_layer", "%d is beyond any supported model (at most 1024)",
          c->n_layer);
    CHECK(c->n_embd > 0, "n_embd", "must be positive, got %d", c->n_embd);
    CHECK(c->n_ff > 0, "n_ff", "must be positive, got %d", c->n_ff);
    CHECK(c->n_head > 0, "n_head", "must be positive, got %d", c->n_head);
    CHECK(c->n_head_kv > 0, "n_head_kv", "must be positive, got %d", c->n_head_kv);
    CHECK(c->n_head % c->n_head_kv == 0, "n_head_kv",
          "query heads (%d) must be a multiple of KV heads (%d)", c->n_head, c->n_head_kv);
    CHECK(c->head_dim > 0 && c->head_dim % 2 == 0, "head_dim",
          "must be positive and even (RoPE rotates pairs), got %d", c->head_dim);
    CHECK(c->n_vocab > 0, "n_vocab", "must be positive, got %d", c->n_vocab);
    CHECK(c->n_ctx > 0, "n_ctx", "must be positive, got %d", c->n_ctx);
    CHECK(c->rms_eps > 0.0f && c->rms_eps < 1.0f, "rms_eps", "must be in (0, 1), got %g",
          (double)c->rms_eps);
    CHECK(c->rope_theta > 0.0f, "rope_theta", "must be positive, got %g", (double)c->rope_theta);
    CHECK((unsigned)c->rope_scaling < COMET_ROPE_SCALING_COUNT, "rope_scaling", "invalid value %d",
          (int)c->rope_scaling);
    if (c->rope_scaling != COMET_ROPE_SCALING_NONE)
        CHECK(c->rope_factor > 0.0f, "rope_factor", "must be positive, got %g",
              (double)c->rope_factor);
    if (c->rope_scaling == COMET_ROPE_SCALING_LLAMA3) {
        CHECK(c->rope_orig_ctx > 0, "rope_orig_ctx", "must be positive, got %d", c->rope_orig_ctx);
        CHECK(c->rope_high_freq_factor > c->rope_low_freq_factor, "rope_high_freq_factor",
              "must exceed low_freq_factor (%g <= %g)", (double)c->rope_high_freq_factor,
              (double)c->rope_low_freq_factor);
    }
    CHECK(c->bos_id >= -1 && c->bos_id < c->n_vocab, "bos_id",
          "%d is outside the vocabulary "
          "of %d tokens",
          (int)c->bos_id, c->n_vocab);
    CHECK(c->n_eos >= 0 && c->n_eos <= COMET_MAX_EOS, "n_eos", "must be in 0..%d, got %d",
          COMET_MAX_EOS, c->n_eos);
    for (int i = 0; i < c->n_eos; i++)
        CHECK(c->eos_ids[i] >= 0 && c->eos_ids[i] < c->n_vocab, "eos_ids",
              "%d is outside the vocabulary of %d tokens", (int)c->eos_ids[i], c->n_vocab);
    /* Products the loaders and backends form in size_t/int64 must stay far from overflow. */
    CHECK((int64_t)c->n_vocab * c->n_embd < ((int64_t)1 << 40), "n_vocab",
          "%d x n_embd %d is too large", c->n_vocab, c->n_embd);
    CHECK((int64_t)c->n_ff * c->n_embd < ((int64_t)1 << 40), "n_ff", "%d x n_embd %d is too large",
          c->n_ff, c->n_embd);
    CHECK((int64_t)c->n_head * c->head_dim * c->n_embd < ((int64_t)1 << 40), "n_head",
          "%d x head_dim %d x n_embd %d is too large", c->n_head, c->head_dim, c->n_embd);
#undef CHECK
    return comet_model_variant_check(c, src);
}

/* gguf_model.c — a LLaMA model from a GGUF file (comet_load_gguf, loader.h): llama.* keys
 * to comet_model_config, the tokenizer from tokenizer.ggml.*, and the tensors converted to
 * fp32 through the shared weight walk (loader.c), which undoes the Q/K row permutation
 * llama.cpp's converter applies (model.h: weights are held in HF order).
 * Bias tensors set the config's bias flags (comet_model_variant_check refuses them).
 * What this does not do: architectures other than llama, partial rotary.
 */
#include "format/loader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/log.h"
#include "comet/tokenizer.h"
#include "format/gguf.h"

static comet_status gguf_fetch(comet_wsource *s, const char *name, int64_t rows, int64_t cols,
                               float *dst) {
    const comet_gguf *g = s->impl;
    const comet_gguf_tensor *t = comet_gguf_find_tensor(g, name);
    if (!t)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor '%s' missing", g->name, name);
    /* ggml shapes are [ne0 = cols, ne1 = rows]. */
    int64_t want0 = cols ? cols : rows, want1 = cols ? rows : 1;
    if (t->ne[0] != want0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
                               "[%lld, %lld] (ggml order: row length first)",
                               g->name, name, (long long)t->ne[0], (long long)t->ne[1],
                               (long long)t->ne[2], (long long)t->ne[3], (long long)want0,
                               (long long)want1);
    if (!dst)
        return comet_gguf_type_supported(t->type) ? COMET_OK : comet_gguf_dequant(g, t, NULL);
    return comet_gguf_dequant(g, t, dst);
}

/* Optional integer key: *out unchanged when absent. */
static comet_status opt_i32(const comet_gguf *g, const char *key, int32_t *out) {
    if (!comet_gguf_find(g, key))
        return COMET_OK;
    int64_t v;
    COMET_TRY(comet_gguf_get_i64(g, key, &v));
    if (v < INT32_MIN || v > INT32_MAX)
        return comet_set_error(COMET_ERR_FORMAT, "%s: metadata key '%s' = %lld out of range",
                               g->name, key, (long long)v);
    *out = (int32_t)v;
    return COMET_OK;
}

static comet_status opt_f32(const comet_gguf *g, const char *key, float *out) {
    return comet_gguf_find(g, key) ? comet_gguf_get_f32(g, key, out) : COMET_OK;
}

static comet_status req_int(const comet_gguf *g, const char *key, int *out) {
    uint32_t v;
    COMET_TRY(comet_gguf_get_u32(g, key, &v));
    if (v > INT32_MAX)
        return comet_set_error(COMET_ERR_FORMAT, "%s: metadata key '%s' = %u out of range", g->name,
                               key, v);
    *out = (int)v;
    return COMET_OK;
}

/* llama.cpp stores Llama-3.1 RoPE scaling as a rope_freqs.weight tensor of per-frequency
 * divisors instead of the parameters. Recover factor (its maximum) and check that the
 * tensor equals the Llama-3 formula with low/high frequency factors 1 and 4 (the values
 * every Llama-3.x release uses) and the original context from the metadata or 8192. */
static comet_status gguf_rope_freqs(const comet_gguf *g, comet_model_config *c) {
    const comet_gguf_tensor *t = comet_gguf_find_tensor(g, "rope_freqs.weight");
    if (t->n_elements != c->head_dim / 2)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor 'rope_freqs.weight' has %lld values, "
                               "expected head_dim/2 = %d",
                               g->name, (long long)t->n_elements, c->head_dim / 2);
    float f[512];
    if (t->n_elements > 512)
        return comet_set_error(COMET_ERR_UNSUPPORTED, "%s: rope_freqs.weight too long", g->name);
    COMET_TRY(comet_gguf_dequant(g, t, f));
    float factor = 0.0f;
    for (int i = 0; i < c->head_dim / 2; i++)
        factor = f[i] > factor ? f[i] : factor;
    int32_t orig = 8192;
    COMET_TRY(opt_i32(g, "llama.rope.scaling.original_context_length", &orig));
    const double lo = 1.0, hi = 4.0, pi = 3.14159265358979323846;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double freq = 1.0 / pow((double)c->rope_theta, 2.0 * i / c->head_dim);
        double wavelen = 2.0 * pi / freq, want;
        if (wavelen < orig / hi) {
            want = 1.0;
        } else if (wavelen > orig / lo) {
            want = factor;
        } else {
            double smooth = (orig / wavelen - lo) / (hi - lo);
            want = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        if (fabs(f[i] - want) > 1e-3 * want)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: rope_freqs.weight[%d] = %g does not match Llama-3 RoPE "
                                   "scaling (expected %g); other frequency scalings are not "
                                   "supported",
                                   g->name, i, (double)f[i], want);
    }
    c->rope_scaling = COMET_ROPE_SCALING_LLAMA3;
    c->rope_factor = factor;
    c->rope_low_freq_factor = (float)lo;
    c->rope_high_freq_factor = (float)hi;
    c->rope_orig_ctx = orig;
    return COMET_OK;
}

/* GGUF has no bias keys: llama.cpp's llama graph adds a bias wherever a layer holds the
 * tensor (blk.N.attn_q.bias, ...), so the flags say whether any layer holds one. */
static void gguf_bias_flags(const comet_gguf *g, comet_model_config *c) {
    const struct {
        const char *suffix;
        int *flag;
    } bias[] = {
        {".attn_q.bias", &c->qkv_bias},   {".attn_k.bias", &c->qkv_bias},
        {".attn_v.bias", &c->qkv_bias},   {".attn_output.bias", &c->o_bias},
        {".ffn_gate.bias", &c->mlp_bias}, {".ffn_up.bias", &c->mlp_bias},
        {".ffn_down.bias", &c->mlp_bias},
    };
    for (size_t t = 0; t < g->n_tensors; t++) {
        const char *name = g->tensors[t].name;
        size_t n = strlen(name);
        if (strncmp(name, "blk.", 4) != 0)
            continue;
        for (size_t i = 0; i < sizeof bias / sizeof bias[0]; i++) {
            size_t k = strlen(bias[i].suffix);
            if (n > k && !strcmp(name + n - k, bias[i].suffix))
                *bias[i].flag = 1;
        }
    }
}

static comet_status gguf_config(const comet_gguf *g, comet_model_config *c) {
    comet_gguf_str arch;
    COMET_TRY(comet_gguf_get_str(g, "general.architecture", &arch));
    COMET_TRY(comet_arch_parse(arch.s, arch.len, COMET_WNAMES_GGUF, g->name, &c->arch));
    COMET_TRY(req_int(g, "llama.block_count", &c->n_layer));
    COMET_TRY(req_int(g, "llama.embedding_length", &c->n_embd));
    COMET_TRY(req_int(g, "llama.feed_forward_length", &c->n_ff));
    COMET_TRY(req_int(g, "llama.attention.head_count", &c->n_head));
    c->n_head_kv = c->n_head;
    if (comet_gguf_find(g, "llama.attention.head_count_kv"))
        COMET_TRY(req_int(g, "llama.attention.head_count_kv", &c->n_head_kv));
    COMET_TRY(req_int(g, "llama.context_length", &c->n_ctx));
    COMET_TRY(comet_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps));
    c->rope_theta = 10000.0f;
    COMET_TRY(opt_f32(g, "llama.rope.freq_base", &c->rope_theta));
    if (c->n_head <= 0)
        return comet_set_error(COMET_ERR_FORMAT, "%s: llama.attention.head_count is 0", g->name);
    c->head_dim = c->n_embd / c->n_head;
    if (comet_gguf_find(g, "llama.attention.key_length"))
        COMET_TRY(req_int(g, "llama.attention.key_length", &c->head_dim));
    if (comet_gguf_find(g, "llama.attention.value_length")) {
        int vl = 0;
        COMET_TRY(req_int(g, "llama.attention.value_length", &vl));
        if (vl != c->head_dim)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: llama.attention.value_length %d "
                                   "differs from key_length %d",
                                   g->name, vl, c->head_dim);
    }
    if (comet_gguf_find(g, "llama.rope.dimension_count")) {
        int rd = 0;
        COMET_TRY(req_int(g, "llama.rope.dimension_count", &rd));
        if (rd != c->head_dim)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: llama.rope.dimension_count %d: "
                                   "partial rotary (head_dim %d) is not supported",
                                   g->name, rd, c->head_dim);
    }
    if (comet_gguf_find(g, "llama.expert_count")) {
        int ne = 0;
        COMET_TRY(req_int(g, "llama.expert_count", &ne));
        if (ne > 0)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: mixture-of-experts llama "
                                   "(llama.expert_count = %d) is not supported",
                                   g->name, ne);
    }
    /* RoPE scaling: llama.rope.scaling.type ("none", "linear", ...) + factor, the older
     * llama.rope.scale_linear, or Llama-3's rope_freqs.weight tensor. */
    c->rope_scaling = COMET_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    const comet_gguf_kv *st = comet_gguf_find(g, "llama.rope.scaling.type");
    if (st) {
        comet_gguf_str s;
        COMET_TRY(comet_gguf_get_str(g, "llama.rope.scaling.type", &s));
        if (s.len == 6 && memcmp(s.s, "linear", 6) == 0) {
            c->rope_scaling = COMET_ROPE_SCALING_LINEAR;
            COMET_TRY(comet_gguf_get_f32(g, "llama.rope.scaling.factor", &c->rope_factor));
        } else if (!(s.len == 4 && memcmp(s.s, "none", 4) == 0)) {
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: llama.rope.scaling.type '%.*s' is "
                                   "not supported; supported: none, linear, llama3 "
                                   "(rope_freqs.weight)",
                                   g->name, (int)(s.len > 32 ? 32 : s.len), s.s);
        }
    } else if (comet_gguf_find(g, "llama.rope.scale_linear")) {
        COMET_TRY(comet_gguf_get_f32(g, "llama.rope.scale_linear", &c->rope_factor));
        if (c->rope_factor != 1.0f)
            c->rope_scaling = COMET_ROPE_SCALING_LINEAR;
    }
    if (comet_gguf_find_tensor(g, "rope_freqs.weight")) {
        if (c->rope_scaling != COMET_ROPE_SCALING_NONE)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: both rope scaling keys and "
                                   "rope_freqs.weight are present",
                                   g->name);
        if (c->head_dim <= 0 || c->head_dim % 2)
            return comet_set_error(COMET_ERR_FORMAT, "%s: head_dim %d must be positive and even",
                                   g->name, c->head_dim);
        COMET_TRY(gguf_rope_freqs(g, c));
    }
    c->tie_embeddings = comet_gguf_find_tensor(g, "output.weight") == NULL;
    gguf_bias_flags(g, c);
    return COMET_OK;
}

/* Build the tokenizer from tokenizer.ggml.* and fill the token-related config. */
static comet_status gguf_tokenizer(const comet_gguf *g, comet_model *m) {
    comet_model_config *c = &m->cfg;
    if (!comet_gguf_find(g, "tokenizer.ggml.tokens"))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s has no tokenizer (tokenizer.ggml.tokens "
                               "missing); comet needs a GGUF with its vocabulary",
                               g->name);
    comet_gguf_str model;
    COMET_TRY(comet_gguf_get_str(g, "tokenizer.ggml.model", &model));
    comet_vocab_desc d;
    memset(&d, 0, sizeof d);
    if (model.len == 4 && memcmp(model.s, "gpt2", 4) == 0)
        d.type = COMET_TOK_BPE;
    else if (model.len == 5 && memcmp(model.s, "llama", 5) == 0)
        d.type = COMET_TOK_SPM;
    else
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tokenizer.ggml.model '%.*s' is not "
                               "supported; supported: gpt2 (byte-level BPE), llama "
                               "(SentencePiece BPE)",
                               g->name, (int)(model.len > 32 ? 32 : model.len), model.s);
    const comet_gguf_kv *tokens_kv, *kv;
    COMET_TRY(comet_gguf_get_arr(g, "tokenizer.ggml.tokens", COMET_GGUF_STRING, &tokens_kv));
    if (tokens_kv->arr_n == 0 || tokens_kv->arr_n > INT32_MAX)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                               g->name, (unsigned long long)tokens_kv->arr_n);
    int n = (int)tokens_kv->arr_n;
    c->n_vocab = n;
    char **tokens = NULL, **merges = NULL, *pre = NULL;
    int32_t *attr = NULL;
    float *scores = NULL;
    comet_status st = comet_gguf_arr_strings(tokens_kv, &tokens);
    if (st < 0)
        goto done;
    if ((kv = comet_gguf_find(g, "tokenizer.ggml.token_type"))) {
        if (kv->type != COMET_GGUF_ARRAY || kv->arr_n != (uint64_t)n) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tokenizer.ggml.token_type must be an "
                                 "array of %d integers",
                                 g->name, n);
            goto done;
        }
        if (!(attr = malloc((size_t)n * sizeof *attr))) {
            st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", g->name);
            goto done;
        }
        if ((st = comet_gguf_arr_i32(kv, attr)) < 0)
            goto done;
    }
    if ((kv = comet_gguf_find(g, "tokenizer.ggml.scores"))) {
        if (kv->type != COMET_GGUF_ARRAY || kv->arr_n != (uint64_t)n) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tokenizer.ggml.scores must be an array "
                                 "of %d floats",
                                 g->name, n);
            goto done;
        }
        if (!(scores = malloc((size_t)n * sizeof *scores))) {
            st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", g->name);
            goto done;
        }
        if ((st = comet_gguf_arr_f32(kv, scores)) < 0)
            goto done;
    }
    if ((kv = comet_gguf_find(g, "tokenizer.ggml.merges"))) {
        if ((st = comet_gguf_get_arr(g, "tokenizer.ggml.merges", COMET_GGUF_STRING, &kv)) < 0 ||
            (st = comet_gguf_arr_strings(kv, &merges)) < 0)
            goto done;
        if (kv->arr_n > INT32_MAX) {
            st = comet_set_error(COMET_ERR_FORMAT, "%s: too many merges", g->name);
            goto done;
        }
        d.n_merges = (int)kv->arr_n;
    }
    if (comet_gguf_find(g, "tokenizer.ggml.pre")) {
        comet_gguf_str s;
        if ((st = comet_gguf_get_str(g, "tokenizer.ggml.pre", &s)) < 0)
            goto done;
        if (!(pre = comet_gguf_strdup(s))) {
            st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", g->name);
            goto done;
        }
    }
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
    if ((st = opt_i32(g, "tokenizer.ggml.bos_token_id", &bos)) < 0 ||
        (st = opt_i32(g, "tokenizer.ggml.eos_token_id", &eos)) < 0 ||
        (st = opt_i32(g, "tokenizer.ggml.unknown_token_id", &unk)) < 0 ||
        (st = opt_i32(g, "tokenizer.ggml.padding_token_id", &pad)) < 0 ||
        (st = opt_i32(g, "tokenizer.ggml.eot_token_id", &eot)) < 0 ||
        (st = opt_i32(g, "tokenizer.ggml.eom_token_id", &eom)) < 0)
        goto done;
    const int32_t ids[] = {bos, eos, unk, pad, eot, eom};
    const char *const id_keys[] = {"bos_token_id",     "eos_token_id", "unknown_token_id",
                                   "padding_token_id", "eot_token_id", "eom_token_id"};
    for (int i = 0; i < 6; i++)
        if (ids[i] < -1 || ids[i] >= n) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tokenizer.ggml.%s = %d is outside the "
                                 "vocabulary of %d tokens",
                                 g->name, id_keys[i], (int)ids[i], n);
            goto done;
        }
    /* llama.cpp's defaults when add_bos_token is absent: SentencePiece and Llama-3 BPE
     * vocabularies add BOS, other BPE vocabularies do not. */
    int add_bos = d.type == COMET_TOK_SPM ||
                  (pre && (strcmp(pre, "llama3") == 0 || strcmp(pre, "llama-bpe") == 0));
    if (comet_gguf_find(g, "tokenizer.ggml.add_bos_token") &&
        (st = comet_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos)) < 0)
        goto done;
    int add_space_prefix = 1;
    if (comet_gguf_find(g, "tokenizer.ggml.add_space_prefix") &&
        (st = comet_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix)) < 0)
        goto done;
    d.no_space_prefix = !add_space_prefix;
    c->bos_id = bos;
    c->add_bos = add_bos && bos >= 0;
    c->n_eos = 0;
    comet_config_add_eos(c, eos);
    comet_config_add_eos(c, eot);
    comet_config_add_eos(c, eom);

    d.n_tokens = n;
    d.tokens = (const char *const *)tokens;
    d.token_attr = attr;
    d.scores = scores;
    d.merges = (const char *const *)merges;
    d.pre = pre;
    d.bos_id = bos;
    d.eos_id = eos;
    d.unk_id = unk;
    d.pad_id = pad;
    m->tok = comet_tokenizer_init(&d);
    if (!m->tok) {
        /* Keep the message one line: token text from the file may hold control bytes. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", comet_last_error());
        for (char *q = msg; *q; q++)
            if ((unsigned char)*q < 0x20 || *q == 0x7f)
                *q = '?';
        st = comet_set_error(COMET_ERR_FORMAT, "%s: %s%s", g->name,
                             strncmp(msg, "tokenizer", 9) ? "tokenizer: " : "", msg);
        goto done;
    }
    comet_config_add_end_markers(c, m->tok);
    if (comet_gguf_find(g, "tokenizer.chat_template")) {
        comet_gguf_str s;
        if ((st = comet_gguf_get_str(g, "tokenizer.chat_template", &s)) < 0)
            goto done;
        if (!(m->chat_template = comet_gguf_strdup(s)))
            st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", g->name);
    }
done:
    free(tokens);
    free(merges);
    free(attr);
    free(scores);
    free(pre);
    return st;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

comet_status comet_load_gguf(const char *path, comet_model **out) {
    comet_gguf *g = NULL;
    COMET_TRY(comet_gguf_open(path, &g));
    comet_model *m = calloc(1, sizeof *m);
    comet_status st = COMET_OK;
    if (!m || !(m->path = strdup(path))) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((st = gguf_config(g, &m->cfg)) < 0 || (st = gguf_tokenizer(g, m)) < 0 ||
        (st = comet_model_config_check(&m->cfg, path)) < 0)
        goto fail;
    comet_gguf_str nm;
    if (comet_gguf_find(g, "general.name") &&
        comet_gguf_get_str(g, "general.name", &nm) == COMET_OK)
        m->name = comet_gguf_strdup(nm);
    else
        m->name = strdup(base_name(path));
    if (!m->name) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    comet_log(COMET_LOG_INFO, "%s: llama, %d layers, C=%d, F=%d, H=%d/%d, D=%d, V=%d", path,
              m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_ff, m->cfg.n_head, m->cfg.n_head_kv,
              m->cfg.head_dim, m->cfg.n_vocab);
    comet_wsource src = {COMET_WNAMES_GGUF, gguf_fetch, g};
    if ((st = comet_load_weights(m, &src)) < 0)
        goto fail;
    comet_gguf_free(g);
    *out = m;
    return COMET_OK;
fail:
    comet_model_free(m);
    comet_gguf_free(g);
    return st;
}

/* loader.c — comet_model_load: which reader a path takes, and what the readers share (the
 * architectures each source names, the weight walk that checks and converts every LLaMA
 * tensor, the end-of-turn ids).
 *
 * Dispatch: a path ending in .gguf or starting with the GGUF magic is a GGUF file
 * (gguf_model.c); a directory with config.json is an HF checkpoint (hf.c), or the comet
 * quantized checkpoint when its config.json has a quantization_config (checkpoint_read.c).
 */
#include "format/loader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comet/log.h"
#include "comet/tokenizer.h"
#include "format/checkpoint.h"

/* ---- architecture names --------------------------------------------------------- */

/* Each source's spelling of the architectures comet runs. */
static const struct {
    comet_wnames names;
    const char *name;
    comet_arch arch;
} arch_names[] = {
    {COMET_WNAMES_GGUF, "llama", COMET_ARCH_LLAMA},
    {COMET_WNAMES_HF, "LlamaForCausalLM", COMET_ARCH_LLAMA},
    {COMET_WNAMES_HF, "MistralForCausalLM", COMET_ARCH_LLAMA},
};

comet_status comet_arch_parse(const char *name, size_t len, comet_wnames names, const char *src,
                              comet_arch *out) {
    char supported[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++) {
        if (arch_names[i].names != names)
            continue;
        if (strlen(arch_names[i].name) == len && !memcmp(arch_names[i].name, name, len)) {
            *out = arch_names[i].arch;
            return COMET_OK;
        }
        n += (size_t)snprintf(supported + n, sizeof supported - n, "%s%s", n ? ", " : "",
                              arch_names[i].name);
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "%s: architecture '%.*s' is not supported; supported: %s", src,
                           (int)(len > 64 ? 64 : len), name, supported);
}

/* ---- the shared weight walk -------------------------------------------------------- */

typedef enum wrole {
    W_ATTN_NORM,
    W_Q,
    W_K,
    W_V,
    W_O,
    W_FFN_NORM,
    W_GATE,
    W_UP,
    W_DOWN,
    W_LAYER_COUNT
} wrole;

static const char *const layer_names[2][W_LAYER_COUNT] = {
    [COMET_WNAMES_GGUF] = {"blk.%d.attn_norm.weight", "blk.%d.attn_q.weight",
                           "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
                           "blk.%d.attn_output.weight", "blk.%d.ffn_norm.weight",
                           "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
                           "blk.%d.ffn_down.weight"},
    [COMET_WNAMES_HF] =
        {"model.layers.%d.input_layernorm.weight", "model.layers.%d.self_attn.q_proj.weight",
         "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
         "model.layers.%d.self_attn.o_proj.weight",
         "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
         "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight"},
};
static const char *const embd_names[2] = {"token_embd.weight", "model.embed_tokens.weight"};
static const char *const norm_names[2] = {"output_norm.weight", "model.norm.weight"};
static const char *const head_names[2] = {"output.weight", "lm_head.weight"};

comet_status comet_unpermute_qk(float *w, int n_head, int head_dim, int64_t cols) {
    size_t row = (size_t)cols * sizeof(float);
    float *tmp = malloc((size_t)head_dim * row);
    if (!tmp)
        return comet_set_error(COMET_ERR_NOMEM, "out of memory undoing the Q/K permutation");
    int half = head_dim / 2;
    for (int h = 0; h < n_head; h++) {
        float *hw = w + (size_t)h * head_dim * cols;
        memcpy(tmp, hw, (size_t)head_dim * row);
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(hw + (size_t)(j * half + i) * cols, tmp + (size_t)(2 * i + j) * cols, row);
    }
    free(tmp);
    return COMET_OK;
}

/* Check `name`, then allocate [rows * max(cols, 1)] floats owned by the model and fetch
 * it into them. */
static comet_status fetch_owned(comet_model *m, comet_wsource *src, const char *name, int64_t rows,
                                int64_t cols, float **out) {
    COMET_TRY(src->fetch(src, name, rows, cols, NULL));
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    float *p = comet_model_own(m, malloc(n * sizeof(float)));
    if (!p)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory for tensor '%s' (%zu floats)",
                               m->path, name, n);
    *out = p;
    return src->fetch(src, name, rows, cols, p);
}

static void set_linear(comet_linear *l, int n_out, int n_in, float *w) {
    l->n_out = n_out;
    l->n_in = n_in;
    l->fmt = COMET_WFMT_F32;
    l->w = w;
}

comet_status comet_load_weights(comet_model *m, comet_wsource *src) {
    const comet_model_config *c = &m->cfg;
    int nm = src->names;
    int C = c->n_embd, F = c->n_ff, D = c->head_dim, H = c->n_head, Hkv = c->n_head_kv;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", m->path);
    long total = 2 + (c->tie_embeddings ? 0 : 1) + (long)W_LAYER_COUNT * c->n_layer, done = 0;

    COMET_TRY(fetch_owned(m, src, embd_names[nm], c->n_vocab, C, &m->tok_embd));
    comet_log_progress("loading tensors", ++done, total, NULL);
    COMET_TRY(fetch_owned(m, src, norm_names[nm], C, 0, &m->output_norm));
    comet_log_progress("loading tensors", ++done, total, NULL);
    if (c->tie_embeddings) {
        m->lm_head = m->tok_embd;
    } else {
        COMET_TRY(fetch_owned(m, src, head_names[nm], c->n_vocab, C, &m->lm_head));
        comet_log_progress("loading tensors", ++done, total, NULL);
    }
    /* [rows, cols] of each role; cols 0 = 1-D. */
    const int64_t shape[W_LAYER_COUNT][2] = {
        [W_ATTN_NORM] = {C, 0},
        [W_Q] = {(int64_t)H * D, C},
        [W_K] = {(int64_t)Hkv * D, C},
        [W_V] = {(int64_t)Hkv * D, C},
        [W_O] = {C, (int64_t)H * D},
        [W_FFN_NORM] = {C, 0},
        [W_GATE] = {F, C},
        [W_UP] = {F, C},
        [W_DOWN] = {C, F},
    };
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *L = &m->layers[l];
        float *w[W_LAYER_COUNT];
        for (int r = 0; r < W_LAYER_COUNT; r++) {
            char name[96];
            snprintf(name, sizeof name, layer_names[nm][r], l);
            COMET_TRY(fetch_owned(m, src, name, shape[r][0], shape[r][1], &w[r]));
            if (nm == COMET_WNAMES_GGUF && (r == W_Q || r == W_K))
                COMET_TRY(comet_unpermute_qk(w[r], r == W_Q ? H : Hkv, D, C));
            comet_log_progress("loading tensors", ++done, total, NULL);
        }
        L->attn_norm = w[W_ATTN_NORM];
        L->ffn_norm = w[W_FFN_NORM];
        set_linear(&L->wq, H * D, C, w[W_Q]);
        set_linear(&L->wk, Hkv * D, C, w[W_K]);
        set_linear(&L->wv, Hkv * D, C, w[W_V]);
        set_linear(&L->wo, C, H * D, w[W_O]);
        set_linear(&L->w_gate, F, C, w[W_GATE]);
        set_linear(&L->w_up, F, C, w[W_UP]);
        set_linear(&L->w_down, C, F, w[W_DOWN]);
    }
    return COMET_OK;
}

void comet_config_add_eos(comet_model_config *cfg, int32_t id) {
    if (id < 0)
        return;
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id)
            return;
    if (cfg->n_eos < COMET_MAX_EOS)
        cfg->eos_ids[cfg->n_eos++] = id;
}

/* Texts of control tokens that end a turn or a document in the chat formats comet knows
 * (Llama-3, ChatML, Phi-3, Llama-2/SentencePiece, GPT-2 style). Generation stops at these
 * whatever the metadata names as EOS, as llama.cpp's end-of-generation set does: Llama-3
 * files name one of <|end_of_text|> / <|eot_id|> and the model emits the other. */
static const char *const end_markers[] = {
    "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "</s>", "<|end|>",
};

void comet_config_add_end_markers(comet_model_config *cfg, const comet_tokenizer *tok) {
    if (!tok)
        return;
    int n = comet_tokenizer_n_vocab(tok);
    for (int32_t id = 0; id < n; id++) {
        if (comet_tokenizer_token_attr(tok, id) != COMET_TOKEN_CONTROL)
            continue;
        char buf[32];
        int len = comet_tokenizer_token_bytes(tok, id, 1, buf, sizeof buf);
        if (len <= 0 || (size_t)len >= sizeof buf)
            continue;
        for (size_t i = 0; i < sizeof end_markers / sizeof end_markers[0]; i++) {
            if (strlen(end_markers[i]) != (size_t)len || memcmp(buf, end_markers[i], (size_t)len))
                continue;
            if (cfg->n_eos == COMET_MAX_EOS) {
                int have = 0;
                for (int k = 0; k < cfg->n_eos; k++)
                    have |= cfg->eos_ids[k] == id;
                if (!have)
                    comet_log(COMET_LOG_WARN,
                              "end-of-generation set full (%d ids): token %d "
                              "'%s' not added",
                              COMET_MAX_EOS, (int)id, end_markers[i]);
            }
            comet_config_add_eos(cfg, id);
            break;
        }
    }
}

/* ---- dispatch ---------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char b[4];
    int ok = fread(b, 1, 4, f) == 4 && memcmp(b, "GGUF", 4) == 0;
    fclose(f);
    return ok;
}

comet_model_load_params comet_model_default_load_params(void) {
    comet_model_load_params p = {.keep_codes_only = 0};
    return p;
}

comet_status comet_model_load(const char *path, comet_model **out) {
    return comet_model_load_with(path, NULL, out);
}

comet_status comet_model_load_with(const char *path, const comet_model_load_params *p,
                                   comet_model **out) {
    comet_model_load_params dp = comet_model_default_load_params();
    if (!p)
        p = &dp;
    *out = NULL;
    if (!path || !*path)
        return comet_set_error(COMET_ERR_INVALID_ARG, "no model path given");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return comet_set_error(COMET_ERR_IO,
                                   "model '%s' not found (expected a .gguf file "
                                   "or an HF checkpoint directory)",
                                   path);
        return comet_set_error(COMET_ERR_IO, "model '%s': %s", path, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (stat(cfg, &sb) != 0)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "model '%s' is a directory without "
                                   "config.json (expected an HF checkpoint)",
                                   path);
        if (comet_checkpoint_detect(path))
            return comet_checkpoint_load_with(path, p->keep_codes_only, out);
        return comet_load_hf(path, out);
    }
    if (ends_with(path, ".gguf") || has_gguf_magic(path))
        return comet_load_gguf(path, out);
    return comet_set_error(COMET_ERR_FORMAT,
                           "model '%s' is neither a GGUF file (no 'GGUF' "
                           "magic) nor a directory with config.json",
                           path);
}

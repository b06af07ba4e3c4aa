/* hf.c — HF checkpoint directory loader: config.json, safetensors weights, tokenizer.
 *
 * Reads config.json (LlamaForCausalLM; MistralForCausalLM without sliding window; the bias
 * flags from attention_bias and mlp_bias, which the config check refuses),
 * model.safetensors or the shards listed in model.safetensors.index.json (F32/F16/BF16),
 * tokenizer.json (through comet_tokenizer_from_hf_json), the chat template from
 * tokenizer_config.json or chat_template.jinja, extra EOS ids (an id or a list) and the
 * sampling defaults (temperature, top_p, top_k, min_p, max_new_tokens: comet_model.gen) from
 * generation_config.json, and extra EOS ids from the vocabulary's end-marker control
 * tokens (comet_config_add_end_markers). A config.json with a quantization_config block is
 * a quantized checkpoint, refused here until a reader for it exists.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "comet/log.h"
#include "comet/tokenizer.h"
#include "core/mmap.h"
#include "format/loader.h"
#include "format/safetensors.h"

#define PATH_CAP 4096

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A whole file as a NUL-terminated string in *out (cJSON then never reads past the end);
 * caller frees. COMET_ERR_IO naming the path, or COMET_ERR_NOMEM. */
static comet_status read_text(const char *path, char **out) {
    comet_mmap m;
    *out = NULL;
    COMET_TRY(comet_mmap_open(path, &m));
    char *s = malloc(m.size + 1);
    if (!s) {
        comet_mmap_close(&m);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory for %zu bytes", path, m.size);
    }
    if (m.size)
        memcpy(s, m.data, m.size);
    s[m.size] = '\0';
    comet_mmap_close(&m);
    *out = s;
    return COMET_OK;
}

/* Parse a JSON file. A missing file gives *out = NULL and COMET_OK when !required. */
static comet_status read_json(const char *path, int required, cJSON **out) {
    *out = NULL;
    if (!required && !file_exists(path))
        return COMET_OK;
    char *text;
    COMET_TRY(read_text(path, &text));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 0);
    size_t at = end ? (size_t)(end - text) : 0;
    free(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: not a JSON object (parse error near byte "
                               "%zu)",
                               path, at);
    }
    *out = j;
    return COMET_OK;
}

/* Integer field: absent or null keeps *out (COMET_ERR_FORMAT when `required`). */
static comet_status json_int(const cJSON *o, const char *key, int required, const char *file,
                             int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" missing", file, key);
        return COMET_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != floor(d))
        return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" must be an integer", file, key);
    *out = (int)d;
    return COMET_OK;
}

static comet_status json_float(const cJSON *o, const char *key, int required, const char *file,
                               float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" missing", file, key);
        return COMET_OK;
    }
    if (!cJSON_IsNumber(v))
        return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" must be a number", file, key);
    *out = (float)v->valuedouble;
    return COMET_OK;
}

/* Boolean field: absent or null gives 0. */
static comet_status json_bool(const cJSON *o, const char *key, const char *file, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && !cJSON_IsBool(v) && !cJSON_IsNull(v))
        return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" must be a boolean", file, key);
    *out = cJSON_IsTrue(v);
    return COMET_OK;
}

/* bos/eos ids: an integer, a list of integers, or null. Each id goes to add(). */
static comet_status json_ids(const cJSON *o, const char *key, const char *file,
                             comet_model_config *c, int is_bos) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return COMET_OK;
    const cJSON *items = cJSON_IsArray(v) ? v->child : v;
    for (const cJSON *e = items; e; e = cJSON_IsArray(v) ? e->next : NULL) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(d >= 0 && d <= 2147483647.0) || d != floor(d))
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: \"%s\" must be a token id or a list "
                                   "of token ids",
                                   file, key);
        if (is_bos) {
            c->bos_id = (int32_t)d;
            break;
        }
        comet_config_add_eos(c, (int32_t)d);
    }
    return COMET_OK;
}

/* RoPE scaling from an HF object: transformers <= 4 "rope_scaling" ({"rope_type" or
 * "type", factor, ...} or null) or transformers >= 5 "rope_parameters" (the same keys
 * plus rope_theta). */
static comet_status hf_rope_scaling(const cJSON *rs, const char *field, const char *file,
                                    comet_model_config *c) {
    c->rope_scaling = COMET_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    if (!rs || cJSON_IsNull(rs))
        return COMET_OK;
    if (!cJSON_IsObject(rs))
        return comet_set_error(COMET_ERR_FORMAT, "%s: \"%s\" must be an object or null", file,
                               field);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!t && strcmp(field, "rope_parameters") == 0)
        return COMET_OK; /* rope_theta only */
    if (!cJSON_IsString(t))
        return comet_set_error(COMET_ERR_FORMAT, "%s: %s.rope_type missing", file, field);
    if (strcmp(t->valuestring, "default") == 0)
        return COMET_OK;
    if (strcmp(t->valuestring, "linear") == 0) {
        c->rope_scaling = COMET_ROPE_SCALING_LINEAR;
        return json_float(rs, "factor", 1, file, &c->rope_factor);
    }
    if (strcmp(t->valuestring, "llama3") == 0) {
        c->rope_scaling = COMET_ROPE_SCALING_LLAMA3;
        COMET_TRY(json_float(rs, "factor", 1, file, &c->rope_factor));
        COMET_TRY(json_float(rs, "low_freq_factor", 1, file, &c->rope_low_freq_factor));
        COMET_TRY(json_float(rs, "high_freq_factor", 1, file, &c->rope_high_freq_factor));
        return json_int(rs, "original_max_position_embeddings", 1, file, &c->rope_orig_ctx);
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "%s: %s type '%.32s' is not supported; "
                           "supported: default, linear, llama3",
                           file, field, t->valuestring);
}

static comet_status hf_config(const cJSON *cfg, const char *file, comet_model_config *c) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        const cJSON *meth = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantized checkpoint (quant_method "
                               "'%.32s') is not supported; comet reads F32/F16/BF16 HF "
                               "checkpoints",
                               file, cJSON_IsString(meth) ? meth->valuestring : "?");
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
    if (!cJSON_IsString(a0))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: \"architectures\" missing (expected "
                               "[\"LlamaForCausalLM\"])",
                               file);
    const char *arch = a0->valuestring;
    COMET_TRY(comet_arch_parse(arch, strlen(arch), COMET_WNAMES_HF, file, &c->arch));
    if (strcmp(arch, "MistralForCausalLM") == 0) {
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window");
        if (sw && !cJSON_IsNull(sw))
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: MistralForCausalLM with "
                                   "sliding_window is not supported (only full attention)",
                                   file);
    }
    /* transformers' LlamaConfig: attention_bias biases q, k, v and o; mlp_bias gate, up
     * and down. comet_model_config_check refuses them, naming the flag. */
    COMET_TRY(json_bool(cfg, "attention_bias", file, &c->qkv_bias));
    c->o_bias = c->qkv_bias;
    COMET_TRY(json_bool(cfg, "mlp_bias", file, &c->mlp_bias));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: hidden_act '%.32s' is not supported; "
                               "supported: silu",
                               file, act->valuestring);
    COMET_TRY(json_int(cfg, "num_hidden_layers", 1, file, &c->n_layer));
    COMET_TRY(json_int(cfg, "hidden_size", 1, file, &c->n_embd));
    COMET_TRY(json_int(cfg, "intermediate_size", 1, file, &c->n_ff));
    COMET_TRY(json_int(cfg, "num_attention_heads", 1, file, &c->n_head));
    c->n_head_kv = c->n_head;
    COMET_TRY(json_int(cfg, "num_key_value_heads", 0, file, &c->n_head_kv));
    if (c->n_head <= 0)
        return comet_set_error(COMET_ERR_FORMAT, "%s: num_attention_heads must be positive", file);
    c->head_dim = c->n_embd / c->n_head;
    COMET_TRY(json_int(cfg, "head_dim", 0, file, &c->head_dim));
    COMET_TRY(json_int(cfg, "vocab_size", 1, file, &c->n_vocab));
    c->n_ctx = 2048;
    COMET_TRY(json_int(cfg, "max_position_embeddings", 0, file, &c->n_ctx));
    c->rms_eps = 1e-6f;
    COMET_TRY(json_float(cfg, "rms_norm_eps", 0, file, &c->rms_eps));
    c->rope_theta = 10000.0f;
    COMET_TRY(json_float(cfg, "rope_theta", 0, file, &c->rope_theta));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (cJSON_IsObject(rp))
            COMET_TRY(json_float(rp, "rope_theta", 0, file, &c->rope_theta));
        COMET_TRY(hf_rope_scaling(rp, "rope_parameters", file, c));
    } else {
        COMET_TRY(hf_rope_scaling(cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling"),
                                  "rope_scaling", file, c));
    }
    COMET_TRY(json_bool(cfg, "tie_word_embeddings", file, &c->tie_embeddings));
    c->bos_id = -1;
    c->n_eos = 0;
    COMET_TRY(json_ids(cfg, "bos_token_id", file, c, 1));
    COMET_TRY(json_ids(cfg, "eos_token_id", file, c, 0));
    return COMET_OK;
}

/* ---- weights ----------------------------------------------------------------------- */

typedef struct hf_weights {
    comet_safetensors **shards;
    int n_shards;
} hf_weights;

static comet_status hf_fetch(comet_wsource *s, const char *name, int64_t rows, int64_t cols,
                             float *dst) {
    hf_weights *w = s->impl;
    for (int i = 0; i < w->n_shards; i++) {
        const comet_st_tensor *t = comet_st_find(w->shards[i], name);
        if (!t)
            continue;
        int ok = cols ? (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols)
                      : (t->n_dims == 1 && t->shape[0] == rows);
        if (!ok) {
            char sh[128] = "";
            size_t n = 0;
            for (int d = 0; d < t->n_dims && n < sizeof sh - 24; d++)
                n += (size_t)snprintf(sh + n, sizeof sh - n, "%s%lld", d ? ", " : "",
                                      (long long)t->shape[d]);
            if (cols)
                return comet_set_error(COMET_ERR_FORMAT,
                                       "%s: tensor '%s' has shape [%s], "
                                       "expected [%lld, %lld]",
                                       w->shards[i]->name, name, sh, (long long)rows,
                                       (long long)cols);
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor '%s' has shape [%s], expected "
                                   "[%lld]",
                                   w->shards[i]->name, name, sh, (long long)rows);
        }
        if (!dst &&
            (t->dtype == COMET_ST_F32 || t->dtype == COMET_ST_F16 || t->dtype == COMET_ST_BF16))
            return COMET_OK;
        return comet_st_to_f32(w->shards[i], t, dst); /* dst NULL: the dtype error */
    }
    return comet_set_error(COMET_ERR_FORMAT,
                           "tensor '%s' missing from the checkpoint's "
                           "safetensors files (%d file%s)",
                           name, w->n_shards, w->n_shards == 1 ? "" : "s");
}

static void hf_weights_free(hf_weights *w) {
    for (int i = 0; i < w->n_shards; i++)
        comet_st_free(w->shards[i]);
    free(w->shards);
    w->shards = NULL;
    w->n_shards = 0;
}

static comet_status open_shard(hf_weights *w, const char *dir, const char *file) {
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    comet_safetensors **s = realloc(w->shards, (size_t)(w->n_shards + 1) * sizeof *s);
    if (!s)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
    w->shards = s;
    COMET_TRY(comet_st_open(path, &w->shards[w->n_shards]));
    w->n_shards++;
    return COMET_OK;
}

static comet_status hf_open_weights(const char *dir, hf_weights *w) {
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (file_exists(path))
        return open_shard(w, dir, "model.safetensors");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!file_exists(path))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: no model.safetensors or "
                               "model.safetensors.index.json (comet reads safetensors weights)",
                               dir);
    cJSON *idx;
    COMET_TRY(read_json(path, 1, &idx));
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    comet_status st = COMET_OK;
    if (!cJSON_IsObject(map) || !map->child) {
        st = comet_set_error(COMET_ERR_FORMAT, "%s: \"weight_map\" missing or empty", path);
        goto done;
    }
    for (const cJSON *e = map->child; e && st == COMET_OK; e = e->next) {
        if (!cJSON_IsString(e)) {
            st = comet_set_error(COMET_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name",
                                 path, e->string ? e->string : "?");
            break;
        }
        const char *f = e->valuestring;
        if (!*f || strchr(f, '/') || strstr(f, "..")) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: weight_map file '%.64s' must be a plain "
                                 "file name in the checkpoint directory",
                                 path, f);
            break;
        }
        int seen = 0;
        for (const cJSON *p = map->child; p != e && !seen; p = p->next)
            seen = cJSON_IsString(p) && strcmp(p->valuestring, f) == 0;
        if (!seen)
            st = open_shard(w, dir, f);
    }
done:
    cJSON_Delete(idx);
    return st;
}

/* ---- tokenizer side files ---------------------------------------------------------- */

/* Whether tokenizer.json's post_processor prepends a special token (BOS) to one sequence. */
static int post_processor_adds_bos(const cJSON *pp) {
    if (!cJSON_IsObject(pp))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    if (!cJSON_IsString(type))
        return 0;
    if (strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *procs = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (const cJSON *p = cJSON_IsArray(procs) ? procs->child : NULL; p; p = p->next)
            if (post_processor_adds_bos(p))
                return 1;
        return 0;
    }
    if (strcmp(type->valuestring, "TemplateProcessing") != 0)
        return 0;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    return first && cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") != NULL;
}

static comet_status hf_tokenizer(const char *dir, comet_model *m) {
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!file_exists(path))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tokenizer.json missing; comet reads the "
                               "tokenizer from the HF fast-tokenizer file",
                               dir);
    m->tok = comet_tokenizer_from_hf_json(path);
    if (!m->tok)
        return comet_last_error()[0] ? COMET_ERR_FORMAT
                                     : comet_set_error(COMET_ERR_FORMAT, "%s: unreadable", path);
    int n_tok = comet_tokenizer_n_vocab(m->tok);
    if (n_tok > m->cfg.n_vocab)
        return comet_set_error(COMET_ERR_FORMAT, "%s: %d tokens but config.json vocab_size is %d",
                               path, n_tok, m->cfg.n_vocab);
    cJSON *tj = NULL, *tc = NULL;
    COMET_TRY(read_json(path, 1, &tj));
    int add_bos = post_processor_adds_bos(cJSON_GetObjectItemCaseSensitive(tj, "post_processor"));
    cJSON_Delete(tj);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    COMET_TRY(read_json(path, 0, &tc));
    if (tc) {
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
        if (cJSON_IsBool(ab))
            add_bos = cJSON_IsTrue(ab);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        /* A list of named templates: take "default", else the first. */
        for (const cJSON *e = cJSON_IsArray(ct) ? ct->child : NULL; e; e = e->next) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(t) &&
                (!tmpl || (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0)))
                tmpl = t->valuestring;
        }
        if (tmpl && !(m->chat_template = strdup(tmpl))) {
            cJSON_Delete(tc);
            return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
        }
        cJSON_Delete(tc);
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (!m->chat_template && file_exists(path))
        COMET_TRY(read_text(path, &m->chat_template));
    m->cfg.add_bos = add_bos && m->cfg.bos_id >= 0;
    /* tokenizer.json does not name BOS/EOS; give the tokenizer config.json's. */
    if (m->cfg.bos_id < n_tok)
        COMET_TRY(comet_tokenizer_set_special(m->tok, COMET_SPECIAL_BOS, m->cfg.bos_id));
    if (m->cfg.n_eos > 0 && m->cfg.eos_ids[0] < n_tok)
        COMET_TRY(comet_tokenizer_set_special(m->tok, COMET_SPECIAL_EOS, m->cfg.eos_ids[0]));
    comet_config_add_end_markers(&m->cfg, m->tok);
    return COMET_OK;
}

/* The sampling defaults generation_config.json recommends; a field that is missing, not a
 * number or out of its range (comet_sampler_params_check) is left out (a warning for the
 * last two). */
static void hf_gen_config(const cJSON *g, const char *path, comet_gen_config *out) {
    static const struct {
        const char *key;
        unsigned bit; /* COMET_SAMPLER_*; 0: max_new_tokens */
    } f[] = {
        {"temperature", COMET_SAMPLER_TEMPERATURE},
        {"top_p", COMET_SAMPLER_TOP_P},
        {"top_k", COMET_SAMPLER_TOP_K},
        {"min_p", COMET_SAMPLER_MIN_P},
        {"max_new_tokens", 0},
    };
    memset(out, 0, sizeof *out);
    out->sampling = comet_sampler_default_params();
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(g, f[i].key);
        if (!it || cJSON_IsNull(it))
            continue;
        double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!f[i].bit) {
            if (!(v >= 1 && v <= 1 << 30))
                comet_log(COMET_LOG_WARN, "%s: ignoring max_new_tokens (not a number in [1, %d])",
                          path, 1 << 30);
            else
                out->max_new_tokens = (int)v;
            continue;
        }
        comet_sampler_params s = out->sampling;
        int is_int = f[i].bit == COMET_SAMPLER_TOP_K;
        if (is_int && !(v >= 0 && v <= 1 << 30)) /* before the conversion to int */
            v = -1;
        switch (f[i].bit) {
        case COMET_SAMPLER_TEMPERATURE: s.temperature = (float)v; break;
        case COMET_SAMPLER_TOP_P: s.top_p = (float)v; break;
        case COMET_SAMPLER_TOP_K: s.top_k = (int)v; break;
        default: s.min_p = (float)v; break;
        }
        if (comet_sampler_params_check(&s, 0, NULL) < 0) {
            comet_log(COMET_LOG_WARN, "%s: ignoring %s (%s)", path, f[i].key, comet_last_error());
            comet_clear_error();
            continue;
        }
        out->sampling = s;
        out->given |= f[i].bit;
    }
}

comet_status comet_load_hf(const char *dir, comet_model **out) {
    *out = NULL;
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg = NULL;
    hf_weights w = {NULL, 0};
    comet_status st;
    comet_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(dir))) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    if ((st = read_json(path, 1, &cfg)) < 0 || (st = hf_config(cfg, path, &m->cfg)) < 0)
        goto fail;
    cJSON_Delete(cfg);
    cfg = NULL;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if ((st = read_json(path, 0, &cfg)) < 0 ||
        (cfg && (st = json_ids(cfg, "eos_token_id", path, &m->cfg, 0)) < 0))
        goto fail;
    if (cfg)
        hf_gen_config(cfg, path, &m->gen);
    cJSON_Delete(cfg);
    cfg = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((st = comet_model_config_check(&m->cfg, path)) < 0 || (st = hf_tokenizer(dir, m)) < 0 ||
        (st = hf_open_weights(dir, &w)) < 0)
        goto fail;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    const char *b = dir + n;
    while (b > dir && b[-1] != '/')
        b--;
    if (!(m->name = strndup(b, (size_t)(dir + n - b)))) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    comet_log(COMET_LOG_INFO,
              "%s: llama, %d layers, C=%d, F=%d, H=%d/%d, D=%d, V=%d, %d "
              "safetensors file%s",
              dir, m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_ff, m->cfg.n_head, m->cfg.n_head_kv,
              m->cfg.head_dim, m->cfg.n_vocab, w.n_shards, w.n_shards == 1 ? "" : "s");
    comet_wsource src = {COMET_WNAMES_HF, hf_fetch, &w};
    if ((st = comet_load_weights(m, &src)) < 0)
        goto fail;
    hf_weights_free(&w);
    *out = m;
    return COMET_OK;
fail:
    cJSON_Delete(cfg);
    hf_weights_free(&w);
    comet_model_free(m);
    return st;
}

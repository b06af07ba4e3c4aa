/* checkpoint_write.c — writes a quantized model as a comet checkpoint directory
 * (config.json + model.safetensors; see checkpoint.h). The safetensors writer lays tensors
 * out contiguously (the format allows no holes), 4-byte dtypes first, then 2-byte, then
 * 1-byte ones, so every tensor is naturally aligned in a mapped file; the JSON header is
 * padded with spaces to a multiple of 8 bytes. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/checkpoint.h"
#include "numerics/group.h"
#include "numerics/quant.h"

typedef enum {
    ST_F32,
    ST_I32,
    ST_F16,
    ST_U8,
    ST_I8
} st_dtype;
static const char *dtype_name[] = {"F32", "I32", "F16", "U8", "I8"};
static const int dtype_size[] = {4, 4, 2, 1, 1};

typedef struct st_entry {
    char name[96];
    st_dtype dtype;
    int n_dims;
    int64_t shape[2];
    const void *data; /* F16 entries: fp32 source converted on write (f32_src) or raw */
    int f32_src;
} st_entry;

typedef struct st_list {
    st_entry *e;
    int n, cap;
} st_list;

static int st_add(st_list *l, st_dtype dt, const void *data, int f32_src, int64_t d0, int64_t d1,
                  const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int st_add(st_list *l, st_dtype dt, const void *data, int f32_src, int64_t d0, int64_t d1,
                  const char *fmt, ...) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        st_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e)
            return -1;
        l->e = e, l->cap = cap;
    }
    st_entry *x = &l->e[l->n++];
    memset(x, 0, sizeof *x);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->name, sizeof x->name, fmt, ap);
    va_end(ap);
    x->dtype = dt;
    x->data = data;
    x->f32_src = f32_src;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->n_dims = d1 > 0 ? 2 : 1;
    return 0;
}

static size_t st_bytes(const st_entry *e) {
    size_t n = (size_t)e->shape[0] * (e->n_dims == 2 ? (size_t)e->shape[1] : 1);
    return n * (size_t)dtype_size[e->dtype];
}

static const char *lin_names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                   "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                   "mlp.down_proj"};

static comet_linear *layer_linear(comet_layer_weights *lw, int i) {
    comet_linear *all[7] = {&lw->wq,     &lw->wk,   &lw->wv,    &lw->wo,
                            &lw->w_gate, &lw->w_up, &lw->w_down};
    return all[i];
}

/* Every tensor of the checkpoint, in file order. */
static comet_status collect(const comet_model *m, st_list *l) {
    const comet_model_config *c = &m->cfg;
    int ok = 0;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 0)
            ok |= st_add(l, ST_F32, m->output_norm, 0, c->n_embd, 0, "model.norm.weight");
        /* fp32 weights (permutation-only checkpoints) keep an fp32 embedding too. */
        st_dtype et = m->quant->w_bits == 32 ? ST_F32 : ST_F16;
        if (pass == (et == ST_F32 ? 0 : 1)) {
            ok |= st_add(l, et, m->tok_embd, et == ST_F16, c->n_vocab, c->n_embd,
                         "model.embed_tokens.weight");
            if (!c->tie_embeddings)
                ok |= st_add(l, et, m->lm_head, et == ST_F16, c->n_vocab, c->n_embd,
                             "lm_head.weight");
        }
        for (int li = 0; li < c->n_layer; li++) {
            comet_layer_weights *lw = &m->layers[li];
            if (pass == 0) {
                ok |= st_add(l, ST_F32, lw->attn_norm, 0, c->n_embd, 0,
                             "model.layers.%d.input_layernorm.weight", li);
                ok |= st_add(l, ST_F32, lw->ffn_norm, 0, c->n_embd, 0,
                             "model.layers.%d.post_attention_layernorm.weight", li);
                ok |= st_add(l, ST_I32, lw->wq.perm, 0, lw->wq.n_in, 0,
                             "model.layers.%d.self_attn.qkv_perm", li);
                ok |= st_add(l, ST_I32, lw->wo.perm, 0, lw->wo.n_in, 0,
                             "model.layers.%d.self_attn.o_perm", li);
                ok |= st_add(l, ST_I32, lw->w_gate.perm, 0, lw->w_gate.n_in, 0,
                             "model.layers.%d.mlp.gate_up_perm", li);
                ok |= st_add(l, ST_I32, lw->w_down.perm_folded, 0, lw->w_down.n_in, 0,
                             "model.layers.%d.mlp.down_perm", li);
            }
            for (int i = 0; i < 7; i++) {
                const comet_linear *lin = layer_linear(lw, i);
                int N = lin->n_out, K = lin->n_in;
                if (pass == 0 && lin->w_bits == 32)
                    ok |= st_add(l, ST_F32, lin->w, 0, N, K, "model.layers.%d.%s.weight", li,
                                 lin_names[i]);
                if (pass == 1 && lin->w_bits == 16)
                    ok |= st_add(l, ST_F16, lin->w, 1, N, K, "model.layers.%d.%s.weight", li,
                                 lin_names[i]);
                if (pass == 1 && lin->w_bits < 16)
                    ok |= st_add(l, ST_F16, lin->sw, 0, N, K / lin->block,
                                 "model.layers.%d.%s.scales", li, lin_names[i]);
                if (pass == 2 && lin->w_bits == 4)
                    ok |= st_add(l, ST_U8, lin->qw, 0, N, K / 2, "model.layers.%d.%s.qweight", li,
                                 lin_names[i]);
                if (pass == 2 && lin->w_bits == 8)
                    ok |= st_add(l, ST_I8, lin->qw, 0, N, K, "model.layers.%d.%s.qweight", li,
                                 lin_names[i]);
            }
        }
    }
    if (ok)
        return comet_set_error(COMET_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < l->n; i++)
        if (!l->e[i].data)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "checkpoint: tensor %s has no data (is the model quantized?)",
                                   l->e[i].name);
    return COMET_OK;
}

static comet_status write_safetensors(const st_list *l, const char *path) {
    cJSON *hdr = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "comet-fmpq");
    cJSON_AddStringToObject(meta, "format_version", "1");
    size_t off = 0;
    for (int i = 0; i < l->n; i++) {
        const st_entry *e = &l->e[i];
        cJSON *t = cJSON_AddObjectToObject(hdr, e->name);
        cJSON_AddStringToObject(t, "dtype", dtype_name[e->dtype]);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->n_dims; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += st_bytes(e);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *json = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    if (!json)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory for the header", path);
    size_t jlen = strlen(json), padded = (8 + jlen + 7) / 8 * 8 - 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(json);
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(json, 1, jlen, f) != jlen;
    for (size_t i = jlen; i < padded && !bad; i++)
        bad = fputc(' ', f) == EOF;
    free(json);
    for (int i = 0; i < l->n && !bad; i++) {
        const st_entry *e = &l->e[i];
        size_t nb = st_bytes(e);
        if (e->f32_src) {
            size_t n = nb / 2;
            uint16_t *h = malloc(n * sizeof *h);
            if (!h) {
                fclose(f);
                return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
            }
            const float *src = e->data;
            for (size_t j = 0; j < n; j++)
                h[j] = comet_quant_f16_bits(src[j]);
            bad = fwrite(h, 1, nb, f) != nb;
            free(h);
        } else {
            bad = fwrite(e->data, 1, nb, f) != nb;
        }
    }
    if (fclose(f) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return COMET_OK;
}

static cJSON *config_json(const comet_model *m) {
    const comet_model_config *c = &m->cfg;
    const comet_quant_config *q = m->quant;
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", comet_arch_name(c->arch));
    if (m->name)
        cJSON_AddStringToObject(j, "_name_or_path", m->name);
    cJSON_AddNumberToObject(j, "hidden_size", c->n_embd);
    cJSON_AddNumberToObject(j, "intermediate_size", c->n_ff);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_head_kv);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "vocab_size", c->n_vocab);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->n_ctx);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    if (c->rope_scaling == COMET_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        int l3 = c->rope_scaling == COMET_ROPE_SCALING_LLAMA3;
        cJSON_AddStringToObject(rs, "rope_type", l3 ? "llama3" : "linear");
        cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
        if (l3) {
            cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_ctx);
        }
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddBoolToObject(j, "mlp_bias", 0);
    cJSON_AddStringToObject(j, "torch_dtype", "float16");
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    else
        cJSON_AddNullToObject(j, "bos_token_id");
    cJSON *eos = cJSON_AddArrayToObject(j, "eos_token_id");
    for (int i = 0; i < c->n_eos; i++)
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(c->eos_ids[i]));

    cJSON *qc = cJSON_AddObjectToObject(j, "quantization_config");
    cJSON_AddStringToObject(qc, "quant_method", "comet-fmpq");
    cJSON_AddStringToObject(qc, "method", "comet-fmpq");
    cJSON_AddNumberToObject(qc, "format_version", COMET_QUANT_FORMAT_VERSION);
    cJSON_AddNumberToObject(qc, "w_bits", q->w_bits);
    cJSON_AddNumberToObject(qc, "a_bits", q->a_bits);
    cJSON_AddNumberToObject(qc, "kv_bits", comet_kv_type_bits(q->kv.type));
    cJSON_AddNumberToObject(qc, "kv_group_size", q->kv.group);
    cJSON_AddStringToObject(qc, "kv_rotation", comet_kv_rotation_name(q->kv.rotation));
    cJSON_AddNumberToObject(qc, "block_size", q->block);
    cJSON_AddNumberToObject(qc, "lm_head_bits", q->lm_head_bits == 8 ? 8 : 16);
    cJSON_AddStringToObject(qc, "weight_method", q->wmethod);
    cJSON_AddBoolToObject(qc, "clip_search", q->clip_search);
    cJSON_AddNumberToObject(qc, "gptq_damp", q->gptq_damp);
    cJSON_AddBoolToObject(qc, "reorder", q->reorder);
    cJSON_AddNumberToObject(qc, "tau", q->tau);
    cJSON_AddNumberToObject(qc, "int8_budget", q->int8_budget);
    cJSON_AddStringToObject(qc, "down_proj_permutation", "folded");
    cJSON *cal = cJSON_AddObjectToObject(qc, "calibration");
    cJSON_AddStringToObject(cal, "corpus", q->calib_corpus);
    cJSON_AddNumberToObject(cal, "windows", q->calib_windows);
    cJSON_AddNumberToObject(cal, "window_tokens", q->calib_window_len);
    cJSON_AddNumberToObject(cal, "tokens", (double)q->calib_tokens);
    double frac[COMET_GROUP_LAYER_COUNT], fb, fw;
    comet_group_int8_fraction(m, frac, &fb, &fw);
    cJSON *fr = cJSON_AddObjectToObject(qc, "int8_block_fraction");
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        cJSON_AddNumberToObject(fr, comet_group_name((comet_group)g), frac[g]);
    cJSON_AddNumberToObject(fr, "overall", fb);
    cJSON_AddNumberToObject(fr, "overall_gemm_work", fw);
    cJSON *layers = cJSON_AddArrayToObject(qc, "layers");
    for (int li = 0; li < c->n_layer; li++) {
        cJSON *lj = cJSON_CreateObject();
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
            comet_linear *lins[3];
            comet_group_linears(&m->layers[li], (comet_group)g, lins);
            cJSON *gj = cJSON_AddObjectToObject(lj, comet_group_name((comet_group)g));
            cJSON_AddNumberToObject(gj, "block_size", lins[0]->block);
            cJSON_AddNumberToObject(gj, "n8", lins[0]->n8);
            cJSON *blocks = cJSON_AddArrayToObject(gj, "int8_blocks");
            for (int b = 0; b < lins[0]->n8; b++)
                cJSON_AddItemToArray(blocks, cJSON_CreateNumber(b));
        }
        cJSON_AddItemToArray(layers, lj);
    }
    return j;
}

static comet_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
    if (fclose(f) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return COMET_OK;
}

/* 1 when directory `dir` holds anything besides "." and "..". */
static int dir_has_entries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int any = 0;
    while (d && !any && (e = readdir(d)))
        any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return any;
}

comet_status comet_checkpoint_out_check(const char *dir, int overwrite) {
    if (!dir || !dir[0])
        return comet_set_error(COMET_ERR_IO, "output directory: no path given");
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return comet_set_error(COMET_ERR_IO,
                                   "output directory '%s' exists and is not a directory; "
                                   "name a new or empty directory",
                                   dir);
        if (access(dir, W_OK | X_OK) != 0)
            return comet_set_error(COMET_ERR_IO, "output directory '%s' is not writable: %s",
                                   dir, strerror(errno));
        if (!overwrite && dir_has_entries(dir) && !comet_checkpoint_detect(dir))
            return comet_set_error(COMET_ERR_IO,
                                   "output directory '%s' is not empty and not a comet "
                                   "checkpoint; its files would be replaced: name a new or "
                                   "empty directory, or force it (comet quantize --force)",
                                   dir);
        return COMET_OK;
    }
    if (errno != ENOENT)
        return comet_set_error(COMET_ERR_IO, "output directory '%s': %s", dir, strerror(errno));
    /* a new directory: its parent must exist and take it */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    while (n > 0 && dir[n - 1] != '/')
        n--;
    char parent[4096];
    if (n == 0)
        snprintf(parent, sizeof parent, ".");
    else
        snprintf(parent, sizeof parent, "%.*s", (int)(n > 1 ? n - 1 : 1), dir);
    if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return comet_set_error(COMET_ERR_IO,
                               "output directory '%s' cannot be created: its parent '%s' %s",
                               dir, parent,
                               stat(parent, &sb) != 0 ? "does not exist" : "is not a directory");
    if (access(parent, W_OK | X_OK) != 0)
        return comet_set_error(COMET_ERR_IO,
                               "output directory '%s' cannot be created: '%s' is not writable: "
                               "%s",
                               dir, parent, strerror(errno));
    return COMET_OK;
}

comet_status comet_checkpoint_write(const comet_model *m, const char *dir) {
    if (!m->quant)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "checkpoint: the model is not quantized (run comet quantize)");
    for (int li = 0; li < m->cfg.n_layer; li++)
        for (int i = 0; i < 7; i++)
            if (layer_linear(&m->layers[li], i)->fmt != COMET_WFMT_QSIM)
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "checkpoint: layer %d %s is not quantized", li,
                                       lin_names[i]);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return comet_set_error(COMET_ERR_IO, "%s: cannot create directory: %s", dir,
                               strerror(errno));
    char path[4096];
    st_list l = {0};
    comet_status st = collect(m, &l);
    if (st == COMET_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = write_safetensors(&l, path);
    }
    free(l.e);
    COMET_TRY(st);
    cJSON *cfg = config_json(m);
    char *text = cfg ? cJSON_Print(cfg) : NULL;
    cJSON_Delete(cfg);
    if (!text)
        return comet_set_error(COMET_ERR_NOMEM, "checkpoint: out of memory for config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = write_text(path, text);
    free(text);
    return st;
}

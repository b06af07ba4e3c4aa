/* checkpoint_read.c — loads a comet checkpoint directory (checkpoint.h) into a model with
 * COMET_WFMT_QSIM linears. Every field and tensor is checked before use: unknown
 * format_version, bits or method, a missing tensor, a wrong dtype or shape, a
 * permutation that is not one, or bad JSON give an error naming the file and the field. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comet/log.h"
#include "comet/tokenizer.h"
#include "format/checkpoint.h"
#include "format/loader.h"
#include "format/safetensors.h"
#include "numerics/group.h"
#include "numerics/pack.h"
#include "numerics/quant.h"

/* Whole file as a NUL-terminated string; NULL + COMET_ERR_IO message. */
static char *read_text(const char *path, int quiet) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (!quiet)
            comet_set_error(COMET_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        comet_set_error(COMET_ERR_IO, "%s: read failed", path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Parse a JSON file; NULL + COMET_ERR_FORMAT naming the byte offset on bad JSON. */
static cJSON *read_json(const char *path, comet_status *st) {
    char *text = read_text(path, 0);
    if (!text) {
        *st = COMET_ERR_IO;
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j) {
        *st = comet_set_error(COMET_ERR_FORMAT, "%s: bad JSON near byte %ld", path,
                              end ? (long)(end - text) : -1L);
    }
    free(text);
    return j;
}

int comet_checkpoint_detect(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text(path, 1);
    if (!text)
        return 0;
    cJSON *j = cJSON_Parse(text);
    /* A malformed config.json that mentions quantization_config is claimed too, so that
     * the loader reports the checkpoint's problem instead of an HF one. */
    int yes = j ? cJSON_GetObjectItemCaseSensitive(j, "quantization_config") != NULL
                : strstr(text, "\"quantization_config\"") != NULL;
    cJSON_Delete(j);
    free(text);
    return yes;
}

/* ---- config.json ---------------------------------------------------------------------- */

typedef struct ctx {
    const char *dir;
    char cfg_path[4096];
    char st_path[4096];
    comet_model *m;
    comet_safetensors *st;
    int keep_codes_only; /* comet_model_load_params */
} ctx;

/* An integer field; `def` when absent and def_ok. */
static comet_status get_int(const ctx *c, const cJSON *obj, const char *where, const char *key,
                            int def_ok, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && def_ok) {
        *out = def;
        return COMET_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= INT_MIN && v->valuedouble <= INT_MAX) ||
        v->valuedouble != (double)(int)v->valuedouble)
        return comet_set_error(COMET_ERR_FORMAT, "%s: %s%s: %s integer expected", c->cfg_path,
                               where, key, v ? "an" : "missing;");
    *out = (int)v->valuedouble;
    return COMET_OK;
}

static comet_status get_float(const ctx *c, const cJSON *obj, const char *where, const char *key,
                              int def_ok, float def, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && def_ok) {
        *out = def;
        return COMET_OK;
    }
    if (!cJSON_IsNumber(v))
        return comet_set_error(COMET_ERR_FORMAT, "%s: %s%s: %s number expected", c->cfg_path, where,
                               key, v ? "a" : "missing;");
    *out = (float)v->valuedouble;
    return COMET_OK;
}

/* A boolean field; 0 when absent or null. */
static comet_status get_bool(const ctx *c, const cJSON *obj, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v && !cJSON_IsBool(v) && !cJSON_IsNull(v))
        return comet_set_error(COMET_ERR_FORMAT, "%s: %s: true or false expected", c->cfg_path,
                               key);
    *out = cJSON_IsTrue(v);
    return COMET_OK;
}

static comet_status parse_model_config(const ctx *c, const cJSON *j, comet_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (!cJSON_IsString(a0))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: architectures: [\"LlamaForCausalLM\"] expected", c->cfg_path);
    COMET_TRY(comet_arch_parse(a0->valuestring, strlen(a0->valuestring), COMET_WNAMES_HF,
                               c->cfg_path, &cfg->arch));
    /* the bias flags as HF's LlamaConfig spells them; the config check refuses them */
    COMET_TRY(get_bool(c, j, "attention_bias", &cfg->qkv_bias));
    cfg->o_bias = cfg->qkv_bias;
    COMET_TRY(get_bool(c, j, "mlp_bias", &cfg->mlp_bias));
    COMET_TRY(get_int(c, j, "", "hidden_size", 0, 0, &cfg->n_embd));
    COMET_TRY(get_int(c, j, "", "intermediate_size", 0, 0, &cfg->n_ff));
    COMET_TRY(get_int(c, j, "", "num_hidden_layers", 0, 0, &cfg->n_layer));
    COMET_TRY(get_int(c, j, "", "num_attention_heads", 0, 0, &cfg->n_head));
    COMET_TRY(get_int(c, j, "", "num_key_value_heads", 1, cfg->n_head, &cfg->n_head_kv));
    COMET_TRY(get_int(c, j, "", "head_dim", 1, cfg->n_head ? cfg->n_embd / cfg->n_head : 0,
                      &cfg->head_dim));
    COMET_TRY(get_int(c, j, "", "vocab_size", 0, 0, &cfg->n_vocab));
    COMET_TRY(get_int(c, j, "", "max_position_embeddings", 0, 0, &cfg->n_ctx));
    COMET_TRY(get_float(c, j, "", "rms_norm_eps", 0, 0, &cfg->rms_eps));
    COMET_TRY(get_float(c, j, "", "rope_theta", 1, 10000.0f, &cfg->rope_theta));
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (cJSON_IsObject(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "linear"))
            cfg->rope_scaling = COMET_ROPE_SCALING_LINEAR;
        else if (cJSON_IsString(t) && !strcmp(t->valuestring, "llama3"))
            cfg->rope_scaling = COMET_ROPE_SCALING_LLAMA3;
        else
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: rope_scaling.rope_type: \"linear\" or \"llama3\" expected",
                                   c->cfg_path);
        COMET_TRY(get_float(c, rs, "rope_scaling.", "factor", 0, 0, &cfg->rope_factor));
        if (cfg->rope_scaling == COMET_ROPE_SCALING_LLAMA3) {
            COMET_TRY(get_float(c, rs, "rope_scaling.", "low_freq_factor", 0, 0,
                                &cfg->rope_low_freq_factor));
            COMET_TRY(get_float(c, rs, "rope_scaling.", "high_freq_factor", 0, 0,
                                &cfg->rope_high_freq_factor));
            COMET_TRY(get_int(c, rs, "rope_scaling.", "original_max_position_embeddings", 0, 0,
                              &cfg->rope_orig_ctx));
        }
    } else if (rs && !cJSON_IsNull(rs)) {
        return comet_set_error(COMET_ERR_FORMAT, "%s: rope_scaling: an object or null expected",
                               c->cfg_path);
    }
    cfg->tie_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    cfg->bos_id = cJSON_IsNumber(bos) ? (int32_t)bos->valuedouble : -1;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *e;
    if (cJSON_IsNumber(eos))
        comet_config_add_eos(cfg, (int32_t)eos->valuedouble);
    const cJSON *eos_list = cJSON_IsArray(eos) ? eos : NULL;
    cJSON_ArrayForEach(e, eos_list) {
        if (!cJSON_IsNumber(e) || cfg->n_eos == COMET_MAX_EOS)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: eos_token_id: at most %d integer ids expected", c->cfg_path,
                                   COMET_MAX_EOS);
        comet_config_add_eos(cfg, (int32_t)e->valuedouble);
    }
    return comet_model_config_check(cfg, c->cfg_path);
}

/* quantization_config: global fields, then per layer and group n8 and block size. */
static comet_status parse_quant_config(ctx *c, const cJSON *qj, int *n8, int *blk) {
    comet_model *m = c->m;
    comet_quant_config *q = comet_model_own(m, calloc(1, sizeof *q));
    if (!q)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->cfg_path);
    const char *W = "quantization_config.";
    const cJSON *meth = cJSON_GetObjectItemCaseSensitive(qj, "quant_method");
    if (!cJSON_IsString(meth) || strcmp(meth->valuestring, "comet-fmpq"))
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantization_config.quant_method: \"comet-fmpq\" expected",
                               c->cfg_path);
    COMET_TRY(get_int(c, qj, W, "format_version", 0, 0, &q->format_version));
    if (q->format_version < 1 || q->format_version > COMET_QUANT_FORMAT_VERSION)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantization_config.format_version %d is not known to this "
                               "build (it reads versions 1 to %d); re-quantize the model with "
                               "this build",
                               c->cfg_path, q->format_version, COMET_QUANT_FORMAT_VERSION);
    COMET_TRY(get_int(c, qj, W, "w_bits", 0, 0, &q->w_bits));
    COMET_TRY(get_int(c, qj, W, "a_bits", 0, 0, &q->a_bits));
    /* the KV type is stored as kv_bits and derived here (comet/kv_format.h) */
    int kv_bits = 0;
    COMET_TRY(get_int(c, qj, W, "kv_bits", 0, 0, &kv_bits));
    q->kv.type = comet_kv_type_from_bits(kv_bits);
    if (q->kv.type < 0)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantization_config.kv_bits %d: 4, 8 "
                               "or 16 expected",
                               c->cfg_path, kv_bits);
    COMET_TRY(get_int(c, qj, W, "kv_group_size", 1, m->cfg.head_dim, &q->kv.group));
    if (q->kv.group <= 0)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: quantization_config.kv_group_size %d: a divisor of head_dim "
                               "%d expected",
                               c->cfg_path, q->kv.group, m->cfg.head_dim);
    /* version 1 had no KV rotation; from version 2 the key is required */
    q->kv.rotation = COMET_KV_ROTATION_NONE;
    if (q->format_version >= 2) {
        const cJSON *rot = cJSON_GetObjectItemCaseSensitive(qj, "kv_rotation");
        q->kv.rotation = cJSON_IsString(rot) ? comet_kv_rotation_parse(rot->valuestring) : -1;
        if (q->kv.rotation < 0)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: quantization_config.kv_rotation: "
                                   "\"none\" or \"hadamard\" expected",
                                   c->cfg_path);
    }
    /* version 3 added lm_head_bits (required from it); older files have an fp16 lm_head */
    q->lm_head_bits = 16;
    if (q->format_version >= 3) {
        COMET_TRY(get_int(c, qj, W, "lm_head_bits", 0, 0, &q->lm_head_bits));
        if (q->lm_head_bits != 8 && q->lm_head_bits != 16)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: quantization_config.lm_head_bits %d: 8 or 16 expected",
                                   c->cfg_path, q->lm_head_bits);
    }
    char who[sizeof c->cfg_path + 32], msg[1024];
    snprintf(who, sizeof who, "%s: quantization_config", c->cfg_path);
    if (comet_kv_format_check(&q->kv, m->cfg.head_dim, who) < 0) { /* a bad file: FORMAT */
        snprintf(msg, sizeof msg, "%s", comet_last_error());
        return comet_set_error(COMET_ERR_FORMAT, "%s", msg);
    }
    COMET_TRY(get_int(c, qj, W, "block_size", 0, 0, &q->block));
    if (q->w_bits != 4 && q->w_bits != 8 && q->w_bits != 16 && q->w_bits != 32)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantization_config.w_bits %d: 4, 8, "
                               "16 or 32 expected",
                               c->cfg_path, q->w_bits);
    if (q->a_bits != 4 && q->a_bits != 8 && q->a_bits != 16)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: quantization_config.a_bits %d: 4, 8 "
                               "or 16 expected",
                               c->cfg_path, q->a_bits);
    if (q->block < 0)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: quantization_config.block_size %d: >= 0 "
                               "expected",
                               c->cfg_path, q->block);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(qj, "weight_method");
    if (!cJSON_IsString(wm))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: quantization_config.weight_method: a "
                               "string expected",
                               c->cfg_path);
    snprintf(q->wmethod, sizeof q->wmethod, "%s", wm->valuestring);
    q->clip_search = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(qj, "clip_search"));
    q->reorder = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(qj, "reorder"));
    COMET_TRY(get_float(c, qj, W, "gptq_damp", 1, 0.0f, &q->gptq_damp));
    COMET_TRY(get_float(c, qj, W, "tau", 1, 0.0f, &q->tau));
    COMET_TRY(get_float(c, qj, W, "int8_budget", 1, 0.0f, &q->int8_budget));
    const cJSON *cal = cJSON_GetObjectItemCaseSensitive(qj, "calibration");
    if (cJSON_IsObject(cal)) {
        const cJSON *corpus = cJSON_GetObjectItemCaseSensitive(cal, "corpus");
        if (cJSON_IsString(corpus))
            snprintf(q->calib_corpus, sizeof q->calib_corpus, "%s", corpus->valuestring);
        const char *CW = "quantization_config.calibration.";
        COMET_TRY(get_int(c, cal, CW, "windows", 1, 0, &q->calib_windows));
        COMET_TRY(get_int(c, cal, CW, "window_tokens", 1, 0, &q->calib_window_len));
        int tokens = 0;
        COMET_TRY(get_int(c, cal, CW, "tokens", 1, 0, &tokens));
        q->calib_tokens = tokens;
    }
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(qj, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != m->cfg.n_layer)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: quantization_config.layers: an array of "
                               "%d layers expected",
                               c->cfg_path, m->cfg.n_layer);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const cJSON *lj = cJSON_GetArrayItem(layers, l);
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
            const char *gname = comet_group_name((comet_group)g);
            char where[96];
            snprintf(where, sizeof where, "quantization_config.layers[%d].%s.", l, gname);
            const cJSON *gj = cJSON_GetObjectItemCaseSensitive(lj, gname);
            if (!cJSON_IsObject(gj))
                return comet_set_error(COMET_ERR_FORMAT, "%s: %s: missing", c->cfg_path, where);
            int K = comet_group_config_width(&m->cfg, (comet_group)g), *nb = &blk[l * 4 + g];
            COMET_TRY(get_int(c, gj, where, "block_size", 0, 0, nb));
            if (*nb <= 0 || K % *nb)
                return comet_set_error(COMET_ERR_FORMAT,
                                       "%s: %sblock_size %d does not divide "
                                       "the input width %d",
                                       c->cfg_path, where, *nb, K);
            COMET_TRY(get_int(c, gj, where, "n8", 0, 0, &n8[l * 4 + g]));
            if (n8[l * 4 + g] < 0 || n8[l * 4 + g] > K / *nb)
                return comet_set_error(COMET_ERR_FORMAT, "%s: %sn8 %d outside 0..%d", c->cfg_path,
                                       where, n8[l * 4 + g], K / *nb);
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(gj, "int8_blocks");
            int ok = cJSON_IsArray(list) && cJSON_GetArraySize(list) == n8[l * 4 + g];
            for (int b = 0; ok && b < n8[l * 4 + g]; b++) {
                const cJSON *v = cJSON_GetArrayItem(list, b);
                ok = cJSON_IsNumber(v) && v->valuedouble == b;
            }
            if (!ok)
                return comet_set_error(COMET_ERR_FORMAT,
                                       "%s: %sint8_blocks: the leading blocks "
                                       "[0 .. n8-1] expected",
                                       c->cfg_path, where);
        }
    }
    m->quant = q;
    m->kv = q->kv;
    return COMET_OK;
}

/* ---- model.safetensors ---------------------------------------------------------------- */

/* The tensor `name` after checking dtype and shape [d0] or [d0, d1] (d1 == 0: 1-D). */
static comet_status get_tensor(const ctx *c, const char *name, comet_st_dtype dt, int64_t d0,
                               int64_t d1, const comet_st_tensor **out) {
    const comet_st_tensor *t = comet_st_find(c->st, name);
    if (!t)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor %s is missing", c->st_path, name);
    if (t->dtype != dt)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor %s: dtype %s, %s expected", c->st_path,
                               name, comet_st_dtype_name(t->dtype), comet_st_dtype_name(dt));
    int want_dims = d1 ? 2 : 1;
    if (t->n_dims != want_dims || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
        char got[64] = "";
        for (int i = 0; i < t->n_dims && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        if (d1)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor %s: shape [%s], [%lld, %lld] "
                                   "expected",
                                   c->st_path, name, got, (long long)d0, (long long)d1);
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor %s: shape [%s], [%lld] expected",
                               c->st_path, name, got, (long long)d0);
    }
    *out = t;
    return COMET_OK;
}

static void *own_alloc(ctx *c, size_t bytes) {
    return comet_model_own(c->m, malloc(bytes ? bytes : 1));
}

#define NEED(p)                                                                                    \
    do {                                                                                           \
        if (!(p))                                                                                  \
            return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->st_path);              \
    } while (0)

/* An fp32 copy of an F32 or F16 tensor of shape [d0] / [d0, d1]. */
/* The file's pages under [p, p + n) leave this process's memory once their bytes are
 * copied: the mapping is read-only, so they would only be read again from the file. Keeps
 * the peak of a load near the model's own size instead of twice it. */
static void drop_mapped(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static comet_status load_float(ctx *c, const char *name, comet_st_dtype dt, int64_t d0, int64_t d1,
                               float **out) {
    const comet_st_tensor *t;
    COMET_TRY(get_tensor(c, name, dt, d0, d1, &t));
    float *dst = own_alloc(c, (size_t)t->n_elements * sizeof *dst);
    NEED(dst);
    if (dt == COMET_ST_F32) {
        memcpy(dst, t->data, t->n_bytes);
    } else {
        const uint8_t *src = t->data;
        for (int64_t i = 0; i < t->n_elements; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = comet_quant_f16_value(h);
        }
    }
    drop_mapped(t->data, t->n_bytes);
    *out = dst;
    return COMET_OK;
}

/* An fp16 tensor [d0, d1] copied as it is (fp16 bits). */
static comet_status load_f16(ctx *c, const char *name, int d0, int d1, uint16_t **out) {
    const comet_st_tensor *t;
    COMET_TRY(get_tensor(c, name, COMET_ST_F16, d0, d1, &t));
    uint16_t *dst = own_alloc(c, t->n_bytes);
    NEED(dst);
    memcpy(dst, t->data, t->n_bytes);
    drop_mapped(t->data, t->n_bytes);
    *out = dst;
    return COMET_OK;
}

static comet_status load_perm(ctx *c, const char *name, int K, int32_t **out) {
    const comet_st_tensor *t;
    COMET_TRY(get_tensor(c, name, COMET_ST_I32, K, 0, &t));
    int32_t *p = own_alloc(c, (size_t)K * sizeof *p);
    uint8_t *seen = calloc((size_t)K, 1);
    if (!p || !seen) {
        free(seen);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->st_path);
    }
    memcpy(p, t->data, (size_t)K * sizeof *p);
    for (int k = 0; k < K; k++) {
        if (p[k] < 0 || p[k] >= K || seen[p[k]]) {
            free(seen);
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor %s is not a permutation of "
                                   "0..%d (entry %d = %d)",
                                   c->st_path, name, K - 1, k, (int)p[k]);
        }
        seen[p[k]] = 1;
    }
    free(seen);
    *out = p;
    return COMET_OK;
}

static comet_status load_linear(ctx *c, comet_linear *lin, const char *base, int N, int K,
                                int block, int n8, const int32_t *perm, const int32_t *folded) {
    const comet_quant_config *q = c->m->quant;
    char name[192];
    memset(lin, 0, sizeof *lin);
    lin->n_out = N, lin->n_in = K;
    lin->fmt = COMET_WFMT_QSIM;
    lin->perm = perm, lin->perm_folded = folded;
    lin->block = block, lin->n8 = n8;
    lin->a_bits = q->a_bits;
    lin->w_bits = q->w_bits;
    if (q->w_bits >= 16) {
        snprintf(name, sizeof name, "%s.weight", base);
        return load_float(c, name, q->w_bits == 16 ? COMET_ST_F16 : COMET_ST_F32, N, K, &lin->w);
    }
    const comet_st_tensor *qt, *stt;
    snprintf(name, sizeof name, "%s.qweight", base);
    if (q->w_bits == 4)
        COMET_TRY(get_tensor(c, name, COMET_ST_U8, N, K / 2, &qt));
    else
        COMET_TRY(get_tensor(c, name, COMET_ST_I8, N, K, &qt));
    snprintf(name, sizeof name, "%s.scales", base);
    COMET_TRY(get_tensor(c, name, COMET_ST_F16, N, K / block, &stt));
    lin->qw = own_alloc(c, qt->n_bytes);
    lin->sw = own_alloc(c, stt->n_bytes);
    if (!lin->qw || !lin->sw)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->st_path);
    memcpy(lin->qw, qt->data, qt->n_bytes);
    memcpy(lin->sw, stt->data, stt->n_bytes);
    drop_mapped(qt->data, qt->n_bytes);
    if (c->keep_codes_only && q->a_bits < 16)
        return COMET_OK; /* run on the codes: no dequantized copy */
    lin->w = own_alloc(c, (size_t)N * K * sizeof *lin->w);
    int8_t *codes = malloc((size_t)N * K);
    if (!lin->w || !codes) {
        free(codes);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->st_path);
    }
    if (q->w_bits == 4)
        comet_w4_unpack(lin->qw, N, K, codes);
    else
        memcpy(codes, lin->qw, (size_t)N * K);
    comet_quant_w_dequant(codes, lin->sw, N, K, block, lin->w);
    free(codes);
    return COMET_OK;
}

static comet_status load_tensors(ctx *c, const int *n8, const int *blk) {
    comet_model *m = c->m;
    const comet_model_config *cfg = &m->cfg;
    int C = cfg->n_embd, F = cfg->n_ff, HD = cfg->n_head * cfg->head_dim;
    int KVD = cfg->n_head_kv * cfg->head_dim;
    comet_st_dtype et = m->quant->w_bits == 32 ? COMET_ST_F32 : COMET_ST_F16;
    c->keep_codes_only = c->keep_codes_only && m->quant->w_bits <= 8 && m->quant->a_bits < 16;
    if (c->keep_codes_only) { /* fp16 in the file: kept as it is */
        COMET_TRY(load_f16(c, "model.embed_tokens.weight", cfg->n_vocab, C, &m->tok_embd_f16));
        if (cfg->tie_embeddings)
            m->lm_head_f16 = m->tok_embd_f16;
        else
            COMET_TRY(load_f16(c, "lm_head.weight", cfg->n_vocab, C, &m->lm_head_f16));
    } else {
        COMET_TRY(load_float(c, "model.embed_tokens.weight", et, cfg->n_vocab, C, &m->tok_embd));
        if (cfg->tie_embeddings)
            m->lm_head = m->tok_embd;
        else
            COMET_TRY(load_float(c, "lm_head.weight", et, cfg->n_vocab, C, &m->lm_head));
    }
    COMET_TRY(load_float(c, "model.norm.weight", COMET_ST_F32, C, 0, &m->output_norm));
    m->layers = calloc((size_t)cfg->n_layer, sizeof *m->layers);
    NEED(m->layers);
    char name[192], base[160];
    for (int l = 0; l < cfg->n_layer; l++) {
        comet_layer_weights *lw = &m->layers[l];
        const int *ln8 = n8 + 4 * l, *lb = blk + 4 * l;
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        COMET_TRY(load_float(c, name, COMET_ST_F32, C, 0, &lw->attn_norm));
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        COMET_TRY(load_float(c, name, COMET_ST_F32, C, 0, &lw->ffn_norm));
        int32_t *p_qkv, *p_o, *p_gu, *p_down;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.qkv_perm", l);
        COMET_TRY(load_perm(c, name, C, &p_qkv));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_perm", l);
        COMET_TRY(load_perm(c, name, HD, &p_o));
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_up_perm", l);
        COMET_TRY(load_perm(c, name, C, &p_gu));
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_perm", l);
        COMET_TRY(load_perm(c, name, F, &p_down));
#define LIN(field, sub, N, K, g, perm, folded)                                                     \
    do {                                                                                           \
        snprintf(base, sizeof base, "model.layers.%d.%s", l, sub);                                 \
        COMET_TRY(load_linear(c, &lw->field, base, N, K, lb[g], ln8[g], perm, folded));            \
    } while (0)
        LIN(wq, "self_attn.q_proj", HD, C, COMET_GROUP_QKV, p_qkv, NULL);
        LIN(wk, "self_attn.k_proj", KVD, C, COMET_GROUP_QKV, p_qkv, NULL);
        LIN(wv, "self_attn.v_proj", KVD, C, COMET_GROUP_QKV, p_qkv, NULL);
        LIN(wo, "self_attn.o_proj", C, HD, COMET_GROUP_O, p_o, NULL);
        LIN(w_gate, "mlp.gate_proj", F, C, COMET_GROUP_GATE_UP, p_gu, NULL);
        LIN(w_up, "mlp.up_proj", F, C, COMET_GROUP_GATE_UP, p_gu, NULL);
        LIN(w_down, "mlp.down_proj", C, F, COMET_GROUP_DOWN, NULL, p_down);
#undef LIN
    }
    return COMET_OK;
}

/* tokenizer.json and tokenizer_config.json (chat template, add_bos_token). */
static comet_status load_tokenizer(ctx *c) {
    comet_model *m = c->m;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", c->dir);
    m->tok = comet_tokenizer_from_hf_json(path);
    if (!m->tok)
        return COMET_ERR_FORMAT;
    if (comet_tokenizer_n_vocab(m->tok) > m->cfg.n_vocab)
        return comet_set_error(COMET_ERR_FORMAT, "%s: %d tokens but vocab_size is %d", path,
                               comet_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", c->dir);
    comet_status st = COMET_OK;
    cJSON *tc = read_json(path, &st);
    if (!tc)
        return st;
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
    if (cJSON_IsString(tmpl)) {
        m->chat_template = strdup(tmpl->valuestring);
        if (!m->chat_template)
            st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
    }
    m->cfg.add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token"));
    cJSON_Delete(tc);
    return st;
}

static comet_status load(ctx *c) {
    comet_status st = COMET_OK;
    snprintf(c->cfg_path, sizeof c->cfg_path, "%s/config.json", c->dir);
    snprintf(c->st_path, sizeof c->st_path, "%s/model.safetensors", c->dir);
    cJSON *j = read_json(c->cfg_path, &st);
    if (!j)
        return st;
    int *n8 = NULL, *blk = NULL;
    const cJSON *qj = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    if (!cJSON_IsObject(qj))
        st = comet_set_error(COMET_ERR_FORMAT,
                             "%s: quantization_config: missing (not a comet "
                             "checkpoint)",
                             c->cfg_path);
    if (st == COMET_OK)
        st = parse_model_config(c, j, &c->m->cfg);
    if (st == COMET_OK) {
        n8 = malloc((size_t)c->m->cfg.n_layer * 4 * sizeof *n8);
        blk = malloc((size_t)c->m->cfg.n_layer * 4 * sizeof *blk);
        st = n8 && blk ? parse_quant_config(c, qj, n8, blk)
                       : comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", c->cfg_path);
    }
    if (st == COMET_OK) { /* the model line a GGUF file and an HF directory print too */
        const comet_model_config *mc = &c->m->cfg;
        const comet_quant_config *q = c->m->quant;
        comet_log(COMET_LOG_INFO,
                  "%s: llama, %d layers, C=%d, F=%d, H=%d/%d, D=%d, V=%d, comet checkpoint "
                  "W%dA%d KV%d, %s lm_head",
                  c->dir, mc->n_layer, mc->n_embd, mc->n_ff, mc->n_head, mc->n_head_kv,
                  mc->head_dim, mc->n_vocab, q->w_bits, q->a_bits, comet_kv_type_bits(q->kv.type),
                  q->lm_head_bits == 8 ? "INT8" : "fp16");
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(j, "_name_or_path");
    if (st == COMET_OK)
        c->m->name = strdup(cJSON_IsString(nm) ? nm->valuestring : c->dir);
    cJSON_Delete(j);
    if (st == COMET_OK)
        st = comet_st_open(c->st_path, &c->st);
    if (st == COMET_OK)
        st = load_tensors(c, n8, blk);
    if (st == COMET_OK && c->m->quant->lm_head_bits == 8)
        st = comet_model_lm_head_quantize(c->m);
    free(n8);
    free(blk);
    comet_st_free(c->st);
    c->st = NULL;
    if (st == COMET_OK)
        st = load_tokenizer(c);
    return st;
}

comet_status comet_checkpoint_load(const char *dir, comet_model **out) {
    return comet_checkpoint_load_with(dir, 0, out);
}

comet_status comet_checkpoint_load_with(const char *dir, int keep_codes_only, comet_model **out) {
    *out = NULL;
    ctx c = {.dir = dir, .keep_codes_only = keep_codes_only};
    c.m = calloc(1, sizeof *c.m);
    if (!c.m)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", dir);
    c.m->path = strdup(dir);
    comet_status st = c.m->path ? load(&c) : comet_set_error(COMET_ERR_NOMEM, "out of memory");
    if (st < 0) {
        comet_model_free(c.m);
        return st;
    }
    *out = c.m;
    return COMET_OK;
}

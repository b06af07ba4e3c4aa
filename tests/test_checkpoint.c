/* test_checkpoint.c — the comet quantized checkpoint (src/format/checkpoint.h): a model
 * quantized with GPTQ written, read back (every tensor byte-identical), written again
 * (identical files); corrupt checkpoints (bad JSON, unknown format_version, an
 * unsupported architecture or bias flag, missing tensor, wrong shape, a permutation that
 * is not one) give clear errors. Uses a small
 * synthetic model with the default model's vocabulary (tokenizer.json is written from
 * the default GGUF). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "comet/model.h"
#include "comet/tokenizer.h"
#include "format/checkpoint.h"
#include "quant/calib.h"
#include "quant/fmpq.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (float)((double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0) * 2.0f -
           1.0f;
}

static char model_path[4096], tmpdir[4096], tok_json[4300];

static float *rand_buf(comet_model *m, size_t n, float scale, float offset) {
    float *p = comet_model_own(m, malloc(n * sizeof *p));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = offset + scale * frand();
    return p;
}

static void rand_linear(comet_model *m, comet_linear *l, int N, int K) {
    l->n_out = N, l->n_in = K, l->fmt = COMET_WFMT_F32;
    l->w = rand_buf(m, (size_t)N * K, 0.1f, 0.0f);
}

/* 2 layers, C 128, F 256, 4 heads of 32 (2 KV heads), the default model's 49152 tokens. */
static comet_model *synthetic_model(void) {
    comet_model *m = calloc(1, sizeof *m);
    comet_model_config *c = &m->cfg;
    c->arch = COMET_ARCH_LLAMA;
    c->n_layer = 2, c->n_embd = 128, c->n_ff = 256, c->n_head = 4, c->n_head_kv = 2;
    c->head_dim = 32, c->n_vocab = 49152, c->n_ctx = 256, c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f, c->tie_embeddings = 1, c->bos_id = 1, c->n_eos = 1;
    c->eos_ids[0] = 2;
    m->tok_embd = rand_buf(m, (size_t)c->n_vocab * c->n_embd, 0.5f, 0.0f);
    m->lm_head = m->tok_embd;
    m->output_norm = rand_buf(m, c->n_embd, 0.1f, 1.0f);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        w->attn_norm = rand_buf(m, c->n_embd, 0.1f, 1.0f);
        w->ffn_norm = rand_buf(m, c->n_embd, 0.1f, 1.0f);
        rand_linear(m, &w->wq, 128, 128);
        rand_linear(m, &w->wk, 64, 128);
        rand_linear(m, &w->wv, 64, 128);
        rand_linear(m, &w->wo, 128, 128);
        rand_linear(m, &w->w_gate, 256, 128);
        rand_linear(m, &w->w_up, 256, 128);
        rand_linear(m, &w->w_down, 128, 256);
    }
    m->chat_template = strdup("{% for message in messages %}<|im_start|>...{% endfor %}");
    m->name = strdup("synthetic");
    if (tok_json[0]) {
        m->tok = comet_tokenizer_from_hf_json(tok_json);
        assert_non_null(m->tok);
    }
    return m;
}

/* Statistics from random inputs with a few outlier channels. */
static comet_calib_stats *synthetic_stats(const comet_model *m) {
    comet_calib_stats *cs = comet_calib_stats_init(&m->cfg, 1);
    assert_non_null(cs);
    enum {
        T = 300
    };
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
            int K = cs->width[g];
            float *x = malloc((size_t)T * K * sizeof *x);
            for (int t = 0; t < T; t++)
                for (int k = 0; k < K; k++) {
                    x[t * K + k] = frand() * (k % 29 == 3 ? 40.0f : 1.0f);
                    if (k > 0) /* correlated neighbours */
                        x[t * K + k] += 0.3f * x[t * K + k - 1];
                }
            comet_calib_stats_observe(cs, l, (comet_group)g, x, T);
            free(x);
        }
    return cs;
}

static comet_model *quantized_model(int w_bits, int gptq) {
    comet_model *m = synthetic_model();
    comet_calib_stats *cs = synthetic_stats(m);
    comet_fmpq_params p = comet_fmpq_default_params();
    p.w_bits = w_bits, p.gptq = gptq, p.tau = 4.0f, p.int8_budget = 0.5f;
    assert_int_equal(comet_fmpq_quantize(m, cs, &p), COMET_OK);
    comet_calib_stats_free(cs);
    snprintf(m->quant->calib_corpus, sizeof m->quant->calib_corpus, "synthetic");
    return m;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void spit(const char *path, const char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

static void write_checkpoint(const comet_model *m, const char *dir) {
    assert_int_equal(comet_checkpoint_write(m, dir), COMET_OK);
    assert_int_equal(comet_checkpoint_write_tokenizer(m, model_path, dir), COMET_OK);
}

static void assert_linear_equal(const comet_linear *a, const comet_linear *b) {
    assert_int_equal(a->fmt, COMET_WFMT_QSIM);
    assert_int_equal(b->fmt, COMET_WFMT_QSIM);
    assert_int_equal(a->n_out, b->n_out);
    assert_int_equal(a->n_in, b->n_in);
    assert_int_equal(a->block, b->block);
    assert_int_equal(a->n8, b->n8);
    assert_int_equal(a->a_bits, b->a_bits);
    assert_int_equal(a->w_bits, b->w_bits);
    int N = a->n_out, K = a->n_in;
    assert_true((a->perm == NULL) == (b->perm == NULL));
    if (a->perm)
        assert_memory_equal(a->perm, b->perm, (size_t)K * sizeof(int32_t));
    assert_true((a->perm_folded == NULL) == (b->perm_folded == NULL));
    if (a->perm_folded)
        assert_memory_equal(a->perm_folded, b->perm_folded, (size_t)K * sizeof(int32_t));
    if (a->w_bits == 4)
        assert_memory_equal(a->qw, b->qw, (size_t)N * K / 2);
    if (a->w_bits == 8)
        assert_memory_equal(a->qw, b->qw, (size_t)N * K);
    if (a->w_bits <= 8)
        assert_memory_equal(a->sw, b->sw, (size_t)N * (K / a->block) * sizeof(uint16_t));
    assert_memory_equal(a->w, b->w, (size_t)N * K * sizeof(float));
}

static void round_trip(int w_bits, int gptq) {
    comet_model *m = quantized_model(w_bits, gptq);
    char d1[4200], d2[4200], p1[4300], p2[4300];
    snprintf(d1, sizeof d1, "%s/rt_a", tmpdir);
    snprintf(d2, sizeof d2, "%s/rt_b", tmpdir);
    write_checkpoint(m, d1);
    assert_true(comet_checkpoint_detect(d1));
    comet_model *r = NULL;
    assert_int_equal(comet_checkpoint_load(d1, &r), COMET_OK);
    assert_memory_equal(&r->cfg, &m->cfg, sizeof r->cfg);
    assert_int_equal(r->kv.type, COMET_KV_INT4);
    assert_int_equal(r->kv.group, m->kv.group);
    assert_int_equal(r->kv.group, 16); /* comet_kv_default_group(32): the default policy */
    assert_int_equal(r->kv.rotation, COMET_KV_ROTATION_HADAMARD); /* KV4, D = 32 */
    assert_int_equal(r->quant->kv.rotation, m->quant->kv.rotation);
    assert_non_null(r->quant);
    assert_int_equal(r->quant->w_bits, w_bits);
    assert_string_equal(r->quant->wmethod, w_bits >= 16 ? "none" : gptq ? "gptq" : "rtn");
    assert_non_null(r->tok);
    assert_non_null(r->chat_template);
    assert_string_equal(r->chat_template, m->chat_template);
    size_t n_embd = (size_t)m->cfg.n_vocab * m->cfg.n_embd;
    assert_memory_equal(r->tok_embd, m->tok_embd, n_embd * sizeof(float));
    assert_true(r->lm_head == r->tok_embd);
    /* the lm_head: INT8 rows with 4- and 8-bit weights (the default), the same codes as the
     * quantizer's; fp16 with 16-bit weights */
    const int V = m->cfg.n_vocab, C = m->cfg.n_embd;
    assert_int_equal(r->quant->lm_head_bits, w_bits <= 8 ? 8 : 16);
    assert_int_equal(r->lm_head_bits, m->lm_head_bits);
    if (w_bits <= 8) {
        assert_non_null(r->lm_head_q8);
        assert_memory_equal(r->lm_head_q8, m->lm_head_q8, (size_t)V * C);
        assert_memory_equal(r->lm_head_s8, m->lm_head_s8, (size_t)V * 2);
    } else {
        assert_null(r->lm_head_q8);
        assert_null(r->lm_head_s8);
    }
    assert_memory_equal(r->output_norm, m->output_norm, m->cfg.n_embd * sizeof(float));
    for (int l = 0; l < m->cfg.n_layer; l++) {
        comet_layer_weights *a = &m->layers[l], *b = &r->layers[l];
        assert_memory_equal(a->attn_norm, b->attn_norm, m->cfg.n_embd * sizeof(float));
        assert_memory_equal(a->ffn_norm, b->ffn_norm, m->cfg.n_embd * sizeof(float));
        assert_linear_equal(&a->wq, &b->wq);
        assert_linear_equal(&a->wk, &b->wk);
        assert_linear_equal(&a->wv, &b->wv);
        assert_linear_equal(&a->wo, &b->wo);
        assert_linear_equal(&a->w_gate, &b->w_gate);
        assert_linear_equal(&a->w_up, &b->w_up);
        assert_linear_equal(&a->w_down, &b->w_down);
    }
    /* Written again from the loaded model: the same bytes. */
    write_checkpoint(r, d2);
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json",
                           "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        size_t n1, n2;
        snprintf(p1, sizeof p1, "%s/%s", d1, files[i]);
        snprintf(p2, sizeof p2, "%s/%s", d2, files[i]);
        char *a = slurp(p1, &n1), *b = slurp(p2, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, n1);
        free(a), free(b);
    }
    comet_model_free(r);
    comet_model_free(m);
}

static void test_round_trip_w4_gptq(void **st) {
    (void)st;
    round_trip(4, 1);
}

static void test_round_trip_w8_rtn(void **st) {
    (void)st;
    round_trip(8, 0);
}

static void test_round_trip_w16(void **st) {
    (void)st;
    round_trip(16, 0);
}

/* The safetensors header: 8-byte length, JSON, padded to 8 bytes; data contiguous. */
static void test_safetensors_layout(void **st) {
    (void)st;
    comet_model *m = quantized_model(4, 0);
    char d[4200], p[4300];
    snprintf(d, sizeof d, "%s/layout", tmpdir);
    write_checkpoint(m, d);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t n;
    char *buf = slurp(p, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)(uint8_t)buf[i] << (8 * i);
    assert_true(hlen % 8 == 0);
    assert_true(8 + hlen <= n);
    assert_int_equal(buf[8], '{');
    assert_non_null(strstr(buf + 8, "\"model.layers.1.mlp.down_proj.qweight\""));
    assert_non_null(strstr(buf + 8, "\"dtype\":\"U8\",\"shape\":[128,128]"));
    free(buf);
    comet_model_free(m);
}

/* Copy checkpoint tmpdir/<from> to tmpdir/bad_<name> (its path in dir[4200]), replacing
 * `find` by `replace` (same length) in `file`. */
static void edited_copy(const char *from, const char *name, const char *file, const char *find,
                        const char *replace, char *dir) {
    char good[4200], src[4300], dst[4300];
    snprintf(good, sizeof good, "%s/%s", tmpdir, from);
    snprintf(dir, 4200, "%s/bad_%s", tmpdir, name);
    mkdir(dir, 0777);
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json",
                           "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        size_t n;
        snprintf(src, sizeof src, "%s/%s", good, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *buf = slurp(src, &n);
        if (!strcmp(files[i], file)) {
            char *at = strstr(buf + (strcmp(file, "model.safetensors") ? 0 : 8), find);
            assert_non_null(at);
            size_t fl = strlen(find), rl = strlen(replace);
            assert_int_equal(fl, rl); /* same length keeps offsets valid */
            memcpy(at, replace, rl);
        }
        spit(dst, buf, n);
        free(buf);
    }
}

/* edited_copy, then load: expect `want` and a message containing `needle`. */
static void expect_corrupt(const char *name, const char *file, const char *find,
                           const char *replace, comet_status want, const char *needle) {
    char dir[4200];
    edited_copy("good", name, file, find, replace, dir);
    comet_model *m = NULL;
    comet_clear_error();
    comet_status got = comet_checkpoint_load(dir, &m);
    print_message("%s: %s\n", name, comet_last_error());
    assert_int_equal(got, want);
    assert_null(m);
    assert_non_null(strstr(comet_last_error(), needle));
}

static void test_corrupt_checkpoints(void **st) {
    (void)st;
    comet_model *m = quantized_model(4, 0);
    char good[4200];
    snprintf(good, sizeof good, "%s/good", tmpdir);
    write_checkpoint(m, good);
    comet_model_free(m);
    expect_corrupt("json", "config.json", "\"hidden_size\":", "\"hidden_size\"=", COMET_ERR_FORMAT,
                   "bad JSON");
    expect_corrupt("version", "config.json", "\"format_version\":\t3", "\"format_version\":\t7",
                   COMET_ERR_UNSUPPORTED, "format_version 7 is not known");
    expect_corrupt("lm_head_bits", "config.json", "\"lm_head_bits\":\t8", "\"lm_head_bits\":\t4",
                   COMET_ERR_UNSUPPORTED, "lm_head_bits 4: 8 or 16 expected");
    /* an integer past int's range is refused, not cast (undefined in C) */
    expect_corrupt("int_range", "config.json", "\"kv_group_size\":\t16", "\"kv_group_size\":9e9",
                   COMET_ERR_FORMAT, "kv_group_size: an integer expected");
    expect_corrupt("lm_head_key", "config.json",
                   "\"lm_head_bits\":", "\"lm_head_bitz\":", COMET_ERR_FORMAT,
                   "lm_head_bits: missing");
    expect_corrupt("rotation", "config.json", "\"kv_rotation\":\t\"hadamard\"",
                   "\"kv_rotation\":\t\"hadamaro\"", COMET_ERR_UNSUPPORTED,
                   "kv_rotation: \"none\" or \"hadamard\" expected");
    /* the KV format: the type derived from kv_bits, the group through comet_kv_format_check */
    expect_corrupt("kv_bits", "config.json", "\"kv_bits\":\t4", "\"kv_bits\":\t5",
                   COMET_ERR_UNSUPPORTED, "kv_bits 5: 4, 8 or 16 expected");
    expect_corrupt("kv_group", "config.json", "\"kv_group_size\":\t16", "\"kv_group_size\":\t12",
                   COMET_ERR_FORMAT,
                   "quantization_config: KV group 12 does not divide the head dim 32");
    expect_corrupt("missing", "model.safetensors", "model.layers.1.self_attn.k_proj.scales",
                   "model.layers.1.self_attn.k_proj.scalez", COMET_ERR_FORMAT,
                   "tensor model.layers.1.self_attn.k_proj.scales is missing");
    expect_corrupt("shape", "model.safetensors",
                   "\"model.layers.0.mlp.down_proj.scales\":{\"dtype\":\"F16\",\"shape\":[128,2]",
                   "\"model.layers.0.mlp.down_proj.scales\":{\"dtype\":\"F16\",\"shape\":[2,128]",
                   COMET_ERR_FORMAT, "down_proj.scales: shape [2, 128], [128, 2] expected");
    expect_corrupt("dtype", "model.safetensors", "\"model.norm.weight\":{\"dtype\":\"F32\"",
                   "\"model.norm.weight\":{\"dtype\":\"I32\"", COMET_ERR_FORMAT,
                   "model.norm.weight: dtype I32, F32 expected");
    expect_corrupt("n8", "config.json", "\"n8\":\t", "\"n9\":\t", COMET_ERR_FORMAT, "n8");
    /* the model variant: the architecture and the bias flags are read and refused by name */
    expect_corrupt("arch", "config.json", "\"LlamaForCausalLM\"", "\"Qwen2ForCausalLM\"",
                   COMET_ERR_UNSUPPORTED, "architecture 'Qwen2ForCausalLM' is not supported");
    expect_corrupt("attn_bias", "config.json", "\"attention_bias\":\tfalse",
                   "\"attention_bias\":\ttrue ", COMET_ERR_UNSUPPORTED, "qkv_bias: llama q/k/v");
    expect_corrupt("mlp_bias", "config.json", "\"mlp_bias\":\tfalse", "\"mlp_bias\":\ttrue ",
                   COMET_ERR_UNSUPPORTED, "mlp_bias");
    expect_corrupt("bias_type", "config.json", "\"mlp_bias\":\tfalse", "\"mlp_bias\":\t\"no\" ",
                   COMET_ERR_FORMAT, "mlp_bias: true or false expected");
    /* format_version 1 (no kv_rotation key) still loads, with its meaning: no rotation;
     * version 2 without the key is refused */
    char dir[4200];
    comet_model *r = NULL;
    edited_copy("good", "nokey", "config.json", "\"kv_rotation\":", "\"kv_rotatioX\":", dir);
    assert_int_equal(comet_checkpoint_load(dir, &r), COMET_ERR_UNSUPPORTED);
    edited_copy("bad_nokey", "v1", "config.json", "\"format_version\":\t3",
                "\"format_version\":\t1", dir);
    assert_int_equal(comet_checkpoint_load(dir, &r), COMET_OK);
    assert_int_equal(r->quant->format_version, 1);
    assert_int_equal(r->kv.type, COMET_KV_INT4);
    assert_int_equal(r->kv.rotation, COMET_KV_ROTATION_NONE);
    assert_int_equal(r->quant->lm_head_bits, 16); /* before version 3: an fp16 lm_head */
    assert_null(r->lm_head_q8);
    comet_model_free(r);
    /* format_version 2 (kv_rotation, no lm_head_bits key) loads with an fp16 lm_head */
    edited_copy("good", "v2", "config.json", "\"format_version\":\t3", "\"format_version\":\t2",
                dir);
    edited_copy("bad_v2", "v2_nokey", "config.json", "\"lm_head_bits\":", "\"lm_head_bitz\":", dir);
    assert_int_equal(comet_checkpoint_load(dir, &r), COMET_OK);
    assert_int_equal(r->quant->format_version, 2);
    assert_int_equal(r->quant->lm_head_bits, 16);
    assert_int_equal(r->lm_head_bits, 0);
    assert_null(r->lm_head_q8);
    comet_model_free(r);
}

/* A permutation with a repeated entry is refused. */
static void test_bad_permutation(void **st) {
    (void)st;
    comet_model *m = quantized_model(4, 0);
    int32_t *p = (int32_t *)m->layers[0].wo.perm;
    p[5] = p[6];
    char d[4200];
    snprintf(d, sizeof d, "%s/badperm", tmpdir);
    write_checkpoint(m, d);
    comet_model_free(m);
    comet_model *r = NULL;
    assert_int_equal(comet_checkpoint_load(d, &r), COMET_ERR_FORMAT);
    assert_non_null(strstr(comet_last_error(), "self_attn.o_perm is not a permutation"));
}

static void test_write_needs_quantized_model(void **st) {
    (void)st;
    comet_model *m = synthetic_model();
    char d[4200];
    snprintf(d, sizeof d, "%s/fp", tmpdir);
    assert_int_equal(comet_checkpoint_write(m, d), COMET_ERR_INVALID_ARG);
    comet_model_free(m);
    comet_model *r = NULL;
    assert_int_equal(comet_checkpoint_load("/nonexistent/dir", &r), COMET_ERR_IO);
}

/* Calibration statistics saved and read back equal; another corpus or window count is
 * refused by name; a truncated file is a format error. */
static void test_calib_cache(void **st) {
    (void)st;
    comet_model *m = synthetic_model();
    comet_calib_stats *cs = synthetic_stats(m), *back = NULL;
    comet_calib_meta meta = {.windows = 16, .window_len = 512};
    snprintf(meta.model, sizeof meta.model, "models/x.gguf");
    snprintf(meta.corpus, sizeof meta.corpus, "data/mobydick.txt");
    char path[4300];
    snprintf(path, sizeof path, "%s/calib.bin", tmpdir);
    assert_int_equal(comet_calib_stats_save(cs, &meta, path), COMET_OK);
    comet_calib_meta same = meta;
    snprintf(same.model, sizeof same.model, "/elsewhere/x.gguf"); /* matched by file name */
    assert_int_equal(comet_calib_stats_load(path, &m->cfg, &same, 1, &back), COMET_OK);
    assert_int_equal(back->n_tokens, cs->n_tokens);
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        size_t K = (size_t)cs->width[g];
        assert_memory_equal(back->sal[g], cs->sal[g], (size_t)cs->n_layer * K * sizeof(float));
        assert_memory_equal(back->xtx[g], cs->xtx[g], (size_t)cs->n_layer * K * K * sizeof(float));
    }
    comet_calib_stats_free(back);
    comet_calib_meta other = meta;
    other.windows = 8;
    assert_int_equal(comet_calib_stats_load(path, &m->cfg, &other, 1, &back),
                     COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "do not match"));
    assert_null(back);
    size_t n;
    char *buf = slurp(path, &n);
    spit(path, buf, n / 2);
    free(buf);
    assert_int_equal(comet_calib_stats_load(path, &m->cfg, &meta, 1, &back), COMET_ERR_FORMAT);
    assert_non_null(strstr(comet_last_error(), "truncated"));
    comet_calib_stats_free(cs);
    comet_model_free(m);
}

/* The tokenizer.json written from the GGUF metadata tokenizes like the GGUF's tokenizer. */
static void test_tokenizer_json_from_gguf(void **st) {
    (void)st;
    comet_model *m = NULL;
    assert_int_equal(comet_model_load(model_path, &m), COMET_OK);
    comet_tokenizer *t = comet_tokenizer_from_hf_json(tok_json);
    assert_non_null(t);
    assert_int_equal(comet_tokenizer_n_vocab(t), comet_tokenizer_n_vocab(m->tok));
    const char *texts[] = {
        "Hello, world! It's 2026: 12345 apples.",
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
        "  multiple   spaces\n\n\tand tabs; unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
        "\xf0\x9f\x98\x80 code: for (int i = 0; i < n; i++) { x += y[i]; }",
    };
    for (int i = 0; i < 3; i++)
        for (int special = 0; special < 2; special++) {
            int32_t *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            assert_int_equal(
                comet_tokenizer_encode(m->tok, texts[i], strlen(texts[i]), special, &a, &na),
                COMET_OK);
            assert_int_equal(
                comet_tokenizer_encode(t, texts[i], strlen(texts[i]), special, &b, &nb), COMET_OK);
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, na * sizeof *a);
            free(a), free(b);
        }
    comet_tokenizer_free(t);
    comet_model_free(m);
}

int main(void) {
    const char *src = getenv("COMET_SOURCE_DIR");
    snprintf(model_path, sizeof model_path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf",
             src ? src : ".");
    if (access(model_path, R_OK) != 0) {
        fprintf(stderr, "test_checkpoint: the default model %s is missing (run the setup)\n",
                model_path);
        return 1;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/comet_test_checkpoint_%d", (int)getpid());
    mkdir(tmpdir, 0777);
    /* The synthetic models use the default model's tokenizer, written once from its GGUF. */
    char tokdir[4200];
    snprintf(tokdir, sizeof tokdir, "%s/tok", tmpdir);
    mkdir(tokdir, 0777);
    comet_model *tm = synthetic_model();
    if (comet_checkpoint_write_tokenizer(tm, model_path, tokdir) != COMET_OK) {
        fprintf(stderr, "test_checkpoint: %s\n", comet_last_error());
        return 1;
    }
    comet_model_free(tm);
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", tokdir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_w4_gptq),
        cmocka_unit_test(test_round_trip_w8_rtn),
        cmocka_unit_test(test_round_trip_w16),
        cmocka_unit_test(test_safetensors_layout),
        cmocka_unit_test(test_corrupt_checkpoints),
        cmocka_unit_test(test_bad_permutation),
        cmocka_unit_test(test_write_needs_quantized_model),
        cmocka_unit_test(test_tokenizer_json_from_gguf),
        cmocka_unit_test(test_calib_cache),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_checkpoint: could not remove %s\n", tmpdir);
    return rc;
}

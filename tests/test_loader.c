/* test_loader.c — comet_model_load on GGUF and HF checkpoints.
 *
 * - The default model: config against scripts/golden_gguf.py's "meta" lines, and the
 *   Q/K/V weights against transformers' own GGUF reverse permutation ("hf" lines).
 * - The tiny checkpoints of scripts/make_tiny_fixtures.py: HF BF16 single file, HF F16
 *   sharded + tied, and GGUF (permuted Q/K, mixed types) all load to the formula values
 *   the script wrote, so GGUF and HF loading agree weight for weight.
 * - Bad input: unknown architecture (GGUF and config.json), bias tensors and bias keys
 *   (refused naming the variant flag), missing tokenizer, missing tensor, wrong shape,
 *   sliding-window Mistral, quantized checkpoint, missing path.
 * - The end-of-generation set: the ids the GGUF / config.json / generation_config.json name
 *   plus every control token whose text is an end marker (<|eot_id|>, <|end_of_text|>, ...),
 *   and greedy generation on a built GGUF stopping at once on either Llama-3 marker.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "engine/generate.h"
#include "test_util.h"

/* ---- the default model vs golden values -------------------------------------------- */

static comet_model *smol;

static int load_smol(void **state) {
    (void)state;
    comet_status st = comet_model_load(default_model_path(), &smol);
    if (st != COMET_OK) {
        fprintf(stderr, "load %s: %s\n", default_model_path(), comet_last_error());
        return -1;
    }
    return 0;
}

static int free_smol(void **state) {
    (void)state;
    comet_model_free(smol);
    return 0;
}

static void test_default_config(void **state) {
    (void)state;
    const comet_model_config *c = &smol->cfg;
    size_t n = 0;
    char *txt = read_file(src_path("tests/fixtures/gguf_golden.txt"), &n);
    assert_non_null(txt);
    int n_meta = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        char key[64];
        double v;
        if (sscanf(line, "meta %63s %lf", key, &v) != 2)
            continue;
        struct {
            const char *k;
            double got;
        } map[] = {
            {"n_layer", c->n_layer},    {"n_embd", c->n_embd},         {"n_ff", c->n_ff},
            {"n_head", c->n_head},      {"n_head_kv", c->n_head_kv},   {"n_ctx", c->n_ctx},
            {"n_vocab", c->n_vocab},    {"rope_theta", c->rope_theta}, {"rms_eps", c->rms_eps},
            {"bos_id", c->bos_id},      {"eos_id", c->eos_ids[0]},     {"add_bos", c->add_bos},
            {"tied", c->tie_embeddings}};
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (!strcmp(map[i].k, key)) {
                if (fabs(map[i].got - v) > 1e-6 * fabs(v))
                    fail_msg("%s: got %g want %g", key, map[i].got, v);
                n_meta++;
            }
    }
    assert_int_equal(n_meta, 13);
    free(txt);
    assert_int_equal(c->arch, COMET_ARCH_LLAMA);
    assert_string_equal(comet_arch_name(c->arch), "llama");
    assert_int_equal(c->qkv_bias + c->o_bias + c->mlp_bias, 0);
    assert_int_equal(c->head_dim, 64);
    /* eos <|im_end|> (2), then the control end marker <|endoftext|> (0), as llama.cpp's
     * end-of-generation set */
    assert_int_equal(c->n_eos, 2);
    assert_int_equal(c->eos_ids[1], 0);
    assert_int_equal(c->rope_scaling, COMET_ROPE_SCALING_NONE);
    assert_ptr_equal(smol->lm_head, smol->tok_embd);
    assert_non_null(smol->tok);
    assert_int_equal(comet_tokenizer_n_vocab(smol->tok), c->n_vocab);
    assert_non_null(smol->chat_template);
    assert_non_null(strstr(smol->chat_template, "<|im_start|>"));
    assert_non_null(smol->name);
}

/* "hf" lines: weights after transformers' reverse permutation, sampled at moved rows. */
static void test_default_qk_order(void **state) {
    (void)state;
    size_t n = 0;
    char *txt = read_file(src_path("tests/fixtures/gguf_golden.txt"), &n);
    assert_non_null(txt);
    int n_hf = 0;
    char *save = NULL;
    for (char *line = strtok_r(txt, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[96];
        int rows, cols, off, layer;
        double s, ws;
        if (sscanf(line, "hf %95s %d %d %lf %lf%n", name, &rows, &cols, &s, &ws, &off) != 5)
            continue;
        char which;
        assert_int_equal(sscanf(name, "blk.%d.attn_%c", &layer, &which), 2);
        const comet_layer_weights *L = &smol->layers[layer];
        const comet_linear *lin = which == 'q' ? &L->wq : which == 'k' ? &L->wk : &L->wv;
        assert_int_equal(lin->n_out, rows);
        assert_int_equal(lin->n_in, cols);
        double gs = 0, gws = 0;
        for (int r = 0; r < rows; r++) {
            double rs = 0;
            for (int c = 0; c < cols; c++)
                rs += lin->w[(size_t)r * cols + c];
            gs += rs;
            gws += (r + 1) * rs;
        }
        if (fabs(gs - s) > 1e-9 * (fabs(s) + 1) || fabs(gws - ws) > 1e-9 * (fabs(ws) + 1))
            fail_msg("%s: sums %.17g %.17g want %.17g %.17g", name, gs, gws, s, ws);
        char *p = line + off;
        int n_rows = 0;
        while (*p == ' ') {
            int row = (int)strtol(p + 1, &p, 10);
            assert_int_equal(*p, ':');
            p++;
            for (int c = 0; c < 8; c++) {
                float want = strtof(p, &p);
                if (*p == ',')
                    p++;
                float got = lin->w[(size_t)row * cols + c];
                if (got != want)
                    fail_msg("%s row %d col %d: got %.9g want %.9g", name, row, c, got, want);
            }
            n_rows++;
        }
        assert_int_equal(n_rows, 12);
        n_hf++;
    }
    assert_int_equal(n_hf, 5);
    free(txt);
}

/* ---- the tiny checkpoints ----------------------------------------------------------- */

static float formula(int t, int64_t i) { return (float)((37 * i + 11 * t) % 129 - 64) / 64.0f; }

static void check_formula(const float *w, int64_t n, int t, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (w[i] != formula(t, i))
            fail_msg("%s[%lld] = %g, want %g", what, (long long)i, w[i], formula(t, i));
}

/* Every weight against the formula; tensor numbers follow the script's NAMES order. */
static void check_tiny(const comet_model *m, int tied, float theta) {
    const comet_model_config *c = &m->cfg;
    assert_int_equal(c->n_layer, 2);
    assert_int_equal(c->n_embd, 32);
    assert_int_equal(c->n_ff, 64);
    assert_int_equal(c->n_head, 4);
    assert_int_equal(c->n_head_kv, 2);
    assert_int_equal(c->head_dim, 8);
    assert_int_equal(c->n_vocab, 300);
    assert_int_equal(c->n_ctx, 256);
    assert_true(c->rms_eps == 1e-5f);
    assert_true(c->rope_theta == theta);
    assert_int_equal(c->bos_id, 0);
    assert_int_equal(c->add_bos, 0);
    assert_int_equal(c->eos_ids[0], 2);
    int V = c->n_vocab, C = c->n_embd;
    check_formula(m->tok_embd, (int64_t)V * C, 0, "tok_embd");
    check_formula(m->output_norm, C, 1, "output_norm");
    if (tied)
        assert_ptr_equal(m->lm_head, m->tok_embd);
    else
        check_formula(m->lm_head, (int64_t)V * C, 2, "lm_head");
    for (int l = 0; l < 2; l++) {
        const comet_layer_weights *L = &m->layers[l];
        int t = 3 + 9 * l;
        check_formula(L->attn_norm, C, t, "attn_norm");
        check_formula(L->wq.w, 32 * 32, t + 1, "wq");
        check_formula(L->wk.w, 16 * 32, t + 2, "wk");
        check_formula(L->wv.w, 16 * 32, t + 3, "wv");
        check_formula(L->wo.w, 32 * 32, t + 4, "wo");
        check_formula(L->ffn_norm, C, t + 5, "ffn_norm");
        check_formula(L->w_gate.w, 64 * 32, t + 6, "w_gate");
        check_formula(L->w_up.w, 64 * 32, t + 7, "w_up");
        check_formula(L->w_down.w, 32 * 64, t + 8, "w_down");
        assert_int_equal(L->wk.n_out, 16);
        assert_int_equal(L->wo.n_in, 32);
        assert_int_equal(L->w_down.n_in, 64);
    }
    assert_non_null(m->tok);
    assert_non_null(m->chat_template);
    assert_non_null(strstr(m->chat_template, "<|im_start|>"));
}

static void test_tiny_hf(void **state) {
    (void)state;
    comet_model *m;
    comet_status st = comet_model_load(src_path("tests/fixtures/tiny_hf"), &m);
    if (st != COMET_OK)
        fail_msg("%s", comet_last_error());
    check_tiny(m, 0, 50000.0f);
    assert_int_equal(m->cfg.n_eos, 2); /* config.json eos_token_id is the list [2, 0] */
    assert_int_equal(m->cfg.eos_ids[1], 0);
    comet_model_free(m);
}

static void test_tiny_hf_sharded(void **state) {
    (void)state;
    comet_model *m;
    comet_status st = comet_model_load(src_path("tests/fixtures/tiny_hf_sharded/"), &m);
    if (st != COMET_OK)
        fail_msg("%s", comet_last_error());
    check_tiny(m, 1, 50000.0f);
    assert_int_equal(m->cfg.rope_scaling, COMET_ROPE_SCALING_LLAMA3);
    assert_true(m->cfg.rope_factor == 8.0f);
    assert_true(m->cfg.rope_low_freq_factor == 1.0f);
    assert_true(m->cfg.rope_high_freq_factor == 4.0f);
    assert_int_equal(m->cfg.rope_orig_ctx, 64);
    assert_string_equal(m->name, "tiny_hf_sharded");
    comet_model_free(m);
}

static void test_tiny_gguf(void **state) {
    (void)state;
    comet_model *m;
    comet_status st = comet_model_load(src_path("tests/fixtures/tiny.gguf"), &m);
    if (st != COMET_OK)
        fail_msg("%s", comet_last_error());
    /* Q (F32) and K (BF16) were stored permuted: the formula only holds after unpermuting. */
    check_tiny(m, 0, 50000.0f);
    assert_string_equal(m->name, "tiny-llama");
    assert_int_equal(m->cfg.rope_scaling, COMET_ROPE_SCALING_NONE);
    comet_model_free(m);
}

/* Llama-3.1 RoPE scaling stored as rope_freqs.weight (llama.cpp's converter formula,
 * factor 8, low/high 1/4, original context 8192): recovered as LLAMA3 parameters. */
static void test_tiny_llama3_gguf(void **state) {
    (void)state;
    comet_model *m;
    comet_status st = comet_model_load(src_path("tests/fixtures/tiny_llama3.gguf"), &m);
    if (st != COMET_OK)
        fail_msg("%s", comet_last_error());
    check_tiny(m, 0, 500000.0f);
    assert_int_equal(m->cfg.rope_scaling, COMET_ROPE_SCALING_LLAMA3);
    assert_true(m->cfg.rope_factor == 8.0f);
    assert_true(m->cfg.rope_low_freq_factor == 1.0f);
    assert_true(m->cfg.rope_high_freq_factor == 4.0f);
    assert_int_equal(m->cfg.rope_orig_ctx, 8192);
    comet_model_free(m);
}

/* ---- bad input ---------------------------------------------------------------------- */

static void expect_load(const char *path, comet_status want, const char *frag1, const char *frag2) {
    comet_model *m = NULL;
    comet_status got = comet_model_load(path, &m);
    if (got != want)
        fail_msg("%s: got %s want %s (%s)", path, comet_status_name(got), comet_status_name(want),
                 comet_last_error());
    assert_null(m);
    const char *msg = comet_last_error();
    if ((frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2)))
        fail_msg("message '%s' lacks '%s' / '%s'", msg, frag1 ? frag1 : "", frag2 ? frag2 : "");
}

/* A llama-shaped GGUF header; `arch` and whether to include tokenizer keys vary.
 * with_tokens == 2: no tokens, but a rope_freqs.weight that is not Llama-3 scaling;
 * `bias` names one more (1-D, 32-value) tensor, with tokens. */
static void write_small_gguf_bias(const char *path, const char *arch, int with_tokens,
                                  const char *bias) {
    gbuf b = {0};
    static const char *const toks[] = {"a", "b", "c", "<eos>"};
    gb_header(&b, 3, with_tokens == 2 || bias ? 1 : 0, with_tokens == 1 ? 10 : 8);
    kv_str(&b, "general.architecture", arch);
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    kv_u32(&b, KEY("block_count"), 1);
    kv_u32(&b, KEY("embedding_length"), 32);
    kv_u32(&b, KEY("feed_forward_length"), 64);
    kv_u32(&b, KEY("attention.head_count"), 4);
    kv_u32(&b, KEY("context_length"), 64);
    kv_f32(&b, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    kv_f32(&b, KEY("rope.freq_base"), 10000.0f);
#undef KEY
    if (with_tokens == 1) {
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_arr_str(&b, "tokenizer.ggml.tokens", 4, toks);
    }
    if (with_tokens == 2) {
        const float rf[4] = {1.0f, 2.0f, 3.0f, 4.0f}; /* head_dim 8 -> 4 frequencies */
        ti(&b, "rope_freqs.weight", 4, 0, 0, 0);
        gb_align(&b, 32);
        gb_put(&b, rf, sizeof rf);
    } else if (bias) {
        const float zero[32] = {0};
        ti(&b, bias, 32, 0, 0, 0);
        gb_align(&b, 32);
        gb_put(&b, zero, sizeof zero);
    }
    write_file(path, b.p, b.n);
    free(b.p);
}

static void write_small_gguf(const char *path, const char *arch, int with_tokens) {
    write_small_gguf_bias(path, arch, with_tokens, NULL);
}

static void test_bad_gguf(void **state) {
    (void)state;
    const char *p = tmp_file("arch.gguf");
    write_small_gguf(p, "gpt2", 1);
    expect_load(p, COMET_ERR_UNSUPPORTED, "architecture 'gpt2' is not supported",
                "supported: llama");
    write_small_gguf(p, "llama", 0);
    expect_load(p, COMET_ERR_FORMAT, "has no tokenizer (tokenizer.ggml.tokens missing)", p);
    write_small_gguf(p, "llama", 2);
    expect_load(p, COMET_ERR_UNSUPPORTED, "rope_freqs.weight[1] = 2", "Llama-3");
    /* a bias tensor in any layer sets its flag, which the config check refuses by name */
    write_small_gguf_bias(p, "llama", 1, "blk.0.attn_k.bias");
    expect_load(p, COMET_ERR_UNSUPPORTED, "qkv_bias: llama q/k/v projections with a bias",
                "not supported");
    write_small_gguf_bias(p, "llama", 1, "blk.0.attn_output.bias");
    expect_load(p, COMET_ERR_UNSUPPORTED, "o_bias", p);
    write_small_gguf_bias(p, "llama", 1, "blk.0.ffn_down.bias");
    expect_load(p, COMET_ERR_UNSUPPORTED, "mlp_bias", p);
    write_small_gguf(p, "qwen2", 1);
    expect_load(p, COMET_ERR_UNSUPPORTED, "architecture 'qwen2' is not supported",
                "supported: llama");
    /* The real model cut before its data: refused by the reader, naming the file. */
    const char *cut = tmp_file("cut_model.gguf");
    size_t n = 0;
    uint8_t *head = NULL;
    FILE *f = fopen(default_model_path(), "rb");
    assert_non_null(f);
    head = malloc(4 << 20);
    n = fread(head, 1, 4 << 20, f);
    fclose(f);
    write_file(cut, head, n);
    free(head);
    expect_load(cut, COMET_ERR_FORMAT, cut, "past the end");
    expect_load(tmp_file("nope.gguf"), COMET_ERR_IO, "not found", "nope.gguf");
    expect_load(tmp_file("nope_dir"), COMET_ERR_IO, "not found", NULL);
}

/* Copy tiny_hf into a temp dir, then replace one file. */
static const char *hf_copy(const char *name, const char *file, const char *content) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir(), name);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        char src[600], dst[600];
        snprintf(src, sizeof src, "tests/fixtures/tiny_hf/%s", files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        size_t n = 0;
        void *d = read_file(src_path(src), &n);
        assert_non_null(d);
        write_file(dst, d, n);
        free(d);
    }
    if (file) {
        char dst[600];
        snprintf(dst, sizeof dst, "%s/%s", dir, file);
        if (content)
            write_file(dst, content, strlen(content));
        else
            remove(dst);
    }
    return dir;
}

/* tiny_hf's config.json with one substitution. */
static char *config_with(const char *from, const char *to) {
    size_t n = 0;
    char *c = read_file(src_path("tests/fixtures/tiny_hf/config.json"), &n);
    char *at = strstr(c, from);
    assert_non_null(at);
    char *r = malloc(n + strlen(to) + 1);
    size_t pre = (size_t)(at - c);
    memcpy(r, c, pre);
    strcpy(r + pre, to);
    strcat(r, at + strlen(from));
    free(c);
    return r;
}

static void test_bad_hf(void **state) {
    (void)state;
    char *cfg = config_with("\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\"");
    expect_load(hf_copy("arch", "config.json", cfg), COMET_ERR_UNSUPPORTED,
                "architecture 'GPT2LMHeadModel' is not supported", "config.json");
    free(cfg);
    cfg = config_with("\"LlamaForCausalLM\"", "\"MistralForCausalLM\"], \"sliding_window\": [4096");
    expect_load(hf_copy("mistral_sw", "config.json", cfg), COMET_ERR_UNSUPPORTED, "sliding_window",
                NULL);
    free(cfg);
    cfg = config_with("\"LlamaForCausalLM\"",
                      "\"MistralForCausalLM\"], \"sliding_window\": null, \"x\": [0");
    comet_model *m = NULL;
    comet_status st = comet_model_load(hf_copy("mistral_ok", "config.json", cfg), &m);
    if (st != COMET_OK)
        fail_msg("mistral without sliding window: %s", comet_last_error());
    comet_model_free(m);
    free(cfg);
    /* the variant flags: transformers' LlamaConfig bias keys are read and refused by name */
    cfg = config_with("\"tie_word_embeddings\": false",
                      "\"attention_bias\": true, \"tie_word_embeddings\": false");
    expect_load(hf_copy("attn_bias", "config.json", cfg), COMET_ERR_UNSUPPORTED,
                "qkv_bias: llama q/k/v projections with a bias", "config.json");
    free(cfg);
    cfg = config_with("\"tie_word_embeddings\": false",
                      "\"mlp_bias\": true, \"tie_word_embeddings\": false");
    expect_load(hf_copy("mlp_bias", "config.json", cfg), COMET_ERR_UNSUPPORTED, "mlp_bias",
                "no backend adds a linear's bias");
    free(cfg);
    cfg = config_with("\"tie_word_embeddings\": false",
                      "\"attention_bias\": 1, \"tie_word_embeddings\": false");
    expect_load(hf_copy("bias_int", "config.json", cfg), COMET_ERR_FORMAT,
                "\"attention_bias\" must be a boolean", NULL);
    free(cfg);
    cfg = config_with("\"tie_word_embeddings\": false",
                      "\"attention_bias\": false, \"mlp_bias\": null, "
                      "\"tie_word_embeddings\": false");
    {
        comet_model *nb = NULL;
        if (comet_model_load(hf_copy("no_bias", "config.json", cfg), &nb) != COMET_OK)
            fail_msg("attention_bias false: %s", comet_last_error());
        assert_int_equal(nb->cfg.qkv_bias + nb->cfg.o_bias + nb->cfg.mlp_bias, 0);
        assert_int_equal(nb->cfg.arch, COMET_ARCH_LLAMA);
        comet_model_free(nb);
    }
    free(cfg);
    cfg = config_with("\"hidden_size\": 32", "\"hidden_size\": 48");
    expect_load(hf_copy("shape", "config.json", cfg), COMET_ERR_FORMAT,
                "'model.embed_tokens.weight' has shape [300, 32], expected [300, 48]", NULL);
    free(cfg);
    cfg = config_with("\"tie_word_embeddings\": false",
                      "\"quantization_config\": "
                      "{\"quant_method\": \"gptq\"}, \"tie_word_embeddings\": false");
    /* Claimed by the comet checkpoint reader (checkpoint_read.c), which wants its own method. */
    {
        comet_model *q = NULL;
        assert_true(comet_model_load(hf_copy("quant", "config.json", cfg), &q) < 0);
        assert_null(q);
        assert_non_null(strstr(comet_last_error(), "quant_method"));
        assert_non_null(strstr(comet_last_error(), "config.json"));
    }
    free(cfg);
    cfg = config_with("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    expect_load(hf_copy("layers", "config.json", cfg), COMET_ERR_FORMAT,
                "'model.layers.2.input_layernorm.weight' missing", NULL);
    free(cfg);
    cfg = config_with("\"hidden_size\": 32,", "");
    expect_load(hf_copy("nohidden", "config.json", cfg), COMET_ERR_FORMAT,
                "\"hidden_size\" missing", "config.json");
    free(cfg);
    expect_load(hf_copy("notok", "tokenizer.json", NULL), COMET_ERR_FORMAT,
                "tokenizer.json missing", "notok");
    expect_load(hf_copy("noweights", "model.safetensors", NULL), COMET_ERR_FORMAT,
                "no model.safetensors", "noweights");
    expect_load(hf_copy("badjson", "config.json", "{\"architectures\": ["), COMET_ERR_FORMAT,
                "config.json", "not a JSON object");
    expect_load(hf_copy("badst", "model.safetensors", "\xff\xff\xff\xff\xff\xff\xff\x7f{}"),
                COMET_ERR_FORMAT, "model.safetensors", "header length");
}

/* The synthetic presets set the same variant fields as the readers: LLaMA, no bias,
 * untied embeddings, Llama-3.1 RoPE scaling; an unknown preset is refused by name. */
static void test_synthetic_variant(void **state) {
    (void)state;
    comet_model *m = NULL;
    assert_int_equal(comet_model_synthetic("llama3-70b", 1, 0, &m), COMET_OK);
    const comet_model_config *c = &m->cfg;
    assert_int_equal(c->arch, COMET_ARCH_LLAMA);
    assert_int_equal(c->qkv_bias + c->o_bias + c->mlp_bias, 0);
    assert_int_equal(c->tie_embeddings, 0);
    assert_int_equal(c->rope_scaling, COMET_ROPE_SCALING_LLAMA3);
    assert_int_equal(c->n_layer, 80);
    assert_int_equal(comet_model_variant_check(c, "x"), COMET_OK);
    comet_model_free(m);
    m = NULL;
    assert_int_equal(comet_model_synthetic("qwen2-7b", 0, 0, &m), COMET_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(comet_last_error(), "synthetic model 'qwen2-7b'"));
}

/* ---- the end-of-generation set ------------------------------------------------------ */

/* A Llama-3-like vocabulary: the end markers as control tokens, plus look-alikes that must
 * not stop generation (a NORMAL "<|endoftext|>", a control token that is no end marker). */
static const char *const eog_toks[] = {
    "a",
    "b",
    "c",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|end|>",
    "<|start_header_id|>",
};
static const int32_t eog_types[] = {1, 1, 1, 3, 3, 3, 3, 3, 1, 3, 3, 3};
#define EOG_V 12

static void kv_arr_i32(gbuf *b, const char *k, int n, const int32_t *v) {
    gb_str(b, k);
    gb_u32(b, 9);
    gb_u32(b, 5);
    gb_u64(b, (uint64_t)n);
    gb_put(b, v, (size_t)n * 4);
}

/* A one-layer F32 llama GGUF on eog_toks whose greedy output is always token `emit`
 * (every embedding is e0, attention and FFN are zero, lm_head row `emit` reads e0). The
 * GGUF names eos = `eos` and, when >= 0, eot = `eot`. */
static void write_eog_gguf(const char *path, int eos, int eot, int emit) {
    enum {
        C = 32,
        F = 64,
        V = EOG_V
    };
    gbuf b = {0};
    gb_header(&b, 3, 3 + 9, 13 + (eot >= 0));
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.embedding_length", C);
    kv_u32(&b, "llama.feed_forward_length", F);
    kv_u32(&b, "llama.attention.head_count", 4);
    kv_u32(&b, "llama.context_length", 64);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "llama-bpe");
    kv_arr_str(&b, "tokenizer.ggml.tokens", V, eog_toks);
    kv_arr_i32(&b, "tokenizer.ggml.token_type", V, eog_types);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 3);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (eot >= 0)
        kv_u32(&b, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    static float emb[V * C], head[V * C], ones[C], zq[C * C], zf[F * C];
    memset(emb, 0, sizeof emb);
    memset(head, 0, sizeof head);
    for (int v = 0; v < V; v++)
        emb[v * C] = 1.0f;
    head[emit * C] = 100.0f;
    for (int i = 0; i < C; i++)
        ones[i] = 1.0f;
    struct {
        const char *name;
        int ne0, ne1;
        const float *data;
        size_t bytes;
    } t[] = {
        {"token_embd.weight", C, V, emb, sizeof emb},
        {"output_norm.weight", C, 0, ones, sizeof ones},
        {"output.weight", C, V, head, sizeof head},
        {"blk.0.attn_norm.weight", C, 0, ones, sizeof ones},
        {"blk.0.attn_q.weight", C, C, zq, sizeof zq},
        {"blk.0.attn_k.weight", C, C, zq, sizeof zq},
        {"blk.0.attn_v.weight", C, C, zq, sizeof zq},
        {"blk.0.attn_output.weight", C, C, zq, sizeof zq},
        {"blk.0.ffn_norm.weight", C, 0, ones, sizeof ones},
        {"blk.0.ffn_gate.weight", C, F, zf, sizeof zf},
        {"blk.0.ffn_up.weight", C, F, zf, sizeof zf},
        {"blk.0.ffn_down.weight", F, C, zf, sizeof zf},
    };
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        ti(&b, t[i].name, (uint64_t)t[i].ne0, (uint64_t)t[i].ne1, 0, off);
        off += t[i].bytes; /* every size is a multiple of 32 */
    }
    gb_align(&b, 32);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        gb_put(&b, t[i].data, t[i].bytes);
    write_file(path, b.p, b.n);
    free(b.p);
}

static int has_eos(const comet_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

/* The control end markers of eog_toks: 4 <|end_of_text|>, 5 <|eot_id|>, 6 <|eom_id|>,
 * 7 <|im_end|>, 9 </s>, 10 <|end|>; not 8 (a NORMAL token) nor 3 / 11. */
static void check_eog_set(const comet_model_config *c, int first) {
    assert_int_equal(c->eos_ids[0], first);
    assert_int_equal(c->n_eos, 6);
    for (int id = 0; id < EOG_V; id++)
        if (has_eos(c, id) != (id >= 4 && id <= 10 && id != 8))
            fail_msg("token %d '%s' %s the end-of-generation set", id, eog_toks[id],
                     has_eos(c, id) ? "is in" : "is missing from");
}

/* Greedy generation from one prompt token: the number of tokens generated (a final EOS
 * counted) and the stop reason. */
static comet_stop_reason greedy(const comet_model *m, int max_tokens, int *n_generated) {
    comet_backend *be = comet_backend_cpu_init(1);
    assert_non_null(be);
    comet_gen_params p = comet_gen_default_params();
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0.0f;
    const int32_t prompt[] = {3, 0, 1};
    comet_gen_stats st;
    assert_int_equal(comet_generate(m, be, prompt, 3, &p, NULL, NULL, &st), COMET_OK);
    comet_backend_free(be);
    *n_generated = st.n_generated;
    return st.stop;
}

/* Llama-3 GGUFs name eos = <|end_of_text|> without an eot key while the chat model ends
 * its turn with <|eot_id|>, or eos = <|eot_id|> while a base model emits <|end_of_text|>:
 * either way generation stops on the first token, as llama.cpp's does. */
static void test_gguf_end_markers(void **state) {
    (void)state;
    const char *p = tmp_file("eog.gguf");
    static const int cases[][3] = {/* eos, eot, emitted */ {4, -1, 5}, {5, -1, 4}, {4, 5, 6}};
    for (int k = 0; k < 3; k++) {
        write_eog_gguf(p, cases[k][0], cases[k][1], cases[k][2]);
        comet_model *m = NULL;
        if (comet_model_load(p, &m) != COMET_OK)
            fail_msg("%s", comet_last_error());
        check_eog_set(&m->cfg, cases[k][0]);
        if (cases[k][1] >= 0)
            assert_int_equal(m->cfg.eos_ids[1], cases[k][1]);
        int n = 0;
        assert_int_equal(greedy(m, 5, &n), COMET_STOP_EOS);
        assert_int_equal(n, 1);
        comet_model_free(m);
    }
    /* a token that is not an end marker still runs to max_tokens */
    write_eog_gguf(p, 4, -1, 8);
    comet_model *m = NULL;
    if (comet_model_load(p, &m) != COMET_OK)
        fail_msg("%s", comet_last_error());
    int n = 0;
    assert_int_equal(greedy(m, 5, &n), COMET_STOP_LENGTH);
    assert_int_equal(n, 5);
    comet_model_free(m);
}

/* HF: config.json's eos, then generation_config.json's (an id or a list), then the
 * vocabulary's control end markers (tiny_hf: 0 <|endoftext|>, 2 <|im_end|>). */
static void test_hf_end_markers(void **state) {
    (void)state;
    char *cfg = config_with("\"eos_token_id\": [\n    2,\n    0\n  ]", "\"eos_token_id\": 2");
    const char *dir = hf_copy("eog", "config.json", cfg);
    free(cfg);
    char path[700];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    const char *gens[] = {"{\"eos_token_id\": [2, 1]}", "{\"eos_token_id\": 1}"};
    for (int k = 0; k < 2; k++) {
        write_file(path, gens[k], strlen(gens[k]));
        comet_model *m = NULL;
        if (comet_model_load(dir, &m) != COMET_OK)
            fail_msg("%s", comet_last_error());
        assert_int_equal(m->cfg.n_eos, 3);
        assert_int_equal(m->cfg.eos_ids[0], 2);
        assert_int_equal(m->cfg.eos_ids[1], 1);
        assert_int_equal(m->cfg.eos_ids[2], 0);
        assert_int_equal(comet_tokenizer_special_id(m->tok, COMET_SPECIAL_EOS), 2);
        comet_model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest smol_tests[] = {
        cmocka_unit_test(test_default_config),
        cmocka_unit_test(test_default_qk_order),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_hf),           cmocka_unit_test(test_tiny_hf_sharded),
        cmocka_unit_test(test_tiny_gguf),         cmocka_unit_test(test_tiny_llama3_gguf),
        cmocka_unit_test(test_bad_gguf),          cmocka_unit_test(test_bad_hf),
        cmocka_unit_test(test_gguf_end_markers),  cmocka_unit_test(test_hf_end_markers),
        cmocka_unit_test(test_synthetic_variant),
    };
    int fails = cmocka_run_group_tests(tests, NULL, NULL);
    return fails + cmocka_run_group_tests(smol_tests, load_smol, free_smol);
}

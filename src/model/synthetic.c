/* synthetic.c — models of a known shape without weight files, for benchmarks
 * (comet_model_synthetic in comet/model.h). The backend that runs one generates its random
 * weights in its own memory; nothing here touches weight data. The model's tokenizer has
 * no vocabulary (comet_tokenizer_ids): it takes token-id prompts and refuses text. */
#include <stdlib.h>
#include <string.h>

#include "comet/model.h"
#include "comet/tokenizer.h"

typedef struct preset {
    const char *name;
    int n_layer, n_embd, n_ff, n_head, n_head_kv;
} preset;

/* LLaMA-3.1 8B and 70B (head dim 128, vocabulary 128256). */
static const preset presets[] = {
    {"llama3-8b", 32, 4096, 14336, 32, 8},
    {"llama3-70b", 80, 8192, 28672, 64, 8},
};

#define SYNTH_BLOCK 128 /* activation / weight block of the quantized presets */

static void set_linear(comet_linear *lin, int N, int K, int quantized, const int32_t *perm) {
    memset(lin, 0, sizeof *lin);
    lin->n_out = N;
    lin->n_in = K;
    if (!quantized) {
        lin->fmt = COMET_WFMT_F32;
        return;
    }
    lin->fmt = COMET_WFMT_QSIM;
    lin->perm = perm;
    lin->block = SYNTH_BLOCK;
    lin->n8 = (K / SYNTH_BLOCK + 7) / 8; /* 12.5 % INT8 blocks */
    lin->a_bits = 4;
    lin->w_bits = 4;
}

comet_status comet_model_synthetic(const char *preset_name, int quantized, uint64_t seed,
                                   comet_model **out) {
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (preset_name && !strcmp(preset_name, presets[i].name))
            p = &presets[i];
    if (!p)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "synthetic model '%s': expected llama3-8b or llama3-70b",
                               preset_name ? preset_name : "(null)");
    comet_model *m = calloc(1, sizeof *m);
    if (!m)
        return comet_set_error(COMET_ERR_NOMEM, "synthetic model: out of memory");
    comet_model_config *c = &m->cfg;
    c->arch = COMET_ARCH_LLAMA; /* no biases, untied embeddings, Llama-3.1 RoPE scaling */
    c->n_layer = p->n_layer;
    c->n_embd = p->n_embd;
    c->n_ff = p->n_ff;
    c->n_head = p->n_head;
    c->n_head_kv = p->n_head_kv;
    c->head_dim = p->n_embd / p->n_head;
    c->n_vocab = 128256;
    c->n_ctx = 8192;
    c->rms_eps = 1e-5f;
    c->rope_theta = 500000.0f;
    c->rope_scaling = COMET_ROPE_SCALING_LLAMA3;
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
    c->bos_id = 128000;
    c->n_eos = 1;
    c->eos_ids[0] = 128009;
    m->synthetic_seed = seed ? seed : 1;
    m->name = strdup(p->name);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    /* No vocabulary: prompts are token ids; token i decodes to " <i>". */
    m->tok = comet_tokenizer_ids("synthetic", p->name, c->n_vocab, c->bos_id, c->eos_ids[0]);
    if (!m->tok) {
        comet_model_free(m);
        return comet_last_status();
    }
    if (!m->name || !m->layers) {
        comet_model_free(m);
        return comet_set_error(COMET_ERR_NOMEM, "synthetic model: out of memory");
    }
    int HD = c->n_head * c->head_dim, KVD = c->n_head_kv * c->head_dim;
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        set_linear(&w->wq, HD, c->n_embd, quantized, NULL);
        set_linear(&w->wk, KVD, c->n_embd, quantized, NULL);
        set_linear(&w->wv, KVD, c->n_embd, quantized, NULL);
        set_linear(&w->wo, c->n_embd, HD, quantized, NULL);
        set_linear(&w->w_gate, c->n_ff, c->n_embd, quantized, NULL);
        set_linear(&w->w_up, c->n_ff, c->n_embd, quantized, NULL);
        set_linear(&w->w_down, c->n_embd, c->n_ff, quantized, NULL);
    }
    m->lm_head_bits = quantized ? 8 : 16; /* as comet quantize's default */
    if (quantized) {
        m->kv.type = COMET_KV_INT4;
        m->kv.rotation = COMET_KV_ROTATION_HADAMARD;
    }
    comet_status st = comet_model_config_check(c, m->name);
    if (st < 0) {
        comet_model_free(m);
        return st;
    }
    *out = m;
    return COMET_OK;
}

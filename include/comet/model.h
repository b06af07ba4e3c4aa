/* comet/model.h — a loaded LLaMA-family model: configuration, weights, tokenizer.
 *
 * One struct for every source format (GGUF, HF safetensors directory, later the comet
 * quantized checkpoint). Weights are held in the HF convention: row-major [out, in]
 * matrices, Q/K rows in HF order (rotate-half RoPE); the GGUF reader undoes llama.cpp's
 * Q/K row permutation on load so that every backend sees one layout.
 * Shape letters as in NUMERICS.md: C hidden, F FFN, H query heads, Hkv KV heads,
 * D head dim, V vocab.
 */
#ifndef COMET_MODEL_H
#define COMET_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum comet_rope_scaling {
    COMET_ROPE_SCALING_NONE,
    COMET_ROPE_SCALING_LINEAR, /* positions divided by factor */
    COMET_ROPE_SCALING_LLAMA3, /* Llama-3.1 frequency-dependent scaling */
    COMET_ROPE_SCALING_COUNT
} comet_rope_scaling;

#define COMET_MAX_EOS 8

typedef struct comet_model_config {
    char arch[32];       /* "llama" */
    int n_layer;
    int n_embd;          /* C */
    int n_ff;            /* F */
    int n_head;          /* H */
    int n_head_kv;       /* Hkv (GQA when < H) */
    int head_dim;        /* D */
    int n_vocab;         /* V */
    int n_ctx;           /* maximum positions the model was trained for */
    float rms_eps;
    float rope_theta;
    comet_rope_scaling rope_scaling;
    float rope_factor;           /* LINEAR, LLAMA3 */
    float rope_low_freq_factor;  /* LLAMA3 */
    float rope_high_freq_factor; /* LLAMA3 */
    int rope_orig_ctx;           /* LLAMA3: original_max_position_embeddings */
    int tie_embeddings;          /* lm_head shares the token embedding */
    int32_t bos_id;              /* -1 if none */
    int add_bos;                 /* prepend BOS when tokenizing a prompt */
    int n_eos;
    int32_t eos_ids[COMET_MAX_EOS]; /* generation stops at any of these */
} comet_model_config;

/* Weight storage formats of a linear layer. Append-only. */
typedef enum comet_wfmt {
    COMET_WFMT_F32, /* w: [N, K] fp32 row-major */
    COMET_WFMT_COUNT
} comet_wfmt;

/* A linear layer y[T, N] = x[T, K] · W[N, K]ᵀ. */
typedef struct comet_linear {
    int n_out; /* N */
    int n_in;  /* K */
    comet_wfmt fmt;
    float *w;  /* COMET_WFMT_F32: [N, K] */
} comet_linear;

typedef struct comet_layer_weights {
    float *attn_norm;    /* [C] RMSNorm weight before attention */
    comet_linear wq;     /* [H*D, C] */
    comet_linear wk;     /* [Hkv*D, C] */
    comet_linear wv;     /* [Hkv*D, C] */
    comet_linear wo;     /* [C, H*D] */
    float *ffn_norm;     /* [C] RMSNorm weight before the MLP */
    comet_linear w_gate; /* [F, C] */
    comet_linear w_up;   /* [F, C] */
    comet_linear w_down; /* [C, F] */
} comet_layer_weights;

struct comet_tokenizer;

typedef struct comet_model {
    comet_model_config cfg;
    float *tok_embd;             /* [V, C] */
    float *output_norm;          /* [C] */
    float *lm_head;              /* [V, C]; == tok_embd when cfg.tie_embeddings */
    comet_layer_weights *layers; /* [n_layer] */
    struct comet_tokenizer *tok; /* owned */
    char *chat_template;         /* the model's template string (Jinja), owned; may be NULL */
    char *name;                  /* model name for display, owned */
    char *path;                  /* where it was loaded from, owned */
    /* Every weight buffer above is owned by the model and released by comet_model_free. */
    void **owned;
    size_t n_owned, cap_owned;
} comet_model;

/* Load a model from `path`: a `.gguf` file (GGUF v3) or a directory holding an HF
 * checkpoint (config.json + *.safetensors [+ model.safetensors.index.json] +
 * tokenizer.json). Weights are converted to fp32. Returns COMET_OK and a new model in
 * *out (free with comet_model_free), or a negative status with comet_last_error() naming
 * the file/field and the problem: COMET_ERR_IO, COMET_ERR_FORMAT (malformed),
 * COMET_ERR_UNSUPPORTED (architecture, tensor type). */
comet_status comet_model_load(const char *path, comet_model **out);

/* Release a model and everything it owns. NULL is a no-op. */
void comet_model_free(comet_model *m);

/* Register a heap buffer (malloc) as owned by the model; returns `p`, or NULL (and frees
 * p) when the registry cannot grow. Used by loaders. */
void *comet_model_own(comet_model *m, void *p);

/* Validate the config (positive sizes, H divisible by Hkv, D*H consistent, ...).
 * Returns COMET_OK or COMET_ERR_FORMAT naming the field. */
comet_status comet_model_config_check(const comet_model_config *cfg, const char *src);

#ifdef __cplusplus
}
#endif
#endif

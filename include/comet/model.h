/* comet/model.h — a loaded LLaMA-family model: configuration, weights, tokenizer.
 *
 * One struct for every source format (GGUF, HF safetensors directory, later the comet
 * quantized checkpoint). Weights are held in the HF convention: row-major [out, in]
 * matrices, Q/K rows in HF order (rotate-half RoPE); the GGUF reader undoes llama.cpp's
 * Q/K row permutation on load so that every backend sees one layout.
 * Shape letters as in docs/numerics.md: C hidden, F FFN, H query heads, Hkv KV heads,
 * D head dim, V vocab.
 */
#ifndef COMET_MODEL_H
#define COMET_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comet/kv_format.h"
#include "comet/sampling.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The architecture of a model: which layer program forward.c runs. Append-only. */
typedef enum comet_arch {
    COMET_ARCH_LLAMA, /* pre-norm decoder, RMSNorm, RoPE, GQA, SwiGLU: Llama-2/3, SmolLM,
                       * Mistral without sliding window */
    COMET_ARCH_COUNT
} comet_arch;

/* The short name of an architecture ("llama", as GGUF's general.architecture spells it);
 * NULL for a value outside comet_arch. */
const char *comet_arch_name(int arch);

typedef enum comet_rope_scaling {
    COMET_ROPE_SCALING_NONE,
    COMET_ROPE_SCALING_LINEAR, /* positions divided by factor */
    COMET_ROPE_SCALING_LLAMA3, /* Llama-3.1 frequency-dependent scaling */
    COMET_ROPE_SCALING_COUNT
} comet_rope_scaling;

#define COMET_MAX_EOS 16
#define COMET_MAX_TENSOR_PARALLEL 64 /* ranks a model is split over at most */

/* What a model is. The variant fields (arch, the bias flags, rope_scaling, tie_embeddings)
 * are set by every loader from its source (GGUF metadata and tensors, config.json, the comet
 * checkpoint, the synthetic presets) and checked by comet_model_variant_check; forward.c
 * reads them where they change the layer program. */
typedef struct comet_model_config {
    comet_arch arch;
    int n_layer;
    int n_embd;    /* C */
    int n_ff;      /* F */
    int n_head;    /* H */
    int n_head_kv; /* Hkv (GQA when < H) */
    int head_dim;  /* D */
    int n_vocab;   /* V */
    int n_ctx;     /* maximum positions the model was trained for */
    float rms_eps;
    float rope_theta;
    comet_rope_scaling rope_scaling;
    float rope_factor;           /* LINEAR, LLAMA3 */
    float rope_low_freq_factor;  /* LLAMA3 */
    float rope_high_freq_factor; /* LLAMA3 */
    int rope_orig_ctx;           /* LLAMA3: original_max_position_embeddings */
    int tie_embeddings;          /* lm_head shares the token embedding */
    int qkv_bias;                /* q, k, v projections add a bias (Qwen2; HF attention_bias) */
    int o_bias;                  /* o_proj adds a bias (HF attention_bias) */
    int mlp_bias;                /* gate, up, down projections add a bias (HF mlp_bias) */
    int32_t bos_id;              /* -1 if none */
    int add_bos;                 /* prepend BOS when tokenizing a prompt */
    int n_eos;
    int32_t eos_ids[COMET_MAX_EOS]; /* generation stops at any of these */
} comet_model_config;

/* Weight storage formats of a linear layer. Append-only. */
typedef enum comet_wfmt {
    COMET_WFMT_F32,  /* w: [N, K] fp32 row-major */
    COMET_WFMT_QSIM, /* FMPQ (docs/numerics.md) run by fp32 simulation: x' = x gathered by perm,
                      * activations quantized->dequantized per token per block (a_bits 4),
                      * y = x' · wᵀ with w the dequantized weights in permuted column order.
                      * src/numerics/qlinear.h implements the input side. */
    COMET_WFMT_COUNT
} comet_wfmt;

/* A linear layer y[T, N] = x[T, K] · W[N, K]ᵀ. */
typedef struct comet_linear {
    int n_out; /* N */
    int n_in;  /* K */
    comet_wfmt fmt;
    float *w; /* COMET_WFMT_F32: [N, K]; QSIM: dequantized [N, K], columns in perm order */
    /* COMET_WFMT_QSIM only (arrays owned by the model): */
    const int32_t *perm;        /* [K] input gather x'[k] = x[perm[k]]; NULL = identity */
    const int32_t *perm_folded; /* [K] (down_proj) permutation folded offline into the
                                 * producer's output rows: already applied, kept for the
                                 * checkpoint; NULL if none */
    int block;                  /* B: activation and weight block (channels) */
    int n8;                     /* activation blocks 0..n8-1 INT8, the rest INT4 */
    int a_bits;                 /* 4 (INT4 + n8 INT8 blocks) or 8 (n8 = all blocks): quantize
                                 * activations as above; 16: keep them fp32 */
    int w_bits;                 /* 4 or 8: codes below; 16 / 32: w only (fp16 / fp32) */
    uint8_t *qw;                /* w_bits 4: [N, K/2] plain INT4 (numerics/w4_plain.h);
                                 * 8: [N, K] int8; 16, 32: NULL */
    uint16_t *sw;               /* [N, K/B] fp16 weight scales; NULL for w_bits 16, 32 */
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

/* What a quantized model is (config.json "quantization_config" of a comet checkpoint).
 * Per-linear choices (permutation, n8) live in each comet_linear. */
/* Version 2 added kv_rotation; version 1 checkpoints are read with kv_rotation = none
 * (their meaning when they were written). Version 3 added lm_head_bits; versions 1 and 2
 * are read with lm_head_bits = 16. */
#define COMET_QUANT_FORMAT_VERSION 3

typedef struct comet_quant_config {
    int format_version; /* COMET_QUANT_FORMAT_VERSION */
    int w_bits;         /* 4, 8, 16 or 32 */
    int a_bits;         /* 4 (FMPQ INT4/INT8 blocks) or 16 (not quantized) */
    comet_kv_format kv; /* the KV cache: type (kv_bits on disk), group G, rotation */
    int block;          /* B */
    int reorder;        /* channels sorted by salience (else identity permutations) */
    float tau;          /* INT8 threshold: salience > tau * median */
    float int8_budget;  /* at most this fraction of each group's blocks is INT8 */
    char wmethod[8];    /* "rtn" or "gptq" */
    int clip_search;    /* RTN/GPTQ block scales from the clipping search */
    float gptq_damp;
    char calib_corpus[256];
    int calib_windows, calib_window_len;
    long calib_tokens;
    int lm_head_bits; /* 8: the lm_head runs as per-row INT8 codes of its stored fp16 weights
                       * (comet_model_lm_head_quantize); 16: floating point */
} comet_quant_config;

/* Sampling defaults the checkpoint recommends (HF generation_config.json: temperature,
 * top_p, top_k, min_p, max_new_tokens). */
typedef struct comet_gen_config {
    unsigned given;                /* COMET_SAMPLER_* bits of the fields of `sampling` given;
                                    * 0: the checkpoint recommends no sampling */
    comet_sampler_params sampling; /* the given fields; the others are the defaults */
    int max_new_tokens;            /* > 0 when given, else 0 */
} comet_gen_config;

typedef struct comet_model {
    comet_model_config cfg;
    comet_gen_config gen;        /* from generation_config.json (HF); empty for other formats */
    float *tok_embd;             /* [V, C] */
    float *output_norm;          /* [C] */
    float *lm_head;              /* [V, C]; == tok_embd when cfg.tie_embeddings */
    /* A comet checkpoint loaded with keep_codes_only (comet_model_load_with): the embedding
     * and lm_head as the checkpoint stores them, fp16 bits [V, C] (lm_head_f16 ==
     * tok_embd_f16 when tied), while tok_embd and lm_head are NULL. NULL otherwise, and an
     * untied lm_head_f16 is NULL again once comet_model_lm_head_quantize made its codes. */
    uint16_t *tok_embd_f16, *lm_head_f16;
    /* The lm_head the backends run (docs/numerics.md "lm_head"): lm_head_bits 8 = per-row
     * INT8, codes lm_head_q8 [V, C] and fp16 scale bits lm_head_s8 [V] made from the fp
     * lm_head above (which stays, as the checkpoint stores it) by
     * comet_model_lm_head_quantize, or by the backend for a synthetic model (both NULL then);
     * 0 or 16 = the floating-point lm_head (both NULL). */
    int lm_head_bits;
    int8_t *lm_head_q8;
    uint16_t *lm_head_s8;
    comet_layer_weights *layers; /* [n_layer] */
    struct comet_tokenizer *tok; /* owned */
    char *chat_template;         /* the model's template string (Jinja), owned; may be NULL */
    char *name;                  /* model name for display, owned */
    char *path;                  /* where it was loaded from, owned */
    /* Quantization: NULL for a floating-point model; set by `comet quantize` and by the
     * comet checkpoint loader (src/format/checkpoint.h). */
    struct comet_quant_config *quant;
    /* The KV cache the model runs with (comet/kv_format.h): F16 = unquantized (zeroed for a
     * floating-point model), INT8 / INT4 (codes on CUDA and on the threaded CPU backend;
     * simulated in fp32, quantize->dequantize per token per KV head, by cpu-ref and with
     * --simulate); group 0 = D. */
    comet_kv_format kv;
    /* Non-zero for a synthetic model (comet_model_synthetic): the config, formats, blocks and
     * n8 are set but no weight array exists; a backend that can (CUDA) fills its own copy
     * with random weights from this seed, others refuse the model. */
    uint64_t synthetic_seed;
    /* A tensor-parallel shard (src/model/shard.h) of a model of vocab_total tokens holds the
     * vocabulary rows vocab0 .. vocab0 + cfg.n_vocab - 1 in tok_embd and lm_head; a token id
     * outside them embeds as zeros. vocab_total 0 (and vocab0 0): a whole model. */
    int vocab0, vocab_total;
    /* Every weight buffer above is owned by the model and released by comet_model_free:
     * weight/quantization buffers through this registry (comet_model_own); `layers` (calloc),
     * `tok`, `chat_template`, `name` and `path` are freed directly. */
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

/* How comet_model_load_with reads a model (comet_model_default_load_params). */
typedef struct comet_model_load_params {
    /* 1: a comet checkpoint with W4 (or W8) linears and quantized activations keeps only
     * what a backend running the codes needs: each such linear's codes and scales (w NULL,
     * no dequantized fp32 copy) and the fp16 embedding and lm_head (tok_embd_f16 /
     * lm_head_f16; tok_embd and lm_head NULL). The threaded CPU backend's integer path runs
     * such a model; the fp32 simulation (--simulate, cpu-ref), tensor parallelism and the
     * quantizer refuse it. Other models load as usual. 0 (default): as comet_model_load. */
    int keep_codes_only;
} comet_model_load_params;

comet_model_load_params comet_model_default_load_params(void);

/* comet_model_load with params p (NULL: the defaults). Same statuses. */
comet_status comet_model_load_with(const char *path, const comet_model_load_params *p,
                                   comet_model **out);

/* A synthetic model of a known shape for benchmarks, with no weights in host memory
 * (comet_model.synthetic_seed): preset "llama3-8b" or "llama3-70b" (LLaMA-3.1 shapes,
 * vocabulary 128256, context 8192). quantized: W4AxKV4 linears (block 128, the first 1/8 of
 * each group's blocks INT8, KV4 with the Hadamard rotation); else floating-point linears and a
 * 16-bit KV cache. The tokenizer (m->tok) has no vocabulary (comet_tokenizer_ids): prompts
 * are token ids, text is refused ("synthetic model llama3-8b has no vocabulary: send token
 * ids"), token i decodes to " <i>", BOS 128000 and EOS 128009 are control tokens. COMET_OK and *out (free with comet_model_free), or
 * COMET_ERR_INVALID_ARG naming the preset, COMET_ERR_NOMEM. */
comet_status comet_model_synthetic(const char *preset, int quantized, uint64_t seed,
                                   comet_model **out);

/* Make m's per-row INT8 lm_head (lm_head_q8, lm_head_s8; lm_head_bits = 8) from its
 * floating-point lm_head (lm_head, or lm_head_f16 of a keep_codes_only load, which is freed
 * then unless it is the tied embedding; the token embedding when tied), row by row with
 * comet_quant_lm_head_row. The codes are owned by m.
 * COMET_OK; COMET_ERR_INVALID_ARG when m has no lm_head in host memory (a synthetic model);
 * COMET_ERR_NOMEM. */
comet_status comet_model_lm_head_quantize(comet_model *m);

/* Release a model and everything it owns. NULL is a no-op. */
void comet_model_free(comet_model *m);

/* Register a heap buffer (malloc) as owned by the model; returns `p`, or NULL (and frees
 * p) when the registry cannot grow. Used by loaders. */
void *comet_model_own(comet_model *m, void *p);

/* Validate the config (positive sizes, H divisible by Hkv, D*H consistent, ...), then the
 * variant (comet_model_variant_check). Returns COMET_OK, COMET_ERR_FORMAT naming the field,
 * or the variant check's COMET_ERR_UNSUPPORTED; messages start with `src`. */
comet_status comet_model_config_check(const comet_model_config *cfg, const char *src);

/* Whether comet runs this model variant: arch one of comet_arch and no bias flag set (no
 * backend adds a linear's bias: a model with one is refused, naming the flag, rather than
 * run without it). COMET_OK, or COMET_ERR_UNSUPPORTED "<src>: <flag> ..." naming the
 * architecture or the first flag set. */
comet_status comet_model_variant_check(const comet_model_config *cfg, const char *src);

#ifdef __cplusplus
}
#endif
#endif

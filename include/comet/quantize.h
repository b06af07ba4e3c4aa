/* comet/quantize.h — FMPQ quantization of a floating-point model into a comet checkpoint
 * directory (docs/numerics.md, docs/quantization.md): calibration on a text, channel
 * reordering with INT8 outlier blocks, INT4/INT8 weights (RTN with clipping search, or
 * GPTQ), the KV cache format; optionally a residual-stream rotation and SmoothQuant first.
 * The checkpoint is what comet_model_load reads back (simulated in fp32 on the CPU).
 * Progress and the steps taken are logged through comet_log (comet/log.h).
 */
#ifndef COMET_QUANTIZE_H
#define COMET_QUANTIZE_H

#include <stdint.h>

#include "comet/model.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the linears and the KV cache are quantized. */
typedef struct comet_fmpq_params {
    int w_bits;         /* 4, 8, 16 (weights rounded to fp16) or 32 (weights kept fp32:
                        * permutation and folding only, embeddings not rounded either) */
    int a_bits;         /* 4: FMPQ INT4/INT8 blocks; 8: every block INT8; 16: no activation quant */
    comet_kv_format kv; /* the KV cache asked for, resolved by comet_kv_format_resolve
                         * without a base (comet/kv_format.h): group 0 = automatic
                         * (comet_kv_default_group for INT4/INT8, D for F16); rotation -1 =
                         * automatic: hadamard when the cache is quantized and D is a power of
                         * two, else none */
    int block;          /* B; 0 = one block per row (per-token activations, per-channel
                        * weights); -1 = automatic: 128, or 64 when the model's widths are not
                        * multiples of 128 */
    int reorder;        /* sort channels by salience */
    float tau;          /* INT8 where salience > tau * median */
    float int8_budget;  /* cap on each group's INT8 block fraction */
    int gptq;           /* GPTQ (needs XᵀX); else RTN (comet_quantize: RTN for w_bits 16) */
    int clip_search;
    float gptq_damp; /* GPTQ damping, a fraction of the mean Hessian diagonal */
    int lm_head_bits; /* 8: per-row INT8 lm_head (docs/numerics.md "lm_head"); 16: fp16;
                       * 0: automatic, 8 with 4- or 8-bit weights, else 16 */
} comet_fmpq_params;

/* Defaults: W4 A4(mixed) KV4 (automatic KV group and rotation), automatic block, reorder, tau 2
 * (chosen by docs/accuracy.md), budget 0.25, GPTQ with the
 * clipping search, damping 0.01, automatic lm_head bits. */
comet_fmpq_params comet_fmpq_default_params(void);

/* The steps of comet_quantize, in order; a step that is not needed is skipped. */
typedef enum comet_quantize_stage {
    COMET_QUANTIZE_LOAD,      /* loading the source model */
    COMET_QUANTIZE_ROTATE,    /* the residual-stream rotation (and its outlier calibration) */
    COMET_QUANTIZE_CALIBRATE, /* statistics: from the cache file, or a calibration run */
    COMET_QUANTIZE_SMOOTH,    /* SmoothQuant */
    COMET_QUANTIZE_QUANTIZE,  /* FMPQ of every layer */
    COMET_QUANTIZE_WRITE,     /* the checkpoint directory */
    COMET_QUANTIZE_STAGE_COUNT
} comet_quantize_stage;

/* Called on the calling thread as each step starts. */
typedef void (*comet_quantize_progress_fn)(void *user, comet_quantize_stage stage);

typedef struct comet_quantize_params {
    comet_fmpq_params fmpq;  /* the KV format's automatic fields: comet_kv_format_resolve */
    const char *calib_path;  /* calibration text, UTF-8 (default "data/mobydick.txt") */
    int calib_windows;       /* windows of the calibration run (default 128; fewer when the
                             * text holds fewer, with a warning logged) */
    int calib_len;           /* tokens per window (default 512) */
    const char *calib_cache; /* NULL, or a file of saved statistics: used when made from the
                              * same model, text and windows; else calibration runs and
                              * saves them there */
    int rotate;              /* 1: rotate the residual stream by a random orthogonal matrix
                              * folded into the weights, RMSNorm weights folded first */
    uint64_t rotate_seed;    /* the rotation's seed (default 1) */
    int rotate_keep;         /* with rotate: leave the residual channels with the largest
                              * activation outliers (on up to 16 calibration windows of the
                              * unrotated model) out of the rotation (default 0) */
    float smooth;            /* >= 0: SmoothQuant alpha; < 0 (default): off */
    int n_threads;           /* CPU threads of calibration; <= 0: all cores */
    int overwrite;           /* 1: write into a non-empty directory that is not a comet
                              * checkpoint (default 0: refused before the model loads) */
    comet_quantize_progress_fn progress; /* may be NULL */
    void *progress_user;
} comet_quantize_params;

/* comet_fmpq_default_params, the defaults above, no cache, rotation and smoothing off. */
comet_quantize_params comet_quantize_default_params(void);

/* The linear input groups (qkv, o, gate_up, down) a result reports on. */
#define COMET_QUANTIZE_GROUPS 4

/* What comet_quantize made. */
typedef struct comet_quantize_result {
    comet_quant_config config;                     /* the checkpoint's quantization_config */
    const char *group_name[COMET_QUANTIZE_GROUPS]; /* "qkv", "o", "gate_up", "down" (static) */
    double int8_fraction[COMET_QUANTIZE_GROUPS];   /* INT8 blocks / blocks, per group */
    double int8_blocks;                            /* overall, by blocks */
    double int8_work;                              /* overall, weighted by GEMM work */
    double calib_s, quant_s, total_s;              /* seconds: up to quantization (load, rotation,
                                       * calibration, smoothing), FMPQ, all of it */
    double out_bytes;                              /* bytes of the files written to out_dir */
} comet_quantize_result;

/* Quantize the floating-point model at `model_path` (.gguf file or HF directory) with
 * `p` and write the checkpoint into directory `out_dir` (created; files replaced; the
 * same inputs give the same bytes). *r (may be NULL) is filled on success. Returns
 * COMET_OK, or a negative status with comet_last_error() naming the problem:
 * COMET_ERR_IO, before anything loads, for an `out_dir` that cannot be created or written
 * or that is a non-empty directory other than a comet checkpoint (without p->overwrite);
 * the model's load errors; COMET_ERR_INVALID_ARG for an already quantized model, rotate_keep without
 * rotate or not below the model's width, smoothing without calibration statistics
 * (RTN with neither reordering nor 4-bit activations needs none), a calibration text
 * shorter than one window, bad FMPQ params; COMET_ERR_IO (the text, the checkpoint),
 * COMET_ERR_NOMEM, or a failed step's error. */
comet_status comet_quantize(const char *model_path, const char *out_dir,
                            const comet_quantize_params *p, comet_quantize_result *r);

#ifdef __cplusplus
}
#endif
#endif

/* checkpoint.h — the comet quantized checkpoint (docs/architecture.md "Model formats"): a
 * directory that standard tools can open, holding everything needed to run the model
 * without its source.
 *
 *   config.json        the model's config in HF LlamaForCausalLM form plus a
 *                      "quantization_config" block (docs/quantization.md lists its keys)
 *   model.safetensors  per layer and linear: `qweight` (U8 [N, K/2] plain INT4 codes, or
 *                      I8 [N, K]) and `scales` (F16 [N, K/B]), or `weight` (F16 / F32
 *                      [N, K]) for 16- / 32-bit weights, columns in the group's permuted order;
 *                      per layer the I32 permutations `self_attn.qkv_perm` [C],
 *                      `self_attn.o_perm` [H*D], `mlp.gate_up_perm` [C], `mlp.down_perm` [F]
 *                      (down_perm is folded into the gate/up rows and the down columns);
 *                      F16 embedding (and lm_head when untied; F32 with 32-bit weights);
 *                      F32 RMSNorm weights.
 *   tokenizer.json     HF tokenizer (copied from an HF source, or written from a GGUF
 *                      source's tokenizer.ggml.* metadata), tokenizer_config.json with
 *                      the chat template.
 */
#ifndef COMET_FORMAT_CHECKPOINT_H
#define COMET_FORMAT_CHECKPOINT_H

#include "comet/model.h"

/* Write config.json and model.safetensors of the quantized model `m` (m->quant set, all
 * linears COMET_WFMT_QSIM) into directory `dir` (created if missing; files replaced).
 * Output is deterministic: the same model gives the same bytes. Returns COMET_ERR_IO
 * naming the file, COMET_ERR_INVALID_ARG for a model that is not quantized, or
 * COMET_ERR_NOMEM. */
comet_status comet_checkpoint_write(const comet_model *m, const char *dir);

/* Whether comet_checkpoint_write can write into `dir`, checked before the work that
 * produces the model: `dir` is an existing writable directory that is empty or a comet
 * checkpoint (its files are replaced), or does not exist and its parent is a writable
 * directory. A non-empty directory that is not a checkpoint is refused unless
 * `overwrite`. Returns COMET_OK or COMET_ERR_IO with a message naming `dir` and the
 * problem. Creates nothing. */
comet_status comet_checkpoint_out_check(const char *dir, int overwrite);

/* Write tokenizer.json and tokenizer_config.json into `dir` for the model loaded from
 * `src_path` (a GGUF file or an HF directory), with m's chat template and special ids. */
comet_status comet_checkpoint_write_tokenizer(const comet_model *m, const char *src_path,
                                              const char *dir);

/* Non-zero when `dir` is a directory whose config.json has a "quantization_config" whose
 * quant_method is "comet-fmpq". */
int comet_checkpoint_detect(const char *dir);

/* Load a comet checkpoint directory into a new model with COMET_WFMT_QSIM linears (the
 * dequantized weights are rebuilt from codes and scales). Errors name the file and the
 * field or tensor: COMET_ERR_IO, COMET_ERR_FORMAT (bad JSON, missing tensor, wrong
 * shape or dtype, a permutation that is not one), COMET_ERR_UNSUPPORTED (unknown
 * format_version, bits). */
comet_status comet_checkpoint_load(const char *dir, comet_model **out);

/* comet_checkpoint_load, with keep_codes_only as comet_model_load_params says (1: no
 * dequantized weights for W4/W8 linears with quantized activations, fp16 embedding and
 * lm_head in tok_embd_f16 / lm_head_f16). */
comet_status comet_checkpoint_load_with(const char *dir, int keep_codes_only, comet_model **out);

#endif

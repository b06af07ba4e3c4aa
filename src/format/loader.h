/* loader.h — internals shared by the model readers (loader.c: dispatch and the weight walk;
 * gguf_model.c: GGUF; hf.c: HF).
 *
 * A loader fills the config, then hands a weight source to comet_load_weights, which
 * walks the LLaMA tensor list once, checks every shape and converts to fp32. The two
 * sources differ only in tensor names and in GGUF's Q/K row permutation.
 */
#ifndef COMET_FORMAT_LOADER_H
#define COMET_FORMAT_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "comet/model.h"
#include "comet/tokenizer.h"

typedef enum comet_wnames {
    COMET_WNAMES_GGUF, /* token_embd.weight, blk.N.attn_q.weight, ... */
    COMET_WNAMES_HF,   /* model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight */
} comet_wnames;

typedef struct comet_wsource {
    comet_wnames names;
    /* Convert tensor `name` to dst[rows * cols] fp32 after checking its shape is
     * [rows, cols] (row-major; cols == 0 means a 1-D tensor of `rows` elements) and its
     * type convertible. dst == NULL: the checks only (run before allocating, so that a
     * file cannot make the loader allocate for a tensor it does not hold). Errors name
     * the file and tensor. */
    comet_status (*fetch)(struct comet_wsource *s, const char *name, int64_t rows, int64_t cols,
                          float *dst);
    void *impl;
} comet_wsource;

/* The comet_arch a model file names: GGUF's general.architecture ("llama") with names
 * COMET_WNAMES_GGUF, config.json's architectures[0] ("LlamaForCausalLM",
 * "MistralForCausalLM", whose sliding window hf.c refuses) with COMET_WNAMES_HF. `name` is
 * `len` bytes, not necessarily NUL-terminated. COMET_OK and *out, or COMET_ERR_UNSUPPORTED
 * "<src>: architecture '<name>' is not supported; supported: <that source's names>". */
comet_status comet_arch_parse(const char *name, size_t len, comet_wnames names, const char *src,
                              comet_arch *out);

/* Allocate and fill every weight of `m` (m->cfg filled and checked) from `src`. GGUF names
 * imply llama.cpp's Q/K row order, which is undone. Logs "loading tensors" progress. */
comet_status comet_load_weights(comet_model *m, comet_wsource *src);

/* HF directory loader (hf.c). `dir` holds config.json. */
comet_status comet_load_hf(const char *dir, comet_model **out);

/* GGUF file loader (gguf_model.c). */
comet_status comet_load_gguf(const char *path, comet_model **out);

/* Undo llama.cpp's convert_hf_to_gguf permutation of Q/K rows in place: within each of
 * `n_head` heads of `head_dim` rows (of `cols` floats), GGUF row 2i+j holds HF row
 * j*head_dim/2 + i (i < head_dim/2, j in {0,1}). Same as transformers'
 * LlamaTensorProcessor._reverse_permute_weights. */
comet_status comet_unpermute_qk(float *w, int n_head, int head_dim, int64_t cols);

/* Add `id` to cfg->eos_ids unless present or negative. */
void comet_config_add_eos(comet_model_config *cfg, int32_t id);

/* Add to cfg->eos_ids every CONTROL token of `tok` whose text is a known end-of-turn or
 * end-of-text marker (<|eot_id|>, <|end_of_text|>, <|eom_id|>, <|im_end|>, <|endoftext|>,
 * </s>, <|end|>), after the ids the model's metadata names. The GGUF and HF loaders call it
 * once the tokenizer is built; a comet checkpoint stores the resulting set in config.json
 * (checkpoint_write.c) and its reader takes that list as is. */
void comet_config_add_end_markers(comet_model_config *cfg, const comet_tokenizer *tok);

#endif

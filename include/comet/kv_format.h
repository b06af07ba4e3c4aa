/* comet/kv_format.h — how the KV cache stores K and V (docs/numerics.md "KV cache"): the
 * cache type, the scale/zero group and the rotation, with the one check and the one default
 * policy every reader and command uses (the checkpoint reader, the quantizer, perplexity's
 * override, the KV pool of every backend).
 *
 * A new cache type is a new comet_kv_type value: its name, its bits and whether it is
 * quantized are answered here; the backends' kv_init say whether they store it.
 * On disk (a comet checkpoint's quantization_config) the type is written as kv_bits and
 * derived again on load (comet_kv_type_from_bits), so the checkpoint format does not name it.
 */
#ifndef COMET_KV_FORMAT_H
#define COMET_KV_FORMAT_H

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one cached K or V channel is. Append-only; an FP8 cache (e4m3 codes with a scale)
 * would be the next value, COMET_KV_FP8_E4M3. */
typedef enum comet_kv_type {
    /* not quantized (kv_bits 16 on disk): the CUDA backend stores fp16 values, the CPU
     * backends keep fp32 (their simulation rounds nothing) */
    COMET_KV_F16 = 0,
    COMET_KV_INT8 = 1, /* 8-bit unsigned codes, fp16 scale and zero per token, head and group */
    COMET_KV_INT4 = 2, /* 4-bit unsigned codes, two a byte; scale and zero as INT8's */
    COMET_KV_TYPE_COUNT
} comet_kv_type;

/* Rotation of K (after RoPE) and V per KV head before KV quantization (docs/numerics.md
 * "KV cache"): none, or the normalized Walsh–Hadamard matrix H_D (D a power of two);
 * attention then rotates q by H_D and its output back by H_D, so only the quantization
 * error changes. */
typedef enum comet_kv_rotation {
    COMET_KV_ROTATION_NONE = 0,
    COMET_KV_ROTATION_HADAMARD = 1,
} comet_kv_rotation;

/* How the KV cache stores K and V: the one definition the checkpoint, the model, the
 * quantizer's and perplexity's parameters and the cache itself share. A zeroed struct is an
 * unquantized cache without rotation (group 0 = D). In a request (comet_kv_format_resolve)
 * type -1, group 0 and rotation -1 mean "automatic". */
typedef struct comet_kv_format {
    int type;     /* comet_kv_type */
    int group;    /* G: channels per scale/zero group (divides the head dim D); 0 = D */
    int rotation; /* comet_kv_rotation applied before quantization */
} comet_kv_format;

/* "f16", "int8", "int4"; NULL for a value not listed above. */
const char *comet_kv_type_name(int type);

/* Bits of one stored channel: 16, 8 or 4 (what `--kv-bits` and the checkpoint's kv_bits
 * say); 0 for a value not listed above. */
int comet_kv_type_bits(int type);

/* The type stored in `bits` bits: 16 -> F16, 8 -> INT8, 4 -> INT4; -1 for other values
 * (the caller names the input and what would work: 4, 8 or 16). */
int comet_kv_type_from_bits(int bits);

/* Whether the type is quantized (codes with a scale and zero per group): INT8, INT4. */
int comet_kv_type_quantized(int type);

/* "none" / "hadamard" (the checkpoint's and the CLI's spelling); NULL for other values. */
const char *comet_kv_rotation_name(int rotation);

/* The comet_kv_rotation named `name`, or -1 for a name not listed above (or NULL). */
int comet_kv_rotation_parse(const char *name);

/* The KV group a quantized cache takes unless told otherwise: 16 channels where the head
 * dim is a multiple of 16, else 0 (one group per head). docs/accuracy.md has what it buys. */
int comet_kv_default_group(int head_dim);

/* Whether `f` is a format a cache of head dim `head_dim` can take: a known type, a group in
 * 0..D dividing D (0 = D), a known rotation, and the Hadamard rotation only at a power-of-two
 * D. COMET_OK, or COMET_ERR_INVALID_ARG with a message that begins with `who` (e.g.
 * "quantize", "kv cache", a checkpoint's config path) and names the field, its value and
 * what would work. Backend limits (the CUDA kernels' group multiple of 8, ...) are the
 * backend's kv_init's to check. */
comet_status comet_kv_format_check(const comet_kv_format *f, int head_dim, const char *who);

/* The default policy: the format a cache of head dim `head_dim` runs with when `req` is
 * asked for on top of `base` (the model's format; NULL: none, as for the quantizer).
 * req->type -1 takes base's type (F16 without a base). An automatic group (0) or rotation
 * (-1) keeps base's value, unless there is no base or a quantized type is asked for on top
 * of an unquantized base; then it takes the policy: group comet_kv_default_group(D) for a
 * quantized type (D for F16), rotation hadamard for a quantized type at a power-of-two D,
 * else none. The result has group in 1..D; a fully given req is returned as it is.
 * COMET_OK, or comet_kv_format_check's error for the result (message beginning with `who`);
 * *out (which may be req) is written only on success. */
comet_status comet_kv_format_resolve(const comet_kv_format *req, const comet_kv_format *base,
                                     int head_dim, const char *who, comet_kv_format *out);

#ifdef __cplusplus
}
#endif
#endif

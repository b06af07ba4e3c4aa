/* gguf.h — GGUF v3 reader (internal): metadata, tensor infos (gguf.c), dequantization to
 * fp32 (gguf_dequant.c).
 *
 * The reader parses a whole GGUF file held in memory (normally a read-only mmap) and
 * validates everything before handing anything out: every string and array lies inside
 * the buffer, nested arrays are walked, tensor infos have 1..4 dimensions whose product
 * does not overflow, a known type, a first dimension divisible by the type's block size,
 * an aligned offset, and bytes that end inside the file. Strings returned point into the
 * buffer (not NUL-terminated) and live as long as the comet_gguf.
 *
 * Format reference: ggml/docs/gguf.md (llama.cpp); block layouts: ggml-common.h.
 * This file does not know about LLaMA: the model loader (gguf_model.c) maps keys and tensor
 * names to a comet_model. Only version 3 (little-endian) is read.
 */
#ifndef COMET_FORMAT_GGUF_H
#define COMET_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"
#include "core/mmap.h"

/* Metadata value types, numbered as in the file. */
typedef enum comet_gguf_vtype {
    COMET_GGUF_U8 = 0,
    COMET_GGUF_I8 = 1,
    COMET_GGUF_U16 = 2,
    COMET_GGUF_I16 = 3,
    COMET_GGUF_U32 = 4,
    COMET_GGUF_I32 = 5,
    COMET_GGUF_F32 = 6,
    COMET_GGUF_BOOL = 7,
    COMET_GGUF_STRING = 8,
    COMET_GGUF_ARRAY = 9,
    COMET_GGUF_U64 = 10,
    COMET_GGUF_I64 = 11,
    COMET_GGUF_F64 = 12,
    COMET_GGUF_VTYPE_COUNT
} comet_gguf_vtype;

/* ggml tensor types used by comet by name; the full table (names, block sizes) is in
 * gguf.c and reachable through comet_gguf_type_name / comet_gguf_type_block. */
enum {
    COMET_GGML_F32 = 0,
    COMET_GGML_F16 = 1,
    COMET_GGML_Q4_0 = 2,
    COMET_GGML_Q4_1 = 3,
    COMET_GGML_Q5_0 = 6,
    COMET_GGML_Q5_1 = 7,
    COMET_GGML_Q8_0 = 8,
    COMET_GGML_Q2_K = 10,
    COMET_GGML_Q3_K = 11,
    COMET_GGML_Q4_K = 12,
    COMET_GGML_Q5_K = 13,
    COMET_GGML_Q6_K = 14,
    COMET_GGML_BF16 = 30,
};

#define COMET_GGUF_MAX_DIMS 4
#define COMET_GGUF_MAX_NAME 64 /* tensor names are shorter than this (GGML_MAX_NAME) */
#define COMET_GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the file buffer: `len` bytes at `s`, not NUL-terminated. */
typedef struct comet_gguf_str {
    const char *s;
    uint64_t len;
} comet_gguf_str;

/* One metadata key/value pair. */
typedef struct comet_gguf_kv {
    comet_gguf_str key;
    comet_gguf_vtype type;
    union {
        uint64_t u; /* U8, U16, U32, U64, BOOL (0/1) */
        int64_t i;  /* I8, I16, I32, I64 */
        double f;   /* F32, F64 */
    } num;
    comet_gguf_str str;        /* STRING */
    comet_gguf_vtype arr_type; /* ARRAY: element type */
    uint64_t arr_n;            /* ARRAY: element count */
    const uint8_t *arr_data;   /* ARRAY: first element (fixed-size elements are packed,
                                * little-endian, possibly unaligned) */
    size_t arr_bytes;          /* ARRAY: bytes spanned by all elements */
} comet_gguf_kv;

/* One tensor info. ne[0] is the fastest-varying (row length): a ggml [ne0, ne1] weight is
 * a row-major [ne1][ne0] matrix, i.e. HF's [out, in] with ne0 = in. */
typedef struct comet_gguf_tensor {
    char name[COMET_GGUF_MAX_NAME];
    int n_dims;
    int64_t ne[COMET_GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint32_t type;                   /* ggml type id */
    uint64_t offset;                 /* from the start of the data section */
    int64_t n_elements;
    uint64_t n_bytes;
    const uint8_t *data; /* [n_bytes] inside the file buffer */
} comet_gguf_tensor;

typedef struct comet_gguf {
    comet_mmap map;     /* when opened from a file */
    const uint8_t *buf; /* [size] the whole file */
    size_t size;
    char *name; /* file name for messages, owned */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* start of the tensor data section */
    size_t n_kv;
    comet_gguf_kv *kv; /* [n_kv] in file order */
    size_t n_tensors;
    comet_gguf_tensor *tensors; /* [n_tensors] in file order */
} comet_gguf;

/* Map and parse a GGUF file. Returns COMET_OK and *out (free with comet_gguf_free), or
 * COMET_ERR_IO (cannot map), COMET_ERR_FORMAT (bad magic, truncated, bad offsets,
 * overflowing shapes; the message names the file and the field/tensor),
 * COMET_ERR_UNSUPPORTED (GGUF version other than 3, unknown tensor type id),
 * COMET_ERR_NOMEM. */
comet_status comet_gguf_open(const char *path, comet_gguf **out);

/* Parse `size` bytes at `buf` (borrowed: must outlive the result). `name` labels messages.
 * Same statuses as comet_gguf_open except COMET_ERR_IO. */
comet_status comet_gguf_parse(const void *buf, size_t size, const char *name, comet_gguf **out);

void comet_gguf_free(comet_gguf *g);

/* The pair for `key` (NUL-terminated), or NULL. */
const comet_gguf_kv *comet_gguf_find(const comet_gguf *g, const char *key);

/* Typed getters. A missing key gives COMET_ERR_FORMAT "<file>: metadata key '<key>'
 * missing"; a value of the wrong type or out of range gives COMET_ERR_FORMAT naming the
 * key, the type found and the type expected. Integer getters accept any integer type
 * whose value fits; get_f32 accepts F32 and F64; get_bool accepts BOOL. */
comet_status comet_gguf_get_u32(const comet_gguf *g, const char *key, uint32_t *out);
comet_status comet_gguf_get_i64(const comet_gguf *g, const char *key, int64_t *out);
comet_status comet_gguf_get_f32(const comet_gguf *g, const char *key, float *out);
comet_status comet_gguf_get_bool(const comet_gguf *g, const char *key, int *out);
comet_status comet_gguf_get_str(const comet_gguf *g, const char *key, comet_gguf_str *out);

/* An ARRAY value whose elements have type `elem` (COMET_GGUF_VTYPE_COUNT: any). */
comet_status comet_gguf_get_arr(const comet_gguf *g, const char *key, comet_gguf_vtype elem,
                                const comet_gguf_kv **out);

/* Copy a STRING array into one malloc'd block: *out is [kv->arr_n] NUL-terminated
 * strings; free(*out) releases everything. COMET_ERR_FORMAT if not a string array. */
comet_status comet_gguf_arr_strings(const comet_gguf_kv *kv, char ***out);

/* Convert a numeric array (any integer type, or F32/F64 for the float version) into
 * out[kv->arr_n]. Integer values that do not fit give COMET_ERR_FORMAT naming the key. */
comet_status comet_gguf_arr_i32(const comet_gguf_kv *kv, int32_t *out);
comet_status comet_gguf_arr_f32(const comet_gguf_kv *kv, float *out);

/* malloc'd NUL-terminated copy of a file string, or NULL on OOM. */
char *comet_gguf_strdup(comet_gguf_str s);

/* Name of a metadata value type ("u32", "string", ...). */
const char *comet_gguf_vtype_name(comet_gguf_vtype t);

/* The tensor called `name`, or NULL. */
const comet_gguf_tensor *comet_gguf_find_tensor(const comet_gguf *g, const char *name);

/* ggml type name ("Q4_1"), or NULL for an id ggml does not define. */
const char *comet_gguf_type_name(uint32_t type);

/* Elements per block and bytes per block of a ggml type; 0 for unknown ids. */
int comet_gguf_type_block(uint32_t type, size_t *type_bytes);

/* Whether comet_gguf_dequant converts this type. */
int comet_gguf_type_supported(uint32_t type);

/* Dequantize `n` elements of ggml type `type` at `src` (n a multiple of the block size,
 * src holding n / block * type_bytes bytes) into dst[n] fp32, exactly as ggml's
 * dequantize_row_* does. Returns COMET_ERR_UNSUPPORTED for a type comet cannot convert
 * (the message names the type; callers prefix the tensor). */
comet_status comet_gguf_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Dequantize a whole tensor into dst[t->n_elements]. COMET_ERR_UNSUPPORTED names the file,
 * the tensor and its type. */
comet_status comet_gguf_dequant(const comet_gguf *g, const comet_gguf_tensor *t, float *dst);

/* IEEE half / bfloat16 bit patterns to fp32 (exact). */
float comet_fp16_to_fp32(uint16_t h);
float comet_bf16_to_fp32(uint16_t h);

#endif

/* safetensors.h — safetensors file reader (internal).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
 * then the data section; offsets are relative to its start. The reader maps the file,
 * parses the header with cJSON and checks every entry (known dtype, non-negative integer
 * shape, offsets inside the file, byte length == elements * dtype size) before handing
 * anything out. Conversion to fp32 covers the float dtypes HF checkpoints use
 * (F32, F16, BF16); tensors of other dtypes can be read raw (the comet checkpoint stores
 * packed integers). Spec: huggingface/safetensors README "Format".
 */
#ifndef COMET_FORMAT_SAFETENSORS_H
#define COMET_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"
#include "core/mmap.h"

typedef enum comet_st_dtype {
    COMET_ST_F32,
    COMET_ST_F16,
    COMET_ST_BF16,
    COMET_ST_F64,
    COMET_ST_I8,
    COMET_ST_U8,
    COMET_ST_I16,
    COMET_ST_U16,
    COMET_ST_I32,
    COMET_ST_U32,
    COMET_ST_I64,
    COMET_ST_U64,
    COMET_ST_BOOL,
    COMET_ST_F8_E4M3,
    COMET_ST_F8_E5M2,
    COMET_ST_DTYPE_COUNT
} comet_st_dtype;

#define COMET_ST_MAX_DIMS 8

typedef struct comet_st_tensor {
    char *name; /* owned */
    comet_st_dtype dtype;
    int n_dims;
    int64_t shape[COMET_ST_MAX_DIMS]; /* row-major, shape[n_dims-1] fastest */
    int64_t n_elements;
    const uint8_t *data; /* [n_bytes] inside the mapped file */
    size_t n_bytes;
} comet_st_tensor;

typedef struct comet_safetensors {
    comet_mmap map;     /* when opened from a file */
    const uint8_t *buf; /* [size] */
    size_t size;
    char *name; /* owned, for messages */
    size_t n_tensors;
    comet_st_tensor *tensors; /* [n_tensors] in header order */
} comet_safetensors;

/* Map and parse a safetensors file. COMET_OK and *out (free with comet_st_free), or
 * COMET_ERR_IO (cannot map), COMET_ERR_FORMAT (header length past the end, bad JSON,
 * bad shape/offsets; the message names the file and tensor), COMET_ERR_UNSUPPORTED
 * (unknown dtype, more than COMET_ST_MAX_DIMS dimensions), COMET_ERR_NOMEM. */
comet_status comet_st_open(const char *path, comet_safetensors **out);

/* Parse `size` bytes at `buf` (borrowed, must outlive the result); `name` labels messages. */
comet_status comet_st_parse(const void *buf, size_t size, const char *name,
                            comet_safetensors **out);

void comet_st_free(comet_safetensors *st);

/* The tensor called `name`, or NULL. */
const comet_st_tensor *comet_st_find(const comet_safetensors *st, const char *name);

/* Dtype name as written in headers ("BF16"). */
const char *comet_st_dtype_name(comet_st_dtype d);

/* Bytes per element of a dtype. */
size_t comet_st_dtype_size(comet_st_dtype d);

/* Convert a F32/F16/BF16 tensor to dst[t->n_elements] fp32. COMET_ERR_UNSUPPORTED naming
 * the file, tensor and dtype for any other dtype. */
comet_status comet_st_to_f32(const comet_safetensors *st, const comet_st_tensor *t, float *dst);

#endif

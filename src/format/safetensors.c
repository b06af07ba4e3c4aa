/* safetensors.c — safetensors header parsing (cJSON), validation and fp32 conversion.
 *
 * The JSON header is copied into a NUL-terminated buffer before cJSON sees it, so the
 * parser never reads past the header; bytes after the JSON value must be the spaces
 * writers pad with. Numbers are doubles in cJSON: shapes and offsets must be integers
 * in [0, 2^53], which covers every real file.
 */
#include "format/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "format/gguf.h" /* comet_fp16_to_fp32, comet_bf16_to_fp32 */

static const struct {
    const char *name;
    size_t size;
} dtypes[COMET_ST_DTYPE_COUNT] = {
    [COMET_ST_F32] = {"F32", 4},         [COMET_ST_F16] = {"F16", 2},
    [COMET_ST_BF16] = {"BF16", 2},       [COMET_ST_F64] = {"F64", 8},
    [COMET_ST_I8] = {"I8", 1},           [COMET_ST_U8] = {"U8", 1},
    [COMET_ST_I16] = {"I16", 2},         [COMET_ST_U16] = {"U16", 2},
    [COMET_ST_I32] = {"I32", 4},         [COMET_ST_U32] = {"U32", 4},
    [COMET_ST_I64] = {"I64", 8},         [COMET_ST_U64] = {"U64", 8},
    [COMET_ST_BOOL] = {"BOOL", 1},       [COMET_ST_F8_E4M3] = {"F8_E4M3", 1},
    [COMET_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *comet_st_dtype_name(comet_st_dtype d) {
    return (unsigned)d < COMET_ST_DTYPE_COUNT ? dtypes[d].name : "invalid";
}

size_t comet_st_dtype_size(comet_st_dtype d) {
    return (unsigned)d < COMET_ST_DTYPE_COUNT ? dtypes[d].size : 0;
}

#define MAX_EXACT 9007199254740992.0 /* 2^53 */

/* A JSON number that is a non-negative integer <= 2^53. */
static int json_u64(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j))
        return 0;
    double d = j->valuedouble;
    if (!(d >= 0.0 && d <= MAX_EXACT) || d != (double)(uint64_t)d)
        return 0;
    *v = (uint64_t)d;
    return 1;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(((const comet_st_tensor *)a)->name, ((const comet_st_tensor *)b)->name);
}

static comet_status parse_entry(comet_safetensors *st, const cJSON *e, comet_st_tensor *t,
                                uint64_t data_bytes, const uint8_t *data) {
    const char *f = st->name, *n = t->name;
    if (!cJSON_IsObject(e))
        return comet_set_error(COMET_ERR_FORMAT, "%s: header entry '%s' is not an object", f, n);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': \"dtype\" missing or not a "
                               "string",
                               f, n);
    int d = 0;
    while (d < COMET_ST_DTYPE_COUNT && strcmp(dtypes[d].name, dt->valuestring) != 0)
        d++;
    if (d == COMET_ST_DTYPE_COUNT)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tensor '%s': unknown dtype '%.32s' "
                               "(known: F32, F16, BF16, F64, I8..I64, U8..U64, BOOL, F8_E4M3, "
                               "F8_E5M2)",
                               f, n, dt->valuestring);
    t->dtype = (comet_st_dtype)d;
    if (!cJSON_IsArray(shape))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': \"shape\" missing or not an "
                               "array",
                               f, n);
    int rank = cJSON_GetArraySize(shape);
    if (rank > COMET_ST_MAX_DIMS)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has %d dimensions (at "
                               "most %d supported)",
                               f, n, rank, COMET_ST_MAX_DIMS);
    t->n_dims = rank;
    uint64_t n_el = 1;
    int i = 0;
    for (const cJSON *s = shape->child; s; s = s->next, i++) {
        uint64_t v;
        if (!json_u64(s, &v))
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor '%s': shape[%d] is not a "
                                   "non-negative integer",
                                   f, n, i);
        if (v && n_el > (uint64_t)INT64_MAX / v)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor '%s': element count "
                                   "overflows",
                                   f, n);
        t->shape[i] = (int64_t)v;
        n_el *= v;
    }
    t->n_elements = (int64_t)n_el;
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &begin) ||
        !json_u64(offs->child->next, &end))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': \"data_offsets\" must be two "
                               "non-negative integers [begin, end]",
                               f, n);
    if (begin > end || end > data_bytes)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                               "] out of range (data section is %" PRIu64
                               " bytes; truncated file?)",
                               f, n, begin, end, data_bytes);
    uint64_t want = n_el;
    if (want > UINT64_MAX / dtypes[d].size)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor '%s': byte size overflows", f, n);
    want *= dtypes[d].size;
    if (end - begin != want)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets span %" PRIu64 " bytes but %" PRIu64
                               " x %s needs %" PRIu64,
                               f, n, end - begin, n_el, dtypes[d].name, want);
    t->data = data + begin;
    t->n_bytes = (size_t)want;
    return COMET_OK;
}

comet_status comet_st_parse(const void *buf, size_t size, const char *name,
                            comet_safetensors **out) {
    *out = NULL;
    const char *label = name ? name : "<safetensors>";
    comet_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->name = strdup(label))) {
        free(st);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", label);
    }
    st->buf = buf;
    st->size = size;
    comet_status rc = COMET_OK;
    char *hdr = NULL;
    cJSON *root = NULL;
    if (size < 8) {
        rc = comet_set_error(COMET_ERR_FORMAT,
                             "%s: not a safetensors file: %zu bytes, shorter "
                             "than the 8-byte header length",
                             label, size);
        goto done;
    }
    const uint8_t *p = buf;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > size - 8) {
        rc = comet_set_error(COMET_ERR_FORMAT,
                             "%s: header length %" PRIu64 " runs past the end "
                             "of the file (%zu bytes; truncated or not a safetensors file)",
                             label, hlen, size);
        goto done;
    }
    hdr = malloc((size_t)hlen + 1);
    if (!hdr) {
        rc = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory for the header", label);
        goto done;
    }
    memcpy(hdr, p + 8, (size_t)hlen);
    hdr[hlen] = '\0';
    const char *end = NULL;
    root = cJSON_ParseWithOpts(hdr, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        long at = root ? 0 : (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - hdr : 0);
        rc = comet_set_error(COMET_ERR_FORMAT,
                             "%s: header is not a JSON object (error near "
                             "byte %ld of the %" PRIu64 "-byte header)",
                             label, at, hlen);
        goto done;
    }
    for (const char *q = end; q < hdr + hlen; q++) {
        if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') {
            rc = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: header has trailing bytes after the JSON "
                                 "object (at byte %ld)",
                                 label, (long)(q - hdr));
            goto done;
        }
    }
    int n = cJSON_GetArraySize(root);
    st->tensors = calloc(n > 0 ? (size_t)n : 1, sizeof *st->tensors);
    if (!st->tensors) {
        rc = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    uint64_t data_bytes = size - 8 - hlen;
    const uint8_t *data = p + 8 + hlen;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string) {
            rc = comet_set_error(COMET_ERR_FORMAT, "%s: header member without a name", label);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        comet_st_tensor *t = &st->tensors[st->n_tensors];
        if (!(t->name = strdup(e->string))) {
            rc = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        st->n_tensors++;
        if ((rc = parse_entry(st, e, t, data_bytes, data)) < 0)
            goto done;
    }
    /* Duplicate names would make lookups ambiguous. Sort a copy to find them. */
    if (st->n_tensors > 1) {
        comet_st_tensor *s = malloc(st->n_tensors * sizeof *s);
        if (!s) {
            rc = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        memcpy(s, st->tensors, st->n_tensors * sizeof *s);
        qsort(s, st->n_tensors, sizeof *s, name_cmp);
        for (size_t i = 1; i < st->n_tensors && rc == COMET_OK; i++)
            if (strcmp(s[i - 1].name, s[i].name) == 0)
                rc = comet_set_error(COMET_ERR_FORMAT,
                                     "%s: tensor '%s' appears twice in the "
                                     "header",
                                     label, s[i].name);
        free(s);
    }
done:
    cJSON_Delete(root);
    free(hdr);
    if (rc < 0) {
        comet_st_free(st);
        return rc;
    }
    *out = st;
    return COMET_OK;
}

comet_status comet_st_open(const char *path, comet_safetensors **out) {
    *out = NULL;
    comet_mmap m;
    COMET_TRY(comet_mmap_open(path, &m));
    comet_status rc = comet_st_parse(m.data, m.size, path, out);
    if (rc < 0) {
        comet_mmap_close(&m);
        return rc;
    }
    (*out)->map = m;
    return COMET_OK;
}

void comet_st_free(comet_safetensors *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free(st->tensors[i].name);
    free(st->tensors);
    comet_mmap_close(&st->map);
    free(st->name);
    free(st);
}

const comet_st_tensor *comet_st_find(const comet_safetensors *st, const char *name) {
    for (size_t i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0)
            return &st->tensors[i];
    return NULL;
}

comet_status comet_st_to_f32(const comet_safetensors *st, const comet_st_tensor *t, float *dst) {
    const uint8_t *s = t->data;
    int64_t n = t->n_elements;
    switch (t->dtype) {
    case COMET_ST_F32: memcpy(dst, s, (size_t)n * 4); return COMET_OK;
    case COMET_ST_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = comet_fp16_to_fp32((uint16_t)(s[2 * i] | (s[2 * i + 1] << 8)));
        return COMET_OK;
    case COMET_ST_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = comet_bf16_to_fp32((uint16_t)(s[2 * i] | (s[2 * i + 1] << 8)));
        return COMET_OK;
    default:
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has dtype %s; weights must "
                               "be F32, F16 or BF16",
                               st->name, t->name, comet_st_dtype_name(t->dtype));
    }
}

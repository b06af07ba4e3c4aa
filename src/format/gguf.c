/* gguf.c — GGUF v3 parsing, validation, the ggml type table and typed metadata access.
 *
 * Parsing is a single forward pass with a bounds-checked cursor; every count read from
 * the file is checked against the bytes left before anything is allocated, so a hostile
 * file costs at most O(file size) memory and time. The tensors' conversion to fp32 is
 * gguf_dequant.c's.
 */

#include "format/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- type tables ------------------------------------------------------------------ */

typedef struct ggml_type_info {
    const char *name;
    int block;    /* elements per block */
    size_t bytes; /* bytes per block */
} ggml_type_info;

/* Indexed by ggml type id; ids ggml retired or never assigned have name NULL. */
static const ggml_type_info ggml_types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 40},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *comet_gguf_type_name(uint32_t type) {
    return type < N_GGML_TYPES ? ggml_types[type].name : NULL;
}

int comet_gguf_type_block(uint32_t type, size_t *type_bytes) {
    if (type >= N_GGML_TYPES || !ggml_types[type].name) {
        if (type_bytes)
            *type_bytes = 0;
        return 0;
    }
    if (type_bytes)
        *type_bytes = ggml_types[type].bytes;
    return ggml_types[type].block;
}

int comet_gguf_type_supported(uint32_t type) {
    switch (type) {
    case COMET_GGML_F32:
    case COMET_GGML_F16:
    case COMET_GGML_BF16:
    case COMET_GGML_Q4_0:
    case COMET_GGML_Q4_1:
    case COMET_GGML_Q5_0:
    case COMET_GGML_Q5_1:
    case COMET_GGML_Q8_0:
    case COMET_GGML_Q2_K:
    case COMET_GGML_Q3_K:
    case COMET_GGML_Q4_K:
    case COMET_GGML_Q5_K:
    case COMET_GGML_Q6_K: return 1;
    default: return 0;
    }
}

static const char *const vtype_names[COMET_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* Encoded size of a fixed-size value type; 0 for STRING/ARRAY. */
static const uint8_t vtype_size[COMET_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *comet_gguf_vtype_name(comet_gguf_vtype t) {
    return (unsigned)t < COMET_GGUF_VTYPE_COUNT ? vtype_names[t] : "invalid";
}

/* ---- little-endian loads (the buffer is unaligned) ---------------------------------- */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

/* ---- the cursor ------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *buf;
    size_t size;
    size_t off;
    const char *file;
} cursor;

static size_t left(const cursor *c) { return c->size - c->off; }

/* Fails with a message naming the file, what was being read, and where. */
static comet_status need(cursor *c, uint64_t n, const char *what) {
    if (n > left(c))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: truncated: %s needs %" PRIu64 " bytes at offset %zu but "
                               "the file is %zu bytes (incomplete download?)",
                               c->file, what, n, c->off, c->size);
    return COMET_OK;
}

static comet_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    COMET_TRY(need(c, 4, what));
    *v = ld32(c->buf + c->off);
    c->off += 4;
    return COMET_OK;
}

static comet_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    COMET_TRY(need(c, 8, what));
    *v = ld64(c->buf + c->off);
    c->off += 8;
    return COMET_OK;
}

static comet_status rd_str(cursor *c, comet_gguf_str *s, const char *what) {
    uint64_t len;
    COMET_TRY(rd_u64(c, &len, what));
    COMET_TRY(need(c, len, what));
    s->s = (const char *)c->buf + c->off;
    s->len = len;
    c->off += (size_t)len;
    return COMET_OK;
}

/* Print a file string into a bounded, printable form for messages. */
static const char *show(comet_gguf_str s, char *buf, size_t cap) {
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)s.s[i];
        buf[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (s.len > n && n + 4 <= cap) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

#define MAX_ARRAY_DEPTH 8

/* Skip (validate) one value of type `t`; for the top-level value fill `kv`. */
static comet_status rd_value(cursor *c, comet_gguf_vtype t, int depth, comet_gguf_kv *kv,
                             const char *key) {
    char what[160];
    if ((unsigned)t >= COMET_GGUF_VTYPE_COUNT)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: metadata key '%s' has invalid value type %u (valid: 0..%d)",
                               c->file, key, (unsigned)t, COMET_GGUF_VTYPE_COUNT - 1);
    if (t == COMET_GGUF_STRING) {
        comet_gguf_str s;
        snprintf(what, sizeof what, "string value of key '%s'", key);
        COMET_TRY(rd_str(c, &s, what));
        if (kv)
            kv->str = s;
        return COMET_OK;
    }
    if (t == COMET_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        snprintf(what, sizeof what, "array header of key '%s'", key);
        COMET_TRY(rd_u32(c, &et, what));
        COMET_TRY(rd_u64(c, &n, what));
        if (et >= COMET_GGUF_VTYPE_COUNT)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: metadata key '%s': array has invalid element type %u",
                                   c->file, key, et);
        if (et == COMET_GGUF_ARRAY && depth + 1 >= MAX_ARRAY_DEPTH)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: metadata key '%s': arrays nested deeper than %d", c->file,
                                   key, MAX_ARRAY_DEPTH);
        /* Every element takes at least this many bytes: bounds the count before walking. */
        uint64_t min_elem = vtype_size[et] ? vtype_size[et] : (et == COMET_GGUF_STRING ? 8 : 12);
        if (n > left(c) / min_elem)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: truncated: metadata key '%s': array of %" PRIu64
                                   " %s needs at least %" PRIu64 " bytes at offset %zu but "
                                   "the file is %zu bytes",
                                   c->file, key, n, vtype_names[et], n * min_elem, c->off, c->size);
        size_t start = c->off;
        if (vtype_size[et]) {
            c->off += (size_t)(n * vtype_size[et]);
        } else {
            for (uint64_t i = 0; i < n; i++)
                COMET_TRY(rd_value(c, (comet_gguf_vtype)et, depth + 1, NULL, key));
        }
        if (kv) {
            kv->arr_type = (comet_gguf_vtype)et;
            kv->arr_n = n;
            kv->arr_data = c->buf + start;
            kv->arr_bytes = c->off - start;
        }
        return COMET_OK;
    }
    snprintf(what, sizeof what, "%s value of key '%s'", vtype_names[t], key);
    COMET_TRY(need(c, vtype_size[t], what));
    const uint8_t *p = c->buf + c->off;
    c->off += vtype_size[t];
    if (!kv)
        return COMET_OK;
    switch (t) {
    case COMET_GGUF_U8: kv->num.u = p[0]; break;
    case COMET_GGUF_I8: kv->num.i = (int8_t)p[0]; break;
    case COMET_GGUF_U16: kv->num.u = ld16(p); break;
    case COMET_GGUF_I16: kv->num.i = (int16_t)ld16(p); break;
    case COMET_GGUF_U32: kv->num.u = ld32(p); break;
    case COMET_GGUF_I32: kv->num.i = (int32_t)ld32(p); break;
    case COMET_GGUF_U64: kv->num.u = ld64(p); break;
    case COMET_GGUF_I64: kv->num.i = (int64_t)ld64(p); break;
    case COMET_GGUF_BOOL: kv->num.u = p[0] != 0; break;
    case COMET_GGUF_F32: {
        uint32_t b = ld32(p);
        float f;
        memcpy(&f, &b, 4);
        kv->num.f = f;
        break;
    }
    case COMET_GGUF_F64: {
        uint64_t b = ld64(p);
        double f;
        memcpy(&f, &b, 8);
        kv->num.f = f;
        break;
    }
    default: break;
    }
    return COMET_OK;
}

static int str_cmp(comet_gguf_str a, comet_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = n ? memcmp(a.s, b.s, n) : 0;
    if (r)
        return r;
    return (a.len > b.len) - (a.len < b.len);
}

static int kv_ptr_cmp(const void *a, const void *b) {
    return str_cmp((*(const comet_gguf_kv *const *)a)->key,
                   (*(const comet_gguf_kv *const *)b)->key);
}

static int tensor_ptr_cmp(const void *a, const void *b) {
    return strcmp((*(const comet_gguf_tensor *const *)a)->name,
                  (*(const comet_gguf_tensor *const *)b)->name);
}

/* Duplicate keys or tensor names make lookups ambiguous: refuse them (as ggml does). */
static comet_status check_duplicates(const comet_gguf *g) {
    size_t n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    if (n < 2)
        return COMET_OK;
    const void **v = malloc(n * sizeof *v);
    if (!v)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", g->name);
    comet_status st = COMET_OK;
    char b[80];
    for (size_t i = 0; i < g->n_kv; i++)
        v[i] = &g->kv[i];
    qsort(v, g->n_kv, sizeof *v, kv_ptr_cmp);
    for (size_t i = 1; i < g->n_kv && st == COMET_OK; i++)
        if (kv_ptr_cmp(&v[i - 1], &v[i]) == 0)
            st = comet_set_error(COMET_ERR_FORMAT, "%s: metadata key '%s' appears twice", g->name,
                                 show(((const comet_gguf_kv *)v[i])->key, b, sizeof b));
    for (size_t i = 0; i < g->n_tensors; i++)
        v[i] = &g->tensors[i];
    qsort(v, g->n_tensors, sizeof *v, tensor_ptr_cmp);
    for (size_t i = 1; i < g->n_tensors && st == COMET_OK; i++)
        if (tensor_ptr_cmp(&v[i - 1], &v[i]) == 0)
            st = comet_set_error(COMET_ERR_FORMAT, "%s: tensor '%s' appears twice", g->name,
                                 ((const comet_gguf_tensor *)v[i])->name);
    free(v);
    return st;
}

static comet_status rd_tensor_info(cursor *c, comet_gguf_tensor *t, uint64_t idx) {
    char what[96];
    comet_gguf_str name;
    snprintf(what, sizeof what, "name of tensor info #%" PRIu64, idx);
    COMET_TRY(rd_str(c, &name, what));
    if (name.len >= COMET_GGUF_MAX_NAME) {
        char b[80];
        return comet_set_error(
            COMET_ERR_FORMAT,
            "%s: tensor info #%" PRIu64 ": name '%s' is %" PRIu64 " bytes (at most %d allowed)",
            c->file, idx, show(name, b, sizeof b), name.len, COMET_GGUF_MAX_NAME - 1);
    }
    memcpy(t->name, name.s, (size_t)name.len);
    t->name[name.len] = '\0';
    if (memchr(t->name, '\0', (size_t)name.len))
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor info #%" PRIu64 ": name contains a NUL byte", c->file,
                               idx);
    snprintf(what, sizeof what, "tensor info of '%s'", t->name);
    uint32_t n_dims;
    COMET_TRY(rd_u32(c, &n_dims, what));
    if (n_dims < 1 || n_dims > COMET_GGUF_MAX_DIMS)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s' has %u dimensions (1..%d allowed)", c->file,
                               t->name, n_dims, COMET_GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    for (int d = 0; d < COMET_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        COMET_TRY(rd_u64(c, &ne, what));
        if (ne > (uint64_t)INT64_MAX)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor '%s': dimension %u is %" PRIu64
                                   " (negative as int64)",
                                   c->file, t->name, d, ne);
        t->ne[d] = (int64_t)ne;
        if (ne != 0 && n_el > (uint64_t)INT64_MAX / ne)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: tensor '%s': element count overflows (dimensions "
                                   "%" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64 ")",
                                   c->file, t->name, t->ne[0], d >= 1 ? t->ne[1] : 1,
                                   d >= 2 ? t->ne[2] : 1, d >= 3 ? t->ne[3] : 1);
        n_el *= ne;
    }
    t->n_elements = (int64_t)n_el;
    COMET_TRY(rd_u32(c, &t->type, what));
    COMET_TRY(rd_u64(c, &t->offset, what));
    size_t bb;
    int blk = comet_gguf_type_block(t->type, &bb);
    if (!blk)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has unknown ggml type id %u (a newer GGUF "
                               "type?); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                               "Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K",
                               c->file, t->name, t->type);
    if (t->ne[0] % blk != 0)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: tensor '%s': row length %" PRId64 " is not a multiple of "
                               "the %s block size %d",
                               c->file, t->name, t->ne[0], ggml_types[t->type].name, blk);
    uint64_t n_blocks = n_el / (uint64_t)blk;
    if (n_blocks && bb > UINT64_MAX / n_blocks)
        return comet_set_error(COMET_ERR_FORMAT, "%s: tensor '%s': byte size overflows", c->file,
                               t->name);
    t->n_bytes = n_blocks * bb;
    return COMET_OK;
}

comet_status comet_gguf_parse(const void *buf, size_t size, const char *name, comet_gguf **out) {
    *out = NULL;
    comet_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(name ? name : "<gguf>"))) {
        free(g);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", name ? name : "<gguf>");
    }
    g->buf = buf;
    g->size = size;
    cursor c = {buf, size, 0, g->name};
    comet_status st;
    char b[80];

    if (size < 4 || memcmp(buf, "GGUF", 4) != 0) {
        const uint8_t *p = buf;
        st = size < 4 ? comet_set_error(COMET_ERR_FORMAT,
                                        "%s: not a GGUF file: %zu bytes, shorter than the "
                                        "4-byte magic 'GGUF'",
                                        g->name, size)
                      : comet_set_error(COMET_ERR_FORMAT,
                                        "%s: not a GGUF file: magic is %02x %02x %02x %02x, "
                                        "expected 'GGUF' (47 47 55 46)",
                                        g->name, p[0], p[1], p[2], p[3]);
        goto fail;
    }
    c.off = 4;
    if ((st = rd_u32(&c, &g->version, "header version")) < 0)
        goto fail;
    if (g->version != 3) {
        if (g->version == 1 || g->version == 2)
            st = comet_set_error(COMET_ERR_UNSUPPORTED,
                                 "%s: GGUF version %u is not supported; only version 3 is "
                                 "(re-convert the model with a current llama.cpp)",
                                 g->name, g->version);
        else if (g->version == 0x03000000u)
            st = comet_set_error(COMET_ERR_UNSUPPORTED,
                                 "%s: big-endian GGUF is not supported; use a little-endian "
                                 "version 3 file",
                                 g->name);
        else
            st = comet_set_error(COMET_ERR_UNSUPPORTED,
                                 "%s: GGUF version %u is not supported; only version 3 is", g->name,
                                 g->version);
        goto fail;
    }
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(&c, &n_tensors, "header tensor count")) < 0 ||
        (st = rd_u64(&c, &n_kv, "header metadata count")) < 0)
        goto fail;
    /* A kv takes >= 13 bytes (key length, type, 1-byte value); a tensor info >= 32. */
    if (n_kv > left(&c) / 13 || n_tensors > left(&c) / 32) {
        st = comet_set_error(COMET_ERR_FORMAT,
                             "%s: truncated or corrupt header: %" PRIu64 " metadata pairs and "
                             "%" PRIu64 " tensors cannot fit in %zu bytes",
                             g->name, n_kv, n_tensors, size);
        goto fail;
    }
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory for the header", g->name);
        goto fail;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        comet_gguf_kv *kv = &g->kv[i];
        char what[64];
        snprintf(what, sizeof what, "key of metadata pair #%" PRIu64, i);
        if ((st = rd_str(&c, &kv->key, what)) < 0)
            goto fail;
        show(kv->key, b, sizeof b);
        uint32_t t;
        snprintf(what, sizeof what, "type of metadata key '%.40s'", b);
        if ((st = rd_u32(&c, &t, what)) < 0)
            goto fail;
        kv->type = (comet_gguf_vtype)t;
        if ((st = rd_value(&c, kv->type, 0, kv, b)) < 0)
            goto fail;
        g->n_kv++;
    }
    g->alignment = COMET_GGUF_DEFAULT_ALIGNMENT;
    const comet_gguf_kv *al = comet_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != COMET_GGUF_U32 || al->num.u == 0 || (al->num.u & (al->num.u - 1))) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: metadata key 'general.alignment' must be a u32 power of "
                                 "two, got %s %" PRIu64,
                                 g->name, vtype_names[al->type], al->num.u);
            goto fail;
        }
        g->alignment = (uint32_t)al->num.u;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((st = rd_tensor_info(&c, &g->tensors[i], i)) < 0)
            goto fail;
        g->n_tensors++;
    }
    if ((st = check_duplicates(g)) < 0)
        goto fail;
    uint64_t data_off = ((uint64_t)c.off + g->alignment - 1) / g->alignment * g->alignment;
    g->data_offset = data_off;
    if (n_tensors > 0 && data_off > size) {
        st = comet_set_error(COMET_ERR_FORMAT,
                             "%s: truncated: tensor data should start at offset %" PRIu64
                             " but the file is %zu bytes",
                             g->name, data_off, size);
        goto fail;
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        comet_gguf_tensor *t = &g->tensors[i];
        uint64_t avail = size - data_off;
        if (t->offset % g->alignment) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tensor '%s': data offset %" PRIu64 " is not a multiple "
                                 "of the alignment %u",
                                 g->name, t->name, t->offset, g->alignment);
            goto fail;
        }
        if (t->offset > avail || t->n_bytes > avail - t->offset) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tensor '%s': data [%" PRIu64 ", +%" PRIu64 ") lies past "
                                 "the end of the file (%" PRIu64 " data bytes after offset %" PRIu64
                                 "; truncated file?)",
                                 g->name, t->name, t->offset, t->n_bytes, avail, data_off);
            goto fail;
        }
        t->data = g->buf + data_off + t->offset;
    }
    *out = g;
    return COMET_OK;
fail:
    comet_gguf_free(g);
    return st;
}

comet_status comet_gguf_open(const char *path, comet_gguf **out) {
    *out = NULL;
    comet_mmap m;
    COMET_TRY(comet_mmap_open(path, &m));
    comet_status st = comet_gguf_parse(m.data, m.size, path, out);
    if (st < 0) {
        comet_mmap_close(&m);
        return st;
    }
    (*out)->map = m;
    return COMET_OK;
}

void comet_gguf_free(comet_gguf *g) {
    if (!g)
        return;
    comet_mmap_close(&g->map);
    free(g->kv);
    free(g->tensors);
    free(g->name);
    free(g);
}

/* ---- metadata access -------------------------------------------------------------- */

const comet_gguf_kv *comet_gguf_find(const comet_gguf *g, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.len == n && memcmp(g->kv[i].key.s, key, n) == 0)
            return &g->kv[i];
    return NULL;
}

static comet_status find_req(const comet_gguf *g, const char *key, const comet_gguf_kv **kv) {
    *kv = comet_gguf_find(g, key);
    if (!*kv)
        return comet_set_error(COMET_ERR_FORMAT, "%s: metadata key '%s' missing", g->name, key);
    return COMET_OK;
}

static comet_status wrong_type(const comet_gguf *g, const char *key, comet_gguf_vtype got,
                               const char *want) {
    return comet_set_error(COMET_ERR_FORMAT, "%s: metadata key '%s' is %s, expected %s", g->name,
                           key, comet_gguf_vtype_name(got), want);
}

static int is_unsigned(comet_gguf_vtype t) {
    return t == COMET_GGUF_U8 || t == COMET_GGUF_U16 || t == COMET_GGUF_U32 || t == COMET_GGUF_U64;
}

static int is_signed(comet_gguf_vtype t) {
    return t == COMET_GGUF_I8 || t == COMET_GGUF_I16 || t == COMET_GGUF_I32 || t == COMET_GGUF_I64;
}

comet_status comet_gguf_get_i64(const comet_gguf *g, const char *key, int64_t *out) {
    const comet_gguf_kv *kv;
    COMET_TRY(find_req(g, key, &kv));
    if (is_signed(kv->type)) {
        *out = kv->num.i;
    } else if (is_unsigned(kv->type)) {
        if (kv->num.u > (uint64_t)INT64_MAX)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "%s: metadata key '%s' = %" PRIu64 " is out of range", g->name,
                                   key, kv->num.u);
        *out = (int64_t)kv->num.u;
    } else {
        return wrong_type(g, key, kv->type, "an integer");
    }
    return COMET_OK;
}

comet_status comet_gguf_get_u32(const comet_gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    COMET_TRY(comet_gguf_get_i64(g, key, &v));
    if (v < 0 || v > (int64_t)UINT32_MAX)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: metadata key '%s' = %" PRId64 " is out of range for u32",
                               g->name, key, v);
    *out = (uint32_t)v;
    return COMET_OK;
}

comet_status comet_gguf_get_f32(const comet_gguf *g, const char *key, float *out) {
    const comet_gguf_kv *kv;
    COMET_TRY(find_req(g, key, &kv));
    if (kv->type != COMET_GGUF_F32 && kv->type != COMET_GGUF_F64)
        return wrong_type(g, key, kv->type, "f32");
    *out = (float)kv->num.f;
    return COMET_OK;
}

comet_status comet_gguf_get_bool(const comet_gguf *g, const char *key, int *out) {
    const comet_gguf_kv *kv;
    COMET_TRY(find_req(g, key, &kv));
    if (kv->type != COMET_GGUF_BOOL)
        return wrong_type(g, key, kv->type, "bool");
    *out = (int)kv->num.u;
    return COMET_OK;
}

comet_status comet_gguf_get_str(const comet_gguf *g, const char *key, comet_gguf_str *out) {
    const comet_gguf_kv *kv;
    COMET_TRY(find_req(g, key, &kv));
    if (kv->type != COMET_GGUF_STRING)
        return wrong_type(g, key, kv->type, "string");
    *out = kv->str;
    return COMET_OK;
}

comet_status comet_gguf_get_arr(const comet_gguf *g, const char *key, comet_gguf_vtype elem,
                                const comet_gguf_kv **out) {
    const comet_gguf_kv *kv;
    COMET_TRY(find_req(g, key, &kv));
    if (kv->type != COMET_GGUF_ARRAY)
        return wrong_type(g, key, kv->type, "array");
    if (elem != COMET_GGUF_VTYPE_COUNT && kv->arr_type != elem)
        return comet_set_error(COMET_ERR_FORMAT,
                               "%s: metadata key '%s' is an array of %s, "
                               "expected an array of %s",
                               g->name, key, comet_gguf_vtype_name(kv->arr_type),
                               comet_gguf_vtype_name(elem));
    *out = kv;
    return COMET_OK;
}

char *comet_gguf_strdup(comet_gguf_str s) {
    char *r = malloc((size_t)s.len + 1);
    if (!r)
        return NULL;
    if (s.len)
        memcpy(r, s.s, (size_t)s.len);
    r[s.len] = '\0';
    return r;
}

comet_status comet_gguf_arr_strings(const comet_gguf_kv *kv, char ***out) {
    char b[80];
    *out = NULL;
    if (kv->type != COMET_GGUF_ARRAY || kv->arr_type != COMET_GGUF_STRING)
        return comet_set_error(COMET_ERR_FORMAT, "metadata key '%s' is not a string array",
                               show(kv->key, b, sizeof b));
    /* Pointers, then the strings: arr_bytes includes an 8-byte length per string, more
     * than the NUL each copy needs. */
    size_t n = (size_t)kv->arr_n;
    char **v = malloc(n * sizeof(char *) + kv->arr_bytes + 1);
    if (!v)
        return comet_set_error(COMET_ERR_NOMEM, "metadata key '%s': out of memory for %zu strings",
                               show(kv->key, b, sizeof b), n);
    char *dst = (char *)(v + n);
    const uint8_t *p = kv->arr_data;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = ld64(p); /* bounds were checked by the parser */
        p += 8;
        memcpy(dst, p, (size_t)len);
        dst[len] = '\0';
        v[i] = dst;
        dst += len + 1;
        p += len;
    }
    *out = v;
    return COMET_OK;
}

/* Element i of a fixed-size numeric array as int64 (integers) or double (floats). */
static int64_t elem_i(const comet_gguf_kv *kv, size_t i, int *ok) {
    const uint8_t *p = kv->arr_data + i * vtype_size[kv->arr_type];
    *ok = 1;
    switch (kv->arr_type) {
    case COMET_GGUF_U8:
    case COMET_GGUF_BOOL: return p[0];
    case COMET_GGUF_I8: return (int8_t)p[0];
    case COMET_GGUF_U16: return ld16(p);
    case COMET_GGUF_I16: return (int16_t)ld16(p);
    case COMET_GGUF_U32: return ld32(p);
    case COMET_GGUF_I32: return (int32_t)ld32(p);
    case COMET_GGUF_I64: return (int64_t)ld64(p);
    case COMET_GGUF_U64: {
        uint64_t v = ld64(p);
        if (v > (uint64_t)INT64_MAX)
            *ok = 0;
        return (int64_t)(v & (uint64_t)INT64_MAX);
    }
    default: *ok = 0; return 0;
    }
}

comet_status comet_gguf_arr_i32(const comet_gguf_kv *kv, int32_t *out) {
    char b[80];
    if (kv->type != COMET_GGUF_ARRAY || !(is_signed(kv->arr_type) || is_unsigned(kv->arr_type)))
        return comet_set_error(COMET_ERR_FORMAT, "metadata key '%s' is not an integer array",
                               show(kv->key, b, sizeof b));
    for (size_t i = 0; i < kv->arr_n; i++) {
        int ok;
        int64_t v = elem_i(kv, i, &ok);
        if (!ok || v < INT32_MIN || v > INT32_MAX)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "metadata key '%s'[%zu] is out of range "
                                   "for i32",
                                   show(kv->key, b, sizeof b), i);
        out[i] = (int32_t)v;
    }
    return COMET_OK;
}

comet_status comet_gguf_arr_f32(const comet_gguf_kv *kv, float *out) {
    char b[80];
    if (kv->type != COMET_GGUF_ARRAY ||
        (kv->arr_type != COMET_GGUF_F32 && kv->arr_type != COMET_GGUF_F64))
        return comet_set_error(COMET_ERR_FORMAT, "metadata key '%s' is not a float array",
                               show(kv->key, b, sizeof b));
    for (size_t i = 0; i < kv->arr_n; i++) {
        if (kv->arr_type == COMET_GGUF_F32) {
            uint32_t u = ld32(kv->arr_data + 4 * i);
            memcpy(&out[i], &u, 4);
        } else {
            uint64_t u = ld64(kv->arr_data + 8 * i);
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
        }
    }
    return COMET_OK;
}

const comet_gguf_tensor *comet_gguf_find_tensor(const comet_gguf *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

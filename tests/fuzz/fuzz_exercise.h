/* fuzz_exercise.h — what the fuzz targets do with one input, shared with the regression
 * test (tests/test_fuzz_regress.c) that replays saved inputs in the normal build.
 *
 * Each function parses the bytes and, when they parse, touches everything a loader
 * would: typed getters on every key, array conversion, tensor lookup and dequantization
 * of small tensors. Returns the parse status. Header-only (static functions).
 */
#ifndef COMET_FUZZ_EXERCISE_H
#define COMET_FUZZ_EXERCISE_H

#include <stdint.h>
#include <stdlib.h>

#include "format/gguf.h"
#include "format/safetensors.h"

static inline comet_status fuzz_exercise_gguf(const uint8_t *data, size_t size) {
    comet_gguf *g = NULL;
    comet_status st = comet_gguf_parse(data, size, "fuzz.gguf", &g);
    if (st < 0)
        return st;
    for (size_t i = 0; i < g->n_kv; i++) {
        const comet_gguf_kv *kv = &g->kv[i];
        char *key = comet_gguf_strdup(kv->key);
        if (!key)
            break;
        uint32_t u;
        int64_t i64;
        float f;
        int b;
        comet_gguf_str s;
        const comet_gguf_kv *arr;
        comet_gguf_get_u32(g, key, &u);
        comet_gguf_get_i64(g, key, &i64);
        comet_gguf_get_f32(g, key, &f);
        comet_gguf_get_bool(g, key, &b);
        comet_gguf_get_str(g, key, &s);
        if (comet_gguf_get_arr(g, key, COMET_GGUF_VTYPE_COUNT, &arr) == COMET_OK &&
            arr->arr_n <= (1u << 16)) {
            char **strs;
            if (comet_gguf_arr_strings(arr, &strs) == COMET_OK)
                free(strs);
            int32_t *iv = malloc((arr->arr_n + 1) * sizeof *iv);
            float *fv = malloc((arr->arr_n + 1) * sizeof *fv);
            if (iv && fv) {
                comet_gguf_arr_i32(arr, iv);
                comet_gguf_arr_f32(arr, fv);
            }
            free(iv);
            free(fv);
        }
        free(key);
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        const comet_gguf_tensor *t = &g->tensors[i];
        if (comet_gguf_find_tensor(g, t->name) == NULL)
            abort(); /* names are unique and NUL-free, so every tensor is findable */
        if (t->n_elements > (1 << 16))
            continue;
        float *dst = malloc((size_t)(t->n_elements + 1) * sizeof *dst);
        if (dst)
            comet_gguf_dequant(g, t, dst);
        free(dst);
    }
    comet_gguf_free(g);
    return COMET_OK;
}

static inline comet_status fuzz_exercise_safetensors(const uint8_t *data, size_t size) {
    comet_safetensors *st = NULL;
    comet_status rc = comet_st_parse(data, size, "fuzz.safetensors", &st);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const comet_st_tensor *t = &st->tensors[i];
        if (comet_st_find(st, t->name) != t)
            abort(); /* names are unique, so lookup gives back this entry */
        if (t->n_elements > (1 << 16))
            continue;
        float *dst = malloc((size_t)(t->n_elements + 1) * sizeof *dst);
        if (dst)
            comet_st_to_f32(st, t, dst);
        free(dst);
    }
    comet_st_free(st);
    return COMET_OK;
}

#endif

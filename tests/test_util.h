/* test_util.h — helpers shared by the format tests: paths, temp files, a tiny GGUF writer.
 *
 * The GGUF writer builds files byte by byte from the spec (ggml/docs/gguf.md), so bad-input
 * tests can produce exactly the corruption they test without large fixtures. Header-only
 * (static functions); include from one test file each.
 */
#ifndef COMET_TEST_UTIL_H
#define COMET_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* $COMET_SOURCE_DIR/<rel> (CTest sets the variable; fall back to the build's parent). */
static inline const char *src_path(const char *rel) {
    static char buf[8][4096];
    static int k;
    const char *root = getenv("COMET_SOURCE_DIR");
    char *b = buf[k++ % 8];
    snprintf(b, 4096, "%s/%s", root ? root : "..", rel);
    return b;
}

static inline const char *default_model_path(void) {
    return src_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

static char tmp_dir_path[256];

/* rm -r `path` (no symlinks are followed: lstat). */
static inline void rm_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *sub = malloc(n);
            if (!sub)
                break;
            snprintf(sub, n, "%s/%s", path, e->d_name);
            rm_tree(sub);
            free(sub);
        }
        if (d)
            closedir(d);
    }
    remove(path);
}

static inline void tmp_dir_remove(void) {
    if (tmp_dir_path[0])
        rm_tree(tmp_dir_path);
}

/* A fresh temp directory for this process, removed with its contents at exit. */
static inline const char *tmp_dir(void) {
    if (!tmp_dir_path[0]) {
        snprintf(tmp_dir_path, sizeof tmp_dir_path, "/tmp/comet_test_XXXXXX");
        if (!mkdtemp(tmp_dir_path))
            abort();
        atexit(tmp_dir_remove);
    }
    return tmp_dir_path;
}

static inline const char *tmp_file(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, 512, "%s/%s", tmp_dir(), name);
    return b;
}

static inline void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n))
        abort();
    fclose(f);
}

static inline void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)sz + 1);
    if (!p || fread(p, 1, (size_t)sz, f) != (size_t)sz)
        abort();
    fclose(f);
    ((char *)p)[sz] = '\0';
    *n = (size_t)sz;
    return p;
}

/* ---- GGUF writer ------------------------------------------------------------------ */

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static inline void gb_put(gbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); } /* little-endian host */
static inline void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static inline void gb_str(gbuf *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static inline void gb_header(gbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
static inline void kv_str(gbuf *b, const char *k, const char *v) {
    gb_str(b, k);
    gb_u32(b, 8);
    gb_str(b, v);
}
static inline void kv_u32(gbuf *b, const char *k, uint32_t v) {
    gb_str(b, k);
    gb_u32(b, 4);
    gb_u32(b, v);
}
static inline void kv_f32(gbuf *b, const char *k, float v) {
    gb_str(b, k);
    gb_u32(b, 6);
    gb_put(b, &v, 4);
}
static inline void kv_arr_str(gbuf *b, const char *k, int n, const char *const *v) {
    gb_str(b, k);
    gb_u32(b, 9);
    gb_u32(b, 8);
    gb_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++)
        gb_str(b, v[i]);
}
/* Tensor info: 1 or 2 dims (ne1 == 0 -> 1-D). */
static inline void ti(gbuf *b, const char *name, uint64_t ne0, uint64_t ne1, uint32_t type,
                      uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, ne1 ? 2 : 1);
    gb_u64(b, ne0);
    if (ne1)
        gb_u64(b, ne1);
    gb_u32(b, type);
    gb_u64(b, offset);
}
static inline void gb_align(gbuf *b, size_t a) {
    static const uint8_t z[64];
    while (b->n % a)
        gb_put(b, z, 1);
}

#endif

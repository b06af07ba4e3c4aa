/* fuzz_gguf_model.c — libFuzzer target for the whole GGUF model loader: the input is a
 * GGUF file given to comet_model_load (through a memfd, so no disk I/O), which runs the
 * reader, the llama.* config mapping, the tokenizer built from tokenizer.ggml.*, and the
 * weight walk with its shape checks, Q/K unpermutation and dequantization. Seeds: small
 * complete models (tests/fuzz/corpus/gguf_model/). Any crash, sanitizer report, leak or
 * allocation beyond -malloc_limit_mb is a bug.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comet/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("fuzz.gguf", 0)) < 0)
        abort();
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    comet_model *m = NULL;
    if (comet_model_load(path, &m) == COMET_OK) {
        if (!m || !m->tok || !m->tok_embd || !m->layers)
            abort(); /* success must give a complete model */
        comet_model_free(m);
    } else if (m) {
        abort(); /* failure must not hand out a model */
    }
    return 0;
}

/* fuzz_gguf.c — libFuzzer target for the GGUF reader (format/gguf.c, gguf_dequant.c).
 * The work per input is fuzz_exercise_gguf; any crash, sanitizer report or leak is a bug.
 */
#include "fuzz_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_exercise_gguf(data, size);
    return 0;
}

/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser
 * (format/safetensors.c). The work per input is fuzz_exercise_safetensors.
 */
#include "fuzz_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_exercise_safetensors(data, size);
    return 0;
}

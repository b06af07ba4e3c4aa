/* env_switch.h — the CUDA backend's A/B switches in the environment (COMET_CUDA_GRAPHS,
 * COMET_CUDA_NORM_SMEM, ...): each is on unless set to "0". Callable from C and CUDA. */
#pragma once

#include <stdlib.h>
#include <string.h>

/* 1 when the environment variable `name` is set to "0" (its switch is off), else 0. */
static inline int comet_cuda_env_off(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

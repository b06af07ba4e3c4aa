/* clock.c — comet_now_s (clock.h). */
#define _POSIX_C_SOURCE 200809L
#include "core/clock.h"

#include <time.h>

double comet_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

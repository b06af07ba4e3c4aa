/* backend.c — backend-independent helpers of the op table: releasing a backend, its batch
 * invariance and thread count (comet/backend.h). */
#include "backend/backend.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void comet_backend_free(comet_backend *be) {
    if (be)
        be->ops->destroy(be);
}

void comet_backend_set_batch_invariant(comet_backend *be, int on) {
    if (be)
        be->batch_invariant = on ? 1 : 0;
}

void comet_backend_set_simulate(comet_backend *be, int on) {
    if (be)
        be->simulate = on ? 1 : 0;
}

int comet_backend_n_threads(const comet_backend *be) { return be->n_threads; }

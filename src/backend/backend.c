/* backend.c — backend-independent helpers of the op table. */
#include "backend/backend.h"

void comet_backend_free(comet_backend *be) {
    if (be)
        be->ops->destroy(be);
}

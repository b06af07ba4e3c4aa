/* backend_open.c — a backend chosen by device name (the CLI's and the engine's --device). Kept
 * apart from backend.c, which the GPU-only GEMM build links without the CPU backends. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/threads.h"

int comet_backend_rank_threads(int n_threads, int tensor_parallel) {
    if (tensor_parallel <= 0)
        return n_threads;
    int all = n_threads > 0 ? n_threads : comet_n_cores();
    return all / tensor_parallel > 0 ? all / tensor_parallel : 1;
}

comet_backend *comet_backend_open(const char *device, int n_threads) {
    if (!device || !strcmp(device, "cpu"))
        return comet_backend_cpu_init(n_threads);
    if (!strcmp(device, "cpu-ref"))
        return comet_backend_cpu_ref_init();
    if (!strncmp(device, "cuda", 4)) {
        int index = 0;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || v < 0 || v > 1024) {
                comet_set_error(COMET_ERR_INVALID_ARG,
                                "device '%s': expected cuda or cuda:N with N a GPU number", device);
                return NULL;
            }
            index = (int)v;
        } else if (device[4]) {
            goto bad;
        }
        return comet_backend_cuda_init(index);
    }
bad:
    comet_set_error(COMET_ERR_INVALID_ARG, "device '%s': expected cpu, cuda or cuda:N", device);
    return NULL;
}

/* mmap.h — read-only file mapping (internal).
 *
 * Model files are mapped rather than read so that a multi-GB checkpoint costs no copy
 * and pages are faulted in as tensors are converted. The mapping is private and
 * read-only; an empty file maps to data == NULL, size == 0.
 */
#ifndef COMET_CORE_MMAP_H
#define COMET_CORE_MMAP_H

#include <stddef.h>

#include "comet/status.h"

typedef struct comet_mmap {
    const unsigned char *data; /* [size] bytes of the file, or NULL when size == 0 */
    size_t size;               /* file size in bytes */
    char *path;                /* owned copy of the path, for messages */
} comet_mmap;

/* Map `path` read-only into *m. Returns COMET_OK, COMET_ERR_IO (cannot open/stat/map,
 * or the path is a directory; the message names the path and errno text) or
 * COMET_ERR_NOMEM. On failure *m is left zeroed. */
comet_status comet_mmap_open(const char *path, comet_mmap *m);

/* Unmap and zero *m. A zeroed struct (or NULL) is a no-op. */
void comet_mmap_close(comet_mmap *m);

#endif

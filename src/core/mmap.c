/* mmap.c — read-only file mapping with POSIX mmap. */
#include "core/mmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

comet_status comet_mmap_open(const char *path, comet_mmap *m) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return comet_set_error(COMET_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return comet_set_error(COMET_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return comet_set_error(COMET_ERR_IO, "%s: not a regular file", path);
    }
    void *p = NULL;
    size_t size = (size_t)st.st_size;
    if (size > 0) {
        p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return comet_set_error(COMET_ERR_IO, "%s: cannot map %zu bytes: %s", path, size,
                                   strerror(e));
        }
    }
    close(fd);
    char *copy = strdup(path);
    if (!copy) {
        if (p)
            munmap(p, size);
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
    }
    m->data = p;
    m->size = size;
    m->path = copy;
    return COMET_OK;
}

void comet_mmap_close(comet_mmap *m) {
    if (!m)
        return;
    if (m->data)
        munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

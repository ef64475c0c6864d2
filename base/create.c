/* A shared file made whole under a temporary name, then linked into place.
 *
 * Its blocks are reserved before it is mapped.  A file only ftruncate'd is
 * sparse: on a full filesystem the first store to one of its pages raises
 * SIGBUS, which kills whoever writes (the supervisor, or the application the
 * shim runs in), and leaves the half-made temporary file behind.  Reserved,
 * every page the mapping can touch is backed, and a full filesystem is an
 * error returned here, with nothing left. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"

int vgl_create_linked(const char *path, mode_t mode, size_t size, int (*init)(void *map, void *arg),
                      void *arg, int *fd_out)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int err = 0;
    void *map = MAP_FAILED;
    /* fchmod, not the umask's leftovers: a group-shared file must be group-writable. */
    if (fchmod(fd, mode) < 0)
        err = -errno;
    if (!err)
        err = -posix_fallocate(fd, 0, (off_t)size); /* returns the error, sets no errno */
    if (!err) {
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            err = -errno;
    }
    if (!err)
        err = init(map, arg);
    if (map != MAP_FAILED)
        munmap(map, size);
    if (!err && link(tmp, path) < 0)
        err = -errno;
    unlink(tmp);
    if (!err && fd_out)
        *fd_out = fd;
    else
        close(fd);
    return err;
}

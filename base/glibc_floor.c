/* stat, fstat and memfd_create for the glibc floor (glibc_floor.h): the
 * system calls that newer glibcs make for them.  On x86_64 and aarch64 the kernel's struct
 * stat is glibc's, so the result needs no conversion. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "glibc_floor.h"

int vgl_floor_stat(const char *path, struct stat *buf)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, buf, 0);
}

int vgl_floor_fstat(int fd, struct stat *buf)
{
    return (int)syscall(SYS_fstat, fd, buf);
}

int vgl_floor_memfd_create(const char *name, unsigned int flags)
{
    return (int)syscall(SYS_memfd_create, name, flags);
}

/* stat and fstat for the glibc floor (glibc_floor.h): the system calls that
 * glibc >= 2.33 makes for them.  On x86_64 and aarch64 the kernel's struct
 * stat is glibc's, so the result needs no conversion. */
#include <fcntl.h>
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

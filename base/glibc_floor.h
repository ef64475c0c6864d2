/* The oldest C library the shim loads with: glibc 2.17 (where aarch64's
 * glibc starts, and the manylinux2014 floor).  The hook copies one build of
 * the shim into every container, and the loader stops every process of an
 * image whose glibc lacks a version the shim names, so the shim must not
 * name the versions of the glibc it happens to be built on.  The simulated
 * driver ships in the same wheel and is held to the same floor, so that the
 * wheel is one manylinux2014 wheel rather than one for glibc 2.34 on.
 *
 * The build includes this file before every source of the shim, its core,
 * the simulated driver and the base they link (-include).  Each function used that a newer glibc gave
 * a new version is pinned to the version it first had; the link still
 * resolves against the build machine's libc, which keeps those versions for old binaries.  On
 * glibc < 2.34 the dl* functions live in libdl.so.2 and the pthread ones in
 * libpthread.so.0: the shim lists both as needed (shim/meson.build; simgpu
 * uses no dl* function and lists the second), and the
 * loader finds a versioned symbol by version, in whichever library has it.
 * tests/test_platforms.py reads the version needs of every library the wheel
 * ships: a function used anew that needs pinning fails it. */
#ifndef VGPULIMIT_GLIBC_FLOOR_H
#define VGPULIMIT_GLIBC_FLOOR_H
#ifndef __ASSEMBLER__

#include <sys/mman.h>
#include <sys/stat.h>

#if defined(__x86_64__)
#define VGL_GLIBC_FIRST "GLIBC_2.2.5"
#define VGL_GLIBC_ROBUST "GLIBC_2.12"   /* robust mutexes came in 2.12 */
#elif defined(__aarch64__)
#define VGL_GLIBC_FIRST "GLIBC_2.17"    /* every aarch64 symbol is 2.17 or later */
#define VGL_GLIBC_ROBUST "GLIBC_2.17"
#else
#error "the shim's glibc floor is written for x86_64 and aarch64 only"
#endif

#define VGL_GLIBC_PIN(name, version) __asm__(".symver " #name "," #name "@" version)

/* In libdl before 2.34. */
VGL_GLIBC_PIN(dlopen, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(dlerror, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(dlvsym, VGL_GLIBC_FIRST);
/* In libpthread before 2.34. */
VGL_GLIBC_PIN(pthread_once, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(pthread_mutexattr_init, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(pthread_mutexattr_destroy, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(pthread_mutexattr_setpshared, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(pthread_mutexattr_setrobust, VGL_GLIBC_ROBUST);
VGL_GLIBC_PIN(pthread_mutex_consistent, VGL_GLIBC_ROBUST);
VGL_GLIBC_PIN(pthread_mutex_timedlock, VGL_GLIBC_FIRST);
/* simgpu's checkpoint thread: moved into libc in 2.34 and 2.32. */
VGL_GLIBC_PIN(pthread_create, VGL_GLIBC_FIRST);
VGL_GLIBC_PIN(pthread_sigmask, VGL_GLIBC_FIRST);

/* With 64-bit file offsets (meson's default), glibc 2.28's headers name
 * fcntl fcntl64, a version new in 2.28; on a 64-bit target it is fcntl. */
__asm__(".symver fcntl64,fcntl@" VGL_GLIBC_FIRST);

/* stat and fstat became functions of libc only in 2.33 (before, the headers
 * turned them into calls of __xstat64 and friends, since removed from the
 * headers): the shim's calls go to glibc_floor.c instead.  Function-like
 * macros, so that `struct stat` stays itself. */
int vgl_floor_stat(const char *path, struct stat *buf);
int vgl_floor_fstat(int fd, struct stat *buf);
#define stat(path, buf) vgl_floor_stat(path, buf)
#define fstat(fd, buf) vgl_floor_fstat(fd, buf)

/* memfd_create came to glibc in 2.27, years after its system call (Linux
 * 3.17): the simulated driver's VMM calls the system call. */
int vgl_floor_memfd_create(const char *name, unsigned int flags);
#define memfd_create(name, flags) vgl_floor_memfd_create(name, flags)

#endif
#endif

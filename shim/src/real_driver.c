/* Finds the C library's dlsym, and the real libcuda / libnvidia-ml, once.
 *
 * The libraries are looked up by soname, as every client does, so that we
 * resolve the very object the application uses: with vgpulimit's simulated
 * GPU first on LD_LIBRARY_PATH that is simgpu, otherwise the NVIDIA driver. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "internal.h"

void *(*vgl_real_dlsym)(void *handle, const char *name);

static void *no_dlsym(void *handle, const char *name)
{
    (void)handle;
    (void)name;
    return NULL;
}

VGL_NO_SANITIZE void vgl_resolve_real_dlsym(void)
{
    /* dlvsym is not ours, so RTLD_NEXT from here is the C library.  2.34
     * moved dlsym into libc; older glibc has only the original version. */
    static const char *const VERSIONS[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    void *real = NULL;
    for (size_t i = 0; i < sizeof VERSIONS / sizeof VERSIONS[0] && !real; i++)
        real = dlvsym(RTLD_NEXT, "dlsym", VERSIONS[i]);
    if (!real) {
        vgl_log(VGL_LOG_ERROR, "cannot find the C library's dlsym; dynamic look-ups will fail");
        real = (void *)no_dlsym;
    }
    __atomic_store_n((void **)&vgl_real_dlsym, real, __ATOMIC_RELEASE);
}

struct library {
    const char *soname;
    /* How loud its absence is: a CUDA call with no libcuda is an error; the
     * shim's own use of NVML (the driver's cost per process) is optional. */
    enum vgl_log_level missing;
    pthread_once_t once;
    void *handle;
    char error[256]; /* why it could not be loaded (dlerror) */
};

static struct library cuda = {"libcuda.so.1", VGL_LOG_ERROR, PTHREAD_ONCE_INIT, NULL, ""};
static struct library nvml = {"libnvidia-ml.so.1", VGL_LOG_INFO, PTHREAD_ONCE_INIT, NULL, ""};

static void open_library(struct library *lib)
{
    if (!vgl_real_dlsym)
        vgl_resolve_real_dlsym();
    /* RTLD_NOLOAD first: the application has almost always loaded it already. */
    void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!handle)
        handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        snprintf(lib->error, sizeof lib->error, "%s", why ? why : "not found");
        VGL_LOG((int)lib->missing, "cannot load %s: %s", lib->soname, lib->error);
    }
    /* Never closed: the real pointers point into it. */
    lib->handle = handle;
}

static void open_cuda(void) { open_library(&cuda); }
static void open_nvml(void) { open_library(&nvml); }

void *vgl_real_cuda_library(void)
{
    pthread_once(&cuda.once, open_cuda);
    return cuda.handle;
}

void *vgl_real_nvml_library(void)
{
    pthread_once(&nvml.once, open_nvml);
    return nvml.handle;
}

const char *vgl_real_nvml_error(void)
{
    pthread_once(&nvml.once, open_nvml);
    return nvml.error;
}

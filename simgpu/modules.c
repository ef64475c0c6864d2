/* simgpu's modules, libraries and kernels.
 *
 * Any image is accepted (cubin, PTX, fatbin alike): simgpu runs no code.  A
 * kernel is known by its name, and its name is how long it runs:
 *
 *   "<anything>_us<N>" or "<anything>_us_<N>"   N microseconds (e.g. "spin_us250",
 *                                              "sleep_us_20000")
 *   any other name                             SIMGPU_KERNEL_US (default 10)
 *
 * so a test or benchmark writes its workload as kernel names, and kernels from
 * real compilers (numba-cuda, NVRTC) run for the default.  A library
 * (cuLibraryLoadData) is a module of no context; its kernels are its module's
 * functions, so a CUkernel may be launched as the CUfunction it also is, as
 * the driver allows. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

enum {
    SIM_MODULE_MAGIC = 0x444f4d53,  /* "SMOD" */
    SIM_FUNC_MAGIC = 0x4e554653,    /* "SFUN" */
    SIM_LIBRARY_MAGIC = 0x42494c53, /* "SLIB" */
    SIM_NAME_DIGITS_MAX = 9,        /* a duration below 1000 s */
};

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;                  /* NULL: a library's, of every context */
    CUlibrary library;              /* the library that owns it, or NULL */
    struct CUfunc_st *functions;    /* guarded by sim_modules_mutex */
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule module;
    struct CUfunc_st *next;
    uint64_t duration_ns;
    char name[];
};

struct CUlib_st {
    uint32_t magic;
    CUmodule module;
};

static pthread_mutex_t sim_modules_mutex = PTHREAD_MUTEX_INITIALIZER;

static bool sim_name_is(const char *name, size_t end, const char *suffix)
{
    size_t len = strlen(suffix);
    return end >= len && memcmp(name + end - len, suffix, len) == 0;
}

static uint64_t sim_duration_of(const char *name)
{
    size_t len = strlen(name), digits = len;
    while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9')
        digits--;
    if (digits == len || len - digits > SIM_NAME_DIGITS_MAX ||
        !(sim_name_is(name, digits, "_us") || sim_name_is(name, digits, "_us_")))
        return sim_config()->kernel_ns;
    return strtoull(name + digits, NULL, 10) * 1000;
}

static CUresult sim_module_new(CUcontext ctx, CUmodule *module)
{
    CUmodule m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SIM_MODULE_MAGIC;
    m->ctx = ctx;
    *module = m;
    return CUDA_SUCCESS;
}

static CUresult sim_module_in_context(CUmodule *module)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    return res == CUDA_SUCCESS ? sim_module_new(ctx, module) : res;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_in_context(module);
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return sim_module_in_context(module);
}

static bool sim_module_valid(CUmodule m)
{
    return m && m->magic == SIM_MODULE_MAGIC;
}

static void sim_module_free(CUmodule m)
{
    pthread_mutex_lock(&sim_modules_mutex);
    struct CUfunc_st *f = m->functions;
    while (f) {
        struct CUfunc_st *next = f->next;
        f->magic = 0;
        free(f);
        f = next;
    }
    m->magic = 0;
    pthread_mutex_unlock(&sim_modules_mutex);
    free(m);
}

CUresult cuModuleUnload(CUmodule hmod)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_module_valid(hmod) || hmod->library)
        return CUDA_ERROR_INVALID_HANDLE; /* a library's module goes with the library */
    sim_module_free(hmod);
    return CUDA_SUCCESS;
}

/* One handle per name and module, as the driver returns the same handle for
 * the same kernel. */
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_module_valid(hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult res = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_modules_mutex);
    struct CUfunc_st *f = hmod->functions;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f) {
        size_t len = strlen(name);
        f = malloc(sizeof *f + len + 1);
        if (f) {
            f->magic = SIM_FUNC_MAGIC;
            f->module = hmod;
            f->duration_ns = sim_duration_of(name);
            memcpy(f->name, name, len + 1);
            f->next = hmod->functions;
            hmod->functions = f;
        } else {
            res = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sim_modules_mutex);
    if (f)
        *hfunc = f;
    return res;
}

CUresult sim_kernel_duration(CUfunction f, uint64_t *duration_ns)
{
    if (!f || f->magic != SIM_FUNC_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    *duration_ns = f->duration_ns;
    return CUDA_SUCCESS;
}

static bool sim_library_valid(CUlibrary l)
{
    return l && l->magic == SIM_LIBRARY_MAGIC;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                           void **libraryOptionValues, unsigned int numLibraryOptions)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!library || !code || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    CUlibrary l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult res = sim_module_new(NULL, &l->module);
    if (res != CUDA_SUCCESS) {
        free(l);
        return res;
    }
    l->module->library = l;
    l->magic = SIM_LIBRARY_MAGIC;
    *library = l;
    return CUDA_SUCCESS;
}

CUresult cuLibraryUnload(CUlibrary library)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_library_valid(library))
        return CUDA_ERROR_INVALID_HANDLE;
    sim_module_free(library->module);
    library->magic = 0;
    free(library);
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_library_valid(library))
        return CUDA_ERROR_INVALID_HANDLE;
    *pMod = library->module;
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_library_valid(library))
        return CUDA_ERROR_INVALID_HANDLE;
    CUfunction f;
    CUresult res = cuModuleGetFunction(&f, library->module, name);
    if (res == CUDA_SUCCESS)
        *pKernel = (CUkernel)(void *)f;
    return res;
}

/* The kernel's function in the current context: the kernel itself. */
CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = (CUfunction)(void *)kernel;
    uint64_t ns;
    res = sim_kernel_duration(f, &ns);
    if (res == CUDA_SUCCESS)
        *pFunc = f;
    return res;
}

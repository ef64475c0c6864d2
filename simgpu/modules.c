/* simgpu's modules, libraries and kernels, and the device memory the driver
 * takes for them after a context is made.
 *
 * Any image is accepted (cubin, PTX, fatbin alike): simgpu runs no code.  A
 * kernel is known by its name, and its name says how long it runs and how much
 * local memory each of its threads needs, in '_'-separated words at its end,
 * in any order:
 *
 *   "_us<N>" or "_us_<N>"   it runs N microseconds (e.g. "spin_us250",
 *                           "sleep_us_20000"); else SIMGPU_KERNEL_US (default 10)
 *   "_local<N>"             each thread needs N bytes of local memory (e.g.
 *                           "fill_local256_us100"); else none
 *
 * so a test or benchmark writes its workload as kernel names, and kernels from
 * real compilers (numba-cuda, NVRTC) run for the default and need no local
 * memory.  A module's code is 64 KiB unless its image (or the file
 * cuModuleLoad reads) begins with "//simgpu code=<size>" (a PTX comment; the
 * size as SIMGPU_MEMORY reads it, e.g. "//simgpu code=40MiB"); a bad size is
 * CUDA_ERROR_INVALID_IMAGE.  A library (cuLibraryLoadData) is a module of no
 * context; its kernels are its module's functions, so a CUkernel may be
 * launched as the CUfunction it also is, as the driver allows.
 *
 * The memory model, after the H200, where PyTorch's process grew 92 MiB beyond
 * its context and allocations (docs/facts.md §1): the driver takes device
 * memory of its own, charged to the process as NVML lists it, in whole 2 MiB
 * granules:
 *
 *   code   a module's code is loaded into a context when the module loads
 *          (CUDA_MODULE_LOADING=EAGER; a library into the context current
 *          then, if any) or when a kernel of it first runs there (LAZY, the
 *          driver's default since CUDA 12.2, and any other value); a context's
 *          code is one pool, charged rounded up to the granule, and a module's
 *          share goes back when it is unloaded
 *   local  a context's local-memory pool grows, at a launch, to what the kernel
 *          needs: its bytes per thread times the threads the device holds at
 *          once (SMs times threads per SM), rounded up to the granule; it is
 *          kept until the context is destroyed
 *
 * Both go back when the context is destroyed or reset, or the process exits.
 * A launch that needs more than the device has free fails with
 * CUDA_ERROR_OUT_OF_MEMORY, as the driver's does.  A launch into a stream
 * being captured counts as a run here; a kernel node of a graph made by hand
 * loads nothing. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

#include "driver.h"

enum {
    SIM_MODULE_MAGIC = 0x444f4d53,  /* "SMOD" */
    SIM_FUNC_MAGIC = 0x4e554653,    /* "SFUN" */
    SIM_LIBRARY_MAGIC = 0x42494c53, /* "SLIB" */
    SIM_NAME_DIGITS_MAX = 9,        /* a duration below 1000 s */
};

/* A context a module is loaded into, as it was when it was: a context reset
 * and made again has none. */
struct sim_loaded {
    CUcontext ctx;
    unsigned int activation;
};

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;                  /* NULL: a library's, of every context */
    CUlibrary library;              /* the library that owns it, or NULL */
    uint64_t code_bytes;            /* its code, once loaded into a context */
    /* Guarded by sim_modules_mutex: */
    struct CUfunc_st *functions;
    struct sim_loaded *loaded;      /* the contexts its code is loaded into */
    size_t n_loaded, cap_loaded;
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule module;
    struct CUfunc_st *next;
    uint64_t duration_ns;
    uint64_t local_bytes;           /* per thread */
    /* The context in which it last found all it needs (read without the
     * mutex, so atomic): the launch's fast path. */
    CUcontext ready_ctx;
    unsigned int ready_activation;
    char name[];
};

struct CUlib_st {
    uint32_t magic;
    CUmodule module;
};

static pthread_mutex_t sim_modules_mutex = PTHREAD_MUTEX_INITIALIZER;

enum {
    SIM_MODULE_CODE_DEFAULT = 64 << 10, /* a small module's code */
};

/* A word of digits, at most SIM_NAME_DIGITS_MAX of them: its value. */
static bool sim_name_number(const char *word, size_t len, uint64_t *out)
{
    if (len == 0 || len > SIM_NAME_DIGITS_MAX)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (word[i] < '0' || word[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(word[i] - '0');
    }
    *out = v;
    return true;
}

static bool sim_name_word(const char *word, size_t len, const char *prefix, uint64_t *out)
{
    size_t n = strlen(prefix);
    return len > n && memcmp(word, prefix, n) == 0 && sim_name_number(word + n, len - n, out);
}

/* What a kernel's name says of it (see the top of the file), from its last
 * '_'-separated words back to the first that says nothing. */
static void sim_name_figures(const char *name, uint64_t *duration_ns, uint64_t *local_bytes)
{
    *duration_ns = sim_config()->kernel_ns;
    *local_bytes = 0;
    bool timed = false, local = false;
    size_t end = strlen(name);
    for (;;) {
        const char *us = NULL;
        size_t start = end;
        while (start > 0 && name[start - 1] != '_')
            start--;
        if (start == 0)
            return; /* the first word is the kernel's own name */
        const char *word = name + start;
        size_t len = end - start;
        uint64_t v;
        if (!timed && sim_name_word(word, len, "us", &v)) {
            *duration_ns = v * 1000;
            timed = true;
        } else if (!local && sim_name_word(word, len, "local", &v)) {
            *local_bytes = v;
            local = true;
        } else if (!timed && start >= 4 && memcmp(name + start - 4, "_us_", 4) == 0 &&
                   sim_name_number(word, len, &v)) {
            *duration_ns = v * 1000;
            timed = true;
            us = name + start - 4;
        } else {
            return;
        }
        end = us ? (size_t)(us - name) : start - 1;
    }
}

/* The code an image declares ("//simgpu code=<size>" at its start), or the
 * default; false for a declaration whose size is bad. */
static bool sim_image_code(const char *image, uint64_t *code_bytes)
{
    static const char tag[] = "//simgpu code=";
    *code_bytes = SIM_MODULE_CODE_DEFAULT;
    if (strncmp(image, tag, sizeof tag - 1) != 0)
        return true;
    const char *size = image + sizeof tag - 1;
    size_t len = strcspn(size, " \t\r\n");
    char text[32];
    if (len == 0 || len >= sizeof text)
        return false;
    memcpy(text, size, len);
    text[len] = '\0';
    if (strcmp(text, "0") == 0) {
        *code_bytes = 0;
        return true;
    }
    return vgl_parse_size(text, code_bytes) == 0;
}

static uint64_t sim_granules(uint64_t bytes)
{
    return (bytes + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
}

/* Sets the bytes a context's pool has charged to `want` (more or less).
 * Under sim_modules_mutex. */
static bool sim_pool_set(CUcontext ctx, uint64_t *charged, uint64_t want)
{
    if (want > *charged) {
        if (sim_state_charge(ctx->device, want - *charged) != 0)
            return false;
    } else if (want < *charged) {
        sim_state_uncharge(ctx->device, *charged - want);
    }
    *charged = want;
    return true;
}

/* Loads `m`'s code into `ctx` if it is not there.  Under sim_modules_mutex. */
static CUresult sim_module_load_into(CUmodule m, CUcontext ctx)
{
    for (size_t i = 0; i < m->n_loaded; i++)
        if (m->loaded[i].ctx == ctx && m->loaded[i].activation == ctx->activation)
            return CUDA_SUCCESS;
    if (m->n_loaded == m->cap_loaded) {
        size_t cap = m->cap_loaded ? 2 * m->cap_loaded : 4;
        struct sim_loaded *v = realloc(m->loaded, cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        m->loaded = v;
        m->cap_loaded = cap;
    }
    if (!sim_pool_set(ctx, &ctx->code_charged, sim_granules(ctx->code_bytes + m->code_bytes)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->code_bytes += m->code_bytes;
    m->loaded[m->n_loaded++] = (struct sim_loaded){ctx, ctx->activation};
    return CUDA_SUCCESS;
}

/* Takes `m`'s code out of every live context it is loaded into.  Under sim_modules_mutex. */
static void sim_module_unload_all(CUmodule m)
{
    for (size_t i = 0; i < m->n_loaded; i++) {
        CUcontext ctx = m->loaded[i].ctx;
        if (!__atomic_load_n(&ctx->alive, __ATOMIC_ACQUIRE) || ctx->activation != m->loaded[i].activation)
            continue;
        ctx->code_bytes -= m->code_bytes;
        sim_pool_set(ctx, &ctx->code_charged, sim_granules(ctx->code_bytes));
    }
    free(m->loaded);
    m->loaded = NULL;
    m->n_loaded = m->cap_loaded = 0;
}

static void sim_module_free(CUmodule m);

/* A module of `ctx` (NULL: a library's) with `code_bytes` of code, loaded
 * into `ctx` (or, for a library, the current context if any) at once under
 * CUDA_MODULE_LOADING=EAGER. */
static CUresult sim_module_new(CUcontext ctx, uint64_t code_bytes, CUmodule *module)
{
    CUmodule m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SIM_MODULE_MAGIC;
    m->ctx = ctx;
    m->code_bytes = code_bytes;
    CUcontext into = ctx;
    if (!into && sim_current_context(&into) != CUDA_SUCCESS)
        into = NULL;
    if (sim_config()->eager_modules && into) {
        pthread_mutex_lock(&sim_modules_mutex);
        CUresult res = sim_module_load_into(m, into);
        pthread_mutex_unlock(&sim_modules_mutex);
        if (res != CUDA_SUCCESS) {
            sim_module_free(m);
            return res;
        }
    }
    *module = m;
    return CUDA_SUCCESS;
}

static CUresult sim_module_in_context(const char *image, CUmodule *module)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    uint64_t code_bytes;
    if (!sim_image_code(image, &code_bytes))
        return CUDA_ERROR_INVALID_IMAGE;
    return sim_module_new(ctx, code_bytes, module);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_in_context(image, module);
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *file = fopen(fname, "re");
    if (!file)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char head[64] = "";
    size_t n = fread(head, 1, sizeof head - 1, file);
    fclose(file);
    head[n] = '\0';
    return sim_module_in_context(head, module);
}

static bool sim_module_valid(CUmodule m)
{
    return m && m->magic == SIM_MODULE_MAGIC;
}

static void sim_module_free(CUmodule m)
{
    pthread_mutex_lock(&sim_modules_mutex);
    sim_module_unload_all(m);
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
        f = calloc(1, sizeof *f + len + 1);
        if (f) {
            f->magic = SIM_FUNC_MAGIC;
            f->module = hmod;
            sim_name_figures(name, &f->duration_ns, &f->local_bytes);
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

uint64_t sim_kernel_local_bytes(CUfunction f)
{
    return f->local_bytes;
}

CUresult sim_kernel_prepare(CUfunction f, CUcontext ctx)
{
    if (__atomic_load_n(&f->ready_ctx, __ATOMIC_ACQUIRE) == ctx &&
        __atomic_load_n(&f->ready_activation, __ATOMIC_RELAXED) == ctx->activation)
        return CUDA_SUCCESS;
    const struct sim_config *cfg = sim_config();
    const uint64_t resident_threads = (uint64_t)cfg->units[ctx->device].sms * cfg->profile->threads_per_sm;
    pthread_mutex_lock(&sim_modules_mutex);
    CUresult res = sim_module_load_into(f->module, ctx);
    uint64_t local = sim_granules(f->local_bytes * resident_threads);
    if (res == CUDA_SUCCESS && local > ctx->local_charged && !sim_pool_set(ctx, &ctx->local_charged, local))
        res = CUDA_ERROR_OUT_OF_MEMORY;
    if (res == CUDA_SUCCESS) {
        __atomic_store_n(&f->ready_activation, ctx->activation, __ATOMIC_RELAXED);
        __atomic_store_n(&f->ready_ctx, ctx, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&sim_modules_mutex);
    return res;
}

void sim_modules_release_context(CUcontext ctx)
{
    pthread_mutex_lock(&sim_modules_mutex);
    sim_pool_set(ctx, &ctx->code_charged, 0);
    sim_pool_set(ctx, &ctx->local_charged, 0);
    ctx->code_bytes = 0;
    pthread_mutex_unlock(&sim_modules_mutex);
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
    uint64_t code_bytes;
    if (!sim_image_code(code, &code_bytes))
        return CUDA_ERROR_INVALID_IMAGE;
    CUlibrary l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult res = sim_module_new(NULL, code_bytes, &l->module);
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

/* hooks.def expanded: the resolve-on-first-use stubs, the typed real
 * pointers, and the table through which every pointer we hand out passes. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Until its library is resolved, a real pointer is a stub that resolves it
 * and calls through.  A function the library lacks keeps its stub, which
 * then answers "not found" the way a missing entry point would. */
#define CU_HOOK(symbol, base, version, pt, params, args)                  \
    static CUresult lazy_##symbol params                                  \
    {                                                                     \
        if (!vgl_resolve_cuda() || vgl_real.symbol == lazy_##symbol)      \
            return CUDA_ERROR_NOT_FOUND;                                  \
        return vgl_real.symbol args;                                      \
    }
#define CU_CALL CU_HOOK
#define NVML_HOOK(symbol, params, args)                                   \
    static nvmlReturn_t lazy_##symbol params                              \
    {                                                                     \
        if (!vgl_resolve_nvml() || vgl_real.symbol == lazy_##symbol)      \
            return NVML_ERROR_FUNCTION_NOT_FOUND;                         \
        return vgl_real.symbol args;                                      \
    }
#define NVML_CALL NVML_HOOK
#include "hooks.def"

struct vgl_real vgl_real = {
#define CU_HOOK(symbol, base, version, pt, params, args) .symbol = lazy_##symbol,
#define CU_CALL CU_HOOK
#define NVML_HOOK(symbol, params, args) .symbol = lazy_##symbol,
#define NVML_CALL NVML_HOOK
#include "hooks.def"
};

/* Hooks and the functions we only call, in one table; `wrapper` is NULL for the latter. */
static const struct vgl_hook TABLE[] = {
#define CU_HOOK(symbol, base, version, pt, params, args) \
    {#symbol, #base, (void *)symbol, (void **)&vgl_real.symbol, (void *)lazy_##symbol},
#define CU_CALL(symbol, base, version, pt, params, args) \
    {#symbol, #base, NULL, (void **)&vgl_real.symbol, (void *)lazy_##symbol},
#define NVML_HOOK(symbol, params, args) \
    {#symbol, #symbol, (void *)symbol, (void **)&vgl_real.symbol, (void *)lazy_##symbol},
#define NVML_CALL(symbol, params, args) \
    {#symbol, #symbol, NULL, (void **)&vgl_real.symbol, (void *)lazy_##symbol},
#include "hooks.def"
};
#define TABLE_SIZE (sizeof TABLE / sizeof TABLE[0])

const struct vgl_hook *vgl_hook_by_name(const char *name)
{
    for (size_t i = 0; i < TABLE_SIZE; i++)
        if (TABLE[i].wrapper && strcmp(TABLE[i].name, name) == 0)
            return &TABLE[i];
    return NULL;
}

void *vgl_wrap_real_pointer(const char *name, void *real)
{
    bool base_hooked = false;
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        if (!TABLE[i].wrapper)
            continue;
        if (*TABLE[i].real == real && real != TABLE[i].lazy)
            return TABLE[i].wrapper;
        base_hooked = base_hooked || (name && strcmp(TABLE[i].base, name) == 0);
    }
    if (base_hooked && real) {
        static unsigned warned;
        vgl_log_bounded(VGL_LOG_WARN, &warned,
                        "the driver handed out %s at %p, none of the variants the shim resolved; "
                        "calls through it are not limited", name, real);
    }
    return real;
}

/* Fills the real pointers of the entries whose name starts with `prefix`. */
static void resolve(void *handle, const char *prefix)
{
    size_t len = strlen(prefix);
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        if (strncmp(TABLE[i].name, prefix, len) != 0)
            continue;
        void *real = vgl_real_dlsym(handle, TABLE[i].name);
        if (real)
            __atomic_store_n(TABLE[i].real, real, __ATOMIC_RELEASE);
    }
}

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;
static bool cuda_found, nvml_found;

static void resolve_cuda(void)
{
    void *handle = vgl_real_cuda_library();
    if (handle)
        resolve(handle, "cu");
    cuda_found = handle != NULL;
}

static void resolve_nvml(void)
{
    void *handle = vgl_real_nvml_library();
    if (handle)
        resolve(handle, "nvml");
    nvml_found = handle != NULL;
}

bool vgl_resolve_cuda(void)
{
    pthread_once(&cuda_once, resolve_cuda);
    return cuda_found;
}

bool vgl_resolve_nvml(void)
{
    pthread_once(&nvml_once, resolve_nvml);
    return nvml_found;
}

/* NVML started for the shim's own use: the context's cost (overhead.c) and
 * the devices' kinds (devices.c).  NVML counts its users: this reference is
 * ours and stays. */
static pthread_once_t started_once = PTHREAD_ONCE_INIT;
static bool started;
static char not_started[300]; /* why NVML could not be started */

static void start_nvml(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    started = vgl_resolve_nvml() && (rc = vgl_real.nvmlInit_v2()) == NVML_SUCCESS;
    if (!started && rc != NVML_SUCCESS)
        snprintf(not_started, sizeof not_started, "nvmlInit failed (NVML error %d)", (int)rc);
    else if (!started)
        snprintf(not_started, sizeof not_started, "cannot load libnvidia-ml.so.1: %s", vgl_real_nvml_error());
}

bool vgl_nvml_started(void)
{
    pthread_once(&started_once, start_nvml);
    return started;
}

const char *vgl_nvml_not_started(void)
{
    pthread_once(&started_once, start_nvml);
    return not_started;
}

/* cuGetProcAddress: entry points by base name and CUDA version, from the one
 * table in driver_api.def.
 *
 * The caller names a base ("cuMemAlloc") and the CUDA version it was built for;
 * the answer is the newest variant introduced at or before that version (never
 * an older one: variants change signatures, e.g. cuCtxGetDevice at 13000), and
 * under CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM its _ptsz/_ptds variant
 * when one exists at that version.  The pointer is the exported function's own
 * address, so a shim can map it back to the symbol.  Works before cuInit, as
 * cuda-bindings asks for everything first. */
#include <string.h>

#include "driver.h"

enum sim_flavour {
    SIM_PLAIN,
    SIM_PER_THREAD,
};

struct sim_proc_entry {
    const char *base;
    int version;
    enum sim_flavour flavour;
    const char *symbol;
    void *fn;
};

static const struct sim_proc_entry sim_procs[] = {
#define SIM_PROC(base, version, flavour, symbol) {#base, version, SIM_##flavour, #symbol, (void *)&symbol},
#include "driver_api.def"
#undef SIM_PROC
};

enum {
    SIM_NPROCS = sizeof sim_procs / sizeof sim_procs[0],
    SIM_KNOWN_FLAGS = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
};

/* The entry to hand out, or NULL with *known telling whether the name exists
 * at any version. */
static const struct sim_proc_entry *sim_lookup(const char *symbol, int version, cuuint64_t flags, bool *known)
{
    const struct sim_proc_entry *plain = NULL, *per_thread = NULL;
    *known = false;
    for (int i = 0; i < SIM_NPROCS; i++) {
        const struct sim_proc_entry *e = &sim_procs[i];
        if (strcmp(e->base, symbol) != 0)
            continue;
        *known = true;
        if (e->version > version)
            continue;
        const struct sim_proc_entry **best = e->flavour == SIM_PER_THREAD ? &per_thread : &plain;
        if (!*best || e->version > (*best)->version)
            *best = e;
    }
    /* The per-thread variant only if it is at least as new as the plain one:
     * otherwise it has an older signature than the caller was built for. */
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && per_thread &&
        (!plain || per_thread->version >= plain->version))
        return per_thread;
    return plain;
}

static CUresult sim_get_proc(const char *api, const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn || (flags & ~(cuuint64_t)SIM_KNOWN_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    /* A driver knows no variant newer than itself. */
    const struct sim_config *cfg = sim_config();
    int version = cfg && cfg->driver_version < cudaVersion ? cfg->driver_version : cudaVersion;
    bool known;
    const struct sim_proc_entry *e = sim_lookup(symbol, version, flags, &known);
    if (cfg && cfg->trace)
        sim_log("%s(\"%s\", %d, %llu) -> %s", api, symbol, cudaVersion, (unsigned long long)flags,
                e ? e->symbol : known ? "(version not sufficient)" : "(not found)");
    *pfn = e ? e->fn : NULL;
    if (status)
        *status = e       ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return e ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    SIM_CALLED();
    return sim_get_proc("cuGetProcAddress_v2", symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    SIM_CALLED();
    return sim_get_proc("cuGetProcAddress", symbol, pfn, cudaVersion, flags, NULL);
}

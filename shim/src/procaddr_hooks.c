/* cuGetProcAddress: how CUDA >= 11.3 runtimes and cuda-bindings fetch every
 * entry point.  The real driver chooses the variant (by name, the caller's
 * CUDA version and its per-thread-stream flag); we only swap the pointer it
 * returns for our wrapper of that very variant, so a caller never gets a
 * variant, or a signature, it did not ask for. */
#include "internal.h"

static void wrap(const char *symbol, void **pfn)
{
    if (vgl_config.enabled && pfn && *pfn)
        *pfn = vgl_wrap_real_pointer(symbol, *pfn);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    CUresult rc = vgl_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS)
        wrap(symbol, pfn);
    return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CUresult rc = vgl_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS)
        wrap(symbol, pfn);
    return rc;
}

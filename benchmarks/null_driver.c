/* A driver that does nothing, as fast as it can: a libcuda.so.1 with just
 * what bench_overhead.c and the shim call.  Measured against it, the time a
 * call takes is the shim's own cost, with no simulated work around it. */
#include <stddef.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

#define API __attribute__((visibility("default")))

static CUdeviceptr next_ptr = 1ULL << 40;

API CUresult cuInit(unsigned int flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
API CUresult cuCtxGetDevice(CUdevice *device) { *device = 0; return CUDA_SUCCESS; }
/* One device, as every driver can say (the shim asks once which devices a
 * process has, and would ask again at every allocation until told). */
API CUresult cuDeviceGetCount(int *count) { *count = 1; return CUDA_SUCCESS; }
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    memset(uuid->bytes, 0x42, sizeof uuid->bytes);
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { (void)dev; *bytes = 80ULL << 30; return CUDA_SUCCESS; }
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) { *free_bytes = *total_bytes = 80ULL << 30; return CUDA_SUCCESS; }
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    *dptr = __atomic_fetch_add(&next_ptr, (bytes + 511) & ~511ULL, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
API CUresult cuMemFree_v2(CUdeviceptr dptr) { return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, CUstream stream, void **params, void **extra)
{
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream; (void)params; (void)extra;
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status);

static const struct { const char *name; void *fn; } TABLE[] = {
    {"cuInit", (void *)cuInit}, {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount}, {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2}, {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
    {"cuMemAlloc", (void *)cuMemAlloc_v2}, {"cuMemFree", (void *)cuMemFree_v2},
    {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
};

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    (void)version;
    (void)flags;
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++) {
        if (strcmp(TABLE[i].name, symbol) == 0) {
            *pfn = TABLE[i].fn;
            if (status)
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

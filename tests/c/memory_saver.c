/* A second preload library of the shape of SGLang's torch_memory_saver
 * (sgl-project/torch_memory_saver, the LD_PRELOAD hook mode): it defines
 * cudaMalloc and cudaFree, allocates through virtual memory management so
 * that the memory can be paused (unmapped and released, the addresses kept)
 * and resumed (created and mapped again at the same addresses), and reaches
 * the driver by its ordinary symbols, linked against libcuda.
 *
 *   cudaMalloc / cudaFree          what PyTorch's allocator calls
 *   memory_saver_pause / _resume   torch_memory_saver.pause() / resume() */
#include <stddef.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);

#define GRANULE ((size_t)2 << 20)

static struct {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle;
    int mapped;
} regions[64];

/* cudaError_t values: 0 success, 2 cudaErrorMemoryAllocation. */
static int create_and_map(int i)
{
    CUdevice dev = 0;
    cuCtxGetDevice(&dev);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cuMemCreate(&regions[i].handle, regions[i].size, &prop, 0) != CUDA_SUCCESS)
        return 2;
    if (cuMemMap(regions[i].ptr, regions[i].size, 0, regions[i].handle, 0) != CUDA_SUCCESS ||
        cuMemSetAccess(regions[i].ptr, regions[i].size, &access, 1) != CUDA_SUCCESS) {
        cuMemRelease(regions[i].handle);
        return 2;
    }
    regions[i].mapped = 1;
    return 0;
}

int cudaMalloc(void **ptr, size_t size)
{
    size = (size + GRANULE - 1) / GRANULE * GRANULE;
    for (int i = 0; i < 64; i++) {
        if (regions[i].size)
            continue;
        regions[i].size = size;
        if (cuMemAddressReserve(&regions[i].ptr, size, 0, 0, 0) != CUDA_SUCCESS) {
            regions[i].size = 0;
            return 2;
        }
        int rc = create_and_map(i);
        if (rc) {
            cuMemAddressFree(regions[i].ptr, size);
            regions[i].size = 0;
            return rc;
        }
        *ptr = (void *)(uintptr_t)regions[i].ptr;
        return 0;
    }
    return 2;
}

int cudaFree(void *ptr)
{
    for (int i = 0; i < 64; i++) {
        if (!regions[i].size || regions[i].ptr != (CUdeviceptr)(uintptr_t)ptr)
            continue;
        if (regions[i].mapped) {
            cuMemUnmap(regions[i].ptr, regions[i].size);
            cuMemRelease(regions[i].handle);
        }
        cuMemAddressFree(regions[i].ptr, regions[i].size);
        regions[i].size = 0;
        return 0;
    }
    return 1;
}

int memory_saver_pause(void)
{
    for (int i = 0; i < 64; i++) {
        if (regions[i].size && regions[i].mapped) {
            if (cuMemUnmap(regions[i].ptr, regions[i].size) != CUDA_SUCCESS ||
                cuMemRelease(regions[i].handle) != CUDA_SUCCESS)
                return 1;
            regions[i].mapped = 0;
        }
    }
    return 0;
}

int memory_saver_resume(void)
{
    for (int i = 0; i < 64; i++)
        if (regions[i].size && !regions[i].mapped && create_and_map(i))
            return 2;
    return 0;
}

/* Page-locked host memory as a program linked with -lcuda uses it:
 * cuMemAllocHost, cuMemHostAlloc and cuMemFreeHost; cuMemHostRegister and
 * cuMemHostUnregister on memory of its own; cuMemHostGetDevicePointer and
 * cuMemHostGetFlags; copies through it.  Host memory is not device memory:
 * 2 GiB of it leave cuMemGetInfo's free bytes as they were, under a cap of
 * 1 GiB too.  Ends with check.h's "N passed, N failed" line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags);
CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream);

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static size_t free_bytes(void)
{
    size_t free = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS, "cuMemGetInfo_v2");
    return free;
}

static void allocated(void)
{
    size_t before = free_bytes();
    void *big = NULL;
    CHECK(cuMemHostAlloc(&big, 2 * GiB, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS, "2 GiB of pinned host memory");
    CHECK(free_bytes() == before, "host memory is not charged to the device");
    CHECK(cuMemFreeHost(big) == CUDA_SUCCESS, "free");

    unsigned int all = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    void *p = NULL;
    CHECK(cuMemHostAlloc(&p, MiB, all) == CUDA_SUCCESS && p, "cuMemHostAlloc with every flag");
    unsigned int flags = 0;
    CHECK(cuMemHostGetFlags(&flags, (char *)p + 100) == CUDA_SUCCESS && flags == all, "flags %u", flags);
    CUdeviceptr d = 0;
    CHECK(cuMemHostGetDevicePointer_v2(&d, (char *)p + 100, 0) == CUDA_SUCCESS &&
              d == (CUdeviceptr)(uintptr_t)p + 100,
          "under unified addressing, the device pointer is the host pointer");
    CHECK(cuMemHostGetDevicePointer_v2(&d, p, 1) == CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    void *q = NULL;
    CHECK(cuMemHostAlloc(&q, MiB, 0x8) == CUDA_ERROR_INVALID_VALUE, "an unknown flag");
    CHECK(cuMemHostAlloc(&q, 0, 0) == CUDA_ERROR_INVALID_VALUE, "no bytes");
    CHECK(cuMemFreeHost((char *)p + 100) == CUDA_ERROR_INVALID_VALUE, "free of an inner pointer");
    CHECK(cuMemFreeHost(p) == CUDA_SUCCESS, "free");
    CHECK(cuMemHostGetFlags(&flags, p) == CUDA_ERROR_INVALID_VALUE, "flags of freed memory");
    CHECK(cuMemFreeHost(p) == CUDA_ERROR_INVALID_VALUE, "a second free");

    CHECK(cuMemAllocHost_v2(&p, 4096) == CUDA_SUCCESS, "cuMemAllocHost");
    CHECK(cuMemHostGetFlags(&flags, p) == CUDA_SUCCESS && flags == 0, "cuMemAllocHost's flags: %u", flags);
    CHECK(cuMemHostGetDevicePointer_v2(&d, p, 0) == CUDA_SUCCESS && d == (CUdeviceptr)(uintptr_t)p,
          "cuMemAllocHost memory is mapped");
    CHECK(cuMemFreeHost(p) == CUDA_SUCCESS, "free");
}

static void registered(void)
{
    size_t n = 3 * MiB + 5; /* neither page-aligned nor a whole number of pages */
    char *buffer = malloc(n + 64);
    char *p = buffer + 64;
    memset(buffer, 0, n + 64);
    size_t before = free_bytes();
    CUdeviceptr d = 0;
    unsigned int flags;
    CHECK(cuMemHostGetDevicePointer_v2(&d, p, 0) == CUDA_ERROR_INVALID_VALUE, "pageable memory has no device pointer");
    CHECK(cuMemHostUnregister(p) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "unregister before register");
    CHECK(cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_IOMEMORY) == CUDA_ERROR_NOT_SUPPORTED, "no I/O memory");
    CHECK(cuMemHostRegister_v2(p, n, 0x10) == CUDA_ERROR_INVALID_VALUE, "an unknown flag");
    CHECK(cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS,
          "register");
    CHECK(free_bytes() == before, "registered memory is not charged to the device");
    CHECK(cuMemHostRegister_v2(p, n, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "twice");
    CHECK(cuMemHostRegister_v2(p + MiB, 16, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "inside");
    CHECK(cuMemHostRegister_v2(buffer, 65, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "overlapping");
    CHECK(cuMemHostGetDevicePointer_v2(&d, p + 7, 0) == CUDA_SUCCESS && d == (CUdeviceptr)(uintptr_t)(p + 7),
          "the device pointer of registered memory is its host pointer");
    CHECK(cuMemHostGetFlags(&flags, p) == CUDA_ERROR_INVALID_VALUE, "flags are an allocation's only");
    CHECK(cuMemFreeHost(p) == CUDA_ERROR_INVALID_VALUE, "registered memory is not freed");
    CHECK(cuMemHostUnregister(p + 7) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "unregister of an inner pointer");
    CHECK(cuMemHostUnregister(p) == CUDA_SUCCESS, "unregister");
    CHECK(cuMemHostUnregister(p) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "unregister twice");
    CHECK(cuMemHostRegister_v2(p, n, 0) == CUDA_SUCCESS && cuMemHostUnregister(p) == CUDA_SUCCESS,
          "registered again after unregistering");

    CUdeviceptr device = 0;
    CHECK(cuMemAlloc_v2(&device, MiB) == CUDA_SUCCESS, "cuMemAlloc");
    CHECK(cuMemHostRegister_v2((void *)(uintptr_t)device, MiB, 0) == CUDA_ERROR_INVALID_VALUE,
          "device memory is not host memory");
    CHECK(cuMemFree_v2(device) == CUDA_SUCCESS, "cuMemFree");
    free(buffer);
}

/* Bytes through pinned memory to the device and back, on a stream. */
static void copies(void)
{
    CUstream stream;
    CHECK(cuStreamCreate(&stream, 0) == CUDA_SUCCESS, "stream");
    unsigned char *in = NULL, *out = NULL;
    CUdeviceptr device = 0;
    CHECK(cuMemHostAlloc((void **)&in, MiB, 0) == CUDA_SUCCESS && cuMemAllocHost_v2((void **)&out, MiB) == CUDA_SUCCESS,
          "pinned buffers");
    CHECK(cuMemAlloc_v2(&device, MiB) == CUDA_SUCCESS, "cuMemAlloc");
    for (size_t i = 0; i < MiB; i++)
        in[i] = (unsigned char)(i * 7);
    CHECK(cuMemcpyHtoDAsync_v2(device, in, MiB, stream) == CUDA_SUCCESS, "HtoD");
    CHECK(cuMemcpyDtoHAsync_v2(out, device, MiB, stream) == CUDA_SUCCESS, "DtoH");
    CHECK(cuStreamSynchronize(stream) == CUDA_SUCCESS, "sync");
    CHECK(memcmp(in, out, MiB) == 0, "the bytes came back");
    CHECK(cuMemFreeHost(in) == CUDA_SUCCESS && cuMemFreeHost(out) == CUDA_SUCCESS, "free");
    CHECK(cuMemFree_v2(device) == CUDA_SUCCESS, "cuMemFree");
}

int main(void)
{
    void *p;
    CHECK(cuMemHostAlloc(&p, MiB, 0) == CUDA_ERROR_NOT_INITIALIZED, "before cuInit");
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) {
        fprintf(stderr, "no device\n");
        return 2;
    }
    CHECK(cuMemHostAlloc(&p, MiB, 0) == CUDA_ERROR_INVALID_CONTEXT, "without a current context");
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "current");
    int mapped = 0, unified = 0, host_pointer = 0;
    cuDeviceGetAttribute(&mapped, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev);
    cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
    cuDeviceGetAttribute(&host_pointer, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev);
    CHECK(mapped && unified && host_pointer, "a device that maps host memory at its host address");
    allocated();
    registered();
    copies();
    return check_summary();
}

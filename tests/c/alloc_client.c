/* A small CUDA client that fills device memory in blocks, reaching the driver
 * one of the three ways real clients do:
 *   link            calls the functions it was linked against (-lcuda)
 *   procaddr        pointers from cuGetProcAddress_v2 (flags 0)
 *   procaddr-ptds   the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *   dlsym           dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2"),
 *                   as cuda-bindings and the CUDA runtime do
 * Usage: alloc_client MODE BLOCK_BYTES COUNT
 * Prints one line per call: "meminfo FREE TOTAL", "alloc I RESULT", "free RESULT",
 * "realloc RESULT", "total BYTES". */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*get_info)(size_t *, size_t *);
    CUresult (*total_mem)(size_t *, CUdevice);
} api;

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *lookup(procaddr_fn get, const char *name, cuuint64_t flags)
{
    void *pfn = NULL;
    CUdriverProcAddressQueryResult status = -1;
    CUresult rc = get(name, &pfn, 13000, flags, &status);
    if (rc != CUDA_SUCCESS || !pfn || status != CU_GET_PROC_ADDRESS_SUCCESS) {
        fprintf(stderr, "cuGetProcAddress_v2(%s) failed: %d status %d\n", name, rc, status);
        exit(3);
    }
    return pfn;
}

static void through_procaddr(procaddr_fn get, cuuint64_t flags)
{
    api.init = lookup(get, "cuInit", flags);
    api.device_get = lookup(get, "cuDeviceGet", flags);
    api.retain = lookup(get, "cuDevicePrimaryCtxRetain", flags);
    api.set_current = lookup(get, "cuCtxSetCurrent", flags);
    api.alloc = lookup(get, "cuMemAlloc", flags);
    api.free = lookup(get, "cuMemFree", flags);
    api.get_info = lookup(get, "cuMemGetInfo", flags);
    api.total_mem = lookup(get, "cuDeviceTotalMem", flags);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s link|procaddr|procaddr-ptds|dlsym BLOCK_BYTES COUNT\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    size_t block = strtoull(argv[2], NULL, 0);
    int count = atoi(argv[3]);

    if (strcmp(mode, "link") == 0) {
        api.init = cuInit;
        api.device_get = cuDeviceGet;
        api.retain = cuDevicePrimaryCtxRetain;
        api.set_current = cuCtxSetCurrent;
        api.alloc = cuMemAlloc_v2;
        api.free = cuMemFree_v2;
        api.get_info = cuMemGetInfo_v2;
        api.total_mem = cuDeviceTotalMem_v2;
    } else if (strcmp(mode, "procaddr") == 0) {
        through_procaddr(cuGetProcAddress_v2, CU_GET_PROC_ADDRESS_DEFAULT);
    } else if (strcmp(mode, "procaddr-ptds") == 0) {
        through_procaddr(cuGetProcAddress_v2, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    } else if (strcmp(mode, "dlsym") == 0) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!driver) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 3;
        }
        through_procaddr((procaddr_fn)dlsym(driver, "cuGetProcAddress_v2"), CU_GET_PROC_ADDRESS_DEFAULT);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }

    CUdevice dev;
    CUcontext ctx;
    if (api.init(0) || api.device_get(&dev, 0) || api.retain(&ctx, dev) || api.set_current(ctx)) {
        fprintf(stderr, "no context\n");
        return 3;
    }
    size_t free_bytes = 0, total_bytes = 0, device_total = 0;
    api.get_info(&free_bytes, &total_bytes);
    api.total_mem(&device_total, dev);
    printf("meminfo %zu %zu\n", free_bytes, total_bytes);
    printf("total %zu\n", device_total);

    CUdeviceptr *blocks = calloc((size_t)count, sizeof *blocks);
    int held = 0;
    for (int i = 0; i < count; i++) {
        CUresult rc = api.alloc(&blocks[held], block);
        printf("alloc %d %d\n", i, rc);
        if (rc == CUDA_SUCCESS)
            held++;
    }
    api.get_info(&free_bytes, &total_bytes);
    printf("meminfo %zu %zu\n", free_bytes, total_bytes);
    if (held > 0) {
        printf("free %d\n", api.free(blocks[--held]));
        CUresult rc = api.alloc(&blocks[held], block);
        printf("realloc %d\n", rc);
        if (rc == CUDA_SUCCESS)
            held++;
    }
    while (held > 0)
        api.free(blocks[--held]);
    free(blocks);
    fflush(stdout);
    return 0;
}

/* CUDA 2.x's array entry points, with 32-bit sizes, reached the two ways an
 * old client does: linked by name (dlsym) or from cuGetProcAddress_v2 at
 * version 2000.
 * Usage: legacy_arrays dlsym|procaddr WIDTH HEIGHT
 * Makes a WIDTH x HEIGHT array of float4 with cuArrayCreate, then the same
 * with cuArray3DCreate (depth 0); prints "array2d RESULT", "array3d RESULT",
 * then "meminfo FREE TOTAL". */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *handle;

/* `symbol` as exported, or `name` at `version` from cuGetProcAddress_v2. */
static void *lookup(const char *mode, const char *symbol, const char *name, int version)
{
    void *pfn = NULL;
    if (strcmp(mode, "dlsym") == 0) {
        pfn = dlsym(handle, symbol);
    } else {
        procaddr_fn get = (procaddr_fn)dlsym(handle, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult status;
        if (!get || get(name, &pfn, version, 0, &status) != CUDA_SUCCESS)
            pfn = NULL;
    }
    if (!pfn) {
        fprintf(stderr, "%s: no %s\n", mode, symbol);
        exit(3);
    }
    return pfn;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s dlsym|procaddr WIDTH HEIGHT\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    unsigned int width = (unsigned int)strtoul(argv[2], NULL, 0), height = (unsigned int)strtoul(argv[3], NULL, 0);
    handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (!handle) {
        fprintf(stderr, "%s\n", dlerror());
        return 3;
    }
    CUresult (*init)(unsigned int) = lookup(mode, "cuInit", "cuInit", 2000);
    CUresult (*device_get)(CUdevice *, int) = lookup(mode, "cuDeviceGet", "cuDeviceGet", 2000);
    CUresult (*retain)(CUcontext *, CUdevice) =
        lookup(mode, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000);
    CUresult (*set_current)(CUcontext) = lookup(mode, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000);
    CUresult (*get_info)(size_t *, size_t *) = lookup(mode, "cuMemGetInfo_v2", "cuMemGetInfo", 3020);
    CUresult (*create2d)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *) =
        lookup(mode, "cuArrayCreate", "cuArrayCreate", 2000);
    CUresult (*create3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *) =
        lookup(mode, "cuArray3DCreate", "cuArray3DCreate", 2000);
    CUdevice dev;
    CUcontext ctx;
    if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx))
        return 4;
    const CUarray_format float32 = (CUarray_format)0x20;
    CUDA_ARRAY_DESCRIPTOR_v1 d2 = {.Width = width, .Height = height, .Format = float32, .NumChannels = 4};
    CUDA_ARRAY3D_DESCRIPTOR_v1 d3 = {.Width = width, .Height = height, .Format = float32, .NumChannels = 4};
    CUarray a2, a3;
    printf("array2d %d\n", (int)create2d(&a2, &d2));
    printf("array3d %d\n", (int)create3d(&a3, &d3));
    size_t free_bytes, total_bytes;
    get_info(&free_bytes, &total_bytes);
    printf("meminfo %zu %zu\n", free_bytes, total_bytes);
    return 0;
}

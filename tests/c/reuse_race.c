/* Two threads meet at a free: the main thread makes a FAMILY handle and
 * frees it while a second thread makes one, which a driver that reuses
 * handles at once (reuse_driver.c) hands the very handle being freed.
 * Prints "held" once the second thread holds it and waits for a line on
 * stdin, frees it, prints "freed" and waits for end of input.  The region
 * must then say: one handle's charge, then none.
 *     reuse_race pointer|array|mipmap|pool|vmm */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

/* Reached as the CUDA runtime reaches them: dlopen, then dlsym. */
#define DRIVER(X)                                                                                  \
    X(cuInit, (unsigned int))                                                                      \
    X(cuDeviceGet, (CUdevice *, int))                                                              \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                           \
    X(cuCtxSetCurrent, (CUcontext))                                                                \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                      \
    X(cuMemFree_v2, (CUdeviceptr))                                                                 \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                                \
    X(cuArrayDestroy, (CUarray))                                                                   \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                                 \
    X(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *))                                   \
    X(cuMemPoolDestroy, (CUmemoryPool))                                                            \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                    \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                     \
    X(cuStreamSynchronize, (CUstream))                                                             \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,           \
                    unsigned long long))                                                           \
    X(cuMemRelease, (CUmemGenericAllocationHandle))

#define POINTER(name, args) static CUresult(*name) args;
DRIVER(POINTER)

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        exit(3);
    }
#define LOAD(name, args)                                                                           \
    if (!(*(void **)&name = dlsym(lib, #name))) {                                                  \
        fprintf(stderr, "no %s\n", #name);                                                         \
        exit(3);                                                                                   \
    }
    DRIVER(LOAD)
}

#define BLOCK (16u << 20)

static const char *family;
static CUcontext ctx;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "%s: %s failed: %d\n", family, #call, (int)rc_);                       \
            exit(4);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t make(void)
{
    if (strcmp(family, "pointer") == 0) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, BLOCK));
        return p;
    }
    if (strcmp(family, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR desc = {.Width = 1024, .Height = BLOCK / 4096, .Format = CU_AD_FORMAT_FLOAT,
                                      .NumChannels = 1};
        CUarray a;
        CHECK(cuArrayCreate_v2(&a, &desc));
        return (uint64_t)(uintptr_t)a;
    }
    if (strcmp(family, "mipmap") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = 1024, .Height = BLOCK / 4096, .Format = CU_AD_FORMAT_FLOAT,
                                        .NumChannels = 1};
        CUmipmappedArray a;
        CHECK(cuMipmappedArrayCreate(&a, &desc, 1));
        return (uint64_t)(uintptr_t)a;
    }
    if (strcmp(family, "pool") == 0) {
        /* A pool that has reserved memory: its charge is what it holds. */
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemoryPool pool;
        CUdeviceptr p;
        CHECK(cuMemPoolCreate(&pool, &props));
        CHECK(cuMemAllocFromPoolAsync(&p, BLOCK, pool, NULL));
        CHECK(cuMemFreeAsync(p, NULL));
        CHECK(cuStreamSynchronize(NULL));
        return (uint64_t)(uintptr_t)pool;
    }
    if (strcmp(family, "vmm") == 0) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemGenericAllocationHandle h;
        CHECK(cuMemCreate(&h, BLOCK, &prop, 0));
        return h;
    }
    fprintf(stderr, "unknown family %s\n", family);
    exit(2);
}

static void unmake(uint64_t h)
{
    if (strcmp(family, "pointer") == 0)
        CHECK(cuMemFree_v2(h));
    else if (strcmp(family, "array") == 0)
        CHECK(cuArrayDestroy((CUarray)(uintptr_t)h));
    else if (strcmp(family, "mipmap") == 0)
        CHECK(cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h));
    else if (strcmp(family, "pool") == 0)
        CHECK(cuMemPoolDestroy((CUmemoryPool)(uintptr_t)h));
    else
        CHECK(cuMemRelease(h));
}

static void *second(void *out)
{
    CHECK(cuCtxSetCurrent(ctx));
    *(uint64_t *)out = make();
    return NULL;
}

static void wait_for_line(void)
{
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    family = argv[1];
    load();
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    uint64_t first = make(), other = 0;
    pthread_t t;
    pthread_create(&t, NULL, second, &other);
    unmake(first);
    pthread_join(t, NULL);
    printf("held %s\n", other == first ? "the same handle" : "another handle");
    fflush(stdout);
    wait_for_line();
    unmake(other);
    printf("freed\n");
    fflush(stdout);
    wait_for_line();
    return 0;
}

/* Times driver calls the way an application makes them, to compare runs with
 * and without the shim (benchmarks/overhead.py does the comparing).
 * Prints "NAME NS_PER_CALL" lines; the best of several rounds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double time_launches(launch_fn launch, CUfunction f, long n)
{
    double best = 1e30;
    for (int round = 0; round < 7; round++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        double per = (now_ns() - t0) / n;
        best = per < best ? per : best;
    }
    return best;
}

static double time_alloc_free(alloc_fn alloc, free_fn release, long n)
{
    double best = 1e30;
    for (int round = 0; round < 7; round++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            if (alloc(&p, 1 << 20) == CUDA_SUCCESS)
                release(p);
        }
        double per = (now_ns() - t0) / n;
        best = per < best ? per : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    long launches = argc > 1 ? atol(argv[1]) : 2000000;
    long pairs = argc > 2 ? atol(argv[2]) : 200000;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    procaddr_fn get = driver ? (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2") : NULL;
    if (!get) {
        fprintf(stderr, "no libcuda.so.1 with cuGetProcAddress_v2\n");
        return 1;
    }
    void *launch = NULL, *alloc = NULL, *release = NULL, *init = NULL, *dev_get = NULL, *retain = NULL,
         *set_current = NULL;
    get("cuLaunchKernel", &launch, 13000, 0, NULL);
    get("cuMemAlloc", &alloc, 13000, 0, NULL);
    get("cuMemFree", &release, 13000, 0, NULL);
    get("cuInit", &init, 13000, 0, NULL);
    get("cuDeviceGet", &dev_get, 13000, 0, NULL);
    get("cuDevicePrimaryCtxRetain", &retain, 13000, 0, NULL);
    get("cuCtxSetCurrent", &set_current, 13000, 0, NULL);
    ((CUresult(*)(unsigned))init)(0);
    if (dev_get && retain && set_current) { /* the null driver needs no context */
        CUdevice dev;
        CUcontext ctx;
        ((CUresult(*)(CUdevice *, int))dev_get)(&dev, 0);
        ((CUresult(*)(CUcontext *, CUdevice))retain)(&ctx, dev);
        ((CUresult(*)(CUcontext))set_current)(ctx);
    }
    /* A real function handle where the driver has modules (simgpu: its name
     * makes it run for no time, so the loop never waits for the device); the
     * null driver takes any non-NULL handle. */
    CUfunction f = (CUfunction)(void *)&launches;
    void *load = NULL, *get_function = NULL;
    get("cuModuleLoadData", &load, 13000, 0, NULL);
    get("cuModuleGetFunction", &get_function, 13000, 0, NULL);
    CUmodule module;
    if (load && get_function && ((CUresult(*)(CUmodule *, const void *))load)(&module, "bench") == CUDA_SUCCESS)
        ((CUresult(*)(CUfunction *, CUmodule, const char *))get_function)(&f, module, "bench_us0");
    if (launches > 0)
        printf("launch %.2f\n", time_launches((launch_fn)launch, f, launches));
    if (pairs > 0)
        printf("alloc_free %.2f\n", time_alloc_free((alloc_fn)alloc, (free_fn)release, pairs));
    return 0;
}

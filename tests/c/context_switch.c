/* Launches on two devices from one thread, switching contexts between them,
 * for the test that each launch is charged to its own device.
 *
 *   context_switch push|set ROUNDS
 *
 * Each round makes device 1's primary context current (cuCtxPushCurrent_v2,
 * or cuCtxSetCurrent), launches three 1 ms kernels there, goes back to device
 * 0's (cuCtxPopCurrent_v2, or cuCtxSetCurrent) and launches one there.  The
 * driver is reached through dlopen and cuGetProcAddress_v2, as the CUDA
 * runtime reaches it.  Prints "done" when both devices are idle. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

static procaddr_fn get_proc;

static void *fn(const char *name)
{
    void *p = NULL;
    if (get_proc(name, &p, 13000, 0, NULL) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "context_switch: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

#define CALL(type, name, ...)                                                          \
    do {                                                                               \
        CUresult rc_ = ((type)fn(name))(__VA_ARGS__);                                  \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            fprintf(stderr, "context_switch: %s failed: %d\n", name, (int)rc_);       \
            exit(4);                                                                   \
        }                                                                              \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "push") && strcmp(argv[1], "set"))) {
        fprintf(stderr, "usage: context_switch push|set ROUNDS\n");
        return 2;
    }
    bool push = strcmp(argv[1], "push") == 0;
    long rounds = atol(argv[2]);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc = driver ? (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2") : NULL;
    if (!get_proc) {
        fprintf(stderr, "context_switch: no libcuda.so.1 with cuGetProcAddress_v2\n");
        return 3;
    }
    CALL(CUresult(*)(unsigned), "cuInit", 0);
    CUcontext ctx[2];
    CUfunction kernel[2];
    for (int d = 1; d >= 0; d--) {
        CUdevice dev;
        CUmodule module;
        CALL(CUresult(*)(CUdevice *, int), "cuDeviceGet", &dev, d);
        CALL(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &ctx[d], dev);
        CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx[d]);
        CALL(CUresult(*)(CUmodule *, const void *), "cuModuleLoadData", &module, "context_switch");
        CALL(CUresult(*)(CUfunction *, CUmodule, const char *), "cuModuleGetFunction", &kernel[d], module,
             "spin_us1000");
    }
    launch_fn launch = (launch_fn)fn("cuLaunchKernel");
    for (long r = 0; r < rounds; r++) {
        if (push)
            CALL(CUresult(*)(CUcontext), "cuCtxPushCurrent", ctx[1]);
        else
            CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx[1]);
        for (int i = 0; i < 3; i++)
            CALL(launch_fn, "cuLaunchKernel", kernel[1], 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        if (push) {
            CUcontext popped;
            CALL(CUresult(*)(CUcontext *), "cuCtxPopCurrent", &popped);
        } else {
            CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx[0]);
        }
        if (launch(kernel[0], 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
            fprintf(stderr, "context_switch: launch failed\n");
            return 4;
        }
    }
    for (int d = 0; d < 2; d++) {
        CALL(CUresult(*)(CUcontext), "cuCtxSynchronize", ctx[d]); /* the variant of CUDA 13 names it */
    }
    printf("done\n");
    return 0;
}

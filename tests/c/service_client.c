/* A latency-sensitive service, for tests/test_priority.py and benchmarks/priority.py.
 *
 *   service_client RATE SECONDS KERNEL_US...
 *
 * Requests arrive at RATE per second, on a fixed schedule (a request that
 * finds the previous one still running waits for it: its latency counts that
 * wait, as a service's queue would); each launches simgpu's kernels
 * "spin_us<KERNEL_US>" one after another on one stream and waits for them.
 * Prints, for each request,
 *   "request PID ARRIVAL LATENCY_US"  ARRIVAL in CLOCK_MONOTONIC seconds
 * and last "done PID N". The driver is reached as the CUDA runtime reaches it
 * (dlopen, cuGetProcAddress_v2), as in launch_client.c. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "vgpulimit/cuda_abi.h"

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

static procaddr_fn get_proc;

static void *fn(const char *name)
{
    void *p = NULL;
    if (get_proc(name, &p, 13000, 0, NULL) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "service_client: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

#define CALL(type, name, ...)                                                          \
    do {                                                                               \
        CUresult rc_ = ((type)fn(name))(__VA_ARGS__);                                  \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            fprintf(stderr, "service_client: %s failed: %d\n", name, (int)rc_);       \
            exit(4);                                                                   \
        }                                                                              \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: service_client RATE SECONDS KERNEL_US...\n");
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    int nkernels = argc - 3;
    if (rate <= 0 || seconds <= 0 || nkernels > 16) {
        fprintf(stderr, "service_client: RATE and SECONDS must be positive, at most 16 kernels\n");
        return 2;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc = driver ? (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2") : NULL;
    if (!get_proc) {
        fprintf(stderr, "service_client: no libcuda.so.1 with cuGetProcAddress_v2\n");
        return 3;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUstream stream;
    CUfunction kernels[16];
    CALL(CUresult(*)(unsigned), "cuInit", 0);
    CALL(CUresult(*)(CUdevice *, int), "cuDeviceGet", &dev, 0);
    CALL(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &ctx, dev);
    CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx);
    CALL(CUresult(*)(CUmodule *, const void *), "cuModuleLoadData", &module, "service_client");
    for (int k = 0; k < nkernels; k++) {
        char name[64];
        snprintf(name, sizeof name, "spin_us%ld", atol(argv[3 + k]));
        CALL(CUresult(*)(CUfunction *, CUmodule, const char *), "cuModuleGetFunction", &kernels[k], module, name);
    }
    CALL(CUresult(*)(CUstream *, unsigned), "cuStreamCreate", &stream, 0);
    launch_fn launch = (launch_fn)fn("cuLaunchKernel");
    CUresult (*sync)(CUstream) = (CUresult(*)(CUstream))fn("cuStreamSynchronize");

    double start = now_s() + 0.01;
    long n = 0;
    for (;; n++) {
        double arrival = start + (double)n / rate;
        if (arrival - start >= seconds)
            break;
        sleep_until(arrival);
        for (int k = 0; k < nkernels; k++)
            if (launch(kernels[k], 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL) != CUDA_SUCCESS) {
                fprintf(stderr, "service_client: launch failed\n");
                return 4;
            }
        if (sync(stream) != CUDA_SUCCESS) {
            fprintf(stderr, "service_client: cuStreamSynchronize failed\n");
            return 4;
        }
        printf("request %d %.6f %.1f\n", (int)getpid(), arrival, (now_s() - arrival) * 1e6);
    }
    printf("done %d %ld\n", (int)getpid(), n);
    return 0;
}

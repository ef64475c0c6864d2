/* Threads of one process that launch at once, each on a stream of its own,
 * as a program's compute threads do: each keeps QUEUE kernels of KERNEL_US
 * queued (launches them, then waits for its stream) for SECONDS, then the
 * process prints "launched N".  For the ThreadSanitizer run of priorities
 * (tests/test_thread_sanitizer.py): beside a higher container, every launch
 * reads the beacons and the process's fence, and the launches that go record it.
 *     thread_launch THREADS KERNEL_US QUEUE SECONDS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra);

static CUcontext ctx;
static CUfunction kernel;
static long queue;
static double seconds;
static long launched; /* atomic */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "thread_launch: %s failed: %d\n", what, (int)rc);
        exit(4);
    }
}

static void *launch_loop(void *arg)
{
    (void)arg;
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUstream stream;
    check(cuStreamCreate(&stream, 0), "cuStreamCreate");
    for (double start = now_s(); now_s() - start < seconds;) {
        for (long i = 0; i < queue; i++)
            check(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL), "cuLaunchKernel");
        check(cuStreamSynchronize(stream), "cuStreamSynchronize");
        __atomic_add_fetch(&launched, queue, __ATOMIC_RELAXED);
    }
    check(cuStreamDestroy_v2(stream), "cuStreamDestroy");
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: thread_launch THREADS KERNEL_US QUEUE SECONDS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    queue = atol(argv[3]);
    seconds = atof(argv[4]);
    char name[64];
    snprintf(name, sizeof name, "spin_us%ld", atol(argv[2]));
    CUdevice dev;
    CUmodule module;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&module, "thread_launch"), "cuModuleLoadData");
    check(cuModuleGetFunction(&kernel, module, name), "cuModuleGetFunction");
    pthread_t t[64];
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, launch_loop, NULL) != 0)
            return 5;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("launched %ld\n", __atomic_load_n(&launched, __ATOMIC_RELAXED));
    return 0;
}

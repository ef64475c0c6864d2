/* The driver-level programs of benchmarks/real_gpu.py, one per mode.  The
 * driver is reached as the CUDA runtime reaches it (dlopen + dlsym of
 * cuGetProcAddress_v2, then every entry point by name), so the shim catches
 * it as it catches PyTorch; kernels come from spin_timer.ptx, which the driver
 * compiles (on the simulated GPU their names give their length).
 *
 *   real_gpu_client spin PTX KERNEL_US SECONDS GEOMETRY STREAMS CALIBRATE
 *       Launches vgl_spin_us<KERNEL_US> back to back for SECONDS, two batches
 *       of about 2 ms of kernels in flight, on STREAMS streams in turn (joined
 *       into the first after each batch).  GEOMETRY: "1" (one block of 32
 *       threads), "sm" (one block of 32 per SM), "full" (blocks of 1024 threads
 *       filling every SM, so that kernels of two streams cannot overlap).
 *       With CALIBRATE 1, first times 8..64 kernels back to back with events
 *       on a busy stream and prints "kernel_ns N" (one kernel's span).
 *       Prints "progress PID T N" after each batch it waited for
 *       (CLOCK_MONOTONIC seconds when the wait returned, kernels completed).
 *   real_gpu_client service PTX RATE SECONDS KERNEL_US...
 *       A latency-sensitive service (benchmarks/priority.py): requests arrive
 *       at RATE per second on a fixed schedule (one that finds the previous
 *       still running waits, and its latency counts the wait); each launches
 *       vgl_spin_us<KERNEL_US> of each KERNEL_US, one after another on one
 *       stream, and waits for them.  Prints "request PID ARRIVAL LATENCY_US"
 *       for each (ARRIVAL in CLOCK_MONOTONIC seconds).
 *   real_gpu_client cost PTX LAUNCHES PAIRS
 *       Prints "launch NS" (an empty kernel's cuLaunchKernel, LAUNCHES in a
 *       row, per call) and "alloc_free NS" (cuMemAlloc + cuMemFree of 1 MiB,
 *       PAIRS times, per pair).
 *   real_gpu_client fill BLOCK_MIB LIMIT_MIB
 *       Allocates BLOCK_MIB blocks until refused or LIMIT_MIB are held, frees
 *       half of them, allocates again until refused or the limit; prints one
 *       JSON line, then holds everything until stdin closes or gives a line.
 *
 * Every line is flushed; a failing driver call prints its name and code on
 * stderr and exits 4. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpulimit/cuda_abi.h"

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*event_sync_fn)(CUevent);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

enum { MAX_STREAMS = 4, MAX_BLOCKS = 4096, MAX_HELD = 4096 };

static procaddr_fn get_proc;

static void *fn(const char *name)
{
    void *p = NULL;
    if (get_proc(name, &p, 13000, 0, NULL) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "real_gpu_client: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

static const char *error_name(CUresult rc)
{
    const char *name = NULL;
    void *p = NULL;
    if (get_proc("cuGetErrorName", &p, 13000, 0, NULL) == CUDA_SUCCESS && p)
        ((CUresult(*)(CUresult, const char **))p)(rc, &name);
    return name ? name : "unknown";
}

#define CALL(type, name, ...)                                                                      \
    do {                                                                                           \
        CUresult rc_ = ((type)fn(name))(__VA_ARGS__);                                              \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "real_gpu_client: %s failed: %s (%d)\n", name, error_name(rc_), (int)rc_); \
            exit(4);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "real_gpu_client: cannot read %s\n", path);
        exit(2);
    }
    text[size] = '\0';
    fclose(f);
    return text;
}

/* cuInit, device 0's primary context made current. */
static CUdevice open_device(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc = driver ? (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2") : NULL;
    if (!get_proc) {
        fprintf(stderr, "real_gpu_client: no libcuda.so.1 with cuGetProcAddress_v2\n");
        exit(3);
    }
    CUdevice dev;
    CUcontext ctx;
    CALL(CUresult(*)(unsigned), "cuInit", 0);
    CALL(CUresult(*)(CUdevice *, int), "cuDeviceGet", &dev, 0);
    CALL(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &ctx, dev);
    CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx);
    return dev;
}

static CUfunction load_kernel(const char *ptx_path, const char *name)
{
    CUmodule module;
    CUfunction kernel;
    char *ptx = read_file(ptx_path);
    CALL(CUresult(*)(CUmodule *, const void *), "cuModuleLoadData", &module, ptx);
    CALL(CUresult(*)(CUfunction *, CUmodule, const char *), "cuModuleGetFunction", &kernel, module, name);
    free(ptx);
    return kernel;
}

static int attribute(CUdevice dev, int which)
{
    int value = 0;
    CALL(CUresult(*)(int *, int, CUdevice), "cuDeviceGetAttribute", &value, which, dev);
    return value;
}

static int spin(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: real_gpu_client spin PTX KERNEL_US SECONDS 1|sm|full STREAMS CALIBRATE\n");
        return 2;
    }
    long kernel_us = atol(argv[3]);
    double seconds = atof(argv[4]);
    const char *geometry = argv[5];
    int nstreams = atoi(argv[6]);
    int calibrate = atoi(argv[7]);
    if (nstreams < 1 || nstreams > MAX_STREAMS) {
        fprintf(stderr, "real_gpu_client: STREAMS is 1 to %d\n", MAX_STREAMS);
        return 2;
    }
    CUdevice dev = open_device();
    int sms = attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    int threads_per_sm = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    unsigned blocks = 1, threads = 32;
    if (strcmp(geometry, "sm") == 0) {
        blocks = (unsigned)sms;
    } else if (strcmp(geometry, "full") == 0) {
        threads = 1024;
        blocks = (unsigned)sms * (unsigned)(threads_per_sm > 1024 ? threads_per_sm / 1024 : 1);
    } else if (strcmp(geometry, "1") != 0) {
        fprintf(stderr, "real_gpu_client: GEOMETRY is 1, sm or full\n");
        return 2;
    }
    if (blocks < 1 || blocks > MAX_BLOCKS)
        blocks = 1;
    printf("device sms %d threads_per_sm %d blocks %u threads %u\n", sms, threads_per_sm, blocks, threads);
    fflush(stdout);

    char name[64];
    snprintf(name, sizeof name, "vgl_spin_us%ld", kernel_us);
    CUfunction kernel = load_kernel(argv[2], name);
    CUstream streams[MAX_STREAMS];
    CUevent joined[MAX_STREAMS];
    for (int s = 0; s < nstreams; s++) {
        CALL(CUresult(*)(CUstream *, unsigned), "cuStreamCreate", &streams[s], CU_STREAM_NON_BLOCKING);
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &joined[s], CU_EVENT_DISABLE_TIMING);
    }
    launch_fn launch = (launch_fn)fn("cuLaunchKernel");

    if (calibrate) {
        /* Kernels queued ahead, so the span starts on a busy stream. */
        CUevent from, to;
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &from, CU_EVENT_DEFAULT);
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &to, CU_EVENT_DEFAULT);
        long ahead = kernel_us >= 10000 ? 2 : 8;
        long timed = kernel_us >= 10000 ? 8 : kernel_us >= 1000 ? 32 : 64;
        for (long i = 0; i < ahead; i++)
            CALL(launch_fn, "cuLaunchKernel", kernel, blocks, 1, 1, threads, 1, 1, 0, streams[0], NULL, NULL);
        CALL(event_record_fn, "cuEventRecord", from, streams[0]);
        for (long i = 0; i < timed; i++)
            CALL(launch_fn, "cuLaunchKernel", kernel, blocks, 1, 1, threads, 1, 1, 0, streams[0], NULL, NULL);
        CALL(event_record_fn, "cuEventRecord", to, streams[0]);
        CALL(event_sync_fn, "cuEventSynchronize", to);
        float ms = 0;
        CALL(CUresult(*)(float *, CUevent, CUevent), "cuEventElapsedTime", &ms, from, to);
        printf("kernel_ns %.0f\n", ms * 1e6 / (double)timed);
        fflush(stdout);
    }

    CUevent batch_done[2];
    for (int i = 0; i < 2; i++)
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &batch_done[i], CU_EVENT_DISABLE_TIMING);
    long batch = kernel_us > 0 ? 2000 / kernel_us : 256;
    batch = batch < 1 ? 1 : batch > 256 ? 256 : batch;
    if (batch < nstreams)
        batch = nstreams;
    long launched = 0;
    double start = now_s();
    printf("progress %d %.6f %ld\n", (int)getpid(), start, 0L);
    for (unsigned b = 0; now_s() - start < seconds; b++) {
        for (long i = 0; i < batch; i++) {
            CUresult rc = launch(kernel, blocks, 1, 1, threads, 1, 1, 0, streams[i % nstreams], NULL, NULL);
            if (rc != CUDA_SUCCESS) {
                fprintf(stderr, "real_gpu_client: cuLaunchKernel failed: %s (%d)\n", error_name(rc), (int)rc);
                return 4;
            }
        }
        launched += batch;
        for (int s = 1; s < nstreams; s++) {
            CALL(event_record_fn, "cuEventRecord", joined[s], streams[s]);
            CALL(CUresult(*)(CUstream, CUevent, unsigned), "cuStreamWaitEvent", streams[0], joined[s], 0);
        }
        CALL(event_record_fn, "cuEventRecord", batch_done[b % 2], streams[0]);
        if (b) {
            CALL(event_sync_fn, "cuEventSynchronize", batch_done[(b + 1) % 2]);
            printf("progress %d %.6f %ld\n", (int)getpid(), now_s(), launched - batch);
            fflush(stdout);
        }
    }
    CALL(CUresult(*)(CUstream), "cuStreamSynchronize", streams[0]);
    printf("progress %d %.6f %ld\n", (int)getpid(), now_s(), launched);
    printf("done %d %ld %.6f\n", (int)getpid(), launched, now_s() - start);
    return 0;
}

static void sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

static int service(int argc, char **argv)
{
    enum { MAX_KERNELS = 16 };
    double rate = argc >= 6 ? atof(argv[3]) : 0, seconds = argc >= 6 ? atof(argv[4]) : 0;
    int nkernels = argc - 5;
    if (rate <= 0 || seconds <= 0 || nkernels < 1 || nkernels > MAX_KERNELS) {
        fprintf(stderr, "usage: real_gpu_client service PTX RATE SECONDS KERNEL_US... (1 to %d kernels)\n",
                MAX_KERNELS);
        return 2;
    }
    open_device();
    CUfunction kernels[MAX_KERNELS];
    for (int k = 0; k < nkernels; k++) {
        char name[64];
        snprintf(name, sizeof name, "vgl_spin_us%ld", atol(argv[5 + k]));
        kernels[k] = load_kernel(argv[2], name);
    }
    CUstream stream;
    CALL(CUresult(*)(CUstream *, unsigned), "cuStreamCreate", &stream, CU_STREAM_NON_BLOCKING);
    CUresult (*sync)(CUstream) = (CUresult(*)(CUstream))fn("cuStreamSynchronize");
    double start = now_s() + 0.01;
    for (long n = 0;; n++) {
        double arrival = start + (double)n / rate;
        if (arrival - start >= seconds)
            break;
        sleep_until(arrival);
        for (int k = 0; k < nkernels; k++)
            CALL(launch_fn, "cuLaunchKernel", kernels[k], 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        CUresult rc = sync(stream);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "real_gpu_client: cuStreamSynchronize failed: %s (%d)\n", error_name(rc), (int)rc);
            return 4;
        }
        printf("request %d %.6f %.1f\n", (int)getpid(), arrival, (now_s() - arrival) * 1e6);
    }
    fflush(stdout);
    return 0;
}

static int cost(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: real_gpu_client cost PTX LAUNCHES PAIRS\n");
        return 2;
    }
    long launches = atol(argv[3]), pairs = atol(argv[4]);
    open_device();
    CUfunction kernel = load_kernel(argv[2], "vgl_empty_us0");
    launch_fn launch = (launch_fn)fn("cuLaunchKernel");
    alloc_fn alloc = (alloc_fn)fn("cuMemAlloc");
    free_fn release = (free_fn)fn("cuMemFree");
    /* Once each first: the shim's and the driver's first-call work is not the
     * per-call cost. */
    CALL(launch_fn, "cuLaunchKernel", kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    CUdeviceptr p;
    CALL(alloc_fn, "cuMemAlloc", &p, 1 << 20);
    CALL(free_fn, "cuMemFree", p);
    CALL(CUresult(*)(CUstream), "cuStreamSynchronize", NULL);
    double t0 = now_s();
    for (long i = 0; i < launches; i++)
        if (launch(kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
            fprintf(stderr, "real_gpu_client: cuLaunchKernel failed\n");
            return 4;
        }
    double launch_ns = launches ? (now_s() - t0) * 1e9 / (double)launches : 0;
    CALL(CUresult(*)(CUstream), "cuStreamSynchronize", NULL);
    t0 = now_s();
    for (long i = 0; i < pairs; i++) {
        if (alloc(&p, 1 << 20) != CUDA_SUCCESS || release(p) != CUDA_SUCCESS) {
            fprintf(stderr, "real_gpu_client: cuMemAlloc/cuMemFree failed\n");
            return 4;
        }
    }
    double pair_ns = pairs ? (now_s() - t0) * 1e9 / (double)pairs : 0;
    printf("launch %.1f\nalloc_free %.1f\n", launch_ns, pair_ns);
    return 0;
}

/* Allocates `block` bytes until refused or `limit` bytes are held; the
 * count allocated, the first refusal's name in `error` (or "none"). */
static long fill_to(CUdeviceptr *held, long count, size_t block, size_t limit, const char **error)
{
    alloc_fn alloc = (alloc_fn)fn("cuMemAlloc");
    long added = 0;
    *error = "none";
    while (count + added < MAX_HELD && (size_t)(count + added + 1) * block <= limit) {
        CUresult rc = alloc(&held[count + added], block);
        if (rc != CUDA_SUCCESS) {
            *error = error_name(rc);
            break;
        }
        added++;
    }
    return added;
}

static int fill(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: real_gpu_client fill BLOCK_MIB LIMIT_MIB\n");
        return 2;
    }
    size_t block = (size_t)atol(argv[2]) << 20, limit = (size_t)atol(argv[3]) << 20;
    open_device();
    size_t free_bytes = 0, total_bytes = 0;
    CALL(CUresult(*)(size_t *, size_t *), "cuMemGetInfo", &free_bytes, &total_bytes);
    static CUdeviceptr held[MAX_HELD];
    const char *error, *again_error;
    long count = fill_to(held, 0, block, limit, &error);
    long freed = count / 2;
    for (long i = 0; i < freed; i++)
        CALL(free_fn, "cuMemFree", held[count - 1 - i]);
    long again = fill_to(held, count - freed, block, limit, &again_error);
    printf("{\"pid\": %d, \"total_bytes\": %zu, \"free_bytes\": %zu, \"block_bytes\": %zu, \"blocks\": %ld, "
           "\"error\": \"%s\", \"freed\": %ld, \"again\": %ld, \"again_error\": \"%s\", "
           "\"held_bytes\": %zu}\n",
           (int)getpid(), total_bytes, free_bytes, block, count, error, freed, again, again_error,
           (size_t)(count - freed + again) * block);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) {
        /* stdin closed: hold no longer */
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "spin") == 0)
        return spin(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "cost") == 0)
        return cost(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "service") == 0)
        return service(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "fill") == 0)
        return fill(argc, argv);
    fprintf(stderr, "usage: real_gpu_client spin|service|cost|fill ...\n");
    return 2;
}

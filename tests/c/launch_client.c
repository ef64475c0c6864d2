/* A kernel launch loop, for the compute-share tests and benchmarks/compute_share.py.
 *
 *   launch_client PATH KERNEL_US SECONDS [CPU_US [QUEUE_US]]
 *
 * Launches simgpu's kernel "spin_us<KERNEL_US>" (it runs KERNEL_US on the
 * simulated GPU) through PATH for SECONDS, after each launch working CPU_US
 * on the CPU (default 0: launches back to back; with more than the kernel
 * takes, the program is launch-bound, its GPU idle between kernels), and prints
 *   "progress PID T N"  about every 100 ms: CLOCK_MONOTONIC seconds, launches completed
 *   "gpu PID US"        at the end: the GPU time of one launch, in microseconds
 *   "done PID N T"      last: launches completed, seconds taken
 * PATH: kernel (cuLaunchKernel), ptsz (cuLaunchKernel of the per-thread
 * stream), ex (cuLaunchKernelEx), cooperative (cuLaunchCooperativeKernel),
 * graph (cuGraphLaunch of a graph built node by node), capture (cuGraphLaunch
 * of a graph captured from a stream), graph40 (cuGraphLaunch of a graph of
 * 40 kernels one after another), streams2 / streams4 (cuLaunchKernel on
 * two / four streams in turn, joined at the end of each batch), captured (cuLaunchKernel into a
 * stream being captured, at most 1000 launches in SECONDS, never run).  The driver is reached as the CUDA
 * runtime reaches it: dlopen and cuGetProcAddress_v2.  Two batches of about
 * QUEUE_US of kernels (default 2000) are kept in flight, so the device never
 * runs dry while the loop waits for the older one, nor while the loop waits
 * that long for a CPU on a busy machine. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpulimit/cuda_abi.h"

typedef CUresult (*procaddr_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* cuda.h's kernel node parameters (CUDA_KERNEL_NODE_PARAMS_v2). */
struct kernel_node_params {
    CUfunction func;
    unsigned int grid[3], block[3], shared_bytes;
    void **params, **extra;
    CUkernel kern;
    CUcontext ctx;
};

static procaddr_fn get_proc;
static cuuint64_t proc_flags;

static void *fn(const char *name)
{
    void *p = NULL;
    if (get_proc(name, &p, 13000, proc_flags, NULL) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "launch_client: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

#define CALL(type, name, ...)                                                          \
    do {                                                                               \
        CUresult rc_ = ((type)fn(name))(__VA_ARGS__);                                  \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            fprintf(stderr, "launch_client: %s failed: %d\n", name, (int)rc_);        \
            exit(4);                                                                   \
        }                                                                              \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: launch_client kernel|ptsz|ex|cooperative|graph|graph40|capture|captured|streams2|"
                        "streams4 KERNEL_US SECONDS [CPU_US [QUEUE_US]]\n");
        return 2;
    }
    const char *path = argv[1];
    long kernel_us = atol(argv[2]);
    double seconds = atof(argv[3]);
    double cpu_s = argc >= 5 ? atof(argv[4]) / 1e6 : 0;
    long queue_us = argc == 6 ? atol(argv[5]) : 2000;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc = driver ? (procaddr_fn)dlsym(driver, "cuGetProcAddress_v2") : NULL;
    if (!get_proc) {
        fprintf(stderr, "launch_client: no libcuda.so.1 with cuGetProcAddress_v2\n");
        return 3;
    }
    if (strcmp(path, "ptsz") == 0)
        proc_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction kernel;
    CUstream stream;
    char name[64];
    snprintf(name, sizeof name, "spin_us%ld", kernel_us);
    CALL(CUresult(*)(unsigned), "cuInit", 0);
    CALL(CUresult(*)(CUdevice *, int), "cuDeviceGet", &dev, 0);
    CALL(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", &ctx, dev);
    CALL(CUresult(*)(CUcontext), "cuCtxSetCurrent", ctx);
    CALL(CUresult(*)(CUmodule *, const void *), "cuModuleLoadData", &module, "launch_client");
    CALL(CUresult(*)(CUfunction *, CUmodule, const char *), "cuModuleGetFunction", &kernel, module, name);
    CALL(CUresult(*)(CUstream *, unsigned), "cuStreamCreate", &stream, 0);
    /* The per-thread path uses the default stream, as such programs do. */
    CUstream on = proc_flags ? NULL : stream;
    /* streams[0] is `on`; the others are joined into it after each batch. */
    CUstream streams[4] = {on};
    CUevent joined[4];
    int nstreams = strcmp(path, "streams2") == 0 ? 2 : strcmp(path, "streams4") == 0 ? 4 : 1;
    for (int s = 1; s < nstreams; s++) {
        CALL(CUresult(*)(CUstream *, unsigned), "cuStreamCreate", &streams[s], 0);
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &joined[s], CU_EVENT_DISABLE_TIMING);
    }

    CUgraphExec exec = NULL;
    long nodes = strcmp(path, "graph40") == 0 ? 40 : 1;
    if (strncmp(path, "graph", 5) == 0) {
        CUgraph graph;
        CUgraphNode node = NULL;
        struct kernel_node_params p = {.func = kernel, .grid = {1, 1, 1}, .block = {32, 1, 1}};
        CALL(CUresult(*)(CUgraph *, unsigned), "cuGraphCreate", &graph, 0);
        for (long i = 0; i < nodes; i++) {
            CUgraphNode after = node;
            CALL(CUresult(*)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const void *),
                 "cuGraphAddKernelNode", &node, graph, after ? &after : NULL, after ? 1 : 0, &p);
        }
        CALL(CUresult(*)(CUgraphExec *, CUgraph, unsigned long long), "cuGraphInstantiateWithFlags", &exec,
             graph, 0ULL);
    } else if (strcmp(path, "capture") == 0) {
        CUgraph graph;
        CALL(CUresult(*)(CUstream, int), "cuStreamBeginCapture", stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        CALL(launch_fn, "cuLaunchKernel", kernel, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        CALL(CUresult(*)(CUstream, CUgraph *), "cuStreamEndCapture", stream, &graph);
        CALL(CUresult(*)(CUgraphExec *, CUgraph, unsigned long long), "cuGraphInstantiateWithFlags", &exec,
             graph, 0ULL);
    } else if (strcmp(path, "captured") == 0) {
        /* Launches into a capture cost no GPU time: the graph would, if it
         * were launched.  What the shim charges them shows in the region. */
        CUgraph graph;
        CALL(CUresult(*)(CUstream, int), "cuStreamBeginCapture", stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        long n = 0;
        for (double start = now_s(); n < 1000 && now_s() - start < seconds; n++)
            CALL(launch_fn, "cuLaunchKernel", kernel, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        CALL(CUresult(*)(CUstream, CUgraph *), "cuStreamEndCapture", stream, &graph);
        printf("done %d %ld %.6f\n", (int)getpid(), n, seconds);
        return 0;
    } else if (strcmp(path, "kernel") && strcmp(path, "ptsz") && strcmp(path, "ex") &&
               strcmp(path, "cooperative") && nstreams == 1) {
        fprintf(stderr, "launch_client: unknown path %s\n", path);
        return 2;
    }

    launch_fn launch = (launch_fn)fn("cuLaunchKernel");
    coop_fn cooperative = (coop_fn)fn("cuLaunchCooperativeKernel");
    ex_fn launch_ex = (ex_fn)fn("cuLaunchKernelEx");
    graph_launch_fn graph_launch = (graph_launch_fn)fn("cuGraphLaunch");
    CUresult (*record)(CUevent, CUstream) = (CUresult(*)(CUevent, CUstream))fn("cuEventRecord");
    CUresult (*wait)(CUevent) = (CUresult(*)(CUevent))fn("cuEventSynchronize");
    CUevent batch_done[2];
    for (int i = 0; i < 2; i++)
        CALL(CUresult(*)(CUevent *, unsigned), "cuEventCreate", &batch_done[i], CU_EVENT_DISABLE_TIMING);
    CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
                             .blockDimZ = 1, .hStream = on};

    long batch = kernel_us > 0 ? queue_us / (nodes * kernel_us) : 256;
    batch = batch < 1 ? 1 : batch > 256 ? 256 : batch;
    long launched = 0, completed = 0;
    double start = now_s(), next_report = start;
    for (unsigned b = 0;; b++) {
        double now = now_s();
        if (now >= next_report) {
            printf("progress %d %.6f %ld\n", (int)getpid(), now, completed);
            fflush(stdout);
            next_report = now + 0.1;
        }
        if (now - start >= seconds)
            break;
        for (long i = 0; i < batch; i++) {
            CUresult rc;
            if (exec)
                rc = graph_launch(exec, on);
            else if (path[0] == 'e')
                rc = launch_ex(&config, kernel, NULL, NULL);
            else if (path[0] == 'c')
                rc = cooperative(kernel, 1, 1, 1, 32, 1, 1, 0, on, NULL);
            else
                rc = launch(kernel, 1, 1, 1, 32, 1, 1, 0, streams[i % nstreams], NULL, NULL);
            if (rc != CUDA_SUCCESS) {
                fprintf(stderr, "launch_client: launch failed: %d\n", (int)rc);
                return 4;
            }
            for (double until = cpu_s > 0 ? now_s() + cpu_s : 0; until && now_s() < until;)
                continue; /* the program's own work between launches */
        }
        launched += batch;
        for (int s = 1; s < nstreams; s++) {
            CALL(CUresult(*)(CUevent, CUstream), "cuEventRecord", joined[s], streams[s]);
            CALL(CUresult(*)(CUstream, CUevent, unsigned), "cuStreamWaitEvent", on, joined[s], 0);
        }
        if (record(batch_done[b % 2], on) != CUDA_SUCCESS || (b && wait(batch_done[(b + 1) % 2]) != CUDA_SUCCESS)) {
            fprintf(stderr, "launch_client: waiting for a batch failed\n");
            return 4;
        }
        completed = launched - batch;
    }
    CALL(CUresult(*)(CUstream), "cuStreamSynchronize", on);
    printf("gpu %d %ld\n", (int)getpid(), nodes * kernel_us);
    printf("done %d %ld %.6f\n", (int)getpid(), launched, now_s() - start);
    return 0;
}

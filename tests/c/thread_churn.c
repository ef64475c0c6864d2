/* Threads of one process that allocate and free at once, as a data loader
 * and a compute thread do: each of THREADS threads makes and gives back one
 * block of FAMILY, ROUNDS times.  Then the main thread fills what is left of
 * the cap in blocks and prints "filled BYTES", waits for a line on stdin,
 * frees what it filled, prints "freed", and waits for end of input.  The
 * region must then say exactly what is held: the filled bytes, then none.
 * Graph memory stays in the device's graph pool until it is trimmed, which
 * the main thread does before it fills.
 *     thread_churn pointer|pitch|managed|array|mipmap|vmm|pool|graph THREADS ROUNDS BLOCK_MIB */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult cuArrayDestroy(CUarray array);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray array);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params);
CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                               CUdeviceptr dptr);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuDeviceGraphMemTrim(CUdevice device);

static const char *family;
static int rounds;
static size_t block;
static CUcontext ctx;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "%s: %s failed: %d\n", family, #call, (int)rc_);                       \
            exit(4);                                                                               \
        }                                                                                          \
    } while (0)

/* One block of the family made and given back. */
static void churn_once(void)
{
    if (strcmp(family, "pointer") == 0) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, block));
        CHECK(cuMemFree_v2(p));
    } else if (strcmp(family, "pitch") == 0) {
        CUdeviceptr p;
        size_t pitch;
        CHECK(cuMemAllocPitch_v2(&p, &pitch, 1 << 20, block >> 20, 4));
        CHECK(cuMemFree_v2(p));
    } else if (strcmp(family, "managed") == 0) {
        CUdeviceptr p;
        CHECK(cuMemAllocManaged(&p, block, CU_MEM_ATTACH_GLOBAL));
        CHECK(cuMemFree_v2(p));
    } else if (strcmp(family, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR desc = {.Width = 1024, .Height = block / 4096, .Format = CU_AD_FORMAT_FLOAT,
                                      .NumChannels = 1};
        CUarray a;
        CHECK(cuArrayCreate_v2(&a, &desc));
        CHECK(cuArrayDestroy(a));
    } else if (strcmp(family, "mipmap") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = 1024, .Height = block / 4096, .Format = CU_AD_FORMAT_FLOAT,
                                        .NumChannels = 1};
        CUmipmappedArray a;
        CHECK(cuMipmappedArrayCreate(&a, &desc, 1));
        CHECK(cuMipmappedArrayDestroy(a));
    } else if (strcmp(family, "vmm") == 0) {
        /* As CUDA's vectorAddMMAP sample: the handle is released as soon as
         * it is mapped; the memory lives until it is unmapped. */
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        CHECK(cuMemCreate(&h, block, &prop, 0));
        CHECK(cuMemAddressReserve(&va, block, 0, 0, 0));
        CHECK(cuMemMap(va, block, 0, h, 0));
        CHECK(cuMemRelease(h));
        CHECK(cuMemSetAccess(va, block, &access, 1));
        CHECK(cuMemUnmap(va, block));
        CHECK(cuMemAddressFree(va, block));
    } else if (strcmp(family, "pool") == 0) {
        /* A pool per use, as a library that keeps its allocations apart does. */
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemoryPool pool;
        CUdeviceptr p;
        CHECK(cuMemPoolCreate(&pool, &props));
        CHECK(cuMemAllocFromPoolAsync(&p, block, pool, NULL));
        CHECK(cuMemFreeAsync(p, NULL));
        CHECK(cuStreamSynchronize(NULL));
        CHECK(cuMemPoolDestroy(pool));
    } else if (strcmp(family, "graph") == 0) {
        /* A graph that allocates and frees, made, launched and destroyed. */
        CUDA_MEM_ALLOC_NODE_PARAMS params = {
            .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}},
            .bytesize = block};
        CUgraph graph;
        CUgraphNode alloc, release;
        CUgraphExec exec;
        CHECK(cuGraphCreate(&graph, 0));
        CHECK(cuGraphAddMemAllocNode(&alloc, graph, NULL, 0, &params));
        CHECK(cuGraphAddMemFreeNode(&release, graph, &alloc, 1, params.dptr));
        CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
        CHECK(cuGraphLaunch(exec, NULL));
        CHECK(cuStreamSynchronize(NULL));
        CHECK(cuGraphExecDestroy(exec));
        CHECK(cuGraphDestroy(graph));
    } else {
        fprintf(stderr, "unknown family %s\n", family);
        exit(2);
    }
}

static pthread_barrier_t start;

static void *churn(void *arg)
{
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx));
    pthread_barrier_wait(&start);
    for (int r = 0; r < rounds; r++)
        churn_once();
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
    if (argc != 5)
        return 2;
    family = argv[1];
    int threads = atoi(argv[2]);
    rounds = atoi(argv[3]);
    block = (size_t)atoi(argv[4]) << 20;
    CUdevice dev;
    if (threads < 1 || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx))
        return 3;
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    if (strcmp(family, "graph") == 0)
        CHECK(cuDeviceGraphMemTrim(dev));

    enum { MAX_HELD = 4096 };
    static CUdeviceptr held[MAX_HELD];
    int n = 0;
    while (n < MAX_HELD && cuMemAlloc_v2(&held[n], block) == CUDA_SUCCESS)
        n++;
    printf("filled %zu\n", (size_t)n * block);
    fflush(stdout);
    wait_for_line();
    while (n > 0)
        CHECK(cuMemFree_v2(held[--n]));
    printf("freed\n");
    fflush(stdout);
    wait_for_line();
    free(t);
    return 0;
}

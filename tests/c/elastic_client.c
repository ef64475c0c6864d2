/* A CUDA client driven line by line on stdin, so that a test can step
 * several containers in turn: it allocates, frees and keeps a cache of
 * blocks as PyTorch's caching allocator does (a block freed by the program
 * stays allocated, cached; an allocation the driver refuses frees every
 * cached block and is tried once more).
 *
 * Commands, one per line; each answers one line on stdout, flushed:
 *   alloc BYTES     cuMemAlloc_v2        -> "alloc ID RC NS" (ID: the block's number, -1 if refused;
 *                                           NS: when it returned, CLOCK_MONOTONIC)
 *   cache BYTES     a cached block of BYTES if there is one; else as alloc, but on a refusal the
 *                   cache is freed and it is tried again
 *                                        -> "cache ID RC FREED" (FREED: cached blocks freed for it)
 *   uncache ID      the program is done with block ID: it goes to the cache -> "uncache ID"
 *   free ID         cuMemFree_v2 of block ID       -> "free ID RC NS" (NS: when it was called)
 *   empty           frees every cached block       -> "empty N"
 *   meminfo         cuMemGetInfo_v2                -> "meminfo FREE TOTAL RC"
 *   total           cuDeviceTotalMem_v2            -> "total BYTES"
 *   now             -> "now NS"
 *   launch US       one kernel of US microseconds (simgpu's spin_usUS), waited for -> "launch RC"
 *   exit            frees nothing (the process's memory goes with it) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);
CUresult cuCtxSynchronize(void);

enum { MAX_BLOCKS = 4096 };

static struct {
    CUdeviceptr ptr; /* 0: none */
    size_t bytes;
    int cached;
} blocks[MAX_BLOCKS];

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static int keep(CUdeviceptr ptr, size_t bytes)
{
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (!blocks[i].ptr) {
            blocks[i].ptr = ptr;
            blocks[i].bytes = bytes;
            blocks[i].cached = 0;
            return i;
        }
    fprintf(stderr, "elastic_client: more than %d blocks\n", MAX_BLOCKS);
    exit(3);
}

static int empty_cache(void)
{
    int n = 0;
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].ptr && blocks[i].cached && cuMemFree_v2(blocks[i].ptr) == CUDA_SUCCESS) {
            blocks[i].ptr = 0;
            n++;
        }
    return n;
}

/* A cached block of `bytes`, taken out of the cache: its id, or -1. */
static int reuse(size_t bytes)
{
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].ptr && blocks[i].cached && blocks[i].bytes == bytes) {
            blocks[i].cached = 0;
            return i;
        }
    return -1;
}

static int valid(long id) { return id >= 0 && id < MAX_BLOCKS && blocks[id].ptr; }

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "elastic_client: no CUDA device\n");
        return 2;
    }
    printf("ready\n");
    fflush(stdout);
    char line[256], cmd[32];
    while (fgets(line, sizeof line, stdin)) {
        long long arg = 0;
        int fields = sscanf(line, "%31s %lld", cmd, &arg);
        if (fields < 1)
            continue;
        int cached = strcmp(cmd, "cache") == 0 ? reuse((size_t)arg) : -1;
        if (cached >= 0) {
            printf("cache %d 0 0\n", cached);
        } else if (strcmp(cmd, "alloc") == 0 || strcmp(cmd, "cache") == 0) {
            CUdeviceptr ptr = 0;
            CUresult rc = cuMemAlloc_v2(&ptr, (size_t)arg);
            int freed = 0;
            if (rc == CUDA_ERROR_OUT_OF_MEMORY && cmd[0] == 'c' && (freed = empty_cache()) > 0)
                rc = cuMemAlloc_v2(&ptr, (size_t)arg);
            int id = rc == CUDA_SUCCESS ? keep(ptr, (size_t)arg) : -1;
            if (cmd[0] == 'a')
                printf("alloc %d %d %llu\n", id, (int)rc, now_ns());
            else
                printf("cache %d %d %d\n", id, (int)rc, freed);
        } else if (strcmp(cmd, "uncache") == 0 && valid(arg)) {
            blocks[arg].cached = 1;
            printf("uncache %lld\n", arg);
        } else if (strcmp(cmd, "free") == 0 && valid(arg)) {
            unsigned long long at = now_ns();
            CUresult rc = cuMemFree_v2(blocks[arg].ptr);
            if (rc == CUDA_SUCCESS)
                blocks[arg].ptr = 0;
            printf("free %lld %d %llu\n", arg, (int)rc, at);
        } else if (strcmp(cmd, "empty") == 0) {
            printf("empty %d\n", empty_cache());
        } else if (strcmp(cmd, "meminfo") == 0) {
            size_t free = 0, total = 0;
            CUresult rc = cuMemGetInfo_v2(&free, &total);
            printf("meminfo %zu %zu %d\n", free, total, (int)rc);
        } else if (strcmp(cmd, "total") == 0) {
            size_t total = 0;
            cuDeviceTotalMem_v2(&total, dev);
            printf("total %zu\n", total);
        } else if (strcmp(cmd, "launch") == 0) {
            char name[64];
            snprintf(name, sizeof name, "spin_us%lld", arg);
            CUmodule module;
            CUfunction kernel;
            CUresult rc = cuModuleLoadData(&module, "elastic_client");
            if (rc == CUDA_SUCCESS)
                rc = cuModuleGetFunction(&kernel, module, name);
            if (rc == CUDA_SUCCESS)
                rc = cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            if (rc == CUDA_SUCCESS)
                rc = cuCtxSynchronize();
            printf("launch %d\n", (int)rc);
        } else if (strcmp(cmd, "now") == 0) {
            printf("now %llu\n", now_ns());
        } else if (strcmp(cmd, "exit") == 0) {
            break;
        } else {
            printf("error %s", line);
        }
        fflush(stdout);
    }
    return 0;
}

/* A program under tests/c/memory_saver.c, as PyTorch runs under SGLang's
 * torch_memory_saver: it calls cudaMalloc (found in the preloaded library)
 * and pauses and resumes through it, one command per stdin line:
 *   malloc MIB | pause | resume | info  ->  "ok [..]" or "err N" */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);

int main(void)
{
    int (*malloc_fn)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cudaMalloc");
    int (*pause_fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memory_saver_pause");
    int (*resume_fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memory_saver_resume");
    CUdevice dev;
    CUcontext ctx;
    if (!malloc_fn || !pause_fn || !resume_fn || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("err setup\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        int rc;
        if (!strncmp(line, "malloc ", 7)) {
            void *p;
            rc = malloc_fn(&p, strtoull(line + 7, NULL, 10) << 20);
        } else if (!strncmp(line, "pause", 5)) {
            rc = pause_fn();
        } else if (!strncmp(line, "resume", 6)) {
            rc = resume_fn();
        } else {
            size_t free_bytes = 0, total = 0;
            rc = (int)cuMemGetInfo_v2(&free_bytes, &total);
            if (!rc) {
                printf("ok %zu %zu\n", free_bytes, total);
                continue;
            }
        }
        if (rc)
            printf("err %d\n", rc);
        else
            printf("ok\n");
    }
    return 0;
}

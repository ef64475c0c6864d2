/* One of several processes racing for the last bytes of a cap: ROUNDS rounds
 * of allocating a random 1-128 MiB block (up to 32 held) and freeing a random
 * one, once START_FILE exists (so that all racers start together).
 * Prints "granted N refused M".
 *     racer ROUNDS SEED START_FILE */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    int rounds = atoi(argv[1]);
    srand((unsigned)atoi(argv[2]));
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    while (access(argv[3], F_OK) != 0)
        usleep(100);
    CUdeviceptr held[32];
    int n = 0, granted = 0, refused = 0;
    for (int r = 0; r < rounds; r++) {
        if (n < 32) {
            CUresult rc = cuMemAlloc_v2(&held[n], (size_t)(rand() % 128 + 1) << 20);
            if (rc == CUDA_SUCCESS) {
                n++;
                granted++;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                refused++;
            } else {
                return 4;
            }
        }
        if (n > 0 && rand() % 3 == 0) {
            int i = rand() % n;
            if (cuMemFree_v2(held[i]) != CUDA_SUCCESS)
                return 5;
            held[i] = held[--n];
        }
    }
    while (n > 0)
        cuMemFree_v2(held[--n]);
    printf("granted %d refused %d\n", granted, refused);
    return 0;
}

/* cuMemGetInfo with NULL for free, total or both, as a careless client calls
 * it.  Prints the driver's answer for each, so a run through the shim can be
 * compared with a run without it: same results, and no crash. */
#include <stdio.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 3;
    size_t free_bytes = 0, total_bytes = 0;
    CUresult rc = cuMemGetInfo_v2(NULL, &total_bytes);
    printf("free-null %d %zu\n", rc, total_bytes);
    rc = cuMemGetInfo_v2(&free_bytes, NULL);
    printf("total-null %d %zu\n", rc, free_bytes);
    printf("both-null %d\n", cuMemGetInfo_v2(NULL, NULL));
    return 0;
}

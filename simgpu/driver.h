/* simgpu's libcuda.so.1: the driver entry points it exports, and the internals
 * its files share.
 *
 * Every exported function is declared here with its cuda.h signature, and is
 * listed in driver_api.def with the CUDA version that introduced it; procaddr.c
 * takes each one's address from that list, so a name in the table that is not
 * declared (and defined) here does not build. */
#ifndef SIMGPU_DRIVER_H
#define SIMGPU_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"
#include "vgpulimit/cuda_abi.h"

/* Parameter types simgpu accepts but does not read; tags as in cuda.h (C11
 * allows the identical typedef to appear again if cuda_abi.h gains them). */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* The special stream handles of cuda.h. */
#define SIM_STREAM_LEGACY ((CUstream)0x1)
#define SIM_STREAM_PER_THREAD ((CUstream)0x2)

/* ---- driver.c: the exported driver API --------------------------------------- */

SIM_EXPORT CUresult cuInit(unsigned int Flags);
SIM_EXPORT CUresult cuDriverGetVersion(int *driverVersion);
SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr);
SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr);

SIM_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal);
SIM_EXPORT CUresult cuDeviceGetCount(int *count);
SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);

SIM_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                   unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                   CUdevice dev);
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx);
SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *device);
SIM_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
SIM_EXPORT CUresult cuCtxSynchronize(void);
SIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx);

SIM_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname);
SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image);
SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod);
SIM_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra);
SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams, void **extra);

SIM_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
SIM_EXPORT CUresult cuStreamDestroy(CUstream hStream);
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream);

/* ---- memory.c: device memory --------------------------------------------------- */

SIM_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
SIM_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
SIM_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                    unsigned int Height, unsigned int ElementSizeBytes);
SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes);
SIM_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr);
SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);

SIM_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);

SIM_EXPORT CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N);
SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
SIM_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
SIM_EXPORT CUresult cuMemsetD32(CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N);
SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
SIM_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);

/* ---- procaddr.c: entry points by name -------------------------------------------- */

SIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
SIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus);

/* ---- hidden internals ------------------------------------------------------------ */

/* A context.  Never freed: a destroyed one stays readable (alive == false), so a
 * stale handle on some thread's stack is an error, not a use after free. */
struct CUctx_st {
    uint32_t magic;
    uint32_t device;
    bool primary;
    bool alive;
    unsigned int flags;
    unsigned int generation;        /* the process generation it was made in (fork) */
};

/* driver.c */
/* The current context for a call that needs one: CUDA_SUCCESS, or
 * NOT_INITIALIZED / INVALID_CONTEXT / CONTEXT_IS_DESTROYED. */
CUresult sim_current_context(CUcontext *out);

/* memory.c */
/* Frees every allocation made in `ctx` (a destroyed or reset context).  Takes
 * the memory mutex: callers holding driver.c's mutex take it first. */
void sim_mem_release_context(CUcontext ctx);
/* Fork handlers, called by driver.c's after its own mutex (the lock order). */
void sim_mem_atfork_prepare(void);
void sim_mem_atfork_parent(void);
/* The child forgets every allocation without freeing it: they are its parent's. */
void sim_mem_atfork_child(void);

#endif

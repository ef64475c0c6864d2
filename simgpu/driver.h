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

/* cuda.h's kernel node parameters (graphs). */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;                  /* launched when func is NULL */
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

/* The special stream handles of cuda.h. */
#define SIM_STREAM_LEGACY ((CUstream)0x1)
#define SIM_STREAM_PER_THREAD ((CUstream)0x2)

/* ---- init.c: initialisation ------------------------------------------------------ */

SIM_EXPORT CUresult cuInit(unsigned int Flags);
SIM_EXPORT CUresult cuDriverGetVersion(int *driverVersion);

/* ---- errors.c: error names ----------------------------------------------------------- */

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr);
SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr);

/* ---- devices.c: devices -------------------------------------------------------------- */

SIM_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal);
SIM_EXPORT CUresult cuDeviceGetCount(int *count);
SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);

/* ---- contexts.c: contexts ------------------------------------------------------------ */

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);

SIM_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                   unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                   CUdevice dev);
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

/* ---- context_teardown.c: the ends of contexts ------------------------------------- */

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx);
SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);

/* ---- peer_access.c: peer access between devices ------------------------------------ */

SIM_EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
SIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
SIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext);

/* ---- modules.c: modules, libraries, kernels ------------------------------------ */

SIM_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname);
SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image);
SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod);
SIM_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
SIM_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                      void **jitOptionsValues, unsigned int numJitOptions,
                                      CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                      unsigned int numLibraryOptions);
SIM_EXPORT CUresult cuLibraryUnload(CUlibrary library);
SIM_EXPORT CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library);
SIM_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
SIM_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);

/* ---- kernel_attributes.c: what a kernel reports of itself ----------------------------- */

SIM_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
SIM_EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev);

/* ---- launches.c, streams.c, events.c, capture.c, graphs.c: work on a device ------- */

SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra);
SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams, void **extra);
SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                     void **extra);
SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                          void **extra);
SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                              unsigned int gridDimZ, unsigned int blockDimX,
                                              unsigned int blockDimY, unsigned int blockDimZ,
                                              unsigned int sharedMemBytes, CUstream hStream,
                                              void **kernelParams);
SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                   unsigned int gridDimZ, unsigned int blockDimX,
                                                   unsigned int blockDimY, unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void **kernelParams);

SIM_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
SIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
SIM_EXPORT CUresult cuStreamDestroy(CUstream hStream);
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream);
SIM_EXPORT CUresult cuStreamQuery(CUstream hStream);
SIM_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream);
SIM_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
SIM_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
SIM_EXPORT CUresult cuStreamBeginCapture(CUstream hStream);
SIM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
SIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
SIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
SIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
SIM_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);

SIM_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
SIM_EXPORT CUresult cuEventDestroy(CUevent hEvent);
SIM_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent);
SIM_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
SIM_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
SIM_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
SIM_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
SIM_EXPORT CUresult cuEventQuery(CUevent hEvent);
SIM_EXPORT CUresult cuEventSynchronize(CUevent hEvent);
SIM_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
SIM_EXPORT CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);

SIM_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
SIM_EXPORT CUresult cuGraphDestroy(CUgraph hGraph);
SIM_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                         size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams);
SIM_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                            const CUgraphNode *dependencies, size_t numDependencies,
                                            const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams);
SIM_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize);
SIM_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                          char *logBuffer, size_t bufferSize);
SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                unsigned long long flags);
SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
SIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                           const CUgraphNode *dependencies, size_t numDependencies,
                                           CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
SIM_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out);
SIM_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies, size_t numDependencies,
                                          CUdeviceptr dptr);

/* ---- graph_memory.c: the graph memory pool ------------------------------------------ */

SIM_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device);
SIM_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value);
SIM_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value);

/* ---- memory.c: device memory --------------------------------------------------- */

SIM_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
SIM_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
SIM_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                    unsigned int Height, unsigned int ElementSizeBytes);
SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes);
SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);

/* ---- frees.c: frees of device memory by address ------------------------------------ */

SIM_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr);
SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* ---- host_memory.c: page-locked host memory -------------------------------------- */

SIM_EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize);
SIM_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
SIM_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
SIM_EXPORT CUresult cuMemFreeHost(void *p);
SIM_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags);
SIM_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
SIM_EXPORT CUresult cuMemHostUnregister(void *p);
SIM_EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags);
SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
SIM_EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p);

/* ---- copies.c: copies and memsets ------------------------------------------------ */

SIM_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
SIM_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
SIM_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount,
                                      CUstream hStream);
SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                         CUstream hStream);
SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                              CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
                                      CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
SIM_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
                                      CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                         CUstream hStream);
SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream);

SIM_EXPORT CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N);
SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
SIM_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
SIM_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
SIM_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
SIM_EXPORT CUresult cuMemsetD16(CUdeviceptr_v1 dstDevice, unsigned short us, unsigned int N);
SIM_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N);
SIM_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
SIM_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
SIM_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
SIM_EXPORT CUresult cuMemsetD32(CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N);
SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
SIM_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
SIM_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
SIM_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);

/* ---- pools.c: stream-ordered allocation and memory pools -------------------------- */

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream hStream);
SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream);
SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool);
SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
SIM_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                     CUmemAllocationHandleType handleType, unsigned long long flags);
SIM_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                       CUmemAllocationHandleType handleType, unsigned long long flags);
SIM_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr);
SIM_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData *shareData);

/* ---- ipc.c: legacy interprocess memory --------------------------------------------- */

SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
SIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
SIM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
SIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
/* events.c */
SIM_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event);
SIM_EXPORT CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle);

/* ---- vmm.c: virtual memory management ------------------------------------------------ */

SIM_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option);
SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags);
SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
SIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                           CUmemGenericAllocationHandle handle);
SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                        unsigned long long flags);
SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                             unsigned long long flags);
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
SIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType handleType, unsigned long long flags);
SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                   CUmemAllocationHandleType shHandleType);

/* ---- arrays.c: CUDA arrays and mipmapped arrays --------------------------------------- */

SIM_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray);
SIM_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray);
SIM_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
SIM_EXPORT CUresult cuArrayDestroy(CUarray hArray);
SIM_EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *pArrayDescriptor, CUarray hArray);
SIM_EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *pArrayDescriptor, CUarray hArray);
SIM_EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUarray array,
                                                 CUdevice device);
SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                           const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                           unsigned int numMipmapLevels);
SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
SIM_EXPORT CUresult cuMipmappedArrayGetLevel(CUarray *pLevelArray, CUmipmappedArray hMipmappedArray,
                                             unsigned int level);
SIM_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements,
                                                          CUmipmappedArray mipmap, CUdevice device);

/* ---- checkpoint.c: the checkpoint API ------------------------------------------------ */

SIM_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);
SIM_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state);
SIM_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
SIM_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
SIM_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
SIM_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);

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
    uint64_t last_work;             /* the ticket of its last work, on any stream (atomic; timeline.c) */
    uint64_t legacy_last_work;      /* that of its legacy default stream's last work (atomic) */
    uint32_t npeers;
    CUcontext peers[8];             /* contexts whose memory it may reach (cuCtxEnablePeerAccess) */
    /* What the driver takes for it after it is made (modules.c; under its mutex). */
    unsigned int activation;        /* bumped each time it is made alive: modules loaded before are gone */
    uint64_t code_bytes;            /* the code of the modules loaded into it */
    uint64_t code_charged;          /* code_bytes in whole granules, charged to the process */
    uint64_t local_charged;         /* its local-memory pool, charged to the process */
};

/* instruments.c */
/* Whether SIMGPU_CALLS asks for the count of calls (set once, at load). */
extern bool sim_counting;
/* Counts a call of the entry point `name` (its __func__) made from `return_address`. */
void sim_count_call(const char *name, const void *return_address);
/* checkpoint.c: while a checkpoint holds the process LOCKED, its calls wait.
 * The outermost entry point of a thread counts itself in while it runs, so
 * that a lock waits for the calls in progress. */
int sim_call_enter(void);
void sim_call_leave(int *entered);
/* Starts this process's checkpoint thread (once per process generation):
 * cuInit's. */
void sim_checkpoint_thread_start(void);

/* The first statement of every entry point of driver_api.def. */
#define SIM_CALLED()                                                                 \
    __attribute__((cleanup(sim_call_leave))) int sim_called_ = sim_call_enter();     \
    do {                                                                             \
        if (__atomic_load_n(&sim_counting, __ATOMIC_RELAXED))                        \
            sim_count_call(__func__, __builtin_return_address(0));                  \
    } while (0)

/* Whether SIMGPU_FAIL names the entry point `name` (its __func__): it then
 * fails with CUDA_ERROR_UNKNOWN, to test how callers take a failing driver.
 * Only the entry points that ask answer to it (cuStreamIsCapturing; in a
 * checkpoint target, cuCheckpointProcessRestore). */
bool sim_failing(const char *name);

/* initialized.c */
/* Whether cuInit has succeeded (in this process generation). */
bool sim_initialized(void);
/* The configuration cuInit read; only once sim_initialized(). */
const struct sim_config *sim_driver_config(void);
/* For init.c alone, under its mutex: what cuInit found, and (false) the child
 * of a fork. */
void sim_set_initialized(bool initialized);
void sim_set_driver_config(const struct sim_config *cfg);

/* devices.c */
/* For cuInit: CUDA's numbering of the devices, from CUDA_VISIBLE_DEVICES and
 * CUDA_DEVICE_ORDER; CUDA_ERROR_NO_DEVICE when they leave none. */
CUresult sim_devices_enumerate(const struct sim_config *cfg);
/* CUDA_SUCCESS for a device of the configuration, else NOT_INITIALIZED / INVALID_DEVICE. */
CUresult sim_check_device(CUdevice dev);
/* The same, and the machine's index of CUDA's ordinal `dev` (what the state
 * file, the timelines and a context's `device` count in). */
CUresult sim_device_index(CUdevice dev, uint32_t *index);
/* CUDA's ordinal of the machine's device `index`; -1: not visible. */
CUdevice sim_device_ordinal(uint32_t index);

/* contexts.c */
/* The last work of each live context of this process (those that have
 * submitted any): up to `max` into `out`, and how many. */
struct sim_ctx_work {
    uint32_t device;
    uint64_t ticket;
    CUcontext ctx;
};
size_t sim_contexts_work(struct sim_ctx_work *out, size_t max);
/* The current context for a call that needs one: CUDA_SUCCESS, or
 * NOT_INITIALIZED / INVALID_CONTEXT / CONTEXT_IS_DESTROYED. */
CUresult sim_current_context(CUcontext *out);
/* Whether `ctx` is a handle of this process that a call may make current, or
 * (live) one that a call may act on by name; contexts.c says what each refuses. */
CUresult sim_check_context(CUcontext ctx);
CUresult sim_check_live_context(CUcontext ctx);
/* contexts.c's mutex, which also guards a context's peers (peer_access.c); in
 * the lock order after init.c's mutex and before the memory mutex. */
void sim_contexts_lock(void);
void sim_contexts_unlock(void);
/* Fork handlers, called by init.c's after its own mutex and before the
 * memory mutex (the lock order).  The child has no context. */
void sim_contexts_atfork_prepare(void);
void sim_contexts_atfork_parent(void);
void sim_contexts_atfork_child(void);
/* For context_teardown.c, under contexts.c's mutex.  A primary context's
 * release drops one reference to it (`all`: every one, as a reset does):
 * *ended is the context when that leaves none, else NULL;
 * CUDA_ERROR_INVALID_CONTEXT for a release (not a reset) of one not retained. */
CUresult sim_primary_release(CUdevice dev, bool all, CUcontext *ended);
/* Whether `ctx` is a live created context of this process (cuCtxDestroy's). */
bool sim_context_destroyable(CUcontext ctx);
/* The two halves of a context's end, around the release of what the families
 * hold for it: from the first no call may use it (CONTEXT_IS_DESTROYED); the
 * second tells the state file when it was this process's last on its device. */
void sim_context_deactivate(CUcontext ctx);
void sim_context_retire(CUcontext ctx);
/* Takes `ctx` off this thread's stack of current contexts (no mutex). */
void sim_context_unstack(CUcontext ctx);

/* modules.c */
/* How long a launch of `f` (a CUfunction, or a CUkernel as one) runs;
 * CUDA_ERROR_INVALID_HANDLE when it is neither. */
CUresult sim_kernel_duration(CUfunction f, uint64_t *duration_ns);
/* The local memory a thread of `f` needs, in bytes (its name says; 0 else). */
uint64_t sim_kernel_local_bytes(CUfunction f);
/* Before `f` (valid: sim_kernel_duration said so) first runs in `ctx`: loads
 * its module there if it is not (lazy loading) and grows the context's local
 * memory to what `f` needs; CUDA_ERROR_OUT_OF_MEMORY when the device has not
 * that much free. */
CUresult sim_kernel_prepare(CUfunction f, CUcontext ctx);
/* Gives back what the driver took for `ctx` (module code, local memory): for
 * a context being destroyed or reset, under contexts.c's mutex
 * (context_teardown.c). */
void sim_modules_release_context(CUcontext ctx);

/* graph_memory.c */
/* An alloc node's allocation (graphs.c's nodes and executables hold it). */
struct sim_graph_alloc;
/* For cuGraphAddMemAllocNode: checks `params` and reserves the allocation's
 * address; it has no holder yet (sim_graph_alloc_hold(a, 0) forgets it). */
CUresult sim_graph_alloc_new(const CUDA_MEM_ALLOC_NODE_PARAMS *params, struct sim_graph_alloc **out);
/* The parameters it was made with, its address in dptr. */
const CUDA_MEM_ALLOC_NODE_PARAMS *sim_graph_alloc_params(const struct sim_graph_alloc *a);
/* For cuGraphAddMemFreeNode: the allocation at `dptr`, with a hold taken on
 * it for the caller; NULL: none. */
struct sim_graph_alloc *sim_graph_alloc_at(CUdeviceptr dptr);
/* A memory node's step of a graph launch, in the graph's node order. */
struct sim_graph_mem_op {
    struct sim_graph_alloc *alloc;
    bool is_free;
};
/* Adds `delta` holders (graph nodes, executables) to `a`; it is forgotten when
 * none is left and its memory is not allocated.  Takes the memory mutex. */
void sim_graph_alloc_hold(struct sim_graph_alloc *a, int delta);
/* A launch's memory steps: refused whole (CUDA_ERROR_INVALID_VALUE for an
 * allocation still live or a free of one that is not, CUDA_ERROR_OUT_OF_MEMORY
 * when the graph pool cannot grow) or done whole.  `auto_free`: the
 * executable's allocations still live are freed first
 * (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH).  Takes the memory mutex. */
CUresult sim_graph_memory_run(const struct sim_graph_mem_op *ops, size_t n, bool auto_free);

/* The granularity of device memory as the simulated driver reserves it: pool
 * chunks, VMM allocations and the charge of an array are multiples of it, as
 * cuMemGetAllocationGranularity reports it (2 MiB, an H100's value). */
#define SIM_GRANULARITY ((size_t)2 << 20)

/* memory.c */
/* What an entry of memory.c's table of device memory is. */
enum sim_mem_kind {
    SIM_MEM_LINEAR,                 /* cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged: memory.c's own */
    SIM_MEM_POOL,                   /* an allocation of a memory pool (pools.c) */
    SIM_MEM_MAPPED,                 /* a virtual memory mapping that is accessible (vmm.c) */
    SIM_MEM_GRAPH,                  /* a graph allocation while live (graph_memory.c) */
    SIM_MEM_IPC,                    /* another process's allocation, opened by cuIpcOpenMemHandle: memory.c's */
};
/* An entry of memory.c's table. */
struct sim_mem_entry {
    uintptr_t base;
    size_t size;                    /* as asked for (and charged, for SIM_MEM_LINEAR) */
    size_t map_size;                /* whole pages (SIM_MEM_LINEAR) */
    CUcontext ctx;                  /* the context it was made in; NULL unless SIM_MEM_LINEAR */
    enum sim_mem_kind kind;
    void *owner;                    /* a SIM_MEM_POOL entry's pool chunk, a SIM_MEM_GRAPH one's allocation */
    struct sim_shared_ref *shared;  /* SIM_MEM_LINEAR once exported by cuIpcGetMemHandle, and SIM_MEM_IPC */
    unsigned int opens;             /* SIM_MEM_IPC: cuIpcOpenMemHandle's count */
    bool managed;                   /* cuMemAllocManaged's */
};
/* Whether a checkpoint may take this process's memory: 0; -EFAULT with
 * managed memory, -EXDEV with memory shared with other processes (IPC). */
int sim_mem_checkpointable(void);
/* CUDA_SUCCESS once cuInit has succeeded, else CUDA_ERROR_NOT_INITIALIZED: for
 * the calls that need no current context. */
CUresult sim_mem_initialized(void);
/* The device of a CU_MEM_LOCATION_TYPE_DEVICE location.  Host locations are
 * CUDA_ERROR_NOT_SUPPORTED: simgpu simulates device memory only. */
CUresult sim_mem_location(const CUmemLocation *location, uint32_t *device);
/* Under the memory mutex: frees every cuMemAlloc* allocation made in `ctx` (a
 * destroyed or reset context; context_teardown.c, which holds contexts.c's
 * mutex, as the lock order has it). */
void sim_mem_release_context(CUcontext ctx);
/* The memory mutex, which also guards the state of pools.c, vmm.c and arrays.c.
 * Never held while taking init.c's or contexts.c's mutex. */
void sim_mem_lock(void);
void sim_mem_unlock(void);
/* Under the memory mutex: makes [base, base + size) device memory that copies
 * and memsets may use (it must overlap no entry).  The caller keeps the bytes
 * and the charge; `owner` is the pool chunk of a SIM_MEM_POOL entry, handed
 * back to sim_pool_free, or the allocation of a SIM_MEM_GRAPH one.  false: no memory for the table. */
bool sim_mem_track(uintptr_t base, size_t size, enum sim_mem_kind kind, void *owner);
/* Whether `addr` lies in one of this process's device allocations. */
bool sim_mem_device(uintptr_t addr);
/* Whether [addr, addr + n) (n > 0) lies in one device allocation, or in
 * virtual memory mappings that follow each other. */
bool sim_mem_device_range(uintptr_t addr, size_t n);
/* Under the memory mutex: a copy of the entry whose base is `base`; false: none. */
bool sim_mem_entry_at(uintptr_t base, struct sim_mem_entry *out);
/* Under the memory mutex: forgets the entry at `base`. */
void sim_mem_untrack(uintptr_t base);
/* Under the memory mutex, for frees.c: removes the entry whose base is `base`,
 * unless it is a virtual memory mapping's, into *out; false: there is none.
 * The entry's family then takes it back: pools.c's sim_pool_free and
 * graph_memory.c's sim_graph_memory_free under the mutex, sim_mem_unmap a
 * SIM_MEM_LINEAR entry's after it. */
bool sim_mem_take(uintptr_t base, struct sim_mem_entry *out);
/* Gives a SIM_MEM_LINEAR or SIM_MEM_IPC entry's pages and charge (or hold on
 * a shared allocation) back (no mutex). */
void sim_mem_unmap(const struct sim_mem_entry *entry);
/* Legacy IPC (ipc.c): the cuMemAlloc allocation whose base is `dptr` made a
 * shared allocation, if it is not yet, and its id. */
CUresult sim_mem_share(uintptr_t dptr, uint64_t *id);
/* Maps shared allocation `id` in `ctx`, or counts one more open of it. */
CUresult sim_mem_ipc_open(CUcontext ctx, uint64_t id, uintptr_t *out);
/* One open fewer of what sim_mem_ipc_open mapped at `dptr`; unmapped at the last. */
CUresult sim_mem_ipc_close(uintptr_t dptr);
/* Fork handlers, called by init.c's after its own and contexts.c's mutexes (the lock order). */
void sim_mem_atfork_prepare(void);
void sim_mem_atfork_parent(void);
/* The child forgets every allocation without freeing it: they are its parent's.
 * So do pools.c, graph_memory.c, vmm.c and arrays.c, through their forget
 * functions, which init.c's handler calls first, under the memory mutex. */
void sim_mem_atfork_child(void);

/* host_memory.c */
/* Whether [addr, addr + n) lies in one page-locked range of host memory. */
bool sim_host_pinned(uintptr_t addr, size_t n);

/* pools.c */
/* What a stream-ordered call on `stream` needs: a current context for a
 * default stream (cuda.h: CUDA_ERROR_INVALID_CONTEXT), an initialised driver
 * for any other. */
CUresult sim_pool_stream_ready(CUstream stream);
/* Under the memory mutex: returns a pool allocation to the pool that owns `chunk`. */
void sim_pool_free(void *chunk, uintptr_t base);
/* Under the memory mutex, in the child of a fork: forgets every pool without
 * releasing its memory. */
void sim_pools_forget(void);

/* graph_memory.c (under the memory mutex) */
/* Returns a graph allocation (`owner` of its entry) to the graph pool. */
void sim_graph_memory_free(void *owner);
/* In the child of a fork: the graph allocations and pool are the parent's. */
void sim_graph_memory_forget(void);

/* vmm.c (under the memory mutex) */
/* In the child of a fork: forgets every handle, reservation and mapping. */
void sim_vmm_forget(void);

/* arrays.c (under the memory mutex) */
/* Destroys the arrays and mipmapped arrays made in `ctx` (context_teardown.c). */
void sim_arrays_release_context(CUcontext ctx);
/* In the child of a fork: forgets every array without returning its bytes. */
void sim_arrays_forget(void);

#endif

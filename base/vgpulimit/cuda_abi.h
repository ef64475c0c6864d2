/* The slice of the CUDA driver ABI that vgpulimit's shim and simulated GPU use.
 *
 * We declare it ourselves so that neither needs the CUDA toolkit to build.  Every
 * constant is listed once, in an X-macro, so that tests/c/check_cuda_abi.c can
 * compare each one with the toolkit's cuda.h when that header is present.  The
 * types follow cuda.h's names so that the hook declarations can be checked
 * against cuda.h's prototypes by the compiler. */
#ifndef VGPULIMIT_CUDA_ABI_H
#define VGPULIMIT_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#define VGL_CU_RESULTS(X)                          \
    X(CUDA_SUCCESS, 0)                             \
    X(CUDA_ERROR_INVALID_VALUE, 1)                 \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2)                 \
    X(CUDA_ERROR_NOT_INITIALIZED, 3)               \
    X(CUDA_ERROR_DEINITIALIZED, 4)                 \
    X(CUDA_ERROR_STUB_LIBRARY, 34)                 \
    X(CUDA_ERROR_NO_DEVICE, 100)                   \
    X(CUDA_ERROR_INVALID_DEVICE, 101)              \
    X(CUDA_ERROR_INVALID_IMAGE, 200)               \
    X(CUDA_ERROR_INVALID_CONTEXT, 201)             \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209)           \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, 217)     \
    X(CUDA_ERROR_INVALID_PTX, 218)                 \
    X(CUDA_ERROR_INVALID_SOURCE, 300)              \
    X(CUDA_ERROR_FILE_NOT_FOUND, 301)              \
    X(CUDA_ERROR_OPERATING_SYSTEM, 304)            \
    X(CUDA_ERROR_INVALID_HANDLE, 400)              \
    X(CUDA_ERROR_ILLEGAL_STATE, 401)               \
    X(CUDA_ERROR_NOT_FOUND, 500)                   \
    X(CUDA_ERROR_NOT_READY, 600)                   \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, 700)             \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701)     \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, 704) \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, 705)     \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708)      \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709)        \
    X(CUDA_ERROR_TOO_MANY_PEERS, 711)              \
    X(CUDA_ERROR_LAUNCH_FAILED, 719)               \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712) \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713)  \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720) \
    X(CUDA_ERROR_NOT_PERMITTED, 800)               \
    X(CUDA_ERROR_NOT_SUPPORTED, 801)               \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900)  \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901)  \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903)    \
    X(CUDA_ERROR_CAPTURED_EVENT, 907)              \
    X(CUDA_ERROR_UNKNOWN, 999)

/* Other enum constants the shim or simgpu use (flags, query results, attributes). */
#define VGL_CU_CONSTANTS(X)                                         \
    X(CU_GET_PROC_ADDRESS_DEFAULT, 0)                               \
    X(CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1)                         \
    X(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2)             \
    X(CU_GET_PROC_ADDRESS_SUCCESS, 0)                               \
    X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, 1)                      \
    X(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, 2)                \
    X(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1)                 \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 2)                       \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 3)                       \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 4)                       \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 5)                        \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 6)                        \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 7)                        \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 8)           \
    X(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 9)                 \
    X(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 10)                            \
    X(CU_DEVICE_ATTRIBUTE_MAX_PITCH, 11)                            \
    X(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 12)              \
    X(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 13)                           \
    X(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 14)                    \
    X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 16)                 \
    X(CU_DEVICE_ATTRIBUTE_INTEGRATED, 18)                           \
    X(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 19)                  \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 20)                         \
    X(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 31)                   \
    X(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 32)                          \
    X(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 33)                           \
    X(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 34)                        \
    X(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 36)                    \
    X(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 37)               \
    X(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 38)                        \
    X(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 39)       \
    X(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 40)                   \
    X(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 41)                   \
    X(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 50)                        \
    X(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 51)              \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75)             \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76)             \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 81) \
    X(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 82)     \
    X(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 83)                       \
    X(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 84)                      \
    X(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 89)            \
    X(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 91) \
    X(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 95)                   \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 97)    \
    X(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 99)              \
    X(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 113)   \
    X(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 115)              \
    X(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 4)                         \
    X(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 5)                      \
    X(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 6)                         \
    X(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 7)                          \
    X(CU_MEMPOOL_ATTR_USED_MEM_HIGH, 8)                             \
    X(CU_MEM_LOCATION_TYPE_DEVICE, 1)                               \
    X(CU_MEM_ALLOCATION_TYPE_PINNED, 1)                             \
    X(CU_MEM_ALLOCATION_TYPE_MANAGED, 2)                            \
    X(CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 1)           \
    X(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 2)                 \
    X(CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 3)         \
    X(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, 0)                        \
    X(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, 1)                           \
    X(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, 2)                    \
    X(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, 3)                       \
    X(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, 1)           \
    X(CU_MEM_LOCATION_TYPE_HOST, 2)                                 \
    X(CU_MEM_LOCATION_TYPE_HOST_NUMA, 3)                            \
    X(CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 4)                    \
    X(CU_MEM_HANDLE_TYPE_NONE, 0)                                   \
    X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1)                  \
    X(CU_MEM_ACCESS_FLAGS_PROT_NONE, 0)                             \
    X(CU_MEM_ACCESS_FLAGS_PROT_READ, 1)                             \
    X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 3)                        \
    X(CU_MEM_ALLOC_GRANULARITY_MINIMUM, 0)                          \
    X(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, 1)                      \
    X(CU_MEM_ATTACH_GLOBAL, 1)                                      \
    X(CU_MEM_ATTACH_HOST, 2)                                        \
    X(CU_MEMHOSTALLOC_PORTABLE, 0x01)                               \
    X(CU_MEMHOSTALLOC_DEVICEMAP, 0x02)                              \
    X(CU_MEMHOSTALLOC_WRITECOMBINED, 0x04)                          \
    X(CU_MEMHOSTREGISTER_PORTABLE, 0x01)                            \
    X(CU_MEMHOSTREGISTER_DEVICEMAP, 0x02)                           \
    X(CU_MEMHOSTREGISTER_IOMEMORY, 0x04)                            \
    X(CU_MEMHOSTREGISTER_READ_ONLY, 0x08)                           \
    X(CU_AD_FORMAT_UNSIGNED_INT8, 0x01)                             \
    X(CU_AD_FORMAT_UNSIGNED_INT16, 0x02)                            \
    X(CU_AD_FORMAT_UNSIGNED_INT32, 0x03)                            \
    X(CU_AD_FORMAT_SIGNED_INT8, 0x08)                               \
    X(CU_AD_FORMAT_SIGNED_INT16, 0x09)                              \
    X(CU_AD_FORMAT_SIGNED_INT32, 0x0a)                              \
    X(CU_AD_FORMAT_HALF, 0x10)                                      \
    X(CU_AD_FORMAT_FLOAT, 0x20)                                     \
    X(CUDA_ARRAY3D_LAYERED, 0x01)                                   \
    X(CUDA_ARRAY3D_SURFACE_LDST, 0x02)                              \
    X(CUDA_ARRAY3D_CUBEMAP, 0x04)                                   \
    X(CUDA_ARRAY3D_TEXTURE_GATHER, 0x08)                            \
    X(CUDA_ARRAY3D_DEPTH_TEXTURE, 0x10)                             \
    X(CUDA_ARRAY3D_COLOR_ATTACHMENT, 0x20)                          \
    X(CUDA_ARRAY3D_SPARSE, 0x40)                                    \
    X(CUDA_ARRAY3D_DEFERRED_MAPPING, 0x80)                          \
    X(CU_CTX_FLAGS_MASK, 0xFF)                                      \
    X(CU_STREAM_NON_BLOCKING, 1)                                    \
    X(CU_EVENT_DEFAULT, 0)                                          \
    X(CU_EVENT_BLOCKING_SYNC, 1)                                    \
    X(CU_EVENT_DISABLE_TIMING, 2)                                   \
    X(CU_EVENT_INTERPROCESS, 4)                                     \
    X(CU_STREAM_CAPTURE_STATUS_NONE, 0)                             \
    X(CU_STREAM_CAPTURE_STATUS_ACTIVE, 1)                           \
    X(CU_STREAM_CAPTURE_MODE_GLOBAL, 0)                             \
    X(CU_STREAM_CAPTURE_MODE_RELAXED, 2)                            \
    X(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0)                   \
    X(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, 1)                       \
    X(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, 2)                        \
    X(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, 3)                        \
    X(CU_FUNC_ATTRIBUTE_NUM_REGS, 4)                                \
    X(CU_FUNC_ATTRIBUTE_PTX_VERSION, 5)                             \
    X(CU_FUNC_ATTRIBUTE_BINARY_VERSION, 6)                          \
    X(CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, 7)                           \
    X(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 8)           \
    X(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 9)       \
    X(CU_MEM_HANDLE_TYPE_FABRIC, 0x8)                               \
    X(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, 0x1)

#ifndef VGL_CHECK_AGAINST_CUDA_H
/* The toolkit-free declarations.  A check build defines VGL_CHECK_AGAINST_CUDA_H
 * and includes cuda.h first instead. */
#define VGL_ENUM_ITEM(name, value) name = value,
typedef enum cudaError_enum { VGL_CU_RESULTS(VGL_ENUM_ITEM) } CUresult;
enum { VGL_CU_CONSTANTS(VGL_ENUM_ITEM) };
#undef VGL_ENUM_ITEM

typedef uint64_t cuuint64_t;
typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;
typedef int CUdevice_attribute;
typedef unsigned int CUdeviceptr_v1;
typedef unsigned long long CUdeviceptr_v2;
typedef CUdeviceptr_v2 CUdeviceptr;
typedef int CUdriverProcAddressQueryResult;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;
/* Context creation's parameters, passed through untouched. */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* Events, graphs, libraries and launches (the compute share's paths). */
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData; /* passed through */
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef int CUfunction_attribute;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef int CUstreamCaptureMode;
typedef int CUstreamCaptureStatus;
typedef struct CUlaunchAttribute_st CUlaunchAttribute; /* read by neither */
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS; /* passed through */
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Memory pools, virtual memory management, arrays. */
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle_v1;
typedef CUmemGenericAllocationHandle_v1 CUmemGenericAllocationHandle;
typedef int CUmemPool_attribute;
typedef int CUgraphMem_attribute;
typedef int CUmemLocationType;
typedef int CUmemAllocationType;
typedef int CUmemAllocationHandleType;
typedef int CUarray_format;
typedef int CUmemAllocationGranularity_flags;
typedef int CUmemAccess_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation_v1;
typedef CUmemLocation_v1 CUmemLocation;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc_v1;
typedef CUmemAccessDesc_v1 CUmemAccessDesc;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp_v1;
typedef CUmemAllocationProp_v1 CUmemAllocationProp;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps_v1;
typedef CUmemPoolProps_v1 CUmemPoolProps;

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v1;
typedef CUDA_MEM_ALLOC_NODE_PARAMS_v1 CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle_v1;
typedef CUipcMemHandle_v1 CUipcMemHandle;

typedef struct CUipcEventHandle_st {
    char reserved[64];
} CUipcEventHandle_v1;
typedef CUipcEventHandle_v1 CUipcEventHandle;

typedef struct CUmemPoolPtrExportData_st {
    unsigned char reserved[64];
} CUmemPoolPtrExportData_v1;
typedef CUmemPoolPtrExportData_v1 CUmemPoolPtrExportData;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;
typedef CUDA_ARRAY_DESCRIPTOR_v2 CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v2;
typedef CUDA_ARRAY3D_DESCRIPTOR_v2 CUDA_ARRAY3D_DESCRIPTOR;

/* CUDA 2.x's, with 32-bit sizes (cuArrayCreate, cuArray3DCreate). */
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

typedef struct CUDA_ARRAY_MEMORY_REQUIREMENTS_st {
    size_t size;
    size_t alignment;
    unsigned int reserved[4];
} CUDA_ARRAY_MEMORY_REQUIREMENTS_v1;
typedef CUDA_ARRAY_MEMORY_REQUIREMENTS_v1 CUDA_ARRAY_MEMORY_REQUIREMENTS;

/* The checkpoint API (cuda.h, "CUDA Checkpointing", CUDA 12.8): the *Args
 * structs are mostly reserved fields that must be zero. */
typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED,
    CU_PROCESS_STATE_CHECKPOINTED,
    CU_PROCESS_STATE_FAILED,
} CUprocessState;
typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs;         /* 0: no timeout */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;
typedef struct CUcheckpointGpuPair_st {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;
typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;
typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;
#endif

#endif

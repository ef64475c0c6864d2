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
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708)      \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709)        \
    X(CUDA_ERROR_LAUNCH_FAILED, 719)               \
    X(CUDA_ERROR_NOT_PERMITTED, 800)               \
    X(CUDA_ERROR_NOT_SUPPORTED, 801)               \
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
    X(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 95)                   \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 97)    \
    X(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 115)              \
    X(CU_CTX_FLAGS_MASK, 0xFF)                                      \
    X(CU_STREAM_NON_BLOCKING, 1)

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
#endif

#endif

/* Compiled by tests/test_abi.py when the CUDA toolkit's headers are present:
 * compiling at all is the check.  Every constant of cuda_abi.h must have
 * cuda.h's value, and every function of hooks.def the signature of its
 * PFN_<base>_v<version> typedef in cudaTypedefs.h. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>

#define VGL_CHECK_AGAINST_CUDA_H
#include "vgpulimit/cuda_abi.h"
#include "vgpulimit/nvml_abi.h"

#define SAME_VALUE(name, value) _Static_assert((name) == (value), #name " differs from cuda.h");
VGL_CU_RESULTS(SAME_VALUE)
VGL_CU_CONSTANTS(SAME_VALUE)

#define SAME_TYPE(symbol, base, version, pt, params, args)                              \
    typedef CUresult (*ours_##symbol) params;                                          \
    _Static_assert(__builtin_types_compatible_p(ours_##symbol, PFN_##base##_v##version##pt), \
                   #symbol " does not match PFN_" #base "_v" #version #pt);
#define CU_HOOK SAME_TYPE
#define CU_CALL SAME_TYPE
#include "hooks.def"

_Static_assert(sizeof(CUuuid) == 16, "CUuuid");
_Static_assert(CU_PROCESS_STATE_RUNNING == 0 && CU_PROCESS_STATE_LOCKED == 1 && CU_PROCESS_STATE_CHECKPOINTED == 2 &&
               CU_PROCESS_STATE_FAILED == 3, "CUprocessState");

/* The structs cuda_abi.h declares, field by field: a toolkit-free build lays
 * them out the same way (the expected numbers are those of the x86-64/arm64 ABI). */
#define AT(type, field, offset) _Static_assert(offsetof(type, field) == (offset), #type "." #field);
AT(CUmemAllocationProp, location, 8)
AT(CUcheckpointRestoreArgs, gpuPairsCount, 8)
AT(CUcheckpointRestoreArgs, reserved1, 56)
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs");
_Static_assert(sizeof(CUcheckpointLockArgs) == 64 && sizeof(CUcheckpointUnlockArgs) == 64, "CUcheckpoint*Args");
AT(CUmemAllocationProp, win32HandleMetaData, 16)
AT(CUmemAllocationProp, allocFlags, 24)
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
AT(CUmemPoolProps, location, 8)
AT(CUmemPoolProps, maxSize, 24)
AT(CUmemPoolProps, usage, 32)
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps");
AT(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs, 88)
AT(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount, 96)
AT(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize, 104)
AT(CUDA_MEM_ALLOC_NODE_PARAMS, dptr, 112)
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS");
AT(CUDA_ARRAY_DESCRIPTOR, Format, 16)
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24, "CUDA_ARRAY_DESCRIPTOR");
AT(CUDA_ARRAY3D_DESCRIPTOR, Format, 24)
AT(CUDA_ARRAY3D_DESCRIPTOR, Flags, 32)
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR");
_Static_assert(sizeof(CUDA_ARRAY_MEMORY_REQUIREMENTS) == 32, "CUDA_ARRAY_MEMORY_REQUIREMENTS");
AT(CUDA_ARRAY_MEMORY_REQUIREMENTS, alignment, 8)
AT(CUDA_ARRAY_MEMORY_REQUIREMENTS, reserved, 16)
AT(CUmemLocation, id, 4)
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");
AT(CUmemAccessDesc, flags, 8)
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
AT(CUlaunchConfig, sharedMemBytes, 24)
AT(CUlaunchConfig, hStream, 32)
AT(CUlaunchConfig, attrs, 40)
AT(CUlaunchConfig, numAttrs, 48)
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr");

/* NVML has no header in the toolkit; its layouts are fixed by the ABI that
 * nvidia-ml-py's ctypes structures also encode. */
_Static_assert(sizeof(nvmlMemory_v2_t) == 40 && nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24 && sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo");

int main(void) { return 0; }

/* Compiled by tests/test_abi.py when the CUDA toolkit's headers are present:
 * compiling at all is the check.  Every constant of cuda_abi.h must have
 * cuda.h's value, and every function of hooks.def the signature of its
 * PFN_<base>_v<version> typedef in cudaTypedefs.h. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

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
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr");

/* NVML has no header in the toolkit; its layouts are fixed by the ABI that
 * nvidia-ml-py's ctypes structures also encode. */
_Static_assert(sizeof(nvmlMemory_v2_t) == 40 && nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24 && sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo");

int main(void) { return 0; }

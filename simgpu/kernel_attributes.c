/* What a kernel reports of itself (cuFuncGetAttribute, cuKernelGetAttribute).
 * simgpu runs no code, so a kernel's only figure of its own is the local
 * memory its name asks for (modules.c): all else answers alike. */
#include "driver.h"

/* What a small kernel compiled for the profile's architecture reports. */
static CUresult sim_function_attribute(int *pi, CUfunction_attribute attrib, CUfunction f)
{
    uint64_t ns;
    CUresult res = sim_kernel_duration(f, &ns);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_profile *p = sim_config()->profile;
    const int sm = 10 * p->cc_major + p->cc_minor;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = (int)sim_kernel_local_bytes(f); return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = sm; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = sm; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 48 * 1024; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    return sim_function_attribute(pi, attrib, hfunc);
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || (uint32_t)dev >= sim_config()->device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    return sim_function_attribute(pi, attrib, (CUfunction)(void *)kernel);
}

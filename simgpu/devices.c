/* simgpu's devices: count, names, UUIDs, memory, PCI bus ids and attributes,
 * from the configured profile (config.c). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

CUresult sim_check_device(CUdevice dev)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || (uint32_t)dev >= sim_driver_config()->device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)sim_driver_config()->device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_check_device(ordinal);
    if (res == CUDA_SUCCESS)
        *device = ordinal;
    return res;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", sim_device_name());
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    uint8_t bytes[SIM_UUID_LEN];
    sim_device_uuid((uint32_t)dev, bytes);
    memcpy(uuid->bytes, bytes, sizeof uuid->bytes);
    return CUDA_SUCCESS;
}

/* _v2 differs only for MIG instances, which simgpu does not have. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    SIM_CALLED();
    return cuDeviceGetUuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)sim_driver_config()->memory_bytes;
    return CUDA_SUCCESS;
}

/* The 32-bit call of CUDA 2.0: sizes of 4 GiB and more read as UINT_MAX. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    SIM_CALLED();
    size_t total;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = cuDeviceTotalMem_v2(&total, dev);
    if (res == CUDA_SUCCESS)
        *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    return res;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", sim_device_pci_bus((uint32_t)dev));
    return CUDA_SUCCESS;
}

/* An H100 SXM's values, except that features whose entry points simgpu lacks
 * (managed memory, memory pools) read 0, so that clients which check before
 * use take their other path.  Its copy engines are simgpu's three (copies.c). */
static bool sim_attribute(CUdevice_attribute attrib, CUdevice dev, int *out)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *out = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *out = INT_MAX; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *out = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *out = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *out = 48 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *out = 64 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *out = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *out = INT_MAX; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *out = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *out = 1980000; return true; /* kHz */
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *out = 512; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *out = 132; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *out = 0; return true; /* default: shared */
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *out = (int)sim_device_pci_bus((uint32_t)dev); return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *out = 2619000; return true; /* kHz */
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *out = 5120; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *out = 50 * 1024 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *out = 2048; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *out = 3; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *out = 32; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *out = 9; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *out = 228 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *out = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *out = 227 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *out = 0; return true;
    }
    return false;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_attribute(attrib, dev, pi) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* simgpu's NVML memory figures: a device's used and total bytes, as the
 * state file counts them for every process of the machine. */
#include "nvml.h"

static bool sim_nvml_mem_info(uint32_t index, uint64_t *used, uint64_t *total)
{
    return sim_state_mem_info(index, used, total) == 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t used, total;
    if (!sim_nvml_mem_info(i, &used, &total))
        return NVML_ERROR_UNKNOWN;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

/* No memory is reserved by the (simulated) driver itself, so `reserved` is 0. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t used, total;
    if (!sim_nvml_mem_info(i, &used, &total))
        return NVML_ERROR_UNKNOWN;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

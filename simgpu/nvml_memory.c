/* simgpu's NVML memory figures, as the state file counts them for every
 * process of the machine, in the two forms the H200's driver (580) gave:
 * v1's `used` includes what the driver keeps for itself (SIMGPU_RESERVED;
 * 615 MiB on the idle H200), v2 reports that as `reserved` and leaves it out
 * of `used`.  `total` and `free` are the same in both, and free is what
 * neither processes nor the driver hold.
 *
 * A MIG device answers for its instance.  A GPU in MIG mode answers for the
 * whole board (its instances' use, the driver's reserve) "only with
 * appropriate privileges" (nvml.h): without MIG monitoring rights
 * (SIMGPU_MIG_MONITOR=none) it answers NVML_ERROR_NO_PERMISSION, as pynvml
 * got in a container (NVIDIA/nvidia-container-toolkit#842). */
#include "nvml.h"

static nvmlReturn_t sim_nvml_mem_info(nvmlDevice_t device, struct sim_mem_info *mem)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    const struct sim_config *cfg = sim_config();
    if (!t.mig_parent)
        return sim_state_mem_info(t.unit, mem) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    if (!cfg->mig_monitor)
        return NVML_ERROR_NO_PERMISSION;
    *mem = (struct sim_mem_info){.total_bytes = cfg->memory_bytes, .reserved_bytes = cfg->reserved_bytes};
    const struct sim_gpu_mig *mig = &cfg->mig[t.gpu];
    for (uint32_t i = 0; i < mig->count; i++) {
        struct sim_mem_info one;
        if (sim_state_mem_info(mig->instances[i].unit, &one) != 0)
            return NVML_ERROR_UNKNOWN;
        mem->used_bytes += one.used_bytes;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct sim_mem_info mem;
    nvmlReturn_t ret = sim_nvml_mem_info(device, &mem);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = mem.total_bytes;
    memory->used = mem.reserved_bytes + mem.used_bytes;
    memory->free = mem.total_bytes - memory->used;
    return NVML_SUCCESS;
}

/* Any `version` but nvmlMemory_v2 (sizeof | 2 << 24) got
 * NVML_ERROR_FUNCTION_NOT_FOUND from the H200's driver, a literal 2 or 0
 * included: not the ARGUMENT_VERSION_MISMATCH nvml.h would suggest. */
nvmlReturn_t sim_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct sim_mem_info mem;
    nvmlReturn_t ret = sim_nvml_mem_info(device, &mem);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    memory->total = mem.total_bytes;
    memory->reserved = mem.reserved_bytes;
    memory->used = mem.used_bytes;
    memory->free = mem.total_bytes - mem.reserved_bytes - mem.used_bytes;
    return NVML_SUCCESS;
}

/* NVML as the container should see it: the cap as the device's memory, the
 * container's usage as used. */
#include "internal.h"

/* NVML numbers devices as the container sees them, which is CUDA's order
 * unless CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER reorders them. */
static int nvml_index(nvmlDevice_t device)
{
    unsigned int index;
    if (vgl_real.nvmlDeviceGetIndex(device, &index) != NVML_SUCCESS || index >= VGL_MAX_DEVICES)
        return -1;
    return (int)index;
}

static void nvml_capped(nvmlDevice_t device, unsigned long long *total, unsigned long long *free_bytes,
                        unsigned long long *used)
{
    struct vgl_view v = {*free_bytes, *total, *used};
    if (vgl_capped_view(nvml_index(device), &v)) {
        *total = v.total_bytes;
        *free_bytes = v.free_bytes;
        *used = v.used_bytes;
    }
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    nvml_capped(device, &memory->total, &memory->free, &memory->used);
    return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    nvml_capped(device, &memory->total, &memory->free, &memory->used);
    return rc;
}

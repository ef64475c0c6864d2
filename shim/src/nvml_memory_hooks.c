/* NVML's memory figures as a container sees them: each device's capped.
 *
 * The real library answers first, so arguments, versions and errors are the
 * driver's business; only a successful answer is rewritten.  With no
 * vgpulimit variable set, every hook is a plain call through.
 *
 * The GPU of a container's MIG device answers as that device: the driver
 * answers a MIG parent's memory only with MIG monitoring rights
 * (NVML_ERROR_NO_PERMISSION in a container, nvidia-container-toolkit#842),
 * so tools that take nvmlDeviceGetHandleByIndex(0) would show nothing; they
 * show the instance, capped. */
#include "internal.h"

/* Total becomes the cap, used the container's usage (never above the cap,
 * so used/total stays a share), free what it has left under the cap. */
static bool nvml_capped(nvmlDevice_t device, unsigned long long *total, unsigned long long *free_bytes,
                        unsigned long long *used)
{
    struct vgl_view v = {*free_bytes, *total, *used};
    if (!vgl_capped_view(vgl_container_device(device), &v))
        return false;
    *total = v.total_bytes;
    *free_bytes = v.free_bytes;
    *used = v.used_bytes;
    return true;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (VGL_UNLIKELY(vgl_config.enabled))
        device = vgl_container_handle(device);
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    nvml_capped(device, &memory->total, &memory->free, &memory->used);
    return rc;
}

/* `reserved` is what the cap holds that is neither the container's nor free
 * to it (the driver's own reservation, other tenants' memory), so that
 * total = reserved + used + free, as in the driver's answer. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (VGL_UNLIKELY(vgl_config.enabled))
        device = vgl_container_handle(device);
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    if (nvml_capped(device, &memory->total, &memory->free, &memory->used) &&
        memory->used + memory->free <= memory->total)
        memory->reserved = memory->total - memory->used - memory->free;
    return rc;
}

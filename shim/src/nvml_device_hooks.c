/* NVML's devices as a container sees them: its own only, numbered as CUDA
 * numbers them (devices.c), whether found by index, UUID or bus id.
 *
 * The real library answers first, so arguments, versions and errors are the
 * driver's business; only a successful answer is rewritten.  With no
 * vgpulimit variable set, every hook is a plain call through. */
#include "internal.h"

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetCount_v2(deviceCount);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    *deviceCount = visible.count;
    return rc;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetCount(deviceCount);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    *deviceCount = visible.count;
    return rc;
}

/* The container's index `index` is the driver's device visible.nvml_index[index]. */
static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device,
                                    nvmlReturn_t (*real)(unsigned int, nvmlDevice_t *))
{
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || !vgl_visible_devices(&visible))
        return real(index, device);
    if (index >= visible.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return real(visible.nvml_index[index], device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device, vgl_real.nvmlDeviceGetHandleByIndex_v2);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device, vgl_real.nvmlDeviceGetHandleByIndex);
}

/* A handle found by another key is refused when it is not the container's. */
static nvmlReturn_t only_visible(nvmlReturn_t rc, const nvmlDevice_t *device)
{
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    for (unsigned i = 0; i < visible.count; i++)
        if (visible.handle[i] == *device)
            return rc;
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByUUID(uuid, device), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByPciBusId(pciBusId, device), device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetIndex(device, index);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    for (unsigned i = 0; i < visible.count; i++) {
        if (visible.handle[i] == device) {
            *index = i;
            return rc;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

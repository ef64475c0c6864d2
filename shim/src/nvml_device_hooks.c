/* NVML's devices as a container sees them: its own only, numbered as CUDA
 * numbers them (devices.c), whether found by index, UUID or bus id.  For a
 * container's MIG device, its GPU is found by index (as in a MIG container on
 * a real driver) and its MIG device by UUID.
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
        if (visible.handle[i] == *device || visible.parent[i] == *device)
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
        if (visible.parent[i] == device || (visible.handle[i] == device && !visible.parent[i])) {
            *index = i;
            return rc;
        }
        if (visible.handle[i] == device) {
            /* A MIG device's is among its GPU's, as nvmlDeviceGetMigDeviceHandleByIndex numbers them. */
            *index = 0;
            for (unsigned j = 0; j < i; j++)
                *index += visible.parent[j] == visible.parent[i];
            return rc;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* A container given a MIG device sees its GPU's other MIG devices as a real
 * one does, not at all: its own are the GPU's MIG devices 0, 1, ... (nvitop
 * 1.7 stops at the first index without one). */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMigDeviceHandleByIndex(device, index, migDevice);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || (rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_FOUND) ||
        !vgl_visible_devices(&visible))
        return rc;
    unsigned int own = 0;
    for (unsigned i = 0; i < visible.count; i++)
        if (visible.parent[i] == device && own++ == index) {
            *migDevice = visible.handle[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

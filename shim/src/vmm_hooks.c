/* Virtual memory management (cuMemCreate and friends).
 *
 * A cuMemCreate handle holds device memory until it is released AND every
 * mapping of it is unmapped: CUDA's own examples release the handle right
 * after mapping it.  So a handle's charge has holders — the handle itself and
 * each mapping — and returns to the ledger with the last of them. */
#include "internal.h"

static void drop_holder(uint64_t handle)
{
    int32_t device;
    uint64_t bytes;
    if (vgl_allocations_hold(VGL_ALLOC_VMM, handle, -1, &device, &bytes) == 0 && vgl_self.slot)
        vgl_release((uint32_t)device, bytes);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle_v1 *handle, size_t size, const CUmemAllocationProp_v1 *prop,
                     unsigned long long flags)
{
    /* Memory on the host (pinned or NUMA locations) is not the device's. */
    if (VGL_LIKELY(!vgl_config.enabled) || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vgl_real.cuMemCreate(handle, size, prop, flags);
    struct vgl_charge c;
    CUresult rc = vgl_charge_begin("cuMemCreate", prop->location.id, size, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMemCreate(handle, size, prop, flags);
    vgl_charge_end(&c, rc, VGL_ALLOC_VMM, rc == CUDA_SUCCESS ? *handle : 0);
    return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle_v1 handle)
{
    CUresult rc = vgl_real.cuMemRelease(handle);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS)
        drop_holder(handle);
    return rc;
}

CUresult cuMemMap(CUdeviceptr_v2 ptr, size_t size, size_t offset, CUmemGenericAllocationHandle_v1 handle,
                  unsigned long long flags)
{
    CUresult rc = vgl_real.cuMemMap(ptr, size, offset, handle, flags);
    int32_t device;
    uint64_t bytes;
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS &&
        vgl_allocations_hold(VGL_ALLOC_VMM, handle, +1, &device, &bytes) > 0)
        vgl_allocations_put(VGL_ALLOC_MAPPING, ptr, device, size, handle);
    return rc;
}

/* One unmap may cover several mappings laid side by side. */
CUresult cuMemUnmap(CUdeviceptr_v2 ptr, size_t size)
{
    CUresult rc = vgl_real.cuMemUnmap(ptr, size);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    uint64_t at = ptr, mapped, handle;
    while (at < ptr + size && vgl_allocations_take_link(VGL_ALLOC_MAPPING, at, &mapped, &handle) && mapped) {
        drop_holder(handle);
        at += mapped;
    }
    return rc;
}

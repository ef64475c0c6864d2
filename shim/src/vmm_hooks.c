/* Virtual memory management (cuMemCreate and friends).
 *
 * A cuMemCreate handle holds device memory until it is released AND every
 * mapping of it is unmapped: CUDA's own examples release the handle right
 * after mapping it.  So a handle's charge has holders — the handle itself and
 * each mapping — and returns to the ledger with the last of them.
 *
 * Each call and its bookkeeping are one step for the process's threads: the
 * driver may hand a released handle, or an unmapped address, to the next
 * caller at once, who must find the old record already gone; and a call the
 * driver refuses changes nothing.  These calls are not on any hot path (a
 * caching allocator makes them as it grows or shrinks), so one lock serves.
 *
 * A handle imported from another process (cuMemImportFromShareableHandle) is
 * charged to this process's container when it is imported, whoever else
 * holds it, and held like one of ours: once its exporter lets go, the driver
 * keeps the memory for its importers, and what they hold must be paid for
 * at every instant (docs/memory.md, "Framework paths").  Memory on the host
 * (pinned or NUMA locations, as NCCL's shared-memory transport makes) passes
 * through untouched: it is not the device's, and every rank must see the
 * driver's own answer. */
#include <pthread.h>

#include "internal.h"
#include "resume_ask.h"

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

static void forget_in_child(void) { pthread_mutex_init(&vmm_lock, NULL); }
VGL_AFTER_FORK(forget_in_child)

/* Under vmm_lock.  A handle we have no record of (on the host) is not ours to count. */
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
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vgl_real.cuMemCreate(handle, size, prop, flags);
    struct vgl_charge c;
    CUresult rc;
    /* A wait for memory is outside the lock: the process's own releases take it. */
    do {
        pthread_mutex_lock(&vmm_lock);
        rc = vgl_charge_begin("cuMemCreate", prop->location.id, size, &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemCreate(handle, size, prop, flags);
            vgl_charge_end(&c, rc, VGL_ALLOC_VMM, rc == CUDA_SUCCESS ? *handle : 0);
        }
        pthread_mutex_unlock(&vmm_lock);
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle_v1 handle)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemRelease(handle);
    pthread_mutex_lock(&vmm_lock);
    vgl_charges_enter();
    CUresult rc = vgl_real.cuMemRelease(handle);
    if (rc == CUDA_SUCCESS)
        drop_holder(handle);
    vgl_charges_leave();
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

CUresult cuMemMap(CUdeviceptr_v2 ptr, size_t size, size_t offset, CUmemGenericAllocationHandle_v1 handle,
                  unsigned long long flags)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemMap(ptr, size, offset, handle, flags);
    int32_t device;
    uint64_t bytes;
    pthread_mutex_lock(&vmm_lock);
    CUresult rc = vgl_real.cuMemMap(ptr, size, offset, handle, flags);
    if (rc == CUDA_SUCCESS && vgl_allocations_hold(VGL_ALLOC_VMM, handle, +1, &device, &bytes) > 0)
        vgl_allocations_put(VGL_ALLOC_MAPPING, ptr, device, size, handle);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/* One unmap may cover several mappings laid side by side. */
CUresult cuMemUnmap(CUdeviceptr_v2 ptr, size_t size)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemUnmap(ptr, size);
    pthread_mutex_lock(&vmm_lock);
    vgl_charges_enter();
    CUresult rc = vgl_real.cuMemUnmap(ptr, size);
    struct vgl_allocation mapping;
    uint64_t at = ptr;
    for (; rc == CUDA_SUCCESS && at < ptr + size && vgl_allocations_take(VGL_ALLOC_MAPPING, at, &mapping) &&
           mapping.bytes;
         at += mapping.bytes)
        drop_holder(mapping.link);
    vgl_charges_leave();
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/* The size of an imported allocation, which no call reports: the most of it
 * that cuMemMap maps from its start (cuda.h, cuMemMap: offset + size within
 * the allocation, in multiples of its granularity), found by bisection on a
 * reservation of the device's size.  0: the driver would not say. */
static uint64_t imported_size(CUmemGenericAllocationHandle_v1 handle, const CUmemAllocationProp_v1 *prop,
                              uint64_t total)
{
    size_t granularity = 0;
    if (vgl_real.cuMemGetAllocationGranularity(&granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS || !granularity || total < granularity)
        return 0;
    uint64_t pieces = total / granularity, lo = 0, hi = pieces; /* lo pieces map; more than hi do not */
    CUdeviceptr_v2 va;
    if (vgl_real.cuMemAddressReserve(&va, pieces * granularity, 0, 0, 0) != CUDA_SUCCESS)
        return 0;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (vgl_real.cuMemMap(va, mid * granularity, 0, handle, 0) == CUDA_SUCCESS) {
            vgl_real.cuMemUnmap(va, mid * granularity);
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    vgl_real.cuMemAddressFree(va, pieces * granularity);
    return lo * granularity;
}

/* Charged at the import, refused if it does not fit the cap; the same
 * allocation imported again, where the driver answers with the handle it
 * gave before, is one more holder of it. */
static CUresult import_locked(CUmemGenericAllocationHandle_v1 *handle, void *osHandle,
                              CUmemAllocationHandleType type, struct vgl_charge *c)
{
    *c = (struct vgl_charge){.device = -1, .refused_on = -1};
    CUresult rc = vgl_real.cuMemImportFromShareableHandle(handle, osHandle, type);
    CUmemAllocationProp_v1 prop;
    int32_t device;
    uint64_t bytes;
    if (rc != CUDA_SUCCESS || vgl_allocations_hold(VGL_ALLOC_VMM, *handle, +1, &device, &bytes) > 0 ||
        vgl_real.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) != CUDA_SUCCESS ||
        prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return rc; /* on the host (NCCL's transport): passed through, as its creation is */
    uint64_t size = prop.location.id >= 0 && prop.location.id < VGL_MAX_DEVICES
                        ? imported_size(*handle, &prop, vgl_device_total(prop.location.id)) : 0;
    if (!size) {
        static unsigned said;
        vgl_log_bounded(VGL_LOG_ERROR, &said, "cuMemImportFromShareableHandle refused: the driver does not "
                        "say the size of the memory imported, so it cannot be counted against the cap");
        vgl_real.cuMemRelease(*handle);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc = vgl_charge_begin("cuMemImportFromShareableHandle", prop.location.id, size, c);
    if (rc == CUDA_SUCCESS)
        vgl_charge_end(c, rc, VGL_ALLOC_VMM, *handle);
    else
        vgl_real.cuMemRelease(*handle);
    return rc;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle_v1 *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !handle)
        return vgl_real.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    struct vgl_charge c;
    CUresult rc;
    do {
        pthread_mutex_lock(&vmm_lock);
        rc = import_locked(handle, osHandle, shHandleType, &c);
        pthread_mutex_unlock(&vmm_lock);
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

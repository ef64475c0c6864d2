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
 * not charged: its exporter pays for it while it holds it (overhead.c says
 * who pays after).  Memory on the host (pinned or NUMA locations, as NCCL's
 * shared-memory transport makes) passes through untouched: it is not the
 * device's, and every rank must see the driver's own answer. */
#include <pthread.h>

#include "internal.h"

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

static void forget_in_child(void) { pthread_mutex_init(&vmm_lock, NULL); }
VGL_AFTER_FORK(forget_in_child)

/* Under vmm_lock.  false: not a handle of ours (imported from another
 * process: its exporter pays for it, overhead.c). */
static bool drop_holder(uint64_t handle)
{
    int32_t device;
    uint64_t bytes;
    int held = vgl_allocations_hold(VGL_ALLOC_VMM, handle, -1, &device, &bytes);
    if (held == 0 && vgl_self.slot)
        vgl_release((uint32_t)device, bytes);
    return held >= 0;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle_v1 *handle, size_t size, const CUmemAllocationProp_v1 *prop,
                     unsigned long long flags)
{
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
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemRelease(handle);
    pthread_mutex_lock(&vmm_lock);
    vgl_charges_enter();
    CUresult rc = vgl_real.cuMemRelease(handle);
    bool imported = rc == CUDA_SUCCESS && !drop_holder(handle);
    vgl_charges_leave();
    pthread_mutex_unlock(&vmm_lock);
    if (imported)
        vgl_overhead_recheck_shared();
    return rc;
}

CUresult cuMemMap(CUdeviceptr_v2 ptr, size_t size, size_t offset, CUmemGenericAllocationHandle_v1 handle,
                  unsigned long long flags)
{
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
    /* Some of the range mapped imported memory, which has no record. */
    if (rc == CUDA_SUCCESS && at < ptr + size)
        vgl_overhead_recheck_shared();
    return rc;
}

/* Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync).
 *
 * A pool takes device memory in chunks and keeps what is freed into it for
 * reuse, so what the container holds is each pool's reserve
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the sum of live allocations:
 * that is what we charge.  Before an allocation that may grow the pool we
 * reserve a chunk-rounded headroom, then settle the charge to the growth the
 * driver reports.  A pool also shrinks where we do not see it (at
 * synchronisation, down to its release threshold): its charge catches up the
 * next time we look at it, so between the two we over-count, never under.
 * A pool imported from another process is charged the same way, from the
 * first pointer imported into it (cuMemPoolImportPointer, below). */
#include <pthread.h>

#include "internal.h"
#include "resume_ask.h"

/* The growth a pool may take for one allocation: real drivers and simgpu
 * grow pools in 2 MiB pages. */
#define POOL_CHUNK (2ULL << 20)

/* The link of an imported pool's record once the pool is destroyed while
 * pointers imported into it live on: nothing may be asked of it. */
#define POOL_DESTROYED 1

/* Settling reads the charge and then writes it: one thread at a time. */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

/* The pools' charges are the allocations table's, which forgets them itself. */
static void forget_in_child(void) { pthread_mutex_init(&pools_lock, NULL); }
VGL_AFTER_FORK(forget_in_child)

static bool pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, uint64_t *value)
{
    cuuint64_t v;
    if (vgl_real.cuMemPoolGetAttribute(pool, attr, &v) != CUDA_SUCCESS)
        return false;
    *value = v;
    return true;
}

/* The device a pool's memory lives on: from cuMemPoolCreate, else (a
 * device's own pool) the current context's. */
static int pool_device(CUmemoryPool pool)
{
    int32_t device;
    uint64_t charged;
    if (vgl_allocations_get(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, &device, &charged))
        return device;
    return vgl_current_device();
}

static uint64_t pool_charge(CUmemoryPool pool)
{
    int32_t device;
    uint64_t charged = 0;
    vgl_allocations_get(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, &device, &charged);
    return charged;
}

/* What the pointers imported into `pool` that are alive add up to. */
static uint64_t imports_of(CUmemoryPool pool)
{
    int32_t device;
    uint64_t bytes = 0;
    vgl_allocations_get(VGL_ALLOC_POOL_IMPORTS, (uint64_t)(uintptr_t)pool, &device, &bytes);
    return bytes;
}

/* Brings a pool's charge to its reserve, and never below what the pointers
 * imported into it hold (all of it, for a pool destroyed since, which may no
 * longer be asked).  Under pools_lock. */
static void settle(CUmemoryPool pool, int device)
{
    struct vgl_allocation record = {0};
    vgl_allocations_find(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, &record);
    uint64_t reserved = 0, floor = imports_of(pool);
    bool told = record.link != POOL_DESTROYED &&
                pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    uint64_t target = reserved > floor ? reserved : floor;
    if ((!told && !floor && record.link != POOL_DESTROYED) || target == record.bytes)
        return;
    vgl_follow_reserve((uint32_t)device, record.bytes, target);
    vgl_allocations_put(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, device, target, record.link);
}

enum variant { ASYNC, ASYNC_PTSZ, FROM_POOL, FROM_POOL_PTSZ };

static CUresult call_driver(enum variant v, CUdeviceptr_v2 *dptr, size_t bytes, CUmemoryPool pool,
                            CUstream stream)
{
    switch (v) {
    case ASYNC:
        return vgl_real.cuMemAllocAsync(dptr, bytes, stream);
    case ASYNC_PTSZ:
        return vgl_real.cuMemAllocAsync_ptsz(dptr, bytes, stream);
    case FROM_POOL:
        return vgl_real.cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
    default:
        return vgl_real.cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream);
    }
}

static CUresult pool_alloc(enum variant v, CUdeviceptr_v2 *dptr, size_t bytes, CUmemoryPool pool,
                           CUstream stream)
{
    VGL_ASKS();
    const char *call = v <= ASYNC_PTSZ ? "cuMemAllocAsync" : "cuMemAllocFromPoolAsync";
    if (VGL_LIKELY(!vgl_config.enabled))
        return call_driver(v, dptr, bytes, pool, stream);
    if (!vgl_ready()) {
        struct vgl_charge refused;
        return vgl_charge_begin(call, -1, bytes, &refused); /* refuses, and says why */
    }
    /* cuMemAllocAsync draws from the current pool of the stream's device. */
    CUmemoryPool source = pool;
    int device = pool ? pool_device(pool) : vgl_current_device();
    if (!pool && device >= 0 && vgl_real.cuDeviceGetMemPool(&source, device) != CUDA_SUCCESS)
        source = NULL;
    if (!source || device < 0)
        return call_driver(v, dptr, bytes, pool, stream); /* the driver will say what is wrong */
    if (device >= VGL_MAX_DEVICES) {
        struct vgl_charge refused;
        return vgl_charge_begin(call, device, bytes, &refused); /* refuses, and says why */
    }

    pthread_mutex_lock(&pools_lock);
    settle(source, device);
    uint64_t reserved = pool_charge(source), used = 0;
    bool fits_in_reserve = pool_attribute(source, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) &&
                           used <= reserved && reserved - used >= bytes;
    struct vgl_charge c = {.device = -1};
    CUresult rc = CUDA_SUCCESS;
    if (!fits_in_reserve)
        rc = vgl_charge_begin(call, device, (bytes + POOL_CHUNK - 1) / POOL_CHUNK * POOL_CHUNK, &c);
    if (rc == CUDA_SUCCESS) {
        rc = call_driver(v, dptr, bytes, pool, stream);
        uint64_t now;
        if (rc == CUDA_SUCCESS && pool_attribute(source, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now) &&
            now > reserved) {
            uint64_t growth = now - reserved;
            if (c.device < 0)
                vgl_charge_open(&c, call, device);
            /* The driver grew the pool past our headroom (fragmentation):
             * the memory is held all the same, so it is counted, and the
             * allocations after it are refused until the pool shrinks. */
            if (!vgl_charge_settle(&c, growth, false))
                vgl_charge_settle(&c, growth, true);
            vgl_allocations_put(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)source, device, reserved + growth, 0);
            vgl_charge_keep(&c);
        } else {
            vgl_charge_cancel(&c);
        }
    }
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr_v2 *dptr, size_t bytesize, CUstream hStream)
{
    return pool_alloc(ASYNC, dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr_v2 *dptr, size_t bytesize, CUstream hStream)
{
    return pool_alloc(ASYNC_PTSZ, dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr_v2 *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return pool_alloc(FROM_POOL, dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr_v2 *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    return pool_alloc(FROM_POOL_PTSZ, dptr, bytesize, pool, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps_v1 *poolProps)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuMemPoolCreate(pool, poolProps);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS &&
        poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        vgl_allocations_put(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)*pool, poolProps->location.id, 0, 0);
    return rc;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuMemPoolTrimTo(pool, minBytesToKeep);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS && vgl_self.slot) {
        int device = pool_device(pool);
        pthread_mutex_lock(&pools_lock);
        if (device >= 0 && device < VGL_MAX_DEVICES)
            settle(pool, device);
        pthread_mutex_unlock(&pools_lock);
    }
    return rc;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemPoolDestroy(pool);
    struct vgl_uncharge u;
    int32_t device;
    uint64_t charged;
    pthread_mutex_lock(&pools_lock);
    if (imports_of(pool) && vgl_allocations_get(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, &device, &charged)) {
        /* Pointers imported into it live on: so does its charge (vgl_pool_import_freed). */
        CUresult rc = vgl_real.cuMemPoolDestroy(pool);
        if (rc == CUDA_SUCCESS)
            vgl_allocations_put(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, device, charged, POOL_DESTROYED);
        pthread_mutex_unlock(&pools_lock);
        return rc;
    }
    vgl_uncharge_begin(VGL_ALLOC_POOL, (uint64_t)(uintptr_t)pool, &u);
    CUresult rc = vgl_real.cuMemPoolDestroy(pool);
    vgl_uncharge_end(&u, rc);
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

/* A pointer imported from another process's pool maps that pool's memory,
 * which the driver keeps for the importer once the exporter lets go of it.
 * So the imported pool is charged as a pool of ours is, by its reserve (the
 * memory its imports map), and never less than the imported allocations
 * themselves (cuMemGetAddressRange's sizes: a driver may not count the
 * exporter's memory in an importer's reserve), at the import, which is
 * refused if that does not fit the cap. */
static CUresult import_pointer(CUdeviceptr_v2 *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData_v1 *data,
                               int device)
{
    settle(pool, device);
    uint64_t key = (uint64_t)(uintptr_t)pool, charged = pool_charge(pool), reserved = 0;
    CUresult rc = vgl_real.cuMemPoolImportPointer(ptr_out, pool, data);
    struct vgl_allocation known;
    if (rc != CUDA_SUCCESS || vgl_allocations_find(VGL_ALLOC_IMPORTED, *ptr_out, &known))
        return rc; /* failed, or the same allocation imported again: the same pointer */
    size_t size = vgl_import_size("cuMemPoolImportPointer", *ptr_out);
    if (!size) {
        vgl_real.cuMemFree_v2(*ptr_out);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t floor = imports_of(pool) + size;
    if (!pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) || reserved < floor)
        reserved = floor;
    struct vgl_charge c;
    rc = vgl_charge_begin("cuMemPoolImportPointer", device, reserved > charged ? reserved - charged : 0, &c);
    if (rc != CUDA_SUCCESS) {
        vgl_real.cuMemFree_v2(*ptr_out);
        return rc;
    }
    vgl_allocations_put(VGL_ALLOC_POOL, key, device, reserved > charged ? reserved : charged, 0);
    if (vgl_allocations_put(VGL_ALLOC_IMPORTED, *ptr_out, device, size, key)) {
        int32_t d;
        uint64_t sum;
        vgl_allocations_hold(VGL_ALLOC_POOL_IMPORTS, key, +1, &d, &sum); /* one more, if any was there */
        vgl_allocations_put(VGL_ALLOC_POOL_IMPORTS, key, device, floor, 0);
    }
    vgl_charge_keep(&c);
    return rc;
}

CUresult cuMemPoolImportPointer(CUdeviceptr_v2 *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData_v1 *shareData)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !ptr_out)
        return vgl_real.cuMemPoolImportPointer(ptr_out, pool, shareData);
    struct vgl_charge refused;
    if (!vgl_ready())
        return vgl_charge_begin("cuMemPoolImportPointer", -1, 0, &refused); /* refuses, and says why */
    int device = pool_device(pool);
    if (device < 0)
        return vgl_real.cuMemPoolImportPointer(ptr_out, pool, shareData); /* the driver will say what is wrong */
    if (device >= VGL_MAX_DEVICES)
        return vgl_charge_begin("cuMemPoolImportPointer", device, 0, &refused); /* refuses, and says why */
    pthread_mutex_lock(&pools_lock);
    CUresult rc = import_pointer(ptr_out, pool, shareData, device);
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

/* The pool's charge stays while a pointer imported into it lives, even past
 * the pool's destruction (cuda.h, cuMemPoolDestroy: its resources go once no
 * allocation is outstanding); the last such free after it returns the rest. */
void vgl_pool_import_freed(const struct vgl_allocation *imported, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        vgl_allocations_restore(VGL_ALLOC_IMPORTED, imported);
        return;
    }
    CUmemoryPool pool = (CUmemoryPool)(uintptr_t)imported->link;
    int32_t device;
    uint64_t sum;
    pthread_mutex_lock(&pools_lock);
    if (vgl_allocations_hold(VGL_ALLOC_POOL_IMPORTS, imported->link, -1, &device, &sum) > 0)
        vgl_allocations_put(VGL_ALLOC_POOL_IMPORTS, imported->link, device,
                            sum > imported->bytes ? sum - imported->bytes : 0, 0);
    struct vgl_allocation record;
    if (vgl_allocations_find(VGL_ALLOC_POOL, imported->link, &record) && vgl_self.slot) {
        settle(pool, record.device);
        if (record.link == POOL_DESTROYED && !imports_of(pool))
            vgl_allocations_take(VGL_ALLOC_POOL, imported->link, &record);
    }
    pthread_mutex_unlock(&pools_lock);
}

/* Device memory by pointer (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged,
 * memory opened with cuIpcOpenMemHandle, and their frees) and the queries
 * that report the device's size (cuMemGetInfo, cuDeviceTotalMem), capped.  A
 * refused allocation is tried again while the container's memory wait lasts
 * (vgl_charge_retry).  With no vgpulimit variable set, every hook is a plain
 * call through. */
#include "internal.h"
#include "resume_ask.h"

/* The driver's pitch alignment is at most this on every GPU we know; we
 * reserve a pitched allocation at this bound and settle to the real pitch. */
#define PITCH_BOUND 512u

CUresult cuMemAlloc_v2(CUdeviceptr_v2 *dptr, size_t bytesize)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAlloc_v2(dptr, bytesize);
    struct vgl_charge c;
    CUresult rc;
    do {
        rc = vgl_charge_begin("cuMemAlloc", -1, bytesize, &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemAlloc_v2(dptr, bytesize);
            vgl_charge_end(&c, rc, VGL_ALLOC_POINTER, rc == CUDA_SUCCESS ? *dptr : 0);
        }
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAlloc(dptr, bytesize);
    struct vgl_charge c;
    CUresult rc;
    do {
        rc = vgl_charge_begin("cuMemAlloc", -1, bytesize, &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemAlloc(dptr, bytesize);
            vgl_charge_end(&c, rc, VGL_ALLOC_POINTER, rc == CUDA_SUCCESS ? *dptr : 0);
        }
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

/* Managed memory counts against the device's cap like any other: it may
 * migrate to the host, but it can occupy the device in full. */
CUresult cuMemAllocManaged(CUdeviceptr_v2 *dptr, size_t bytesize, unsigned int flags)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAllocManaged(dptr, bytesize, flags);
    struct vgl_charge c;
    CUresult rc;
    do {
        rc = vgl_charge_begin("cuMemAllocManaged", -1, bytesize, &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemAllocManaged(dptr, bytesize, flags);
            vgl_charge_end(&c, rc, VGL_ALLOC_POINTER, rc == CUDA_SUCCESS ? *dptr : 0);
        }
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

/* A pitched allocation is reserved at the widest pitch we expect, then
 * settled to what the driver chose: the ledger never runs ahead of the cap. */
static CUresult settle_pitch(struct vgl_charge *c, CUresult rc, uint64_t ptr, uint64_t pitch,
                             uint64_t height, CUresult (*free_fn)(uint64_t))
{
    if (rc == CUDA_SUCCESS && !vgl_charge_settle(c, pitch * height, false)) {
        free_fn(ptr);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgl_charge_end(c, rc, VGL_ALLOC_POINTER, ptr);
    return rc;
}

static uint64_t pitch_bound(uint64_t width, uint64_t height)
{
    uint64_t pitch = (width + PITCH_BOUND - 1) / PITCH_BOUND * PITCH_BOUND;
    return height && pitch > UINT64_MAX / height ? UINT64_MAX : pitch * height;
}

static CUresult free_v2(uint64_t ptr) { return vgl_real.cuMemFree_v2(ptr); }
static CUresult free_v1(uint64_t ptr) { return vgl_real.cuMemFree((CUdeviceptr_v1)ptr); }

CUresult cuMemAllocPitch_v2(CUdeviceptr_v2 *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct vgl_charge c;
    CUresult rc;
    do {
        rc = vgl_charge_begin("cuMemAllocPitch", -1, pitch_bound(WidthInBytes, Height), &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
            rc = rc == CUDA_SUCCESS ? settle_pitch(&c, rc, *dptr, *pPitch, Height, free_v2)
                                    : settle_pitch(&c, rc, 0, 0, 0, free_v2);
        }
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct vgl_charge c;
    CUresult rc;
    do {
        rc = vgl_charge_begin("cuMemAllocPitch", -1, pitch_bound(WidthInBytes, Height), &c);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
            rc = rc == CUDA_SUCCESS ? settle_pitch(&c, rc, *dptr, *pPitch, Height, free_v1)
                                    : settle_pitch(&c, rc, 0, 0, 0, free_v1);
        }
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

static CUresult driver_free_v2(uint64_t dptr, CUstream stream)
{
    (void)stream;
    return vgl_real.cuMemFree_v2(dptr);
}

static CUresult driver_free_v1(uint64_t dptr, CUstream stream)
{
    (void)stream;
    return vgl_real.cuMemFree((CUdeviceptr_v1)dptr);
}

static CUresult driver_free_async(uint64_t dptr, CUstream stream) { return vgl_real.cuMemFreeAsync(dptr, stream); }

static CUresult driver_free_async_ptsz(uint64_t dptr, CUstream stream)
{
    return vgl_real.cuMemFreeAsync_ptsz(dptr, stream);
}

/* Whether the stream has reached a free just queued on it (CUDA_SUCCESS):
 * the driver gives the memory back only then, which a tenant may put off for
 * ever (a stream held by a kernel that never ends), so the charge waits for
 * it.  In a stream being captured the free is a node of a graph, run who
 * knows when: the charge stays (over-counted, never under). */
static CUresult stream_reached(CUstream stream, bool ptsz)
{
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = ptsz ? vgl_real.cuStreamIsCapturing_ptsz(stream, &capture)
                       : vgl_real.cuStreamIsCapturing(stream, &capture);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
        return CUDA_ERROR_NOT_READY;
    return ptsz ? vgl_real.cuStreamSynchronize_ptsz(stream) : vgl_real.cuStreamSynchronize(stream);
}

/* Every free by address.  The charge stays until the driver has the memory
 * back: a free it refuses leaves the memory held, and counted; a
 * stream-ordered one of memory charged by pointer waits for its stream
 * (stream_reached).  A pointer we never charged (a pool's own allocation,
 * charged by the pool's reserve) is simply passed on; one imported into a
 * pool gives its pool's charge back as far as the pool shrank. */
static CUresult free_address(uint64_t dptr, CUstream stream, CUresult (*driver_free)(uint64_t, CUstream))
{
    if (VGL_LIKELY(!vgl_config.enabled) || !dptr)
        return driver_free(dptr, stream);
    struct vgl_uncharge u;
    struct vgl_allocation imported;
    vgl_uncharge_begin(VGL_ALLOC_POINTER, dptr, &u);
    bool was_imported = !u.held && vgl_allocations_take(VGL_ALLOC_IMPORTED, dptr, &imported);
    CUresult rc = driver_free(dptr, stream), done = rc;
    bool async = driver_free == driver_free_async || driver_free == driver_free_async_ptsz;
    if (rc == CUDA_SUCCESS && async && (u.held || was_imported))
        done = stream_reached(stream, driver_free == driver_free_async_ptsz);
    vgl_uncharge_end(&u, done);
    if (was_imported)
        vgl_pool_import_freed(&imported, done);
    return rc;
}

/* Each free asks here, not in free_address: there it cost 4 ns per alloc +
 * free pair under a cap (benchmarks/overhead.py), free_address no longer
 * inlined with its driver_free known. */
CUresult cuMemFree_v2(CUdeviceptr_v2 dptr)
{
    VGL_ASKS();
    return free_address(dptr, NULL, driver_free_v2);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    VGL_ASKS();
    return free_address(dptr, NULL, driver_free_v1);
}

CUresult cuMemFreeAsync(CUdeviceptr_v2 dptr, CUstream hStream)
{
    VGL_ASKS();
    return free_address(dptr, hStream, driver_free_async);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr_v2 dptr, CUstream hStream)
{
    VGL_ASKS();
    return free_address(dptr, hStream, driver_free_async_ptsz);
}

/* Memory opened from another process (torch.multiprocessing's CUDA tensors)
 * is charged to this process's container when it is opened, and refused if
 * it does not fit the cap, whoever else holds it: once its exporter frees
 * it, the driver keeps it for its importers, and what they hold must be
 * paid for at every instant, not from their next call (docs/memory.md,
 * "Framework paths").  A second open of the same memory in the process
 * gives the same pointer and is counted once. */
static CUresult open_ipc(CUdeviceptr_v2 *pdptr, CUipcMemHandle_v1 handle, unsigned int flags, bool v2)
{
    CUresult rc;
    struct vgl_charge c;
    do {
        c = (struct vgl_charge){.device = -1, .refused_on = -1};
        rc = v2 ? vgl_real.cuIpcOpenMemHandle_v2(pdptr, handle, flags)
                : vgl_real.cuIpcOpenMemHandle(pdptr, handle, flags);
        int32_t device;
        uint64_t bytes;
        if (rc != CUDA_SUCCESS || vgl_allocations_hold(VGL_ALLOC_OPENED, *pdptr, +1, &device, &bytes) > 0)
            continue;
        size_t size = vgl_import_size("cuIpcOpenMemHandle", *pdptr);
        if (!size) {
            vgl_real.cuIpcCloseMemHandle(*pdptr);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            continue;
        }
        rc = vgl_charge_begin("cuIpcOpenMemHandle", -1, size, &c);
        if (rc == CUDA_SUCCESS)
            vgl_charge_end(&c, rc, VGL_ALLOC_OPENED, *pdptr);
        else
            vgl_real.cuIpcCloseMemHandle(*pdptr);
    } while (vgl_charge_retry(&c, rc));
    return rc;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr_v2 *pdptr, CUipcMemHandle_v1 handle, unsigned int Flags)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pdptr)
        return vgl_real.cuIpcOpenMemHandle(pdptr, handle, Flags);
    return open_ipc(pdptr, handle, Flags, false);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr_v2 *pdptr, CUipcMemHandle_v1 handle, unsigned int Flags)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pdptr)
        return vgl_real.cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
    return open_ipc(pdptr, handle, Flags, true);
}

/* The last close of an opened pointer gives its charge back. */
CUresult cuIpcCloseMemHandle(CUdeviceptr_v2 dptr)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuIpcCloseMemHandle(dptr);
    int32_t device;
    uint64_t bytes;
    vgl_charges_enter();
    int left = vgl_allocations_hold(VGL_ALLOC_OPENED, dptr, -1, &device, &bytes);
    CUresult rc = vgl_real.cuIpcCloseMemHandle(dptr);
    if (rc != CUDA_SUCCESS && left > 0)
        vgl_allocations_hold(VGL_ALLOC_OPENED, dptr, +1, &device, &bytes);
    else if (rc != CUDA_SUCCESS && left == 0)
        vgl_allocations_put(VGL_ALLOC_OPENED, dptr, device, bytes, 0);
    else if (left == 0 && vgl_self.slot)
        vgl_release((uint32_t)device, bytes);
    vgl_charges_leave();
    return rc;
}

/* The capped (free, total) of the current context's device, from what the
 * driver wrote (a NULL pointer is the driver's business: we only cap what it
 * wrote).  A context exists, so its cost is the container's: counted first. */
static bool capped_meminfo(uint64_t *free_bytes, bool has_free, uint64_t *total_bytes, bool has_total)
{
    int device = vgl_current_device();
    bool known = device >= 0 && device < VGL_MAX_DEVICES;
    if (known && vgl_ready())
        vgl_overhead_check(device, 0);
    struct vgl_view v = {has_free ? *free_bytes : UINT64_MAX,
                         has_total ? *total_bytes : (known ? vgl_device_total(device) : 0), 0};
    if (!vgl_capped_view(device, &v))
        return false;
    *free_bytes = v.free_bytes;
    *total_bytes = v.total_bytes;
    return true;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    uint64_t f = free_bytes ? *free_bytes : 0, t = total_bytes ? *total_bytes : 0;
    if (capped_meminfo(&f, free_bytes, &t, total_bytes)) {
        if (free_bytes)
            *free_bytes = f;
        if (total_bytes)
            *total_bytes = t;
    }
    return rc;
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuMemGetInfo(free_bytes, total_bytes);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    uint64_t f = free_bytes ? *free_bytes : 0, t = total_bytes ? *total_bytes : 0;
    if (capped_meminfo(&f, free_bytes, &t, total_bytes)) {
        if (free_bytes)
            *free_bytes = (unsigned int)f;
        if (total_bytes)
            *total_bytes = (unsigned int)t;
    }
    return rc;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice_v1 dev)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuDeviceTotalMem_v2(bytes, dev);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || !bytes)
        return rc;
    struct vgl_view v = {0, *bytes, 0};
    if (vgl_capped_view(dev, &v))
        *bytes = v.total_bytes;
    return rc;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice_v1 dev)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuDeviceTotalMem(bytes, dev);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || !bytes)
        return rc;
    struct vgl_view v = {0, *bytes, 0};
    if (vgl_capped_view(dev, &v))
        *bytes = (unsigned int)v.total_bytes;
    return rc;
}


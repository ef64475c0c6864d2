/* Device memory: every allocation is reserved in the container's ledger
 * before the driver is asked, and returned when the driver fails or the
 * memory is freed; the queries report the cap as the device's size.
 *
 * With no vgpulimit variable set, every hook is a plain call through. */
#include <errno.h>

#include "internal.h"

/* The driver's pitch alignment is at most this on every GPU we know; we
 * reserve a pitched allocation at this bound and settle to the real pitch. */
#define PITCH_BOUND 512u

static uint64_t device_total[VGL_MAX_DEVICES]; /* as the driver reports it; 0: not asked yet */

int vgl_current_device(void)
{
    CUdevice device;
    if (vgl_real.cuCtxGetDevice(&device) != CUDA_SUCCESS || device < 0)
        return -1;
    return device;
}

static uint64_t total_of(int device)
{
    uint64_t total = __atomic_load_n(&device_total[device], __ATOMIC_RELAXED);
    if (VGL_UNLIKELY(!total)) {
        size_t bytes;
        if (vgl_real.cuDeviceTotalMem_v2(&bytes, device) != CUDA_SUCCESS)
            return 0;
        total = bytes;
        __atomic_store_n(&device_total[device], total, __ATOMIC_RELAXED);
        if (vgl_self.region)
            __atomic_store_n(&vgl_self.region->devices[device].total_bytes, total, __ATOMIC_RELAXED);
    }
    return total;
}

/* The cap of a device of `total` bytes, read live from the region
 * (`vgpulimit set` changes it); UINT64_MAX: none.  0 while the
 * configuration is broken. */
static uint64_t cap_of(int device, uint64_t total)
{
    if (VGL_UNLIKELY(vgl_config.broken))
        return 0;
    const struct vgl_mem_limit *live = &vgl_self.region->devices[device].limit;
    struct vgl_mem_limit limit = {
        .bytes = __atomic_load_n(&live->bytes, __ATOMIC_RELAXED),
        .ppm = __atomic_load_n(&live->ppm, __ATOMIC_RELAXED),
    };
    return vgl_cap_bytes(&limit, total);
}

/* A reservation: `device` < 0 when nothing was charged. */
struct charge {
    int device;
    uint64_t bytes;
};

static bool ready(void)
{
    return VGL_LIKELY(vgl_self.slot != NULL) || vgl_attach();
}

static void log_refusal(const char *call, int device, uint64_t bytes, uint64_t cap)
{
    static unsigned refusals;
    char asked[32], capped[32], used[32];
    if (vgl_config.broken || device < 0) {
        /* The reason was logged once, when it arose. */
        vgl_log_bounded(VGL_LOG_INFO, &refusals, "%s of %s refused: vgpulimit cannot enforce its "
                        "limits (see the error above)", call, vgl_format_bytes(bytes, asked, sizeof asked));
        return;
    }
    vgl_log_bounded(VGL_LOG_WARN, &refusals, "%s of %s refused on device %d: cap %s, %s in use by "
                    "the container", call, vgl_format_bytes(bytes, asked, sizeof asked), device,
                    vgl_format_bytes(cap, capped, sizeof capped),
                    vgl_format_bytes(vgl_self.region->devices[device].used_bytes, used, sizeof used));
}

/* Reserves `bytes` on the current device.  CUDA_SUCCESS with c->device < 0
 * means there is no current context: the driver will say so itself. */
static CUresult charge_begin(const char *call, uint64_t bytes, struct charge *c)
{
    c->device = -1;
    c->bytes = bytes;
    if (VGL_UNLIKELY(vgl_config.broken) || !ready()) {
        log_refusal(call, -1, bytes, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int device = vgl_current_device();
    if (device < 0)
        return CUDA_SUCCESS;
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region "
                        "accounts for; its allocations are refused", device, VGL_MAX_DEVICES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t cap = cap_of(device, total_of(device));
    if (vgl_ledger_reserve(vgl_self.region, vgl_self.slot, (uint32_t)device, bytes, cap) < 0) {
        log_refusal(call, device, bytes, cap);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->device = device;
    return CUDA_SUCCESS;
}

static void charge_end(struct charge *c, CUresult rc, uint64_t ptr)
{
    if (c->device < 0)
        return;
    if (rc == CUDA_SUCCESS && vgl_allocations_add(ptr, c->device, c->bytes))
        return;
    /* The driver refused (or we could not record it, so a free could never
     * return it: then the memory stays used but uncounted, which is the
     * lesser harm than counting it forever). */
    vgl_ledger_release(vgl_self.region, vgl_self.slot, (uint32_t)c->device, c->bytes);
}

static void uncharge(uint64_t ptr)
{
    int32_t device;
    uint64_t bytes;
    if (vgl_self.slot && vgl_allocations_take(ptr, &device, &bytes))
        vgl_ledger_release(vgl_self.region, vgl_self.slot, (uint32_t)device, bytes);
}

CUresult cuMemAlloc_v2(CUdeviceptr_v2 *dptr, size_t bytesize)
{
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAlloc_v2(dptr, bytesize);
    struct charge c;
    CUresult rc = charge_begin("cuMemAlloc", bytesize, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMemAlloc_v2(dptr, bytesize);
    charge_end(&c, rc, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAlloc(dptr, bytesize);
    struct charge c;
    CUresult rc = charge_begin("cuMemAlloc", bytesize, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMemAlloc(dptr, bytesize);
    charge_end(&c, rc, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

/* A pitched allocation is reserved at the widest pitch we expect, then
 * settled to what the driver chose: the ledger never runs ahead of the cap. */
static CUresult settle_pitch(struct charge *c, CUresult rc, uint64_t ptr, uint64_t pitch,
                             uint64_t height, CUresult (*free_fn)(uint64_t))
{
    if (rc == CUDA_SUCCESS && c->device >= 0) {
        uint64_t actual = pitch * height;
        uint32_t device = (uint32_t)c->device;
        uint64_t cap = cap_of(c->device, total_of(c->device));
        if (actual < c->bytes) {
            vgl_ledger_release(vgl_self.region, vgl_self.slot, device, c->bytes - actual);
        } else if (actual > c->bytes &&
                   vgl_ledger_reserve(vgl_self.region, vgl_self.slot, device, actual - c->bytes,
                                      cap) < 0) {
            free_fn(ptr);
            log_refusal("cuMemAllocPitch", c->device, actual, cap);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            actual = c->bytes; /* what the release below returns */
        }
        c->bytes = actual;
    }
    charge_end(c, rc, ptr);
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
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct charge c;
    CUresult rc = charge_begin("cuMemAllocPitch", pitch_bound(WidthInBytes, Height), &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS)
        return settle_pitch(&c, rc, 0, 0, 0, free_v2);
    return settle_pitch(&c, rc, *dptr, *pPitch, Height, free_v2);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct charge c;
    CUresult rc = charge_begin("cuMemAllocPitch", pitch_bound(WidthInBytes, Height), &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS)
        return settle_pitch(&c, rc, 0, 0, 0, free_v1);
    return settle_pitch(&c, rc, *dptr, *pPitch, Height, free_v1);
}

/* Freed first, uncharged after: until the driver has the memory back, the
 * container still holds it.  A pointer we never charged is simply passed on. */
CUresult cuMemFree_v2(CUdeviceptr_v2 dptr)
{
    CUresult rc = vgl_real.cuMemFree_v2(dptr);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS && dptr)
        uncharge(dptr);
    return rc;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    CUresult rc = vgl_real.cuMemFree(dptr);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS && dptr)
        uncharge(dptr);
    return rc;
}

/* The capped view of a device whose driver reports (free, total): total
 * becomes the cap, free what the container has left under it (never more
 * than the device has free), used the container's own usage. */
struct view {
    uint64_t free_bytes, total_bytes, used_bytes;
};

static bool capped_view(int device, struct view *v)
{
    if (device < 0 || device >= VGL_MAX_DEVICES || !ready()) {
        v->free_bytes = 0; /* fail closed: nothing is allocatable */
        return true;
    }
    uint64_t cap = cap_of(device, v->total_bytes);
    if (cap == UINT64_MAX)
        return false;
    uint64_t used = __atomic_load_n(&vgl_self.region->devices[device].used_bytes, __ATOMIC_RELAXED);
    v->total_bytes = cap;
    v->used_bytes = used < cap ? used : cap;
    if (cap - v->used_bytes < v->free_bytes)
        v->free_bytes = cap - v->used_bytes;
    return true;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult rc = vgl_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    /* The driver decides what a NULL pointer means; we only cap what it wrote. */
    int device = vgl_current_device();
    struct view v = {free_bytes ? *free_bytes : UINT64_MAX,
                     total_bytes ? *total_bytes : (device >= 0 && device < VGL_MAX_DEVICES ? total_of(device) : 0), 0};
    if (capped_view(device, &v)) {
        if (free_bytes)
            *free_bytes = v.free_bytes;
        if (total_bytes)
            *total_bytes = v.total_bytes;
    }
    return rc;
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    CUresult rc = vgl_real.cuMemGetInfo(free_bytes, total_bytes);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    /* The driver decides what a NULL pointer means; we only cap what it wrote. */
    int device = vgl_current_device();
    struct view v = {free_bytes ? *free_bytes : UINT64_MAX,
                     total_bytes ? *total_bytes : (device >= 0 && device < VGL_MAX_DEVICES ? total_of(device) : 0), 0};
    if (capped_view(device, &v)) {
        if (free_bytes)
            *free_bytes = (unsigned int)v.free_bytes;
        if (total_bytes)
            *total_bytes = (unsigned int)v.total_bytes;
    }
    return rc;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice_v1 dev)
{
    CUresult rc = vgl_real.cuDeviceTotalMem_v2(bytes, dev);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || !bytes)
        return rc;
    struct view v = {0, *bytes, 0};
    if (capped_view(dev, &v))
        *bytes = v.total_bytes;
    return rc;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice_v1 dev)
{
    CUresult rc = vgl_real.cuDeviceTotalMem(bytes, dev);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || !bytes)
        return rc;
    struct view v = {0, *bytes, 0};
    if (capped_view(dev, &v))
        *bytes = (unsigned int)v.total_bytes;
    return rc;
}

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
    struct view v = {*free_bytes, *total, *used};
    if (capped_view(nvml_index(device), &v)) {
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

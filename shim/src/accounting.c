/* Accounting around a driver call: reserve in the container's ledger before
 * the driver is asked, settle to what the driver actually took, return it on
 * failure or free; and the capped view that the queries report.  The hooks
 * of every allocation family (memory_hooks.c, pool_hooks.c, vmm_hooks.c,
 * array_hooks.c) go through here. */
#include <errno.h>

#include "internal.h"

static uint64_t device_total[VGL_MAX_DEVICES]; /* as the driver reports it; 0: not asked yet */

int vgl_current_device(void)
{
    CUdevice device;
    if (vgl_real.cuCtxGetDevice(&device) != CUDA_SUCCESS || device < 0)
        return -1;
    return device;
}

uint64_t vgl_device_total(int device)
{
    uint64_t total = __atomic_load_n(&device_total[device], __ATOMIC_RELAXED);
    if (VGL_UNLIKELY(!total)) {
        size_t bytes;
        if (vgl_real.cuDeviceTotalMem_v2(&bytes, device) != CUDA_SUCCESS)
            return 0;
        total = bytes;
        __atomic_store_n(&device_total[device], total, __ATOMIC_RELAXED);
        if (vgl_self.region) {
            __atomic_store_n(&vgl_self.region->devices[device].total_bytes, total, __ATOMIC_RELAXED);
            vgl_device_note(device);
        }
    }
    return total;
}

/* Whether a region file lost pages under our mapping (region_guard.c): what
 * we read and write there is no longer shared with the container, so nothing
 * can be accounted.  Said once. */
static bool region_lost(void)
{
    static int said;
    bool lost = false;
    for (uint32_t i = 0; i < vgl_links() && !lost; i++)
        lost = vgl_region_broken(vgl_link_at(i).region);
    if (VGL_LIKELY(!lost))
        return false;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        vgl_log(VGL_LOG_ERROR, "region file %s%s was truncated while in use; device memory "
                "allocations are refused", vgl_config.region_path,
                vgl_self.nouter ? " (or one it is nested in)" : "");
    return true;
}

/* Read live: `vgpulimit set` changes it. */
uint64_t vgl_region_cap(const struct vgl_region *region, int device, uint64_t total)
{
    const struct vgl_mem_limit *live = &region->devices[device].limit;
    struct vgl_mem_limit limit = {
        .bytes = __atomic_load_n(&live->bytes, __ATOMIC_RELAXED),
        .ppm = __atomic_load_n(&live->ppm, __ATOMIC_RELAXED),
    };
    return vgl_cap_bytes(&limit, total);
}

uint64_t vgl_device_cap(int device, uint64_t total)
{
    if (VGL_UNLIKELY(vgl_config.broken))
        return 0;
    uint64_t cap = UINT64_MAX;
    for (uint32_t i = 0; i < vgl_links(); i++) {
        uint64_t own = vgl_region_cap(vgl_link_at(i).region, device, total);
        cap = own < cap ? own : cap;
    }
    /* After the reads: a page lost to them reads as zeros, which mean no cap. */
    if (VGL_UNLIKELY(region_lost()))
        return 0;
    return cap;
}

int vgl_reserve(uint32_t device, uint64_t bytes, bool forced, uint32_t *refused)
{
    uint64_t total = forced ? 0 : vgl_device_total((int)device);
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_link link = vgl_link_at(i);
        uint64_t cap = forced ? UINT64_MAX : vgl_region_cap(link.region, (int)device, total);
        if (VGL_UNLIKELY(vgl_config.broken))
            cap = 0;
        if (vgl_region_reserve(link.region, link.slot, device, bytes, cap) < 0) {
            if (refused)
                *refused = i;
            while (i--)
                vgl_ledger_release(vgl_link_at(i).region, vgl_link_at(i).slot, device, bytes);
            return -ENOMEM;
        }
    }
    return 0;
}

void vgl_release(uint32_t device, uint64_t bytes)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        vgl_ledger_release(vgl_link_at(i).region, vgl_link_at(i).slot, device, bytes);
}

void vgl_follow_reserve(uint32_t device, uint64_t charged, uint64_t reserved)
{
    if (reserved < charged)
        vgl_release(device, charged - reserved);
    else if (reserved > charged)
        vgl_reserve(device, reserved - charged, true, NULL);
}

bool vgl_ready(void)
{
    return !region_lost() && (VGL_LIKELY(vgl_self.slot != NULL) || vgl_attach());
}

/* `link`: the region whose cap refused (0 the process's own, then those it is
 * nested in); < 0: no limit could be enforced at all. */
static void log_refusal(const char *call, int device, uint64_t bytes, int link)
{
    static unsigned refusals;
    char asked[32], capped[32], used[32];
    if (link < 0 || device < 0 || region_lost()) {
        /* The reason was logged once, when it arose. */
        vgl_log_bounded(VGL_LOG_INFO, &refusals, "%s of %s refused: vgpulimit cannot enforce its "
                        "limits (see the error above)", call, vgl_format_bytes(bytes, asked, sizeof asked));
        return;
    }
    const struct vgl_region *region = vgl_link_at((uint32_t)link).region;
    vgl_log_bounded(VGL_LOG_WARN, &refusals, "%s of %s refused on device %d: cap %s, %s in use by "
                    "%s", call, vgl_format_bytes(bytes, asked, sizeof asked), device,
                    vgl_format_bytes(vgl_region_cap(region, device, vgl_device_total(device)), capped, sizeof capped),
                    vgl_format_bytes(region->devices[device].used_bytes, used, sizeof used),
                    link ? "the run this one is nested in" : "the container");
}

CUresult vgl_charge_begin(const char *call, int device, uint64_t bytes, struct vgl_charge *c)
{
    c->device = -1;
    c->bytes = bytes;
    c->call = call;
    if (VGL_UNLIKELY(vgl_config.broken) || !vgl_ready()) {
        log_refusal(call, -1, bytes, -1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (device < 0)
        device = vgl_current_device();
    if (device < 0)
        return CUDA_SUCCESS;
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region "
                        "accounts for; its allocations are refused", device, VGL_MAX_DEVICES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgl_overhead_check(device);
    uint32_t refused;
    int err = vgl_reserve((uint32_t)device, bytes, false, &refused);
    /* A region may have been lost during the reservation itself: then it
     * counted into zeros that only we see (no need to return it there). */
    if (err < 0 || VGL_UNLIKELY(region_lost())) {
        log_refusal(call, device, bytes, err < 0 ? (int)refused : -1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->device = device;
    return CUDA_SUCCESS;
}

bool vgl_charge_settle(struct vgl_charge *c, uint64_t actual, bool force)
{
    if (c->device < 0 || actual == c->bytes)
        return true;
    uint32_t device = (uint32_t)c->device;
    if (actual < c->bytes) {
        vgl_release(device, c->bytes - actual);
    } else {
        uint32_t refused;
        if (vgl_reserve(device, actual - c->bytes, force, &refused) < 0) {
            log_refusal(c->call, c->device, actual, (int)refused);
            return false;
        }
    }
    c->bytes = actual;
    return true;
}

void vgl_charge_end(struct vgl_charge *c, CUresult rc, enum vgl_allocation_kind kind, uint64_t key)
{
    if (c->device < 0)
        return;
    if (rc == CUDA_SUCCESS && vgl_allocations_put(kind, key, c->device, c->bytes, 0))
        return;
    /* The driver refused (or we could not record it, so a free could never
     * return it: then the memory stays used but uncounted, which is the
     * lesser harm than counting it forever). */
    vgl_release((uint32_t)c->device, c->bytes);
}

void vgl_charge_cancel(struct vgl_charge *c)
{
    if (c->device >= 0)
        vgl_release((uint32_t)c->device, c->bytes);
    c->device = -1;
}

void vgl_uncharge(enum vgl_allocation_kind kind, uint64_t key)
{
    int32_t device;
    uint64_t bytes;
    if (vgl_self.slot && vgl_allocations_take(kind, key, &device, &bytes))
        vgl_release((uint32_t)device, bytes);
}

/* The capped view of a device whose driver reports (free, total): total
 * becomes the cap, free what the container has left under it (never more
 * than the device has free), used the container's own usage. */
bool vgl_capped_view(int device, struct vgl_view *v)
{
    /* A view needs the region, not a slot: a monitor is not a tenant. */
    if (device < 0 || device >= VGL_MAX_DEVICES || !vgl_map_region()) {
        v->free_bytes = 0; /* fail closed: nothing is allocatable */
        return true;
    }
    uint64_t total = v->total_bytes;
    uint64_t cap = vgl_device_cap(device, total);
    if (cap == UINT64_MAX)
        return false;
    uint64_t used = __atomic_load_n(&vgl_self.region->devices[device].used_bytes, __ATOMIC_RELAXED);
    v->total_bytes = cap;
    v->used_bytes = used < cap ? used : cap;
    /* Free is what fits under every cap the process counts in. */
    for (uint32_t i = 0; i < vgl_links() && cap; i++) {
        const struct vgl_region *region = vgl_link_at(i).region;
        uint64_t own = vgl_region_cap(region, device, total);
        uint64_t in_use = __atomic_load_n(&region->devices[device].used_bytes, __ATOMIC_RELAXED);
        uint64_t left = in_use < own ? own - in_use : 0;
        if (left < v->free_bytes)
            v->free_bytes = left;
    }
    if (cap - v->used_bytes < v->free_bytes)
        v->free_bytes = cap - v->used_bytes;
    return true;
}


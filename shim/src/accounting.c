/* The process's account in its regions: bytes reserved and returned on every
 * region it counts in (its own, and each it is nested in), the caps read
 * live, the devices' totals, and the capped view that the queries report.
 * A charge around one driver call is built on it (charge.c). */
#include <errno.h>

#include "internal.h"

static uint64_t device_total[VGL_MAX_DEVICES]; /* as the driver reports it; 0: not asked yet */
static bool device_used[VGL_MAX_DEVICES];      /* the region has been told (vgl_device_used) */

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
    }
    return total;
}

static void tell_region(int device)
{
    uint64_t total = vgl_device_total(device);
    if (!total || !vgl_self.region)
        return; /* told at the next use */
    __atomic_store_n(&vgl_self.region->devices[device].total_bytes, total, __ATOMIC_RELAXED);
    vgl_device_note(device);
    __atomic_store_n(&device_used[device], true, __ATOMIC_RELAXED);
}

/* Inline on the hot path: a load once the region has been told. */
static inline void used(int device)
{
    if (VGL_UNLIKELY(!__atomic_load_n(&device_used[device], __ATOMIC_RELAXED)))
        tell_region(device);
}

void vgl_device_used(int device) { used(device); }

/* Whether a region file lost pages under our mapping (region_guard.c): what
 * we read and write there is no longer shared with the container, so nothing
 * can be accounted.  Said once. */
bool vgl_region_lost(void)
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
    if (VGL_UNLIKELY(vgl_region_lost()))
        return 0;
    return cap;
}

/* Changes to this process's charges begun and ended by its threads (a
 * charge around a driver call, charge.c, is one): the driver's figure for
 * the process is compared with the ledger only while they are equal
 * (overhead.c). */
static uint64_t begun, ended;

uint64_t vgl_charges_mark(void)
{
    uint64_t e = __atomic_load_n(&ended, __ATOMIC_SEQ_CST);
    uint64_t b = __atomic_load_n(&begun, __ATOMIC_SEQ_CST);
    return b == e ? b : UINT64_MAX;
}

bool vgl_charges_quiet_since(uint64_t mark)
{
    return mark != UINT64_MAX && __atomic_load_n(&begun, __ATOMIC_SEQ_CST) == mark;
}

/* A charge under way in another thread of the parent is none of the child's. */
static void forget_in_child(void)
{
    __atomic_store_n(&ended, __atomic_load_n(&begun, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
}
VGL_AFTER_FORK(forget_in_child)

void vgl_charges_enter(void) { __atomic_add_fetch(&begun, 1, __ATOMIC_SEQ_CST); }
void vgl_charges_leave(void) { __atomic_add_fetch(&ended, 1, __ATOMIC_SEQ_CST); }

/* Bytes ever reserved on each device by this process (overhead.c). */
static uint64_t reserved_ever[VGL_MAX_DEVICES];

uint64_t vgl_reserved_ever(int device) { return __atomic_load_n(&reserved_ever[device], __ATOMIC_SEQ_CST); }

int vgl_reserve(uint32_t device, uint64_t bytes, bool forced, bool count, uint32_t *refused)
{
    uint64_t total = 0;
    if (!forced) {
        used((int)device);
        total = vgl_device_total((int)device);
    }
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_link link = vgl_link_at(i);
        uint64_t cap = forced ? UINT64_MAX : vgl_region_cap(link.region, (int)device, total);
        if (VGL_UNLIKELY(vgl_config.broken))
            cap = 0;
        int err = count ? vgl_region_reserve(link.region, link.slot, device, bytes, cap)
                        : vgl_region_reserve_quietly(link.region, link.slot, device, bytes, cap);
        if (err < 0) {
            if (refused)
                *refused = i;
            while (i--)
                vgl_ledger_release(vgl_link_at(i).region, vgl_link_at(i).slot, device, bytes);
            return err == -ETIMEDOUT ? err : -ENOMEM;
        }
    }
    /* After the process's slot counts them, never before: overhead.c reads
     * this figure, then the slot, and a reservation its slot read missed must
     * show here as made since.  (Counted first, a thread stopped between the
     * two had its block, once the driver held it, taken for the driver's own
     * cost: 16 MiB of a 1 GiB cap refused, under load, with 64 threads.) */
    if (device < VGL_MAX_DEVICES)
        __atomic_add_fetch(&reserved_ever[device], bytes, __ATOMIC_SEQ_CST);
    return 0;
}

void vgl_release_unused(uint32_t device, uint64_t bytes)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        vgl_ledger_release(vgl_link_at(i).region, vgl_link_at(i).slot, device, bytes);
}

void vgl_release(uint32_t device, uint64_t bytes)
{
    vgl_release_unused(device, bytes);
    if (vgl_elastic_takes_part())
        vgl_elastic_changed((int)device, 0, true);
}

void vgl_follow_reserve(uint32_t device, uint64_t charged, uint64_t reserved)
{
    vgl_charges_enter();
    if (reserved < charged)
        vgl_release(device, charged - reserved);
    else if (reserved > charged)
        vgl_reserve(device, reserved - charged, true, true, NULL);
    vgl_charges_leave();
}

/* The first attach binds the devices to their UUIDs, before the first
 * allocation is weighed against a cap that a limit by UUID may set. */
static bool attach(void)
{
    bool attached = vgl_attach();
    if (attached) {
        vgl_devices_note_all();
        vgl_elastic_attached();
    }
    return attached;
}

bool vgl_ready(void)
{
    return !VGL_UNLIKELY(vgl_config.broken) && !vgl_region_lost() &&
           (VGL_LIKELY(vgl_self.slot != NULL) || attach()) && vgl_named_devices_hold();
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
    uint64_t total = v->total_bytes, physical = v->free_bytes;
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
    /* Past its request a container has only what no other one is owed. */
    uint64_t elastic;
    if (vgl_elastic_view_free(device, total, cap, used, physical, &elastic) && elastic < v->free_bytes)
        v->free_bytes = elastic;
    return true;
}


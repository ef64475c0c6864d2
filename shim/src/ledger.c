/* The ledger: bytes per device, reserved before the driver is asked, so that
 * racing processes can never together pass the cap.  The slots' counts are
 * the truth; a device's used_bytes is their sum, kept under the device lock,
 * and recomputed from them when a holder of that lock died mid-update. */
#include <errno.h>

#include "internal.h"

void vgl_ledger_repair(struct vgl_region *region, uint32_t device)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
        if (region->slots[i].state == VGL_SLOT_LIVE)
            sum += region->slots[i].used_bytes[device];
    __atomic_store_n(&region->devices[device].used_bytes, sum, __ATOMIC_RELAXED);
}

static void device_lock(struct vgl_region *region, uint32_t device)
{
    struct vgl_lock *lock = &region->devices[device].lock;
    if (vgl_lock_acquire(lock)) {
        vgl_ledger_repair(region, device);
        vgl_lock_consistent(lock);
    }
}

static int try_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    struct vgl_device_state *dev = &region->devices[device];
    device_lock(region, device);
    uint64_t used = dev->used_bytes;
    int err = used > cap || bytes > cap - used ? -ENOMEM : 0;
    if (!err) {
        /* The slot first: a death between the two stores leaves the slot
         * ahead, which a repair turns back into a consistent sum. */
        __atomic_store_n(&slot->used_bytes[device], slot->used_bytes[device] + bytes, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->used_bytes, used + bytes, __ATOMIC_RELAXED);
    }
    vgl_lock_release(&dev->lock);
    return err;
}

int vgl_ledger_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    if (device >= VGL_MAX_DEVICES)
        return -EINVAL;
    int err = try_reserve(region, slot, device, bytes, cap);
    /* Short of room: the bytes of processes that died are the first to take back. */
    if (err == -ENOMEM && vgl_region_reclaim(region) > 0)
        err = try_reserve(region, slot, device, bytes, cap);
    if (err == -ENOMEM)
        __atomic_add_fetch(&region->devices[device].oom_refusals, 1, __ATOMIC_RELAXED);
    return err;
}

void vgl_ledger_release(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                        uint64_t bytes)
{
    if (device >= VGL_MAX_DEVICES)
        return;
    struct vgl_device_state *dev = &region->devices[device];
    device_lock(region, device);
    uint64_t own = slot->used_bytes[device];
    if (bytes > own)
        bytes = own; /* never below zero, whatever the caller believes */
    __atomic_store_n(&slot->used_bytes[device], own - bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&dev->used_bytes, dev->used_bytes >= bytes ? dev->used_bytes - bytes : 0,
                     __ATOMIC_RELAXED);
    vgl_lock_release(&dev->lock);
}

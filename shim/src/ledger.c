/* The ledger: bytes per device, reserved before the driver is asked, so that
 * racing processes can never together pass the cap.  Lock-free: no lock is
 * taken unless a process died in the middle of a change.
 *
 * A reservation is one compare-and-swap on the device's used_bytes that
 * refuses to pass the cap, then an atomic add to the slot's own count; a
 * release takes from the slot first, then from the device.  The cap is
 * checked in the same atomic step that raises the total, so no two
 * reservations can together pass it; and since the device is counted first
 * on the way up and last on the way down, used_bytes is never below what the
 * slots hold: it can only over-state, never let through a byte too many.
 *
 * A death between the two steps.  Each change raises the slot's `busy`
 * count before it touches a count and lowers it after (atomically: the
 * threads of a process share its slot).  A process that died with busy at 0
 * left its slot holding exactly what it added to the devices, and a
 * reclaimer gives that back with an ordinary release (raising the dead
 * slot's busy meanwhile, so that its own death is caught the same way).
 * One that died with busy raised may have counted a device and not its slot,
 * or (releasing) its slot and not the device, or neither: nothing says which,
 * so its counts are dropped and every device's total is recounted as the sum
 * of the live slots (vgl_ledger_recount).  After that, the totals are exact:
 * the dead slot counts for nothing, and the driver has freed its memory.
 *
 * The recount must see no change under way: it would miss a reservation
 * counted on the device but not yet on its slot, and come out short.  So the
 * recounter, under the region lock, sets every device's `frozen`, then waits
 * until each live slot's busy is 0.  A change raises busy and then reads
 * frozen, both sequentially consistent, as the recounter writes frozen and
 * then reads busy: of the two, at least one sees the other's write.  Either
 * the recounter sees busy and waits for that change to end (a few
 * instructions; a slot whose process died meanwhile is dropped), or the
 * change sees frozen before touching anything, lowers busy again and waits
 * for the region lock, which the recounter holds until it has written the
 * totals and cleared frozen.  No total is written by anything but an atomic
 * read-modify-write, except the recount's own, made while nothing changes.
 *
 * A recounter that dies leaves the region lock to its next taker, who is
 * told (a robust mutex) and recounts again (vgl_region_lock); frozen flags
 * found set by the holder of the region lock are such leftovers too.  So
 * no death, at any instruction, leaves the totals off past the next reclaim,
 * or anyone waiting on a process that is gone.  A live process stopped (by a
 * signal, a debugger) in the middle of a change holds up a recount, and with
 * it the changes of the others, until it resumes: that wait is what makes
 * the recount exact. */
#include <errno.h>
#include <sched.h>
#include <time.h>

#include "internal.h"

/* A change to the counts on `device` begins, unless a recount holds the
 * devices frozen: then false, and nothing changed. */
static bool begin_change(struct vgl_region *region, struct vgl_slot *slot, uint32_t device)
{
    __atomic_add_fetch(&slot->busy, 1, __ATOMIC_SEQ_CST);
    if (VGL_LIKELY(!__atomic_load_n(&region->devices[device].frozen, __ATOMIC_SEQ_CST)))
        return true;
    __atomic_sub_fetch(&slot->busy, 1, __ATOMIC_RELEASE);
    return false;
}

/* Both counts are written: a recounter that sees busy drop sees them. */
static void end_change(struct vgl_slot *slot) { __atomic_sub_fetch(&slot->busy, 1, __ATOMIC_RELEASE); }

/* The recounter holds the region lock until it is done. */
static void wait_for_recount(struct vgl_region *region)
{
    vgl_region_lock(region);
    vgl_region_unlock(region);
}

/* 0, -ENOMEM, or -EAGAIN: frozen, nothing done. */
static int try_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    if (!begin_change(region, slot, device))
        return -EAGAIN;
    uint64_t *used = &region->devices[device].used_bytes;
    uint64_t now = __atomic_load_n(used, __ATOMIC_RELAXED);
    do {
        if (now > cap || bytes > cap - now) {
            end_change(slot);
            return -ENOMEM;
        }
    } while (!__atomic_compare_exchange_n(used, &now, now + bytes, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    __atomic_add_fetch(&slot->used_bytes[device], bytes, __ATOMIC_RELAXED);
    end_change(slot);
    return 0;
}

static int reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                   uint64_t bytes, uint64_t cap)
{
    int err;
    while ((err = try_reserve(region, slot, device, bytes, cap)) == -EAGAIN)
        wait_for_recount(region);
    return err;
}

int vgl_ledger_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    if (device >= VGL_MAX_DEVICES)
        return -EINVAL;
    int err = reserve(region, slot, device, bytes, cap);
    /* Short of room: the bytes of processes that died are the first to take back. */
    if (err == -ENOMEM && vgl_region_reclaim(region) > 0)
        err = reserve(region, slot, device, bytes, cap);
    if (err == -ENOMEM)
        __atomic_add_fetch(&region->devices[device].oom_refusals, 1, __ATOMIC_RELAXED);
    return err;
}

/* Subtracts at most `*bytes` from `*count`, never below zero; says how much in `*bytes`. */
static void take(uint64_t *count, uint64_t *bytes)
{
    uint64_t now = __atomic_load_n(count, __ATOMIC_RELAXED), part;
    do
        part = *bytes < now ? *bytes : now;
    while (!__atomic_compare_exchange_n(count, &now, now - part, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    *bytes = part;
}

static bool try_release(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                        uint64_t bytes)
{
    if (!begin_change(region, slot, device))
        return false;
    /* Never more than the slot holds, whatever the caller believes. */
    take(&slot->used_bytes[device], &bytes);
    if (bytes)
        take(&region->devices[device].used_bytes, &bytes);
    end_change(slot);
    return true;
}

void vgl_ledger_release(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                        uint64_t bytes)
{
    if (device >= VGL_MAX_DEVICES)
        return;
    while (!try_release(region, slot, device, bytes))
        wait_for_recount(region);
}

void vgl_ledger_drop(struct vgl_slot *slot)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        __atomic_store_n(&slot->used_bytes[d], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->busy, 0, __ATOMIC_RELEASE);
}

/* Waits until no change of `slot`'s is under way; one whose process died
 * in the middle never ends, so its counts are dropped. */
static void settle(struct vgl_slot *slot)
{
    for (unsigned tries = 0; __atomic_load_n(&slot->busy, __ATOMIC_SEQ_CST) != 0; tries++) {
        if (tries < 64)
            continue; /* a change is a few instructions */
        if (tries % 256 == 64 && !vgl_proc_running(slot->pid, slot->start_time)) {
            vgl_ledger_drop(slot);
            return;
        }
        if (tries < 1024) {
            sched_yield(); /* its process was preempted */
        } else {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL); /* stopped, most likely */
        }
    }
}

void vgl_ledger_recount(struct vgl_region *region)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        __atomic_store_n(&region->devices[d].frozen, 1, __ATOMIC_SEQ_CST);
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
        if (__atomic_load_n(&region->slots[i].state, __ATOMIC_ACQUIRE) == VGL_SLOT_LIVE)
            settle(&region->slots[i]);
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
            if (region->slots[i].state == VGL_SLOT_LIVE)
                sum += __atomic_load_n(&region->slots[i].used_bytes[d], __ATOMIC_RELAXED);
        __atomic_store_n(&region->devices[d].used_bytes, sum, __ATOMIC_RELAXED);
    }
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        __atomic_store_n(&region->devices[d].frozen, 0, __ATOMIC_RELEASE);
}

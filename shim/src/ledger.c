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
 * slots hold: it can over-state, never let a byte too many through.
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
 * of the slots (vgl_ledger_recount).  Then the totals are exact: the dropped
 * slot counts for nothing, and the driver has freed its process's memory.
 *
 * The recount must see no change under way: it would miss a reservation
 * counted on the device but not yet on its slot, and come out short.  So the
 * recounter, under the region lock, sets every device's `frozen`, then waits
 * until each live slot's busy is 0.  A change raises busy and then reads
 * frozen, both sequentially consistent, as the recounter writes frozen and
 * then reads busy: of the two, at least one sees the other's write.  Either
 * the recounter sees busy and waits for that change to end (a few
 * instructions), or the change sees frozen before it touches a count, lowers
 * busy again and waits for the region lock, which the recounter holds until
 * it has written the totals and cleared frozen.  No total is written but by
 * an atomic read-modify-write, except the recount's own, made while nothing
 * changes.
 *
 * Dropping and writing the totals go together: a dead slot's counts are
 * zeroed only once every change has settled, and its busy stays raised
 * until the totals are written, so a recounter that dies in between leaves
 * the slot to be dropped again by the next.  One that dies at any point
 * leaves the region lock to its next taker, who is told (a robust mutex) and
 * recounts again (vgl_ledger_lock); frozen flags found set by the holder of
 * the region lock are such leftovers too.  So no death, at any instruction,
 * leaves the totals off past the next reclaim, or anyone waiting on a
 * process that is gone.
 *
 * A live process stopped (a signal, a debugger) in the middle of a change,
 * or one in another pid namespace that died in the middle of one (it cannot
 * be told from a live one), would hold a recount, and with it every change,
 * up forever.  So a recount waits for a slot at most vgl_timings.recount_wait_ns; then it
 * gives up, having written nothing: the totals keep over-stating what the
 * dead held, and its slot stays for a later reclaim to try again.  The same
 * goes for a process stopped while it holds the region lock itself, recount
 * or not: nobody waits for the lock past a bound (vgl_ledger_lock). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
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

static pthread_mutex_t *region_mutex(struct vgl_region *region)
{
    return (pthread_mutex_t *)(void *)region->lock.opaque;
}

static bool any_frozen(const struct vgl_region *region)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        if (__atomic_load_n(&region->devices[d].frozen, __ATOMIC_RELAXED))
            return true;
    return false;
}

/* Slot claims and limits are written so that a half-done change is harmless
 * (a slot's state is set last); the totals are not (a recount cut short,
 * devices left frozen), so they are recounted.
 *
 * The lock is in a file every process of the container can write, and a
 * live holder can keep it as long as it likes (stopped by a signal or a
 * debugger; or a lock word written by a tenant to name a live thread).  So
 * nobody waits for it longer than vgl_timings.lock_wait_ns: then the caller is told
 * (-ETIMEDOUT) and does without, failing closed for that call (a slot is not
 * claimed, a limit not changed, the dead not reclaimed); the next call tries
 * again.  The holder may be working still, so nothing it guards is touched.
 *
 * A program that calls in a loop would wait the bound at every call, so the
 * process remembers the holder that kept the lock for a whole wait (the same
 * thread named at its start and end), and waits only vgl_timings.lock_recheck_ns
 * while the lock word names that thread: held by another thread, or by
 * nobody, the wait is the whole bound again.  Remembered by the thread id
 * alone, for any region and pid namespace: a thread that merely has the same
 * id (or the same one, taking the lock again) then gets the short wait, which
 * the lock's ordinary holders (a claim, a recount) are done well within. */
static uint32_t stuck_holder; /* 0: none; atomic, never a lock of its own */

int vgl_ledger_lock(struct vgl_region *region)
{
    bool repaired;
    uint32_t holder = vgl_robust_owner(region_mutex(region));
    bool stuck = holder && holder == __atomic_load_n(&stuck_holder, __ATOMIC_RELAXED);
    int err = vgl_robust_lock_within(region_mutex(region), stuck ? vgl_timings.lock_recheck_ns : vgl_timings.lock_wait_ns,
                                     &repaired);
    if (err == -ETIMEDOUT && !stuck && holder && holder == vgl_robust_owner(region_mutex(region)))
        __atomic_store_n(&stuck_holder, holder, __ATOMIC_RELAXED);
    if (repaired) {
        static unsigned said;
        vgl_log_bounded(VGL_LOG_ERROR, &said, "the region lock's word named no possible thread (it was "
                        "written by something other than vgpulimit); taken as a dead holder's, and the "
                        "region's totals recounted");
    }
    if (err == -ETIMEDOUT)
        return err; /* said by whoever was refused, with the holder (vgl_region_lock_holder) */
    if (err < 0) {
        /* Not from vgpulimit, which makes every EOWNERDEAD consistent: the
         * lock's bytes were written by something else.  Nothing it guards is
         * touched. */
        static unsigned said;
        vgl_log_bounded(VGL_LOG_ERROR, &said, "region lock unusable: %s", strerror(-err));
        return err;
    }
    /* Only the lock's holder freezes, and it thaws before it lets go. */
    if (err == 1 || any_frozen(region))
        vgl_ledger_recount(region);
    if (err == 1)
        pthread_mutex_consistent(region_mutex(region));
    return 0;
}

void vgl_ledger_unlock(struct vgl_region *region) { pthread_mutex_unlock(region_mutex(region)); }

/* The recounter holds the region lock until it is done. */
static int wait_for_recount(struct vgl_region *region)
{
    int err = vgl_ledger_lock(region);
    if (!err)
        vgl_ledger_unlock(region);
    return err;
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

int vgl_ledger_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    if (device >= VGL_MAX_DEVICES)
        return -EINVAL;
    int err;
    while ((err = try_reserve(region, slot, device, bytes, cap)) == -EAGAIN) {
        int broken = wait_for_recount(region);
        if (broken)
            return broken;
    }
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
    /* With the lock broken, the bytes stay counted: over-stated, never passed. */
    while (!try_release(region, slot, device, bytes))
        if (wait_for_recount(region))
            return;
}


/* Waits until no change of `slot`'s is under way: true, or false when it
 * stays under way for vgl_timings.recount_wait_ns.  A slot whose process is found gone
 * is dead: its change under way never ends, and the recount drops it. */
static bool settle(const struct vgl_region *region, struct vgl_slot *slot)
{
    uint64_t deadline = 0;
    for (unsigned tries = 0; __atomic_load_n(&slot->busy, __ATOMIC_SEQ_CST) != 0; tries++) {
        if (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == VGL_SLOT_DEAD)
            return true;
        if (tries < 64)
            continue; /* a change is a few instructions */
        if (tries % 256 == 64 && !vgl_owner_running(region, slot)) {
            __atomic_store_n(&slot->state, VGL_SLOT_DEAD, __ATOMIC_RELEASE);
            return true;
        }
        uint64_t now = vgl_clock_ns(CLOCK_MONOTONIC);
        if (!deadline)
            deadline = now + vgl_timings.recount_wait_ns;
        else if (now > deadline)
            return false;
        if (tries < 1024) {
            sched_yield(); /* its process was preempted */
        } else {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL); /* stopped, most likely */
        }
    }
    return true;
}

static bool counted(const struct vgl_slot *slot)
{
    uint32_t state = __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE);
    return state == VGL_SLOT_LIVE || state == VGL_SLOT_DEAD;
}

static bool torn(const struct vgl_slot *slot)
{
    return __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == VGL_SLOT_DEAD &&
           __atomic_load_n(&slot->busy, __ATOMIC_RELAXED);
}

bool vgl_ledger_recount(struct vgl_region *region)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        __atomic_store_n(&region->devices[d].frozen, 1, __ATOMIC_SEQ_CST);
    bool settled = true;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS && settled; i++)
        if (counted(&region->slots[i]))
            settled = settle(region, &region->slots[i]);
    if (settled) {
        for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
            if (torn(&region->slots[i]))
                for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
                    __atomic_store_n(&region->slots[i].used_bytes[d], 0, __ATOMIC_RELAXED);
        for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++) {
            uint64_t sum = 0;
            for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
                if (counted(&region->slots[i]))
                    sum += __atomic_load_n(&region->slots[i].used_bytes[d], __ATOMIC_RELAXED);
            __atomic_store_n(&region->devices[d].used_bytes, sum, __ATOMIC_RELAXED);
        }
        for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
            if (torn(&region->slots[i]))
                __atomic_store_n(&region->slots[i].busy, 0, __ATOMIC_RELEASE);
    }
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        __atomic_store_n(&region->devices[d].frozen, 0, __ATOMIC_RELEASE);
    return settled;
}

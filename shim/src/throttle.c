/* The compute share: a container's budget of GPU time on one device, a token
 * bucket kept in the device's region state so that all the container's
 * processes draw from one controller.
 *
 * The budget grows with the clock at the share (30 % of a second buys 300 ms
 * of kernels) up to vgl_timings.budget_window_ns of it, so an idle container cannot
 * hoard; it starts full.  A launch may start while the budget is not negative and takes its
 * expected GPU time from it at once, so a burst of launches cannot outrun the
 * measurements; when the kernel's real GPU time is measured the difference is
 * settled.  A launch that costs more than there is leaves the budget owing,
 * and later launches wait until the clock has paid it back: over any stretch
 * of time the container gets its share, whatever its kernels' lengths.
 *
 * Every update is a compare-and-swap on the shared words: no lock, so a
 * process killed at any instruction blocks no one (at worst one refill or one
 * settlement is lost).  The clock is the caller's, so this file can be tested
 * alone (tests/c/throttle_test.c). */
#include "internal.h"


uint32_t vgl_throttle_share(const struct vgl_device_state *dev)
{
    uint32_t pct = __atomic_load_n(&dev->cores_pct, __ATOMIC_RELAXED);
    if (__atomic_load_n(&dev->cores_policy, __ATOMIC_RELAXED) == VGL_CORES_NONE)
        return 0;
    return pct < 100 ? pct : 0;
}

static void refill(struct vgl_device_state *dev, uint64_t now_ns, uint32_t pct)
{
    uint64_t last = __atomic_load_n(&dev->budget_at_ns, __ATOMIC_ACQUIRE);
    if (last == 0) {
        /* A container that has not launched yet was idle: it holds what an
         * idle one keeps, so that its first kernel, charged before it is
         * measured, leaves it no debt to wait for. */
        if (__atomic_compare_exchange_n(&dev->budget_at_ns, &last, now_ns, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            __atomic_add_fetch(&dev->budget_ns, (int64_t)(vgl_timings.budget_window_ns * pct / 100), __ATOMIC_ACQ_REL);
        return;
    }
    /* Every process of the container keeps the same clock (the node's), so
     * a refill this far in the future was written by no process of ours (a
     * region written by hand, or a process whose time namespace's offset it
     * could not know): waiting for that future would stall the container,
     * so the clock restarts from ours.  (A caller whose clock reading went
     * stale over a second, stopped in between, rewinds it too: the budget
     * gains at most a window and the debt it owed.) */
    if (last > now_ns + vgl_timings.refill_ahead_ns) {
        __atomic_compare_exchange_n(&dev->budget_at_ns, &last, now_ns, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return;
    }
    /* One process turns each stretch of time into budget: the one that moves the clock. */
    if (now_ns <= last || !__atomic_compare_exchange_n(&dev->budget_at_ns, &last, now_ns, false,
                                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    /* A debt is paid by all the time that passed; a surplus is capped below.
     * (Past a day the sum could overflow, and the cap would apply anyway.) */
    uint64_t elapsed = now_ns - last;
    if (elapsed > vgl_timings.budget_elapsed_max_ns)
        elapsed = vgl_timings.budget_elapsed_max_ns;
    int64_t full = (int64_t)(vgl_timings.budget_window_ns * pct / 100);
    int64_t add = (int64_t)(elapsed * pct / 100);
    /* The cap bounds what the clock adds, not what settlements gave back:
     * a refund for launches charged more than their kernels took (streams
     * whose spans overlap) is kept, or the container would pay for time it
     * did not use. */
    int64_t budget = __atomic_load_n(&dev->budget_ns, __ATOMIC_ACQUIRE), next;
    do
        next = budget + add <= full ? budget + add : budget > full ? budget : full;
    while (!__atomic_compare_exchange_n(&dev->budget_ns, &budget, next, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
}

int64_t vgl_throttle_admit(struct vgl_device_state *dev, uint64_t now_ns, int64_t cost_ns)
{
    uint32_t pct = vgl_throttle_share(dev);
    if (!pct)
        return 0;
    refill(dev, now_ns, pct);
    int64_t budget = __atomic_load_n(&dev->budget_ns, __ATOMIC_ACQUIRE);
    while (budget >= 0)
        if (__atomic_compare_exchange_n(&dev->budget_ns, &budget, budget - cost_ns, true, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 0;
    /* When the clock will have paid the debt at this share. */
    return -budget * 100 / pct + 1;
}

int64_t vgl_throttle_owed(struct vgl_device_state *dev, uint64_t now_ns)
{
    uint32_t pct = vgl_throttle_share(dev);
    if (!pct)
        return 0;
    refill(dev, now_ns, pct);
    int64_t budget = __atomic_load_n(&dev->budget_ns, __ATOMIC_ACQUIRE);
    return budget < 0 ? -budget * 100 / pct + 1 : 0;
}

void vgl_throttle_settle(struct vgl_device_state *dev, int64_t charged_ns, int64_t measured_ns)
{
    if (charged_ns != measured_ns)
        __atomic_add_fetch(&dev->budget_ns, charged_ns - measured_ns, __ATOMIC_ACQ_REL);
}

void vgl_throttle_lend(struct vgl_device_state *dev, int64_t cost_ns)
{
    /* What the container owes is forgiven: lent time is never paid back, so
     * once lending ends its share holds at once. */
    __atomic_store_n(&dev->budget_ns, -cost_ns, __ATOMIC_RELEASE);
}

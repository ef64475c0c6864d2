/* The budgets a launch on a device draws from: the device's state in the
 * process's region and in each region that one is nested in (a nested
 * `vgpulimit run`), so that what the process's kernels take counts in all of
 * them.  A launch goes when every budget that holds a share admits it
 * (throttle.c keeps each); a borrowing container's is lent the device's idle
 * time, as the real NVML tells it. */
#include "internal.h"

/* A launch that waited for budget waits on until the budget holds resume_ns
 * (timings.def), or RESUME_KERNELS of its kernel if more (at most three
 * quarters of what the container may keep), so that bursts are long: a long
 * kernel's burst of resume_ns would be one kernel or two.  (Longer bursts of
 * short kernels, from several processes at once, stretch one another's
 * spans.) */
#define RESUME_KERNELS 4

static uint32_t states(int device, struct vgl_device_state **out)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        out[i] = &vgl_link_at(i).region->devices[device];
    return vgl_links();
}

/* Those of them that hold a share. */
static uint32_t budgets(int device, struct vgl_device_state **out)
{
    struct vgl_device_state *all[VGL_MAX_CHAIN];
    uint32_t n = 0, count = states(device, all);
    for (uint32_t i = 0; i < count; i++)
        if (vgl_throttle_share(all[i]))
            out[n++] = all[i];
    return n;
}

bool vgl_share_limits(int device)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    return budgets(device, devs) > 0;
}

/* Whether a borrowing container may run past its share on `device` now: no
 * other tenant ran kernels there lately, as the real NVML tells.  One process
 * asks at a time, at most every vgl_timings.lend_check_ns; the answer holds for all the
 * container's processes until the next. */
static bool lent(int device, struct vgl_device_state *dev, uint64_t now_ns)
{
    if (__atomic_load_n(&dev->cores_policy, __ATOMIC_RELAXED) != VGL_CORES_BORROW)
        return false;
    uint64_t until = __atomic_load_n(&dev->lend_until_ns, __ATOMIC_ACQUIRE);
    /* A loan is made for vgl_timings.lend_check_ns at most: one that ends later was not
     * made on our clock (throttle.c's refill says whose), and is not one. */
    if (now_ns < until && until - now_ns <= vgl_timings.lend_check_ns)
        return true;
    static uint64_t asked_ns[VGL_MAX_DEVICES];
    uint64_t asked = __atomic_load_n(&asked_ns[device], __ATOMIC_RELAXED);
    if (now_ns - asked < vgl_timings.lend_check_ns ||
        !__atomic_compare_exchange_n(&asked_ns[device], &asked, now_ns, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return false;
    bool idle = !vgl_others_busy(device, vgl_timings.lend_window_us);
    __atomic_store_n(&dev->lend_until_ns, idle ? now_ns + vgl_timings.lend_check_ns : 0, __ATOMIC_RELEASE);
    return idle;
}

int64_t vgl_share_admit(int device, uint64_t now_ns, int64_t cost_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t n = budgets(device, devs);
    for (uint32_t i = 0; i < n; i++) {
        int64_t wait = vgl_throttle_admit(devs[i], now_ns, cost_ns);
        if (wait > 0 && lent(device, devs[i], now_ns)) {
            vgl_throttle_lend(devs[i], cost_ns);
            wait = 0;
        }
        if (wait > 0) {
            while (i--)
                vgl_throttle_settle(devs[i], cost_ns, 0);
            return wait;
        }
    }
    return 0;
}

int64_t vgl_share_owed(int device, uint64_t now_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    int64_t longest = 0;
    for (uint32_t i = 0, n = budgets(device, devs); i < n; i++) {
        int64_t owed = vgl_throttle_owed(devs[i], now_ns);
        longest = owed > longest ? owed : longest;
    }
    return longest;
}

int64_t vgl_share_resume_ns(int device, int64_t cost_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t pct = 100;
    for (uint32_t i = 0, n = budgets(device, devs); i < n; i++) {
        uint32_t share = vgl_throttle_share(devs[i]);
        if (share && share < pct)
            pct = share;
    }
    int64_t hold = (int64_t)(vgl_timings.budget_window_ns * pct / 100 * 3 / 4);
    int64_t want = RESUME_KERNELS * cost_ns > vgl_timings.resume_ns ? RESUME_KERNELS * cost_ns : vgl_timings.resume_ns;
    if (want > hold)
        want = hold;
    return want * 100 / pct;
}

void vgl_share_used(int device, int64_t charged_ns, int64_t used_ns)
{
    struct vgl_device_state *all[VGL_MAX_CHAIN];
    for (uint32_t i = 0, n = states(device, all); i < n; i++) {
        if (vgl_throttle_share(all[i]))
            vgl_throttle_settle(all[i], charged_ns, used_ns);
        __atomic_add_fetch(&all[i]->busy_ns, (uint64_t)used_ns, __ATOMIC_RELAXED);
    }
}

void vgl_share_waited(int device, uint64_t ns)
{
    struct vgl_device_state *all[VGL_MAX_CHAIN];
    for (uint32_t i = 0, n = states(device, all); i < n; i++)
        __atomic_add_fetch(&all[i]->throttled_ns, ns, __ATOMIC_RELAXED);
}

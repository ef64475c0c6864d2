/* What the driver spends on a process beyond its allocations — the context,
 * its heaps, loaded modules, local memory, the driver's own rounding —
 * charged to the container too, so that the cap bounds what NVML on the host
 * shows for the container's processes, not only what they asked for.
 *
 * Nothing tells us that cost directly, so we read it off NVML: the process's
 * memory there, under the pid the driver names it by, minus what we charged
 * it for its allocations.  The driver takes some of it on its own, at any
 * time (a module loaded lazily at a kernel's first launch, local memory for
 * a kernel that needs more), so we look when a context is made, and then on
 * allocations: at most every 200 ms while far from the cap, at every one
 * near it, and again before refusing one.
 *
 * Memory shared between processes is charged to each holder's container by
 * the hooks: the exporter's at its allocation, each importer's at its import
 * (docs/memory.md, "Framework paths").  The driver lists it for one holder
 * at a time, which is charged for it already, so it adds nothing here.  A holder the
 * driver does not list is charged more than the driver shows for it, which
 * may hide its context's cost under that charge: never less than the
 * driver's figure.
 *
 * The driver names processes by their pid in the host's pid namespace.  A
 * process in a container with a /proc of its own cannot know that pid
 * (base/identity.c), so it finds itself in the driver's list by a signature:
 * it allocates a probe, and is the one process whose memory rose by the
 * probe and fell by it again when the probe was freed.  Others' allocations
 * at that moment only make that rarer; a process claimed by another slot of
 * the container is never taken, and an answer that is not unique is no
 * answer (asked again at a later allocation). */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "internal.h"

/* Near the cap, every allocation looks: within this much of it, or an
 * eighth of the cap, whichever is more. */
#define NEAR_BYTES (64ULL << 20)
/* A multiple of the driver's 2 MiB page, so that it shows whole. */
#define PROBE_BYTES (4ULL << 20)
#define PROBE_TRIES 3
/* Tries, over the process's allocations, before saying its cost is not counted. */
#define IDENTIFY_TRIES 8
#define MAX_LISTED 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t charged[VGL_MAX_DEVICES];   /* overhead charged to this process */
static uint64_t checked_at[VGL_MAX_DEVICES]; /* CLOCK_MONOTONIC_COARSE; 0: never */
static unsigned identify_tries;

/* The cap depends on the driver's figure: without NVML the context's cost
 * (hundreds of MiB) cannot be read, and a cap that counted allocations alone
 * would let the driver hold that much more for the process.  Nothing else
 * tells the cost (cuMemGetInfo's free is the whole device's, every tenant's
 * memory in it), so where a cap applies the process is refused device memory,
 * said once with the cause (too few descriptors left, say, with `ulimit -n`). */
bool vgl_overhead_countable(int device)
{
    static int said;
    if (VGL_LIKELY(vgl_nvml_started()))
        return true;
    uint64_t total = vgl_device_total(device);
    bool capped = false;
    for (uint32_t i = 0; i < vgl_links() && !capped; i++)
        capped = vgl_region_cap(vgl_link_at(i).region, device, total) != UINT64_MAX;
    if (capped && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        vgl_log(VGL_LOG_ERROR, "%s; the memory the driver holds for this process's contexts cannot be "
                "counted against the cap, so contexts and device memory under it are refused",
                vgl_nvml_not_started());
    return !capped;
}

/* The driver's compute processes on `handle`; -1 when it cannot say. */
static int list_processes(nvmlDevice_t handle, nvmlProcessInfo_t procs[MAX_LISTED])
{
    unsigned int count = MAX_LISTED;
    if (vgl_real.nvmlDeviceGetComputeRunningProcesses_v3(handle, &count, procs) != NVML_SUCCESS ||
        count > MAX_LISTED)
        return -1;
    return (int)count;
}

/* `pid`'s memory in a list; false when it is not there or its figure is not. */
static bool listed(const nvmlProcessInfo_t *procs, int n, unsigned int pid, uint64_t *bytes)
{
    for (int i = 0; i < n; i++) {
        if (procs[i].pid == pid && procs[i].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL) {
            *bytes = procs[i].usedGpuMemory;
            return true;
        }
    }
    return false;
}

/* Whether another live slot of the container has found itself as `pid`. */
static bool claimed_by_another(unsigned int pid)
{
    const struct vgl_region *region = vgl_self.region;
    for (unsigned s = 0; s < VGL_MAX_SLOTS; s++) {
        const struct vgl_slot *slot = &region->slots[s];
        if (slot != vgl_self.slot && __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == VGL_SLOT_LIVE &&
            (unsigned int)__atomic_load_n(&slot->host_pid, __ATOMIC_RELAXED) == pid)
            return true;
    }
    return false;
}

/* One probe: the pid whose memory rose by the probe and fell by it again,
 * if exactly one did; 0 otherwise.  Needs a current context on `device`.
 * The probe is counted while it lives, even past a full cap (no refusal
 * counted for it): a process joining a full container must still find
 * itself, so that its context is charged and its allocations refused. */
static unsigned int probe_once(int device, nvmlDevice_t handle)
{
    static nvmlProcessInfo_t before[MAX_LISTED], during[MAX_LISTED], after[MAX_LISTED]; /* under `lock` */
    vgl_reserve((uint32_t)device, PROBE_BYTES, true, true, NULL);
    int nb = list_processes(handle, before), nd = -1, na = -1;
    CUdeviceptr_v2 probe;
    if (nb >= 0 && vgl_real.cuMemAlloc_v2(&probe, PROBE_BYTES) == CUDA_SUCCESS) {
        nd = list_processes(handle, during);
        vgl_real.cuMemFree_v2(probe);
        na = list_processes(handle, after);
    }
    vgl_release((uint32_t)device, PROBE_BYTES);
    unsigned int found = 0;
    for (int i = 0; nd >= 0 && na >= 0 && i < nd; i++) {
        /* We hold a context all along: a process absent before is not us,
         * and one gone after is not either. */
        unsigned int pid = during[i].pid;
        uint64_t was, at, then;
        if (!listed(before, nb, pid, &was) || !listed(during, nd, pid, &at) || !listed(after, na, pid, &then) ||
            at < was + PROBE_BYTES || then + PROBE_BYTES > at || claimed_by_another(pid))
            continue;
        if (found)
            return 0; /* two candidates: no answer */
        found = pid;
    }
    return found;
}

/* Our pid as the driver names us, found by the probe and kept in our slots
 * (the views and the process lists match the driver's entries by it). */
static int32_t identify(int device, nvmlDevice_t handle)
{
    if (identify_tries >= IDENTIFY_TRIES || vgl_current_device() != device)
        return 0;
    unsigned int pid = 0;
    for (int i = 0; i < PROBE_TRIES && !pid; i++)
        pid = probe_once(device, handle);
    if (!pid || pid > INT32_MAX) {
        static unsigned logged;
        if (++identify_tries == IDENTIFY_TRIES)
            vgl_log_bounded(VGL_LOG_WARN, &logged, "this process (pid %d in its container) could not be "
                            "found in the driver's process list; the memory the driver holds for its "
                            "contexts is not counted against the cap", (int)vgl_self.pid);
        return 0;
    }
    for (uint32_t i = 0; i < vgl_links(); i++)
        __atomic_store_n(&vgl_link_at(i).slot->host_pid, (int32_t)pid, __ATOMIC_RELEASE);
    VGL_LOG(VGL_LOG_DEBUG, "the driver names this process %u", pid);
    return (int32_t)pid;
}

/* This process's memory on `device` as NVML reports it; false when NVML
 * cannot say (no NVML, device not found, our pid not listed or not known). */
static bool nvml_usage(int device, uint64_t *bytes)
{
    if (!vgl_nvml_started())
        return false; /* vgl_overhead_countable says what follows */
    struct vgl_visible visible;
    if (!vgl_visible_devices(&visible) || (unsigned)device >= visible.count)
        return false;
    int32_t self = __atomic_load_n(&vgl_self.slot->host_pid, __ATOMIC_ACQUIRE);
    if (self <= 0 && (self = identify(device, visible.handle[device])) <= 0)
        return false;
    static nvmlProcessInfo_t procs[MAX_LISTED]; /* under `lock` */
    int n = list_processes(visible.handle[device], procs);
    return listed(procs, n, (unsigned int)self, bytes);
}

/* Whether `bytes` more would leave the container within NEAR of a cap. */
static bool near_cap(int device, uint64_t bytes)
{
    uint64_t total = vgl_device_total(device);
    for (uint32_t i = 0; i < vgl_links(); i++) {
        const struct vgl_region *region = vgl_link_at(i).region;
        uint64_t cap = vgl_region_cap(region, device, total);
        uint64_t near = cap / 8 > NEAR_BYTES ? cap / 8 : NEAR_BYTES;
        uint64_t used = __atomic_load_n(&region->devices[device].used_bytes, __ATOMIC_RELAXED);
        if (used + bytes + near > cap || used + bytes < used)
            return true;
    }
    return false;
}

void vgl_overhead_check(int device, uint64_t bytes)
{
    uint64_t last = __atomic_load_n(&checked_at[device], __ATOMIC_RELAXED);
    if (VGL_LIKELY(last && vgl_clock_ns(CLOCK_MONOTONIC_COARSE) - last < vgl_timings.overhead_recheck_ns) &&
        !near_cap(device, bytes))
        return;
    vgl_overhead_check_now(device);
}

void vgl_overhead_check_now(int device)
{
    uint64_t now = vgl_clock_ns(CLOCK_MONOTONIC_COARSE);
    pthread_mutex_lock(&lock);
    __atomic_store_n(&checked_at[device], now, __ATOMIC_RELAXED);
    uint64_t reported;
    uint64_t mark = vgl_charges_mark(), asked = vgl_reserved_ever(device);
    /* For allocations: never less than the driver holds for them, as each
     * is counted before the driver is asked and returned after it frees. */
    uint64_t ours = __atomic_load_n(&vgl_self.slot->used_bytes[device], __ATOMIC_SEQ_CST) - charged[device];
    if (nvml_usage(device, &reported)) {
        uint64_t overhead;
        if (vgl_charges_quiet_since(mark)) {
            overhead = reported > ours ? reported - ours : 0;
        } else {
            /* Other threads allocated or freed meanwhile: what the driver
             * held for their allocations when it answered is at most what
             * we counted before, plus what was reserved since.  So the
             * difference is the least the overhead can be: raised to it,
             * never lowered, until a quiet look says exactly. */
            uint64_t bound = ours + (vgl_reserved_ever(device) - asked);
            uint64_t least = reported > bound ? reported - bound : 0;
            overhead = least > charged[device] ? least : charged[device];
        }
        uint32_t dev = (uint32_t)device;
        if (overhead > charged[device])
            vgl_reserve(dev, overhead - charged[device], true, true, NULL);
        else if (overhead < charged[device])
            vgl_release(dev, charged[device] - overhead);
        charged[device] = overhead;
    }
    pthread_mutex_unlock(&lock);
}

/* The parent's overhead is not the child's, nor its pid. */
static void forget_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        charged[i] = checked_at[i] = 0;
    identify_tries = 0;
}

VGL_AFTER_FORK(forget_in_child)

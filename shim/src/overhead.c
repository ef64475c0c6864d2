/* What the driver spends on a process beyond its allocations — the context,
 * its heaps, loaded modules, the driver's own rounding — charged to the
 * container too, so that the cap bounds what NVML on the host shows for the
 * container's processes, not only what they asked for.
 *
 * Nothing tells us that cost directly, so we read it off NVML: the process's
 * memory there, under its host pid (as the driver names processes), minus
 * what we charged it for its allocations.  A process that cannot know its
 * host pid is not charged that cost.  We look when the process first
 * allocates on a device, and again at most every 200 ms while it keeps
 * allocating.  The difference is already held by the driver: it is charged
 * even past the cap (the allocations after it are refused). */
#include <pthread.h>
#include <time.h>

#include "internal.h"

#define RECHECK_NS 200000000ULL

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t charged[VGL_MAX_DEVICES];   /* overhead charged to this process */
static uint64_t checked_at[VGL_MAX_DEVICES]; /* CLOCK_MONOTONIC_COARSE; 0: never */
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static bool nvml_up;

static void start_nvml(void)
{
    /* NVML counts its own users: this reference is ours and stays. */
    nvml_up = vgl_resolve_nvml() && vgl_real.nvmlInit_v2() == NVML_SUCCESS;
}

/* This process's memory on `device` as NVML reports it; false when NVML
 * cannot say (no NVML, device not found, our pid not listed).  The driver
 * lists host pids only: a process that does not know its own (a container
 * with its own /proc) cannot be found, and its container-local pid may be
 * another namespace's process on the host, whose memory is not ours. */
static bool nvml_usage(int device, uint64_t *bytes)
{
    int32_t self = vgl_self.slot->host_pid;
    if (self <= 0)
        return false;
    pthread_once(&nvml_once, start_nvml);
    struct vgl_visible visible;
    if (!nvml_up || !vgl_visible_devices(&visible) || (unsigned)device >= visible.count)
        return false;
    static nvmlProcessInfo_t procs[256]; /* under `lock` */
    unsigned int count = sizeof procs / sizeof procs[0];
    if (vgl_real.nvmlDeviceGetComputeRunningProcesses_v3(visible.handle[device], &count, procs) != NVML_SUCCESS)
        return false;
    for (unsigned int i = 0; i < count; i++) {
        if (procs[i].pid == (unsigned int)self && procs[i].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL) {
            *bytes = procs[i].usedGpuMemory;
            return true;
        }
    }
    return false;
}

void vgl_overhead_check(int device)
{
    uint64_t last = __atomic_load_n(&checked_at[device], __ATOMIC_RELAXED);
    if (VGL_LIKELY(last && vgl_clock_ns(CLOCK_MONOTONIC_COARSE) - last < RECHECK_NS))
        return;
    vgl_overhead_check_now(device);
}

void vgl_overhead_check_now(int device)
{
    uint64_t now = vgl_clock_ns(CLOCK_MONOTONIC_COARSE);
    pthread_mutex_lock(&lock);
    __atomic_store_n(&checked_at[device], now, __ATOMIC_RELAXED);
    uint64_t reported;
    if (nvml_usage(device, &reported)) {
        uint64_t ours = vgl_self.slot->used_bytes[device] - charged[device]; /* for allocations */
        uint64_t overhead = reported > ours ? reported - ours : 0;
        uint32_t dev = (uint32_t)device;
        if (overhead > charged[device])
            vgl_reserve(dev, overhead - charged[device], true, NULL);
        else if (overhead < charged[device])
            vgl_release(dev, charged[device] - overhead);
        charged[device] = overhead;
    }
    pthread_mutex_unlock(&lock);
}

/* The parent's overhead is not the child's. */
static void forget_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        charged[i] = checked_at[i] = 0;
}

VGL_AFTER_FORK(forget_in_child)

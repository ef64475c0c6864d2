/* NVML's utilisation as a container sees it: its own processes' only, as a
 * share of its own; and, for a borrowing container, whether anyone else ran.
 *
 * The real library answers first, so arguments, versions and errors are the
 * driver's business; only a successful answer is rewritten.  With no
 * vgpulimit variable set, every hook is a plain call through. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"


/* A container with a compute share sees a GPU of its own whose 100% is that
 * share: a process that uses all of a 30% share shows 100%.  With no share,
 * its processes' own use of the whole device.  Other tenants never show. */
static unsigned int scaled(unsigned int pct, uint32_t cores_pct)
{
    if (cores_pct == 0 || cores_pct >= 100)
        return pct > 100 ? 100 : pct;
    unsigned long long v = ((unsigned long long)pct * 100 + cores_pct / 2) / cores_pct;
    return v > 100 ? 100 : (unsigned int)v;
}

static uint32_t cores_of(int device)
{
    return __atomic_load_n(&vgl_self.region->devices[device].cores_pct, __ATOMIC_RELAXED);
}

/* The slot of a process the driver names by `host_pid`, or NULL. */
static const struct vgl_slot *slot_of(unsigned int host_pid)
{
    const struct vgl_region *region = vgl_self.region;
    for (unsigned s = 0; s < VGL_MAX_SLOTS && host_pid; s++) {
        const struct vgl_slot *slot = &region->slots[s];
        if (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == VGL_SLOT_LIVE &&
            (unsigned int)slot->host_pid == host_pid)
            return slot;
    }
    return NULL;
}

/* The driver's samples since `since_us`, whole.  Any answer but SUCCESS
 * leaves none: the real driver answers the size query with a fixed count
 * (INSUFFICIENT_SIZE, 72 on an H200) and then, with that buffer, NOT_FOUND
 * when nothing ran, leaving the count as given — which must not be taken
 * for samples. */
static nvmlReturn_t all_samples(nvmlDevice_t device, unsigned long long since_us,
                                nvmlProcessUtilizationSample_t **out, unsigned int *count)
{
    nvmlProcessUtilizationSample_t *samples = NULL;
    unsigned int room = 0;
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned int n = room;
        rc = vgl_real.nvmlDeviceGetProcessUtilization(device, samples, &n, since_us);
        if (rc == NVML_SUCCESS) {
            *out = samples;
            *count = n <= room ? n : room;
            return rc;
        }
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE || n > (1u << 16))
            break;
        /* Room for a few more: processes start between the two calls. */
        room = n + 8;
        nvmlProcessUtilizationSample_t *grown = realloc(samples, room * sizeof *samples);
        if (!grown) {
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
        samples = grown;
        memset(samples, 0, room * sizeof *samples);
        rc = NVML_ERROR_UNKNOWN; /* eight size answers in a row */
    }
    free(samples);
    *out = NULL;
    *count = 0;
    return rc;
}

/* Keeps the samples of the container's processes, renamed to their container
 * pids and scaled to its share; returns how many are left. */
static unsigned int own_samples(int device, nvmlProcessUtilizationSample_t *samples, unsigned int count)
{
    uint32_t cores = cores_of(device);
    unsigned int kept = 0;
    for (unsigned int i = 0; i < count; i++) {
        const struct vgl_slot *slot = slot_of(samples[i].pid);
        if (!slot)
            continue;
        nvmlProcessUtilizationSample_t s = samples[i];
        s.pid = (unsigned int)slot->pid;
        s.smUtil = scaled(s.smUtil, cores);
        s.memUtil = scaled(s.memUtil, cores);
        samples[kept++] = s;
    }
    return kept;
}

/* The size query (no buffer, or no room) is the driver's own: it answers a
 * fixed count whatever the load, which tells nothing of other tenants, and a
 * count of our own could grow before the caller's second call. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    int d;
    if (VGL_LIKELY(!vgl_config.enabled) || !processSamplesCount || !utilization || !*processSamplesCount ||
        (d = vgl_container_device(device)) < 0 || !vgl_map_region())
        return vgl_real.nvmlDeviceGetProcessUtilization(device, utilization, processSamplesCount,
                                                        lastSeenTimeStamp);
    nvmlProcessUtilizationSample_t *samples;
    unsigned int n;
    nvmlReturn_t rc = all_samples(device, lastSeenTimeStamp, &samples, &n);
    if (rc == NVML_SUCCESS) {
        n = own_samples(d, samples, n);
        if (n == 0) {
            rc = NVML_ERROR_NOT_FOUND; /* as the driver when nothing ran: the count as given */
        } else if (n > *processSamplesCount) {
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
            *processSamplesCount = n;
        } else {
            memcpy(utilization, samples, n * sizeof *samples);
            *processSamplesCount = n;
        }
    }
    free(samples);
    return rc;
}

/* The driver's device figure, attributed to the container by its processes'
 * part of the per-process samples of the last second (the driver knows its
 * own window and sample period; their ratio needs neither), then scaled to
 * the container's share.  A driver that keeps no per-process samples cannot
 * tell tenants apart: its device figure then stands. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetUtilizationRates(device, utilization);
    int d;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !utilization ||
        (d = vgl_container_device(device)) < 0 || !vgl_map_region())
        return rc;
    nvmlProcessUtilizationSample_t *samples;
    unsigned int n;
    unsigned long long now_us = vgl_clock_ns(CLOCK_REALTIME) / 1000u; /* the driver's timestamps */
    nvmlReturn_t got = all_samples(device, now_us - vgl_timings.utilization_window_us, &samples, &n);
    if (got != NVML_SUCCESS && got != NVML_ERROR_NOT_FOUND)
        return rc;
    unsigned long long sm_all = 0, sm_own = 0, mem_all = 0, mem_own = 0;
    for (unsigned int i = 0; i < n; i++) {
        bool own = slot_of(samples[i].pid) != NULL;
        sm_all += samples[i].smUtil;
        mem_all += samples[i].memUtil;
        sm_own += own ? samples[i].smUtil : 0;
        mem_own += own ? samples[i].memUtil : 0;
    }
    free(samples);
    uint32_t cores = cores_of(d);
    utilization->gpu = scaled(sm_all ? (unsigned int)((utilization->gpu * sm_own + sm_all / 2) / sm_all) : 0,
                              cores);
    utilization->memory =
        scaled(mem_all ? (unsigned int)((utilization->memory * mem_own + mem_all / 2) / mem_all) : 0, cores);
    return rc;
}

bool vgl_others_busy(int device, unsigned long long window_us)
{
    struct vgl_visible visible;
    if (!vgl_map_region() || !vgl_visible_devices(&visible) || device < 0 || (unsigned)device >= visible.count)
        return true;
    nvmlProcessUtilizationSample_t *samples;
    unsigned int n;
    unsigned long long now_us = vgl_clock_ns(CLOCK_REALTIME) / 1000u;
    nvmlReturn_t rc = all_samples(visible.handle[device], now_us - window_us, &samples, &n);
    if (rc == NVML_ERROR_NOT_FOUND)
        return false; /* nothing ran at all */
    if (rc != NVML_SUCCESS) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "nvmlDeviceGetProcessUtilization failed (%d): a borrowing "
                        "container cannot tell whether others want the device, and keeps its share", (int)rc);
        return true;
    }
    bool busy = false;
    for (unsigned int i = 0; i < n && !busy; i++)
        busy = samples[i].smUtil > 0 && !slot_of(samples[i].pid);
    free(samples);
    return busy;
}

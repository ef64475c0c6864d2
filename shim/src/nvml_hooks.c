/* NVML as a container sees it: its devices only, numbered as CUDA numbers
 * them (devices.c); each device's memory capped; only its own processes,
 * under the pids it knows them by; utilisation as a share of its own.
 *
 * Every hook asks the real library first, so arguments, versions and errors
 * are the driver's business; only a successful answer is rewritten.  With no
 * vgpulimit variable set, every hook is a plain call through. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* NVML's "not applicable" for MIG instance ids. */
#define NO_INSTANCE 0xFFFFFFFFu
/* The window nvmlDeviceGetUtilizationRates answers for, as nvitop asks it. */
#define UTILIZATION_WINDOW_US 1000000ull

/* ---- devices ------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetCount_v2(deviceCount);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    *deviceCount = visible.count;
    return rc;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetCount(deviceCount);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    *deviceCount = visible.count;
    return rc;
}

/* The container's index `index` is the driver's device visible.nvml_index[index]. */
static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device,
                                    nvmlReturn_t (*real)(unsigned int, nvmlDevice_t *))
{
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || !vgl_visible_devices(&visible))
        return real(index, device);
    if (index >= visible.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return real(visible.nvml_index[index], device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device, vgl_real.nvmlDeviceGetHandleByIndex_v2);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device, vgl_real.nvmlDeviceGetHandleByIndex);
}

/* A handle found by another key is refused when it is not the container's. */
static nvmlReturn_t only_visible(nvmlReturn_t rc, const nvmlDevice_t *device)
{
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    for (unsigned i = 0; i < visible.count; i++)
        if (visible.handle[i] == *device)
            return rc;
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByUUID(uuid, device), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return only_visible(vgl_real.nvmlDeviceGetHandleByPciBusId(pciBusId, device), device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetIndex(device, index);
    struct vgl_visible visible;
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !vgl_visible_devices(&visible))
        return rc;
    for (unsigned i = 0; i < visible.count; i++) {
        if (visible.handle[i] == device) {
            *index = i;
            return rc;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* ---- memory ------------------------------------------------------------------------- */

/* Total becomes the cap, used the container's usage (never above the cap,
 * so used/total stays a share), free what it has left under the cap. */
static bool nvml_capped(nvmlDevice_t device, unsigned long long *total, unsigned long long *free_bytes,
                        unsigned long long *used)
{
    struct vgl_view v = {*free_bytes, *total, *used};
    if (!vgl_capped_view(vgl_container_device(device), &v))
        return false;
    *total = v.total_bytes;
    *free_bytes = v.free_bytes;
    *used = v.used_bytes;
    return true;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    nvml_capped(device, &memory->total, &memory->free, &memory->used);
    return rc;
}

/* `reserved` is what the cap holds that is neither the container's nor free
 * to it (the driver's own reservation, other tenants' memory), so that
 * total = reserved + used + free, as in the driver's answer. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != NVML_SUCCESS || !memory)
        return rc;
    if (nvml_capped(device, &memory->total, &memory->free, &memory->used) &&
        memory->used + memory->free <= memory->total)
        memory->reserved = memory->total - memory->used - memory->free;
    return rc;
}

/* ---- processes ---------------------------------------------------------------------- */

/* A list the driver fills with NVML's size protocol; every element starts
 * with `unsigned int pid`.  `fetch` is one call of the caller's own variant. */
struct driver_list {
    nvmlReturn_t (*fetch)(nvmlDevice_t device, unsigned int *count, void *entries, void *arg);
    void *arg;
    size_t stride;
    unsigned int count;
    unsigned char *entries; /* malloc'd */
};

static nvmlReturn_t fetch_all(nvmlDevice_t device, struct driver_list *list)
{
    list->count = 0;
    list->entries = NULL;
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned int count = list->count;
        nvmlReturn_t rc = list->fetch(device, &count, list->entries, list->arg);
        if (rc == NVML_SUCCESS) {
            list->count = count;
            return rc;
        }
        free(list->entries);
        list->entries = NULL;
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
            return rc;
        /* Room for a few more: processes start between the two calls. */
        list->count = count + 8;
        list->entries = calloc(list->count, list->stride);
        if (!list->entries)
            return NVML_ERROR_UNKNOWN;
    }
    free(list->entries);
    list->entries = NULL;
    return NVML_ERROR_UNKNOWN;
}

static unsigned int entry_pid(const struct driver_list *list, unsigned int i)
{
    unsigned int pid;
    memcpy(&pid, list->entries + i * list->stride, sizeof pid);
    return pid;
}

/* One of the container's processes, as a list reports it. */
struct listed {
    unsigned int pid;                    /* as the container sees it */
    unsigned long long used_bytes;       /* from the ledger */
    const unsigned char *driver_entry;   /* the driver's entry for it, or NULL */
};

/* The container's processes on `device`: those with memory in the ledger
 * (`with_memory`; the compute list) and those the driver lists (matched by
 * host pid, so a process with a context and no allocation yet is there too).
 * Returns how many, or -1 when it cannot tell (no region): then the list is
 * empty rather than someone else's. */
static int container_processes(nvmlDevice_t device, const struct driver_list *list, bool with_memory,
                               struct listed **out)
{
    *out = NULL;
    int d = vgl_container_device(device);
    if (d < 0 || !vgl_map_region())
        return -1;
    vgl_region_reclaim(vgl_self.region); /* a process that is gone is not listed */
    const struct vgl_region *region = vgl_self.region;
    struct listed *found = NULL;
    int n = 0;
    for (unsigned s = 0; s < VGL_MAX_SLOTS; s++) {
        const struct vgl_slot *slot = &region->slots[s];
        if (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) != VGL_SLOT_LIVE)
            continue;
        uint64_t bytes = __atomic_load_n(&slot->used_bytes[d], __ATOMIC_RELAXED);
        const unsigned char *entry = NULL;
        for (unsigned i = 0; slot->host_pid > 0 && i < list->count && !entry; i++)
            if (entry_pid(list, i) == (unsigned int)slot->host_pid)
                entry = list->entries + i * list->stride;
        if (!entry && !(with_memory && bytes))
            continue;
        if (!found && !(found = calloc(VGL_MAX_SLOTS, sizeof *found)))
            return -1;
        found[n++] = (struct listed){(unsigned int)slot->pid, bytes, entry};
    }
    *out = found;
    return n;
}

/* The MIG instance ids of a v2/v3 or detail entry: both sit after pid and memory. */
static void instance_ids(const unsigned char *driver_entry, unsigned int *gi, unsigned int *ci)
{
    *gi = *ci = NO_INSTANCE;
    if (driver_entry) {
        memcpy(gi, driver_entry + offsetof(nvmlProcessInfo_t, gpuInstanceId), sizeof *gi);
        memcpy(ci, driver_entry + offsetof(nvmlProcessInfo_t, computeInstanceId), sizeof *ci);
    }
}

typedef void (*fill_fn)(void *infos, unsigned int i, const struct listed *p);

static void fill_v1(void *infos, unsigned int i, const struct listed *p)
{
    nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + i;
    out->pid = p->pid;
    out->usedGpuMemory = p->used_bytes;
}

static void fill_v2(void *infos, unsigned int i, const struct listed *p)
{
    nvmlProcessInfo_t *out = (nvmlProcessInfo_t *)infos + i;
    out->pid = p->pid;
    out->usedGpuMemory = p->used_bytes;
    instance_ids(p->driver_entry, &out->gpuInstanceId, &out->computeInstanceId);
}

static void fill_detail(void *infos, unsigned int i, const struct listed *p)
{
    nvmlProcessDetail_v1_t *out = (nvmlProcessDetail_v1_t *)infos + i;
    out->pid = p->pid;
    out->usedGpuMemory = p->used_bytes;
    instance_ids(p->driver_entry, &out->gpuInstanceId, &out->computeInstanceId);
    out->usedGpuCcProtectedMemory = 0;
}

/* The driver's list, replaced by the container's processes, with NVML's
 * size protocol: too small a *count gets NVML_ERROR_INSUFFICIENT_SIZE and
 * the count needed; none to list is success and 0. */
static nvmlReturn_t list_processes(nvmlDevice_t device, struct driver_list *list, bool with_memory,
                                   unsigned int *count, void *infos, fill_fn fill)
{
    nvmlReturn_t rc = fetch_all(device, list);
    if (rc != NVML_SUCCESS)
        return rc;
    struct listed *procs;
    int n = container_processes(device, list, with_memory, &procs);
    if (n < 0)
        n = 0;
    if ((unsigned int)n > *count) {
        *count = (unsigned int)n;
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && !infos) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        for (int i = 0; i < n; i++)
            fill(infos, (unsigned int)i, &procs[i]);
        *count = (unsigned int)n;
    }
    free(procs);
    free(list->entries);
    return rc;
}

typedef nvmlReturn_t (*info_v1_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
typedef nvmlReturn_t (*info_v2_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

static nvmlReturn_t fetch_v1(nvmlDevice_t device, unsigned int *count, void *entries, void *arg)
{
    return (*(info_v1_fn *)arg)(device, count, entries);
}

static nvmlReturn_t fetch_v2(nvmlDevice_t device, unsigned int *count, void *entries, void *arg)
{
    return (*(info_v2_fn *)arg)(device, count, entries);
}

/* `real` points at the variant's slot in vgl_real. */
#define PROCESS_LIST_V1(symbol, with_memory)                                                    \
    nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos) \
    {                                                                                           \
        if (VGL_LIKELY(!vgl_config.enabled) || !infoCount)                                      \
            return vgl_real.symbol(device, infoCount, infos);                                   \
        struct driver_list list = {fetch_v1, &vgl_real.symbol, sizeof *infos, 0, NULL};         \
        return list_processes(device, &list, with_memory, infoCount, infos, fill_v1);           \
    }
#define PROCESS_LIST_V2(symbol, with_memory)                                                    \
    nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos) \
    {                                                                                           \
        if (VGL_LIKELY(!vgl_config.enabled) || !infoCount)                                      \
            return vgl_real.symbol(device, infoCount, infos);                                   \
        struct driver_list list = {fetch_v2, &vgl_real.symbol, sizeof *infos, 0, NULL};         \
        return list_processes(device, &list, with_memory, infoCount, infos, fill_v2);           \
    }

PROCESS_LIST_V1(nvmlDeviceGetComputeRunningProcesses, true)
PROCESS_LIST_V2(nvmlDeviceGetComputeRunningProcesses_v2, true)
PROCESS_LIST_V2(nvmlDeviceGetComputeRunningProcesses_v3, true)
/* A graphics or MPS client is the container's when the driver lists it and
 * its host pid is one of the container's; its memory is still the ledger's. */
PROCESS_LIST_V1(nvmlDeviceGetGraphicsRunningProcesses, false)
PROCESS_LIST_V2(nvmlDeviceGetGraphicsRunningProcesses_v2, false)
PROCESS_LIST_V2(nvmlDeviceGetGraphicsRunningProcesses_v3, false)
PROCESS_LIST_V1(nvmlDeviceGetMPSComputeRunningProcesses, false)
PROCESS_LIST_V2(nvmlDeviceGetMPSComputeRunningProcesses_v2, false)
PROCESS_LIST_V2(nvmlDeviceGetMPSComputeRunningProcesses_v3, false)

/* The caller's list header, with our own entry count and array. */
static nvmlReturn_t fetch_detail(nvmlDevice_t device, unsigned int *count, void *entries, void *arg)
{
    nvmlProcessDetailList_v1_t list = *(const nvmlProcessDetailList_v1_t *)arg;
    list.numProcArrayEntries = *count;
    list.procArray = entries;
    nvmlReturn_t rc = vgl_real.nvmlDeviceGetRunningProcessDetailList(device, &list);
    *count = list.numProcArrayEntries;
    return rc;
}

nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_v1_t *plist)
{
    if (VGL_LIKELY(!vgl_config.enabled) || !plist)
        return vgl_real.nvmlDeviceGetRunningProcessDetailList(device, plist);
    struct driver_list list = {fetch_detail, plist, sizeof(nvmlProcessDetail_v1_t), 0, NULL};
    return list_processes(device, &list, plist->mode == NVML_PROCESS_MODE_COMPUTE,
                          &plist->numProcArrayEntries, plist->procArray, fill_detail);
}

/* ---- utilisation ---------------------------------------------------------------------- */

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

/* The driver's samples since `since_us`, whole (NVML_ERROR_NOT_FOUND: none). */
static nvmlReturn_t all_samples(nvmlDevice_t device, unsigned long long since_us,
                                nvmlProcessUtilizationSample_t **out, unsigned int *count)
{
    *out = NULL;
    *count = 0;
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned int n = *count;
        nvmlReturn_t rc = vgl_real.nvmlDeviceGetProcessUtilization(device, *out, &n, since_us);
        if (rc == NVML_SUCCESS) {
            *count = n;
            return rc;
        }
        free(*out);
        *out = NULL;
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
            return rc;
        *count = n + 8;
        if (!(*out = calloc(*count, sizeof **out)))
            return NVML_ERROR_UNKNOWN;
    }
    free(*out);
    *out = NULL;
    return NVML_ERROR_UNKNOWN;
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

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    int d;
    if (VGL_LIKELY(!vgl_config.enabled) || !processSamplesCount ||
        (d = vgl_container_device(device)) < 0 || !vgl_map_region())
        return vgl_real.nvmlDeviceGetProcessUtilization(device, utilization, processSamplesCount,
                                                        lastSeenTimeStamp);
    nvmlProcessUtilizationSample_t *samples;
    unsigned int n;
    nvmlReturn_t rc = all_samples(device, lastSeenTimeStamp, &samples, &n);
    if (rc == NVML_SUCCESS) {
        n = own_samples(d, samples, n);
        if (n == 0)
            rc = NVML_ERROR_NOT_FOUND; /* the driver's answer when nothing ran */
        else if (n > *processSamplesCount || !utilization)
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            memcpy(utilization, samples, n * sizeof *samples);
        *processSamplesCount = n;
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
    nvmlReturn_t got = all_samples(device, now_us - UTILIZATION_WINDOW_US, &samples, &n);
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

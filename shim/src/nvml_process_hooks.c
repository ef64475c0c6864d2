/* NVML's process lists as a container sees them: only its own processes,
 * under the pids it knows them by, with the memory its ledger counts.
 *
 * The real library answers first, so arguments, versions and errors are the
 * driver's business; only a successful answer is rewritten.  With no
 * vgpulimit variable set, every hook is a plain call through. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* NVML's "not applicable" for MIG instance ids. */
#define NO_INSTANCE 0xFFFFFFFFu

/* A list the driver fills with NVML's size protocol; every element starts
 * with `unsigned int pid`.  `fetch` is one call of the caller's own variant. */
struct driver_list {
    nvmlReturn_t (*fetch)(nvmlDevice_t device, unsigned int *count, void *entries, void *arg);
    void *arg;
    size_t stride;
    unsigned int count;
    unsigned char *entries; /* malloc'd */
};

/* Any answer but SUCCESS leaves an empty list, whatever count came with it. */
static nvmlReturn_t fetch_all(nvmlDevice_t device, struct driver_list *list)
{
    unsigned int room = 0;
    unsigned char *entries = NULL;
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned int count = room;
        rc = list->fetch(device, &count, entries, list->arg);
        if (rc == NVML_SUCCESS) {
            list->count = count <= room ? count : room;
            list->entries = entries;
            return rc;
        }
        free(entries);
        entries = NULL;
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE || count > (1u << 16))
            break;
        /* Room for a few more: processes start between the two calls. */
        room = count + 8;
        if (!(entries = calloc(room, list->stride))) {
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
        rc = NVML_ERROR_UNKNOWN; /* eight size answers in a row */
    }
    free(entries);
    list->count = 0;
    list->entries = NULL;
    return rc;
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
 * the count needed; none to list is success and 0.  The GPU of a container's
 * MIG device lists that device's (vgl_container_handle). */
static nvmlReturn_t list_processes(nvmlDevice_t device, struct driver_list *list, bool with_memory,
                                   unsigned int *count, void *infos, fill_fn fill)
{
    nvmlReturn_t rc = fetch_all(vgl_container_handle(device), list);
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

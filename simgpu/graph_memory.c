/* simgpu's graph memory: the allocations of alloc nodes and the per-device
 * graph memory pool they draw from (the nodes themselves, cuGraphAddMemAllocNode
 * and cuGraphAddMemFreeNode, are graphs.c's).
 *
 * An alloc node's address is fixed when the node is made (cuda.h: the
 * allocation's address is returned in nodeParams->dptr), so each allocation
 * reserves its own address range then; the device memory behind it is taken
 * from the device's graph pool only when a launch runs the node, and goes back
 * to the pool when a free node runs, or cuMemFree / cuMemFreeAsync frees the
 * address.  The pool grows by the shortfall rounded up to SIM_GRANULARITY
 * (2 MiB), charged to the process in the state file as pools.c charges its
 * chunks, so cuMemGetInfo and NVML see what it reserves
 * (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT); what it reserves beyond what is in
 * use stays reserved until cuDeviceGraphMemTrim.
 *
 * Launches run nothing asynchronously, so a launch's allocations and frees are
 * done, in the order the nodes were added (which respects their
 * dependencies, as a node's dependencies must exist before it), when
 * cuGraphLaunch returns.  All state here is guarded by the memory mutex.
 *
 * This file owns the allocations (held by graphs.c's nodes and executables)
 * and the pool, with its entry points (cuDeviceGraphMemTrim and the graph
 * memory attributes); it calls memory.c, devices.c and the state file, and
 * neither graphs.c nor frees.c, which give its allocations back. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "driver.h"

/* One alloc node's allocation. */
struct sim_graph_alloc {
    struct sim_graph_alloc *next;   /* in sim_graph_memory.list */
    uint32_t device;
    uintptr_t base;                 /* reserved when the node is made */
    size_t size;                    /* rounded up to SIM_GRANULARITY: what it takes from the pool */
    CUDA_MEM_ALLOC_NODE_PARAMS params; /* as given, for cuGraphMemAllocNodeGetParams */
    unsigned holders;               /* graph nodes and executables */
    bool live;
    bool planned;                   /* scratch of sim_graph_memory_run */
};

static struct {
    struct sim_graph_alloc *list;
    struct {
        uint64_t reserved, reserved_high, used, used_high;
    } device[SIM_MAX_DEVICES];
} sim_graph_memory;

static void sim_graph_alloc_delete(struct sim_graph_alloc *a)
{
    for (struct sim_graph_alloc **link = &sim_graph_memory.list; *link; link = &(*link)->next) {
        if (*link == a) {
            *link = a->next;
            break;
        }
    }
    munmap((void *)a->base, a->size);
    free(a);
}

void sim_graph_alloc_hold(struct sim_graph_alloc *a, int delta)
{
    sim_mem_lock();
    a->holders += (unsigned)delta;
    if (a->holders == 0 && !a->live)
        sim_graph_alloc_delete(a);
    sim_mem_unlock();
}

/* Under the memory mutex. */
static void sim_graph_alloc_release(struct sim_graph_alloc *a)
{
    a->live = false;
    sim_graph_memory.device[a->device].used -= a->size;
}

void sim_graph_memory_free(void *owner)
{
    struct sim_graph_alloc *a = owner;
    sim_graph_alloc_release(a);
    if (a->holders == 0)
        sim_graph_alloc_delete(a);
}

/* The allocations stay, as the child's graphs still name them, but their
 * memory and the pool's charge are the parent's. */
void sim_graph_memory_forget(void)
{
    for (struct sim_graph_alloc *a = sim_graph_memory.list; a; a = a->next)
        a->live = false;
    memset(sim_graph_memory.device, 0, sizeof sim_graph_memory.device);
}

/* Grows each device's pool to what the launch will use at its peak; nothing
 * is grown when one cannot be. */
static CUresult sim_graph_memory_grow(const uint64_t peak[SIM_MAX_DEVICES])
{
    uint64_t grown[SIM_MAX_DEVICES] = {0};
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++) {
        uint64_t reserved = sim_graph_memory.device[d].reserved;
        if (peak[d] <= reserved)
            continue;
        grown[d] = (peak[d] - reserved + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
        if (sim_state_charge(d, grown[d]) != 0) {
            for (uint32_t u = 0; u < d; u++)
                if (grown[u])
                    sim_state_uncharge(u, grown[u]);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++) {
        sim_graph_memory.device[d].reserved += grown[d];
        if (sim_graph_memory.device[d].reserved > sim_graph_memory.device[d].reserved_high)
            sim_graph_memory.device[d].reserved_high = sim_graph_memory.device[d].reserved;
    }
    return CUDA_SUCCESS;
}

/* Under the memory mutex, once the pool holds the bytes. */
static bool sim_graph_alloc_take(struct sim_graph_alloc *a)
{
    if (!sim_mem_track(a->base, a->params.bytesize, SIM_MEM_GRAPH, a))
        return false;
    a->live = true;
    uint64_t used = sim_graph_memory.device[a->device].used += a->size;
    if (used > sim_graph_memory.device[a->device].used_high)
        sim_graph_memory.device[a->device].used_high = used;
    return true;
}

CUresult sim_graph_memory_run(const struct sim_graph_mem_op *ops, size_t n, bool auto_free)
{
    sim_mem_lock();
    if (auto_free)
        for (size_t i = 0; i < n; i++)
            if (!ops[i].is_free && ops[i].alloc->live) {
                sim_mem_untrack(ops[i].alloc->base);
                sim_graph_alloc_release(ops[i].alloc);
            }
    /* A dry run first: the launch is refused before anything changes. */
    uint64_t now[SIM_MAX_DEVICES], peak[SIM_MAX_DEVICES];
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++)
        now[d] = peak[d] = sim_graph_memory.device[d].used;
    for (size_t i = 0; i < n; i++)
        ops[i].alloc->planned = ops[i].alloc->live;
    CUresult res = CUDA_SUCCESS;
    for (size_t i = 0; i < n && res == CUDA_SUCCESS; i++) {
        struct sim_graph_alloc *a = ops[i].alloc;
        if (a->planned == !ops[i].is_free) {
            res = CUDA_ERROR_INVALID_VALUE;
        } else if (ops[i].is_free) {
            a->planned = false;
            now[a->device] -= a->size;
        } else {
            a->planned = true;
            now[a->device] += a->size;
            if (now[a->device] > peak[a->device])
                peak[a->device] = now[a->device];
        }
    }
    if (res == CUDA_SUCCESS)
        res = sim_graph_memory_grow(peak);
    size_t done = 0;
    for (; done < n && res == CUDA_SUCCESS; done++) {
        struct sim_graph_alloc *a = ops[done].alloc;
        if (ops[done].is_free) {
            sim_mem_untrack(a->base);
            sim_graph_alloc_release(a);
        } else if (!sim_graph_alloc_take(a)) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
    }
    /* No room in the memory table: the steps done are undone, newest first; the
     * pool keeps what it grew by, as reserve. */
    while (res != CUDA_SUCCESS && done-- > 0) {
        struct sim_graph_alloc *a = ops[done].alloc;
        if (ops[done].is_free) {
            sim_graph_alloc_take(a); /* its entry was just removed: there is room */
        } else {
            sim_mem_untrack(a->base);
            sim_graph_alloc_release(a);
        }
    }
    sim_mem_unlock();
    return res;
}

/* Device memory only, with no handle types for IPC (cuda.h). */
CUresult sim_graph_alloc_new(const CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams, struct sim_graph_alloc **out)
{
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!nodeParams || nodeParams->bytesize == 0 || nodeParams->bytesize > SIZE_MAX - SIM_GRANULARITY ||
        nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        nodeParams->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t device;
    res = sim_mem_location(&nodeParams->poolProps.location, &device);
    if (res != CUDA_SUCCESS)
        return res;
    struct sim_graph_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->device = device;
    a->size = (nodeParams->bytesize + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
    void *base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)base;
    a->params = *nodeParams;
    a->params.accessDescs = NULL; /* the caller's array is not ours to keep */
    a->params.accessDescCount = 0;
    a->params.dptr = (CUdeviceptr)a->base;
    sim_mem_lock();
    a->next = sim_graph_memory.list;
    sim_graph_memory.list = a;
    sim_mem_unlock();
    *out = a;
    return CUDA_SUCCESS;
}

const CUDA_MEM_ALLOC_NODE_PARAMS *sim_graph_alloc_params(const struct sim_graph_alloc *a)
{
    return &a->params;
}

/* Only an address an alloc node returned may be freed by a free node. */
struct sim_graph_alloc *sim_graph_alloc_at(CUdeviceptr dptr)
{
    sim_mem_lock();
    struct sim_graph_alloc *a = sim_graph_memory.list;
    while (a && a->base != (uintptr_t)dptr)
        a = a->next;
    if (a)
        a->holders++;
    sim_mem_unlock();
    return a;
}

/* Releases what the pool reserves beyond what is in use. */
CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(device, &index);
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    uint64_t spare = sim_graph_memory.device[index].reserved - sim_graph_memory.device[index].used;
    if (spare)
        sim_state_uncharge(index, spare);
    sim_graph_memory.device[index].reserved -= spare;
    sim_mem_unlock();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(device, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = sim_graph_memory.device[index].used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = sim_graph_memory.device[index].used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = sim_graph_memory.device[index].reserved;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = sim_graph_memory.device[index].reserved_high;
        break;
    default: res = CUDA_ERROR_INVALID_VALUE;
    }
    sim_mem_unlock();
    return res;
}

/* Only the high watermarks can be set, and only to 0, which resets them to
 * the current value (cuda.h). */
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(device, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!value || *(const cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        sim_graph_memory.device[index].used_high = sim_graph_memory.device[index].used;
    else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        sim_graph_memory.device[index].reserved_high = sim_graph_memory.device[index].reserved;
    else
        res = CUDA_ERROR_INVALID_VALUE;
    sim_mem_unlock();
    return res;
}

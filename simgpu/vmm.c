/* simgpu's virtual memory management: physical allocations (cuMemCreate),
 * reserved address ranges (cuMemAddressReserve), and mappings of the one into
 * the other (cuMemMap, cuMemSetAccess, cuMemUnmap), and the sharing of
 * allocations with other processes through file descriptors
 * (cuMemExportToShareableHandle, cuMemImportFromShareableHandle).
 *
 * An allocation's size must be a multiple of the granularity that
 * cuMemGetAllocationGranularity reports, SIM_GRANULARITY (2 MiB), or
 * cuMemCreate answers CUDA_ERROR_INVALID_VALUE (cuda.h, cuMemCreate); the whole
 * size is charged to the process in the state file when it is created, and
 * comes back once it has been released and its last mapping is gone (cuda.h,
 * cuMemRelease and cuMemUnmap), whichever comes last.  Its bytes are a range of
 * one memfd per process, sparse and committed only when written, so that one
 * allocation mapped at two addresses shows the same bytes at both, as on a GPU.
 * An allocation that may be exported (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
 * requested) is a shared allocation of shared.c instead, whose bytes every
 * importer maps and whose charge follows its holders across processes.  An
 * allocation on the host (CU_MEM_LOCATION_TYPE_HOST or HOST_NUMA, as NCCL
 * makes for its shared-memory transport) is host memory: a memfd of its own,
 * exported as a duplicate of it, charged to no device and listed by NVML for
 * no one.  A reservation is address space only (PROT_NONE, not charged).  A
 * mapping becomes device memory that copies and memsets may use once
 * cuMemSetAccess grants some device access to it.
 *
 * Simplifications: read-only access (CU_MEM_ACCESS_FLAGS_PROT_READ) maps the
 * range read-write; a host allocation's NUMA node is not where its pages are.
 * Allocations are not a context's, so destroying one leaves them (cuda.h,
 * cuCtxDestroy). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"

/* A physical allocation. */
struct sim_handle {
    CUmemGenericAllocationHandle id;
    CUmemAllocationProp prop;       /* as created */
    uint32_t device;
    size_t size;                    /* a multiple of SIM_GRANULARITY, charged (unless on the host) */
    int fd;                         /* the file of its bytes: sim_vmm.fd, shared.fd, or a host memfd */
    off_t offset;                   /* of its bytes in `fd` */
    struct sim_shared_ref shared;   /* id 0: not shared */
    bool host;                      /* on the host: its own memfd, charged to nothing */
    unsigned int mappings;
    bool released;                  /* by cuMemRelease: the handle is no longer valid */
};

struct sim_reservation {
    uintptr_t base;
    size_t size;
};

struct sim_mapping {
    uintptr_t base;
    size_t size;
    struct sim_handle *handle;
    uint32_t access;                /* bit d: device d may access it */
};

/* Guarded by the memory mutex (sim_mem_lock). */
static struct {
    int fd;                         /* the memfd behind every allocation; -1 until the first */
    off_t fd_size;                  /* offsets are never reused: a freed range is a hole */
    CUmemGenericAllocationHandle last_id;
    struct sim_handle **handles;    /* sorted by id, which only grows */
    size_t n_handles, cap_handles;
    struct sim_reservation *reservations; /* sorted by base */
    size_t n_reservations, cap_reservations;
    struct sim_mapping *mappings;   /* sorted by base */
    size_t n_mappings, cap_mappings;
} sim_vmm = {.fd = -1};

/* Room for one more element in a table of `*cap`; false when there is no memory. */
static bool sim_reserve_slot(void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t new_cap = *cap ? 2 * *cap : 16;
    void *p = realloc(*v, new_cap * elem);
    if (!p)
        return false;
    *v = p;
    *cap = new_cap;
    return true;
}

/* Allocation `id` until its memory is given back (released or not), or NULL. */
static struct sim_handle *sim_handle_find(CUmemGenericAllocationHandle id, size_t *index)
{
    size_t lo = 0, hi = sim_vmm.n_handles;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim_vmm.handles[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == sim_vmm.n_handles || sim_vmm.handles[lo]->id != id)
        return NULL;
    if (index)
        *index = lo;
    return sim_vmm.handles[lo];
}

/* Gives an allocation's memory back: its pages, then its charge (or this
 * process's hold on a shared allocation). */
static void sim_handle_give_back(struct sim_handle *h)
{
    if (h->shared.id) {
        sim_shared_leave(&h->shared);
    } else if (h->host) {
        close(h->fd);
    } else {
        fallocate(sim_vmm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, h->offset, (off_t)h->size);
        sim_state_uncharge(h->device, h->size);
    }
}

static void sim_handle_destroy(struct sim_handle *h)
{
    size_t i = 0;
    sim_handle_find(h->id, &i); /* found: `h` is in the table */
    memmove(&sim_vmm.handles[i], &sim_vmm.handles[i + 1], (sim_vmm.n_handles - i - 1) * sizeof *sim_vmm.handles);
    sim_vmm.n_handles--;
    sim_handle_give_back(h);
    free(h);
}

/* The first mapping whose base is at or above `addr`. */
static size_t sim_mapping_lower_bound(uintptr_t addr)
{
    size_t lo = 0, hi = sim_vmm.n_mappings;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim_vmm.mappings[mid].base < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* [ptr, ptr + size) is exactly whole mappings that follow each other: the
 * first and how many. */
static bool sim_whole_mappings(uintptr_t ptr, size_t size, size_t *first, size_t *count)
{
    size_t i = sim_mapping_lower_bound(ptr), j = i;
    size_t covered = 0;
    while (j < sim_vmm.n_mappings && covered < size && sim_vmm.mappings[j].base == ptr + covered) {
        covered += sim_vmm.mappings[j].size;
        j++;
    }
    if (j == i || covered != size)
        return false;
    *first = i;
    *count = j - i;
    return true;
}

/* The index of the reservation that holds all of [ptr, ptr + size), or SIZE_MAX. */
static size_t sim_reservation_holding(uintptr_t ptr, size_t size)
{
    size_t lo = 0, hi = sim_vmm.n_reservations;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim_vmm.reservations[mid].base <= ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return SIZE_MAX;
    const struct sim_reservation *r = &sim_vmm.reservations[lo - 1];
    size_t offset = ptr - r->base;
    return offset < r->size && size <= r->size - offset ? lo - 1 : SIZE_MAX;
}

void sim_vmm_forget(void)
{
    /* The child's own descriptors: closing them leaves the parent's files alone. */
    for (size_t i = 0; i < sim_vmm.n_handles; i++) {
        if (sim_vmm.handles[i]->fd != sim_vmm.fd)
            close(sim_vmm.handles[i]->fd);
        free(sim_vmm.handles[i]);
    }
    free(sim_vmm.handles);
    free(sim_vmm.reservations);
    free(sim_vmm.mappings);
    /* The child's own descriptor: closing it leaves the parent's file alone. */
    if (sim_vmm.fd >= 0)
        close(sim_vmm.fd);
    memset(&sim_vmm, 0, sizeof sim_vmm);
    sim_vmm.fd = -1;
}

/* Pinned memory on a device or on the host; exported, if at all, as a POSIX
 * file descriptor.  *host says which (then *device is meaningless). */
static CUresult sim_check_prop(const CUmemAllocationProp *prop, uint32_t *device, bool *host)
{
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    *host = false;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_HOST:
        *host = true;
        return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA: {
        /* A node of this machine (cuda.h: the id is a NUMA node's). */
        char path[64];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d", prop->location.id);
        struct stat st;
        if (prop->location.id < 0 || (stat(path, &st) != 0 && prop->location.id != 0))
            return CUDA_ERROR_INVALID_VALUE;
        *host = true;
        return CUDA_SUCCESS;
    }
    default:
        return sim_mem_location(&prop->location, device);
    }
}

/* The same for both options, as an H100 reports. */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    SIM_CALLED();
    if (!granularity || !prop ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t device;
    bool host;
    CUresult res = sim_check_prop(prop, &device, &host);
    if (res == CUDA_SUCCESS)
        *granularity = SIM_GRANULARITY;
    return res;
}

/* Under the memory mutex: records `h` and gives it its id. */
static bool sim_handle_add(struct sim_handle *h)
{
    if (!sim_reserve_slot((void **)&sim_vmm.handles, &sim_vmm.cap_handles, sim_vmm.n_handles,
                          sizeof *sim_vmm.handles))
        return false;
    h->id = ++sim_vmm.last_id;
    sim_vmm.handles[sim_vmm.n_handles++] = h;
    return true;
}

/* Memory on the host: a memfd of its own, charged to no device. */
static CUresult sim_create_host(struct sim_handle *h)
{
    h->host = true;
    h->fd = memfd_create("simgpu-host", MFD_CLOEXEC);
    if (h->fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(h->fd, (off_t)h->size) != 0) {
        close(h->fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Device memory that may be exported: a shared allocation (shared.c). */
static CUresult sim_create_shared(struct sim_handle *h)
{
    int rc = sim_shared_create(h->device, h->size, true, &h->shared);
    if (rc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->fd = h->shared.fd;
    return CUDA_SUCCESS;
}

/* Device memory kept to this process: a range of the process's memfd. */
static CUresult sim_create_private(struct sim_handle *h)
{
    if (sim_vmm.fd < 0)
        sim_vmm.fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
    if (sim_vmm.fd < 0 || h->size > (uint64_t)(INT64_MAX - sim_vmm.fd_size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (sim_state_charge(h->device, h->size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(sim_vmm.fd, sim_vmm.fd_size + (off_t)h->size) != 0) {
        sim_state_uncharge(h->device, h->size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->fd = sim_vmm.fd;
    h->offset = sim_vmm.fd_size;
    sim_vmm.fd_size += (off_t)h->size;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    SIM_CALLED();
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t device;
    bool host;
    CUresult res = sim_check_prop(prop, &device, &host);
    if (res != CUDA_SUCCESS)
        return res;
    if (!handle || flags || size == 0 || size % SIM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->prop = *prop;
    h->prop.allocFlags.compressionType = 0; /* never compressible here: how a client tells (cuda.h) */
    h->device = device;
    h->size = size;
    sim_mem_lock();
    if (host)
        res = sim_create_host(h);
    else if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        res = sim_create_shared(h);
    else
        res = sim_create_private(h);
    if (res == CUDA_SUCCESS && !sim_handle_add(h)) {
        sim_handle_give_back(h);
        res = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (res == CUDA_SUCCESS) {
        *handle = h->id;
        h = NULL;
    }
    sim_mem_unlock();
    free(h);
    return res;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    struct sim_handle *h = sim_handle_find(handle, NULL);
    if (!h || h->released) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        h->released = true;
        if (h->mappings == 0)
            sim_handle_destroy(h);
    }
    sim_mem_unlock();
    return res;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    const struct sim_handle *h = sim_handle_find(handle, NULL);
    if (h && !h->released)
        *prop = h->prop;
    else
        res = CUDA_ERROR_INVALID_VALUE;
    sim_mem_unlock();
    return res;
}

/* Aligned to the granularity at least, so that the range can be mapped from
 * its start; `addr` is a hint. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || flags || size == 0 || size % page || addr % page || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > SIM_GRANULARITY ? alignment : SIM_GRANULARITY;
    if (size > SIZE_MAX - align)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap((void *)(uintptr_t)addr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = (uintptr_t)p, base = (start + align - 1) / align * align;
    if (base > start)
        munmap(p, base - start);
    if (start + align > base)
        munmap((void *)(base + size), start + align - base);
    sim_mem_lock();
    bool ok = sim_reserve_slot((void **)&sim_vmm.reservations, &sim_vmm.cap_reservations, sim_vmm.n_reservations,
                               sizeof *sim_vmm.reservations);
    if (ok) {
        size_t i = 0;
        while (i < sim_vmm.n_reservations && sim_vmm.reservations[i].base < base)
            i++;
        memmove(&sim_vmm.reservations[i + 1], &sim_vmm.reservations[i],
                (sim_vmm.n_reservations - i) * sizeof *sim_vmm.reservations);
        sim_vmm.reservations[i] = (struct sim_reservation){.base = base, .size = size};
        sim_vmm.n_reservations++;
    }
    sim_mem_unlock();
    if (!ok) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

/* Exactly a reservation, as cuda.h asks.  One that still holds mappings is
 * refused (simgpu's choice: unmapping behind the caller's back would free
 * memory it may still count). */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    size_t i = sim_reservation_holding((uintptr_t)ptr, size);
    const struct sim_reservation *r = i == SIZE_MAX ? NULL : &sim_vmm.reservations[i];
    size_t m = sim_mapping_lower_bound((uintptr_t)ptr);
    if (!r || r->base != ptr || r->size != size ||
        (m < sim_vmm.n_mappings && sim_vmm.mappings[m].base - r->base < r->size)) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        munmap((void *)r->base, r->size);
        memmove(&sim_vmm.reservations[i], &sim_vmm.reservations[i + 1],
                (sim_vmm.n_reservations - i - 1) * sizeof *sim_vmm.reservations);
        sim_vmm.n_reservations--;
    }
    sim_mem_unlock();
    return res;
}

/* Inside one reservation, over no other mapping, all aligned to the
 * granularity (cuda.h, cuMemMap).  The range is not accessible until
 * cuMemSetAccess. */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (flags || !ptr || size == 0 || ptr % SIM_GRANULARITY || size % SIM_GRANULARITY || offset % SIM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    struct sim_handle *h = sim_handle_find(handle, NULL);
    size_t next = sim_mapping_lower_bound((uintptr_t)ptr);
    bool overlaps = (next < sim_vmm.n_mappings && sim_vmm.mappings[next].base - ptr < size) ||
                    (next > 0 && sim_vmm.mappings[next - 1].base + sim_vmm.mappings[next - 1].size > ptr);
    if (!h || h->released || offset > h->size || size > h->size - offset ||
        sim_reservation_holding((uintptr_t)ptr, size) == SIZE_MAX || overlaps) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (!sim_reserve_slot((void **)&sim_vmm.mappings, &sim_vmm.cap_mappings, sim_vmm.n_mappings,
                                 sizeof *sim_vmm.mappings) ||
               mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd,
                    h->offset + (off_t)offset) == MAP_FAILED) {
        res = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        memmove(&sim_vmm.mappings[next + 1], &sim_vmm.mappings[next],
                (sim_vmm.n_mappings - next) * sizeof *sim_vmm.mappings);
        sim_vmm.mappings[next] = (struct sim_mapping){.base = (uintptr_t)ptr, .size = size, .handle = h};
        sim_vmm.n_mappings++;
        h->mappings++;
    }
    sim_mem_unlock();
    return res;
}

/* Whole mappings only (cuda.h: no sub-range of one); the range stays reserved. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    size_t first, count;
    if (!sim_whole_mappings((uintptr_t)ptr, size, &first, &count)) {
        sim_mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = first; i < first + count; i++) {
        struct sim_mapping *m = &sim_vmm.mappings[i];
        if (m->access)
            sim_mem_untrack(m->base);
        mmap((void *)m->base, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        if (--m->handle->mappings == 0 && m->handle->released)
            sim_handle_destroy(m->handle);
    }
    memmove(&sim_vmm.mappings[first], &sim_vmm.mappings[first + count],
            (sim_vmm.n_mappings - first - count) * sizeof *sim_vmm.mappings);
    sim_vmm.n_mappings -= count;
    sim_mem_unlock();
    return res;
}

/* Over whole mappings that follow each other.  Any access from any device
 * makes a mapping readable and writable (see the top of the file). */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t grant = 0, revoke = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t device;
        res = sim_mem_location(&desc[i].location, &device);
        if (res != CUDA_SUCCESS)
            return res;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE:
            revoke |= 1u << device;
            grant &= ~(1u << device);
            break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ:
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            grant |= 1u << device;
            revoke &= ~(1u << device);
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    sim_mem_lock();
    size_t first, n;
    if (!sim_whole_mappings((uintptr_t)ptr, size, &first, &n)) {
        sim_mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = first; i < first + n && res == CUDA_SUCCESS; i++) {
        struct sim_mapping *m = &sim_vmm.mappings[i];
        uint32_t access = (m->access & ~revoke) | grant;
        if (access && !m->access) {
            if (sim_mem_track(m->base, m->size, SIM_MEM_MAPPED, NULL))
                mprotect((void *)m->base, m->size, PROT_READ | PROT_WRITE);
            else
                res = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!access && m->access) {
            sim_mem_untrack(m->base);
            mprotect((void *)m->base, m->size, PROT_NONE);
        }
        if (res == CUDA_SUCCESS)
            m->access = access;
    }
    sim_mem_unlock();
    return res;
}

/* A POSIX file descriptor, for allocations that asked for one at creation
 * (cuda.h, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
 * "if requested via cuMemCreate").  Device memory's descriptor holds the
 * allocation until it is closed everywhere; host memory's is its memfd. */
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!shareableHandle || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    sim_mem_lock();
    const struct sim_handle *h = sim_handle_find(handle, NULL);
    int fd = -1;
    if (!h || h->released || !(h->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        res = CUDA_ERROR_INVALID_VALUE;
    else if ((fd = h->host ? fcntl(h->fd, F_DUPFD_CLOEXEC, 0) : sim_shared_export(&h->shared)) < 0)
        res = CUDA_ERROR_OUT_OF_MEMORY;
    else
        *(int *)shareableHandle = fd;
    sim_mem_unlock();
    return res;
}

/* Whether `fd` is a host allocation's memfd (of any process). */
static bool sim_host_memfd(int fd)
{
    char link[64], target[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return false;
    target[n] = 0;
    return strncmp(target, "/memfd:simgpu-host ", 19) == 0;
}

/* A new handle for what `osHandle` (the descriptor itself, for
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) was exported from.  The caller
 * keeps its descriptor; the handle holds the memory until it is released
 * (cuda.h, cuMemRelease: "Each time a recipient process imports a shareable
 * handle, it needs to pair it with cuMemRelease").  Imported device memory
 * is not charged to the importer: it stays its owner's (shared.c). */
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    struct sim_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->prop = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (sim_host_memfd(fd)) {
        h->host = true;
        h->size = (size_t)st.st_size;
        h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        h->prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
        res = h->fd < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    } else if (sim_shared_join(0, fd, &h->shared) == 0) {
        h->device = h->shared.device;
        h->size = h->shared.size;
        h->fd = h->shared.fd;
        h->prop.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)h->device};
    } else {
        res = CUDA_ERROR_INVALID_VALUE;
    }
    if (res == CUDA_SUCCESS) {
        sim_mem_lock();
        if (sim_handle_add(h)) {
            *handle = h->id;
            h = NULL;
        } else {
            sim_handle_give_back(h);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        }
        sim_mem_unlock();
    }
    free(h);
    return res;
}

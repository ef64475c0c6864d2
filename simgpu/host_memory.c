/* simgpu's page-locked host memory: cuMemAllocHost, cuMemHostAlloc,
 * cuMemFreeHost, cuMemHostRegister, cuMemHostUnregister,
 * cuMemHostGetDevicePointer and cuMemHostGetFlags.
 *
 * Host memory is not the device's: nothing here is charged to a device or
 * shows in NVML, as on a GPU.  Nothing is really locked either (no mlock, so
 * RLIMIT_MEMLOCK does not matter); what the driver keeps is the table of
 * page-locked ranges, which tells copies.c whether an asynchronous copy to
 * the host may return before it is done.
 *
 * simgpu's devices have unified addressing and can use the host pointer of
 * registered memory (CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
 * is 1, as on an H100 under Linux), so every page-locked range is mapped, and
 * its device pointer is its host pointer, whatever the flags (cuda.h, "Unified
 * Addressing", and cuMemHostGetDevicePointer).  A range lives until it is freed or
 * unregistered, even past the context it was made in (a real driver frees
 * the allocations of a context that is destroyed without PORTABLE). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver.h"

enum {
    SIM_HOSTALLOC_FLAGS = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED,
    SIM_HOSTREGISTER_FLAGS = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                             CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY,
};

struct sim_host_range {
    uintptr_t base;
    size_t size;                    /* as asked for */
    size_t map_size;                /* whole pages of an allocation; 0 for a registered range */
    unsigned int flags;             /* as given to cuMemHostAlloc or cuMemHostRegister */
};

static struct {
    pthread_mutex_t mutex;          /* guards the table */
    struct sim_host_range *v;       /* sorted by base, not overlapping */
    size_t n, cap;
} sim_host = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static void sim_host_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_host.mutex);
}

/* A child keeps its copy of the parent's ranges: the pages are there, as
 * the table says. */
static void sim_host_atfork_done(void)
{
    pthread_mutex_unlock(&sim_host.mutex);
}

__attribute__((constructor)) static void sim_host_load(void)
{
    pthread_atfork(sim_host_atfork_prepare, sim_host_atfork_done, sim_host_atfork_done);
}

/* The first range whose base is above `addr`.  Under the mutex. */
static size_t sim_host_upper_bound(uintptr_t addr)
{
    size_t lo = 0, hi = sim_host.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim_host.v[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The range that holds `addr`, or NULL.  Under the mutex. */
static struct sim_host_range *sim_host_find(uintptr_t addr)
{
    size_t i = sim_host_upper_bound(addr);
    if (i == 0)
        return NULL;
    struct sim_host_range *r = &sim_host.v[i - 1];
    return addr - r->base < r->size ? r : NULL;
}

/* Whether [addr, addr + n) meets a range.  Under the mutex. */
static bool sim_host_overlaps(uintptr_t addr, size_t n)
{
    size_t i = sim_host_upper_bound(addr);
    if (i > 0 && addr - sim_host.v[i - 1].base < sim_host.v[i - 1].size)
        return true;
    return i < sim_host.n && sim_host.v[i].base - addr < n;
}

/* Under the mutex; false: no memory for the table. */
static bool sim_host_insert(const struct sim_host_range *r)
{
    if (sim_host.n == sim_host.cap) {
        size_t cap = sim_host.cap ? 2 * sim_host.cap : 64;
        struct sim_host_range *v = realloc(sim_host.v, cap * sizeof *v);
        if (!v)
            return false;
        sim_host.v = v;
        sim_host.cap = cap;
    }
    size_t i = sim_host_upper_bound(r->base);
    memmove(&sim_host.v[i + 1], &sim_host.v[i], (sim_host.n - i) * sizeof *sim_host.v);
    sim_host.v[i] = *r;
    sim_host.n++;
    return true;
}

/* Removes the range at `base` if it is an allocation (`allocated`) or a
 * registered range (not); *out: what it was.  false: there is none such. */
static bool sim_host_remove(uintptr_t base, bool allocated, struct sim_host_range *out)
{
    pthread_mutex_lock(&sim_host.mutex);
    struct sim_host_range *r = sim_host_find(base);
    bool found = r && r->base == base && (r->map_size != 0) == allocated;
    if (found) {
        *out = *r;
        size_t i = (size_t)(r - sim_host.v);
        memmove(&sim_host.v[i], &sim_host.v[i + 1], (sim_host.n - i - 1) * sizeof *sim_host.v);
        sim_host.n--;
    }
    pthread_mutex_unlock(&sim_host.mutex);
    return found;
}

bool sim_host_pinned(uintptr_t addr, size_t n)
{
    pthread_mutex_lock(&sim_host.mutex);
    const struct sim_host_range *r = sim_host_find(addr);
    bool pinned = r && n <= r->size - (addr - r->base);
    pthread_mutex_unlock(&sim_host.mutex);
    return pinned;
}

static CUresult sim_host_alloc(void **pp, size_t bytesize, unsigned int flags)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pp || bytesize == 0 || (flags & ~(unsigned int)SIM_HOSTALLOC_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytesize > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_host_range r = {.size = bytesize, .map_size = (bytesize + page - 1) / page * page, .flags = flags};
    void *p = mmap(NULL, r.map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r.base = (uintptr_t)p;
    pthread_mutex_lock(&sim_host.mutex);
    bool inserted = sim_host_insert(&r);
    pthread_mutex_unlock(&sim_host.mutex);
    if (!inserted) {
        munmap(p, r.map_size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    SIM_CALLED();
    return sim_host_alloc(pp, bytesize, Flags);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    SIM_CALLED();
    return sim_host_alloc(pp, bytesize, 0);
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    SIM_CALLED();
    return sim_host_alloc(pp, bytesize, 0);
}

/* Only the pointer an allocation returned; a registered range is
 * CUDA_ERROR_INVALID_VALUE (it is unregistered, not freed). */
CUresult cuMemFreeHost(void *p)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    struct sim_host_range r;
    if (!p || !sim_host_remove((uintptr_t)p, true, &r))
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, r.map_size);
    return CUDA_SUCCESS;
}

/* Whether every page of [addr, addr + n) is mapped: pinning touches them all. */
static bool sim_host_mapped(uintptr_t addr, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = addr & ~(page - 1);
    return msync((void *)start, addr + n - start, MS_ASYNC) == 0;
}

static CUresult sim_host_register(void *p, size_t bytesize, unsigned int flags)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    uintptr_t base = (uintptr_t)p;
    if (!p || bytesize == 0 || base + bytesize < base || (flags & ~(unsigned int)SIM_HOSTREGISTER_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_MEMHOSTREGISTER_IOMEMORY)
        return CUDA_ERROR_NOT_SUPPORTED; /* simgpu has no I/O memory to map */
    if (sim_mem_device(base) || !sim_host_mapped(base, bytesize))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_host_range r = {.base = base, .size = bytesize, .flags = flags};
    pthread_mutex_lock(&sim_host.mutex);
    res = sim_host_overlaps(base, bytesize) ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
          : sim_host_insert(&r)             ? CUDA_SUCCESS
                                            : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&sim_host.mutex);
    return res;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    SIM_CALLED();
    return sim_host_register(p, bytesize, Flags);
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    SIM_CALLED();
    return sim_host_register(p, bytesize, Flags);
}

/* Only the base a registration named. */
CUresult cuMemHostUnregister(void *p)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_host_range r;
    return sim_host_remove((uintptr_t)p, false, &r) ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* Any address inside a page-locked range, allocated or registered: its
 * device pointer is the same address. */
static CUresult sim_host_device_pointer(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pdptr || !p || flags != 0 || !sim_host_pinned((uintptr_t)p, 1))
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    SIM_CALLED();
    return sim_host_device_pointer(pdptr, p, Flags);
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags)
{
    SIM_CALLED();
    CUdeviceptr d;
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_host_device_pointer(&d, p, Flags);
    if (res == CUDA_SUCCESS && d > UINT32_MAX)
        res = CUDA_ERROR_INVALID_VALUE; /* no 32-bit device pointer reaches it */
    if (res == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr_v1)d;
    return res;
}

/* The flags an allocation was made with (cuMemAllocHost: none), for any
 * address inside it; a registered range is CUDA_ERROR_INVALID_VALUE (cuda.h:
 * only allocations of cuMemAllocHost or cuMemHostAlloc). */
CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pFlags || !p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_host.mutex);
    const struct sim_host_range *r = sim_host_find((uintptr_t)p);
    bool allocated = r && r->map_size;
    unsigned int flags = allocated ? r->flags : 0;
    pthread_mutex_unlock(&sim_host.mutex);
    if (!allocated)
        return CUDA_ERROR_INVALID_VALUE;
    *pFlags = flags;
    return CUDA_SUCCESS;
}

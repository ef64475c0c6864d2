/* simgpu's device memory: accounting in the machine-wide state file, backed by
 * host pages that are committed only when touched.
 *
 * An allocation is an anonymous MAP_NORESERVE mapping, so a 10 GiB allocation
 * costs no RAM until written, and copies move real bytes.  A CUdeviceptr is the
 * host address.  The bytes are charged to the device in the state file before
 * the mapping is made, so all processes together never exceed the device.
 *
 * This process's allocations are kept sorted by address, so that a copy or a
 * memset (copies.c) can be checked to lie inside one allocation (a wrong
 * pointer is CUDA_ERROR_INVALID_VALUE, as on a real driver, not a crash).  The table also
 * holds the allocations of memory pools (pools.c), the accessible mappings
 * of virtual memory (vmm.c) and the live graph allocations (graph_memory.c),
 * which those files own and charge; its mutex guards their state too, so that
 * the one lock order is contexts.c's mutex, then this one, then the state
 * file's.
 *
 * This file owns the table, its mutex and cuMemAlloc*'s memory; it calls only
 * contexts.c, devices.c and the state file, so that the families whose
 * entries it keeps may call it.  What hands an entry back to its family by
 * address (cuMemFree, cuMemFreeAsync) is frees.c's, and what ends a context's
 * memory context_teardown.c's, both above the families. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver.h"

enum {
    SIM_PITCH_ALIGN = 512,
};

static struct {
    pthread_mutex_t mutex;          /* guards the table */
    struct sim_mem_entry *v;        /* sorted by base */
    size_t n, cap;
} sim_mem = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* The first allocation whose base is above `addr`.  Under the mutex. */
static size_t sim_upper_bound(uintptr_t addr)
{
    size_t lo = 0, hi = sim_mem.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim_mem.v[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The allocation that holds `addr`, or NULL.  Under the mutex. */
static struct sim_mem_entry *sim_find(uintptr_t addr)
{
    size_t i = sim_upper_bound(addr);
    if (i == 0)
        return NULL;
    struct sim_mem_entry *a = &sim_mem.v[i - 1];
    return addr - a->base < a->size ? a : NULL;
}

/* Under the mutex. */
static bool sim_insert(const struct sim_mem_entry *a)
{
    bool ok = true;
    if (sim_mem.n == sim_mem.cap) {
        size_t cap = sim_mem.cap ? 2 * sim_mem.cap : 64;
        struct sim_mem_entry *v = realloc(sim_mem.v, cap * sizeof *v);
        if (v) {
            sim_mem.v = v;
            sim_mem.cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        size_t i = sim_upper_bound(a->base);
        memmove(&sim_mem.v[i + 1], &sim_mem.v[i], (sim_mem.n - i) * sizeof *sim_mem.v);
        sim_mem.v[i] = *a;
        sim_mem.n++;
    }
    return ok;
}

/* Removes the entry at `a`.  Under the mutex. */
static void sim_remove(struct sim_mem_entry *a)
{
    size_t i = (size_t)(a - sim_mem.v);
    memmove(&sim_mem.v[i], &sim_mem.v[i + 1], (sim_mem.n - i - 1) * sizeof *sim_mem.v);
    sim_mem.n--;
}

/* Virtual memory mappings that follow each other are one range, as a
 * reserved range mapped piece by piece is on a GPU. */
bool sim_mem_device_range(uintptr_t addr, size_t n)
{
    pthread_mutex_lock(&sim_mem.mutex);
    size_t i = sim_upper_bound(addr);
    const struct sim_mem_entry *a = i ? &sim_mem.v[i - 1] : NULL;
    bool ok = false;
    if (a && addr - a->base < a->size) {
        size_t avail = a->size - (addr - a->base);
        while (avail < n && a->kind == SIM_MEM_MAPPED && i < sim_mem.n && sim_mem.v[i].kind == SIM_MEM_MAPPED &&
               sim_mem.v[i].base == a->base + a->size) {
            a = &sim_mem.v[i++];
            avail += a->size;
        }
        ok = n <= avail;
    }
    pthread_mutex_unlock(&sim_mem.mutex);
    return ok;
}

bool sim_mem_device(uintptr_t addr)
{
    pthread_mutex_lock(&sim_mem.mutex);
    bool found = sim_find(addr) != NULL;
    pthread_mutex_unlock(&sim_mem.mutex);
    return found;
}

void sim_mem_unmap(const struct sim_mem_entry *a)
{
    munmap((void *)a->base, a->map_size);
    if (a->shared) {
        sim_shared_leave(a->shared);
        free(a->shared);
    } else {
        sim_state_uncharge(a->ctx->device, a->size);
    }
}

/* Lists a mapped allocation; one that cannot be listed is unmapped (false). */
static bool sim_publish(const struct sim_mem_entry *a)
{
    pthread_mutex_lock(&sim_mem.mutex);
    bool inserted = sim_insert(a);
    pthread_mutex_unlock(&sim_mem.mutex);
    if (!inserted)
        sim_mem_unmap(a);
    return inserted;
}

void sim_mem_release_context(CUcontext ctx)
{
    size_t kept = 0;
    for (size_t i = 0; i < sim_mem.n; i++) {
        /* Opened IPC memory is a context's too (cuda.h, cuIpcOpenMemHandle). */
        if (sim_mem.v[i].ctx == ctx)
            sim_mem_unmap(&sim_mem.v[i]);
        else
            sim_mem.v[kept++] = sim_mem.v[i];
    }
    sim_mem.n = kept;
}

void sim_mem_lock(void)
{
    pthread_mutex_lock(&sim_mem.mutex);
}

void sim_mem_unlock(void)
{
    pthread_mutex_unlock(&sim_mem.mutex);
}

bool sim_mem_track(uintptr_t base, size_t size, enum sim_mem_kind kind, void *owner)
{
    struct sim_mem_entry a = {.base = base, .size = size, .kind = kind, .owner = owner};
    return sim_insert(&a);
}

void sim_mem_untrack(uintptr_t base)
{
    struct sim_mem_entry *a = sim_find(base);
    if (a && a->base == base)
        sim_remove(a);
}

void sim_mem_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_mem.mutex);
}

void sim_mem_atfork_parent(void)
{
    pthread_mutex_unlock(&sim_mem.mutex);
}

void sim_mem_atfork_child(void)
{
    sim_mem.n = 0;
    pthread_mutex_unlock(&sim_mem.mutex);
}

CUresult sim_mem_initialized(void)
{
    int count;
    return cuDeviceGetCount(&count);
}

CUresult sim_mem_location(const CUmemLocation *location, uint32_t *device)
{
    switch (location->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_device_index(location->id, device);
}

/* `low` asks for an address below 4 GiB, for the 32-bit calls of CUDA 2.0:
 * MAP_32BIT on x86-64 (the first 2 GiB), elsewhere a hint that is checked.
 * When no such address is free the answer is CUDA_ERROR_OUT_OF_MEMORY. */
static void *sim_map(size_t map_size, bool low)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *hint = NULL;
    if (low) {
#ifdef MAP_32BIT
        flags |= MAP_32BIT;
#else
        hint = (void *)(uintptr_t)0x10000000u;
#endif
    }
    void *p = mmap(hint, map_size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (low && (uintptr_t)p + map_size > ((uintptr_t)1 << 32)) {
        munmap(p, map_size);
        return NULL;
    }
    return p;
}

static CUresult sim_alloc(CUdeviceptr *dptr, size_t bytes, bool low)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_mem_entry a = {.size = bytes, .map_size = (bytes + page - 1) / page * page, .ctx = ctx};

    if (sim_state_charge(ctx->device, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = sim_map(a.map_size, low);
    if (!p) {
        sim_state_uncharge(ctx->device, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.base = (uintptr_t)p;
    if (!sim_publish(&a))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)a.base;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    SIM_CALLED();
    return sim_alloc(dptr, bytesize, false);
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    SIM_CALLED();
    CUdeviceptr p;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_alloc(&p, bytesize, true);
    if (res == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    return res;
}

/* Rows padded to a multiple of 512 bytes; the charge is pitch x height. */
static CUresult sim_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                unsigned int element_bytes, bool low)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!dptr || !pitch || !width || !height || width > INT_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + SIM_PITCH_ALIGN - 1) / SIM_PITCH_ALIGN * SIM_PITCH_ALIGN;
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    res = sim_alloc(dptr, p * height, low);
    if (res == CUDA_SUCCESS)
        *pitch = p;
    return res;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    SIM_CALLED();
    return sim_alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, false);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    SIM_CALLED();
    CUdeviceptr p;
    size_t pitch;
    if (!dptr || !pPitch)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_alloc_pitch(&p, &pitch, WidthInBytes, Height, ElementSizeBytes, true);
    if (res == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned int)pitch;
    }
    return res;
}

/* Managed memory lives on the device that is current, as on a GPU without
 * concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS 0,
 * cuda.h on cuMemAllocManaged): it is charged there like cuMemAlloc's, and the
 * host reaches it at the same address. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    SIM_CALLED();
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
        CUcontext ctx;
        CUresult res = sim_current_context(&ctx);
        return res == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : res;
    }
    return sim_alloc(dptr, bytesize, false);
}

bool sim_mem_entry_at(uintptr_t base, struct sim_mem_entry *out)
{
    const struct sim_mem_entry *a = sim_find(base);
    if (!a || a->base != base)
        return false;
    *out = *a;
    return true;
}

/* Not a virtual memory mapping (vmm.c's cuMemUnmap takes those), nor
 * opened IPC memory (cuIpcCloseMemHandle's). */
bool sim_mem_take(uintptr_t base, struct sim_mem_entry *out)
{
    struct sim_mem_entry *a = sim_find(base);
    if (!a || a->base != base || a->kind == SIM_MEM_MAPPED || a->kind == SIM_MEM_IPC)
        return false;
    *out = *a;
    sim_remove(a);
    return true;
}

/* The bytes move to the shared allocation's file, mapped over the same
 * address, so that the pointer the process holds keeps its contents. */
CUresult sim_mem_share(uintptr_t dptr, uint64_t *id)
{
    pthread_mutex_lock(&sim_mem.mutex);
    struct sim_mem_entry *a = sim_find(dptr);
    CUresult res = CUDA_SUCCESS;
    struct sim_shared_ref *ref = NULL;
    if (!a || a->base != dptr || a->kind != SIM_MEM_LINEAR) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (!a->shared) {
        ref = malloc(sizeof *ref);
        if (!ref || sim_shared_create(a->ctx->device, a->size, false, ref) != 0) {
            free(ref);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (ftruncate(ref->fd, (off_t)a->map_size) != 0 ||
                   pwrite(ref->fd, (void *)a->base, a->map_size, 0) != (ssize_t)a->map_size ||
                   mmap((void *)a->base, a->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ref->fd, 0) ==
                       MAP_FAILED) {
            /* The charge stays the process's: the allocation's again. */
            sim_state_charge(a->ctx->device, a->size);
            sim_shared_leave(ref);
            free(ref);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            a->shared = ref;
        }
    }
    if (res == CUDA_SUCCESS)
        *id = a->shared->id;
    pthread_mutex_unlock(&sim_mem.mutex);
    return res;
}

CUresult sim_mem_ipc_open(CUcontext ctx, uint64_t id, uintptr_t *out)
{
    pthread_mutex_lock(&sim_mem.mutex);
    CUresult res = CUDA_SUCCESS;
    for (size_t i = 0; i < sim_mem.n; i++) {
        struct sim_mem_entry *a = &sim_mem.v[i];
        if (a->shared && a->shared->id == id) {
            /* The process that exported it cannot open it (cuda.h: "from
             * another process"), and a real driver says so with
             * CUDA_ERROR_INVALID_CONTEXT ("invalid device context", as UCX
             * logged it: openucx/ucx#11603); an open one is counted again. */
            if (a->kind == SIM_MEM_IPC && a->ctx == ctx) {
                a->opens++;
                *out = a->base;
            } else {
                res = CUDA_ERROR_INVALID_CONTEXT;
            }
            pthread_mutex_unlock(&sim_mem.mutex);
            return res;
        }
    }
    pthread_mutex_unlock(&sim_mem.mutex);
    struct sim_mem_entry a = {.ctx = ctx, .kind = SIM_MEM_IPC, .opens = 1, .shared = malloc(sizeof *a.shared)};
    if (!a.shared)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (sim_shared_join(id, -1, a.shared) != 0) {
        free(a.shared);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    a.size = a.shared->size;
    a.map_size = (a.size + page - 1) / page * page;
    void *p = mmap(NULL, a.map_size, PROT_READ | PROT_WRITE, MAP_SHARED, a.shared->fd, 0);
    if (p == MAP_FAILED) {
        sim_shared_leave(a.shared);
        free(a.shared);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.base = (uintptr_t)p;
    if (!sim_publish(&a))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = a.base;
    return CUDA_SUCCESS;
}

CUresult sim_mem_ipc_close(uintptr_t dptr)
{
    pthread_mutex_lock(&sim_mem.mutex);
    struct sim_mem_entry *a = sim_find(dptr);
    struct sim_mem_entry gone = {0};
    CUresult res = CUDA_SUCCESS;
    if (!a || a->base != dptr || a->kind != SIM_MEM_IPC) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (--a->opens == 0) {
        gone = *a;
        sim_remove(a);
    }
    pthread_mutex_unlock(&sim_mem.mutex);
    if (gone.shared)
        sim_mem_unmap(&gone);
    return res;
}

/* The allocation that holds `dptr`, of any family this process can address:
 * its own, a pool's (an imported one's too), an accessible mapping, opened
 * IPC memory (cuda.h: "the allocation ... that contains the input pointer";
 * a NULL `pbase` or `psize` is ignored).  An address in none of them is
 * CUDA_ERROR_NOT_FOUND. */
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&sim_mem.mutex);
    const struct sim_mem_entry *a = sim_find((uintptr_t)dptr);
    if (a && pbase)
        *pbase = (CUdeviceptr)a->base;
    if (a && psize)
        *psize = a->size;
    pthread_mutex_unlock(&sim_mem.mutex);
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* Free is the device's total less what all processes hold.
 *
 * A NULL `free` or `total` is skipped, not refused: on real drivers OptiX calls
 * cuMemGetInfo_v2(NULL, &total), and llama.cpp passed a NULL total through
 * cudaMemGetInfo; both work there and crashed only under HAMi-core
 * (HAMi-core issue #321 / PR #322, llama.cpp PR #20499).  With both NULL there
 * is nothing to answer, and simgpu says CUDA_ERROR_INVALID_VALUE (unverified on
 * a real driver). */
CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!free && !total)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_mem_info mem;
    if (sim_state_mem_info(ctx->device, &mem) != 0)
        return CUDA_ERROR_UNKNOWN;
    /* What the driver keeps for itself is no more free than what processes hold. */
    if (free)
        *free = (size_t)(mem.total_bytes - mem.reserved_bytes - mem.used_bytes);
    if (total)
        *total = (size_t)mem.total_bytes;
    return CUDA_SUCCESS;
}

/* The 32-bit call: values of 4 GiB and more read as UINT_MAX. */
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    SIM_CALLED();
    size_t f, t;
    CUresult res = cuMemGetInfo_v2(free ? &f : NULL, total ? &t : NULL);
    if (res != CUDA_SUCCESS)
        return res;
    if (free)
        *free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
    if (total)
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    return CUDA_SUCCESS;
}

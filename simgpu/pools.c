/* simgpu's stream-ordered allocator: memory pools (cuMemPoolCreate and each
 * device's default pool) and cuMemAllocAsync / cuMemAllocFromPoolAsync.  A
 * pool allocation goes back through sim_pool_free, which frees.c calls for
 * cuMemFree and cuMemFreeAsync (any family's address).
 *
 * A pool reserves device memory in chunks.  An allocation's size is rounded up
 * to SIM_POOL_ALIGN bytes and placed first-fit in a chunk the pool holds; when
 * none has room, the pool grows by one chunk of that size rounded up to
 * SIM_GRANULARITY (2 MiB).  A chunk is charged to the process in the state file
 * when it is made, so cuMemGetInfo and NVML see what the pool reserves
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not what is in use.  Freed memory
 * stays reserved for reuse until cuMemPoolTrimTo releases unused chunks, oldest
 * first, never going below its minBytesToKeep (cuda.h), or the pool is
 * destroyed, which releases its unused chunks at once and the rest when its
 * last allocation is freed (cuda.h, cuMemPoolDestroy).
 *
 * Where simgpu differs from a real driver, always by holding memory longer:
 * - A real driver also gives back what a pool holds beyond
 *   CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0) at the next stream, event or
 *   context synchronisation (cuda.h, CUmemPool_attribute).  simgpu keeps the
 *   threshold as an attribute only: its synchronisation calls do not reach the
 *   pools, so memory comes back on cuMemPoolTrimTo and destruction alone.
 * - Nothing runs asynchronously, so an allocation or free is complete when the
 *   call returns, whatever the stream (cuda.h lets a real driver count frees not
 *   yet seen by a synchronisation as outstanding).  The stream handle is not
 *   examined: cuMemAllocAsync takes the current pool of the current context's
 *   device, and a default stream needs a current context.
 * - Pools hold device memory only.
 *
 * A pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR may be shared with
 * other processes (PyTorch's and CuPy's cudaMallocAsync IPC): each of its
 * chunks is then a shared allocation (shared.c), the pool is exported as a
 * memfd that names it (cuMemPoolExportToShareableHandle), and an allocation as
 * its chunk and place (cuMemPoolExportPointer).  An importing process maps the
 * chunk and tracks the allocation in its imported pool until it frees it;
 * the chunk is charged to its owner (shared.c), never to the importer while
 * the exporter holds it.
 *
 * This file owns the pools, their chunks and the places of their allocations
 * in them, under memory.c's mutex; it calls memory.c, contexts.c, devices.c
 * and the state file, and none of them calls it. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver.h"

enum {
    SIM_POOL_ALIGN = 512,           /* allocation sizes are multiples of this */
    SIM_REUSE_ATTRS = 3,            /* CU_MEMPOOL_ATTR_REUSE_*: 1 to 3 */
};

/* A live allocation inside a chunk. */
struct sim_block {
    size_t offset;
    size_t size;                    /* rounded up to SIM_POOL_ALIGN */
};

/* Memory a pool reserves: one mapping, charged whole. */
struct sim_chunk {
    CUmemoryPool pool;
    uintptr_t base;
    size_t size;                    /* a multiple of SIM_GRANULARITY */
    struct sim_block *blocks;       /* sorted by offset */
    size_t n, cap;
    struct sim_shared_ref shared;   /* an exportable or imported pool's; id 0: the process's own */
};

struct CUmemPoolHandle_st {
    CUmemoryPool next;              /* in sim_pools.list */
    uint32_t device;
    bool is_default;
    bool destroyed;                 /* by cuMemPoolDestroy while allocations were live */
    bool exportable;                /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: its chunks are shared */
    bool imported;                  /* by cuMemPoolImportFromShareableHandle: another process's */
    uint64_t token;                 /* names an exportable or imported pool machine-wide; 0: not yet */
    uint64_t max_bytes;             /* what it may reserve */
    uint64_t release_threshold;     /* an attribute only: see the top of the file */
    int reuse[SIM_REUSE_ATTRS];
    uint64_t reserved_bytes, reserved_high;
    uint64_t used_bytes, used_high;
    struct sim_chunk **chunks;
    size_t n_chunks, cap_chunks;
};

/* Guarded by the memory mutex (sim_mem_lock). */
static struct {
    CUmemoryPool list;              /* every pool, destroyed ones until their last free */
    CUmemoryPool default_pool[SIM_MAX_DEVICES];
    CUmemoryPool current[SIM_MAX_DEVICES];  /* NULL: the default pool */
} sim_pools;

static size_t sim_round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

static CUmemoryPool sim_pool_new(uint32_t device, uint64_t max_bytes)
{
    CUmemoryPool p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->device = device;
    p->max_bytes = max_bytes ? max_bytes : UINT64_MAX; /* 0: as much as the device has */
    for (int i = 0; i < SIM_REUSE_ATTRS; i++)
        p->reuse[i] = 1; /* every reuse policy is on by default (cuda.h) */
    p->next = sim_pools.list;
    sim_pools.list = p;
    return p;
}

/* A pool handle of this process that the API may use. */
static bool sim_pool_valid(CUmemoryPool pool)
{
    for (CUmemoryPool p = sim_pools.list; p; p = p->next)
        if (p == pool)
            return !p->destroyed;
    return false;
}

/* Made on first use, as a process that never asks has none. */
static CUmemoryPool sim_default_pool(uint32_t device)
{
    if (!sim_pools.default_pool[device]) {
        sim_pools.default_pool[device] = sim_pool_new(device, 0);
        if (sim_pools.default_pool[device])
            sim_pools.default_pool[device]->is_default = true;
    }
    return sim_pools.default_pool[device];
}

static CUmemoryPool sim_current_pool(uint32_t device)
{
    return sim_pools.current[device] ? sim_pools.current[device] : sim_default_pool(device);
}

static void sim_chunk_release(struct sim_chunk *c)
{
    CUmemoryPool p = c->pool;
    munmap((void *)c->base, c->size);
    if (c->shared.id)
        sim_shared_leave(&c->shared);
    else
        sim_state_uncharge(p->device, c->size);
    p->reserved_bytes -= c->size;
    free(c->blocks);
    free(c);
}

/* Releases unused chunks while at least `keep` bytes stay reserved. */
static void sim_pool_trim(CUmemoryPool p, uint64_t keep)
{
    size_t kept = 0;
    for (size_t i = 0; i < p->n_chunks; i++) {
        struct sim_chunk *c = p->chunks[i];
        if (c->n == 0 && p->reserved_bytes - c->size >= keep)
            sim_chunk_release(c);
        else
            p->chunks[kept++] = c;
    }
    p->n_chunks = kept;
}

/* Frees a pool that holds no allocation. */
static void sim_pool_delete(CUmemoryPool pool)
{
    sim_pool_trim(pool, 0);
    for (CUmemoryPool *link = &sim_pools.list; *link; link = &(*link)->next) {
        if (*link == pool) {
            *link = pool->next;
            break;
        }
    }
    free(pool->chunks);
    free(pool);
}

/* The offset of the first gap of `size` bytes in `c`, and in `*index` where its
 * block goes; SIZE_MAX when there is none. */
static size_t sim_chunk_fit(const struct sim_chunk *c, size_t size, size_t *index)
{
    size_t start = 0;
    for (size_t i = 0; i <= c->n; i++) {
        size_t end = i < c->n ? c->blocks[i].offset : c->size;
        if (end - start >= size) {
            *index = i;
            return start;
        }
        if (i < c->n)
            start = c->blocks[i].offset + c->blocks[i].size;
    }
    return SIZE_MAX;
}

static bool sim_chunk_insert(struct sim_chunk *c, size_t index, size_t offset, size_t size)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        struct sim_block *v = realloc(c->blocks, cap * sizeof *v);
        if (!v)
            return false;
        c->blocks = v;
        c->cap = cap;
    }
    memmove(&c->blocks[index + 1], &c->blocks[index], (c->n - index) * sizeof *c->blocks);
    c->blocks[index] = (struct sim_block){.offset = offset, .size = size};
    c->n++;
    return true;
}

/* A new chunk of `size` bytes (a multiple of SIM_GRANULARITY), charged; NULL
 * when the pool's maximum or the device's memory does not allow it. */
static struct sim_chunk *sim_pool_grow(CUmemoryPool p, size_t size)
{
    if (size > p->max_bytes - p->reserved_bytes)
        return NULL;
    if (p->n_chunks == p->cap_chunks) {
        size_t cap = p->cap_chunks ? 2 * p->cap_chunks : 8;
        struct sim_chunk **v = realloc(p->chunks, cap * sizeof *v);
        if (!v)
            return NULL;
        p->chunks = v;
        p->cap_chunks = cap;
    }
    struct sim_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    void *base = MAP_FAILED;
    if (p->exportable) {
        if (sim_shared_create(p->device, size, true, &c->shared) == 0 &&
            (base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->shared.fd, 0)) == MAP_FAILED)
            sim_shared_leave(&c->shared);
    } else if (sim_state_charge(p->device, size) == 0 &&
               (base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                            0)) == MAP_FAILED) {
        sim_state_uncharge(p->device, size);
    }
    if (base == MAP_FAILED) {
        free(c);
        return NULL;
    }
    c->pool = p;
    c->base = (uintptr_t)base;
    c->size = size;
    p->chunks[p->n_chunks++] = c;
    p->reserved_bytes += size;
    if (p->reserved_bytes > p->reserved_high)
        p->reserved_high = p->reserved_bytes;
    return c;
}

/* Under the memory mutex; `pool` is valid. */
static CUresult sim_pool_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool)
{
    if (bytes > SIZE_MAX - SIM_GRANULARITY)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = sim_round_up(bytes, SIM_POOL_ALIGN);
    struct sim_chunk *c = NULL;
    size_t offset = SIZE_MAX, index = 0;
    for (size_t i = 0; i < pool->n_chunks && offset == SIZE_MAX; i++) {
        c = pool->chunks[i];
        offset = sim_chunk_fit(c, size, &index);
    }
    bool grown = offset == SIZE_MAX;
    if (grown) {
        c = sim_pool_grow(pool, sim_round_up(size, SIM_GRANULARITY));
        if (!c)
            return CUDA_ERROR_OUT_OF_MEMORY;
        offset = index = 0;
    }
    if (sim_chunk_insert(c, index, offset, size)) {
        if (sim_mem_track(c->base + offset, bytes, SIM_MEM_POOL, c)) {
            pool->used_bytes += size;
            if (pool->used_bytes > pool->used_high)
                pool->used_high = pool->used_bytes;
            *dptr = (CUdeviceptr)(c->base + offset);
            return CUDA_SUCCESS;
        }
        memmove(&c->blocks[index], &c->blocks[index + 1], (c->n - index - 1) * sizeof *c->blocks);
        c->n--;
    }
    if (grown) {
        pool->n_chunks--;
        sim_chunk_release(c);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void sim_pool_free(void *chunk, uintptr_t base)
{
    struct sim_chunk *c = chunk;
    CUmemoryPool p = c->pool;
    size_t offset = base - c->base, lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->blocks[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    p->used_bytes -= c->blocks[lo].size;
    memmove(&c->blocks[lo], &c->blocks[lo + 1], (c->n - lo - 1) * sizeof *c->blocks);
    c->n--;
    /* An imported chunk is mapped for as long as an allocation in it is. */
    if (p->imported && c->n == 0)
        sim_pool_trim(p, 0);
    if (p->destroyed && p->used_bytes == 0)
        sim_pool_delete(p);
}

void sim_pools_forget(void)
{
    while (sim_pools.list) {
        CUmemoryPool p = sim_pools.list;
        sim_pools.list = p->next;
        for (size_t i = 0; i < p->n_chunks; i++) {
            if (p->chunks[i]->shared.id)
                close(p->chunks[i]->shared.fd); /* the child's own descriptor */
            free(p->chunks[i]->blocks);
            free(p->chunks[i]);
        }
        free(p->chunks);
        free(p);
    }
    memset(&sim_pools, 0, sizeof sim_pools);
}

CUresult sim_pool_stream_ready(CUstream stream)
{
    if (!stream || stream == SIM_STREAM_LEGACY || stream == SIM_STREAM_PER_THREAD) {
        CUcontext ctx;
        return sim_current_context(&ctx);
    }
    return sim_mem_initialized();
}

/* The stream is not examined: see the top of the file. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    SIM_CALLED();
    (void)hStream;
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    CUmemoryPool pool = sim_current_pool(ctx->device);
    res = pool ? sim_pool_alloc(dptr, bytesize, pool) : CUDA_ERROR_OUT_OF_MEMORY;
    sim_mem_unlock();
    return res;
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    SIM_CALLED();
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    SIM_CALLED();
    CUresult res = sim_pool_stream_ready(hStream);
    if (res != CUDA_SUCCESS)
        return res;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    /* An imported pool only imports (cuda.h, cuMemPoolImportFromShareableHandle). */
    res = sim_pool_valid(pool) && !pool->imported ? sim_pool_alloc(dptr, bytesize, pool) : CUDA_ERROR_INVALID_VALUE;
    sim_mem_unlock();
    return res;
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    SIM_CALLED();
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

/* Pinned device memory only, exportable as a POSIX file descriptor if asked. */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    SIM_CALLED();
    if (!pool || !poolProps)
        return CUDA_ERROR_INVALID_VALUE;
    if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return poolProps->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED
                                                                       : CUDA_ERROR_INVALID_VALUE;
    uint32_t device;
    CUresult res = sim_mem_location(&poolProps->location, &device);
    if (res != CUDA_SUCCESS)
        return res;
    if ((poolProps->handleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || poolProps->usage)
        return CUDA_ERROR_NOT_SUPPORTED;
    sim_mem_lock();
    CUmemoryPool p = sim_pool_new(device, poolProps->maxSize);
    if (p)
        p->exportable = poolProps->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    sim_mem_unlock();
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = p;
    return CUDA_SUCCESS;
}

/* A device's default pool cannot be destroyed; the device's current pool
 * becomes its default again (cuda.h). */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    if (!sim_pool_valid(pool) || pool->is_default) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        if (sim_pools.current[pool->device] == pool)
            sim_pools.current[pool->device] = NULL;
        if (pool->used_bytes == 0) {
            sim_pool_delete(pool);
        } else {
            pool->destroyed = true;
            sim_pool_trim(pool, 0);
        }
    }
    sim_mem_unlock();
    return res;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    if (sim_pool_valid(pool))
        sim_pool_trim(pool, minBytesToKeep);
    else
        res = CUDA_ERROR_INVALID_VALUE;
    sim_mem_unlock();
    return res;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    if (!sim_pool_valid(pool)) {
        sim_mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved_bytes; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used_bytes; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    default: res = CUDA_ERROR_INVALID_VALUE;
    }
    sim_mem_unlock();
    return res;
}

/* The high watermarks can only be reset, by setting 0 (cuda.h): they then
 * start again from the current value. */
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    if (!sim_pool_valid(pool)) {
        sim_mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(const int *)value;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = *(const cuuint64_t *)value;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            res = CUDA_ERROR_INVALID_VALUE;
        else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved_bytes;
        else
            pool->used_high = pool->used_bytes;
        break;
    default:
        res = CUDA_ERROR_INVALID_VALUE;
    }
    sim_mem_unlock();
    return res;
}

static CUresult sim_device_pool(CUmemoryPool *out, CUdevice dev, bool current)
{
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    CUmemoryPool p = current ? sim_current_pool(index) : sim_default_pool(index);
    sim_mem_unlock();
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = p;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    SIM_CALLED();
    return sim_device_pool(pool_out, dev, false);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_CALLED();
    return sim_device_pool(pool, dev, true);
}

/* The pool must be one of `dev`'s. */
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    if (sim_pool_valid(pool) && pool->device == index && !pool->imported)
        sim_pools.current[index] = pool;
    else
        res = CUDA_ERROR_INVALID_VALUE;
    sim_mem_unlock();
    return res;
}

/* What a pool's shareable handle (a memfd) holds, and a pointer's export data. */
struct sim_pool_name {
    char magic[8];                  /* SIM_POOL_MAGIC */
    uint64_t token;
    uint32_t device;
    uint32_t pad;
};

struct sim_pool_ptr {
    char magic[8];                  /* SIM_POOL_PTR_MAGIC */
    uint64_t token;                 /* of its pool */
    uint64_t chunk;                 /* the chunk's shared allocation */
    uint64_t offset, size;          /* in the chunk */
};
_Static_assert(sizeof(struct sim_pool_ptr) <= sizeof(CUmemPoolPtrExportData), "export data has 64 bytes");

#define SIM_POOL_MAGIC "simgpuQ"
#define SIM_POOL_PTR_MAGIC "simgpuP"

CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType handleType,
                                          unsigned long long flags)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!handle_out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    sim_mem_lock();
    if (!sim_pool_valid(pool) || !pool->exportable) {
        sim_mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!pool->token)
        pool->token = sim_shared_new_id();
    if (!pool->token) {
        sim_mem_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_pool_name name = {.magic = SIM_POOL_MAGIC, .token = pool->token, .device = pool->device};
    sim_mem_unlock();
    int fd = memfd_create("simgpu-pool", MFD_CLOEXEC);
    if (fd < 0 || pwrite(fd, &name, sizeof name, 0) != (ssize_t)sizeof name) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle_out = fd;
    return CUDA_SUCCESS;
}

/* `handle` is the descriptor itself; the caller keeps it. */
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle, CUmemAllocationHandleType handleType,
                                            unsigned long long flags)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!pool_out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct sim_pool_name name;
    int fd = (int)(intptr_t)handle;
    if (fd < 0 || pread(fd, &name, sizeof name, 0) != (ssize_t)sizeof name ||
        memcmp(name.magic, SIM_POOL_MAGIC, sizeof name.magic) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (name.device >= sim_driver_config()->device_count)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    CUmemoryPool p = sim_pool_new(name.device, 0);
    if (p) {
        p->imported = true;
        p->token = name.token;
    }
    sim_mem_unlock();
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool_out = p;
    return CUDA_SUCCESS;
}

/* An allocation of an exportable pool. */
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!shareData_out)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    struct sim_mem_entry a;
    const struct sim_chunk *c = sim_mem_entry_at((uintptr_t)ptr, &a) && a.kind == SIM_MEM_POOL ? a.owner : NULL;
    if (!c || !c->pool->exportable || c->pool->imported || !c->pool->token) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct sim_pool_ptr data = {.magic = SIM_POOL_PTR_MAGIC, .token = c->pool->token, .chunk = c->shared.id,
                                    .offset = a.base - c->base, .size = a.size};
        memset(shareData_out, 0, sizeof *shareData_out);
        memcpy(shareData_out, &data, sizeof data);
    }
    sim_mem_unlock();
    return res;
}

/* Under the memory mutex: the chunk of `pool` that maps shared allocation
 * `id`, mapped if need be; NULL when it is gone or there is no memory. */
static struct sim_chunk *sim_import_chunk(CUmemoryPool pool, uint64_t id)
{
    for (size_t i = 0; i < pool->n_chunks; i++)
        if (pool->chunks[i]->shared.id == id)
            return pool->chunks[i];
    if (pool->n_chunks == pool->cap_chunks) {
        size_t cap = pool->cap_chunks ? 2 * pool->cap_chunks : 8;
        struct sim_chunk **v = realloc(pool->chunks, cap * sizeof *v);
        if (!v)
            return NULL;
        pool->chunks = v;
        pool->cap_chunks = cap;
    }
    struct sim_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    void *base = MAP_FAILED;
    if (sim_shared_join(id, -1, &c->shared) == 0 &&
        (base = mmap(NULL, c->shared.size, PROT_READ | PROT_WRITE, MAP_SHARED, c->shared.fd, 0)) == MAP_FAILED)
        sim_shared_leave(&c->shared);
    if (base == MAP_FAILED) {
        free(c);
        return NULL;
    }
    c->pool = pool;
    c->base = (uintptr_t)base;
    c->size = c->shared.size;
    pool->chunks[pool->n_chunks++] = c;
    pool->reserved_bytes += c->size;
    return c;
}

/* Into a pool imported from the exporter's (cuda.h); the same allocation
 * imported again is the same pointer. */
CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData *shareData)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!ptr_out || !shareData)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool_ptr data;
    memcpy(&data, shareData, sizeof data);
    sim_mem_lock();
    struct sim_chunk *c = NULL;
    if (!sim_pool_valid(pool) || !pool->imported || pool->token != data.token ||
        memcmp(data.magic, SIM_POOL_PTR_MAGIC, sizeof data.magic) != 0 || !(c = sim_import_chunk(pool, data.chunk)) ||
        data.offset > c->size || data.size > c->size - data.offset) {
        res = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t size = sim_round_up(data.size, SIM_POOL_ALIGN), index = 0;
    while (index < c->n && c->blocks[index].offset < data.offset)
        index++;
    if (index == c->n || c->blocks[index].offset != data.offset) {
        if (!sim_chunk_insert(c, index, data.offset, size)) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        if (!sim_mem_track(c->base + data.offset, data.size, SIM_MEM_POOL, c)) {
            memmove(&c->blocks[index], &c->blocks[index + 1], (c->n - index - 1) * sizeof *c->blocks);
            c->n--;
            res = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        pool->used_bytes += size;
    }
    *ptr_out = (CUdeviceptr)(c->base + data.offset);
out:
    if (c && c->n == 0)
        sim_pool_trim(pool, 0); /* a chunk mapped for nothing */
    sim_mem_unlock();
    return res;
}

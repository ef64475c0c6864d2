/* A driver that hands a freed handle to the next caller at once, every time,
 * as a real driver may: installed as libcuda.so.1 in front of the simulated
 * driver (on which it depends for everything else), it makes one
 * interleaving certain that threads only sometimes meet.
 *
 * For each family (device pointers, arrays, mipmapped arrays, pools, VMM
 * handles), the second creation waits until a free of the family has begun,
 * and is handed the very handle being freed; the free returns once the
 * handle is handed on.  The handle is never freed in the simulated driver,
 * so it stays valid for its new owner.  A wait gives up after two seconds
 * (a caller that keeps the two apart, as a lock does, is not a failure) and
 * everything after the one hand-over passes straight through.
 *
 * Built with -DSTUB it is an empty library whose only use is its soname,
 * libsimgpu-real.so: the wrapper links against that name, which the test
 * points at the simulated driver (whose own soname is libcuda.so.1). */
#ifndef STUB
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult cuArrayDestroy(CUarray array);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray array);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);

struct family {
    int created;     /* creations seen */
    uint64_t first;  /* the first one's handle */
    bool freeing;    /* a free waits to hand `handle` on */
    bool done;       /* handed on, or given up: pass through from now on */
    uint64_t handle;
};

/* reuse_race's pointers are of this size: the shim's own allocations (its
 * probe for the process's pid in NVML's list) take no part. */
#define BLOCK (16u << 20)

enum { POINTER, ARRAY, MIPMAP, POOL, VMM, FAMILIES };
static struct family families[FAMILIES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

/* The simulated driver's own function: next after us in the search order.
 * Through the C library's dlsym, never the shim's, which would answer with
 * its own hook of the name. */
static void *real(const char *name)
{
    static void *(*libc_dlsym)(void *, const char *);
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !libc_dlsym; i++)
        libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    return libc_dlsym(RTLD_NEXT, name);
}

static bool wait_until(const bool *flag, bool value)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 2;
    while (*flag != value)
        if (pthread_cond_timedwait(&changed, &lock, &deadline))
            return false;
    return true;
}

/* A creation: true with *handle when it was handed a freed one. */
static bool handed(int f, uint64_t *handle)
{
    struct family *fam = &families[f];
    bool got = false;
    pthread_mutex_lock(&lock);
    if (!fam->done && ++fam->created == 2) {
        got = wait_until(&fam->freeing, true);
        if (got) {
            *handle = fam->handle;
            fam->freeing = false;
        }
        fam->done = true;
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    return got;
}

/* After a creation that was not handed anything: the first one's handle. */
static CUresult noted(int f, CUresult rc, uint64_t handle)
{
    struct family *fam = &families[f];
    pthread_mutex_lock(&lock);
    if (rc == CUDA_SUCCESS && !fam->first)
        fam->first = handle;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* A free: true when the handle went to another caller (and is not to be
 * freed in the simulated driver).  Only the first creation's handle is
 * handed on, whether the second creation has begun or not. */
static bool hand_on(int f, uint64_t handle)
{
    struct family *fam = &families[f];
    bool gone = false;
    pthread_mutex_lock(&lock);
    if (!fam->done && fam->first == handle && !fam->freeing) {
        fam->handle = handle;
        fam->freeing = true;
        pthread_cond_broadcast(&changed);
        gone = wait_until(&fam->freeing, false);
        fam->freeing = false;
        fam->done = true;
    }
    pthread_mutex_unlock(&lock);
    return gone;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    uint64_t h;
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))real("cuMemAlloc_v2");
    if (bytes != BLOCK)
        return alloc(dptr, bytes);
    if (handed(POINTER, &h)) {
        *dptr = h;
        return CUDA_SUCCESS;
    }
    CUresult rc = alloc(dptr, bytes);
    return noted(POINTER, rc, rc == CUDA_SUCCESS ? *dptr : 0);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (hand_on(POINTER, dptr))
        return CUDA_SUCCESS;
    return ((CUresult(*)(CUdeviceptr))real("cuMemFree_v2"))(dptr);
}

CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    uint64_t h;
    if (handed(ARRAY, &h)) {
        *array = (CUarray)(uintptr_t)h;
        return CUDA_SUCCESS;
    }
    CUresult rc = ((CUresult(*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *))real("cuArrayCreate_v2"))(array, desc);
    return noted(ARRAY, rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*array : 0);
}

CUresult cuArrayDestroy(CUarray array)
{
    if (hand_on(ARRAY, (uint64_t)(uintptr_t)array))
        return CUDA_SUCCESS;
    return ((CUresult(*)(CUarray))real("cuArrayDestroy"))(array);
}

/* Deferred-mapping arrays hold no memory: the shim makes them to ask what
 * an array needs, and they take no part here. */
static CUmipmappedArray deferred;

CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    uint64_t h;
    if (desc && desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING) {
        CUresult rc = ((CUresult(*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))real(
            "cuMipmappedArrayCreate"))(array, desc, levels);
        if (rc == CUDA_SUCCESS)
            __atomic_store_n(&deferred, *array, __ATOMIC_SEQ_CST);
        return rc;
    }
    if (handed(MIPMAP, &h)) {
        *array = (CUmipmappedArray)(uintptr_t)h;
        return CUDA_SUCCESS;
    }
    CUresult rc = ((CUresult(*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))real(
        "cuMipmappedArrayCreate"))(array, desc, levels);
    return noted(MIPMAP, rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*array : 0);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    CUmipmappedArray probe = array;
    if (!__atomic_compare_exchange_n(&deferred, &probe, NULL, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) &&
        hand_on(MIPMAP, (uint64_t)(uintptr_t)array))
        return CUDA_SUCCESS;
    return ((CUresult(*)(CUmipmappedArray))real("cuMipmappedArrayDestroy"))(array);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    uint64_t h;
    if (handed(POOL, &h)) {
        *pool = (CUmemoryPool)(uintptr_t)h;
        return CUDA_SUCCESS;
    }
    CUresult rc = ((CUresult(*)(CUmemoryPool *, const CUmemPoolProps *))real("cuMemPoolCreate"))(pool, props);
    return noted(POOL, rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pool : 0);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    if (hand_on(POOL, (uint64_t)(uintptr_t)pool))
        return CUDA_SUCCESS;
    return ((CUresult(*)(CUmemoryPool))real("cuMemPoolDestroy"))(pool);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    uint64_t h;
    if (handed(VMM, &h)) {
        *handle = h;
        return CUDA_SUCCESS;
    }
    CUresult rc = ((CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                unsigned long long))real("cuMemCreate"))(handle, size, prop, flags);
    return noted(VMM, rc, rc == CUDA_SUCCESS ? *handle : 0);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (hand_on(VMM, handle))
        return CUDA_SUCCESS;
    return ((CUresult(*)(CUmemGenericAllocationHandle))real("cuMemRelease"))(handle);
}
#endif

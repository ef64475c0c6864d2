/* simgpu's ends of contexts: cuCtxDestroy, cuDevicePrimaryCtxRelease and
 * cuDevicePrimaryCtxReset.  A context that ends gives back what every family
 * took for it, as the driver frees a destroyed context's: its device memory
 * (memory.c) and arrays (arrays.c), its modules' code and local memory
 * (modules.c).
 *
 * This file owns that fan-out and nothing else: which contexts exist and how
 * a primary one is counted are contexts.c's.  It is above contexts.c and the
 * families it releases (which all ask contexts.c for the current context);
 * none of them calls it. */
#include "driver.h"

/* Ends `ctx`: no call may use it from the first step on, then what the
 * families hold for it goes back.  Under contexts.c's mutex, then the memory
 * mutex (the lock order). */
static void sim_context_end(CUcontext ctx)
{
    sim_context_deactivate(ctx);
    sim_mem_lock();
    sim_mem_release_context(ctx);
    sim_arrays_release_context(ctx);
    sim_mem_unlock();
    sim_modules_release_context(ctx);
    sim_context_retire(ctx);
}

/* `all`: a reset, which ends the context whatever its count of references. */
static CUresult sim_primary_end(CUdevice dev, bool all)
{
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    sim_contexts_lock();
    CUcontext ended;
    res = sim_primary_release(dev, all, &ended);
    if (ended)
        sim_context_end(ended);
    sim_contexts_unlock();
    return res;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    SIM_CALLED();
    return sim_primary_end(dev, false);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    SIM_CALLED();
    return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    SIM_CALLED();
    return sim_primary_end(dev, true);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    SIM_CALLED();
    return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    sim_contexts_lock();
    CUresult res = CUDA_SUCCESS;
    if (!sim_context_destroyable(ctx))
        res = CUDA_ERROR_INVALID_CONTEXT;
    else
        sim_context_end(ctx);
    sim_contexts_unlock();
    if (res != CUDA_SUCCESS)
        return res;
    /* Off this thread's stack; another thread that still has it current gets
     * CUDA_ERROR_CONTEXT_IS_DESTROYED. */
    sim_context_unstack(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    SIM_CALLED();
    return cuCtxDestroy_v2(ctx);
}

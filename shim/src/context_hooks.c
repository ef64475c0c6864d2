/* Contexts.  A context costs device memory before anything is allocated in it
 * (overhead.c counts that cost); so as soon as the driver has made one we
 * count it, and if the container is then past its cap the context is undone
 * and the caller gets CUDA_ERROR_OUT_OF_MEMORY, as on a GPU that is full. */
#include <pthread.h>

#include "internal.h"
#include "resume_ask.h"

/* After the driver made a context on `device`: whether the container (and
 * each run it is nested in) still fits under its cap, with the context's
 * cost counted. */
static bool fits(CUdevice_v1 device, CUcontext ctx)
{
    if (device < 0 || device >= VGL_MAX_DEVICES || !vgl_ready())
        return true; /* nothing to count it against: allocations say no if need be */
    vgl_device_used(device);
    /* A process that must find itself in the driver's list does so with a
     * probe allocated in the context (overhead.c): a retained primary
     * context is not current yet. */
    CUcontext popped;
    bool pushed = ctx && vgl_real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
    vgl_overhead_check_now(device);
    if (pushed)
        vgl_real.cuCtxPopCurrent_v2(&popped);
    if (!vgl_overhead_countable(device))
        return false; /* its cost cannot be read: it may not fit */
    uint64_t total = vgl_device_total(device);
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_region *region = vgl_link_at(i).region;
        uint64_t cap = vgl_region_cap(region, device, total);
        const uint64_t *used = &region->devices[device].used_bytes;
        /* What dead processes held (their contexts too) is taken back before a
         * context is refused. */
        if (__atomic_load_n(used, __ATOMIC_RELAXED) > cap &&
            (vgl_region_reclaim(region) <= 0 || __atomic_load_n(used, __ATOMIC_RELAXED) > cap))
            return false;
    }
    return true;
}

static void refuse(const char *call, CUdevice_v1 device)
{
    static unsigned refusals;
    __atomic_add_fetch(&vgl_self.region->devices[device].oom_refusals, 1, __ATOMIC_RELAXED);
    /* Where its cost cannot be read, the one line that says why was said. */
    bool countable = vgl_overhead_countable(device);
    vgl_log_bounded(countable ? VGL_LOG_WARN : VGL_LOG_INFO, &refusals, "%s on device %d refused: the "
                    "context's own memory %s", call, device, countable ? "does not fit under the container's "
                    "cap" : "cannot be counted against the container's cap");
    vgl_overhead_check_now(device); /* the undone context's cost is gone again */
}

/* The calling thread's current context, as the launch path asks it.  Asking
 * the driver on every launch would be most of what a compute share costs, so
 * each thread keeps its answer until one of the calls below may have changed
 * it: on this thread when it changed the stack of current contexts, on every
 * thread when a context may have ended (the epoch), and in a forked child. */
enum { RECHECK_LAUNCHES = 64 };     /* asked again after this many all the same */
static uint64_t contexts_epoch = 1;
static __thread struct {
    CUcontext ctx;
    uint64_t epoch;                 /* 0: ask the driver */
    uint32_t uses;                  /* answers since the driver was last asked */
} current;

static void forget_in_child(void)
{
    __atomic_add_fetch(&contexts_epoch, 1, __ATOMIC_RELEASE);
}
VGL_AFTER_FORK(forget_in_child)

CUresult vgl_context_changed(bool everywhere, CUresult rc)
{
    if (everywhere)
        __atomic_add_fetch(&contexts_epoch, 1, __ATOMIC_RELEASE);
    current.epoch = 0;
    return rc;
}

CUresult vgl_current_context(CUcontext *ctx)
{
    uint64_t epoch = __atomic_load_n(&contexts_epoch, __ATOMIC_ACQUIRE);
    /* Asked again now and then all the same: a path the shim does not see
     * (a driver-private one) would otherwise charge another device for good. */
    if (current.epoch == epoch && ++current.uses < RECHECK_LAUNCHES) {
        *ctx = current.ctx;
        return CUDA_SUCCESS;
    }
    CUresult rc = vgl_real.cuCtxGetCurrent(ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (current.epoch == epoch && current.ctx != *ctx) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "the current context changed from %p to %p by a call the "
                        "shim does not see; up to %d launches were charged to the former's device",
                        (void *)current.ctx, (void *)*ctx, RECHECK_LAUNCHES);
    }
    current.ctx = *ctx;
    current.epoch = epoch;
    current.uses = 0;
    return rc;
}

#define CHANGES_CURRENT(call) vgl_context_changed(false, (call))
#define ENDS_CONTEXT(call) vgl_context_changed(true, (call))

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice_v1 dev)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || fits(dev, *pctx))
        return rc;
    vgl_real.cuDevicePrimaryCtxRelease_v2(dev);
    vgl_context_changed(true, CUDA_SUCCESS);
    refuse("cuDevicePrimaryCtxRetain", dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult admit(const char *call, CUresult rc, CUcontext *pctx, CUdevice_v1 dev)
{
    vgl_context_changed(false, rc); /* a new context is pushed on the thread's stack */
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS || fits(dev, NULL))
        return rc;
    vgl_real.cuCtxDestroy_v2(*pctx);
    vgl_context_changed(true, CUDA_SUCCESS);
    *pctx = NULL;
    refuse(call, dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice_v1 dev)
{
    VGL_ASKS();
    return admit("cuCtxCreate", vgl_real.cuCtxCreate_v2(pctx, flags, dev), pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice_v1 dev)
{
    VGL_ASKS();
    return admit("cuCtxCreate", vgl_real.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev), pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice_v1 dev)
{
    VGL_ASKS();
    return admit("cuCtxCreate", vgl_real.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev), pctx, dev);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice_v1 dev)
{
    VGL_ASKS();
    return admit("cuCtxCreate", vgl_real.cuCtxCreate(pctx, flags, dev), pctx, dev);
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    VGL_ASKS();
    return CHANGES_CURRENT(vgl_real.cuCtxSetCurrent(ctx));
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    VGL_ASKS();
    return CHANGES_CURRENT(vgl_real.cuCtxPushCurrent(ctx));
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    VGL_ASKS();
    return CHANGES_CURRENT(vgl_real.cuCtxPushCurrent_v2(ctx));
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    VGL_ASKS();
    return CHANGES_CURRENT(vgl_real.cuCtxPopCurrent(pctx));
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    VGL_ASKS();
    return CHANGES_CURRENT(vgl_real.cuCtxPopCurrent_v2(pctx));
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuCtxDestroy(ctx));
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuCtxDestroy_v2(ctx));
}

CUresult cuCtxDetach(CUcontext ctx)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuCtxDetach(ctx));
}

CUresult cuDevicePrimaryCtxRelease(CUdevice_v1 dev)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuDevicePrimaryCtxRelease(dev));
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice_v1 dev)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuDevicePrimaryCtxRelease_v2(dev));
}

CUresult cuDevicePrimaryCtxReset(CUdevice_v1 dev)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuDevicePrimaryCtxReset(dev));
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice_v1 dev)
{
    VGL_ASKS();
    return ENDS_CONTEXT(vgl_real.cuDevicePrimaryCtxReset_v2(dev));
}

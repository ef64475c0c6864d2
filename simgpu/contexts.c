/* simgpu's contexts, as the driver models them: one primary context per
 * device per process (retained and released), any number of created ones,
 * and a stack of current contexts per thread.
 *
 * This file owns which contexts exist, which is current on each thread (what
 * every family asks, sim_current_context), their flags, and waiting for a
 * context's work (cuCtxSynchronize).  The ends of contexts, which reach into
 * every family that keeps something per context, are context_teardown.c's,
 * above them all: this file calls only initialized.c, devices.c and the state
 * file. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

enum {
    SIM_CTX_MAGIC = 0x58544353,     /* "SCTX" */
    SIM_CTX_STACK_MAX = 64,         /* current contexts one thread may push */
};

struct sim_primary {
    CUcontext ctx;                  /* made on first retain, then kept */
    unsigned int refcount;
    unsigned int flags;
};

static struct {
    pthread_mutex_t mutex;          /* guards everything here */
    unsigned int generation;        /* bumped in the child of a fork */
    struct sim_primary primary[SIM_MAX_DEVICES];
    uint32_t live_contexts[SIM_MAX_DEVICES];
    CUcontext *contexts;            /* every context made, to check handles */
    size_t n_contexts, cap_contexts;
} sim_drv = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* This thread's stack of current contexts; stale after a fork. */
static _Thread_local struct {
    CUcontext stack[SIM_CTX_STACK_MAX];
    int depth;
    unsigned int generation;
} sim_tls;

void sim_contexts_lock(void)
{
    pthread_mutex_lock(&sim_drv.mutex);
}

void sim_contexts_unlock(void)
{
    pthread_mutex_unlock(&sim_drv.mutex);
}

void sim_contexts_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_drv.mutex);
}

void sim_contexts_atfork_parent(void)
{
    pthread_mutex_unlock(&sim_drv.mutex);
}

/* The child has no context: they are its parent's. */
void sim_contexts_atfork_child(void)
{
    for (size_t i = 0; i < sim_drv.n_contexts; i++)
        sim_drv.contexts[i]->alive = false;
    memset(sim_drv.primary, 0, sizeof sim_drv.primary);
    memset(sim_drv.live_contexts, 0, sizeof sim_drv.live_contexts);
    sim_drv.generation++;
    pthread_mutex_unlock(&sim_drv.mutex);
}

/* This thread's stack, emptied if it predates a fork. */
static int sim_stack_depth(void)
{
    if (sim_tls.generation != sim_drv.generation) {
        sim_tls.depth = 0;
        sim_tls.generation = sim_drv.generation;
    }
    return sim_tls.depth;
}

static CUcontext sim_stack_top(void)
{
    int depth = sim_stack_depth();
    return depth ? sim_tls.stack[depth - 1] : NULL;
}

static bool sim_ctx_alive(CUcontext ctx)
{
    return __atomic_load_n(&ctx->alive, __ATOMIC_ACQUIRE);
}

CUresult sim_current_context(CUcontext *out)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx = sim_stack_top();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!sim_ctx_alive(ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = ctx;
    return CUDA_SUCCESS;
}

/* A handle this process made, of this generation.  Under the mutex. */
static bool sim_ctx_known(CUcontext ctx)
{
    if (!ctx)
        return false;
    for (size_t i = 0; i < sim_drv.n_contexts; i++)
        if (sim_drv.contexts[i] == ctx)
            return ctx->generation == sim_drv.generation;
    return false;
}

/* A new context, not yet alive.  Under the mutex. */
static CUcontext sim_ctx_new(uint32_t device, bool primary, unsigned int flags)
{
    if (sim_drv.n_contexts == sim_drv.cap_contexts) {
        size_t cap = sim_drv.cap_contexts ? 2 * sim_drv.cap_contexts : 16;
        CUcontext *v = realloc(sim_drv.contexts, cap * sizeof *v);
        if (!v)
            return NULL;
        sim_drv.contexts = v;
        sim_drv.cap_contexts = cap;
    }
    CUcontext ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->magic = SIM_CTX_MAGIC;
    ctx->device = device;
    ctx->primary = primary;
    ctx->flags = flags;
    ctx->generation = sim_drv.generation;
    sim_drv.contexts[sim_drv.n_contexts++] = ctx;
    return ctx;
}

/* What a process's first context on a device costs it (a real one's
 * context, heaps and modules). */
static uint64_t context_bytes(void)
{
    const struct sim_config *cfg = sim_config();
    return cfg ? cfg->context_overhead_bytes : 0;
}

/* Makes `ctx` alive and tells the state file that this process now holds a
 * context on its device.  Under the mutex; sim_context_deactivate and
 * sim_context_retire undo it. */
static CUresult sim_ctx_activate(CUcontext ctx)
{
    if (sim_drv.live_contexts[ctx->device] == 0 &&
        sim_state_set_context(ctx->device, true, context_bytes()) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_drv.live_contexts[ctx->device]++;
    ctx->activation++;
    __atomic_store_n(&ctx->alive, true, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

void sim_context_deactivate(CUcontext ctx)
{
    __atomic_store_n(&ctx->alive, false, __ATOMIC_RELEASE);
}

void sim_context_retire(CUcontext ctx)
{
    if (--sim_drv.live_contexts[ctx->device] == 0)
        sim_state_set_context(ctx->device, false, context_bytes());
}

size_t sim_contexts_work(struct sim_ctx_work *out, size_t max)
{
    pthread_mutex_lock(&sim_drv.mutex);
    size_t n = 0;
    for (size_t i = 0; i < sim_drv.n_contexts && n < max; i++) {
        CUcontext c = sim_drv.contexts[i];
        uint64_t last = __atomic_load_n(&c->last_work, __ATOMIC_ACQUIRE);
        if (sim_ctx_alive(c) && c->generation == sim_drv.generation && last)
            out[n++] = (struct sim_ctx_work){.device = c->device, .ticket = last, .ctx = c};
    }
    pthread_mutex_unlock(&sim_drv.mutex);
    return n;
}

CUresult sim_primary_release(CUdevice dev, bool all, CUcontext *ended)
{
    struct sim_primary *p = &sim_drv.primary[dev];
    *ended = NULL;
    if (p->refcount == 0)
        return all ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    p->refcount = all ? 0 : p->refcount - 1;
    if (p->refcount == 0)
        *ended = p->ctx;
    return CUDA_SUCCESS;
}

bool sim_context_destroyable(CUcontext ctx)
{
    return sim_ctx_known(ctx) && !ctx->primary && ctx->alive;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_drv.mutex);
    struct sim_primary *p = &sim_drv.primary[dev];
    if (!p->ctx)
        p->ctx = sim_ctx_new(index, true, p->flags);
    if (!p->ctx)
        res = CUDA_ERROR_OUT_OF_MEMORY;
    else if (p->refcount == 0)
        res = sim_ctx_activate(p->ctx);
    if (res == CUDA_SUCCESS) {
        p->refcount++;
        *pctx = p->ctx;
    }
    pthread_mutex_unlock(&sim_drv.mutex);
    return res;
}

/* `active_error`: what to answer while the context is active (before CUDA 11
 * the flags could not change then; _v2 allows it). */
static CUresult sim_primary_set_flags(CUdevice dev, unsigned int flags, CUresult active_error)
{
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (flags & ~(unsigned int)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_drv.mutex);
    struct sim_primary *p = &sim_drv.primary[dev];
    if (p->refcount && active_error != CUDA_SUCCESS) {
        res = active_error;
    } else {
        p->flags = flags;
        if (p->ctx)
            p->ctx->flags = flags;
    }
    pthread_mutex_unlock(&sim_drv.mutex);
    return res;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    SIM_CALLED();
    return sim_primary_set_flags(dev, flags, CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    SIM_CALLED();
    return sim_primary_set_flags(dev, flags, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SIM_CALLED();
    CUresult res = sim_check_device(dev);
    if (res != CUDA_SUCCESS)
        return res;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_drv.mutex);
    *flags = sim_drv.primary[dev].flags;
    *active = sim_drv.primary[dev].refcount > 0;
    pthread_mutex_unlock(&sim_drv.mutex);
    return CUDA_SUCCESS;
}

static CUresult sim_stack_push(CUcontext ctx)
{
    int depth = sim_stack_depth();
    if (depth == SIM_CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_tls.stack[depth] = ctx;
    sim_tls.depth = depth + 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pctx || (flags & ~(unsigned int)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_stack_depth() == SIM_CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&sim_drv.mutex);
    CUcontext ctx = sim_ctx_new(index, false, flags);
    res = ctx ? sim_ctx_activate(ctx) : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&sim_drv.mutex);
    if (res != CUDA_SUCCESS)
        return res;
    sim_stack_push(ctx);
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_CALLED();
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* Execution affinity (a share of the SMs) is accepted and ignored: every
 * context sees the whole simulated device. */
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    SIM_CALLED();
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* cuda.h's CUctxCreateParams, read only to refuse what simgpu cannot do. */
struct sim_ctx_create_params {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
};

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    SIM_CALLED();
    if (ctxCreateParams) {
        const struct sim_ctx_create_params *p = (const struct sim_ctx_create_params *)ctxCreateParams;
        if (p->cigParams)
            return CUDA_ERROR_NOT_SUPPORTED; /* CUDA in graphics: no graphics here */
        if (p->numExecAffinityParams < 0 || (p->numExecAffinityParams > 0 && !p->execAffinityParams))
            return CUDA_ERROR_INVALID_VALUE;
    }
    return cuCtxCreate_v2(pctx, flags, dev);
}

void sim_context_unstack(CUcontext ctx)
{
    int depth = sim_stack_depth(), kept = 0;
    for (int i = 0; i < depth; i++)
        if (sim_tls.stack[i] != ctx)
            sim_tls.stack[kept++] = sim_tls.stack[i];
    sim_tls.depth = kept;
}

/* A handle of this process for calls that make a context current: a destroyed
 * created context is invalid; a primary context may be made current while
 * inactive (the calls that then need it answer CUDA_ERROR_CONTEXT_IS_DESTROYED,
 * which cuda.h defines as a current context destroyed, or a primary one not
 * yet initialised). */
CUresult sim_check_context(CUcontext ctx)
{
    pthread_mutex_lock(&sim_drv.mutex);
    bool ok = sim_ctx_known(ctx) && (ctx->alive || ctx->primary);
    pthread_mutex_unlock(&sim_drv.mutex);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* A live handle of this process, for calls that act on a named context. */
CUresult sim_check_live_context(CUcontext ctx)
{
    CUresult res = sim_check_context(ctx);
    if (res == CUDA_SUCCESS && !sim_ctx_alive(ctx))
        res = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return res;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult res = sim_check_context(ctx);
    return res == CUDA_SUCCESS ? sim_stack_push(ctx) : res;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    SIM_CALLED();
    return cuCtxPushCurrent_v2(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    int depth = sim_stack_depth();
    if (depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_tls.depth = depth - 1;
    if (pctx)
        *pctx = sim_tls.stack[depth - 1];
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    SIM_CALLED();
    return cuCtxPopCurrent_v2(pctx);
}

/* Replaces the top of the stack; NULL pops it (nothing when it is empty). */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    int depth = sim_stack_depth();
    if (!ctx) {
        if (depth)
            sim_tls.depth = depth - 1;
        return CUDA_SUCCESS;
    }
    CUresult res = sim_check_context(ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (depth == 0)
        return sim_stack_push(ctx);
    sim_tls.stack[depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = sim_stack_top();
    return CUDA_SUCCESS;
}

/* `ctx`, or the current context when NULL. */
static CUresult sim_named_or_current(CUcontext ctx, CUcontext *out)
{
    if (!ctx)
        return sim_current_context(out);
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult res = sim_check_live_context(ctx);
    if (res == CUDA_SUCCESS)
        *out = ctx;
    return res;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    SIM_CALLED();
    CUcontext c;
    CUresult res = sim_named_or_current(ctx, &c);
    if (res != CUDA_SUCCESS)
        return res;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = sim_device_ordinal(c->device);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    SIM_CALLED();
    return cuCtxGetDevice_v2(device, NULL);
}

/* Waits until the device has run all of `ctx`'s work: its last ticket, on
 * any stream (lanes.c keeps it), is done on the device's timeline. */
static CUresult sim_context_synchronize(CUcontext ctx)
{
    uint64_t last = __atomic_load_n(&ctx->last_work, __ATOMIC_ACQUIRE), at;
    if (last && sim_timeline_wait(ctx->device, last, (uintptr_t)ctx, &at) < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    SIM_CALLED();
    CUcontext c;
    CUresult res = sim_named_or_current(ctx, &c);
    return res == CUDA_SUCCESS ? sim_context_synchronize(c) : res;
}

CUresult cuCtxSynchronize(void)
{
    SIM_CALLED();
    return cuCtxSynchronize_v2(NULL);
}

/* Kernel launches: every launch path (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz variants) draws
 * from the container's compute budget on its device (throttle.c).
 *
 * A launch is charged the GPU time its kernel (or graph) took last time, and
 * waits, asleep, while the container's budget is owing.  The time it really
 * takes is measured with two events recorded around it on its stream, read
 * back without waiting by later launches of the process, and settled against
 * the charge: the budget is kept against measured GPU time, through the CUDA
 * API alone, so the same code holds on a real GPU.  The budget refills with
 * the clock, never with the process's own synchronisation, so a launch cannot
 * wait on work that only its own thread could let finish.
 *
 * While no device of the container is limited (no share, or 100 %), a launch
 * costs one comparison: the region's generation (bumped by every change of
 * limits, `vgpulimit set`) against the generation at which nothing was. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum {
    INFLIGHT = 256,                 /* measured launches per context not yet read back */
    CONTEXTS = 16,                  /* contexts per process whose launches are measured */
    COSTS = 256,                    /* launch targets whose GPU time a process remembers */
};
/* What a kernel never measured is charged at first (then what it took). */
#define FIRST_COST_NS 1000000
/* A waiting launch wakes at least this often, to read measurements back and
 * to see a changed share. */
#define MAX_SLEEP_NS 20000000
/* cuda.h's per-thread default stream: what NULL means in a _ptsz entry point,
 * and what the shim's own calls must name there. */
#define STREAM_PER_THREAD ((CUstream)0x2)

/* ---- whether launches draw at all --------------------------------------------------- */

/* Before the first launch, and where there is no region: generation 1. */
static uint64_t without_budget = 1;
static uint64_t *limits_generation = &without_budget;
/* The generation at which no device was limited; 0 (never a generation): some is. */
static uint64_t unlimited_generation;
static uint64_t seen_generation;

static inline bool unlimited(void)
{
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    return __atomic_load_n(generation, __ATOMIC_RELAXED) ==
           __atomic_load_n(&unlimited_generation, __ATOMIC_RELAXED);
}

/* ---- the budgets a launch draws from ---------------------------------------------------- */

/* The device's state in the process's region and in each region that one is
 * nested in (a nested `vgpulimit run`): what the process's kernels take
 * counts in all of them. */
static uint32_t states(int device, struct vgl_device_state **out)
{
    out[0] = &vgl_self.region->devices[device];
    for (uint32_t i = 0; i < vgl_self.nouter; i++)
        out[i + 1] = &vgl_self.outer[i].region->devices[device];
    return 1 + vgl_self.nouter;
}

/* Those of them that hold a share: a launch goes when every one admits it. */
static uint32_t budgets(int device, struct vgl_device_state **out)
{
    struct vgl_device_state *all[VGL_MAX_CHAIN];
    uint32_t n = 0, count = states(device, all);
    for (uint32_t i = 0; i < count; i++)
        if (vgl_throttle_share(all[i]))
            out[n++] = all[i];
    return n;
}

/* 0: admitted by every budget and charged `cost_ns` in each; else how long
 * to wait, nothing charged. */
static int64_t admit(int device, uint64_t now_ns, int64_t cost_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t n = budgets(device, devs);
    for (uint32_t i = 0; i < n; i++) {
        int64_t wait = vgl_throttle_admit(devs[i], now_ns, cost_ns);
        if (wait > 0) {
            while (i--)
                vgl_throttle_settle(devs[i], cost_ns, 0);
            return wait;
        }
    }
    return 0;
}

static void settle(int device, int64_t charged_ns, int64_t measured_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t n = budgets(device, devs);
    for (uint32_t i = 0; i < n; i++)
        vgl_throttle_settle(devs[i], charged_ns, measured_ns);
}

/* ---- per-process measurement state ------------------------------------------------------ */

struct flight {
    CUevent start, end;
    int64_t charged_ns;
    const void *key;
};

/* A context's launches that drew from the budget and are not yet read back. */
struct tracker {
    CUcontext ctx;
    uint32_t device;
    uint32_t head, count;
    struct flight ring[INFLIGHT];
    uint32_t nspare;
    CUevent spare[2 * INFLIGHT];    /* events read back, to record again */
};

static struct {
    pthread_mutex_t lock;           /* guards all of it */
    uint32_t ntrackers;
    struct tracker trackers[CONTEXTS];
    struct {
        const void *key;
        int64_t ns;
    } costs[COSTS];                 /* by launch target (function or graph), hashed */
} launches = {.lock = PTHREAD_MUTEX_INITIALIZER};

void vgl_launch_forget(void)
{
    pthread_mutex_init(&launches.lock, NULL);
    launches.ntrackers = 0;
    memset(launches.trackers, 0, sizeof launches.trackers);
    memset(launches.costs, 0, sizeof launches.costs);
}

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Under the lock: whether any device is limited, as of the region's generation now. */
static void refresh(void)
{
    if (!vgl_config.enabled || (!vgl_self.slot && !vgl_attach() && !vgl_self.region)) {
        /* Nothing to draw from (why was logged): launches go as they are. */
        __atomic_store_n(&unlimited_generation, without_budget, __ATOMIC_RELAXED);
        return;
    }
    struct vgl_region *region = vgl_self.region;
    uint64_t generation = __atomic_load_n(&region->generation, __ATOMIC_ACQUIRE);
    /* A nested run looks at every launch: its outer regions' limits change
     * with generations of their own. */
    bool limited = vgl_self.nouter > 0;
    for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++)
        limited = limited || vgl_throttle_share(&region->devices[i]);
    seen_generation = generation;
    __atomic_store_n(&unlimited_generation, limited ? 0 : generation, __ATOMIC_RELAXED);
    __atomic_store_n(&limits_generation, &region->generation, __ATOMIC_RELEASE);
}

/* Under the lock: the tracker of `ctx` (the current context, on `device`),
 * made on first use; NULL when there are too many. */
static struct tracker *tracker_for(CUcontext ctx, int device)
{
    for (uint32_t i = 0; i < launches.ntrackers; i++)
        if (launches.trackers[i].ctx == ctx)
            return &launches.trackers[i];
    if (launches.ntrackers == CONTEXTS) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "launches in context %p are not measured (more than %d "
                        "contexts); the compute share charges them what they are expected to take",
                        (void *)ctx, CONTEXTS);
        return NULL;
    }
    struct tracker *t = &launches.trackers[launches.ntrackers++];
    t->ctx = ctx;
    t->device = (uint32_t)device;
    return t;
}

/* Under the lock: the device of the current context, if the region accounts for it. */
static int launch_device(CUcontext *ctx)
{
    if (vgl_real.cuCtxGetCurrent(ctx) != CUDA_SUCCESS || !*ctx)
        return -1; /* the driver refuses the launch itself */
    for (uint32_t i = 0; i < launches.ntrackers; i++)
        if (launches.trackers[i].ctx == *ctx)
            return (int)launches.trackers[i].device;
    int device = vgl_current_device();
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region accounts "
                        "for; its launches are not limited", device, VGL_MAX_DEVICES);
        return -1;
    }
    return device;
}

static uint32_t cost_slot(const void *key)
{
    return (uint32_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ULL >> 56) % COSTS;
}

/* Under the lock: what a launch of `key` is expected to take. */
static int64_t expected_cost(const void *key)
{
    uint32_t slot = cost_slot(key);
    return launches.costs[slot].key == key ? launches.costs[slot].ns : FIRST_COST_NS;
}

/* Under the lock: a moving average, so one slow launch does not set the price. */
static void learn_cost(const void *key, int64_t measured_ns)
{
    uint32_t slot = cost_slot(key);
    if (launches.costs[slot].key != key) {
        launches.costs[slot].key = key;
        launches.costs[slot].ns = measured_ns;
    } else {
        launches.costs[slot].ns = (3 * launches.costs[slot].ns + measured_ns) / 4;
    }
}

static void drop_events(CUevent start, CUevent end)
{
    vgl_real.cuEventDestroy_v2(start);
    vgl_real.cuEventDestroy_v2(end);
}

static void spare(struct tracker *t, CUevent start, CUevent end)
{
    if (t->nspare + 2 <= 2 * INFLIGHT) {
        t->spare[t->nspare++] = start;
        t->spare[t->nspare++] = end;
    } else {
        drop_events(start, end);
    }
}

/* Under the lock: two events of `t`'s context (which is current). */
static bool take_events(struct tracker *t, CUevent *start, CUevent *end)
{
    if (t->nspare >= 2) {
        *end = t->spare[--t->nspare];
        *start = t->spare[--t->nspare];
        return true;
    }
    if (vgl_real.cuEventCreate(start, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return false;
    if (vgl_real.cuEventCreate(end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
        vgl_real.cuEventDestroy_v2(*start);
        return false;
    }
    return true;
}

/* Under the lock: settles the oldest launch, at `measured_ns`; its events are
 * kept for another launch if `reuse`. */
static void settle_oldest(struct tracker *t, int64_t measured_ns, bool reuse)
{
    struct flight *f = &t->ring[t->head];
    settle((int)t->device, f->charged_ns, measured_ns);
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    for (uint32_t i = 0, n = states((int)t->device, devs); i < n; i++)
        __atomic_add_fetch(&devs[i]->busy_ns, (uint64_t)measured_ns, __ATOMIC_RELAXED);
    if (reuse)
        spare(t, f->start, f->end);
    else
        drop_events(f->start, f->end);
    t->head = (t->head + 1) % INFLIGHT;
    t->count--;
}

/* Under the lock: reads back the launches that have finished, oldest first,
 * without waiting for any.  One whose events the driver no longer knows (its
 * context was destroyed) counts as charged. */
static void harvest(struct tracker *t)
{
    while (t->count) {
        struct flight *f = &t->ring[t->head];
        CUresult rc = vgl_real.cuEventQuery(f->end);
        if (rc == CUDA_ERROR_NOT_READY)
            return;
        float ms;
        if (rc != CUDA_SUCCESS || vgl_real.cuEventElapsedTime(&ms, f->start, f->end) != CUDA_SUCCESS) {
            settle_oldest(t, f->charged_ns, false);
            continue;
        }
        int64_t measured = ms > 0 ? (int64_t)((double)ms * 1e6) : 0;
        learn_cost(f->key, measured);
        settle_oldest(t, measured, true);
    }
}

/* ---- the gate around a launch ------------------------------------------------------- */

struct gate {
    int device;                     /* -1: the launch does not draw from the budget */
    struct tracker *tracker;        /* NULL: it drew, and is not measured */
    int64_t charged_ns;
    const void *key;
    CUstream stream;
    CUevent start, end;
};

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* Waits for budget for a launch of `key` on `stream`, then records the start
 * event.  A launch the driver will refuse anyway (no context), one on a
 * device with no share and one into a capturing stream (it runs when its
 * graph is launched) pass; one whose stream's capture state cannot be read
 * does not. */
static void gate_enter(struct gate *g, const void *key, CUstream stream)
{
    g->device = -1;
    g->tracker = NULL;
    pthread_mutex_lock(&launches.lock);
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    if (generation == &without_budget || __atomic_load_n(generation, __ATOMIC_ACQUIRE) != seen_generation)
        refresh();
    CUcontext ctx = NULL;
    int device = unlimited() ? -1 : launch_device(&ctx);
    struct vgl_device_state *limited[VGL_MAX_CHAIN];
    if (device < 0 || !budgets(device, limited)) {
        pthread_mutex_unlock(&launches.lock);
        return;
    }
    struct tracker *t = tracker_for(ctx, device);
    if (t)
        harvest(t);
    int64_t cost = expected_cost(key);
    pthread_mutex_unlock(&launches.lock);

    /* A launch whose capture state cannot be read is charged as an ordinary
     * one: what the shim cannot determine is never waved through. */
    CUstreamCaptureStatus capture;
    CUresult captured = vgl_real.cuStreamIsCapturing(stream, &capture);
    if (captured == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    if (captured != CUDA_SUCCESS) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "cuStreamIsCapturing failed (%d); the launch is charged as "
                        "an ordinary one", (int)captured);
    }
    uint64_t now = clock_ns();
    int64_t wait;
    while ((wait = admit(device, now, cost)) > 0) {
        sleep_ns(wait < MAX_SLEEP_NS ? wait : MAX_SLEEP_NS);
        uint64_t woke = clock_ns();
        struct vgl_device_state *devs[VGL_MAX_CHAIN];
        for (uint32_t i = 0, n = states(device, devs); i < n; i++)
            __atomic_add_fetch(&devs[i]->throttled_ns, woke - now, __ATOMIC_RELAXED);
        now = woke;
        pthread_mutex_lock(&launches.lock);
        if (t)
            harvest(t);
        pthread_mutex_unlock(&launches.lock);
    }
    g->device = device;
    g->charged_ns = cost;
    if (!t)
        return;
    pthread_mutex_lock(&launches.lock);
    bool have_events = take_events(t, &g->start, &g->end);
    pthread_mutex_unlock(&launches.lock);
    if (!have_events)
        return;
    if (vgl_real.cuEventRecord(g->start, stream) != CUDA_SUCCESS) {
        drop_events(g->start, g->end); /* stale (a destroyed context's) or unusable */
        return;
    }
    g->tracker = t;
    g->key = key;
    g->stream = stream;
}

/* After the driver call: a refused launch gives its charge back; one that
 * went is measured from here. */
static CUresult gate_leave(struct gate *g, CUresult rc)
{
    struct tracker *t = g->tracker;
    if (rc != CUDA_SUCCESS) {
        if (g->device >= 0)
            settle(g->device, g->charged_ns, 0);
        if (t) {
            pthread_mutex_lock(&launches.lock);
            spare(t, g->start, g->end);
            pthread_mutex_unlock(&launches.lock);
        }
        return rc;
    }
    if (!t)
        return rc;
    if (vgl_real.cuEventRecord(g->end, g->stream) != CUDA_SUCCESS) {
        drop_events(g->start, g->end);
        return rc;
    }
    pthread_mutex_lock(&launches.lock);
    if (t->count == INFLIGHT)
        settle_oldest(t, t->ring[t->head].charged_ns, true); /* never read back: as charged */
    t->ring[(t->head + t->count) % INFLIGHT] =
        (struct flight){.start = g->start, .end = g->end, .charged_ns = g->charged_ns, .key = g->key};
    t->count++;
    pthread_mutex_unlock(&launches.lock);
    return rc;
}

/* ---- the launch paths ------------------------------------------------------------------ */

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                       sharedMemBytes, hStream, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, hStream);
    return gate_leave(&g, vgl_real.cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                  blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                            sharedMemBytes, hStream, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                       blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, config->hStream);
    return gate_leave(&g, vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, config->hStream ? config->hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                  blockDimZ, sharedMemBytes, hStream, kernelParams);
    struct gate g;
    gate_enter(&g, f, hStream);
    return gate_leave(&g, vgl_real.cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX,
                                                             blockDimY, blockDimZ, sharedMemBytes, hStream,
                                                             kernelParams));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchCooperativeKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                       blockDimZ, sharedMemBytes, hStream, kernelParams);
    struct gate g;
    gate_enter(&g, f, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchCooperativeKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX,
                                                                  blockDimY, blockDimZ, sharedMemBytes, hStream,
                                                                  kernelParams));
}

/* vgl_graph_launch charges the graph's memory nodes (graph_memory_hooks.c). */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch);
    struct gate g;
    gate_enter(&g, hGraphExec, hStream);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz);
    struct gate g;
    gate_enter(&g, hGraphExec, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz));
}

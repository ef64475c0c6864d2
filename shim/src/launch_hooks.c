/* Kernel launches: every launch path (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz variants) draws
 * from the container's compute budget on its device (share.c).
 *
 * A launch is charged what its kernel (or graph) is known to cost
 * (busy_time.c, which measures through the driver's events handed to it
 * here, and hands back what its measurements settled, for the share), and
 * waits, asleep, while the container's budget is owing; then it sleeps on
 * until the budget holds a little, so that launches go in bursts.
 * Measurements read back while it sleeps may pay the debt sooner (launches
 * charged more than their kernels took): it looks again at each wake.  The
 * budget refills with the clock, never with the process's own
 * synchronisation, so a launch cannot wait on work that only its own thread
 * could let finish.
 *
 * A launch into a stream being captured is not charged: its graph is, when
 * launched.  The shim counts the captures the process has open and asks a
 * stream's capture state only while there are any; a launch whose capture
 * state cannot be read is charged as an ordinary one, never waved through.
 *
 * While no device of the container is limited (no share, or 100 %), a launch
 * costs one comparison: the region's generation (bumped by every change of
 * limits, `vgpulimit set`, and by a suspend and a resume) against the
 * generation at which nothing was. */
#include <pthread.h>
#include <time.h>

#include "internal.h"
#include "resume_ask.h"

/* cuda.h's per-thread default stream: what NULL means in a _ptsz entry point,
 * and what the shim's own calls must name there. */
#define STREAM_PER_THREAD ((CUstream)0x2)

/* Before the first launch, and where there is no region: generation 1. */
static uint64_t without_budget = 1;
static uint64_t *limits_generation = &without_budget;
/* The generation at which no device was limited; 0 (never a generation): some is. */
static uint64_t unlimited_generation;
static uint64_t seen_generation;
static pthread_mutex_t refresh_lock = PTHREAD_MUTEX_INITIALIZER;
/* Stream captures begun and not ended in this process. */
static int captures_open;

static void forget_in_child(void)
{
    pthread_mutex_init(&refresh_lock, NULL);
    captures_open = 0;
}
VGL_AFTER_FORK(forget_in_child)

static inline bool unlimited(void)
{
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    return __atomic_load_n(generation, __ATOMIC_RELAXED) ==
           __atomic_load_n(&unlimited_generation, __ATOMIC_RELAXED);
}

/* Whether any device is limited, as of the region's generation now. */
static void refresh(void)
{
    pthread_mutex_lock(&refresh_lock);
    if (!vgl_config.enabled || (!vgl_self.slot && !vgl_attach() && !vgl_self.region)) {
        /* Nothing to draw from (why was logged): launches go as they are. */
        __atomic_store_n(&unlimited_generation, without_budget, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&refresh_lock);
        return;
    }
    /* A limit by UUID reaches a device once it is bound to its UUID. */
    vgl_devices_note_all();
    struct vgl_region *region = vgl_self.region;
    uint64_t generation = __atomic_load_n(&region->generation, __ATOMIC_ACQUIRE);
    /* A nested run looks at every launch: its outer regions' limits change
     * with generations of their own. */
    bool limited = vgl_self.nouter > 0;
    for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++)
        limited = limited || vgl_throttle_share(&region->devices[i]);
    /* A container with a priority writes its beacon at every launch, and a
     * low one may have to wait: all its launches pass the gate. */
    limited = limited || vgl_priority_takes_part();
    /* A suspended container's launches ask to be resumed (gate_enter); a
     * setter's suspend and resume bump the generation. */
    limited = limited || __atomic_load_n(&region->suspend_state, __ATOMIC_RELAXED) != VGL_SUSPEND_RUNNING;
    __atomic_store_n(&seen_generation, generation, __ATOMIC_RELAXED);
    __atomic_store_n(&unlimited_generation, limited ? 0 : generation, __ATOMIC_RELAXED);
    __atomic_store_n(&limits_generation, &region->generation, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&refresh_lock);
}

/* The device of the current context (*ctx), if it holds a share; else -1. */
static int launch_device(CUcontext *ctx)
{
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    if (generation == &without_budget ||
        __atomic_load_n(generation, __ATOMIC_ACQUIRE) != __atomic_load_n(&seen_generation, __ATOMIC_RELAXED))
        refresh();
    if (unlimited() || vgl_current_context(ctx) != CUDA_SUCCESS || !*ctx)
        return -1; /* with no context, the driver refuses the launch itself */
    int device = vgl_busy_device(*ctx);
    if (device < 0)
        device = vgl_current_device();
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region accounts "
                        "for; its launches are not limited", device, VGL_MAX_DEVICES);
        return -1;
    }
    return device >= 0 && (vgl_share_limits(device) || vgl_priority_takes_part()) ? device : -1;
}

/* The driver's events, and the node's clock, as the measurement asks them. */
static CUresult event_create(CUevent *event)
{
    return vgl_real.cuEventCreate(event, CU_EVENT_DEFAULT);
}

static CUresult event_record(CUevent event, CUstream stream)
{
    return vgl_real.cuEventRecord(event, stream);
}

static CUresult event_query(CUevent event)
{
    return vgl_real.cuEventQuery(event);
}

static CUresult event_elapsed(float *ms, CUevent start, CUevent end)
{
    return vgl_real.cuEventElapsedTime(ms, start, end);
}

static CUresult event_destroy(CUevent event)
{
    return vgl_real.cuEventDestroy_v2(event);
}

static const struct vgl_events driver_events = {
    .create = event_create, .record = event_record, .query = event_query, .elapsed = event_elapsed,
    .destroy = event_destroy, .now_ns = vgl_node_clock_ns,
};

/* What the measurement settled is given to the share. */
static void settle(const struct vgl_settlements *settled)
{
    for (uint32_t i = 0; i < settled->n; i++)
        vgl_share_used(settled->at[i].device, settled->at[i].charged_ns, settled->at[i].used_ns);
}

/* While a launch waits: what is done is read back (vgl_busy_wait). */
static void measure_while_waiting(struct vgl_launch *l, uint64_t now, bool sleeps, bool quiet)
{
    struct vgl_settlements settled;
    vgl_busy_wait(l, now, sleeps, quiet, &settled);
    settle(&settled);
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* Holds a launch back while a container of a higher priority has work on
 * its device (priority.c), after the share admitted it: the time it waits is
 * counted apart (yielded_ns), not as throttled.  Returns the clock then. */
static uint64_t yield_to_higher(struct vgl_launch *l, int device, uint64_t now, bool quiet)
{
    int64_t wait = vgl_priority_admit(device, now, l->cost_ns, quiet);
    if (wait <= 0)
        return now;
    measure_while_waiting(l, now, true, quiet);
    while (wait > 0) {
        sleep_ns(wait);
        uint64_t woke = vgl_node_clock_ns();
        vgl_priority_yielded(device, woke - now);
        now = woke;
        measure_while_waiting(l, now, false, quiet);
        wait = vgl_priority_admit(device, now, l->cost_ns, quiet);
    }
    return now;
}

/* Waits for budget for a launch of `key` on `stream`.  A launch the driver
 * will refuse anyway (no context), one on a device with no share and one into
 * a capturing stream pass (device -1). */
static void gate_enter(struct vgl_launch *l, const void *key, CUstream stream)
{
    /* First: every driver call below blocks while the container is suspended. */
    bool asked = vgl_resume_ask();
    l->device = -1;
    l->asked = asked;
    CUcontext ctx = NULL;
    int device = launch_device(&ctx);
    if (device < 0)
        return;
    bool quiet = __atomic_load_n(&captures_open, __ATOMIC_RELAXED) > 0;
    if (quiet) {
        CUstreamCaptureStatus capture;
        CUresult captured = vgl_real.cuStreamIsCapturing(stream, &capture);
        if (captured == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE)
            return;
        if (captured != CUDA_SUCCESS) {
            static unsigned logged;
            vgl_log_bounded(VGL_LOG_WARN, &logged, "cuStreamIsCapturing failed (%d); the launch is charged "
                            "as an ordinary one", (int)captured);
        }
    }
    uint64_t now = vgl_node_clock_ns();
    struct vgl_settlements settled;
    vgl_busy_enter(l, &driver_events, ctx, device, key, stream, now, quiet, &settled);
    l->asked = asked; /* vgl_busy_enter makes the launch anew */
    settle(&settled);
    int64_t wait = vgl_share_admit(device, now, l->cost_ns);
    if (wait > 0) {
        uint64_t until = now + (uint64_t)wait + (uint64_t)vgl_share_resume_ns(device, l->cost_ns);
        VGL_LOG(VGL_LOG_DEBUG, "launch waits %.3f ms for budget (cost %.3f ms%s)", (until - now) / 1e6,
                l->cost_ns / 1e6, l->known ? "" : ", not measured yet");
        measure_while_waiting(l, now, true, quiet);
        for (;;) {
            uint64_t left = until > now ? until - now : 0;
            if (left)
                sleep_ns((int64_t)(left < vgl_timings.max_sleep_ns ? left : vgl_timings.max_sleep_ns));
            uint64_t woke = vgl_node_clock_ns();
            vgl_share_waited(device, woke - now);
            now = woke;
            measure_while_waiting(l, now, false, quiet);
            if (now < until) {
                /* Measurements read back meanwhile may have given back
                 * what launches were charged past their kernels' time (a
                 * kernel's first measurements, stretched by other
                 * processes'): the wait ends as soon as the debt is paid. */
                uint64_t sooner = now + (uint64_t)vgl_share_owed(device, now) +
                                  (uint64_t)vgl_share_resume_ns(device, l->cost_ns);
                until = sooner < until ? sooner : until;
                continue;
            }
            if ((wait = vgl_share_admit(device, now, l->cost_ns)) <= 0)
                break;
            until = now + (uint64_t)wait;
        }
    }
    if (vgl_priority_takes_part())
        now = yield_to_higher(l, device, now, quiet);
    vgl_busy_begin(l, now, quiet, &settled);
    settle(&settled);
}

static CUresult gate_leave(struct vgl_launch *l, CUresult rc)
{
    if (l->asked)
        vgl_resume_asked();
    if (l->device >= 0) {
        struct vgl_settlements settled;
        bool quiet = __atomic_load_n(&captures_open, __ATOMIC_RELAXED) > 0;
        vgl_busy_leave(l, rc == CUDA_SUCCESS, quiet, &settled);
        settle(&settled);
        if (vgl_priority_takes_part())
            vgl_priority_launched(l->device, l->stream, rc == CUDA_SUCCESS, quiet);
    }
    return rc;
}

/* A stream's measurement ends before the stream does. */
static void stream_ends(CUstream stream)
{
    if (!stream || stream == (CUstream)0x1 || stream == STREAM_PER_THREAD)
        return; /* the default streams (NULL, legacy 0x1, per-thread 0x2) are never destroyed */
    struct vgl_settlements settled;
    vgl_busy_stream_ends(stream, &settled);
    settle(&settled);
}

CUresult cuStreamDestroy(CUstream hStream)
{
    VGL_ASKS();
    stream_ends(hStream);
    return vgl_real.cuStreamDestroy(hStream);
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    VGL_ASKS();
    stream_ends(hStream);
    return vgl_real.cuStreamDestroy_v2(hStream);
}

/* A capture is counted before it begins, so that no launch measures into it,
 * and the current context's runs end first, their events recorded before it. */
static void capture_begins(void)
{
    __atomic_add_fetch(&captures_open, 1, __ATOMIC_RELAXED);
    CUcontext ctx;
    if (vgl_current_context(&ctx) == CUDA_SUCCESS && ctx) {
        struct vgl_settlements settled;
        vgl_busy_quiesce(ctx, &settled);
        settle(&settled);
    }
}

static CUresult capture_began(CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        __atomic_sub_fetch(&captures_open, 1, __ATOMIC_RELAXED);
    return rc;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCapture(hStream));
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCapture_ptsz(hStream));
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCapture_v2(hStream, mode));
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCapture_v2_ptsz(hStream, mode));
}

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                     CUstreamCaptureMode mode)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies, dependencyData,
                                                               numDependencies, mode));
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                          const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode)
{
    VGL_ASKS();
    capture_begins();
    return capture_began(vgl_real.cuStreamBeginCaptureToGraph_ptsz(hStream, hGraph, dependencies,
                                                                    dependencyData, numDependencies, mode));
}

/* A capture has ended when the driver says so, and also when it failed to
 * end one that is over (an invalidated capture ends with an error). */
static CUresult capture_ended(CUstream stream, CUresult rc)
{
    CUstreamCaptureStatus status;
    if (rc != CUDA_SUCCESS && (vgl_real.cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
                               status != CU_STREAM_CAPTURE_STATUS_NONE))
        return rc;
    if (__atomic_sub_fetch(&captures_open, 1, __ATOMIC_RELAXED) < 0)
        __atomic_store_n(&captures_open, 0, __ATOMIC_RELAXED); /* begun before the shim was there */
    return rc;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    VGL_ASKS();
    return capture_ended(hStream, vgl_real.cuStreamEndCapture(hStream, phGraph));
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    VGL_ASKS();
    return capture_ended(hStream ? hStream : STREAM_PER_THREAD, vgl_real.cuStreamEndCapture_ptsz(hStream, phGraph));
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                       sharedMemBytes, hStream, kernelParams, extra);
    struct vgl_launch g;
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
    struct vgl_launch g;
    gate_enter(&g, f, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                       blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra);
    struct vgl_launch g;
    gate_enter(&g, f, config->hStream);
    return gate_leave(&g, vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra);
    struct vgl_launch g;
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
    struct vgl_launch g;
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
    struct vgl_launch g;
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
    struct vgl_launch g;
    gate_enter(&g, hGraphExec, hStream);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz);
    struct vgl_launch g;
    gate_enter(&g, hGraphExec, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz));
}

/* simgpu's lanes: where a stream's work is remembered, and how work is queued
 * on the device timelines of timeline.c.
 *
 * A launch returns at once; its kernel is queued in its stream on its device's
 * timeline, which runs it as a GPU would (timeline.c), and the stream keeps
 * the ticket of its last item.  So a stream is done when that item is, and
 * synchronising sleeps until then.  A kernel of no duration is not queued:
 * nothing could tell it from the work around it.
 *
 * The default streams: the legacy one (NULL or CU_STREAM_LEGACY in a plain
 * entry point) is one per context; the per-thread one (CU_STREAM_PER_THREAD, or
 * NULL in a _ptsz entry point) one per thread and device.  (The legacy stream's
 * implicit synchronisation with other streams is not simulated.)
 *
 * This file owns the lanes and the tickets of their last work (a context's
 * too, which contexts.c waits on for cuCtxSynchronize); it calls contexts.c
 * for the current context, launch_queue.c and the timelines, and none of
 * them calls it. */
#include <errno.h>

#include "work.h"

/* The per-thread default stream's last work, per device. */
static _Thread_local uint64_t sim_per_thread_last[SIM_MAX_DEVICES];

void sim_atomic_max(uint64_t *p, uint64_t value)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < value && !__atomic_compare_exchange_n(p, &cur, value, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
}

bool sim_default_stream(CUstream s)
{
    return !s || s == SIM_STREAM_LEGACY || s == SIM_STREAM_PER_THREAD;
}

CUresult sim_lane_of(CUstream s, bool per_thread, struct sim_lane *lane)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!s)
        s = per_thread ? SIM_STREAM_PER_THREAD : SIM_STREAM_LEGACY;
    if (s == SIM_STREAM_LEGACY || s == SIM_STREAM_PER_THREAD) {
        CUresult res = sim_current_context(&lane->ctx);
        if (res != CUDA_SUCCESS)
            return res;
        bool legacy = s == SIM_STREAM_LEGACY;
        lane->last_work = legacy ? &lane->ctx->legacy_last_work : &sim_per_thread_last[lane->ctx->device];
        lane->stream = NULL;
        return CUDA_SUCCESS;
    }
    if (s->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&s->ctx->alive, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    lane->ctx = s->ctx;
    lane->last_work = &s->last_work;
    lane->stream = s;
    return CUDA_SUCCESS;
}

CUgraph sim_capturing(const struct sim_lane *lane)
{
    return lane->stream ? __atomic_load_n(&lane->stream->capture, __ATOMIC_ACQUIRE) : NULL;
}

static CUresult sim_submit(const struct sim_lane *lane, enum sim_engine engine, uint64_t duration_ns,
                           uint64_t after, uint64_t *ticket)
{
    uint32_t dev = lane->ctx->device;
    struct sim_work item = {.ctx = (uintptr_t)lane->ctx, .stream = (uintptr_t)lane->last_work,
                            .left_ns = duration_ns, .after = after, .engine = engine};
    uint64_t wake;
    int rc;
    while ((rc = sim_timeline_submit(dev, &item, ticket, &wake)) == -EAGAIN)
        sim_sleep_until(wake == UINT64_MAX ? sim_now_ns() + 1000000 : wake);
    if (rc)
        return CUDA_ERROR_OPERATING_SYSTEM; /* the state file's lock is unusable (logged) */
    sim_atomic_max(lane->last_work, *ticket);
    sim_atomic_max(&lane->ctx->last_work, *ticket);
    return CUDA_SUCCESS;
}

CUresult sim_run_on(const struct sim_lane *lane, enum sim_engine engine, uint64_t duration_ns)
{
    if (!duration_ns)
        return CUDA_SUCCESS;
    uint32_t dev = lane->ctx->device;
    sim_queue_wait(dev);
    uint64_t ticket;
    CUresult res = sim_submit(lane, engine, duration_ns, 0, &ticket);
    if (res == CUDA_SUCCESS)
        sim_queue_push(dev, ticket);
    return res;
}

CUresult sim_run(const struct sim_lane *lane, uint64_t duration_ns)
{
    return sim_run_on(lane, SIM_ENGINE_SM, duration_ns);
}

CUresult sim_mark(const struct sim_lane *lane, uint64_t after, uint64_t *ticket)
{
    return sim_submit(lane, SIM_ENGINE_SM, 0, after, ticket);
}

CUresult sim_wait_lane(const struct sim_lane *lane)
{
    if (sim_capturing(lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    uint64_t last = __atomic_load_n(lane->last_work, __ATOMIC_ACQUIRE), at;
    if (last && sim_timeline_wait(lane->ctx->device, last, 0, &at) < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    return CUDA_SUCCESS;
}

bool sim_lane_idle(const struct sim_lane *lane)
{
    uint64_t last = __atomic_load_n(lane->last_work, __ATOMIC_ACQUIRE), at, wake;
    return !last || sim_timeline_done(lane->ctx->device, last, 0, &at, &wake) != 0;
}

/* simgpu's lanes: where a stream's work is remembered, and how work is queued
 * on the device timelines of timeline.c.
 *
 * A launch returns at once; its kernel is queued on its device after all the
 * work that every process queued there before (timeline.c), and its stream
 * remembers when it ends.  So a stream is done when the clock passes its last
 * end, and synchronising sleeps until then.
 *
 * The default streams: the legacy one (NULL or CU_STREAM_LEGACY in a plain
 * entry point) is one per context; the per-thread one (CU_STREAM_PER_THREAD, or
 * NULL in a _ptsz entry point) one per thread and device. */
#include <errno.h>

#include "work.h"

/* The per-thread default stream's last end and link, per device. */
static _Thread_local uint64_t sim_per_thread_tail[SIM_MAX_DEVICES];
static _Thread_local struct sim_link sim_per_thread_link[SIM_MAX_DEVICES];

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
        lane->tail_ns = legacy ? &lane->ctx->legacy_tail_ns : &sim_per_thread_tail[lane->ctx->device];
        lane->link = legacy ? &lane->ctx->legacy_link : &sim_per_thread_link[lane->ctx->device];
        lane->stream = NULL;
        return CUDA_SUCCESS;
    }
    if (s->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&s->ctx->alive, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    lane->ctx = s->ctx;
    lane->tail_ns = &s->tail_ns;
    lane->link = &s->link;
    lane->stream = s;
    return CUDA_SUCCESS;
}

CUgraph sim_capturing(const struct sim_lane *lane)
{
    return lane->stream ? __atomic_load_n(&lane->stream->capture, __ATOMIC_ACQUIRE) : NULL;
}

/* The lane's next work starts at `start_ns`: an event recorded just before it
 * that has not completed yet completes then. */
CUresult sim_run(const struct sim_lane *lane, uint64_t duration_ns)
{
    uint32_t dev = lane->ctx->device;
    uint64_t end;
    if (!duration_ns) {
        end = sim_timeline_reached(dev);
    } else {
        sim_queue_wait(dev);
        int rc;
        while ((rc = sim_timeline_enqueue(dev, duration_ns, &end)) == -EAGAIN)
            sim_sleep_until(end);
        if (rc)
            return CUDA_ERROR_OPERATING_SYSTEM; /* the state file's lock is unusable (logged) */
        sim_queue_push(dev, end);
    }
    sim_event_follow(lane, sim_now_ns(), end - duration_ns);
    sim_atomic_max(lane->tail_ns, end);
    sim_atomic_max(&lane->ctx->tail_ns, end);
    return CUDA_SUCCESS;
}

CUresult sim_wait_lane(const struct sim_lane *lane)
{
    if (sim_capturing(lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_sleep_until(__atomic_load_n(lane->tail_ns, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

CUresult sim_context_synchronize(CUcontext ctx)
{
    sim_sleep_until(__atomic_load_n(&ctx->tail_ns, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

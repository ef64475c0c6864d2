/* simgpu's events.  An event recorded in a busy stream completes with the
 * stream's work before it; in an idle one, when the device reaches it.  Either
 * way, if the stream's next kernel is queued before the event has completed,
 * the event completes as that kernel starts. */
#include <pthread.h>
#include <stdlib.h>

#include "work.h"

enum { SIM_EVENT_FLAGS = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS };

static struct {
    pthread_mutex_t mutex;          /* guards the free list, serials and links */
    struct CUevent_st *free;
} sim_events = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static void sim_events_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_events.mutex);
}

static void sim_events_atfork_done(void)
{
    pthread_mutex_unlock(&sim_events.mutex);
}

__attribute__((constructor)) static void sim_events_load(void)
{
    pthread_atfork(sim_events_atfork_prepare, sim_events_atfork_done, sim_events_atfork_done);
}

bool sim_event_valid(CUevent e)
{
    return e && e->magic == SIM_EVENT_MAGIC;
}

void sim_event_follow(const struct sim_lane *lane, uint64_t now_ns, uint64_t start_ns)
{
    pthread_mutex_lock(&sim_events.mutex);
    struct CUevent_st *e = lane->link->event;
    if (e && e->magic == SIM_EVENT_MAGIC && e->serial == lane->link->serial &&
        __atomic_load_n(&e->state, __ATOMIC_ACQUIRE) == SIM_EVENT_RECORDED) {
        uint64_t at = __atomic_load_n(&e->at_ns, __ATOMIC_ACQUIRE);
        if (at > now_ns && start_ns > at)
            __atomic_store_n(&e->at_ns, start_ns, __ATOMIC_RELEASE);
    }
    lane->link->event = NULL;
    pthread_mutex_unlock(&sim_events.mutex);
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phEvent || (Flags & ~(unsigned int)SIM_EVENT_FLAGS) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_events.mutex);
    CUevent e = sim_events.free;
    if (e)
        sim_events.free = e->next_free;
    pthread_mutex_unlock(&sim_events.mutex);
    if (!e && !(e = calloc(1, sizeof *e)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = ctx;
    e->flags = Flags;
    e->state = SIM_EVENT_NEW;
    e->at_ns = 0;
    __atomic_store_n(&e->magic, SIM_EVENT_MAGIC, __ATOMIC_RELEASE);
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&sim_events.mutex);
    CUresult res = CUDA_ERROR_INVALID_HANDLE;
    if (sim_event_valid(hEvent)) {
        hEvent->magic = 0;
        hEvent->next_free = sim_events.free;
        sim_events.free = hEvent;
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_events.mutex);
    return res;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    SIM_CALLED();
    return cuEventDestroy_v2(hEvent);
}

/* In a busy stream, the event completes with the stream's work before it; in
 * an idle one, when the device reaches it, after all that is queued there;
 * and, until then, it waits for the stream's next kernel (sim_link_follow). */
static CUresult sim_event_record(CUevent e, CUstream s, unsigned int flags, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned int)SIM_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_capturing(&lane)) {
        __atomic_store_n(&e->state, SIM_EVENT_CAPTURED, __ATOMIC_RELEASE);
        return CUDA_SUCCESS;
    }
    uint64_t tail = __atomic_load_n(lane.tail_ns, __ATOMIC_ACQUIRE);
    uint64_t at = tail > sim_now_ns() ? tail : sim_timeline_reached(lane.ctx->device);
    pthread_mutex_lock(&sim_events.mutex);
    __atomic_store_n(&e->at_ns, at, __ATOMIC_RELEASE);
    __atomic_store_n(&e->state, SIM_EVENT_RECORDED, __ATOMIC_RELEASE);
    lane.link->event = e;
    lane.link->serial = ++e->serial;
    pthread_mutex_unlock(&sim_events.mutex);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    SIM_CALLED();
    return sim_event_record(hEvent, hStream, 0, false);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    SIM_CALLED();
    return sim_event_record(hEvent, hStream, 0, true);
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    SIM_CALLED();
    return sim_event_record(hEvent, hStream, flags, false);
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    SIM_CALLED();
    return sim_event_record(hEvent, hStream, flags, true);
}

/* CUDA_SUCCESS with *at_ns when the event is recorded; a never-recorded event
 * is complete (at_ns 0). */
static CUresult sim_event_time(CUevent e, uint64_t *at_ns)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    uint32_t state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
    if (state == SIM_EVENT_CAPTURED)
        return CUDA_ERROR_CAPTURED_EVENT;
    *at_ns = state == SIM_EVENT_RECORDED ? __atomic_load_n(&e->at_ns, __ATOMIC_RELAXED) : 0;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
    SIM_CALLED();
    uint64_t at;
    CUresult res = sim_event_time(hEvent, &at);
    if (res != CUDA_SUCCESS)
        return res;
    return sim_now_ns() >= at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    SIM_CALLED();
    uint64_t at;
    CUresult res = sim_event_time(hEvent, &at);
    if (res == CUDA_SUCCESS)
        sim_sleep_until(at);
    return res;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    SIM_CALLED();
    uint64_t start, end;
    CUresult res = sim_event_time(hStart, &start);
    if (res == CUDA_SUCCESS)
        res = sim_event_time(hEnd, &end);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!start || !end || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (now < start || now < end)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((int64_t)(end - start)) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    SIM_CALLED();
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

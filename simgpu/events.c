/* simgpu's events.  Recording one queues a marker in its stream on the
 * device's timeline: it completes when the stream's earlier work has, in its
 * context's time slice (timeline.c), and its time is when it did.
 *
 * An interprocess event (CU_EVENT_INTERPROCESS, shared by cuIpcGetEventHandle
 * and cuIpcOpenEventHandle, as PyTorch shares a CUDA tensor's event with the
 * process it sends the tensor to) keeps its last record in the state file
 * (shared.c), where every process that has it writes and reads it; the
 * timeline is machine-wide, so any of them can tell when it completes. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "work.h"

enum { SIM_EVENT_FLAGS = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS };

static struct {
    pthread_mutex_t mutex;          /* guards the free list */
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

void sim_event_refresh(CUevent e)
{
    uint32_t state, device;
    uint64_t ticket;
    if (!e->ipc_id || sim_ipc_event_get(e->ipc_id, &state, &device, &ticket) != 0)
        return;
    if (__atomic_load_n(&e->ticket, __ATOMIC_ACQUIRE) != ticket) {
        e->device = device;
        __atomic_store_n(&e->at_ns, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&e->ticket, ticket, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&e->state, state, __ATOMIC_RELEASE);
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
    e->device = ctx->device;
    e->ticket = 0;
    e->at_ns = 0;
    e->ipc_id = 0;
    e->ipc_owner = false;
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
        if (hEvent->ipc_owner)
            sim_ipc_event_free(hEvent->ipc_id);
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
    uint64_t ticket;
    res = sim_mark(&lane, 0, &ticket);
    if (res != CUDA_SUCCESS)
        return res;
    e->device = lane.ctx->device;
    __atomic_store_n(&e->at_ns, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->ticket, ticket, __ATOMIC_RELEASE);
    __atomic_store_n(&e->state, SIM_EVENT_RECORDED, __ATOMIC_RELEASE);
    if (e->ipc_id)
        sim_ipc_event_set(e->ipc_id, SIM_EVENT_RECORDED, e->device, ticket);
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

/* CUDA_SUCCESS with *done: whether the event has completed, and *at_ns when
 * (0: never recorded, or a time no longer kept).  `wait`: sleeps until it has. */
static CUresult sim_event_status(CUevent e, bool wait, bool *done, uint64_t *at_ns)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    sim_event_refresh(e);
    uint32_t state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
    if (state == SIM_EVENT_CAPTURED)
        return CUDA_ERROR_CAPTURED_EVENT;
    *done = true;
    *at_ns = 0;
    if (state != SIM_EVENT_RECORDED)
        return CUDA_SUCCESS;
    uint64_t ticket = __atomic_load_n(&e->ticket, __ATOMIC_ACQUIRE);
    *at_ns = __atomic_load_n(&e->at_ns, __ATOMIC_ACQUIRE);
    if (*at_ns)
        return CUDA_SUCCESS;
    uint64_t wake;
    int rc = wait ? sim_timeline_wait(e->device, ticket, 0, at_ns)
                  : sim_timeline_done(e->device, ticket, 0, at_ns, &wake);
    if (rc < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    *done = wait || rc == 1;
    /* Kept here, as the device may give its slot to later work. */
    if (*done && *at_ns && __atomic_load_n(&e->ticket, __ATOMIC_ACQUIRE) == ticket)
        __atomic_store_n(&e->at_ns, *at_ns, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
    SIM_CALLED();
    bool done;
    uint64_t at;
    CUresult res = sim_event_status(hEvent, false, &done, &at);
    if (res != CUDA_SUCCESS)
        return res;
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    SIM_CALLED();
    bool done;
    uint64_t at;
    return sim_event_status(hEvent, true, &done, &at);
}

/* An event whose time is no longer kept (more than SIM_TIMELINE_SLOTS items
 * were queued on its device after it before anyone asked) has none to give. */
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    SIM_CALLED();
    uint64_t start, end;
    bool start_done, end_done;
    CUresult res = sim_event_status(hStart, false, &start_done, &start);
    if (res == CUDA_SUCCESS)
        res = sim_event_status(hEnd, false, &end_done, &end);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_load_n(&hStart->state, __ATOMIC_ACQUIRE) != SIM_EVENT_RECORDED ||
        __atomic_load_n(&hEnd->state, __ATOMIC_ACQUIRE) != SIM_EVENT_RECORDED ||
        ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!start_done || !end_done)
        return CUDA_ERROR_NOT_READY;
    if (!start || !end)
        return CUDA_ERROR_UNKNOWN;
    *pMilliseconds = (float)((double)((int64_t)(end - start)) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    SIM_CALLED();
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

/* What a CUipcEventHandle holds here. */
struct sim_ipc_event_handle {
    char magic[8];                  /* SIM_IPC_EVENT_MAGIC */
    uint64_t id;
};
_Static_assert(sizeof(struct sim_ipc_event_handle) <= sizeof(CUipcEventHandle), "an IPC handle has 64 bytes");

#define SIM_IPC_EVENT_MAGIC "simgpuE"

/* Only an event made with CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING
 * (cuda.h; cuEventCreate refuses the one without the other). */
CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pHandle || !sim_event_valid(event) || !(event->flags & CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_events.mutex);
    if (!event->ipc_id && (event->ipc_id = sim_ipc_event_new()) != 0) {
        event->ipc_owner = true;
        sim_ipc_event_set(event->ipc_id, __atomic_load_n(&event->state, __ATOMIC_ACQUIRE), event->device,
                          __atomic_load_n(&event->ticket, __ATOMIC_ACQUIRE));
    }
    uint64_t id = event->ipc_id;
    pthread_mutex_unlock(&sim_events.mutex);
    if (!id)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ipc_event_handle h = {.magic = SIM_IPC_EVENT_MAGIC, .id = id};
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle, &h, sizeof h);
    return CUDA_SUCCESS;
}

/* A new event of the current context that is the exported one: recorded
 * in either process, it is recorded in both (cuda.h: freed with
 * cuEventDestroy; "performing operations on the imported event after the
 * exported event has been freed" is undefined: here the event reads as
 * never recorded). */
CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    SIM_CALLED();
    struct sim_ipc_event_handle h;
    memcpy(&h, &handle, sizeof h);
    uint32_t state, device;
    uint64_t ticket;
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    CUevent e;
    CUresult res = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
    if (res != CUDA_SUCCESS)
        return res;
    if (memcmp(h.magic, SIM_IPC_EVENT_MAGIC, sizeof h.magic) != 0 ||
        sim_ipc_event_get(h.id, &state, &device, &ticket) != 0) {
        cuEventDestroy_v2(e);
        return CUDA_ERROR_INVALID_VALUE;
    }
    e->ipc_id = h.id;
    sim_event_refresh(e);
    *phEvent = e;
    return CUDA_SUCCESS;
}

/* simgpu's streams: creation, synchronisation, queries and waits on events.
 * Their work is kept in lanes (lanes.c). */
#include <stdlib.h>

#include "work.h"

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phStream || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = SIM_STREAM_MAGIC;
    s->ctx = ctx;
    s->flags = flags;
    s->priority = priority;
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    SIM_CALLED();
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

/* Its queued work still runs, as on the driver. */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_default_stream(hStream) || hStream->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    CUgraph capture = __atomic_exchange_n(&hStream->capture, NULL, __ATOMIC_ACQ_REL);
    if (capture)
        cuGraphDestroy(capture);
    hStream->magic = 0;
    free(hStream);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    SIM_CALLED();
    return cuStreamDestroy_v2(hStream);
}

static CUresult sim_stream_synchronize(CUstream s, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    return res == CUDA_SUCCESS ? sim_wait_lane(&lane) : res;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    SIM_CALLED();
    return sim_stream_synchronize(hStream, false);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    SIM_CALLED();
    return sim_stream_synchronize(hStream, true);
}

static CUresult sim_stream_query(CUstream s, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (sim_capturing(&lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sim_lane_idle(&lane) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery(CUstream hStream)
{
    SIM_CALLED();
    return sim_stream_query(hStream, false);
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    SIM_CALLED();
    return sim_stream_query(hStream, true);
}

/* Work queued in the stream after the wait starts once the event has completed:
 * a marker that waits for the event's. */
static CUresult sim_stream_wait_event(CUstream s, CUevent e, unsigned int flags, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned int)SIM_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    sim_event_refresh(e);
    if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) != SIM_EVENT_RECORDED || sim_capturing(&lane) ||
        e->device != lane.ctx->device || __atomic_load_n(&e->at_ns, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS; /* nothing to wait for (another device's event: not simulated) */
    uint64_t ticket;
    return sim_mark(&lane, __atomic_load_n(&e->ticket, __ATOMIC_ACQUIRE), &ticket);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    SIM_CALLED();
    return sim_stream_wait_event(hStream, hEvent, Flags, false);
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    SIM_CALLED();
    return sim_stream_wait_event(hStream, hEvent, Flags, true);
}


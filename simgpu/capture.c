/* simgpu's stream capture: work queued in a capturing stream is added to its
 * graph instead of run.  Only explicit streams are captured here. */
#include "work.h"

static CUresult sim_begin_capture(CUstream s, CUstreamCaptureMode mode, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!lane.stream)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g;
    res = cuGraphCreate(&g, 0);
    if (res != CUDA_SUCCESS)
        return res;
    CUgraph none = NULL;
    if (!__atomic_compare_exchange_n(&lane.stream->capture, &none, g, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        cuGraphDestroy(g);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    SIM_CALLED();
    return sim_begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    SIM_CALLED();
    return sim_begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    SIM_CALLED();
    return sim_begin_capture(hStream, mode, false);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    SIM_CALLED();
    return sim_begin_capture(hStream, mode, true);
}

static CUresult sim_end_capture(CUstream s, CUgraph *phGraph, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = lane.stream ? __atomic_exchange_n(&lane.stream->capture, NULL, __ATOMIC_ACQ_REL) : NULL;
    if (!g)
        return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    SIM_CALLED();
    return sim_end_capture(hStream, phGraph, false);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    SIM_CALLED();
    return sim_end_capture(hStream, phGraph, true);
}

static CUresult sim_is_capturing(CUstream s, CUstreamCaptureStatus *status, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = sim_capturing(&lane) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    SIM_CALLED();
    if (sim_failing(__func__))
        return CUDA_ERROR_UNKNOWN;
    return sim_is_capturing(hStream, captureStatus, false);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    SIM_CALLED();
    if (sim_failing(__func__))
        return CUDA_ERROR_UNKNOWN;
    return sim_is_capturing(hStream, captureStatus, true);
}


/* simgpu's error names and strings, as the driver words them. */
#include <stddef.h>

#include "driver.h"

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    SIM_CALLED();
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
#define SIM_ERROR_NAME(name, value) \
    case name:                      \
        *pStr = #name;              \
        return CUDA_SUCCESS;
        VGL_CU_RESULTS(SIM_ERROR_NAME)
#undef SIM_ERROR_NAME
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

static const char *sim_error_text(CUresult error)
{
    switch (error) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_DEINITIALIZED: return "driver shutting down";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA driver is a stub library";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "no kernel image is available for execution on the device";
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return "peer access is not supported between these two devices";
    case CUDA_ERROR_INVALID_PTX: return "a PTX JIT compilation failed";
    case CUDA_ERROR_INVALID_SOURCE: return "device kernel image is invalid";
    case CUDA_ERROR_FILE_NOT_FOUND: return "file not found";
    case CUDA_ERROR_OPERATING_SYSTEM: return "OS call failed or operation not supported on this OS";
    case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
    case CUDA_ERROR_ILLEGAL_STATE: return "the operation cannot be performed in the present state";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_NOT_READY: return "device not ready";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "too many resources requested for launch";
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "peer access is already enabled";
    case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: return "peer access has not been enabled";
    case CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: return "primary context active";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return "context is destroyed";
    case CUDA_ERROR_TOO_MANY_PEERS: return "peer mapping resources exhausted";
    case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        return "part or all of the requested memory range is already mapped";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: return "too many blocks in cooperative launch";
    case CUDA_ERROR_NOT_PERMITTED: return "operation not permitted";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "operation not permitted when stream is capturing";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return "operation failed due to a previous error during capture";
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return "capture was not initiated in this stream";
    case CUDA_ERROR_CAPTURED_EVENT: return "operation not permitted on an event last recorded in a capturing stream";
    case CUDA_ERROR_UNKNOWN: return "unknown error";
    }
    return NULL;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    SIM_CALLED();
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = sim_error_text(error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

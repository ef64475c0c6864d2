"""A cuda-bindings client of simulated time: kernels that take time, launches
that return at once, streams, events, synchronisation, graphs, libraries, the
bounded launch queue.  Prints what it measured as JSON (seconds, milliseconds
from events, CUresult names).

    python timeline.py"""

import json
import time

from cuda.bindings import driver as cu


def ok(what, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"timeline: {what}: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def name(result) -> str:
    return (result[0] if isinstance(result, tuple) else result).name


def launch(fn, stream, count=1):
    for _ in range(count):
        ok("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))


def seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


report = {}
ok("cuInit", cu.cuInit(0))
ctx = ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ok("cuDeviceGet", cu.cuDeviceGet(0))))
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
long_kernel = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us_200000"))
short_kernel = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us20000"))
default_kernel = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"_Z6kernelPf"))
stream = ok("cuStreamCreate", cu.cuStreamCreate(0))
start, end = (ok("cuEventCreate", cu.cuEventCreate(0)) for _ in range(2))

# A launch returns at once; its stream is busy until the kernel's time has passed.
report["launch_s"] = seconds(lambda: launch(long_kernel, stream))
report["query_busy"] = name(cu.cuStreamQuery(stream))
report["sync_s"] = seconds(lambda: ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream)))
report["query_idle"] = name(cu.cuStreamQuery(stream))

# Events around two kernels time them; an event is not ready before its work.
ok("cuEventRecord", cu.cuEventRecord(start, stream))
launch(short_kernel, stream, 2)
ok("cuEventRecord", cu.cuEventRecord(end, stream))
report["event_query_busy"] = name(cu.cuEventQuery(end))
report["elapsed_not_ready"] = name(cu.cuEventElapsedTime(start, end))
ok("cuEventSynchronize", cu.cuEventSynchronize(end))
report["event_query_done"] = name(cu.cuEventQuery(end))
report["elapsed_ms"] = ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))

# Kernels with no duration in their name run SIMGPU_KERNEL_US.
ok("cuEventRecord", cu.cuEventRecord(start, stream))
launch(default_kernel, stream, 10)
ok("cuEventRecord", cu.cuEventRecord(end, stream))
ok("cuCtxSynchronize", cu.cuCtxSynchronize())
report["default_kernels_ms"] = ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))

# The legacy default stream, and cuCtxSynchronize waiting for it.
launch(short_kernel, cu.CUstream(0), 3)
report["ctx_sync_s"] = seconds(lambda: ok("cuCtxSynchronize", cu.cuCtxSynchronize()))

# A graph captured from a stream, and one built node by node, run their kernels.
ok("cuStreamBeginCapture", cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
report["capturing"] = ok("cuStreamIsCapturing", cu.cuStreamIsCapturing(stream)).name
launch(short_kernel, stream, 3)
report["sync_while_capturing"] = name(cu.cuStreamSynchronize(stream))
captured = ok("cuStreamEndCapture", cu.cuStreamEndCapture(stream))
params = cu.CUDA_KERNEL_NODE_PARAMS()
params.func = short_kernel
params.gridDimX = params.gridDimY = params.gridDimZ = 1
params.blockDimX, params.blockDimY, params.blockDimZ = 32, 1, 1
built = ok("cuGraphCreate", cu.cuGraphCreate(0))
first = ok("cuGraphAddKernelNode", cu.cuGraphAddKernelNode(built, None, 0, params))
ok("cuGraphAddKernelNode", cu.cuGraphAddKernelNode(built, [first], 1, params))
for key, graph in (("captured_graph_ms", captured), ("built_graph_ms", built)):
    exe = ok("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
    ok("cuEventRecord", cu.cuEventRecord(start, stream))
    ok("cuGraphLaunch", cu.cuGraphLaunch(exe, stream))
    ok("cuEventRecord", cu.cuEventRecord(end, stream))
    ok("cuEventSynchronize", cu.cuEventSynchronize(end))
    report[key] = ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))
    ok("cuGraphExecDestroy", cu.cuGraphExecDestroy(exe))
    ok("cuGraphDestroy", cu.cuGraphDestroy(graph))

# Context-independent loading, as numba-cuda does it, and cuLaunchKernelEx.
library = ok("cuLibraryLoadData", cu.cuLibraryLoadData(b"any image", None, None, 0, None, None, 0))
kernel = ok("cuLibraryGetKernel", cu.cuLibraryGetKernel(library, b"spin_us20000"))
fn = ok("cuKernelGetFunction", cu.cuKernelGetFunction(kernel))
report["num_regs"] = ok("cuFuncGetAttribute", cu.cuFuncGetAttribute(
    cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
report["kernel_max_threads"] = ok("cuKernelGetAttribute", cu.cuKernelGetAttribute(
    cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, 0))
config = cu.CUlaunchConfig()
config.gridDimX = config.gridDimY = config.gridDimZ = 1
config.blockDimX, config.blockDimY, config.blockDimZ = 32, 1, 1
config.hStream = stream
config.numAttrs = 0
ok("cuEventRecord", cu.cuEventRecord(start, stream))
ok("cuLaunchKernelEx", cu.cuLaunchKernelEx(config, fn, None, 0))
ok("cuEventRecord", cu.cuEventRecord(end, stream))
ok("cuEventSynchronize", cu.cuEventSynchronize(end))
report["launch_ex_ms"] = ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))
ok("cuLibraryUnload", cu.cuLibraryUnload(library))

# The launch queue holds 1024 launches; the next ones wait for the oldest to end.
tiny = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us1000"))
report["queue_1000_s"] = seconds(lambda: launch(tiny, stream, 1000))
report["queue_1200_more_s"] = seconds(lambda: launch(tiny, stream, 200))
ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
print(json.dumps(report))

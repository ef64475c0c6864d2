"""A cuda-bindings client of copies on the simulated GPU's copy engines.
Prints as JSON what events and the host's clock measured (milliseconds from
events, seconds from perf_counter, CUresult names).  Run it with
SIMGPU_COPY_GBPS=1 and SIMGPU_DEVICE_COPY_GBPS=10, so that a copy of 4 MiB
takes 4.194 ms over the link, 0.419 ms within the device.

    python copies.py engines       the engines: directions, order, kernels beside
    python copies.py loop SECONDS  copies only, back and forth, for SECONDS
    python copies.py between SECONDS  1 ms kernels, each followed by a copy, on one stream"""

import json
import sys
import time

from cuda.bindings import driver as cu

MiB = 1 << 20
SIZE = 4 * MiB


def ok(what, result):
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"copies: {what}: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def name(result) -> str:
    return (result[0] if isinstance(result, tuple) else result).name


ok("cuInit", cu.cuInit(0))
ctx = ok("retain", cu.cuDevicePrimaryCtxRetain(ok("cuDeviceGet", cu.cuDeviceGet(0))))
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
streams = [ok("cuStreamCreate", cu.cuStreamCreate(0)) for _ in range(3)]
device = [ok("cuMemAlloc", cu.cuMemAlloc(SIZE)) for _ in range(2)]
pinned = [ok("cuMemHostAlloc", cu.cuMemHostAlloc(SIZE, 0)) for _ in range(2)]
pageable = bytearray(SIZE)


def event():
    return ok("cuEventCreate", cu.cuEventCreate(0))


def record(stream):
    e = event()
    ok("cuEventRecord", cu.cuEventRecord(e, stream))
    return e


def elapsed(start, end) -> float:
    return round(ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end)), 3)


def seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def h2d(stream, i=0):
    ok("HtoD", cu.cuMemcpyHtoDAsync(device[i], pinned[i], SIZE, stream))


def d2h(stream, i=1):
    ok("DtoH", cu.cuMemcpyDtoHAsync(pinned[i], device[i], SIZE, stream))


def kernel(stream):
    module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
    work = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"work_us_20000"))
    ok("launch", cu.cuLaunchKernel(work, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))


def gate():
    """An event on streams[0] that 200 ms of kernel hold back."""
    module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
    gate_kernel = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"gate_us_200000"))
    ok("launch", cu.cuLaunchKernel(gate_kernel, 1, 1, 1, 32, 1, 1, 0, streams[0], 0, 0))
    return record(streams[0])


def gated(first, second):
    """`first` on one stream and `second` on another, both held behind a
    200 ms kernel until the same instant: ms from then to each one's end."""
    gate_event = gate()
    ends = []
    for stream, copy in zip(streams[1:], (first, second)):
        ok("cuStreamWaitEvent", cu.cuStreamWaitEvent(stream, gate_event, 0))
        copy(stream)
        ends.append(record(stream))
    ok("cuCtxSynchronize", cu.cuCtxSynchronize())
    return [elapsed(gate_event, end) for end in ends]


def engines():
    report = {}
    # Each direction has an engine: they overlap.  One direction: in turn.
    report["h2d_beside_d2h_ms"] = gated(h2d, d2h)
    report["h2d_after_h2d_ms"] = gated(h2d, lambda s: h2d(s, 1))
    # A copy between two kernels on one stream: its time is on the stream.
    report["kernel_copy_kernel_ms"] = gated(lambda s: (kernel(s), h2d(s), kernel(s)), lambda s: None)[0]
    # A copy on one stream runs beside a kernel on another.
    report["kernel_beside_copy_ms"] = gated(kernel, d2h)
    # An asynchronous copy returns at once; its stream is busy until it ends
    # (held behind a 200 ms kernel, so that a slow machine asks in time).
    ok("cuStreamWaitEvent", cu.cuStreamWaitEvent(streams[1], gate(), 0))
    h2d(streams[1])
    report["query_busy"] = name(cu.cuStreamQuery(streams[1]))
    ok("sync", cu.cuStreamSynchronize(streams[1]))
    report["query_idle"] = name(cu.cuStreamQuery(streams[1]))
    # To pageable memory, an asynchronous copy returns when it is done.
    report["async_to_pageable_s"] = seconds(
        lambda: ok("DtoH", cu.cuMemcpyDtoHAsync(pageable, device[0], SIZE, streams[1])))
    report["query_after_pageable"] = name(cu.cuStreamQuery(streams[1]))
    # A synchronous copy returns when it is done.
    report["sync_s"] = seconds(lambda: ok("HtoD", cu.cuMemcpyHtoD(device[0], pageable, SIZE)))
    # Memsets and copies within the device: the third engine, at device speed.
    report["memset_then_d2d_ms"] = gated(
        lambda s: (ok("memset", cu.cuMemsetD32Async(device[0], 7, SIZE // 4, s)),
                   ok("DtoD", cu.cuMemcpyDtoDAsync(device[1], device[0], SIZE, s))),
        lambda s: None)[0]
    # Copies into a stream being captured: simgpu's graphs hold kernels only.
    ok("capture", cu.cuStreamBeginCapture(streams[2], cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    report["captured_copy"] = name(cu.cuMemcpyHtoDAsync(device[0], pinned[0], SIZE, streams[2]))
    cu.cuStreamEndCapture(streams[2])
    return report


def loop(duration_s: float):
    """Copies back and forth, on two streams, until `duration_s` has passed."""
    start = record(streams[0])
    deadline = time.monotonic() + duration_s
    copies = 0
    while time.monotonic() < deadline:
        h2d(streams[0])
        d2h(streams[1])
        copies += 2
        ok("sync", cu.cuCtxSynchronize())
    end = record(streams[0])
    ok("sync", cu.cuCtxSynchronize())
    return {"copies": copies, "elapsed_ms": elapsed(start, end)}


def between_kernels(duration_s: float):
    """1 ms kernels on one stream, each followed by a copy of 1 MiB (1.05 ms
    at 1 GB/s), until `duration_s` has passed: the kernels' share of the time."""
    module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
    work = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"work_us_1000"))
    launches = 0
    start = time.monotonic()
    while time.monotonic() - start < duration_s:
        ok("launch", cu.cuLaunchKernel(work, 1, 1, 1, 32, 1, 1, 0, streams[0], 0, 0))
        ok("HtoD", cu.cuMemcpyHtoDAsync(device[0], pinned[0], MiB, streams[0]))
        launches += 1
    ok("sync", cu.cuCtxSynchronize())
    wall_s = time.monotonic() - start
    return {"launches": launches, "kernel_share": launches * 0.001 / wall_s}


if __name__ == "__main__":
    mode, seconds_arg = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(json.dumps(engines() if mode == "engines"
                     else loop(seconds_arg) if mode == "loop"
                     else between_kernels(seconds_arg)))

"""A cuda-bindings client of a launch-bound program on simgpu: what events say
when the CPU is slower than the kernels.  Prints JSON (milliseconds from
events, seconds of wall time, CUresult names).

    python launch_bound.py"""

import json
import time

from cuda.bindings import driver as cu


def ok(what, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"launch_bound: {what}: {err.name}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def launch(fn, stream):
    ok("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))


def elapsed_ms(start, end) -> float:
    ok("cuEventSynchronize", cu.cuEventSynchronize(end))
    return ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))


report = {}
ok("cuInit", cu.cuInit(0))
ctx = ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ok("cuDeviceGet", cu.cuDeviceGet(0))))
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
short = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us20"))
long = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us200000"))
stream, other = (ok("cuStreamCreate", cu.cuStreamCreate(0)) for _ in range(2))
start, end, idle = (ok("cuEventCreate", cu.cuEventCreate(0)) for _ in range(3))

# A launch takes the CPU SIMGPU_LAUNCH_US.
launches = 100
began = time.perf_counter()
for _ in range(launches):
    launch(short, stream)
report["launch_s"] = (time.perf_counter() - began) / launches
ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream))

# An event pair around one launch on an idle stream: the start event completes
# at once, the kernel only once the launch has reached the GPU.
ok("cuEventRecord", cu.cuEventRecord(start, stream))
report["start_query"] = cu.cuEventQuery(start)[0].name
launch(short, stream)
ok("cuEventRecord", cu.cuEventRecord(end, stream))
report["one_launch_ms"] = elapsed_ms(start, end)

# Ten kernels with 1 ms of CPU work after each: the GPU idles between them.
ok("cuEventRecord", cu.cuEventRecord(start, stream))
for _ in range(10):
    launch(short, stream)
    until = time.perf_counter() + 0.001
    while time.perf_counter() < until:
        pass
ok("cuEventRecord", cu.cuEventRecord(end, stream))
report["paced_ms"] = elapsed_ms(start, end)

# Queued behind a kernel, the same launches run back to back.
launch(long, stream)
ok("cuEventRecord", cu.cuEventRecord(start, stream))
for _ in range(10):
    launch(short, stream)
ok("cuEventRecord", cu.cuEventRecord(end, stream))
# An event on an idle stream completes at once, while the other stream's kernels run.
ok("cuEventRecord", cu.cuEventRecord(idle, other))
report["idle_query"] = cu.cuEventQuery(idle)[0].name
report["queued_ms"] = elapsed_ms(start, end)
print(json.dumps(report))

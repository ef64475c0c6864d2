"""How simgpu keeps time across streams and contexts, as event times show it
(they are simulated GPU time).  Prints JSON, milliseconds.

    python gpu_time.py"""

import json

from cuda.bindings import driver as cu


def ok(what, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"gpu_time: {what}: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def launch(fn, stream):
    ok("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))


def event(stream):
    e = ok("cuEventCreate", cu.cuEventCreate(0))
    ok("cuEventRecord", cu.cuEventRecord(e, stream))
    return e


def ms(start, end):
    ok("cuEventSynchronize", cu.cuEventSynchronize(end))
    return ok("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))


def context():
    ctx = ok("cuCtxCreate", cu.cuCtxCreate(None, 0, ok("cuDeviceGet", cu.cuDeviceGet(0))))
    module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"any image"))
    kernel = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us20000"))
    return ctx, kernel, [ok("cuStreamCreate", cu.cuStreamCreate(0)) for _ in range(2)]


report = {}
ok("cuInit", cu.cuInit(0))
ctx, kernel, (a, b) = context()

# An event on an idle stream completes at once, while another stream's kernel runs.
start = event(a)
launch(kernel, a)
after_kernel = event(a)
idle = event(b)
report["idle_stream_event_query"] = cu.cuEventQuery(idle)[0].name
report["idle_stream_event_ms"] = ms(start, idle)
report["busy_stream_event_ms"] = ms(start, after_kernel)

# Two streams of one context, a 20 ms kernel each: they overlap when allowed.
start = event(a)
ok("cuStreamWaitEvent", cu.cuStreamWaitEvent(b, start, 0))
launch(kernel, a)
launch(kernel, b)
end_a, end_b = event(a), event(b)
report["two_streams_ms"] = max(ms(start, end_a), ms(start, end_b))

# Two contexts, a 20 ms kernel each: they time-slice; a kernel longer than the
# slice is preempted, so each one's span holds the other's slices.
other, other_kernel, (c, _) = context()
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
first_start = event(a)
launch(kernel, a)
first_end = event(a)
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(other))
second_start = event(c)
launch(other_kernel, c)
second_end = event(c)
report["contexts_ms"] = sorted([ms(first_start, first_end), ms(second_start, second_end)])
print(json.dumps(report))

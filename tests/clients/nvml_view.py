"""An NVML client (nvidia-ml-py) that prints, as JSON, what a monitor asks of
every device: count, UUID, index, memory (v1 and v2), the process lists
(every version, graphics, MPS, the detail list), utilisation.  An NVML error
is printed as its name instead of a value.

    python nvml_view.py [--cuda-init] [--uuid-lookup UUID ...]

--cuda-init initialises CUDA (cuda-bindings) first and adds each CUDA
ordinal's UUID; --uuid-lookup asks nvmlDeviceGetHandleByUUID for each UUID
and reports the index it finds or the error."""

import json
import sys
import time

import pynvml


def ask(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        return type(exc).__name__


def processes(fn, handle):
    found = ask(fn, handle)
    return found if isinstance(found, str) else [[p.pid, p.usedGpuMemory] for p in found]


def detail(handle, mode):
    found = ask(pynvml.nvmlDeviceGetRunningProcessDetailList, handle,
                pynvml.nvmlProcessDetailList_v1, mode)
    return found if isinstance(found, str) else [[p.pid, p.usedGpuMemory] for p in found]


def device(index):
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    util = ask(pynvml.nvmlDeviceGetUtilizationRates, h)
    samples = ask(pynvml.nvmlDeviceGetProcessUtilization, h, time.time_ns() // 1000 - 1_000_000)
    return {
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "index": pynvml.nvmlDeviceGetIndex(h),
        "v1": {"total": v1.total, "free": v1.free, "used": v1.used},
        "v2": {"total": v2.total, "reserved": v2.reserved, "free": v2.free, "used": v2.used},
        "compute": processes(pynvml.nvmlDeviceGetComputeRunningProcesses, h),
        "compute_v2": processes(pynvml.nvmlDeviceGetComputeRunningProcesses_v2, h),
        "compute_v3": processes(pynvml.nvmlDeviceGetComputeRunningProcesses_v3, h),
        "graphics": processes(pynvml.nvmlDeviceGetGraphicsRunningProcesses, h),
        "mps": processes(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, h),
        "detail_compute": detail(h, pynvml.NVML_PROCESS_MODE_COMPUTE),
        "utilization": util if isinstance(util, str) else {"gpu": util.gpu, "memory": util.memory},
        "process_utilization": samples if isinstance(samples, str) else
        [{"pid": s.pid, "sm": s.smUtil, "mem": s.memUtil} for s in samples],
    }


def main():
    report = {}
    args = sys.argv[1:]
    if "--cuda-init" in args:
        from cuda.bindings import driver as cu

        cu.cuInit(0)
        count = cu.cuDeviceGetCount()[1]
        report["cuda_uuids"] = []
        for ordinal in range(count):
            raw = bytes(cu.cuDeviceGetUuid(cu.cuDeviceGet(ordinal)[1])[1].bytes)
            h = raw.hex()
            report["cuda_uuids"].append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    pynvml.nvmlInit()
    report["count"] = pynvml.nvmlDeviceGetCount()
    report["devices"] = [device(i) for i in range(report["count"])]
    if "--uuid-lookup" in args:
        wanted = args[args.index("--uuid-lookup") + 1:]
        found = {}
        for uuid in wanted:
            h = ask(pynvml.nvmlDeviceGetHandleByUUID, uuid)
            found[uuid] = h if isinstance(h, str) else pynvml.nvmlDeviceGetIndex(h)
        report["by_uuid"] = found
    pynvml.nvmlShutdown()
    print(json.dumps(report))


main()

"""What a MIG-aware monitor and a CUDA program see of a machine in MIG mode,
through pynvml and cuda-bindings, as JSON: per GPU its MIG mode, memory (or
the error NVML answered) and MIG devices (looping to the maximum and skipping
NOT_FOUND, as nvitop and HAMi do), with their ids, memory, attributes and
processes; the board's GPU-instance profiles and placements; and the CUDA
devices this process enumerates.

    python mig_view.py [HOLD_BYTES]

With HOLD_BYTES, the process first allocates that much on CUDA device 0 and
holds it while it reports."""

import ctypes
import json
import sys

import pynvml as nv
from cuda.bindings import driver as cu


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"mig_view: {err.name}")
    return values[0] if len(values) == 1 else values


def answer(call, *args):
    """The call's value, or the name of the NVML error it answered."""
    try:
        return call(*args)
    except nv.NVMLError as e:
        return type(e).__name__.removeprefix("NVMLError_")


def processes(handle):
    listed = answer(nv.nvmlDeviceGetComputeRunningProcesses, handle)
    if isinstance(listed, str):
        return listed
    return [{"pid": p.pid, "used": p.usedGpuMemory, "gi": p.gpuInstanceId, "ci": p.computeInstanceId}
            for p in listed]


def memory(handle):
    info = answer(nv.nvmlDeviceGetMemoryInfo, handle)
    return info if isinstance(info, str) else {"total": info.total, "used": info.used}


report = {"cuda": []}
ok(cu.cuInit(0))
for ordinal in range(ok(cu.cuDeviceGetCount())):
    dev = ok(cu.cuDeviceGet(ordinal))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    if ordinal == 0 and len(sys.argv) > 1:
        ok(cu.cuMemAlloc(int(sys.argv[1])))
    free, total = ok(cu.cuMemGetInfo())
    report["cuda"].append({
        "name": ok(cu.cuDeviceGetName(96, dev)).split(b"\0")[0].decode(),
        "uuid": bytes(ok(cu.cuDeviceGetUuid(dev)).bytes).hex(),
        "total": int(ok(cu.cuDeviceTotalMem(dev))),
        "sms": ok(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)),
        "mem_get_info_total": total,
    })

nv.nvmlInit()
report["gpus"] = []
for index in range(nv.nvmlDeviceGetCount()):
    gpu = nv.nvmlDeviceGetHandleByIndex(index)
    mode = answer(nv.nvmlDeviceGetMigMode, gpu)
    entry = {"uuid": nv.nvmlDeviceGetUUID(gpu), "mig_mode": mode, "memory": memory(gpu),
             "processes": processes(gpu),
             "utilization": answer(lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu, gpu),
             "max_mig": nv.nvmlDeviceGetMaxMigDeviceCount(gpu), "mig": [], "holes": [],
             "profiles": {}}
    for mig_index in range(entry["max_mig"]):
        mig = answer(nv.nvmlDeviceGetMigDeviceHandleByIndex, gpu, mig_index)
        if isinstance(mig, str):
            entry["holes"].append([mig_index, mig])
            continue
        uuid = nv.nvmlDeviceGetUUID(mig)
        by_uuid = nv.nvmlDeviceGetHandleByUUID(uuid)
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        attributes = nv.nvmlDeviceGetAttributes_v2(mig)
        entry["mig"].append({
            "index": nv.nvmlDeviceGetIndex(mig), "name": nv.nvmlDeviceGetName(mig), "uuid": uuid,
            "is_mig": bool(nv.nvmlDeviceIsMigDeviceHandle(mig).value),
            "gi": nv.nvmlDeviceGetGpuInstanceId(mig), "ci": nv.nvmlDeviceGetComputeInstanceId(mig),
            "by_uuid_is_same": nv.nvmlDeviceGetUUID(by_uuid) == uuid,
            "parent_uuid": nv.nvmlDeviceGetUUID(parent),
            "memory": memory(mig), "processes": processes(mig),
            "sms": attributes.multiprocessorCount, "memory_mib": attributes.memorySizeMB,
            "utilization": answer(lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu, mig),
            "process_utilization": answer(nv.nvmlDeviceGetProcessUtilization, mig, 0),
        })
    for enum in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
        info = answer(nv.nvmlDeviceGetGpuInstanceProfileInfo, gpu, enum, 1)
        if isinstance(info, str):
            entry["profiles"][enum] = info
            continue
        count = ctypes.c_uint(0)
        placements = answer(nv.nvmlDeviceGetGpuInstancePossiblePlacements, gpu, info.id, None,
                            ctypes.byref(count))
        if placements == nv.NVML_SUCCESS:
            array = (nv.c_nvmlGpuInstancePlacement_t * count.value)()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, info.id, array, ctypes.byref(count))
            placements = [[p.start, p.size] for p in array]
        entry["profiles"][enum] = {
            "id": info.id, "memory_mib": info.memorySizeMB, "sms": info.multiprocessorCount,
            "copy_engines": info.copyEngineCount, "max_count": info.instanceCount,
            "slices": info.sliceCount, "placements": placements,
            "v2_name": answer(lambda h, e: nv.nvmlDeviceGetGpuInstanceProfileInfo(h, e).name, gpu, enum)}
    report["gpus"].append(entry)
print(json.dumps(report))

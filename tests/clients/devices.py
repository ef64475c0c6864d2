"""What a monitoring tool and a CUDA program see of the devices: every device
through NVML (nvidia-ml-py) and through cuda-bindings, as JSON.

    python devices.py"""

import json

import pynvml
from cuda.bindings import driver as cu


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"devices: {err.name}")
    return values[0] if len(values) == 1 else values


pynvml.nvmlInit()
nvml = {"driver_version": pynvml.nvmlSystemGetDriverVersion(),
        "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion(),
        "devices": []}
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
    nvml["devices"].append({
        "name": pynvml.nvmlDeviceGetName(handle),
        "uuid": uuid,
        "index_by_uuid": pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)),
        "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
        "total": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
        "utilization": [utilization.gpu, utilization.memory],
    })
pynvml.nvmlShutdown()
try:
    pynvml.nvmlDeviceGetCount()
    nvml["after_shutdown"] = "answered"
except pynvml.NVMLError as e:
    nvml["after_shutdown"] = type(e).__name__

ok(cu.cuInit(0))
cuda = {"driver_version": ok(cu.cuDriverGetVersion()), "devices": []}
count = ok(cu.cuDeviceGetCount())
for index in range(count):
    dev = ok(cu.cuDeviceGet(index))
    cuda["devices"].append({
        "name": ok(cu.cuDeviceGetName(96, dev)).split(b"\0")[0].decode(),
        "uuid": bytes(ok(cu.cuDeviceGetUuid(dev)).bytes).hex(),
        "total": int(ok(cu.cuDeviceTotalMem(dev))),
    })
cuda["device_past_the_end"] = cu.cuDeviceGet(count)[0].name
print(json.dumps({"nvml": nvml, "cuda": cuda}))

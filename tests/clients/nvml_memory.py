"""An NVML client (nvidia-ml-py): prints device 0's memory, v1 and v2, as JSON."""

import json

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
print(json.dumps({
    "v1": {"total": v1.total, "free": v1.free, "used": v1.used},
    "v2": {"total": v2.total, "free": v2.free, "used": v2.used},
}))
pynvml.nvmlShutdown()

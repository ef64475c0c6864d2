"""An NVML client (nvidia-ml-py): prints device 0's memory as v1 and as v2
(with `reserved`), and what nvmlDeviceGetMemoryInfo_v2 answers to a `version`
other than nvmlMemory_v2 (a literal 2, and 0), as JSON."""

import ctypes
import json

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
other_versions = {}
for version in (2, 0):
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = version
    other_versions[version] = fn(handle, ctypes.byref(memory))
print(json.dumps({
    "v1": {"total": v1.total, "free": v1.free, "used": v1.used},
    "v2": {"total": v2.total, "reserved": v2.reserved, "free": v2.free, "used": v2.used},
    "v2_version_2": other_versions[2],
    "v2_version_0": other_versions[0],
}))
pynvml.nvmlShutdown()

"""An NVML client (nvidia-ml-py), as nvidia-smi or nvitop reads device 0: the
processes on it and the memory in use, as JSON. Process tables map pid (a
string, as JSON keys are) to usedGpuMemory in bytes.

    python nvml_processes.py"""

import json
import os

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
compute = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
print(json.dumps({
    "pid": os.getpid(),
    "compute": {p.pid: p.usedGpuMemory for p in compute},
    "compute_v2": {p.pid: p.usedGpuMemory
                   for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)},
    "gpu_instance_ids": sorted({p.gpuInstanceId for p in compute}),
    "graphics": [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)],
    "used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
}))
pynvml.nvmlShutdown()

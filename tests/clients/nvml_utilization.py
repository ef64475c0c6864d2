"""An NVML client (nvidia-ml-py): prints device 0's utilisation and the
per-process utilisation samples newer than SINCE_US (wall-clock us) as JSON.

    python nvml_utilization.py SINCE_US"""

import json
import sys

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
try:
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, int(sys.argv[1]))
except pynvml.NVMLError_NotFound:
    samples = []
print(json.dumps({
    "gpu": rates.gpu,
    "memory": rates.memory,
    "samples": [{"pid": s.pid, "timestamp_us": s.timeStamp, "sm": s.smUtil} for s in samples],
}))
pynvml.nvmlShutdown()

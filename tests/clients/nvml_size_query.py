"""An NVML client that walks nvmlDeviceGetProcessUtilization's size protocol
by hand (ctypes through nvidia-ml-py's loaded library), as nvidia-smi and the
shim call it, and prints each answer of device 0 as JSON.

    python nvml_size_query.py SINCE_US

"null_0", "null_now": the size query (NULL buffer, count 0) at timestamp 0 and
at now; "small": a buffer of 1 with count 1; "room": a buffer of the queried
count, with the count set to 1000 first when asked with a count of 1000 (so
that an answer that leaves it shows it); each is [return code, count, samples]."""

import ctypes
import json
import sys
import time

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
Sample = pynvml.c_nvmlProcessUtilizationSample_t


def call(buffer, count: int, since_us: int) -> list:
    c_count = ctypes.c_uint(count)
    rc = fn(handle, buffer, ctypes.byref(c_count), ctypes.c_ulonglong(since_us))
    samples = []
    if rc == pynvml.NVML_SUCCESS:
        samples = [{"pid": s.pid, "timestamp_us": s.timeStamp, "sm": s.smUtil}
                   for s in buffer[:c_count.value]]
    return [rc, c_count.value, samples]


since_us = int(sys.argv[1])
answers = {
    "null_0": call(None, 0, 0),
    "null_now": call(None, 0, int(time.time() * 1e6)),
}
answers["small"] = call((Sample * 1)(), 1, since_us)
needed = answers["null_0"][1]
answers["room"] = call((Sample * 1000)(), 1000, since_us) if needed <= 1000 else None
answers["exact"] = call((Sample * needed)(), needed, since_us)
print(json.dumps(answers))
pynvml.nvmlShutdown()

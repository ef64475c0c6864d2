"""Watches device 0's memory as the driver counts it (all processes, no cap
applied) until FILE exists, and once more after; prints the highest 'used'
seen and the number of samples.

    python nvml_watch.py FILE"""

import os
import sys
import time

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
highest = samples = 0
print("watching", flush=True)
give_up = time.monotonic() + 300  # never outlive a test that failed before its end
while True:
    done = os.path.exists(sys.argv[1]) or time.monotonic() > give_up
    highest = max(highest, pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    samples += 1
    if done:
        break
print(highest, samples, flush=True)

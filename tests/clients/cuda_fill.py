"""A cuda-bindings client (cuda.bindings.driver, which reaches the driver only
through dlopen + dlsym("cuGetProcAddress_v2")): allocates BLOCK bytes COUNT
times, frees one and allocates once more, and prints what it saw as JSON.

    python cuda_fill.py BLOCK COUNT [--hold FILE] [--start FILE] [--device I]

With --hold, it keeps its memory until FILE exists (for tests that run several
clients at once). With --start, it sets up its context, prints {"ready": PID}
and waits until FILE exists before it allocates (for clients that race).  With
--device, it allocates on device I as the process numbers it (default 0)."""

import json
import os
import sys
import time

from cuda.bindings import driver as cu


def say(report) -> None:
    """One line in one write(2): clients of one container share a pipe, and a
    line written in pieces could be cut by another's."""
    os.write(sys.stdout.fileno(), (json.dumps(report) + "\n").encode())


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda_fill: {cu.cuGetErrorName(err)[1]!r}")
    return values[0] if len(values) == 1 else values


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def main():
    block, count = int(sys.argv[1]), int(sys.argv[2])
    options = dict(zip(sys.argv[3::2], sys.argv[4::2]))
    hold, start = options.get("--hold"), options.get("--start")
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(int(options.get("--device", 0))))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    report = {"pid": os.getpid(), "total_mem": int(check(cu.cuDeviceTotalMem(device)))}
    free, total = check(cu.cuMemGetInfo())
    report["before"] = {"free": int(free), "total": int(total)}
    if start:
        say({"ready": os.getpid()})
        wait_for(start)
    held, results = [], []
    for _ in range(count):
        err, ptr = cu.cuMemAlloc(block)
        results.append(cu.cuGetErrorName(err)[1].decode())
        if err == cu.CUresult.CUDA_SUCCESS:
            held.append(ptr)
    report["allocs"] = results
    free, total = check(cu.cuMemGetInfo())
    report["after"] = {"free": int(free), "total": int(total)}
    if hold:
        say(report)
        wait_for(hold)
        return
    if held:
        report["free"] = cu.cuGetErrorName(cu.cuMemFree(held.pop())[0])[1].decode()
        err, ptr = cu.cuMemAlloc(block)
        report["realloc"] = cu.cuGetErrorName(err)[1].decode()
        if err == cu.CUresult.CUDA_SUCCESS:
            held.append(ptr)
    for ptr in held:
        check(cu.cuMemFree(ptr))
    say(report)


main()

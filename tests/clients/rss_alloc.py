"""A cuda-bindings client that allocates BYTES of device memory, writes 1 MiB
at each end of it, reads the last 16 bytes back, and prints as JSON what that
cost in resident memory (VmRSS of this process, before and after).

    python rss_alloc.py BYTES"""

import json
import sys

from cuda.bindings import driver as cu

MiB = 1 << 20


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"rss_alloc: {err.name}")
    return values[0] if len(values) == 1 else values


def rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("rss_alloc: no VmRSS in /proc/self/status")


size = int(sys.argv[1])
ok(cu.cuInit(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
tail = bytearray(16)
report = {"rss_before": rss_bytes()}
ptr = ok(cu.cuMemAlloc(size))
ok(cu.cuMemsetD8(ptr, 7, MiB))
ok(cu.cuMemsetD8(int(ptr) + size - MiB, 9, MiB))
ok(cu.cuMemcpyDtoH(tail, int(ptr) + size - len(tail), len(tail)))
report["rss_after"] = rss_bytes()
free, total = ok(cu.cuMemGetInfo())
report["used"] = int(total) - int(free)
report["tail"] = bytes(tail).hex()
ok(cu.cuMemFree(ptr))
print(json.dumps(report))

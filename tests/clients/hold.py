"""A program as users run them one after another: retains the primary context
(which costs the driver's own memory), allocates MIB mebibytes with
cuda-bindings, and exits (without freeing: the driver takes all of it back).

    python hold.py MIB

Exits 0 when both worked, else prints the driver's error name and exits 1."""

import sys

from cuda.bindings import driver as cu


def check(result, what):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        print(f"hold: {what}: {cu.cuGetErrorName(err)[1].decode()}", file=sys.stderr)
        raise SystemExit(1)
    return values[0] if values else None


check(cu.cuInit(0), "cuInit")
device = check(cu.cuDeviceGet(0), "cuDeviceGet")
context = check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
check(cu.cuMemAlloc(int(sys.argv[1]) << 20), "cuMemAlloc")

"""Allocate GPU memory in 256 MiB blocks until the driver says no.

Under `vgpulimit run --memory 1GiB` the last allocation that fits is the one
at the cap, and the next one fails with CUDA_ERROR_OUT_OF_MEMORY; without a
cap it runs until the device is full.  The CUDA context itself holds device
memory before anything is allocated (518 MiB on an H200, and on the simulated
GPU, which is one by default): that counts against the cap too, as it does on
the device.  Works on a real GPU and on the simulated one
(`vgpulimit run --simulate ...`).
"""

import sys

try:
    from cuda.bindings import driver
except ImportError:
    sys.exit("fill_gpu.py needs cuda-bindings: pip install cuda-bindings")

BLOCK_BYTES = 256 << 20
MiB = 1 << 20


def check(result):
    """cuda-bindings returns (CUresult, *values): the values, or exit on an error."""
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"fill_gpu.py: {err.name}")
    return values[0] if len(values) == 1 else values


def mem_info(label):
    free, total = check(driver.cuMemGetInfo())
    print(f"{label}: free {free // MiB} MiB of {total // MiB} MiB")
    return free, total


def main():
    check(driver.cuInit(0))
    device = check(driver.cuDeviceGet(0))
    context = check(driver.cuDevicePrimaryCtxRetain(device))
    check(driver.cuCtxSetCurrent(context))
    free, total = mem_info("before")
    if free < total:
        print(f"(in use before any allocation: {(total - free) // MiB} MiB, the context and "
              f"whatever else shares the cap)")

    blocks = []
    while True:
        err, pointer = driver.cuMemAlloc(BLOCK_BYTES)
        if err == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            print(f"block {len(blocks) + 1}: CUDA_ERROR_OUT_OF_MEMORY "
                  f"after {len(blocks) * BLOCK_BYTES // MiB} MiB")
            break
        if err != driver.CUresult.CUDA_SUCCESS:
            sys.exit(f"fill_gpu.py: cuMemAlloc: {err.name}")
        blocks.append(pointer)
        total_mib = len(blocks) * BLOCK_BYTES // MiB
        print(f"block {len(blocks)}: 256 MiB allocated, {total_mib} MiB in all")

    mem_info("after")
    for pointer in blocks:
        check(driver.cuMemFree(pointer))
    check(driver.cuDevicePrimaryCtxRelease(device))


if __name__ == "__main__":
    main()

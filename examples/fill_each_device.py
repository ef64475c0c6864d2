"""Fill every device the process sees: take each device's primary context,
read cuMemGetInfo, and allocate 512 MiB blocks until the driver says no.

    vgpulimit run --simulate --memory 8GiB -- python examples/fill_each_device.py

Prints one line per device: its ordinal as CUDA numbers it, its UUID (cut),
the total cuMemGetInfo reports (the cap under vgpulimit) and what it
allocated.  The context's own memory counts against the cap too."""

import sys

try:
    from cuda.bindings import driver
except ImportError:
    sys.exit("fill_each_device.py needs cuda-bindings: pip install cuda-bindings")

BLOCK_BYTES = 512 << 20
GiB = 1 << 30


def check(result):
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"fill_each_device.py: {err.name}")
    return values[0] if len(values) == 1 else values


def size(count: int) -> str:
    return f"{count / GiB:g} GiB"


def main():
    check(driver.cuInit(0))
    for ordinal in range(check(driver.cuDeviceGetCount())):
        device = check(driver.cuDeviceGet(ordinal))
        uuid = bytes(check(driver.cuDeviceGetUuid(device)).bytes).hex()
        context = check(driver.cuDevicePrimaryCtxRetain(device))
        check(driver.cuCtxSetCurrent(context))
        _, total = check(driver.cuMemGetInfo())
        allocated = 0
        while True:
            err, _ = driver.cuMemAlloc(BLOCK_BYTES)
            if err != driver.CUresult.CUDA_SUCCESS:
                break
            allocated += BLOCK_BYTES
        print(f"cuda:{ordinal} GPU-{uuid[:8]}…  total {size(total)}, allocated {size(allocated)}")


if __name__ == "__main__":
    main()

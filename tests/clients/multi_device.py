"""A program that uses every device it is given, as a multi-GPU job does: a
context on each, allocations on each until the driver says no, peer access
between the first two, then 1 ms kernels on every device at once (a thread
each) for SECONDS.  Prints one JSON line per ordinal: its UUID, what
cuMemGetInfo and cuDeviceTotalMem say, what it could allocate, and the share
of the GPU's time its kernels took.  With --hold FILE it keeps its memory
until FILE exists.

    python multi_device.py SECONDS [--hold FILE]"""

import json
import os
import sys
import threading
import time

from cuda.bindings import driver as cu

BLOCK = 128 << 20
KERNEL_MS = 1


def ok(what, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"multi_device: {what}: {err.name}")
    return values[0] if len(values) == 1 else tuple(values) or None


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def fill() -> int:
    """Allocates blocks on the current device until refused; the bytes held."""
    held = 0
    while held < (64 << 30):
        err, _ = cu.cuMemAlloc(BLOCK)
        if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            break
        if err != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"multi_device: cuMemAlloc: {err.name}")
        held += BLOCK
    return held


def launch_loop(ctx, kernel, seconds: float, out: dict) -> None:
    ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    stream = ok("cuStreamCreate", cu.cuStreamCreate(0))
    start = time.monotonic()
    launched = 0
    while time.monotonic() - start < seconds:
        ok("cuLaunchKernel", cu.cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))
        launched += 1
        if launched % 16 == 0:
            ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    out["share"] = round(launched * KERNEL_MS / 1000 / (time.monotonic() - start), 3)


def main() -> None:
    seconds = float(sys.argv[1])
    release = sys.argv[sys.argv.index("--hold") + 1] if "--hold" in sys.argv else None
    ok("cuInit", cu.cuInit(0))
    devices = []
    for ordinal in range(ok("cuDeviceGetCount", cu.cuDeviceGetCount())):
        dev = ok("cuDeviceGet", cu.cuDeviceGet(ordinal))
        ctx = ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
        ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
        # A module of no code: what the program can allocate is the cap.
        module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"//simgpu code=0\n"))
        free, total = ok("cuMemGetInfo", cu.cuMemGetInfo())
        devices.append({"ordinal": ordinal, "uuid": uuid_text(bytes(ok("cuDeviceGetUuid", cu.cuDeviceGetUuid(dev)).bytes)),
                        "total": int(total), "free": int(free),
                        "total_mem": int(ok("cuDeviceTotalMem", cu.cuDeviceTotalMem(dev))),
                        "allocated": fill(), "ctx": ctx,
                        "kernel": ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"spin_us1000"))})
    peer = None
    if len(devices) > 1:
        ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(devices[0]["ctx"]))
        peer = [cu.cuDeviceCanAccessPeer(0, 1)[1], cu.cuCtxEnablePeerAccess(devices[1]["ctx"], 0)[0].name]
    threads = [threading.Thread(target=launch_loop, args=(d["ctx"], d["kernel"], seconds, d)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in devices:
        del d["ctx"], d["kernel"]
        d["pid"] = os.getpid()
        d["peer"] = peer
        print(json.dumps(d), flush=True)
    print("ready", flush=True)
    while release and not os.path.exists(release):
        time.sleep(0.05)


main()

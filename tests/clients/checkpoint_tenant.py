"""A cuda-bindings tenant for checkpoint tests, driven one command per line on
stdin, answering one JSON line per command on stdout:

    alloc BYTES     cuMemAlloc, then writes a pattern at both ends (1 MiB each)
    managed BYTES   cuMemAllocManaged
    ipc             cuIpcGetMemHandle of its first allocation
    launch          launches of a kernel in flight (cuLaunchKernel on the default module)
    check           reads every pattern back: {"intact": bool, "ptrs": [...]}
    info            cuMemGetInfo: {"free": ..., "total": ...}
    free            frees everything it allocated

It prints {"ready": PID} once its context is current."""

import json
import os
import sys

from cuda.bindings import driver as cu

END = 1 << 20


def say(report) -> None:
    os.write(sys.stdout.fileno(), (json.dumps(report) + "\n").encode())


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"checkpoint_tenant: {cu.cuGetErrorName(err)[1]!r}")
    return values[0] if len(values) == 1 else values


def pattern(ptr: int, where: int) -> bytes:
    return bytes((ptr // 4096 + where + i) % 251 for i in range(END))


def ends(ptr: int, size: int) -> list[tuple[int, int]]:
    n = min(END, size)
    return [(ptr, n), (ptr + size - n, n)]


def main():
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    held: list[tuple[int, int]] = []
    say({"ready": os.getpid()})
    for line in sys.stdin:
        word, *args = line.split()
        if word in ("alloc", "managed"):
            size = int(args[0])
            if word == "alloc":
                err, ptr = cu.cuMemAlloc(size)
            else:
                err, ptr = cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
            if err == cu.CUresult.CUDA_SUCCESS:
                held.append((int(ptr), size))
                for at, n in ends(int(ptr), size):
                    check(cu.cuMemcpyHtoD(at, pattern(int(ptr), at - int(ptr))[:n], n))
            say({"result": cu.cuGetErrorName(err)[1].decode(), "ptr": int(ptr) if ptr else None})
        elif word == "ipc":
            err, _ = cu.cuIpcGetMemHandle(held[0][0])
            say({"result": cu.cuGetErrorName(err)[1].decode()})
        elif word == "check":
            intact = True
            for ptr, size in held:
                for at, n in ends(ptr, size):
                    buf = bytearray(n)
                    check(cu.cuMemcpyDtoH(buf, at, n))
                    intact = intact and bytes(buf) == pattern(ptr, at - ptr)[:n]
            say({"intact": intact, "ptrs": [p for p, _ in held]})
        elif word == "info":
            free, total = check(cu.cuMemGetInfo())
            say({"free": int(free), "total": int(total)})
        elif word == "free":
            for ptr, _ in held:
                check(cu.cuMemFree(ptr))
            held.clear()
            say({"result": "CUDA_SUCCESS"})
        else:
            say({"error": f"unknown command {word!r}"})


if __name__ == "__main__":
    main()

"""A tenant for the checkpoint tests and benchmarks, driven one command per
line on stdin, answering one JSON line per command on stdout.  It reaches the
driver as ctypes programs do (dlopen + dlsym of libcuda.so.1), so it runs
wherever a driver is, cuda-bindings or not (benchmarks/real_gpu_rows/suspend.py):

    alloc BYTES     cuMemAlloc, then writes a pattern at both ends (1 MiB each)
    managed BYTES   cuMemAllocManaged
    async BYTES     cuMemAllocAsync on the null stream (pool BYTES: cuMemAllocFromPoolAsync from the
                    device's default pool), then cuStreamSynchronize, and writes the pattern as alloc does
    sync            cuCtxSynchronize
    ipc             cuIpcGetMemHandle of its first allocation
    launch US       launches a kernel of US microseconds and returns (simgpu: a kernel's
                    name says its length), its work in flight
    check           reads every pattern back: {"intact": bool, "ptrs": [...]}
    info            cuMemGetInfo: {"free": ..., "total": ...}
    free            frees everything it allocated

It prints {"ready": PID} once its context is current."""

import ctypes
import json
import os
import sys

END = 1 << 20
CU_MEM_ATTACH_GLOBAL = 1

cuda = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64


def say(report) -> None:
    os.write(sys.stdout.fileno(), (json.dumps(report) + "\n").encode())


def name(code: int) -> str:
    text = ctypes.c_char_p()
    cuda.cuGetErrorName(code, ctypes.byref(text))
    return (text.value or b"CUresult %d" % code).decode()


def check(code: int) -> None:
    if code != 0:
        raise SystemExit(f"checkpoint_tenant: {name(code)}")


def pattern(ptr: int, where: int) -> bytes:
    return bytes((ptr // 4096 + where + i) % 251 for i in range(END))


def ends(ptr: int, size: int) -> list[tuple[int, int]]:
    n = min(END, size)
    return [(ptr, n), (ptr + size - n, n)]


def main():
    check(cuda.cuInit(0))
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0))
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    check(cuda.cuCtxSetCurrent(context))
    # Asked now: a call the shim does not intercept would wait, without asking, in a suspended process.
    pool = ctypes.c_void_p()
    check(cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device))
    held: list[tuple[int, int]] = []
    ordered: set[int] = set()   # stream-ordered: freed by cuMemFreeAsync
    kernels: dict[str, ctypes.c_void_p] = {}
    say({"ready": os.getpid()})
    for line in sys.stdin:
        word, *args = line.split()
        if word in ("alloc", "managed", "async", "pool"):
            size, ptr = int(args[0]), u64()
            if word == "alloc":
                code = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
            elif word == "managed":
                code = cuda.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(size), CU_MEM_ATTACH_GLOBAL)
            elif word == "async":
                code = cuda.cuMemAllocAsync(ctypes.byref(ptr), ctypes.c_size_t(size), None)
            else:
                code = cuda.cuMemAllocFromPoolAsync(ctypes.byref(ptr), ctypes.c_size_t(size), pool, None)
            if code == 0 and word in ("async", "pool"):
                ordered.add(ptr.value)
                check(cuda.cuStreamSynchronize(None))
            if code == 0:
                held.append((ptr.value, size))
                for at, n in ends(ptr.value, size):
                    check(cuda.cuMemcpyHtoD_v2(u64(at), pattern(ptr.value, at - ptr.value)[:n], ctypes.c_size_t(n)))
            say({"result": name(code), "ptr": ptr.value if code == 0 else None})
        elif word == "launch":
            if args[0] not in kernels:   # loaded once: a later launch is a launch alone
                module, kernels[args[0]] = ctypes.c_void_p(), ctypes.c_void_p()
                check(cuda.cuModuleLoadData(ctypes.byref(module), b"// simgpu runs no code\n"))
                check(cuda.cuModuleGetFunction(ctypes.byref(kernels[args[0]]), module, b"spin_us%d" % int(args[0])))
            code = cuda.cuLaunchKernel(kernels[args[0]], 1, 1, 1, 1, 1, 1, 0, None, None, None)
            say({"result": name(code)})
        elif word == "ipc":
            handle = ctypes.create_string_buffer(64)
            say({"result": name(cuda.cuIpcGetMemHandle(handle, u64(held[0][0])))})
        elif word == "check":
            intact = True
            for ptr, size in held:
                for at, n in ends(ptr, size):
                    buf = ctypes.create_string_buffer(n)
                    check(cuda.cuMemcpyDtoH_v2(buf, u64(at), ctypes.c_size_t(n)))
                    intact = intact and buf.raw == pattern(ptr, at - ptr)[:n]
            say({"intact": intact, "ptrs": [p for p, _ in held]})
        elif word == "info":
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
            say({"free": free.value, "total": total.value})
        elif word == "sync":
            say({"result": name(cuda.cuCtxSynchronize())})
        elif word == "free":
            for ptr, _ in held:
                check(cuda.cuMemFreeAsync(u64(ptr), None) if ptr in ordered else cuda.cuMemFree_v2(u64(ptr)))
            check(cuda.cuStreamSynchronize(None))
            held.clear()
            ordered.clear()
            say({"result": "CUDA_SUCCESS"})
        else:
            say({"error": f"unknown command {word!r}"})


if __name__ == "__main__":
    main()

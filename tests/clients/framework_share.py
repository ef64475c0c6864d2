"""Frameworks sharing device memory between processes, and giving it back and
taking it again, for the sharing rows of benchmarks/real_gpu.py. Each way
prints one JSON line per step and waits for a line on stdin before the next,
so the caller can compare what the driver lists for each process (NVML) with
what the container's region counts at that step. Exits 77, saying why, when
what it needs is missing.

    python framework_share.py torch-ipc MIB      # torch.multiprocessing: a CUDA tensor to a child
    python framework_share.py cupy-ipc MIB       # CuPy: cudaIpcGetMemHandle to a child
    python framework_share.py nccl MIB           # torch.distributed, NCCL, world size 1
    python framework_share.py sleep-wake MIB N   # VMM from ctypes: N x (unmap + release, create + map)

torch-ipc shares through CUDA IPC handles, or through exported VMM handles
(file descriptors) when PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
Steps: "shared" (both hold it), then "child gone"; nccl: "all_reduce done",
then "destroyed"; sleep-wake: "awake" and "asleep" in turn, N times."""

from __future__ import annotations

import ctypes
import json
import os
import sys

MiB = 1 << 20


def step(name: str, **what) -> None:
    print(json.dumps({"step": name, "pid": os.getpid(), **what}), flush=True)
    sys.stdin.readline()


def missing(why: str) -> None:
    print(why, flush=True)
    sys.exit(77)


def torch_child(tensors, replies, done) -> None:
    try:
        tensor = tensors.get()
        replies.put((os.getpid(), float(tensor[0].item()), None))
    except Exception as exc:  # noqa: BLE001 -- said to the parent, which decides
        replies.put((os.getpid(), None, f"{type(exc).__name__}: {exc}"))
        return
    done.wait()


def child_report(queue) -> tuple[int, float]:
    """What the child saw; a pidfd_getfd the OS refuses (ptrace restricted, as
    in many containers: pytorch/pytorch#165685) is a reason to skip."""
    pid, seen, error = queue.get(timeout=300)
    if error and "pidfd_getfd" in error:
        missing(f"the child could not fetch the exported descriptor: {error}")
    if error:
        sys.exit(f"framework_share.py: the child failed: {error}")
    return pid, seen


def torch_ipc(mib: int) -> None:
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        missing("PyTorch is not installed")
    if not torch.cuda.is_available():
        missing("PyTorch sees no GPU")
    ctx = mp.get_context("spawn")
    # A queue each way: on one queue the parent, reading the child's reply,
    # took its own tensor back before the child had started (an H200, torch
    # 2.11: "invalid device context" opening its own handle).
    tensors, replies, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    tensor = torch.full((mib * MiB // 4,), 7.0, device="cuda")
    child = ctx.Process(target=torch_child, args=(tensors, replies, done))
    child.start()
    tensors.put(tensor)
    child_pid, seen = child_report(replies)
    step("shared", child_pid=child_pid, child_saw=seen, torch=torch.__version__,
         alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    done.set()
    child.join()
    step("child gone", child_pid=child_pid)


def cupy_child(handle, nbytes, queue, done) -> None:
    import cupy

    try:
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        view = cupy.ndarray((nbytes // 4,), cupy.float32,
                            cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, None), 0))
        queue.put((os.getpid(), float(view[0].get()), None))
    except Exception as exc:  # noqa: BLE001 -- said to the parent, which decides
        queue.put((os.getpid(), None, f"{type(exc).__name__}: {exc}"))
        return
    done.wait()
    cupy.cuda.runtime.ipcCloseMemHandle(ptr)


def cupy_ipc(mib: int) -> None:
    try:
        import cupy
    except ImportError:
        missing("CuPy is not installed")
    import multiprocessing as mp

    nbytes = mib * MiB
    array = cupy.full((nbytes // 4,), 7.0, dtype=cupy.float32)
    handle = cupy.cuda.runtime.ipcGetMemHandle(array.data.ptr)
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=cupy_child, args=(handle, nbytes, queue, done))
    child.start()
    child_pid, seen = child_report(queue)
    step("shared", child_pid=child_pid, child_saw=seen, cupy=cupy.__version__)
    done.set()
    child.join()
    step("child gone", child_pid=child_pid)


def nccl(mib: int) -> None:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        missing("PyTorch is not installed")
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        missing("PyTorch has no GPU or no NCCL here")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    tensor = torch.ones(mib * MiB // 4, device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    step("all_reduce done", value=float(tensor[0].item()), torch=torch.__version__,
         nccl=".".join(map(str, torch.cuda.nccl.version())))
    dist.destroy_process_group()
    del tensor
    torch.cuda.empty_cache()
    step("destroyed")


class MemProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                ("locId", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("locType", ctypes.c_int), ("locId", ctypes.c_int), ("flags", ctypes.c_int)]


def sleep_wake(mib: int, rounds: int) -> None:
    """vLLM's CuMemAllocator: the model's memory in 2 MiB-granular handles
    mapped into one reserved range; sleep unmaps and releases them, keeping
    the range; wake creates and maps them again at the same addresses."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        missing(f"no libcuda.so.1: {exc}")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0) or \
            cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) or cu.cuCtxSetCurrent(ctx):
        missing("no CUDA context on device 0")
    prop = MemProp(type=1, requestedHandleTypes=0, locType=1, locId=0)
    granularity = ctypes.c_size_t()
    cu.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0)
    piece = max(granularity.value, 2 * MiB)
    size = (mib * MiB + piece - 1) // piece * piece
    base = ctypes.c_uint64()
    if cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(size), ctypes.c_size_t(0),
                              ctypes.c_uint64(0), ctypes.c_ulonglong(0)):
        missing("cuMemAddressReserve failed")
    access = AccessDesc(locType=1, locId=0, flags=3)

    def meminfo() -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def wake() -> tuple[list[int], int]:
        handles = []
        for at in range(0, size, piece):
            handle = ctypes.c_ulonglong()
            rc = cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(piece), ctypes.byref(prop),
                                ctypes.c_ulonglong(0))
            if rc:
                return handles, rc
            rc = cu.cuMemMap(ctypes.c_uint64(base.value + at), ctypes.c_size_t(piece), ctypes.c_size_t(0),
                             handle, ctypes.c_ulonglong(0))
            if rc:
                cu.cuMemRelease(handle)
                return handles, rc
            handles.append(handle.value)
        return handles, cu.cuMemSetAccess(ctypes.c_uint64(base.value), ctypes.c_size_t(size),
                                          ctypes.byref(access), ctypes.c_size_t(1))

    def sleep(handles: list[int]) -> int:
        rc = cu.cuMemUnmap(ctypes.c_uint64(base.value), ctypes.c_size_t(len(handles) * piece))
        for handle in handles:
            rc = rc or cu.cuMemRelease(ctypes.c_ulonglong(handle))
        return rc

    for round_ in range(rounds):
        handles, rc = wake()
        step("awake", round=round_, rc=rc, bytes=size, meminfo=meminfo())
        rc = sleep(handles)
        double = cu.cuMemRelease(ctypes.c_ulonglong(handles[-1])) if handles else None
        step("asleep", round=round_, rc=rc, double_release=double, meminfo=meminfo())


def main() -> None:
    way, mib = sys.argv[1], int(sys.argv[2])
    if way == "torch-ipc":
        torch_ipc(mib)
    elif way == "cupy-ipc":
        cupy_ipc(mib)
    elif way == "nccl":
        nccl(mib)
    elif way == "sleep-wake":
        sleep_wake(mib, int(sys.argv[3]))
    else:
        sys.exit(f"framework_share.py: unknown way {way!r}; expected torch-ipc, cupy-ipc, nccl or sleep-wake")


if __name__ == "__main__":
    main()

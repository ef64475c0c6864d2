"""Driver calls that cuda-bindings does not make the way a C program would: the
32-bit (v1) entry points, NULL outputs, calls before cuInit, the context stack,
fork and threads. Through ctypes, one scenario per run; each prints what the
calls returned as JSON, results as CUresult names (from cuda-bindings' enum, so
that the names do not come from the driver under test).

    python cuda_ctypes.py SCENARIO"""

import ctypes as C
import json
import os
import sys
import threading

from cuda.bindings.driver import CUresult

GiB, MiB = 1 << 30, 1 << 20
cu = C.CDLL("libcuda.so.1")


def name(rc: int) -> str:
    try:
        return CUresult(rc).name
    except ValueError:
        return str(rc)


def context() -> C.c_void_p:
    ctx = C.c_void_p()
    for rc in (cu.cuInit(0), cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), cu.cuCtxSetCurrent(ctx)):
        if rc:
            raise SystemExit(f"cuda_ctypes: setting up a context: {name(rc)}")
    return ctx


def free_bytes() -> int:
    free = C.c_size_t()
    rc = cu.cuMemGetInfo_v2(C.byref(free), None)
    if rc:
        raise SystemExit(f"cuda_ctypes: cuMemGetInfo_v2: {name(rc)}")
    return free.value


def before_init():
    count, version = C.c_int(-1), C.c_int(-1)
    return {"cuDeviceGetCount": name(cu.cuDeviceGetCount(C.byref(count))),
            "cuDriverGetVersion": name(cu.cuDriverGetVersion(C.byref(version))),
            "version": version.value}


def without_context():
    ptr, free, total = C.c_uint64(), C.c_size_t(), C.c_size_t()
    return {"cuInit": name(cu.cuInit(0)),
            "cuMemAlloc_v2": name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(1))),
            "cuMemGetInfo_v2": name(cu.cuMemGetInfo_v2(C.byref(free), C.byref(total)))}


def meminfo_outputs():
    context()
    free, total = C.c_size_t(), C.c_size_t()
    free32, total32 = C.c_uint(), C.c_uint()
    return {"total_only": [name(cu.cuMemGetInfo_v2(None, C.byref(total))), total.value],
            "free_only": [name(cu.cuMemGetInfo_v2(C.byref(free), None)), free.value],
            "neither": name(cu.cuMemGetInfo_v2(None, None)),
            "v1": [name(cu.cuMemGetInfo(C.byref(free32), C.byref(total32))),
                   free32.value, total32.value],
            "v1_total_mem": [name(cu.cuDeviceTotalMem(C.byref(total32), 0)), total32.value]}


def alloc_edges():
    context()
    ptr = C.c_uint64()
    out = {"alloc_zero": name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(0))),
           "free_null": name(cu.cuMemFree_v2(C.c_uint64(0))),
           "alloc": name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(4096)))}
    out["free_interior"] = name(cu.cuMemFree_v2(C.c_uint64(ptr.value + 8)))
    out["free_unknown"] = name(cu.cuMemFree_v2(C.c_uint64(0x1234000)))
    out["memset32_unaligned"] = name(cu.cuMemsetD32_v2(C.c_uint64(ptr.value + 1), 0, C.c_size_t(1)))
    # cuMemcpy takes host or device addresses on either side (unified addressing).
    src = C.create_string_buffer(b"unified " * 8, 64)
    dst = C.create_string_buffer(64)
    out["memcpy_to_device"] = name(cu.cuMemcpy(ptr, C.c_uint64(C.addressof(src)), C.c_size_t(64)))
    out["memcpy_to_host"] = name(cu.cuMemcpy(C.c_uint64(C.addressof(dst)), ptr, C.c_size_t(64)))
    out["memcpy_data"] = [src.raw.hex(), dst.raw.hex()]
    out["free"] = name(cu.cuMemFree_v2(ptr))
    return out


def v1_calls():
    """The 32-bit entry points of CUDA 2.x: pointers and sizes are 32 bits."""
    context()
    ptr = C.c_uint()
    out = {"alloc": name(cu.cuMemAlloc(C.byref(ptr), C.c_uint(MiB)))}
    out["ptr"] = ptr.value
    src = C.create_string_buffer(b"simgpu v1 " * 10, 100)
    dst = C.create_string_buffer(100)
    out["htod"] = name(cu.cuMemcpyHtoD(ptr, src, C.c_uint(100)))
    out["dtoh"] = name(cu.cuMemcpyDtoH(dst, ptr, C.c_uint(100)))
    out["data"] = [src.raw.hex(), dst.raw.hex()]
    pitched, pitch = C.c_uint(), C.c_uint()
    out["pitch_alloc"] = name(cu.cuMemAllocPitch(C.byref(pitched), C.byref(pitch), 100, 3, 16))
    out["pitch"] = pitch.value
    out["free"] = [name(cu.cuMemFree(pitched)), name(cu.cuMemFree(ptr))]
    return out


def created_context():
    """A created context is pushed, popped, carries its device; destroying it
    frees its memory and makes it unusable."""
    primary = context()
    created, popped, current = C.c_void_p(), C.c_void_p(), C.c_void_p()
    ptr, dev = C.c_uint64(), C.c_int(-1)
    out = {"create": name(cu.cuCtxCreate_v2(C.byref(created), 0, 0))}
    before = free_bytes()
    out["alloc"] = name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(GiB)))
    out["taken"] = before - free_bytes()
    out["pop"] = name(cu.cuCtxPopCurrent_v2(C.byref(popped)))
    out["popped_is_created"] = popped.value == created.value
    cu.cuCtxGetCurrent(C.byref(current))
    out["current_after_pop_is_primary"] = current.value == primary.value
    out["push"] = name(cu.cuCtxPushCurrent_v2(created))
    out["get_device"] = [name(cu.cuCtxGetDevice_v2(C.byref(dev), created)), dev.value]
    out["destroy"] = name(cu.cuCtxDestroy_v2(created))
    out["given_back"] = free_bytes() - (before - GiB)
    cu.cuCtxGetCurrent(C.byref(current))
    out["current_after_destroy_is_primary"] = current.value == primary.value
    out["push_destroyed"] = name(cu.cuCtxPushCurrent_v2(created))
    out["destroy_primary"] = name(cu.cuCtxDestroy_v2(primary))
    return out


def primary_context():
    """The primary context's state and flags; releasing it ends it and frees its memory."""
    context()
    flags, active, ptr = C.c_uint(), C.c_int(-1), C.c_uint64()
    free, total = C.c_size_t(), C.c_size_t()
    out = {"get_state": name(cu.cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active)))}
    out["active"] = active.value
    out["set_flags_v1_while_active"] = name(cu.cuDevicePrimaryCtxSetFlags(0, 4))
    out["set_flags_v2"] = name(cu.cuDevicePrimaryCtxSetFlags_v2(0, 4))
    out["set_unknown_flags"] = name(cu.cuDevicePrimaryCtxSetFlags_v2(0, 0x100))
    out["alloc"] = name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(GiB)))
    out["release"] = name(cu.cuDevicePrimaryCtxRelease_v2(0))
    out["alloc_after_release"] = name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(1)))
    out["release_again"] = name(cu.cuDevicePrimaryCtxRelease_v2(0))
    context()
    out["meminfo"] = name(cu.cuMemGetInfo_v2(C.byref(free), C.byref(total)))
    out["free_total"] = [free.value, total.value]
    return out


def forked_child():
    """A child of fork starts uninitialised and holds none of its parent's memory."""
    context()
    ptr = C.c_uint64()
    out = {"parent_alloc": name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(GiB)))}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        count, ctx, mine = C.c_int(), C.c_void_p(), C.c_uint64()
        seen = {"count": name(cu.cuDeviceGetCount(C.byref(count))),
                "init": name(cu.cuInit(0)),
                "free_parents": name(cu.cuMemFree_v2(ptr)),
                "retain": name(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0)),
                "set": name(cu.cuCtxSetCurrent(ctx)),
                "alloc": name(cu.cuMemAlloc_v2(C.byref(mine), C.c_size_t(MiB)))}
        os.write(write_end, json.dumps(seen).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        out["child"] = json.loads(pipe.read() or "null")
    out["child_exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out["parent_free"] = name(cu.cuMemFree_v2(ptr))
    return out


def new_thread():
    """The context stack is per thread: a new thread has none until it sets one."""
    primary = context()
    seen = {}

    def worker():
        ptr = C.c_uint64()
        seen["alloc_before_set"] = name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(4096)))
        seen["set"] = name(cu.cuCtxSetCurrent(primary))
        seen["alloc"] = name(cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(4096)))
        seen["free"] = name(cu.cuMemFree_v2(ptr))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    return seen


def launches():
    context()
    module, fn, again = C.c_void_p(), C.c_void_p(), C.c_void_p()
    out = {"load": name(cu.cuModuleLoadData(C.byref(module), b"\x7fELF whatever")),
           "get": name(cu.cuModuleGetFunction(C.byref(fn), module, b"k")),
           "get_again": name(cu.cuModuleGetFunction(C.byref(again), module, b"k"))}
    out["same_function"] = fn.value == again.value
    out["null_function"] = name(cu.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None))
    out["block_too_big"] = name(cu.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, None, None, None))
    out["ptsz"] = name(cu.cuLaunchKernel_ptsz(fn, 1, 1, 1, 32, 32, 1, 0, None, None, None))
    out["load_missing_file"] = name(cu.cuModuleLoad(C.byref(module), b"/nonexistent/file.cubin"))
    return out


def error_names():
    text = C.c_char_p()
    out = {"known": [name(cu.cuGetErrorName(709, C.byref(text))), text.value.decode()]}
    text = C.c_char_p(b"untouched")
    out["unknown"] = [name(cu.cuGetErrorName(12345, C.byref(text))), text.value]
    return out


SCENARIOS = {f.__name__: f for f in (before_init, without_context, meminfo_outputs, alloc_edges,
                                     v1_calls, created_context, primary_context, forked_child,
                                     new_thread, launches, error_names)}
print(json.dumps(SCENARIOS[sys.argv[1]]()), flush=True)

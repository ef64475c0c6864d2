"""A cuda-bindings client that runs a script of steps and reports, after
each, what it returned and what the driver then lists for this process
(NVML's per-process figure, nvidia-ml-py) and what cuMemGetInfo says: for
tests of the memory the driver takes on its own after the context (module
code, local memory), as JSON lines.

    python driver_memory.py STEP...

Steps:
    alloc:BYTES       cuMemAlloc (the pointer is kept)
    alloc!:BYTES      the same; refused, the steps after it are skipped up to a hold
    load:CODE         cuModuleLoadData of an image declaring CODE bytes of code
                      ("//simgpu code=CODE", as simgpu/modules.c reads it);
                      "load:-" loads an image that declares nothing
    library:CODE      cuLibraryLoadData of such an image
    launch:NAME       cuModuleGetFunction(NAME) of the last module (or library)
                      and one cuLaunchKernel of it, 1 block of 1 thread
    local:NAME        cuFuncGetAttribute(LOCAL_SIZE_BYTES) of NAME in the last module
    unload            cuModuleUnload (or cuLibraryUnload) of the last one
    release           cuDevicePrimaryCtxRelease, then retain again (a fresh context)
    hold:PATH         prints its line, then waits until PATH exists (holding everything)

Each line: {"step": STEP, "result": CUDA_... or a number, "nvml": BYTES or
null, "free": cuMemGetInfo's free}."""

import json
import os
import sys
import time

import pynvml
from cuda.bindings import driver as cu


def name(err) -> str:
    return cu.cuGetErrorName(err)[1].decode()


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver_memory: {name(err)}")
    return values[0] if len(values) == 1 else values


pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)


def listed():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None


ok(cu.cuInit(0))
device = ok(cu.cuDeviceGet(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
held, modules = [], []
skipping = False
for step in sys.argv[1:]:
    verb, _, arg = step.partition(":")
    if skipping and verb != "hold":
        continue
    if verb in ("alloc", "alloc!"):
        err, ptr = cu.cuMemAlloc(int(arg))
        held.append(ptr)
        result = name(err)
        skipping = verb == "alloc!" and err != cu.CUresult.CUDA_SUCCESS
    elif verb in ("load", "library"):
        image = b"\0" if arg == "-" else f"//simgpu code={arg}\n".encode()
        if verb == "load":
            err, mod = cu.cuModuleLoadData(image)
        else:
            err, lib = cu.cuLibraryLoadData(image, None, None, 0, None, None, 0)
            mod = lib
        if err == cu.CUresult.CUDA_SUCCESS:
            modules.append(mod)
        result = name(err)
    elif verb in ("launch", "local"):
        mod = modules[-1]
        if isinstance(mod, cu.CUlibrary):
            kernel = ok(cu.cuLibraryGetKernel(mod, arg.encode()))
            func = cu.CUfunction(int(kernel))
        else:
            func = ok(cu.cuModuleGetFunction(mod, arg.encode()))
        if verb == "launch":
            result = name(cu.cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, 0, None, 0)[0])
            ok(cu.cuCtxSynchronize())
        else:
            attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
            result = ok(cu.cuFuncGetAttribute(attribute, func))
    elif verb == "unload":
        mod = modules.pop()
        unload = cu.cuLibraryUnload if isinstance(mod, cu.CUlibrary) else cu.cuModuleUnload
        result = name(unload(mod)[0])
    elif verb == "release":
        held, modules = [], []
        result = name(cu.cuDevicePrimaryCtxRelease(device)[0])
        ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
    elif verb == "hold":
        print(json.dumps({"step": step, "pid": os.getpid()}), flush=True)
        while not os.path.exists(arg):
            time.sleep(0.01)
        continue
    else:
        raise SystemExit(f"driver_memory: unknown step {step!r}")
    free, _ = ok(cu.cuMemGetInfo())
    print(json.dumps({"step": step, "result": result, "nvml": listed(), "free": int(free)}), flush=True)

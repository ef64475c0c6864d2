"""A cuda-bindings client (cuda.bindings.driver) that walks through what a CUDA
program does: init, device queries, primary context, memory, copies, memset,
pitch allocation, a module and a launch, free, error names. It prints what it
saw as JSON and writes the bytes it copied back from the device to files.

    python cuda_end_to_end.py DATA_FILE OUT_DIR

DATA_FILE's bytes are copied host -> device, device -> device to the far end of
the allocation, and back from both places to OUT_DIR/near.bin and OUT_DIR/far.bin.
A call that must succeed for the walk to go on exits non-zero naming itself;
calls whose failure is the point are reported by their error name."""

import json
import sys
from pathlib import Path

from cuda.bindings import driver as cu

MiB = 1 << 20
ALLOC_BYTES = 256 * MiB


def ok(what, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuda_end_to_end: {what}: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def error(result):
    """The error name of a call whose failure is being checked."""
    return (result[0] if isinstance(result, tuple) else result).name


def main():
    data = Path(sys.argv[1]).read_bytes()
    out_dir = Path(sys.argv[2])
    report = {}

    ok("cuInit", cu.cuInit(0))
    report["driver_version"] = ok("cuDriverGetVersion", cu.cuDriverGetVersion())
    report["count"] = ok("cuDeviceGetCount", cu.cuDeviceGetCount())
    dev = ok("cuDeviceGet", cu.cuDeviceGet(0))
    report["name"] = ok("cuDeviceGetName", cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    report["uuid"] = bytes(ok("cuDeviceGetUuid", cu.cuDeviceGetUuid(dev)).bytes).hex()
    report["total_mem"] = int(ok("cuDeviceTotalMem", cu.cuDeviceTotalMem(dev)))
    attr = cu.CUdevice_attribute
    report["cc_major"] = ok("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    report["alloc_without_context"] = error(cu.cuMemAlloc(MiB))

    ctx = ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
    ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    report["context_device"] = int(ok("cuCtxGetDevice", cu.cuCtxGetDevice()))
    ok("cuCtxSynchronize", cu.cuCtxSynchronize())
    free0, total = (int(v) for v in ok("cuMemGetInfo", cu.cuMemGetInfo()))
    report["meminfo_total"] = total

    dptr = ok("cuMemAlloc", cu.cuMemAlloc(ALLOC_BYTES))
    free1 = int(ok("cuMemGetInfo", cu.cuMemGetInfo())[0])
    report["alloc_bytes"], report["alloc_taken"] = ALLOC_BYTES, free0 - free1

    far = int(dptr) + ALLOC_BYTES - len(data)
    ok("cuMemcpyHtoD", cu.cuMemcpyHtoD(dptr, data, len(data)))
    ok("cuMemcpyDtoD", cu.cuMemcpyDtoD(far, dptr, len(data)))
    for name, src in (("near.bin", dptr), ("far.bin", far)):
        back = bytearray(len(data))
        ok("cuMemcpyDtoH", cu.cuMemcpyDtoH(back, src, len(data)))
        (out_dir / name).write_bytes(back)
    report["copy_past_end"] = error(cu.cuMemcpyHtoD(int(dptr) + ALLOC_BYTES - 10, data, 11))

    ok("cuMemsetD8", cu.cuMemsetD8(dptr, 0xAB, 16))
    ok("cuMemsetD32", cu.cuMemsetD32(int(dptr) + 16, 0x01020304, 4))
    head = bytearray(32)
    ok("cuMemcpyDtoH", cu.cuMemcpyDtoH(head, dptr, len(head)))
    report["memset_head"] = bytes(head).hex()

    pptr, pitch = ok("cuMemAllocPitch", cu.cuMemAllocPitch(1000, 10, 4))
    free2 = int(ok("cuMemGetInfo", cu.cuMemGetInfo())[0])
    report["pitch"], report["pitch_taken"] = int(pitch), free1 - free2
    report["pitch_bad_element_size"] = error(cu.cuMemAllocPitch(1000, 10, 3))

    module = ok("cuModuleLoadData", cu.cuModuleLoadData(b"anything at all"))
    fn = ok("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"my_kernel"))
    ok("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0))
    report["launch_empty_grid"] = error(cu.cuLaunchKernel(fn, 0, 1, 1, 128, 1, 1, 0, 0, 0, 0))
    stream = ok("cuStreamCreate", cu.cuStreamCreate(0))
    ok("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0))
    ok("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    ok("cuStreamDestroy", cu.cuStreamDestroy(stream))
    ok("cuModuleUnload", cu.cuModuleUnload(module))

    ok("cuMemFree", cu.cuMemFree(dptr))
    ok("cuMemFree", cu.cuMemFree(pptr))
    report["double_free"] = error(cu.cuMemFree(dptr))
    report["free_at_start"] = free0
    report["free_at_end"] = int(ok("cuMemGetInfo", cu.cuMemGetInfo())[0])
    report["alloc_more_than_device"] = error(cu.cuMemAlloc(total + 1))

    oom = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    report["oom_name"] = ok("cuGetErrorName", cu.cuGetErrorName(oom)).decode()
    report["oom_string"] = ok("cuGetErrorString", cu.cuGetErrorString(oom)).decode()

    # Context handles, as integers: the created one is pushed, and popped by its destruction.
    created = ok("cuCtxCreate", cu.cuCtxCreate(None, 0, dev))
    report["primary"], report["created"] = int(ctx), int(created)
    report["current_after_create"] = int(ok("cuCtxGetCurrent", cu.cuCtxGetCurrent()))
    ok("cuCtxDestroy", cu.cuCtxDestroy(created))
    report["current_after_destroy"] = int(ok("cuCtxGetCurrent", cu.cuCtxGetCurrent()))
    ok("cuDevicePrimaryCtxRelease", cu.cuDevicePrimaryCtxRelease(dev))
    print(json.dumps(report), flush=True)


main()

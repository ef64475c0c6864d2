"""A cuda-bindings client of page-locked host memory: allocates it
(cuMemHostAlloc, cuMemAllocHost), registers memory of its own
(cuMemHostRegister), asks for device pointers and flags, copies through it,
and prints as JSON the error names of the calls whose outcome is the point,
the pointers' relations, and cuMemGetInfo's free bytes before and after.

    python host_memory.py"""

import ctypes
import json

from cuda.bindings import driver as cu

MiB = 1 << 20
GiB = 1 << 30


def ok(result):
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err.name)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def name(result) -> str:
    return (result[0] if isinstance(result, tuple) else result).name


def free_bytes() -> int:
    return int(ok(cu.cuMemGetInfo())[0])


report = {}
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
flags = cu.CU_MEMHOSTALLOC_PORTABLE | cu.CU_MEMHOSTALLOC_DEVICEMAP

before = free_bytes()
big = ok(cu.cuMemHostAlloc(2 * GiB, flags))
report["free_unchanged_by_2GiB"] = free_bytes() == before
ok(cu.cuMemFreeHost(big))

pinned = ok(cu.cuMemHostAlloc(4 * MiB, flags))
report["flags"] = int(ok(cu.cuMemHostGetFlags(pinned)))
report["device_pointer_is_host_pointer"] = int(ok(cu.cuMemHostGetDevicePointer(pinned + 8, 0))) == pinned + 8
report["bad_flags"] = name(cu.cuMemHostAlloc(MiB, 0x10))

# Memory of its own, registered.
buffer = ctypes.create_string_buffer(2 * MiB)
address = ctypes.addressof(buffer)
report["register"] = name(cu.cuMemHostRegister(address, 2 * MiB, cu.CU_MEMHOSTREGISTER_DEVICEMAP))
report["register_again"] = name(cu.cuMemHostRegister(address + 64, 64, 0))
report["registered_device_pointer_is_host_pointer"] = (
    int(ok(cu.cuMemHostGetDevicePointer(address, 0))) == address)
report["registered_flags"] = name(cu.cuMemHostGetFlags(address))
report["unregister"] = name(cu.cuMemHostUnregister(address))
report["unregister_again"] = name(cu.cuMemHostUnregister(address))
report["pageable_device_pointer"] = name(cu.cuMemHostGetDevicePointer(address, 0))

# Through pinned memory to the device and back.
stream = ok(cu.cuStreamCreate(0))
device = ok(cu.cuMemAlloc(4 * MiB))
back = ok(cu.cuMemAllocHost(4 * MiB))
data = bytes(range(256)) * (4 * MiB // 256)
ctypes.memmove(pinned, data, len(data))
ok(cu.cuMemcpyHtoDAsync(device, pinned, 4 * MiB, stream))
ok(cu.cuMemcpyDtoHAsync(back, device, 4 * MiB, stream))
ok(cu.cuStreamSynchronize(stream))
report["round_trip"] = ctypes.string_at(back, 4 * MiB) == data
report["free_host"] = [name(cu.cuMemFreeHost(p)) for p in (pinned, back)]
report["free_twice"] = name(cu.cuMemFreeHost(pinned))
ok(cu.cuMemFree(device))
print(json.dumps(report))

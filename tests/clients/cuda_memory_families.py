"""A cuda-bindings client that exercises one family of device allocations and
prints, as JSON, what it saw: error names of the calls whose outcome is the
point, and after each step the device memory in use as cuMemGetInfo and NVML
(nvidia-ml-py, this process's usedGpuMemory) report it, less what they
reported before the first allocation.

    python cuda_memory_families.py FAMILY
    python cuda_memory_families.py all --hold FILE

FAMILY is managed, async, pool, vmm, arrays or graph. With --hold, the client instead
makes one 64 MiB allocation of every family, prints {"held": memory in use}
and waits until FILE exists (for kill -9 tests). A call that must succeed for the
walk to go on raises, naming its error."""

import ctypes
import json
import os
import sys
import time

import pynvml
from cuda.bindings import driver as cu

MiB = 1 << 20
GiB = 1 << 30


def ok(result):
    """The values of a call that must succeed; the traceback names the one that did not."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err.name)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def error(result):
    """The error name of a call whose outcome is being checked."""
    return (result[0] if isinstance(result, tuple) else result).name


class Usage:
    """Device memory in use since the first look, as the driver and NVML see it."""

    def __init__(self):
        pynvml.nvmlInit()
        self.nvml_device = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.base = self.now()

    def now(self):
        free, total = ok(cu.cuMemGetInfo())
        mine = [
            p.usedGpuMemory
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self.nvml_device)
            if p.pid == os.getpid()
        ]
        return int(total) - int(free), sum(mine)

    def __call__(self):
        (used, nvml), (used0, nvml0) = self.now(), self.base
        return {"used": used - used0, "nvml": nvml - nvml0}


def copy_round_trip(dptr, data):
    """Writes `data` at dptr and reads it back: True when the bytes survive."""
    ok(cu.cuMemcpyHtoD(dptr, data, len(data)))
    back = bytearray(len(data))
    ok(cu.cuMemcpyDtoH(back, dptr, len(data)))
    return bytes(back) == data


def managed(usage, report):
    flags = cu.CUmemAttach_flags
    report["bad_flags"] = error(cu.cuMemAllocManaged(MiB, 0x10))
    size = 100 * MiB + 1
    ptr = ok(cu.cuMemAllocManaged(size, flags.CU_MEM_ATTACH_GLOBAL.value))
    report["allocated"] = usage()
    report["round_trip"] = copy_round_trip(ptr, os.urandom(4096))
    # The host reaches managed memory at the same address.
    ctypes.memmove(int(ptr) + size - 5, b"hello", 5)
    back = bytearray(5)
    ok(cu.cuMemcpyDtoH(back, int(ptr) + size - 5, 5))
    report["host_write_seen"] = bytes(back) == b"hello"
    report["too_much"] = error(cu.cuMemAllocManaged(GiB, flags.CU_MEM_ATTACH_HOST.value))
    ok(cu.cuMemFree(ptr))
    report["freed"] = usage()


def pool_attrs(pool):
    attr = cu.CUmemPool_attribute
    names = ["RESERVED_MEM_CURRENT", "RESERVED_MEM_HIGH", "USED_MEM_CURRENT", "USED_MEM_HIGH"]
    return {
        name.lower(): int(
            ok(cu.cuMemPoolGetAttribute(pool, getattr(attr, f"CU_MEMPOOL_ATTR_{name}")))
        )
        for name in names
    }


def async_default_pool(usage, report, dev):
    """cuMemAllocAsync / cuMemFreeAsync on the device's default pool."""
    stream = ok(cu.cuStreamCreate(0))
    pool = ok(cu.cuDeviceGetDefaultMemPool(dev))
    report["current_is_default"] = int(ok(cu.cuDeviceGetMemPool(dev))) == int(pool)
    a = ok(cu.cuMemAllocAsync(MiB, stream))
    report["one_mib"] = usage() | pool_attrs(pool)
    b = ok(cu.cuMemAllocAsync(MiB, stream))
    report["two_mib"] = usage() | pool_attrs(pool)
    c = ok(cu.cuMemAllocAsync(3 * MiB, stream))
    report["five_mib"] = usage() | pool_attrs(pool)
    report["round_trip"] = copy_round_trip(c, os.urandom(3 * MiB))
    report["copy_past_end"] = error(cu.cuMemcpyHtoD(c, bytes(3 * MiB + 1), 3 * MiB + 1))
    for ptr in (a, b, c):
        ok(cu.cuMemFreeAsync(ptr, stream))
    ok(cu.cuStreamSynchronize(stream))
    report["all_freed"] = usage() | pool_attrs(pool)
    report["double_free"] = error(cu.cuMemFreeAsync(a, stream))
    ok(cu.cuMemPoolTrimTo(pool, 3 * MiB))
    report["trimmed_to_3"] = usage() | pool_attrs(pool)
    ok(cu.cuMemPoolTrimTo(pool, 0))
    report["trimmed_to_0"] = usage() | pool_attrs(pool)

    # Fill the device through the pool; what it keeps reserved stays taken.
    halves = [ok(cu.cuMemAllocAsync(512 * MiB, stream)) for _ in range(2)]
    report["full"] = usage()
    report["async_when_full"] = error(cu.cuMemAllocAsync(MiB, stream))
    ok(cu.cuMemFree(halves.pop()))  # cuMemFree takes a pool's pointer too
    report["alloc_while_reserved"] = error(cu.cuMemAlloc(MiB))
    ok(cu.cuMemPoolTrimTo(pool, 0))
    report["half_trimmed"] = usage()
    plain = ok(cu.cuMemAlloc(MiB))
    ok(cu.cuMemFreeAsync(plain, stream))  # and cuMemFreeAsync cuMemAlloc's
    ok(cu.cuMemFreeAsync(halves.pop(), stream))
    ok(cu.cuMemPoolTrimTo(pool, 0))
    report["end"] = usage()
    report["destroy_default"] = error(cu.cuMemPoolDestroy(pool))


def explicit_pool(usage, report, dev):
    """cuMemPoolCreate with a maximum size, the device's current pool, attributes, destroy."""
    attr = cu.CUmemPool_attribute
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    props.maxSize = 64 * MiB
    pool = ok(cu.cuMemPoolCreate(props))
    report["created"] = usage()
    stream = ok(cu.cuStreamCreate(0))
    first = ok(cu.cuMemAllocFromPoolAsync(40 * MiB, pool, stream))
    report["first"] = usage() | pool_attrs(pool)
    report["past_max_size"] = error(cu.cuMemAllocFromPoolAsync(30 * MiB, pool, stream))

    ok(cu.cuDeviceSetMemPool(dev, pool))
    report["current_is_pool"] = int(ok(cu.cuDeviceGetMemPool(dev))) == int(pool)
    second = ok(cu.cuMemAllocAsync(10 * MiB, stream))  # from `pool` now
    report["second"] = usage() | pool_attrs(pool)

    threshold = cu.cuuint64_t(32 * MiB)
    ok(cu.cuMemPoolSetAttribute(pool, attr.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold))
    report["threshold"] = int(
        ok(cu.cuMemPoolGetAttribute(pool, attr.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD))
    )
    report["set_high_nonzero"] = error(
        cu.cuMemPoolSetAttribute(pool, attr.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, cu.cuuint64_t(1))
    )
    report["set_current"] = error(
        cu.cuMemPoolSetAttribute(pool, attr.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, cu.cuuint64_t(0))
    )
    ok(cu.cuMemFreeAsync(second, stream))
    ok(cu.cuMemPoolSetAttribute(pool, attr.CU_MEMPOOL_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)))
    report["high_reset"] = pool_attrs(pool)

    # Destroyed with an allocation live: unused chunks go at once, the rest at its free.
    ok(cu.cuMemPoolDestroy(pool))
    report["destroyed"] = usage()
    report["current_is_default_again"] = int(ok(cu.cuDeviceGetMemPool(dev))) == int(
        ok(cu.cuDeviceGetDefaultMemPool(dev))
    )
    report["attr_after_destroy"] = error(
        cu.cuMemPoolGetAttribute(pool, attr.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    )
    ok(cu.cuMemFreeAsync(first, stream))
    report["last_freed"] = usage()

    props.maxSize = 0
    props.location.id = 7
    report["bad_device"] = error(cu.cuMemPoolCreate(props))


def vmm_prop():
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    return prop


def set_access(ptr, size, flags):
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = flags
    return cu.cuMemSetAccess(ptr, size, [desc], 1)


def vmm(usage, report):
    prop = vmm_prop()
    option = cu.CUmemAllocationGranularity_flags
    report["granularity"] = [
        int(ok(cu.cuMemGetAllocationGranularity(prop, o)))
        for o in (
            option.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            option.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    ]
    report["unaligned_size"] = error(cu.cuMemCreate(3 * MiB, prop, 0))
    handle = ok(cu.cuMemCreate(4 * MiB, prop, 0))
    report["created"] = usage()
    got = ok(cu.cuMemGetAllocationPropertiesFromHandle(handle))
    report["props"] = [got.type.name, got.location.type.name, got.location.id]

    ptr = int(ok(cu.cuMemAddressReserve(8 * MiB, 0, 0, 0)))
    report["reserved"] = usage()
    report["reservation_aligned"] = ptr % (2 * MiB) == 0
    ok(cu.cuMemMap(ptr, 4 * MiB, 0, handle, 0))
    report["copy_before_access"] = error(cu.cuMemcpyHtoD(ptr, b"x", 1))
    access = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(set_access(ptr, 4 * MiB, access))
    data = os.urandom(4 * MiB)
    report["round_trip"] = copy_round_trip(ptr, data)
    # The same allocation mapped again, right after: the same bytes, and one range.
    ok(cu.cuMemMap(ptr + 4 * MiB, 4 * MiB, 0, handle, 0))
    ok(set_access(ptr + 4 * MiB, 4 * MiB, access))
    both = bytearray(8 * MiB)
    ok(cu.cuMemcpyDtoH(both, ptr, 8 * MiB))
    report["aliased"] = bytes(both) == data + data
    report["mapped_twice"] = usage()
    report["free_a_mapping"] = error(cu.cuMemFree(ptr))
    report["unmap_part"] = error(cu.cuMemUnmap(ptr, 2 * MiB))
    report["address_free_while_mapped"] = error(cu.cuMemAddressFree(ptr, 8 * MiB))

    # The memory comes back once released and unmapped, in either order.
    ok(cu.cuMemRelease(handle))
    report["released"] = usage()
    report["release_again"] = error(cu.cuMemRelease(handle))
    ok(cu.cuMemUnmap(ptr, 4 * MiB))
    report["one_unmapped"] = usage()
    ok(cu.cuMemUnmap(ptr + 4 * MiB, 4 * MiB))
    report["unmapped"] = usage()
    report["copy_after_unmap"] = error(cu.cuMemcpyHtoD(ptr, b"x", 1))
    ok(cu.cuMemAddressFree(ptr, 8 * MiB))

    halves = [ok(cu.cuMemCreate(512 * MiB, prop, 0)) for _ in range(2)]
    report["full"] = usage()
    report["create_when_full"] = error(cu.cuMemCreate(2 * MiB, prop, 0))
    for h in halves:
        ok(cu.cuMemRelease(h))
    report["end"] = usage()


def array_desc(width, height, fmt, channels):
    desc = cu.CUDA_ARRAY_DESCRIPTOR()
    desc.Width, desc.Height, desc.Format, desc.NumChannels = width, height, fmt, channels
    return desc


def array3d_desc(width, height, depth, fmt, channels, flags=0):
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = width, height, depth
    desc.Format, desc.NumChannels, desc.Flags = fmt, channels, flags
    return desc


def arrays(usage, report, dev):
    fmt = cu.CUarray_format
    flat = ok(cu.cuArrayCreate(array_desc(1000, 1000, fmt.CU_AD_FORMAT_FLOAT, 4)))
    report["2d"] = usage()
    got = ok(cu.cuArrayGetDescriptor(flat))
    report["2d_descriptor"] = [got.Width, got.Height, got.Format.name, got.NumChannels]
    report["2d_requirements"] = error(cu.cuArrayGetMemoryRequirements(flat, dev))
    ok(cu.cuArrayDestroy(flat))
    report["2d_destroyed"] = usage()
    report["destroy_again"] = error(cu.cuArrayDestroy(flat))

    line = ok(cu.cuArrayCreate(array_desc(100, 0, fmt.CU_AD_FORMAT_UNSIGNED_INT8, 1)))
    report["1d"] = usage()
    ok(cu.cuArrayDestroy(line))

    cube = ok(cu.cuArray3DCreate(array3d_desc(256, 256, 256, fmt.CU_AD_FORMAT_UNSIGNED_INT8, 1)))
    report["3d"] = usage()
    got = ok(cu.cuArray3DGetDescriptor(cube))
    report["3d_descriptor"] = [got.Width, got.Height, got.Depth, got.Flags]
    ok(cu.cuArrayDestroy(cube))

    deferred = cu.CUDA_ARRAY3D_DEFERRED_MAPPING
    lazy = ok(cu.cuArray3DCreate(array3d_desc(1000, 1000, 0, fmt.CU_AD_FORMAT_FLOAT, 4, deferred)))
    report["deferred"] = usage()
    req = ok(cu.cuArrayGetMemoryRequirements(lazy, dev))
    report["deferred_requirements"] = [req.size, req.alignment]
    ok(cu.cuArrayDestroy(lazy))

    report["bad_cubemap"] = error(
        cu.cuArray3DCreate(
            array3d_desc(64, 32, 6, fmt.CU_AD_FORMAT_FLOAT, 1, cu.CUDA_ARRAY3D_CUBEMAP)
        )
    )
    report["three_channels"] = error(
        cu.cuArrayCreate(array_desc(64, 64, fmt.CU_AD_FORMAT_FLOAT, 3))
    )
    report["too_big"] = error(cu.cuArrayCreate(array_desc(16384, 16384, fmt.CU_AD_FORMAT_FLOAT, 4)))

    mip_desc = array3d_desc(1024, 1024, 0, fmt.CU_AD_FORMAT_FLOAT, 1)
    report["too_many_levels"] = error(cu.cuMipmappedArrayCreate(mip_desc, 12))
    mip = ok(cu.cuMipmappedArrayCreate(mip_desc, 11))
    report["mipmapped"] = usage()
    levels = []
    for level in (0, 10):
        got = ok(cu.cuArray3DGetDescriptor(ok(cu.cuMipmappedArrayGetLevel(mip, level))))
        levels.append([got.Width, got.Height])
    report["levels"] = levels
    report["level_past_end"] = error(cu.cuMipmappedArrayGetLevel(mip, 11))
    report["mipmapped_requirements"] = error(cu.cuMipmappedArrayGetMemoryRequirements(mip, dev))
    ok(cu.cuMipmappedArrayDestroy(mip))
    report["mipmapped_destroyed"] = usage()

    # A context's arrays go with it.
    ctx = ok(cu.cuCtxCreate(None, 0, dev))
    ok(cu.cuArrayCreate(array_desc(1000, 1000, fmt.CU_AD_FORMAT_FLOAT, 4)))
    report["in_context"] = usage()
    ok(cu.cuCtxDestroy(ctx))
    report["context_destroyed"] = usage()


def graph_attr(name):
    return getattr(cu.CUgraphMem_attribute, f"CU_GRAPH_MEM_ATTR_{name}")


def graph_attrs(dev):
    names = ["RESERVED_MEM_CURRENT", "RESERVED_MEM_HIGH", "USED_MEM_CURRENT", "USED_MEM_HIGH"]
    return {
        name.lower(): int(ok(cu.cuDeviceGetGraphMemAttribute(dev, graph_attr(name))))
        for name in names
    }


def graph_with_alloc(size, free=False):
    """A graph with an alloc node of `size` bytes on device 0 (and a free node
    of it after, if `free`): the graph, the alloc node and its address."""
    graph = ok(cu.cuGraphCreate(0))
    params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    params.bytesize = size
    node = ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params))
    if free:
        ok(cu.cuGraphAddMemFreeNode(graph, [node], 1, params.dptr))
    return graph, node, int(params.dptr)


def graph_memory(usage, report, dev):
    """Alloc and free nodes, and the device's graph memory pool."""
    stream = ok(cu.cuStreamCreate(0))
    graph, node, address = graph_with_alloc(3 * MiB, free=True)
    got = ok(cu.cuGraphMemAllocNodeGetParams(node))
    report["address_fixed"] = address != 0 and (int(got.dptr), int(got.bytesize)) == (
        address,
        3 * MiB,
    )
    report["created"] = usage() | graph_attrs(dev)  # nothing is taken before a launch
    executable = ok(cu.cuGraphInstantiate(graph, 0))
    ok(cu.cuGraphLaunch(executable, stream))
    report["launched"] = usage() | graph_attrs(dev)
    ok(cu.cuGraphLaunch(executable, stream))
    report["relaunched"] = usage() | graph_attrs(dev)

    graph, _, address = graph_with_alloc(3 * MiB)
    executable = ok(cu.cuGraphInstantiate(graph, 0))
    ok(cu.cuGraphLaunch(executable, stream))
    report["kept"] = usage() | graph_attrs(dev)  # from the pool's reserve
    report["round_trip"] = copy_round_trip(address, os.urandom(3 * MiB))
    report["relaunch_while_live"] = error(cu.cuGraphLaunch(executable, stream))
    ok(cu.cuMemFree(address))  # cuMemFree takes a graph's allocation
    report["freed"] = usage() | graph_attrs(dev)
    report["double_free"] = error(cu.cuMemFree(address))
    plain = ok(cu.cuMemAlloc(MiB))
    report["free_node_of_other"] = error(cu.cuGraphAddMemFreeNode(graph, None, 0, plain))
    ok(cu.cuMemFree(plain))

    graph, _, _ = graph_with_alloc(GiB + 1)  # more than the device has, with the pool's reserve
    report["too_much"] = error(cu.cuGraphLaunch(ok(cu.cuGraphInstantiate(graph, 0)), stream))
    ok(cu.cuDeviceGraphMemTrim(dev))
    report["trimmed"] = usage() | graph_attrs(dev)
    report["set_high_nonzero"] = error(
        cu.cuDeviceSetGraphMemAttribute(dev, graph_attr("RESERVED_MEM_HIGH"), cu.cuuint64_t(1))
    )
    for name in ("RESERVED_MEM_HIGH", "USED_MEM_HIGH"):
        ok(cu.cuDeviceSetGraphMemAttribute(dev, graph_attr(name), cu.cuuint64_t(0)))
    report["high_reset"] = graph_attrs(dev)


def hold(usage, until):
    """One 64 MiB allocation of every family, kept until `until` exists."""
    fmt = cu.CUarray_format
    ok(cu.cuMemAllocManaged(64 * MiB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    ok(cu.cuMemAllocAsync(64 * MiB, 0))
    handle = ok(cu.cuMemCreate(64 * MiB, vmm_prop(), 0))
    ptr = ok(cu.cuMemAddressReserve(64 * MiB, 0, 0, 0))
    ok(cu.cuMemMap(ptr, 64 * MiB, 0, handle, 0))
    ok(cu.cuArrayCreate(array_desc(8192, 2048, fmt.CU_AD_FORMAT_FLOAT, 1)))  # 64 MiB
    print(json.dumps({"held": usage()}), flush=True)
    while not os.path.exists(until):
        time.sleep(0.01)


def main():
    family = sys.argv[1]
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    usage = Usage()
    if len(sys.argv) == 4 and sys.argv[2] == "--hold":
        hold(usage, sys.argv[3])
        return
    report = {}
    if family == "managed":
        managed(usage, report)
    elif family == "async":
        async_default_pool(usage, report, dev)
    elif family == "pool":
        explicit_pool(usage, report, dev)
    elif family == "vmm":
        vmm(usage, report)
    elif family == "arrays":
        arrays(usage, report, dev)
    elif family == "graph":
        graph_memory(usage, report, dev)
    else:
        raise SystemExit(f"cuda_memory_families: unknown family {family!r}")
    print(json.dumps(report))


main()

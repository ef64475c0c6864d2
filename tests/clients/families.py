"""Allocates device memory through one allocation family until the driver
(or the cap) refuses, gives it back, and prints what the device looked like
at each step as JSON.

    python families.py FAMILY BLOCK_BYTES COUNT [DEVICE]

FAMILY: plain (cuMemAlloc), managed, async, pool, vmm, array, mipmap, graph,
on the device of ordinal DEVICE (default 0).  Memory is reported
as cuMemGetInfo's free bytes ("free") after: "filled" (all allocations made),
"freed" (freed or released, still held by a pool or a mapping), "returned"
(trimmed, destroyed or unmapped).  For graph, each allocation is a launch of
its own graph with one alloc node; first ("repeated", "reused") a graph that
allocates and frees a block is launched three times."""

import json
import sys

from cuda.bindings import driver as cu


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"families: {cu.cuGetErrorName(err)[1].decode()}")
    return values[0] if len(values) == 1 else values


def name(err):
    return cu.cuGetErrorName(err)[1].decode()


def free_bytes():
    return int(ok(cu.cuMemGetInfo())[0])


def device_prop(ordinal):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    return prop


def driver_size(desc, levels):
    """What the driver says an array of this shape needs: it answers only for
    arrays made with deferred mapping, which take no memory."""
    probe = array_desc(0, like=desc)
    probe.Flags = cu.CUDA_ARRAY3D_DEFERRED_MAPPING
    if levels:
        handle = ok(cu.cuMipmappedArrayCreate(probe, levels))
        size = ok(cu.cuMipmappedArrayGetMemoryRequirements(handle, 0)).size
        ok(cu.cuMipmappedArrayDestroy(handle))
    else:
        handle = ok(cu.cuArray3DCreate(probe))
        size = ok(cu.cuArrayGetMemoryRequirements(handle, 0)).size
        ok(cu.cuArrayDestroy(handle))
    return int(size)


def graph_alloc(graph, block, ordinal, deps=()):
    """Adds an alloc node of `block` bytes on device `ordinal`; returns it and its address."""
    params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = ordinal
    params.bytesize = block
    node = ok(cu.cuGraphAddMemAllocNode(graph, list(deps), len(deps), params))
    return node, params.dptr


def graph_exec(block, ordinal, free=False):
    """A graph allocating `block` bytes on device `ordinal` (and freeing them,
    if `free`), instantiated: the executable and the address."""
    graph = ok(cu.cuGraphCreate(0))
    node, address = graph_alloc(graph, block, ordinal)
    if free:
        ok(cu.cuGraphAddMemFreeNode(graph, [node], 1, address))
    return ok(cu.cuGraphInstantiate(graph, 0)), address


def array_desc(block, like=None):
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width = 4096
    desc.Height = like.Height if like is not None else block // (4096 * 16)
    desc.Depth = 0
    desc.Format = cu.CUarray_format.CU_AD_FORMAT_FLOAT
    desc.NumChannels = 4
    desc.Flags = 0
    return desc


def main():
    family, block, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ordinal = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    ok(cu.cuInit(0))
    device = ok(cu.cuDeviceGet(ordinal))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
    stream = cu.CUstream(0)
    report = {"family": family, "start": free_bytes(), "results": []}
    held = []
    pool = None
    if family == "async":
        pool = ok(cu.cuDeviceGetMemPool(device))
    elif family == "pool":
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = ordinal
        pool = ok(cu.cuMemPoolCreate(props))
    elif family == "graph":
        executable, _ = graph_exec(block, ordinal, free=True)
        report["repeated"] = [name(cu.cuGraphLaunch(executable, stream)[0]) for _ in range(3)]
        ok(cu.cuStreamSynchronize(stream))
        report["reused"] = free_bytes()  # the pool keeps the block for the next launch

    for _ in range(count):
        if family == "plain":
            err, handle = cu.cuMemAlloc(block)
        elif family == "managed":
            err, handle = cu.cuMemAllocManaged(block, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
        elif family == "async":
            err, handle = cu.cuMemAllocAsync(block, stream)
        elif family == "pool":
            err, handle = cu.cuMemAllocFromPoolAsync(block, pool, stream)
        elif family == "vmm":
            err, handle = cu.cuMemCreate(block, device_prop(ordinal), 0)
        elif family == "graph":
            executable, handle = graph_exec(block, ordinal)
            (err,) = cu.cuGraphLaunch(executable, stream)
        elif family in ("array", "mipmap"):
            levels = 3 if family == "mipmap" else 0
            desc = array_desc(block)
            before = free_bytes()
            if levels:
                err, handle = cu.cuMipmappedArrayCreate(desc, levels)
            else:
                err, handle = cu.cuArray3DCreate(desc)
            if "size" not in report:
                report["size"] = driver_size(desc, levels)
                report["drop"] = before - free_bytes()
        else:
            raise SystemExit(f"families: unknown family {family}")
        report["results"].append(name(err))
        if err == cu.CUresult.CUDA_SUCCESS:
            held.append(handle)
    report["filled"] = free_bytes()

    mapping = None
    for handle in held:
        if family in ("plain", "managed"):
            ok(cu.cuMemFree(handle))
        elif family in ("async", "pool", "graph"):
            ok(cu.cuMemFreeAsync(handle, stream))
        elif family == "vmm":
            if mapping is None:  # keep one mapped past its release
                address = ok(cu.cuMemAddressReserve(block, 0, 0, 0))
                ok(cu.cuMemMap(address, block, 0, handle, 0))
                mapping = address
            ok(cu.cuMemRelease(handle))
        elif family == "array":
            ok(cu.cuArrayDestroy(handle))
        elif family == "mipmap":
            ok(cu.cuMipmappedArrayDestroy(handle))
    ok(cu.cuStreamSynchronize(stream))
    report["freed"] = free_bytes()

    if family in ("async", "pool"):
        ok(cu.cuMemPoolTrimTo(pool, 0))
    if family == "pool":
        ok(cu.cuMemPoolDestroy(pool))
    if family == "graph":
        ok(cu.cuDeviceGraphMemTrim(device))
    if mapping is not None:
        ok(cu.cuMemUnmap(mapping, block))
        ok(cu.cuMemAddressFree(mapping, block))
    report["returned"] = free_bytes()
    print(json.dumps(report))


main()

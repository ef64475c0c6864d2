"""What a monitoring tool and a CUDA program see of each device's board:
through NVML (nvidia-ml-py) its name, PCI identity, compute capability,
memory (v1 and v2) and process-utilisation size query; through cuda-bindings
its name, memory, SMs, compute capability, PCI address and, with a primary
context made, cuMemGetInfo. JSON on stdout.

    python board.py"""

import ctypes
import json

import pynvml
from cuda.bindings import driver as cu


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"board: {err.name}")
    return values[0] if len(values) == 1 else values


pynvml.nvmlInit()
nvml = []
utilization = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = pynvml.nvmlDeviceGetPciInfo_v3(handle)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    samples = ctypes.c_uint(0)
    utilization(handle, None, ctypes.byref(samples), ctypes.c_ulonglong(0))
    bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
    nvml.append({
        "name": pynvml.nvmlDeviceGetName(handle),
        "bus_id": bus_id,
        "index_by_bus_id": pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)),
        "pci": [pci.domain, pci.bus, pci.device, pci.pciDeviceId, pci.pciSubSystemId],
        "cc": list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
        "v1": {"total": v1.total, "free": v1.free, "used": v1.used},
        "v2": {"total": v2.total, "reserved": v2.reserved, "free": v2.free, "used": v2.used},
        "process_samples": samples.value,
    })
pynvml.nvmlShutdown()

A = cu.CUdevice_attribute
ok(cu.cuInit(0))
cuda = []
for index in range(ok(cu.cuDeviceGetCount())):
    dev = ok(cu.cuDeviceGet(index))

    def attribute(name, dev=dev):
        return ok(cu.cuDeviceGetAttribute(getattr(A, name), dev))

    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    free, total = ok(cu.cuMemGetInfo())
    cuda.append({
        "name": ok(cu.cuDeviceGetName(96, dev)).split(b"\0")[0].decode(),
        "total": int(ok(cu.cuDeviceTotalMem(dev))),
        "meminfo": [int(free), int(total)],
        "sms": attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        "cc": [attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
               attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")],
        "bus_id": ok(cu.cuDeviceGetPCIBusId(32, dev)).split(b"\0")[0].decode(),
        "pci": [attribute("CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID"), attribute("CU_DEVICE_ATTRIBUTE_PCI_BUS_ID"),
                attribute("CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID")],
    })
    ok(cu.cuCtxSetCurrent(None))
    ok(cu.cuDevicePrimaryCtxRelease(dev))
print(json.dumps({"nvml": nvml, "cuda": cuda}))

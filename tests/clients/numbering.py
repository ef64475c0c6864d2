"""How a CUDA program and a monitoring tool number the devices, as JSON: CUDA's
ordinals (cuda-bindings) with each one's UUID, bus id and SM count, and
NVML's indices (nvidia-ml-py) with their UUIDs.  With --peers, also what the
peer-access calls answer between the first two devices, and which device
cuCtxGetDevice names for a context made on each.

    python numbering.py [--peers]"""

import json
import sys

import pynvml
from cuda.bindings import driver as cu


def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"numbering: {err.name}")
    return values[0] if len(values) == 1 else values


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def peers():
    a, b = ok(cu.cuDeviceGet(0)), ok(cu.cuDeviceGet(1))
    seen = {"can_access": [ok(cu.cuDeviceCanAccessPeer(a, b)), ok(cu.cuDeviceCanAccessPeer(a, a))]}
    ctx_a = ok(cu.cuCtxCreate(None, 0, a))
    ctx_b = ok(cu.cuCtxCreate(None, 0, b))
    seen["ctx_device"] = [int(ok(cu.cuCtxGetDevice())), None]  # ctx_b is current
    ok(cu.cuCtxSetCurrent(ctx_a))
    seen["ctx_device"][1] = int(ok(cu.cuCtxGetDevice()))
    seen["enable"] = [cu.cuCtxEnablePeerAccess(ctx_b, 0)[0].name, cu.cuCtxEnablePeerAccess(ctx_b, 0)[0].name,
                      cu.cuCtxEnablePeerAccess(ctx_a, 0)[0].name, cu.cuCtxEnablePeerAccess(ctx_b, 1)[0].name]
    seen["disable"] = [cu.cuCtxDisablePeerAccess(ctx_b)[0].name, cu.cuCtxDisablePeerAccess(ctx_b)[0].name]
    return seen


pynvml.nvmlInit()
out = {"nvml": [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]}
err, = cu.cuInit(0)
out["init"] = err.name
if err == cu.CUresult.CUDA_SUCCESS:
    out["cuda"] = []
    for i in range(ok(cu.cuDeviceGetCount())):
        d = ok(cu.cuDeviceGet(i))
        out["cuda"].append({
            "uuid": uuid_text(bytes(ok(cu.cuDeviceGetUuid(d)).bytes)),
            "bus": ok(cu.cuDeviceGetPCIBusId(32, d)).split(b"\0")[0].decode(),
            "sms": ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d)),
        })
    if "--peers" in sys.argv:
        out["peers"] = peers()
print(json.dumps(out))

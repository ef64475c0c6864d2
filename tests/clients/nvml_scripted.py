"""Calls NVML functions of simgpu's libnvidia-ml.so.1 by name, through ctypes
and nothing else, for tests of SIMGPU_NVML_ANSWER; prints JSON.

    python nvml_scripted.py untouched FUNCTION...
        calls each FUNCTION once, before nvmlInit, with five arguments that each
        point to a buffer of canary bytes: {FUNCTION: [return code, whether
        every buffer is as it was]}
    python nvml_scripted.py count FUNCTION...
        calls each function with a count out-argument (the process lists, the
        process utilisation, the detail list) twice, its count set to 5 and its
        buffers NULL: {FUNCTION: [[return code, count], [return code, count]]}"""

import ctypes
import json
import sys

lib = ctypes.CDLL("libnvidia-ml.so.1")
CANARY = b"\xa5" * 256


def untouched(name: str) -> list:
    buffers = [ctypes.create_string_buffer(CANARY, len(CANARY)) for _ in range(5)]
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    rc = fn(*buffers)
    return [rc, all(b.raw == CANARY for b in buffers)]


class DetailList(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("numProcArrayEntries", ctypes.c_uint),
                ("procArray", ctypes.c_void_p)]


def count_once(name: str) -> list:
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    n = ctypes.c_uint(5)
    if name == "nvmlDeviceGetRunningProcessDetailList":
        plist = DetailList(version=ctypes.sizeof(DetailList) | 1 << 24, numProcArrayEntries=5)
        rc = fn(None, ctypes.byref(plist))
        return [rc, plist.numProcArrayEntries]
    if name == "nvmlDeviceGetProcessUtilization":
        rc = fn(None, None, ctypes.byref(n), ctypes.c_ulonglong(0))
    else:
        rc = fn(None, ctypes.byref(n), None)
    return [rc, n.value]


def count(name: str) -> list:
    return [count_once(name), count_once(name)]


mode, names = sys.argv[1], sys.argv[2:]
print(json.dumps({name: (untouched if mode == "untouched" else count)(name) for name in names}))

"""Asks libcuda.so.1 for entry points the way the CUDA runtime and cuda-bindings
do, through cuGetProcAddress_v2 (and the 4-argument cuGetProcAddress), with
ctypes: no client library exposes the raw call. It never calls cuInit.

    python procaddr.py < QUERY.json

QUERY: {"v2": [[name, cuda_version, flags], ...], "v1": [[name, cuda_version, flags], ...],
        "sweep": [name, ...], "symbols": [exported symbol, ...]}  (every key optional)
Prints, as JSON:
  "v2": [{"rc", "status", "pfn", "symbol"}, ...]  one per query, in order
  "v1": [{"rc", "pfn", "symbol"}, ...]
  "sweep": {name: [symbol, ...]}  every entry point handed out for name at any CUDA
           version from 1.0 to 13.9, with flags 0 and PER_THREAD_DEFAULT_STREAM
  "symbols": {symbol: address}  dlsym's answer for each
where pfn is the address written (null for NULL; it starts at a sentinel, so an
untouched output shows) and symbol the exported name at exactly that address (dladdr)."""

import ctypes
import json
import sys

SENTINEL = 0xDEAD
PER_THREAD = 2

lib = ctypes.CDLL("libcuda.so.1")
get_v2 = lib.cuGetProcAddress_v2
get_v2.restype = ctypes.c_int
get_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
get_v1 = lib.cuGetProcAddress
get_v1.restype = ctypes.c_int
get_v1.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64]


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


try:
    dladdr = ctypes.CDLL(None).dladdr
except AttributeError:  # glibc before 2.34 keeps it in libdl
    dladdr = ctypes.CDLL("libdl.so.2").dladdr
dladdr.restype = ctypes.c_int
dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]


def symbol_at(address):
    info = DlInfo()
    if not address or not dladdr(address, ctypes.byref(info)) or info.dli_saddr != address:
        return None
    return info.dli_sname.decode()


def ask_v2(name, version, flags):
    pfn, status = ctypes.c_void_p(SENTINEL), ctypes.c_int(-1)
    rc = get_v2(name.encode(), ctypes.byref(pfn), version, flags, ctypes.byref(status))
    return {"rc": rc, "status": status.value, "pfn": pfn.value, "symbol": symbol_at(pfn.value)}


def ask_v1(name, version, flags):
    pfn = ctypes.c_void_p(SENTINEL)
    rc = get_v1(name.encode(), ctypes.byref(pfn), version, flags)
    return {"rc": rc, "pfn": pfn.value, "symbol": symbol_at(pfn.value)}


def sweep(name):
    found = set()
    for version in range(1000, 14000, 10):
        for flags in (0, PER_THREAD):
            pfn, status = ctypes.c_void_p(), ctypes.c_int()
            if get_v2(name.encode(), ctypes.byref(pfn), version, flags, ctypes.byref(status)) == 0:
                found.add(pfn.value)
    return sorted(symbol_at(address) or hex(address) for address in found)


query = json.load(sys.stdin)
print(json.dumps({
    "v2": [ask_v2(*q) for q in query.get("v2", [])],
    "v1": [ask_v1(*q) for q in query.get("v1", [])],
    "sweep": {name: sweep(name) for name in query.get("sweep", [])},
    "symbols": {s: ctypes.cast(getattr(lib, s), ctypes.c_void_p).value
                for s in query.get("symbols", [])},
}))

"""The CUDA process of `vgpulimit verify`: it reaches the driver as an
application does (ctypes: dlopen + dlsym of libcuda.so.1 and
libnvidia-ml.so.1, the path the shim must catch), records what the driver
and NVML show it, and writes those facts as JSON -- before each step too,
with the step's name, so that a probe that crashes leaves how far it got.
It judges nothing: vgpulimit.verify compares the facts with the limits.

    python -m vgpulimit.verify_probe --report FILE [--device I] [--quick]
                                     [--costs-only --alloc-room BYTES | --nvml-processes
                                      | --no-alloc]

It never holds more than the cap: it allocates what is free under the cap,
then one block more, which a working shim refuses, and frees everything.
Without the shim it allocates nothing bigger than one small block at a time.
With --no-alloc it allocates nothing at all: it makes the context (which the
region counts), reads the views and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

# The core through cffi (the shim's own UUID formatter), never the preload library.
from vgpulimit.limits import format_uuid

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_READY = 600
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13     # kHz
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_MEMORY_V2 = 40 | 2 << 24           # sizeof(nvmlMemory_v2_t) | version 2 << 24

SHIM_NAME = "libvgpulimit.so"
SPIN_KERNEL = b"vgpulimit_spin"
SPIN_MS = 1.0                # a spin kernel's intended length on a real GPU
CALIBRATION_AHEAD = 8        # kernels queued before a calibration span, so it starts busy
SHARE_WARMUP_S = 0.4         # drains the budget a quiet container saved (at most 100 ms of GPU)
SHARE_WINDOW_S = 2.0
IN_FLIGHT = 4                # kernels queued at once while measuring the share
COST_BLOCK = 1 << 20         # the allocation whose cost is measured
MiB = 1 << 20


class DriverError(RuntimeError):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class Cuda:
    """The driver calls the probe makes, each by its exported name."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def name(self, code: int) -> str:
        out = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(out)) == CUDA_SUCCESS and out.value:
            return out.value.decode()
        return f"CUresult {code}"

    def call(self, fn: str, *args) -> int:
        """Calls ``fn``; DriverError on anything but success."""
        code = getattr(self.lib, fn)(*args)
        if code != CUDA_SUCCESS:
            raise DriverError(fn, code, self.name(code))
        return code

    def try_call(self, fn: str, *args) -> int:
        return getattr(self.lib, fn)(*args)


class Progress:
    """The facts found so far, written to the report before each step with
    the step's name (``reached``): a probe killed in a step -- a driver, or
    the shim, crashing it -- leaves what it found and how far it got, for
    verify to say.  The report is replaced whole, never seen half written."""

    def __init__(self, report: str | os.PathLike | None = None) -> None:
        self.report = None if report is None else Path(report)
        self.facts: dict = {}

    def reach(self, step: str) -> None:
        self.facts["reached"] = step
        self.write()

    def write(self) -> None:
        if self.report is None:
            return
        partial = self.report.with_name(self.report.name + ".tmp")
        partial.write_text(json.dumps(self.facts))
        os.replace(partial, self.report)

    def done(self, facts: dict) -> None:
        """The whole report: every step finished (or failed with an error)."""
        facts.pop("reached", None)
        self.facts = facts
        self.write()


def _mapped(fragment: str) -> str | None:
    """The path of the first object mapped into this process whose name holds ``fragment``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)   # the sixth, the path, only for a file
                if len(fields) == 6 and fragment in os.path.basename(fields[5].strip()):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def _preload_entries(text: str) -> list[str]:
    return [entry for entry in text.replace(":", " ").split() if entry]


def shim_facts() -> dict:
    """Whether the shim is in this process, where from, and which way it came."""
    path = _mapped(SHIM_NAME)
    via = []
    if any(os.path.basename(e) == SHIM_NAME for e in _preload_entries(os.environ.get("LD_PRELOAD", ""))):
        via.append("LD_PRELOAD")
    try:
        system = Path("/etc/ld.so.preload").read_text()
    except OSError:
        system = ""
    if any(os.path.basename(e) == SHIM_NAME for e in _preload_entries(system)):
        via.append("/etc/ld.so.preload")
    return {"loaded": path is not None, "path": path, "via": via}


def host_pids() -> list[int]:
    """This process's pid and, where /proc shows it, its pid in the host's namespace."""
    pids = [os.getpid()]
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                pids += [int(p) for p in line.split()[1:2]]
    except OSError:
        pass
    return sorted(set(pids))


# -- NVML --------------------------------------------------------------------------------------


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _ProcessInfo(ctypes.Structure):   # nvmlProcessInfo_v2_t, as the _v3 list returns
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Nvml:
    """libnvidia-ml through ctypes, where a function the library lacks (a
    driver before R450 has no MIG calls; minimal or vendor NVMLs lack others)
    answers NVML_ERROR_FUNCTION_NOT_FOUND, as nvidia-ml-py reads it, instead
    of raising AttributeError."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library

    def __getattr__(self, name: str):
        try:
            return getattr(self._library, name)
        except AttributeError:
            return lambda *args: NVML_ERROR_FUNCTION_NOT_FOUND


def unanswered(function: str, rc: int) -> str:
    """What the facts say of a call that did not succeed: "NVML has no F"
    (verify.MISSING) where the library lacks it, else the code it returned."""
    return f"NVML has no {function}" if rc == NVML_ERROR_FUNCTION_NOT_FOUND else f"{function} returned {rc}"


def nvml_processes(nvml, handle) -> list[dict] | str:
    """The device's compute processes, or the error that stopped the list."""
    count = ctypes.c_uint(0)
    rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
    if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
        return unanswered("nvmlDeviceGetComputeRunningProcesses_v3", rc)
    for _ in range(4):   # the list may grow between the two calls
        infos = (_ProcessInfo * (count.value + 4))()
        count = ctypes.c_uint(len(infos))
        rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
        if rc == NVML_SUCCESS:
            return [{"pid": infos[i].pid, "used_bytes": infos[i].usedGpuMemory}
                    for i in range(count.value)]
        if rc != NVML_ERROR_INSUFFICIENT_SIZE:
            break
    return unanswered("nvmlDeviceGetComputeRunningProcesses_v3", rc)


def open_nvml(uuid: str | None, index: int, library: str = "libnvidia-ml.so.1"):
    """(library, device handle) or (None, why)."""
    try:
        nvml = _Nvml(ctypes.CDLL(library))
    except OSError as exc:
        return None, f"{library} cannot be loaded ({exc})"
    if (rc := nvml.nvmlInit_v2()) != NVML_SUCCESS:
        return None, f"nvmlInit_v2 returned {rc}"
    handle = ctypes.c_void_p()
    rc = (nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) if uuid
          else nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)))
    if rc != NVML_SUCCESS and uuid:   # CUDA's 16 bytes do not say GPU- or MIG-
        rc = nvml.nvmlDeviceGetHandleByUUID(mig_uuid(uuid).encode(), ctypes.byref(handle))
    if rc != NVML_SUCCESS:
        return None, f"NVML has no handle for {uuid or f'device {index}'} ({rc})"
    return nvml, handle


def mig_uuid(uuid: str) -> str:
    """The MIG device's UUID of the same 16 bytes: "MIG-..." for "GPU-..."."""
    return "MIG-" + uuid[4:]


def nvml_facts(uuid: str | None, index: int, progress: Progress, when: str,
               facts: dict) -> dict:
    """What NVML shows of the device, into ``facts`` as it is found (a part
    of the progress' facts); each call is a step of ``progress``."""
    def reach(call: str) -> None:
        progress.reach(f"{call} (NVML's view, {when})")

    reach("nvmlInit_v2")
    nvml, handle = open_nvml(uuid, index)
    if nvml is None:
        facts.update({"available": False, "error": handle})
        return facts
    facts["available"] = True
    is_mig = ctypes.c_uint(0)
    facts["mig"] = nvml.nvmlDeviceIsMigDeviceHandle(handle, ctypes.byref(is_mig)) == NVML_SUCCESS \
        and bool(is_mig.value)
    reach("nvmlDeviceGetMemoryInfo")
    v1 = _Memory()
    rc = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(v1))
    facts["memory_v1"] = ({"total": v1.total, "free": v1.free, "used": v1.used}
                          if rc == NVML_SUCCESS else unanswered("nvmlDeviceGetMemoryInfo", rc))
    reach("nvmlDeviceGetMemoryInfo_v2")
    v2 = _MemoryV2(version=NVML_MEMORY_V2)
    rc = nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(v2))
    facts["memory_v2"] = ({"total": v2.total, "free": v2.free, "used": v2.used}
                          if rc == NVML_SUCCESS else unanswered("nvmlDeviceGetMemoryInfo_v2", rc))
    reach("nvmlDeviceGetComputeRunningProcesses_v3")
    facts["processes"] = nvml_processes(nvml, handle)
    reach("nvmlDeviceGetUtilizationRates")
    util = _Utilization()
    rc = nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util))
    facts["utilization_pct"] = util.gpu if rc == NVML_SUCCESS else None
    reach("nvmlShutdown")
    nvml.nvmlShutdown()
    return facts


# -- CUDA --------------------------------------------------------------------------------------


class Device:
    """One device's primary context, a stream and the spin kernel on it."""

    def __init__(self, cuda: Cuda, index: int, kernel: bool = True) -> None:
        self.cuda = cuda
        c = ctypes
        cuda.call("cuInit", 0)
        self.handle = c.c_int()
        cuda.call("cuDeviceGet", c.byref(self.handle), index)
        self.ctx = c.c_void_p()
        cuda.call("cuDevicePrimaryCtxRetain", c.byref(self.ctx), self.handle)
        cuda.call("cuCtxSetCurrent", self.ctx)
        self.stream = c.c_void_p()
        self.module = c.c_void_p()
        if not kernel:   # no stream, no module: nothing the driver would allocate for them
            return
        cuda.call("cuStreamCreate", c.byref(self.stream), CU_STREAM_NON_BLOCKING)
        ptx = resources.files("vgpulimit").joinpath("spin.ptx").read_bytes() + b"\0"
        cuda.call("cuModuleLoadData", c.byref(self.module), c.c_char_p(ptx))
        self.kernel = c.c_void_p()
        cuda.call("cuModuleGetFunction", c.byref(self.kernel), self.module, SPIN_KERNEL)
        khz = c.c_int()
        cuda.call("cuDeviceGetAttribute", c.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE, self.handle)
        self._cycles = c.c_uint64(int(khz.value * SPIN_MS))
        self._params = (c.c_void_p * 1)(c.cast(c.pointer(self._cycles), c.c_void_p))

    def facts(self) -> dict:
        c, cuda = ctypes, self.cuda
        version = c.c_int()
        cuda.call("cuDriverGetVersion", c.byref(version))
        name = c.create_string_buffer(256)
        cuda.call("cuDeviceGetName", name, len(name), self.handle)
        raw = (c.c_ubyte * 16)()
        # _v2: a MIG device's own UUID (the first call gives its GPU's).
        uuid = format_uuid(bytes(raw)) if cuda.try_call("cuDeviceGetUuid_v2", raw, self.handle) == 0 \
            else None
        total = c.c_size_t()
        cuda.call("cuDeviceTotalMem_v2", c.byref(total), self.handle)
        return {"driver_version": version.value, "name": name.value.decode(errors="replace"),
                "uuid": uuid, "libcuda": _mapped("libcuda.so"),
                "device_total_mem": total.value, "mem_get_info": self.meminfo()}

    def meminfo(self) -> dict:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.cuda.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return {"free": free.value, "total": total.value}

    def launch(self) -> None:
        self.cuda.call("cuLaunchKernel", self.kernel, 1, 1, 1, 32, 1, 1, 0, self.stream,
                       self._params, None)

    def event(self, timing: bool = True) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        self.cuda.call("cuEventCreate", ctypes.byref(ev), 0 if timing else CU_EVENT_DISABLE_TIMING)
        return ev

    def record(self, ev) -> None:
        self.cuda.call("cuEventRecord", ev, self.stream)

    def done(self, ev) -> bool:
        code = self.cuda.try_call("cuEventQuery", ev)
        if code not in (CUDA_SUCCESS, CUDA_ERROR_NOT_READY):
            raise DriverError("cuEventQuery", code, self.cuda.name(code))
        return code == CUDA_SUCCESS

    def elapsed_ms(self, start, end) -> float:
        ms = ctypes.c_float()
        self.cuda.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value

    def sync(self) -> None:
        self.cuda.call("cuStreamSynchronize", self.stream)

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """(CUresult, pointer) of one cuMemAlloc_v2."""
        ptr = ctypes.c_uint64()
        return self.cuda.try_call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes)), \
            ptr.value

    def free(self, ptr: int) -> None:
        self.cuda.call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def close(self) -> None:
        if self.module.value:
            self.cuda.try_call("cuModuleUnload", self.module)
        if self.stream.value:
            self.cuda.try_call("cuStreamDestroy_v2", self.stream)
        self.cuda.try_call("cuDevicePrimaryCtxRelease_v2", self.handle)


def fill(dev: Device, free_bytes: int, cap_bytes: int) -> dict:
    """Allocates what is free under the cap in chunks, then one chunk more
    (past the cap), and frees it all."""
    chunk = max(2 * MiB, (cap_bytes // 8) // (2 * MiB) * (2 * MiB))
    held: list[int] = []
    facts: dict = {"chunk_bytes": chunk, "free_before": free_bytes}
    try:
        while (len(held) + 1) * chunk <= free_bytes:
            code, ptr = dev.alloc(chunk)
            if code != CUDA_SUCCESS:
                facts["refused_early"] = dev.cuda.name(code)
                break
            held.append(ptr)
        facts["filled_bytes"] = len(held) * chunk
        if "refused_early" not in facts:
            facts["meminfo_full"] = dev.meminfo()
            code, ptr = dev.alloc(chunk)
            facts["past_cap"] = dev.cuda.name(code) if code != CUDA_SUCCESS else "CUDA_SUCCESS"
            if code == CUDA_SUCCESS:
                held.append(ptr)
    finally:
        for ptr in held:
            dev.free(ptr)
    facts["meminfo_after"] = dev.meminfo()
    return facts


def calibrate(dev: Device) -> float | None:
    """A spin kernel's own length on the GPU (ms), from events: the span
    between an event behind a queue of kernels and one after the next kernel,
    counted only when that queue was still running once the kernel was
    queued (so the span holds the kernel and nothing before it).  A pause
    before each try lets a compute budget refill, so the launches go through
    back to back."""
    start, end = dev.event(), dev.event()
    spans: list[float] = []
    pause = 0.02
    for _ in range(24):
        time.sleep(pause)
        for _ in range(CALIBRATION_AHEAD):
            dev.launch()
        dev.record(start)
        dev.launch()
        busy = not dev.done(start)
        dev.record(end)
        dev.sync()
        if busy:
            spans.append(dev.elapsed_ms(start, end))
            if len(spans) == 5:
                break
        else:
            pause = min(2 * pause, 1.0)
    for ev in (start, end):
        dev.cuda.try_call("cuEventDestroy_v2", ev)
    # The least span is the kernel's own; others include neighbours' time slices.
    return min(spans) if spans else None


def share(dev: Device) -> dict:
    """The share of the GPU's time this process's kernels got: kernels
    completed in a window, times their calibrated length, over the window's
    wall time.  The window starts after a warm-up that spends the budget a
    quiet container had saved."""
    kernel_ms = calibrate(dev)
    if kernel_ms is None:
        return {"error": "no event span held a kernel alone: the kernel's length is unknown"}
    events = [dev.event(timing=False) for _ in range(IN_FLIGHT)]
    pending: list = []
    launched = completed = 0
    begin = time.monotonic()
    marks: list[tuple[float, int]] = []
    edges = [begin + SHARE_WARMUP_S, begin + SHARE_WARMUP_S + SHARE_WINDOW_S]
    while len(marks) < 2:
        dev.launch()
        # An event is recorded again only once it has been seen complete (popped below).
        ev = events[launched % IN_FLIGHT]
        launched += 1
        dev.record(ev)
        pending.append(ev)
        while pending and (len(pending) == IN_FLIGHT or dev.done(pending[0])):
            if len(pending) == IN_FLIGHT:
                dev.cuda.call("cuEventSynchronize", pending[0])
            pending.pop(0)
            completed += 1
        now = time.monotonic()
        if now >= edges[len(marks)]:
            marks.append((now, completed))
    dev.sync()
    for ev in events:
        dev.cuda.try_call("cuEventDestroy_v2", ev)
    (t0, n0), (t1, n1) = marks
    return {"kernel_ms": kernel_ms, "window_s": t1 - t0, "kernels": n1 - n0,
            "achieved_pct": 100.0 * (n1 - n0) * kernel_ms / 1000.0 / (t1 - t0)}


def costs(dev: Device, alloc_room: int) -> dict:
    """What one launch and one allocation cost this process (ns, the median
    of calls timed one by one).  Launches go in short bursts after pauses,
    so that a compute budget has room for them and the figure is the
    launch's cost, not a wait for the share."""
    launch_ns: list[int] = []
    for _ in range(4):
        time.sleep(0.12)
        for _ in range(8):
            t = time.perf_counter_ns()
            dev.launch()
            launch_ns.append(time.perf_counter_ns() - t)
        dev.sync()
    facts: dict = {"launch_ns": sorted(launch_ns)[len(launch_ns) // 4]}
    if alloc_room >= 2 * COST_BLOCK:
        alloc_ns, free_ns = [], []
        for _ in range(64):
            t = time.perf_counter_ns()
            code, ptr = dev.alloc(COST_BLOCK)
            alloc_ns.append(time.perf_counter_ns() - t)
            if code != CUDA_SUCCESS:
                raise DriverError("cuMemAlloc_v2", code, dev.cuda.name(code))
            t = time.perf_counter_ns()
            dev.free(ptr)
            free_ns.append(time.perf_counter_ns() - t)
        facts["alloc_ns"] = int(statistics.median(alloc_ns))
        facts["free_ns"] = int(statistics.median(free_ns))
    return facts


def probe(index: int, quick: bool, costs_only: bool, alloc_room: int,
          progress: Progress | None = None, no_alloc: bool = False) -> dict:
    """The facts; each step is reached through ``progress`` first, and the
    facts found so far are written with it.  With ``no_alloc``, the views
    only: the context, the driver's and NVML's figures, the region -- no
    stream, module, fill, cost or share, so nothing counts against the cap
    beyond the context itself."""
    progress = progress or Progress()
    facts = progress.facts
    facts.update({"pids": host_pids(), "shim": shim_facts()})
    progress.reach("loading libcuda.so.1")
    try:
        cuda = Cuda()
    except OSError as exc:
        facts["error"] = f"libcuda.so.1 cannot be loaded ({exc})"
        return facts
    dev = None
    try:
        progress.reach("cuInit, the primary context and the spin kernel's module")
        dev = Device(cuda, index, kernel=not no_alloc)
        if costs_only:
            progress.reach("added cost (launches, allocations)")
            facts["costs"] = costs(dev, alloc_room)
            return facts
        progress.reach("the driver's figures (cuDeviceTotalMem, cuMemGetInfo)")
        facts["cuda"] = dev.facts()
        progress.reach("the region")
        facts["region"] = region = region_facts(index)   # after cuInit: the shim has attached
        facts["cap_bytes"] = cap = cap_bytes(region, index, facts["cuda"])
        nvml_facts(facts["cuda"]["uuid"], index, progress, "before the fill",
                   facts.setdefault("nvml_before", {}))
        if no_alloc:
            nvml_facts(facts["cuda"]["uuid"], index, progress, "with the context only",
                       facts.setdefault("nvml", {}))
            facts["meminfo_after"] = dev.meminfo()
            return facts
        if cap is not None and facts["shim"]["loaded"]:
            progress.reach("past the cap (filling the cap, then one block more)")
            facts["fill"] = fill(dev, facts["cuda"]["mem_get_info"]["free"], cap)
        progress.reach("added cost (launches, allocations)")
        facts["costs"] = costs(dev, facts["cuda"]["mem_get_info"]["free"])
        if not quick and region and region.get("cores_pct"):
            progress.reach("compute share")
            facts["share"] = share(dev)
        nvml_facts(facts["cuda"]["uuid"], index, progress, "after the fill",
                   facts.setdefault("nvml", {}))
    except DriverError as exc:
        facts["error"] = str(exc)
        if dev is None:
            # No context: what the region says is still known, and is what
            # verify needs to tell a cap too small for the context from none.
            facts["no_context"] = {"call": exc.call, "result": exc.name}
            if "region" not in facts:
                facts["region"] = region = region_facts(index)
                facts["cap_bytes"] = (region or {}).get("cap_bytes")
    finally:
        if dev is not None:
            progress.reach("releasing the context")
            dev.close()
    return facts


def cap_bytes(region: dict | None, index: int, cuda: dict) -> int | None:
    """The cap this process should meet: its region's, else that of the
    limit variables (the shim then keeps a region of its own, which we do
    not look for; a share of the device is taken at the size CUDA shows)."""
    from vgpulimit import environment

    if region:
        return region.get("cap_bytes")
    setting = environment.read(os.environ).memory.get(index)
    if setting is None:
        return None
    return setting.value.bytes or setting.value.cap_bytes(cuda["device_total_mem"])


def listed(index: int, progress: Progress | None = None) -> dict:
    """The pids NVML lists on the device now (to see that a probe has gone)."""
    (progress or Progress()).reach("nvmlDeviceGetComputeRunningProcesses_v3 (after the probe)")
    nvml, handle = open_nvml(None, index)
    if nvml is None:
        return {"error": handle}
    processes = nvml_processes(nvml, handle)
    nvml.nvmlShutdown()
    return {"error": processes} if isinstance(processes, str) else {"processes": processes}


def region_facts(index: int) -> dict | None:
    """The region the shim of this process counts in, as its file says now."""
    from vgpulimit.placement import enclosing_region
    from vgpulimit.region import RegionError, read_snapshot

    path = enclosing_region(os.environ)
    if path is None:
        return None
    try:
        snap = read_snapshot(path, all_devices=True)
    except RegionError as exc:
        return {"path": path, "error": str(exc)}
    dev = snap.devices[index]
    return {"path": path, "cap_bytes": dev.cap_bytes, "cores_pct": dev.cores_pct,
            "limit": dev.limit.describe() if dev.limit else None,
            # As written, before the shim clamps it to the device (cap_bytes).
            "limit_bytes": dev.limit.bytes if dev.limit else 0,
            "limit_ppm": dev.limit.ppm if dev.limit else 0,
            "total_bytes": dev.total_bytes, "used_bytes": dev.used_bytes,
            "pids": [p.pid for p in snap.processes]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpulimit.verify_probe")
    parser.add_argument("--report", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--costs-only", action="store_true")
    parser.add_argument("--alloc-room", type=int, default=0)
    parser.add_argument("--nvml-processes", action="store_true")
    parser.add_argument("--no-alloc", action="store_true")
    args = parser.parse_args(argv)
    progress = Progress(args.report)
    facts = listed(args.device, progress) if args.nvml_processes else \
        probe(args.device, args.quick, args.costs_only, args.alloc_room, progress,
              args.no_alloc)
    progress.done(facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())

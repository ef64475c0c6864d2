"""The driver, as the node sees it: NVML in this process, which has no shim."""

from __future__ import annotations

import ctypes
import statistics
import threading
import time

from vgpulimit import _paths


class DriverView:
    """NVML in this process, which has no shim: what the driver lists, what a
    capped process cannot touch.  On the simulated GPU, its NVML (loaded by
    path first, so that nvidia-ml-py's dlopen by soname finds it)."""

    def __init__(self, simulate: bool) -> None:
        self.nvml = None
        self.error = ""
        try:
            if simulate:
                ctypes.CDLL(str(_paths.simgpu_dir() / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
            import pynvml
        except (ImportError, OSError) as exc:
            self.error = f"NVML cannot be read here: {exc}"
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.nvml = pynvml
        except pynvml.NVMLError as exc:     # no driver: the rows that need it say so
            self.error = f"NVML cannot be read here: {exc}"

    def _call(self, fn: str, *args, default=None):
        if self.nvml is None:
            return default
        try:
            return getattr(self.nvml, fn)(*args)
        except (self.nvml.NVMLError, AttributeError, TypeError):
            return default

    def machine(self) -> dict:
        if self.nvml is None:
            return {"nvml": self.error}
        name = self._call("nvmlDeviceGetName", self.handle, default="?")
        memory = self._call("nvmlDeviceGetMemoryInfo", self.handle)
        cuda = self._call("nvmlSystemGetCudaDriverVersion_v2", default=None)
        return {"gpu": name if isinstance(name, str) else name.decode(),
                "memory_bytes": memory.total if memory else None,
                "driver": self._call("nvmlSystemGetDriverVersion", default="?"),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None}

    def process_bytes(self) -> dict[int, int]:
        """Host pid -> bytes, as the driver lists compute processes."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", self.handle, default=[]) or []
        return {p.pid: p.usedGpuMemory for p in procs if p.usedGpuMemory is not None}

    def memory(self) -> dict:
        """v1's used (the driver's reserve in it), v2's used and reserved."""
        out: dict = {}
        v1 = self._call("nvmlDeviceGetMemoryInfo", self.handle)
        if v1 is not None:
            out.update(total_bytes=v1.total, v1_used_bytes=v1.used)
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        v2 = self._call("nvmlDeviceGetMemoryInfo", self.handle, version) if version else None
        if v2 is not None:
            out.update(used_bytes=v2.used, reserved_bytes=v2.reserved)
        return out

    def power(self) -> tuple[float, int] | None:
        """(watts, SM clock MHz) now; None where NVML does not say."""
        mw = self._call("nvmlDeviceGetPowerUsage", self.handle)
        clock = self._call("nvmlDeviceGetClockInfo", self.handle, getattr(self.nvml, "NVML_CLOCK_SM", 1))
        return (mw / 1000, clock) if mw is not None and clock is not None else None


class PowerSampler:
    """Power and SM clock every 0.25 s while a program runs; the medians of
    the last `seconds` before stop() (the program's measured phase)."""

    def __init__(self, driver: DriverView) -> None:
        self.driver, self.samples = driver, []
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.running:
            got = self.driver.power()
            if got is not None:
                self.samples.append((time.monotonic(), *got))
            time.sleep(0.25)

    def stop(self, seconds: float) -> dict:
        self.running = False
        self.thread.join(2)
        end = time.monotonic()
        recent = [s for s in self.samples if s[0] >= end - seconds] or self.samples
        if not recent:
            return {}
        return {"watts": statistics.median(s[1] for s in recent),
                "sm_mhz": statistics.median(s[2] for s in recent)}

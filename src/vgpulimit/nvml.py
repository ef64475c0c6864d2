"""The views' one door to NVML (through nvidia-ml-py): every query the node
view makes goes through ``Nvml.query``, which answers a default instead of
raising when the driver's NVML cannot answer -- a function it lacks (pynvml
raises NVMLError_FunctionNotFound, or NVMLLibraryMismatchError from an
unversioned wrapper whose versioned function is missing), a function not
supported on the GPU or not permitted, any other NVML error -- and notes it,
once per function, for the views to say in one line.  nvitop's
``nvmlQuery(..., default=NA)`` does the same.

The views degrade; whoever must not (the hook's admission) checks what came
back unavailable and raises itself.  Reads only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from vgpulimit.errors import VgpulimitError

FUNCTION_NOT_FOUND = "Function Not Found"   # as pynvml words NVML_ERROR_FUNCTION_NOT_FOUND


class NvmlError(VgpulimitError, RuntimeError):
    """NVML cannot be loaded or answered at all; the message is one line."""


@dataclass(frozen=True)
class Unavailable:
    """A query NVML did not answer, as the views say it."""

    function: str     # the NVML function, as the driver's library names it
    answer: str       # what NVML answered, e.g. "Function Not Found"
    shown: str        # what the views show for it instead

    @property
    def line(self) -> str:
        """"NVML has no nvmlDeviceGetGraphicsRunningProcesses_v3: graphics processes n/a",
        "NVML nvmlDeviceGetUtilizationRates: Not Supported: utilisation n/a"."""
        if self.answer == FUNCTION_NOT_FOUND:
            return f"NVML has no {self.function}: {self.shown}"
        return f"NVML {self.function}: {self.answer}: {self.shown}"


class Nvml:
    """pynvml, initialised, with the queries that did not answer noted."""

    def __init__(self, pynvml) -> None:
        self.pynvml = pynvml
        self._unavailable: dict[str, Unavailable] = {}

    @property
    def unavailable(self) -> tuple[Unavailable, ...]:
        """Each function that did not answer, once, in the order first met."""
        return tuple(self._unavailable.values())

    def query(self, name: str, *args: Any, default: Any = None, shown: str = "n/a",
              function: str | None = None, note: bool = True, **kwargs: Any) -> Any:
        """pynvml's ``name`` called with the arguments; ``default`` when NVML
        does not answer, noted under ``function`` (the NVML function the
        wrapper calls; ``name`` by default) unless ``note`` is false."""
        function = function or name
        call: Callable | None = getattr(self.pynvml, name, None)
        if call is None:   # an nvidia-ml-py older than the function: as good as missing
            answer = FUNCTION_NOT_FOUND
        else:
            try:
                return call(*args, **kwargs)
            except self.pynvml.NVMLLibraryMismatchError:
                answer = FUNCTION_NOT_FOUND
            except self.pynvml.NVMLError as exc:
                answer = str(exc)
        if note:
            self.note(function, answer, shown)
        return default

    def note(self, function: str, answer: str, shown: str) -> None:
        self._unavailable.setdefault(function, Unavailable(function, answer, shown))

    def required(self, name: str, *args: Any, function: str | None = None) -> Any:
        """pynvml's ``name``, or NvmlError: for what there is no view without
        (the device count, a device's handle and UUID)."""
        call = getattr(self.pynvml, name, None)
        try:
            if call is None:
                raise self.pynvml.NVMLLibraryMismatchError(name)
            return call(*args)
        except self.pynvml.NVMLLibraryMismatchError:
            answer = FUNCTION_NOT_FOUND
        except self.pynvml.NVMLError as exc:
            answer = str(exc)
        raise NvmlError(f"NVML: {function or name}: {answer}")


@contextlib.contextmanager
def session() -> Iterator[Nvml]:
    """NVML, initialised for the block; NvmlError when it cannot be."""
    try:
        import pynvml
    except ImportError:
        raise NvmlError("nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlError(f"NVML: {exc} (is the NVIDIA driver loaded?)") from None
    try:
        yield Nvml(pynvml)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def use_simulated() -> None:
    """The views read the simulated GPU that ships with vgpulimit as the
    node's (``--simulate``), as ``run --simulate`` runs on it: its NVML is
    loaded first, so that pynvml's ``dlopen("libnvidia-ml.so.1")`` finds it
    by its soname instead of the driver's.  Nothing to set before the process
    starts (as LD_LIBRARY_PATH would be)."""
    import ctypes

    from vgpulimit._paths import simgpu_dir

    ctypes.CDLL(str(simgpu_dir() / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)


def device_count() -> int | None:
    """How many GPUs NVML shows this process; None when it cannot say."""
    try:
        with session() as nvml:
            return int(nvml.required("nvmlDeviceGetCount", function="nvmlDeviceGetCount_v2"))
    except NvmlError:
        return None


def text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

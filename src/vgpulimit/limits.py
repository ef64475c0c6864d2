"""The Python face of the one limit parser (shim/src/limits.c, through cffi).

Nothing here parses a limit: the shim reads the environment with the same C
code, so a value the CLI accepts is a value the shim accepts, with the same
meaning.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from vgpulimit._paths import core
from vgpulimit.errors import UsageError

ffi, lib = core()

_UINT64_MAX = 2**64 - 1
_PPM_PER_PERCENT = 10_000


class LimitError(UsageError):
    """A limit that the parser refused.  The message names where the text came
    from (a flag or a variable), the text, and the forms that are accepted."""

    def __init__(self, source: str, text: str, reason: str, forms: str, message: str | None = None) -> None:
        self.source = source
        self.text = text
        self.reason = reason
        self.forms = forms
        # One terminal line (160 columns): a long value is shown cut.
        shown = text if len(text) <= 16 else text[:15] + "…"
        super().__init__(message or f"{source}: {shown!r} is {reason}; accepted forms: {forms}")


def format_bytes(count: int) -> str:
    """A byte count for people, as the shim writes it in its messages: exact in
    the largest binary unit that holds it whole ("1 GiB", "3000 MiB"), else to
    one decimal ("1.5 GiB")."""
    buf = ffi.new("char[]", 32)
    return ffi.string(lib.vgl_format_bytes(count, buf, 32)).decode()


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class MemoryLimit:
    """A memory limit as the user gave it: an absolute size (``bytes``) or a
    share of the device in millionths (``ppm``); exactly one is non-zero."""

    bytes: int
    ppm: int

    def describe(self) -> str:
        """"1 GiB", "50% of the device"."""
        if self.ppm:
            percent = f"{self.ppm / _PPM_PER_PERCENT:.4f}".rstrip("0").rstrip(".")
            return f"{percent}% of the device"
        return format_bytes(self.bytes)

    def cap_bytes(self, total_bytes: int) -> int | None:
        """The cap on a device of ``total_bytes``, as the shim computes it;
        None when there is none."""
        cap = lib.vgl_cap_bytes(self._cdata(), total_bytes)
        return None if cap == _UINT64_MAX else int(cap)

    def _cdata(self):
        limit = ffi.new("struct vgl_mem_limit *")
        limit.bytes = self.bytes
        limit.ppm = self.ppm
        return limit

    @classmethod
    def _from_cdata(cls, limit) -> MemoryLimit | None:
        """The limit in a C struct; None for "no cap" (both fields 0)."""
        if limit.bytes == 0 and limit.ppm == 0:
            return None
        return cls(bytes=int(limit.bytes), ppm=int(limit.ppm))


def memory_forms() -> str:
    return _one_line(ffi.string(lib.vgl_memory_forms()).decode())


def cores_forms() -> str:
    return _one_line(ffi.string(lib.vgl_cores_forms()).decode())


def _reason(err: int, text: str = "") -> str:
    if text.strip().startswith("-"):
        return "negative (a limit is a size or a share above zero)"
    if err == -errno.ERANGE:
        return "out of range (zero, or more than can be)"
    return "not a valid value"


def _encode(text: str, source: str, forms) -> bytes:
    data = text.encode("utf-8", errors="surrogateescape")
    if b"\0" in data:
        raise LimitError(source, text, "not a valid value", forms())
    return data


def ascii_number(text: str, below: int) -> int | None:
    """The number ``text`` writes in ASCII digits 0-9 (leading zeros allowed),
    if it is below ``below``; None for anything else.  Not str.isdigit() and
    int(): they also take '²' (which int() then refuses) and '１' (which it
    reads as 1)."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(below)):   # int() refuses past 4300 digits
        return None
    value = int(digits)
    return value if value < below else None


def parse_memory(text: str, source: str = "--memory") -> MemoryLimit:
    """Parses a memory limit ("4GiB", "3000m", "50%", "0.2", ...)."""
    out = ffi.new("struct vgl_mem_limit *")
    err = lib.vgl_parse_memory(_encode(text, source, memory_forms), out)
    if err == -errno.ERANGE and _unitless_above_one(text):
        number = text.strip()
        raise LimitError(source, text, "a fraction above 1", memory_forms(),
                         message=f"{source} {number}: {number} what? (a fraction is 0–1; sizes need a unit, "
                                 f"e.g. {number}GiB)")
    if err != 0:
        raise LimitError(source, text, _reason(err, text), memory_forms())
    limit = MemoryLimit._from_cdata(out)
    assert limit is not None, "vgl_parse_memory accepted a limit of nothing"
    return limit


def wait_forms() -> str:
    return ffi.string(lib.vgl_wait_forms()).decode()


def parse_wait(text: str, source: str = "--memory-wait") -> int:
    """Parses a memory wait ("500ms", "2s", "1.5m", "0"), in nanoseconds."""
    out = ffi.new("uint64_t *")
    err = lib.vgl_parse_wait(_encode(text, source, wait_forms), out)
    if err != 0:
        stripped = text.strip()
        reason = ("negative (a wait is 0 or a duration)" if stripped.startswith("-")
                  else "out of range (more than 1h)" if err == -errno.ERANGE
                  else "a number without a unit" if stripped.replace(".", "", 1).isdigit()
                  else "not a valid value")
        raise LimitError(source, text, reason, wait_forms())
    return int(out[0])


def format_wait(wait_ns: int) -> str:
    """A memory wait for people: "0", "500ms", "2s", "1.5s"."""
    if wait_ns == 0:
        return "0"
    if wait_ns % 1_000_000_000 == 0:
        return f"{wait_ns // 1_000_000_000}s"
    if wait_ns < 1_000_000_000:
        return f"{wait_ns / 1_000_000:g}ms"
    return f"{wait_ns / 1_000_000_000:g}s"


def decimal_note(text: str, source: str, limit: MemoryLimit) -> str | None:
    """A line saying which size a decimal unit made ("--memory 8GB is
    8000000000 bytes (7.5 GiB), ..."), since Docker's and Run:ai's 8GB is
    8 GiB; None for any other form.  An upper-case K, M, G or T not followed
    by i is decimal (the one parser's rule); lower case is binary, as HAMi's."""
    unit = text.strip().removesuffix("B").removesuffix("b")[-1:]
    if unit not in ("K", "M", "G", "T") or not limit.bytes:
        return None
    number = text.strip()[:text.strip().index(unit)]
    return (f"{source} {text.strip()} is {limit.bytes} bytes ({format_bytes(limit.bytes)}): "
            f"{unit} is decimal (10^{3 * 'KMGT'.index(unit) + 3}); for binary units write "
            f"{number}{unit}iB or {number}{unit.lower()}")


def _unitless_above_one(text: str) -> bool:
    """"1.5", "12.0": a number with a point and no unit, which the parser
    reads as a fraction of the device and refuses as more than all of it."""
    whole, point, frac = text.strip().partition(".")
    if not (point and whole.isascii() and whole.isdigit() and (not frac or frac.isascii() and frac.isdigit())):
        return False
    return float(f"{whole}.{frac}0") > 1


def memory_in_units(count_text: str, unit_text: str, count_source: str = "--memory-units",
                    unit_source: str = "--unit") -> MemoryLimit:
    """A memory cap counted in units, as Alibaba's gpushare does
    (``--memory-units 16 --unit 128Mi``): the unit is a size for the one
    parser, the count a whole number."""
    unit = parse_memory(unit_text, unit_source)
    if unit.ppm:
        raise LimitError(unit_source, unit_text, "a share of the device, not a size",
                         "a size such as 1GiB or 128Mi")
    most = (_UINT64_MAX >> 1) // unit.bytes
    count = ascii_number(count_text.strip(), most + 1)
    if not count:
        raise LimitError(count_source, count_text,
                         f"not a whole number of units from 1 to {most}",
                         "a whole number from 1, such as 16")
    return MemoryLimit(bytes=count * unit.bytes, ppm=0)


def parse_cores(text: str, source: str = "--cores") -> int:
    """Parses a compute share ("30", "30%"): the percentage, 1-100."""
    out = ffi.new("uint32_t *")
    err = lib.vgl_parse_cores(_encode(text, source, cores_forms), out)
    if err != 0:
        raise LimitError(source, text, _reason(err, text), cores_forms())
    return int(out[0])


def parse_uuid(text: str, source: str) -> str:
    """A GPU's UUID as nvidia-smi -L prints it ("GPU-8932f937-d72c-4106-c12f-
    20bd9faed9f6", either case), or a MIG device's ("MIG-..."), in the lower
    case NVML and CUDA report."""
    out = ffi.new("uint8_t[16]")
    data = text.strip().encode("ascii", errors="replace")
    err = -errno.EINVAL if b"\0" in data else lib.vgl_parse_uuid(data, out)
    if err != 0:
        # All zeros has the form but is no device's: NVML gives none that UUID.
        raise LimitError(source, text, "all zeros, which is no device's UUID" if err == -errno.ERANGE
                         else "not a GPU or MIG device UUID",
                         "GPU- or MIG- and 32 hex digits as nvidia-smi -L prints them: "
                         "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6")
    return format_uuid(bytes(out), mig=data.startswith(b"MIG-"))


def format_uuid(raw: bytes, mig: bool = False) -> str:
    """16 bytes as NVML and nvidia-smi print a GPU's UUID (lower case), or a
    MIG device's, by the core's formatters, the ones the shim uses."""
    text = ffi.new("char[41]")
    (lib.vgl_format_mig_uuid if mig else lib.vgl_format_uuid)(raw, text)
    return ffi.string(text).decode()


CORES_POLICIES = ("hard", "borrow", "none")   # enum vgl_cores_policy, in order


def parse_cores_policy(text: str, source: str = "--cores-policy") -> str:
    """Parses a compute policy: hard, borrow or none (or HAMi-core's FORCE,
    DEFAULT, DISABLE)."""
    out = ffi.new("uint32_t *")
    if lib.vgl_parse_cores_policy(_encode(text, source, _policy_forms), out) != 0:
        raise LimitError(source, text, "not a valid value", _policy_forms())
    return CORES_POLICIES[out[0]]


def _policy_forms() -> str:
    return ffi.string(lib.vgl_cores_policy_forms()).decode()


PRIORITIES = ("normal", "high", "low")   # enum vgl_priority, in order


def parse_priority(text: str, source: str = "--priority") -> str:
    """Parses a priority between tenants: high, normal or low."""
    out = ffi.new("uint32_t *")
    if lib.vgl_parse_priority(_encode(text, source, _priority_forms), out) != 0:
        raise LimitError(source, text, "not a valid value", _priority_forms())
    return PRIORITIES[out[0]]


def _priority_forms() -> str:
    return ffi.string(lib.vgl_priority_forms()).decode()

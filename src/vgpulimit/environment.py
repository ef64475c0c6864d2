"""The environment contract, read by the shim's own reader
(shim/src/environment.c, through cffi), so that the supervisor and the OCI
hook make of a process's variables exactly what the shim in it would.

Precedence (strongest first): a flag or an annotation (layered on by the
caller), VGPULIMIT_<X>_<i>, VGPULIMIT_<X>, HAMi's <Y>_<i>, HAMi's <Y>, and
for memory KAI's GPU_PORTION.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpulimit._paths import core
from vgpulimit.limits import MemoryLimit

ffi, lib = core()

MAX_DEVICES: int = lib.VGL_MAX_DEVICES


@dataclass(frozen=True)
class Setting:
    """A value as the user wrote it, where it came from, and what it means."""

    text: str
    source: str   # the flag, annotation or variable, for messages
    value: object


@dataclass(frozen=True)
class Environment:
    """What the limit variables of one environment say, per device."""

    memory: Mapping[int, Setting] = field(default_factory=dict)   # value: MemoryLimit
    cores: Mapping[int, Setting] = field(default_factory=dict)    # value: percent
    cores_policy: Setting | None = None   # value: "hard", "borrow" or "none"
    priority: Setting | None = None       # value: "high", "normal" or "low"
    # By device UUID ("GPU-…", lower case), whatever CUDA numbers that device:
    memory_by_uuid: Mapping[str, Setting] = field(default_factory=dict)   # value: MemoryLimit
    cores_by_uuid: Mapping[str, Setting] = field(default_factory=dict)    # value: percent
    request: Mapping[int, Setting] = field(default_factory=dict)          # value: MemoryLimit
    request_by_uuid: Mapping[str, Setting] = field(default_factory=dict)  # value: MemoryLimit
    memory_wait: Setting | None = None    # value: nanoseconds
    region_path: str | None = None
    region_source: str | None = None   # VGPULIMIT_REGION, CUDA_DEVICE_MEMORY_SHARED_CACHE or
                                       # CONTAINER_VGPU_MOUNT (KAI's isolator)
    asks: bool = False                 # a limit or region variable is present
    control_disabled: bool = False     # HAMi's CUDA_DISABLE_CONTROL=true: nothing is enforced
    mps: bool = False                  # CUDA_MPS_PIPE_DIRECTORY is set: an MPS client
    errors: tuple[str, ...] = ()       # variables that cannot be used, one line each
    warnings: tuple[str, ...] = ()


def _text(chars) -> str:
    return ffi.string(chars).decode("utf-8", errors="replace")


def read(environ: Mapping[str, str]) -> Environment:
    """Reads ``environ`` as the shim reads its environment."""
    entries = [ffi.new("char[]", f"{name}={value}".encode("utf-8", errors="surrogateescape"))
               for name, value in environ.items() if "\0" not in name + value and "=" not in name]
    envp = ffi.new("char *[]", [*entries, ffi.NULL])
    out = ffi.new("struct vgl_env *")
    lib.vgl_env_read(envp, out)

    memory, cores, request = {}, {}, {}
    for i in range(MAX_DEVICES):
        if out.request_from[i].source:
            origin = out.request_from[i]
            request[i] = Setting(_text(origin.text), _text(origin.name), MemoryLimit._from_cdata(out.request[i]))
        if out.memory_from[i].source:
            origin = out.memory_from[i]
            limit = MemoryLimit._from_cdata(out.memory[i])
            memory[i] = Setting(_text(origin.text), _text(origin.name), limit)
        if out.cores_from[i].source:
            origin = out.cores_from[i]
            cores[i] = Setting(_text(origin.text), _text(origin.name), int(out.cores_pct[i]))
    memory_by_uuid, cores_by_uuid, request_by_uuid = _by_uuid(out)
    memory_wait = None
    if out.memory_wait_set:
        origin = out.memory_wait_from
        memory_wait = Setting(_text(origin.text), _text(origin.name), int(out.memory_wait_ns))
    lines = [(_text(out.line[i]), bool(out.line_is_error[i])) for i in range(out.lines)]
    region = _text(out.region_path) or None
    policy = None
    if out.cores_policy >= 0:
        from vgpulimit.limits import CORES_POLICIES

        origin = out.cores_policy_from
        policy = Setting(_text(origin.text), _text(origin.name), CORES_POLICIES[out.cores_policy])
    priority = None
    if out.priority >= 0:
        from vgpulimit.limits import PRIORITIES

        origin = out.priority_from
        priority = Setting(_text(origin.text), _text(origin.name), PRIORITIES[out.priority])
    return Environment(
        memory=memory, cores=cores, cores_policy=policy, priority=priority, region_path=region,
        memory_by_uuid=memory_by_uuid, cores_by_uuid=cores_by_uuid,
        request=request, request_by_uuid=request_by_uuid, memory_wait=memory_wait,
        region_source=_text(out.region_from) if region else None, asks=bool(out.asks),
        control_disabled=bool(out.control_disabled), mps=bool(out.mps),
        errors=tuple(line for line, error in lines if error),
        warnings=tuple(line for line, error in lines if not error),
    )


def _by_uuid(out) -> tuple[dict[str, Setting], dict[str, Setting], dict[str, Setting]]:
    """VGPULIMIT_MEMORY_GPU-<uuid>, VGPULIMIT_CORES_GPU-<uuid> and
    VGPULIMIT_MEMORY_REQUEST_GPU-<uuid>, as the reader kept them."""
    from vgpulimit.limits import format_uuid

    memory, cores, request = {}, {}, {}
    for i in range(MAX_DEVICES):
        entry = out.by_uuid[i]
        if not entry.flags:
            continue
        uuid = format_uuid(bytes(entry.uuid), mig=bool(entry.flags & lib.VGL_UUID_MIG))
        if entry.flags & lib.VGL_UUID_MEMORY:
            limit = MemoryLimit._from_cdata(entry.limit)
            memory[uuid] = Setting(limit.describe() if limit else "", f"VGPULIMIT_MEMORY_{uuid}", limit)
        if entry.flags & lib.VGL_UUID_CORES:
            cores[uuid] = Setting(str(entry.cores_pct), f"VGPULIMIT_CORES_{uuid}", int(entry.cores_pct))
        if entry.flags & lib.VGL_UUID_REQUEST:
            asked = MemoryLimit._from_cdata(entry.request)
            request[uuid] = Setting(asked.describe() if asked else "", f"VGPULIMIT_MEMORY_REQUEST_{uuid}", asked)
    return memory, cores, request

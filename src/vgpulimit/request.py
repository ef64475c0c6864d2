"""The limits a user asks for, as a model apart from what acts on them: the
flags of `run` (and `verify`) over the limit variables, read by the shim's
own reader in its precedence; the OCI hook's annotations over a container's
variables; and whether a nested run asks for more than the region it runs
in holds.  Nothing here spawns, writes a region or prints: `run`
(supervisor.py), the hook and verify take a ``Limits`` and act on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from vgpulimit import environment
from vgpulimit.environment import Setting
from vgpulimit.errors import UsageError, quoted
from vgpulimit.kinds import kind
from vgpulimit.limits import (
    MemoryLimit,
    ascii_number,
    decimal_note,
    parse_cores,
    parse_memory,
)
from vgpulimit.region import MAX_DEVICES, DeviceSnapshot

_MEMORY, _CORES, _REQUEST = kind("memory"), kind("cores"), kind("memory_request")
_POLICY, _PRIORITY, _WAIT = kind("cores_policy"), kind("priority"), kind("memory_wait")
MEMORY_VAR, CORES_VAR, REQUEST_VAR = _MEMORY.ours, _CORES.ours, _REQUEST.ours

__all__ = ["CORES_VAR", "MEMORY_VAR", "Limits", "RunOptions", "Setting", "UsageError", "layer", "looser",
           "named_mig_gpu", "parse_device_items", "resolve_limits", "split_uuid_items"]


@dataclass(frozen=True)
class Limits:
    memory: Mapping[int, Setting] = field(default_factory=dict)   # device -> its cap
    cores: Mapping[int, Setting] = field(default_factory=dict)    # device -> its share
    cores_policy: Setting | None = None   # value: limits.CORES_POLICIES; None: hard
    priority: Setting | None = None       # value: limits.PRIORITIES; None: takes no part
    warnings: tuple[str, ...] = ()   # what the user should know: overridden values
    # By device UUID ("GPU-…"): the device of that UUID, whatever CUDA numbers it.
    memory_by_uuid: Mapping[str, Setting] = field(default_factory=dict)
    cores_by_uuid: Mapping[str, Setting] = field(default_factory=dict)
    # Elastic memory (docs/memory.md): the guarantee below the cap, per
    # device or by UUID (none: the cap), and how long an allocation that
    # would be refused waits for memory (value: ns; None: 0, refused at once).
    request: Mapping[int, Setting] = field(default_factory=dict)
    request_by_uuid: Mapping[str, Setting] = field(default_factory=dict)
    memory_wait: Setting | None = None

    def memory_per_device(self) -> list[MemoryLimit | None]:
        return [_value(self.memory.get(i)) for i in range(MAX_DEVICES)]

    def request_per_device(self) -> list[MemoryLimit | None]:
        return [_value(self.request.get(i)) for i in range(MAX_DEVICES)]

    def guarantee_per_device(self) -> list[MemoryLimit | None]:
        """What the board guarantees each device: its request, else its cap."""
        return [_value(self.request.get(i)) or _value(self.memory.get(i)) for i in range(MAX_DEVICES)]

    def guarantee_by_uuid(self) -> dict[str, MemoryLimit]:
        uuids = dict.fromkeys([*self.request_by_uuid, *self.memory_by_uuid])
        chosen = {u: _value(self.request_by_uuid.get(u)) or _value(self.memory_by_uuid.get(u)) for u in uuids}
        return {u: g for u, g in chosen.items() if g is not None}

    def memory_wait_ns(self) -> int:
        return _value(self.memory_wait) or 0

    def takes_memory_row(self) -> bool:
        """A cap, a request or a wait: the container's guarantee goes on the node's board."""
        return bool(any(s.value is not None for s in self.memory.values()) or self.memory_by_uuid
                    or self.elastic())

    def elastic(self) -> bool:
        """A request below a cap, or a wait: the container takes part in elastic memory."""
        return bool(self.request or self.request_by_uuid or self.memory_wait_ns())

    def cores_per_device(self) -> list[int]:
        return [_value(self.cores.get(i)) or 0 for i in range(MAX_DEVICES)]

    def limits_nothing(self) -> bool:
        """No cap and no share on any device (by index or by UUID)."""
        return not (any(s.value is not None for s in self.memory.values())
                    or any(s.value for s in self.cores.values())
                    or self.memory_by_uuid or self.cores_by_uuid)

    def by_uuid(self) -> dict[str, dict]:
        """The limits by UUID, as Region.create takes them."""
        return {"memory_by_uuid": {u: s.value for u, s in self.memory_by_uuid.items()},
                "cores_by_uuid": {u: s.value for u, s in self.cores_by_uuid.items()},
                "request_by_uuid": {u: s.value for u, s in self.request_by_uuid.items()}}


@dataclass(frozen=True)
class RunOptions:
    command: Sequence[str]
    limits: Limits
    simulate: bool = False
    region_path: str | None = None   # None: a fresh private one, removed afterwards
    board_path: str | None = None    # with a priority; None: priority.board beside run's regions
    suspend_idle_ms: int = 0         # --suspend-idle (docs/agent.md); 0: never suspended for idleness


def _value(setting: Setting | None):
    return None if setting is None else setting.value


def _device_index(text: str, source: str) -> int:
    index = ascii_number(text, MAX_DEVICES)
    if index is None:
        raise UsageError(f"{source}: device index {quoted(text)} is not in 0-{MAX_DEVICES - 1} "
                         "(ASCII digits)")
    return index


def split_uuid_items(items: Sequence[str], flag: str) -> tuple[list[str], dict[str, str]]:
    """``GPU-<uuid>=<value>`` (or a MIG device's ``MIG-<uuid>=<value>``) flags
    apart from ``I=<value>`` ones: the latter as they are, the former as
    {uuid: value text}."""
    from vgpulimit.limits import LimitError, parse_uuid

    by_index: list[str] = []
    by_uuid: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key.strip().upper().startswith(("GPU-", "MIG-")):
            by_index.append(item)
            continue
        try:
            uuid = parse_uuid(key, flag)
        except LimitError as exc:
            raise UsageError(f"{flag}: {quoted(key.strip())} is {exc.reason} (GPU- or MIG- "
                             "and 32 hex digits, as nvidia-smi -L prints them)") from exc
        if not sep:
            raise UsageError(f"{flag}: {quoted(item)} has no '=' and a value after the UUID")
        if uuid in by_uuid:
            raise UsageError(f"{flag}: device {uuid} is given twice")
        by_uuid[uuid] = value
    return by_index, by_uuid


def named_mig_gpu(given: Mapping[str, str], gpus: Sequence) -> str | None:
    """The line refusing a limit given for a GPU in MIG mode by the GPU's own
    UUID (the first line nvidia-smi -L prints for it), or None.  CUDA never
    shows such a GPU, only its MIG devices, so the limit would cap nothing;
    the line names the MIG devices to give it for.  ``given``: {UUID: the
    flag or variable that gave a limit for it}; ``gpus``: the node's, as
    node.read_gpus gives them (each MIG device after its GPU)."""
    for uuid, source in given.items():
        gpu = next((g for g in gpus if g.mig is None and g.uuid.lower() == uuid.lower()), None)
        if gpu is None or not gpu.mig_mode:
            continue
        migs = [f"{g.uuid} ({g.mig.profile})" for g in gpus if g.mig is not None and g.mig.parent_uuid == gpu.uuid]
        return (f"{source}: that GPU is in MIG mode, and CUDA never shows it (only its MIG devices), "
                f"so the limit would cap nothing; give it for one of its MIG devices: "
                f"{', '.join(migs) or 'it has none now'}")
    return None


def parse_device_items(items: Sequence[str], flag: str, what: str = "SIZE") -> dict[int, str]:
    """``I=<what>`` flags as {device index: value text}; each device at most once."""
    values: dict[int, str] = {}
    for item in items:
        index_text, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"{flag}: {quoted(item)} is not I={what} "
                             f"(a device index 0-{MAX_DEVICES - 1}, '=', a {what.lower()})")
        index = _device_index(index_text.strip(), flag)
        if index in values:
            raise UsageError(f"{flag}: device {index} is given twice")
        values[index] = value
    return values


def layer(below: Mapping[int, Setting], every: Setting | None, per_device: Mapping[int, Setting],
          warnings: list[str]) -> dict[int, Setting]:
    """Settings of a stronger source (a value for every device, and per
    device, which beats it) laid over ``below``; each value of ``below`` that
    they change is said in ``warnings``, never dropped silently."""
    result = dict(below)
    for index in range(MAX_DEVICES):
        upper = per_device.get(index, every)
        if upper is None:
            continue
        lower = result.get(index)
        if lower is not None and lower.value != upper.value:
            warnings.append(f"{upper.source} {upper.text} overrides {lower.source}={lower.text}")
        result[index] = upper
    return result


def environment_limits(environ: Mapping[str, str]) -> environment.Environment:
    """The limit variables as the shim reads them; their errors raise UsageError."""
    env = environment.read(environ)
    if env.errors:
        raise UsageError(env.errors[0])
    return env


def resolve_limits(
    memory: str | Setting | None = None,
    memory_device: Sequence[str] = (),
    environ: Mapping[str, str] = MappingProxyType({}),
    cores: str | None = None,
    cores_device: Sequence[str] = (),
    cores_policy: str | None = None,
    priority: str | None = None,
    memory_request: str | None = None,
    memory_request_device: Sequence[str] = (),
    memory_wait: str | None = None,
) -> Limits:
    """The limits of a run: the flags, over what the environment the
    supervisor was started with says (read by the shim's own reader: ours
    and HAMi's variables, in its precedence), so that `docker run -e
    VGPULIMIT_MEMORY=4GiB` works with a plain `vgpulimit run -- CMD`
    entrypoint.  Where a flag overrides a variable, a warning says so."""
    env = environment_limits(environ)
    warnings = list(env.warnings)

    def flag(var: str, text: str | Setting | None, source: str) -> Setting | None:
        if isinstance(text, Setting):   # parsed already (--memory-units): never formatted and read again
            return text
        return None if text is None else _setting(var, text, source)

    memory_flags, memory_by_uuid = _device_flags(_MEMORY, memory_device, env.memory_by_uuid, warnings)
    cores_flags, cores_by_uuid = _device_flags(_CORES, cores_device, env.cores_by_uuid, warnings)
    request_flags, request_by_uuid = _device_flags(_REQUEST, memory_request_device, env.request_by_uuid,
                                                   warnings)
    request_all = layer(env.request, flag(REQUEST_VAR, memory_request, _REQUEST.flag), request_flags,
                        warnings)
    wait_setting = _scalar_flag(_WAIT, memory_wait, env.memory_wait)
    memory_all = layer(env.memory, flag(MEMORY_VAR, memory, _MEMORY.flag), memory_flags, warnings)
    cores_all = layer(env.cores, flag(CORES_VAR, cores, _CORES.flag), cores_flags, warnings)
    policy = _scalar_flag(_POLICY, cores_policy, env.cores_policy)
    priority_setting = _scalar_flag(_PRIORITY, priority, env.priority)
    if priority is not None and env.priority is not None and env.priority.value != priority_setting.value:
        warnings.append(f"{_PRIORITY.flag} {priority} overrides {env.priority.source}={env.priority.text}")
    check_requests(request_all, memory_all)
    check_requests(request_by_uuid, memory_by_uuid)
    for setting in [*memory_all.values(), *memory_by_uuid.values(), *request_all.values(),
                    *request_by_uuid.values()]:
        note = decimal_note(setting.text, setting.source, setting.value)
        if note:
            warnings.append(note)
    return Limits(memory=memory_all, cores=cores_all, cores_policy=policy, priority=priority_setting,
                  warnings=tuple(dict.fromkeys(warnings)),
                  memory_by_uuid=memory_by_uuid, cores_by_uuid=cores_by_uuid,
                  request=request_all, request_by_uuid=request_by_uuid, memory_wait=wait_setting)


def _device_flags(which, items: Sequence[str], env_by_uuid: Mapping[str, Setting],
                  warnings: list[str]) -> tuple[dict[int, Setting], dict[str, Setting]]:
    """A per-device kind's ``--<flag>-device`` items: by index, and by UUID
    laid over the variables by UUID."""
    flag = which.device_flag
    by_index, uuids = split_uuid_items(items, flag)
    what = "PERCENT" if which.parser == "cores" else "SIZE"
    flags = {i: _setting(which.ours, text, f"{flag} {i}")
             for i, text in parse_device_items(by_index, flag, what).items()}
    return flags, _layer_uuids(env_by_uuid, which.ours, uuids, flag, warnings)


def _scalar_flag(which, text: str | None, below: Setting | None) -> Setting | None:
    """A kind given once for every device: its flag, else its variable."""
    return below if text is None else Setting(text, which.flag, which.parse(text, which.flag))


def check_requests(requests: Mapping, limits: Mapping) -> None:
    """A request above its limit (both sizes, or both shares: a size against
    a share is held to the limit once the device is seen) is refused, naming
    both."""
    from vgpulimit.limits import memory_forms

    for key, request in sorted(requests.items(), key=lambda item: str(item[0])):
        limit = limits.get(key)
        if limit is None or request.value is None or limit.value is None:
            continue
        asked, cap = request.value, limit.value
        if (asked.bytes and cap.bytes and asked.bytes > cap.bytes) or (asked.ppm and cap.ppm and asked.ppm > cap.ppm):
            where = f"device {key}" if isinstance(key, int) else key
            raise UsageError(f"{request.source} {request.text} is above the limit {limit.source} {limit.text} on "
                             f"{where}; a request is at most the limit (accepted forms: {memory_forms()})")


def _layer_uuids(below: Mapping[str, Setting], var: str, flags: Mapping[str, str], flag: str,
                 warnings: list[str]) -> dict[str, Setting]:
    """Flags by UUID over the variables by UUID; an overridden value is said."""
    result = dict(below)
    for uuid, text in flags.items():
        upper = _setting(var, text, f"{flag} {uuid}")
        lower = result.get(uuid)
        if lower is not None and lower.value != upper.value:
            warnings.append(f"{upper.source} {upper.text} overrides {lower.source}={lower.text}")
        result[uuid] = upper
    return result


def memory_units(count: str, unit: str | None) -> Setting:
    """``--memory-units N [--unit SIZE]`` as the memory setting it makes."""
    from vgpulimit.limits import memory_in_units

    limit = memory_in_units(count, unit or "1GiB")
    return Setting(text=f"{count} x {unit or '1GiB'}", source="--memory-units", value=limit)


def _setting(var: str, text: str, source: str) -> Setting:
    parse = parse_cores if var == CORES_VAR else parse_memory
    return Setting(text=text, source=source, value=parse(text, source))


def looser(limits: Limits, held: Sequence[DeviceSnapshot], path: str) -> list[str]:
    """What to say of each asked limit looser than those ``held`` by the
    enclosing region at ``path``, which hold as well (a nested run can only
    tighten)."""
    lines = []
    for index, setting in sorted(limits.memory.items()):
        limit, asked, total = held[index].limit, setting.value, held[index].total_bytes
        if limit is None:
            continue
        if limit.bytes and asked.bytes:
            wider = asked.bytes > limit.bytes
        elif limit.ppm and asked.ppm:
            wider = asked.ppm > limit.ppm
        elif total:   # one a size, one a share: comparable once the device's size is seen
            wider = _bytes_of(asked, total) > _bytes_of(limit, total)
        else:         # the whole device is looser than any size
            wider = asked.ppm == 1_000_000
        if wider:
            lines.append(f"{setting.source} {setting.text} is looser than the {limit.describe()} of the "
                         f"region {path} this runs in, which holds too (a nested run can only tighten)")
    for index, setting in sorted(limits.cores.items()):
        cores = held[index].cores_pct
        if cores and setting.value > cores:
            lines.append(f"{setting.source} {setting.text} is looser than the {cores}% of the region "
                         f"{path} this runs in, which holds too (a nested run can only tighten)")
    return lines


def _bytes_of(limit: MemoryLimit, total: int) -> int:
    return limit.bytes or total * limit.ppm // 1_000_000

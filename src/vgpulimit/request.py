"""The limits a user asks for, as a model apart from what acts on them: the
flags of `run` (and `verify`) over the limit variables, read by the shim's
own reader in its precedence; the OCI hook's annotations over a container's
variables; and whether a nested run asks for more than the region it runs
in holds.  Nothing here spawns, writes a region or prints: `run`
(supervisor.py), the hook and verify take a ``Limits`` and act on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpulimit import environment
from vgpulimit.environment import Setting
from vgpulimit.errors import UsageError, quoted
from vgpulimit.limits import (
    MemoryLimit,
    ascii_number,
    decimal_note,
    parse_cores,
    parse_cores_policy,
    parse_memory,
    parse_priority,
)
from vgpulimit.region import MAX_DEVICES, DeviceSnapshot

MEMORY_VAR = "VGPULIMIT_MEMORY"
CORES_VAR = "VGPULIMIT_CORES"

__all__ = ["CORES_VAR", "MEMORY_VAR", "Limits", "RunOptions", "Setting", "UsageError", "layer", "looser",
           "parse_device_items", "resolve_limits", "split_uuid_items"]


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

    def memory_per_device(self) -> list[MemoryLimit | None]:
        return [_value(self.memory.get(i)) for i in range(MAX_DEVICES)]

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
                "cores_by_uuid": {u: s.value for u, s in self.cores_by_uuid.items()}}


@dataclass(frozen=True)
class RunOptions:
    command: Sequence[str]
    limits: Limits
    simulate: bool = False
    region_path: str | None = None   # None: a fresh private one, removed afterwards
    board_path: str | None = None    # with a priority; None: priority.board beside run's regions


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
            raise UsageError(f"{flag}: {quoted(key.strip())} is not a GPU or MIG device UUID (GPU- or MIG- "
                             "and 32 hex digits, as nvidia-smi -L prints them)") from exc
        if not sep:
            raise UsageError(f"{flag}: {quoted(item)} has no '=' and a value after the UUID")
        if uuid in by_uuid:
            raise UsageError(f"{flag}: device {uuid} is given twice")
        by_uuid[uuid] = value
    return by_index, by_uuid


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
    memory: str | Setting | None,
    memory_device: Sequence[str],
    environ: Mapping[str, str],
    cores: str | None = None,
    cores_device: Sequence[str] = (),
    cores_policy: str | None = None,
    priority: str | None = None,
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

    memory_device, memory_uuids = split_uuid_items(memory_device, "--memory-device")
    cores_device, cores_uuids = split_uuid_items(cores_device, "--cores-device")
    memory_flags = {i: _setting(MEMORY_VAR, text, f"--memory-device {i}")
                    for i, text in parse_device_items(memory_device, "--memory-device").items()}
    cores_flags = {i: _setting(CORES_VAR, text, f"--cores-device {i}")
                   for i, text in parse_device_items(cores_device, "--cores-device",
                                                     "PERCENT").items()}
    memory_by_uuid = _layer_uuids(env.memory_by_uuid, MEMORY_VAR, memory_uuids, "--memory-device", warnings)
    cores_by_uuid = _layer_uuids(env.cores_by_uuid, CORES_VAR, cores_uuids, "--cores-device", warnings)
    memory_all = layer(env.memory, flag(MEMORY_VAR, memory, "--memory"), memory_flags, warnings)
    cores_all = layer(env.cores, flag(CORES_VAR, cores, "--cores"), cores_flags, warnings)
    policy = env.cores_policy
    if cores_policy is not None:
        policy = Setting(cores_policy, "--cores-policy", parse_cores_policy(cores_policy, "--cores-policy"))
    priority_setting = env.priority
    if priority is not None:
        priority_setting = Setting(priority, "--priority", parse_priority(priority, "--priority"))
        if env.priority is not None and env.priority.value != priority_setting.value:
            warnings.append(f"--priority {priority} overrides {env.priority.source}={env.priority.text}")
    for setting in [*memory_all.values(), *memory_by_uuid.values()]:
        note = decimal_note(setting.text, setting.source, setting.value)
        if note:
            warnings.append(note)
    return Limits(memory=memory_all, cores=cores_all, cores_policy=policy, priority=priority_setting,
                  warnings=tuple(dict.fromkeys(warnings)),
                  memory_by_uuid=memory_by_uuid, cores_by_uuid=cores_by_uuid)


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
    parse = parse_memory if var == MEMORY_VAR else parse_cores
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

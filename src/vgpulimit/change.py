"""`vgpulimit set`: a running container's limits changed, as library code.

``Change.parse`` reads what was asked (every value parsed before anything is
written: a bad one changes nothing); ``apply`` writes it into a region and
returns what changed, old -> new, one line each.  The CLI prints the lines."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field

from vgpulimit.errors import UsageError
from vgpulimit.limits import (
    MemoryLimit,
    decimal_note,
    parse_cores,
    parse_cores_policy,
    parse_memory,
    parse_priority,
    parse_wait,
)
from vgpulimit.region import Region
from vgpulimit.request import parse_device_items, split_uuid_items

_KEEP = object()   # a limit not asked to change


def _memory(text: str, source: str) -> MemoryLimit | None:
    return None if text.strip().lower() == "none" else parse_memory(text, source)


def _cores(text: str, source: str) -> int:
    return 0 if text.strip().lower() == "none" else parse_cores(text, source)


@dataclass(frozen=True)
class Change:
    """The limits to change; ``_KEEP`` where one is not asked to change.
    A memory limit of None lifts the cap, a share of 0 lifts the share."""

    memory_all: object = _KEEP
    cores_all: object = _KEEP
    policy: str | None = None
    priority: str | None = None
    memory: dict[int, MemoryLimit | None] = field(default_factory=dict)
    cores: dict[int, int] = field(default_factory=dict)
    memory_by_uuid: dict[str, MemoryLimit | None] = field(default_factory=dict)
    cores_by_uuid: dict[str, int] = field(default_factory=dict)
    request_all: object = _KEEP   # a MemoryLimit, or None: the cap
    request: dict[int, MemoryLimit | None] = field(default_factory=dict)
    memory_wait_ns: int | None = None
    notes: tuple[str, ...] = ()   # what the user should know: a decimal unit's size

    @classmethod
    def parse(cls, memory: str | None, memory_device: Sequence[str], cores: str | None,
              cores_device: Sequence[str], cores_policy: str | None, priority: str | None = None,
              memory_request: str | None = None, memory_request_device: Sequence[str] = (),
              memory_wait: str | None = None) -> Change:
        request_items, request_uuids = split_uuid_items(memory_request_device, "--memory-request-device")
        if request_uuids:
            raise UsageError("set: --memory-request-device takes I=SIZE, a device index as CUDA numbers it in "
                             "the container; a request by UUID is given when the container starts")
        request_by_index = parse_device_items(request_items, "--memory-request-device")
        memory_items, memory_uuids = split_uuid_items(memory_device, "--memory-device")
        cores_items, cores_uuids = split_uuid_items(cores_device, "--cores-device")
        memory_by_index = parse_device_items(memory_items, "--memory-device")
        cores_by_index = parse_device_items(cores_items, "--cores-device", "PERCENT")
        if (memory is None and cores is None and cores_policy is None and priority is None
                and not memory_by_index and not cores_by_index and not memory_uuids and not cores_uuids
                and memory_request is None and not request_by_index and memory_wait is None):
            from vgpulimit.kinds import KINDS

            flags = [flag for kind in KINDS for flag in (kind.flag, kind.device_flag) if flag]
            raise UsageError(f"set: nothing to change (give {', '.join(flags[:-1])} or {flags[-1]})")
        given = [("--memory", memory)] if memory is not None else []
        given += [(f"--memory-device {i}", t) for i, t in memory_by_index.items()]
        given += [(f"--memory-device {u}", t) for u, t in memory_uuids.items()]
        notes = [decimal_note(t, source, limit) for source, t in given
                 if (limit := _memory(t, source)) is not None]
        return cls(
            notes=tuple(n for n in notes if n),
            memory_all=_memory(memory, "--memory") if memory is not None else _KEEP,
            cores_all=_cores(cores, "--cores") if cores is not None else _KEEP,
            policy=parse_cores_policy(cores_policy) if cores_policy is not None else None,
            priority=parse_priority(priority) if priority is not None else None,
            memory={i: _memory(t, f"--memory-device {i}") for i, t in memory_by_index.items()},
            cores={i: _cores(t, f"--cores-device {i}") for i, t in cores_by_index.items()},
            memory_by_uuid={u: _memory(t, f"--memory-device {u}") for u, t in memory_uuids.items()},
            cores_by_uuid={u: _cores(t, f"--cores-device {u}") for u, t in cores_uuids.items()},
            request_all=_memory(memory_request, "--memory-request") if memory_request is not None else _KEEP,
            request={i: _memory(t, f"--memory-request-device {i}") for i, t in request_by_index.items()},
            memory_wait_ns=parse_wait(memory_wait) if memory_wait is not None else None,
        )


def apply(region_path: str, change: Change) -> list[str]:
    """Writes ``change`` into the region; what changed, one line each."""
    changes: list[str] = []
    unnamed: dict[str, list[int]] = {}
    pending: list[str] = []
    with Region.open(region_path) as region:
        before = region.snapshot(all_devices=True)
        if change.priority is not None:
            changes += _set_priority(region, before, change.priority)
        changes += _set_elastic(region, before, change)
        if change.policy is not None:
            old_policies = {d.cores_policy for d in before.devices if d.cores_pct}
            region.set_cores_policy(change.policy)
            if old_policies != {change.policy}:
                changes.append(f"compute policy: {'/'.join(sorted(old_policies)) or 'hard'} → {change.policy}")
        # By the 32 hex digits: a device bound where NVML could not say its
        # kind reads GPU- in the region, though the user names it MIG-.
        memory_by_key = {uuid[4:]: limit for uuid, limit in change.memory_by_uuid.items()}
        cores_by_key = {uuid[4:]: pct for uuid, pct in change.cores_by_uuid.items()}
        for device in before.devices:
            index = device.index
            key = device.uuid[4:] if device.uuid else None
            every_limit = device.limit if change.memory_all is _KEEP else change.memory_all
            every_pct = device.cores_pct if change.cores_all is _KEEP else change.cores_all
            limit = change.memory.get(index, every_limit)
            pct = change.cores.get(index, every_pct)
            if key in memory_by_key:
                limit = memory_by_key[key]
            if key in cores_by_key:
                pct = cores_by_key[key]
            if limit != device.limit or pct != device.cores_pct:
                region.set_limits(index, limit, pct)
                what = _change_line(device.limit, limit, device.cores_pct, pct)
                if device.uuid:
                    changes.append(f"device {index} ({device.uuid}): {what}")
                else:   # devices no process has used yet: alike ones share a line
                    unnamed.setdefault(what, []).append(index)
        bound = {d.uuid[4:] for d in before.devices if d.uuid}
        for uuid in dict.fromkeys([*change.memory_by_uuid, *change.cores_by_uuid]):
            region.set_uuid_limits(uuid, change.memory_by_uuid.get(uuid), change.cores_by_uuid.get(uuid),
                                   memory_given=uuid in change.memory_by_uuid)
            if uuid[4:] not in bound:
                new = [f"memory {_memory_text(change.memory_by_uuid[uuid])}"] \
                    if uuid in change.memory_by_uuid else []
                new += [f"cores {_cores_text(change.cores_by_uuid[uuid])}"] \
                    if uuid in change.cores_by_uuid else []
                pending.append(f"{uuid} (no process has used it yet): {', '.join(new)}")
        if changes or unnamed or pending:
            _update_guarantee(region)
    grouped = [f"device{'s' if len(indices) > 1 else ''} {_ranges(indices)}: {what}"
               for what, indices in unnamed.items()]
    return changes + grouped + pending


def _set_elastic(region: Region, before, change: Change) -> list[str]:
    """Requests and the wait, before the limits: a request above the
    device's cap, as the change leaves it, is refused with nothing written."""
    from vgpulimit.environment import Setting
    from vgpulimit.limits import format_wait
    from vgpulimit.request import check_requests

    wanted, caps = {}, {}
    for device in before.devices:
        every = device.request if change.request_all is _KEEP else change.request_all
        wanted[device.index] = change.request.get(device.index, every)
        cap = change.memory.get(device.index, device.limit if change.memory_all is _KEEP else change.memory_all)
        caps[device.index] = Setting(_memory_text(cap), "the cap", cap)
    check_requests({i: Setting(_memory_text(r), "--memory-request", r) for i, r in wanted.items()}, caps)
    alike: dict[str, list[int]] = {}
    for device in before.devices:
        request = wanted[device.index]
        if request != device.request:
            region.set_request(device.index, request)
            alike.setdefault(f"memory request {_request_text(device.request)} → {_request_text(request)}",
                             []).append(device.index)
    lines = [f"device{'s' if len(indices) > 1 else ''} {_ranges(indices)}: {what}" for what, indices in alike.items()]
    if change.memory_wait_ns is not None and change.memory_wait_ns != before.memory_wait_ns:
        region.set_memory_wait(change.memory_wait_ns)
        lines.append(f"memory wait: {format_wait(before.memory_wait_ns)} → {format_wait(change.memory_wait_ns)}")
    return lines


def _update_guarantee(region: Region) -> None:
    """A container on the node's board for its memory is guaranteed its
    request, else its cap, there: the board, which no tenant writes, is
    brought to what the region now says."""
    from vgpulimit import board
    from vgpulimit._paths import core
    from vgpulimit.limits import format_uuid

    _, lib = core()
    mapped = region._mapped
    if not mapped.board_flags & lib.VGL_ROW_MEMORY:
        return
    snap = region.snapshot(all_devices=True)
    by_uuid = {}
    for entry in mapped.by_uuid:
        given = entry.request if entry.flags & lib.VGL_UUID_REQUEST else entry.limit
        if entry.flags & (lib.VGL_UUID_REQUEST | lib.VGL_UUID_MEMORY):
            by_uuid[format_uuid(bytes(entry.uuid), mig=bool(entry.flags & lib.VGL_UUID_MIG))] = \
                MemoryLimit._from_cdata(given)
    terms = _Guarantee([d.request or d.limit for d in snap.devices],
                       {u: g for u, g in by_uuid.items() if g is not None}, snap.memory_wait_ns)
    try:
        board.set_memory(board.reachable(snap.board, region.path), region.path, terms)
    except board.BoardError as exc:
        if exc.errno != errno.ESRCH:   # its row is gone with its container: nothing is guaranteed
            raise


@dataclass(frozen=True)
class _Guarantee:
    """What board.set_memory writes, as a region holds it."""

    per_device: list
    by_uuid: dict
    wait_ns: int

    def guarantee_per_device(self) -> list:
        return self.per_device

    def guarantee_by_uuid(self) -> dict:
        return self.by_uuid

    def memory_wait_ns(self) -> int:
        return self.wait_ns


def _request_text(request) -> str:
    return "none (the cap)" if request is None else request.describe()


def _set_priority(region: Region, before, priority: str) -> list[str]:
    """The board first: where it cannot be written (inside a container),
    nothing changes, not even the region the tenant could write itself."""
    from vgpulimit import board

    if before.board is None:
        raise UsageError(f"set --priority {priority}: the container takes no part in priorities (it "
                         "was started without one); give it one when it starts: vgpulimit run --priority, "
                         "or the vgpulimit.io/priority annotation")
    # The row is found by the region file, not by the row its region names (the tenant's to write).
    row = board.set_priority(board.reachable(before.board, region.path), region.path, priority)
    region.set_priority(priority, before.board, row.row, row.key)
    return [] if before.priority == priority else [f"priority: {before.priority} → {priority}"]


def _ranges(indices: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3,5"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _memory_text(limit) -> str:
    return "no cap" if limit is None else limit.describe()


def _cores_text(pct: int) -> str:
    return f"{pct}%" if pct else "no share"


def _change_line(old_limit, new_limit, old_pct: int, new_pct: int) -> str:
    """"memory 4 GiB → 2 GiB, cores 50% → 30%": only what changed."""
    parts = []
    if old_limit != new_limit:
        parts.append(f"memory {_memory_text(old_limit)} → {_memory_text(new_limit)}")
    if old_pct != new_pct:
        parts.append(f"cores {_cores_text(old_pct)} → {_cores_text(new_pct)}")
    return ", ".join(parts)

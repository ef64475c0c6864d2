"""What the views show (`status`, `top`, `metrics`): region snapshots, the
compute share measured between two of them, and `vgpulimit status` for people
(80 columns) and for programs (JSON, bytes as integers).

Reads only: each sample reads a validated copy of every region file
(region.read_snapshot), never maps one and never takes its locks, so a view
needs read access alone, and a file that one tenant truncated, grew or filled
with garbage is one line among the others, not a crash.  No terminal UI here
(top.py builds on this module, never the other way round)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vgpulimit import identity, nvml
from vgpulimit.limits import format_bytes
from vgpulimit.processes import (
    ProcessDetails,
    ProcessWatcher,
    format_age,
    host_pids,
    in_initial_pid_namespace,
    shown,
)
from vgpulimit.region import (
    MAGIC,
    DeviceSnapshot,
    ProcessSnapshot,
    RegionError,
    RegionSnapshot,
    read_snapshot,
)

if TYPE_CHECKING:
    from vgpulimit.node import NodeView


# -- reading regions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerView:
    """One region as a view shows it: its latest snapshot, and each device's
    compute share measured since the previous one."""

    snapshot: RegionSnapshot
    share_pct: Mapping[int, float] = field(default_factory=dict)  # device -> % of the whole GPU;
                                                                   # absent: not measured (n/a)

    @property
    def path(self) -> str:
        return self.snapshot.path


@dataclass(frozen=True)
class Sample:
    views: tuple[ContainerView, ...]
    errors: tuple[tuple[str, str], ...] = ()  # (path, why) of region files that could not be read
    details: Mapping[int, ProcessDetails] = field(default_factory=dict)  # host pid -> the host's
                                              # figures of each listed process; absent: not known
    found_host_pids: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (pid, start
                                              # time) -> host pid, as the host's /proc tells
    device_count: int | None = None           # the GPUs NVML shows here; None: not known

    def host_pid(self, proc: ProcessSnapshot) -> int | None:
        """The process's pid on the host: found by its pid in its container and
        its start time where the view sees the host's /proc, else its slot's.
        The slot's is its tenant's word: the pid its shim found itself under
        in the driver's list (a simulated driver names a process in a /proc of
        its own otherwise to it than to the host)."""
        return self.found_host_pids.get((proc.pid, proc.start_ticks)) or proc.host_pid


def find_regions(directory: str | os.PathLike) -> list[str]:
    """Every region file under ``directory`` (the private run directories
    included), recognised by its magic; sorted."""
    found = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if name.endswith(".tmp"):   # a region being created: not there yet
                continue
            path = os.path.join(root, name)
            if _starts_like_a_region(path):
                found.append(path)
    return sorted(found)


def _starts_like_a_region(path: str) -> bool:
    """Regular files only, links not followed: a FIFO, a device or a link
    that a tenant left in its directory is neither waited on nor opened."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def measured_share(before: DeviceSnapshot | None, after: DeviceSnapshot, elapsed_ns: int) -> float | None:
    """The device's GPU time over wall time between two snapshots, in percent
    of the whole GPU; None when there is no earlier snapshot to compare."""
    if before is None or elapsed_ns <= 0 or after.busy_ns < before.busy_ns:
        return None
    return 100.0 * (after.busy_ns - before.busy_ns) / elapsed_ns


class Sampler:
    """Reads regions again and again: the named files, and every region under
    ``directory`` as containers come and go.  Each sample measures the
    compute share since the one before."""

    def __init__(self, paths: Sequence[str] = (),
                 directory: str | Sequence[str] | None = None) -> None:
        self._paths = [os.fspath(p) for p in paths]
        # Several: a node may keep regions in vgpulimit's layout and in HAMi's.
        self._directories = [directory] if isinstance(directory, str) else list(directory or ())
        self._previous: dict[str, RegionSnapshot] = {}
        self.watcher = ProcessWatcher()
        self._looked: set[int] = set()
        # Host pids are ours to look up only where our /proc is the host's.
        self._host_view = in_initial_pid_namespace()

    def sample(self, strict: bool = True) -> Sample:
        """Regions that cannot be read are reported in ``errors``; with
        ``strict``, a named one raises RegionError instead."""
        views: list[ContainerView] = []
        errors: list[tuple[str, str]] = []
        found = sorted({p for d in self._directories for p in find_regions(d)})
        for path in set(self._previous) - set(found) - set(self._paths):
            del self._previous[path]
        for path in self._paths + [p for p in found if p not in self._paths]:
            try:
                views.append(self._view(path, read_snapshot(path)))
            except RegionError as exc:
                if strict and path in self._paths:
                    raise
                self._previous.pop(path, None)
                errors.append((path, exc.reason))
        self.watcher.forget_others(self._looked)
        self._looked = set()
        details = {}
        found = {}
        if self._host_view:
            if any(p.start_ticks for v in views for p in v.snapshot.processes):
                host = host_pids()
                found = {(p.pid, p.start_ticks): host[(p.pid, p.start_ticks)]
                         for v in views for p in v.snapshot.processes
                         if (p.pid, p.start_ticks) in host}
            for view in views:
                for proc in view.snapshot.processes:
                    pid = found.get((proc.pid, proc.start_ticks)) or proc.host_pid
                    if pid:
                        details[pid] = self.watcher.details(pid, proc.start_ticks)
        self._looked.update(details)
        return Sample(tuple(views), tuple(errors), details, found)

    def look(self, pids: Iterable[int]) -> dict[int, ProcessDetails]:
        """The host's figures of further processes (the driver's, in no region);
        what was kept of processes no longer looked at is dropped."""
        found = {pid: self.watcher.details(pid) for pid in pids} if self._host_view else {}
        self._looked.update(found)
        return found

    def _view(self, path: str, snap: RegionSnapshot) -> ContainerView:
        before = self._previous.get(path)
        self._previous[path] = snap
        shares: dict[int, float] = {}
        if before is not None:
            earlier = {d.index: d for d in before.devices}
            for dev in snap.devices:
                share = measured_share(earlier.get(dev.index), dev, snap.taken_ns - before.taken_ns)
                if share is not None:
                    shares[dev.index] = share
        return ContainerView(snap, shares)


def devices_of(view: ContainerView, sample: Sample | None = None) -> tuple[DeviceSnapshot, ...]:
    """The region's devices that the container has: each that its processes
    have used, and of the others (a cap for every device is kept for all
    sixteen numbers) those below the count of GPUs the hook recorded the
    container was given, else of the GPUs NVML shows here.  Where neither is
    known (a view with no driver), a process that initialised CUDA noted
    every device it has (its UUID): those and the used ones; before any
    did, every one."""
    given = identity.of_region(view.path).gpus
    count = len(given) if given is not None else (sample.device_count if sample else None)
    if count is None:
        if not any(dev.uuid for dev in view.snapshot.devices):
            return view.snapshot.devices
        return tuple(dev for dev in view.snapshot.devices if dev.seen or dev.uuid)
    return tuple(dev for dev in view.snapshot.devices
                 if dev.seen or dev.uuid or dev.index < count)


def _bytes_or_dash(count: int | None) -> str:
    return "-" if count is None else format_bytes(count)


def _limit_text(dev: DeviceSnapshot) -> str:
    if dev.limit is None:
        return "none"
    if dev.limit.ppm and dev.cap_bytes is not None:
        percent = dev.limit.describe().split("%")[0]
        return f"{format_bytes(dev.cap_bytes)} ({percent}%)"
    return dev.limit.describe()


def _index_ranges(indices: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3,5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def _device_rows(devices: tuple[DeviceSnapshot, ...]) -> list[tuple[str, ...]]:
    """One row per device; devices that no process has used yet and that have
    the same limit share a row, so sixteen unused slots take one line."""
    rows: list[tuple[str, ...]] = []
    unseen: dict[str, list[int]] = {}
    for dev in devices:
        if dev.total_bytes == 0 and dev.used_bytes == 0 and dev.oom_refusals == 0:
            unseen.setdefault(_limit_text(dev), []).append(dev.index)
            continue
        rows.append((
            str(dev.index),
            _limit_text(dev),
            format_bytes(dev.used_bytes),
            _bytes_or_dash(dev.free_bytes),
            # What the container may use, as nvidia-smi's Total reads inside it;
            # the device's own size has its column.
            _bytes_or_dash(dev.cap_bytes if dev.cap_bytes is not None else dev.total_bytes or None),
            _bytes_or_dash(dev.total_bytes or None),
            str(dev.oom_refusals),
        ))
    for limit_text, indices in unseen.items():
        rows.append((_index_ranges(indices), limit_text, "-", "-", "-", "not seen", "-"))
    return rows


def _process_used(proc: ProcessSnapshot) -> str:
    if not proc.used_bytes:
        return "0 B"
    return ", ".join(f"{format_bytes(n)} on {d}" for d, n in sorted(proc.used_bytes.items()))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def _share_text(view: ContainerView, index: int) -> str:
    share = view.share_pct.get(index)
    return "n/a" if share is None else f"{share:.0f}%"


def _compute_rows(view: ContainerView, devices: tuple[DeviceSnapshot, ...]
                  ) -> list[tuple[str, ...]]:
    """Devices the container used, or that have a compute cap (unused ones
    with the same cap share a row)."""
    rows: list[tuple[str, ...]] = []
    unseen: dict[int, list[int]] = {}
    for dev in devices:
        if not dev.seen:
            if dev.cores_pct:
                unseen.setdefault(dev.cores_pct, []).append(dev.index)
            continue
        rows.append((str(dev.index), _cores_text(dev.cores_pct, dev.cores_policy),
                     _share_text(view, dev.index), f"{dev.throttled_ns / 1e9:.1f} s"))
    for cores, indices in unseen.items():
        rows.append((_index_ranges(indices), f"{cores}%", "-", "-"))
    return rows


def _cores_text(cores_pct: int, policy: str) -> str:
    """"30%", or "30% borrow" / "30% none" where the policy is not the hard cap."""
    if not cores_pct:
        return "none"
    return f"{cores_pct}%" + ("" if policy == "hard" else f" {policy}")


def process_row(proc: ProcessSnapshot, details: ProcessDetails | None,
                host_pid: int | None = None) -> tuple[str, ...]:
    """PID, HOST PID, USER, CPU, RSS, AGE, USED, COMMAND; a process that is
    gone shows no memory."""
    host = str(host_pid or proc.host_pid or "-")
    comm = shown(proc.comm)
    if details is not None and details.gone:
        return (str(proc.pid), host, "-", "-", "-", "-", "gone", comm)
    if details is None:
        return (str(proc.pid), host, "-", "-", "-", "-", _process_used(proc), comm)
    return (str(proc.pid), host, shown(details.user) or "-",
            "-" if details.cpu_pct is None else f"{details.cpu_pct:.0f}%",
            _bytes_or_dash(details.rss_bytes), format_age(details.age_s), _process_used(proc),
            shown(details.command) or comm)


PROCESS_HEADER = ("PID", "HOST PID", "USER", "CPU", "RSS", "AGE", "GPU MEMORY", "COMMAND")


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def render_text(view: ContainerView | RegionSnapshot, sample: Sample | None = None,
                width: int = 80) -> str:
    if isinstance(view, RegionSnapshot):
        view = ContainerView(view)
    snap = view.snapshot
    who = identity.of_region(snap.path)
    named = f" - {shown(who.name)}" if who.name else ""
    lines = [f"region {shown(snap.path)} (generation {snap.generation}){named}", ""]
    devices = devices_of(view, sample)
    if devices:
        lines += _table(("DEVICE", "LIMIT", "USED", "FREE", "TOTAL", "PHYSICAL", "OOM REFUSED"),
                        _device_rows(devices))
        compute = _compute_rows(view, devices)
        if compute:
            lines.append("")
            lines += _table(("DEVICE", "COMPUTE CAP", "MEASURED SHARE", "THROTTLED"), compute)
    else:
        lines.append("no limits set and no device seen yet")
    lines.append("")
    if snap.processes:
        sample = sample or Sample(())
        rows = []
        for proc in snap.processes:
            host = sample.host_pid(proc)
            rows.append(process_row(proc, sample.details.get(host or -1), host))
        lines += [_cut(line, width) for line in _table(PROCESS_HEADER, rows)]
    else:
        lines.append("no processes attached")
    return "\n".join(lines) + "\n"


def render_text_all(sample: Sample, node: NodeView | None = None) -> str:
    """The physical GPUs first (with ``node``), then every container, one
    block each; unreadable region files at the end."""
    head = ""
    if node is not None:
        from vgpulimit.node import render_text as render_node

        head = render_node(node, sample)
    if not sample.views and not sample.errors:
        return head + "\n" * bool(head) + "no regions found\n"
    blocks = [head] * bool(head) + [render_text(view, sample) for view in sample.views]
    blocks += [f"region {shown(path)}: {shown(why)}\n" for path, why in sample.errors]
    return "\n".join(blocks)


def identity_json(who: identity.Identity) -> dict[str, Any]:
    return {"container_id": who.container_id or None,
            **{label: value or None for label, value in who.labels().items()},
            "gpus": None if who.gpus is None else list(who.gpus)}


def _process_json(proc: ProcessSnapshot, sample: Sample) -> dict[str, Any]:
    host = sample.host_pid(proc)
    details = sample.details.get(host or -1)
    gone = details is not None and details.gone
    return {
        "pid": proc.pid,
        "host_pid": host,
        "comm": proc.comm,
        "gone": gone,
        "used_bytes": None if gone else proc.total_used_bytes,
        "devices": [] if gone else [{"index": d, "used_bytes": n}
                                    for d, n in sorted(proc.used_bytes.items())],
        "host": None if details is None else details.to_json(),
    }


def to_json(view: ContainerView | RegionSnapshot, sample: Sample | None = None) -> dict[str, Any]:
    if isinstance(view, RegionSnapshot):
        view = ContainerView(view)
    snap = view.snapshot
    return {
        "region": snap.path,
        "identity": identity_json(identity.of_region(snap.path)),
        "generation": snap.generation,
        "devices": [
            {
                "index": dev.index,
                "uuid": dev.uuid,
                "limit": None if dev.limit is None else {
                    "bytes": dev.limit.bytes or None,
                    "ppm": dev.limit.ppm or None,
                    "text": dev.limit.describe(),
                },
                "cap_bytes": dev.cap_bytes,
                "cores_pct": dev.cores_pct or None,
                "cores_policy": dev.cores_policy,
                "total_bytes": dev.total_bytes or None,
                "used_bytes": dev.used_bytes,
                "free_bytes": dev.free_bytes,
                "oom_refusals": dev.oom_refusals,
                "compute_share_pct": view.share_pct.get(dev.index),
                "busy_ns": dev.busy_ns,
                "throttled_ns": dev.throttled_ns,
            }
            for dev in devices_of(view, sample)
        ],
        "processes": [_process_json(proc, sample or Sample(())) for proc in snap.processes],
    }


def render_json(view: ContainerView | RegionSnapshot, sample: Sample | None = None) -> str:
    return json.dumps(to_json(view, sample), indent=2) + "\n"


def render_json_all(sample: Sample, node: NodeView | None = None) -> str:
    document: dict[str, Any] = {}
    if node is not None:
        from vgpulimit.node import node_json

        document |= node_json(node, sample)
    document |= {
        "regions": [to_json(view, sample) for view in sample.views],
        "errors": [{"region": path, "error": why} for path, why in sample.errors],
    }
    return json.dumps(document, indent=2) + "\n"


def take(paths: Iterable[str] = (), directory: str | Sequence[str] | None = None, interval_s: float = 0.0) -> Sample:
    """One reading for `status`: two samples ``interval_s`` apart, so that
    the compute share is measured (none with 0), and the count of GPUs NVML
    shows here (devices_of)."""
    sampler = Sampler(list(paths), directory)
    sample = sampler.sample()
    if interval_s > 0:
        time.sleep(interval_s)
        sample = sampler.sample()
    return dataclasses.replace(sample, device_count=nvml.device_count())

"""What the views show (`status`, `top`, `metrics`): region snapshots, the
compute share measured between two of them: the model of `vgpulimit status`
(render.py writes it for people and for programs).

Reads only: each sample reads a validated copy of every region file
(region.read_snapshot), never maps one and never takes its locks, so a view
needs read access alone, and a file that one tenant truncated, grew or filled
with garbage is one line among the others, not a crash.  No terminal UI here
(render.py and top.py build on this module, never the other way round)."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpulimit import identity, nvml
from vgpulimit.agent.journal import Seen, seen_by
from vgpulimit.board import reachable
from vgpulimit.layouts import pod_names
from vgpulimit.processes import (
    ProcessDetails,
    ProcessWatcher,
    host_pids,
    in_initial_pid_namespace,
)
from vgpulimit.region import (
    MAGIC,
    DeviceSnapshot,
    ProcessSnapshot,
    RegionError,
    RegionSnapshot,
    read_snapshot,
    running_processes,
)
from vgpulimit.suspend_record import Record, read_record

# -- reading regions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerView:
    """One region as a view shows it: its latest snapshot, and each device's
    compute share measured since the previous one."""

    snapshot: RegionSnapshot
    share_pct: Mapping[int, float] = field(default_factory=dict)  # device -> % of the whole GPU;
                                                                   # absent: not measured (n/a)
    suspend: Record = field(default_factory=Record)               # its suspends and resumes
    agent: Seen | None = None                                     # its board's node agent; None: no row

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
    pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # pod UID -> (namespace,
                                              # name), from the kubelet's logs (layouts.pod_names)

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
                 directory: str | Sequence[str] | None = None, pod_logs: str | None = None) -> None:
        self._pod_logs = pod_logs
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
        running = running_processes()   # once: a node may have a thousand regions
        for path in self._paths + [p for p in found if p not in self._paths]:
            try:
                views.append(self._view(path, read_snapshot(path, running=running)))
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
        return Sample(tuple(views), tuple(errors), details, found, pods=pod_names(self._pod_logs))

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
        board = reachable(snap.board, path) if snap.board else None
        return ContainerView(snap, shares, read_record(path), seen_by(board, path, time.monotonic_ns()))


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

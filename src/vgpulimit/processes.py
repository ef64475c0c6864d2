"""What the host knows of a process a view lists (psutil): its full command
line, user, CPU use, resident memory, age and container.

A process is named by its pid in the host's pid namespace, as the regions'
slots and the NVIDIA driver name it.  One that has exited -- or whose pid now
belongs to another process (its start time differs from the one its slot
recorded) -- is "gone": a view shows it as such and never with memory."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import psutil

from vgpulimit.region import start_time_shift


def shown(text: str) -> str:
    """``text`` safe to put on a terminal: every character that is not
    printable -- control characters (an escape sequence, a newline that would
    forge a row), format characters such as a right-to-left override -- as
    its Python escape (``\\x1b``), and a byte that was not UTF-8 as ``\\xff``
    (plain).  For what a tenant controls and a text view or a metric's label
    shows: command lines, process names, container names and ids, paths.
    JSON output escapes the rest by itself and keeps the text as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else plain(c) if _UNDECODED.match(c) else ascii(c)[1:-1]
                   for c in text)


# What os.fsdecode and psutil make of a byte that is not UTF-8 (surrogateescape).
_UNDECODED = re.compile("[\udc80-\udcff]")


def plain(text: str) -> str:
    """``text`` with each byte that was not UTF-8 -- a path, an argv, a user
    name as the OS gave them -- written ``\\xff``: text that every encoder
    takes (UTF-8 refuses the lone surrogates Python holds such bytes as)."""
    return _UNDECODED.sub(lambda m: f"\\x{ord(m[0]) - 0xDC00:02x}", text)


@dataclass(frozen=True)
class ProcessDetails:
    pid: int                    # in the host's pid namespace
    gone: bool = False          # exited, or the pid is another process's now
    command: str = ""           # the full command line ("[comm]" for a kernel thread or no argv)
    user: str = ""
    cpu_pct: float | None = None   # of one CPU, since the previous look; None: first look
    rss_bytes: int | None = None   # host memory it holds (resident set)
    age_s: float | None = None
    container_id: str = ""      # its container's, by its cgroup (container_id_of)

    def to_json(self) -> dict:
        return {"gone": self.gone, "command": self.command or None, "user": self.user or None,
                "cpu_pct": self.cpu_pct, "rss_bytes": self.rss_bytes, "age_s": self.age_s,
                "container_id": self.container_id or None}


# A cgroup path's component named by a container's id: <id> (containerd or
# runc on cgroupfs), cri-containerd-<id>.scope, crio-<id>.scope,
# docker-<id>.scope (systemd's cgroup driver).
_CONTAINER_COMPONENT = re.compile(r"(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?")


def container_id_of(cgroup_text: str) -> str:
    """The id of the container whose cgroup the process is in, as
    /proc/<pid>/cgroup (``cgroup_text``) says, "" where none: the id that
    `crictl ps` and a pod's status (containerd://<id>) show, which tells apart
    the containers of one region (the containers of a claim of HAMi's DRA
    driver share one).  The outermost such component is the runtime's: a
    process cannot leave its cgroup without privileges its container does
    not have, but where its cgroups are delegated it may make ones below it,
    and name them as it likes."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for component in path.split("/"):
            found = _CONTAINER_COMPONENT.fullmatch(component)
            if found:
                return found[1]
    return ""


def _container_id(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return container_id_of(f.read(64 * 1024))
    except (OSError, UnicodeDecodeError):
        return ""


def _start_ticks(pid: int, shift: int | None = None) -> int | None:
    """/proc/<pid>/stat's starttime, as a region's slot records it (in the
    initial time namespace: ``shift``, this process's start_time_shift(),
    taken off)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return None
    fields = line[line.rfind(b")") + 2:].split()
    if len(fields) <= 19:
        return None
    return int(fields[19]) - (start_time_shift() if shift is None else shift)


class ProcessWatcher:
    """Looks processes up again and again; keeps each one between looks so
    that its CPU use is measured over the time between them."""

    def __init__(self) -> None:
        self._seen: dict[int, psutil.Process] = {}

    def details(self, pid: int, start_ticks: int = 0) -> ProcessDetails:
        """``start_ticks``: the start time its slot recorded (0: not known)."""
        if start_ticks and _start_ticks(pid) not in (start_ticks, None):
            self._seen.pop(pid, None)
            return ProcessDetails(pid, gone=True)
        proc = self._seen.get(pid)
        first = proc is None or not proc.is_running()
        try:
            if first:
                proc = psutil.Process(pid)
                self._seen[pid] = proc
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                argv = proc.cmdline()
                command = " ".join(argv) if argv else f"[{proc.name()}]"
                try:
                    user = proc.username()
                except KeyError:   # a uid with no name on the host
                    user = str(proc.uids().real)
                rss = proc.memory_info().rss
                age = max(0.0, time.time() - proc.create_time())
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._seen.pop(pid, None)
            return ProcessDetails(pid, gone=True)
        except psutil.AccessDenied:
            return ProcessDetails(pid)
        return ProcessDetails(pid, command=command, user=user, cpu_pct=None if first else cpu,
                              rss_bytes=rss, age_s=age, container_id=_container_id(pid))

    def forget_others(self, pids: set[int]) -> None:
        """Drops what is kept of processes no longer listed."""
        for pid in set(self._seen) - pids:
            del self._seen[pid]


def format_age(seconds: float | None) -> str:
    """"42s", "17m", "5h03m", "3d04h"."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def host_pids() -> dict[tuple[int, int], int]:
    """(pid, start time) -> host pid, for every process on the machine under
    each pid it has (NSpid: the host's, then each namespace's down to its
    own): how a slot that knows only its pid in the container (its container
    has a /proc of its own) is found among the host's processes, and in the
    driver's process list.  The start time tells apart two processes of one
    pid in different containers.  Empty where our /proc is not the host's."""
    found: dict[tuple[int, int], int] = {}
    if not in_initial_pid_namespace():
        return found
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    shift = start_time_shift()
    for name in names:
        if not name.isdecimal():
            continue
        start = _start_ticks(int(name), shift)
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue   # exited meanwhile
        if start is None:
            continue
        for line in status.splitlines():
            if line.startswith(b"NSpid:"):
                for pid in line.split()[1:]:
                    found[(int(pid), start)] = int(name)
    return found


def in_initial_pid_namespace() -> bool:
    try:
        return os.stat("/proc/self/ns/pid").st_ino == 0xEFFFFFFC
    except OSError:
        return False

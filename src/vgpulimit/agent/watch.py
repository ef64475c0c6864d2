"""What the node agent sees (docs/agent.md): the node's board (the setters'
rules), each container's region and suspend record, its beacon's claims,
verified, and the GPUs as the driver counts them (NVML).  Reads only.

The setters' rules are read from the board, which tenants cannot write: a
row's priority, guarantee and idle limit.  A container's region is found by
the file its row names (device and inode), among the region files under the
directories the agent watches.  What a tenant writes is believed only as a
claim the agent can verify:

- a waiter: its beacon says so on a device, a live process of the container
  holds the byte a waiter holds locked (waits.c: the kernel drops it when the
  process dies), and its region's live slots say it waits there too;
- an ask to be resumed: a live process holds the byte a suspended
  container's calls lock (resume_ask.c);
- its use: the most of its region's count and what the driver lists for its
  processes, so that claiming less use than it has gets it nothing;
- idleness: the driver's per-process utilisation (NVML), not the beacon."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpulimit._paths import core
from vgpulimit.errors import VgpulimitError
from vgpulimit.limits import PRIORITIES
from vgpulimit.region import find_regions

ffi, lib = core()

F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)


def uuid_key(text: str | bytes | None) -> str | None:
    """A device's UUID as its 32 hex digits (GPU- and MIG- forms alike)."""
    if text is None:
        return None
    if isinstance(text, bytes):
        return None if not any(text) else text.hex()
    digits = re.sub(r"[^0-9a-f]", "", text.lower().split("-", 1)[-1])
    return digits or None


@dataclass(frozen=True)
class BoardRow:
    row: int
    key: int
    rank_name: str                                   # "high", "normal", "low"
    region_dev: int
    region_ino: int
    suspended: bool
    idle_limit_ms: int
    memory: bool                                     # takes part in elastic memory
    guarantee_by_index: Mapping[int, tuple[int, int]]   # index -> (bytes, ppm)
    guarantee_by_uuid: Mapping[str, tuple[int, int]]
    owner_pid: int = 0                               # its holder; once gone, the row is no one's

    def guarantee(self, index: int, uuid: str | None, total: int) -> int:
        given = self.guarantee_by_uuid.get(uuid) if uuid else None
        if given is None:
            given = self.guarantee_by_index.get(index, (0, 0))
        nbytes, ppm = given
        return nbytes if nbytes else total * ppm // 1_000_000


def read_board(path: str) -> dict[int, BoardRow] | None:
    """The held rows of the board at ``path``; None when it is not a board."""
    size = ffi.sizeof("struct vgl_board")
    try:
        with open(path, "rb") as f:
            image = bytearray(f.read(size + 1))
    except OSError:
        return None
    if lib.vgl_board_check(ffi.from_buffer(image), len(image)) != 0:
        return None
    b = ffi.cast("struct vgl_board *", ffi.from_buffer(image))
    rows = {}
    for i in range(lib.VGL_BOARD_ROWS):
        r = b.row[i]
        if not r.key:
            continue
        ranked = r.flags & lib.VGL_ROW_PRIORITY and r.priority < len(PRIORITIES)
        rows[i] = BoardRow(
            row=i, key=int(r.key), rank_name=PRIORITIES[r.priority] if ranked else "normal",
            region_dev=int(r.region_dev), region_ino=int(r.region_ino),
            suspended=bool(r.flags & lib.VGL_ROW_SUSPENDED), idle_limit_ms=int(r.suspend_idle_ms),
            memory=bool(r.flags & lib.VGL_ROW_MEMORY),
            guarantee_by_index={d: (int(r.guarantee[d].bytes), int(r.guarantee[d].ppm))
                                for d in range(lib.VGL_MAX_DEVICES)
                                if r.guarantee[d].bytes or r.guarantee[d].ppm},
            guarantee_by_uuid={uuid_key(bytes(g.uuid)): (int(g.guarantee.bytes), int(g.guarantee.ppm))
                               for g in r.guarantee_by_uuid if any(bytes(g.uuid))},
            owner_pid=int(r.owner_pid))
    return rows


def beacon_name(key: int) -> str:
    name = ffi.new("char[]", lib.VGL_BEACON_NAME_LEN)
    lib.vgl_beacon_name(key, name)
    return ffi.string(name).decode()


def byte_held(fd: int, at: int) -> bool:
    """Whether some process holds a lock on byte ``at`` of the file open at ``fd``."""
    query = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, at, 1, 0)
    try:
        answer = fcntl.fcntl(fd, F_OFD_GETLK, query)
    except OSError:
        return False
    return struct.unpack("hh4xqqi4x", answer)[0] != fcntl.F_UNLCK


def waits_byte(device: int) -> int:
    return (ffi.offsetof("struct vgl_beacon", "device") + device * ffi.sizeof("struct vgl_beacon_device")
            + ffi.offsetof("struct vgl_beacon_device", "waiters"))


RESUME_BYTE = ffi.offsetof("struct vgl_beacon", "pad")   # resume_ask.c


@dataclass(frozen=True)
class Beacon:
    """What a container's beacon claims, with the locks that back each claim."""

    waits: Mapping[str, int] = field(default_factory=dict)   # UUID -> oldest wait (ns), held waits only
    asks: bool = False


def read_beacon(path: str) -> Beacon:
    """Read, never mapped, and only a regular file of a beacon's size (a
    tenant's file: one cut short or replaced by a FIFO stalls no one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return Beacon()
    try:
        st = os.fstat(fd)
        size = ffi.sizeof("struct vgl_beacon")
        if not (st.st_mode & 0o170000 == 0o100000 and st.st_size == size):
            return Beacon()
        image = bytearray(os.pread(fd, size, 0))
        if len(image) != size or lib.vgl_beacon_check(ffi.from_buffer(image), size) != 0:
            return Beacon()
        b = ffi.cast("struct vgl_beacon *", ffi.from_buffer(image))
        waits = {}
        for d in range(lib.VGL_MAX_DEVICES):
            e = b.device[d]
            uuid = uuid_key(bytes(e.uuid))
            if uuid and e.waiters and e.oldest_wait_ns and byte_held(fd, waits_byte(d)):
                waits[uuid] = int(e.oldest_wait_ns)
        return Beacon(waits, byte_held(fd, RESUME_BYTE))
    except OSError:
        return Beacon()
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Gpu:
    uuid: str            # uuid_key
    total_bytes: int
    free_bytes: int
    used_by_pid: Mapping[int, int]       # the driver's list: host pid -> bytes
    active_pids: frozenset[int]          # processes with work on it since the last look


class Driver:
    """The node's GPUs through NVML: free memory, processes, utilisation."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise VgpulimitError("agent: nvidia-ml-py (pynvml) is not installed: the agent needs the "
                                 "driver's figures") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise VgpulimitError(f"agent: NVML does not start ({exc}): the agent needs the driver's "
                                 "figures") from None
        self.seen_us: dict[str, int] = {}

    def gpus(self) -> dict[str, Gpu]:
        n = self.nvml
        found = {}
        for i in range(n.nvmlDeviceGetCount()):
            handle = n.nvmlDeviceGetHandleByIndex(i)
            uuid = uuid_key(n.nvmlDeviceGetUUID(handle))
            memory = n.nvmlDeviceGetMemoryInfo(handle)
            try:
                procs = {int(p.pid): int(p.usedGpuMemory or 0) for p in n.nvmlDeviceGetComputeRunningProcesses(handle)}
            except n.NVMLError:
                procs = {}
            found[uuid] = Gpu(uuid, int(memory.total), int(memory.free), procs, self._active(uuid, handle))
        return found

    def _active(self, uuid: str, handle) -> frozenset[int]:
        """Processes that had work on the GPU since the last look (NVML's
        samples newer than the newest seen)."""
        n = self.nvml
        last = self.seen_us.get(uuid, 0)
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, last)
        except n.NVMLError:
            return frozenset()
        active = set()
        for s in samples:
            if s.timeStamp > last and (s.smUtil or s.memUtil):
                active.add(int(s.pid))
            self.seen_us[uuid] = max(self.seen_us.get(uuid, 0), int(s.timeStamp))
        return frozenset(active)


def watched_regions(board_path: str, extra: Iterable[str]) -> dict[tuple[int, int], str]:
    """(device, inode) -> path of every region file under the directories
    the agent watches: the board's (`run`'s regions are beside its board),
    the node directory of the OCI hook's board (<node dir>/.priority/), and
    ``extra``."""
    from vgpulimit.board import NODE_BOARD_DIR

    board_dir = os.path.dirname(os.path.abspath(board_path))
    dirs = [os.path.dirname(board_dir) if os.path.basename(board_dir) == NODE_BOARD_DIR else board_dir, *extra]
    found = {}
    for d in dirs:
        for path in find_regions(d):
            try:
                st = os.stat(path)
            except OSError:
                continue
            found.setdefault((st.st_dev, st.st_ino), path)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def now_ns() -> int:
    """The node's clock (CLOCK_MONOTONIC), which beacons and records use."""
    return time.monotonic_ns()

"""The region file, read and written through the shim's own C code (cffi).

The layout is declared once, in shim/include/vgpulimit/region.h; this module
reads a ``struct vgl_region`` field by field through cffi and gives the values
names and types.  It never re-declares the layout.

Two ways in.  ``Region`` maps the file read-write, as the container's
processes do (the supervisor, ``vgpulimit set``), under the C side's guard
against the file being truncated beneath the mapping.  ``read_snapshot``, for
the views, reads a copy with ordinary reads (read access is all it needs)
and validates the copy before it believes a byte of it: any process of a
container may write its region, and a view reads every container's.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpulimit._paths import core
from vgpulimit.errors import VgpulimitError
from vgpulimit.limits import MemoryLimit, format_uuid

ffi, lib = core()

MAX_DEVICES: int = lib.VGL_MAX_DEVICES
PARENT_LEN: int = lib.VGL_PARENT_LEN
MAX_SLOTS: int = lib.VGL_MAX_SLOTS
REGION_BYTES: int = ffi.sizeof("struct vgl_region")
MAGIC: bytes = bytes(ffi.buffer(lib.vgl_region_magic(), 8))


class RegionError(VgpulimitError, OSError):
    """A region call failed; the message is the C side's line for the error
    (``reason``, with ``detail`` after it) and the path it was about."""

    def __init__(self, path: str, err: int, action: str = "", detail: str = "",
                 line: str | None = None) -> None:
        self.path = path
        self.reason = line if line is not None else \
            ffi.string(lib.vgl_region_strerror(err)).decode(errors="replace")
        if detail:
            self.reason += f" ({detail})"
        where = f"{action} {path}" if action else path
        super().__init__(-err, f"{where}: {self.reason}", path)

    def __str__(self) -> str:
        return self.strerror


@dataclass(frozen=True)
class DeviceSnapshot:
    index: int
    limit: MemoryLimit | None   # None: no cap
    cap_bytes: int | None       # limit resolved against total_bytes; None: none, or not known yet
    cores_pct: int              # 0: no compute cap
    total_bytes: int            # 0: no process has seen the device yet
    used_bytes: int
    oom_refusals: int
    throttled_ns: int = 0       # time the container's launches waited for compute budget
    busy_ns: int = 0            # GPU time its kernels took; its growth over wall time is the share
    cores_policy: str = "hard"  # hard, borrow or none (limits.CORES_POLICIES)
    uuid: str | None = None     # "GPU-…" or "MIG-…" as NVML names it; None until a process has seen it
    yielded_ns: int = 0         # time its launches held back for containers of a higher priority
    # Elastic memory (docs/memory.md):
    request: MemoryLimit | None = None   # the guarantee as given; None: the cap
    waiting: int = 0            # allocations waiting for memory now
    waited_ns: int = 0          # time allocations spent waiting for memory, in all
    wait_timeouts: int = 0      # waits that ended in a refusal
    borrow_refusals: int = 0    # allocations past the request refused for others' guarantees

    @property
    def request_bytes(self) -> int | None:
        """The guarantee in bytes: the request resolved against the device (at
        most the cap), else the cap; None when neither is known."""
        if self.request is None or not self.total_bytes:
            return self.cap_bytes
        asked = _cap_bytes(self.request, self.total_bytes)
        return asked if self.cap_bytes is None else min(asked, self.cap_bytes)

    @property
    def borrowed_bytes(self) -> int:
        """Bytes in use past the guarantee."""
        guaranteed = self.request_bytes
        return 0 if guaranteed is None else max(self.used_bytes - guaranteed, 0)

    @property
    def seen(self) -> bool:
        """Whether a process of the container has used the device."""
        return bool(self.total_bytes or self.used_bytes or self.oom_refusals or self.busy_ns)

    @property
    def free_bytes(self) -> int | None:
        """Bytes left under the cap (or on the device with no cap); None when unknown."""
        room = self.cap_bytes if self.cap_bytes is not None else (self.total_bytes or None)
        if room is None:
            return None
        return max(room - self.used_bytes, 0)


@dataclass(frozen=True)
class ProcessSnapshot:
    pid: int
    host_pid: int | None        # None: unknown
    comm: str
    used_bytes: Mapping[int, int] = field(default_factory=dict)  # device -> bytes, non-zero only
    start_ticks: int = 0        # /proc/<pid>/stat starttime, in the initial time namespace
                                # (0: not known): a reused pid is another

    @property
    def total_used_bytes(self) -> int:
        return sum(self.used_bytes.values())


@dataclass(frozen=True)
class RegionSnapshot:
    path: str
    generation: int
    devices: tuple[DeviceSnapshot, ...]
    processes: tuple[ProcessSnapshot, ...]
    taken_ns: int = 0           # time.monotonic_ns() when read: shares divide by its growth
    priority: str | None = None  # high, normal or low (limits.PRIORITIES); None: takes no part
    board: str | None = None     # the node's priority board the container's row is in
    memory_wait_ns: int = 0      # how long an allocation that would be refused waits for memory


class Slot:
    """A process's slot in a region (from ``Region.attach``)."""

    def __init__(self, region: Region, cdata) -> None:
        self._region = region
        self._cdata = cdata

    @property
    def pid(self) -> int:
        return int(self._cdata.pid)


def _limit_struct(limit: MemoryLimit | None):
    out = ffi.new("struct vgl_mem_limit *")
    if limit is not None:
        out.bytes = limit.bytes
        out.ppm = limit.ppm
    return out


def _uuid_limits(memory: Mapping[str, MemoryLimit | None], cores: Mapping[str, int],
                 request: Mapping[str, MemoryLimit | None] | None = None):
    """Limits by UUID as the region's table (struct vgl_uuid_limit[MAX_DEVICES])."""
    request = request or {}
    uuids = list(dict.fromkeys([*memory, *cores, *request]))
    if len(uuids) > MAX_DEVICES:
        raise ValueError(f"limits by UUID: more than {MAX_DEVICES} devices")
    table = ffi.new("struct vgl_uuid_limit[]", MAX_DEVICES)
    for entry, uuid in zip(table, uuids):
        if lib.vgl_parse_uuid(uuid.encode(), entry.uuid) != 0:
            raise ValueError(f"{uuid!r} is not a GPU or MIG device UUID (or is all zeros)")
        if uuid in memory:
            entry.flags |= lib.VGL_UUID_MEMORY
            if memory[uuid] is not None:
                entry.limit.bytes = memory[uuid].bytes
                entry.limit.ppm = memory[uuid].ppm
        if uuid in cores:
            entry.flags |= lib.VGL_UUID_CORES
            entry.cores_pct = cores[uuid]
        if uuid in request:
            entry.flags |= lib.VGL_UUID_REQUEST
            if request[uuid] is not None:
                entry.request.bytes = request[uuid].bytes
                entry.request.ppm = request[uuid].ppm
        if entry.flags and uuid[:4].upper() == "MIG-":
            entry.flags |= lib.VGL_UUID_MIG   # the kind, as it was given: the 16 bytes do not say
    return table


def _device_list(values: Sequence | Mapping | None, default, name: str) -> list:
    """Per-device values as a full list of MAX_DEVICES: from a sequence (index
    = device) or a mapping {device: value}."""
    result = [default] * MAX_DEVICES
    if values is None:
        return result
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    for index, value in items:
        if not 0 <= index < MAX_DEVICES:
            raise ValueError(f"{name}: device {index} is out of range 0-{MAX_DEVICES - 1}")
        result[index] = value
    return result


class Region:
    """An open, mapped region file.  Use as a context manager, or close()."""

    def __init__(self, path: str | os.PathLike, cdata) -> None:
        self.path = os.fspath(path)
        self._cdata = cdata

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        memory: Sequence[MemoryLimit | None] | Mapping[int, MemoryLimit | None] | None = None,
        cores_pct: Sequence[int] | Mapping[int, int] | None = None,
        group_shared: bool = False,
        parent: str | None = None,
        memory_by_uuid: Mapping[str, MemoryLimit | None] | None = None,
        cores_by_uuid: Mapping[str, int] | None = None,
        request: Sequence[MemoryLimit | None] | Mapping[int, MemoryLimit | None] | None = None,
        request_by_uuid: Mapping[str, MemoryLimit | None] | None = None,
        memory_wait_ns: int = 0,
    ) -> Region:
        """Creates a region file (0600, or 0660 with ``group_shared``) with
        these limits per device, nested in the region at ``parent`` (what its
        processes use counts there too), and opens it.  Limits by device UUID
        ("GPU-…") apply to the device of that UUID whatever CUDA in the
        container numbers it.  Fails if the file exists."""
        fspath = os.fspath(path)
        occupant = _not_a_file(fspath)
        if occupant:
            raise RegionError(fspath, -errno.EEXIST, "cannot create",
                              line=f"{occupant} is there; give a path where no file exists")
        limits = ffi.new("struct vgl_mem_limit[]", MAX_DEVICES)
        for index, limit in enumerate(_device_list(memory, None, "memory")):
            if limit is not None:
                limits[index].bytes = limit.bytes
                limits[index].ppm = limit.ppm
        cores = ffi.new("uint32_t[]", _device_list(cores_pct, 0, "cores_pct"))
        by_uuid = _uuid_limits(memory_by_uuid or {}, cores_by_uuid or {}, request_by_uuid)
        requests = ffi.new("struct vgl_mem_limit[]", MAX_DEVICES)
        for index, asked in enumerate(_device_list(request, None, "request")):
            if asked is not None:
                requests[index].bytes = asked.bytes
                requests[index].ppm = asked.ppm
        err = lib.vgl_region_create_elastic(os.fsencode(fspath), limits, cores, by_uuid, requests, memory_wait_ns,
                                            int(group_shared), os.fsencode(parent) if parent else ffi.NULL)
        if err == -errno.ENOSPC:   # not "every slot is taken", as for an attach
            raise RegionError(fspath, err, "cannot create", line=f"no space left on its filesystem for the "
                              f"region's {REGION_BYTES // 1024} KiB (nothing was left behind)")
        if err < 0:
            raise RegionError(fspath, err, "cannot create")
        return cls.open(fspath)

    @classmethod
    def open(cls, path: str | os.PathLike) -> Region:
        """Maps the file read-write; a truncation under the mapping then
        breaks the region (RegionError from its calls), not the process."""
        fspath = os.fspath(path)
        out = ffi.new("struct vgl_region **")
        err = lib.vgl_region_open(os.fsencode(fspath), out)
        if err == 0:
            err = lib.vgl_region_guard(out[0])
            if err < 0:
                lib.vgl_region_close(out[0])
        if err < 0:
            raise RegionError(fspath, err, "cannot open")
        return cls(fspath, out[0])

    def close(self) -> None:
        if self._cdata is not None:
            lib.vgl_region_unguard(self._cdata)
            lib.vgl_region_close(self._cdata)
            self._cdata = None

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._cdata is None

    @property
    def intact(self) -> bool:
        """False once the file lost pages under the mapping (it was
        truncated): what is read or written here is no longer shared."""
        return self._cdata is not None and not lib.vgl_region_broken(self._cdata)

    @property
    def _mapped(self):
        if self._cdata is None:
            raise RegionError(self.path, -errno.EBADF, "closed region")
        return self._cdata

    def _error(self, err: int, action: str) -> RegionError:
        """The error of a call; a lock held past its bound names its holder."""
        detail = ""
        if err == -errno.ETIMEDOUT and self._cdata is not None:
            detail = f"held by thread {lib.vgl_region_lock_holder(self._cdata)}"
        return RegionError(self.path, err, action, detail)

    def _outcome(self, err: int) -> int:
        """A C call's result, or -EBADF when the file lost pages by its end:
        what it did went to private zeros, not to the container."""
        return err if self.intact else -errno.EBADF

    # -- writers -------------------------------------------------------------

    def attach(self, pid: int, host_pid: int = 0) -> Slot:
        out = ffi.new("struct vgl_slot **")
        err = self._outcome(lib.vgl_region_attach(self._mapped, pid, host_pid, out))
        if err < 0:
            raise self._error(err, f"cannot attach pid {pid} to")
        return Slot(self, out[0])

    def detach(self, slot: Slot) -> None:
        lib.vgl_region_detach(self._mapped, slot._cdata)

    def reclaim(self) -> int:
        """Frees the slots of processes that no longer exist; returns how many."""
        count = self._outcome(lib.vgl_region_reclaim(self._mapped))
        if count < 0:
            raise self._error(count, "cannot reclaim in")
        return int(count)

    def repair_beacon(self, beacon: str) -> bool:
        """Writes into the container's beacon at ``beacon`` (the file beside
        the board its setter made) what its live slots say of waits for
        memory: a waiter killed as it waited is said no longer.  False when
        the beacon cannot be written (gone, or not a beacon)."""
        return self._outcome(lib.vgl_beacon_repair(os.fsencode(beacon), self._mapped)) == 0

    def set_limits(self, device: int, limit: MemoryLimit | None, cores_pct: int = 0) -> None:
        err = self._outcome(lib.vgl_region_set_limits(self._mapped, device, _limit_struct(limit),
                                                      cores_pct))
        if err < 0:
            raise self._error(err, f"cannot set the limits of device {device} in")

    def set_request(self, device: int, request: MemoryLimit | None) -> None:
        """Sets the memory request of device ``device`` (None: none, the cap)."""
        err = self._outcome(lib.vgl_region_set_request(self._mapped, device, _limit_struct(request)))
        if err < 0:
            raise self._error(err, f"cannot set the memory request of device {device} in")

    def set_memory_wait(self, wait_ns: int) -> None:
        err = self._outcome(lib.vgl_region_set_memory_wait(self._mapped, wait_ns))
        if err < 0:
            raise self._error(err, "cannot set the memory wait in")

    def set_suspend_state(self, state: int) -> None:
        """The setter's word of a suspend (suspend.py): enum vgl_suspend_state."""
        if not lib.VGL_SUSPEND_RUNNING <= state <= lib.VGL_SUSPEND_RESUMING:
            raise ValueError(f"suspend state {state}")
        self._mapped.suspend_state = state
        # Bumps the generation: the shim's launches look again, and a suspended
        # container's ask to be resumed (resume_ask.c, docs/agent.md).
        self._outcome(lib.vgl_region_set_memory_wait(self._mapped, int(self._mapped.memory_wait_ns)))

    def set_uuid_limits(self, uuid: str, limit: MemoryLimit | None = None, cores_pct: int | None = None,
                        memory_given: bool = False) -> None:
        """Sets the limits of the device with ``uuid`` ("GPU-…"), bound to an
        index or not yet: the memory cap when ``memory_given`` (None: no cap),
        the share when ``cores_pct`` is not None (0: none)."""
        entry = _uuid_limits({uuid: limit} if memory_given else {},
                             {uuid: cores_pct} if cores_pct is not None else {})
        if not entry[0].flags:
            return
        # The entry replaces what was given for that UUID: keep the other half.
        for existing in self._mapped.by_uuid:
            if existing.flags and bytes(existing.uuid) == bytes(entry[0].uuid):
                if not memory_given and existing.flags & lib.VGL_UUID_MEMORY:
                    entry[0].limit = existing.limit
                    entry[0].flags |= lib.VGL_UUID_MEMORY
                if cores_pct is None and existing.flags & lib.VGL_UUID_CORES:
                    entry[0].cores_pct = existing.cores_pct
                    entry[0].flags |= lib.VGL_UUID_CORES
                if existing.flags & lib.VGL_UUID_REQUEST:
                    entry[0].request = existing.request
                    entry[0].flags |= lib.VGL_UUID_REQUEST
        err = self._outcome(lib.vgl_region_set_uuid_limit(self._mapped, entry))
        if err < 0:
            raise self._error(err, f"cannot set the limits of {uuid} in")

    def set_cores_policy(self, policy: str) -> None:
        """What the share means on every device while others leave it idle
        (limits.CORES_POLICIES)."""
        from vgpulimit.limits import CORES_POLICIES

        value = CORES_POLICIES.index(policy)
        for index in range(MAX_DEVICES):
            self._mapped.devices[index].cores_policy = value
        # Writing device 0's limits as they are bumps the generation: every
        # process looks at its limits again (a launch that saw none may now
        # have one).
        dev = self._mapped.devices[0]
        self._outcome(lib.vgl_region_set_limits(self._mapped, 0, ffi.addressof(dev, "limit"),
                                                int(dev.cores_pct)))

    @property
    def board_row(self) -> int:
        return int(self._mapped.board_row)

    @property
    def board_key(self) -> int:
        return int(self._mapped.board_key)

    def set_priority(self, priority: str, board: str, row: int, key: int) -> None:
        """Records the container's priority and its row in the node's board
        (board.py): the row is what the shim goes by, this for the views."""
        from vgpulimit.limits import PRIORITIES

        encoded = os.fsencode(board)
        if len(encoded) >= PARENT_LEN:
            raise RegionError(self.path, -errno.ENAMETOOLONG, "cannot name the board",
                              f"{board} is longer than {PARENT_LEN - 1} bytes")
        mapped = self._mapped
        mapped.board_row = row
        mapped.board_key = key
        ffi.memmove(mapped.board, encoded + b"\0", len(encoded) + 1)
        mapped.priority = PRIORITIES.index(priority)
        mapped.board_flags |= lib.VGL_ROW_PRIORITY
        dev = mapped.devices[0]
        self._outcome(lib.vgl_region_set_limits(mapped, 0, ffi.addressof(dev, "limit"), int(dev.cores_pct)))

    def set_board_row(self, board: str, row: int, key: int) -> None:
        """Records the container's row in the node's board for elastic
        memory (board.set_memory): the row is what the shim goes by."""
        encoded = os.fsencode(board)
        if len(encoded) >= PARENT_LEN:
            raise RegionError(self.path, -errno.ENAMETOOLONG, "cannot name the board",
                              f"{board} is longer than {PARENT_LEN - 1} bytes")
        mapped = self._mapped
        mapped.board_row = row
        mapped.board_key = key
        ffi.memmove(mapped.board, encoded + b"\0", len(encoded) + 1)
        mapped.board_flags |= lib.VGL_ROW_MEMORY
        self.set_memory_wait(int(mapped.memory_wait_ns))   # bumps the generation: processes look again

    def reserve(self, slot: Slot, device: int, nbytes: int, cap_bytes: int | None = None) -> bool:
        """Reserves bytes in the ledger as the shim does for an allocation;
        False (and a refusal counted) when they do not fit under the cap."""
        cap = 2**64 - 1 if cap_bytes is None else cap_bytes
        err = self._outcome(lib.vgl_region_reserve(self._mapped, slot._cdata, device, nbytes, cap))
        if err == -errno.ENOMEM:
            return False
        if err < 0:
            raise self._error(err, f"cannot reserve on device {device} in")
        return True

    def release(self, slot: Slot, device: int, nbytes: int) -> None:
        lib.vgl_ledger_release(self._mapped, slot._cdata, device, nbytes)

    # -- reader --------------------------------------------------------------

    def snapshot(self, all_devices: bool = False) -> RegionSnapshot:
        """The region as it is now, from a copy of the mapping validated as
        read_snapshot validates the file."""
        image = bytearray(ffi.buffer(self._mapped, REGION_BYTES))
        err = self._outcome(0)
        if err < 0:
            raise RegionError(self.path, err, "cannot read")
        return _snapshot(self.path, image, REGION_BYTES, all_devices)


# read_snapshot's default: look at the machine's processes for this one region.
_LOOK = frozenset({(-1, -1)})


def read_snapshot(path: str | os.PathLike, all_devices: bool = False,
                  running: frozenset[tuple[int, int]] | None = _LOOK) -> RegionSnapshot:
    """The region file at ``path`` as it is now, for the views: read with
    ordinary reads, never mapped (a file truncated under a mapping kills its
    reader), so read access is enough; validated before any of it is
    believed.  Read without the region's locks: each number is current, the
    set of them may be a moment apart.  RegionError: the file cannot be read,
    or is no whole region of this version, or holds values vgpulimit never
    writes (garbled).  ``running``: running_processes() as the caller found
    them, so that a view of many regions looks at the machine's processes
    once, not once per region (by default, looked at for this one)."""
    fspath = os.fspath(path)
    try:
        image, got, size = _read_copy(fspath)
    except OSError as exc:
        raise RegionError(fspath, -(exc.errno or errno.EIO), "cannot open") from None
    return _snapshot(fspath, image, got, all_devices, action="region",
                     detail=f"{size} bytes, expected {REGION_BYTES}",
                     running=running_processes() if running is _LOOK else running)


def _read_copy(path: str) -> tuple[bytearray, int, int]:
    """Up to one byte more than a region from the file (so that a grown one
    shows), the count read, and the file's size."""
    # O_NONBLOCK: a FIFO planted in its place must not hang the view.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EPROTO, "not a regular file")
        image = bytearray(REGION_BYTES + 1)
        got = 0
        with memoryview(image) as view:
            while got < len(image) and (n := f.readinto(view[got:])):
                got += n
    return image, got, st.st_size


def _snapshot(path: str, image: bytearray, size: int, all_devices: bool,
              action: str = "cannot read", detail: str = "",
              running: frozenset[tuple[int, int]] | None = _LOOK) -> RegionSnapshot:
    """A snapshot of ``size`` bytes of a region in ``image``, once the C side
    has validated them.  Devices with no limit that no process has seen are
    left out unless ``all_devices``."""
    taken_ns = time.monotonic_ns()
    err = lib.vgl_region_check(ffi.from_buffer(image), size)
    if err < 0:
        raise RegionError(path, err, action, detail if err == -errno.EBADF else "")
    region = ffi.cast("struct vgl_region *", ffi.from_buffer(image))
    # A view never writes, so it cannot reclaim the slots of processes that
    # are gone; it leaves them (and their bytes) out instead.
    if running is _LOOK:
        running = running_processes()
    claimed = [region.slots[i] for i in _live_slot_indices(image)]
    live = [slot for slot in claimed
            if slot.state == lib.VGL_SLOT_LIVE
            and (running is None or not slot.start_time
                 or (int(slot.pid), int(slot.start_time)) in running)]
    gone = [0] * MAX_DEVICES
    # What waits is what the live slots say: a process killed as it waited
    # waits no longer, before anyone reclaims its slot.
    waiting = [sum(int(slot.waiting[d]) for slot in live) for d in range(MAX_DEVICES)]
    if running is not None:
        for slot in claimed:
            if slot.state == lib.VGL_SLOT_LIVE and slot.start_time and \
                    (int(slot.pid), int(slot.start_time)) not in running:
                for d in range(MAX_DEVICES):
                    gone[d] += int(slot.used_bytes[d])
    devices = []
    for index in range(MAX_DEVICES):
        dev = region.devices[index]
        limit = MemoryLimit._from_cdata(dev.limit)
        total_bytes = int(dev.total_bytes)
        if total_bytes == 0 and limit is None and not all_devices:
            continue
        devices.append(
            DeviceSnapshot(
                index=index,
                limit=limit,
                cap_bytes=_cap_bytes(limit, total_bytes),
                cores_pct=int(dev.cores_pct),
                cores_policy=_policy_name(int(dev.cores_policy)),
                total_bytes=total_bytes,
                used_bytes=max(0, int(dev.used_bytes) - gone[index]),
                oom_refusals=int(dev.oom_refusals),
                throttled_ns=int(dev.throttled_ns),
                busy_ns=int(dev.busy_ns),
                uuid=_uuid_text(bytes(dev.uuid), int(dev.uuid_kind)),
                yielded_ns=int(region.yielded_ns[index]),
                request=MemoryLimit._from_cdata(dev.request),
                waiting=waiting[index],
                waited_ns=int(dev.waited_ns),
                wait_timeouts=int(dev.wait_timeouts),
                borrow_refusals=int(dev.borrow_refusals),
            )
        )
    processes = []
    for slot in live:
        used = {d: int(n) for d, n in enumerate(slot.used_bytes) if n}
        processes.append(
            ProcessSnapshot(
                pid=int(slot.pid),
                host_pid=int(slot.host_pid) or None,
                comm=ffi.string(slot.comm).decode("utf-8", "surrogateescape"),   # a view escapes it
                used_bytes=used,
                start_ticks=int(slot.start_time),
            )
        )
    return RegionSnapshot(
        path=path,
        generation=int(region.generation),
        devices=tuple(devices),
        processes=tuple(processes),
        taken_ns=taken_ns,
        priority=_priority_of(region),
        board=ffi.string(region.board).decode(errors="replace") or None,
        memory_wait_ns=int(region.memory_wait_ns),
    )


_SLOTS_AT = ffi.offsetof("struct vgl_region", "slots")
_SLOT_BYTES = ffi.sizeof("struct vgl_slot")
_STATE_AT = ffi.offsetof("struct vgl_slot", "state")
assert _SLOT_BYTES % 4 == 0 and _STATE_AT % 4 == 0, "a slot's state is a uint32_t on a 4-byte boundary"


def _live_slot_indices(image: bytearray) -> list[int]:
    """The slots whose state is live, read as plain integers: a region has a
    thousand slots and few in use, and looking at each through cffi is most
    of the time a node's scrape takes."""
    start = _SLOTS_AT + _STATE_AT
    with memoryview(image) as view, view[start:start + MAX_SLOTS * _SLOT_BYTES] as slots, \
            slots.cast("I") as words:
        states = words[::_SLOT_BYTES // 4].tolist()
    return [i for i, state in enumerate(states) if state == lib.VGL_SLOT_LIVE]


def start_time_shift() -> int:
    """What this process's time namespace adds to every starttime its /proc
    shows (clock ticks): taken off one before it is compared with a slot's,
    which is the initial time namespace's.  0 outside a time namespace."""
    return int(lib.vgl_region_start_time_shift())


# The kernel's inode number of the initial pid namespace (PROC_PID_INIT_INO).
_INITIAL_PID_NS = 0xEFFFFFFC


def running_processes() -> frozenset[tuple[int, int]] | None:
    """(pid, start time) of every process on the machine under each pid it
    has (NSpid: the host's, then each namespace's down to its own), as a slot
    names its process (the pid its container sees, /proc/<pid>/stat's
    starttime as the initial time namespace reads it, the same in every
    namespace).  None where this process cannot
    see every process (not in the initial pid namespace, or /proc mounted
    with hidepid): then no slot is called gone."""
    try:
        if os.stat("/proc/self/ns/pid").st_ino != _INITIAL_PID_NS:
            return None
        # Readable only where /proc hides no process from us (hidepid).
        open("/proc/1/status", "rb").close()
        names = os.listdir("/proc")
    except OSError:
        return None
    shift = start_time_shift()
    running = set()
    for name in names:
        if not name.isdecimal():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat_line = f.read()
            with open(f"/proc/{name}/status", "rb") as f:
                status_text = f.read()
        except OSError:
            continue   # exited meanwhile
        fields = stat_line[stat_line.rfind(b")") + 2:].split()
        if len(fields) < 20 or fields[0] in (b"Z", b"X"):
            continue
        start = int(fields[19]) - shift   # field 22, counted from the state (field 3)
        for line in status_text.splitlines():
            if line.startswith(b"NSpid:"):
                running.update((int(pid), start) for pid in line.split()[1:])
    return frozenset(running)


def _not_a_file(path: str) -> str | None:
    """What stands at ``path`` if it is something other than a regular file
    ("a dangling symbolic link", "a directory", ...), which the C side would
    only call an existing region; None for nothing or a regular file."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                return "a dangling symbolic link"
    except OSError:
        return None   # nothing there, or out of reach: creating it says why
    if stat.S_ISREG(mode):
        return None
    return f"{_KINDS.get(stat.S_IFMT(mode), 'a special file')} (not a regular file)"


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def _uuid_text(raw: bytes, kind: int) -> str | None:
    """A device's 16 bytes as NVML prints its UUID, GPU- or MIG- as the region
    says (GPU- where no process could ask NVML); None when all zero (not seen
    yet)."""
    return format_uuid(raw, mig=kind == lib.VGL_UUID_KIND_MIG) if any(raw) else None


def _cap_bytes(limit: MemoryLimit | None, total_bytes: int) -> int | None:
    """The cap as the shim computes it, or None: no limit, or a share of a
    device whose size no process has reported yet."""
    if limit is None or (limit.ppm and total_bytes == 0):
        return None
    return limit.cap_bytes(total_bytes)


def _policy_name(value: int) -> str:
    from vgpulimit.limits import CORES_POLICIES

    return CORES_POLICIES[value] if 0 <= value < len(CORES_POLICIES) else "hard"


def _priority_of(region) -> str | None:
    from vgpulimit.limits import PRIORITIES

    if region.board[0] != b"\0" and not region.board_flags & lib.VGL_ROW_PRIORITY:
        return None   # a row for elastic memory alone
    return PRIORITIES[int(region.priority)] if region.board[0] != b"\0" or region.priority else None

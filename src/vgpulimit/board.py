"""The node's priority board (shim/include/vgpulimit/board.h), the setters'
side: `run`, `set` and the OCI hook give a container a row, change its
priority, and free the row, through the core's C code.  Containers only read
the board (the shim maps it read-only), so none can change a priority.

A row is the container's by its region file (device and inode), never by
the row and key its region records: those are the tenant's to write, so a
setter that went by them could be sent to another container's row."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from vgpulimit._paths import container_board, container_region, core
from vgpulimit.errors import VgpulimitError
from vgpulimit.limits import PRIORITIES

ffi, lib = core()

BOARD_NAME = "priority.board"
# The node's board of the OCI hook, in its node directory (a name no container
# id takes); its containers see it at _paths.container_board().
NODE_BOARD_DIR = ".priority"


class BoardError(VgpulimitError, OSError):
    """The board cannot be read or written."""

    def __str__(self) -> str:
        return self.strerror


@dataclass(frozen=True)
class Row:
    board: str
    row: int
    key: int

    @property
    def beacon(self) -> str:
        """The beacon's file name beside the board."""
        name = ffi.new("char[]", lib.VGL_BEACON_NAME_LEN)
        lib.vgl_beacon_name(self.key, name)
        return ffi.string(name).decode()


def _fail(board: str, err: int, action: str) -> BoardError:
    if err == -errno.ENOSPC:
        why = f"all {lib.VGL_BOARD_ROWS} rows are held by running containers"
    elif err in (-errno.EACCES, -errno.EPERM, -errno.EROFS):
        why = ("not writable here: priorities and memory guarantees are set by the node (vgpulimit run, "
               "the OCI hook), never from inside a container")
    elif err == -errno.ENOENT:
        why = "the container takes no part in priorities (it was started without one)"
    elif err == -errno.ESRCH:
        why = "the container's row is gone (the container ended, or its row was taken since)"
    elif err == -errno.EPROTONOSUPPORT:
        why = ("a board of another vgpulimit version (layout version differs): remove it once no container "
               "started by that version runs")
    elif err in (-errno.EPROTO, -errno.EBADMSG, -errno.EBADF):
        why = "not a priority board of this vgpulimit"
    else:
        why = os.strerror(-err)
    return BoardError(-err, f"{action} the priority board {board}: {why}")


def join(board: str, priority: str | None, region: str, owner_pid: int = 0, beacon_uid: int = -1) -> Row:
    """A row of ``priority`` (None: a row that takes no part in priorities,
    for elastic memory alone) for the container of the region file
    ``region``, held by ``owner_pid`` (a supervisor; 0: none)."""
    key = ffi.new("uint64_t *")
    row = ffi.new("uint32_t *")
    st = os.stat(region)
    rank = lib.VGL_BOARD_NO_PRIORITY if priority is None else PRIORITIES.index(priority)
    err = lib.vgl_board_join(os.fsencode(board), rank, owner_pid, beacon_uid, st.st_dev, st.st_ino, key, row)
    if err < 0:
        raise _fail(board, err, "cannot take a row in")
    return Row(board, int(row[0]), int(key[0]))


def find(board: str, region: str) -> Row | None:
    """The row of the container of the region file ``region``, or None."""
    try:
        st = os.stat(region)
        with open(board, "rb") as file:
            image = bytearray(file.read(ffi.sizeof("struct vgl_board") + 1))
    except OSError:
        return None
    if lib.vgl_board_check(ffi.from_buffer(image), len(image)) != 0:
        return None
    key = ffi.new("uint64_t *")
    row = lib.vgl_board_find(ffi.cast("struct vgl_board *", ffi.from_buffer(image)), st.st_dev, st.st_ino, key)
    return Row(board, row, int(key[0])) if row >= 0 else None


def set_priority(board: str, region: str, priority: str) -> Row:
    """Sets the priority of the row of the container of ``region``; its row."""
    try:
        st = os.stat(region)
    except OSError as exc:
        raise BoardError(exc.errno, f"cannot change the priority board {board}: the region {region}: "
                                    f"{exc.strerror}") from None
    err = lib.vgl_board_set(os.fsencode(board), st.st_dev, st.st_ino, PRIORITIES.index(priority))
    row = find(board, region) if err >= 0 else None
    if err >= 0 and row is None:
        err = -errno.ESRCH   # left between the two
    if err < 0:
        raise _fail(board, err, "cannot change")
    return row


def set_memory(board: str, region: str, limits) -> None:
    """Writes what the container of ``region`` is guaranteed (a
    request.Limits: its requests, else its caps) into its row."""
    from vgpulimit.limits import parse_uuid

    st = os.stat(region)
    guarantee = ffi.new("struct vgl_mem_limit[]", lib.VGL_MAX_DEVICES)
    for index, given in enumerate(limits.guarantee_per_device()):
        if given is not None:
            guarantee[index].bytes, guarantee[index].ppm = given.bytes, given.ppm
    by_uuid = ffi.new("struct vgl_board_guarantee[]", lib.VGL_MAX_DEVICES)
    for entry, (uuid, given) in zip(by_uuid, limits.guarantee_by_uuid().items()):
        lib.vgl_parse_uuid(parse_uuid(uuid, "a guarantee").encode(), entry.uuid)
        entry.guarantee.bytes, entry.guarantee.ppm = given.bytes, given.ppm
    err = lib.vgl_board_set_memory(os.fsencode(board), st.st_dev, st.st_ino, guarantee, by_uuid,
                                   limits.memory_wait_ns())
    if err < 0:
        raise _fail(board, err, "cannot write the memory guarantee in")


def set_suspended(board: str, region: str, suspended: bool) -> None:
    """Marks the row of the container of ``region`` suspended, or not
    (nothing if it has no row: it takes no part in elastic memory)."""
    st = os.stat(region)
    err = lib.vgl_board_set_suspended(os.fsencode(board), st.st_dev, st.st_ino, int(suspended))
    if err < 0 and err not in (-errno.ESRCH, -errno.ENOENT):
        raise _fail(board, err, "cannot mark the suspend in")


def wake_waiters(board: str, key: int) -> None:
    """Wakes whoever waits for memory on the wake words of the beacon of the
    row of ``key``, as a free by its container does: a setter's, when the
    container's memory leaves the GPU without its processes freeing any (a
    suspend).  Nothing where it has no beacon."""
    lib.vgl_beacon_wake(os.fsencode(os.path.join(os.path.dirname(board), Row(board, -1, key).beacon)))


def set_suspend_idle(board: str, region: str, idle_ms: int) -> None:
    """Writes how long the container of ``region`` may be idle before the
    node agent may suspend it (0: never) into its row."""
    st = os.stat(region)
    err = lib.vgl_board_set_suspend_idle(os.fsencode(board), st.st_dev, st.st_ino, idle_ms)
    if err < 0:
        raise _fail(board, err, "cannot write the idle limit in")


def reachable(board: str, region: str) -> str:
    """The board a region names, as this process reaches it.  A region of the
    OCI hook names the board as its container sees it; seen from the node,
    that is the board of the node directory the region is in
    (<node dir>/<container id>/region)."""
    if board != container_board() or os.path.realpath(region) == container_region():
        return board
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(region))), NODE_BOARD_DIR, BOARD_NAME)


def leave(row: Row) -> None:
    """Frees the row (nothing if it is gone already)."""
    lib.vgl_board_leave(os.fsencode(row.board), row.row, row.key)

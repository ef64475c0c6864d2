"""The node's priority board (shim/include/vgpulimit/board.h), the setters'
side: `run`, `set` and the OCI hook give a container a row, change its
priority, and free the row, through the core's C code.  Containers only read
the board (the shim maps it read-only), so none can change a priority."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from vgpulimit._paths import core
from vgpulimit.errors import VgpulimitError
from vgpulimit.limits import PRIORITIES

ffi, lib = core()

BOARD_NAME = "priority.board"


class BoardError(VgpulimitError, OSError):
    """The board cannot be read or written."""


@dataclass(frozen=True)
class Row:
    board: str
    row: int
    key: int

    @property
    def beacon(self) -> str:
        """The beacon's file name beside the board (board.c names it so)."""
        return f"beacon-{self.key:016x}"


def _fail(board: str, err: int, action: str) -> BoardError:
    if err == -errno.ENOSPC:
        why = f"all {lib.VGL_BOARD_ROWS} rows are held by running containers"
    elif err in (-errno.EACCES, -errno.EPERM, -errno.EROFS):
        why = ("not writable here: priorities are set by the node (vgpulimit run, the OCI hook), "
               "never from inside a container")
    elif err == -errno.ESRCH:
        why = "the container's row is gone (the container ended, or its row was taken since)"
    elif err in (-errno.EPROTO, -errno.EBADMSG, -errno.EBADF, -errno.EPROTONOSUPPORT):
        why = "not a priority board of this vgpulimit"
    else:
        why = os.strerror(-err)
    return BoardError(-err, f"{action} the priority board {board}: {why}")


def join(board: str, priority: str, owner_pid: int = 0, beacon_uid: int = -1) -> Row:
    """A row of ``priority`` for a new container, held by ``owner_pid`` (a
    supervisor; 0: none)."""
    key = ffi.new("uint64_t *")
    row = ffi.new("uint32_t *")
    err = lib.vgl_board_join(os.fsencode(board), PRIORITIES.index(priority), owner_pid, beacon_uid, key, row)
    if err < 0:
        raise _fail(board, err, "cannot take a row in")
    return Row(board, int(row[0]), int(key[0]))


def set_priority(row: Row, priority: str) -> None:
    err = lib.vgl_board_set(os.fsencode(row.board), row.row, row.key, PRIORITIES.index(priority))
    if err < 0:
        raise _fail(row.board, err, "cannot change")


def leave(row: Row) -> None:
    """Frees the row (nothing if it is gone already)."""
    lib.vgl_board_leave(os.fsencode(row.board), row.row, row.key)

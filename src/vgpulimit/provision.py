"""A tenant set up and taken back, in one place, whatever starts it: `vgpulimit
run`, the OCI hook (and so every container of a CRI pod given vgpulimit's CDI
device: its createRuntime and poststop hooks), the Slurm Prolog (and Epilog).  Engines differ in what they
hand over -- who the tenant is, where its files go, whose they are -- never in
how a tenant is set up.

Setting one up is, in this order: who it is, beside where its region will be
(a view that finds the region finds whose it is); the region with its limits;
its row in the node's board and its beacon (vgl_board_join makes both, or
neither); the row recorded in the region; the region given to its owner and
put where the tenant finds it.  It is all or nothing: a step that fails takes
back the steps before it, and the error is one line.  Taking a tenant back
goes by its files, never by what its region says (the tenant writes its region:
a setter that went by the row it names could be sent to another's row), so it
takes back a tenant half made, or made by another process, as well."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vgpulimit import board, identity
from vgpulimit.errors import VgpulimitError
from vgpulimit.region import Region
from vgpulimit.suspend_record import RECORD_SUFFIX

if TYPE_CHECKING:
    from vgpulimit.request import Limits

# Said where a tenant with a cap alone gets no row: it runs as without elastic memory.
CAP_UNKNOWN = "the container's cap is not known to containers that borrow memory (docs/memory.md)"


class ProvisionError(VgpulimitError):
    """A tenant cannot be set up; nothing of it is left behind.  ``board``:
    the node's board refused the row the tenant asked for."""

    def __init__(self, line: str, board: bool = False) -> None:
        super().__init__(line)
        self.board = board


@dataclass(frozen=True)
class Row:
    """Where a tenant's row in the node's board goes, and whose it is."""

    board: str                    # the board's path, as the setter reaches it
    seen_as: str | None = None    # the board's path as the tenant sees it (recorded in its region); None: board
    holder_pid: int = 0           # the process whose end frees the row (0: none, only a leave)
    beacon_uid: int = -1          # who may write the beacon (-1: the setter)
    cap_alone: bool = False       # a cap alone takes a row too where one is free; without one it is said
    suspend_idle_ms: int = 0      # the node agent may suspend it once idle this long (docs/agent.md); 0: never


@dataclass(frozen=True)
class Tenant:
    """Who a tenant is, what it may use, and where its files go."""

    region: Path                          # the region file
    limits: Limits
    who: identity.Identity | None = None  # written beside the region (identity.json)
    owner: tuple[int, int] | None = None  # (uid, gid) the region is given to; None: the setter's
    group_shared: bool = False            # the region 0660 rather than 0600
    parent: str | None = None             # the region it is nested in (a nested run)
    row: Row | None = None                # None: no row in any board

    def joins(self) -> bool:
        """Whether it takes a row: a priority or elastic memory (a row it must
        have), or a cap alone where ``row.cap_alone``."""
        limits = self.limits
        if self.row is None:
            return False
        return (limits.priority is not None or limits.elastic() or bool(self.row.suspend_idle_ms)
                or (self.row.cap_alone and limits.takes_memory_row()))

    def needs_row(self) -> bool:
        """A priority or elastic memory: without its row the tenant does not start."""
        return (self.limits.priority is not None or self.limits.elastic()
                or bool(self.row and self.row.suspend_idle_ms))

    @property
    def staged(self) -> Path:
        """The region's name while it is made for an owner."""
        return self.region.with_name(self.region.name + ".tmp")

    def staging(self) -> Path:
        """Where the region is made: an owner's region appears under its name
        whole and already theirs."""
        return self.region if self.owner is None else self.staged


@dataclass
class Provisioned:
    """What ``provision`` made: the region, open; the row (None: none); what the
    setter should say (a cap alone that got no row)."""

    region: Region
    row: board.Row | None
    notes: tuple[str, ...] = ()

    @property
    def beacon(self) -> str | None:
        """The beacon's path, as the setter reaches it."""
        return None if self.row is None else os.path.join(os.path.dirname(self.row.board), self.row.beacon)

    def close(self) -> None:
        self.region.close()


def provision(tenant: Tenant) -> Provisioned:
    """Sets the tenant up; its region is returned open.  ProvisionError (one
    line) if a step fails, with every step before it taken back."""
    region = row = None
    wrote = False
    notes: list[str] = []
    staging = tenant.staging()
    try:
        if tenant.who is not None:
            wrote = True
            _write_identity(tenant.region.parent, tenant.who)
        region = _create_region(tenant, staging)
        if tenant.limits.cores_policy is not None:
            region.set_cores_policy(tenant.limits.cores_policy.value)
        if tenant.joins():
            row = _join(tenant, region, notes)
        if tenant.owner is not None:
            os.chown(staging, *tenant.owner)
            os.rename(staging, tenant.region)
    except BaseException as exc:   # an interrupt half-way leaves nothing either
        if row is not None:
            board.leave(row)
        if region is not None:
            region.close()
            with contextlib.suppress(OSError):
                os.unlink(staging)
        for name in (identity.IDENTITY_NAME, f".{identity.IDENTITY_NAME}.tmp") if wrote else ():
            with contextlib.suppress(OSError):
                os.unlink(tenant.region.parent / name)
        if isinstance(exc, (VgpulimitError, OSError)):
            raise ProvisionError(_line(exc, tenant), isinstance(exc, board.BoardError)) from None
        raise
    return Provisioned(region, row, tuple(notes))


def deprovision(tenant: Tenant, keep_region: bool = False, row: board.Row | None = None) -> None:
    """Takes the tenant back: its row and beacon (``row``: the one
    ``provision`` gave a setter that still holds it; else the one its region
    file holds), its region (unless ``keep_region``) and who it is.
    Whatever of it is there, as far as it goes: a tenant half made, or taken
    back already, is no error."""
    found = row or row_of(tenant)
    if found is not None:
        board.leave(found)
    names = [] if keep_region else [tenant.region.name, tenant.staged.name, tenant.region.name + RECORD_SUFFIX]
    if tenant.who is not None:
        names += [identity.IDENTITY_NAME, f".{identity.IDENTITY_NAME}.tmp"]
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tenant.region.parent / name)


def row_of(tenant: Tenant) -> board.Row | None:
    """The row the tenant's region file holds, found by the file (device and
    inode), never by the row the region names, which the tenant may have
    written; None where it holds none."""
    if tenant.row is None:
        return None
    for path in (tenant.region, tenant.staged):
        found = board.find(tenant.row.board, str(path))
        if found is not None:
            return found
    return None


def _write_identity(directory: Path, who: identity.Identity) -> None:
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        identity.write(fd, who)
    finally:
        os.close(fd)


def _create_region(tenant: Tenant, path: Path) -> Region:
    limits = tenant.limits
    return Region.create(path, limits.memory_per_device(), limits.cores_per_device(),
                         group_shared=tenant.group_shared, parent=tenant.parent, request=limits.request_per_device(),
                         memory_wait_ns=limits.memory_wait_ns(), **limits.by_uuid())


def _join(tenant: Tenant, region: Region, notes: list[str]) -> board.Row | None:
    """The tenant's row (and beacon), its guarantee written in it, and the row
    recorded in its region; None for a cap alone that got no row (said in
    ``notes``)."""
    where, limits = tenant.row, tenant.limits
    priority = limits.priority
    row = None
    try:
        row = board.join(where.board, None if priority is None else priority.value, region.path,
                         owner_pid=where.holder_pid, beacon_uid=where.beacon_uid)
        if limits.takes_memory_row():
            board.set_memory(where.board, region.path, limits)
        if where.suspend_idle_ms:
            board.set_suspend_idle(where.board, region.path, where.suspend_idle_ms)
        seen_as = where.seen_as or where.board
        if priority is not None:
            region.set_priority(priority.value, seen_as, row.row, row.key)
        if limits.takes_memory_row():
            region.set_board_row(seen_as, row.row, row.key)
    except BaseException as exc:
        if row is not None:
            board.leave(row)
        if isinstance(exc, board.BoardError) and not tenant.needs_row():
            notes.append(f"{exc.strerror}; {CAP_UNKNOWN}")
            return None
        raise
    return row


def _line(exc: Exception, tenant: Tenant) -> str:
    """The one line a failure says: a board's names the setting that asked for the row."""
    if isinstance(exc, board.BoardError):
        limits = tenant.limits
        given = limits.priority or limits.memory_wait or next(iter([*limits.request.values(),
                                                                    *limits.request_by_uuid.values()]), None)
        return f"{exc.strerror}" if given is None else f"{given.source} {given.text}: {exc.strerror}"
    if isinstance(exc, VgpulimitError):
        return str(exc)
    return f"cannot set up the region in {tenant.region.parent}: {exc.strerror}"

"""Setting a tenant up and taking it back (provision.py), once for every
caller: `run`, the OCI hook and the Slurm Prolog all go through it, and their
own tests show what each hands over.  Here, the sequence: who it is, its
region, its row and beacon, the row recorded in the region, the region given
to its owner; and each step failing half-way, after which nothing of the
tenant is left and the failure is one line."""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT, GiB

from vgpulimit import board, identity, provision
from vgpulimit.region import PARENT_LEN, Region
from vgpulimit.request import resolve_limits

OWNER = (4321, 4322)
WHO = identity.Identity(container_id="c-1", pod="trainer", namespace="ml")


def _limits(**given):
    """The limits of a run with these flags (memory="4GiB", priority="high", …)."""
    return resolve_limits(given.pop("memory", None), [], {}, **given)


def _tenant(tmp_path: Path, limits, board_dir: Path | None = None, **row) -> provision.Tenant:
    entry = tmp_path / "node" / "c-1"
    entry.mkdir(parents=True, exist_ok=True)
    board_dir = board_dir or tmp_path / "node" / ".priority"
    board_dir.mkdir(parents=True, exist_ok=True)
    where = provision.Row(str(board_dir / board.BOARD_NAME), beacon_uid=OWNER[0], **row)
    return provision.Tenant(entry / "region", limits, who=WHO, owner=OWNER, group_shared=True, row=where)


def _rows(board_path: str) -> list[int]:
    """The rows held in the board, by their keys (none where there is no board)."""
    from vgpulimit._core import ffi

    try:
        image = bytearray(Path(board_path).read_bytes())
    except FileNotFoundError:
        return []
    return [row.key for row in ffi.cast("struct vgl_board *", ffi.from_buffer(image)).row if row.key]


def _beacons(board_path: str) -> list[str]:
    return sorted(p.name for p in Path(board_path).parent.glob("beacon-*"))


def _nothing_left(tenant: provision.Tenant) -> None:
    """No file of the tenant beside its region, no row, no beacon."""
    assert sorted(os.listdir(tenant.region.parent)) == []
    assert _rows(tenant.row.board) == []
    assert _beacons(tenant.row.board) == []


def _one_line(exc: pytest.ExceptionInfo) -> str:
    line = str(exc.value)
    assert "\n" not in line and line
    return line


# -- made whole, taken back whole ------------------------------------------------------------

def test_a_tenant_is_made_whole_and_taken_back_whole(tmp_path):
    tenant = _tenant(tmp_path, _limits(memory="4GiB", cores="30", priority="high", memory_request="1GiB"),
                     seen_as="/.vgpulimit/board/priority.board", holder_pid=os.getpid())
    made = provision.provision(tenant)
    made.close()
    st = os.stat(tenant.region)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (*OWNER, 0o660)
    assert sorted(os.listdir(tenant.region.parent)) == ["identity.json", "region"]
    assert identity.read(str(tenant.region)) == WHO
    with Region.open(tenant.region) as region:
        device = region.snapshot(all_devices=True).devices[0]
        assert (device.limit.bytes, device.cores_pct, device.request.bytes) == (4 * GiB, 30, 1 * GiB)
        assert (region.board_row, region.board_key) == (made.row.row, made.row.key)
    # The row is the region file's, found by its file; its beacon is the owner's to write.
    assert provision.row_of(tenant) == made.row
    assert _beacons(tenant.row.board) == [made.row.beacon]
    assert os.stat(made.beacon).st_uid == OWNER[0]
    assert made.notes == ()

    provision.deprovision(tenant)
    _nothing_left(tenant)
    provision.deprovision(tenant)   # taken back already: nothing to do, no error
    _nothing_left(tenant)


def test_a_tenant_with_a_cap_alone_takes_a_row_only_where_its_setter_asks(tmp_path):
    """`run` gives a cap alone a row (containers that borrow then know it);
    the hook does not; neither needs one to start."""
    limits = _limits(memory="2GiB")
    hook = _tenant(tmp_path / "hook", limits)
    assert provision.provision(hook).row is None
    assert _rows(hook.row.board) == []
    run = _tenant(tmp_path / "run", limits, cap_alone=True)
    made = provision.provision(run)
    assert made.row is not None and _rows(run.row.board) == [made.row.key]
    made.close()
    provision.deprovision(run)
    _nothing_left(run)


# -- failing half-way --------------------------------------------------------------------------

def _other_version_board(tenant: provision.Tenant) -> bytes:
    """A board an older vgpulimit wrote: the row cannot be taken in it."""
    image = b"VGLBOARD" + (2).to_bytes(4, sys.byteorder) + bytes(24 + 64 * 104 - 12)
    Path(tenant.row.board).write_bytes(image)
    return image


def test_a_board_that_refuses_the_row_leaves_no_region(tmp_path):
    """The region is made, then the row is refused: the region goes, and who
    the tenant is with it."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"))
    image = _other_version_board(tenant)
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    assert _one_line(refused) == (
        f"--priority high: cannot take a row in the priority board {tenant.row.board}: a board of another "
        "vgpulimit version (layout version differs): remove it once no container started by that version runs")
    assert refused.value.board
    assert os.listdir(tenant.region.parent) == []
    assert Path(tenant.row.board).read_bytes() == image


def test_a_cap_alone_that_gets_no_row_starts_and_says_why(tmp_path):
    tenant = _tenant(tmp_path, _limits(memory="4GiB"), cap_alone=True)
    _other_version_board(tenant)
    made = provision.provision(tenant)
    made.close()
    assert made.row is None
    assert made.notes == ((f"cannot take a row in the priority board {tenant.row.board}: a board of another vgpulimit "
                           "version (layout version differs): remove it once no container started by that version "
                           f"runs; {provision.CAP_UNKNOWN}"),)
    with Region.open(tenant.region) as region:
        assert region.snapshot().devices[0].limit.bytes == 4 * GiB


def test_a_beacon_that_cannot_be_made_leaves_no_row(tmp_path):
    """The board opens, but the beacon's path beside it is longer than a path
    can be: the C side writes no row without its beacon, and the region goes."""
    deep = tmp_path
    while len(os.fsencode(deep)) < 4076 - 200:
        deep = deep / ("d" * 200)
    deep = deep / ("d" * (4076 - len(os.fsencode(deep)) - 1))
    assert len(os.fsencode(deep / board.BOARD_NAME)) < os.pathconf("/", "PC_PATH_MAX")
    tenant = _tenant(tmp_path, _limits(memory="4GiB", memory_request="1GiB"), board_dir=deep)
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    assert _one_line(refused).startswith("--memory-request 1GiB: cannot take a row in the priority board ")
    assert _one_line(refused).endswith(": File name too long")
    _nothing_left(tenant)


def test_a_guarantee_that_cannot_be_written_gives_the_row_back(tmp_path, monkeypatch):
    """The row and its beacon are made, then the guarantee cannot be written
    in the row."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", memory_request="1GiB", priority="low"))

    def refuse(path, region, limits):
        assert _rows(path) != [] and _beacons(path) != []   # half-way indeed
        raise board.BoardError(errno.EIO, f"cannot write the memory guarantee in the priority board {path}: "
                                          "Input/output error")

    monkeypatch.setattr(board, "set_memory", refuse)
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    assert _one_line(refused) == (f"--priority low: cannot write the memory guarantee in the priority board "
                                  f"{tenant.row.board}: Input/output error")
    _nothing_left(tenant)


def test_a_cap_alone_whose_guarantee_cannot_be_written_starts_without_its_row(tmp_path, monkeypatch):
    """`run`'s cap alone: the row is made, its guarantee cannot be written;
    the row goes back, the tenant starts with its cap, and says so."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB"), cap_alone=True)

    def refuse(path, region, limits):
        raise board.BoardError(errno.EIO, "cannot write the memory guarantee: Input/output error")

    monkeypatch.setattr(board, "set_memory", refuse)
    made = provision.provision(tenant)
    made.close()
    assert made.row is None
    assert made.notes == (f"cannot write the memory guarantee: Input/output error; {provision.CAP_UNKNOWN}",)
    assert _rows(tenant.row.board) == [] and _beacons(tenant.row.board) == []
    assert sorted(os.listdir(tenant.region.parent)) == ["identity.json", "region"]


def test_a_region_that_cannot_name_its_board_gives_the_row_back(tmp_path):
    """The row and its beacon are made, then the region cannot record where
    the tenant sees the board (a path past the region's field)."""
    long = "/" + "b" * PARENT_LEN
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"), seen_as=long)
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    line = _one_line(refused)
    assert "cannot name the board" in line and f"is longer than {PARENT_LEN - 1} bytes" in line
    assert not refused.value.board
    _nothing_left(tenant)


def test_a_region_that_cannot_be_given_to_its_owner_is_taken_back(tmp_path, monkeypatch):
    """Everything is made but the last step: the region, root's still, under
    its staging name, cannot be given to the tenant's user."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"))

    def refuse(path, uid, gid):
        assert Path(path).name == "region.tmp" and _rows(tenant.row.board) != []
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))

    monkeypatch.setattr(os, "chown", refuse)
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    assert _one_line(refused) == f"cannot set up the region in {tenant.region.parent}: Operation not permitted"
    _nothing_left(tenant)


def test_an_interrupt_half_way_leaves_nothing_and_goes_on(tmp_path, monkeypatch):
    """A Ctrl-C (or any exception vgpulimit does not expect) once the row is
    made: everything is taken back, and the interrupt goes on as it was."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"))

    def interrupt(path, uid, gid):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "chown", interrupt)
    with pytest.raises(KeyboardInterrupt):
        provision.provision(tenant)
    _nothing_left(tenant)


def test_a_region_that_cannot_be_made_leaves_nothing(tmp_path):
    """Who the tenant is was written; the region cannot be made (a file is in
    its way): the identity goes, the file in the way stays."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"))
    tenant.region.with_name("region.tmp").mkdir()
    with pytest.raises(provision.ProvisionError) as refused:
        provision.provision(tenant)
    assert "give a path where no file exists" in _one_line(refused)
    assert os.listdir(tenant.region.parent) == ["region.tmp"]
    assert _rows(tenant.row.board) == []


# -- taking back ------------------------------------------------------------------------------

def test_a_half_made_tenant_is_taken_back(tmp_path):
    """A setter that died half-way (the hook killed, a Prolog cut short) left
    who the tenant is, its region under its staging name and its row: taking
    the tenant back finds each by its files."""
    tenant = _tenant(tmp_path, _limits(memory="4GiB", priority="high"))
    fd = os.open(tenant.region.parent, os.O_PATH | os.O_DIRECTORY)
    identity.write(fd, WHO)
    os.close(fd)
    staged = tenant.region.with_name("region.tmp")
    Region.create(staged, [None]).close()
    row = board.join(tenant.row.board, "high", str(staged))
    assert provision.row_of(tenant) == row
    provision.deprovision(tenant)
    _nothing_left(tenant)


def test_taking_back_goes_by_the_file_not_by_what_the_tenant_wrote(tmp_path):
    """A tenant writes its region: it names another tenant's row and key.
    Taking it back frees its own row, never the one it named."""
    mine = _tenant(tmp_path / "mine", _limits(memory="4GiB", priority="low"))
    other = provision.Tenant(tmp_path / "other" / "region", mine.limits, row=mine.row)
    other.region.parent.mkdir()
    theirs = provision.provision(other)
    made = provision.provision(mine)
    made.region.set_priority("low", mine.row.board, theirs.row.row, theirs.row.key)
    made.close()
    provision.deprovision(mine)
    assert _rows(mine.row.board) == [theirs.row.key]
    assert _beacons(mine.row.board) == [theirs.row.beacon]
    theirs.close()
    provision.deprovision(other)
    assert _rows(mine.row.board) == []


def test_the_callers_set_tenants_up_only_through_provision():
    """`run`, the OCI hook and the Slurm Prolog make no region and take no row
    themselves: a caller that did would set its tenants up its own way."""
    package = ROOT / "src" / "vgpulimit"
    makers = re.compile(r"\bRegion\.create\(|\bboard\.join\(|\bboard\.leave\(")
    found = {path.relative_to(package).as_posix() for path in package.rglob("*.py")
             if makers.search(path.read_text())}
    assert found == {"provision.py"}

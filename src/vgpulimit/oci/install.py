"""Install at createRuntime (or prestart), remove at poststop."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpulimit import identity
from vgpulimit.identity import Identity
from vgpulimit.oci import (
    BOARD_DIR,
    CONTAINER_BOARD_DIR,
    CONTAINER_DIR,
    CONTAINER_REGION,
    MANIFEST,
    PRELOAD,
    REGION_NAME,
    SHIM_PATH,
    HookError,
)
from vgpulimit.oci.admit import Admission, given_gpus, node_lock
from vgpulimit.oci.elf import check_architecture, check_glibc, elf_kind
from vgpulimit.oci.manifest import Manifest
from vgpulimit.oci.mounts import (
    AT_RECURSIVE,
    AT_SYMLINK_NOFOLLOW,
    attach_mount,
    clone_mount,
    detach,
    enter_mount_namespace,
    mount_id,
    remount_read_only,
)
from vgpulimit.oci.owner import region_owner
from vgpulimit.oci.preload import preload_tokens, with_line, without_line
from vgpulimit.oci.request import requested
from vgpulimit.oci.rootfs import Rootfs, split_path
from vgpulimit.oci.state import State, rootfs_of
from vgpulimit.oci.state import annotations as config_annotations


@dataclass(frozen=True)
class _Prepared:
    """What the host side hands the container side: open descriptors, since paths
    name other things once the hook is in the container's mount namespace."""

    node_fd: int        # the node directory
    entry_fd: int       # the container's directory in it
    tree: int           # the region, as a detached mount
    region: os.stat_result
    shim: bytes
    board_tree: int = -1     # with a priority: the board's directory, and the beacon,
    beacon_tree: int = -1    # as detached mounts
    beacon: str = ""


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _tenant(node_dir: Path, entry: Path, owner: tuple[int, int] = (0, 0), limits=None,
            who: Identity | None = None, pid: int = 0, idle_ms: int = 0):
    """The container as a tenant: its region in its directory of the node
    directory, root's until given to the container's user (0660: its group
    too), and its row in the node's board, which only the hook writes (root's,
    0644, mounted read-only in containers) and the container sees at
    CONTAINER_BOARD_DIR; its beacon is the container's user's to write.  The
    row is held by the container's init (``pid``): poststop frees it, and if
    no poststop comes, the next container to join takes it once that process
    is gone."""
    from vgpulimit import board, provision
    from vgpulimit.request import Limits

    row = provision.Row(str(node_dir / BOARD_DIR / board.BOARD_NAME),
                        seen_as=f"{CONTAINER_BOARD_DIR}/{board.BOARD_NAME}", holder_pid=pid, beacon_uid=owner[0],
                        suspend_idle_ms=idle_ms)
    return provision.Tenant(entry / REGION_NAME, limits or Limits(), who=who, owner=owner, group_shared=True,
                            row=row)


def _prepare_node(node_dir: Path, name: str, limits, owner: tuple[int, int],
                  who: Identity, pid: int = 0, again: bool = False, idle_ms: int = 0) -> _Prepared:
    """The container's tenant, set up by provision; ``again``: this very
    container's hook ran before (prestart, then createRuntime), and the
    region there is its own."""
    from vgpulimit import provision
    from vgpulimit._paths import libpath

    shim = libpath().read_bytes()
    node_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    entry = node_dir / name
    entry.mkdir(mode=0o700, exist_ok=True)
    tenant = _tenant(node_dir, entry, owner, limits, who, pid, idle_ms)
    region_path = tenant.region
    entry_fd = _open_dir(entry)
    try:
        if again and region_path.exists():
            identity.write(entry_fd, who)
            row = provision.row_of(tenant)
        else:
            # Left by an earlier container of this id whose hook did not finish
            # (no manifest): its limits are not this one's.
            provision.deprovision(tenant)
            if tenant.joins():
                (node_dir / BOARD_DIR).mkdir(mode=0o755, exist_ok=True)
            made = provision.provision(tenant)
            made.close()
            row = made.row
    except provision.ProvisionError as exc:
        os.close(entry_fd)
        raise HookError(str(exc)) from None
    except OSError:
        os.close(entry_fd)
        raise
    prepared = _Prepared(node_fd=_open_dir(node_dir), entry_fd=entry_fd,
                         tree=clone_mount(str(region_path)), region=os.stat(region_path), shim=shim)
    if row is None:
        return prepared
    return dataclasses.replace(prepared, board_tree=clone_mount(str(node_dir / BOARD_DIR)),
                               beacon_tree=clone_mount(str(node_dir / BOARD_DIR / row.beacon)),
                               beacon=row.beacon)


def _remove_entry(node_fd: int, name: str) -> None:
    """Removes a container's directory from the node directory: the tenant
    taken back, then what the hook kept of it."""
    from vgpulimit import provision

    try:
        entry_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=node_fd)
    except FileNotFoundError:
        return
    try:
        # Through the descriptors: after a failure inside the container's
        # mount namespace, the node's paths name nothing.
        provision.deprovision(_tenant(Path(f"/proc/self/fd/{node_fd}"), Path(f"/proc/self/fd/{entry_fd}"),
                                      who=identity.Identity()))
        for file in (MANIFEST, f".{MANIFEST}.tmp"):
            try:
                os.unlink(file, dir_fd=entry_fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(entry_fd)
    os.rmdir(name, dir_fd=node_fd)


def _make_dir(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    rootfs.dir(split_path(CONTAINER_DIR), create=True, made=manifest.made)


def _install_shim(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    shim = prepared.shim
    parts = split_path(SHIM_PATH)
    st = rootfs.entry(parts)
    if st is not None:
        with os.fdopen(rootfs.open_file(parts), "rb") as file:
            mounted = mount_id(file.fileno()) != rootfs.mount_id
            content = file.read()
        if mounted:
            # Mounted by the runtime, as the CDI spec asks: the runtime's copy.
            if elf_kind(content) != elf_kind(shim):
                raise HookError(f"{SHIM_PATH} is mounted into the container but is not a shim "
                                "for this architecture")
            return
        if content == shim:
            return
    rootfs.replace(parts, shim, 0o755)
    if st is None:
        manifest.made.append(SHIM_PATH)


def _install_preload(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    rootfs.dir(PRELOAD[:-1], create=True, made=manifest.made)
    st = rootfs.entry(PRELOAD)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise HookError("/etc/ld.so.preload in the container is not a regular file")
    content = rootfs.read(PRELOAD) or b""
    if SHIM_PATH in preload_tokens(content.decode("utf-8", errors="replace")):
        return
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    owner = (st.st_uid, st.st_gid) if st is not None else None
    rootfs.replace(PRELOAD, with_line(content), mode, owner)
    manifest.preload_added = True
    manifest.preload_created = manifest.preload_created or st is None


def _mount_region(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    region = prepared.region
    parts = split_path(CONTAINER_REGION)
    st = rootfs.entry(parts)
    if st is None:
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=rootfs.dir(parts[:-1]))
        os.close(fd)
        manifest.made.append(CONTAINER_REGION)
    elif (st.st_dev, st.st_ino) == (region.st_dev, region.st_ino):
        return   # mounted by an earlier run of the hook (prestart, then createRuntime)
    elif not stat.S_ISREG(st.st_mode):
        raise HookError(f"{CONTAINER_REGION} in the container is not a regular file")
    target = rootfs.open_file(parts, os.O_PATH)
    try:
        attach_mount(prepared.tree, target)
    finally:
        os.close(target)


def _mount_board(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    """The node's board, read-only, at /.vgpulimit/board, and the container's
    own beacon in it, writable: the shim reads every row and beacon there and
    writes only its own (board.h)."""
    if prepared.board_tree < 0:
        return
    parts = split_path(CONTAINER_BOARD_DIR)
    rootfs.dir(parts, create=True, made=manifest.made)
    target = rootfs.open_file(parts, os.O_PATH | os.O_DIRECTORY)
    try:
        attach_mount(prepared.board_tree, target)
    finally:
        os.close(target)
    mounted = rootfs.lookup_afresh(parts)
    try:
        remount_read_only(mounted)
        beacon = os.open(prepared.beacon, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=mounted)
        try:
            attach_mount(prepared.beacon_tree, beacon)
        finally:
            os.close(beacon)
    finally:
        os.close(mounted)


def _bind_onto_itself(rootfs: Rootfs, parts: tuple[str, ...], read_only: bool,
                      recursive: bool) -> int:
    """Binds a file or directory of the rootfs onto itself; returns the new
    mount's root, open (O_PATH)."""
    flags = AT_SYMLINK_NOFOLLOW | (AT_RECURSIVE if recursive else 0)
    tree = clone_mount(parts[-1], rootfs.dir(parts[:-1]), flags)
    try:
        target = rootfs.open_file(parts, os.O_PATH)
        try:
            attach_mount(tree, target)
        finally:
            os.close(target)
    finally:
        os.close(tree)
    mounted = rootfs.lookup_afresh(parts)
    if read_only:
        try:
            remount_read_only(mounted)
        except OSError:
            detach(mounted)
            os.close(mounted)
            raise
    return mounted


def _lock(rootfs: Rootfs, read_only_root: bool) -> None:
    """Makes the preload line and the shim's directory unremovable for root in
    the container without CAP_SYS_ADMIN: each becomes a read-only mount
    point (writes fail with EROFS; rename, unlink and rmdir with EBUSY; only
    umount or a remount, both CAP_SYS_ADMIN, would undo it).  The region
    keeps its own mount, writable, under /.vgpulimit.  /etc is bound onto
    itself too, writable, so that it cannot be renamed away with the preload
    in it -- unless the whole rootfs is read-only (root.readonly), which the
    runtime makes it after the hook: a mount of ours would stay writable."""
    steps = [(PRELOAD, True, False), (split_path(CONTAINER_DIR), True, True)]
    if not read_only_root:
        steps.append((PRELOAD[:-1], False, True))
    mounted: list[int] = []
    try:
        for parts, read_only, recursive in steps:
            mounted.append(_bind_onto_itself(rootfs, parts, read_only, recursive))
    except OSError:
        # The container will not start; what is undone next must see the rootfs itself.
        for fd in reversed(mounted):
            detach(fd)
        raise
    finally:
        for fd in mounted:
            os.close(fd)


def _node_dirs_of_other_entries(config: Mapping[str, Any], node_dir: Path) -> list[Path]:
    """The node directories of the other vgpulimit hook entries in the
    container's config.json: a container of podman's hooks.d (or CRI-O's)
    that is also given the CDI device gets the hook twice, maybe with two
    node directories."""
    from vgpulimit.oci import NODE_DIR

    hooks = config.get("hooks")
    found: list[Path] = []
    if not isinstance(hooks, dict):
        return found
    for entry in hooks.get("createRuntime", []) + hooks.get("prestart", []):
        args = entry.get("args") if isinstance(entry, dict) else None
        if not isinstance(args, list) or "oci-hook" not in args or "vgpulimit" not in args:
            continue
        at = args.index("--node-dir") + 1 if "--node-dir" in args else 0
        other = Path(args[at]) if 0 < at < len(args) and isinstance(args[at], str) else Path(NODE_DIR)
        if other.is_absolute() and other != node_dir and other not in found:
            found.append(other)
    return found


def _set_up_by_another_entry(state: State, config: Mapping[str, Any], node_dir: Path) -> bool:
    """Whether another hook entry of this container (see above) has set it up
    already: its manifest for this very container is complete.  Then this one
    has nothing to do, and its poststop finds nothing of its own to undo."""
    for other in _node_dirs_of_other_entries(config, node_dir):
        try:
            done = Manifest.load(other / state.id)
        except HookError:
            continue
        if done is not None and done.pid == state.pid and done.locked:
            return True
    return False


def _idle_ms(config: Mapping[str, Any]) -> int:
    """The container's idle limit for the node agent (its annotation), in ms; 0: none."""
    from vgpulimit.agent.rules import parse_idle
    from vgpulimit.errors import UsageError
    from vgpulimit.oci import SUSPEND_IDLE_ANNOTATION

    text = config_annotations(config).get(SUSPEND_IDLE_ANNOTATION)
    if text is None:
        return 0
    try:
        return parse_idle(text, f"annotation {SUSPEND_IDLE_ANNOTATION}")
    except UsageError as exc:
        raise HookError(str(exc)) from None


def install(state: State, config: Mapping[str, Any], node_dir: Path,
            admission: Admission | None = None) -> None:
    """Installs the shim if the container asks for limits; with
    ``admission``, first refuses a container that does not fit."""
    limits = requested(config)
    if limits is None:
        if admission is not None:
            with node_lock(node_dir):
                admission.check(state.id, config, None, node_dir)
        return
    if state.pid is None:
        raise HookError(f"the container state has no pid (status {state.status!r}): run the "
                        "hook at createRuntime or prestart")
    rootfs_path = rootfs_of(config, state.bundle)
    owner = region_owner(config)
    manifest = Manifest.load(node_dir / state.id)
    if manifest is not None and manifest.pid != state.pid:
        # Left by an earlier container of this id that had no poststop.
        _undo(manifest, node_dir, state.id)
        manifest = None
    again = manifest is not None
    if manifest is None:
        manifest = Manifest(rootfs=str(rootfs_path), pid=state.pid)
    elif manifest.locked:
        return   # installed by an earlier run of the hook (prestart, then createRuntime)
    if _set_up_by_another_entry(state, config, node_dir):
        return   # the hook of hooks.d and the CDI spec's: one sets it up, the other sees it done
    try:
        with node_lock(node_dir) if admission is not None else contextlib.nullcontext():
            gpus = (admission.check(state.id, config, limits, node_dir) if admission is not None
                    else given_gpus(config))
            who = identity.from_annotations(state.id, config_annotations(config), gpus)
            prepared = _prepare_node(node_dir, state.id, limits, owner, who, state.pid, again,
                                     _idle_ms(config))
            manifest.save(prepared.entry_fd)
    except (HookError, OSError) as exc:
        if node_dir.is_dir():
            node_fd = _open_dir(node_dir)
            try:
                _remove_entry(node_fd, state.id)
            finally:
                os.close(node_fd)
        if isinstance(exc, HookError):
            raise
        raise HookError(f"cannot set up the region in {node_dir / state.id}: "
                        f"{exc.strerror}") from None
    rootfs = None
    try:
        # From here on, paths name what the container's init sees.
        enter_mount_namespace(state.pid)
        rootfs = Rootfs(rootfs_path)
        check_architecture(rootfs, prepared.shim)
        check_glibc(rootfs, prepared.shim)
        for parts in (split_path(CONTAINER_DIR), PRELOAD[:-1]):
            if rootfs.entry(parts) is not None:   # refuses a link before anything is written
                rootfs.dir(parts)
        for step in (_make_dir, _install_shim, _install_preload, _mount_region, _mount_board):
            step(rootfs, prepared, manifest)
            manifest.save(prepared.entry_fd)
        root = config.get("root")
        _lock(rootfs, isinstance(root, dict) and root.get("readonly") is True)
        manifest.locked = True
        manifest.save(prepared.entry_fd)
    except (HookError, OSError) as exc:
        # The runtime will not start the container: take it all back.
        if rootfs is not None:
            _undo_in(rootfs, manifest)
        _remove_entry(prepared.node_fd, state.id)
        if isinstance(exc, HookError):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        raise HookError(f"cannot install the shim into rootfs {rootfs_path}: "
                        f"{exc.strerror}{where}") from None
    finally:
        if rootfs is not None:
            rootfs.close()


def _undo_in(rootfs: Rootfs, manifest: Manifest) -> list[str]:
    """Undoes an install in ``rootfs``; returns what could not be undone, one
    phrase each."""
    problems = []
    if manifest.preload_added:
        try:
            content = rootfs.read(PRELOAD)
            st = rootfs.entry(PRELOAD)
            if content is not None and st is not None:
                rest = without_line(content)
                if manifest.preload_created and not rest.strip():
                    rootfs.remove(PRELOAD)
                else:
                    rootfs.replace(PRELOAD, rest, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
        except (HookError, OSError) as exc:
            problems.append(f"/etc/ld.so.preload ({_reason(exc)})")
    for path in reversed(manifest.made):
        try:
            rootfs.remove(split_path(path))
        except (HookError, OSError) as exc:
            problems.append(f"{path} ({_reason(exc)})")
    return problems


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _undo(manifest: Manifest, node_dir: Path, name: str) -> list[str]:
    problems: list[str] = []
    try:
        rootfs = Rootfs(Path(manifest.rootfs))
    except HookError:
        problems.append(f"rootfs {manifest.rootfs} is gone")
    else:
        try:
            problems = _undo_in(rootfs, manifest)
        finally:
            rootfs.close()
    node_fd = _open_dir(node_dir)
    try:
        _remove_entry(node_fd, name)
    finally:
        os.close(node_fd)
    return problems


def remove(state: State, node_dir: Path) -> None:
    """Removes what install made for this container, if anything."""
    manifest = Manifest.load(node_dir / state.id)
    if manifest is None:
        return
    problems = _undo(manifest, node_dir, state.id)
    if problems:
        raise HookError(f"container {state.id}: left in rootfs {manifest.rootfs}: "
                        + "; ".join(problems))

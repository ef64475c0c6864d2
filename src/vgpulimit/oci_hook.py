"""`vgpulimit oci-hook`: puts the shim into a container that asks for limits,
with images unchanged.

A runtime runs the hook with the container's state (OCI runtime spec,
"State") on stdin: at createRuntime (or prestart, on runtimes older than
createRuntime) it installs, at poststop it removes what it installed.  The
stage is read from the state's status, so one hooks.d entry serves them all.

A container asks with limit variables in ``process.env`` (VGPULIMIT_MEMORY[_i],
VGPULIMIT_CORES[_i], or HAMi's CUDA_DEVICE_MEMORY_LIMIT[_i] and
CUDA_DEVICE_SM_LIMIT[_i]) or with the annotations vgpulimit.io/memory and
vgpulimit.io/cores (and vgpulimit.io/cores-policy, as VGPULIMIT_CORES_POLICY).  An annotation beats the variables of its kind: the
variables come with the image, the annotations from whoever runs it.  A
container whose environment names its region (VGPULIMIT_REGION, or
CUDA_DEVICE_MEMORY_SHARED_CACHE as HAMi's device plugin sets it) is left to
whoever named it -- a device plugin that mounts the shim itself -- so that
the two can share a node.

Installed, in the rootfs:  /.vgpulimit/libvgpulimit.so (a copy of the shim,
unless a mount -- the CDI spec's -- puts it there), a line for it in
/etc/ld.so.preload, and /.vgpulimit/region, onto which the hook mounts the
container's region.  The region itself lives on the node, in
<node dir>/<container id>/region, where `vgpulimit status --all` finds it;
it carries the limits, so that limits given as annotations reach the shim
although a hook cannot change the container's environment.

Every path in the rootfs is walked one component at a time without following
symbolic links (a link planted by the image, /etc -> /host/etc, is refused,
never followed out), and checked to lie on the rootfs's own mount as the
container will see it (a runtime mount would hide what we write).  Whenever a
container asked for limits and they cannot be enforced, the hook fails with
one line, and the runtime does not start the container.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# Where things go in the container.  The shim looks for CONTAINER_REGION
# itself (shim/src/config.c, default_region_path).
CONTAINER_DIR = ".vgpulimit"
SHIM_NAME = "libvgpulimit.so"
REGION_NAME = "region"
SHIM_PATH = f"/{CONTAINER_DIR}/{SHIM_NAME}"
CONTAINER_REGION = f"/{CONTAINER_DIR}/{REGION_NAME}"
PRELOAD = ("etc", "ld.so.preload")

# The node view: one directory per container holding its region.
NODE_DIR = "/run/vgpulimit/containers"
MANIFEST = "installed.json"

MEMORY_ANNOTATION = "vgpulimit.io/memory"
CORES_ANNOTATION = "vgpulimit.io/cores"
CORES_POLICY_ANNOTATION = "vgpulimit.io/cores-policy"

# A container id as runc accepts it; it names a directory of ours.
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}")
# ld.so splits /etc/ld.so.preload at these.
_PRELOAD_SEPARATORS = re.compile(r"[\s:]+")

# ELF: (class, machine) -> the glibc dynamic loader of that architecture.  A
# rootfs without the one our shim is built for cannot load it.
_ELFCLASS64 = 2
_LOADERS = {
    (_ELFCLASS64, 62): ("x86-64", "/lib64/ld-linux-x86-64.so.2"),
    (_ELFCLASS64, 183): ("arm64", "/lib/ld-linux-aarch64.so.1"),
}

_CLONE_NEWNS = 0x00020000
_SYS_OPEN_TREE = 428        # the same number on every architecture (Linux >= 5.2)
_SYS_MOVE_MOUNT = 429
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x04
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_RECURSIVE = 0x8000
_MS_RDONLY = 0x1
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MNT_DETACH = 2
# Per-mount flags a bind remount would clear unless given again (statvfs's
# ST_* have the same values as these MS_*).
_MS_KEPT = {os.ST_NOSUID: 0x2, os.ST_NODEV: 0x4, os.ST_NOEXEC: 0x8}


class HookError(RuntimeError):
    """The hook cannot do its job; the message is the one line the runtime shows."""


# -- the state and the bundle ---------------------------------------------------------------


@dataclass(frozen=True)
class State:
    id: str
    status: str
    bundle: Path
    pid: int | None


def read_state(stream: IO[str] | None) -> State:
    if stream is None or stream.isatty():
        what = "closed" if stream is None else "a terminal"
        raise HookError("the hook reads the container's state (OCI state JSON) on stdin, as a "
                        f"runtime gives it; stdin is {what}")
    try:
        state = json.loads(stream.read())
    except OSError as exc:
        raise HookError(f"cannot read the container state on stdin: {exc.strerror}") from None
    except ValueError as exc:
        raise HookError(f"the container state on stdin is not JSON ({exc}); a runtime passes "
                        "the OCI state object there") from None
    except RecursionError:
        raise HookError("the container state on stdin is JSON nested too deeply to read; a "
                        "runtime passes the OCI state object there") from None
    if not isinstance(state, dict):
        raise HookError("the container state on stdin is not a JSON object (OCI state)")
    for key in ("id", "status", "bundle"):
        if not isinstance(state.get(key), str):
            raise HookError(f"the container state on stdin has no string {key!r} (OCI state)")
    if not _CONTAINER_ID.fullmatch(state["id"]):
        raise HookError(f"container id {state['id']!r} is not one a runtime gives "
                        "(letters, digits, '_', '.', '+', '-')")
    bundle = Path(state["bundle"])
    if not bundle.is_absolute():
        raise HookError(f"bundle {state['bundle']!r} in the container state is not an "
                        "absolute path")
    pid = state.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise HookError(f"pid {pid!r} in the container state is not a process id")
    return State(id=state["id"], status=state["status"], bundle=bundle, pid=pid)


def load_config(bundle: Path) -> dict[str, Any]:
    path = bundle / "config.json"
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except FileNotFoundError:
        what = "no config.json" if bundle.is_dir() else "no such directory"
        raise HookError(f"bundle {bundle}: {what}") from None
    except OSError as exc:
        raise HookError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise HookError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise HookError(f"{path} is JSON nested too deeply to read, not an OCI runtime "
                        "config") from None
    if not isinstance(config, dict):
        raise HookError(f"{path} is not a JSON object (OCI runtime config)")
    return config


def _environment(config: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for entry in (config.get("process") or {}).get("env") or []:
        if isinstance(entry, str):
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def _annotations(config: Mapping[str, Any]) -> dict[str, str]:
    annotations = config.get("annotations") or {}
    return {k: v for k, v in annotations.items() if isinstance(v, str)}


def rootfs_of(config: Mapping[str, Any], bundle: Path) -> Path:
    root = config.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HookError(f"{bundle / 'config.json'} has no root.path")
    return bundle / path   # an absolute root.path stays itself


# -- what the container asks for -------------------------------------------------------------


def requested(config: Mapping[str, Any]):
    """The limits the container asks for (a supervisor.Limits), or None when
    it asks for none.  Its variables are read by the shim's own reader, in
    the shim's precedence; an annotation beats every variable of its kind
    (the variables may come with the image, the annotation from whoever runs
    it)."""
    from vgpulimit import environment
    from vgpulimit.limits import LimitError, parse_cores, parse_cores_policy, parse_memory
    from vgpulimit.supervisor import Limits, Setting, layer

    env, annotations = _environment(config), _annotations(config)
    found = environment.read(env)
    asks_by_annotation = MEMORY_ANNOTATION in annotations or CORES_ANNOTATION in annotations
    if not (found.memory or found.cores or asks_by_annotation or found.errors):
        return None
    if found.region_path:
        # A device plugin that mounts the shim itself named the region (HAMi's
        # sets CUDA_DEVICE_MEMORY_SHARED_CACHE): the container is its to set up.
        return None
    if found.errors:
        raise HookError(f"process.env {found.errors[0]}")

    def annotation(name: str, parse) -> Setting | None:
        if name not in annotations:
            return None
        try:
            return Setting(annotations[name], f"annotation {name}", parse(annotations[name],
                                                                           f"annotation {name}"))
        except LimitError as exc:
            raise HookError(str(exc)) from None

    warnings = list(found.warnings)
    memory = layer(found.memory, annotation(MEMORY_ANNOTATION, parse_memory), {}, warnings)
    cores = layer(found.cores, annotation(CORES_ANNOTATION, parse_cores), {}, warnings)
    policy = annotation(CORES_POLICY_ANNOTATION, parse_cores_policy) or found.cores_policy
    return Limits(memory=memory, cores=cores, cores_policy=policy, warnings=tuple(warnings))


# -- who owns the region ---------------------------------------------------------------------


def _host_id(container_id: int, mappings: Any, what: str) -> int:
    if not mappings:
        return container_id
    for mapping in mappings:
        start, host, size = (mapping.get(k) for k in ("containerID", "hostID", "size"))
        if not all(isinstance(v, int) for v in (start, host, size)):
            continue
        if start <= container_id < start + size:
            return host + container_id - start
    raise HookError(f"the container's {what} {container_id} is not in linux.{what}Mappings")


def region_owner(config: Mapping[str, Any]) -> tuple[int, int]:
    """The host uid and gid of the container's process (through its user namespace)."""
    user = (config.get("process") or {}).get("user") or {}
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    linux = config.get("linux") or {}
    return (_host_id(uid, linux.get("uidMappings"), "uid"),
            _host_id(gid, linux.get("gidMappings"), "gid"))


# -- system calls Python does not wrap ------------------------------------------------------------

@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _clone_mount(path: str, dir_fd: int = _AT_FDCWD, flags: int = 0) -> int:
    """A detached bind mount of ``path`` (open_tree), to attach elsewhere."""
    flags = ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC | flags)
    try:
        return _check(_libc().syscall(_SYS_OPEN_TREE, dir_fd, os.fsencode(path), flags),
                      "open_tree")
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            raise HookError("this kernel has no open_tree (Linux 5.2 or later is needed to "
                            "mount a container's region)") from None
        raise


def _attach_mount(tree: int, target_fd: int) -> None:
    flags = ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH)
    _check(_libc().syscall(_SYS_MOVE_MOUNT, tree, b"", target_fd, b"", flags), "move_mount")


def _remount_read_only(fd: int) -> None:
    """Makes the mount whose root ``fd`` is read-only, keeping its other flags.
    mount(2) rather than mount_setattr(2), which needs Linux 5.12: this works
    wherever open_tree does."""
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
    held = os.fstatvfs(fd).f_flag
    flags |= sum(ms for st, ms in _MS_KEPT.items() if held & st)
    _check(_libc().mount(None, f"/proc/self/fd/{fd}".encode(), None, ctypes.c_ulong(flags), None),
           "mount")


def _detach(fd: int) -> None:
    _check(_libc().umount2(f"/proc/self/fd/{fd}".encode(), _MNT_DETACH), "umount2")


def _enter_mount_namespace(pid: int) -> None:
    """Makes this process see mounts as the container's init does: the rootfs with
    the runtime's mounts on it, before pivot_root."""
    try:
        ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise HookError(f"cannot open the mount namespace of the container's process {pid}: "
                        f"{exc.strerror} (the hook must run as root, at createRuntime or "
                        "prestart)") from None
    try:
        _check(_libc().setns(ns, _CLONE_NEWNS), "setns")
    except OSError as exc:
        raise HookError(f"cannot enter the mount namespace of the container's process {pid}: "
                        f"{exc.strerror}") from None
    finally:
        os.close(ns)


def _mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "no mnt_id in /proc/self/fdinfo")


# -- the rootfs, walked without following links ---------------------------------------------------


def _container_path(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


def _elf_kind(data: bytes) -> tuple[int, int] | None:
    """(class, machine) of an ELF header, or None."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    order = "little" if data[5] == 1 else "big"
    return data[4], int.from_bytes(data[18:20], order)


class Rootfs:
    """A container's root directory, as an open descriptor; every path below it
    is walked one component at a time (O_NOFOLLOW), never leaving it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise HookError(f"rootfs {path}: {exc.strerror}") from None
        self.mount_id = _mount_id(self.fd)
        self._dirs: dict[tuple[str, ...], int] = {(): self.fd}

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def _refuse_link(self, parts: tuple[str, ...], dir_fd: int, name: str) -> HookError:
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return HookError(f"{self.path}{_container_path(parts)} in the container's rootfs is a "
                         f"symbolic link (to {target}); the hook does not follow links in a rootfs")

    def on_rootfs(self, fd: int, parts: tuple[str, ...]) -> None:
        if _mount_id(fd) != self.mount_id:
            raise HookError(f"{_container_path(parts)} is on a mount of its own in the container, "
                            "which would hide what the hook writes there; the shim cannot be "
                            "installed")

    def dir(self, parts: tuple[str, ...], create: bool = False,
            made: list[str] | None = None) -> int:
        """The directory at ``parts``, on the rootfs's own mount; created (0755)
        when ``create``, and then its path added to ``made``."""
        if parts in self._dirs:
            return self._dirs[parts]
        parent = self.dir(parts[:-1], create, made)
        name = parts[-1]
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o755, dir_fd=parent)
            if made is not None:
                made.append(_container_path(parts))
            fd = os.open(name, flags, dir_fd=parent)
            # Whatever the runtime's umask: every user of the container must
            # reach the shim, or ld.so skips it and the process runs unlimited.
            os.fchmod(fd, 0o755)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                    os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise self._refuse_link(parts, parent, name) from None
            raise
        self._dirs[parts] = fd
        self.on_rootfs(fd, parts)
        return fd

    def entry(self, parts: tuple[str, ...]) -> os.stat_result | None:
        """lstat of a file in the rootfs (None: absent); a link is refused."""
        try:
            parent = self.dir(parts[:-1])
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise self._refuse_link(parts, parent, parts[-1])
        return st

    def open_file(self, parts: tuple[str, ...], flags: int = os.O_RDONLY) -> int:
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir(parts[:-1]))

    def read(self, parts: tuple[str, ...]) -> bytes | None:
        """The content of a file on the rootfs's own mount; None: absent."""
        if self.entry(parts) is None:
            return None
        with os.fdopen(self.open_file(parts), "rb") as file:
            self.on_rootfs(file.fileno(), parts)
            return file.read()

    def replace(self, parts: tuple[str, ...], data: bytes, mode: int,
                owner: tuple[int, int] | None = None) -> None:
        """Writes the file whole, through a temporary file renamed over it, so
        that no process ever reads half of it."""
        parent = self.dir(parts[:-1])
        temp = f".{parts[-1]}.vgpulimit-{os.getpid()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                os.fchmod(file.fileno(), mode)
                if owner is not None:
                    os.fchown(file.fileno(), *owner)
            os.rename(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            os.unlink(temp, dir_fd=parent)
            raise

    def remove(self, parts: tuple[str, ...]) -> None:
        """Removes a file, or a directory if it is empty (what others put in it stays)."""
        st = self.entry(parts)
        if st is None:
            return
        parent = self.dir(parts[:-1])
        if stat.S_ISDIR(st.st_mode):
            cached = self._dirs.pop(parts, None)
            if cached is not None:
                os.close(cached)
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise
        else:
            os.unlink(parts[-1], dir_fd=parent)

    def resolve_read(self, path: str, size: int) -> bytes | None:
        """The first ``size`` bytes of ``path`` as the container would read it:
        links are followed, but resolved inside the rootfs ("/" and ".." stop at
        it).  None when there is no such file."""
        todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]
        here: list[str] = []
        links = 0
        while todo:
            name = todo.pop()
            if name == "..":
                if here:
                    here.pop()
                continue
            try:
                parent = self._open_plain(here)
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        target = os.readlink(name, dir_fd=parent)
                        links += 1
                        if links > 40:
                            return None
                        if target.startswith("/"):
                            here = []
                        todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                        continue
                    if todo:
                        here.append(name)
                        continue
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
                    with os.fdopen(fd, "rb") as file:
                        return file.read(size)
                finally:
                    if parent != self.fd:
                        os.close(parent)
            except (FileNotFoundError, NotADirectoryError):
                return None
        return None

    def lookup_afresh(self, parts: tuple[str, ...]) -> int:
        """``parts`` opened (O_PATH) from the root down, not through the cached
        directories: it reaches what has been mounted since they were opened."""
        parent = self._open_plain(list(parts[:-1]))
        try:
            return os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        finally:
            if parent != self.fd:
                os.close(parent)

    def _open_plain(self, parts: list[str]) -> int:
        fd = self.fd
        for name in parts:
            next_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            if fd != self.fd:
                os.close(fd)
            fd = next_fd
        return fd


# -- what the hook leaves behind, to be undone ----------------------------------------------------


@dataclass
class Manifest:
    """What the hook made in a container, kept in its node directory."""

    rootfs: str
    pid: int | None
    made: list[str] = field(default_factory=list)     # paths in the rootfs, in order of making
    preload_added: bool = False                       # our line in /etc/ld.so.preload
    preload_created: bool = False                     # ... in a file we created
    locked: bool = False                              # bound read-only: the install is done

    @classmethod
    def load(cls, entry: Path) -> Manifest | None:
        try:
            data = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
            return cls(rootfs=data["rootfs"], pid=data["pid"], made=list(data["made"]),
                       preload_added=bool(data["preload_added"]),
                       preload_created=bool(data["preload_created"]),
                       locked=bool(data.get("locked")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HookError(f"{entry / MANIFEST} is unreadable ({exc}); remove {entry} "
                            "once the container is gone") from None

    def save(self, entry_fd: int) -> None:
        temp = f".{MANIFEST}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600,
                     dir_fd=entry_fd)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(self.__dict__, file)
        os.rename(temp, MANIFEST, src_dir_fd=entry_fd, dst_dir_fd=entry_fd)


def _preload_tokens(text: str) -> list[str]:
    return [token for token in _PRELOAD_SEPARATORS.split(text) if token]


def _with_line(content: bytes) -> bytes:
    text = content.decode("utf-8", errors="surrogateescape")
    if text and not text.endswith("\n"):
        text += "\n"
    return (text + SHIM_PATH + "\n").encode("utf-8", errors="surrogateescape")


def _without_line(content: bytes) -> bytes:
    lines = content.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    kept = [line for line in lines if line.strip() != SHIM_PATH]
    return "".join(kept).encode("utf-8", errors="surrogateescape")


# -- install ------------------------------------------------------------------------------------


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


@dataclass(frozen=True)
class _Prepared:
    """What the host side hands the container side: open descriptors, since paths
    name other things once the hook is in the container's mount namespace."""

    node_fd: int        # the node directory
    entry_fd: int       # the container's directory in it
    tree: int           # the region, as a detached mount
    region: os.stat_result
    shim: bytes


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _prepare_node(node_dir: Path, name: str, limits, owner: tuple[int, int]) -> _Prepared:
    from vgpulimit._paths import libpath
    from vgpulimit.region import Region, RegionError

    shim = libpath().read_bytes()
    node_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    entry = node_dir / name
    entry.mkdir(mode=0o700, exist_ok=True)
    region_path = entry / REGION_NAME
    if not region_path.exists():
        try:
            with Region.create(region_path, limits.memory_per_device(), limits.cores_per_device(),
                               group_shared=True) as region:
                if limits.cores_policy is not None:
                    region.set_cores_policy(limits.cores_policy.value)
        except RegionError as exc:
            raise HookError(str(exc)) from None
        os.chown(region_path, *owner)
    return _Prepared(node_fd=_open_dir(node_dir), entry_fd=_open_dir(entry),
                     tree=_clone_mount(str(region_path)), region=os.stat(region_path), shim=shim)


def _remove_entry(node_fd: int, name: str) -> None:
    """Removes a container's directory from the node directory."""
    try:
        entry_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=node_fd)
    except FileNotFoundError:
        return
    try:
        for file in (REGION_NAME, MANIFEST, f".{MANIFEST}.tmp"):
            try:
                os.unlink(file, dir_fd=entry_fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(entry_fd)
    os.rmdir(name, dir_fd=node_fd)


def _check_architecture(rootfs: Rootfs, shim: bytes) -> None:
    kind = _elf_kind(shim)
    if kind not in _LOADERS:
        raise HookError("the installed shim is not an ELF library of an architecture the hook "
                        "knows (x86-64, arm64)")
    arch, loader = _LOADERS[kind]
    found = _elf_kind(rootfs.resolve_read(loader, 64) or b"")
    if found == kind:
        return
    others = [name for k, (name, path) in _LOADERS.items()
              if k != kind and _elf_kind(rootfs.resolve_read(path, 64) or b"") == k]
    what = f"its programs are {others[0]}" if others else f"it has no {loader}"
    raise HookError(f"rootfs {rootfs.path}: {what}, and the shim is {arch} (glibc): its "
                    "programs could not load it")


def _check_glibc(rootfs: Rootfs, shim: bytes) -> None:
    """Refuses a rootfs whose glibc is older than the shim needs: the loader
    would stop every process of the container on the shim's version needs.
    Read from the symbol versions libc.so.6 defines, where the loader looks
    for it (its default directories, Debian's and Red Hat's)."""
    from vgpulimit import glibc

    need = glibc.newest(glibc.needed(shim))
    if need is None:
        return
    kind = _elf_kind(shim)
    multiarch = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu"}[kind[1]]
    directories = (f"/lib/{multiarch}", f"/usr/lib/{multiarch}", "/lib64", "/usr/lib64", "/lib",
                   "/usr/lib")
    for directory in directories:
        path = f"{directory}/libc.so.6"
        libc = rootfs.resolve_read(path, 64 << 20)
        if libc is not None and _elf_kind(libc) == kind:
            break
    else:
        raise HookError(f"rootfs {rootfs.path}: it has no libc.so.6 in "
                        f"{', '.join(directories)}, and the shim needs glibc "
                        f"{glibc.text(need)} or later")
    have = glibc.newest(glibc.defined(libc))
    if have is None or have < need:
        what = f"glibc {glibc.text(have)}" if have else "not glibc (it defines no GLIBC_ version)"
        raise HookError(f"rootfs {rootfs.path}: its C library ({path}) is {what}, and the shim "
                        f"needs glibc {glibc.text(need)} or later: its programs could not load it")


def _make_dir(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    rootfs.dir(_parts(CONTAINER_DIR), create=True, made=manifest.made)


def _install_shim(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    shim = prepared.shim
    parts = _parts(SHIM_PATH)
    st = rootfs.entry(parts)
    if st is not None:
        with os.fdopen(rootfs.open_file(parts), "rb") as file:
            mounted = _mount_id(file.fileno()) != rootfs.mount_id
            content = file.read()
        if mounted:
            # Mounted by the runtime, as the CDI spec asks: the runtime's copy.
            if _elf_kind(content) != _elf_kind(shim):
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
    if SHIM_PATH in _preload_tokens(content.decode("utf-8", errors="replace")):
        return
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    owner = (st.st_uid, st.st_gid) if st is not None else None
    rootfs.replace(PRELOAD, _with_line(content), mode, owner)
    manifest.preload_added = True
    manifest.preload_created = manifest.preload_created or st is None


def _mount_region(rootfs: Rootfs, prepared: _Prepared, manifest: Manifest) -> None:
    region = prepared.region
    parts = _parts(CONTAINER_REGION)
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
        _attach_mount(prepared.tree, target)
    finally:
        os.close(target)


def _bind_onto_itself(rootfs: Rootfs, parts: tuple[str, ...], read_only: bool,
                      recursive: bool) -> int:
    """Binds a file or directory of the rootfs onto itself; returns the new
    mount's root, open (O_PATH)."""
    flags = _AT_SYMLINK_NOFOLLOW | (_AT_RECURSIVE if recursive else 0)
    tree = _clone_mount(parts[-1], rootfs.dir(parts[:-1]), flags)
    try:
        target = rootfs.open_file(parts, os.O_PATH)
        try:
            _attach_mount(tree, target)
        finally:
            os.close(target)
    finally:
        os.close(tree)
    mounted = rootfs.lookup_afresh(parts)
    if read_only:
        try:
            _remount_read_only(mounted)
        except OSError:
            _detach(mounted)
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
    steps = [(PRELOAD, True, False), (_parts(CONTAINER_DIR), True, True)]
    if not read_only_root:
        steps.append((PRELOAD[:-1], False, True))
    mounted: list[int] = []
    try:
        for parts, read_only, recursive in steps:
            mounted.append(_bind_onto_itself(rootfs, parts, read_only, recursive))
    except OSError:
        # The container will not start; what is undone next must see the rootfs itself.
        for fd in reversed(mounted):
            _detach(fd)
        raise
    finally:
        for fd in mounted:
            os.close(fd)


def install(state: State, config: Mapping[str, Any], node_dir: Path) -> None:
    """Installs the shim if the container asks for limits."""
    limits = requested(config)
    if limits is None:
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
    if manifest is None:
        manifest = Manifest(rootfs=str(rootfs_path), pid=state.pid)
    elif manifest.locked:
        return   # installed by an earlier run of the hook (prestart, then createRuntime)
    try:
        prepared = _prepare_node(node_dir, state.id, limits, owner)
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
        _enter_mount_namespace(state.pid)
        rootfs = Rootfs(rootfs_path)
        _check_architecture(rootfs, prepared.shim)
        _check_glibc(rootfs, prepared.shim)
        for parts in (_parts(CONTAINER_DIR), PRELOAD[:-1]):
            if rootfs.entry(parts) is not None:   # refuses a link before anything is written
                rootfs.dir(parts)
        for step in (_make_dir, _install_shim, _install_preload, _mount_region):
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


# -- remove -------------------------------------------------------------------------------------


def _undo_in(rootfs: Rootfs, manifest: Manifest) -> list[str]:
    """Undoes an install in ``rootfs``; returns what could not be undone, one
    phrase each."""
    problems = []
    if manifest.preload_added:
        try:
            content = rootfs.read(PRELOAD)
            st = rootfs.entry(PRELOAD)
            if content is not None and st is not None:
                rest = _without_line(content)
                if manifest.preload_created and not rest.strip():
                    rootfs.remove(PRELOAD)
                else:
                    rootfs.replace(PRELOAD, rest, stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
        except (HookError, OSError) as exc:
            problems.append(f"/etc/ld.so.preload ({_reason(exc)})")
    for path in reversed(manifest.made):
        try:
            rootfs.remove(_parts(path))
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


# -- the command --------------------------------------------------------------------------------

# OCI status -> what to do.  createRuntime and prestart see "creating" (runc)
# or "created"; poststop sees "stopped".
_INSTALL_STATUSES = frozenset({"creating", "created"})
_REMOVE_STATUSES = frozenset({"stopped"})


def run(stream: IO[str] | None, node_dir: Path) -> int:
    state = read_state(stream)
    if state.status in _REMOVE_STATUSES:
        remove(state, node_dir)
        return 0
    if state.status not in _INSTALL_STATUSES:
        raise HookError(f"container status {state.status!r}: the hook runs at createRuntime or "
                        "prestart (status creating or created) and poststop (stopped)")
    install(state, load_config(state.bundle), node_dir)
    return 0


# -- hooks.d ------------------------------------------------------------------------------------

HOOKS_D_NAME = "vgpulimit.json"
HOOKS_D_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_STAGES = ("createRuntime", "poststop")


def hook_command(node_dir: str | None = None) -> list[str]:
    """The hook as a runtime runs it: this interpreter, so that it finds this
    installation of vgpulimit."""
    args = [sys.executable, "-m", "vgpulimit", "oci-hook"]
    if node_dir is not None:
        args += ["--node-dir", node_dir]
    return args


def hooks_d_config(node_dir: str | None = None) -> dict[str, Any]:
    """A hooks.d (oci-hooks(5), version 1.0.0) entry for this installation.  The
    hook runs for every container and decides itself: hooks.d cannot match on
    environment variables."""
    args = hook_command(node_dir)
    return {"version": "1.0.0", "hook": {"path": args[0], "args": args},
            "when": {"always": True}, "stages": list(HOOK_STAGES)}


def install_hooks_d(directory: Path, node_dir: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / HOOKS_D_NAME
    temp = directory / f".{HOOKS_D_NAME}.tmp"
    temp.write_text(json.dumps(hooks_d_config(node_dir), indent=2) + "\n", encoding="utf-8")
    temp.chmod(0o644)
    temp.replace(path)
    return path

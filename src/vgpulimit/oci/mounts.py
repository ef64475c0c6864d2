"""The mount system calls Python does not wrap (open_tree, move_mount, setns,
mount, umount2), through libc."""

from __future__ import annotations

import ctypes
import errno
import functools
import os

from vgpulimit.oci import HookError

_CLONE_NEWNS = 0x00020000
_SYS_OPEN_TREE = 428        # the same number on every architecture (Linux >= 5.2)
_SYS_MOVE_MOUNT = 429
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x04
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_RECURSIVE = 0x8000
_MS_RDONLY = 0x1
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MNT_DETACH = 2
# Per-mount flags a bind remount would clear unless given again (statvfs's
# ST_* have the same values as these MS_*).
_MS_KEPT = {os.ST_NOSUID: 0x2, os.ST_NODEV: 0x4, os.ST_NOEXEC: 0x8}


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


def clone_mount(path: str, dir_fd: int = AT_FDCWD, flags: int = 0) -> int:
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


def attach_mount(tree: int, target_fd: int) -> None:
    flags = ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH)
    _check(_libc().syscall(_SYS_MOVE_MOUNT, tree, b"", target_fd, b"", flags), "move_mount")


def remount_read_only(fd: int) -> None:
    """Makes the mount whose root ``fd`` is read-only, keeping its other flags.
    mount(2) rather than mount_setattr(2), which needs Linux 5.12: this works
    wherever open_tree does."""
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
    held = os.fstatvfs(fd).f_flag
    flags |= sum(ms for st, ms in _MS_KEPT.items() if held & st)
    _check(_libc().mount(None, f"/proc/self/fd/{fd}".encode(), None, ctypes.c_ulong(flags), None),
           "mount")


def detach(fd: int) -> None:
    _check(_libc().umount2(f"/proc/self/fd/{fd}".encode(), _MNT_DETACH), "umount2")


def enter_mount_namespace(pid: int) -> None:
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


def mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "no mnt_id in /proc/self/fdinfo")

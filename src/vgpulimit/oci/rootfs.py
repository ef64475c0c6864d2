"""A container's rootfs, walked one component at a time without following links."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from vgpulimit.oci import HookError
from vgpulimit.oci.mounts import mount_id


def split_path(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


def _container_path(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


class Rootfs:
    """A container's root directory, as an open descriptor; every path below it
    is walked one component at a time (O_NOFOLLOW), never leaving it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise HookError(f"rootfs {path}: {exc.strerror}") from None
        self.mount_id = mount_id(self.fd)
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
        if mount_id(fd) != self.mount_id:
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

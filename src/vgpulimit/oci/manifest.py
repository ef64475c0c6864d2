"""What the hook made in a container, kept beside its region on the node so that
poststop (or the next container of that id) can undo it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from vgpulimit.oci import MANIFEST, HookError


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

"""Where regions are: the private directory a run makes its region in, and
the region a process already runs under (its container's, or an enclosing
run's).  `run` (supervisor.py) and verify both ask; nothing here spawns."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from vgpulimit import environment
from vgpulimit._paths import container_region, runtime_dirs
from vgpulimit.errors import VgpulimitError
from vgpulimit.region import Region, RegionError

# Where `vgpulimit oci-hook` mounts a container's region (paths.h).
CONTAINER_REGION = container_region()


class PlacementError(VgpulimitError, RuntimeError):
    """No directory here can hold a run's region."""


def _private_dir(path: Path) -> Path:
    """``path`` as a directory that only we can use (mode 0700, ours, not a link)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory")
    if st.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"owned by another user (uid {st.st_uid}, not {os.getuid()})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    if not os.access(path, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, "not writable")
    return path


def runtime_base() -> Path:
    """The private directory for run regions: the first of the runtime
    directories the shim would also pick (paths.h) that we can make ours."""
    candidates = runtime_dirs(os.environ)
    failures = []
    for candidate in candidates:
        try:
            return _private_dir(candidate)
        except OSError as exc:
            failures.append(f"{candidate}: {exc.strerror}")
    raise PlacementError("no private directory for the region: " + "; ".join(failures))


def enclosing_region(environ: Mapping[str, str]) -> str | None:
    """The region this process already runs under: the one its runtime set up
    (the hook's), else the one an enclosing `vgpulimit run` named; None when
    there is none (or the named file is no region)."""
    env = environment.read(environ)
    for path in (CONTAINER_REGION, env.region_path):
        if path and os.path.isfile(path) and os.path.getsize(path) > 0:
            try:
                Region.open(path).close()
            except RegionError:
                continue
            return path
    return None

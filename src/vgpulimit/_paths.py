"""Where the installed package keeps its native parts, and where vgpulimit's
files go (paths.h: the shim and Python read the same C)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vgpulimit.errors import VgpulimitError

_LIB_DIR = Path(__file__).resolve().parent / "_lib"
_SIMGPU_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


class InstallError(VgpulimitError, RuntimeError):
    """A native part of the package is missing: it was not built or installed right."""


def _missing(what: Path) -> InstallError:
    return InstallError(
        f"{what} is missing: vgpulimit is not built or installed right "
        "(install it with 'pip install .' rather than running it from the source tree)"
    )


def libpath() -> Path:
    """Absolute path of the preload library, libvgpulimit.so."""
    path = _LIB_DIR / "libvgpulimit.so"
    if not path.is_file():
        raise _missing(path)
    return path


def simgpu_dir() -> Path:
    """Absolute path of the directory that holds the simulated libcuda.so.1 and
    libnvidia-ml.so.1 (put it first on LD_LIBRARY_PATH)."""
    path = _LIB_DIR / "simgpu"
    for name in _SIMGPU_LIBS:
        if not (path / name).is_file():
            raise _missing(path / name)
    return path


def core():
    """The cffi binding over the shim's core: ``(ffi, lib)``."""
    try:
        from vgpulimit._core import ffi, lib
    except ImportError as exc:
        raise InstallError(
            f"the native module vgpulimit._core cannot be loaded ({exc}): vgpulimit is not "
            "built or installed right (install it with 'pip install .')"
        ) from exc
    return ffi, lib


def container_region() -> str:
    """Where `vgpulimit oci-hook` mounts a container's region, as the shim looks for it."""
    ffi, lib = core()
    return ffi.string(lib.vgl_container_region()).decode()


def container_board() -> str:
    """Where the hook mounts the node's priority board in a container that has a priority."""
    ffi, lib = core()
    return ffi.string(lib.vgl_container_board()).decode()


def slurm_dir() -> str:
    """Where Slurm's Prolog makes each job's region (<dir>/<job id>/region), as the
    shim looks for it when a job's process names none."""
    ffi, lib = core()
    return ffi.string(lib.vgl_slurm_dir()).decode()


def slurm_job(cgroup_text: str) -> str | None:
    """The Slurm job whose cgroup ``cgroup_text`` (/proc/self/cgroup's lines)
    names, as the shim reads it; None for none, or for two."""
    ffi, lib = core()
    job = ffi.new("char[24]")
    found = lib.vgl_env_slurm_job(cgroup_text.encode("utf-8", errors="surrogateescape"), job, 24)
    return ffi.string(job).decode() if found == 0 else None


def runtime_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The directories for a process's own regions, best first, as the shim
    picks them: $XDG_RUNTIME_DIR/vgpulimit, /run/vgpulimit, $TMPDIR (else
    /tmp)/vgpulimit-<uid>."""
    ffi, lib = core()
    entries = [ffi.new("char[]", f"{name}={value}".encode("utf-8", errors="surrogateescape"))
               for name, value in environ.items() if "\0" not in name + value and "=" not in name]
    envp = ffi.new("char *[]", [*entries, ffi.NULL])
    out = ffi.new("char[]", 4096)
    dirs = []
    while lib.vgl_runtime_dir(envp, len(dirs), out, 4096) == 0:
        dirs.append(Path(ffi.string(out).decode("utf-8", errors="surrogateescape")))
    return dirs

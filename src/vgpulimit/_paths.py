"""Where the installed package keeps its native parts."""

from __future__ import annotations

from pathlib import Path

_LIB_DIR = Path(__file__).resolve().parent / "_lib"
_SIMGPU_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


class InstallError(RuntimeError):
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

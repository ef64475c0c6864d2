"""vgpulimit: per-container GPU memory caps, enforced by an LD_PRELOAD shim.

The package is the supervisor and the views; the enforcement is the C library
``_lib/libvgpulimit.so`` that ships inside it (``vgpulimit libpath``).
"""

from importlib.metadata import PackageNotFoundError, version

# Written once, in meson.build's project(); the installed metadata carries it.
try:
    __version__ = version("vgpulimit")
except PackageNotFoundError:   # the source tree, not installed
    __version__ = "unknown"

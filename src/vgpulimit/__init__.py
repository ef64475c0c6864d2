"""vgpulimit: per-container GPU memory caps, enforced by an LD_PRELOAD shim.

The package is the supervisor and the views; the enforcement is the C library
``_lib/libvgpulimit.so`` that ships inside it (``vgpulimit libpath``).
"""

__version__ = "0.1.0"

"""vgpulimit: per-container GPU memory caps, enforced by an LD_PRELOAD shim.

The package is the supervisor and the views; the enforcement is the C library
``_lib/libvgpulimit.so`` that ships inside it (``vgpulimit libpath``).
"""


def __getattr__(name: str) -> str:
    # ``__version__``, looked up when first asked for: importlib.metadata takes
    # some 15 ms to import and search, and `vgpulimit run` holds its signals
    # only once the package and its CLI are imported (cli.main).
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    # Written once, in meson.build's project(); the installed metadata carries it.
    try:
        found = version("vgpulimit")
    except PackageNotFoundError:   # the source tree, not installed
        found = "unknown"
    globals()["__version__"] = found
    return found

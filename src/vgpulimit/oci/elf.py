"""Can the container's programs load the shim: its architecture's loader and a
glibc new enough, read from the rootfs."""

from __future__ import annotations

from vgpulimit.oci import HookError
from vgpulimit.oci.rootfs import Rootfs

# ELF: (class, machine) -> the glibc dynamic loader of that architecture.  A
# rootfs without the one our shim is built for cannot load it.
_ELFCLASS64 = 2
_LOADERS = {
    (_ELFCLASS64, 62): ("x86-64", "/lib64/ld-linux-x86-64.so.2"),
    (_ELFCLASS64, 183): ("arm64", "/lib/ld-linux-aarch64.so.1"),
}


def elf_kind(data: bytes) -> tuple[int, int] | None:
    """(class, machine) of an ELF header, or None."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    order = "little" if data[5] == 1 else "big"
    return data[4], int.from_bytes(data[18:20], order)


def check_architecture(rootfs: Rootfs, shim: bytes) -> None:
    kind = elf_kind(shim)
    if kind not in _LOADERS:
        raise HookError("the installed shim is not an ELF library of an architecture the hook "
                        "knows (x86-64, arm64)")
    arch, loader = _LOADERS[kind]
    found = elf_kind(rootfs.resolve_read(loader, 64) or b"")
    if found == kind:
        return
    others = [name for k, (name, path) in _LOADERS.items()
              if k != kind and elf_kind(rootfs.resolve_read(path, 64) or b"") == k]
    what = f"its programs are {others[0]}" if others else f"it has no {loader}"
    raise HookError(f"rootfs {rootfs.path}: {what}, and the shim is {arch} (glibc): its "
                    "programs could not load it")


def check_glibc(rootfs: Rootfs, shim: bytes) -> None:
    """Refuses a rootfs whose glibc is older than the shim needs: the loader
    would stop every process of the container on the shim's version needs.
    Read from the symbol versions libc.so.6 defines, where the loader looks
    for it (its default directories, Debian's and Red Hat's)."""
    from vgpulimit import glibc

    need = glibc.newest(glibc.needed(shim))
    if need is None:
        return
    kind = elf_kind(shim)
    multiarch = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu"}[kind[1]]
    directories = (f"/lib/{multiarch}", f"/usr/lib/{multiarch}", "/lib64", "/usr/lib64", "/lib",
                   "/usr/lib")
    for directory in directories:
        path = f"{directory}/libc.so.6"
        libc = rootfs.resolve_read(path, 64 << 20)
        if libc is not None and elf_kind(libc) == kind:
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

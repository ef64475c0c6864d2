"""Which glibc a library needs, and which one a C library is: read from the
symbol versions of their ELF files, which is what the dynamic loader checks
before it runs anything (a library that names GLIBC_2.34 stops every process
of a system whose libc.so.6 does not define GLIBC_2.34).

Only 64-bit ELF is read: the shim is built for x86_64 and aarch64 alone.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator

_SHT_GNU_VERDEF = 0x6FFFFFFD
_SHT_GNU_VERNEED = 0x6FFFFFFE
_GLIBC_VERSION = re.compile(r"GLIBC_(\d+)\.(\d+)(?:\.(\d+))?")


def _sections(data: bytes) -> Iterator[tuple[str, int, int, int, int, bytes]]:
    """(byte order, type, offset, size, sh_info, linked section's bytes) of each
    section; nothing for what is not a 64-bit ELF file."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        return
    order = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(order + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        return
    headers = [struct.unpack_from(order + "IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    for _, sh_type, _, _, offset, size, link, info, _, _ in headers:
        if sh_type in (_SHT_GNU_VERDEF, _SHT_GNU_VERNEED) and link < shnum:
            strings_offset, strings_size = headers[link][4], headers[link][5]
            yield order, sh_type, offset, size, info, data[strings_offset:
                                                         strings_offset + strings_size]


def _string(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    return strings[offset:end if end >= 0 else None].decode("ascii", errors="replace")


def needed(data: bytes) -> list[str]:
    """The version names an ELF library needs, of every library it needs
    (its .gnu.version_r)."""
    names = []
    for order, sh_type, offset, _size, count, strings in _sections(data):
        if sh_type != _SHT_GNU_VERNEED:
            continue
        for _ in range(count):
            _, aux_count, _, aux, next_entry = struct.unpack_from(order + "HHIII", data, offset)
            at = offset + aux
            for _ in range(aux_count):
                _, _, _, name, next_aux = struct.unpack_from(order + "IHHII", data, at)
                names.append(_string(strings, name))
                at += next_aux
            if not next_entry:
                break
            offset += next_entry
    return names


def defined(data: bytes) -> list[str]:
    """The version names an ELF library defines (its .gnu.version_d)."""
    names = []
    for order, sh_type, offset, _size, count, strings in _sections(data):
        if sh_type != _SHT_GNU_VERDEF:
            continue
        for _ in range(count):
            _, _, _, _, _, aux, next_entry = struct.unpack_from(order + "HHHHIII", data, offset)
            name, = struct.unpack_from(order + "I", data, offset + aux)
            names.append(_string(strings, name))
            if not next_entry:
                break
            offset += next_entry
    return names


def newest(names: Iterable[str]) -> tuple[int, ...] | None:
    """The newest glibc release among version names ("GLIBC_2.17" -> (2, 17));
    None when there is none."""
    versions = [tuple(int(part) for part in m.groups() if part is not None)
                for m in map(_GLIBC_VERSION.fullmatch, names) if m]
    return max(versions, default=None)


def text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))

"""Writes the C source of vgpulimit._core (cffi, API mode).

Run by meson: ``python _cffi_build.py OUTPUT.c limits.h region.h environment.h paths.h board.h``.  The
headers are written so that, without their preprocessor lines (include guards
and includes), they are valid cffi declarations: the layout is declared once,
in C, and cffi's generated code checks it against the compiler's view.
"""

import sys
from pathlib import Path

import cffi

SOURCE = ('#include "vgpulimit/limits.h"\n#include "vgpulimit/region.h"\n'
          '#include "vgpulimit/environment.h"\n#include "vgpulimit/paths.h"\n'
          '#include "vgpulimit/board.h"\n')


def cdef_text(header: Path) -> str:
    lines = header.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: _cffi_build.py OUTPUT.c HEADER...", file=sys.stderr)
        return 2
    output, headers = argv[1], argv[2:]
    ffi = cffi.FFI()
    for header in headers:
        ffi.cdef(cdef_text(Path(header)))
    ffi.set_source("vgpulimit._core", SOURCE)
    ffi.emit_c_code(output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

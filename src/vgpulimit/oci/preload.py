"""The shim's line in the container's /etc/ld.so.preload."""

from __future__ import annotations

import re

from vgpulimit.oci import SHIM_PATH

# ld.so splits /etc/ld.so.preload at these.
_PRELOAD_SEPARATORS = re.compile(r"[\s:]+")


def preload_tokens(text: str) -> list[str]:
    return [token for token in _PRELOAD_SEPARATORS.split(text) if token]


def with_line(content: bytes) -> bytes:
    text = content.decode("utf-8", errors="surrogateescape")
    if text and not text.endswith("\n"):
        text += "\n"
    return (text + SHIM_PATH + "\n").encode("utf-8", errors="surrogateescape")


def without_line(content: bytes) -> bytes:
    lines = content.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    kept = [line for line in lines if line.strip() != SHIM_PATH]
    return "".join(kept).encode("utf-8", errors="surrogateescape")

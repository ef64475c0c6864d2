"""What a row of the table is, the figures its pass line is judged by, and
how its cells read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from real_gpu_rows.bench import Bench

MiB, GiB = 1 << 20, 1 << 30
CAP_BYTES = 4 * GiB
CAP_FLAG = "4GiB"
BLOCK_MIB = 256
DRIVER_SLACK_BYTES = 16 * MiB          # what the driver may list beyond the cap: 1 % + this
SHARE_TOLERANCE_PP = 2.0
LAUNCH_BOUND_KEPT = 0.95               # eager PyTorch (GPU ~11 % busy) under a share of 50 or 90
NODE_TOLERANCE_BYTES = 16 * MiB


class Skip(Exception):
    """The row cannot run here; the message says why."""


@dataclass
class Row:
    group: str
    name: str
    uncapped: str = ""
    capped: str = ""
    expect: str = ""            # the pass line; "" for a figure reported only
    verdict: str = "INFO"       # PASS, FAIL, INFO (reported), SKIP, ERROR
    note: str = ""
    seconds: float | None = None
    data: dict = field(default_factory=dict)


@dataclass
class Spec:
    """A unit of work with its own budget; it gives one row or several."""
    id: str                     # "group.name", what --only selects
    title: str                  # the row's name when the spec fails as a whole
    budget_s: float
    fn: Callable[[Bench], list[Row]]
    needs: tuple[str, ...] = ()  # Python modules of the real CUDA runtime's world


def size(nbytes: float | None) -> str:
    if nbytes is None:
        return "n/a"
    if abs(nbytes) >= GiB:
        return f"{nbytes / GiB:.2f} GiB"
    return f"{nbytes / MiB:.0f} MiB"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def oom(error: str) -> bool:
    return any(word in error for word in ("OUT_OF_MEMORY", "OutOfMemory", "RESOURCE_EXHAUSTED",
                                          "out of memory"))

"""What one shard is worth: the site's mapping (``--shard-memory``,
``--shard-cores``) and the limits of N shards of a GPU of S."""

from __future__ import annotations

from dataclasses import dataclass

from vgpulimit.errors import UsageError
from vgpulimit.limits import LimitError, MemoryLimit, parse_memory

FRACTION = "fraction"
_PPM = 1_000_000


@dataclass(frozen=True)
class ShardMapping:
    """What one shard is worth.  ``memory_unit``: None for N/S of the GPU's
    memory, else the bytes of one shard; ``cores_pct``: None for N/S of the
    GPU's time, 0 for no compute limit, else the percent of one shard."""

    memory_unit: MemoryLimit | None = None
    cores_pct: int | None = None

    def limits(self, shards: int, per_gpu: int) -> tuple[MemoryLimit, int]:
        """The memory cap and compute share (percent, 0: none) of ``shards``
        of a GPU of ``per_gpu`` shards."""
        if self.memory_unit is None:
            memory = MemoryLimit(bytes=0, ppm=max(1, shards * _PPM // per_gpu))
        else:
            memory = MemoryLimit(bytes=shards * self.memory_unit.bytes, ppm=0)
        if self.cores_pct is None:
            cores = max(1, shards * 100 // per_gpu)
        else:
            cores = min(100, shards * self.cores_pct)
        return memory, 0 if cores >= 100 else cores


def parse_mapping(memory_text: str, cores_text: str) -> ShardMapping:
    """``--shard-memory`` (``fraction`` or a SIZE per shard) and
    ``--shard-cores`` (``fraction``, ``none`` or a percent per shard)."""
    memory = None
    if memory_text != FRACTION:
        try:
            memory = parse_memory(memory_text, "--shard-memory")
        except LimitError as exc:
            raise UsageError(f"unknown shard mapping: {exc}; or 'fraction' (N/S of the GPU)") from None
        if memory.ppm:
            raise UsageError(f"unknown shard mapping: --shard-memory {memory_text!r} is a share of the "
                             "GPU; give a size per shard (1GiB, 128Mi) or 'fraction' (N/S of the GPU)")
    if cores_text == FRACTION:
        cores = None
    elif cores_text == "none":
        cores = 0
    else:
        number = cores_text.removesuffix("%")
        if not (number.isascii() and number.isdigit() and 1 <= int(number) <= 100):
            raise UsageError(f"unknown shard mapping: --shard-cores {cores_text!r}: give 'fraction' "
                             "(N/S of the GPU's time), 'none' or a percent per shard, 1-100")
        cores = int(number)
    return ShardMapping(memory, cores)


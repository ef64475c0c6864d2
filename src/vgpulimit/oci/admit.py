"""Admission on a node without a scheduler (`oci-hook --admit`): a container
whose memory guarantee (its request, else its cap) would push the guarantees
on one of its GPUs past the GPU's memory does not start, nor -- unless
allowed -- one that asks for a GPU with no cap.  Caps above requests may
over-commit: what is past a request is borrowed (docs/memory.md).

What is committed on a GPU is read from the regions in the node directory
(node.py places them, identity.py says which GPUs each was given); the check
and the new container's region are made under one lock on the node
directory, so that of two containers starting at once the second sees the
first's cap."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpulimit.oci import REGION_NAME, HookError
from vgpulimit.oci.gpus import requested_gpus, resolve


@contextmanager
def node_lock(node_dir: Path) -> Iterator[None]:
    """The node directory locked (flock on the directory itself: no lock file
    is left among the containers' directories)."""
    node_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(node_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # and the lock with it


def read_node_gpus() -> Sequence:
    from vgpulimit.node import NvmlError, read_gpus

    try:
        return read_gpus()
    except NvmlError as exc:
        raise HookError(f"--admit: cannot read this node's GPUs: {exc}") from None


def given_gpus(config: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The UUIDs of the GPUs the container is given, for its identity; None
    when it names none or they cannot be read (no driver here)."""
    from vgpulimit.node import NvmlError, read_gpus

    names = requested_gpus(config)
    if names is None:
        return None
    try:
        return tuple(g.uuid for g in resolve(names, read_gpus()))
    except (NvmlError, HookError):
        return None


@dataclass(frozen=True)
class Admission:
    allow_uncapped: bool = False

    def check(self, container_id: str, config: Mapping[str, Any], limits,
              node_dir: Path) -> tuple[str, ...] | None:
        """Raises HookError (one line) when the container may not start; returns
        the UUIDs of the GPUs it is given (None: it names none, and is not
        counted).  Call under node_lock."""
        names = requested_gpus(config)
        if names is None:
            return None
        gpus = read_node_gpus()
        given = resolve(names, gpus)
        caps = limits.memory_per_device() if limits is not None else []
        asked = limits.guarantee_per_device() if limits is not None else []
        wanted = []
        for index, gpu in enumerate(given):
            if gpu.total_bytes is None:   # the views degrade; admission cannot
                raise HookError(f"--admit: NVML gives no memory size for GPU {gpu.index} "
                                f"({gpu.uuid}): cannot tell whether container {container_id} "
                                "fits")
            limit = caps[index] if index < len(caps) else None
            cap = None if limit is None else limit.cap_bytes(gpu.total_bytes)
            guarantee = asked[index] if index < len(asked) else None
            if guarantee is not None and limits.request.get(index) is not None:
                held = guarantee.cap_bytes(gpu.total_bytes)
                cap = held if cap is None else min(cap, held)
            if cap is None and not self.allow_uncapped:
                raise HookError(f"--admit: container {container_id} asks for GPU {gpu.index} "
                                f"({gpu.uuid}) with no memory cap; give it one (VGPULIMIT_MEMORY, "
                                "vgpulimit.io/memory), or let the hook admit such containers "
                                "(--admit-uncapped)")
            wanted.append((gpu, cap or 0, "request" if limits is not None and limits.request.get(index) else "cap"))
        committed = _committed(node_dir, container_id, gpus)
        for gpu, cap, what in wanted:
            there, held = committed.get(gpu.uuid, (0, []))
            if there + cap > gpu.total_bytes:
                raise HookError(_refusal(container_id, gpu, there, held, cap, what))
        return tuple(g.uuid for g in given)


def _committed(node_dir: Path, container_id: str,
               gpus: Sequence) -> dict[str, tuple[int, list[tuple[str, int]]]]:
    """GPU UUID -> (the guarantees on it added up, [(container, guarantee)])
    of every region in the node directory but this container's own (a
    guarantee: the request, else the cap)."""
    from vgpulimit.node import build
    from vgpulimit.status import Sampler

    own = os.fspath(node_dir / container_id / REGION_NAME)
    sample = Sampler([], os.fspath(node_dir)).sample(strict=False)
    sample = type(sample)(tuple(v for v in sample.views if v.path != own))
    found = {}
    for view in build(sample, gpus).gpus:
        held = [(t.name, t.request_bytes) for t in view.tenants if t.request_bytes]
        found[view.gpu.uuid] = (view.requested_bytes, held)
    return found


def _refusal(container_id: str, gpu, there: int, held: list[tuple[str, int]], cap: int, what: str) -> str:
    from vgpulimit.limits import format_bytes

    shown = ", ".join(f"{name} {format_bytes(n)}" for name, n in held[:4])
    if len(held) > 4:
        shown += f", and {len(held) - 4} more"
    left = max(gpu.total_bytes - there, 0)
    return (f"--admit: container {container_id} refused: its memory {what} {format_bytes(cap)} "
            f"would over-commit GPU {gpu.index} ({gpu.uuid}, {gpu.name}, "
            f"{format_bytes(gpu.total_bytes)}): guarantees (requests, else caps) there already {format_bytes(there)}"
            + (f" ({shown})" if shown else "") + f"; {format_bytes(left)} left")

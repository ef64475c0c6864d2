"""`vgpulimit top`: a live view of one container or of every container under a
directory, redrawn each second; `q` or Ctrl-C quits.

Plain terminal only (no mouse, no colours needed), so that it works over ssh
and fits 80 columns.  Reads what status.py samples; nothing else reads this
module."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Sequence
from contextlib import contextmanager

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from vgpulimit.limits import format_bytes
from vgpulimit.status import ContainerView, Sample, Sampler

_BAR_WIDTH = 16


def _memory_bar(used: int, cap: int | None) -> RenderableType:
    if not cap:
        return Text("no cap", style="dim")
    return ProgressBar(total=cap, completed=min(used, cap), width=_BAR_WIDTH)


def _devices(view: ContainerView) -> RenderableType:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    for name, justify in (("DEV", "right"), ("MEMORY", "left"), ("USED / CAP", "right"),
                          ("CORES", "right"), ("SHARE", "right"), ("THROTTLED", "right"),
                          ("OOM", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    seen = [dev for dev in view.snapshot.devices if dev.seen]
    for dev in seen:
        room = dev.cap_bytes if dev.cap_bytes is not None else (dev.total_bytes or None)
        share = view.share_pct.get(dev.index)
        table.add_row(
            str(dev.index),
            _memory_bar(dev.used_bytes, room),
            f"{format_bytes(dev.used_bytes)} / {format_bytes(room) if room else '-'}",
            f"{dev.cores_pct}%" if dev.cores_pct else "-",
            "n/a" if share is None else f"{share:.0f}%",
            f"{dev.throttled_ns / 1e9:.1f} s",
            str(dev.oom_refusals),
        )
    if not seen:
        caps = sorted({dev.limit.describe() for dev in view.snapshot.devices if dev.limit})
        return Text("no device used yet" + (f"; memory cap {', '.join(caps)}" if caps else ""))
    return table


def _processes(view: ContainerView) -> RenderableType:
    procs = view.snapshot.processes
    if not procs:
        return Text("no processes attached")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    for name, justify in (("PID", "right"), ("HOST PID", "right"), ("COMMAND", "left"),
                          ("DEV", "right"), ("MEMORY", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for proc in sorted(procs, key=lambda p: -p.total_used_bytes):
        devices = sorted(proc.used_bytes.items()) or [(None, 0)]
        for device, used in devices:
            table.add_row(str(proc.pid), str(proc.host_pid or "-"), proc.comm,
                          "-" if device is None else str(device), format_bytes(used))
    return table


def render(sample: Sample, interval_s: float) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"vgpulimit top - {time.strftime('%H:%M:%S')} - every {interval_s:g} s - q quits",
             style="bold")]
    if not sample.views and not sample.errors:
        parts.append(Text("no regions found"))
    for view in sample.views:
        parts += [Text(""), Text(f"region {view.path}", overflow="fold"), _devices(view),
                  _processes(view)]
    for path, why in sample.errors:
        parts.append(Text(f"region {path}: {why}", overflow="fold"))
    return Group(*parts)


@contextmanager
def _keys():
    """Keys one at a time without echo (Ctrl-C still interrupts); nothing when
    stdin is no terminal."""
    fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)
        yield fd
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_quit(fd: int | None, timeout_s: float) -> bool:
    """Waits up to ``timeout_s``; True when q was pressed."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 1) in (b"q", b"Q"):
            return True
    return False


def run(paths: Sequence[str] = (), directory: str | Sequence[str] | None = None, interval_s: float = 1.0) -> int:
    sampler = Sampler(paths, directory)
    console = Console()
    try:
        # Not strict: a region that breaks while watched is a line, not the end of top.
        with _keys() as fd, Live(render(sampler.sample(strict=False), interval_s), console=console,
                                 screen=True, auto_refresh=False) as live:
            while not _wait_for_quit(fd, interval_s):
                live.update(render(sampler.sample(strict=False), interval_s), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0

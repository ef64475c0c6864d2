"""`vgpulimit top`: a live view of one container or of every container under a
directory, redrawn each second, laid out as monitors of GPUs are (nvitop,
nvidia-smi): with --all, each physical GPU as the driver counts it on top,
the containers on it under it, and their processes under each container;
then the regions on no GPU the driver lists, and the unreadable ones.

Keys: q (or Ctrl-C) quits; s changes the order (GPU memory, CPU, pid); g
shows the next GPU alone (and all again after the last), 0-9 picks one, a
shows all.  ``-1`` prints one frame and exits (for logs, scripts, ssh).

Plain terminal only (no mouse, no colours needed), so that it works over ssh
and fits 80 columns: each line is cut to the terminal's width.  Reads what
status.py and node.py sample; nothing else reads this module."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from vgpulimit.agent.journal import node_agents
from vgpulimit.limits import format_bytes
from vgpulimit.processes import ProcessDetails, format_age, shown
from vgpulimit.region import ProcessSnapshot
from vgpulimit.status import ContainerView, Sample, Sampler

_BAR_WIDTH = 16
SORTS = ("memory", "cpu", "pid")


@dataclass
class Choice:
    """What the keys chose."""

    sort: str = "memory"
    gpu: int | None = None     # None: every GPU

    def press(self, key: str, gpu_count: int) -> None:
        if key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key == "a":
            self.gpu = None
        elif key == "g" and gpu_count:
            self.gpu = 0 if self.gpu is None else (self.gpu + 1 if self.gpu + 1 < gpu_count
                                                   else None)
        elif len(key) == 1 and key in "0123456789" and int(key) < gpu_count:
            self.gpu = int(key)


def _memory_bar(used: int, cap: int | None) -> RenderableType:
    if not cap:
        return Text("no cap", style="dim")
    return ProgressBar(total=cap, completed=min(used, cap), width=_BAR_WIDTH)


def _text_bar(used: int, total: int, width: int = _BAR_WIDTH) -> str:
    filled = 0 if total <= 0 else min(width, round(width * used / total))
    return "█" * filled + "░" * (width - filled)


def _devices(view: ContainerView) -> RenderableType:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    seen = [dev for dev in view.snapshot.devices if dev.seen]
    # Elastic memory's columns only where a request or a wait is set: the rest fit 80 columns as before.
    elastic = view.snapshot.memory_wait_ns or any(dev.request is not None or dev.waited_ns for dev in seen)
    for name, justify in (("DEV", "right"), ("MEMORY", "left"), ("USED / CAP", "right"),
                          *((("REQUEST", "right"), ("WAITING", "right")) if elastic else ()),
                          ("CORES", "right"), ("SHARE", "right"), ("THROTTLED", "right"), ("OOM", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for dev in seen:
        room = dev.cap_bytes if dev.cap_bytes is not None else (dev.total_bytes or None)
        share = view.share_pct.get(dev.index)
        waits = f"{dev.waiting} ({dev.waited_ns / 1e9:.1f} s, {dev.wait_timeouts} timed out)"
        table.add_row(
            str(dev.index),
            _memory_bar(dev.used_bytes, room),
            f"{format_bytes(dev.used_bytes)} / {format_bytes(room) if room else '-'}",
            *((format_bytes(dev.request_bytes) if dev.request is not None and dev.request_bytes is not None
               else "-", waits) if elastic else ()),
            f"{dev.cores_pct}%" if dev.cores_pct else "-",
            "n/a" if share is None else f"{share:.0f}%",
            f"{dev.throttled_ns / 1e9:.1f} s",
            str(dev.oom_refusals),
        )
    if not seen:
        caps = sorted({dev.limit.describe() for dev in view.snapshot.devices if dev.limit})
        return Text("no device used yet" + (f"; memory cap {', '.join(caps)}" if caps else ""))
    return table


# One line per process: PID, USER, CPU, RSS, AGE, GPU MEMORY, COMMAND (cut to the width).
_PROCESS_HEAD = f"{'PID':>8} {'USER':<8} {'CPU':>4} {'RSS':>9} {'AGE':>5} {'GPU MEM':>9}  COMMAND"


def _process_line(pid: int, details: ProcessDetails | None, gpu_bytes: int | None,
                  fallback: str) -> Text:
    fallback = shown(fallback)
    if details is not None and details.gone:
        return Text(f"{pid:>8} {'-':<8} {'-':>4} {'-':>9} {'-':>5} {'gone':>9}  {fallback}",
                    style="dim", no_wrap=True, overflow="ellipsis")
    d = details or ProcessDetails(pid)
    cpu = "-" if d.cpu_pct is None else f"{d.cpu_pct:.0f}%"
    rss = "-" if d.rss_bytes is None else format_bytes(d.rss_bytes)
    mem = "n/a" if gpu_bytes is None else format_bytes(gpu_bytes)
    return Text(f"{pid:>8} {(shown(d.user) or '-')[:8]:<8} {cpu:>4} {rss:>9} {format_age(d.age_s):>5} "
                f"{mem:>9}  {shown(_short(d.command)) or fallback}", no_wrap=True, overflow="ellipsis")


def _short(command: str) -> str:
    """The program by its name, not its directory: the arguments matter more in a line."""
    program, _, rest = command.partition(" ")
    return f"{os.path.basename(program) or program} {rest}".rstrip()


def _sorted(rows: list[tuple[int, ProcessDetails | None, int | None, str]], sort: str):
    """(pid, details, GPU bytes, fallback name) rows in the chosen order."""
    def key(row):
        pid, details, gpu_bytes, _ = row
        cpu = (details.cpu_pct if details is not None else None) or 0.0
        return {"memory": (-(gpu_bytes or 0), pid), "cpu": (-cpu, pid), "pid": (pid,)}[sort]
    return sorted(rows, key=key)


def _region_rows(procs: Sequence[ProcessSnapshot], sample: Sample, device: int | None):
    """A row per process: its host pid where known (else its pid in the
    container), and its bytes on ``device`` (None: on every device)."""
    rows = []
    for proc in procs:
        host = sample.host_pid(proc)
        used = proc.total_used_bytes if device is None else proc.used_bytes.get(device, 0)
        rows.append((host or proc.pid, sample.details.get(host or -1), used, proc.comm))
    return rows


def _processes(view: ContainerView, sample: Sample, sort: str = "memory") -> RenderableType:
    procs = view.snapshot.processes
    if not procs:
        return Text("no processes attached")
    lines = [Text(_PROCESS_HEAD, style="bold", no_wrap=True, overflow="ellipsis")]
    lines += [_process_line(*row) for row in _sorted(_region_rows(procs, sample, None), sort)]
    return Group(*lines)


def _priority(view: ContainerView) -> str | None:
    from vgpulimit.render import priority_text

    return priority_text(view.snapshot)


def _indented(line: Text) -> Text:
    return Text("  ", no_wrap=True, overflow="ellipsis").append(line)


def _gpu_block(gpu, sample: Sample, sort: str) -> list[RenderableType]:
    from vgpulimit.render import (
        commit_text,
        elastic_text,
        mig_title,
        outside_text,
        priority_text,
        reserve_text,
        tail,
    )

    g = gpu.gpu
    util = "n/a" if g.utilization_pct is None else f"{g.utilization_pct}%"
    used = "n/a" if g.used_bytes is None else format_bytes(g.used_bytes)
    total = "n/a" if g.total_bytes is None else format_bytes(g.total_bytes)
    title = (mig_title(g) if g.mig is not None else
             f"GPU {g.index}  {g.name}  {g.bus_id}  util {util}" + ("  MIG mode" if g.mig_mode else ""))
    lines: list[RenderableType] = [
        Text(title, style="bold" if g.mig is not None else "bold reverse",
             no_wrap=True, overflow="ellipsis"),
        Text(f" MEM {_text_bar(g.used_bytes or 0, g.total_bytes or 0)} {used} / {total}  "
             f"{g.uuid}", no_wrap=True, overflow="ellipsis"),
        Text(f" {reserve_text(gpu)}", no_wrap=True, overflow="ellipsis"),
    ]
    if g.mig_mode:   # its memory is its instances', below it
        return lines
    lines += [
        Text(f" {commit_text(gpu)}", style="bold red" if gpu.overcommitted else "",
             no_wrap=True, overflow="ellipsis"),
        Text(f" {outside_text(gpu)}", no_wrap=True, overflow="ellipsis"),
    ]
    elastic = elastic_text(gpu)
    if elastic is not None:
        lines.append(Text(f" {elastic}", no_wrap=True, overflow="ellipsis"))
    tenants = sorted(gpu.tenants, key=lambda t: (-t.used_bytes, t.name) if sort != "pid"
                     else (t.name,))
    if tenants:
        lines.append(Text(f" {'CONTAINER':<30} {'DEV':>3} {'USED / CAP':>19} {'SHARE':>5} "
                          f"{'THROTTLED':>9}", style="bold", no_wrap=True, overflow="ellipsis"))
        lines.append(Text("  " + _PROCESS_HEAD, style="dim", no_wrap=True, overflow="ellipsis"))
    for t in tenants:
        cap = "none" if t.cap_bytes is None else format_bytes(t.cap_bytes)
        share = "n/a" if t.share_pct is None else f"{t.share_pct:.0f}%"
        lines.append(Text(f" {tail(shown(t.name), 30):<30} {t.index:>3} "
                          f"{format_bytes(t.used_bytes) + ' / ' + cap:>19} {share:>5} "
                          f"{t.throttled_ns / 1e9:>7.1f} s", no_wrap=True, overflow="ellipsis"))
        said = priority_text(t.view.snapshot, t.device.yielded_ns if t.device is not None else 0)
        if said is not None:
            lines.append(Text(f"   {said}", no_wrap=True, overflow="ellipsis"))
        said = t.view.suspend.view_text(t.view.snapshot.taken_ns)
        if said is not None:
            lines.append(Text(f"   {said}", no_wrap=True, overflow="ellipsis"))
        if t.view.agent is not None and t.view.agent.entry is not None:
            lines.append(Text(f"   {t.view.agent.text()}", no_wrap=True, overflow="ellipsis"))
        if elastic is not None:
            request = "none" if t.request_bytes is None else format_bytes(t.request_bytes)
            lines.append(Text(f"   request {request}, borrowed {format_bytes(t.borrowed_bytes)}, "
                              f"{t.waiting} waiting, waited {t.waited_ns / 1e9:.1f} s, "
                              f"{t.wait_timeouts} timeouts", no_wrap=True, overflow="ellipsis"))
        rows = _region_rows(t.view.snapshot.processes, sample, t.index)
        lines += [_indented(_process_line(*row)) for row in _sorted(rows, sort)]
    if gpu.outside:
        lines.append(Text(" outside any cap:", style="bold", no_wrap=True))
        rows = [(p.pid, sample.details.get(p.pid), p.used_bytes, "") for p in gpu.outside]
        lines += [_indented(_process_line(*row)) for row in _sorted(rows, sort)]
    return lines


def render(sample: Sample, interval_s: float, node=None, choice: Choice | None = None
           ) -> RenderableType:
    choice = choice or Choice()
    parts: list[RenderableType] = [
        Text(f"vgpulimit top - {time.strftime('%H:%M:%S')} - every {interval_s:g} s - q quits",
             style="bold", no_wrap=True, overflow="ellipsis")]
    if node is not None and node.error is None:
        which = "all shown" if choice.gpu is None else f"showing GPU {choice.gpu}"
        parts.append(Text(f"keys: s order (by {choice.sort})  g/0-9 one GPU ({which})  a all",
                          no_wrap=True, overflow="ellipsis"))
    if not sample.views and not sample.errors:
        parts.append(Text("no regions found"))
    placed: set[str] = set()
    if node is not None:
        if node.error is not None:
            parts.append(Text(f"no physical view: {node.error}", no_wrap=True,
                              overflow="ellipsis"))
        for gpu in node.gpus:
            placed.update(t.view.path for t in gpu.tenants)
            if choice.gpu is None or gpu.gpu.index == choice.gpu:
                parts.append(Text(""))
                parts += _gpu_block(gpu, sample, choice.sort)
        if node.unavailable:
            parts.append(Text(""))
            parts += [Text(u.line, overflow="fold") for u in node.unavailable]
        for agent in node_agents([v.agent for v in sample.views], time.monotonic_ns()):
            parts += [Text(""), Text(agent.text(), overflow="fold"),
                      *[Text(line, no_wrap=True, overflow="ellipsis") for line in agent.latest_text()]]
    for view in sample.views:
        if view.path in placed:
            continue
        parts += [Text(""), Text(f"region {shown(view.path)}", overflow="fold")]
        agent = (view.agent.text() if view.agent is not None and view.agent.said(view.snapshot.memory_wait_ns)
                 else None)
        for said in (_priority(view), view.suspend.view_text(view.snapshot.taken_ns), agent):
            if said is not None:
                parts.append(Text(said, no_wrap=True, overflow="ellipsis"))
        parts += [_devices(view), _processes(view, sample, choice.sort)]
    for path, why in sample.errors:
        parts.append(Text(f"region {shown(path)}: {shown(why)}", overflow="fold"))
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


def _wait_for_key(fd: int | None, timeout_s: float) -> str | None:
    """Waits up to ``timeout_s`` for a key; None when none was pressed."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            return os.read(fd, 1).decode(errors="replace").lower()
    return None


def run(paths: Sequence[str] = (), directory: str | Sequence[str] | None = None,
        interval_s: float = 1.0, once: bool = False, pod_logs: str | None = None) -> int:
    sampler = Sampler(paths, directory, pod_logs)
    choice = Choice()

    def frame():
        # Not strict: a region that breaks while watched is a line, not the end of top.
        if directory is None:
            return sampler.sample(strict=False), None
        from vgpulimit import node

        return node.take(sampler)

    # Stdout no terminal (a pipe, a log): one frame, as -1, rather than a
    # full-screen redraw that rich writes nowhere.
    if once or not sys.stdout.isatty():
        # Two reads one interval apart, so that the share and CPU are measured
        # (one read has nothing to measure them against).
        frame()
        time.sleep(interval_s)
        sample, gpus = frame()
        Console().print(render(sample, interval_s, gpus, choice))
        return 0
    console = Console()
    try:
        sample, gpus = frame()
        with _keys() as fd, Live(render(sample, interval_s, gpus, choice), console=console,
                                 screen=True, auto_refresh=False) as live:
            while True:
                key = _wait_for_key(fd, interval_s)
                if key == "q":
                    break
                if key is None:
                    sample, gpus = frame()
                else:
                    choice.press(key, len(gpus.gpus) if gpus is not None else 0)
                live.update(render(sample, interval_s, gpus, choice), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0

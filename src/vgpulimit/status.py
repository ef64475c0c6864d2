"""`vgpulimit status`: a region snapshot for people (80 columns) and for
programs (JSON, bytes as integers).  Reads only."""

from __future__ import annotations

import json
from typing import Any

from vgpulimit.limits import format_bytes
from vgpulimit.region import DeviceSnapshot, ProcessSnapshot, RegionSnapshot


def _bytes_or_dash(count: int | None) -> str:
    return "-" if count is None else format_bytes(count)


def _limit_text(dev: DeviceSnapshot) -> str:
    if dev.limit is None:
        return "none"
    if dev.limit.ppm and dev.cap_bytes is not None:
        percent = dev.limit.describe().split("%")[0]
        return f"{format_bytes(dev.cap_bytes)} ({percent}%)"
    return dev.limit.describe()


def _index_ranges(indices: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3,5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def _device_rows(devices: tuple[DeviceSnapshot, ...]) -> list[tuple[str, ...]]:
    """One row per device; devices that no process has used yet and that have
    the same limit share a row, so sixteen unused slots take one line."""
    rows: list[tuple[str, ...]] = []
    unseen: dict[str, list[int]] = {}
    for dev in devices:
        if dev.total_bytes == 0 and dev.used_bytes == 0 and dev.oom_refusals == 0:
            unseen.setdefault(_limit_text(dev), []).append(dev.index)
            continue
        rows.append((
            str(dev.index),
            _limit_text(dev),
            format_bytes(dev.used_bytes),
            _bytes_or_dash(dev.free_bytes),
            _bytes_or_dash(dev.total_bytes or None),
            str(dev.oom_refusals),
        ))
    for limit_text, indices in unseen.items():
        rows.append((_index_ranges(indices), limit_text, "-", "-", "not seen", "-"))
    return rows


def _process_used(proc: ProcessSnapshot) -> str:
    if not proc.used_bytes:
        return "0 B"
    return ", ".join(f"{format_bytes(n)} on {d}" for d, n in sorted(proc.used_bytes.items()))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def render_text(snap: RegionSnapshot) -> str:
    lines = [f"region {snap.path} (generation {snap.generation})", ""]
    if snap.devices:
        lines += _table(("DEVICE", "LIMIT", "USED", "FREE", "TOTAL", "OOM REFUSED"),
                        _device_rows(snap.devices))
    else:
        lines.append("no limits set and no device seen yet")
    lines.append("")
    if snap.processes:
        rows = [(str(p.pid), str(p.host_pid or "-"), p.comm, _process_used(p))
                for p in snap.processes]
        lines += _table(("PID", "HOST PID", "COMMAND", "USED"), rows)
    else:
        lines.append("no processes attached")
    return "\n".join(lines) + "\n"


def to_json(snap: RegionSnapshot) -> dict[str, Any]:
    return {
        "region": snap.path,
        "generation": snap.generation,
        "devices": [
            {
                "index": dev.index,
                "limit": None if dev.limit is None else {
                    "bytes": dev.limit.bytes or None,
                    "ppm": dev.limit.ppm or None,
                    "text": dev.limit.describe(),
                },
                "cap_bytes": dev.cap_bytes,
                "cores_pct": dev.cores_pct or None,
                "total_bytes": dev.total_bytes or None,
                "used_bytes": dev.used_bytes,
                "free_bytes": dev.free_bytes,
                "oom_refusals": dev.oom_refusals,
            }
            for dev in snap.devices
        ],
        "processes": [
            {
                "pid": proc.pid,
                "host_pid": proc.host_pid,
                "comm": proc.comm,
                "used_bytes": proc.total_used_bytes,
                "devices": [{"index": d, "used_bytes": n}
                            for d, n in sorted(proc.used_bytes.items())],
            }
            for proc in snap.processes
        ],
    }


def render_json(snap: RegionSnapshot) -> str:
    return json.dumps(to_json(snap), indent=2) + "\n"

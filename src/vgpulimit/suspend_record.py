"""A container's suspends and resumes as the views show them: the record a
setter writes beside the region file (``<region>.suspend``) as it suspends or
resumes the container (suspend.py).  Read by the views, which degrade: a
missing or unreadable record is a container never suspended."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

STATES = ("running", "suspending", "suspended", "resuming")   # enum vgl_suspend_state's order
RECORD_SUFFIX = ".suspend"
RECORD_BYTES = 2048   # the record is written whole, padded: one write, which a reader sees whole


@dataclass(frozen=True)
class Record:
    """A container's suspends and resumes, as its setters wrote them."""

    state: str = "running"              # STATES
    since_ns: int = 0                   # CLOCK_MONOTONIC when the state began
    out_bytes: Mapping[int, int] = field(default_factory=dict)   # device -> bytes off the GPU
    suspends: int = 0
    resumes: int = 0
    suspended_ns: int = 0               # time suspended in all, periods ended
    last_suspend_ns: int = 0            # how long the last suspend took
    last_resume_ns: int = 0
    failed: tuple[int, ...] = ()        # its processes (as it sees them) FAILED in the driver

    def suspended_total_ns(self, now_ns: int) -> int:
        """Time suspended in all, the current period included."""
        current = now_ns - self.since_ns if self.state != "running" and self.since_ns else 0
        return self.suspended_ns + max(current, 0)

    @property
    def out_total_bytes(self) -> int:
        return sum(self.out_bytes.values())

    def out_on(self, device: int) -> int:
        """What is off the GPU of the container's ``device`` now: its memory
        while suspended (while suspending or resuming it is on its way)."""
        return self.out_bytes.get(device, 0) if self.state == "suspended" else 0

    def view_json(self, now_ns: int) -> dict:
        """What `status --json` shows of it."""
        return {"state": self.state, "out_bytes": self.out_total_bytes if self.state == "suspended" else 0,
                "suspended_ns": self.suspended_total_ns(now_ns), "suspends": self.suspends,
                "resumes": self.resumes, "last_suspend_ns": self.last_suspend_ns,
                "last_resume_ns": self.last_resume_ns, "failed": list(self.failed)}

    def view_text(self, now_ns: int) -> str | None:
        """The line `status` shows of it; None for a container never suspended."""
        if self.state == "running" and not self.suspends:
            return None
        from vgpulimit.limits import format_bytes

        counts = (f"suspended {self.suspends} time(s), resumed {self.resumes}; "
                  f"{self.suspended_total_ns(now_ns) / 1e9:.1f} s suspended in all")
        if self.state == "suspended":
            line = (f"suspended for {(now_ns - self.since_ns) / 1e9:.1f} s: "
                    f"{format_bytes(self.out_total_bytes)} off the GPU ({counts})")
        else:
            line = f"{self.state} ({counts})"
        if self.failed:
            pids = ", ".join(map(str, self.failed))
            line += (f"; process {pids} FAILED in the driver (its GPU memory was lost in a restore): "
                     "end it, then 'vgpulimit resume' brings the others back")
        return line

    def to_json(self) -> dict:
        document = asdict(self)
        document["out_bytes"] = {str(d): n for d, n in self.out_bytes.items()}
        document["failed"] = list(self.failed)
        return document


def record_path(region: str) -> str:
    return os.fspath(region) + RECORD_SUFFIX


def read_record(region: str) -> Record:
    """The record of the container of ``region``; a missing or unreadable
    one is a container never suspended (views degrade, never fail)."""
    try:
        with open(record_path(region), "rb") as f:
            document = json.loads(f.read(RECORD_BYTES) or b"{}")
        out = {int(d): int(n) for d, n in document.get("out_bytes", {}).items() if int(n) >= 0}
        failed = tuple(int(p) for p in document.get("failed", ()))
        record = Record(state=str(document["state"]), out_bytes=out, failed=failed,
                        **{k: int(document.get(k, 0)) for k in
                           ("since_ns", "suspends", "resumes", "suspended_ns", "last_suspend_ns",
                            "last_resume_ns")})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Record()
    return record if record.state in STATES else Record()


def write_record(fd: int, record: Record) -> None:
    """Into the record open at ``fd`` (suspend.py holds it locked)."""
    text = json.dumps(record.to_json()).encode()
    if len(text) > RECORD_BYTES:
        raise ValueError(f"the suspend record would take {len(text)} bytes, more than {RECORD_BYTES}")
    os.pwrite(fd, text.ljust(RECORD_BYTES), 0)

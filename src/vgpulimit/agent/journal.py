"""The node agent's state on disk, beside the board it serves: ``agent.json``
(who it is, when it last looked, what it suspended and why, its counts and
latest decisions), rewritten whole at every change and every look, and
``agent.log``, one JSON line per decision.  The agent writes the state
before it acts and again after, so an agent killed in between, restarted,
finds what it was doing (serve.py).  The views read it and degrade: a
missing, stale or unreadable state is "no agent"."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

STATE_NAME = "agent.json"
LOG_NAME = "agent.log"
LOG_KEEP_BYTES = 1 << 20      # the log is cut to its second half past this
LATEST = 20                   # decisions the state keeps for the views
STALE_NS = 5_000_000_000      # an agent that has not looked for this long is not serving


@dataclass
class Entry:
    """A container the agent suspended (or is suspending or resuming)."""

    state: str                  # suspending, suspended, resuming
    why: str
    for_name: str | None
    since_ns: int


@dataclass
class State:
    pid: int = 0
    board: str = ""
    started_ns: int = 0
    beat_ns: int = 0            # when it last looked (CLOCK_MONOTONIC)
    suspended: dict[str, Entry] = field(default_factory=dict)   # region -> entry
    suspends: int = 0
    resumes: int = 0
    refusals: int = 0           # suspends or resumes the driver or suspend.py refused
    latest: list[dict] = field(default_factory=list)
    error: str = ""             # why the last look failed, if it did


def state_path(board: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(board)), STATE_NAME)


def log_path(board: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(board)), LOG_NAME)


def read(board: str) -> State | None:
    """The state beside ``board``; None when there is none (or it is unreadable)."""
    try:
        with open(state_path(board), "rb") as f:
            doc = json.loads(f.read(1 << 20))
        entries = {str(k): Entry(str(v["state"]), str(v["why"]), v.get("for_name"), int(v["since_ns"]))
                   for k, v in doc.pop("suspended", {}).items()}
        return State(suspended=entries, **{k: doc[k] for k in State.__dataclass_fields__ if k in doc})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write(board: str, state: State) -> None:
    """Whole, by a rename: a reader sees the old state or the new."""
    path = state_path(board)
    staged = f"{path}.{os.getpid()}.tmp"
    with open(staged, "w") as f:
        json.dump(asdict(state), f)
    os.chmod(staged, 0o644)
    os.replace(staged, path)


def log(board: str, decision: dict) -> None:
    path = log_path(board)
    line = json.dumps(decision) + "\n"
    try:
        if os.path.getsize(path) > LOG_KEEP_BYTES:
            with open(path, "rb") as f:
                tail = f.read()[LOG_KEEP_BYTES // 2:]
            tail = tail[tail.find(b"\n") + 1:]
            with open(path, "wb") as f:
                f.write(tail)
    except OSError:
        pass
    with open(path, "a") as f:
        f.write(line)


def serving(state: State | None, now_ns: int) -> bool:
    """Whether an agent serves the board: its process alive, its last look recent."""
    if state is None or not state.pid:
        return False
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return now_ns - state.beat_ns < STALE_NS


@dataclass(frozen=True)
class Seen:
    """The agent as a container's views show it."""

    board: str
    serving: bool
    pid: int = 0
    entry: Entry | None = None      # the container's, while the agent holds it suspended

    def said(self, memory_wait_ns: int) -> bool:
        """Whether a container's own status says it: while the agent holds it
        suspended, or where no agent serves a container whose allocations wait."""
        return self.entry is not None or (not self.serving and bool(memory_wait_ns))

    def text(self) -> str:
        if self.entry is not None:
            head = "suspended by the node agent" if self.entry.state == "suspended" else \
                f"being {self.entry.state[:-3]}ed by the node agent"
            return f"{head}: {self.entry.why}" + ("" if self.serving else " (the agent is not serving now)")
        if self.serving:
            return f"node agent serving (pid {self.pid}): it may suspend the container by the setters' rules"
        return ("no node agent serves this board: nothing is suspended for others, and waits for memory "
                "end in refusals (docs/agent.md)")

    def to_json(self) -> dict:
        return {"board": self.board, "serving": self.serving, "pid": self.pid or None,
                "suspended": None if self.entry is None else asdict(self.entry)}


def seen_by(board: str | None, region: str, now_ns: int) -> Seen | None:
    """The agent of the board of a container (None: it has no row)."""
    if not board:
        return None
    state = read(board)
    up = serving(state, now_ns)
    entry = state.suspended.get(os.path.abspath(region)) if state else None
    return Seen(board, up, state.pid if state and up else 0, entry)


@dataclass(frozen=True)
class NodeAgent:
    """The agent of one board, as the node's views show it."""

    board: str
    serving: bool
    state: State | None

    def text(self) -> str:
        if not self.serving:
            return f"no node agent: nothing is suspended for others (board {self.board})"
        s = self.state
        held = ", ".join(f"{_short(n)}" + ("" if e.state == "suspended" else f" ({e.state})")
                         for n, e in s.suspended.items()) or "none"
        line = (f"node agent (pid {s.pid}): {s.suspends} suspend(s), {s.resumes} resume(s), {s.refusals} "
                f"refused; holds suspended: {held}")
        return line + (f"; cannot look: {s.error}" if s.error else "")

    def latest_text(self) -> list[str]:
        """Its latest decisions, newest last."""
        return [f"  {d['action']} {_short(d['container'])}" + (f" for {_short(d['for'])}" if d.get("for") else "")
                + f": {d['why']}" for d in (self.state.latest if self.state else [])[-5:]]

    def to_json(self) -> dict:
        doc = {"board": self.board, "serving": self.serving}
        if self.state is not None:
            doc.update({k: v for k, v in asdict(self.state).items() if k != "board"})
        return doc


def _short(name: str) -> str:
    parts = name.rstrip("/").split("/")
    return "/".join(parts[-2:]) if parts[-1] == "region" and len(parts) > 1 else parts[-1]


def node_agents(seen: list[Seen | None], now_ns: int) -> list[NodeAgent]:
    """The agents of the boards the containers in a view have rows in."""
    boards = sorted({s.board for s in seen if s is not None})
    agents = []
    for b in boards:
        state = read(b)
        agents.append(NodeAgent(b, serving(state, now_ns), state))
    return agents

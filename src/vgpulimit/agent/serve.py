"""The node agent's loop (docs/agent.md): look (watch.py), decide
(rules.py), act (suspend.py's suspend and resume), write down (journal.py).

It acts by the setters' rules only, and only on what it verified.  It writes
its state before each act and after it: an agent killed at any moment,
restarted, reads what it was doing and finishes it.  A suspend or resume
interrupted half way is finished by suspend.resume, which reads the states
the driver keeps for each process (a suspend cut short is undone; the rules
then decide again).  One agent serves a board at a time (a lock beside it)."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import replace

from vgpulimit import suspend
from vgpulimit.agent import journal, rules, watch
from vgpulimit.errors import VgpulimitError
from vgpulimit.region import RegionError, read_snapshot
from vgpulimit.suspend_record import read_record

SETTLE_NS = 1_000_000_000      # after acting for a claimant, it is left to take the memory this long
SHIELD_NS = 30_000_000_000     # a container whose suspend was refused is not tried again for this long
LOCK_NAME = "agent.lock"


class AgentError(VgpulimitError, RuntimeError):
    """The agent cannot serve the board."""


class Agent:
    def __init__(self, board: str, regions: Sequence[str] = (), simulate: bool = False,
                 interval_s: float = 0.1) -> None:
        self.board = os.path.abspath(board)
        self.regions = list(regions)
        self.interval_s = interval_s
        self.driver = suspend.Driver(simulate)
        if simulate:
            from vgpulimit.nvml import use_simulated

            use_simulated()
        self.gpus = watch.Driver()
        self.state = journal.State(pid=os.getpid(), board=self.board, started_ns=watch.now_ns())
        self.first_seen: dict[str, int] = {}
        self.last_active: dict[str, int] = {}
        self.last_used: dict[str, dict[str, int]] = {}
        self.acted_for: dict[str, int] = {}
        self.shielded: dict[str, int] = {}
        self.unfinished: dict[str, str] = {}   # region -> why finishing it failed, said once
        self.lock_fd = -1

    # ---- start: one agent per board; what a killed one left ----

    def take_board(self) -> None:
        path = os.path.join(os.path.dirname(self.board), LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise AgentError(f"agent: cannot open {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            held = journal.read(self.board)
            raise AgentError(f"agent: another agent serves the board {self.board}"
                             + (f" (pid {held.pid})" if held else "")) from None
        self.lock_fd = fd

    def recover(self) -> None:
        """What a killed agent left: a container it suspended stays its; one
        it was suspending or resuming is finished by the next look."""
        before = journal.read(self.board)
        if before is None:
            return
        self.state.suspends, self.state.resumes = before.suspends, before.resumes
        self.state.refusals, self.state.latest = before.refusals, before.latest
        for name, entry in before.suspended.items():
            if not os.path.exists(name):
                continue
            record = read_record(name)
            if record.state == "suspended" and entry.state != "resuming":
                # Its suspend was done: the record is written last.
                self.state.suspended[name] = replace(entry, state="suspended")
                self._decide("kept", name, "suspended by the agent before it restarted", entry.for_name)
            elif record.state != "running":
                self.state.suspended[name] = replace(entry, state="resuming")

    def finish(self) -> None:
        """A suspend or resume of the agent's cut short (it was killed, or a
        step it asked for went on in its target) is resumed whole; the rules
        then decide again.  Left suspended where it cannot be (no room: the
        rules resume it later), and tried again at the next look otherwise."""
        for name, entry in list(self.state.suspended.items()):
            if not os.path.exists(name):
                continue   # the container ended: the look forgets it
            was = read_record(name).state
            if was == "running":
                del self.state.suspended[name]
                self._decide("forgot", name, "resumed by another setter", entry.for_name)
                continue
            if entry.state == "suspended" and was == "suspended":
                continue
            try:
                suspend.resume(name, self.driver)
            except (suspend.SuspendError, RegionError) as exc:
                now = read_record(name).state
                entry.state = "suspended" if now == "suspended" else "resuming"
                if self.unfinished.get(name) != str(exc):
                    self.unfinished[name] = str(exc)
                    self._decide("refused", name, f"an interrupted {was}: {exc}", entry.for_name)
                continue
            del self.state.suspended[name]
            self.unfinished.pop(name, None)
            self.state.resumes += was == "suspended"
            self._decide("finished", name, f"an interrupted {was}: resumed", entry.for_name)

    # ---- the loop ----

    def serve(self) -> int:
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.append(1))
        self.take_board()
        self.recover()
        self._save()
        while not stop:
            self.tick()
            time.sleep(self.interval_s)
        self.state.beat_ns = 0
        self._save()
        return 0

    def tick(self) -> list[rules.Action]:
        self.finish()
        now = watch.now_ns()
        try:
            containers, free, total = self.look(now)
        except (OSError, VgpulimitError) as exc:
            self.state.error = str(exc)
            self.state.beat_ns = now
            self._save()
            return []
        self.state.error = ""
        actions = rules.decide(containers, free, total)
        for action in actions:
            self.act(action)
        self.state.beat_ns = watch.now_ns()
        self._save()
        return actions

    def look(self, now: int) -> tuple[list[rules.Container], dict[str, int], dict[str, int]]:
        rows = watch.read_board(self.board)
        if rows is None:
            raise AgentError(f"the board {self.board} is missing or not a board of this vgpulimit")
        gpus = self.gpus.gpus()
        regions = watch.watched_regions(self.board, self.regions)
        containers = []
        for row in rows.values():
            name = regions.get((row.region_dev, row.region_ino))
            if name is None or row.owner_pid > 0 and not watch.alive(row.owner_pid):
                continue   # no region here, or its holder is gone: the row is no one's
            try:
                snap = read_snapshot(name)
            except RegionError:
                continue
            containers.append(self._container(name, row, snap, gpus, now))
        names = {c.name for c in containers}
        for name in [n for n in self.state.suspended if n not in names]:
            # Its row or its region is gone: the container ended.
            del self.state.suspended[name]
            if os.path.exists(name):
                try:
                    suspend.forget(name, self.driver)
                except (suspend.SuspendError, RegionError, OSError):
                    pass   # a region gone meanwhile, or one a process holds again
            self._decide("forgot", name, "the container ended while suspended")
        return (containers, {u: g.free_bytes for u, g in gpus.items()}, {u: g.total_bytes for u, g in gpus.items()})

    def _container(self, name: str, row: watch.BoardRow, snap, gpus: dict[str, watch.Gpu], now: int) -> rules.Container:
        record = read_record(name)
        beacon = watch.read_beacon(os.path.join(os.path.dirname(self.board), watch.beacon_name(row.key)))
        pids = {p.host_pid for p in snap.processes if p.host_pid}
        guarantee, cap, used, out, waits = {}, {}, {}, {}, {}
        for d in snap.devices:
            uuid = watch.uuid_key(d.uuid)
            gpu = gpus.get(uuid) if uuid else None
            if gpu is None:
                continue
            if row.memory:
                guarantee[uuid] = min(row.guarantee(d.index, uuid, gpu.total_bytes), d.cap_bytes or gpu.total_bytes)
            cap[uuid] = d.cap_bytes or gpu.total_bytes
            listed = sum(gpu.used_by_pid.get(p, 0) for p in pids)
            used[uuid] = max(d.used_bytes, listed)
            out[uuid] = record.out_bytes.get(d.index, 0)
            if uuid in beacon.waits and d.waiting:
                waits[uuid] = beacon.waits[uuid]
        state = record.state
        if state != "running":
            used = {}
        else:
            out = {}
        active = any(pids & gpus[u].active_pids for u in cap) or used != self.last_used.get(name)
        self.last_used[name] = used
        self.first_seen.setdefault(name, now)
        if active:
            self.last_active[name] = now
        entry = self.state.suspended.get(name)
        by_agent = entry is not None and state == "suspended"
        return rules.Container(
            name=name, rank=rules.RANKS[row.rank_name], guarantee=guarantee, cap=cap, used=used, out=out,
            state=state, by_agent=by_agent, suspended_at_ns=entry.since_ns if entry else 0, waits=waits,
            asks=beacon.asks, idle_ns=now - self.last_active.get(name, self.first_seen[name]),
            idle_limit_ns=row.idle_limit_ms * 1_000_000,
            settling=now - self.acted_for.get(name, -SETTLE_NS) < SETTLE_NS,
            shielded=now - self.shielded.get(name, -SHIELD_NS) < SHIELD_NS)

    def act(self, action: rules.Action) -> None:
        now = watch.now_ns()
        if action.for_name:
            self.acted_for[action.for_name] = now
        if action.kind == "suspend":
            self.state.suspended[action.name] = journal.Entry("suspending", action.why, action.for_name, now)
            self._save()
            try:
                record = suspend.suspend(action.name, self.driver)
            except (suspend.SuspendError, RegionError) as exc:
                del self.state.suspended[action.name]
                self.shielded[action.name] = now
                self.state.refusals += 1
                self._decide("refused", action.name, f"could not suspend it: {exc}", action.for_name)
                return
            self.state.suspended[action.name].state = "suspended"
            self.state.suspends += 1
            self._decide("suspend", action.name, action.why, action.for_name, out_bytes=record.out_total_bytes,
                         took_ns=record.last_suspend_ns)
            return
        entry = self.state.suspended[action.name]
        entry.state = "resuming"
        self._save()
        try:
            record = suspend.resume(action.name, self.driver)
        except suspend.SuspendError as exc:
            entry.state = "suspended"
            self.state.refusals += 1
            self._decide("refused", action.name, f"could not resume it: {exc}")
            return
        del self.state.suspended[action.name]
        self.state.resumes += 1
        self.last_active[action.name] = now
        self._decide("resume", action.name, action.why, took_ns=record.last_resume_ns)

    def _decide(self, kind: str, name: str, why: str, for_name: str | None = None, **figures) -> None:
        decision = {"at_ns": watch.now_ns(), "time": time.time(), "action": kind, "container": name,
                    "for": for_name, "why": why, **figures}
        self.state.latest = [*self.state.latest, decision][-journal.LATEST:]
        journal.log(self.board, decision)
        self._save()

    def _save(self) -> None:
        journal.write(self.board, self.state)

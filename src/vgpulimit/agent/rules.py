"""The node agent's rules: whom to suspend for whom, and whom to resume
(docs/agent.md).  A pure model: it is given what the agent saw (the
containers, as the setters' rules and the verified facts say them, and each
GPU's free memory as the driver says it) and answers the actions, each with
its reason.  ``check`` tests the rules on any outcome.

Only setters' rules count: a container's guarantee, its cap, its priority and
its idle limit are what its setter wrote in the node's board; what a tenant
writes (its beacon, its region) enters only as claims that the agent has
verified (a waiter alive and holding its lock, an ask held by a live process)
and that can get the claimant no more than those rules give it.

1. A **claim** is a live waiter on a GPU, or a container the agent suspended
   that asks to be resumed.  It is owed memory:
   - within its guarantee: the rest of its guarantee (an asker: what it had
     on the GPU, where that is within its guarantee);
   - past it: only if it is of a higher priority than some running holder on
     the GPU; how much is not known (no setter's figure says an allocation's
     size), so one holder at a time is suspended for it, and it must settle
     before another is.
   Claims are served higher priority first, then the oldest.
2. For a claim, **victims** are running containers on the GPU other than the
   claimant, each of them:
   - of a lower priority than the claimant; or
   - borrowing past its own guarantee there, for a claim within a guarantee;
   or
   - idle at least its idle limit (``--suspend-idle``).
   A container within its guarantee, of the claimant's priority or above, and
   busy (or without an idle limit) is never a victim.
3. Victims are taken **lowest priority first**; within the priority where
   enough is freed, the **fewest** (largest first, then any not needed
   dropped).  A claim that all its victims together cannot satisfy suspends
   no one.
4. The agent **resumes** what it suspended (never a container a setter
   suspended by hand), higher priority first, then the longest suspended,
   when each GPU it held memory on has it free beyond what claims there are
   owed, and no claim there is unsatisfied.  An asker whose room is made is
   resumed in the same round."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpulimit.errors import UsageError

# The rank of each priority, higher first served; a container without one is normal.
RANKS = {"low": 0, "normal": 1, "high": 2}
IDLE_MAX_MS = 30 * 24 * 3600 * 1000   # the board keeps it in 32 bits of ms; a month is plenty
_IDLE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_idle(text: str, source: str) -> int:
    """An idle limit ("30s", "10m", "4h", "500ms"; "0": never), in ms."""
    if text.strip() == "0":
        return 0
    match = _IDLE.match(text)
    ms = round(float(match[1]) * _UNIT_MS[match[2]]) if match else -1
    if not match or ms <= 0 or ms > IDLE_MAX_MS:
        why = "out of range (at most 30d)" if match and ms > IDLE_MAX_MS else "not a valid value"
        raise UsageError(f"{source} {text!r}: {why}; give a duration with its unit: 500ms, 30s, 10m, 4h, 1d, "
                         "or 0 (never)")
    return ms


def format_ns(ns: int) -> str:
    if ns >= 3_600_000_000_000 and ns % 3_600_000_000_000 == 0:
        return f"{ns // 3_600_000_000_000}h"
    if ns >= 60_000_000_000 and ns % 60_000_000_000 == 0:
        return f"{ns // 60_000_000_000}m"
    return f"{ns / 1e9:g}s" if ns >= 1_000_000_000 else f"{ns / 1e6:g}ms"


@dataclass(frozen=True)
class Container:
    """A container on the node, as the agent sees it.  Bytes by GPU UUID."""

    name: str                                   # its region file
    rank: int = RANKS["normal"]
    guarantee: Mapping[str, int] = field(default_factory=dict)   # the setter's: its request, else its cap
    cap: Mapping[str, int] = field(default_factory=dict)         # absent: none (the GPU)
    used: Mapping[str, int] = field(default_factory=dict)        # on the GPU now
    out: Mapping[str, int] = field(default_factory=dict)         # off the GPU, while suspended
    state: str = "running"                      # suspend_record.STATES
    by_agent: bool = False                      # suspended by the agent (its journal says)
    suspended_at_ns: int = 0
    waits: Mapping[str, int] = field(default_factory=dict)       # GPU -> since (ns), live waiters only
    asks: bool = False                          # asks to be resumed (a live process holds its ask)
    idle_ns: int | None = None                  # how long its GPU work has been idle; None: busy
    idle_limit_ns: int = 0                      # --suspend-idle; 0: never for idleness
    settling: bool = False                      # the agent acted for it a moment ago: let it take
    shielded: bool = False                      # a suspend of it was refused a moment ago: not now

    def idle(self) -> bool:
        return bool(self.idle_limit_ns) and self.idle_ns is not None and self.idle_ns >= self.idle_limit_ns


@dataclass(frozen=True)
class Action:
    kind: str                 # "suspend" or "resume"
    name: str                 # the container's region
    why: str                  # one line, for the journal and the views
    for_name: str | None = None   # the claimant it was done for


@dataclass(frozen=True)
class Claim:
    claimant: Container
    owed: Mapping[str, int | None]   # GPU -> bytes owed; None: not known (past its guarantee)
    since_ns: int
    within: bool                     # within its guarantee
    why: str

    @property
    def asks(self) -> bool:
        return not self.claimant.waits


def _claims(containers: Sequence[Container], total: Mapping[str, int]) -> list[Claim]:
    claims = []
    running = [c for c in containers if c.state == "running"]
    for c in containers:
        if c.state == "running":
            for gpu, since in c.waits.items():
                used = c.used.get(gpu, 0)
                guarantee = c.guarantee.get(gpu, 0)
                if used < guarantee:
                    claims.append(Claim(c, {gpu: guarantee - used}, since, True,
                                        "waits for memory within its guarantee"))
                elif any(o.rank < c.rank and o.used.get(gpu, 0) for o in running if o is not c):
                    claims.append(Claim(c, {gpu: None}, since, False,
                                        "waits for memory, of a higher priority than holders"))
        elif c.state == "suspended" and c.by_agent and c.asks:
            owed = {gpu: n for gpu, n in c.out.items() if n}
            within = all(n <= c.guarantee.get(gpu, 0) for gpu, n in owed.items())
            if owed:
                claims.append(Claim(c, owed, c.suspended_at_ns, within, "asks to be resumed (it called CUDA)"))
    return sorted(claims, key=lambda k: (-k.claimant.rank, k.since_ns, k.claimant.name))


def _reason(victim: Container, claim: Claim, gpu: str) -> str | None:
    """Why ``victim`` may be suspended for ``claim`` on ``gpu``; None: it may not."""
    if (victim is claim.claimant or victim.state != "running" or victim.shielded
            or not victim.used.get(gpu, 0)):
        return None
    if victim.rank < claim.claimant.rank:
        return "of a lower priority"
    if claim.within and victim.used.get(gpu, 0) > victim.guarantee.get(gpu, 0):
        return "borrowing past its guarantee"
    if victim.idle():
        return f"idle for {format_ns(victim.idle_ns)} (its limit {format_ns(victim.idle_limit_ns)})"
    return None


def _pick(eligible: list[Container], gpu: str, need: int | None) -> list[Container]:
    """Lowest priority first; within the priority where enough is freed, the
    fewest.  ``need`` None: one, the largest of the lowest."""
    if need is None:
        lowest = min(c.rank for c in eligible)
        return [max((c for c in eligible if c.rank == lowest), key=lambda c: (c.used.get(gpu, 0), c.name))]
    chosen: list[Container] = []
    for rank in sorted({c.rank for c in eligible}):
        tier = sorted((c for c in eligible if c.rank == rank), key=lambda c: (-c.used.get(gpu, 0), c.name))
        left = need - sum(c.used.get(gpu, 0) for c in chosen)
        if sum(c.used.get(gpu, 0) for c in tier) < left:
            chosen += tier
            continue
        taken: list[Container] = []
        for c in tier:
            if sum(t.used.get(gpu, 0) for t in taken) >= left:
                break
            taken.append(c)
        for c in sorted(taken, key=lambda c: c.used.get(gpu, 0)):
            if sum(t.used.get(gpu, 0) for t in taken if t is not c) >= left:
                taken.remove(c)
        return chosen + taken
    return []   # not enough, all of them together


def decide(containers: Sequence[Container], free: Mapping[str, int], total: Mapping[str, int]) -> list[Action]:
    """The actions for what the agent sees: suspends first, then resumes."""
    avail = dict(free)
    chosen: dict[str, Container] = {}
    actions: list[Action] = []
    blocked: set[str] = set()     # GPUs with a claim left unsatisfied: nothing resumes there
    resumed: list[Container] = []
    for claim in _claims(containers, total):
        if claim.claimant.settling:
            blocked |= set(claim.owed)
            continue
        picks: dict[str, tuple[Container, str]] = {}
        ok = True
        for gpu, owed in claim.owed.items():
            have = avail.get(gpu, 0) + sum(v.used.get(gpu, 0) for v, _ in picks.values())
            if owed is not None and have >= owed:
                continue
            eligible = [c for c in containers if c.name not in chosen and c.name not in picks
                        and _reason(c, claim, gpu)]
            need = None if owed is None else owed - have
            victims = _pick(eligible, gpu, need) if eligible else []
            if not victims:
                ok = False
                break
            picks.update({v.name: (v, _reason(v, claim, gpu)) for v in victims})
        if not ok:
            blocked |= set(claim.owed)
            continue
        for v, reason in picks.values():
            chosen[v.name] = v
            for gpu, n in v.used.items():
                avail[gpu] = avail.get(gpu, 0) + n
            actions.append(Action("suspend", v.name, f"{reason}, for {_short(claim.claimant.name)}, which "
                                  f"{claim.why}", claim.claimant.name))
        for gpu, owed in claim.owed.items():
            if owed is None:
                blocked.add(gpu)   # how much it takes is not known: it settles first
            else:
                avail[gpu] = avail.get(gpu, 0) - owed
        if claim.asks:
            resumed.append(claim.claimant)
    for c in resumed:
        actions.append(Action("resume", c.name, "it called CUDA (resume on use)"))
    waiting = sorted((c for c in containers if c.state == "suspended" and c.by_agent and c not in resumed),
                     key=lambda c: (-c.rank, c.suspended_at_ns, c.name))
    for c in waiting:
        if any(gpu in blocked or avail.get(gpu, 0) < n for gpu, n in c.out.items() if n):
            continue
        for gpu, n in c.out.items():
            avail[gpu] = avail.get(gpu, 0) - n
        actions.append(Action("resume", c.name, "its memory is free again"))
    return actions


def _short(name: str) -> str:
    """A region's name as the journal says it: its directory's or file's name."""
    parts = name.rstrip("/").split("/")
    return "/".join(parts[-2:]) if parts[-1] == "region" and len(parts) > 1 else parts[-1]


def check(containers: Sequence[Container], free: Mapping[str, int], total: Mapping[str, int],
          actions: Iterable[Action]) -> None:
    """The rules on an outcome (AssertionError when one is broken)."""
    by_name = {c.name: c for c in containers}
    for a in actions:
        c = by_name[a.name]
        if a.kind == "resume":
            assert c.by_agent and c.state == "suspended", f"{a.name}: resumed, and the agent did not suspend it"
            continue
        claimant = by_name[a.for_name]
        assert claimant is not c and c.state == "running"
        gpus = [g for g in (claimant.waits or claimant.out) if c.used.get(g, 0)]
        assert gpus, f"{a.name}: suspended for {a.for_name}, and holds nothing on its GPUs"
        assert any(c.rank < claimant.rank or c.idle() or c.used.get(g, 0) > c.guarantee.get(g, 0)
                   for g in gpus), f"{a.name}: suspended, and no rule lets it be"

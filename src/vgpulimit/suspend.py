"""Suspend and resume a container through the driver's checkpoint API
(cuda.h, "CUDA Checkpointing", driver 570 and later; docs/suspend.md).

A setter's act: the caller is outside the container and names it by its region
file; the container's processes are the region's live slots.  A suspend locks
them all first (their CUDA calls wait, their submitted work drains), then
checkpoints them all (their device memory goes to host memory, the GPU's is
free); a resume restores them all, then unlocks them all.  All or nothing: a
step that fails undoes the steps done before it, so a container is never left
half suspended by a refusal.  A setter killed half way leaves the driver's
states to say where each process is; ``resume`` reads them and finishes.

What the suspend changes beside the driver, for the container's shim and the
views: the region's ``suspend_state`` word (the shim never lowers its charge
for the driver's overhead while it is not RUNNING), the container's row in the
node's board (nothing held for its guarantee while it is suspended: others may
borrow what it left), and its record, a file beside the region with the state,
the bytes out and the counts and times the views show.

The model (``plan_suspend``, ``plan_resume``: what to do with each process,
given the states the driver reports) is apart from the mechanism (``Driver``
and ``suspend``/``resume``)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from vgpulimit.errors import VgpulimitError
from vgpulimit.suspend_record import STATES, Record, read_record, record_path, write_record

DEFAULT_LOCK_TIMEOUT_MS = 10_000
# A call without a timeout of its own (checkpoint, restore, unlock) waits for
# the process to answer: at most the lock's timeout and the copy of what the
# container holds at this rate, far below any host link, before the setter
# gives it up (a process stopped half way answers none).
SLOWEST_COPY_BYTES_PER_S = 1 << 30
# The driver carries out one request of a process at a time, so a step a
# killed setter asked for goes before the resume's own and moves the state
# under it: the resume reads the states again, at most this many times.
RESUME_ROUNDS = 3

# CUprocessState (cuda.h)
RUNNING, LOCKED, CHECKPOINTED, FAILED = range(4)
PROCESS_STATES = ("RUNNING", "LOCKED", "CHECKPOINTED", "FAILED")
# CUresult values the steps tell apart (cuda.h)
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3   # the process has no CUDA context (or is gone)
CUDA_ERROR_NOT_READY = 600       # a lock's timeout passed
CUDA_ERROR_ILLEGAL_STATE = 401   # the step does not apply to the process's state
CUDA_ERROR_NOT_SUPPORTED = 801   # managed (UVM) or IPC memory

_CALLS = ("cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
          "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock")


class SuspendError(VgpulimitError, RuntimeError):
    """The container cannot be suspended or resumed; nothing was left half done."""


# ---- The model: what to do with each process ----------------------------------


@dataclass(frozen=True)
class Target:
    """A process of the container, as the driver names it."""

    pid: int                  # in the setter's pid namespace: what the driver is given
    container_pid: int        # as the container sees it
    comm: str

    @property
    def shown(self) -> str:
        return f"process {self.container_pid} ({self.comm})" if self.comm else f"process {self.container_pid}"


def plan_suspend(states: Mapping[Target, int | None]) -> list[Target]:
    """The processes a suspend locks and checkpoints, in order: those with a
    context (state not None), every one RUNNING.  SuspendError otherwise."""
    live = [t for t, s in states.items() if s is not None]
    if not live:
        raise SuspendError("no process of the container holds a CUDA context: nothing to suspend")
    for t in live:
        if states[t] == FAILED:
            raise SuspendError(_failed_line(t))
    if all(states[t] == CHECKPOINTED for t in live):
        raise SuspendError("the container is suspended already")
    for t in live:
        if states[t] != RUNNING:
            raise SuspendError(f"{t.shown} is {PROCESS_STATES[states[t]]}: a suspend or resume was "
                               "interrupted, or another setter holds it; 'vgpulimit resume' brings it back")
    return live


def _failed_line(t: Target) -> str:
    return (f"{t.shown} is FAILED in the driver (an uncorrectable error in a checkpoint or restore: its GPU "
            f"memory is lost) and cannot run on: end it (kill {t.container_pid} in the container), then "
            "'vgpulimit resume' brings the others back")


def plan_resume(states: Mapping[Target, int | None], interrupted: bool = False) -> tuple[list[Target], list[Target]]:
    """The processes a resume restores (CHECKPOINTED), then unlocks (those
    and the LOCKED); SuspendError when there is nothing to resume or a
    process cannot be.  ``interrupted``: the record says a setter was killed
    half way, and a step it asked for may still be under way in a process
    that reads RUNNING (a lock waiting for work to drain): every live one is
    unlocked then, which waits for that step and undoes it (an unlock of a
    RUNNING process is refused, and changes nothing)."""
    for t, s in states.items():
        if s == FAILED:
            raise SuspendError(_failed_line(t))
    restore = [t for t, s in states.items() if s == CHECKPOINTED]
    held = (LOCKED, CHECKPOINTED, RUNNING) if interrupted else (LOCKED, CHECKPOINTED)
    unlock = [t for t, s in states.items() if s in held]
    if not unlock and not interrupted:
        raise SuspendError("the container is not suspended")
    return restore, unlock


# ---- The mechanism: the driver -----------------------------------------------


class Driver:
    """libcuda.so.1's checkpoint calls, through ctypes; ``simulate``: the
    simulated GPU's driver that ships with vgpulimit."""

    def __init__(self, simulate: bool = False) -> None:
        if simulate:
            from vgpulimit._paths import simgpu_dir

            path = str(simgpu_dir() / "libcuda.so.1")
        else:
            path = "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise SuspendError(f"cannot load the CUDA driver ({path}): {exc}") from None
        missing = [name for name in _CALLS if not hasattr(self.lib, name)]
        if missing:
            raise SuspendError(f"the CUDA driver has no checkpoint API ({missing[0]}): suspending needs "
                               "NVIDIA driver 570 or later")
        code = self.lib.cuInit(0)
        if code != CUDA_SUCCESS:
            raise SuspendError(f"the CUDA driver does not start (cuInit: {self.name(code)})")

    def name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
            return text.value.decode()
        return f"CUresult {code}"

    def state(self, pid: int) -> int | None:
        """The process's CUprocessState; None when it has no CUDA context (or is gone)."""
        state = ctypes.c_int()
        code = self.lib.cuCheckpointProcessGetState(pid, ctypes.byref(state))
        if code == CUDA_ERROR_NOT_INITIALIZED:
            return None
        if code != CUDA_SUCCESS:
            raise SuspendError(f"cannot ask the driver about process {pid}: {self.name(code)}")
        return state.value

    def lock(self, pid: int, timeout_ms: int) -> int:
        args = (ctypes.c_uint32 * 16)()   # CUcheckpointLockArgs: timeoutMs, then reserved zeros
        args[0] = timeout_ms
        return self.lib.cuCheckpointProcessLock(pid, args)

    def checkpoint(self, pid: int) -> int:
        return self.lib.cuCheckpointProcessCheckpoint(pid, None)

    def restore(self, pid: int) -> int:
        return self.lib.cuCheckpointProcessRestore(pid, None)

    def unlock(self, pid: int) -> int:
        return self.lib.cuCheckpointProcessUnlock(pid, None)


# ---- The mechanism: a container ------------------------------------------------


def _targets(region: str) -> tuple[list[Target], object]:
    """The container's live processes, by the pid the driver knows them by,
    and the region's snapshot.  A slot is its tenant's to write: one naming
    a neighbour's pid would have the neighbour locked and checkpointed with
    the container, so every process named must map the region file, as a
    process under its shim does, or nothing is done."""
    from vgpulimit.processes import host_pids
    from vgpulimit.region import read_snapshot

    snapshot = read_snapshot(region)
    host = host_pids() if any(p.host_pid is None for p in snapshot.processes) else {}
    st = os.stat(region)
    mapped = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} "
    targets = []
    for p in snapshot.processes:
        pid = p.host_pid or host.get((p.pid, p.start_ticks))
        if pid is None:
            raise SuspendError(f"cannot tell which process of this machine the container's process {p.pid} "
                               "is: run vgpulimit suspend on the node, in its pid namespace")
        if not _maps(pid, mapped):
            raise SuspendError(f"the region names process {pid}, which does not map it: it may be another "
                               "container's, so nothing was done (a tenant writes its own region's slots)")
        targets.append(Target(pid=pid, container_pid=p.pid, comm=p.comm))
    return targets, snapshot


def _maps(pid: int, needle: str) -> bool:
    """Whether the process maps the file whose "major:minor inode " is
    ``needle``; a process gone meanwhile holds nothing, and counts as one."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return needle in f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False


@contextmanager
def _exclusive(region: str) -> Iterator[int]:
    """The container's record, open and locked: one setter at a time
    suspends or resumes a container.  The record is the lock, not the region
    file, which the container's processes may open and lock too: a tenant
    must not be able to keep itself from being suspended."""
    try:
        st = os.stat(region)
        fd = os.open(record_path(region), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     st.st_mode & 0o666)
    except OSError as exc:
        raise SuspendError(f"region {region}: {exc.strerror}") from None
    try:
        if os.geteuid() == 0:
            os.fchown(fd, st.st_uid, st.st_gid)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SuspendError(f"region {region}: another suspend or resume of the container is under "
                               "way") from None
        yield fd
    finally:
        os.close(fd)


class _Container:
    """The words beside the driver that a suspend changes: the region's, the
    board row's and the record."""

    def __init__(self, region: str, snapshot, fd: int) -> None:
        self.region = region
        self.fd = fd
        self.board = snapshot.board
        self.record = read_record(region)

    def set_state(self, state: str, **changes) -> None:
        from vgpulimit.region import Region

        self.record = replace(self.record, state=state, **changes)
        write_record(self.fd, self.record)
        with Region.open(self.region) as mapped:
            mapped.set_suspend_state(STATES.index(state))

    def mark_board(self, suspended: bool) -> None:
        if self.board:
            from vgpulimit import board

            path = board.reachable(self.board, self.region)
            board.set_suspended(path, self.region, suspended)
            if suspended:
                # Its processes, locked, free nothing: those who wait for
                # memory elsewhere are woken here, not at their next recheck.
                from vgpulimit.region import Region

                with Region.open(self.region) as mapped:
                    board.wake_waiters(path, mapped.board_key)


def _failure(driver: Driver, target: Target, step: str, code: int, timeout_ms: int) -> SuspendError:
    if code == CUDA_ERROR_NOT_SUPPORTED and step == "checkpoint":
        why = "holds managed (UVM) or IPC memory, which the driver's checkpoint refuses"
    elif code == CUDA_ERROR_NOT_READY and step == "lock":
        why = (f"did not finish its submitted GPU work within {timeout_ms} ms (--timeout), or did not "
               "answer (is it stopped?)")
    elif code == CUDA_ERROR_OUT_OF_MEMORY and step == "restore":
        why = "cannot have its memory back: the GPU has no room for it now (it stays suspended)"
    else:
        why = f"{step} failed: {driver.name(code)}"
    return SuspendError(f"{target.shown} {why}")


def _answer(call: Callable[[int], int], pid: int, within_s: float) -> int | None:
    """``call(pid)``; None when the process has not answered within
    ``within_s``.  The call goes on in a thread of its own, left behind: the
    driver's call cannot be taken back, only no longer waited for."""
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(call(pid)), daemon=True)
    worker.start()
    worker.join(within_s)
    return result[0] if result else None


def _run_steps(driver: Driver, steps: Sequence[tuple[str, Callable[[int], int], list[Target]]],
               timeout_ms: int, within_s: float) -> list[tuple[str, Target]]:
    """Each step on each of its targets, in order; the (step, target) pairs
    done.  _StepFailed when one fails (a process gone meanwhile is skipped:
    it holds nothing) or does not answer within ``within_s``."""
    done: list[tuple[str, Target]] = []
    for step, call, targets in steps:
        for t in targets:
            code = _answer(call, t.pid, within_s)
            if code is None:
                raise _StepFailed(done, SuspendError(
                    f"{t.shown} did not answer the driver's {step} within {within_s:.0f} s (is it stopped?): "
                    "it stays as the driver holds it, the others as they were; 'vgpulimit resume' brings it "
                    "back once it runs"), t, stuck=True)
            if code == CUDA_ERROR_NOT_INITIALIZED:
                continue
            if code != CUDA_SUCCESS:
                raise _StepFailed(done, _failure(driver, t, step, code, timeout_ms), t)
            done.append((step, t))
    return done


class _StepFailed(Exception):
    def __init__(self, done: list[tuple[str, Target]], error: SuspendError, target: Target,
                 stuck: bool = False) -> None:
        super().__init__(str(error))
        self.done = done
        self.error = error
        self.target = target
        self.stuck = stuck

    def undo(self, calls: Mapping[str, Callable[[int], int]], within_s: float) -> None:
        """The steps done, undone in reverse; none on a process that does not answer."""
        for step, t in reversed(self.done):
            if not (self.stuck and t == self.target):
                _answer(calls[step], t.pid, within_s)


def _within_s(timeout_ms: int, snapshot) -> float:
    """How long a setter waits for a process to answer one call."""
    held = sum(d.used_bytes for d in snapshot.devices)
    return timeout_ms / 1000 + held / SLOWEST_COPY_BYTES_PER_S + 1


def suspend(region: str, driver: Driver, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
            clock: Callable[[], int] = time.monotonic_ns) -> Record:
    """Suspends the container of ``region``: its record after."""
    with _exclusive(region) as fd:
        targets, snapshot = _targets(region)
        live = plan_suspend({t: driver.state(t.pid) for t in targets})
        container = _Container(region, snapshot, fd)
        started = clock()
        container.set_state("suspending", since_ns=started)
        steps = [("lock", lambda pid: driver.lock(pid, timeout_ms), live), ("checkpoint", driver.checkpoint, live)]
        within_s = _within_s(timeout_ms, snapshot)
        try:
            _run_steps(driver, steps, timeout_ms, within_s)
        except _StepFailed as failed:
            failed.undo({"checkpoint": driver.restore, "lock": driver.unlock}, within_s)
            container.set_state("running", since_ns=0, out_bytes={})
            raise failed.error from None
        from vgpulimit.region import read_snapshot

        # Read again: its processes are locked now, so what they hold is still.
        out = {d.index: d.used_bytes for d in read_snapshot(region).devices if d.used_bytes}
        container.mark_board(True)
        done = clock()
        container.set_state("suspended", since_ns=done, out_bytes=out, suspends=container.record.suspends + 1,
                            last_suspend_ns=done - started)
        return container.record


def resume(region: str, driver: Driver, clock: Callable[[], int] = time.monotonic_ns) -> Record:
    """Resumes the container of ``region`` (or finishes a suspend or resume
    that was interrupted): its record after."""
    with _exclusive(region) as fd:
        targets, snapshot = _targets(region)
        container = _Container(region, snapshot, fd)
        interrupted = container.record.state in ("suspending", "resuming")
        restore, unlock = plan_resume({t: driver.state(t.pid) for t in targets}, interrupted)
        suspended_since = container.record.since_ns if container.record.state == "suspended" else 0
        started = clock()
        container.set_state("resuming", since_ns=container.record.since_ns or started)
        container.mark_board(False)   # its guarantee is held again before its memory comes back
        within_s = _within_s(DEFAULT_LOCK_TIMEOUT_MS, snapshot)

        def restore_step(pid: int) -> int:
            code = driver.restore(pid)
            try:
                if code == CUDA_ERROR_ILLEGAL_STATE and driver.state(pid) == LOCKED:
                    return CUDA_SUCCESS   # a killed setter's restore went first: the memory is back
            except SuspendError:
                pass
            return code

        silent: list[Target] = []
        for _ in range(RESUME_ROUNDS):
            try:
                _run_steps(driver, [("restore", restore_step, restore)], 0, within_s)
            except _StepFailed as failed:
                failed.undo({"restore": driver.checkpoint}, within_s)
                t = failed.target
                lost = not failed.stuck and driver.state(t.pid) == FAILED
                container.mark_board(True)
                container.set_state("suspended", failed=(t.container_pid,) if lost else ())
                raise (SuspendError(_failed_line(t)) if lost else failed.error) from None
            silent += [t for t in unlock if _answer(driver.unlock, t.pid, within_s) is None]
            behind = {t: s for t in targets if t not in silent
                      and (s := driver.state(t.pid)) is not None and s != RUNNING}
            if not behind:
                break
            restore, unlock = plan_resume(behind)
        else:
            t, state = next(iter(behind.items()))
            raise SuspendError(f"{t.shown} is still {PROCESS_STATES[state]} after its unlock: a step asked for "
                               "earlier is still under way in it; run 'vgpulimit resume' again")
        done = clock()
        period = done - suspended_since if suspended_since else 0
        container.set_state("running", since_ns=0, out_bytes={}, failed=(), resumes=container.record.resumes + 1,
                            suspended_ns=container.record.suspended_ns + period, last_resume_ns=done - started)
        if silent:
            raise SuspendError(f"{silent[0].shown} did not answer the driver's unlock within {within_s:.0f} s (is "
                               "it stopped?): its memory is back, its CUDA calls wait until 'vgpulimit resume' "
                               "unlocks it once it runs")
        return container.record


def forget(region: str, driver: Driver) -> bool:
    """A container whose processes all ended while it was suspended holds
    nothing on the GPU or off it: its record, its region's word and its
    board row say it runs again.  False (nothing changed) while a process of
    it holds a CUDA context, or it is not suspended."""
    with _exclusive(region) as fd:
        targets, snapshot = _targets(region)
        if any(driver.state(t.pid) is not None for t in targets):
            return False
        container = _Container(region, snapshot, fd)
        if container.record.state == "running":
            return False
        if snapshot.board:
            from vgpulimit import board

            try:
                container.mark_board(False)
            except board.BoardError:
                pass   # its row is gone with it
        period = time.monotonic_ns() - container.record.since_ns if container.record.since_ns else 0
        container.set_state("running", since_ns=0, out_bytes={}, failed=(),
                            suspended_ns=container.record.suspended_ns + max(period, 0))
        return True

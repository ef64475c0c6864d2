"""`vgpulimit run`: the container entrypoint.

Sets up a tenant with the limits (provision.py; where: placement.py), starts the
command with the shim preloaded and the region's path in its environment
(child_env.py: the region carries the limits, one carrier), forwards signals
to it, reaps every child (it may be PID 1), reclaims the slots of dead
processes, and exits with the command's status.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from vgpulimit import board, provision
from vgpulimit._paths import libpath, simgpu_dir
from vgpulimit.child_env import child_environment
from vgpulimit.errors import UsageError, VgpulimitError
from vgpulimit.placement import enclosing_region, runtime_base
from vgpulimit.region import PARENT_LEN, Region, RegionError
from vgpulimit.request import RunOptions, looser
from vgpulimit.signals import FORWARDED_SIGNALS, WAITED_SIGNALS, held

# Said once by a run that limits nothing (no flag, no variable, no enclosing region).
NOTHING_LIMITED = ("vgpulimit: note: no limit given (no --memory or --cores, no VGPULIMIT_* or HAMi "
                   "CUDA_DEVICE_* variables): the command runs with nothing limited")

# The signals a terminal sends to its foreground process group (see _should_forward).
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGWINCH, signal.SIGHUP})
SI_KERNEL = 0x80
# The supervisor frees the slots of dead processes at least this often.
RECLAIM_INTERVAL_S = 1.0


class SupervisorError(VgpulimitError, RuntimeError):
    """The supervisor cannot set up the run."""


class CommandError(VgpulimitError, OSError):
    """The command cannot be started; ``exit_code`` is the shell's: 127 not
    found, 126 found but not executable."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- the child ---------------------------------------------------------------------------------


def _spawn(argv: Sequence[str], env: Mapping[str, str], sigmask) -> int:
    """Starts the command with the signal mask we were started with and the
    dispositions Python changed (SIGPIPE, SIGXFSZ: ignored) back to default."""
    name = argv[0]
    try:
        return os.posix_spawnp(name, list(argv), dict(env), setsigmask=sigmask,
                               setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except FileNotFoundError:
        what = "no such file" if "/" in name else "command not found"
        raise CommandError(127, f"{name}: {what}") from None
    except PermissionError:
        raise CommandError(126, f"{name}: permission denied") from None
    except OSError as exc:
        raise CommandError(126, f"{name}: cannot execute: {exc.strerror}") from None
    except ValueError as exc:   # an empty name, a NUL byte: no exec(2) could take it
        raise CommandError(126, f"{name!r}: cannot execute: {exc}") from None


def _should_forward(info: signal.struct_siginfo, child: int) -> bool:
    """Whether a signal that reached the supervisor should be sent on to the child.

    The child runs in our process group, so it shares our terminal.  When the
    terminal signals its foreground process group -- Ctrl-C (SIGINT), Ctrl-\\
    (SIGQUIT), a resize (SIGWINCH), and SIGHUP to the foreground group when
    the session leader exits -- the child got the signal as we did, and the
    kernel marks ours si_code == SI_KERNEL.  Sending it again would deliver it
    twice (a program that takes the first Ctrl-C as "finish up" would take
    the second as "abort").  So the rule:

      * SI_KERNEL, a terminal signal, and the child still in our process
        group: not forwarded, it already arrived;
      * except SIGHUP while we are the session leader: at a hangup the kernel
        signals the session leader alone (tty_signal_session_leader), so the
        child did not get it;
      * the child in a group of its own (it called setsid or setpgid, as a
        job-control shell does): the terminal did not signal it, forward;
      * anything else -- kill(2) from a user, `docker stop`, systemd
        (SI_USER, SI_QUEUE, ...) -- was aimed at us: forward.

    A `kill -INT -PGID` aimed at our whole group is SI_USER and cannot be
    told from one aimed at us alone: the child gets it twice.  Signal the
    supervisor's pid, not its group.
    """
    if info.si_code != SI_KERNEL or info.si_signo not in TERMINAL_SIGNALS:
        return True
    if info.si_signo == signal.SIGHUP and os.getsid(0) == os.getpid():
        return True
    try:
        return os.getpgid(child) != os.getpgrp()
    except ProcessLookupError:
        return False


def _reap(child: int) -> int | None:
    """Reaps every child that has exited -- orphans reparented to us when we
    are PID 1 included; returns the wait status of ``child`` if it was one."""
    status = None
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid == child:
            status = wait_status
    return status


_said_held: list[bool] = []   # the region lock was said to be held past its bound


def _reclaim(region: Region, beacon: str | None = None) -> None:
    """Frees the slots of dead processes, and says in the container's
    ``beacon`` (None: it has none) that those that waited for memory wait
    no longer.  The supervisor must keep
    supervising: a failed reclaim is retried next time, except in a region
    that a process of the container truncated.  The C side's guard keeps that
    from killing us (SIGBUS), even when it happens within a reclaim; the
    mapping then holds private zeros where the file lost pages, so it is
    closed and reclaiming stops, said once."""
    if region.closed:
        return
    try:
        region.reclaim()
        if beacon is not None:
            region.repair_beacon(beacon)
    except RegionError as exc:
        if region.intact:
            if exc.errno == errno.ETIMEDOUT and not _said_held:
                _said_held.append(True)   # once: it is tried again every second
                print(f"vgpulimit run: {exc}; reclaiming is tried again each second",
                      file=sys.stderr, flush=True)
            return
        region.close()
        print(f"vgpulimit run: {exc}; the slots of dead processes are no longer reclaimed",
              file=sys.stderr, flush=True)


def _supervise(child: int, region: Region, beacon: str | None) -> int:
    """Waits for the child, forwarding signals; returns its wait status.

    It reclaims every RECLAIM_INTERVAL_S, at a timer's SIGALRM, waited for
    with the others: not at a timeout of sigtimedwait, which CPython (3.11)
    answers with a siginfo it never filled in when the wait was interrupted
    past its deadline -- the supervisor stopped and continued (Ctrl-Z, `fg`)
    -- and the supervisor would act on a signal no one sent."""
    signal.setitimer(signal.ITIMER_REAL, RECLAIM_INTERVAL_S, RECLAIM_INTERVAL_S)
    try:
        while True:
            info = signal.sigwaitinfo(WAITED_SIGNALS)
            if info.si_signo == signal.SIGALRM:
                _reclaim(region, beacon)
            elif info.si_signo == signal.SIGCHLD:
                status = _reap(child)
                if status is not None:
                    return status
                _reclaim(region, beacon)
            elif _should_forward(info, child):
                try:
                    os.kill(child, info.si_signo)
                except ProcessLookupError:
                    pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _take_pending() -> list[int]:
    """The forwarded signals that came before the child exists, taken off to
    be sent to it as it starts: ``_should_forward`` would take a Ctrl-C among
    them for one the child got from the terminal too, but it was not there."""
    taken = []
    while (info := signal.sigtimedwait(FORWARDED_SIGNALS, 0)) is not None:
        taken.append(info.si_signo)
    return taken


def _exit_code(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def _run_child(argv: Sequence[str], env: Mapping[str, str], region: Region, started: str = "",
               beacon: str | None = None) -> int:
    """``started``: a line said once the command runs (not when it cannot start);
    ``beacon``: the container's, which the supervisor repairs as it reclaims."""
    # `vgpulimit run` holds them from its start (cli.main); a caller that did
    # not, holds them before the child exists: a SIGCHLD from a child that
    # exits at once stays pending until we wait for it.
    with held() as sigmask:
        early = _take_pending()
        child = _spawn(argv, env, sigmask)
        for sig in early:
            os.kill(child, sig)
        if started:
            print(started, file=sys.stderr)
        status = _supervise(child, region, beacon)
        _reclaim(region, beacon)
        return _exit_code(status)


def _warn(line: str) -> None:
    print(f"vgpulimit: warning: {line}", file=sys.stderr)


def _looser(path: str, options: RunOptions) -> None:
    """Warns of each asked limit looser than the enclosing region's, which
    hold as well (a nested run can only tighten)."""
    with Region.open(path) as region:
        devices = region.snapshot(all_devices=True).devices
    for line in looser(options.limits, devices, path):
        _warn(line)


def run(options: RunOptions, environ: Mapping[str, str] | None = None) -> int:
    """Runs the command under the limits; returns the exit code for it
    (its status, or 128+N when a signal N killed it).

    Inside a region already (a container set up by the hook, or an enclosing
    `vgpulimit run`), the command's region is nested in that one: what it
    uses counts there too, under the limits already there, which a nested
    run can tighten but not loosen."""
    if not options.command:
        raise UsageError("run: no command given (vgpulimit run [OPTIONS] -- CMD [ARG...])")
    environ = os.environ if environ is None else environ
    # Resolve the native parts before anything is created, so a broken
    # install fails with nothing to clean up.
    libpath()
    if options.simulate:
        simgpu_dir()
    for line in options.limits.warnings:
        _warn(line)

    outer = enclosing_region(environ)
    if outer is not None:
        if len(os.fsencode(outer)) >= PARENT_LEN:
            raise UsageError(f"run: the path of the region this runs in, {outer}, is longer than "
                             f"{PARENT_LEN - 1} bytes: a nested run cannot count in it")
        _looser(outer, options)
        if options.limits.priority is not None:
            # Else a tenant could give itself a row of its own, above its container's.
            _warn(f"{options.limits.priority.source} {options.limits.priority.text} is ignored: a nested run "
                  f"keeps the priority of the region {outer} it runs in")
    workdir = None
    if options.region_path is not None:
        region_path = os.path.abspath(options.region_path)
    else:
        base = runtime_base()
        try:
            workdir = tempfile.mkdtemp(prefix="run-", dir=base)
        except OSError as exc:   # out of inodes or space, say
            raise SupervisorError(f"cannot make a directory for the region in {base}: {exc.strerror}; "
                                  "free some, or give --region PATH elsewhere") from None
        region_path = os.path.join(workdir, "region")
    try:
        limits = options.limits
        row = None
        if (limits.priority is not None or limits.takes_memory_row() or options.suspend_idle_ms) and outer is None:
            # Held by this supervisor: a row whose supervisor is gone is free again.
            row = provision.Row(options.board_path or str(runtime_base() / board.BOARD_NAME),
                                holder_pid=os.getpid(), cap_alone=True, suspend_idle_ms=options.suspend_idle_ms)
        tenant = provision.Tenant(Path(region_path), limits, parent=outer, row=row)
        try:
            made = provision.provision(tenant)
        except provision.ProvisionError as exc:
            if exc.board:
                raise SupervisorError(f"run: {exc}") from None
            raise
        with made.region as region:
            for line in made.notes:
                _warn(line)
            try:
                env = child_environment(environ, region_path, options.simulate)
                nothing = outer is None and limits.limits_nothing() and limits.priority is None
                return _run_child(options.command, env, region, started=NOTHING_LIMITED if nothing else "",
                                  beacon=made.beacon)
            finally:
                # The region goes with its private directory, or stays where --region put it.
                provision.deprovision(tenant, keep_region=True, row=made.row)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

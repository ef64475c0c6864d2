"""The signals `vgpulimit run` passes on to its command, and holding them.

Apart from the supervisor, whose imports load the region's native code, so
that the CLI can hold them before that and the rest of the set-up (``held``);
it imports nothing of ours.  What comes before the CLI's first line (the
interpreter's start, some tens of ms) still meets the kernel's defaults.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

# Signals forwarded to the command; SIGCHLD is waited for too, and SIGALRM, the
# supervisor's tick (supervisor._supervise).
FORWARDED_SIGNALS = frozenset({
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH,
})
WAITED_SIGNALS = FORWARDED_SIGNALS | {signal.SIGCHLD, signal.SIGALRM}

_held_from: list[set[signal.Signals]] = []   # the mask from before the hold in force, if one is


@contextmanager
def held() -> Iterator[set[signal.Signals]]:
    """Blocks the waited signals for the block; yields the mask from before
    the outermost hold, the one to start the command with.

    Held, a signal that comes before the command exists stays pending until
    the supervisor waits for it and passes it on.  Unheld, one with no handler
    would be dropped by the kernel while we are PID 1 (an early `docker stop`
    ignored until its SIGKILL) and elsewhere kill us (SIGUSR1, SIGHUP) or be
    ignored (SIGWINCH).  A hold within a hold changes nothing; what is still
    pending when the outermost one ends is dropped, not raised in Python or
    acted on (a SIGTERM must not kill us before an error is said)."""
    if _held_from:
        yield _held_from[0]
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED_SIGNALS)
    _held_from.append(before)
    try:
        yield before
    finally:
        _held_from.clear()
        while signal.sigtimedwait(WAITED_SIGNALS, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, before)

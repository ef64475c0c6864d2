"""The one base of the errors vgpulimit expects, and their exit codes.

Every module raises a subclass of ``VgpulimitError`` for what a user can
cause (a bad flag, a missing region, a container that cannot be set up);
the CLI turns each into one line on stderr and its ``exit_code``, in one
place (``cli.main``), as psutil's ``wrap_exceptions`` maps OS errors in
one place.  Anything else is a bug, and keeps its traceback."""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2


class VgpulimitError(Exception):
    """An expected error: its message is the one line the user sees."""

    exit_code: int = EXIT_FAILURE


class UsageError(VgpulimitError, ValueError):
    """Bad input: a flag, a variable, an annotation the user gave."""

    exit_code = EXIT_USAGE


# What a message shows of a name the user gave: enough to find it by, and
# the line stays one line on a terminal however long the name was.
QUOTED_MOST = 64


def quoted(text: str, most: int = QUOTED_MOST) -> str:
    """``text`` as a message quotes it (``repr``), cut after ``most``
    characters with its length said: ``'aaaa…' (5000 characters)``."""
    if len(text) <= most:
        return repr(text)
    return f"{text[:most - 1] + '…'!r} ({len(text)} characters)"

"""The `vgpulimit` command: one module per command or family, each adding
its subparser (``add``) and naming its handlers (``COMMANDS``).

Every expected error becomes one line on stderr and an exit code, here and
only here (each error's ``exit_code``, vgpulimit.errors); tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from vgpulimit import signals
from vgpulimit.cli import agent, containers, mig, run, set_, shell, slurm, suspend, verify, views
from vgpulimit.cli.common import PROG, Parser, dash_values
from vgpulimit.errors import VgpulimitError

# In the order `--help` lists them.
_FAMILIES = (run, views, set_, suspend, agent, verify, shell, containers, slurm, mig)
_COMMANDS = {name: handler for family in _FAMILIES for name, handler in family.COMMANDS.items()}


def _build_parser() -> argparse.ArgumentParser:
    from vgpulimit import __version__

    parser = Parser(prog=PROG, description="Per-container GPU memory caps, "
                     "enforced by an LD_PRELOAD shim.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="action", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    # The whole parser, for the commands that write it out (completion).
    parser.set_defaults(parser=parser)
    for family in _FAMILIES:
        family.add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `run` holds the signals it forwards from here, not from the child's
    # start: as a container's PID 1, a `docker stop` during the set-up (the
    # parser, the imports, the region: tens of ms) would be lost.  Only
    # --help and --version may come before a command, so `run` is first.
    with signals.held() if argv[:1] == ["run"] else contextlib.nullcontext():
        try:
            parser = _build_parser()
            args = parser.parse_args(dash_values(parser, argv))
            return _COMMANDS[args.action](args)
        except KeyboardInterrupt:
            return 128 + 2
        except VgpulimitError as exc:   # every expected error, and its code: here only
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return exc.exit_code

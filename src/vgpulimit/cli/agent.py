"""agent: the node agent (vgpulimit.agent)."""

from __future__ import annotations

import argparse


def add(commands) -> None:
    from vgpulimit.agent import command

    command.add_parser(commands)


def _cmd_agent(args: argparse.Namespace) -> int:
    from vgpulimit.agent import command

    return command.run(args)


COMMANDS = {"agent": _cmd_agent}

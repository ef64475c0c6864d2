"""`vgpulimit agent`: serves the node's board (by default the one `vgpulimit
run` uses), or writes a systemd unit that does (--install-unit)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from vgpulimit.errors import UsageError

UNIT_NAME = "vgpulimit-agent.service"


def add_parser(commands) -> None:
    agent = commands.add_parser(
        "agent", help="the node agent: suspend by the setters' rules, resume on use",
        description="Serve the node's board: when an allocation that is owed memory (within its "
                    "container's guarantee, or of a higher priority) waits while lower containers or "
                    "borrowers hold it, suspend the fewest, lowest of them; resume them when the memory "
                    "is free again; suspend containers idle past their --suspend-idle when others wait, "
                    "and resume them at their next CUDA call (docs/agent.md).")
    agent.add_argument("--board", metavar="PATH",
                       help="the board to serve (default: the one 'vgpulimit run' uses, priority.board in "
                            "its runtime directory)")
    agent.add_argument("--regions", metavar="DIR", action="append", default=[],
                       help="a directory whose region files the agent also looks at (repeatable; the "
                            "board's own directory, and the OCI hook's node directory for its board, always)")
    agent.add_argument("--interval", metavar="SECONDS", default="0.1",
                       help="how often it looks (default 0.1)")
    agent.add_argument("--simulate", action="store_true",
                       help="the node's GPU is the simulated one that ships with vgpulimit")
    agent.add_argument("--install-unit", metavar="DIR",
                       help="write a systemd unit that runs the agent with these options into DIR "
                            "(e.g. /etc/systemd/system), and exit")


def default_board() -> str:
    from vgpulimit.board import BOARD_NAME
    from vgpulimit.placement import runtime_base

    return str(runtime_base() / BOARD_NAME)


def run(args: argparse.Namespace) -> int:
    try:
        interval = float(args.interval)
    except ValueError:
        interval = -1.0
    if not 0.01 <= interval <= 60:
        raise UsageError(f"agent: --interval {args.interval!r}: expected seconds from 0.01 to 60 (e.g. 0.1)")
    board = args.board or default_board()
    if not os.path.isabs(board):
        raise UsageError(f"agent: --board {board!r} must be an absolute path")
    regions = [os.path.abspath(d) for d in args.regions]
    for d in regions:
        if not os.path.isdir(d):
            raise UsageError(f"agent: --regions {d}: not a directory")
    if args.install_unit is not None:
        return install_unit(args.install_unit, board, regions, args.interval, args.simulate)
    from vgpulimit.agent.serve import Agent

    return Agent(board, regions, args.simulate, interval).serve()


def unit_text(board: str, regions: list[str], interval: str, simulate: bool) -> str:
    command = [sys.executable, "-m", "vgpulimit", "agent", "--board", board, "--interval", interval,
               *[a for d in regions for a in ("--regions", d)], *(["--simulate"] if simulate else [])]
    return ("[Unit]\n"
            "Description=vgpulimit node agent: suspends by the setters' rules, resumes on use\n"
            "Documentation=https://github.com/vgpulimit/vgpulimit/blob/main/docs/agent.md\n"
            "After=nvidia-persistenced.service\n\n"
            "[Service]\n"
            f"ExecStart={shlex.join(command)}\n"
            "Restart=always\nRestartSec=1\n"
            "# A killed agent, restarted, finishes what it was doing (docs/agent.md).\n"
            "KillMode=process\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def install_unit(directory: str, board: str, regions: list[str], interval: str, simulate: bool) -> int:
    if not os.path.isdir(directory):
        raise UsageError(f"agent: --install-unit {directory}: not a directory")
    path = os.path.join(directory, UNIT_NAME)
    staged = path + ".tmp"
    with open(staged, "w") as f:
        f.write(unit_text(board, regions, interval, simulate))
    os.chmod(staged, 0o644)
    os.replace(staged, path)
    print(f"wrote {path}; start it with: systemctl daemon-reload && systemctl enable --now {UNIT_NAME}")
    return 0

"""`vgpulimit run`: a command under limits, in a fresh region."""

from __future__ import annotations

import argparse
import os

from vgpulimit.cli.common import (
    SIZE_FORMS,
    add_limit_flags,
    limit_flags,
    refuse_mig_gpus,
)
from vgpulimit.errors import UsageError


def _add_memory_units(run: argparse.ArgumentParser) -> None:
    run.add_argument("--memory-units", metavar="N",
                     help="memory cap as N units of --unit, as Alibaba's gpushare counts it "
                          "(instead of --memory)")
    run.add_argument("--unit", metavar="SIZE",
                     help="the size of one --memory-units unit: 1GiB (default), 128Mi, ...")


def add(commands) -> None:
    """run, and its flags: the limit kinds', and where it runs."""
    run = commands.add_parser(
        "run", help="run a command under GPU limits",
        description="Run CMD with the shim preloaded and the limits in a fresh region file. "
                    "Limits not given as flags are taken from VGPULIMIT_MEMORY[_<i>|_GPU-<uuid>|_MIG-<uuid>] "
                    "and VGPULIMIT_CORES[_<i>|_GPU-<uuid>|_MIG-<uuid>] in the environment.",
        epilog=SIZE_FORMS)
    add_limit_flags(run, per_device=True, then={"memory": lambda: _add_memory_units(run)})
    run.add_argument("--board", metavar="PATH",
                     help="the node's board of priorities and memory guarantees, with --priority or "
                          "a memory cap (default: priority.board in the directory run makes regions in)")
    run.add_argument("--suspend-idle", metavar="DURATION",
                     help="the node agent may suspend the container once its GPU work has been idle "
                          "this long and others wait for memory, and resumes it at its next CUDA call: "
                          "30s, 10m, 4h (docs/agent.md; default: never)")
    run.add_argument("--simulate", action="store_true",
                     help="run on the simulated GPU that ships with vgpulimit")
    run.add_argument("--region", metavar="PATH",
                     help="create the region file here and keep it afterwards "
                          "(default: a private one, removed when CMD exits)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def _cmd_run(args: argparse.Namespace) -> int:
    from vgpulimit import request, supervisor

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: no command given (usage: vgpulimit run [OPTIONS] -- CMD [ARG...])")
    if not command[0].strip():
        # A shell's "$CMD" left empty: no program has that name, and exec
        # would refuse it only after the region is made.
        raise UsageError(f"run: the command's name is {command[0]!r}; give a program on PATH or "
                         "a path to one (e.g. vgpulimit run -- python3 app.py)")
    flags = limit_flags(args)
    if args.unit is not None and args.memory_units is None:
        raise UsageError("run: --unit is the size of one --memory-units unit, and no --memory-units "
                         "is given; give --memory-units N with it (e.g. --memory-units 8 --unit 128Mi), "
                         "or --memory SIZE")
    if args.memory_units is not None:
        if flags["memory"] is not None:
            raise UsageError("run: give --memory or --memory-units, not both")
        flags["memory"] = request.memory_units(args.memory_units, args.unit)
    limits = request.resolve_limits(environ=os.environ, **flags)
    if args.board is not None and limits.priority is None and not limits.takes_memory_row():
        raise UsageError("run: --board is the node's board of --priority and of memory caps and requests, "
                         "and neither is given; give --priority high|normal|low or --memory SIZE with it")
    if args.board is not None and not os.path.isabs(args.board):
        raise UsageError(f"run: --board {args.board!r} must be an absolute path (e.g. "
                         "/run/vgpulimit/priority.board)")
    if args.region == "":
        raise UsageError("run: --region is empty; give the path where the region file is made "
                         "(e.g. /run/vgpulimit/job.region), or leave --region out for a private one")
    given = {u: s.source for kind in (limits.memory_by_uuid, limits.cores_by_uuid, limits.request_by_uuid)
             for u, s in kind.items()}
    refuse_mig_gpus(given, args.simulate)
    from vgpulimit.agent.rules import parse_idle

    idle_ms = parse_idle(args.suspend_idle, "--suspend-idle") if args.suspend_idle is not None else 0
    options = request.RunOptions(command=command, limits=limits, simulate=args.simulate,
                                 region_path=args.region, board_path=args.board, suspend_idle_ms=idle_ms)
    return supervisor.run(options)


COMMANDS = {"run": _cmd_run}

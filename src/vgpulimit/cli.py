"""The `vgpulimit` command.

Every expected error becomes one line on stderr and an exit code, here and
only here (see ``_EXIT_CODES``); tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from vgpulimit import __version__

PROG = "vgpulimit"
EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(ValueError):
    """A command line that argparse refused."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: one line, exit 2
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Per-container GPU memory caps, "
                     "enforced by an LD_PRELOAD shim.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="action", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run", help="run a command under GPU limits",
        description="Run CMD with the shim preloaded and the limits in a fresh region file. "
                    "Limits not given as flags are taken from VGPULIMIT_MEMORY[_<i>] "
                    "and VGPULIMIT_CORES[_<i>] in the environment.")
    run.add_argument("--memory", metavar="SIZE",
                     help="memory cap for every device: 4GiB, 3000m, 50%%, 0.2, ...")
    run.add_argument("--memory-device", metavar="I=SIZE", action="append", default=[],
                     help="memory cap for device I (overrides --memory; repeatable)")
    run.add_argument("--simulate", action="store_true",
                     help="run on the simulated GPU that ships with vgpulimit")
    run.add_argument("--region", metavar="PATH",
                     help="create the region file here and keep it afterwards "
                          "(default: a private one, removed when CMD exits)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")

    status = commands.add_parser(
        "status", help="show limits, usage and processes of a region",
        description="Show each device's cap, use and OOM refusals, and each process's use.")
    status.add_argument("--json", action="store_true", help="machine-readable, bytes as integers")
    status.add_argument("--region", metavar="PATH",
                        help="the region file (default: $VGPULIMIT_REGION)")

    set_ = commands.add_parser(
        "set", help="change the limits of a running container",
        description="Change the limits in a region file; its processes apply them to their next "
                    "allocation.  Lowering a cap below what is in use frees nothing: new "
                    "allocations are refused until usage falls under it.")
    set_.add_argument("--memory", metavar="SIZE",
                      help="memory cap for every device: 4GiB, 3000m, 50%%, 0.2, ... or 'none'")
    set_.add_argument("--memory-device", metavar="I=SIZE", action="append", default=[],
                      help="memory cap for device I (overrides --memory; repeatable)")
    set_.add_argument("--region", metavar="PATH",
                      help="the region file (default: $VGPULIMIT_REGION)")

    commands.add_parser("libpath", help="print the path of libvgpulimit.so (for LD_PRELOAD)")
    commands.add_parser("simgpu-path",
                        help="print the directory of the simulated driver (for LD_LIBRARY_PATH)")
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from vgpulimit import supervisor

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: no command given (usage: vgpulimit run [OPTIONS] -- CMD [ARG...])")
    limits = supervisor.resolve_limits(args.memory, args.memory_device, os.environ)
    options = supervisor.RunOptions(command=command, limits=limits, simulate=args.simulate,
                                    region_path=args.region)
    return supervisor.run(options)


def _region_path(args: argparse.Namespace) -> str:
    path = args.region or os.environ.get("VGPULIMIT_REGION")
    if not path:
        raise _NoRegion("no region: give --region PATH or set VGPULIMIT_REGION")
    return path


def _cmd_status(args: argparse.Namespace) -> int:
    from vgpulimit import status
    from vgpulimit.region import Region

    with Region.open(_region_path(args)) as region:
        snap = region.snapshot()
    sys.stdout.write(status.render_json(snap) if args.json else status.render_text(snap))
    return 0


def _cmd_set(args: argparse.Namespace) -> int:
    from vgpulimit.limits import parse_memory
    from vgpulimit.region import Region
    from vgpulimit.supervisor import parse_device_items

    def memory(text: str, source: str):
        return None if text.strip().lower() == "none" else parse_memory(text, source)

    per_device = parse_device_items(args.memory_device, "--memory-device")
    if args.memory is None and not per_device:
        raise UsageError("set: nothing to change (give --memory or --memory-device)")
    everywhere = memory(args.memory, "--memory") if args.memory is not None else None
    with Region.open(_region_path(args)) as region:
        current = {d.index: d for d in region.snapshot(all_devices=True).devices}
        for index, device in current.items():
            if index in per_device:
                limit = memory(per_device[index], f"--memory-device {index}")
            elif args.memory is not None:
                limit = everywhere
            else:
                continue
            region.set_limits(index, limit, device.cores_pct)
    return 0


def _cmd_libpath(args: argparse.Namespace) -> int:
    from vgpulimit._paths import libpath

    print(libpath())
    return 0


def _cmd_simgpu_path(args: argparse.Namespace) -> int:
    from vgpulimit._paths import simgpu_dir

    print(simgpu_dir())
    return 0


class _NoRegion(LookupError):
    pass


_COMMANDS = {
    "run": _cmd_run,
    "status": _cmd_status,
    "set": _cmd_set,
    "libpath": _cmd_libpath,
    "simgpu-path": _cmd_simgpu_path,
}


def _exit_codes() -> list[tuple[type[BaseException], int | None]]:
    """Expected errors and their exit codes (None: the error's own ``exit_code``)."""
    from vgpulimit._paths import InstallError

    codes: list[tuple[type[BaseException], int | None]] = [
        (UsageError, EXIT_USAGE),
        (InstallError, EXIT_FAILURE),
        (_NoRegion, EXIT_FAILURE),
    ]
    try:
        from vgpulimit import supervisor
        from vgpulimit.limits import LimitError
        from vgpulimit.region import RegionError
    except InstallError:
        return codes
    return codes + [
        (LimitError, EXIT_USAGE),
        (supervisor.UsageError, EXIT_USAGE),
        (supervisor.CommandError, None),        # 127 not found, 126 not executable
        (supervisor.SupervisorError, EXIT_FAILURE),
        (RegionError, EXIT_FAILURE),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        return _COMMANDS[args.action](args)
    except KeyboardInterrupt:
        return 128 + 2
    except Exception as exc:
        for kind, code in _exit_codes():
            if isinstance(exc, kind):
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return exc.exit_code if code is None else code
        raise

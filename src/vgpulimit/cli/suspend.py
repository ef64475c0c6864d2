"""`vgpulimit suspend` and `resume`: a container's GPU memory moved to the
host and back."""

from __future__ import annotations

import argparse
import os

from vgpulimit.cli.common import (
    NoRegion,
    region_file,
)
from vgpulimit.errors import UsageError


def add(commands) -> None:
    """suspend and resume."""
    for name, what in (("suspend", "move a container's GPU memory to host memory and free the GPU"),
                       ("resume", "bring a suspended container's GPU memory back and let it run on")):
        sub = commands.add_parser(
            name, help=what,
            description=(f"{what[0].upper()}{what[1:]}, through the driver's checkpoint API (driver "
                         "570 or later): every process of the container, all or nothing.  A setter's "
                         "act, from outside the container (docs/suspend.md)."))
        which = sub.add_mutually_exclusive_group()
        which.add_argument("--region", metavar="PATH",
                           help="the container's region file (default: $VGPULIMIT_REGION)")
        which.add_argument("--container", metavar="ID",
                           help="the container of this id (or its start, or its name as status shows "
                                "it, or its region's path or the end of it, as status --all and top "
                                "--all show it) among the regions under --all DIR")
        sub.add_argument("--all", metavar="DIR", action="append",
                         help="with --container: where its region is, e.g. the OCI hook's node "
                              "directory (repeatable)")
        sub.add_argument("--simulate", action="store_true",
                         help="the container runs on the simulated GPU that ships with vgpulimit")
        if name == "suspend":
            sub.add_argument("--timeout", metavar="DURATION", default="10s",
                             help="how long each process may take to finish its submitted GPU work "
                                  "before the suspend is given up: 500ms, 2s, ... (default 10s)")


def _container_region(args: argparse.Namespace) -> str:
    """The region of the container --container names, among those under --all."""
    from vgpulimit import identity
    from vgpulimit.region import find_regions

    if not args.all:
        raise UsageError(f"{args.action}: --container needs --all DIR, the directory its region is under")
    for directory in args.all:
        if not os.path.isdir(directory):
            raise UsageError(f"--all {directory}: not a directory")
    wanted = args.container
    found = []
    for path in sorted({p for d in args.all for p in find_regions(d)}):
        who = identity.of_region(path)
        # The node view (status --all, top --all) names a container without a
        # name by its region's path, which it may show by its end alone.
        shown = path == wanted or path.endswith(f"/{wanted.lstrip('/')}")
        if wanted and (who.container_id.startswith(wanted) or who.name == wanted or shown):
            found.append(path)
    if len(found) != 1:
        where = ", ".join(args.all)
        raise NoRegion(f"--container {wanted!r}: no container of that id, name or region path under {where}" if not found
                        else f"--container {wanted!r}: {len(found)} containers under {where} match; give more of "
                             "the id")
    return found[0]


def _cmd_suspend(args: argparse.Namespace) -> int:
    from vgpulimit import suspend
    from vgpulimit.limits import format_bytes, parse_wait

    if args.all and args.container is None:
        raise UsageError(f"{args.action}: --all DIR is where --container ID looks; give --container with it")
    region = _container_region(args) if args.container is not None else region_file(args)
    timeout_ms = 0
    if args.action == "suspend":
        timeout_ns = parse_wait(args.timeout, "--timeout")
        if timeout_ns == 0:
            raise UsageError("--timeout 0: expected a duration (500ms, 2s, ...): a suspend that waits forever "
                             "for a process's GPU work is not offered")
        timeout_ms = max(1, timeout_ns // 1_000_000)
    driver = suspend.Driver(args.simulate)
    if args.action == "suspend":
        record = suspend.suspend(region, driver, timeout_ms)
        print(f"suspended: {format_bytes(record.out_total_bytes)} off the GPU in "
              f"{record.last_suspend_ns / 1e9:.3f} s")
    else:
        record = suspend.resume(region, driver)
        print(f"resumed in {record.last_resume_ns / 1e9:.3f} s")
    return 0


COMMANDS = {"suspend": _cmd_suspend, "resume": _cmd_suspend}

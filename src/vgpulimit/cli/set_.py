"""`vgpulimit set`: a running container's limits changed."""

from __future__ import annotations

import argparse
import sys

from vgpulimit.cli.common import (
    PROG,
    SIZE_FORMS,
    add_limit_flags,
    limit_flags,
    refuse_mig_gpus,
    region_file,
)


def add(commands) -> None:
    """set, with the limit kinds' flags."""
    set_ = commands.add_parser(
        "set", help="change the limits of a running container",
        description="Change the limits in a region file; its processes apply them to their next "
                    "allocation or kernel launch.  Lowering a cap below what is in use frees "
                    "nothing: new allocations are refused until usage falls under it.  Prints what "
                    "changed, old → new.",
        epilog=SIZE_FORMS)
    add_limit_flags(set_, per_device=True, none="; 'none' lifts it")
    set_.add_argument("--region", metavar="PATH",
                      help="the region file (default: $VGPULIMIT_REGION)")


def _cmd_set(args: argparse.Namespace) -> int:
    from vgpulimit import change

    asked = change.Change.parse(**limit_flags(args))
    for note in asked.notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    refuse_mig_gpus({u: f"--memory-device {u}" for u in asked.memory_by_uuid}
                     | {u: f"--cores-device {u}" for u in asked.cores_by_uuid}, False)
    lines = change.apply(region_file(args), asked)
    print("\n".join(lines) if lines else "nothing changed: the limits were already these")
    return 0


COMMANDS = {"set": _cmd_set}
